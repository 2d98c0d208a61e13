"""Bound ops launch their kernels from generated JAX through `pl.pallas_call`, and fall back
to the body, one case at a time; each case reads the module's RUNS counters (which path was
traced) and compares with the op's body. Kernels run under LINNET_PALLAS_INTERPRET=1
(`interpret=True`) on the CPU; the `gpu` case launches them for real."""

from __future__ import annotations

import builtins
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from linnet.jax import load_source

# The torch tests' sampler (under CI=1 a seeded draw that rotates daily), shared by both
# runtimes' tests as test_jax_models.py shares it.
TORCH_TESTS = str(Path(__file__).resolve().parents[2] / "linnet-runtime-torch" / "tests")
if TORCH_TESTS not in sys.path:
    sys.path.append(TORCH_TESTS)
from support import CI, CI_SEED, ci_sample  # noqa: E402

SOFTMAX = """
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] { return softmax(x) }
}
"""

# A kernel-bound op with a deliberately wrong grad clause (7 where the body says 2): under
# jax.grad the launched kernel's backward must be it, not the body's derivative. (It was the
# constant `dy * 0.0 + 7.0`; a launch is now differentiated through the clause's transpose,
# which only a clause linear in `dy` has: test_adversarial_grad.py's E0561 cases.)
CLAUSE = """
pub kernel twice_k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid((N + B - 1) / B)
{
    let cols = program_id(0) * B + iota<i32>(B)
    store(y[cols], load(x[cols], cols < N) * 2.0, cols < N)
}

pub op twice<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel twice_k<N, 4> {
    let y[n] = x[n] * 2.0
    return y
} grad(dy) {
    let dx[n] = dy[n] * 7.0
    return dx
}

model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return twice(x) }
}
"""


@pytest.fixture
def model(tmp_path):
    def write(text: str = SOFTMAX):
        path = tmp_path / "m.linnet"
        path.write_text(text)
        return path

    return write


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")


@pytest.fixture
def on_gpu(monkeypatch):
    """Pallas for real on the GPU (the interpreter switched off); skipped without one."""
    monkeypatch.delenv("LINNET_PALLAS_INTERPRET", raising=False)
    if jax.default_backend() != "gpu":
        pytest.skip("needs jax with a GPU backend")


def entry(module):
    """The entry `run` as a function of x alone, jitted (as the runtime jits entries)."""
    return jax.jit(lambda x: module.run(x, {}, {})[0][0])


def poisoned(shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jnp.asarray(x * 4)


@pytest.mark.parametrize("shape", [[1, 1], [3, 5], [2, 1024]])
def test_interpreted_kernel_equals_the_body(model, interpret, shape):
    path = model()
    fast = load_source(path, "run", {"x": shape}, numerics="fast")
    body = load_source(path, "run", {"x": shape}, numerics="exact")
    assert "pl.pallas_call(" in Path(fast.__file__).read_text()
    assert not hasattr(body, "RUNS")  # exact: the body alone, no kernel written
    x = poisoned(shape)
    run = entry(fast)
    y = run(x)
    ((key, counts),) = fast.RUNS.items()
    assert counts == [1, 0]  # traced once, launching the kernel
    np.testing.assert_allclose(np.asarray(y), np.asarray(entry(body)(x)), rtol=1e-6, atol=1e-7)
    y2 = run(x + 1)  # jit reuses the compiled launch: no new trace
    assert fast.RUNS[key] == [1, 0]
    np.testing.assert_allclose(np.asarray(y2), np.asarray(y), rtol=1e-5, atol=1e-7)


def test_cpu_without_the_interpreter_runs_the_body(model, monkeypatch):
    monkeypatch.delenv("LINNET_PALLAS_INTERPRET", raising=False)
    m = load_source(model(), "run", {"x": [3, 5]}, numerics="fast")
    x = poisoned([3, 5])
    y = entry(m)(x)
    assert list(m.RUNS.values()) == [[0, 1]]
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.nn.softmax(x, -1)), rtol=1e-6)


