"""The std library's kernels (issue 14, item 7): each checks, is bound to the std op whose
body defines it, says in its `where` clause when it applies, and binding it changes nothing
where it does not launch (numerics exact, the interpreter, the reference). The kernels'
results against their bodies are checked by `linnet kernels` (linnet-runtime-torch's
test_kernel_checks_run.py); the shapes it draws are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import linnet.lang.syntax.tree as A
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import Program, check_program, check_text, lower
from linnet.lang.check.kernel_cases import (
    bound_ops,
    boundary_sizes,
    candidate_sizes,
    sample_cases,
)
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.emit.torch import emit_torch
from linnet.lang.syntax.program import STD_ROOT

# op -> (kernel, its binding's arguments, what its `where` clause must say)
STD_KERNELS = {
    "std.nn.activation::softmax": ("row_softmax", "<R, C, 1024>", ["B >= C"]),
    "std.nn.linear::linear_tiled": (
        "tiled_matmul",
        "<N, I, O, T, 32, 32, 32>",
        ["BM >= 16", "BN >= 16", "BK >= 16"],
    ),
    "std.nn.norm::rms_norm": ("rms_norm_rows", "<N, D, T, 4096>", ["B >= D"]),
    "std.nn.activation::silu_mul": ("silu_mul_tiles", "<N, F, T, 1024>", ["B >= 16"]),
    "std.nn.decode::linear_gemv": ("gemv_rows", "<N, I, O, T, 16, 8, 512>", ["BR >= N"]),
    "std.nn.decode::linear_gemv_row": ("gemv_row", "<N, I, O, T, 16, 256>", ["N <= 4"]),
    "std.nn.decode::rms_norm_linear": ("rms_norm_gemv", "<N, D, O, T, 16, 8, 512>", ["BR >= N"]),
    "std.nn.decode::rms_norm_qkv": (
        "rms_norm_qkv_gemv",
        "<N, D, Q, K, T, 16, 16, 256>",
        ["BR >= N"],
    ),
    "std.nn.decode::rms_norm_qkv_rope": (
        "rms_norm_qkv_rope_gemv",
        "<N, D, H, KV, HD, T, 16, 4, 512>",
        ["BR >= N", "HD % (2 * BO) == 0"],
    ),
    "std.nn.decode::rms_norm_gate_up": (
        "rms_norm_gate_up_gemv",
        "<N, D, F, T, 16, 16, 256>",
        ["BR >= N"],
    ),
    "std.nn.decode::gate_up_silu": ("gate_up_gemv", "<N, D, F, T, 16, 16, 256>", ["BR >= N"]),
    "std.nn.decode::linear_residual": ("gemv_residual", "<N, I, O, T, 16, 8, 512>", ["BR >= N"]),
    "std.nn.decode::decode_attention_split_once": (
        "decode_attention_split_once_tiles",
        "<B, S, KV, G, HD, T, 16, 32, 128, (S + 63) / 64, 32, 4, 32>",
        ["BG >= G", "BH >= HD", "BN >= NS", "BC >= G"],
    ),
    "std.nn.decode::decode_attention_flash": (
        "decode_attention_tiles",
        "<B, S, KV, G, HD, T, 16, 64, 128, 16>",
        ["BG >= G", "BH >= HD"],
    ),
    "std.nn.decode::residual_rms_norm": ("residual_rms_norm_rows", "<N, D, T, 4096>", ["B >= D"]),
    "std.nn.decode::linear_gemv_dot": (
        "gemv_dot",
        "<N, I, O, T, 16, 16, 256>",
        ["BR >= N", "BR >= 16", "BO >= 16", "BK >= 16"],
    ),
    # Past 16 rows (serving batches): the same kernel, 32 and 64 rows a dot.
    "std.nn.decode::linear_gemv_dot32": (
        "gemv_dot",
        "<N, I, O, T, 32, 16, 256>",
        ["BR >= N", "BR >= 16", "BO >= 16", "BK >= 16"],
    ),
    "std.nn.decode::linear_gemv_dot64": (
        "gemv_dot",
        "<N, I, O, T, 64, 16, 256>",
        ["BR >= N", "BR >= 16", "BO >= 16", "BK >= 16"],
    ),
    # Chains: the first kernel, and the binding's text from its arguments to the second's.
    "std.nn.decode::linear_split": (
        "gemv_split_part",
        "<N, I, O, T, 16, 8, 256, 4> then gemv_split_sum<N, I, O, T, 16, 8, 4>",
        ["BR >= N"],
    ),
    "std.nn.decode::linear_split_wide": (
        "gemv_split_part",
        "<N, I, O, T, 16, 8, 256, 8> then gemv_split_sum<N, I, O, T, 16, 8, 8>",
        ["BR >= N"],
    ),
    "std.nn.decode::linear_residual_split": (
        "gemv_split_part",
        "<N, I, O, T, 16, 8, 256, 4> then gemv_split_residual_sum<N, I, O, T, 16, 8, 4>",
        ["BR >= N"],
    ),
    "std.nn.decode::rms_norm_qkv_split": (
        "rms_norm_qkv_split_part",
        "<N, D, Q, K, T, 16, 8, 256, 4> then rms_norm_qkv_split_sum<N, D, Q, K, T, 16, 32, 256, 4>",
        ["BR >= N"],
    ),
    "std.nn.decode::rms_norm_qkv_rope_split": (
        "rms_norm_qkv_split_part",
        "<N, D, H * HD, KV * HD, T, 16, 16, 256, 4> then "
        "rms_norm_qkv_rope_split_sum<N, D, H, KV, HD, T, 16, 8, 256, 4>",
        ["BR >= N"],
    ),
    "std.nn.decode::rms_norm_qkv_rope_split_wide": (
        "rms_norm_qkv_split_part",
        "<N, D, H * HD, KV * HD, T, 16, 8, 512, 8> then "
        "rms_norm_qkv_rope_split_sum<N, D, H, KV, HD, T, 16, 8, 512, 8>",
        ["BR >= N"],
    ),
    # Quantised products (std.nn.quant, issue 42): the group GS is I / NG; int4 needs it even.
    "std.nn.quant::linear_q8_gemv": (
        "q8_gemv_rows",
        "<N, I, O, NG, I / NG, T, 16, 4, 1024 / (I / NG)>",
        ["BR >= N", "BG >= 1", "1024 % GS == 0", "I == NG * GS"],
    ),
    "std.nn.quant::linear_q4_gemv": (
        "q4_gemv_rows",
        "<N, I, O, NG, I / NG, T, 16, 8, 1024 / (I / NG)>",
        ["BR >= N", "BG >= 1", "GS % 2 == 0", "1024 % GS == 0", "I == NG * GS"],
    ),
    "std.nn.quant::linear_q8_split": (
        "q8_split_part",
        "<N, I, O, NG, I / NG, T, 16, 4, 512 / (I / NG), 4> then "
        "q8_split_sum<N, I, O, NG, T, 16, 64, 4>",
        ["BR >= N", "BG >= 1", "1024 % GS == 0", "I == NG * GS"],
    ),
    "std.nn.quant::linear_q4_split": (
        "q4_split_part",
        "<N, I, O, NG, I / NG, T, 16, 8, 512 / (I / NG), 4> then "
        "q4_split_sum<N, I, O, NG, T, 16, 64, 4>",
        ["BR >= N", "BG >= 1", "GS % 2 == 0", "1024 % GS == 0", "I == NG * GS"],
    ),
    # Their fused prologues and epilogues: the norm before q, k and v (gate and up), the
    # residual after o and down.
    "std.nn.quant::rms_norm_qkv_q8": (
        "rms_norm_q8_qkv_rows",
        "<N, D, Q, K, NG, D / NG, T, 16, 4, 1024 / (D / NG)>",
        ["BR >= N", "BG >= 1", "1024 % GS == 0", "D == NG * GS"],
    ),
    "std.nn.quant::rms_norm_qkv_rope_q8": (
        "rms_norm_q8_qkv_rope_rows",
        "<N, D, H, KV, HD, NG, D / NG, T, 16, 4, 1024 / (D / NG)>",
        ["BR >= N", "BG >= 1", "1024 % GS == 0", "D == NG * GS", "HD % (2 * BO) == 0"],
    ),
    # The same span with every loaded tile used: a KV head's lanes in q, k and v a program.
    "std.nn.quant::rms_norm_qkv_rope_q8_heads": (
        "rms_norm_q8_qkv_rope_heads",
        "<N, D, H, KV, HD, NG, D / NG, T, 16, 2, 512 / (D / NG)>",
        [
            "BR >= N",
            "BG >= 1",
            "1024 % GS == 0",
            "D == NG * GS",
            "HD % (2 * BO) == 0",
            "H % KV == 0",
            "64 % (H / KV) == 0",
        ],
    ),
    "std.nn.quant::rms_norm_gate_up_q8": (
        "rms_norm_q8_gate_up_rows",
        "<N, D, F, NG, D / NG, T, 16, 4, 1024 / (D / NG)>",
        ["BR >= N", "BG >= 1", "1024 % GS == 0", "D == NG * GS"],
    ),
    "std.nn.quant::linear_q8_residual": (
        "q8_residual_rows",
        "<N, I, O, NG, I / NG, T, 16, 4, 1024 / (I / NG)>",
        ["BR >= N", "BG >= 1", "1024 % GS == 0", "I == NG * GS"],
    ),
    "std.nn.quant::rms_norm_qkv_q4": (
        "rms_norm_q4_qkv_rows",
        "<N, D, Q, K, NG, D / NG, T, 16, 8, 1024 / (D / NG)>",
        ["BR >= N", "BG >= 1", "GS % 2 == 0", "1024 % GS == 0", "D == NG * GS"],
    ),
    "std.nn.quant::rms_norm_qkv_rope_q4": (
        "rms_norm_q4_qkv_rope_rows",
        "<N, D, H, KV, HD, NG, D / NG, T, 16, 4, 1024 / (D / NG)>",
        [
            "BR >= N",
            "BG >= 1",
            "GS % 2 == 0",
            "1024 % GS == 0",
            "D == NG * GS",
            "HD % (2 * BO) == 0",
        ],
    ),
    "std.nn.quant::rms_norm_qkv_rope_q4_heads": (
        "rms_norm_q4_qkv_rope_heads",
        "<N, D, H, KV, HD, NG, D / NG, T, 16, 2, 512 / (D / NG)>",
        [
            "BR >= N",
            "BG >= 1",
            "GS % 2 == 0",
            "1024 % GS == 0",
            "D == NG * GS",
            "HD % (2 * BO) == 0",
            "H % KV == 0",
            "64 % (H / KV) == 0",
        ],
    ),
    "std.nn.quant::rms_norm_gate_up_q4": (
        "rms_norm_q4_gate_up_rows",
        "<N, D, F, NG, D / NG, T, 16, 8, 1024 / (D / NG)>",
        ["BR >= N", "BG >= 1", "GS % 2 == 0", "1024 % GS == 0", "D == NG * GS"],
    ),
    "std.nn.quant::linear_q4_residual": (
        "q4_residual_rows",
        "<N, I, O, NG, I / NG, T, 16, 8, 1024 / (I / NG)>",
        ["BR >= N", "BG >= 1", "GS % 2 == 0", "1024 % GS == 0", "I == NG * GS"],
    ),
    # Decode attention over a paged KV cache, one page a step, read in place (std.nn.paged).
    "std.nn.paged::paged_decode_attention_flash": (
        "paged_decode_attention_tiles",
        "<B, NP, PS, MP, KV, G, HD, T, 16, 128, 16>",
        ["BG >= G", "BH >= HD", "PS >= 16", "4096 % PS == 0"],
    ),
    # Chunked prefill over the pages, read in place (std.nn.paged).
    "std.nn.paged::paged_prefill_attention_flash": (
        "paged_prefill_attention_tiles",
        "<B, L, NP, PS, MP, KV, G, HD, T, 64, 128>",
        ["BT >= 16", "BH >= HD", "PS >= 16", "4096 % PS == 0"],
    ),
    # Issue 42's dequantising GEMMs: a step of BK = 128 inputs is BG = 128 / GS whole groups.
    "std.nn.quant_mm::linear_q8_mm": (
        "q8_mm_tiles",
        "<N, I, O, NG, I / NG, T, 32, 64, 128, 128 / (I / NG)>",
        ["BM >= 16", "BN >= 16", "BK >= 16", "BG * GS == BK", "I == NG * GS"],
    ),
    "std.nn.quant_mm::linear_q4_mm": (
        "q4_mm_tiles",
        "<N, I, O, NG, I / NG, T, 32, 64, 128, 128 / (I / NG)>",
        ["BM >= 16", "BN >= 16", "BK >= 32", "BG * GS == BK", "GS % 2 == 0", "I == NG * GS"],
    ),
    # The same span split-K, for decode batches (8-64 rows: programs for every SM).
    "std.nn.quant_mm::linear_q4_mm_split": (
        "q4_mm_split_part",
        "<N, I, O, NG, I / NG, T, 32, 32, 128, 128 / (I / NG), 4> then "
        "q4_mm_split_sum<N, I, O, NG, T, 32, 64, 4>",
        ["BM >= 16", "BN >= 16", "BK >= 32", "BG * GS == BK", "GS % 2 == 0", "I == NG * GS"],
    ),
}

# op -> ((first kernel, its arguments, its `where`), (second kernel, ...)): ops bound to a
# chain, `kernel first<...> then second<...>` (flash-decoding).
STD_CHAINS = {
    "std.nn.paged::paged_decode_attention_split": (
        (
            "paged_decode_split_tiles",
            "<B, NP, PS, MP, KV, G, HD, T, 16, 128, (MP + 3) / 4>",
            ["BG >= G", "BH >= HD", "PS >= 16", "4096 % PS == 0"],
        ),
        (
            "paged_decode_combine_tiles",
            "<B, NP, PS, MP, KV, G, HD, T, (MP + 3) / 4, 32, 4, 32>",
            [],
        ),
    ),
    "std.nn.decode::decode_attention_split": (
        (
            "decode_attention_split_tiles",
            "<B, S, KV, G, HD, T, 16, 32, 128, (S + 63) / 64>",
            ["BG >= G", "BH >= HD"],
        ),
        ("decode_attention_combine_tiles", "<B, S, KV, G, HD, T, (S + 63) / 64, 16, 4, 128>", []),
    ),
    "std.nn.decode::decode_attention_split_short": (
        (
            "decode_attention_split_tiles",
            "<B, S, KV, G, HD, T, 16, 64, 128, (S + 63) / 64>",
            ["BG >= G", "BH >= HD"],
        ),
        ("decode_attention_combine_tiles", "<B, S, KV, G, HD, T, (S + 63) / 64, 32, 4, 32>", []),
    ),
    "std.nn.decode::decode_attention_split_long": (
        (
            "decode_attention_split_tiles",
            "<B, S, KV, G, HD, T, 16, 64, 128, (S + 1023) / 1024>",
            ["BG >= G", "BH >= HD"],
        ),
        (
            "decode_attention_combine_tiles",
            "<B, S, KV, G, HD, T, (S + 1023) / 1024, 16, 4, 128>",
            [],
        ),
    ),
    # Three kernels: the attention input's split-K part, the splits that finish it and
    # attend, the combine (claimed across the cache writes: check/spans.py's Spans.fuse).
    **{
        f"std.nn.decode::rms_norm_qkv_rope_attention{wide}": (
            (
                "rms_norm_qkv_split_part",
                f"<N, D, KV * G * HD, KV * HD, T, 16, {bo}, {bk}, {ks}>",
                ["BR >= N"],
            ),
            (
                "qkv_rope_attention_split_tiles",
                f"<N, D, KV, G, HD, S, T, {ks}, 1024, 16, 64, 128, (S + 63) / 64>",
                ["BG >= G", "BH >= HD", "HD % 2 == 0", "NS * BS >= S"],
            ),
            (
                "qkv_attention_combine_tiles",
                "<N, D, KV, G, HD, S, T, (S + 63) / 64, 32, 4, 32>",
                [],
            ),
        )
        for wide, bo, bk, ks in [("", 16, 256, 4), ("_wide", 8, 512, 8)]
    },
}

STD_USES = """
use std.nn.activation::{softmax, silu_mul, silu}
use std.nn.linear::{linear_tiled}
use std.nn.norm::{rms_norm}
use std.nn.decode::{linear_gemv, linear_gemv_row, rms_norm_linear, rms_norm_qkv, rms_norm_gate_up, gate_up_silu,
                    linear_residual, decode_attention_flash, linear_gemv_dot, linear_split,
                    linear_split_wide, linear_residual_split, residual_rms_norm, rms_norm_qkv_split, rms_norm_qkv_rope,
                    rms_norm_qkv_rope_split, rms_norm_qkv_rope_split_wide,
                    decode_attention_split, decode_attention_split_short, decode_attention_split_long,
                    decode_attention_split_once}
