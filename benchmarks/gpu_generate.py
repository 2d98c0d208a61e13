"""`Model.generate` on CUDA against the captured decode step it runs, in one run on one card.

    bash benchmarks/gpu.sh --generate [--models llama-3.2-1b,llama-3-8b] [--tokens 256]

For each Llama shape (random bf16 weights, numerics "fast", every available backend and
Linnet's kernels): `generate` of TOKENS greedy tokens after a 1,000-token prompt, per token
after the first (the on_token times), against the same plan's `Captured` step replayed back
to back with the argmax on the device (the benchmark loop of gpu_steps.py) over the same
positions. Then, after `warm_up`, the time to the first token of 10 prompts of random lengths
never seen, and what they compiled: Linnet lowerings and torch.compile frames (torch's
counters). Then the greedy text of `generate` against `fast=False` (the entries call by
call): on a model trained to continue periodic sequences (gpu_steps.train_copy_model) and on
SmolLM2-135M-Instruct (the demo GGUF, when its wheel is carried). A short table comes last.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_flashinfer import LLAMA, config

ROWS: list[str] = []


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama-3.2-1b,llama-3-8b")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=1000)
    p.add_argument("--cache", type=int, default=1536)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-text", action="store_true")
    return p.parse_args()


def dynamo_frames() -> int:
    """torch.compile's frames compiled so far in this process (torch's own counter)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


def timed_generate(model: Any, prompt: list[int], tokens: int) -> tuple[float, float, list[int]]:
    """(seconds to the first token, seconds per token after it, the tokens)."""
    stamps: list[float] = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(
        [prompt], tokens, stop_tokens=[], on_token=lambda s, t: stamps.append(time.perf_counter())
    )
    per = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return stamps[0] - start, per, out[0]


