"""On a GPU: plans, `Captured` and CUDA-event timing with the reference backend.

1. Toy Llama (f32): plan_for with the reference linear backend, measured inside CUDA graphs;
   Captured against the unplanned generated source over 32 decode steps (logits and tokens).
2. Llama-3.2-1B and Llama-3-8B shapes (bf16, random weights), decode at positions 1024..:
   ms/token of the generated source eager, the same under Captured (one CUDA graph), and
   Captured over a measured plan with the reference backend; the bandwidth floor.
3. plan_for time for the 8B decode entry: cold (empty timing cache) and warm (cache on disk,
   a fresh model object).
Prints the tables last. Run by benchmarks/gpu.sh --plan on the device machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "linnet-runtime-torch" / "tests"))

from linnet.plan import TimingCache  # noqa: E402
from linnet.torch import load, random_weights  # noqa: E402
from linnet.torch.planned import Captured, plan_for  # noqa: E402
from reference_backends import RefLinear  # noqa: E402

LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
DEV = torch.device("cuda")
# LINNET_BENCH_QUICK=1: only the decode steps (generated and compile="default", Captured).
QUICK = bool(__import__("os").environ.get("LINNET_BENCH_QUICK"))
COMPILE = ("default",) if QUICK else ("default", "max-autotune-no-cudagraphs")


def config(name: str) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def i32(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int32, device=DEV)


def check_captured_toy() -> list[tuple]:
    cfg = config("toy")
    w = random_weights(LLAMA, cfg, seed=0, device=DEV)
    model = load(LLAMA, weights=w, config=cfg, device=DEV)
    plan = plan_for(
        model,
        "decode",
        [i32(0), i32(0)],
        backends=[RefLinear()],
        progress=False,
        cache=TimingCache(Path(tempfile.mkdtemp()) / "b.json"),
    )
    print(plan.explain())
    ctx = model.context_for(plan)
    ref_ctx = model.new_context("decode", [i32(0), i32(0)])
    prompt = torch.randint(0, cfg["V"], (1, 8), dtype=torch.int32, device=DEV)
    model.prefill(prompt, context=ctx)
    model.prefill(prompt, context=ref_ctx)
    step = Captured(plan, ctx)
    token, worst, same = 5, 0.0, 0
    for i in range(32):
        got = step([i32(token), i32(8 + i)])[0]
        want = model.run("decode", [i32(token), i32(8 + i)], context=ref_ctx)
        worst = max(worst, (got - want).abs().max().item())
        same += int(got.argmax()) == int(want.argmax())
        token = int(want.argmax())
    return [("toy f32", len(plan.regions), f"{worst:.2e}", f"{same}/32")]


def per_token(fn, steps: int = 48) -> float:
    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def decode_rows(name: str, with_plan: bool) -> list[tuple]:
    cfg = config(name)
    w = random_weights(LLAMA, cfg, seed=0, device=DEV)
    model = load(LLAMA, weights=w, config=cfg, device=DEV, numerics="fast")
    weight_bytes = sum(t.numel() * t.element_size() for t in w.values())
    ctx0 = 1024
    kv = 2 * cfg["NL"] * (ctx0 + 24) * cfg["KV"] * cfg["HD"] * 2
    prompt = torch.randint(0, cfg["V"], (1, ctx0), dtype=torch.int32, device=DEV)
    rows = []
    ctx = model.new_context("prefill", [prompt])
    model.prefill(prompt, context=ctx)
    rows.append(
        (
            name,
            "generated eager",
            per_token(lambda i: model.run("decode", [i32(1), i32(ctx0 + i)], context=ctx)),
        )
    )
    plan = plan_for(model, "decode", [i32(1), i32(ctx0)], backends=[], progress=False)
    pctx = model.context_for(plan)
    model.prefill(prompt, context=pctx)
    step = Captured(plan, pctx)
    rows.append((name, "generated, Captured", per_token(lambda i: step([i32(1), i32(ctx0 + i)]))))
    for mode in COMPILE:
        t0 = time.perf_counter()
        cplan = plan_for(
            model, "decode", [i32(1), i32(ctx0)], backends=[], compile=mode, progress=False
        )
        cctx = model.context_for(cplan)
        model.prefill(prompt, context=cctx)
        cstep = Captured(cplan, cctx)
        cstep([i32(1), i32(ctx0)])  # compiles
        took = time.perf_counter() - t0
        rows.append(
            (
                name,
                f"generated compile={mode!r}, Captured",
                per_token(lambda i, s=cstep: s([i32(1), i32(ctx0 + i)])),
            )
        )
        rows.append((name, f"compile={mode!r}: plan + first step (s)", took))
    if with_plan:
        cache = TimingCache(Path(tempfile.mkdtemp()) / "b.json")
        t0 = time.perf_counter()
        plan2 = plan_for(
            model,
            "decode",
            [i32(1), i32(ctx0)],
            backends=[RefLinear()],
            progress=False,
            cache=cache,
        )
        cold = time.perf_counter() - t0
        fresh = load(LLAMA, weights=w, config=cfg, device=DEV, numerics="fast")
        t0 = time.perf_counter()
        plan_for(
            fresh,
            "decode",
            [i32(1), i32(ctx0)],
            backends=[RefLinear()],
            progress=False,
            cache=TimingCache(cache.path),
        )
        warm = time.perf_counter() - t0
        print(plan2.explain().splitlines()[0])
        print("\n".join(plan2.explain().splitlines()[-3:]))
        ctx2 = model.context_for(plan2)
        model.prefill(prompt, context=ctx2)
        step2 = Captured(plan2, ctx2)
        rows.append(
            (
                name,
                f"ref backend ({len(plan2.regions)} regions), Captured",
                per_token(lambda i: step2([i32(1), i32(ctx0 + i)])),
            )
        )
        rows.append((name, "plan_for cold (s)", cold))
        rows.append((name, "plan_for warm (s)", warm))
    bw = 4.18e12
    rows.append((name, "floor (weights+KV / 4.18 TB/s)", (weight_bytes + kv) / bw))
    return rows


def main() -> None:
    toy = [] if QUICK else check_captured_toy()
    rows = decode_rows("llama-3.2-1b", with_plan=False) + decode_rows(
        "llama-3-8b", with_plan=not QUICK
    )
    print("\n| model | backend regions | Captured vs eager: max logit diff | same argmax |")
    print("|---|---|---|---|")
    for r in toy:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print("\n| shape | mode | ms/token (or s) |\n|---|---|---|")
    for name, mode, t in rows:
        val = f"{t:.3f} s" if "(s)" in mode else f"{t * 1e3:.3f}"
        print(f"| {name} | {mode} | {val} |")


if __name__ == "__main__":
    main()
