"""std.nn.quant_mm's dequantising GEMM kernels (issue 42) at the Llama-3-8B products, against
the op's body compiled and against bf16 cuBLAS.

For each product ([N, 4096] x 4096 -> 4096, 1024, 14336; [N, 14336] -> 4096), N in 17, 32,
64, 256, 1024, group 128, and each format (int8 `linear_q8_mm`, int4 `linear_q4_mm`):

(a) check: the kernel's result against the body (dequantise to bf16 exactly as
    `linear_q8` / `linear_q4` define it, then F.linear), largest difference, ok within
    `linnet kernels`' bf16 tolerance; a kernel that differs is reported and not timed;
(b) time, CUDA events around each call after a warm-up, the median of ``--reps``: the
    kernel; the body under torch.compile (dequantise then F.linear, cuBLAS); bf16
    F.linear of the same shape (the unquantised weight);
(c) TFLOP/s (2 N I O), GB/s (weights, scales, x and y), and the bytes floor at 3.35 TB/s
    (the H100 SXM's HBM3 bandwidth).

JSON goes to $OUT/quant_mm.json when $OUT is set. On a GPU::

    python3 benchmarks/quant_mm.py [--rows 17,32,64,256,1024] [--reps 50] [--no-compile]
    python3 benchmarks/quant_mm.py --cpu-smoke   # CPU, Triton's interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

SHAPES = [("q/o", 4096, 4096), ("k/v", 4096, 1024), ("gate/up", 4096, 14336), ("down", 14336, 4096)]
FLOOR = 3.35e12  # B/s


def quantise(w: Any, bits: int, group: int) -> tuple[Any, ...]:
    """``w`` [O, I] as `linear_q8`'s (q, s) or `linear_q4`'s (packed q, d, m): round to
    nearest, f16 group scales (as `load(..., quantize=...)`)."""
    import torch

    o, i = w.shape
    g = w.float().reshape(o, i // group, group)
    if bits == 8:
        s = (g.abs().amax(-1) / 127).clamp_min(1e-8).half()
        q = (g / s.float()[..., None]).round().clamp(-128, 127).to(torch.int8).reshape(o, i)
        return q, s
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).clamp_min(1e-8).half()
    m = lo.half()
    lv = ((g - m.float()[..., None]) / d.float()[..., None]).round().clamp(0, 15).to(torch.uint8)
    lv = lv.reshape(o, i)
    return (lv[:, 0::2] | (lv[:, 1::2] << 4)).contiguous(), d, m


def dequantised(bits: int, group: int, *wq: Any) -> Any:
    """The body's weight: w[o, i] = (q * s) or (d * level + m), in f32, rounded to bf16."""
    import torch

    if bits == 8:
        q, s = wq
        w = q.float() * s.float().repeat_interleave(group, 1)
    else:
        q, d, m = wq
        lv = torch.stack([q & 15, q >> 4], -1).reshape(q.shape[0], -1).float()
        w = d.float().repeat_interleave(group, 1) * lv + m.float().repeat_interleave(group, 1)
    return w.to(torch.bfloat16)


def body(bits: int, group: int) -> Any:
    import torch.nn.functional as F

    def run(x: Any, *wq: Any) -> Any:
        return F.linear(x, dequantised(bits, group, *wq))

    return run


