"""Every primitive's VJP rule against torch.autograd (issue 18).

* One hand-made graph per primitive (:data:`CASES`, checked to cover
  :data:`~linnet.lang.ir.primitives.PRIMITIVES`), run at f64 and compared exactly enough
  (1e-9) with autograd through the PyTorch interpreter, and spot-checked by central finite
  differences where the function is smooth there.
* Random index-notation programs (tests/indexgen.py, the generator the semantics tests use),
  differentiated with respect to every float input, at f64.
"""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_against_autograd, widen
from hypothesis import given
from indexgen import index_programs
from linnet.lang import LinnetError, Program, check_program, lower
from linnet.lang.grad import VJP_RULES, differentiate
from linnet.lang.ir.elementwise import SPELLINGS
from linnet.lang.ir.graph import Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES, in_category
from test_properties import budget

torch = pytest.importorskip("torch")


def graph(
    inputs: dict[str, tuple],
    steps: list[tuple],
    outputs: list[str],
    params: dict[str, tuple] | None = None,
) -> Graph:
    """A graph from (op, operands, result, shape, dtype, attrs) rows; inputs name -> type."""
    g = Graph("run", "M", inputs=[f"%{k}" for k in inputs], outputs=outputs)
    g.values = {f"%{k}": ValueType(tuple(s), d) for k, (s, d) in inputs.items()}
    g.parameters = {k: ValueType(tuple(s), d) for k, (s, d) in (params or {}).items()}
    for op, operands, result, shape, dtype, attrs in steps:
        g.steps.append(Step(op, operands, [result] if result else [], attrs or {}))
        if result:
            g.values[result] = ValueType(tuple(shape), dtype)
    return g


F = "f64"
X3 = {"x": ((2, 3), F)}
XY = {"x": ((2, 3), F), "y": ((2, 3), F)}
XB = {"x": ((2, 3), F), "y": ((1, 3), F)}  # y broadcasts along axis 0


def unary(op: str) -> Graph:
    return graph(X3, [(op, ["%x"], "%r", (2, 3), F, None)], ["%r"])


def binary(op: str, inputs: dict = XB) -> Graph:
    return graph(inputs, [(op, ["%x", "%y"], "%r", (2, 3), F, None)], ["%r"])


def compare(op: str) -> Graph:
    """A comparison choosing between x and y: no gradient flows through the condition."""
    return graph(
        XY,
        [
            (op, ["%x", "%y"], "%c", (2, 3), "bool", None),
            ("select", ["%c", "%x", "%y"], "%r", (2, 3), F, None),
        ],
        ["%r"],
    )


def logic(op: str) -> Graph:
    steps = [
        ("lt", ["%x", "%y"], "%a", (2, 3), "bool", None),
        ("gt", ["%x", "%y"], "%b", (2, 3), "bool", None),
    ]
    if op == "not":
        steps.append(("not", ["%a"], "%c", (2, 3), "bool", None))
    else:
        steps.append((op, ["%a", "%b"], "%c", (2, 3), "bool", None))
    steps.append(("select", ["%c", "%x", "%y"], "%r", (2, 3), F, None))
    return graph(XY, steps, ["%r"])


_POSITIVE = {"log", "sqrt", "rsqrt", "pow"}  # primitives tested on positive inputs


