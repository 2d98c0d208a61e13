"""int4 GEMV loop designs in raw Triton, counted in SASS without a GPU: which layout of the
packed weights lets a loop spend fewer instructions a weight than an H100 can issue while
the weight arrives (4.4 lane instructions an int4 weight at 3.35 TB/s)?

    python3 benchmarks/int4_layouts.py

Each design computes y = x dequant(q, d, m)^T for one row of x (4,096 inputs and outputs,
groups of 128, an f16 scale d and offset m per group), is compiled for sm_90 (pointers
16-byte aligned) and its longest loop counted as benchmarks/sass_loops.py does. Designs, one
group a step:

- ``std_magic``: std layout q[o, j] (low nibble input 2j, high 2j + 1), tile [BO, 4, 16
  bytes], levels by ``as f32``'s magic number (an ``or`` and a ``- 2^23`` add a nibble).
- ``std_bitcast``: the same tile, a level n read as the f32 1 + n / 16 from bits, the offset
  folded into the group's sums (16 d sum((1 + n/16) x) + (m - 16 d) sum(x)).
- ``bytes_repacked``: bytes stored [group, chunk, output, 16] so a thread holds a row's group.
- ``words_repacked``: u32 words [group, chunk, output, 4], nibble s of a word is input
  g * 128 + s * 16 + c * 4 + v; the products accumulated by FFMA over the 8 nibbles.

Results (Triton 3.9, 2026-12-07) are in docs/benchmarks/notes/2026-12-07-int4-sass.md. These
are prototypes for the layout decision, not kernels Linnet ships.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.pop("TRITON_INTERPRET", None)

import triton
import triton.language as tl
from sass_loops import budget, loops, sass

IN, OUT, GS = 4096, 4096, 128


@triton.jit
def std_layout(
    x, q, d, m, y, IN: tl.constexpr, GS: tl.constexpr, BO: tl.constexpr, BITS: tl.constexpr
):
    NG: tl.constexpr = IN // GS
    C: tl.constexpr = GS // 32
    outs = tl.program_id(0) * BO + tl.arange(0, BO)
    cs = tl.arange(0, C)
    bs = tl.arange(0, 16)
    acc = tl.zeros((BO,), tl.float32)
    for g in range(0, NG):
        jj = g * (GS // 2) + cs[:, None] * 16 + bs[None, :]
        b = tl.load(q + outs[:, None, None] * (IN // 2) + jj[None, :, :]).to(tl.int32)
        if BITS:
            lo = (((b % 16) * 524288) + 0x3F800000).to(tl.float32, bitcast=True)
            hi = (((b // 16) * 524288) + 0x3F800000).to(tl.float32, bitcast=True)
        else:
            lo = ((b % 16) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
            hi = ((b // 16) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        xe = tl.load(x + 2 * jj).to(tl.float32)
        xo = tl.load(x + 2 * jj + 1).to(tl.float32)
        pg = tl.sum(tl.sum(lo * xe[None] + hi * xo[None], axis=2), axis=1)
        sx = tl.sum(xe + xo)
        dt = tl.load(d + outs * NG + g).to(tl.float32)
        mt = tl.load(m + outs * NG + g).to(tl.float32)
        if BITS:
            acc += (16.0 * dt) * pg + (mt - 16.0 * dt) * sx
        else:
            acc += dt * pg + mt * sx
    tl.store(y + outs, acc.to(tl.bfloat16))


@triton.jit
def bytes_repacked(
    x, q, d, m, y, IN: tl.constexpr, GS: tl.constexpr, BO: tl.constexpr, BITS: tl.constexpr
):
    # byte (g, c, o, b): low nibble input g*GS + c*16 + b, high g*GS + GS/2 + c*16 + b
    NG: tl.constexpr = IN // GS
    C: tl.constexpr = GS // 32
    OUT: tl.constexpr = IN
    outs = tl.program_id(0) * BO + tl.arange(0, BO)
    cs = tl.arange(0, C)
    bs = tl.arange(0, 16)
    acc = tl.zeros((BO,), tl.float32)
    for g in range(0, NG):
        off = g * (C * OUT * 16) + cs[:, None, None] * (OUT * 16) + outs[None, :, None] * 16
        b = tl.load(q + off + bs[None, None, :]).to(tl.uint32)
        lo = (((b & 15) << 19) | 0x3F800000).to(tl.float32, bitcast=True)
        hi = (((b & 0xF0) << 15) | 0x3F800000).to(tl.float32, bitcast=True)
        xl = tl.load(x + g * GS + cs[:, None, None] * 16 + bs[None, None, :]).to(tl.float32)
        xh = tl.load(x + g * GS + GS // 2 + cs[:, None, None] * 16 + bs[None, None, :]).to(
            tl.float32
        )
        pg = tl.sum(tl.sum(lo * xl + hi * xh, axis=2), axis=0)
        sx = tl.sum(xl + xh)
        dt = tl.load(d + outs * NG + g).to(tl.float32)
        mt = tl.load(m + outs * NG + g).to(tl.float32)
        acc += (16.0 * dt) * pg + (mt - 16.0 * dt) * sx
    tl.store(y + outs, acc.to(tl.bfloat16))


@triton.jit
def words_repacked(
    x, q, d, m, y, IN: tl.constexpr, GS: tl.constexpr, BO: tl.constexpr, BITS: tl.constexpr
):
    # word (g, c, o, v): nibble s is input g*GS + s*16 + c*4 + v (GS = 128)
    NG: tl.constexpr = IN // GS
    OUT: tl.constexpr = IN
    outs = tl.program_id(0) * BO + tl.arange(0, BO)
    cs = tl.arange(0, 4)
    vs = tl.arange(0, 4)
    acc = tl.zeros((BO,), tl.float32)
    for g in range(0, NG):
        off = g * (4 * OUT * 4) + cs[:, None, None] * (OUT * 4) + outs[None, :, None] * 4
        wd = tl.load(q + off + vs[None, None, :])
        p3 = tl.zeros((4, BO, 4), tl.float32)
        x3 = tl.zeros((4, 1, 4), tl.float32)
        for s in tl.static_range(8):
            if 4 * s <= 19:
                f = (((wd << (19 - 4 * s)) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
            else:
                f = (((wd >> (4 * s - 19)) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
            xs = tl.load(x + g * GS + s * 16 + cs[:, None, None] * 4 + vs[None, None, :])
            xs = xs.to(tl.float32)
            p3 += f * xs
            x3 += xs
        pg = tl.sum(tl.sum(p3, axis=2), axis=0)
        sx = tl.sum(x3)
        dt = tl.load(d + outs * NG + g).to(tl.float32)
        mt = tl.load(m + outs * NG + g).to(tl.float32)
        acc += (16.0 * dt) * pg + (mt - 16.0 * dt) * sx
    tl.store(y + outs, acc.to(tl.bfloat16))


DESIGNS = [
    ("std_magic", std_layout, "*u8", 0),
    ("std_bitcast", std_layout, "*u8", 1),
    ("bytes_repacked", bytes_repacked, "*u8", 1),
    ("words_repacked", words_repacked, "*u32", 1),
]


def count(fn, qtype: str, bits: int, bo: int, warps: int = 4) -> tuple[int, float]:
    """The longest loop's instructions a thread and a weight."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"x": "*bf16", "q": qtype, "d": "*fp16", "m": "*fp16", "y": "*bf16"}
    consts = {"IN": IN, "GS": GS, "BO": bo, "BITS": bits}
    sig |= dict.fromkeys(consts, "constexpr")
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    body = loops(sass(k.asm["cubin"]))[0]
    n = sum(body.values())
    return n, n / (bo * GS / (warps * 32))


def main() -> int:
    rows = []
    for name, fn, qtype, bits in DESIGNS:
        for bo in (128, 256, 512):
            n, per = count(fn, qtype, bits, bo)
            rows.append(f"| {name} | {bo} | {n} | {per:.2f} | {min(1.0, budget(4) / per):.0%} |")
            print(rows[-1], flush=True)
    print("\n| design | outputs a program | loop instructions a thread | a weight | bound |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
