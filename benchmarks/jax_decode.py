"""The Llama decode step on JAX (linnet-runtime-jax) under jax.jit, against the floor and
(optionally) Linnet's PyTorch path, for the 1B and 8B shapes, bf16 random weights made on
the device.

    python3 benchmarks/jax_decode.py                       # on the H200: 1B and 8B
    python3 benchmarks/jax_decode.py --configs llama-3.2-1b --context 1024 --steps 64
    uv run python benchmarks/jax_decode.py --dry-run       # any machine: the toy config

Each config's decode entry is loaded with `load_function` (no checkpoint: the config gives
every dim, the parameters are `jax.random` bf16 arrays made by one jitted function on the
device). The cache holds `context + steps` positions; positions context..context+steps-1 are
decoded, the token fed back on the device (argmax) and the states donated from step to step;
each step is timed alone (`block_until_ready`), the median is reported. The floor is the
bytes one step must read (every weight once, plus the KV cache up to the position) over the
device's copy bandwidth measured in the same run (a jitted read-and-write of 1 GiB).

`--torch eager|compile` also times linnet.torch's generated source (`load(..., device="cuda")`
with random bf16 weights, `compile=True` for `compile`) on the same shapes, when torch and a
CUDA device are there. The table prints last; with $OUT set, the rows go to
$OUT/jax_decode.json too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
for src in (
    "packages/linnet-lang/src",
    "packages/linnet-runtime-jax/src",
    "packages/linnet-runtime-torch/src",
    "packages/linnet-plan/src",
):
    if (ROOT / src).is_dir() and str(ROOT / src) not in sys.path:
        sys.path.append(str(ROOT / src))  # installed wheels first; the checkout as a fallback

# jax takes 75% of the GPU at start by default; the torch rows need room beside it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from linnet.jax import load_function  # noqa: E402
from linnet.lang.cli import load_config  # noqa: E402


def copy_bandwidth(device: Any, gib: float) -> float:
    """Bytes per second of a jitted read-and-write of ``gib`` GiB on ``device``."""
    # f32 words, not bytes: a byte-wide add ran at a third of the copy bandwidth on the H200
    # (1472 GB/s where torch's copy measured 3941 in the same session).
    n = int(gib * (1 << 30)) // 4
    x = jax.device_put(jnp.zeros(n, jnp.float32), device)
    bump = jax.jit(lambda a: a + jnp.float32(1))
    for _ in range(3):
        x = bump(x)
    x.block_until_ready()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        x = bump(x)
        x.block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * 4 * n / min(times)


def random_params(graph: Any, device: Any, seed: int = 0) -> dict[str, Any]:
    """bf16 (or the graph's dtype) random parameters made on ``device``; norms are ones."""
    out = {}
    key = jax.random.PRNGKey(seed)
    with jax.default_device(device):  # made there: an 8B model never passes the host
        for i, (path, vt) in enumerate(sorted(graph.parameters.items())):
            dtype = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32}[vt.dtype]
            if path.endswith("norm.weight"):
                out[path] = jnp.ones(vt.shape, dtype)
            else:
                make = jax.jit(
                    lambda k, s=vt.shape, d=dtype: (
                        jax.random.normal(k, s, jnp.float32) * 0.02
                    ).astype(d)
                )
                out[path] = make(jax.random.fold_in(key, i))
    return out


def nbytes(arrays: Any) -> int:
    return sum(a.size * a.dtype.itemsize for a in arrays)