use std.nn.quant::{linear_q8_gemv, linear_q8_split, linear_q4_gemv, linear_q4_split}
use std.nn.quant_mm::{linear_q8_mm, linear_q4_mm, linear_q4_mm_split}
use std.nn.paged::{paged_decode_attention_flash, paged_decode_attention_split, paged_prefill_attention_flash}
"""


@pytest.fixture(scope="module")
def std() -> Program:
    program = Program.from_text(STD_USES)
    assert not check_program(program)
    return program


def _ops(program: Program) -> dict[str, A.FuncDecl]:
    return {op.qualified_name: op for op in bound_ops(program)}


@pytest.mark.parametrize("path", sorted(STD_ROOT.rglob("*.linnet")), ids=lambda p: p.name)
def test_every_std_module_checks(path: Path) -> None:
    check_text(
        path.read_text(), name="std." + ".".join(path.relative_to(STD_ROOT).with_suffix("").parts)
    )


def test_each_std_kernel_is_bound_to_its_op(std: Program) -> None:
    ops = _ops(std)
    assert set(ops) == set(STD_KERNELS) | set(STD_CHAINS)
    for name, (kernel, args, clauses) in STD_KERNELS.items():
        op = ops[name]
        assert op.kernel is not None and op.kernel.name == kernel
        text = op.module.source.text  # type: ignore[union-attr]
        # the binding, then the op's body (or the op's own `where` first)
        assert re.search(re.escape(f"kernel {kernel}{args}") + r"(\nwhere [^{]*)? \{", text), name
        kdecl = op.module.find(kernel)  # type: ignore[union-attr]
        assert isinstance(kdecl, A.FuncDecl) and kdecl.kind == "kernel"
        where = [text[w.span.start : w.span.stop] for w in kdecl.where]
        assert where == clauses, name


def test_each_std_chain_is_bound_to_its_op(std: Program) -> None:
    """An op bound to two kernels names both, with their arguments, in order; each kernel's
    `where` clause says when it applies, and the op's bounds what it takes."""
    ops = _ops(std)
    for name, stages in STD_CHAINS.items():
        op = ops[name]
        text = op.module.source.text  # type: ignore[union-attr]
        binding: A.KernelBinding | None = op.kernel
        for kernel, args, clauses in stages:
            assert binding is not None and binding.name == kernel, name
            assert text[binding.span.start : binding.span.stop].endswith(f"{kernel}{args}"), name
            kdecl = op.module.find(kernel)  # type: ignore[union-attr]
            assert isinstance(kdecl, A.FuncDecl) and kdecl.kind == "kernel"
            assert [text[w.span.start : w.span.stop] for w in kdecl.where] == clauses, name
            binding = binding.then
        assert binding is None
        bounds = ["G <= 16", "HD <= 128"] + (["S <= 2048"] if name.endswith("_short") else [])
        if "rope_attention" in name:  # the rotations, and the short attention's bounds
            bounds = ["HD % 2 == 0", "G <= 16", "HD <= 128", "S <= 2048"]
        if name.startswith("std.nn.paged::"):  # pools of 4 pages or more (the kernels' checks)
            bounds = ["NP >= 4", *bounds]
        assert [text[w.span.start : w.span.stop] for w in op.where] == bounds, name


