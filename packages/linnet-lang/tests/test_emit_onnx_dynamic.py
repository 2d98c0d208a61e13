"""Symbolic dims in ONNX export (issue 17): the toy Llama's prefill exported once with B and L
symbolic runs at several (B, L) under onnxruntime and equals the NumPy reference lowered at
each; decode with B symbolic (the KV cache's first axis too) carries its cache; the sizes are
polynomials of the dims fitted from lowerings at other sizes; each dim that cannot be
symbolic is a coded error (E0935-E0938) when asked for, and stays concrete by default."""

from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from export_cases import LLAMA, llama_params, reference_step, toy_config  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from linnet.lang import LinnetError, Program, lower  # noqa: E402
from linnet.lang.emit import onnx as emit  # noqa: E402
from linnet.lang.export import _solve, _value, symbolic_graph  # noqa: E402
from linnet.lang.tensors.poly import SymInt, poly_text  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from reference import run_graph  # noqa: E402
from test_properties import PROFILE, SCALE  # noqa: E402

TOL = 1e-4  # the conformance suite's f32 tolerance, relative to the largest magnitude


def session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        emit.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def close(got, want, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want))))
    assert float(np.max(np.abs(got - want))) <= TOL * scale, what


def exported(program, entry: str, inputs: dict, config: dict, dynamic=None, params=None):
    """The entry lowered at ``inputs`` and made symbolic, its model, and a relowering."""

    def lower_at(i, c):
        return lower(program, entry, i, c, check=False)

    graph = lower_at(inputs, config)
    sym = symbolic_graph(graph, program, inputs, config, lower_at, dynamic)
    return (
        graph,
        sym,
        emit.emit_onnx(
            sym, params, {m.source.name: m.source.text for m in program.modules.values()}
        ),
    )


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def llama():
    program = Program.from_file(LLAMA)
    cfg = toy_config()
    params = llama_params(lower(program, "prefill", {"tokens": [1, 6]}, cfg, check=False))
    prefill = exported(program, "prefill", {"tokens": [1, 6]}, cfg, None, params)
    decode = exported(program, "decode", {"token": [1], "pos": [1]}, cfg, None, params)
    return program, cfg, params, prefill, decode


def at(program, entry: str, cfg: dict, **sizes) -> object:
    """The graph lowered at these sizes (what the reference runs)."""
    b = sizes["B"]
    inputs = {"tokens": [b, sizes["L"]]} if entry == "prefill" else {"token": [b], "pos": [b]}
    return lower(program, entry, inputs, cfg | {"B": b}, check=False)


def test_prefill_with_symbolic_B_and_L_runs_at_every_size(llama):
    program, cfg, params, (_graph, sym, model), _ = llama
    assert sym.symbolic == {"B": sym.symbolic["B"], "L": sym.symbolic["L"]}  # the default
    emit.check(model)
    proto = emit.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    assert dims(proto.graph.input[0]) == ["B", "L"]
    assert [dims(i) for i in proto.graph.input[1:]] == [["B", 128, 2, 16]] * 4  # the caches
    assert dims(proto.graph.output[0]) == ["B", "L", 256]
    assert json.loads({p.key: p.value for p in proto.metadata_props}["linnet.symbolic"]) == [
        "B",
        "L",
    ]
    sess = session(model)
    rng = np.random.default_rng(3)
    for b, length in ((1, 6), (2, 3), (3, 9)):
        g = at(program, "prefill", cfg, B=b, L=length)
        tokens = rng.integers(0, 256, (b, length)).astype(np.int32)
        states = {p: rng.standard_normal(v.shape).astype(np.float32) for p, v in g.states.items()}
        want, after = reference_step(g, params)({"tokens": tokens}, states)
        got = sess.run(None, {"tokens": tokens, **states})
        close(got[0], want, f"logits at B={b}, L={length}")
        for (path, state), value in zip(after.items(), got[1:]):
            close(value, state, f"{path} at B={b}, L={length}")
    # ONNX's reference evaluator reads the same model (Shape, Range, Concat in functions).
    g = at(program, "prefill", cfg, B=2, L=4)
    tokens = rng.integers(0, 256, (2, 4)).astype(np.int32)
    zeros = {p: np.zeros(v.shape, np.float32) for p, v in g.states.items()}
    want, _ = reference_step(g, params)({"tokens": tokens}, zeros)
    (got, *_) = ReferenceEvaluator(proto).run(None, {"tokens": tokens, **zeros})
    close(got, want, "logits on the reference evaluator")


