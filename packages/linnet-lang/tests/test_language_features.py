"""Issue 19's language features besides slices: constants inside composite indices,
unpacking several results at a call site, block config arguments, and a model's configs
reaching the blocks that declare them. Each runs in the NumPy reference interpreter and is
compared with NumPy; mistakes are coded (golden cases unpack_*, block_config_*)."""

from __future__ import annotations

import numpy as np
import pytest
from linnet.lang import LinnetError, Program, check_text, lower
from linnet.lang.emit.torch import emit_torch
from reference import run_graph

HALVES = """
fn halves<N: Dim, F: Dim>(gu: Tensor[N, 2 * F; f32]) -> (Tensor[N, F; f32], Tensor[N, F; f32]) {
    let gate[n, f: F] = gu[n, (0, f)]
    let up[n, f: F] = gu[n, (1, f)]
    return gate, up
}

pub model M<N: Dim, F: Dim> {
    entry run(x: Tensor[N, 2 * F; f32]) -> Tensor[N, F; f32] {
        let (gate, up) = halves<N, F>(x)
        let y[n, f] = gate[n, f] * 10.0 + up[n, f]
        return y
    }
}
"""


def test_constants_inside_composite_indices_and_unpacking():
    g = lower(Program.from_text(HALVES, "h"), "run", {"x": [2, 6]}, {"N": 2, "F": 3})
    assert "gather" not in {s.op for s in g.steps}
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = run_graph(g, {"x": x}, {}, {})
    np.testing.assert_array_equal(y, x[:, :3] * 10 + x[:, 3:])
    text = emit_torch(g)
    assert ".select(1, 0)" in text and ".select(1, 1)" in text  # views, no gather


def test_a_composite_with_an_expression_part():
    src = """
pub op odd<N: Dim>(x: Tensor[2 * N; f32]) -> Tensor[N; f32] {
    let y[n: N] = x[(n, 2 - 1)]
    return y
}
pub model M<N: Dim> {
    entry run(x: Tensor[2 * N; f32]) -> Tensor[N; f32] {
        return odd(x)
    }
}
"""
    g = lower(Program.from_text(src, "o"), "run", {"x": [8]}, {"N": 4})
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run_graph(g, {"x": x}, {}, {})[0], x[1::2])


def test_two_unsized_parts_are_coded():
    src = """
pub op f<N: Dim>(x: Tensor[4 * N; f32]) -> Tensor[N; f32] {
    let y[n: N] = x[(0, 1, n)]
    return y
}
"""
    with pytest.raises(LinnetError) as info:
        check_text(src, "f")
    assert info.value.diagnostics[0].code == "E0307"
    assert "computed parts" in info.value.diagnostics[0].message


CONFIGS = """
block Norm<D: Dim> {
    config rms_norm_eps: f32 = 0.001
    config offset: bool = false
    param weight: Tensor[D; f32]

    fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
        let ms[n] = mean[d] x[n, d] * x[n, d]
        let w = if offset { 1.0 } else { 0.0 }
        let y[n, d] = x[n, d] * rsqrt(ms[n] + rms_norm_eps) * (self.weight[d] + w)
        return y
    }
}

block Layer<D: Dim> {
    block a: Norm<D>
    block b: Norm<D>(offset = true)

    fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
        return self.b(self.a(x))
    }
}

pub model M<D: Dim, L: Dim> {
    config rms_norm_eps: f32 = 0.5
    block layers: [Layer<D>; L]

    entry run<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
        let h = x
        for layer in self.layers {
            h = layer(h)
        }
        return h
    }
}
"""


def _norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("eps", [None, 0.25])
def test_block_configs_and_model_configs_reaching_blocks(eps):
    config = {"D": 4, "L": 2} | ({"rms_norm_eps": eps} if eps is not None else {})
    g = lower(Program.from_text(CONFIGS, "c"), "run", {"x": [3, 4]}, config)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    params = {p: rng.normal(size=vt.shape).astype(np.float32) for p, vt in g.parameters.items()}
    (y,) = run_graph(g, {"x": x}, params, {})
    e = 0.5 if eps is None else eps  # the model's config, not Norm's default 0.001
    want = x
    for i in range(2):
        want = _norm(want, params[f"layers.{i}.a.weight"], e)
        want = _norm(want, params[f"layers.{i}.b.weight"] + 1.0, e)  # offset = true
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_a_block_alone_keeps_its_default():
    src = CONFIGS.replace("    config rms_norm_eps: f32 = 0.5\n", "")
    g = lower(Program.from_text(src, "c"), "run", {"x": [1, 4]}, {"D": 4, "L": 1})
    consts = [s.attributes["value"] for s in g.steps if s.op == "constant"]
    assert 0.001 in consts and 0.5 not in consts


@pytest.mark.parametrize(
    "change,code",
    [
        ("block b: Norm<D>(offset = true)", "block b: Norm<D>(ofset = true)"),
        ("block b: Norm<D>(offset = true)", "block b: Norm<D>(offset = 1.0)"),
        ("config rms_norm_eps: f32 = 0.5", "config rms_norm_eps: bool = true"),
    ],
)
def test_config_mistakes_are_coded(change, code):
    with pytest.raises(LinnetError) as info:
        lower(
            Program.from_text(CONFIGS.replace(*([change, code])), "c"),
            "run",
            {"x": [1, 4]},
            {"D": 4, "L": 1},
        )
    found = info.value.diagnostics[0].code
    assert found == ("E0210" if "ofset" in code else "E0613"), found
