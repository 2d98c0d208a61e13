"""emit/stablehlo.py: every primitive against the NumPy reference (parsed and verified with
jaxlib's MLIR bindings, run on JAX's CPU backend), the toy Llama's prefill and decode (16 greedy
steps carrying the exported KV cache), the text's form (composites, locations) and its errors.

Pinned: jax's `jax._src.compiler` and `jax._src.interpreters.mlir` entry points, as used by
linnet.lang.emit.stablehlo.compile_cpu (the jax of uv.lock, 0.10.2).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from export_cases import (
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
from hypothesis import given, settings
from linnet.lang import LinnetError
from linnet.lang.emit import stablehlo as emit
from linnet.lang.ir.graph import ValueType
from linnet.lang.ir.primitives import PRIMITIVES
from reference import run_graph
from test_properties import PROFILE, SCALE

CASES = cases()


def test_the_cases_cover_every_primitive():
    ops = {s.op for _, g, _, _ in CASES for s in g.steps}
    # A rank's collectives are not exported (emit.EXPECTED_MISSING): E0940, tested below.
    assert ops == set(PRIMITIVES) - emit.EXPECTED_MISSING, sorted(set(PRIMITIVES) - ops)


def test_a_collective_is_not_exported_E0940():
    g = one_step("exp", [np.ones(3, np.float32)])
    g.steps[0] = type(g.steps[0])(
        "all_gather", ["%x"], ["%y"], {"axis": 0, "world": 2}, g.steps[0].loc
    )
    with pytest.raises(LinnetError) as err:
        emit.emit_stablehlo(g)
    assert err.value.diagnostics[0].code == "E0940"
    assert "all_gather" in err.value.diagnostics[0].message


def arguments(graph, inputs: dict, states: dict, params: dict | None = None) -> list:
    named = {**{k.lstrip("%"): v for k, v in inputs.items()}, **states, **(params or {})}
    return [named[n] for n in emit.argument_order(graph)]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_primitive_matches_the_reference(case):
    name, graph, inputs, states = case
    want, after = expected(graph, inputs, states)
    text = emit.emit_stablehlo(graph)
    emit.verify(text)
    got = emit.compile_cpu(text)(*arguments(graph, inputs, states))
    for o, w in zip(got, want):
        assert_close(o, w, name)
    for (path, state), o in zip(after.items(), got[len(want) :]):
        assert_close(o, state, f"{name}: state {path}")


def test_bitcast_keeps_every_bit_on_jax_s_cpu():
    """Each same-width pair (bitcast_cases.py), NaN payloads, subnormals and bf16 included:
    `stablehlo.bitcast_convert` gives the operand's bits, the nibbles their floats."""
    import bitcast_cases as bc
    import jax
    from linnet.lang import Program, lower

    g = lower(Program.from_text(bc.SOURCE), "run", {k: [bc.N] for k in bc.INPUTS}, {"N": bc.N})
    text = emit.emit_stablehlo(g)
    emit.verify(text)
    assert text.count('"stablehlo.bitcast_convert"') == 13
    with jax.enable_x64(True):  # the i64 and f64 pairs
        got = emit.compile_cpu(text)(*bc.arrays())
    bc.check(got[: len(bc.RESULTS) + 1], "stablehlo")


@pytest.fixture(scope="module")
def llama():
    program, prefill, decode = llama_graphs()
    params = llama_params(prefill)
    sources = {m.source.name: m.source.text for m in program.modules.values()}
    texts = {g.entry: emit.emit_stablehlo(g, sources) for g in (prefill, decode)}
    return prefill, decode, params, texts


def test_llama_exports_verify(llama):
    for text in llama[3].values():
        emit.verify(text)


def test_llama_prefill_and_16_greedy_decode_steps_match_the_reference(llama):
    prefill, decode, params, texts = llama
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 256, (1, 6)).astype(np.int32)
    zeros = {p: np.zeros(v.shape, np.float32) for p, v in prefill.states.items()}
    want, want_logits = greedy(
        reference_step(prefill, params), reference_step(decode, params), prompt, zeros, 16
    )

    def step(graph):
        run = emit.compile_cpu(texts[graph.entry])

        def call(inputs, states):
            outs = run(*arguments(graph, inputs, states, params))
            return outs[0], dict(zip(graph.states, outs[1:]))

        return call

    got, got_logits = greedy(step(prefill), step(decode), prompt, zeros, 16)
    assert got == want and len(got) == 17
    for a, b in zip(got_logits, want_logits):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_the_text_s_form(llama):
    _, decode, _, texts = llama
    text = texts["decode"]
    head = next(line for line in text.splitlines() if "func.func public @main" in line)
    assert (
        head.index("%token")
        < head.index("%model_layers_0_self_attn_k_cache")
        < head.index("%model_embed_tokens_weight")
    )
    # Every std op is a composite whose decomposition is a private function; layers share.
    composites = [line for line in text.splitlines() if '"stablehlo.composite"' in line]
    assert sum('name = "linnet.std.nn.attention.decode_attention"' in c for c in composites) == 2
    assert 'path = "model.layers.1.self_attn"' in text
    assert text.count("func.func private @nn_attention_decode_attention(") == 1
    assert "decomposition = @nn_linear_linear" in text
    # Source lines: a comment heading each group, a location on each operation.
    assert "// attention.linnet:" in text and 'loc("std/nn/attention.linnet:' in text
    assert "decode_attention(qs, self.k_cache" in text
    assert emit.argument_order(decode)[:2] == ["token", "pos"]


