"""Tile kernels as @triton.jit text (linnet.lang.emit.triton) and their launches in generated
PyTorch: what is written where, and when the body is written alone. (Running them is
linnet-runtime-torch's tests/test_kernels_launch.py, under Triton's interpreter.)"""

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, check_text, lower
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.tile_lowering import lower_kernel
from linnet.lang.emit.torch import emit_torch
from linnet.lang.emit.triton import EXPECTED_MISSING, TILE_RULES, kernel_text
from linnet.lang.ir.tiles import TILE_PRIMITIVES

SOFTMAX_MODEL = """
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] { return softmax(x) }
}
"""

MM = """
kernel mm<M: Dim, N: Dim, K: Dim, BM: Dim, BN: Dim, BK: Dim>(
    a: Tensor[M, K; f32], b: Tensor[K, N; f32],
) -> c: Tensor[M, N; f32] grid((M + BM - 1) / BM, (N + BN - 1) / BN) {
    let rows = program_id(0) * BM + iota<i32>(BM)
    let cols = program_id(1) * BN + iota<i32>(BN)
    let acc = fill<f32>(0.0, BM, BN)
    for kb in 0..(K + BK - 1) / BK {
        let ks = kb * BK + iota<i32>(BK)
        let ma[i, k] = rows[i] < M && ks[k] < K
        let mb[k, j] = ks[k] < K && cols[j] < N
        let x = load(a[rows, ks], ma, 0.0)
        let y = load(b[ks, cols], mb, 0.0)
        let p[i, j] = sum[k] x[i, k] * y[k, j]
        acc = acc + p
    }
    let mc[i, j] = rows[i] < M && cols[j] < N
    store(c[rows, cols], acc, mc)
}
"""


def sources(prog: Program) -> dict[str, list[str]]:
    return {m.source.name: m.source.text.splitlines() for m in prog.modules.values()}


def module_text(shape: list[int], numerics: str = "fast", program: bool = True) -> str:
    prog = Program.from_text(SOFTMAX_MODEL)
    g = lower(prog, "run", {"x": shape})
    src = {m.source.name: m.source.text for m in prog.modules.values()}
    return emit_torch(with_kernels(g, prog if program else None), src, numerics=numerics)


def test_every_tile_primitive_has_a_triton_rule():
    assert sorted(set(TILE_PRIMITIVES) - set(TILE_RULES)) == sorted(EXPECTED_MISSING)


def test_row_softmax_kernel_text():
    prog = Program.from_text(SOFTMAX_MODEL)
    k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 4, "C": 8, "B": 16})
    text = kernel_text(k, sources(prog), "ieee", set())
    assert text.function == "row_softmax_4_8_16" and text.launcher == "launch_row_softmax_4_8_16"
    src = text.source
    ast.parse(src)
    assert "@triton.jit\ndef row_softmax_4_8_16(x, y, X_STRIDE_0: tl.constexpr," in src
    # names from the source, the source lines as comments, masked loads with `other`
    assert "# std/nn/activation.linnet:21  let v = load(x[row, cols], mask, -1e30)" in src
    assert "v = tl.load(x + row * X_STRIDE_0 + cols * X_STRIDE_1, mask=mask, other=-1e+30)" in src
    assert "tl.store(y + row * Y_STRIDE_0 + cols * Y_STRIDE_1, div, mask=mask)" in src
    # the launcher: inputs read where they are when their rows are contiguous (their own
    # strides), results allocated contiguous (strides as constants)
    assert "    x = rows_in_place(x, (4, 8))" in src
    assert "y = torch.empty((4, 8), dtype=torch.float32, device=x.device)" in src
    assert "    x_st = strides_as(x, (4, 8), (8, 1))" in src
    assert "X_STRIDE_0=x_st[0], X_STRIDE_1=x_st[1]" in src
    assert "Y_STRIDE_0=8, Y_STRIDE_1=1" in src