def test_the_matmul_is_a_dot_in_a_loop_with_a_carried_accumulator() -> None:
    text = (STD_ROOT / "nn" / "linear.linnet").read_text()
    kernel = text[text.index("pub kernel tiled_matmul") :]
    assert "let acc = fill(0.0, BM, BN)" in kernel
    assert "for k0 in 0..(I + BK - 1) / BK {" in kernel and "acc = acc + p" in kernel
    assert "let p[m, n] = sum[k] (a[m, k] as f32) * (b[n, k] as f32)" in kernel


def test_silu_mul_body_is_silu_times_up(std: Program) -> None:
    """The new op's body is `silu(gate) * up` step for step: the same graph steps as calling
    `silu` and multiplying (so results equal wherever the kernel does not run)."""

    def graph(body: str):
        prog = Program.from_text(
            STD_USES
            + f"""
model M<N: Dim, F: Dim> {{
    entry go(g: Tensor[N, F; f32], u: Tensor[N, F; f32]) -> Tensor[N, F; f32] {{
        {body}
    }}
}}"""
        )
        return lower(prog, "go", {"g": [3, 5], "u": [3, 5]})

    fused, plain = graph("return silu_mul(g, u)"), graph("return silu(g) * u")
    assert [s.op for s in fused.steps] == [s.op for s in plain.steps]


