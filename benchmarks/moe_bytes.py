"""The bytes a batch-1 decode step of a mixture of experts reads (issue 45): only the chosen
experts' weights.

    python3 benchmarks/moe_bytes.py                      # the table, from the planned graph
    python3 benchmarks/moe_bytes.py --check              # + the kernels in Triton's interpreter
    python3 benchmarks/moe_bytes.py --device cuda        # + the decode chain timed on the GPU

For each shape (Mixtral-8x7B, Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B's expert layout) the decode
step's graph is lowered at batch 1 (one layer: the rest are the same) and its spans claimed as
a plan claims them; each `moe_experts` call is offered to `moe_experts_gemv`, whose kernels load
expert idx[n, k]'s gate, up and down rows and nothing else (std.nn.moe_kernels). The table
gives a layer's expert bytes: what the kernels read (K experts a row), what every expert
weighs (what a dense read of the stacked weights, or the op's dense body, reads), and the
share. ``--check`` runs the two kernels at a small shape under Triton's interpreter with every
expert the step does not choose filled with NaN: the result is finite and equals the op's
body, so no unchosen weight was read. ``--device cuda`` times the chain at each shape with K
experts and with every expert chosen (K = E): the time scales with the experts read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# (name, D, F (an expert's width), E, K)
SHAPES = [
    ("mixtral-8x7b", 4096, 14336, 8, 2),
    ("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4),
    ("qwen3-30b-a3b", 2048, 768, 128, 8),
]
BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def claimed_op(d: int, f: int, e: int, k: int) -> str:
    """The span op a plan offers for a Mixtral-shaped layer's `moe_experts` call at batch 1
    (lowered with one layer, a small vocabulary: the experts are what is measured)."""
    from linnet.lang import Program, lower
    from linnet.lang.check.spans import claim_spans
    from linnet.lang.syntax.program import model_file

    program = Program.from_file(model_file("std.models.mixtral"))
    dims = {
        "V": 256,
        "D": d,
        "F": f,
        "NL": 1,
        "H": 32,
        "KV": 8,
        "HD": 128,
        "S": 64,
        "T": "bf16",
        "num_experts": e,
        "num_experts_per_tok": k,
    }
    graph = claim_spans(lower(program, "decode", {"token": [1], "pos": [1]}, dims), program)
    spans = [c.callee for c in graph.calls if c.callee.startswith("std.nn.moe_kernels::")]
    return ", ".join(sorted(set(s.rsplit("::", 1)[1] for s in spans)))


def table(dtype: str) -> list[str]:
    rows = [
        f"| shape | D | F | E | K | span ops offered to the plan | read a step ({dtype}, a layer) | all experts | share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d, f, e, k in SHAPES:
        per = 3 * f * d * BYTES[dtype]  # gate, up and down rows of one expert
        read, every = k * per, e * per
        rows.append(
            f"| {name} | {d} | {f} | {e} | {k} | {claimed_op(d, f, e, k)} | "
            f"{read / 2**20:.1f} MiB | {every / 2**20:.1f} MiB | {read / every:.1%} |"
        )
    return rows


def check() -> str:
    """The decode chain in Triton's interpreter with every unchosen expert NaN (a child
    process: the interpreter must be chosen before Triton is imported)."""
    import subprocess

    code = """
import torch
from linnet.torch.kernels import kernel_module, op_case
g = {"N": 1, "D": 40, "F": 24, "E": 8, "K": 2, "T": "bf16"}
case = op_case("std.nn.moe_kernels::moe_experts_gemv", g)
x, wg, wu, wd, w, idx = case.random_inputs("cpu", seed=0)
idx = torch.tensor([[2, 5]], dtype=torch.int32)
want_in = [t.clone() for t in (x, wg, wu, wd, w)]
for t in (wg, wu, wd):
    t[[0, 1, 3, 4, 6, 7]] = float("nan")
tiles = {"BO": 16, "BK": 256}
up = kernel_module(None, "std.nn.moe_kernels::moe_gate_up_rows", g | tiles)
down = kernel_module(None, "std.nn.moe_kernels::moe_down_rows", g | tiles)
ins = [x, wg, wu, wd, w, idx]
y = down.LAUNCH(*ins, up.LAUNCH(*ins))
import tempfile
from pathlib import Path
from linnet.torch import load
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "case.linnet"
    path.write_text(case.text)
    ref = load(path, weights={}, numerics="exact").run("run", [*want_in, idx])
from linnet.torch.testing import compare
found, diff = compare(y, ref, "bf16")
print("finite", bool(y.isfinite().all()), "| agrees with the body:", found is None,
      f"(largest difference {diff:.3g}, largest value {float(ref.float().abs().max()):.3g})")
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    return (done.stdout or done.stderr).strip().splitlines()[-1]


def timed(dtype: str, runs: int) -> list[str]:
    """The decode chain on CUDA at each shape, K experts against all E (batch 1)."""
    import torch
    from linnet.torch.kernels import kernel_module

    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    rows = ["| shape | K | us a layer | GB/s of the experts read |", "|---|---|---|---|"]
    for name, d, f, e, k in SHAPES:
        wg = torch.randn(e, f, d, device="cuda", dtype=dt) * 0.02
        wu, wd = torch.randn_like(wg) * 0.02, torch.randn(e, d, f, device="cuda", dtype=dt) * 0.02
        x = torch.randn(1, d, device="cuda", dtype=dt)
        for kk in (k, e):
            idx = torch.randperm(e, device="cuda")[:kk].sort().values.to(torch.int32)[None]
            w = torch.full((1, kk), 1.0 / kk, device="cuda")
            g = {"N": 1, "D": d, "F": f, "E": e, "K": kk, "T": dtype, "BO": 16, "BK": 256}
            up = kernel_module(None, "std.nn.moe_kernels::moe_gate_up_rows", g)
            down = kernel_module(None, "std.nn.moe_kernels::moe_down_rows", g)
            ins = [x, wg, wu, wd, w, idx]
            for _ in range(3):
                down.LAUNCH(*ins, up.LAUNCH(*ins))
            times = []
            for _ in range(runs):
                torch.cuda.synchronize()
                start = time.perf_counter()
                down.LAUNCH(*ins, up.LAUNCH(*ins))
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            us = statistics.median(times) * 1e6
            read = kk * 3 * f * d * BYTES[dtype]
            rows.append(f"| {name} | {kk} | {us:.1f} | {read / us / 1e3:.0f} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", choices=sorted(BYTES))
    p.add_argument("--check", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    print("\n".join(table(args.dtype)))
    if args.check:
        print("\nunchosen experts NaN, decode chain in Triton's interpreter:", check())
    if args.device == "cuda":
        print("\n" + "\n".join(timed(args.dtype, args.runs)))


if __name__ == "__main__":
    main()