def captured_step(model: Any, prompt_length: int, tokens: int) -> float:
    """Seconds per token of the plan's Captured step generate used, replayed back to back
    over the same positions, the next token picked on the device (gpu_steps.py's loop)."""
    fast = model._fast_steps[1]
    token = torch.ones(1, dtype=torch.int32, device=model.device)

    def step(token: torch.Tensor, i: int) -> torch.Tensor:
        pos = torch.tensor([prompt_length + i], dtype=torch.int32)
        return fast.step([token, pos])[0].argmax(-1).to(torch.int32)

    for i in range(4):
        token = step(token, i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(tokens):
        token = step(token, i % (tokens - 1))
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / tokens


def shape_rows(name: str, args: argparse.Namespace, dev: torch.device) -> None:
    from linnet.torch import load, random_weights

    cfg = config(name, S=args.cache, B=1)
    weights = random_weights(LLAMA, cfg, seed=0, device=dev)
    model = load(LLAMA, weights=weights, config=cfg, device=dev, numerics="fast")
    gen = random.Random(0)
    prompt = [gen.randrange(10, cfg["V"]) for _ in range(args.prompt)]
    t0 = time.perf_counter()
    model.generate([prompt], 4, stop_tokens=[])
    first_call = time.perf_counter() - t0
    print(f"{name}: first call (plan, capture) {first_call:.1f} s", flush=True)
    print("\n".join(ln for ln in model._fast_steps[1].plan.explain().splitlines()[-6:]))
    pairs = []
    for _ in range(args.repeats):
        _, per, _ = timed_generate(model, prompt, args.tokens)
        step = captured_step(model, args.prompt, args.tokens)
        pairs.append((per, step))
        print(f"  generate {per * 1e3:.3f} ms/token, captured step {step * 1e3:.3f}", flush=True)
    gen_ms = statistics.median(p for p, _ in pairs) * 1e3
    step_ms = statistics.median(s for _, s in pairs) * 1e3
    ROWS.append(
        f"| {name} | {gen_ms:.3f} | {step_ms:.3f} | {gen_ms / step_ms:.3f} | {first_call:.0f} s |"
    )
    # New prompt lengths after warm_up: time to first token, and what they compiled.
    t0 = time.perf_counter()
    model.warm_up(longest=args.cache - args.tokens, progress=lambda line: None)
    warm = time.perf_counter() - t0
    lowered, frames = len(model._lowered), dynamo_frames()
    ttfts = []
    for _ in range(10):
        n = gen.randrange(20, args.cache - 40)
        ids = [gen.randrange(10, cfg["V"]) for _ in range(n)]
        ttft, _, _ = timed_generate(model, ids, 8)
        ttfts.append((n, ttft))
    said = ", ".join(f"{n}: {t * 1e3:.0f} ms" for n, t in ttfts)
    print(f"  warm_up {warm:.1f} s; time to first token by prompt length: {said}", flush=True)
    print(
        f"  after warm-up: {len(model._lowered) - lowered} new lowerings, "
        f"{dynamo_frames() - frames} new torch.compile frames",
        flush=True,
    )
    ROWS.append(
        f"| {name} new lengths | TTFT {min(t for _, t in ttfts) * 1e3:.0f}-"
        f"{max(t for _, t in ttfts) * 1e3:.0f} ms | lowerings "
        f"{len(model._lowered) - lowered} | frames {dynamo_frames() - frames} | warm_up "
        f"{warm:.0f} s |"
    )
    del model, weights
    torch.cuda.empty_cache()


def text_rows(dev: torch.device, tokens: int) -> None:
    from gpu_steps import periodic, train_copy_model
    from linnet.torch import load

    cfg = config("toy", V=64, D=256, F=512, NL=2, H=4, KV=2, HD=64, S=512, T="bf16")
    weights, accuracy = train_copy_model(dev, cfg, steps=1000)
    model = load(LLAMA, weights=weights, config=cfg, device=dev, numerics="fast")
    seqs = periodic(3, 40 + 1, cfg["V"], torch.Generator().manual_seed(7), periods=(7, 13))
    prompts = [seqs[0, :40].tolist(), seqs[1, :23].tolist(), seqs[2, :31].tolist()]
    fast = model.generate(prompts, tokens, stop_tokens=[])
    eager = model.generate(prompts, tokens, stop_tokens=[], fast=False)
    same = sum(a == b for a, b in zip(fast, eager))
    print(f"  copy model (accuracy {accuracy:.3f}): {same}/3 prompts identical", flush=True)
    ROWS.append(f"| trained copy model | {same}/3 prompts identical ({tokens} tokens) | | | |")
    try:
        from linnet.lang.host.demo_model import smollm2_gguf

        gguf = smollm2_gguf()
    except Exception as exc:
        ROWS.append(f"| SmolLM2-135M | not run: {str(exc)[:60]} | | | |")
        return
    smol = load("std.models.llama", weights=str(gguf), config={"S": 1024}, device=dev)
    texts = [
        "The capital of France is",
        "Write a short poem about the sea, in four lines, with a rhyme.",
        "List three facts about the planet Jupiter and explain each one briefly, in plain words.",
    ]
    if smol.tokenizer is None:
        ROWS.append("| SmolLM2-135M | not run: no tokenizer | | | |")
        return
    fast_text = smol.generate(texts, tokens)
    eager_text = smol.generate(texts, tokens, fast=False)
    same = sum(a == b for a, b in zip(fast_text, eager_text))
    print(f"  SmolLM2: {same}/3 texts identical; first: {fast_text[0][:120]!r}", flush=True)
    ROWS.append(f"| SmolLM2-135M (f32) | {same}/3 texts identical ({tokens} tokens) | | | |")


def main() -> None:
    args = parse()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), flush=True)
    for name in args.models.split(","):
        try:
            shape_rows(name, args, dev)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            ROWS.append(f"| {name} | failed: {str(exc)[:80]} | | | |")
    if not args.skip_text:
        try:
            text_rows(dev, 64)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            ROWS.append(f"| text | failed: {str(exc)[:80]} | | | |")
    print("\n| shape | generate ms/token | captured step ms/token | ratio | first call |")
    print("|---|---|---|---|---|")
    print("\n".join(ROWS))


if __name__ == "__main__":
    main()
