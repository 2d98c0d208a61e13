"""Kernels with scratch buffers and `atomic_add`: what the checker takes and refuses, the
tile graph they lower to, the Triton text (a launcher-kept, zeroed buffer; the count as one
acquire-release atomic between barriers), and the JAX emitter running the op's body where
Pallas cannot keep a buffer. Launches are in linnet-runtime-torch's kernels_interpreted.py
(interpreted) and test_kernels_launch.py (CUDA)."""

import pytest
from linnet.lang import LinnetError, Program, check_program, lower
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.tile_lowering import lower_kernel
from linnet.lang.emit.jax import emit_jax
from linnet.lang.emit.torch import emit_torch
from linnet.lang.emit.triton import kernel_text

# Each program adds its block's sum into `parts`; the last one to count stores the total.
TOTAL = """
kernel block_total<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[1; f32]
    grid((N + B - 1) / B) scratch(parts: Tensor[(N + B - 1) / B; f32], seen: Tensor[1; i32]) {
    let p = program_id(0)
    let cols = p * B + iota<i32>(B)
    let v = load(x[cols], cols < N)
    store(parts[p], sum[c] v[c])
    let last = atomic_add(seen[0], 1) == (N + B - 1) / B - 1
    let blocks = iota<i32>(B)
    let got = load(parts[blocks], blocks < (N + B - 1) / B && last, 0)
    store(y[0], sum[c] got[c], last)
    store(seen[0], 0, last)
}

op total<N: Dim>(x: Tensor[N; f32]) -> Tensor[1; f32] kernel block_total<N, 8>
where N <= 64 {
    let s = sum[i] x[i]
    let y[j: 1] = s
    return y
}

model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[1; f32] { return total(x) }
}
"""


def diagnostics(src: str) -> list:
    return check_program(Program.from_text(src))


def test_a_kernel_with_scratch_checks_and_lowers():
    assert not diagnostics(TOTAL)
    k = lower_kernel(Program.from_text(TOTAL), "main::block_total", {"N": 20, "B": 8})
    assert k.scratch == [("parts", (3,), "f32"), ("seen", (1,), "i32")]
    assert [p for p, _, _ in k.params] == ["x"] and [r for r, _, _ in k.results] == ["y"]
    ops = [s.op for s in k.walk()]
    assert ops.count("atomic_add") == 1
    count = next(s for s in k.steps if s.op == "atomic_add")
    assert count.operands[0] == "@seen" and k.values[count.results[0]].dtype == "i32"
    assert [s.operands[0] for s in k.walk() if s.op == "store"] == ["@parts", "@y", "@seen"]


def test_two_equal_loads_of_scratch_stay_two_steps():
    src = """
kernel again<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) scratch(s: Tensor[N; f32]) {
    let i = iota<i32>(N)
    let a = load(s[i])
    store(s[i], load(x[i]))
    store(y[i], a + load(s[i]))
}"""
    k = lower_kernel(Program.from_text(src), "main::again", {"N": 4})
    assert [s.operands[0] for s in k.steps if s.op == "load"] == ["@s", "@x", "@s"]


def test_the_triton_text_keeps_the_buffers_and_counts_between_barriers():
    k = lower_kernel(Program.from_text(TOTAL), "main::block_total", {"N": 20, "B": 8})
    text = kernel_text(k, {}, "ieee", set())
    src = text.source
    compile(src, "generated", "exec")
    assert "def block_total_20_8(x, y, parts, seen, X_STRIDE_0: tl.constexpr" in src
    assert "    parts = scratch('block_total_20_8', 'parts', (3,), torch.float32, x.device)" in src
    assert "    seen = scratch('block_total_20_8', 'seen', (1,), torch.int32, x.device)" in src
    lines = [line.strip() for line in src.splitlines()]
    at = next(i for i, line in enumerate(lines) if "tl.atomic_add(" in line)
    assert lines[at - 1].startswith("tl.debug_barrier()")
    assert lines[at + 1].startswith("tl.debug_barrier()")
    assert "sem='acq_rel', scope='gpu')" in lines[at]
    # torch.compile cannot trace a launch whose buffers live outside it: an opaque custom op.
    assert "opaque=True)" in src
    # A scalar bool (the count compared) meets a tile through int8 (Triton's interpreter).
    assert "(tl.zeros((8,), tl.int8) + last.to(tl.int8) != 0)" in src


def test_torch_launches_it_and_jax_runs_the_body():
    prog = Program.from_text(TOTAL)
    graph = lower(prog, "run", {"x": [20]})
    sources = {m.source.name: m.source.text for m in prog.modules.values()}
    torch_text = emit_torch(with_kernels(graph, prog), sources, numerics="fast")
    assert "launch_block_total_20_8(x)" in torch_text
    jax_text = emit_jax(with_kernels(graph, prog), sources, numerics="fast")
    assert "block_total" not in jax_text


@pytest.mark.parametrize(
    "body,code",
    [
        # counting in a result, or in a parameter
        ("let c = atomic_add(y[0], 1)\n    store(y[0], 0.0)", "E0507"),
        ("let c = atomic_add(x[0], 1)\n    store(y[0], 0.0)", "E0507"),
        # in an f32 buffer, at a tile of elements, adding a float
        ("let c = atomic_add(f[0], 1)\n    store(y[0], 0.0)", "E0547"),
        ("let c = atomic_add(n[iota<i32>(2)], 1)\n    store(y[0], 0.0)", "E0547"),
        ("let c = atomic_add(n[0], 1.5)\n    store(y[0], 0.0)", "E0547"),
        # a scratch buffer read outside load/store
        ("let c = n + 1\n    store(y[0], 0.0)", "E0503"),
    ],
)
def test_what_atomic_add_refuses(body, code):
    src = f"""
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[1; f32] grid(1)
    scratch(n: Tensor[2; i32], f: Tensor[2; f32]) {{
    {body}
}}"""
    diags = diagnostics(src)
    assert [d.code for d in diags] == [code], [str(d) for d in diags]


def test_a_scratch_buffer_named_as_a_parameter_is_E0546():
    src = """
kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[1; f32] grid(1) scratch(x: Tensor[2; i32]) {
    store(y[0], 0.0)
}"""
    assert [d.code for d in diagnostics(src)] == ["E0546"]


def test_a_tile_without_indices_inside_index_notation_is_E0304():
    """Until 2026-12-02 the checker took it and the lowering reshaped the tile to one element:
    a launch failed (or, for a tile of one element, read another value than meant)."""
    src = """
kernel k<N: Dim, M: Dim>(x: Tensor[N, M; f32]) -> y: Tensor[M; f32] grid(1) {
    let rs = iota<i32>(N)
    let cs = iota<i32>(M)
    let wt = load(x[rs, cs])
    let s[c] = sum[n] wt[n, c] * load(x[rs, cs])
    store(y[cs], s)
}"""
    diags = diagnostics(src)
    assert [d.code for d in diags] == ["E0304"]
    with pytest.raises(LinnetError, match="E0304"):
        lower_kernel(Program.from_text(src), "main::k", {"N": 2, "M": 4})