def test_no_pallas_runs_the_body(model, interpret, monkeypatch):
    real = builtins.__import__

    def no_pallas(name, *args, **kwargs):
        if name.startswith("jax.experimental.pallas") or (
            name == "jax.experimental" and "pallas" in (args[2] or ())
        ):
            raise ImportError("no pallas here")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pallas)
    m = load_source(model(), "run", {"x": [3, 5]}, numerics="fast")
    monkeypatch.setattr(builtins, "__import__", real)
    assert m.PALLAS is False
    x = poisoned([3, 5])
    y = entry(m)(x)
    assert list(m.RUNS.values()) == [[0, 1]]
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.nn.softmax(x, -1)), rtol=1e-6)


@pytest.mark.parametrize("case", ["where false", "exact"])
def test_no_launch_is_written_where_the_kernel_cannot_run(model, interpret, case):
    shape = [2, 2048] if case == "where false" else [3, 5]  # rows longer than B = 1024
    m = load_source(model(), "run", {"x": shape}, numerics="exact" if case == "exact" else "fast")
    text = Path(m.__file__).read_text()
    assert "kernels_ready" not in text and "pallas" not in text
    x = poisoned(shape)
    np.testing.assert_allclose(
        np.asarray(entry(m)(x)), np.asarray(jax.nn.softmax(x, -1)), rtol=1e-6, atol=1e-7
    )


def test_grad_through_a_kernel_equals_grad_of_the_body(model, interpret):
    path = model()
    fast = load_source(path, "run", {"x": [3, 5]}, numerics="fast")
    body = load_source(path, "run", {"x": [3, 5]}, numerics="exact")
    x, w = poisoned([3, 5]), poisoned([3, 5], seed=1)

    def loss(module):
        return jax.jit(jax.grad(lambda x: jnp.sum(module.run(x, {}, {})[0][0] * w)))

    g = loss(fast)(x)
    assert list(fast.RUNS.values()) == [[1, 0]]  # the forward pass launched the kernel
    np.testing.assert_allclose(np.asarray(g), np.asarray(loss(body)(x)), rtol=1e-5, atol=1e-6)


def test_a_grad_clause_is_the_kernels_backward(model, interpret):
    m = load_source(model(CLAUSE), "run", {"x": [10]}, numerics="fast")
    text = Path(m.__file__).read_text()
    assert "def twice_grad(x, dy):" in text
    assert "launch_twice_k_10_4(twice_body, twice_grad, x)" in text
    x = poisoned([10])
    y = entry(m)(x)
    np.testing.assert_allclose(np.asarray(y), 2 * np.asarray(x))
    g = jax.grad(lambda x: jnp.sum(m.run(x, {}, {})[0][0]))(x)
    assert m.RUNS["twice_k_10_4"][0] >= 1  # launched, and differentiated by the clause
    np.testing.assert_array_equal(np.asarray(g), np.full(10, 7.0, np.float32))


def test_the_llama_decode_step_launches_pallas_kernels_and_equals_exact(interpret, tmp_path):
    """The example model's decode step under numerics fast: its kernel-bound std ops (the
    RMS norms) launch through Pallas's interpreter, and the logits equal numerics exact's
    (the bodies alone) within f32 rounding."""
    from jax_support import LLAMA, toy_config
    from linnet.jax import load_function, random_weights, save_safetensors

    path = tmp_path / "toy.safetensors"
    save_safetensors(random_weights(LLAMA, toy_config(), scale=0.2), str(path))
    inputs = [np.array([4], np.int32), np.array([3], np.int32)]
    logits = {}
    for numerics in ("exact", "fast"):
        f = load_function(LLAMA, "decode", weights=str(path), config="toy", numerics=numerics)
        (logits[numerics],), _ = f(f.params, f.new_states(inputs), inputs)
        runs = getattr(f.lowered(inputs).module, "RUNS", {})
        if numerics == "fast":
            launched = {k for k, (n, body) in runs.items() if n and not body}
            assert launched == set(runs), runs  # every instance written was launched
            assert any(k.startswith("rms_norm_rows") for k in launched), runs
        else:
            assert runs == {}
    scale = float(np.abs(np.asarray(logits["exact"])).max())
    np.testing.assert_allclose(
        np.asarray(logits["fast"]), np.asarray(logits["exact"]), rtol=1e-5, atol=1e-5 * scale
    )


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(1, 1000), (64, 1024)])
def test_std_kernels_launch_on_the_gpu_and_equal_their_bodies(
    rows, cols, on_gpu, monkeypatch, tmp_path
):
    """For real (no interpreter): each std binding's kernel against the same module's body
    (Pallas switched off, same numerics), TF32 products allowed where the kernel has one."""
    for module, op in drawn_bindings():
        text, ins = op_model(module, op, rows, cols)
        path = tmp_path / f"{op}_{rows}_{cols}.linnet"
        path.write_text(text)
        m = load_source(path, "run", ins, numerics="fast")
        xs = [poisoned(s) for s in ins.values()]
        y = jax.jit(lambda *a, m=m: m.run(*a, {}, {})[0][0])(*xs)
        assert all(n >= 1 and body == 0 for n, body in m.RUNS.values()), (op, m.RUNS)
        monkeypatch.setattr(m, "PALLAS", False)
        want = jax.jit(lambda *a, m=m: m.run(*a, {}, {})[0][0])(*xs)
        monkeypatch.setattr(m, "PALLAS", True)
        tol = 1e-2 if "jnp.dot(" in Path(m.__file__).read_text() else 1e-5
        scale = float(np.abs(np.asarray(want)).max())
        np.testing.assert_allclose(
            np.asarray(y), np.asarray(want), rtol=tol, atol=tol * scale, err_msg=op
        )


