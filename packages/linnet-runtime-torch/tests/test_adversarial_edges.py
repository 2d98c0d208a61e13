"""Adversarial edge values (issue 38 item 5): NaN through max/min, floats past an integer
type, subnormal floors and integer division by zero give the rule of docs/language.md
("Edge values", linnet.lang.ir.edges) on the PyTorch interpreter, generated PyTorch and
generated JAX, computed here from the rules' Python definitions (not from another runtime).
The conformance table's `edges` rows run the same entries on every runtime, exports too.

Before the fix: integer division and remainder by zero raised a raw ZeroDivisionError
(RuntimeError) in the interpreter and generated PyTorch and gave -1 and other numbers in JAX;
`inf as i32` gave -2147483648 in PyTorch and 2147483647 in JAX; `300.0 as i8` 44 against 127;
generated JAX floored -1e-45 to -0.0.

Tile kernels (issue 46): a kernel bound to an op (tests/kernels/edges.linnet) gave other
values than the op's body: Triton's `tl.maximum` and `tl.max` skipped NaN, its integer `/`
and `%` by 0 gave NumPy's 0 and 0 (interpreted; garbage on a GPU), `inf as i32` gave
-2147483648 and `300.0 as i8` 44; Pallas's gave -2 for `7 / 0`, 0 for `7 % 0` and -0.0 for
`floor(-1e-45)`. Interpreted in kernels_interpreted.py and test_jax_pallas.py; on a GPU here.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from linnet.lang import lower
from linnet.lang.emit.torch import emit_torch
from linnet.lang.host.loading import load_program
from linnet.lang.ir import edges as E
from linnet.torch import conformance as conf
from linnet.torch import run_graph

CASES = {c.entry: c for c in conf.edge_cases()}


def _flat(case: conf.Case, name: str) -> list:
    return list(case.inputs[name][1])


def expected(entry: str, case: conf.Case) -> list:
    """Each entry's result by the rules' Python definitions (row-major)."""
    if entry in ("max_nan", "min_nan"):
        kind = entry[:3]
        return [E.nan_extreme(a, b, kind) for a, b in zip(_flat(case, "a"), _flat(case, "b"))]
    if entry.startswith("reduce_"):
        kind, rows = entry[7:10], _flat(case, "a")
        out = []
        for r in range(3):
            row = rows[8 * r : 8 * r + 8]
            value = row[0]
            for v in row[1:]:
                value = E.nan_extreme(value, v, kind)
            out.append(value)
        return out
    if entry.startswith("to_"):
        return [E.float_to_int(v, entry[3:]) for v in _flat(case, "x")]
    if entry == "floor_tiny":
        return [E.floor(v) for v in _flat(case, "x")]
    a, b = _flat(case, "a"), _flat(case, "b")
    if entry == "int_div":
        return [E.int_div(x, y, "i32") for x, y in zip(a, b)]
    if entry == "int_rem":
        return [E.int_rem(x, y) for x, y in zip(a, b)]
    return [E.float_rem(x, y) for x, y in zip(a, b)]


def same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        (isinstance(w, float) and math.isnan(w) and math.isnan(g)) or g == w
        for g, w in zip(got, want)
    )


@pytest.fixture(scope="module")
def graphs():
    program, _ = load_program(conf.EDGES)
    return {
        entry: lower(
            program, entry, {k: list(v[0]) for k, v in c.inputs.items()}, c.config, check=False
        )
        for entry, c in CASES.items()
    }


def _inputs(case: conf.Case) -> list[np.ndarray]:
    arrays = conf.make_inputs(case)
    return [arrays[name] for name in case.inputs]


def _generated(text: str, graph, args: list) -> list:
    ns: dict = {}
    exec(compile(text, "generated", "exec"), ns)
    out = ns[ns["ENTRIES"][graph.entry]["function"]](*args, {}, {})
    return out[0] if isinstance(out[0], tuple) else out


@pytest.mark.parametrize("entry", sorted(CASES))
def test_the_interpreter_and_generated_pytorch_follow_the_rule(entry, graphs):
    case, graph = CASES[entry], graphs[entry]
    want = expected(entry, case)
    args = [torch.from_numpy(a.copy()) for a in _inputs(case)]
    (interpreted,) = run_graph(graph, args, {}, {})
    assert same(interpreted.reshape(-1).tolist(), want), ("interpreter", entry)
    (generated,) = _generated(emit_torch(graph), graph, args)
    assert same(generated.reshape(-1).tolist(), want), ("generated", entry)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")
@pytest.mark.parametrize("entry", sorted(CASES))
def test_generated_jax_follows_the_rule(entry, graphs):
    import jax
    from linnet.lang.emit.jax import emit_jax

    case, graph = CASES[entry], graphs[entry]
    text = emit_jax(graph)
    ns: dict = {}
    exec(compile(text, "generated_jax", "exec"), ns)
    fn = ns[ns["ENTRIES"][entry]["function"]]
    (out,), _ = jax.jit(lambda *a: fn(*a, {}, {}))(*_inputs(case))
    assert same(np.asarray(out).reshape(-1).tolist(), expected(entry, case)), entry


def test_every_rule_has_a_conformance_row():
    rules = {
        "max_nan",
        "min_nan",
        "reduce_max_nan",
        "reduce_min_nan",
        "to_i32",
        "to_i8",
        "to_u8",
        "floor_tiny",
        "int_div",
        "int_rem",
        "float_rem",
    }
    assert set(CASES) == rules
    names = {c.name for c in conf.cases()}
    assert {f"edges {r}" for r in rules} <= names


# ---------------------------------------------------------------- tile kernels
KERNEL_EDGES = Path(__file__).parent / "kernels" / "edges.linnet"
_NAN, _INF, _MIN = math.nan, math.inf, -(2**31)
KERNEL_INPUTS = {
    "x": [_NAN, 1.0, -2.0, 3e9, -_INF, _INF, 0.5, -7.9],
    "y": [2.0, _NAN, -1.0, 300.0, -300.0, _NAN, -0.0, 1.5],
    "z": [-1e-45, -1e-30, -0.0, 0.0, 1e-45, -0.5, -1.5, 2.5],
    "a": [7, -7, 5, _MIN, _MIN, 0, 9, -9],
    "b": [0, 0, 2, -1, 1, 0, -2, 4],
}


def kernel_rules() -> list[list]:
    """Each result of tests/kernels/edges.linnet on KERNEL_INPUTS, by the rules' Python
    definitions (the f32 inputs rounded to f32 first)."""
    x, y, z = (torch.tensor(KERNEL_INPUTS[k], dtype=torch.float32).tolist() for k in "xyz")
    a, b = KERNEL_INPUTS["a"], KERNEL_INPUTS["b"]
    top = [E.nan_extreme(*x[:2], "max"), E.nan_extreme(*y[:2], "min"), max(z)]
    for v in x[2:]:
        top[0] = E.nan_extreme(top[0], v, "max")
    for v in y[2:]:
        top[1] = E.nan_extreme(top[1], v, "min")
    return [
        [E.nan_extreme(p, q, "max") for p, q in zip(x, y)],
        [E.nan_extreme(p, q, "min") for p, q in zip(x, y)],
        [top[0], top[1]] + [top[2]] * 6,
        [E.int_div(p, q, "i32") for p, q in zip(a, b)],
        [E.int_rem(p, q) for p, q in zip(a, b)],
        [E.float_to_int(v, "i32") for v in x],
        [E.float_to_int(v, "i8") for v in y],
        [E.floor(v) for v in z],
    ]


def kernel_results_agree(got: list, want: list, rules: list) -> None:
    """The kernel's results equal the body's and the rules', NaN for NaN and the sign of a
    zero included."""
    for k, (g, w, r) in enumerate(zip(got, want, rules)):
        g, w = g.cpu().tolist(), w.cpu().tolist()
        assert same(g, w) and same(g, r), (k, g, w, r)
        assert [math.copysign(1, v) for v in g if v == 0] == [
            math.copysign(1, v) for v in r if v == 0
        ], (k, g, r)


@pytest.mark.gpu
def test_a_kernel_follows_the_edge_value_rules_on_cuda(monkeypatch):
    """On the GPU, Triton's compiled `max`/`min` (PTX max.f32 drops NaN), integer division
    by zero and out-of-range conversions are the hardware's: the kernel must still give the
    body's values."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.torch import load

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = [
        torch.tensor(
            KERNEL_INPUTS[k], dtype=torch.float32 if k in "xyz" else torch.int32, device="cuda"
        )
        for k in "xyzab"
    ]
    fast = load(KERNEL_EDGES, weights={}, device="cuda", numerics="fast")
    got = fast.run("run", args)
    assert fast.module("run", args).RUNS == {"edge_tiles_8": [1, 0]}
    want = load(KERNEL_EDGES, weights={}, device="cuda", numerics="exact").run("run", args)
    kernel_results_agree(got, want, kernel_rules())
