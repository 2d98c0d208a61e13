"""On an H200: start-up cost of a planned decode with a cold and a warm $LINNET_HOME.

Issue 15's "Second-process start": for each model shape (Llama-3.2-1B, Llama-3-8B; random bf16
weights made on the GPU as benchmarks/gpu_steps.py makes them, a cache of 1152 positions),
two fresh processes share one new $LINNET_HOME, the first on an empty one. Each times
`load` -> `plan_for("decode", compile=max-autotune-no-cudagraphs, backends=the installed
plugins)` -> the first token of a `Captured` decode step at position 1024 (synchronised): the
cold process compiles, autotunes and times every region kind; the warm one should reuse
inductor's FX graphs and autotuning, Triton's kernels (both under $LINNET_HOME/cache) and
the planner's timings ($LINNET_HOME/benchmarks.json). TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR are removed from the children's environment, so that Linnet places them.
FlashInfer's JIT cache (FLASHINFER_WORKSPACE_BASE) is not under $LINNET_HOME: gpu.sh warms it
before, so both processes find it warm and the difference is Linnet's and torch.compile's.

    python3 benchmarks/gpu_start.py [--models llama-3.2-1b,llama-3-8b] [--compile MODE]
                                    [--no-plugins]

Run by `bash benchmarks/gpu.sh --start` (installed wheels from dist/, plugins from .whl/).
Both shapes take about 5 minutes (8B cold: ~2 min). The table is printed last; JSON in
$OUT/start.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MAT = "max-autotune-no-cudagraphs"
# Variables a child must not inherit: Linnet puts these caches under $LINNET_HOME itself.
PLACED = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def child(name: str, compile: Any, plugins: bool, device: str) -> dict:
    """One process's start: seconds for each phase, and what its progress lines said."""
    t_start = time.perf_counter()
    import torch

    sys.path.insert(0, str(HERE))
    from gpu_flashinfer import LLAMA, config
    from gpu_steps import CACHE, CONTEXT, cpu_i32, first
    from linnet.torch import load, random_weights
    from linnet.torch.planned import Captured, plan_for

    backends: list[Any] = []
    names = []
    if plugins:
        for module, cls in (
            ("linnet.torch.cublaslt", "CublasLt"),
            ("linnet.torch.flashinfer", "FlashInfer"),
        ):
            try:
                backends.append(getattr(__import__(module, fromlist=[cls]), cls)())
                names.append(cls)
            except ImportError as exc:
                print(f"  (no {cls}: {exc})", file=sys.stderr)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = config(name, S=CACHE)
    weights = random_weights(LLAMA, cfg, seed=0, device=dev)
    sync()
    t_imported = time.perf_counter()
    said: list[str] = []

    def progress(line: str) -> None:
        said.append(line)
        if not line.startswith("linnet: timing regions"):
            print(
                f"  [{time.perf_counter() - t_imported:6.1f} s] {line}", file=sys.stderr, flush=True
            )

    t0 = time.perf_counter()
    model = load(LLAMA, weights=dict(weights), config=cfg, device=dev, numerics="fast")
    t_load = time.perf_counter()
    plan = plan_for(
        model,
        "decode",
        [cpu_i32(1), cpu_i32(CONTEXT)],
        backends=backends,
        compile=compile,
        progress=progress,
    )
    t_plan = time.perf_counter()
    ctx = model.context_for(plan)
    # Captured (one CUDA graph) is how a planned decode runs on the GPU; on the CPU (a dry
    # run of this script) the plan runs step by step.
    step = Captured(plan, ctx) if cuda else (lambda inputs: plan.run(inputs, ctx))
    token = torch.ones(1, dtype=torch.int32, device=dev)
    logits = first(step([token, cpu_i32(CONTEXT)]))
    token = logits.argmax(-1).to(torch.int32)
    sync()
    t_first = time.perf_counter()
    taken: dict[str, int] = {}
    for c in plan.regions:
        taken[c.backend.name] = taken.get(c.backend.name, 0) + 1
    return {
        "model": name,
        "compile": compile,
        "backends": names,
        "imports_and_weights_s": t_imported - t_start,
        "load_s": t_load - t0,
        "plan_s": t_plan - t_load,
        "first_token_s": t_first - t_plan,
        "total_s": t_first - t0,
        "slices_compiled": sum(1 for m in said if m.startswith("compiled ")),
        "slices_reused": sum(
            1 for m in said if m.startswith("reused ") and " region kinds " not in m
        ),
        "regions_timed": sum(1 for m in said if m.startswith("compiling Region(")),
        "timings": next((m for m in said if " region kinds " in m), ""),
        "taken": taken,
        "token": int(token.item()),
    }


def run(name: str, linnet_home: Path, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PLACED}
    env["LINNET_HOME"] = str(linnet_home)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--compile",
        args.compile,
        "--device",
        args.device,
    ]
    if args.no_plugins:
        cmd.append("--no-plugins")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, timeout=1200)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{name}: the child failed with {done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", default="llama-3.2-1b,llama-3-8b")
    parser.add_argument("--compile", default=MAT, help="compile= of the plan (a mode)")
    parser.add_argument(
        "--no-plugins", action="store_true", help="plan without CublasLt and FlashInfer"
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda; cpu only as a dry run (--models toy --compile default)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(child(args.child, args.compile, not args.no_plugins, args.device)),
            flush=True,
        )
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    what = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"{what}, torch {torch.__version__}; compile={args.compile}", flush=True)
    results = []
    for name in args.models.split(","):
        linnet_home = Path(tempfile.mkdtemp(prefix=f"linnet-start-{name}-"))
        pair = {}
        for phase in ("cold", "warm"):
            print(f"\n== {name}, {phase} $LINNET_HOME ({linnet_home})", flush=True)
            try:
                pair[phase] = run(name, linnet_home, args)
            except Exception as exc:  # each shape on its own
                print(f"FAILED: {exc}", flush=True)
                break
            r = pair[phase]
            print(
                f"  load {r['load_s']:.1f} s, plan {r['plan_s']:.1f} s, first token "
                f"{r['first_token_s']:.1f} s: {r['total_s']:.1f} s; slices compiled "
                f"{r['slices_compiled']}, reused {r['slices_reused']}; regions timed "
                f"{r['regions_timed']}; {r['timings'] or 'no timings reused'}",
                flush=True,
            )
        results.append({"model": name, **pair})
    rows = [
        "| shape | cold s | warm s | cold / warm | warm: load / plan / first token s | "
        "warm: slices reused / compiled | regions taken |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cold, warm = r.get("cold"), r.get("warm")
        if not cold or not warm:
            rows.append(
                f"| {r['model']} | {cold['total_s'] if cold else 'failed'} | failed | | | | |"
            )
            continue
        taken = ", ".join(f"{k} {v}" for k, v in sorted(warm["taken"].items())) or "none"
        rows.append(
            f"| {r['model']} | {cold['total_s']:.1f} | {warm['total_s']:.1f} | "
            f"{cold['total_s'] / warm['total_s']:.1f}x | {warm['load_s']:.1f} / "
            f"{warm['plan_s']:.1f} / {warm['first_token_s']:.1f} | "
            f"{warm['slices_reused']} / {warm['slices_compiled']} | {taken} |"
        )
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "start.json").write_text(json.dumps(results, indent=1))
    print(
        f"\n== start-up, load -> first planned decode token (compile={args.compile}, "
        f"{', '.join(results[0].get('cold', {}).get('backends', [])) or 'no plugins'})"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
