"""The checker's layout (issue 13): calls record repeated-block iterations, typing and folding
are per-primitive tables, and lowering keeps no process-global caches."""

import json
from pathlib import Path

import pytest
from linnet.lang import Graph, Program, check_file, lower
from linnet.lang.ir.graph import Call

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def config(name: str) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@pytest.fixture(scope="module")
def program() -> Program:
    return check_file(LLAMA)


# ---------------------------------------------------------------- Call.iteration / repeated

@pytest.mark.parametrize("entry,inputs", [("decode", {"token": [1], "pos": [1]}),
                                          ("prefill", {"tokens": [1, 4]})])
def test_toy_llama_layer_calls_carry_their_iteration(program, entry, inputs):
    cfg = config("toy")
    g = lower(program, entry, inputs, cfg, check=False)
    layer_calls = [c for c in g.calls if c.iteration is not None]
    assert [c.iteration for c in layer_calls] == list(range(cfg["NL"]))
    assert all(c.repeated == "model.layers" for c in layer_calls)
    assert [c.path for c in layer_calls] == [f"model.layers.{i}" for i in range(cfg["NL"])]
    assert all(c.callee == f"llama::DecoderLayer.{entry}" for c in layer_calls)
    # Calls nested inside a layer, and calls outside the stack, are not iterations themselves.
    others = [c for c in g.calls if c.iteration is None]
    assert all(c.repeated == "" for c in others)
    assert any(c.path.startswith("model.layers.0.") for c in others)


def test_iteration_survives_the_json_round_trip(program):
    g = lower(program, "decode", {"token": [1], "pos": [1]}, config("toy"), check=False)
    data = g.to_json()
    layer = [c for c in data["calls"] if "iteration" in c]
    assert [c["iteration"] for c in layer] == [0, 1]
    assert all(c["repeated"] == "model.layers" for c in layer)
    # Only set fields are written: a call outside the stack has neither key.
    assert all("repeated" not in c for c in data["calls"] if "iteration" not in c)
    back = Graph.loads(g.dumps())
    assert [(c.iteration, c.repeated) for c in back.calls] == \
        [(c.iteration, c.repeated) for c in g.calls]
    assert back.to_json() == data


def test_a_graph_without_the_fields_still_reads():
    call = Call("m::f", "fn", 0, 1, 0, "p")
    assert "iteration" not in call.to_json() and "repeated" not in call.to_json()
    g = Graph("run", "M", calls=[call])
    back = Graph.loads(g.dumps())
    assert back.calls[0].iteration is None and back.calls[0].repeated == ""
    zero = Call("m::f", "fn", 0, 1, 0, "layers.0", iteration=0, repeated="layers")
    assert zero.to_json()["iteration"] == 0  # 0 is set, not omitted


def test_an_indexed_block_records_its_iteration():
    prog = Program.from_text("""
block Scale<N: Dim> {
    param w: Tensor[N; f32]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i] * self.w[i]
        return y
    }
}
model M<N: Dim> {
    block layers: [Scale<N>; 3]
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y = self.layers[2](x)
        return self.layers[0](y)
    }
}
""")
    g = lower(prog, "run", {"x": [4]}, {"N": 4})
    got = [(c.iteration, c.repeated, c.path) for c in g.calls if c.iteration is not None]
    assert got == [(2, "layers", "layers.2"), (0, "layers", "layers.0")]