def test_decode_with_symbolic_B_carries_the_cache_at_two_batch_sizes(llama):
    program, cfg, params, (_, _, prefill_model), (_, sym, model) = llama
    assert list(sym.symbolic) == ["B"]  # decode has no L; the cache length S stays 128
    emit.check(model)
    proto = emit.to_proto(model)
    assert [dims(i) for i in proto.graph.input] == [["B"], ["B"]] + [["B", 128, 2, 16]] * 4
    prefill, decode = session(prefill_model), session(model)
    order = list(sym.states)
    for b in (1, 3):
        gp, gd = at(program, "prefill", cfg, B=b, L=5), at(program, "decode", cfg, B=b)
        prompt = np.random.default_rng(b).integers(0, 256, (b, 5)).astype(np.int32)
        zeros = {p: np.zeros(v.shape, np.float32) for p, v in gp.states.items()}
        want, want_states = reference_step(gp, params)({"tokens": prompt}, zeros)
        got, *states = prefill.run(None, {"tokens": prompt, **zeros})
        close(got, want, f"prefill at B={b}")
        got_states = dict(zip(order, states))
        token = want[:, -1].argmax(-1).astype(np.int32)
        for i in range(4):  # greedy steps, each carrying the cache the last one returned
            feed = {"token": token, "pos": np.full(b, 5 + i, np.int32)}
            want, want_states = reference_step(gd, params)(feed, want_states)
            got, *states = decode.run(None, {**feed, **got_states})
            got_states = dict(zip(order, states))
            close(got, want, f"decode step {i} at B={b}")
            assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
            token = want.argmax(-1).astype(np.int32)
        for path in order:
            close(got_states[path], want_states[path], f"{path} after decoding at B={b}")


def test_any_free_dim_can_be_named_the_cache_length_too(llama):
    program, cfg, params, _, _ = llama
    _, sym, model = exported(program, "decode", {"token": [1], "pos": [1]}, cfg, "B,S", params)
    assert list(sym.symbolic) == ["B", "S"]
    assert dims(emit.to_proto(model).graph.input[2]) == ["B", "S", 2, 16]
    g = lower(program, "decode", {"token": [2], "pos": [2]}, cfg | {"B": 2, "S": 40}, check=False)
    rng = np.random.default_rng(5)
    feed = {"token": np.array([3, 200], np.int32), "pos": np.array([39, 7], np.int32)}
    states = {p: rng.standard_normal(v.shape).astype(np.float32) for p, v in g.states.items()}
    want, after = reference_step(g, params)(feed, states)
    got = session(model).run(None, {**feed, **states})
    close(got[0], want, "decode at B=2, S=40")
    for (path, state), value in zip(after.items(), got[1:]):
        close(value, state, f"{path} at B=2, S=40")


def test_function_bodies_take_the_dims_they_use(llama):
    _, _, _, (graph, _, model), _ = llama
    proto = emit.to_proto(model)
    fns = {f.name: f for f in proto.functions}
    concrete = emit.to_proto(emit.emit_onnx(graph))
    assert len(fns) == len(concrete.functions)  # the layers still share their functions
    # rms_norm puts its [B * L] mean back as [B * L, 1]: an Unsqueeze, which needs no size
    # (a Reshape to a computed [B * L, 1] took B and L before: issue 46 item 8)
    assert not {"B", "L"} & set(fns["nn.norm.rms_norm"].input)
    assert "Unsqueeze" in [n.op_type for n in fns["nn.norm.rms_norm"].node]
    assert not {"B", "L"} & set(fns["nn.linear.linear"].input)  # an einsum needs no size
    shapes = [n for n in proto.graph.node if n.op_type == "Shape"]
    assert [(n.output[0], n.input[0]) for n in shapes] == [("B", "tokens"), ("L", "tokens")]
    # window_attention's mask is an iota of length L in its body: it takes L, after the
    # values it reads, as the iota Range(0, L) the model's graph computes once
    _, _, model = exported(Program.from_text(WINDOW, "window"), "prefill", WINDOW_INPUTS, {}, "B,L")
    proto = emit.to_proto(model)
    (fn,) = proto.functions
    assert list(fn.input) == ["q", "k", "v", "L"]
    (call,) = [n for n in proto.graph.node if n.domain == emit.DOMAIN]
    (iota,) = [n for n in proto.graph.node if n.output[0] == call.input[3]]
    assert iota.op_type == "Range"
    sess = session(model)
    rng = np.random.default_rng(7)
    for b, n in ((1, 6), (2, 9)):
        q = rng.standard_normal((b, n, 2, 2, 8)).astype(np.float32)
        k, v = (rng.standard_normal((b, n, 2, 8)).astype(np.float32) for _ in range(2))
        g = lower(
            Program.from_text(WINDOW, "window"),
            "prefill",
            {"q": list(q.shape), "k": list(k.shape), "v": list(v.shape)},
            {},
        )
        (want,) = run_graph(g, {"q": q, "k": k, "v": v}, {}, {})
        close(sess.run(None, {"q": q, "k": k, "v": v})[0], want, f"window at B={b}, L={n}")