# ---------------------------------------------------------------- edge values
# tests/kernels/edges.linnet of the PyTorch runtime (its kernels_interpreted.py runs it in
# Triton's interpreter): NaN through max and min, integer / and % by 0 and MIN / -1, floats
# past i32 and i8, floors of subnormals.
EDGES = (
    Path(__file__).resolve().parents[2]
    / "linnet-runtime-torch"
    / "tests"
    / "kernels"
    / "edges.linnet"
)
_NAN, _INF = math.nan, math.inf
EDGE_INPUTS = {
    "x": np.array([_NAN, 1.0, -2.0, 3e9, -_INF, _INF, 0.5, -7.9], np.float32),
    "y": np.array([2.0, _NAN, -1.0, 300.0, -300.0, _NAN, -0.0, 1.5], np.float32),
    "z": np.array([-1e-45, -1e-30, -0.0, 0.0, 1e-45, -0.5, -1.5, 2.5], np.float32),
    "a": np.array([7, -7, 5, -(2**31), -(2**31), 0, 9, -9], np.int32),
    "b": np.array([0, 0, 2, -1, 1, 0, -2, 4], np.int32),
}


def edge_rules() -> list[list]:
    """Each result by the rules' Python definitions (linnet.lang.ir.edges)."""
    from linnet.lang.ir import edges as E

    x, y, z = (EDGE_INPUTS[k].tolist() for k in "xyz")
    a, b = EDGE_INPUTS["a"].tolist(), EDGE_INPUTS["b"].tolist()

    def reduced(values, kind):
        out = values[0]
        for v in values[1:]:
            out = E.nan_extreme(out, v, kind)
        return out

    top = [reduced(x, "max"), reduced(y, "min")] + [reduced(z, "max")] * 6
    return [
        [E.nan_extreme(p, q, "max") for p, q in zip(x, y)],
        [E.nan_extreme(p, q, "min") for p, q in zip(x, y)],
        top,
        [E.int_div(p, q, "i32") for p, q in zip(a, b)],
        [E.int_rem(p, q) for p, q in zip(a, b)],
        [E.float_to_int(v, "i32") for v in x],
        [E.float_to_int(v, "i8") for v in y],
        [E.floor(v) for v in z],
    ]


def edge_results(numerics: str) -> tuple[list, object]:
    m = load_source(
        EDGES, "run", {k: list(v.shape) for k, v in EDGE_INPUTS.items()}, numerics=numerics
    )
    out = jax.jit(lambda *a: m.run(*a, {}, {})[0])(*(EDGE_INPUTS[k] for k in "xyzab"))
    return [np.asarray(o).tolist() for o in out], m


def assert_edge_values(got: list, want: list) -> None:
    """The kernel's results equal the body's and the rules', NaN for NaN, zeros' signs too."""
    for k, (g, w, r) in enumerate(zip(got, want, edge_rules())):
        for row in (w, r):
            assert all(
                (v != v and u != u) or (v == u and math.copysign(1, v) == math.copysign(1, u))
                for v, u in zip(g, row)
            ), (k, g, w, r)


