"""On a GPU: every std op bound to a kernel, its kernel launched for real against its body.

For each binding the std library has (``linnet.torch.kernels.std_bindings``: discovered, not
listed here), at a decode-like shape (one row) and a prefill-like one (512 rows), widths 4096
where the kernel's where clause allows (else the largest power of two it takes):

(a) check: the kernel (through ``linnet.torch.kernels``, tl.dot at full f32 precision)
    against the op's body (generated PyTorch, numerics "exact", its own inputs), with the
    largest difference and a dtype tolerance;
(b) time: the kernel's launch, the body's generated code eager, and the body compiled
    (torch.compile of its slice), CUDA events, median of N runs after warm-up;
(c) floor: bytes moved (inputs + results) over the copy bandwidth measured here, or flops
    (2 M N K for each product in the body) over a big bf16 matmul's rate measured here,
    whichever is larger;
(d) compile=True with kernels (numerics "fast"): ``torch._dynamo.explain`` of the slice that
    launches the kernel, its graph-break count, and the compiled time.

The table prints last; JSON goes to $OUT/kernels.json when $OUT is set. Run on the device
machine with the wheels installed (``bash benchmarks/gpu.sh --kernels``), or here with
``--dry-run`` (CPU, TRITON_INTERPRET=1, tiny shapes: a check that the script works)::

    python3 benchmarks/kernels.py [--runs 50] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

DRY = "--dry-run" in sys.argv
if DRY:  # before Triton is imported: the interpreter is chosen when kernels are decorated
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from linnet.torch import load  # noqa: E402
from linnet.torch.kernels import (  # noqa: E402
    example_generics,
    kernel_module,
    op_case,
    std_bindings,
)
from torch_decode import triton_version  # noqa: E402

ROWS = {"decode": 1, "prefill": 512}
WIDTH = 4096


def timer(device: str, runs: int) -> Callable[[Callable[[], Any]], float]:
    """Median microseconds of ``fn()``: CUDA events on CUDA, wall clock on the CPU."""

    def measure(fn: Callable[[], Any]) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(runs):
            if device == "cuda":
                start, stop = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) * 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e6)
        return statistics.median(times)

    return measure


def ceilings(device: str, measure: Callable) -> tuple[float, float]:
    """(copy bytes/s, bf16 matmul flops/s) measured on this device."""
    n = (1 << 28) if device == "cuda" else (1 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_us = measure(lambda: dst.copy_(src))
    m = 8192 if device == "cuda" else 256
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(m, m, device=device, dtype=dt)
    b = torch.randn(m, m, device=device, dtype=dt)
    mm_us = measure(lambda: a @ b)
    return 2 * n / (copy_us * 1e-6), 2 * m**3 / (mm_us * 1e-6)


def body_flops(graph: Any) -> int:
    """2 M N K for each product (`contract` step) of the body's graph."""
    total = 0
    for s in graph.steps:
        if s.op != "contract":
            continue
        ins = s.attributes["spec"].split("->")[0]
        size: dict[str, int] = {}
        for labels, ref in zip(ins.split(","), s.operands):
            shape = (
                graph.values[ref].shape
                if ref.startswith("%")
                else (graph.parameters.get(ref[1:]) or graph.states[ref[1:]]).shape
            )
            size.update(zip(labels, shape))
        n = 2
        for lab in set(size):
            n *= size[lab]
        total += n
    return total


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}.get(dtype, 0.0)