def test_a_primitive_without_a_rule_is_E0940(monkeypatch):
    g = one_step("exp", [np.ones(3, np.float32)])
    monkeypatch.delitem(emit.RULES, "exp")
    with pytest.raises(LinnetError) as err:
        emit.emit_stablehlo(g)
    d = err.value.diagnostics[0]
    assert d.code == "E0940" and "step 0 (exp)" in d.message and "case.linnet:1" in d.message


def test_a_dtype_stablehlo_lacks_is_E0941():
    g = one_step("exp", [np.ones(3, np.float32)])
    g.values["%y"] = ValueType((3,), "f8")
    with pytest.raises(LinnetError) as err:
        emit.emit_stablehlo(g)
    d = err.value.diagnostics[0]
    assert d.code == "E0941" and "`f8`" in d.message and "case.linnet:1" in d.message


def test_text_that_does_not_verify_is_E0943():
    with pytest.raises(LinnetError) as err:
        emit.verify(
            'module @m {\n  func.func public @main() -> () {\n    "nope.op"() : () -> ()\n  }\n}\n'
        )
    assert err.value.diagnostics[0].code == "E0943"


@pytest.mark.parametrize(
    "value,dtype,text",
    [
        (float("-inf"), "f32", "0xFF800000"),
        (float("inf"), "bf16", "0x7F80"),
        (float("nan"), "f64", "0x7FF8000000000000"),
        (-3, "i32", "-3"),
        (True, "bool", "true"),
        (1e-5, "f32", "1.000000000e-05"),
    ],
)
def test_scalar_literals(value, dtype, text):
    assert emit.scalar_literal(value, dtype) == text