def time_jax(
    name: str, cfg: dict, context: int, steps: int, numerics: str, device: Any, bandwidth: float
) -> dict:
    decode = load_function(
        LLAMA, "decode", config=cfg, device=device, numerics=numerics, check=False
    )
    one = jax.device_put(jnp.zeros((1,), jnp.int32), device)
    low = decode.lowered([one, one])
    params = random_params(low.graph, device)
    states = decode.new_states([one, one])
    token = jax.device_put(jnp.asarray([1], jnp.int32), device)
    pos = jax.device_put(jnp.asarray([context], jnp.int32), device)
    start = time.perf_counter()
    (logits,), states = low.jitted(params, states, (token, pos))
    logits.block_until_ready()
    compile_s = time.perf_counter() - start
    pick = jax.jit(lambda lg: jnp.argmax(lg, axis=-1).astype(jnp.int32))
    times = []
    for i in range(steps):
        token = pick(logits)
        pos = jax.device_put(jnp.asarray([context + i], jnp.int32), device)
        token.block_until_ready()
        start = time.perf_counter()
        (logits,), states = low.jitted(params, states, (token, pos))
        logits.block_until_ready()
        times.append(time.perf_counter() - start)
    weights = nbytes(params.values())
    kv_row = sum(v.size // v.shape[1] * v.dtype.itemsize for v in states.values())
    floor = (weights + kv_row * (context + steps // 2)) / bandwidth
    ms = 1000 * statistics.median(times)
    # Pallas kernels the step launched (numerics fast, on a GPU: the std kernel-bound ops'
    # `RUNS` counters of the generated module), as "launched/instances".
    runs = getattr(low.module, "RUNS", {})
    pallas = f"{sum(1 for c in runs.values() if c[0])}/{len(runs)}"
    return dict(
        config=name,
        runtime=f"jax ({numerics})",
        ms=ms,
        floor_ms=1000 * floor,
        pallas=pallas,
        of_floor=floor * 1000 / ms,
        compile_s=compile_s,
        weights_gb=weights / 1e9,
        context=context,
        steps=steps,
    )


def time_torch(
    name: str, cfg: dict, context: int, steps: int, mode: str, bandwidth: float
) -> dict | None:
    try:
        import torch
        from linnet.torch import load, random_weights
    except ImportError as exc:
        print(f"linnet.torch not importable ({exc}): no torch rows", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("no CUDA for torch: no torch rows", file=sys.stderr)
        return None
    dev = torch.device("cuda")
    weights = random_weights(LLAMA, cfg, dtype=torch.bfloat16, device=dev)
    model = load(
        LLAMA, weights=weights, config=cfg, device=dev, compile=mode == "compile", numerics="fast"
    )
    token = torch.tensor([1], dtype=torch.int32, device=dev)
    with torch.inference_mode():
        for i in range(2):  # lowering and compiling
            model.decode(token, torch.tensor([context + i], dtype=torch.int32, device=dev))
        torch.cuda.synchronize()
        times = []
        for i in range(steps):
            pos = torch.tensor([context + i], dtype=torch.int32, device=dev)
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = model.decode(token, pos)
            token = logits.argmax(-1).to(torch.int32)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    wbytes = sum(t.numel() * t.element_size() for t in weights.values())
    ms = 1000 * statistics.median(times)
    del model, weights
    torch.cuda.empty_cache()
    return dict(
        config=name,
        runtime=f"torch generated ({mode}, fast)",
        ms=ms,
        floor_ms=float("nan"),
        of_floor=float("nan"),
        compile_s=float("nan"),
        weights_gb=wbytes / 1e9,
        context=context,
        steps=steps,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="llama-3.2-1b,llama-3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--numerics", default="fast,exact")
    ap.add_argument("--torch", choices=["none", "eager", "compile"], default="eager")
    ap.add_argument("--dry-run", action="store_true", help="the toy config, on any device")
    args = ap.parse_args()
    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.platform}: {device.device_kind}", flush=True)
    configs = ["toy"] if args.dry_run else args.configs.split(",")
    if args.dry_run:
        args.context, args.steps, args.torch = 8, 4, "none"
    bandwidth = copy_bandwidth(device, 0.0625 if args.dry_run or device.platform == "cpu" else 1.0)
    print(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s", flush=True)
    rows = []
    for name in configs:
        cfg = load_config(name, [], str(LLAMA))
        cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
        cfg["S"] = args.context + args.steps
        for numerics in args.numerics.split(","):
            try:
                rows.append(
                    time_jax(name, cfg, args.context, args.steps, numerics, device, bandwidth)
                )
                print(rows[-1], flush=True)
            except Exception as exc:  # one failing config never hides the others
                print(f"{name} jax {numerics}: {type(exc).__name__}: {exc}", flush=True)
        if args.torch != "none":
            try:
                row = time_torch(name, cfg, args.context, args.steps, args.torch, bandwidth)
                if row is not None:
                    row["floor_ms"] = rows[-1]["floor_ms"] if rows else float("nan")
                    row["of_floor"] = row["floor_ms"] / row["ms"]
                    rows.append(row)
                    print(row, flush=True)
            except Exception as exc:
                print(f"{name} torch: {type(exc).__name__}: {exc}", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "jax_decode.json").write_text(
            json.dumps(
                dict(
                    jax=jax.__version__, device=device.device_kind, bandwidth=bandwidth, rows=rows
                ),
                indent=1,
            )
        )
    print(
        f"\n{'config':14} {'runtime':30} {'ms/token':>9} {'floor ms':>9} {'of floor':>8} "
        f"{'compile s':>9} {'pallas':>7}"
    )
    for r in rows:
        print(
            f"{r['config']:14} {r['runtime']:30} {r['ms']:9.3f} {r['floor_ms']:9.3f} "
            f"{r['of_floor']:8.0%} {r['compile_s']:9.1f} {r.get('pallas', '-'):>7}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
