"""Std decode kernels compiled for the H200's architecture (sm_90) without a GPU: Triton
compiles to PTX here. Run by test_kernels_ptx.py in a fresh process without TRITON_INTERPRET
(this directory's conftest imports Triton interpreted, which cannot compile); prints one JSON
object: per case, where the L2 prefetches, the loads and the PDL wait fall in the PTX, with
and without PREFETCH, and whether the products are tensor-core MMAs."""

import json
import sys

import triton
from linnet.torch.kernels import compiled

CASES = {
    "rms_norm_qkv_split_part": (
        {
            "N": 1,
            "D": 4096,
            "Q": 4096,
            "K": 1024,
            "T": "bf16",
            "BR": 16,
            "BO": 8,
            "BK": 256,
            "KS": 4,
        },
        None,
    ),
    "decode_attention_split_tiles": (
        {
            "B": 1,
            "S": 1152,
            "KV": 8,
            "G": 4,
            "HD": 128,
            "T": "bf16",
            "BG": 16,
            "BS": 64,
            "BH": 128,
            "NS": 18,
        },
        {"scale": 0.088},
    ),
    # rms_norm_qkv_rope_attention_wide's last two kernels at the 8B step's shape.
    "qkv_rope_attention_split_tiles": (
        {
            "N": 1,
            "D": 4096,
            "KV": 8,
            "G": 4,
            "HD": 128,
            "S": 1152,
            "T": "bf16",
            "KS": 8,
            "BK": 1024,
            "BG": 16,
            "BS": 64,
            "BH": 128,
            "NS": 18,
        },
        {"eps": 1e-5, "scale": 0.088},
    ),
    "qkv_attention_combine_tiles": (
        {
            "N": 1,
            "D": 4096,
            "KV": 8,
            "G": 4,
            "HD": 128,
            "S": 1152,
            "T": "bf16",
            "NS": 18,
            "BN": 32,
            "BG": 4,
            "BD": 32,
        },
        {"eps": 1e-5, "scale": 0.088},
    ),
}


def ptx(kernel: str, generics: dict, scalars: dict | None, use_pdl: int, prefetch: int) -> str:
    """The PTX of std kernel ``kernel`` for sm_90, launched as its launcher would (strides
    of contiguous tensors) under ``USE_PDL`` and ``PREFETCH``."""
    flags = {"USE_PDL": use_pdl, "PREFETCH": prefetch}
    return compiled(kernel, generics, scalars=scalars, flags=flags).asm["ptx"]


def edge_instructions() -> list[str]:
    """The max, min, division and float-to-integer instructions of tests/kernels/edges.linnet
    compiled for sm_90 (a NaN must win: `max.NaN.f32`, never Triton's default `max.f32`)."""
    import re
    from pathlib import Path

    path = Path(__file__).parent / "kernels" / "edges.linnet"
    text = compiled("edges::edge_tiles", {"N": 8}, program=path).asm["ptx"]
    return sorted(set(re.findall(r"\b(?:max|min|div|cvt\.rzi)\.[\w.]+", text)))


def where(text: str) -> dict:
    lines = text.splitlines()
    return {
        "wait": [i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln],
        "prefetch": [i for i, ln in enumerate(lines) if "prefetch.global.L2" in ln],
        "loads": [i for i, ln in enumerate(lines) if "ld.global" in ln or "ld.volatile" in ln],
        "mma": any("mma" in ln and "bf16" in ln for ln in lines),
    }


def can_compile() -> str | None:
    """Why this Triton cannot compile for sm_90 here (a kernel of Triton's own, not Linnet's),
    or None where it can."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def copy(x, y):
        tl.store(y + tl.arange(0, 16), tl.load(x + tl.arange(0, 16)))

    try:
        triton.compile(
            ASTSource(fn=copy, signature={"x": "*fp32", "y": "*fp32"}),
            target=GPUTarget("cuda", 90, 32),
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def main() -> int:
    why = can_compile()
    if why is not None:  # the test skips, saying why; a Linnet kernel's failure is not this
        print(json.dumps({"skip": why}))
        return 0
    out = {}
    for name, (generics, scalars) in CASES.items():
        kernel = "std.nn.decode::" + name
        out[name] = {
            "prefetch": where(ptx(kernel, generics, scalars, 2, 1)),
            "plain": where(ptx(kernel, generics, scalars, 2, 0)),
        }
    out["edges"] = edge_instructions()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
