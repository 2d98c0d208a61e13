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

`bitcast<T>(x)` keeps every bit at these values too (NaN payloads, subnormals, -0.0,
infinities): the interpreter, generated PyTorch and generated JAX on every same-width pair
(linnet-lang's tests/bitcast_cases.py), and a tile kernel (tests/kernels/bitcast.linnet) as its
op's body, with the nibble-in-the-mantissa of int4 dequantisation.
"""

from __future__ import annotations

import importlib.util
import math
import sys
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "linnet-lang" / "tests"))
import bitcast_cases  # linnet-lang's tests: the model and its inputs' bits

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


# ---------------------------------------------------------------- bitcast keeps the bits
@pytest.fixture(scope="module")
def bits_graph():
    from linnet.lang import Program

    bc = bitcast_cases
    return lower(Program.from_text(bc.SOURCE), "run", {k: [bc.N] for k in bc.INPUTS}, {"N": bc.N})


def test_a_bitcast_keeps_every_bit_in_the_interpreter_and_generated_pytorch(bits_graph):
    bc = bitcast_cases
    bc.check(run_graph(bits_graph, bc.tensors(), {}, {}), "interpreter")
    text = emit_torch(bits_graph)
    assert ".view(torch.float32)" in text and ".view(torch.bfloat16)" in text
    bc.check(list(_generated(text, bits_graph, bc.tensors())), "generated")


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")
def test_a_bitcast_keeps_every_bit_in_generated_jax(bits_graph):
    import jax
    from linnet.lang.emit.jax import emit_jax

    text = emit_jax(bits_graph)
    assert "lax.bitcast_convert_type(" in text
    ns: dict = {}
    exec(compile(text, "generated_jax", "exec"), ns)
    fn = ns[ns["ENTRIES"]["run"]["function"]]
    with jax.enable_x64(True):  # the i64 and f64 pairs
        out, _ = jax.jit(lambda *a: fn(*a, {}, {}))(*bitcast_cases.arrays())
    bitcast_cases.check(list(out), "generated JAX")


def test_a_bitcast_of_a_state_is_a_copy_not_a_view_of_it():
    """A view of the state would change with the state's next write: the result read before
    the write keeps the bits it had (the interpreter and generated PyTorch)."""
    from linnet.lang import Program

    src = """
model M<N: Dim> {
    state s: Tensor[N; i32]
    entry run(x: Tensor[N; i32]) -> Tensor[N; f32] {
        let before = bitcast<f32>(self.s)
        self.s[i] = x[i]
        return before
    }
}
"""
    g = lower(Program.from_text(src), "run", {"x": [3]}, {"N": 3})
    x = torch.tensor([7, 8, 9], dtype=torch.int32)
    for name in ("interpreter", "generated"):
        state = {"s": torch.tensor([1065353216, -1082130432, 0], dtype=torch.int32)}
        if name == "interpreter":
            (out,) = run_graph(g, [x], {}, state)
        else:
            ns: dict = {}
            exec(compile(emit_torch(g), "generated", "exec"), ns)
            outs = ns[ns["ENTRIES"]["run"]["function"]](x, {}, state)
            out = outs[0][0] if isinstance(outs[0], tuple) else outs[0]
        assert out.tolist() == [1.0, -1.0, 0.0], name


KERNEL_BITS = Path(__file__).parent / "kernels" / "bitcast.linnet"
BITS_INPUTS = {
    "b": (torch.uint8, [0, 15, 16, 255, 37, 128, 7, 200]),
    # 1.0, a NaN with every payload bit, the smallest subnormal, a NaN with a payload,
    # -1.0, a small integer's bits, inf, -0.0
    "w": (torch.int32, [0x3F800000, -1, 1, 0x7FC00001, -0x40800000, 12345, 0x7F800000, -(2**31)]),
    # f16: 1.0, -2.5, the largest finite, NaN, a subnormal, -0.0, inf, 0.1
    "h": (torch.float16, [1.0, -2.5, 65504.0, math.nan, 6e-8, -0.0, math.inf, 0.1]),
}


def bits_kernel_args(device: str = "cpu") -> list[torch.Tensor]:
    return [torch.tensor(v, dtype=dt, device=device) for dt, v in BITS_INPUTS.values()]


def bits_kernel_rules(args: list[torch.Tensor]) -> list[list[int]]:
    """tests/kernels/bitcast.linnet's results as bit patterns (signed), from the inputs' own
    bits: 1 + (b % 16) / 128 as f32, w's bits as f32 and back, h's as i16, b's as i8."""
    b, w, h = (a.cpu() for a in args)
    nib = torch.tensor([1.0 + (v % 16) / 128 for v in b.tolist()], dtype=torch.float32)
    return [
        nib.view(torch.int32).tolist(),
        w.tolist(),
        w.tolist(),
        h.view(torch.int16).tolist(),
        b.view(torch.int8).tolist(),
    ]


def signed_bits(t: torch.Tensor) -> list[int]:
    if not t.is_floating_point():
        return t.cpu().tolist()
    return t.cpu().view({2: torch.int16, 4: torch.int32}[t.element_size()]).tolist()


@pytest.mark.gpu
def test_a_kernel_reads_bits_as_its_body_does_on_cuda(monkeypatch):
    """Compiled Triton's `x.to(tl.float32, bitcast=True)`: the body's bits, NaN payloads and
    subnormals included (no flush, no canonical NaN)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.torch import load

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = bits_kernel_args("cuda")
    fast = load(KERNEL_BITS, weights={}, device="cuda", numerics="fast")
    got = fast.run("run", args)
    assert fast.module("run", args).RUNS == {"bits_tiles_8_4": [1, 0]}
    want = load(KERNEL_BITS, weights={}, device="cuda", numerics="exact").run("run", args)
    rules = bits_kernel_rules(args)
    for k, (g, w) in enumerate(zip(got, want)):
        assert signed_bits(g) == signed_bits(w) == rules[k], k