def test_the_cli_writes_verified_text(tmp_path, capsys):
    from linnet.lang.cli import main

    out = tmp_path / "prefill.mlir"
    assert (
        main(
            [
                "stablehlo",
                str(LLAMA),
                "--entry",
                "prefill",
                "--config",
                "toy",
                "--set",
                "B=1",
                "--input",
                "tokens=1,4",
                "--verify",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().err
    emit.verify(out.read_text())
    assert out.read_text().startswith("// StableHLO generated by linnet-lang")
    assert (
        main(
            [
                "stablehlo",
                str(LLAMA),
                "--entry",
                "prefill",
                "--config",
                "toy",
                "--set",
                "B=1",
                "--input",
                "tokens=1,4",
            ]
        )
        == 0
    )
    assert '"stablehlo.composite"' in capsys.readouterr().out


def test_a_bf16_model_runs_within_bf16_tolerance():
    import ml_dtypes

    _, _, decode = llama_graphs(T="bf16")
    params32 = llama_params(decode)
    params = {p: v.astype(ml_dtypes.bfloat16) for p, v in params32.items()}
    text = emit.emit_stablehlo(decode)
    assert "xbf16>" in text
    inputs = {"token": np.array([3], np.int32), "pos": np.array([0], np.int32)}
    zeros = {p: np.zeros(v.shape, ml_dtypes.bfloat16) for p, v in decode.states.items()}
    got = emit.compile_cpu(text)(*arguments(decode, inputs, zeros, params))
    # The NumPy reference runs bf16 at f32 precision, on the same (rounded) weights.
    rounded = {p: v.astype(np.float32) for p, v in params.items()}
    want = reference_step(decode, rounded)(
        inputs, {p: np.zeros(v.shape, np.float32) for p, v in decode.states.items()}
    )[0]
    assert got[0].dtype == np.float32
    np.testing.assert_allclose(got[0], want, rtol=0.05, atol=0.05)


def test_composites_nest_and_hand_on_several_values():
    graph = next(g for name, g, _, _ in CASES if name == "call-two-results-nested")
    text = emit.emit_stablehlo(graph)
    assert ':2 = "stablehlo.composite"' in text and 'name = "linnet.std.test.pair"' in text
    pair = text[text.index("func.func private @test_pair(") :]
    assert 'name = "linnet.std.test.inner"' in pair.split("func.func", 2)[1]
    assert "#1" in text.split("func.func public @main", 1)[1]


def test_the_text_computes_what_jax_export_of_the_generated_jax_computes(llama):
    """Issue 17's cross-check: the StableHLO that `jax.export` writes for the generated JAX
    of each entry (`jax.export.export(jax.jit(f))(...).mlir_module()`), compiled the same way
    as ours, gives our text's results on the same inputs: outputs and every state after the
    call, for the prefill and for a decode step from a filled cache."""
    import jax
    from jax import export as jexport
    from linnet.lang.emit.jax import emit_jax

    prefill, decode, params, texts = llama
    rng = np.random.default_rng(11)
    cases = [
        (
            prefill,
            {"tokens": rng.integers(0, 256, (1, 6)).astype(np.int32)},
            {p: np.zeros(v.shape, np.float32) for p, v in prefill.states.items()},
        ),
        (
            decode,
            {"token": np.array([17], np.int32), "pos": np.array([6], np.int32)},
            {p: rng.standard_normal(v.shape).astype(np.float32) for p, v in decode.states.items()},
        ),
    ]
    for graph, inputs, states in cases:
        ours = emit.compile_cpu(texts[graph.entry])(*arguments(graph, inputs, states, params))
        ns: dict = {}
        exec(compile(emit_jax(graph), f"{graph.entry}_jax", "exec"), ns)
        fn = ns[ns["ENTRIES"][graph.entry]["function"]]
        args = (
            [inputs[r.lstrip("%")] for r in graph.inputs],
            {p: params[p] for p in graph.parameters},
            states,
        )
        exported = jexport.export(jax.jit(lambda i, p, s, fn=fn: fn(*i, p, s), keep_unused=True))(
            *args
        )
        text = exported.mlir_module()
        assert "stablehlo." in text
        theirs = emit.compile_cpu(text)(*jax.tree_util.tree_leaves(args))
        # Theirs: the outputs, then the new states as a pytree (sorted by path); ours: the
        # outputs, then the states in the graph's order, then linnet.valid.
        n = len(graph.outputs)
        by_path = dict(zip(sorted(graph.states), theirs[n:]))
        assert len(theirs) == len(ours) - 1 == n + len(graph.states) and ours[-1]
        for k in range(n):
            np.testing.assert_allclose(
                ours[k], theirs[k], rtol=1e-5, atol=1e-5, err_msg=f"{graph.entry}: output {k}"
            )
        for path, value in zip(graph.states, ours[n:]):
            np.testing.assert_allclose(
                value, by_path[path], rtol=1e-5, atol=1e-5, err_msg=f"{graph.entry}: state {path}"
            )


@settings(PROFILE, max_examples=10 * SCALE)
@given(scatter_adds())
def test_scatter_add_matches_the_reference_on_random_positions(case):
    graph, inputs = case
    (want,) = run_graph(graph, inputs, {}, {})
    text = emit.emit_stablehlo(graph)
    emit.verify(text)
    got, valid = emit.compile_cpu(text)(*arguments(graph, inputs, {}))
    assert valid
    assert_close(got, want, "scatter_add on StableHLO")


def test_std_layer_norm_exports_and_runs():
    """Issue 46 item 1: every reduce region was `^bb0(%a, %b)`, so a function with an
    argument named `b` (layer_norm's bias) redefined it and the text did not verify (E0943).
    std.nn's layer_norm, exported whole, against the NumPy formula."""
    from linnet.lang import Program, lower

    prog = Program.from_text("""
use std.nn.norm::{layer_norm}
model M<N: Dim, D: Dim> {
    entry run(x: Tensor[N, D; f32], w: Tensor[D; f32], b: Tensor[D; f32]) -> Tensor[N, D; f32] {
        return layer_norm(x, w, b, 1e-5)
    }
}""")
    graph = lower(prog, "run", {"x": [3, 5], "w": [5], "b": [5]}, {})
    text = emit.emit_stablehlo(graph)
    assert 'name = "linnet.std.nn.norm.layer_norm"' in text
    emit.verify(text)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    w, b = (rng.standard_normal(5).astype(np.float32) for _ in range(2))
    got, valid = emit.compile_cpu(text)(x, w, b)
    assert valid
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- portable artifacts
GELU = """
use std.nn.activation::{gelu}
model M<N: Dim, D: Dim> {
    entry run(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] { return gelu(x) }
}"""


def _erf_graph(dtype: str, n: int):
    from linnet.lang import Program, lower

    prog = Program.from_text(
        f"model M {{ entry run<N: Dim>(x: Tensor[N; {dtype}]) -> "
        f"Tensor[N; {dtype}] {{ return erf(x) }} }}"
    )
    return lower(prog, "run", {"x": [n]}, {})


def test_a_portable_gelu_serializes_at_every_version_jaxlib_writes():
    """Issue 46 item 7: `gelu`'s bare chlo.erf is refused by StableHLO's serializer at every
    version (and jax's wraps it as a composite, from 0.19.0 only). The portable text has no
    CHLO: StableHLO's serializer and jax's take it from the oldest version jaxlib writes to
    its own, std ops as calls below 0.19.0 and composites from it, and the artifact read
    back computes gelu."""
    import math

    from jax.extend.mlir import serialize_portable_artifact
    from jaxlib.mlir.dialects import stablehlo as shlo
    from linnet.lang import Program, lower
    from linnet.lang.emit import stablehlo_portable as portable
    from linnet.lang.export import portable_stablehlo

    graph = lower(Program.from_text(GELU), "run", {"x": [3, 5]}, {})
    with pytest.raises(Exception, match="failed to serialize"):  # why the portable form
        shlo.serialize_portable_artifact_str(emit.emit_stablehlo(graph), "1.0.0")
    oldest, newest = portable.supported()
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32) * 3
    want = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x.astype(np.float64))
    versions = sorted({oldest, (0, 18, 0), portable.COMPOSITE_SINCE, (1, 0, 0), newest})
    for v in versions:
        text, artifact = portable_stablehlo(graph, portable.version_text(v))
        assert "chlo." not in text
        assert ('"stablehlo.composite"' in text) == (v >= (0, 19, 0))
        assert ('"func.call"' in text) == (v < (0, 19, 0))
        assert artifact.startswith(b"ML\xefR")
        serialize_portable_artifact(text, portable.version_text(v))  # jax's serializer too
        got, valid = emit.compile_cpu(portable.deserialize(artifact))(x)
        assert valid
        np.testing.assert_allclose(
            got, want, rtol=1e-6, atol=1e-6, err_msg=portable.version_text(v)
        )
    text, _ = portable_stablehlo(graph, None)  # no version: the oldest jaxlib writes
    assert '"func.call"' in text and oldest < (0, 19, 0)


def _ulps(got: np.ndarray, want: np.ndarray, dtype) -> np.ndarray:
    spacing = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
def test_portable_erf_is_accurate_to_the_dtype_s_rounding(dtype):
    """The portable erf (XLA's own expansions: Eigen's rational for f32, f16 and bf16 in f32,
    Cephes' for f64) against math.erf over [-6, 6] and the edge values: within 6 ulp in f32
    (XLA's CPU chlo.erf: 5), 2 in f64, 1 in f16 and bf16; NaN stays NaN, +-inf gives +-1,
    +-0 stays +-0."""
    import math

    import jax
    import ml_dtypes

    np_dtype = {
        "f32": np.float32,
        "f64": np.float64,
        "f16": np.float16,
        "bf16": ml_dtypes.bfloat16,
    }[dtype]
    sweep = np.linspace(-6, 6, 4001 if dtype in ("f16", "bf16") else 20001)
    edges = np.array(
        [
            np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            1e-3,
            -1e-3,
            0.5,
            1.0,
            -1.0,
            3.9,
            4.0,
            4.1,
            7.99,
            8.0,
            8.01,
            27.0,
            -27.0,
        ]
    )
    x = np.concatenate([sweep, edges]).astype(np_dtype)
    graph = _erf_graph(dtype, len(x))
    text = emit.emit_stablehlo(graph, portable=(0, 9, 0))
    assert "chlo." not in text
    with jax.enable_x64(dtype == "f64"):
        got = emit.compile_cpu(text)(x)[0]
    assert got.dtype == np_dtype
    xf = x.astype(np.float64)
    want = np.array([math.erf(v) if not math.isnan(v) else np.nan for v in xf])
    finite = np.isfinite(xf)
    bound = {"f32": 6, "f64": 2, "f16": 1, "bf16": 1}[dtype]
    assert _ulps(got[finite], want[finite], np_dtype).max() <= bound
    tail = got[len(sweep) :].astype(np.float64)
    assert np.isnan(tail[0]) and tail[1] == 1 and tail[2] == -1
    assert tail[3] == 0 and not np.signbit(tail[3]) and np.signbit(tail[4])


def test_portable_calls_hand_on_several_values_and_nest():
    """Below 0.19.0 a std op is a func.call of its decomposition: the nested case with two
    results, serialized at the oldest version and read back, computes the reference."""
    from linnet.lang.emit import stablehlo_portable as portable

    name, graph, inputs, states = next(c for c in CASES if c[0] == "call-two-results-nested")
    oldest = portable.supported()[0]
    text = emit.emit_stablehlo(graph, portable=oldest)
    assert ':2 = "func.call"' in text and "stablehlo.composite" not in text
    got = emit.compile_cpu(portable.deserialize(portable.serialize(text, oldest)))(
        *arguments(graph, inputs, states)
    )
    want, _ = expected(graph, inputs, states)
    for o, w in zip(got, want):
        assert_close(o, w, name)
