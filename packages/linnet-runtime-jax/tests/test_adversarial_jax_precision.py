"""f64 through the fused JAX forms (issue 46 item 3): a fused call accumulates where its op's
body does (the body's `sum`: f32 for 16-bit floats and f32, f64 for f64). The `linear` forms
passed `preferred_element_type=float32` and the attention forms rounded scores and softmax
to f32 (jax.nn.dot_product_attention does whatever its inputs), so at T = f64 they were up to
1.9e-7 off the body.

Silent wrong results: every fused call at T = f64 against the NumPy reference, and
`jax.test_util.check_grads` through a few of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from jax_support import x64
from linnet.jax.home import import_source
from linnet.lang import lower
from linnet.lang.emit.jax import FAST_CALLS, emit_jax
from reference import run_graph
from test_jax_generated import FAST_CASES, fast_case_program

F32_ONLY = {"std.nn.activation::softmax"}  # declared on f32 tensors: no f64 case
# Bodies that convert to f32 themselves (`x as f32`: the norms' statistics, gelu, silu as
# F.silu computes it): f32-accurate at every T, the reference included, so the fused call is
# held to f32's tolerance there.
AS_F32 = {
    "std.nn.norm::rms_norm",
    "std.nn.norm::rms_norm_offset",
    "std.nn.norm::layer_norm",
    "std.nn.activation::gelu_tanh",
    "std.nn.activation::silu",
    "std.nn.activation::silu_mul",
}


def f64_case(callee: str) -> tuple:
    use, call, inputs, out = FAST_CASES[callee]
    graph = lower(
        fast_case_program(use, call, inputs, out, "f64"),
        "run",
        {n: s for n, (s, _) in inputs.items()},
    )
    rng = np.random.default_rng(0)
    args = [
        rng.integers(0, 10, s, dtype=np.int32) if t == "i32" else rng.standard_normal(s)
        for s, t in inputs.values()
    ]
    if "decode" in callee:
        args[3] = np.array([4, 11], dtype=np.int32)  # pos 11 with window 4: 0..7 masked
    return graph, args


@pytest.mark.parametrize("callee", sorted(set(FAST_CALLS) - F32_ONLY))
def test_fused_call_at_f64_equals_the_body(callee):
    graph, args = f64_case(callee)
    assert graph.semantic_calls(callee), "the case must call the op"
    fast = import_source(emit_jax(graph, fast=True), "fast_f64")
    with x64():
        (got,), _ = jax.jit(fast.run)(*args, {}, {})
    assert got.dtype == jnp.float64
    (want,) = run_graph(graph, {v[1:]: a for v, a in zip(graph.inputs, args)}, {}, {})
    tol = 1e-6 if callee in AS_F32 else 1e-12
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "callee",
    [
        "std.nn.linear::linear_bias",
        "std.nn.attention::causal_attention",
        "std.nn.attention::window_decode_attention",
    ],
)
def test_check_grads_through_fused_calls_at_f64(callee):
    graph, args = f64_case(callee)
    fast = import_source(emit_jax(graph, fast=True), "grad_f64")
    floats = [i for i, a in enumerate(args) if a.dtype == np.float64]

    def entry(*xs):
        given = list(args)
        for i, x in zip(floats, xs):
            given[i] = x
        return fast.run(*given, {}, {})[0][0]

    with x64():
        check_grads(
            entry,
            tuple(jnp.asarray(args[i]) for i in floats),
            order=1,
            modes=["rev"],
            eps=1e-6,
            atol=1e-7,
            rtol=1e-7,
        )
