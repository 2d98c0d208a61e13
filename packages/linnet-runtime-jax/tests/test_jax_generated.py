"""Generated JAX against the NumPy reference and the PyTorch interpreter; every fused JAX
call against the op's body; states, donation, content-hashed source."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from indexgen import index_programs, state_programs
from jax_support import LLAMA, toy_config, x64
from linnet.jax import load, load_function, load_source, random_weights
from linnet.jax.home import import_source
from linnet.lang import Program, check_program, lower
from linnet.lang.emit.jax import FAST_CALLS, emit_jax
from reference import run_graph
from test_properties import PROFILE, SCALE

# Each fused call, with inputs, in a one-entry model that calls it (the torch runtime's
# cases, tests/test_generated.py, with bf16 and f16 variants where the op casts).
FAST_CASES = {
    "std.nn.linear::linear": (
        "use std.nn.linear::{linear}",
        "linear(x, w)",
        {"x": ([3, 8], "f32"), "w": ([5, 8], "f32")},
        "[3, 5]",
    ),
    "std.nn.linear::linear_bias": (
        "use std.nn.linear::{linear_bias}",
        "linear_bias(x, w, b)",
        {"x": ([3, 8], "f32"), "w": ([5, 8], "f32"), "b": ([5], "f32")},
        "[3, 5]",
    ),
    "std.nn.embedding::embedding": (
        "use std.nn.embedding::{embedding}",
        "embedding(ids, t)",
        {"ids": ([4], "i32"), "t": ([10, 6], "f32")},
        "[4, 6]",
    ),
    "std.nn.norm::rms_norm": (
        "use std.nn.norm::{rms_norm}",
        "rms_norm(x, w, 1e-5)",
        {"x": ([3, 8], "f32"), "w": ([8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::silu": (
        "use std.nn.activation::{silu}",
        "silu(x)",
        {"x": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::silu_mul": (
        "use std.nn.activation::{silu_mul}",
        "silu_mul(x, u)",
        {"x": ([3, 8], "f32"), "u": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::softmax": (
        "use std.nn.activation::{softmax}",
        "softmax(x)",
        {"x": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.attention::decode_attention": (
        "use std.nn.attention::{decode_attention}",
        "decode_attention(q, kc, vc, pos, 0.25)",
        {
            "q": ([2, 2, 3, 16], "f32"),
            "kc": ([2, 12, 2, 16], "f32"),
            "vc": ([2, 12, 2, 16], "f32"),
            "pos": ([2], "i32"),
        },
        "[2, 2, 3, 16]",
    ),
    "std.nn.attention::causal_attention": (
        "use std.nn.attention::{causal_attention}",
        "causal_attention(q, k, v, 0.25)",
        {"q": ([2, 5, 2, 3, 16], "f32"), "k": ([2, 5, 2, 16], "f32"), "v": ([2, 5, 2, 16], "f32")},
        "[2, 5, 2, 3, 16]",
    ),
    # The issue-19 ops (the shipped models'); windows shorter than the sequence and the
    # cache, so that the sliding mask drops keys the causal one keeps.
    "std.nn.attention::window_attention": (
        "use std.nn.attention::{window_attention}",
        "window_attention(q, k, v, 0.25, 3)",
        {"q": ([2, 7, 2, 3, 16], "f32"), "k": ([2, 7, 2, 16], "f32"), "v": ([2, 7, 2, 16], "f32")},
        "[2, 7, 2, 3, 16]",
    ),
    "std.nn.attention::window_decode_attention": (
        "use std.nn.attention::{window_decode_attention}",
        "window_decode_attention(q, kc, vc, pos, 0.25, 4)",
        {
            "q": ([2, 2, 3, 16], "f32"),
            "kc": ([2, 12, 2, 16], "f32"),
            "vc": ([2, 12, 2, 16], "f32"),
            "pos": ([2], "i32"),
        },
        "[2, 2, 3, 16]",
    ),
    "std.nn.norm::rms_norm_offset": (
        "use std.nn.norm::{rms_norm_offset}",
        "rms_norm_offset(x, w, 1e-5)",
        {"x": ([3, 8], "f32"), "w": ([8], "f32")},
        "[3, 8]",
    ),
    "std.nn.norm::layer_norm": (
        "use std.nn.norm::{layer_norm}",
        "layer_norm(x, w, b, 1e-5)",
        {"x": ([3, 8], "f32"), "w": ([8], "f32"), "b": ([8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::gelu_tanh": (
        "use std.nn.activation::{gelu_tanh}",
        "gelu_tanh(x)",
        {"x": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.linear::linear_in_out_bias": (
        "use std.nn.linear::{linear_in_out_bias}",
        "linear_in_out_bias(x, w, b)",
        {"x": ([3, 8], "f32"), "w": ([8, 5], "f32"), "b": ([5], "f32")},
        "[3, 5]",
    ),
}


def fast_case_program(use: str, call: str, inputs: dict, out: str, dtype: str = "f32") -> Program:
    params = ", ".join(
        f"{n}: Tensor[{', '.join(str(d) for d in s)}; {t if t != 'f32' else dtype}]"
        for n, (s, t) in inputs.items()
    )
    return Program.from_text(f"""
{use}
model M {{
    entry run({params}) -> Tensor[{out.strip("[]")}; {dtype}] {{
        return {call}
    }}
}}
""")


def random_inputs(callee: str, inputs: dict, dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape, t in inputs.values():
        if t == "i32":
            high = shape[0] if len(shape) == 1 and shape[0] > 2 else 10
            out.append(rng.integers(0, high, shape, dtype=np.int32))
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            out.append(x.astype(jnp.bfloat16) if dtype == "bf16" else x)
    if callee in (
        "std.nn.attention::decode_attention",
        "std.nn.attention::window_decode_attention",
    ):
        out[3] = np.array([4, 11], dtype=np.int32)  # pos 11 with window 4: 0..7 masked
    return out


F32_ONLY = {"std.nn.activation::softmax"}  # declared on f32 tensors: no bf16 variant
CASES = [(c, "f32") for c in sorted(FAST_CALLS)] + [
    (c, "bf16") for c in sorted(FAST_CALLS) if c not in F32_ONLY
]


@pytest.mark.parametrize("callee,dtype", CASES)
def test_fast_call_equals_the_op_body(callee, dtype):
    use, call, inputs, out = FAST_CASES[callee]
    graph = lower(
        fast_case_program(use, call, inputs, out, dtype),
        "run",
        {n: s for n, (s, _) in inputs.items()},
    )
    assert graph.semantic_calls(callee), "the case must call the op"
    args = random_inputs(callee, inputs, dtype)
    fast = import_source(emit_jax(graph, fast=True), "fast_case")
    body = import_source(emit_jax(graph, fast=False), "body_case")
    # The fused form was written (the two modules differ), and it is what runs below.
    assert Path(fast.__file__).read_text() != Path(body.__file__).read_text()
    (got,), _ = jax.jit(fast.run)(*args, {}, {})
    (want,), _ = jax.jit(body.run)(*args, {}, {})
    assert got.dtype == want.dtype == jnp.dtype(jnp.bfloat16 if dtype == "bf16" else "float32")
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    tol = 1e-5 if dtype == "f32" else 2e-2  # bf16: one rounding of 8 mantissa bits apart
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dtype == "f32":  # and the body is what the NumPy reference computes
        (ref,) = run_graph(graph, {v[1:]: a for v, a in zip(graph.inputs, args)}, {}, {})
        np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


# The sliding-window ops with the window an input (a traced value under jit, as a config
# computed one may be): each module is generated and jitted once, hypothesis draws windows
# from 1 (the diagonal alone) past the sequence (the causal mask alone) and decode positions.
WINDOW_PROGRAMS = {
    "prefill": """