def test_every_kernel_waits_before_touching_memory_under_pdl():
    """Programmatic dependent launch: the kernel's first lines, before any load or store,
    wait for the kernel before it; the next may be scheduled at once (mode 1) or before the
    first store outside a loop (mode 2), behind a constexpr the launcher sets from
    `pdl_launch` (with `launch_pdl` only where it is not 0)."""
    prog = Program.from_text(SOFTMAX_MODEL)
    k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 4, "C": 8, "B": 16})
    src = kernel_text(k, sources(prog), "ieee", set()).source
    fn = next(
        n
        for n in ast.parse(src).body
        if isinstance(n, ast.FunctionDef) and n.name == "row_softmax_4_8_16"
    )
    assert [a.arg for a in fn.args.args[-2:]] == ["USE_PDL", "PREFETCH"]
    body = [ast.unparse(s) for s in fn.body]
    # the prefetch (PDL modes 4 and 5) only asks L2 for lines, before the wait
    assert body[0].startswith("if PREFETCH:") and "prefetch_l2(x + " in body[0]
    assert "tl.store" not in body[0] and "tl.load" not in body[0]
    assert body[1] == "if USE_PDL:\n    tl.extra.cuda.gdc_wait()"
    assert body[2] == "if USE_PDL == 1:\n    tl.extra.cuda.gdc_launch_dependents()"
    late = body.index("if USE_PDL == 2:\n    tl.extra.cuda.gdc_launch_dependents()")
    loads = [i for i, b in enumerate(body) if "tl.load" in b]
    stores = [i for i, b in enumerate(body) if b.startswith("tl.store")]
    assert loads and min(loads) > 2 and stores and late == min(stores) - 1
    assert "    pdl = pdl_launch(x.device, 4)\n" in src  # grid (4,): 4 programs
    assert (
        "X_STRIDE_0=x_st[0], X_STRIDE_1=x_st[1], Y_STRIDE_0=8, Y_STRIDE_1=1, "
        "USE_PDL=pdl, PREFETCH=prefetching(pdl), **PDL_LAUNCH[pdl])" in src
    )


def test_a_kernel_that_stores_only_in_loops_lets_the_next_go_at_its_exit():
    from linnet.lang.emit.triton import PDL_LATE, PDL_PROLOGUE, with_pdl

    lines = ["for i in range(4):", "    tl.store(y + i, 0)"]
    assert with_pdl(lines) == PDL_PROLOGUE + lines
    lines = ["a = tl.load(x)", "# f.linnet:3  store(y[i], a)", "tl.store(y, a)"]
    assert with_pdl(lines) == PDL_PROLOGUE + lines[:1] + PDL_LATE + lines[1:]


class _Device:
    def __init__(self, kind: str, index: int | None = 0):
        self.type, self.index = kind, index


def _header(tmp_path, text: str) -> dict:
    """The namespace of ``text`` run from a file (Triton's jit reads its functions' source)."""
    import runpy

    path = tmp_path / "header.py"
    path.write_text("import torch\n" + text)
    return runpy.run_path(str(path))


@pytest.mark.parametrize(
    "env, major, programs, compiling, expected",
    [
        ({}, 9, 64, False, 2),  # Hopper: on, late by default
        ({}, 10, 64, False, 2),  # and later
        ({"LINNET_PDL": "1"}, 9, 64, False, 1),  # early
        ({"LINNET_PDL": "3"}, 9, 132, False, 1),  # by the grid: one program an SM, early
        ({"LINNET_PDL": "3"}, 9, 133, False, 2),  # more, late
        ({}, 8, 64, False, 0),  # Ampere has no PDL
        ({}, 9, 64, True, 0),  # torch.compile traces the launch
        ({"LINNET_PDL": "0"}, 9, 64, False, 0),  # turned off
        ({"LINNET_PDL": "4"}, 9, 64, False, 2),  # late, prefetching
        ({"LINNET_PDL": "5"}, 9, 64, False, 1),  # early, prefetching
        ({"LINNET_PDL": "5"}, 8, 64, False, 0),  # (no PDL: no prefetch)
    ],
)
def test_when_a_launch_uses_pdl(monkeypatch, tmp_path, env, major, programs, compiling, expected):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from types import SimpleNamespace

    from linnet.lang.emit.triton import HEADER, READY

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("LINNET_PDL", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    namespace = _header(tmp_path, HEADER + READY)
    import triton.language as tl

    if not hasattr(tl.extra.cuda, "gdc_wait"):
        assert namespace["PDL"] == 0  # a Triton without it never launches with PDL
        return
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: SimpleNamespace(major=major, multi_processor_count=132),
    )
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    launch = namespace["pdl_launch"]
    assert launch(_Device("cuda"), programs) == expected
    assert launch(_Device("cpu"), programs) == 0
    assert namespace["PDL_LAUNCH"][launch(_Device("cuda", 1), programs)] == (
        {"launch_pdl": True} if expected else {}
    )
    # modes 4 and 5 (late and early, prefetching) launch as 2 and 1 and prefetch
    assert namespace["prefetching"](launch(_Device("cuda"), programs)) == (
        1 if expected and env.get("LINNET_PDL") in ("4", "5") else 0
    )


