"""Paged KV cache decode steps on CUDA: the dense cache against pages, at serving batches.

    bash benchmarks/gpu.sh --paged [--batches 8,32,64] [--context 1024]

For the Llama-3-8B shape (std.models.llama, random bf16 weights, numerics "fast", every
available backend and Linnet's kernels): the model loaded with its dense `[B, S, KV, HD]`
cache and `decode` planned, then loaded with a page pool (`kv_pages`, 16 positions a page,
one page table row a sequence, its pages shuffled across the pool) and `decode_paged`
planned; each plan replayed as one CUDA graph (`Captured`), each step feeding its own argmax
at CONTEXT + i; ms/step over STEPS steps queued back to back (median of REPEATS). The ideal
is the bytes a step must read (every weight but the embedding table's unread rows, and each
sequence's K and V up to its position) over the copy bandwidth measured in this run. The
attention regions of each plan (which kernel or backend reads the cache) are printed. Mode
`hf` adds transformers' best decode step at the same batch and context in the same run
(gpu_steps.py's: StaticCache, compile max-autotune-no-cudagraphs, one CUDA graph).

End to end (prefill and decode of whole requests), two more modes: `engine` runs `batch`
requests of CONTEXT random prompt tokens and STEPS output tokens each through
`linnet.serve.Engine` (continuous batching, chunked prefill, the decode planned and captured
per batch bucket); `hf-generate` runs the same prompts as one padded batch through
transformers' `generate` (StaticCache, which transformers compiles itself). Both report
output tokens a second over the wall time of the whole batch (median of REPEATS after a
warm-up run). Mode `load` drives the Engine with benchmarks/serve_load.py's load generator in
this process (`--load-requests` requests at `--rate` a second, Poisson arrivals, log-normal
prompt and output lengths around `--prompt-median` and `--output-median` tokens, random
token ids): throughput, time to first token and inter-token latency percentiles, after one
warm-up load of a few requests; mode `warm` only warms the engine (`--progress`: each planning
line with the seconds since the engine's start). `--profile` adds each step's kernels (torch.profiler over 8
replays at the context): where the microseconds go. A table comes last.
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
from torch_decode import copy_bandwidth

ROWS: list[str] = []
PROFILES: list[str] = []
PAGE = 16
# Llama-3-8B (examples/llama/configs/llama-3-8b.json), as std.models.llama's generics.
SHAPE = {
    "V": 128256, "D": 4096, "F": 14336, "NL": 32, "KV": 8, "G": 4, "HD": 128, "T": "bf16",
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}  # fmt: skip


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="8,32,64")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="hf,dense,paged")
    p.add_argument(
        "--compile",
        default="none",
        help="torch.compile of the generated slices between regions: none, default (inductor's "
        "default mode) or a mode such as max-autotune-no-cudagraphs",
    )
    p.add_argument(
        "--profile", action="store_true", help="each step's kernels (torch.profiler, 8 replays)"
    )
    p.add_argument(
        "--progress", action="store_true", help="the engine's planning progress (stderr)"
    )
    p.add_argument(
        "--buckets", help="engine: the decode steps' batch sizes, e.g. 8,16,32 (default: 1, 2, 4..)"
    )
    p.add_argument("--token-budget", type=int, default=2048, help="engine: prefill tokens a step")
    p.add_argument("--rate", type=float, default=16.0, help="load: requests a second")
    p.add_argument("--load-requests", type=int, default=128)
    p.add_argument("--prompt-median", type=float, default=512.0)
    p.add_argument("--output-median", type=float, default=128.0)
    return p.parse_args()


def step_bytes(model: Any, cfg: dict, batch: int, context: int) -> int:
    """Weights (the embedding's ``batch`` rows only) plus K and V up to ``context``."""
    total = 0
    for name, p in model.params.items():
        if name.endswith("embed_tokens.weight"):
            total += batch * p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total + 2 * cfg["NL"] * batch * context * cfg["KV"] * cfg["HD"] * 2


def stepper(cap: Any, extra: list[torch.Tensor], batch: int, context: int) -> Any:
    """``step(token, i)``: one replay at position ``context + i``, fed its own argmax."""

    def step(token: torch.Tensor, i: int) -> torch.Tensor:
        pos = torch.full((batch,), context + i, dtype=torch.int32)
        return cap([token, pos, *extra])[0].argmax(-1).to(torch.int32)

    return step


def timed(cap: Any, extra: list[torch.Tensor], batch: int, context: int, steps: int) -> float:
    token = torch.ones(batch, dtype=torch.int32, device="cuda")
    step = stepper(cap, extra, batch, context)
    for i in range(4):
        token = step(token, i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        token = step(token, i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def hf_row(batch: int, args: argparse.Namespace) -> float | None:
    """transformers' best batched decode step (ms) at ``batch`` and the context, or None."""
    import gpu_steps

    gpu_steps.BATCH, gpu_steps.CONTEXT, gpu_steps.STEPS = batch, args.context, args.steps
    gpu_steps.CACHE = args.context + args.steps + 16
    gpu_steps.HF_BEST_ONLY = True
    rows: list[tuple[str, str, Any]] = []
    gpu_steps.hf_rows("llama-3-8b", torch.device("cuda"), rows)
    torch.cuda.empty_cache()
    return rows[-1][2][0] if rows else None


def compile_of(args: argparse.Namespace) -> Any:
    """``load``'s ``compile=`` for ``--compile``."""
    return {"none": False, "default": True}.get(args.compile, args.compile)


def prompts_for(batch: int, args: argparse.Namespace, run: int = 0) -> torch.Tensor:
    """``batch`` random prompts of the context's length; another ``run``, other prompts."""
    gen = torch.Generator().manual_seed(100 + batch + 1000 * run)
    return torch.randint(0, SHAPE["V"], (batch, args.context), generator=gen)


def end_to_end(
    label: str, run: Any, batch: int, args: argparse.Namespace, warmed: Any = None
) -> None:
    """Time ``run()`` (a whole batch of requests) after one warm-up (then ``warmed()``);
    a table row."""
    t0 = time.perf_counter()
    run()  # warm: compiles, plans, captures
    print(f"8B B={batch} {label}: warm-up {time.perf_counter() - t0:.1f} s", flush=True)
    if warmed is not None:
        warmed()
    times = []
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    rate = batch * args.steps / seconds
    each = ", ".join(f"{t:.2f}" for t in times)
    print(
        f"8B B={batch} {label}: {seconds:.2f} s for the batch (runs {each} s), {rate:.0f} output "
        "tok/s",
        flush=True,
    )
    ROWS.append(f"| {batch} | {label} (end to end) | | {rate:.0f} | | | |")


def hf_generate_row(batch: int, args: argparse.Namespace) -> None:
    """transformers' batched generation of the prompts: one padded batch, StaticCache."""
    import gpu_steps

    cfg = gpu_steps.config("llama-3-8b", S=args.context + args.steps + 16)
    hf, _, _ = gpu_steps.hf_model(gpu_steps.hf_config(cfg), torch.device("cuda"), batch)
    prompt = prompts_for(batch, args).cuda()

    def run() -> None:
        with torch.no_grad():
            hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=args.steps,
                min_new_tokens=args.steps,
                do_sample=False,
                pad_token_id=0,
                cache_implementation="static",
            )

    end_to_end("transformers generate (StaticCache)", run, batch, args)


def timed_calls(runner: Any, names: tuple[str, ...]) -> dict[str, list[float]]:
    """Wrap ``runner``'s methods ``names`` to record each call's seconds (the device
    synchronised after it): where an engine's wall time goes, prefill or decode."""
    spent: dict[str, list[float]] = {}

    def wrap(name: str) -> None:
        inner = getattr(runner, name)

        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*args)
            torch.cuda.synchronize()
            spent.setdefault(name, []).append(time.perf_counter() - t0)
            return out

        setattr(runner, name, call)

    for name in names:
        wrap(name)
    return spent


def spent_line(spent: dict[str, list[float]]) -> str:
    """Each wrapped method's calls: count, total, median and the longest."""
    return ", ".join(
        f"{name} {len(times)} calls {sum(times):.2f} s (median "
        f"{statistics.median(times) * 1e3:.1f} ms, longest {max(times) * 1e3:.1f} ms)"
        for name, times in spent.items()
    )


def prefill_rows(model: Any, pages: int, batch: int, args: argparse.Namespace) -> None:
    """Mode ``prefill``: the engine's prefill calls alone, each shape twice (the first plans
    and captures or compiles; the second is the steady cost): a whole batch of prompts in
    chunks of the token budget, then the one-token tail a prefix-cache hit leaves."""
    from linnet.serve.runner import ModelRunner

    runner = ModelRunner(model, pages, PAGE, max_batch=batch)
    mp = -(-(args.context + args.steps + 16) // PAGE)
    rows = min(batch, max(1, args.token_budget // args.context))
    gen = torch.Generator().manual_seed(7)
    cases = [
        (f"{rows} rows x {args.context}", [args.context] * rows, [0] * rows),
        (f"{batch} rows x 1 after {args.context - 1}", [1] * batch, [args.context - 1] * batch),
    ]
    for label, lengths, starts in cases:
        tables = [list(range(1 + b * mp, 1 + (b + 1) * mp)) for b in range(len(lengths))]
        tokens = [torch.randint(0, SHAPE["V"], (n,), generator=gen).tolist() for n in lengths]
        for attempt in ("first", "second"):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runner.prefill(tokens, starts, tables)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            kinds = {k: type(v).__name__ for k, v in runner.prefills.items()}
            print(f"8B prefill {label}, {attempt} call: {ms:.1f} ms; steps {kinds}", flush=True)
            ROWS.append(
                f"| {len(lengths)} | prefill {label}, {attempt} call: {ms:.1f} ms | | | | | |"
            )


def largest_tensors(count: int = 12) -> None:
    """The device memory in use and the largest live CUDA tensors (shape, dtype, and the
    types of the objects holding them): what a warm engine keeps."""
    import gc

    before = torch.cuda.memory_allocated()
    found = gc.collect()
    print(
        f"device memory before a garbage collection: {before / 2**30:.1f} GiB; it found "
        f"{found} objects",
        flush=True,
    )
    seen: dict[int, tuple[int, torch.Tensor]] = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.is_cuda:
            try:
                storage = o.untyped_storage()
                seen.setdefault(storage.data_ptr(), (storage.nbytes(), o))
            except RuntimeError:  # a fake tensor (inductor's tracing): no memory of its own
                continue
    total = sum(n for n, _ in seen.values())
    print(
        f"device memory: {torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated, "
        f"{total / 2**30:.1f} GiB in {len(seen)} live tensors",
        flush=True,
    )
    by_shape: dict[tuple[Any, ...], list[int]] = {}
    for n, t in seen.values():
        holders = sorted({type(r).__name__ for r in gc.get_referrers(t)} - {"list", "frame"})
        key = (tuple(t.shape), str(t.dtype), ",".join(holders[:4]))
        by_shape.setdefault(key, []).append(n)
    rows = sorted(by_shape.items(), key=lambda kv: -sum(kv[1]))[:count]
    for (shape, dtype, holders), sizes in rows:
        print(
            f"  {sum(sizes) / 2**30:6.2f} GiB: {len(sizes)} x {list(shape)} {dtype} ({holders})",
            flush=True,
        )


def serving_rows(model: Any, pages: int, batch: int, args: argparse.Namespace) -> None:
    """The batch's requests through linnet.serve's Engine on the loaded paged model (mode
    ``engine``), then the load generator's arrivals on the same engine (mode ``load``): one
    engine, so the second mode reuses the first's plans and captured steps."""
    from linnet.serve.engine import Engine
    from linnet.serve.runner import ModelRunner

    modes = args.modes.split(",")
    start = time.perf_counter()

    def stamped(line: str) -> None:
        # Planning progress with the seconds since the engine's start and the device memory
        # in use: where warm-up's time and memory go.
        gib = torch.cuda.memory_allocated() / 2**30
        print(
            f"[{time.perf_counter() - start:7.1f} s {gib:5.1f} GiB] {line}",
            file=sys.stderr,
            flush=True,
        )

    buckets = getattr(args, "buckets", None)  # callers' namespaces may predate --buckets
    runner = ModelRunner(
        model,
        pages,
        PAGE,
        max_batch=batch,
        progress=stamped if args.progress else False,
        batch_buckets=[int(b) for b in buckets.split(",")] if buckets else None,
    )
    spent = timed_calls(runner, ("prefill", "decode"))
    engine = Engine(
        runner,
        max_batch=batch,
        token_budget=args.token_budget,
        max_queue=max(4 * batch, args.load_requests),
    )
    t0 = time.perf_counter()
    engine.warm(lambda line: print(f"8B B={batch} warm: {line}", flush=True))
    print(f"8B B={batch} Engine.warm: {time.perf_counter() - t0:.1f} s", flush=True)
    if args.progress:
        largest_tensors()
    spent.clear()
    if "engine" in modes:
        runs = iter(range(1, 1_000))

        def run() -> None:
            # New prompts each run: the same ones again would come from the prefix cache
            # (all but their last page), a lighter and differently shaped workload than the
            # warm-up's, whose first prefill shapes would then be planned inside a timed run.
            prompts = prompts_for(batch, args, next(runs)).tolist()
            engine.generate(prompts, max_tokens=args.steps, stop_tokens=[])

        end_to_end("linnet.serve Engine", run, batch, args, spent.clear)
        print(f"8B B={batch} Engine, {args.repeats} runs: {spent_line(spent)}", flush=True)
    if "load" not in modes:
        return
    import asyncio

    import serve_load

    longest = args.context + args.steps  # what the cache holds a sequence
    load = argparse.Namespace(
        requests=args.load_requests,
        rate=args.rate,
        prompt_median=args.prompt_median,
        prompt_max=longest // 2,
        output_median=args.output_median,
        output_max=longest // 2,
        seed=0,
    )
    warm = argparse.Namespace(**{**vars(load), "requests": 2 * batch, "rate": 1000.0})
    engine.start()
    try:
        t0 = time.perf_counter()
        asyncio.run(serve_load.run_engine(warm, engine, SHAPE["V"]))  # plans and captures
        print(f"8B max batch {batch} load: warm-up {time.perf_counter() - t0:.1f} s", flush=True)
        spent.clear()
        report = asyncio.run(serve_load.run_engine(load, engine, SHAPE["V"]))
    finally:
        engine.close()
    print(f"8B max batch {batch} load: {report}; {spent_line(spent)}", flush=True)
    ROWS.append(
        f"| {batch} | load {load.requests} req at {load.rate}/s: "
        f"TTFT p50 {report['ttft_ms_p50']} p99 {report['ttft_ms_p99']} ms, "
        f"ITL p50 {report['itl_ms_p50']} p99 {report['itl_ms_p99']} ms | | "
        f"{report['output_tokens_per_second']} | | | |"
    )


def rows_for(batch: int, args: argparse.Namespace, bw: float) -> None:
    from linnet.lang.syntax.program import model_file
    from linnet.torch import load, random_weights
    from linnet.torch.planned import Captured

    llama = model_file("std.models.llama")
    seq = args.context + args.steps + 16
    cfg = {**SHAPE, "H": SHAPE["KV"] * SHAPE["G"], "S": seq, "B": batch}
    weights = random_weights(llama, cfg, seed=0, device="cuda")
    mp = -(-seq // PAGE)
    gen = torch.Generator().manual_seed(batch)
    # Every sequence's pages, shuffled across the pool (page 0 is the sink).
    order = torch.randperm(batch * mp, generator=gen) + 1
    table = order.reshape(batch, mp).to(torch.int32)
    dense_ms = None
    modes = args.modes.split(",")
    steps = [m for m in modes if m in ("dense", "paged")]
    if {"engine", "load", "warm"} & set(modes):
        steps.append("serving")
    if "prefill" in modes:
        steps.append("prefill")
    for mode in steps:
        paged = mode != "dense"
        # A pool with room for every sequence's positions, and the sink page.
        pages = batch * mp + 1
        extra = dict(kv_pages=pages, kv_page_size=PAGE) if paged else {}
        t0 = time.perf_counter()
        # The engine runs its batch buckets (1, 2, 4, ..): the batch stays free there.
        serving = mode in ("serving", "prefill")
        model = load(
            llama,
            weights=weights,
            config={k: v for k, v in cfg.items() if k != "B"} if serving else cfg,
            device="cuda",
            numerics="fast",
            compile=compile_of(args),
            **extra,
        )
        if serving:
            (prefill_rows if mode == "prefill" else serving_rows)(model, pages, batch, args)
            del model
            torch.cuda.empty_cache()
            continue
        load_s = time.perf_counter() - t0
        one = torch.ones(batch, dtype=torch.int32)
        # Planned where it runs: attention's cost follows the positions it reads.
        at = torch.full((batch,), args.context, dtype=torch.int32)
        inputs = [one, at, table] if paged else [one, at]
        t0 = time.perf_counter()
        plan = model.plan_for(
            "decode_paged" if paged else "decode",
            inputs,
            captured=True,
            progress=False,
            compile=compile_of(args) or None,
        )
        plan_s = time.perf_counter() - t0
        cap = Captured(plan, model.context_for(plan))
        # The table on the host, as the serving engine gives it: backends that plan on the
        # host (FlashInfer) read it there.
        more = [table] if paged else []
        ms = (
            statistics.median(
                timed(cap, more, batch, args.context, args.steps) for _ in range(args.repeats)
            )
            * 1e3
        )
        ideal = step_bytes(model, cfg, batch, args.context) / bw * 1e3
        if args.profile:
            from gpu_steps import kernel_table, replays_profiled

            token = torch.ones(batch, dtype=torch.int32, device="cuda")
            events, wall = replays_profiled(stepper(cap, more, batch, args.context), token)
            PROFILES.append(f"\n8B B={batch} {mode}: {ms:.3f} ms/step, ideal {ideal:.3f}\n")
            PROFILES.extend(kernel_table(events, 8, wall * 1e3, top=16))
        dense_ms = ms if not paged else dense_ms
        ratio = f"{dense_ms / ms:.2f}x" if dense_ms and paged else ""
        explained = plan.explain()
        out_dir = Path(os.environ.get("OUT", "gpu-results"))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"paged-plan-b{batch}-{mode}.txt").write_text(explained)
        attn = [ln.strip() for ln in explained.splitlines() if "attention" in ln][:2]
        print(
            f"8B B={batch} {mode}: {ms:.3f} ms/step ({batch / ms * 1e3:.0f} tok/s), ideal "
            f"{ideal:.3f} ({ideal / ms:.0%} of it), load {load_s:.1f} s, plan {plan_s:.1f} s; "
            f"{'; '.join(attn)}",
            flush=True,
        )
        ROWS.append(
            f"| {batch} | {mode} | {ms:.3f} | {batch / ms * 1e3:.0f} | {ideal:.3f} | "
            f"{ideal / ms:.0%} | {ratio} |"
        )
        del model, plan, cap
        torch.cuda.empty_cache()
    # transformers last: Linnet's rows come first if the call runs out of time.
    del weights
    import gc

    gc.collect()  # the engine's captured graphs and their pools
    torch.cuda.empty_cache()
    if "hf-generate" in modes:
        hf_generate_row(batch, args)
    if "hf" in modes:
        ms = hf_row(batch, args)
        torch.cuda.empty_cache()
        if ms is not None:
            ROWS.append(
                f"| {batch} | transformers (best) | {ms:.3f} | {batch / ms * 1e3:.0f} | | | |"
            )


def main() -> None:
    args = parse()
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}", flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        try:
            rows_for(batch, args, bw)
        except Exception as exc:  # one batch's failure is reported; the rest still run
            import traceback

            traceback.print_exc()
            ROWS.append(f"| {batch} | failed: {str(exc)[:80]} | | | | | |")
    print("\n".join(PROFILES))
    print(
        f"\nLlama-3-8B shape, context {args.context}, pages of {PAGE}, {bw / 1e12:.2f} TB/s, "
        f"compile {args.compile}"
    )
    print("| batch | cache | ms/step | tok/s | ideal ms | of ideal | dense / paged |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(ROWS))


if __name__ == "__main__":
    main()