use std.nn.attention::{window_attention}
model M {
    entry run(q: Tensor[2, 9, 2, 2, 16; f32], k: Tensor[2, 9, 2, 16; f32],
              v: Tensor[2, 9, 2, 16; f32], w: Tensor[1; i32]) -> Tensor[2, 9, 2, 2, 16; f32] {
        return window_attention(q, k, v, 0.25, w[0])
    }
}""",
    "decode": """
use std.nn.attention::{window_decode_attention}
model M {
    entry run(q: Tensor[2, 2, 2, 16; f32], kc: Tensor[2, 9, 2, 16; f32],
              vc: Tensor[2, 9, 2, 16; f32], pos: Tensor[2; i32], w: Tensor[1; i32])
              -> Tensor[2, 2, 2, 16; f32] {
        return window_decode_attention(q, kc, vc, pos, 0.25, w[0])
    }
}""",
}
_WINDOW_MODULES: dict = {}


def window_functions(kind: str):
    """The fused and the body form of a window op's program, jitted (made once)."""
    if kind not in _WINDOW_MODULES:
        program = Program.from_text(WINDOW_PROGRAMS[kind])
        shapes = (
            {"q": [2, 9, 2, 2, 16], "k": [2, 9, 2, 16], "v": [2, 9, 2, 16], "w": [1]}
            if kind == "prefill"
            else {
                "q": [2, 2, 2, 16],
                "kc": [2, 9, 2, 16],
                "vc": [2, 9, 2, 16],
                "pos": [2],
                "w": [1],
            }
        )
        graph = lower(program, "run", shapes)
        fast = import_source(emit_jax(graph, fast=True), f"window_{kind}_fast")
        body = import_source(emit_jax(graph, fast=False), f"window_{kind}_body")
        assert Path(fast.__file__).read_text() != Path(body.__file__).read_text()
        _WINDOW_MODULES[kind] = (shapes, jax.jit(fast.run), jax.jit(body.run))
    return _WINDOW_MODULES[kind]


