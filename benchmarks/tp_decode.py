"""Tensor parallelism (issue 21): the decode step at TP 1, 2, 4 against each rank's floor.

    python benchmarks/tp_decode.py --config llama-3-8b --tp 1,2,4 --context 1024
    python benchmarks/tp_decode.py --config llama-3-70b --tp 2,4 --blocks    # 70B: see below
    python benchmarks/tp_decode.py --config toy --device cpu --tp 1,2 --steps 8   # a smoke run

For each TP size it starts that many ranks (torch.multiprocessing; NCCL on CUDA, gloo on the
CPU), each loading the model with ``load(..., world=TP)`` from the same random weights
(made on each rank's device, then cut to its blocks), prefills ``--context`` tokens and
times ``--steps`` decode steps one by one (synchronised; median): the generated source
eagerly, and the same plan under ``Captured`` (one CUDA graph with the NCCL collectives
inside; its failure is reported, not fatal). Logits of rank 0 are checked against TP 1's.
The floor is the bytes one rank must read in a step (its weight blocks and its KV cache up
to the position) over the copy bandwidth measured on that rank. Writes JSON to $OUT if set;
prints a table last.

``--blocks`` makes each rank's random blocks directly instead of a whole random model cut
down (a 70B model in bf16, 141 GB, fits no single H200): logits are then not comparable
between TP sizes (``|dlogits|`` is left out). ``--config`` is a name in
examples/llama/configs/ or a JSON file (``llama-3-70b``: give one with V 128256, D 8192,
F 28672, NL 80, H 64, KV 8, HD 128).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_decode import DTYPES, copy_bandwidth, sync  # noqa: E402


def rank_blocks(cfg: dict, tp: int, device: torch.device):
    """A model of this rank's random blocks, made on its device (never the whole model)."""
    from linnet.lang import Program, lower
    from linnet.torch.model import Model
    from linnet.torch.parallel import init, layout_of, parameter_axes

    program = Program.from_file(LLAMA)
    rank, _ = init(tp, device) if tp > 1 else (0, device)
    graph = lower(program, "decode", {"token": [1], "pos": [1]}, cfg)
    axes = parameter_axes(program, cfg, None, tp, rank) if tp > 1 else {}
    blocks = layout_of(axes, tp, rank, {p: vt.shape for p, vt in graph.parameters.items()})
    gen = torch.Generator(device).manual_seed(rank)
    params = {}
    for path, vt in graph.parameters.items():
        shape = list(vt.shape)
        if path in blocks:
            axis, a, b = blocks[path]
            shape[axis] = b - a
        t = torch.empty(shape, dtype=DTYPES[vt.dtype], device=device)
        params[path] = (
            t.fill_(1.0) if path.endswith("norm.weight") else t.normal_(0.0, 0.02, generator=gen)
        )
    return Model(
        program, params, cfg, device, False, "exact", False, None, None, False, tp, rank, axes
    )