def test_a_kernel_follows_the_edge_value_rules_as_its_body_does(interpret):
    """Before: 7 / 0 gave -2 (the body 0), 7 % 0 gave 0 (the body 7), floor(-1e-45) -0.0 (XLA's
    CPU flushes the subnormal; the body -1); on a GPU, Pallas's Triton backend lowers
    jnp.maximum and jnp.max to maxnumf, which skips NaN (the GPU case below)."""
    got, m = edge_results("fast")
    assert m.RUNS == {"edge_tiles_8": [1, 0]}
    want, body = edge_results("exact")
    assert not hasattr(body, "RUNS")
    assert_edge_values(got, want)


@pytest.mark.gpu
def test_a_kernel_follows_the_edge_value_rules_on_the_gpu(on_gpu):
    got, m = edge_results("fast")
    assert m.RUNS == {"edge_tiles_8": [1, 0]}
    assert_edge_values(got, edge_results("exact")[0])


# ---------------------------------------------------------------- bitcast
# tests/kernels/bitcast.linnet of the PyTorch runtime (its kernels_interpreted.py runs it in
# Triton's interpreter): a byte's nibble in an f32's mantissa, i32 words read as f32 and back,
# f16 as i16, u8 as i8, each as `lax.bitcast_convert_type` in the Pallas kernel.
BITS = EDGES.with_name("bitcast.linnet")
BITS_INPUTS = {
    "b": np.array([0, 15, 16, 255, 37, 128, 7, 200], np.uint8),
    "w": np.array(
        [0x3F800000, -1, 1, 0x7FC00001, -0x40800000, 12345, 0x7F800000, -(2**31)], np.int32
    ),
    "h": np.array([1.0, -2.5, 65504.0, np.nan, 6e-8, -0.0, np.inf, 0.1], np.float16),
}


def bits_results(numerics: str) -> tuple[list[np.ndarray], object]:
    m = load_source(BITS, "run", {k: [8] for k in BITS_INPUTS}, numerics=numerics)
    out = jax.jit(lambda *a: m.run(*a, {}, {})[0])(*BITS_INPUTS.values())
    return [np.asarray(o) for o in out], m


def signed_bits(a: np.ndarray) -> list[int]:
    return (a.view({2: np.int16, 4: np.int32}[a.itemsize]) if a.dtype.kind == "f" else a).tolist()


def test_a_kernel_reads_bits_as_its_body_does(interpret):
    got, m = bits_results("fast")
    assert m.RUNS == {"bits_tiles_8_4": [1, 0]}
    assert Path(m.__file__).read_text().count("lax.bitcast_convert_type(") >= 5
    want, body = bits_results("exact")
    assert not hasattr(body, "RUNS")
    b, w, h = BITS_INPUTS.values()
    nib = np.array([1.0 + (v % 16) / 128 for v in b.tolist()], np.float32)
    rules = [nib.view(np.int32), w, w, h.view(np.int16), b.view(np.int8)]
    for k, (g, wv, r) in enumerate(zip(got, want, rules)):
        assert signed_bits(g) == signed_bits(wv) == r.tolist(), k


@pytest.mark.gpu
def test_a_kernel_reads_bits_as_its_body_does_on_the_gpu(on_gpu):
    got, m = bits_results("fast")
    assert m.RUNS == {"bits_tiles_8_4": [1, 0]}
    want, _ = bits_results("exact")
    assert [signed_bits(g) for g in got] == [signed_bits(w) for w in want]


# ---------------------------------------------------------------- the std kernels, checked
def std_bindings() -> list[tuple[str, str]]:
    """Every public std op bound to a kernel, ``(module, op)``: parsed from the std files,
    so a new binding is checked here without being listed."""
    import linnet.lang.syntax.tree as A
    from linnet.lang.diagnostics.core import SourceFile
    from linnet.lang.syntax.parser import parse
    from linnet.lang.syntax.program import STD_ROOT, std_modules

    out = []
    for module in sorted(std_modules()):
        path = STD_ROOT.joinpath(*module.split(".")[1:]).with_suffix(".linnet")
        for item in parse(SourceFile(str(path), path.read_text()), module).items:
            if (
                isinstance(item, A.FuncDecl)
                and item.kind == "op"
                and item.kernel is not None
                and item.public
            ):
                out.append((module, item.name))
    return out