@settings(PROFILE, max_examples=10 * SCALE, deadline=None)
@given(
    kind=st.sampled_from(["prefill", "decode"]),
    window=st.integers(1, 11),
    pos=st.lists(st.integers(0, 8), min_size=2, max_size=2),
    seed=st.integers(0, 2**16),
)
def test_window_fast_calls_equal_the_bodies_for_any_window(kind, window, pos, seed):
    shapes, fast, body = window_functions(kind)
    rng = np.random.default_rng(seed)
    args = [
        rng.standard_normal(s).astype(np.float32)
        for n, s in shapes.items()
        if n not in ("pos", "w")
    ]
    if kind == "decode":
        args.append(np.array(pos, np.int32))
    args.append(np.array([window], np.int32))
    (got,), _ = fast(*args, {}, {})
    (want,), _ = body(*args, {}, {})
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


# Random index-notation programs (computed positions, shifts, reductions, casts, every
# primitive): the generated JAX computes what NumPy says.
@settings(PROFILE, max_examples=40 * SCALE, deadline=None)
@given(index_programs())
def test_generated_index_programs_match_numpy(case) -> None:
    program = Program.from_text(case.source)
    if check_program(program):
        return  # checker limitations are linnet-lang's tests' business
    graph = lower(program, "run", case.inputs, case.config, check=False)
    text = emit_jax(graph)
    ns: dict = {}
    exec(compile(text, "case", "exec"), ns)
    args = [np.asarray(case.data[v[1:]]) for v in graph.inputs]
    with x64():  # jitted, as the runtime runs it
        (out,), _ = jax.jit(ns["run"])(*args, {}, {})
    expected = case.expected
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    tol = 1e-2 if "f16" in case.source else 1e-4
    np.testing.assert_allclose(
        np.asarray(out, dtype=expected.dtype),
        expected,
        rtol=0 if case.exact else tol,
        atol=0 if case.exact else tol * scale,
        err_msg=text,
    )


@settings(PROFILE, max_examples=20 * SCALE, deadline=None)
@given(state_programs())
def test_generated_state_writes_match_numpy(case) -> None:
    program = Program.from_text(case.source)
    if check_program(program):
        return
    graph = lower(program, "run", case.inputs, case.config, check=False)
    text = emit_jax(graph)
    ns: dict = {}
    exec(compile(text, "case", "exec"), ns)
    args = [np.asarray(case.data[v[1:]]) for v in graph.inputs]
    with x64():
        before = {"s": jnp.asarray(case.state.copy())}
        (out,), states = jax.jit(ns["run"])(*args, {}, before)
    np.testing.assert_array_equal(np.asarray(out), case.expected, err_msg=text)
    np.testing.assert_array_equal(np.asarray(states["s"]), case.expected, err_msg=text)
    np.testing.assert_array_equal(np.asarray(before["s"]), case.state)  # pure


