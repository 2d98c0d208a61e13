"""`linnet graph --grad` and `linnet torch --grad` (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

from linnet.lang import Graph
from linnet.lang.cli import main
from linnet.lang.ir.verify import verify

ROOT = Path(__file__).resolve().parents[3]
TINYLM = ROOT / "examples" / "tinylm" / "tinylm.linnet"
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
LOSS = [
    str(TINYLM),
    "--config",
    "tiny",
    "--entry",
    "loss",
    "--input",
    "tokens=8,4",
    "--input",
    "targets=8,4",
]


def test_graph_grad_json_is_a_valid_graph_of_outputs_then_gradients(capsys):
    assert main(["graph", *LOSS, "--grad", "--format", "json"]) == 0
    graph = Graph.from_json(json.loads(capsys.readouterr().out))
    verify(graph)
    assert graph.outputs[0] == "%loss"
    grads = graph.outputs[1:]
    assert len(grads) == len(graph.parameters) and "%d_head_weight" in grads
    for ref in grads:
        assert graph.values[ref].dtype == "f32"
    assert any(s.op == "scatter_add" for s in graph.steps)  # the embedding's transpose


def test_graph_grad_wrt_and_cotangents(capsys):
    args = [
        str(LLAMA),
        "--config",
        "toy",
        "--entry",
        "prefill",
        "--input",
        "tokens=1,4",
        "--grad",
        "--grad-seed",
        "cotangents",
        "--wrt",
        "model.norm.weight",
    ]
    assert main(["graph", *args]) == 0
    out = capsys.readouterr().out
    assert "input %d_out: f32[1, 4, 256]" in out
    assert out.rstrip().endswith("return %out, %d_model_norm_weight")


def test_torch_grad_writes_a_module_computing_the_gradients(tmp_path, capsys):
    target = tmp_path / "loss_grad.py"
    assert main(["torch", *LOSS, "--grad", "-o", str(target)]) == 0
    text = target.read_text()
    compile(text, str(target), "exec")
    assert "d_head_weight" in text and "torch.index_put(" in text


def test_grad_mistakes_are_coded(capsys):
    assert main(["graph", *LOSS, "--grad", "--wrt", "head.wieght"]) == 1
    assert "E0950" in capsys.readouterr().err
    assert main(["graph", *LOSS, "--grad", "--wrt", "tokens"]) == 1
    assert "E0951" in capsys.readouterr().err
    forward = [str(TINYLM), "--config", "tiny", "--entry", "forward", "--input", "tokens=8,4"]
    assert main(["graph", *forward, "--grad"]) == 1
    assert "E0952" in capsys.readouterr().err
    assert main(["graph", *forward, "--grad", "--grad-seed", "cotangents"]) == 0


def test_every_layers_backward_shares_one_generated_function(tmp_path, capsys):
    """As every layer's forward does: the backward of a layer is a slice of one kind."""
    target = tmp_path / "prefill_grad.py"
    args = [
        str(LLAMA),
        "--config",
        "toy",
        "--set",
        "NL=3",
        "--entry",
        "prefill",
        "--input",
        "tokens=1,4",
        "--grad",
        "--grad-seed",
        "cotangents",
        "-o",
        str(target),
    ]
    assert main(["torch", *args]) == 0
    text = target.read_text()
    assert text.count("def decoder_layer_prefill(") == 1
    assert text.count("def decoder_layer_prefill_grad(") == 1
    assert "def decoder_layer_prefill_grad_2(" not in text
    assert text.count("= decoder_layer_prefill_grad(") == 3  # called once per layer


def test_jax_grad_writes_a_module_computing_the_gradients(tmp_path, capsys):
    """`linnet jax --grad`: the same flags (lower_for_command), the JAX emitter."""
    target = tmp_path / "loss_grad.py"
    assert main(["jax", *LOSS, "--grad", "-o", str(target)]) == 0
    text = target.read_text()
    compile(text, str(target), "exec")
    assert "import jax" in text and "d_head_weight" in text
    assert ".add(" in text  # scatter_add, the embedding's transpose: .at[...].add


def test_onnx_and_stablehlo_grad_export_the_gradient_graph(tmp_path, capsys):
    """`linnet onnx --grad` / `linnet stablehlo --grad` export the gradient graph (with
    scatter_add, the embedding's transpose), which computes what the NumPy reference does."""
    import numpy as np
    import pytest

    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("jax")
    from linnet.lang import Program
    from linnet.lang.cli import load_config
    from linnet.lang.emit import stablehlo
    from linnet.lang.grad import lower_grad
    from reference import run_graph

    graph = lower_grad(
        Program.from_file(TINYLM),
        "loss",
        {"tokens": [8, 4], "targets": [8, 4]},
        load_config("tiny", [], str(TINYLM)),
        check=False,
    )
    rng = np.random.default_rng(5)
    named = {
        "tokens": rng.integers(0, 16, (8, 4)).astype(np.int32),
        "targets": rng.integers(0, 16, (8, 4)).astype(np.int32),
    }
    named |= {
        p: (0.2 * rng.standard_normal(vt.shape)).astype(np.float32)
        for p, vt in graph.parameters.items()
    }
    params = {p: named[p] for p in graph.parameters}
    want = run_graph(graph, {k: named[k] for k in ("tokens", "targets")}, params, {})
    assert main(["onnx", *LOSS, "--grad", "-o", str(tmp_path / "g.onnx")]) == 0
    sess = ort.InferenceSession(str(tmp_path / "g.onnx"), providers=["CPUExecutionProvider"])
    got_onnx = sess.run(None, {i.name: named[i.name] for i in sess.get_inputs()})
    assert main(["stablehlo", *LOSS, "--grad", "-o", str(tmp_path / "g.mlir")]) == 0
    run = stablehlo.compile_cpu((tmp_path / "g.mlir").read_text())
    got_hlo = run(*(named[n] for n in stablehlo.argument_order(graph)))
    # Each export ends with linnet.valid (issue 38), true for token ids in the vocabulary.
    assert len(want) == len(graph.outputs) == len(got_onnx) - 1 == len(got_hlo) - 1
    assert got_onnx[-1] and got_hlo[-1]
    assert any(s.op == "scatter_add" for s in graph.steps)
    for name, got in (("onnx", got_onnx), ("stablehlo", got_hlo)):
        for ref, g, w in zip(graph.outputs, got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name}: {ref}")