def _cases() -> dict[str, list[Graph]]:
    cases: dict[str, list[Graph]] = {}
    for op in (
        "neg",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "erf",
        "abs",
        "floor",
    ):
        cases[op] = [unary(op)]
    for op in ("add", "sub", "mul", "div", "rem", "pow", "maximum", "minimum"):
        cases[op] = [binary(op), binary(op, XY)]
    # a rank-0 operand broadcasting against a tensor
    cases["mul"].append(
        graph(
            {"x": ((2, 3), F), "y": ((), F)}, [("mul", ["%x", "%y"], "%r", (2, 3), F, None)], ["%r"]
        )
    )
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        cases[op] = [compare(op)]
    for op in ("and", "or", "not"):
        cases[op] = [logic(op)]
    cases["select"] = [compare("lt")]
    cases["convert"] = [
        graph(
            X3,
            [
                ("convert", ["%x"], "%h", (2, 3), "f32", {"dtype": "f32"}),
                ("convert", ["%h"], "%r", (2, 3), F, {"dtype": F}),
            ],
            ["%r"],
        ),
        # to an integer: constant almost everywhere
        graph(
            X3,
            [
                ("convert", ["%x"], "%i", (2, 3), "i64", {"dtype": "i64"}),
                ("convert", ["%i"], "%f", (2, 3), F, {"dtype": F}),
                ("mul", ["%f", "%x"], "%r", (2, 3), F, None),
            ],
            ["%r"],
        ),
    ]
    # The bits read as an integer and back: x itself, through which no gradient flows (as
    # autograd has it: an integer view does not require grad), so d(x' * x)/dx is x'.
    cases["bitcast"] = [
        graph(
            X3,
            [
                ("bitcast", ["%x"], "%i", (2, 3), "i64", {"dtype": "i64"}),
                ("bitcast", ["%i"], "%f", (2, 3), F, {"dtype": F}),
                ("mul", ["%f", "%x"], "%r", (2, 3), F, None),
            ],
            ["%r"],
        )
    ]
    cases["constant"] = [
        graph(
            X3,
            [
                ("constant", [], "%c", (), F, {"value": 2.5, "dtype": F}),
                ("mul", ["%x", "%c"], "%r", (2, 3), F, None),
            ],
            ["%r"],
        )
    ]
    cases["iota"] = [
        graph(
            X3,
            [
                ("iota", [], "%i", (2, 3), F, {"shape": [2, 3], "axis": 1, "dtype": F}),
                ("mul", ["%x", "%i"], "%r", (2, 3), F, None),
            ],
            ["%r"],
        )
    ]
    cases["reshape"] = [
        graph(X3, [("reshape", ["%x"], "%r", (3, 2), F, {"shape": [3, 2]})], ["%r"])
    ]
    cases["transpose"] = [
        graph(
            {"x": ((2, 3, 4), F)},
            [("transpose", ["%x"], "%r", (4, 2, 3), F, {"perm": [2, 0, 1]})],
            ["%r"],
        )
    ]
    cases["broadcast"] = [
        graph(
            {"x": ((1, 3), F)}, [("broadcast", ["%x"], "%r", (4, 3), F, {"shape": [4, 3]})], ["%r"]
        ),
        graph({"x": ((), F)}, [("broadcast", ["%x"], "%r", (4, 3), F, {"shape": [4, 3]})], ["%r"]),
    ]
    # slice: the leading axis alone, inner axes (the last one too), and every axis whole
    cases["slice"] = [
        graph(
            {"x": ((4, 5, 3), F)},
            [("slice", ["%x"], "%r", (2, 5, 3), F, {"starts": [1, 0, 0], "limits": [3, 5, 3]})],
            ["%r"],
        ),
        graph(
            {"x": ((4, 5, 3), F)},
            [("slice", ["%x"], "%r", (4, 2, 2), F, {"starts": [0, 2, 1], "limits": [4, 4, 3]})],
            ["%r"],
        ),
        graph(
            {"x": ((2, 3), F)},
            [
                ("slice", ["%x"], "%s", (2, 3), F, {"starts": [0, 0], "limits": [2, 3]}),
                ("mul", ["%s", "%x"], "%r", (2, 3), F, None),
            ],
            ["%r"],
        ),
    ]
    cases["reduce"] = []
    for kind, identity in (
        ("sum", 0.0),
        ("mean", 0.0),
        ("max", float("-inf")),
        ("min", float("inf")),
        ("prod", 1.0),
    ):
        for axes, shape in (([1], (2, 4)), ([0, 2], (3,)), ([0, 1, 2], ())):
            cases["reduce"].append(
                graph(
                    {"x": ((2, 3, 4), F)},
                    [
                        (
                            "reduce",
                            ["%x"],
                            "%r",
                            shape,
                            F,
                            {"kind": kind, "axes": axes, "accumulate": F, "identity": identity},
                        )
                    ],
                    ["%r"],
                )
            )
    cases["contract"] = [
        graph(
            {"a": ((2, 3), F), "b": ((4, 3), F)},
            [("contract", ["%a", "%b"], "%r", (2, 4), F, {"spec": "ac,bc->ab", "accumulate": F})],
            ["%r"],
        ),
        # a letter summed in one operand alone (d), and a scalar result
        graph(
            {"a": ((2, 3, 5), F), "b": ((3,), F)},
            [("contract", ["%a", "%b"], "%r", (2,), F, {"spec": "acd,c->a", "accumulate": F})],
            ["%r"],
        ),
        graph(
            {"a": ((3,), F), "b": ((3,), F)},
            [("contract", ["%a", "%b"], "%r", (), F, {"spec": "a,a->", "accumulate": F})],
            ["%r"],
        ),
    ]
    cases["take"] = [
        graph(
            {"x": ((5, 3), F), "i": ((4,), "i64")},
            [("take", ["%x", "%i"], "%r", (4, 3), F, {"axis": 0, "bounds": "unchecked"})],
            ["%r"],
        ),
        graph(
            {"x": ((2, 5, 3), F), "i": ((2, 2), "i64")},
            [("take", ["%x", "%i"], "%r", (2, 2, 2, 3), F, {"axis": 1, "bounds": "zero"})],
            ["%r"],
        ),
    ]
    cases["gather"] = [
        graph(
            {"x": ((4, 5, 3), F), "i": ((2, 1), "i64"), "j": ((1, 3), "i64")},
            [
                (
                    "gather",
                    ["%x", "%i", "%j"],
                    "%r",
                    (2, 3, 3),
                    F,
                    {"indexed_axes": 2, "bounds": "zero"},
                )
            ],
            ["%r"],
        )
    ]
    cases["scatter_add"] = [
        graph(
            {"x": ((5, 3), F), "v": ((4, 3), F), "i": ((4,), "i64")},
            [
                (
                    "scatter_add",
                    ["%x", "%v", "%i"],
                    "%r",
                    (5, 3),
                    F,
                    {"indexed_axes": 1, "bounds": "zero"},
                )
            ],
            ["%r"],
        )
    ]
    st = graph(
        {"x": ((2, 3), F), "i": ((2,), "i64")},
        [
            ("scatter", ["@s", "%x", "%i"], "", (), "", {"indexed_axes": 1, "path": "s"}),
            ("exp", ["%x"], "%r", (2, 3), F, None),
        ],
        ["%r"],
    )
    st.states = {"s": ValueType((4, 3), F)}
    cases["scatter"] = [st]
    # Elementwise math of linnet.lang.ir.elementwise with no case above (a new row): its
    # derivative column (or zero rule) against torch.autograd, on positive inputs.
    for op in sorted(SPELLINGS.keys() - cases.keys()):
        p = PRIMITIVES[op]
        cases[op] = [
            logic(op)
            if p.logical
            else compare(op)
            if p.comparison
            else unary(op)
            if p.arity == 1
            else binary(op)
        ]
        _POSITIVE.add(op)
    return cases


