"""std.nn.quant's decode kernels (issue 42) at Llama-3-8B decode shapes, each against its op's
body and against bf16 cuBLAS, on the device alone (CUDA graphs).

For each product of an 8B decode step ([N, 4096] x 4096 -> 6144 (fused q/k/v), 4096, 1024 and
14336; [N, 14336] x 14336 -> 4096; the LM head 4096 -> 128256), each batch N (1, 8, 32), each
group size (128, 32) and each format (int8: ``linear_q8``; packed int4: ``linear_q4``):

(a) check: every kernel's result against the op's body (generated PyTorch, numerics "exact"),
    within `linnet kernels`' bf16 tolerance (the f32 sums of the kernel and of the body add
    in other orders), before anything is timed;
(b) time, per call, inside one CUDA graph of ``--reps`` calls rotating over copies of every
    input (enough copies that the weights come from HBM, not L2), median of ``--repeats``
    replays after a warm-up: each kernel of the format (the one-pass ``*_gemv`` and the
    split-K ``*_split``, at the std binding's tiles, marked ``*``, and at the tiles of a small
    sweep), the op's body (its generated PyTorch, eager, and compiled with torch.compile
    unless ``--no-compile``), and bf16 ``F.linear`` of the same shape (cuBLAS);
(c) the bytes floor: weight + scale (+ offset) bytes over ``--bandwidth`` (3.35e12 B/s, the
    H100 SXM's HBM3); GB/s and the fraction of that floor each time reaches.

The std bindings take at most 16 rows (``BR >= N``): at N = 32 their where clause fails and a
model runs the body; the rows of N = 32 time the same kernels instantiated with BR = 32 (not
bound; what a 32-row binding would give). The table prints last; JSON goes to
$OUT/quant_kernels.json when $OUT is set. On the device machine with the wheels installed::

    python3 benchmarks/quant_kernels.py [--products qkv,q,kv,up,down,head] [--rows 1,8,32]
                                        [--groups 128,32] [--formats q8,q4] [--reps 32]
                                        [--no-compile] [--compile-mode default]
    python3 benchmarks/quant_kernels.py --cpu-smoke   # CPU, Triton's interpreter, tiny shapes

A whole run compiles one body per case (tens of seconds each): within the device tool's
10-minute limit, run a few products at a time, or ``--no-compile`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:  # before Triton is imported: the interpreter is chosen when kernels are decorated
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from decode_kernels import _chain, body_function, graph_us  # noqa: E402
from linnet.torch.kernels import kernel_module, op_case, stages  # noqa: E402
from linnet.torch.testing import compare  # noqa: E402
from torch_decode import triton_version  # noqa: E402

BANDWIDTH = 3.35e12  # B/s: the H100 SXM's HBM3, the floor's bandwidth
L2 = 50 << 20  # bytes of L2 (H100: 50 MiB): the weight copies a graph rotates over exceed it
# Llama-3-8B decode products: label -> (I, O).
PRODUCTS = {
    "qkv": (4096, 6144),
    "q": (4096, 4096),
    "kv": (4096, 1024),
    "up": (4096, 14336),
    "down": (14336, 4096),
    "head": (4096, 128256),
}
SMOKE_PRODUCTS = {"q": (64, 48), "down": (96, 40)}
# Each kernel's tiles: the std binding's (first) and a sweep around it. One pass: (BO, BK)
# for int8 (BK columns a step), (BO, BJ) for int4 (BJ bytes, 2 BJ columns a step). Split-K:
# the same with KS splits.
SWEEP = {
    "linear_q8_gemv": [(8, 512), (8, 1024), (16, 256), (16, 512), (4, 1024)],
    "linear_q4_gemv": [(8, 256), (8, 512), (16, 256), (16, 128), (4, 512)],
    "linear_q8_split": [(8, 256, 4), (8, 512, 4), (8, 256, 8), (16, 256, 4)],
    "linear_q4_split": [(8, 128, 4), (8, 256, 4), (8, 128, 8), (16, 128, 4)],
}
SMOKE_SWEEP = {
    "linear_q8_gemv": [(8, 512), (8, 16)],
    "linear_q4_gemv": [(8, 256), (8, 8)],
    "linear_q8_split": [(8, 256, 4), (8, 16, 3)],
    "linear_q4_split": [(8, 128, 4), (8, 8, 3)],
}
KEYS = {"linear_q8_gemv": ("BO", "BK"), "linear_q4_gemv": ("BO", "BJ")}
KEYS |= {"linear_q8_split": ("BO", "BK", "KS"), "linear_q4_split": ("BO", "BJ", "KS")}


def quant_inputs(fmt: str, n: int, i: int, o: int, group: int, device: str, seed: int) -> list:
    """x (bf16), then the quantised weight: int8 levels (or packed int4 bytes) over their
    whole range and f16 scales (and offsets) that make each weight about 1 / sqrt(I), as a
    trained layer's, so that products stay near 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, i, generator=g).to(torch.bfloat16)
    ng = i // group
    if fmt == "q8":
        q = torch.randint(-128, 128, (o, i), generator=g).to(torch.int8)
        s = (torch.rand(o, ng, generator=g) * 2 / 127 / i**0.5).to(torch.float16)
        ins = [x, q, s]
    else:
        q = torch.randint(0, 256, (o, i // 2), generator=g).to(torch.uint8)
        d = (torch.rand(o, ng, generator=g) * 2 / 15 / i**0.5).to(torch.float16)
        m = (-7.5 * d.float()).to(torch.float16)  # levels 0..15 centred on 0, as GGUF's Q4_0
        ins = [x, q, d, m]
    return [t.to(device) for t in ins]


def weight_bytes(ins: list[torch.Tensor]) -> int:
    """The floor's bytes: the quantised weight and its scales (and offsets); x and y are
    N x (I + O) bf16, a rounding error beside them."""
    return sum(t.numel() * t.element_size() for t in ins[1:])


def timed(
    fn: Callable[..., Any], copies: list[list[torch.Tensor]], device: str, args: Any
) -> float:
    """Microseconds per call: on CUDA inside a CUDA graph (decode_kernels.graph_us); on the
    CPU (--cpu-smoke) the median of a few wall-clock calls."""
    if device == "cuda":
        return graph_us(fn, copies, args.reps, args.repeats)
    fn(*copies[0])  # warm-up: compile
    times = []
    for _ in range(2):
        start = time.perf_counter()
        fn(*copies[0])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def kernels_for(
    op: str, generics: dict[str, Any], rows: int, sweep: list[tuple[int, ...]]
) -> list[tuple[str, Callable[..., Any], bool]]:
    """``(name, launch, is the std binding)`` for the op's kernel (or chain) at the binding's
    tiles and at each sweep entry; BR, the rows a program holds, is the binding's 16 or the
    next power of two above ``rows``."""
    bound, _ = stages(None, op, generics | {"N": min(rows, 16)})
    br = max(16, 1 << (rows - 1).bit_length())
    keys = KEYS[op.rsplit("::", 1)[-1]]
    base = tuple(bound[0][1][k] if k in bound[0][1] else bound[-1][1][k] for k in keys)
    out = []
    for tiles in sweep:
        mods = []
        for kernel, kgen in bound:
            gen = dict(kgen) | {"N": rows, "BR": br}
            gen |= {k: v for k, v in zip(keys, tiles) if k in kgen}
            mods.append(kernel_module(None, kernel, gen))
        name = ":".join(map(str, tiles)) + (f" BR{br}" if br != 16 else "")
        launch = mods[0].LAUNCH if len(mods) == 1 else _chain(*mods)
        out.append((name, launch, tiles == base and rows <= 16))
    return out


def run_case(
    fmt: str, label: str, rows: int, group: int, device: str, args: Any
) -> list[dict[str, Any]]:
    i, o = (SMOKE_PRODUCTS if SMOKE else PRODUCTS)[label]
    generics = {"N": rows, "I": i, "O": o, "NG": i // group, "T": "bf16"}
    ins = quant_inputs(fmt, rows, i, o, group, device, seed=0)
    nbytes = weight_bytes(ins)
    ncopies = 1 if device != "cuda" else max(2, min(8, -(-3 * L2 // nbytes)))
    copies = [ins] + [
        quant_inputs(fmt, rows, i, o, group, device, seed=c) for c in range(1, ncopies)
    ]
    common = {"format": fmt, "product": label, "N": rows, "I": i, "O": o, "group": group}
    common |= {"bytes": nbytes, "floor_us": nbytes / args.bandwidth * 1e6}
    rows_out = []

    def row(variant: str, us: float, **extra: Any) -> None:
        rows_out.append(
            common
            | {
                "variant": variant,
                "us": us,
                "GB/s": nbytes / us / 1e3,
                "of_floor": (nbytes / args.bandwidth * 1e6) / us,
            }
            | extra
        )

    # The op's body: generated PyTorch (numerics exact) of a one-entry model calling it.
    op = f"std.nn.quant::linear_{fmt}_gemv"
    text = op_case(op, generics).text  # (at N > 16 the kernel's where fails: the body runs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(text)
        body = body_function(path, device, ins)
        want = body(*ins)
        row("body (generated)", timed(body, copies, device, args))
        if not args.no_compile and device == "cuda":
            compiled = body_function(path, device, ins, args.compile_mode)
            compiled(*ins)
            row(f"body (torch.compile {args.compile_mode})", timed(compiled, copies, device, args))
    # bf16 cuBLAS of the same shape (its weight twice or four times the bytes).
    w16 = [[c[0], torch.randn(o, i, device=device).to(torch.bfloat16) / i**0.5] for c in copies]
    lin = timed(F.linear, w16, device, args)
    row("bf16 F.linear", lin, bf16_bytes=o * i * 2)
    sweeps = SMOKE_SWEEP if SMOKE else SWEEP
    for kind in ("gemv", "split"):
        span = f"std.nn.quant::linear_{fmt}_{kind}"
        for name, launch, bound in kernels_for(span, generics, rows, sweeps[span.split("::")[1]]):
            got = launch(*ins)
            found, diff = compare(got, want, "bf16")
            if found is not None:
                raise SystemExit(f"{span} {name} differs from the body: {found}")
            us = timed(launch, copies, device, args)
            row(f"{kind} {name}" + (" *" if bound else ""), us, difference=diff)
    return rows_out


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'fmt':4} {'product':8} {'N':>3} {'GS':>4} {'variant':34} {'us':>9} {'GB/s':>7} {'floor':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['format']:4} {r['product']:8} {r['N']:>3} {r['group']:>4} {r['variant']:34} "
            f"{r['us']:9.2f} {r['GB/s']:7.0f} {r['of_floor']:6.0%}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--products", default="qkv,q,kv,up,down,head")
    p.add_argument("--rows", default="1,8,32")
    p.add_argument("--groups", default="128,32")
    p.add_argument("--formats", default="q8,q4")
    p.add_argument("--reps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--bandwidth", type=float, default=BANDWIDTH)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in Triton's interpreter")
    args = p.parse_args()
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke for the CPU check")
    products = ["q", "down"] if SMOKE else args.products.split(",")
    rows = [1, 20] if SMOKE else [int(r) for r in args.rows.split(",")]
    groups = [16, 32] if SMOKE else [int(g) for g in args.groups.split(",")]
    out: list[dict[str, Any]] = []
    for fmt in args.formats.split(","):
        for label in products:
            for n in rows:
                for group in groups:
                    got = run_case(fmt, label, n, group, device, args)
                    out.extend(got)
                    print("\n".join(table(got).splitlines()[2:]), flush=True)
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    print(
        f"\n{card}; torch {torch.__version__}; triton {triton_version()}; "
        f"floor at {args.bandwidth / 1e12:.2f} TB/s (weight + scale bytes)"
    )
    print(table(out))
    if os.environ.get("OUT"):
        meta = {"device": card, "torch": torch.__version__, "triton": triton_version()}
        Path(os.environ["OUT"], "quant_kernels.json").write_text(
            json.dumps({"meta": meta, "rows": out}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