def drawn_bindings() -> list[tuple[str, str]]:
    """The std bindings the (rows, cols) tests here draw shapes for: all but std.nn.decode's
    span ops (issue 15), whose shapes that draw does not fit (decode attention's i32
    positions and at most 16 query heads a KV head, a several-result op) and which take
    minutes in Pallas's interpreter at widths up to 1024. `linnet kernels --runtime jax`
    checks them (test_linnet_kernels_checks_the_std_kernels_through_pallas), at shapes their
    where clauses allow. Nor std.nn.quant's and std.nn.quant_mm's (issue 42): their weights
    are int8 or packed u8 and their group dims must divide I, which an all-f32 draw of
    (rows, cols) does not give; `linnet kernels` checks them too, with 8-bit weights over their
    whole range. Nor std.nn.moe_kernels' (issue 45): their expert indices are i32 and their
    kernels apply from 8 experts; `linnet kernels` checks them with indices in range. Nor
    std.nn.decode_window's (issue 45): as std.nn.decode's attention, they take i32 positions.
    Nor std.nn.paged's (issue 44): an i32 page table and positions, pages of 16 or more."""
    skipped = (
        "std.nn.decode",
        "std.nn.decode_window",
        "std.nn.quant",
        "std.nn.quant_mm",
        "std.nn.moe_kernels",
        "std.nn.paged",
    )
    return [b for b in std_bindings() if b[0] not in skipped]


def op_model(module: str, op: str, rows: int, cols: int):
    """A one-entry model calling ``op`` on f32 tensors whose first Dim is ``rows`` and other
    Dims ``cols``, and its input shapes."""
    from linnet.lang import Program

    decl = Program.from_text(f"use {module}::{{{op}}}").module(module).find(op)
    dims = [g.name for g in decl.generics if g.kind == "Dim"]
    value = {d: rows if i == 0 else cols for i, d in enumerate(dims)}

    def shape(ty):
        return [value[d.name] for d in ty.dims]

    ins = {p.name: shape(p.type) for p in decl.params if hasattr(p.type, "dims")}
    # A scalar parameter (rms_norm's eps) gets a constant, as a model's call gives it.
    args = [
        p.name if p.name in ins else ("1e-5" if p.type.name.startswith(("f", "bf")) else "1")
        for p in decl.params
    ]
    params = ", ".join(f"{n}: Tensor[{', '.join(map(str, s))}; f32]" for n, s in ins.items())
    out = ", ".join(map(str, shape(decl.results[0].type)))
    text = (
        f"use {module}::{{{op}}}\nmodel Case {{\n    entry run({params}) -> "
        f"Tensor[{out}; f32] {{ return {op}({', '.join(args)}) }}\n}}\n"
    )
    return text, ins


def test_the_std_bindings_are_found():
    assert ("std.nn.activation", "softmax") in std_bindings()