CASES = _cases()


def test_cases_cover_every_primitive_and_rule():
    # The collectives (tensor parallelism) have no gradient: their rule is E0963, below.
    assert set(CASES) | in_category("collective") == set(PRIMITIVES)
    assert set(VJP_RULES) == set(PRIMITIVES)


@pytest.mark.parametrize("op", sorted(in_category("collective")))
def test_a_collective_is_E0963_not_an_identity(op):
    step = Step(op, ["%x"], ["%y"], {"world": 2, "kind": "sum", "axis": 0}, "m.linnet:3")
    with pytest.raises(LinnetError) as err:
        VJP_RULES[op](step, "%g", None, [True])  # type: ignore[arg-type]
    assert err.value.diagnostics[0].code == "E0963"
    assert "the reverse pass runs one process" in err.value.diagnostics[0].message


def _data(g: Graph, rng: np.random.Generator) -> list:
    out = []
    for ref in g.inputs:
        v = g.values[ref]
        if v.dtype == "i64":
            # positions in range, and (for bounds zero) out of range, repeated ones included
            out.append(
                torch.tensor(
                    rng.integers(-1, 6, size=v.shape)
                    if "zero" in repr([s.attributes for s in g.steps])
                    else rng.integers(0, 4, size=v.shape)
                )
            )
        else:
            x = rng.standard_normal(v.shape)
            out.append(torch.tensor(x, dtype=torch.float64))
    return out


def _positive(g: Graph) -> bool:
    return any(s.op in _POSITIVE for s in g.steps)


@pytest.mark.parametrize("op", sorted(CASES))
def test_vjp_rule_matches_autograd(op):
    rng = np.random.default_rng(sorted(PRIMITIVES).index(op))
    for g in CASES[op]:
        wrt = [r for r in g.inputs if g.values[r].dtype == F]
        for trial in range(3):
            inputs = _data(g, rng)
            if _positive(g):
                inputs = [x.abs() + 0.5 if x.is_floating_point() else x for x in inputs]
            if trial == 2 and op in ("maximum", "minimum", "abs", "reduce", "pow"):
                # ties and zeros: the conventions autograd follows at kinks
                inputs = [torch.round(x) if x.is_floating_point() else x for x in inputs]
            check_against_autograd(g, wrt, inputs, {}, seed=trial)


