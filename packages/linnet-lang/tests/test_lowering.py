"""Lowering the Llama example and the graph format's invariants."""

import json
from pathlib import Path

import pytest
from linnet.lang import Graph, LinnetError, Program, check_file, lower
from linnet.lang.ir.primitives import PRIMITIVES

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def config(name: str, **extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


@pytest.fixture(scope="module")
def program() -> Program:
    return check_file(LLAMA)


@pytest.mark.parametrize("name", ["toy", "llama-3.2-1b", "llama-3-8b"])
@pytest.mark.parametrize(
    "entry,inputs", [("decode", {"token": [1], "pos": [1]}), ("prefill", {"tokens": [1, 8]})]
)
def test_llama_lowers(program, name, entry, inputs):
    g = lower(program, entry, inputs, config(name), check=False)
    layers = config(name)["NL"]
    linears = g.semantic_calls("std.nn.linear::linear")
    tied = config(name)["tie_word_embeddings"]
    # q, k, v, o, gate, up, down per layer, plus the LM head (tied: a linear too).
    assert len(linears) == 7 * layers + 1
    for i in range(layers):
        paths = [c.path for c in linears if c.path.startswith(f"model.layers.{i}.")]
        assert paths[:3] == [f"model.layers.{i}.self_attn.{p}_proj" for p in "qkv"]
    assert ("lm_head.weight" in g.parameters) == (not tied)
    assert all(s.op in PRIMITIVES for s in g.steps)
    out = g.values[g.outputs[0]]
    assert out.dtype == "f32"
    assert out.shape[-1] == config(name)["V"]


def test_semantic_call_spans_cover_their_steps(program):
    g = lower(program, "decode", {"token": [2], "pos": [2]}, config("toy"), check=False)
    for call in g.calls:
        assert 0 <= call.start <= call.stop <= len(g.steps)
    q = g.semantic_calls("std.nn.linear::linear")[0]
    step = g.steps[q.start]
    assert step.op == "contract"
    assert step.parameters() == ["model.layers.0.self_attn.q_proj.weight"]


def test_graph_json_round_trip(program):
    g = lower(program, "prefill", {"tokens": [1, 4]}, config("toy"), check=False)
    text = g.dumps()
    again = Graph.loads(text)
    assert again.dumps() == text
    data = json.loads(text)
    assert data["format"] == "linnet.graph" and data["version"] == 1


def test_graph_version_mismatch_is_a_linnet_error():
    with pytest.raises(LinnetError) as err:
        Graph.from_json({"format": "linnet.graph", "version": 999})
    assert err.value.diagnostics[0].code == "E0901"


def test_states_are_written_in_place(program):
    g = lower(program, "decode", {"token": [1], "pos": [1]}, config("toy"), check=False)
    writes = [s for s in g.steps if s.op == "scatter"]
    assert [s.attributes["path"] for s in writes[:2]] == [
        "model.layers.0.self_attn.k_cache",
        "model.layers.0.self_attn.v_cache",
    ]
    assert g.states["model.layers.0.self_attn.k_cache"].shape == (1, 128, 2, 16)


def test_dims_from_weights(program):
    cfg = config("toy")
    weights = {}
    g = lower(program, "decode", {"token": [1], "pos": [1]}, cfg, check=False)
    for path, vt in g.parameters.items():
        weights[path] = (vt.shape, vt.dtype)
    for key in ("V", "D", "F", "NL", "HD"):
        cfg.pop(key)
    g2 = lower(program, "decode", {"token": [1], "pos": [1]}, cfg, weights, check=False)
    assert g2.dims["V"] == 256 and g2.dims["NL"] == 2 and g2.dims["F"] == 128
    assert g2.dims["G"] == 2


def test_missing_config_names_the_dims(program):
    with pytest.raises(LinnetError) as err:
        lower(program, "decode", {"token": [1], "pos": [1]}, {"T": "f32"}, check=False)
    assert err.value.diagnostics[0].code == "E0603"
    assert "`V`" in err.value.diagnostics[0].message


def test_spec_kernel_checks():
    text = (ROOT / "packages/linnet-lang/src/linnet/lang/std/nn/activation.linnet").read_text()
    assert "kernel row_softmax" in text
    Program.from_text(text, "activation")


def test_kernel_binding_recorded_on_the_call():
    prog = Program.from_text("""
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        return softmax(x)
    }
}
""")
    g = lower(prog, "run", {"x": [3, 5]})
    call = g.semantic_calls("std.nn.activation::softmax")[0]
    assert call.attributes["kernel"] == "std.nn.activation::row_softmax"
    assert call.attributes["kernel_generics"] == {"R": 3, "C": 5, "B": 1024}
    assert call.attributes["kernel_applies"] is True
    g = lower(prog, "run", {"x": [3, 2000]})
    assert g.semantic_calls("std.nn.activation::softmax")[0].attributes["kernel_applies"] is False


@pytest.mark.parametrize(
    "entry,inputs", [("decode", {"token": [1], "pos": [1]}), ("prefill", {"tokens": [1, 8]})]
)
def test_every_layer_is_one_slice_kind(program, entry, inputs):
    from linnet.lang.passes.slices import cut

    g = lower(program, entry, inputs, config("llama-3-8b"), check=False)
    slices = cut(g)
    layers = [s for s in slices if s.prefix.startswith("model.layers.")]
    assert len(layers) == 32
    assert len({s.kind for s in layers}) == 1
    assert len({s.kind for s in slices}) == 3  # glue before, the layers, glue after


def test_a_repeated_index_takes_its_range_from_its_first_use():
    # `i` is plain in the composite (i, k) and repeated (a computed position) at the last axis:
    # only the first use gives its range; the repeat reads 0 where it falls outside.
    prog = Program.from_text("""
model M {
    entry run(t: Tensor[1, 2, 1; f32]) -> Tensor[2, 1; f32] {
        let y[(i, j: 1), l: 1] = sum[k: 1] t[j, (i, k), i]
        return y
    }
}
""")
    g = lower(prog, "run", {"t": [1, 2, 1]})
    assert g.values[g.outputs[0]].shape == (2, 1)
