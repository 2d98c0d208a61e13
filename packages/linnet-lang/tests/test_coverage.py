"""THE coverage test (issue 13): every per-primitive table against the registry.

Each entry of :data:`TABLES` names a module and a plain dict keyed by primitive name (typing,
constant folding, an emitter, an interpreter, the test reference, and every future target).
A primitive a table deliberately lacks is listed in that module's ``EXPECTED_MISSING``
(a frozenset, with a comment saying why). The test fails on a missing rule, on a rule for
a name that is not a primitive, and on a stale ``EXPECTED_MISSING`` entry (the rule exists
now, or the name is no primitive). A new target adds one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from linnet.lang.ir import primitives
from linnet.lang.ir.primitives import PRIMITIVES, Category

# (module, table): the module also holds the table's EXPECTED_MISSING, if it has one.
TABLES: list[tuple[str, str]] = [
    ("linnet.lang.check.elementwise", "TYPING_RULES"),  # result dtype/shape as the checker types it
    ("linnet.lang.check.folding", "FOLDING_RULES"),  # constant folding of compile-time scalars
    ("linnet.lang.emit.torch", "RULES"),  # generated PyTorch source
    ("linnet.torch.interpreter", "RULES"),  # the PyTorch interpreter (linnet-runtime-torch)
    ("reference", "REFERENCE_RULES"),  # tests/reference.py, the NumPy reference
    ("linnet.lang.grad.rules", "VJP_RULES"),  # reverse mode: one VJP per primitive (issue 18)
    ("linnet.lang.grad.linearity", "LINEARITY_RULES"),  # grad clauses linear in dy (issue 46)
    ("linnet.lang.emit.jax", "RULES"),  # generated JAX source (issue 16)
    ("linnet.lang.emit.onnx_rules", "RULES"),  # ONNX export (issue 17)
    ("linnet.lang.emit.onnx_rules", "SYMBOLIC_ATTRIBUTES"),  # ONNX: attributes a dim may change
    ("linnet.lang.emit.stablehlo_rules", "RULES"),  # StableHLO export (issue 17)
    ("linnet.lang.ir.shapes", "SHAPE_RULES"),  # result types the verifier checks (E0685)
    ("linnet.lang.passes.shard", "SHARD_RULES"),  # the tensor-parallel pass's rewrite per step
    ("linnet.lang.passes.bounds", "BOUNDS_RULES"),  # the one integer range analysis
    ("linnet.lang.ir.elementwise", "SPELLINGS"),  # elementwise math, spelled per target
]


def _load(module: str) -> ModuleType:
    return importlib.import_module(module)


def problems(module: ModuleType, table_name: str, registry: object = PRIMITIVES) -> list[str]:
    """What is wrong with one table, as sentences (empty: it covers the registry)."""
    PRIMITIVES = registry
    table = getattr(module, table_name)
    where = f"{module.__name__}.{table_name}"
    if not isinstance(table, dict):
        return [f"{where} is a {type(table).__name__}, not a dict keyed by primitive name"]
    expected = getattr(module, "EXPECTED_MISSING", frozenset())
    out = []
    if not isinstance(expected, frozenset):
        out.append(
            f"{module.__name__}.EXPECTED_MISSING is a {type(expected).__name__}, not a frozenset"
        )
        expected = frozenset(expected)
    missing = sorted(set(PRIMITIVES) - set(table) - expected)
    if missing:
        out.append(
            f"{where} has no rule for: {', '.join(missing)} (add one, or list it in "
            f"{module.__name__}.EXPECTED_MISSING with a comment why)"
        )
    unknown = sorted(set(table) - set(PRIMITIVES))
    if unknown:
        out.append(f"{where} has rules for names that are not primitives: {', '.join(unknown)}")
    stale = sorted(expected & set(table)) + sorted(expected - set(PRIMITIVES))
    if stale:
        out.append(
            f"{module.__name__}.EXPECTED_MISSING is stale: {', '.join(stale)} (a rule "
            f"exists, or no such primitive): remove it"
        )
    return out


@pytest.mark.parametrize("module,table", TABLES, ids=[f"{m}.{t}" for m, t in TABLES])
def test_every_table_covers_every_primitive(module: str, table: str) -> None:
    found = problems(_load(module), table)
    assert not found, "\n".join(found)


def _fake(table: dict, expected: frozenset | None = None) -> ModuleType:
    fake = ModuleType("fake_target")
    fake.RULES = table  # type: ignore[attr-defined]
    if expected is not None:
        fake.EXPECTED_MISSING = expected  # type: ignore[attr-defined]
    return fake


def test_the_checker_fails_on_each_kind_of_gap() -> None:
    full = {name: object() for name in PRIMITIVES}
    assert problems(_fake(full), "RULES") == []
    without_exp = {k: v for k, v in full.items() if k != "exp"}
    assert "has no rule for: exp" in problems(_fake(without_exp), "RULES")[0]
    assert problems(_fake(without_exp, frozenset({"exp"})), "RULES") == []
    assert "not primitives: expm1" in problems(_fake(full | {"expm1": 1}), "RULES")[0]
    assert "stale: exp" in problems(_fake(full, frozenset({"exp"})), "RULES")[0]
    assert "stale: nope" in problems(_fake(full, frozenset({"nope"})), "RULES")[0]
    assert "not a frozenset" in problems(_fake(full, {"exp"}), "RULES")[0]  # type: ignore[arg-type]
    assert "not a dict" in problems(_fake(list(full)), "RULES")[0]  # type: ignore[arg-type]


# ---------------------------------------------------------------- categories are data
def test_every_row_is_well_formed() -> None:
    for name, p in PRIMITIVES.items():
        assert p.name == name and isinstance(p.category, Category) and p.doc
        assert p.arity is None or p.min_arity == 0, name
        if p.comparison or p.logical:
            assert p.category is Category.ELEMENTWISE and p.bool_result, name
            assert not p.differentiable, name
        if p.category is Category.CONSTANT:
            assert p.arity == 0 and not p.differentiable, name
    assert [p.name for p in PRIMITIVES.values() if p.results == 0] == ["scatter"]


def test_the_checker_sets_are_derived_from_the_rows() -> None:
    rows = PRIMITIVES.values()
    comparisons, logical = primitives.COMPARISON_PRIMITIVES, primitives.LOGICAL_PRIMITIVES
    unary, differentiable = primitives.UNARY_FUNCTIONS, primitives.DIFFERENTIABLE_PRIMITIVES
    assert comparisons == {"lt", "le", "gt", "ge", "eq", "ne"}
    assert logical == {"and", "or", "not"}
    assert unary == {p.name for p in rows if p.function and p.arity == 1}
    assert primitives.BINARY_FUNCTIONS == {"max": "maximum", "min": "minimum", "pow": "pow"}
    assert primitives.BINARY_OPERATORS == {
        "+": "add",
        "-": "sub",
        "*": "mul",
        "/": "div",
        "%": "rem",
        "<": "lt",
        "<=": "le",
        ">": "gt",
        ">=": "ge",
        "==": "eq",
        "!=": "ne",
        "&&": "and",
        "||": "or",
    }
    for op, name in primitives.BINARY_OPERATORS.items():
        assert PRIMITIVES[name].operator == op and PRIMITIVES[name].arity == 2
    assert primitives.in_category("shape") == {"reshape", "transpose", "broadcast", "slice"}
    assert set().union(*(primitives.in_category(c) for c in Category)) == set(PRIMITIVES)
    assert differentiable <= set(PRIMITIVES) and "floor" not in differentiable


# Tables keyed by tile primitive (linnet.lang.ir.tiles.TILE_PRIMITIVES: a kernel lowered for
# concrete generics), each against that registry.
TILE_TABLES: list[tuple[str, str]] = [
    ("linnet.lang.emit.triton", "TILE_RULES"),  # @triton.jit kernels in generated PyTorch
    ("linnet.lang.emit.pallas", "PALLAS_RULES"),  # Pallas kernels in generated JAX
]


@pytest.mark.parametrize("module,table", TILE_TABLES, ids=[f"{m}.{t}" for m, t in TILE_TABLES])
def test_every_tile_table_covers_every_tile_primitive(module: str, table: str) -> None:
    from linnet.lang.ir.tiles import TILE_PRIMITIVES

    found = problems(_load(module), table, TILE_PRIMITIVES)
    assert not found, "\n".join(found)
