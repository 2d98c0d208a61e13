"""emit/onnx.py: every primitive against the NumPy reference (onnxruntime and ONNX's reference
evaluator), the toy Llama's prefill and decode (16 greedy steps carrying the exported KV cache),
the model's form (local functions, states, initializers, external data) and its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from export_cases import (  # noqa: E402
    LLAMA,
    assert_close,
    cases,
    expected,
    greedy,
    llama_graphs,
    llama_params,
    one_step,
    reference_step,
    scatter_adds,
)
from hypothesis import given, settings  # noqa: E402
from linnet.lang import LinnetError  # noqa: E402
from linnet.lang.emit import onnx as emit  # noqa: E402
from linnet.lang.ir.graph import ValueType  # noqa: E402
from linnet.lang.ir.primitives import PRIMITIVES  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from reference import run_graph  # noqa: E402
from test_properties import PROFILE, SCALE  # noqa: E402

CASES = cases(without=emit.EXPECTED_MISSING)


def session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        emit.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def feeds(graph, inputs: dict, states: dict) -> dict:
    return {**{k.lstrip("%"): v for k, v in inputs.items()}, **states}


def test_the_cases_cover_every_primitive():
    ops = {s.op for _, g, _, _ in CASES for s in g.steps}
    # A rank's collectives are not exported (emit.EXPECTED_MISSING): E0930, tested below.
    assert ops == set(PRIMITIVES) - emit.EXPECTED_MISSING, sorted(set(PRIMITIVES) - ops)


def test_a_collective_is_not_exported_E0930():
    g = one_step("exp", [np.ones(3, np.float32)])
    g.steps[0] = type(g.steps[0])(
        "all_reduce", ["%x"], ["%y"], {"kind": "sum", "world": 2}, g.steps[0].loc
    )
    with pytest.raises(LinnetError) as err:
        emit.emit_onnx(g)
    assert err.value.diagnostics[0].code == "E0930"
    assert "all_reduce" in err.value.diagnostics[0].message


def test_a_bitcast_is_not_exported_E0930(tmp_path, capsys):
    """Opset 21 has no bitcast: `linnet onnx` stops with E0930 naming the step, the
    primitive, its source line and why (no traceback, nothing written), and the StableHLO
    export of the same entry runs."""
    from linnet.lang.cli import main

    src = tmp_path / "bits.linnet"
    src.write_text(
        """model M<N: Dim> {
    entry run(w: Tensor[N; i32]) -> Tensor[N; f32] {
        let f[n] = bitcast<f32>(w[n]) * 2.0
        return f
    }
}
"""
    )
    out = tmp_path / "bits.onnx"
    args = [str(src), "--entry", "run", "--set", "N=4", "--input", "w=4"]
    assert main(["onnx", *args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error[E0930]" in err and "Traceback" not in err and not out.exists()
    assert "step 0 (bitcast) of `M.run` at " in err and "bits.linnet:3: primitive `bitcast`" in err
    assert "opset 21" in err and "linnet stablehlo" in err
    assert main(["stablehlo", *args, "-o", str(tmp_path / "bits.mlir")]) == 0
    # The export cases left out here are the bitcast ones (run by test_emit_stablehlo.py).
    left_out = {c[0] for c in cases()} - {c[0] for c in CASES}
    assert left_out and all(name.startswith("bitcast-") for name in left_out)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_primitive_matches_the_reference(case):
    name, graph, inputs, states = case
    want, after = expected(graph, inputs, states)
    model = emit.emit_onnx(graph)
    emit.check(model)
    for run in ("onnxruntime", "reference"):
        if run == "onnxruntime":
            got = session(model).run(None, feeds(graph, inputs, states))
        else:
            got = ReferenceEvaluator(emit.to_proto(model)).run(None, feeds(graph, inputs, states))
        for o, w in zip(got, want):
            assert_close(o, w, f"{name} on {run}")
        for (path, state), o in zip(after.items(), got[len(want) :]):
            assert_close(o, state, f"{name}: state {path} on {run}")


@pytest.fixture(scope="module")
def llama():
    program, prefill, decode = llama_graphs()
    params = llama_params(prefill)
    sources = {m.source.name: m.source.text for m in program.modules.values()}
    models = {g.entry: emit.emit_onnx(g, params, sources) for g in (prefill, decode)}
    return prefill, decode, params, models


def test_llama_exports_pass_the_full_check(llama):
    _, _, _, models = llama
    for model in models.values():
        emit.check(model)
        proto = emit.to_proto(model)
        onnx.checker.check_model(proto, full_check=True)
        assert {f.domain for f in proto.functions} == {"linnet.std"}


def _ort_step(model, states_order):
    sess = session(model)

    def run(inputs: dict, states: dict):
        outs = sess.run(None, {**inputs, **states})
        return outs[0], dict(zip(states_order, outs[1:]))

    return run


def test_llama_prefill_and_16_greedy_decode_steps_match_the_reference(llama):
    prefill, decode, params, models = llama
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 256, (1, 6)).astype(np.int32)
    zeros = {p: np.zeros(v.shape, np.float32) for p, v in prefill.states.items()}
    want, want_logits = greedy(
        reference_step(prefill, params), reference_step(decode, params), prompt, zeros, 16
    )
    for make in ("onnxruntime", "reference"):
        if make == "onnxruntime":
            steps = [_ort_step(models[g.entry], list(g.states)) for g in (prefill, decode)]
        else:

            def evaluator(model, order):
                ev = ReferenceEvaluator(emit.to_proto(model))

                def run(inputs, states):
                    outs = ev.run(None, {**inputs, **states})
                    return outs[0], dict(zip(order, outs[1:]))

                return run

            steps = [evaluator(models[g.entry], list(g.states)) for g in (prefill, decode)]
        got, got_logits = greedy(steps[0], steps[1], prompt, zeros, 16)
        assert got == want, make
        assert len(got) == 17
        for a, b in zip(got_logits, want_logits):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_model_s_form(llama):
    _, decode, _, models = llama
    proto = emit.to_proto(models["decode"])
    g = proto.graph
    names = [i.name for i in g.input]
    assert names[:2] == ["token", "pos"]
    assert names[2:] == list(decode.states)  # states follow the inputs
    # ... then the validity flag (issue 38: what the runtimes check, as an output)
    assert [o.name for o in g.output] == ["logits"] + [p + ".next" for p in decode.states] + [
        "linnet.valid"
    ]
    assert {i.name for i in g.initializer} == set(decode.parameters)
    # Every std op is a call of a local function; a layer's linears share one function.
    calls = [n for n in g.node if n.domain == "linnet.std"]
    fns = {f.name for f in proto.functions}
    assert {
        "nn.linear.linear",
        "nn.norm.rms_norm",
        "nn.attention.decode_attention",
        "nn.embedding.embedding",
        "nn.rope.rope_with",
    } <= fns
    assert len([n for n in calls if n.op_type == "nn.attention.decode_attention"]) == 2
    linear = next(f for f in proto.functions if f.name == "nn.linear.linear")
    assert [n.op_type for n in linear.node] == ["Einsum", "Identity"]
    # Nodes say where they came from.
    attn = next(n for n in calls if n.op_type == "nn.attention.decode_attention")
    props = {p.key: p.value for p in attn.metadata_props}
    assert props["linnet.path"] == "model.layers.0.self_attn"
    assert "decode_attention(" in attn.doc_string
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["linnet.states"]) == list(decode.states)
    assert meta["linnet.entry"] == "decode"


def test_without_weights_parameters_are_inputs(llama):
    _, decode, _, _ = llama
    proto = emit.to_proto(emit.emit_onnx(decode))
    names = [i.name for i in proto.graph.input]
    assert names[len(decode.inputs) + len(decode.states) :] == list(decode.parameters)
    assert not proto.graph.initializer


def test_large_weights_go_to_external_data(llama, tmp_path):
    _, decode, params, _ = llama
    model = emit.emit_onnx(decode, params)
    written = emit.save_onnx(model, tmp_path / "decode.onnx", external_threshold=1000)
    assert [p.name for p in written] == ["decode.onnx", "decode.onnx.data"]
    assert (tmp_path / "decode.onnx").stat().st_size < 200_000 < written[1].stat().st_size
    onnx.checker.check_model(str(tmp_path / "decode.onnx"), full_check=True)
    small = emit.save_onnx(emit.emit_onnx(decode, params), tmp_path / "inline.onnx")
    assert [p.name for p in small] == ["inline.onnx"]


def test_a_primitive_without_a_rule_is_E0930(monkeypatch):
    g = one_step("exp", [np.ones(3, np.float32)])
    monkeypatch.delitem(emit.RULES, "exp")
    with pytest.raises(LinnetError) as err:
        emit.emit_onnx(g)
    d = err.value.diagnostics[0]
    assert d.code == "E0930"
    assert "step 0 (exp)" in d.message and "case.linnet:1" in d.message


def test_a_dtype_onnx_lacks_is_E0931():
    g = one_step("exp", [np.ones(3, np.float32)])
    g.values["%y"] = ValueType((3,), "f8")
    with pytest.raises(LinnetError) as err:
        emit.emit_onnx(g)
    d = err.value.diagnostics[0]
    assert d.code == "E0931" and "`f8`" in d.message and "case.linnet:1" in d.message


def test_a_missing_weight_is_E0933(llama):
    _, decode, params, _ = llama
    partial = dict(params)
    partial.pop("model.norm.weight")
    with pytest.raises(LinnetError) as err:
        emit.emit_onnx(decode, partial)
    assert err.value.diagnostics[0].code == "E0933"
    assert "model.norm.weight" in err.value.diagnostics[0].message


def test_the_cli_writes_a_checked_model(tmp_path, capsys):
    from linnet.lang.cli import main

    out = tmp_path / "decode.onnx"
    assert (
        main(
            [
                "onnx",
                str(LLAMA),
                "--entry",
                "decode",
                "--config",
                "toy",
                "--set",
                "B=1",
                "--input",
                "token=1",
                "--input",
                "pos=1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "4 states, 21 parameters as graph inputs" in capsys.readouterr().err
    onnx.checker.check_model(str(out), full_check=True)
    assert main(["onnx", str(LLAMA), "--entry", "nope", "--config", "toy", "-o", str(out)]) == 1
    assert "E0601" in capsys.readouterr().err


def test_a_bf16_model_passes_the_full_check():
    import ml_dtypes

    _, _, decode = llama_graphs(T="bf16")
    params = {p: np.ones(v.shape, ml_dtypes.bfloat16) for p, v in decode.parameters.items()}
    proto = emit.to_proto(emit.emit_onnx(decode, params))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.graph.initializer
    assert all(t.data_type == onnx.TensorProto.BFLOAT16 for t in proto.graph.initializer)


def test_calls_nest_and_hand_on_several_values():
    graph = next(g for name, g, _, _ in CASES if name == "call-two-results-nested")
    proto = emit.to_proto(emit.emit_onnx(graph))
    fns = {f.name: f for f in proto.functions}
    assert set(fns) == {"test.pair", "test.inner"}
    assert list(fns["test.pair"].output) and len(fns["test.pair"].output) == 2
    assert [n.op_type for n in fns["test.pair"].node] == ["Exp", "test.inner"]
    (call,) = [n for n in proto.graph.node if n.domain == "linnet.std"]
    assert call.op_type == "test.pair" and len(call.output) == 2
    writer = next(g for name, g, _, _ in CASES if name == "call-writing-a-state")
    fn = emit.to_proto(emit.emit_onnx(writer)).functions[0]
    assert [n.op_type for n in fn.node if n.op_type in ("ScatterND", "ReduceSum")] == [
        "ScatterND",
        "ReduceSum",
    ]
    assert len(fn.output) == 2  # the sum and the state after the write


def test_a_model_the_checker_rejects_is_E0934():
    import onnx_ir as ir

    model = emit.emit_onnx(one_step("exp", [np.ones(3, np.float32)]))
    model.graph.append(ir.Node("", "NoSuchOp", [model.graph.inputs[0]]))
    with pytest.raises(LinnetError) as err:
        emit.check(model)
    d = err.value.diagnostics[0]
    assert d.code == "E0934" and "NoSuchOp" in d.message


@settings(PROFILE, max_examples=10 * SCALE)
@given(scatter_adds())
def test_scatter_add_matches_the_reference_on_random_positions(case):
    graph, inputs = case
    (want,) = run_graph(graph, inputs, {}, {})
    model = emit.emit_onnx(graph)
    emit.check(model)
    got, valid = session(model).run(None, inputs)
    assert valid
    assert_close(got, want, "scatter_add on onnxruntime")
