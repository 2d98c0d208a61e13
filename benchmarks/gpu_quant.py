"""Quantised decode steps on CUDA (issue 42): bf16 against int8 and int4 weights, in one run
on one card.

    bash benchmarks/gpu.sh --quant [--models llama-3-8b] [--batches 1,8,32] [--group 128]

For each Llama shape and batch (random bf16 weights, numerics "fast", every available backend
and Linnet's kernels, as `generate` plans its step): the model loaded as stored, then with
`quantize="int8"` and `quantize="int4"` (round to nearest at load, f16 scales per group);
each format's decode step planned with measured timings and replayed as one CUDA graph
(`Captured`), each step feeding its own argmax and a host position, CONTEXT positions in the
cache; ms/token over STEPS steps queued back to back (median of REPEATS). The floor is the
bytes a step must read (every weight but the embedding table's unread rows, its scales, and
the KV cache up to the position) over the copy bandwidth measured in this run. Which backend
took the quantised products is read from the plan. `--profile` adds each format's kernels
(torch.profiler over 8 replays): where the step's microseconds go. A table comes last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_flashinfer import LLAMA, config
from torch_decode import copy_bandwidth

ROWS: list[str] = []
PROFILES: list[str] = []


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama-3-8b")
    p.add_argument("--formats", default="bf16,int8,int4")
    p.add_argument("--batches", default="1")
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--no-kernels", action="store_true", help="plan without Linnet's kernels")
    p.add_argument(
        "--compile",
        default=None,
        help="torch.compile mode of the generated slices between claimed regions (e.g. default)",
    )
    return p.parse_args()


def step_bytes(model: Any, cfg: dict, batch: int, context: int) -> int:
    """Bytes one decode step must read: every weight (quantised ones as stored, with their
    scales) but the embedding table, of which only ``batch`` rows are read unless the LM head
    is tied to it; and the K and V caches up to ``context``."""
    total = 0
    for name, p in model.params.items():
        if name.endswith("embed_tokens.weight") and not cfg.get("tie_word_embeddings"):
            total += batch * p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    kv = 2 * cfg["NL"] * batch * context * cfg["KV"] * cfg["HD"] * 2
    return total + kv


def took(plan: Any) -> str:
    """Who runs the quantised products: the plan's explanation lines that name them."""
    lines = [ln.strip() for ln in plan.explain().splitlines() if "_q8" in ln or "_q4" in ln]
    return "; ".join(lines[:4]) if lines else "(no quantised region named)"


def timed(cap: Any, batch: int, context: int, steps: int) -> float:
    """Seconds a step, ``steps`` replays queued back to back, each fed its own argmax."""
    token = torch.ones(batch, dtype=torch.int32, device="cuda")

    def step(token: torch.Tensor, i: int) -> torch.Tensor:
        pos = torch.full((batch,), context + i, dtype=torch.int32)
        return cap([token, pos])[0].argmax(-1).to(torch.int32)

    for i in range(4):
        token = step(token, i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        token = step(token, i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def profile(cap: Any, batch: int, context: int, label: str) -> None:
    from gpu_steps import kernel_table, replays_profiled

    def step(token: torch.Tensor, i: int) -> torch.Tensor:
        pos = torch.full((batch,), context + i, dtype=torch.int32)
        return cap([token, pos])[0].argmax(-1).to(torch.int32)

    events, wall = replays_profiled(step, torch.ones(batch, dtype=torch.int32, device="cuda"))
    PROFILES.append(f"\n{label}\n")
    PROFILES.extend(kernel_table(events, 8, wall * 1e3, top=12))


def rows_for(name: str, batch: int, args: argparse.Namespace, bw: float) -> None:
    from linnet.torch import load, random_weights
    from linnet.torch.planned import Captured

    cache = args.context + args.steps + 16
    cfg = config(name, S=cache, B=batch)
    weights = random_weights(LLAMA, cfg, seed=0, device="cuda")
    base_ms = None
    for fmt in args.formats.split(","):
        quantize = None if fmt == "bf16" else {"format": fmt, "group": args.group}
        t0 = time.perf_counter()
        model = load(
            LLAMA, weights=weights, config=cfg, device="cuda", numerics="fast", quantize=quantize
        )
        load_s = time.perf_counter() - t0
        one = torch.ones(batch, dtype=torch.int32)
        t0 = time.perf_counter()
        plan = model.plan_for(
            "decode",
            [one, one],
            captured=True,
            progress=False,
            kernels=not args.no_kernels,
            compile=args.compile,
        )
        plan_s = time.perf_counter() - t0
        # The whole explanation (which kernel each region took, and the timings it chose by).
        out = Path(os.environ.get("OUT", "gpu-results"))
        out.mkdir(parents=True, exist_ok=True)
        (out / f"explain-{name}-{fmt}-b{batch}.txt").write_text(plan.explain())
        cap = Captured(plan, model.context_for(plan))
        ms = (
            statistics.median(
                timed(cap, batch, args.context, args.steps) for _ in range(args.repeats)
            )
            * 1e3
        )
        floor_ms = step_bytes(model, cfg, batch, args.context) / bw * 1e3
        base_ms = ms if fmt == "bf16" else base_ms
        ratio = f"{base_ms / ms:.2f}x" if base_ms else ""
        print(
            f"{name} B={batch} {fmt}: {ms:.3f} ms/token, floor {floor_ms:.3f} "
            f"({floor_ms / ms:.0%} of it), load {load_s:.1f} s, plan {plan_s:.1f} s; {took(plan)}",
            flush=True,
        )
        ROWS.append(
            f"| {name} | {batch} | {fmt} | {ms:.3f} | {floor_ms:.3f} | {ms / floor_ms:.2f} | "
            f"{ratio} |"
        )
        if args.profile:
            profile(cap, batch, args.context, f"{name} B={batch} {fmt}: {ms:.3f} ms/token")
        del model, plan, cap
        torch.cuda.empty_cache()
    del weights
    torch.cuda.empty_cache()


def main() -> None:
    args = parse()
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}", flush=True)
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            try:
                rows_for(name, batch, args, bw)
            except Exception as exc:  # one shape's failure is reported; the rest still run
                import traceback

                traceback.print_exc()
                ROWS.append(f"| {name} | {batch} | failed: {str(exc)[:80]} | | | | |")
    print("\n".join(PROFILES))
    print(f"\ncontext {args.context}, group {args.group}, copy bandwidth {bw / 1e12:.2f} TB/s")
    print("| shape | batch | format | ms/token | floor ms | x floor | bf16 / this |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(ROWS))


if __name__ == "__main__":
    main()