@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_llama_generated_source_without_a_program_has_no_launch(numerics: str) -> None:
    """Without the program (as `linnet torch` emits by default for exact numerics and every
    emitter without kernels), the bound ops' generated code is the body or the fused torch
    call it always was: no kernel, no Triton."""
    prog = Program.from_file(
        Path(__file__).resolve().parents[3] / "examples" / "llama" / "llama.linnet"
    )
    config = {
        "V": 64,
        "D": 32,
        "F": 48,
        "NL": 1,
        "H": 4,
        "KV": 2,
        "HD": 8,
        "S": 8,
        "B": 1,
        "T": "f32",
    }
    graph = lower(prog, "decode", {"token": [1], "pos": [1]}, config)
    bound = [c for c in graph.calls if c.attributes.get("kernel")]
    # The norms, and the SwiGLU MLP's `silu_mul` (issue 15: the span the gate/up kernels claim).
    assert {c.attributes["kernel"] for c in bound} == {
        "std.nn.norm::rms_norm_rows",
        "std.nn.activation::silu_mul_tiles",
    }
    text = emit_torch(graph, numerics=numerics)
    assert "triton" not in text and "kernels_ready" not in text
    assert "F.linear(" in text and "F.rms_norm(" in text
    assert "F.silu(" in text  # silu_mul's fast call
    exact = emit_torch(with_kernels(graph, prog), numerics="exact")
    assert "triton" not in exact and "kernels_ready" not in exact  # exact: the body