@pytest.mark.parametrize("module,op", drawn_bindings())
def test_std_kernels_equal_their_bodies_interpreted(module, op, interpret, tmp_path):
    """Random shapes (the first Dim 1..6, the others 1..1024; those where the kernel's where
    clause fails are not drawn), NaN-poisoned results: every element the body has, the kernel
    writes, and equal to it within f32 rounding."""
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st
    from jax.experimental import pallas as pl
    from linnet.lang import Program, lower
    from linnet.lang.check.tile_lowering import find_kernel, lower_kernel
    from linnet.lang.emit.triton import instance_name, kernel_args

    @settings(
        max_examples=8,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(rows=st.integers(1, 6), cols=st.integers(1, 1024))
    def check(rows, cols):
        text, ins = op_model(module, op, rows, cols)
        path = tmp_path / f"case_{rows}_{cols}.linnet"
        path.write_text(text)
        prog = Program.from_file(path)
        call = next(c for c in lower(prog, "run", ins).calls if c.attributes.get("kernel"))
        assume(call.attributes["kernel_applies"])
        name = call.attributes["kernel"]
        scalars = kernel_args(call.attributes["args"], find_kernel(prog, name))
        k = lower_kernel(prog, name, call.attributes["kernel_generics"], scalars)
        fast = load_source(path, "run", ins, numerics="fast")
        body = load_source(path, "run", ins, numerics="exact")
        xs = [poisoned(s, seed=rows * 7919 + cols) for s in ins.values()]
        kernel = getattr(fast, instance_name(k))
        outs = [jax.ShapeDtypeStruct(shape, jnp.float32) for _, shape, _ in k.results]
        nan = [jnp.full(o.shape, jnp.nan, o.dtype) for o in outs]
        n = len(xs)

        def poisoned_kernel(*refs):  # the aliased NaN buffers are read by no one
            kernel(*refs[:n], *refs[n + len(outs) :])

        got = pl.pallas_call(
            poisoned_kernel,
            out_shape=outs,
            grid=k.grid,
            interpret=True,
            input_output_aliases={n + i: i for i in range(len(outs))},
        )(*xs, *nan)
        want = body.run(*xs, {}, {})[0]

        # f32 rounding: sums in another order differ by a few ulps of the largest term.
        def close(a, b):
            scale = float(np.max(np.abs(np.asarray(b)), initial=1.0))
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6 * scale)

        for g, w in zip(got, want):
            assert not np.isnan(np.asarray(g)).any()  # every element written
            close(g, w)
        (y,), _ = jax.jit(fast.run)(*xs, {}, {})  # and through the generated call
        assert list(fast.RUNS.values()) == [[1, 0]]
        close(y, want[0])

    check()


# ---------------------------------------------------------------- linnet kernels --runtime jax
# The std kernels the Pallas check must reach, in every run (a binding lost, or a kernel
# Pallas can no longer run, fails here).
PALLAS_NAMED = (
    "activation::row_softmax",
    "linear::tiled_matmul",
    "norm::rms_norm_rows",
    "activation::silu_mul_tiles",
    "decode::gemv_rows",
    "decode::rms_norm_gemv",
    "decode::gemv_row",
    "decode::rms_norm_qkv_gemv",
    "decode::rms_norm_gate_up_gemv",
    "decode::gate_up_gemv",
    "decode::gemv_residual",
    "decode::decode_attention_tiles",
    "decode::gemv_dot",
    "decode::gemv_split_part then gemv_split_sum",
    "decode::gemv_split_part then gemv_split_residual_sum",
    "decode::rms_norm_qkv_split_part then rms_norm_qkv_split_sum",
    "decode::decode_attention_split_tiles then decode_attention_combine_tiles",
    "quant::q8_gemv_rows",
    "quant::q4_gemv_rows",
    "quant::q8_split_part then q8_split_sum",
    "quant::q4_split_part then q4_split_sum",
    "moe_kernels::moe_gate_up_rows then moe_down_rows",
    "moe_kernels::moe_gate_up_tiles then moe_down_tiles then moe_combine_tiles",
)
# Under CI=1, how many of the other bound std ops (their kernels named nowhere here) the
# check draws: about a quarter of them (every one without CI=1).
PALLAS_OTHERS = 5


def pallas_ops() -> list[str]:
    """The `--op` names of the Pallas check. None without CI=1: every std op bound to a
    kernel (48 cases, about 65 s in Pallas's interpreter). Under it (the torch tests'
    `support.ci_sample`: a seeded draw that rotates daily, LINNET_CI_SEED pins it) one op of
    each kernel of PALLAS_NAMED, drawn among the ops that bind it (gemv_dot: three), and
    PALLAS_OTHERS of the other ops; each op's case is the one the full run draws for it."""
    if not CI:
        return []
    from linnet.lang.check.kernel_cases import bound_ops, std_program

    by_kernel: dict[str, list[str]] = {}
    for op in bound_ops(std_program()):
        names, binding = [], op.kernel
        while binding is not None:
            names.append(binding.name)
            binding = binding.then
        # As the check names the kernel: `std.nn.decode::gemv_split_part then gemv_split_sum`.
        kernel = f"{op.qualified_name.rpartition('::')[0]}::{' then '.join(names)}"
        by_kernel.setdefault(kernel, []).append(op.qualified_name)
    named = [f"std.nn.{k}" for k in PALLAS_NAMED]
    assert all(k in by_kernel for k in named), sorted(set(named) - set(by_kernel))
    others = [op for k, ops in by_kernel.items() if k not in named for op in ops]
    assert len(others) > 10, others  # the draw below has ops to draw from
    return [op for k in named for op in ci_sample(by_kernel[k], 1, f"pallas {k}")] + ci_sample(
        others, PALLAS_OTHERS, "pallas"
    )