@pytest.fixture(scope="module")
def toy_weights(tmp_path_factory):
    from linnet.jax import save_safetensors

    path = tmp_path_factory.mktemp("w") / "toy.safetensors"
    save_safetensors(random_weights(LLAMA, toy_config()), str(path))
    return path


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_llama_matches_the_pytorch_interpreter(toy_weights, dtype):
    torch = pytest.importorskip("torch")
    from linnet.torch import load as torch_load

    prompt = np.array([[5, 1, 77, 3, 200, 9]], dtype=np.int32)
    cfg = {k: v for k, v in toy_config().items() if k != "T"}  # T follows dtype=
    jm = load(LLAMA, weights=toy_weights, config=cfg, dtype=dtype)
    tm = torch_load(LLAMA, weights=toy_weights, config=cfg, dtype=dtype, interpret=True)
    tol = 1e-4 if dtype == "f32" else 5e-2
    got = np.asarray(jm.prefill(prompt), np.float32)
    want = tm.prefill(torch.from_numpy(prompt)).float().numpy()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    for pos, token in [(6, 17), (7, 250)]:
        t, p = np.array([token], np.int32), np.array([pos], np.int32)
        got = np.asarray(jm.decode(t, p), np.float32)
        want = tm.decode(torch.from_numpy(t), torch.from_numpy(p)).float().numpy()
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # The caches too (the states the model keeps, after the donated calls).
    for path, value in jm.states.items():
        np.testing.assert_allclose(
            np.asarray(value, np.float32),
            tm._contexts[next(iter(tm._contexts))].states[path].float().numpy(),
            rtol=tol,
            atol=tol,
        )


def test_load_function_is_pure_and_returns_new_states(toy_weights):
    decode = load_function(LLAMA, "decode", weights=toy_weights, config="toy")
    ins = [np.array([3], np.int32), np.array([0], np.int32)]
    states = decode.new_states(ins)
    (logits,), new = decode(decode.params, states, ins)
    assert logits.shape == (1, 256)
    assert set(new) == set(states)
    k = np.asarray(new["model.layers.0.self_attn.k_cache"])
    assert np.abs(k[0, 0]).sum() > 0 and np.abs(k[0, 1:]).sum() == 0  # position 0 written
    # By name, and the same function object for the same shapes (jitted once).
    (again,), _ = decode(decode.params, new, {"token": ins[0], "pos": ins[1]})
    assert decode.lowered(ins) is decode.lowered({"token": ins[0], "pos": ins[1]})
    assert again.shape == (1, 256)


def test_the_states_are_donated(toy_weights):
    decode = load_function(LLAMA, "decode", weights=toy_weights, config="toy")
    ins = [np.array([3], np.int32), np.array([0], np.int32)]
    low = decode.lowered(ins)
    states = decode.new_states(ins)
    text = low.jitted.lower(decode.params, states, tuple(ins)).as_text()
    # Each state is an input aliased to an output: XLA may write the new cache in place.
    aliased = text.count("tf.aliasing_output") + text.count("jax.buffer_donor")
    assert aliased == len(states)


def test_load_source_is_a_content_hashed_file(linnet_home):
    m = load_source(LLAMA, "decode", {"token": [1], "pos": [1]}, config="toy")
    path = Path(m.__file__)
    assert path.parent == linnet_home / "generated" and path.read_text().startswith('"""JAX')
    again = load_source(LLAMA, "decode", {"token": [1], "pos": [1]}, config="toy")
    assert again is m
    assert m.ENTRIES["decode"]["function"] == "decode"