def test_an_unknown_pdl_mode_is_said_and_the_default_used(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from linnet.lang.emit.triton import HEADER

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("LINNET_PDL", "yes")
    with pytest.warns(UserWarning, match="LINNET_PDL='yes' is not 0 to 5; using 2"):
        _header(tmp_path, HEADER)


def test_the_call_launches_or_runs_the_body():
    text = module_text([3, 5])
    compile(text, "generated", "exec")
    assert "@triton.jit" in text and "RUNS = {'row_softmax_3_5_1024': [0, 0]}" in text
    # The launch goes through launch_with_grad: under autograd it is a custom op whose
    # autograd is the op's backward (emit/kernel_grad.py); otherwise the launcher call.
    assert (
        "    if kernels_ready('row_softmax_3_5_1024', x):\n"
        "        y = launch_with_grad(launch_row_softmax_3_5_1024, grad_op_1_softmax, x)\n"
        "    else:\n" in text
    )
    assert "        y = torch.softmax(x, dim=-1)" in text  # the body (its fast call)


@pytest.mark.parametrize("case", ["exact", "where false", "no program"])
def test_no_launch_is_written_where_the_kernel_cannot_run(case):
    shape = [2, 2048] if case == "where false" else [3, 5]
    text = module_text(shape, "exact" if case == "exact" else "fast", case != "no program")
    assert "triton" not in text and "kernels_ready" not in text
    assert "y = torch.softmax(x, dim=-1)" in text
    # without kernels the module is what it was before kernels existed
    assert text.replace("Numerics: fast", "Numerics: exact") == module_text(shape, "exact", False)


@settings(max_examples=20, deadline=None)
@given(
    bm=st.sampled_from([4, 8, 16, 32]),
    bn=st.sampled_from([8, 16, 64]),
    bk=st.sampled_from([2, 16, 32]),
)
def test_tl_dot_only_for_tiles_of_16_a_side(bm, bn, bk):
    prog = check_text(MM, "mm")
    k = lower_kernel(prog, "mm::mm", dict(M=40, N=24, K=50, BM=bm, BN=bn, BK=bk))
    src = kernel_text(k, sources(prog), "ieee", set()).source
    ast.parse(src)
    dot = min(bm, bn, bk) >= 16
    assert ("p = tl.dot(x, y, input_precision='ieee', out_dtype=tl.float32)" in src) == dot
    assert ("p = tl.sum(" in src) == (not dot)
    assert f"for kb in range(0, {(50 + bk - 1) // bk}):" in src
    # the carried accumulator: the loop's variable from its first value, updated in place
    assert "acc = tl.full((" in src and "        acc = acc + p\n" in src


@pytest.mark.parametrize("bt", ["bf16", "f16", "f32"])
def test_a_dot_of_widened_16_bit_tiles_runs_at_their_width(bt):
    """`load(...) as f32` of two 16-bit tiles: the dot takes the 16-bit tiles (dot16, f32
    accumulator), unless one side is f32 data or the two widths differ."""
    text = MM.replace(
        "a: Tensor[M, K; f32], b: Tensor[K, N; f32]",
        f"a: Tensor[M, K; bf16], b: Tensor[K, N; {bt}]",
    )
    text = text.replace("load(a[rows, ks], ma, 0.0)", "load(a[rows, ks], ma, 0) as f32")
    text = text.replace("load(b[ks, cols], mb, 0.0)", "load(b[ks, cols], mb, 0) as f32")
    prog = check_text(text, "mm")
    k = lower_kernel(prog, "mm::mm", dict(M=32, N=32, K=32, BM=16, BN=16, BK=16))
    src = kernel_text(k, sources(prog), "ieee", set()).source
    assert ("p = dot16(load, load_2)" in src) == (bt == "bf16")
    assert ("p = tl.dot(x, y, input_precision='ieee'" in src) == (bt != "bf16")


NIBBLES = """
kernel nibbles_k<N: Dim>(q: Tensor[N; u8], h: Tensor[N; f16]) -> (y: Tensor[N; f32],
    s: Tensor[N; i16]) grid(1) {
    let k = iota<i32>(N)
    store(y[k], bitcast<f32>((load(q[k]) as i32 % 16) * 65536 + 1065353216))
    store(s[k], bitcast<i16>(load(h[k])))
}
"""


def test_a_bitcast_is_a_bitcast_conversion():
    """`bitcast<f32>(...)` of an i32 tile is `.to(tl.float32, bitcast=True)` (no conversion
    instruction: the int4 dequantisation's nibble-in-the-mantissa), of a 16-bit one likewise."""
    prog = check_text(NIBBLES, "nib")
    k = lower_kernel(prog, "nib::nibbles_k", {"N": 8})
    assert [s.op for s in k.steps].count("bitcast") == 2
    src = kernel_text(k, sources(prog), "ieee", set()).source
    ast.parse(src)
    assert ".to(tl.float32, bitcast=True)" in src
    assert "load_2.to(tl.int16, bitcast=True)" in src


def test_fast_numerics_may_use_tf32():
    prog = check_text(MM, "mm")
    k = lower_kernel(prog, "mm::mm", dict(M=32, N=32, K=32, BM=16, BN=16, BK=16))
    assert "input_precision='tf32'" in kernel_text(k, sources(prog), "tf32", set()).source


def test_a_primitive_without_a_triton_form_is_E0532():
    prog = check_text(
        """
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(N)
    store(y[cols], pow(load(x[cols]), 3.0))
}""",
        "p",
    )
    k = lower_kernel(prog, "p::k", {"N": 4})
    with pytest.raises(LinnetError) as info:
        kernel_text(k, sources(prog), "ieee", set())
    assert info.value.diagnostics[0].code == "E0532"
    assert "p.linnet:4" in info.value.diagnostics[0].message


def test_the_launchers_dtypes_are_the_emitters():
    from linnet.lang.emit import torch as torch_emit
    from linnet.lang.emit import triton as triton_emit

    assert triton_emit.TORCH_DTYPES == torch_emit.TORCH_DTYPES


def test_source_names_that_python_reserves_are_prefixed():
    prog = check_text(
        """
kernel k<N: Dim>(float: Tensor[N; f32]) -> len: Tensor[N; f32] grid(1) {
    let range = iota<i32>(N)
    let tl = load(float[range])
    store(len[range], tl * 2.0)
}""",
        "names",
    )
    k = lower_kernel(prog, "names::k", {"N": 8})
    src = kernel_text(k, sources(prog), "ieee", set()).source
    compile(src, "kernel", "exec")
    assert "def k_8(v_float, v_len, V_FLOAT_STRIDE_0: tl.constexpr" in src
    assert "v_range = tl.arange(0, 8)" in src and "v_tl = tl.load(v_float + v_range" in src


def test_one_kernel_instance_per_set_of_generics():
    prog = Program.from_text("""
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32], z: Tensor[C, R; f32]) -> Tensor[R, C; f32] {
        let a = softmax(x)
        let b = softmax(x * 2.0)
        let c = softmax(z)
        return a + b
    }
}""")
    g = lower(prog, "run", {"x": [3, 5], "z": [5, 3]})
    src = {m.source.name: m.source.text for m in prog.modules.values()}
    text = emit_torch(with_kernels(g, prog), src, numerics="fast")
    compile(text, "generated", "exec")
    # two calls launch one instance; z's softmax is dead, and so is its kernel: not written
    assert text.count("@triton.jit\ndef row_softmax") == 1
    assert "RUNS = {'row_softmax_3_5_1024': [0, 0]}" in text
    assert text.count("kernels_ready('row_softmax_3_5_1024', ") == 2


GATHER = """
kernel gather<N: Dim, B: Dim>(x: Tensor[N; f32], at: Tensor[B; i32], w: Tensor[N; f32])
    -> y: Tensor[B; f32] grid(1) {
    let lanes = iota<i32>(B)
    let picked = load(at[lanes])
    let acc = fill(0.0, B)
    for i in 2..4 {
        acc = acc + load(w[(lanes + i * B) % N]) + load(x[picked], picked < N, 0.0)
    }
    store(y[lanes], acc)
}
"""


def test_the_prefetch_loads_the_first_iteration_by_the_tensors_bounds():
    """Under PREFETCH (PDL modes 4, 5) a kernel prefetches into L2, before its wait, what its
    indices allow: `at` (top level) and `w` at the loop's start (i = 2), under fresh names and masked
    by the tensors' bounds; not `x`, whose index is a loaded value. The body's own names and
    lines are as they were without it."""
    from linnet.lang.emit.triton import prefetch_loads

    prog = check_text(GATHER, "g")
    k = lower_kernel(prog, "g::gather", {"N": 16, "B": 4})
    assert [s.operands[0] for s, _ in prefetch_loads(k)] == ["@at", "@w"]
    src = kernel_text(k, sources(prog), "ieee", set()).source
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef))
    assert [a.arg for a in fn.args.args[-2:]] == ["USE_PDL", "PREFETCH"]
    block = ast.unparse(fn.body[0])
    assert block.startswith("if PREFETCH:") and block.count("prefetch_l2(") == 2
    assert "prefetch_l2(at + pre_lanes * AT_STRIDE_0, (pre_lanes >= 0) & (pre_lanes < 4))" in block
    assert "pre_mul = 2 * 4" in block  # the loop's index at its start (i = 2)
    assert "x +" not in block and "tl.load" not in block
    rest = "\n".join(ast.unparse(s) for s in fn.body[1:])
    assert "pre_" not in rest and "lanes = tl.arange(0, 4)" in rest
    assert "PREFETCH=prefetching(pdl), " in src


