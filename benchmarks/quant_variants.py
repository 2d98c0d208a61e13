"""Candidate quantised GEMV designs (benchmarks/kernels/quant_variants.linnet) against the
std.nn.quant kernels and bf16 cuBLAS, at Llama-3-8B decode products, one row (issue 42).

The std kernels round each dequantised weight to T before the product, as the ops' bodies
define (`(q * s) as T`), and gather a group scale per element; the candidates keep the
weight in f32 (no bf16 round trip) and either gather the scale per element (`q8v_row`) or
load one scale a step for steps inside one group (`q8v_group`, `q4v_group`), each with a
[BO, BK] f32 accumulator summed once after the loop. Each result is checked against the f32
dequantised product before it is timed (CUDA graphs over weight copies larger than L2).

    python3 benchmarks/quant_variants.py [--products q,kv,up,down] [--group 128]
    python3 benchmarks/quant_variants.py --cpu-smoke     # TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_kernels import graph_us  # noqa: E402
from linnet.torch.kernels import kernel_module  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "kernels" / "quant_variants.linnet"
PRODUCTS = {"q": (4096, 4096), "kv": (4096, 1024), "up": (4096, 14336), "down": (14336, 4096)}
SMOKE_PRODUCTS = {"q": (256, 64)}
BANDWIDTH = 3.35e12
L2 = 50 << 20
Q8 = [
    ("q8v_group_round", {"BO": 16, "BK": 128}),
    ("q8v_row", {"BO": 8, "BK": 512}),
    ("q8v_group", {"BO": 16, "BK": 128}),
    ("q8v_group", {"BO": 32, "BK": 128}),
]
Q4 = [
    ("q4v_group_round", {"BO": 16, "BJ": 64}),
    ("q4v_group", {"BO": 16, "BJ": 64}),
    ("q4v_group", {"BO": 32, "BJ": 64}),
]
# The group-sum designs (no rounding, a group's scale applied once to its sum), N rows:
# (BO outputs, BG groups a step).
GROUPS = [(4, 8), (8, 8), (2, 8), (4, 16), (2, 16), (8, 16)]
Q8 += [("q8v_groups", {"BR": 1, "BO": bo, "BG": bg}) for bo, bg in GROUPS]
Q4 += [("q4v_groups", {"BR": 1, "BO": bo, "BG": bg}) for bo, bg in GROUPS]
Q4 += [
    ("q4v_bytes", {"BR": 1, "BO": bo, "BG": bg}) for bo, bg in [(4, 8), (8, 8), (8, 16), (4, 16)]
]
# On the tensor cores (rows padded to 16): BO outputs a program, one group a step.
Q4 += [("q4v_dot", {"BR": 16, "BO": bo}) for bo in (64, 32)]
STD = {
    "q8": [("std.nn.quant::q8_gemv_rows", {"BR": 16, "BO": 4, "BG": 8})],
    "q4": [("std.nn.quant::q4_gemv_rows", {"BR": 16, "BO": 8, "BG": 8})],
}


def inputs(fmt: str, i: int, o: int, group: int, dev: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, i, generator=g).to(torch.bfloat16)
    ng = i // group
    if fmt == "q8":
        q = torch.randint(-127, 128, (o, i), generator=g).to(torch.int8)
        s = (torch.rand(o, ng, generator=g) * 0.02 / 127 + 1e-5).to(torch.float16)
        return [t.to(dev) for t in (x, q, s)]
    q = torch.randint(0, 256, (o, i // 2), generator=g).to(torch.uint8)
    d = (torch.rand(o, ng, generator=g) * 0.004 + 1e-5).to(torch.float16)
    m = (-7.5 * d.float()).to(torch.float16)
    return [t.to(dev) for t in (x, q, d, m)]


def reference(fmt: str, ins: list[torch.Tensor]) -> torch.Tensor:
    x, q = ins[0].float(), ins[1]
    if fmt == "q8":
        s = ins[2].float()
        w = q.float().reshape(q.shape[0], s.shape[1], -1) * s[..., None]
    else:
        d, m = ins[2].float(), ins[3].float()
        level = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1).float()
        w = level.reshape(q.shape[0], d.shape[1], -1) * d[..., None] + m[..., None]
    return x @ w.reshape(q.shape[0], -1).T


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--products", default="q,kv,up,down")
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--reps", type=int, default=32)
    p.add_argument("--cpu-smoke", action="store_true")
    args = p.parse_args()
    dev = "cpu" if SMOKE else "cuda"
    group = args.group
    products = SMOKE_PRODUCTS if SMOKE else {k: PRODUCTS[k] for k in args.products.split(",")}
    lines = []
    for label, (i, o) in products.items():
        for fmt, variants in (("q8", Q8), ("q4", Q4)):
            ins = inputs(fmt, i, o, group, dev, 0)
            nbytes = sum(t.numel() * t.element_size() for t in ins[1:])
            copies = (
                [ins]
                + [inputs(fmt, i, o, group, dev, c) for c in range(1, max(2, -(-3 * L2 // nbytes)))]
                if not SMOKE
                else [ins]
            )
            want = reference(fmt, ins)
            floor = nbytes / BANDWIDTH * 1e6
            base = {"I": i, "O": o, "NG": i // group, "GS": group, "T": "bf16"}
            cands = []
            for n, g in variants:
                gen = base | g
                if n.endswith(
                    ("_groups", "_bytes", "_dot")
                ):  # N rows; int4 takes HG = GS / 2 bytes a group
                    gen = gen | {"N": 1}
                    if fmt == "q4":
                        gen = {k: v for k, v in gen.items() if k != "GS"} | {"HG": group // 2}
                cands.append((str(SOURCE), f"quant_variants::{n}", gen))
            cands += [(None, n, base | g | {"N": 1}) for n, g in STD[fmt]]
            if not SMOKE:
                w16 = [[c[0], torch.randn(o, i, device=dev, dtype=torch.bfloat16)] for c in copies]
                us = graph_us(F.linear, w16, args.reps)
                lines.append(
                    f"| {label} | {fmt} | bf16 F.linear | {us:.2f} | {o * i * 2 / BANDWIDTH * 1e6 / us:.0%} (bf16 bytes) |"
                )
            for program, name, gen in cands:
                try:
                    mod = kernel_module(program, name, gen)
                except Exception as exc:  # a where clause this shape fails: say so, go on
                    lines.append(
                        f"| {label} | {fmt} | {name} {gen} | n/a: {str(exc).splitlines()[0][:60]} | |"
                    )
                    continue
                got = mod.LAUNCH(*ins).float()
                err = float((got - want).abs().max() / want.abs().max())
                if err > 2e-2:
                    lines.append(f"| {label} | {fmt} | {name} {gen} | WRONG (rel {err:.3g}) | |")
                    continue
                us = graph_us(mod.LAUNCH, copies, args.reps) if not SMOKE else 0.0
                tiles = ":".join(str(v) for k, v in gen.items() if k in ("BO", "BK", "BJ", "BG"))
                share = f"{floor / us:.0%}" if us else "-"
                lines.append(
                    f"| {label} | {fmt} | {name} {tiles} | {us:.2f} | {share} (err {err:.1e}) |"
                )
    print("| product | fmt | kernel | us | of floor |\n|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