def test_numerics_fast_runs_close_to_exact(toy_weights):
    prompt = np.array([[5, 1, 77, 3]], dtype=np.int32)
    exact = load(LLAMA, weights=toy_weights, config="toy").prefill(prompt)
    model = load(LLAMA, weights=toy_weights, config="toy", numerics="fast")
    fast = model.prefill(prompt)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(exact), rtol=1e-2, atol=1e-2)
    assert "PRECISION = None" in Path(model.source("prefill", [prompt])).read_text()


def test_the_function_composes_under_jit_and_scan(toy_weights):
    """Pure: greedy decoding as one `lax.scan` of the decode function, inside `jax.jit`,
    gives the tokens of step-by-step calls."""
    decode = load_function(LLAMA, "decode", weights=toy_weights, config="toy")
    ins = [np.array([7], np.int32), np.array([0], np.int32)]
    states = decode.new_states(ins)
    tokens, s = [], decode.new_states(ins)
    token = ins[0]
    for pos in range(6):
        (logits,), s = decode(decode.params, s, [token, np.array([pos], np.int32)])
        token = np.asarray(logits).argmax(-1).astype(np.int32)
        tokens.append(int(token[0]))

    @jax.jit
    def greedy(params, states, token):
        def step(carry, pos):
            states, token = carry
            (logits,), states = decode(params, states, [token, pos[None]])
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            return (states, token), token[0]

        _, out = jax.lax.scan(step, (states, token), jnp.arange(6, dtype=jnp.int32))
        return out

    assert np.asarray(greedy(decode.params, states, ins[0])).tolist() == tokens


def test_gradients_of_the_fused_forms_equal_the_bodies():
    """jax.grad through the generated prefill: the fused JAX calls (dot_product_attention,
    silu, matmul, ...) give the gradients of the std ops' bodies."""
    prompt = np.array([[5, 1, 7, 3]], np.int32)
    cfg = {
        "V": 16,
        "D": 32,
        "F": 32,
        "NL": 1,
        "H": 2,
        "KV": 1,
        "HD": 16,
        "S": 8,
        "T": "f32",
        "rope_theta": 10000.0,
    }
    weights = random_weights(LLAMA, cfg, scale=0.2)
    grads = []
    for fast in (True, False):
        fn = load_function(LLAMA, "prefill", weights=weights, config=cfg, fast=fast)
        module, states = fn.lowered([prompt]).module, fn.new_states([prompt])

        def loss(params, module=module, states=states):
            (logits,), _ = module.prefill(prompt, params, states)
            return (jax.nn.log_softmax(logits)[0, :, 0]).sum()

        with jax.default_matmul_precision("highest"):
            grads.append(jax.jit(jax.grad(loss))(fn.params))
    assert set(grads[0]) == set(grads[1])
    for path in grads[0]:
        np.testing.assert_allclose(
            np.asarray(grads[0][path]),
            np.asarray(grads[1][path]),
            rtol=1e-4,
            atol=1e-6,
            err_msg=path,
        )


