"""Tile kernels as Pallas kernel functions (linnet.lang.emit.pallas) and their launches in
generated JAX: what is written where, and when the body is written alone. The kernels here
also run under Pallas's interpreter and are compared with NumPy (launches from generated
JAX are linnet-runtime-jax's tests/test_jax_pallas.py)."""

import ast
import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, check_text, lower
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.tile_lowering import lower_kernel
from linnet.lang.emit.jax import emit_jax
from linnet.lang.emit.pallas import EXPECTED_MISSING, PALLAS_RULES, kernel_text
from linnet.lang.ir.tiles import TILE_PRIMITIVES
from test_emit_triton import MM, NIBBLES, SOFTMAX_MODEL, sources


def module_text(shape: list[int], numerics: str = "fast", program: bool = True) -> str:
    prog = Program.from_text(SOFTMAX_MODEL)
    g = lower(prog, "run", {"x": shape})
    src = {m.source.name: m.source.text for m in prog.modules.values()}
    return emit_jax(with_kernels(g, prog if program else None), src, numerics=numerics)


def test_every_tile_primitive_has_a_pallas_rule():
    assert sorted(set(TILE_PRIMITIVES) - set(PALLAS_RULES)) == sorted(EXPECTED_MISSING)


def test_row_softmax_kernel_text():
    prog = Program.from_text(SOFTMAX_MODEL)
    k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 4, "C": 8, "B": 16})
    text = kernel_text(k, sources(prog), "lax.Precision.HIGHEST", set())
    assert text.function == "row_softmax_4_8_16" and text.launcher == "launch_row_softmax_4_8_16"
    src = text.source
    ast.parse(src)
    assert "def row_softmax_4_8_16(x, y):" in src
    # names from the source, the source lines as comments, masked loads with `other`
    assert "# std/nn/activation.linnet:21  let v = load(x[row, cols], mask, -1e30)" in src
    assert "row = pl.program_id(0)" in src
    assert "v = plgpu.load(x.at[row, cols], mask=mask, other=-1e+30)" in src
    assert "plgpu.store(y.at[row, cols], div, mask=mask)" in src
    # the launcher: pallas_call on the grid, interpreted under LINNET_PALLAS_INTERPRET=1
    assert "out_shape = jax.ShapeDtypeStruct((4, 8), jnp.float32)" in src
    assert "pl.pallas_call(row_softmax_4_8_16, out_shape=out_shape, grid=(4,)," in src
    assert "interpret=INTERPRET, compiler_params=COMPILER_PARAMS" in src


def test_the_call_launches_or_runs_the_body():
    text = module_text([3, 5])
    compile(text, "generated", "exec")
    assert "RUNS = {'row_softmax_3_5_1024': [0, 0]}" in text
    assert "INTERPRET = os.environ.get('LINNET_PALLAS_INTERPRET') == '1'" in text
    assert "    def softmax_body(x):\n" in text
    assert (
        "    if kernels_ready('row_softmax_3_5_1024'):\n"
        "        y = launch_row_softmax_3_5_1024(softmax_body, None, x)\n    else:\n"
        "        y = softmax_body(x)\n" in text
    )
    assert "        y = jax.nn.softmax(x, axis=-1)" in text  # the body (its fast call)


@pytest.mark.parametrize("case", ["exact", "where false", "no program"])
def test_no_launch_is_written_where_the_kernel_cannot_run(case):
    shape = [2, 2048] if case == "where false" else [3, 5]
    text = module_text(shape, "exact" if case == "exact" else "fast", case != "no program")
    assert "pallas" not in text and "kernels_ready" not in text
    assert "y = jax.nn.softmax(x, axis=-1)" in text
    # without kernels the module is what it was before kernels existed
    assert text.replace("Numerics: fast", "Numerics: exact").replace(
        "PRECISION = None  # fast: the backend's default (TF32 or bf16 passes for f32 on a GPU)",
        "PRECISION = jax.lax.Precision.HIGHEST  # exact: full f32 products on every backend",
    ) == module_text(shape, "exact", False)


