"""On a GPU: every std op bound to a kernel, its kernel launched for real through Pallas from
generated JAX (linnet-runtime-jax), checked against the op's body and timed.

For each binding the std library has (discovered from the std modules, not listed here), at a
decode-like shape (one row) and prefill-like ones (64 and 4096 rows), widths 1000 and 1024
(a partial tile and a full one) where the kernel's where clause allows:

(a) check: ``load_source(..., numerics="fast")`` (the call launches the kernel: RUNS says so)
    against the same module's body (Pallas switched off, same numerics), largest difference
    against the result's scale, on normal * 4 inputs;
(b) time: both entries under ``jax.jit``, median of N runs after warm-up
    (``block_until_ready``), and the floor: bytes moved (inputs + results) over the copy
    bandwidth measured here.

The table prints last; JSON goes to $OUT/pallas.json when $OUT is set. Run on the device
machine with the wheels installed (``bash benchmarks/gpu.sh --pallas``), or anywhere with
``--dry-run`` (LINNET_PALLAS_INTERPRET=1 on the CPU, small shapes: a check that the script
works)::

    python3 benchmarks/pallas.py [--runs 50] [--dry-run]
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
from pathlib import Path
from typing import Any

DRY = "--dry-run" in sys.argv
if DRY:  # read when each generated module is imported
    os.environ["LINNET_PALLAS_INTERPRET"] = "1"

ROOT = Path(__file__).resolve().parents[1]
for src in ("packages/linnet-lang/src", "packages/linnet-runtime-jax/src"):
    if (ROOT / src).is_dir() and str(ROOT / src) not in sys.path:
        sys.path.append(str(ROOT / src))  # installed wheels first; the checkout as a fallback

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from linnet.jax import load_source  # noqa: E402

SHAPES = {"decode": 1, "prefill": 64, "prefill-4k": 4096}
WIDTHS = (1000, 1024)


def std_bindings() -> list[tuple[Any, str]]:
    """Every std op bound to a kernel: ``(op declaration, its module)``, by qualified name
    (the std files parsed; nothing here names an op)."""
    import linnet.lang.syntax.tree as A
    from linnet.lang.diagnostics.core import SourceFile
    from linnet.lang.syntax.parser import parse
    from linnet.lang.syntax.program import STD_ROOT, std_modules

    out = []
    for module in sorted(std_modules()):
        path = STD_ROOT.joinpath(*module.split(".")[1:]).with_suffix(".linnet")
        tree = parse(SourceFile(str(path), path.read_text()), module)
        for item in tree.items:
            if (
                isinstance(item, A.FuncDecl)
                and item.kind == "op"
                and item.kernel is not None
                and item.public
            ):
                out.append((item, module))
    return sorted(out, key=lambda t: (t[1], t[0].name))


def case_text(op: Any, module: str, rows: int, width: int) -> tuple[str, dict[str, list[int]]]:
    """A one-entry model calling ``op`` on f32 tensors: its first Dim generic ``rows``, the
    others ``width``; a scalar parameter (rms_norm's eps) gets a constant."""
    dims = [g.name for g in op.generics if g.kind == "Dim"]
    value = {d: rows if i == 0 else width for i, d in enumerate(dims)}

    def shape(ty: Any) -> list[int]:
        return [value[d.name] for d in ty.dims]

    shapes = {p.name: shape(p.type) for p in op.params if hasattr(p.type, "dims")}
    args = [
        p.name if p.name in shapes else ("1e-5" if p.type.name.startswith(("f", "bf")) else "1")
        for p in op.params
    ]
    params = ", ".join(f"{n}: Tensor[{', '.join(map(str, s))}; f32]" for n, s in shapes.items())
    out = ", ".join(map(str, shape(op.results[0].type)))
    text = (
        f"use {module}::{{{op.name}}}\n\nmodel Case {{\n    entry run({params}) "
        f"-> Tensor[{out}; f32] {{\n        return {op.name}({', '.join(args)})\n    }}\n}}\n"
    )
    return text, shapes


def median_us(fn: Any, args: tuple, runs: int) -> float:
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def bandwidth() -> float:
    """Bytes per second of a jitted read-and-write of 256 MiB (the copy bandwidth)."""
    x = jnp.ones((64 << 20,), jnp.float32)
    f = jax.jit(lambda a: a + 1)
    us = median_us(f, (x,), 10)
    return 2 * x.nbytes / (us * 1e-6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    shapes = {"decode": 1, "prefill": 3} if args.dry_run else SHAPES
    widths = (5, 8) if args.dry_run else WIDTHS
    runs = 3 if args.dry_run else args.runs
    device = jax.devices()[0]
    print(
        f"jax {jax.__version__} on {device.device_kind} ({jax.default_backend()}), "
        f"interpret={os.environ.get('LINNET_PALLAS_INTERPRET') == '1'}",
        flush=True,
    )
    bw = bandwidth()
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="linnet-pallas-"))
    for op, module in std_bindings():
        for label, r in shapes.items():
            for w in widths:
                name = f"{module}::{op.name}"
                row: dict[str, Any] = dict(op=name, shape=label, rows=r, width=w)
                try:
                    text, ins = case_text(op, module, r, w)
                    path = tmp / f"{op.name}_{r}_{w}.linnet"
                    path.write_text(text)
                    fast = load_source(path, "run", ins, numerics="fast")
                    rng = np.random.default_rng(0)
                    xs = tuple(
                        jnp.asarray(rng.standard_normal(s).astype(np.float32) * 4)
                        for s in ins.values()
                    )
                    f = jax.jit(lambda *a, m=fast: m.run(*a, {}, {})[0][0])
                    y = f(*xs)
                    runs_table = dict(getattr(fast, "RUNS", {}))
                    row["launched"] = bool(runs_table) and all(
                        c[0] >= 1 and c[1] == 0 for c in runs_table.values()
                    )
                    # The body in the same numerics: the same module with Pallas off (its
                    # kernels_ready is asked when a new jit traces it).
                    fast.PALLAS = False
                    b = jax.jit(lambda *a, m=fast: m.run(*a, {}, {})[0][0])
                    y0 = b(*xs)
                    fast.PALLAS = True
                    scale = float(jnp.max(jnp.abs(y0)))
                    row["max_diff"] = float(jnp.max(jnp.abs(y - y0)))
                    # f32 rounding of sums in another order, or TF32 products (numerics
                    # fast on the GPU) in a kernel with a product of tiles.
                    tol = 1e-2 if "jnp.dot(" in Path(fast.__file__).read_text() else 1e-5
                    row["ok"] = row["max_diff"] <= tol * max(scale, 1.0) and bool(
                        jnp.all(jnp.isfinite(y))
                    )
                    row["kernel_us"] = median_us(f, xs, runs)
                    row["body_us"] = median_us(b, xs, runs)
                    moved = sum(x.nbytes for x in xs) + y.nbytes
                    row["floor_us"] = moved / bw * 1e6
                except Exception as exc:  # one failing case never hides the others
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                rows.append(row)
                print(row, flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "pallas.json").write_text(
            json.dumps(
                dict(
                    jax=jax.__version__,
                    device=device.device_kind,
                    backend=jax.default_backend(),
                    bandwidth=bw,
                    rows=rows,
                ),
                indent=1,
            )
        )
    print(
        f"\n{'op':34} {'shape':>10} {'width':>6} {'launched':>8} {'ok':>3} {'max diff':>9} "
        f"{'kernel us':>10} {'body us':>9} {'floor us':>9}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['op']:34} {r['shape']:>10} {r['width']:>6}  error: {r['error'][:60]}")
            continue
        print(
            f"{r['op']:34} {r['shape']:>10} {r['width']:>6} {r['launched']!s:>8} "
            f"{'ok' if r['ok'] else 'BAD':>3} {r['max_diff']:9.1e} {r['kernel_us']:10.1f} "
            f"{r['body_us']:9.1f} {r['floor_us']:9.2f}"
        )
    return (
        0
        if all(r.get("ok") and r.get("launched") for r in rows)
        or (DRY and all(r.get("ok") for r in rows))
        else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