def test_a_kernel_with_nothing_to_prefetch_has_no_prefetch_argument():
    prog = check_text(
        """
kernel fill_y<N: Dim>() -> y: Tensor[N; f32] grid(1) {
    let cols = iota<i32>(N)
    store(y[cols], fill(1.0, N))
}""",
        "f",
    )
    src = kernel_text(
        lower_kernel(prog, "f::fill_y", {"N": 8}), sources(prog), "ieee", set()
    ).source
    assert "PREFETCH" not in src and "USE_PDL=pdl, **PDL_LAUNCH[pdl])" in src


def _defined(text: str) -> set[str]:
    """The module-level names ``text`` defines (functions, assignments, imports), also
    inside its top-level ``if``/``try`` blocks."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse)

    visit(ast.parse(text).body)
    return names


def test_every_name_a_kernel_module_defines_is_reserved():
    """A model's value or function named like a helper of the module's header (`scratch`,
    `direct`, `prefetch_l2`) would shadow it: emit/torch.py's RESERVED holds them all."""
    from linnet.lang.emit.torch import RESERVED
    from linnet.lang.emit.triton import HEADER, READY

    assert _defined(HEADER + "\n" + READY) - RESERVED == set()


def test_an_eager_launch_bypasses_wrap_triton():
    """Each launcher's eager branch runs under `direct()` (wrap_triton then gives the kernel
    itself: no higher-order op a launch), its compiled branch calls the custom op."""
    text = module_text([4, 16])
    assert (
        "    if torch.compiler.is_compiling():\n"
        "        return op_row_softmax_4_16_1024(x)\n"
        "    with direct():  # the kernel itself, not wrap_triton's higher-order op\n"
        "        return run_row_softmax_4_16_1024(x)\n"
    ) in text