@settings(max_examples=20, deadline=None)
@given(
    bm=st.sampled_from([4, 8, 16, 32]),
    bn=st.sampled_from([8, 16, 64]),
    bk=st.sampled_from([2, 16, 32]),
)
def test_jnp_dot_only_for_tiles_of_16_a_side(bm, bn, bk):
    prog = check_text(MM, "mm")
    k = lower_kernel(prog, "mm::mm", dict(M=40, N=24, K=50, BM=bm, BN=bn, BK=bk))
    src = kernel_text(k, sources(prog), "lax.Precision.HIGHEST", set()).source
    ast.parse(src)
    dot = min(bm, bn, bk) >= 16
    assert (
        "p = jnp.dot(x, y, precision=lax.Precision.HIGHEST, "
        "preferred_element_type=jnp.float32)" in src
    ) == dot
    assert ("p = jnp.sum(" in src) == (not dot)
    # the loop: lax.fori_loop over a function of the index and the carried accumulator
    assert "def loop_kb(kb, carry):" in src and "acc, = carry" in src
    assert f"acc, = lax.fori_loop(0, {(50 + bk - 1) // bk}, loop_kb, (acc,))" in src


def test_a_bitcast_is_bitcast_convert_type():
    prog = check_text(NIBBLES, "nib")
    k = lower_kernel(prog, "nib::nibbles_k", {"N": 8})
    src = kernel_text(k, {}, "lax.Precision.HIGHEST", set()).source
    ast.parse(src)
    assert src.count("lax.bitcast_convert_type(") == 2
    assert ", jnp.float32)" in src and ", jnp.int16)" in src


def test_a_primitive_without_a_pallas_form_is_E0560():
    prog = check_text(
        """
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(N)
    store(y[cols], erf(load(x[cols])))
}""",
        "p",
    )
    k = lower_kernel(prog, "p::k", {"N": 4})
    with pytest.raises(LinnetError) as info:
        kernel_text(k, sources(prog), "lax.Precision.HIGHEST", set())
    assert info.value.diagnostics[0].code == "E0560"
    assert "p.linnet:4" in info.value.diagnostics[0].message


def test_source_names_that_python_reserves_are_prefixed():
    prog = check_text(
        """
kernel k<N: Dim>(float: Tensor[N; f32]) -> jnp: Tensor[N; f32] grid(1) {
    let range = iota<i32>(N)
    let pl = load(float[range])
    store(jnp[range], pl * 2.0)
}""",
        "names",
    )
    k = lower_kernel(prog, "names::k", {"N": 8})
    src = kernel_text(k, sources(prog), "lax.Precision.HIGHEST", set()).source
    compile(src, "kernel", "exec")
    assert "def k_8(v_float, v_jnp):" in src
    assert "v_pl = plgpu.load(v_float.at[v_range])" in src


# ---------------------------------------------------------------- run, interpreted
def kernel_module(tmp_path, k, prog):
    """The kernel's text with the generated module's header, imported from a file."""
    from linnet.lang.emit.pallas import HEADER

    text = kernel_text(k, sources(prog), "lax.Precision.HIGHEST", set())
    body = (
        "import jax\nimport jax.numpy as jnp\nfrom jax import lax\n"
        + HEADER
        + "\nINTERPRET = True\n\n\n"
        + text.source
        + "\n"
    )
    path = tmp_path / f"{text.function}.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(text.function, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, text


@pytest.mark.parametrize("bm,bn,bk", [(8, 8, 4), (16, 16, 16)])
def test_a_tiled_matmul_runs_interpreted_and_equals_numpy(tmp_path, bm, bn, bk):
    pytest.importorskip("jax")
    prog = check_text(MM, "mm")
    m, n, kk = 20, 12, 18  # partial tiles on every side: the masks matter
    k = lower_kernel(prog, "mm::mm", dict(M=m, N=n, K=kk, BM=bm, BN=bn, BK=bk))
    module, text = kernel_module(tmp_path, k, prog)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, kk)).astype(np.float32)
    b = rng.standard_normal((kk, n)).astype(np.float32)
    c = getattr(module, f"run_{text.key}")(a, b)
    np.testing.assert_allclose(np.asarray(c), a @ b, rtol=1e-5, atol=1e-5)