# scatter_add (the transpose of gathers in reverse mode, linnet.lang.grad): the generated JAX
# computes what NumPy says, with coinciding positions (they add up) and, under bounds zero,
# positions outside the axes (they add nothing; jax itself would wrap a negative index).
@pytest.mark.parametrize("bounds", ["zero", "unchecked"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_generated_scatter_add_matches_numpy(bounds, k) -> None:
    from test_grad_rules import graph

    rng = np.random.default_rng(k)
    xs = (4, 3, 2)
    inputs = {"x": (xs, "f64"), "v": ((5, *xs[k:]) if k else xs, "f64")}
    for a in range(k):
        inputs[f"i{a}"] = ((5,), "i64")
    g = graph(
        inputs,
        [
            (
                "scatter_add",
                ["%x", "%v", *[f"%i{a}" for a in range(k)]],
                "%r",
                xs,
                "f64",
                {"indexed_axes": k, "bounds": bounds},
            )
        ],
        ["%r"],
    )
    data = {"x": rng.standard_normal(xs), "v": rng.standard_normal(inputs["v"][0])}
    for a in range(k):
        lo, hi = (-2, xs[a] + 2) if bounds == "zero" else (0, xs[a])
        data[f"i{a}"] = rng.integers(lo, hi, size=5)
        data[f"i{a}"][1] = data[f"i{a}"][0]  # a repeated position
    (want,) = run_graph(g, data, {}, {})
    ns: dict = {}
    text = emit_jax(g)
    exec(compile(text, "case", "exec"), ns)
    with x64():
        (got,), _ = jax.jit(ns["run"])(*[np.asarray(data[v[1:]]) for v in g.inputs], {}, {})
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, err_msg=text)


# slice (issue 19's static ranges): Python slicing in the generated JAX, against NumPy, with
# the leading axis alone, inner axes, an empty range and every axis whole.
@pytest.mark.parametrize(
    "starts,limits",
    [
        ([1, 0, 0], [3, 3, 2]),
        ([0, 1, 1], [4, 3, 2]),
        ([2, 0, 0], [2, 3, 2]),
        ([0, 0, 0], [4, 3, 2]),
    ],
)
def test_generated_slice_matches_numpy(starts, limits) -> None:
    from test_grad_rules import graph

    out = tuple(b - a for a, b in zip(starts, limits))
    g = graph(
        {"x": ((4, 3, 2), "f64")},
        [("slice", ["%x"], "%r", out, "f64", {"starts": starts, "limits": limits})],
        ["%r"],
    )
    x = np.random.default_rng(0).standard_normal((4, 3, 2))
    (want,) = run_graph(g, {"x": x}, {}, {})
    ns: dict = {}
    text = emit_jax(g)
    exec(compile(text, "case", "exec"), ns)
    with x64():
        (got,), _ = jax.jit(ns["run"])(x, {}, {})
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=text)


def test_a_bitcast_keeps_every_bit(tmp_path) -> None:
    """Every same-width pair of `bitcast<T>(x)` (linnet-lang's tests/bitcast_cases.py): the
    generated module's `lax.bitcast_convert_type` gives the inputs' bits, NaN payloads,
    subnormals and bf16 included, and the nibbles' floats."""
    import bitcast_cases as bc

    path = tmp_path / "bits.linnet"
    path.write_text(bc.SOURCE)
    with x64():  # the i64 and f64 pairs
        m = load_source(path, "run", {k: [bc.N] for k in bc.INPUTS}, config={"N": bc.N})
        out, _ = jax.jit(lambda *a: m.run(*a, {}, {}))(*bc.arrays())
    bc.check(list(out), "generated JAX")