def test_where_clauses_bound_the_sampled_shapes(std: Program) -> None:
    ops = _ops(std)
    for c in sample_cases(
        std, ops["std.nn.norm::rms_norm"], 6, seed=0, max_size=5000, max_numel=1 << 20
    ):
        assert c.generics["D"] <= 4096 and c.kernel_generics["B"] == 4096
    # softmax: C <= 1024, and the sampler tries the edge (1023, 1024, 1025 -> not 1025).
    softmax = ops["std.nn.activation::softmax"]
    assert {1023, 1024, 1025} <= boundary_sizes(softmax, None)
    cs = sample_cases(std, softmax, 40, seed=1, max_size=1100, max_numel=1 << 22)
    assert cs and all(c.generics["C"] <= 1024 for c in cs)
    assert any(c.generics["C"] in (1023, 1024) for c in cs)


def test_a_false_where_clause_gives_no_case() -> None:
    prog = check_text("""
kernel k<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
where B >= C, C >= 5000 {
    let row = program_id(0)
    let cols = iota<i32>(B)
    store(y[row, cols], load(x[row, cols], cols < C, 0.0), cols < C)
}

pub op o<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] kernel k<R, C, 8192> {
    let y[r, c] = x[r, c]
    return y
}
""")
    [op] = bound_ops(prog)
    assert sample_cases(prog, op, 3, seed=0, max_size=64) == []