@pytest.mark.parametrize(
    "op", ["exp", "erf", "rsqrt", "pow", "div", "contract", "gather", "take", "reduce"]
)
def test_vjp_rule_matches_finite_differences(op):
    """Central differences on the first case of each (smooth where the data lie)."""
    from linnet.torch.interpreter import run_graph

    g = CASES[op][0] if op != "reduce" else CASES["reduce"][-1]  # prod over every axis
    rng = np.random.default_rng(7)
    inputs = [x.abs() + 0.5 if x.is_floating_point() else x for x in _data(g, rng)]
    float_at = [k for k, r in enumerate(g.inputs) if g.values[r].dtype == F]
    wrt = [g.inputs[k] for k in float_at]
    out = g.values[g.outputs[0]]
    cot = torch.tensor(rng.standard_normal(out.shape))
    grads = run_graph(differentiate(g, wrt, "cotangents"), [*inputs, cot], {}, {})[1:]
    eps = 1e-6
    for k, d in zip(float_at, grads):
        flat = inputs[k].reshape(-1)
        for e in range(min(flat.numel(), 6)):
            plus, minus = [x.clone() for x in inputs], [x.clone() for x in inputs]
            plus[k].reshape(-1)[e] += eps
            minus[k].reshape(-1)[e] -= eps
            fp = (run_graph(g, plus, {}, {})[0] * cot).sum()
            fm = (run_graph(g, minus, {}, {})[0] * cot).sum()
            assert abs(float((fp - fm) / (2 * eps)) - float(d.reshape(-1)[e])) < 1e-5


def test_a_state_written_with_a_differentiated_value_and_read_back_is_an_error():
    g = graph(
        {"x": ((2, 3), F), "i": ((2,), "i64")},
        [
            ("scatter", ["@s", "%x", "%i"], "", (), "", {"indexed_axes": 1, "path": "s"}),
            (
                "reduce",
                ["@s"],
                "%r",
                (3,),
                F,
                {"kind": "sum", "axes": [0], "accumulate": F, "identity": 0.0},
            ),
        ],
        ["%r"],
    )
    g.states = {"s": ValueType((4, 3), F)}
    with pytest.raises(LinnetError) as err:
        differentiate(g, ["x"], "cotangents")
    assert err.value.diagnostics[0].code == "E0953"


# ---------------------------------------------------------------- random programs
@budget(60)
@given(index_programs())
def test_random_index_programs_match_autograd(case):
    program = Program.from_text(case.source)
    errors = check_program(program)
    if errors and all(d.code == "E0383" for d in errors):
        return  # a documented limitation (see test_properties)
    assert not errors, case.source
    g = widen(lower(program, "run", case.inputs, case.config, check=False))
    wrt = [r for r in g.inputs if g.values[r].dtype == F]
    if not wrt:
        return
    inputs = []
    from linnet.torch.interpreter import DTYPES

    for ref in g.inputs:
        data = case.data[ref[1:]]
        inputs.append(torch.tensor(np.asarray(data), dtype=DTYPES[g.values[ref].dtype]))
    check_against_autograd(g, wrt, inputs, {}, rtol=1e-7, atol=1e-7)


# ---------------------------------------------------------------- scatter_add, three ways
@pytest.mark.parametrize("bounds", ["zero", "unchecked"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_scatter_add_is_one_primitive_in_the_reference_interpreter_and_generated_source(
    bounds, k, tmp_path
):
    """The NumPy reference, the PyTorch interpreter and the generated source agree on
    scatter_add, coinciding positions (they add up) and, for bounds zero, positions outside
    the axes (dropped) included."""
    import importlib.util

    import reference
    from linnet.lang.emit.torch import emit_torch
    from linnet.torch.interpreter import run_graph as torch_run

    rng = np.random.default_rng(k)
    xs, idx_shape = (4, 3, 2), (5,)
    inputs = {"x": (xs, F), "v": (idx_shape[:1] * (k > 0) + xs[k:], F)}
    if k == 0:
        inputs["v"] = (xs, F)
    for a in range(k):
        inputs[f"i{a}"] = ((5,), "i64")
    g = graph(
        inputs,
        [
            (
                "scatter_add",
                ["%x", "%v", *[f"%i{a}" for a in range(k)]],
                "%r",
                xs,
                F,
                {"indexed_axes": k, "bounds": bounds},
            )
        ],
        ["%r"],
    )
    data = {"x": rng.standard_normal(xs), "v": rng.standard_normal(inputs["v"][0])}
    for a in range(k):
        lo = -2 if bounds == "zero" else 0
        data[f"i{a}"] = rng.integers(lo, xs[a] + (2 if bounds == "zero" else 0), size=5)
        data[f"i{a}"][1] = data[f"i{a}"][0]  # a repeated position
    (want,) = reference.run_graph(g, data, {}, {})
    tensors = [torch.tensor(data[r[1:]]) for r in g.inputs]
    (got,) = torch_run(g, tensors, {}, {})
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    path = tmp_path / f"scatter_add_{bounds}_{k}.py"
    path.write_text(emit_torch(g))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (emitted,) = module.run(*tensors, {}, {})
    np.testing.assert_allclose(emitted.numpy(), want, rtol=1e-12)