def kernel(bits: int, n: int, i: int, o: int, group: int) -> Any:
    """The launcher of the op's bound kernel at these generics (linnet.torch.kernels)."""
    from linnet.torch.kernels import kernel_module, stages

    op = f"std.nn.quant_mm::linear_q{bits}_mm"
    generics = {"N": n, "I": i, "O": o, "NG": i // group, "T": "bf16"}
    [(name, kgen)], holds = stages(None, op, generics)
    assert holds, f"{op}'s kernel does not apply at {generics}"
    return kernel_module(None, name, kgen).LAUNCH


def linnet_body(bits: int, n: int, i: int, o: int, group: int, *tensors: Any) -> Any:
    """`linear_q8` / `linear_q4`'s own body: a one-op model's generated PyTorch, numerics
    "exact"."""
    import tempfile

    from linnet.torch import load

    ng = i // group
    if bits == 8:
        params = f"q: Tensor[{o}, {i}; i8], s: Tensor[{o}, {ng}; f16]"
        args = "q, s"
    else:
        params = (
            f"q: Tensor[{o}, {i // 2}; u8], d: Tensor[{o}, {ng}; f16], m: Tensor[{o}, {ng}; f16]"
        )
        args = "q, d, m"
    text = (
        f"use std.nn.linear::{{linear_q{bits}}}\nmodel Case {{\n    entry run(x: Tensor[{n}, {i}; "
        f"bf16], {params}) -> Tensor[{n}, {o}; bf16] {{\n        return linear_q{bits}<{n}, {i}, "
        f"{o}, {ng}, {group}, bf16>(x, {args})\n    }}\n}}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(text)
        return load(path, weights={}, numerics="exact").run("run", list(tensors))


def timed(fn: Any, args: tuple, reps: int, cuda: bool) -> float:
    """Median microseconds a call (CUDA events; on the CPU, wall time)."""
    import time

    import torch

    for _ in range(3):
        fn(*args)
    out = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn(*args)
            out.append((time.perf_counter() - t) * 1e6)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="17,32,64,256,1024")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in Triton's interpreter")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch
    import torch.nn.functional as F
    from linnet.lang.check.kernel_cases import TOLERANCES

    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke on the CPU", file=sys.stderr)
        return 2
    dev = "cuda" if cuda else "cpu"
    shapes = [("tiny", 256, 96), ("tiny2", 128, 200)] if args.cpu_smoke else SHAPES
    rows = [17, 40] if args.cpu_smoke else [int(r) for r in args.rows.split(",")]
    group = 32 if args.cpu_smoke else args.group
    reps = 2 if args.cpu_smoke else args.reps
    rtol, atol = TOLERANCES["bf16"]
    g = torch.Generator(device=dev).manual_seed(0)
    results = []
    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu (interpreter)'}")
    print(
        f"{'product':>8} {'N':>5} {'fmt':>4} {'kernel us':>10} {'body us':>9} {'bf16 us':>8} "
        f"{'TFLOP/s':>8} {'GB/s':>7} {'floor us':>9} {'max diff':>9} ok"
    )
    for label, i, o in shapes:
        w = (torch.randn(o, i, generator=g, device=dev) / i**0.5).to(torch.bfloat16)
        for bits in (8, 4):
            wq = quantise(w, bits, group)
            ref = (
                torch.compile(body(bits, group))
                if cuda and not args.no_compile
                else body(bits, group)
            )
            wbytes = sum(t.numel() * t.element_size() for t in wq)
            for n in rows:
                x = torch.randn(n, i, generator=g, device=dev).to(torch.bfloat16)
                launch = kernel(bits, n, i, o, group)
                got, want = launch(x, *wq), body(bits, group)(x, *wq)
                if args.cpu_smoke:  # the torch body here is the Linnet op's body
                    assert torch.equal(want, linnet_body(bits, n, i, o, group, x, *wq))
                diff = float((got.float() - want.float()).abs().max())
                # linnet kernels' bf16 check: |got - want| <= atol + rtol |want|, elementwise
                ok = bool(
                    ((got.float() - want.float()).abs() <= atol + rtol * want.float().abs()).all()
                )
                row: dict[str, Any] = {
                    "product": label,
                    "I": i,
                    "O": o,
                    "N": n,
                    "bits": bits,
                    "group": group,
                    "difference": diff,
                    "ok": ok,
                }
                if ok:
                    row["kernel_us"] = timed(launch, (x, *wq), reps, cuda)
                    row["body_us"] = timed(ref, (x, *wq), reps, cuda)
                    row["bf16_us"] = timed(F.linear, (x, w), reps, cuda)
                moved = wbytes + 2 * n * (i + o)
                row["floor_us"] = moved / FLOOR * 1e6
                us = row.get("kernel_us")
                tflops = 2 * n * i * o / (us * 1e-6) / 1e12 if us else float("nan")
                gbs = moved / (us * 1e-6) / 1e9 if us else float("nan")
                results.append(row)
                print(
                    f"{label:>8} {n:>5} {'i' + str(bits):>4} {us or float('nan'):>10.1f} "
                    f"{row.get('body_us', float('nan')):>9.1f} {row.get('bf16_us', float('nan')):>8.1f} "
                    f"{tflops:>8.1f} {gbs:>7.0f} {row['floor_us']:>9.1f} {diff:>9.2e} "
                    f"{'ok' if ok else 'DIFFERS'}"
                )
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "quant_mm.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
