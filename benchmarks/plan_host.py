"""How long a plan's host-side analysis takes before anything is timed, phase by phase.

Not a test: a script that prints a table. On the GPU, planning an 8B-shaped paged decode step
(32 layers, every backend and Linnet's kernels) took 60-99 s a batch bucket, most of it the
host's analysis of the graph rather than compiling or timing (docs/benchmarks/serving.md):
the serving engine plans one step a bucket before it takes a request. This script runs the
same analysis on the CPU for the same graph shape (std.models.llama with 32 layers at the
toy model's dims, `decode_paged`; Triton's interpreter lets Linnet's kernels be claimed, and
no kernel is launched): the span claims, each backend's regions and executables (their
checks and generated modules), and the reference slices the check of each candidate reads.

    uv run python benchmarks/plan_host.py              # 3 repeats, 32 layers
    uv run python benchmarks/plan_host.py --layers 8 --repeats 1
    uv run python benchmarks/plan_host.py --profile    # cProfile of one run, top 30
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from linnet.backends import Options
from linnet.lang.ir.stepsets import indexed
from linnet.lang.passes.slices import slice_steps
from linnet.torch import load, random_weights
from linnet.torch.checking import References
from linnet.torch.plan_builder import PlanBuilder

STD_LLAMA = "std.models.llama"
PAGES, PAGE = 64, 16


def model_for(layers: int) -> object:
    config = {
        "V": 256, "D": 64, "F": 128, "NL": layers, "KV": 2, "G": 2, "HD": 16, "T": "f32",
        "S": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    }  # fmt: skip
    weights = random_weights(STD_LLAMA, config, seed=0)
    return load(
        STD_LLAMA,
        weights=weights,
        config=config,
        numerics="fast",
        kv_pages=PAGES,
        kv_page_size=PAGE,
    )


def phases(model: object, rows: int) -> dict[str, float]:
    """Seconds of each phase of one plan's analysis, on the CPU."""
    token = torch.ones(rows, dtype=torch.int32)
    pos = torch.full((rows,), 40, dtype=torch.int32)
    table = torch.zeros((rows, 16), dtype=torch.int32)
    table[:, :3] = torch.arange(1, 3 * rows + 1, dtype=torch.int32).reshape(rows, 3)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    builder = PlanBuilder(model, "decode_paged", [token, pos, table], Options(), False)
    ready = builder.probe([])
    out["lower"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ready += builder.kernel_paths()
    out["claims"] = time.perf_counter() - t0
    with indexed(builder.graph):  # as plan_for analyses the claimed graph
        t0 = time.perf_counter()
        candidates = builder.candidates(ready)
        out["candidates"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        live = [c for c in candidates if c.status != "failed"]
        references = References(builder)
        references.emit([c.region for c in live])
        for c in live:  # what each candidate's check reads: its steps' reference slice
            slice_steps(builder.graph, list(c.region.steps), "reference")
        out["references"] = time.perf_counter() - t0
    out["regions"] = len(live)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    model = model_for(args.layers)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(phases, model, args.rows)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        return
    runs = [phases(model, args.rows) for _ in range(args.repeats)]
    print(f"{args.layers} layers, {args.rows} rows, median of {args.repeats}")
    print("| phase | seconds |")
    print("|---|---|")
    for key in ("lower", "claims", "candidates", "references"):
        print(f"| {key} | {statistics.median(r[key] for r in runs):.2f} |")
    total = statistics.median(sum(v for k, v in r.items() if k != "regions") for r in runs)
    print(f"| total ({int(runs[0]['regions'])} regions) | {total:.2f} |")


if __name__ == "__main__":
    main()