WINDOW = """
use std.nn.attention::{window_attention}
model M<B: Dim, L: Dim> {
    entry prefill(q: Tensor[B, L, 2, 2, 8; f32], k: Tensor[B, L, 2, 8; f32],
                  v: Tensor[B, L, 2, 8; f32]) -> Tensor[B, L, 2, 2, 8; f32] {
        return window_attention(q, k, v, 0.5, 3)
    }
}
"""
WINDOW_INPUTS = {"q": [1, 6, 2, 2, 8], "k": [1, 6, 2, 8], "v": [1, 6, 2, 8]}


def test_dynamic_none_and_an_empty_list_keep_every_dim_concrete(llama):
    program, cfg, _, _, _ = llama
    for dynamic in ("none", []):
        graph, sym, model = exported(program, "decode", {"token": [1], "pos": [1]}, cfg, dynamic)
        assert sym is graph
        assert dims(emit.to_proto(model).graph.input[0]) == [1]


def test_a_named_dim_that_is_no_dim_of_the_entry_is_E0935(llama):
    program, cfg, _, _, _ = llama
    with pytest.raises(LinnetError) as err:
        exported(program, "decode", {"token": [1], "pos": [1]}, cfg, "B,Q")
    d = err.value.diagnostics[0]
    assert d.code == "E0935" and "`Q`" in d.message and "B, D" in d.help
    with pytest.raises(LinnetError) as err:
        exported(program, "decode", {"token": [1], "pos": [1]}, cfg, 3)
    assert err.value.diagnostics[0].code == "E0935"


SMALL = """
model M<K: Dim> {
    entry branch<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y = if N > 12 { x * 2.0 } else { exp(x) }
        return y
    }
    entry inverse<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return x * (1.0 / (N as f32))
    }
    entry pairs<N: Dim>(x: Tensor[2 * N; f32]) -> Tensor[2 * N; f32] {
        return x * 2.0
    }
    entry shift<N: Dim>(x: Tensor[N, K; f32]) -> Tensor[N - 1, K; f32] {
        let y = x[1.., ..]
        return y * (N as f32)
    }
}
"""


def small(entry: str, shape: list[int], dynamic):
    program = Program.from_text(SMALL, "small")
    return exported(program, entry, {"x": shape}, {"K": 3}, dynamic)


def test_a_graph_that_changes_structure_with_the_dim_is_E0936():
    with pytest.raises(LinnetError) as err:
        small("branch", [4], ["N"])  # the near sizes (5..7) agree; the far one takes `x * 2`
    d = err.value.diagnostics[0]
    assert d.code == "E0936" and "changes structure" in d.message
    assert "small.linnet:4" in d.message and "`N`" in d.message
    with pytest.raises(LinnetError) as err:
        small("inverse", [4], ["N"])  # 1 / N is no whole-number polynomial of N
    d = err.value.diagnostics[0]
    assert d.code == "E0936" and "attribute `value` of step 0 (constant)" in d.message
    assert "small.linnet:8" in d.message
    graph, sym, _ = small("inverse", [4], None)  # only the default: it stays concrete
    assert sym is graph


def test_a_dim_the_weights_fix_is_E0937(llama):
    program, cfg, _, _, _ = llama
    with pytest.raises(LinnetError) as err:
        exported(program, "decode", {"token": [1], "pos": [1]}, cfg, ["D"])
    d = err.value.diagnostics[0]
    assert d.code == "E0937" and "parameter `" in d.message and "`D`" in d.message
    plain = lower(program, "decode", {"token": [1], "pos": [1]}, cfg, check=False)
    weights = {p: (list(v.shape), v.dtype) for p, v in plain.parameters.items()}
    graph = lower(program, "decode", {"token": [1], "pos": [1]}, cfg, weights, check=False)
    with pytest.raises(LinnetError) as err:  # lowering at another H fails: the weights say 4
        symbolic_graph(
            graph,
            program,
            {"token": [1], "pos": [1]},
            cfg,
            lambda i, c: lower(program, "decode", i, c, weights, check=False),
            "H",
        )
    d = err.value.diagnostics[0]
    assert d.code == "E0937" and "lowering it at H = " in d.message


