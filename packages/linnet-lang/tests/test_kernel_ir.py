"""Kernels lowered to tile graphs (linnet.lang.ir.tiles): the spec's row_softmax, loops that
carry values, fn calls inlined, the binding recorded in the op's graph, and the codes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, check_text, lower
from linnet.lang.check.tile_lowering import lower_kernel
from linnet.lang.ir.graph import Graph
from linnet.lang.ir.primitives import PRIMITIVES
from linnet.lang.ir.tiles import TILE_PRIMITIVES

SOFTMAX_MODEL = """
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] { return softmax(x) }
}
"""

KERNELS = """
fn scaled<B: Dim>(v: Tensor[B; f32], s: f32) -> Tensor[B; f32] {
    let y[i] = v[i] * s
    return y
}

kernel twice<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid((N + B - 1) / B) {
    let cols = program_id(0) * B + iota<i32>(B)
    let v = load(x[cols], cols < N)
    store(y[cols], scaled(v, 2.0), cols < N)
}

kernel row_sums<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R; f32] grid(R)
where B <= C {
    let row = program_id(0)
    let acc = 0.0
    for cb in 0..(C + B - 1) / B {
        let cols = cb * B + iota<i32>(B)
        let v = load(x[row, cols], cols < C)
        acc = acc + sum[c] v[c]
    }
    store(y[row], acc)
}
"""


def kernels() -> Program:
    prog = check_text(KERNELS, "kernels")
    return prog


def test_tile_primitives_are_the_op_levels_and_the_kernels_own():
    assert TILE_PRIMITIVES - set(PRIMITIVES) == {"program_id", "load", "store", "atomic_add", "for"}
    # A tile is never gathered from, scattered into nor sliced: those primitives are not
    # tile ones; nor is a collective (a kernel runs on one device).
    assert set(PRIMITIVES) - TILE_PRIMITIVES == {
        "take",
        "gather",
        "scatter_add",
        "scatter",
        "slice",
        "all_reduce",
        "all_gather",
    }


def test_a_range_slice_inside_a_kernel_is_E0526():
    # Of a tile, and of a tensor parameter: a kernel loads the part it needs instead.
    assert codes("""
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(N)
    let v = load(x[cols])
    let part = v[0..2]
    store(y[cols], v)
}""") == ["E0526"]
    assert codes("""
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(N)
    let part = x[0..2]
    store(y[cols], load(x[cols]))
}""") == ["E0526"]


def test_row_softmax_lowers_to_a_tile_graph():
    prog = Program.from_text(SOFTMAX_MODEL)
    k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 4, "C": 8, "B": 16})
    assert k.grid == (4,) and k.params == [("x", (4, 8), "f32")]
    assert k.results == [("y", (4, 8), "f32")]
    assert [s.op for s in k.steps] == [
        "program_id",
        "iota",
        "constant",
        "lt",
        "load",
        "reduce",
        "sub",
        "exp",
        "reduce",
        "div",
        "store",
    ]
    load = k.steps[4]
    assert load.operands == ["@x", "%row", "%cols", "%mask"]
    assert load.attributes == {
        "index": [{"operand": 1}, {"operand": 2}],
        "mask": {"operand": 3},
        "other": -1e30,
    }
    assert k.values["%v"].shape == (16,) and k.values["%row"].shape == ()
    store = k.steps[-1]
    assert store.results == [] and store.operands[0] == "@y"
    assert store.loc == "std/nn/activation.linnet:23"
    assert k.loc == "std/nn/activation.linnet:16"


def test_fn_calls_inside_a_kernel_are_inlined():
    k = lower_kernel(kernels(), "kernels::twice", {"N": 10, "B": 4})
    assert k.grid == (3,)
    assert [s.op for s in k.walk()] == [
        "program_id",
        "constant",
        "mul",
        "iota",
        "add",
        "constant",
        "lt",
        "load",
        "constant",
        "mul",
        "store",
    ]


def test_a_loop_carries_values():
    k = lower_kernel(kernels(), "kernels::row_sums", {"R": 3, "C": 10, "B": 4})
    loop = next(s for s in k.steps if s.op == "for")
    a = loop.attributes
    assert (a["start"], a["stop"], a["step"]) == (0, 3, 1)
    assert len(loop.operands) == len(a["carried"]) == len(a["yields"]) == len(loop.results) == 1
    # the loop starts from the constant 0.0, made an f32 scalar value
    init = next(s for s in k.steps if s.results == loop.operands)
    assert init.op == "constant" and k.values[init.results[0]].dtype == "f32"
    body_ops = [s.op for s in a["body"]]
    assert "load" in body_ops and "reduce" in body_ops and body_ops[-1] == "add"
    assert a["yields"] == a["body"][-1].results
    store = k.steps[-1]
    assert store.op == "store" and store.operands[-1] == loop.results[0]


@settings(max_examples=25, deadline=None)
@given(r=st.integers(1, 64), c=st.integers(1, 64), b=st.sampled_from([16, 64, 128]))
def test_row_softmax_shapes_follow_the_generics(r, c, b):
    prog = Program.from_text(SOFTMAX_MODEL)
    if b < c:
        with pytest.raises(LinnetError) as info:
            lower_kernel(prog, "std.nn.activation::row_softmax", {"R": r, "C": c, "B": b})
        assert info.value.diagnostics[0].code == "E0535"
        return
    k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": r, "C": c, "B": b})
    assert k.grid == (r,) and k.values["%cols"].shape == (b,)
    assert k.steps[2].attributes["value"] == c  # the mask's bound, `cols < C`


def test_the_binding_reaches_the_graph_and_its_json():
    prog = Program.from_text(SOFTMAX_MODEL)
    g = lower(prog, "run", {"x": [3, 5]})
    (call,) = g.semantic_calls("std.nn.activation::softmax")
    assert call.attributes["kernel"] == "std.nn.activation::row_softmax"
    assert call.attributes["kernel_generics"] == {"R": 3, "C": 5, "B": 1024}
    assert call.attributes["kernel_applies"] is True
    again = Graph.loads(g.dumps())
    assert again.semantic_calls("std.nn.activation::softmax")[0].attributes == call.attributes
    wide = lower(prog, "run", {"x": [2, 2048]})
    assert (
        wide.semantic_calls("std.nn.activation::softmax")[0].attributes["kernel_applies"] is False
    )


def codes(text: str) -> list[str]:
    with pytest.raises(LinnetError) as info:
        check_text(text, "bad")
    return [d.code for d in info.value.diagnostics]


def test_loop_bounds_must_be_known():
    assert codes("""
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
    let acc = 0.0
    for i in 0..program_id(0) {
        acc = acc + 1.0
    }
    store(y[program_id(0)], acc)
}""") == ["E0530"]


def test_carried_values_keep_their_type():
    assert codes("""
kernel k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(B)
    let acc = load(x[cols], cols < N)
    for i in 0..4 {
        acc = sum[c] acc[c]
    }
    store(y[cols], acc, cols < N)
}""") == ["E0531"]


def test_lower_kernel_codes():
    prog = kernels()
    with pytest.raises(LinnetError, match="E0533"):
        lower_kernel(prog, "kernels::nothing", {})
    with pytest.raises(LinnetError, match="E0534"):
        lower_kernel(prog, "kernels::twice", {"N": 10})
    with pytest.raises(LinnetError, match="E0535"):
        lower_kernel(prog, "kernels::row_sums", {"R": 3, "C": 2, "B": 4})
    scalar = check_text(
        """
kernel k<N: Dim>(x: Tensor[N; f32], s: f32) -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(N)
    store(y[cols], load(x[cols]) * s)
}""",
        "scalar",
    )
    with pytest.raises(LinnetError, match="E0536"):
        lower_kernel(scalar, "scalar::k", {"N": 4})
    k = lower_kernel(scalar, "scalar::k", {"N": 4}, {"s": 0.5})
    assert k.scalars == {"s": 0.5}
    assert any(s.op == "constant" and s.attributes["value"] == 0.5 for s in k.steps)