def rank_main(rank: int, tp: int, port: int, opts: dict, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(tp),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch.distributed as dist
    from linnet.lang.cli import load_config
    from linnet.torch import load, random_weights
    from linnet.torch.planned import Captured

    cuda = opts["device"] == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:  # as torchrun does: the ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    cfg = load_config(opts["config"], [], str(LLAMA))
    cfg["S"] = max(cfg.get("S", 0), opts["context"] + opts["steps"] + 1)
    if opts["blocks"]:
        model = rank_blocks(cfg, tp, device)
    else:
        weights = random_weights(LLAMA, cfg, seed=0, dtype=DTYPES[cfg["T"]], device=device)
        model = load(
            LLAMA, weights=weights, config=cfg, device=device, world=tp if tp > 1 else None
        )
        del weights
    if cuda:
        torch.cuda.empty_cache()
    prompt = torch.ones(1, opts["context"], dtype=torch.int32, device=device)
    ctx = model.new_context("prefill", [prompt])
    model.prefill(prompt, context=ctx)
    token = torch.tensor([1], dtype=torch.int32, device=device)
    times, logits = [], None
    for i in range(opts["steps"]):
        pos = torch.tensor([opts["context"] + i], dtype=torch.int32, device=device)
        sync(device)
        start = time.perf_counter()
        logits = model.decode(token, pos, context=ctx)
        sync(device)
        times.append(time.perf_counter() - start)
    captured, captured_error = None, ""
    if cuda:
        try:
            plan = model.plan_for(
                "decode", [token, token], backends=[], measure=False, progress=False
            )
            pctx = model.context_for(plan)
            step = Captured(plan, pctx)
            ctimes = []
            for i in range(opts["steps"]):
                pos = torch.tensor([opts["context"] + i], dtype=torch.int32)
                sync(device)
                start = time.perf_counter()
                step([token, pos])
                sync(device)
                ctimes.append(time.perf_counter() - start)
            captured = statistics.median(ctimes[2:] or ctimes)
        except Exception as exc:  # reported in the table: the capture is what is measured
            captured_error = f"{type(exc).__name__}: {str(exc)[:160]}"
    weight_bytes = sum(t.numel() * t.element_size() for t in model.params.values())
    graph = model.graph("decode", [token, token])
    cache_bytes = sum(
        vt.shape[0]
        * (opts["context"] + opts["steps"] // 2)
        * (vt.shape[2] * vt.shape[3])
        * DTYPES[cfg["T"]].itemsize
        for vt in graph.states.values()
    )
    bw = copy_bandwidth(device)
    row = {
        "tp": tp,
        "rank": rank,
        "median_ms": 1e3 * statistics.median(times[1:] or times),
        "captured_ms": None if captured is None else 1e3 * captured,
        "captured_error": captured_error,
        "weight_bytes_per_rank": weight_bytes,
        "cache_bytes_per_rank": cache_bytes,
        "bandwidth": bw,
        "floor_ms": 1e3 * (weight_bytes + cache_bytes) / (bw / 2),
        "logits": logits.float().cpu()[0, :64].tolist() if logits is not None else [],
    }
    if rank == 0:
        Path(out).write_text(json.dumps(row))
    if tp > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="llama-3-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument(
        "--blocks",
        action="store_true",
        help="make each rank's random blocks directly (models that fit no GPU)",
    )
    args = ap.parse_args()
    import torch.multiprocessing as mp
    from linnet.torch.parallel import free_port

    sizes = [int(t) for t in args.tp.split(",")]
    if args.device == "cuda":
        sizes = [n for n in sizes if n <= torch.cuda.device_count()]
    opts = {
        "config": args.config,
        "device": args.device,
        "context": args.context,
        "steps": args.steps,
        "blocks": args.blocks,
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tp in sizes:
            out = f"{tmp}/tp{tp}.json"
            mp.spawn(rank_main, args=(tp, free_port(), opts, out), nprocs=tp, join=True)
            rows.append(json.loads(Path(out).read_text()))
    base = torch.tensor(rows[0]["logits"])
    for r in rows:
        r["logits_vs_tp1"] = (
            None if args.blocks else float((torch.tensor(r["logits"]) - base).abs().max())
        )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "config": args.config,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "context": args.context,
        "rows": rows,
    }
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "tp_decode.json").write_text(json.dumps(result, indent=1))
    print(
        f"{args.config} decode at position {args.context}, {result['gpu']}, "
        f"torch {torch.__version__}"
    )
    print(
        f"{'TP':>3} {'eager ms':>9} {'captured ms':>12} {'floor ms':>9} {'x floor':>8} "
        f"{'GB/rank':>8} {'|dlogits|':>10}"
    )
    for r in rows:
        best = r["captured_ms"] or r["median_ms"]
        cap = (
            f"{r['captured_ms']:.3f}"
            if r["captured_ms"]
            else ("failed" if r["captured_error"] else "-")
        )
        print(
            f"{r['tp']:>3} {r['median_ms']:>9.3f} {cap:>12} {r['floor_ms']:>9.3f} "
            f"{best / r['floor_ms']:>8.2f} {r['weight_bytes_per_rank'] / 1e9:>8.2f} "
            + (f"{r['logits_vs_tp1']:>10.2e}" if r["logits_vs_tp1"] is not None else f"{'-':>10}")
        )
        if r["captured_error"]:
            print(f"    captured at TP {r['tp']}: {r['captured_error']}")


if __name__ == "__main__":
    sys.exit(main())