def test_linnet_kernels_checks_the_std_kernels_through_pallas(capsys):
    from linnet.lang.cli import main

    ops = [a for op in pallas_ops() for a in ("--op", op)]
    argv = ["kernels", "--std", "--runtime", "jax", "--count", "1", "--device", "cpu", *ops]
    seed = f"(CI={CI}, LINNET_CI_SEED={CI_SEED})"
    assert main(argv) == 0, seed
    out = capsys.readouterr().out
    for kernel in PALLAS_NAMED:
        assert f"ok    std.nn.{kernel}  " in out, seed
    assert "case(s) checked through Pallas: every kernel agrees with its op" in out, seed


BROKEN = """
pub kernel k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid((N + B - 1) / B) {
    let cols = program_id(0) * B + iota<i32>(B)
    store(y[cols], load(x[cols], cols < N) * FACTOR, cols < LIMIT)
}

pub op twice<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel k<N, 4> where N >= 2 {
    let y[n] = x[n] * 2.0
    return y
}
"""


@pytest.mark.parametrize(
    "factor,limit,problem",
    [("2.0", "N", None), ("3.0", "N", "differs"), ("2.0", "N - 1", "are NaN where the body's")],
)
def test_a_wrong_kernel_is_a_finding(tmp_path, factor, limit, problem):
    """The Pallas check finds a kernel that computes something else, and one that leaves an
    element unwritten (its NaN poison shows), and passes the right one."""
    from linnet.jax.testing import check_kernels

    path = tmp_path / "k.linnet"
    path.write_text(BROKEN.replace("FACTOR", factor).replace("LIMIT", limit))
    findings = check_kernels(path, count=2, seed=0, interpret=True)
    if problem is None:
        assert findings == []
    else:
        assert findings and all(problem in f.problem for f in findings), findings
        assert str(findings[0]).startswith("kernel k::k (op k::twice, Pallas) on x: [")


def test_a_store_past_the_end_is_a_finding_before_any_launch(tmp_path):
    """Issue 38, item 11: the store's mask lets lane N through. Pallas's interpreter would
    drop the store silently (a compiled launch writes past `y`): the kernel's indices, run
    for the case's shapes, make it a finding, and the case is not launched."""
    from linnet.jax.testing import check_kernels

    path = tmp_path / "k.linnet"
    path.write_text(BROKEN.replace("FACTOR", "2.0").replace("LIMIT", "N + 1"))
    findings = check_kernels(path, count=2, seed=0, interpret=True)
    assert len(findings) == 2
    for f in findings:
        n = f.generics["N"]
        assert f"`store` writes y[{n}], outside `y`" in f.problem and "[E0548]" in f.problem
        assert "not launched" in f.problem


def test_an_op_whose_kernel_keeps_scratch_buffers_is_skipped_and_said():
    """Pallas cannot keep a kernel's scratch buffers between launches, so generated JAX runs
    such an op's body; the Pallas check says so rather than failing on a launch that never
    happens, and checks the other ops."""
    from linnet.jax.testing import check_kernels
    from linnet.lang.check.kernel_cases import std_program

    skipped, checked = [], []
    findings = check_kernels(
        std_program(),
        count=1,
        seed=0,
        interpret=True,
        ops=["decode_attention_split_once", "decode_attention_split_short"],
        on_check=checked.append,
        on_skip=lambda op, why: skipped.append((op, why)),
    )
    assert findings == []
    assert [op for op, _ in skipped] == ["std.nn.decode::decode_attention_split_once"]
    assert "scratch buffers" in skipped[0][1]
    assert checked and all("decode_attention_split_tiles" in c.case.kernel for c in checked)