def test_a_divisibility_clause_no_boundary_names_gets_powers_of_two() -> None:
    """`C % (2 * B) == 0` with B 16 needs C = 32: none of the small sizes, nor the clauses'
    literals and their neighbours, but a power of two (rms_norm_qkv_rope_split_sum's
    `HD % (2 * BO) == 0` at BO 16)."""
    prog = check_text("""
kernel k<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R, C / B)
where C % (2 * B) == 0 {
    let row = program_id(0)
    let cols = program_id(1) * B + iota<i32>(B)
    store(y[row, cols], load(x[row, cols], cols < C, 0.0), cols < C)
}

pub op o<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] kernel k<R, C, 16> {
    let y[r, c] = x[r, c]
    return y
}
""")
    [op] = bound_ops(prog)
    assert 32 not in candidate_sizes(48, boundary_sizes(op, None))
    cases = sample_cases(prog, op, 2, seed=0, max_size=48)
    assert cases and all(c.generics["C"] == 32 for c in cases)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), max_size=st.integers(1, 80))
def test_sampled_cases_satisfy_every_clause(seed: int, max_size: int) -> None:
    """Whatever the seed and size limit: dims within the limit, generics of the op's kinds,
    parameter shapes consistent with the op's types, and the kernel's where clause true."""
    prog = Program.from_text(STD_USES)
    for op in bound_ops(prog):
        for c in sample_cases(prog, op, 2, seed=seed, max_size=max_size):
            kinds = {g.name: g.kind for g in op.generics}
            for name, v in c.generics.items():
                assert (
                    (isinstance(v, int) and 1 <= v <= max_size)
                    if kinds[name] == "Dim"
                    else v in ("f32", "bf16")
                )
            assert set(c.params) == {p.name for p in op.params if isinstance(p.type, A.TensorType)}
            if op.name == "linear_tiled":
                (n, i), (o, i2) = c.params["x"][0], c.params["w"][0]
                assert (i, c.results[0][0]) == (i2, (n, o))
            if op.name == "softmax":
                assert c.generics["C"] <= 1024


def test_candidate_sizes_stay_in_range() -> None:
    assert candidate_sizes(1, {5}) == [1]
    assert max(candidate_sizes(48, {1023, 1024})) == 48