def test_a_dim_no_input_axis_measures_is_E0938():
    with pytest.raises(LinnetError) as err:
        small("pairs", [6], "N")
    d = err.value.diagnostics[0]
    assert d.code == "E0938" and "axis of size `N`" in d.message


def test_slice_bounds_and_a_constant_that_is_the_dim_follow_it():
    _graph, sym, model = small("shift", [5, 3], "N")
    assert [type(v) for v in sym.steps[0].attributes["limits"]] == [SymInt, int]
    emit.check(model)
    sess = session(model)
    for n in (2, 5, 11):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        got, valid = sess.run(None, {"x": x})
        assert valid
        np.testing.assert_array_equal(got, x[1:] * n)


def test_the_cli_takes_dynamic(tmp_path, capsys):
    from linnet.lang.cli import main

    out = tmp_path / "prefill.onnx"
    base = [
        "onnx",
        str(LLAMA),
        "--entry",
        "prefill",
        "--config",
        "toy",
        "--set",
        "B=1",
        "--input",
        "tokens=1,8",
        "-o",
        str(out),
    ]
    assert main([*base, "--dynamic", "B,L"]) == 0
    assert "symbolic dims: B, L" in capsys.readouterr().err
    proto = onnx.load(str(out))
    assert dims(proto.graph.input[0]) == ["B", "L"]
    assert main([*base, "--dynamic", "none"]) == 0
    assert "symbolic dims: none" in capsys.readouterr().err
    assert dims(onnx.load(str(out)).graph.input[0]) == [1, 8]
    assert main([*base, "--dynamic", "D"]) == 1
    assert "E0937" in capsys.readouterr().err


# ---------------------------------------------------------------- the arithmetic
def test_sym_ints_keep_their_polynomial_through_arithmetic():
    b, n = SymInt(3, ((("B",), 1),)), SymInt(5, ((("L",), 1),))
    assert repr(b * n - 1) == "<B*L-1=14>" and int(b * n - 1) == 14
    assert repr(2 * b + n) == "<2*B+L=11>" and repr(-b) == "<-B=-3>"
    assert b - b == 0 and type(b - b) is int  # no dim left: a plain int
    assert poly_text(SymInt.poly_of(10 - b)) == "-B+10"
    assert str(b) == "3"
    import copy
    import pickle

    assert repr(copy.deepcopy([b * n])) == "[<B*L=15>]"
    assert repr(pickle.loads(pickle.dumps(n + 1))) == "<L+1=6>"


@settings(PROFILE, max_examples=30 * SCALE)
@given(
    st.lists(st.integers(-20, 20), min_size=4, max_size=4), st.integers(2, 30), st.integers(2, 30)
)
def test_the_corners_fix_a_multilinear_polynomial(coefs, b0, l0):
    """Any c0 + c1 B + c2 L + c3 B L is recovered from its values at the four corners."""
    names = ["B", "L"]
    poly = tuple(sorted((m, c) for m, c in zip(((), ("B",), ("L",), ("B", "L")), coefs) if c))
    start = {"B": b0, "L": l0}
    corners = [{"B": b0 + (k & 1), "L": l0 + (k >> 1 & 1)} for k in range(4)]
    got = _solve([_value(poly, c) for c in corners], corners, names, start)
    assert got == poly
    assert _value(got, {"B": 7, "L": 1000}) == _value(poly, {"B": 7, "L": 1000})


def test_an_attribute_no_rule_computes_at_run_time_is_E0936():
    """A number outside SYMBOLIC_ATTRIBUTES that changes with the dim (here a reduction's
    identity, made to follow N) is an error naming the step, never a number fixed silently."""
    from export_cases import one_step
    from linnet.lang.export import symbolic_dims

    def at(n: int):
        g = one_step(
            "reduce",
            [np.ones((n, 3), np.float32)],
            {"kind": "sum", "axes": [1], "accumulate": "f32", "identity": float(n)},
            ((n,), "f32"),
        )
        g.dims = {"N": n}
        return g

    with pytest.raises(LinnetError) as err:
        symbolic_dims(at(4), lambda dims, base: at(dims["N"]), ["N"])
    d = err.value.diagnostics[0]
    assert d.code == "E0936" and "attribute `identity` of step 0 (reduce)" in d.message
    assert "case.linnet:1" in d.message

    def fixed(n: int):  # the same graph with an identity that stays put
        g = at(n)
        g.steps[0].attributes["identity"] = 0.0
        return g

    sym = symbolic_dims(fixed(4), lambda dims, base: fixed(dims["N"]), ["N"])
    assert isinstance(sym.values["%a0"].shape[0], SymInt)
    emit.check(emit.emit_onnx(sym))