# model.export_onnx / export_stablehlo: thin calls into linnet.lang.export (as the torch
# runtime's), with the model's own weights; the exported entry computes what the model does.
def test_model_export_onnx_runs_like_the_model(toy_weights, tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = load(LLAMA, weights=toy_weights, config="toy")
    token, pos = np.array([5], np.int32), np.array([0], np.int32)
    written = model.export_onnx("decode", [token, pos], tmp_path / "decode.onnx")
    assert written == [tmp_path / "decode.onnx"]
    sess = ort.InferenceSession(str(written[0]), providers=["CPUExecutionProvider"])
    graph = model.graph("decode", [token, pos])
    states = {p: np.zeros(vt.shape, np.float32) for p, vt in graph.states.items()}
    for step in range(3):
        p = np.array([step], np.int32)
        want = model.decode(token, p)
        outs = sess.run(None, {"token": token, "pos": p, **states})
        np.testing.assert_allclose(outs[0], np.asarray(want), rtol=1e-4, atol=1e-5)
        states = dict(zip(graph.states, outs[1:]))
        for path, value in states.items():  # the exported cache is the model's own
            np.testing.assert_allclose(value, np.asarray(model.states[path]), atol=1e-5)


def test_model_export_stablehlo_runs_like_the_model(toy_weights, tmp_path) -> None:
    from linnet.lang.emit.stablehlo import compile_cpu

    model = load(LLAMA, weights=toy_weights, config="toy")
    tokens = np.array([[3, 1, 4, 1]], np.int32)
    order = model.export_stablehlo("prefill", [tokens], tmp_path / "prefill.mlir", verify=True)
    assert order[0] == "tokens"
    run = compile_cpu((tmp_path / "prefill.mlir").read_text())
    graph = model.graph("prefill", [tokens])
    named = {
        "tokens": tokens,
        **{p: np.zeros(vt.shape, np.float32) for p, vt in graph.states.items()},
        **{p: np.asarray(v) for p, v in model.params.items()},
    }
    outs = run(*(named[n] for n in order))
    np.testing.assert_allclose(outs[0], np.asarray(model.prefill(tokens)), rtol=1e-4, atol=1e-5)


def _cross_entropy(logits, targets):
    """The mean next-token cross-entropy of [1, L, V] logits (a loss of the prefill)."""
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    return -jnp.take_along_axis(logp, jnp.asarray(targets[0])[:, None], axis=-1).mean()


def test_linnet_jax_grad_matches_jax_grad_and_the_torch_gradient(tmp_path, capsys) -> None:
    """Issue 18's acceptance on JAX: `linnet jax --grad` (the reverse pass, as generated JAX)
    on the toy Llama's prefill loss equals jax.grad of the generated forward and the torch
    runtime's value_and_grad, for every parameter."""
    torch = pytest.importorskip("torch")
    from linnet.lang.cli import main
    from linnet.torch import load as torch_load

    cfg = toy_config(B=1)
    target = tmp_path / "prefill_grad.py"
    assert (
        main(
            [
                "jax",
                str(LLAMA),
                "--config",
                "toy",
                "--set",
                "B=1",
                "--entry",
                "prefill",
                "--input",
                "tokens=1,8",
                "--grad",
                "--grad-seed",
                "cotangents",
                "-o",
                str(target),
            ]
        )
        == 0
    )
    grad_ns: dict = {}
    exec(compile(target.read_text(), str(target), "exec"), grad_ns)
    weights = random_weights(LLAMA, cfg, scale=0.05)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, cfg["V"], (1, 8)).astype(np.int32)
    targets = rng.integers(0, cfg["V"], (1, 8)).astype(np.int32)
    fn = load_function(LLAMA, "prefill", weights=weights, config=cfg)
    module, states = fn.lowered([tokens]).module, fn.new_states([tokens])

    def loss(params):
        (logits,), _ = module.prefill(tokens, params, states)
        return _cross_entropy(logits, targets)

    with jax.default_matmul_precision("highest"):
        want = jax.jit(jax.grad(loss))(fn.params)
        (logits,), _ = jax.jit(module.prefill)(tokens, fn.params, states)
        d_logits = jax.grad(_cross_entropy)(logits, targets)
        outs, _ = jax.jit(grad_ns["prefill"])(tokens, d_logits, fn.params, states)
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(logits), rtol=1e-5, atol=1e-6)
    paths = sorted(fn.params)  # "params": every float parameter, by path
    got = dict(zip(paths, outs[1:], strict=True))
    tm = torch_load(LLAMA, weights={k: torch.from_numpy(v) for k, v in weights.items()}, config=cfg)
    _, torch_grads = tm.value_and_grad(
        "prefill", [torch.from_numpy(tokens)], cotangents=[torch.from_numpy(np.array(d_logits))]
    )
    assert set(torch_grads) == set(paths) == set(want)
    for path in paths:
        ref = np.asarray(want[path])
        scale = float(np.abs(ref).max())
        assert scale > 0, path
        for name, other in (("linnet jax --grad", got[path]), ("torch", torch_grads[path])):
            np.testing.assert_allclose(
                np.asarray(other),
                ref,
                rtol=1e-4,
                atol=1e-4 * scale,
                err_msg=f"{path}: {name} against jax.grad",
            )


# Issue 18's acceptance on JAX for the std ops: the reverse pass's graph of each std op,
# written as generated JAX, equals jax.vjp of the op's generated JAX forward.
STD_GRAD_OPS = [
    "silu",
    "gelu",
    "softmax",
    "linear",
    "linear_bias",
    "rms_norm",
    "layer_norm",
    "embedding",
    "rope",
    "causal_attention",
    "decode_attention",
    "linear_q8",  # with respect to x only: the int8 levels and f16 scales have no gradient
    "linear_q4",
]


