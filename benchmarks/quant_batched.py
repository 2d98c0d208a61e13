"""Batched int4 products (issue 42: int4 at batch 8 and 32 no worse than bf16): the tile
kernels that dequantise in registers and feed the tensor cores, over a sweep of tile shapes,
against bf16 cuBLAS (`F.linear`) at the same rows, at Llama-3-8B's products.

`std.nn.quant_mm::q4_mm_tiles` (the std binding: 32 rows x 64 outputs a program, 128 inputs a
step) gives a q product 64 programs for 132 SMs; the sweep tries narrower tiles, longer
steps, `q4b_mm` (levels by bitcast, one group a step) and split-K (`q4_mm_split_part` then
`q4_mm_split_sum`: std.nn.quant_mm's `linear_q4_mm_split`). Each result is checked against
the f32 dequantised product before it is timed (CUDA graphs over weight copies larger than
L2); the table gives microseconds, the int4 bytes' floor share, and bf16 / this.

    python3 benchmarks/quant_batched.py [--rows 8,32] [--products q,kv,up,down]
    python3 benchmarks/quant_batched.py --cpu-smoke     # TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_kernels import graph_us  # noqa: E402
from linnet.torch.kernels import kernel_module  # noqa: E402
from quant_variants import BANDWIDTH, L2, PRODUCTS, reference  # noqa: E402

SOURCE = str(Path(__file__).resolve().parent / "kernels" / "quant_variants.linnet")
SMOKE_PRODUCTS = {"q": (256, 64)}
# (kernel, tile generics) — std.nn.quant_mm::q4_mm_tiles takes BM, BN, BK (= BG * GS).
TILES = [(32, 64, 128), (16, 64, 128), (16, 32, 256), (32, 32, 256), (16, 16, 512), (32, 16, 512)]
BMM = [(16, 16), (16, 32), (32, 32), (32, 64)]
SPLITS = [
    (32, 32, 128, 4),
    (16, 64, 128, 4),
    (32, 64, 128, 4),
    (16, 64, 256, 2),
    (32, 128, 128, 8),
    (32, 32, 128, 8),
]


def inputs(rows: int, i: int, o: int, group: int, dev: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, i, generator=g).to(torch.bfloat16)
    ng = i // group
    q = torch.randint(0, 256, (o, i // 2), generator=g).to(torch.uint8)
    d = (torch.rand(o, ng, generator=g) * 0.004 + 1e-5).to(torch.float16)
    m = (-7.5 * d.float()).to(torch.float16)
    return [t.to(dev) for t in (x, q, d, m)]


def candidates(rows: int, i: int, o: int, group: int) -> list[tuple[str, Any]]:
    """(label, a launcher of (x, q, d, m)) for each design and tile that applies."""
    base = {"N": rows, "I": i, "O": o, "NG": i // group, "GS": group, "T": "bf16"}
    out: list[tuple[str, Any]] = []

    def add(label: str, make: Any) -> None:
        try:
            out.append((label, make()))
        except Exception as exc:  # a where clause this shape fails: say so, go on
            out.append((f"{label} n/a: {str(exc).splitlines()[0][:50]}", None))

    for bm, bn, bk in TILES:
        if bk % group:
            continue
        gen = base | {"BM": bm, "BN": bn, "BK": bk, "BG": bk // group}
        add(
            f"q4_mm_tiles {bm}x{bn}x{bk}",
            lambda gen=gen: kernel_module(None, "std.nn.quant_mm::q4_mm_tiles", gen).LAUNCH,
        )
    for bm, bn in BMM:
        gen = {k: v for k, v in base.items() if k != "T"} | {"BM": bm, "BN": bn}
        add(
            f"q4b_mm {bm}x{bn}",
            lambda gen=gen: kernel_module(SOURCE, "quant_variants::q4b_mm", gen).LAUNCH,
        )
    for bm, bn, bk, ks in SPLITS:
        if bk % group:
            continue

        def split(bm: int = bm, bn: int = bn, bk: int = bk, ks: int = ks) -> Any:
            part = kernel_module(
                None,
                "std.nn.quant_mm::q4_mm_split_part",
                base | {"BM": bm, "BN": bn, "BK": bk, "BG": bk // group, "KS": ks},
            ).LAUNCH
            gen = {k: v for k, v in base.items() if k != "GS"} | {"BM": bm, "BN": 64, "KS": ks}
            total = kernel_module(None, "std.nn.quant_mm::q4_mm_split_sum", gen).LAUNCH
            return lambda x, q, d, m: total(x, q, d, m, part(x, q, d, m))

        add(f"split-K {bm}x{bn}x{bk} /{ks}", split)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="8,32")
    p.add_argument("--products", default="q,kv,up,down")
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--reps", type=int, default=32)
    p.add_argument("--cpu-smoke", action="store_true")
    args = p.parse_args()
    dev = "cpu" if SMOKE else "cuda"
    group = 32 if SMOKE else args.group
    products = SMOKE_PRODUCTS if SMOKE else {k: PRODUCTS[k] for k in args.products.split(",")}
    lines = []
    best: dict[tuple[str, int], tuple[float, str, float]] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        for label, (i, o) in products.items():
            ins = inputs(rows, i, o, group, dev, 0)
            nbytes = sum(t.numel() * t.element_size() for t in ins[1:])
            copies = [ins]
            if not SMOKE:
                copies += [
                    inputs(rows, i, o, group, dev, c) for c in range(1, -(-3 * L2 // nbytes))
                ]
            want = reference("q4", [ins[0].float(), *ins[1:]]).float()
            floor = nbytes / BANDWIDTH * 1e6
            bf16 = 0.0
            if not SMOKE:
                w16 = [[c[0], torch.randn(o, i, device=dev, dtype=torch.bfloat16)] for c in copies]
                bf16 = graph_us(F.linear, w16, args.reps)
                lines.append(f"| {label} | {rows} | bf16 F.linear | {bf16:.2f} | | 1.00x |")
            for name, launch in candidates(rows, i, o, group):
                if launch is None:
                    lines.append(f"| {label} | {rows} | {name} | | | |")
                    continue
                got = launch(*ins).float()
                err = float((got - want).abs().max() / want.abs().max())
                if err > 2e-2:
                    lines.append(f"| {label} | {rows} | {name} | WRONG (rel {err:.3g}) | | |")
                    continue
                us = graph_us(launch, copies, args.reps) if not SMOKE else 0.0
                share = f"{floor / us:.0%}" if us else "-"
                ratio = f"{bf16 / us:.2f}x" if us else "-"
                lines.append(f"| {label} | {rows} | {name} | {us:.2f} | {share} | {ratio} |")
                if us and us < best.get((label, rows), (1e9, "", 0.0))[0]:
                    best[(label, rows)] = (us, name, bf16)
    print("| product | rows | kernel | us | of int4 floor | bf16 / this |")
    print("|---|---|---|---|---|---|")
    print("\n".join(lines))
    print("\nbest int4 design per product and rows:")
    print("| product | rows | best | us | bf16 us | bf16 / best |\n|---|---|---|---|---|---|")
    for (label, rows), (us, name, bf16) in best.items():
        print(f"| {label} | {rows} | {name} | {us:.2f} | {bf16:.2f} | {bf16 / us:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