def one(
    op: str, kernel: str, regime: str, device: str, runs: int, bw: float, peak: float, width: int
) -> dict[str, Any]:
    rows = ROWS[regime] if not DRY else {"decode": 1, "prefill": 8}[regime]
    generics = example_generics(op, rows, width)
    if generics is None:
        return {"op": op, "kernel": kernel, "regime": regime, "error": "no generics fit"}
    case = op_case(op, generics)
    row: dict[str, Any] = {
        "op": op,
        "kernel": kernel,
        "regime": regime,
        "generics": case.kernel_generics,
    }
    measure = timer(device, runs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(case.text)
        inputs = case.random_inputs(device, seed=1)
        # (a) the kernel against the body
        mod = kernel_module(None, case.kernel, case.kernel_generics, case.scalars, "ieee")
        contiguous = [t.contiguous() for t in inputs]
        got = mod.LAUNCH(*contiguous)
        got = got if isinstance(got, tuple) else (got,)
        exact = load(path, weights={}, device=device, numerics="exact")
        want = exact.run("run", inputs)
        want = want if isinstance(want, tuple) else (want,)
        diff = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
        tol = max(tolerance(w.dtype) * max(1.0, float(w.float().abs().max())) for w in want)
        row.update(max_diff=diff, tolerance=tol, ok=diff <= tol)
        # (b) times: the kernel's launch, the body eager and compiled
        row["kernel_us"] = measure(lambda: mod.LAUNCH(*contiguous))
        body_fn = slice_function(exact, inputs)
        row["body_eager_us"] = measure(lambda: body_fn(*inputs))
        compiled_body = torch.compile(body_fn, dynamic=False)
        row["body_compiled_us"] = measure(lambda: compiled_body(*inputs))
        # ... and on the device alone (CUDA graphs): the kernel against the body's kernels
        row["kernel_graph_us"] = graphed_us(lambda: mod.LAUNCH(*contiguous), measure, device)
        row["body_graph_us"] = graphed_us(lambda: body_fn(*inputs), measure, device)
        # (c) the floor
        nbytes = sum(t.numel() * t.element_size() for t in inputs + list(want))
        flops = body_flops(exact.graph("run", inputs))
        row.update(
            bytes=nbytes,
            flops=flops,
            floor_us=max(nbytes / bw, flops / peak if flops else 0.0) * 1e6,
        )
        # (d) compile=True with kernels: graph breaks on the launch, and the compiled time
        fast = load(path, weights={}, device=device, numerics="fast")
        fn = slice_function(fast, inputs)
        explained = torch._dynamo.explain(fn)(*inputs)
        row["graph_breaks"] = explained.graph_break_count
        row["custom_op_in_graph"] = any("torch.ops.linnet_" in g.code for g in explained.graphs)
        compiled = torch.compile(fn, dynamic=False, fullgraph=True)
        out = compiled(*inputs)
        out = out if isinstance(out, tuple) else (out,)
        row["compiled_kernel_ok"] = all(
            float((o.float() - w.float()).abs().max()) <= 10 * tol for o, w in zip(out, want)
        )
        row["compiled_kernel_us"] = measure(lambda: compiled(*inputs))
        # RUNS counts eager calls only (compiled code would recompile on a counter): one eager
        # call under numerics fast says whether the kernel, not the body, ran.
        runs_table = fast.module("run", inputs).RUNS
        before = sum(v[0] for v in runs_table.values())
        fast.run("run", inputs)
        row["launched"] = sum(v[0] for v in runs_table.values()) > before
    return row


def graphed_us(fn: Callable[[], Any], measure: Callable, device: str, reps: int = 20) -> float:
    """Device time per call of ``fn`` (in ``measure``'s unit, us here): ``reps`` calls
    captured in one CUDA graph and replayed, so the host's launch overhead (Python, the
    launcher, the dispatcher) drops out; what a ``Captured`` decode step pays. NaN on the CPU
    or when the capture fails (gpu_steps.py's transformers graph row uses it too)."""
    if device != "cuda":
        return float("nan")
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return measure(graph.replay) / reps
    except Exception as exc:  # the eager columns still stand
        print(f"capture failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return float("nan")


def slice_function(model: Any, inputs: list) -> Callable:
    """The generated function of the one slice of the case's entry."""
    module = model.module("run", inputs)
    (sl,) = module.ENTRIES["run"]["slices"]
    return getattr(module, sl["function"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on the CPU", file=sys.stderr)
        return 2
    runs = 3 if args.dry_run else args.runs
    width = 64 if args.dry_run else WIDTH
    bw, peak = ceilings(device, timer(device, runs))
    print(f"ceilings: copy {bw / 1e9:.1f} GB/s, matmul {peak / 1e12:.2f} TFLOP/s")
    rows = []
    for op, kernel in std_bindings():
        for regime in ROWS:
            try:
                rows.append(one(op, kernel, regime, device, runs, bw, peak, width))
            except Exception as exc:  # one binding's failure does not hide the others
                traceback.print_exc()
                rows.append(
                    {
                        "op": op,
                        "kernel": kernel,
                        "regime": regime,
                        "error": f"{type(exc).__name__}: {exc}"[:300],
                    }
                )
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton_version(),
        "copy_bytes_per_s": bw,
        "bf16_flops_per_s": peak,
        "rows": rows,
    }
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "kernels.json").write_text(json.dumps(result, indent=1))
    head = (
        f"{'kernel':<14} {'regime':<8} {'generics':<26} {'ok':<3} {'diff':>8} "
        f"{'kernel':>8} {'body':>8} {'body.c':>8} {'k.comp':>8} {'k.graph':>8} "
        f"{'b.graph':>8} {'floor':>8} {'breaks':>6}"
    )
    print(
        f"\ntimes in us (median of {runs}); body.c = body compiled, k.comp = compile=True "
        "with kernels; k.graph / b.graph = kernel / body eager inside a CUDA graph (device "
        "time, no launch overhead)"
    )
    print(head)
    for r in rows:
        name = r["kernel"].rsplit("::", 1)[-1]
        if "error" in r:
            print(f"{name:<14} {r['regime']:<8} error: {r['error'][:80]}")
            continue
        gen = ",".join(f"{k}={v}" for k, v in r["generics"].items())
        print(
            f"{name:<14} {r['regime']:<8} {gen:<26} {'yes' if r['ok'] else 'NO':<3} "
            f"{r['max_diff']:>8.1e} {r['kernel_us']:>8.1f} {r['body_eager_us']:>8.1f} "
            f"{r['body_compiled_us']:>8.1f} {r['compiled_kernel_us']:>8.1f} "
            f"{r['kernel_graph_us']:>8.1f} {r['body_graph_us']:>8.1f} "
            f"{r['floor_us']:>8.2f} {r['graph_breaks']:>6}"
        )
    return 0 if all(r.get("ok") and r.get("graph_breaks") == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
