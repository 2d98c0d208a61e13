"""Static range slices (issue 19): `w[0..Q, ..]`, `qkv[.., Q..Q + K]` lower to one `slice`
step (never a gather), run equal to NumPy's slicing in the reference interpreter, and are
generated as Python slicing; their mistakes are coded (E0121, E0343-E0346, golden cases in
diagnostics/cases/slice_*)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import Graph, LinnetError, Program, Step, ValueType, check_text, lower
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.verify import verify
from reference import run_graph

SPLIT = """
pub op split<N: Dim, K: Dim>(qkv: Tensor[N, 3 * K; f32]) -> Tensor[N, K; f32] {
    let q = qkv[.., 0..K]
    let k = qkv[:, K..2 * K]
    let v = qkv[.., 2 * K..]
    let y[n, j] = k[n, j] + v[n, j] * q[n, j]
    return y
}

pub model M<N: Dim, K: Dim> {
    param w: Tensor[3 * K, N; f32]
    state c: Tensor[3 * K, N; f32]

    entry run(x: Tensor[N, 3 * K; f32]) -> Tensor[N, K; f32] {
        let top = self.w[..K, ..]
        let mid = self.c[K..=2 * K - 1, ..]
        let z[n, j] = split<N, K>(x)[n, j] + top[j, n] + mid[j, n]
        return z
    }
}
"""


def _graph(n: int = 2, k: int = 4) -> Graph:
    return lower(Program.from_text(SPLIT, "s"), "run", {"x": [n, 3 * k]}, {"N": n, "K": k})


def test_every_form_lowers_to_one_slice_step():
    g = _graph()
    slices = [s for s in g.steps if s.op == "slice"]
    assert [(s.attributes["starts"], s.attributes["limits"]) for s in slices] == [
        ([0, 0], [4, 2]),  # self.w[..K, ..]
        ([4, 0], [8, 2]),  # self.c[K..=2 * K - 1, ..]
        ([0, 0], [2, 4]),  # qkv[.., 0..K]
        ([0, 4], [2, 8]),  # qkv[:, K..2 * K]
        ([0, 8], [2, 12]),  # qkv[.., 2 * K..]
    ]
    assert not {"gather", "take"} & {s.op for s in g.steps}
    assert [tuple(g.values[s.results[0]].shape) for s in slices] == [(4, 2)] * 2 + [(2, 4)] * 3


def test_slices_run_as_numpy_slicing():
    g = _graph()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 12)).astype(np.float32)
    w = rng.normal(size=(12, 2)).astype(np.float32)
    c = rng.normal(size=(12, 2)).astype(np.float32)
    (z,) = run_graph(g, {"x": x}, {"w": w}, {"c": c})
    q, k, v = x[:, 0:4], x[:, 4:8], x[:, 8:12]
    np.testing.assert_allclose(z, k + v * q + w[0:4].T + c[4:8].T, rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_any_ranges_match_numpy(shape, data):
    """Random shapes and in-range bounds (literal ones): the graph's result is numpy's."""
    ranges = []
    for size in shape:
        a = data.draw(st.integers(0, size))
        b = data.draw(st.integers(a, size))
        ranges.append((a, b))
    dims = ", ".join(map(str, shape))
    out = ", ".join(str(b - a) for a, b in ranges)
    idx = ", ".join(f"{a}..{b}" for a, b in ranges)
    src = f"""
pub model M {{
    entry run(x: Tensor[{dims}; f32]) -> Tensor[{out}; f32] {{
        return x[{idx}]
    }}
}}
"""
    g = lower(Program.from_text(src, "m"), "run", {"x": shape}, {})
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    (y,) = run_graph(g, {"x": x}, {}, {})
    np.testing.assert_array_equal(y, x[tuple(slice(a, b) for a, b in ranges)])


def test_generated_source_slices_views_and_copies_states():
    text = emit_torch(_graph())
    assert "top = w[0:4]\n" in text  # trailing whole axes are left out
    assert "mid = c[4:8].clone()\n" in text  # a state's view would see its next write
    assert "q = x[:, 0:4]\n" in text and "v = x[:, 8:12]\n" in text
    assert "index_select" not in text and ".long()" not in text
    assert "# s.linnet:3\n    q = x[:, 0:4]" in text  # traceable to its line


def test_generic_dims_check_before_lowering():
    check_text(SPLIT, "s")  # symbolic K: the shapes are K, 2 * K - K, 3 * K - 2 * K


def test_the_verifier_rejects_a_bad_slice():
    g = Graph(
        "run",
        "M",
        inputs=["%x"],
        outputs=["%y"],
        values={"%x": ValueType((4,), "f32"), "%y": ValueType((3,), "f32")},
    )
    g.steps = [Step("slice", ["%x"], ["%y"], {"starts": [2], "limits": [5]})]
    with pytest.raises(LinnetError) as info:
        verify(g)
    # E0685 (was E0926, "no valid type"): the slice's rule in ir/shapes.SHAPE_RULES rejects it.
    assert info.value.diagnostics[0].code == "E0685"
    assert "out of an operand of shape [4]" in info.value.diagnostics[0].message
    g.steps = [Step("slice", ["%x"], ["%y"], {"starts": [0], "limits": [2]})]
    with pytest.raises(
        LinnetError,
        match=r"makes f32\[3\], but its operands and attributes "
        r"make f32\[2\]",
    ):
        verify(g)
    g.steps = [Step("slice", ["%x"], ["%y"], {"starts": [1], "limits": [4]})]
    verify(g)


@pytest.mark.parametrize(
    "body,code",
    [
        ("let y = x[1..=]", "E0121"),
        ("let y[n: N] = x[0..N] * 2.0", "E0343"),
        ("let y = x[0..N] + x[0] * 0.0 + (0..N)", "E0334"),
        ("let y = x[0..N, 0]", "E0303"),
        ("let y = x[s..s + N]", "E0345"),
    ],
)
def test_mistakes_are_coded(body, code):
    src = f"""
pub op f<N: Dim>(x: Tensor[2 * N; f32], s: f32) -> Tensor[N; f32] {{
    {body}
    return y
}}
"""
    with pytest.raises(LinnetError) as info:
        check_text(src, "m")
    assert code in [d.code for d in info.value.diagnostics]


def test_a_range_past_the_axis_is_found_when_lowering():
    src = """
pub model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[3; f32] {
        return x[2..5]
    }
}
"""
    prog = Program.from_text(src, "m")
    assert lower(prog, "run", {"x": [5]}, {"N": 5}).steps[0].op == "slice"
    with pytest.raises(LinnetError) as info:
        lower(prog, "run", {"x": [4]}, {"N": 4})
    assert info.value.diagnostics[0].code == "E0346"