def _drawn(rng: np.random.Generator, vt) -> np.ndarray:
    """A random input of an op's graph: 8-bit levels over their range, small f16 scales."""
    if vt.dtype == "i32":
        return rng.integers(0, 3, size=vt.shape).astype(np.int32)
    if vt.dtype == "i8":
        return rng.integers(-127, 128, size=vt.shape).astype(np.int8)
    if vt.dtype == "u8":
        return rng.integers(0, 256, size=vt.shape).astype(np.uint8)
    if vt.dtype == "f16":
        return (rng.standard_normal(vt.shape) * 0.05).astype(np.float16)
    return rng.standard_normal(vt.shape).astype(np.float32)


@pytest.mark.parametrize("name", STD_GRAD_OPS)
def test_std_op_gradient_as_generated_jax_matches_jax_vjp(name) -> None:
    from linnet.lang.grad import differentiate
    from test_grad_std import STD, _graph

    assert sorted(STD_GRAD_OPS) == sorted(STD)  # every std op linnet-lang's grad tests cover
    graph, _ = _graph(name)
    wrt = [r for r in graph.inputs if graph.values[r].dtype == "f32"]
    forward: dict = {}
    backward: dict = {}
    exec(compile(emit_jax(graph), f"{name}_forward", "exec"), forward)
    exec(
        compile(emit_jax(differentiate(graph, wrt, seed="cotangents")), f"{name}_grad", "exec"),
        backward,
    )
    rng = np.random.default_rng(len(name))
    args = [_drawn(rng, graph.values[r]) for r in graph.inputs]
    cot = (
        np.random.default_rng(1)
        .standard_normal(graph.values[graph.outputs[0]].shape)
        .astype(np.float32)
    )
    floats = [i for i, r in enumerate(graph.inputs) if r in wrt]

    def f(*xs):
        full = list(args)
        for i, x in zip(floats, xs, strict=True):
            full[i] = x
        (out,), _ = forward["run"](*full, {}, {})
        return out

    with jax.default_matmul_precision("highest"):
        _, vjp = jax.vjp(f, *[args[i] for i in floats])
        want = vjp(cot)
        outs, _ = jax.jit(backward["run"])(*args, cot, {}, {})
    assert len(outs) == 1 + len(floats)
    for got, ref in zip(outs[1:], want, strict=True):
        ref = np.asarray(ref)
        np.testing.assert_allclose(
            np.asarray(got), ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max()))
        )


def test_model_export_onnx_with_a_symbolic_batch_runs_at_any_batch(toy_weights, tmp_path):
    """dynamic="B": the decode export runs at the model's B = 1 like the model, and at B = 3
    like the NumPy reference lowered there."""
    ort = pytest.importorskip("onnxruntime")
    model = load(LLAMA, weights=toy_weights, config="toy")
    token, pos = np.array([5], np.int32), np.array([0], np.int32)
    (path,) = model.export_onnx("decode", [token, pos], tmp_path / "decode.onnx", dynamic="B")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.shape[0] for i in sess.get_inputs()[:3]] == ["B", "B", "B"]
    graph = model.graph("decode", [token, pos])
    zeros = {p: np.zeros(vt.shape, np.float32) for p, vt in graph.states.items()}
    outs = sess.run(None, {"token": token, "pos": pos, **zeros})
    np.testing.assert_allclose(outs[0], np.asarray(model.decode(token, pos)), rtol=1e-4, atol=1e-5)
    params = {p: np.asarray(v) for p, v in model.params.items()}
    cfg = {**model.function("decode")._prep.config, "B": 3}
    wide = lower(Program.from_file(LLAMA), "decode", {"token": [3], "pos": [3]}, cfg, check=False)
    feed = {"token": np.array([5, 7, 9], np.int32), "pos": np.array([0, 3, 1], np.int32)}
    states = {p: np.zeros(vt.shape, np.float32) for p, vt in wide.states.items()}
    after = {k: v.copy() for k, v in states.items()}
    (want,) = run_graph(wide, feed, params, after)
    outs = sess.run(None, {**feed, **states})
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-5)
    for value, path in zip(outs[1:], wide.states):
        np.testing.assert_allclose(value, after[path], rtol=1e-4, atol=1e-5)
