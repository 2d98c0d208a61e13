"""The decode-step kernels of std.nn.decode (issue 15) at Llama-3-8B and Llama-3.2-1B decode
shapes, each against its op's body and against cuBLAS, on the device alone (CUDA graphs).

For each span op bound to a kernel (``linear_gemv``, ...), each shape of the step where the
op applies (batch 1: the q, k/v, gate/up and down products; D 4096 / 2048, q 4096 / 2048,
kv 1024 / 512, F 14336 / 8192), and each tile configuration of a small sweep (the kernel's
BO and BK generics, instantiated here; the op's own binding is marked ``*``):

(a) check: the kernel's result against the op's body (generated PyTorch, numerics "exact"):
    the largest absolute difference, and ok within `linnet kernels`' bf16 tolerance;
(b) time, per call, inside one CUDA graph of ``--reps`` calls that rotates over ``--copies``
    (>= 8) copies of every input, so the weights come from HBM and not from L2 (50 MiB on the
    H200): the kernel; the body's generated code compiled (torch.compile,
    max-autotune-no-cudagraphs); the same composition written with torch.nn.functional
    (F.linear is cuBLAS);
(c) the bytes floor: bytes read and written over 4.0e12 B/s (the H200's copy bandwidth is
    about that; the measured copy rate is printed too).

The table prints last; JSON goes to $OUT/decode_kernels.json when $OUT is set. On the
device machine with the wheels installed (``bash benchmarks/gpu.sh --decode-kernels``, or
``python3 benchmarks/decode_kernels.py`` where linnet is importable)::

    python3 benchmarks/decode_kernels.py [--shapes 8b,1b] [--ops linear_gemv] [--reps 64]
                                         [--copies 8] [--sweep BO:BK,...] [--no-compile]
                                         [--rows 1] [--precision tf32]
                                         [--cache 2048] [--pos 1087]
    python3 benchmarks/decode_kernels.py --dry-run   # CPU, Triton's interpreter, tiny shapes

``--sweep 16:256,32:512`` replaces the built-in (BO, BK) pairs (the attention row sweeps its
own (BS, BD) pairs, the split-K rows their own (BK, KS) pairs at BO = 8, the q/k/v and o
split-K chains (BO, BK, KS) triples, BO the first kernel's only: a key ``BO@0``).

Flash-decoding (``--ops decode_attention_split,decode_attention_split_short,decode_attention_split_long``): the split
kernel then the combine, swept over (BS, NS) (the combine takes the same NS), at the attention
row's position and cache; ``--cache 32768 --pos 32767`` times them at a long context.

Split-K (``--ops linear_split,linear_split_wide,linear_residual_split``): the two kernels of
each chain (``gemv_split_part`` then ``gemv_split_sum``; the residual forms) composed as a
chain binding launches them, the first's f32 partial sums allocated inside the timed graph,
against the same body (``linear``, ``residual_add(r, linear(x, w))``) and F.linear. The rows
in registers GEMV for a batch: ``--ops linear_gemv_dot,linear_gemv --rows 8``. Each span compiles its body with max-autotune (tens of seconds) and one
Triton kernel per tile configuration: a whole run takes minutes. Within the device tool's
10-minute limit, run one shape at a time (``--shapes 8b``), or ``--no-compile`` first (the
kernels against cuBLAS alone), or ``--compile-mode default``, or a few ``--ops``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DRY = "--dry-run" in sys.argv
if DRY:  # before Triton is imported: the interpreter is chosen when kernels are decorated
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from linnet.torch import load  # noqa: E402
from linnet.torch.kernels import kernel_module, op_case, resolve, stages  # noqa: E402
from linnet.torch.testing import compare  # noqa: E402
from torch_decode import copy_bandwidth, triton_version  # noqa: E402

FLOOR_BW = 4.0e12  # B/s: the bytes floor's bandwidth
# Decode shapes: model width D, q width Q (heads * head dim), k/v width KV, MLP width F.
# HD: head dim (KV / HD k/v heads, Q / KV query heads each). Attention at position POS of a
# cache of CACHE positions (the runs: positions 1024..1087).
SHAPES = {
    "8b": {"D": 4096, "Q": 4096, "KV": 1024, "F": 14336, "HD": 128},
    "1b": {"D": 2048, "Q": 2048, "KV": 512, "F": 8192, "HD": 64},
}
DRY_SHAPES = {"tiny": {"D": 64, "Q": 64, "KV": 32, "F": 96, "HD": 16}}
POS, CACHE = 1087, 2048
# (BO, BK) pairs each GEMV-like kernel is also instantiated with.
SWEEP = [(8, 512), (16, 512), (32, 256), (64, 128)]
DRY_SWEEP = [(16, 32)]
EPS = 1e-5


@dataclass
class Span:
    """One span op at one shape: its generics, a torch.nn.functional form of its body
    (``reference``: cuBLAS products), and which kernel generics the sweep varies."""

    label: str  # what the row is (q, kv, gate, down, ...)
    op: str
    generics: dict[str, Any]
    reference: Callable[..., Any]
    sweep_keys: tuple[str, ...] = ("BO", "BK")
    scalars: dict[str, Any] = field(default_factory=dict)
    sweep: list[tuple[int, ...]] | None = None  # values for sweep_keys (default: --sweep's)
    prepare: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None  # fix inputs
    live_bytes: int | None = None  # the floor's bytes, where not every input is read


def spans(shape: dict[str, int], rows: int = 1) -> list[Span]:
    """The span ops of std.nn.decode at one model shape: every product of a decoder layer
    by `linear_gemv`, then the fused spans as a decoder layer has them."""
    d, q, kv, f, hd = shape["D"], shape["Q"], shape["KV"], shape["F"], shape["HD"]
    mod = "std.nn.decode::"
    eps = {"eps": EPS}

    def rope(y: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, hd: int) -> torch.Tensor:
        """`rope_with` of y's heads (rotate-half, the angle pos * inv_freq in f32)."""
        x = y.view(y.shape[0], -1, hd)
        angle = (pos.float()[:, None] * inv[None, :]).repeat(1, 2)[:, None, :]
        turned = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return (x.float() * angle.cos() + turned.float() * angle.sin()).to(x.dtype)

    def norm(x: torch.Tensor, nw: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), nw, EPS)

    def lin(label: str, i: int, o: int, op: str = "linear_gemv") -> Span:
        return Span(
            label, mod + op, {"N": rows, "I": i, "O": o, "T": "bf16"}, lambda x, w: F.linear(x, w)
        )

    def qkv_rope(
        x: torch.Tensor,
        nw: torch.Tensor,
        wq: torch.Tensor,
        wk: torch.Tensor,
        wv: torch.Tensor,
        pos: torch.Tensor,
        inv: torch.Tensor,
    ) -> tuple:
        """`rms_norm_qkv_rope`'s body in torch: q and k rotated, v as heads."""
        h = norm(x, nw)
        return (
            rope(F.linear(h, wq), pos, inv, hd),
            rope(F.linear(h, wk), pos, inv, hd),
            F.linear(h, wv).view(rows, -1, hd),
        )

    rope_generics = {"N": rows, "D": d, "H": q // hd, "KV": kv // hd, "HD": hd, "T": "bf16"}
    # Split-K chains, swept over (BK, KS) at BO = 8; the q/k/v and o chains over (BO, BK, KS):
    # a program's share of a small weight (50 MB at 8B, 12.6 MB at 1B) is a few KiB at BO = 8.
    split_sweep = [(512, 2), (512, 4), (512, 8), (256, 4), (256, 8), (256, 16)]
    # (H200, session 15: every triple within 2% of the binding's or slower; KS = 1 2x slower.)
    wide_sweep = [(8, 512, 8), (16, 256, 4), (32, 256, 2), (16, 128, 8), (8, 256, 8)]

    def split(label: str, i: int, o: int, op: str) -> Span:
        return Span(
            label,
            mod + op,
            {"N": rows, "I": i, "O": o, "T": "bf16"},
            lambda x, w: F.linear(x, w),
            sweep_keys=("BK", "KS"),
            sweep=split_sweep,
        )

    products = [
        (f"q {d}->{q}", d, q),
        (f"kv {d}->{kv}", d, kv),
        (f"o {q}->{d}", q, d),
        (f"gate {d}->{f}", d, f),
        (f"down {f}->{d}", f, d),
    ]
    return [
        *(lin(*p) for p in products),
        *(lin(*p, op="linear_gemv_row") for p in products),
        *(lin(*p, op="linear_gemv_dot") for p in products),
        *(split(*p, "linear_split") for p in products),
        *(split(*p, "linear_split_wide") for p in products),
        *(
            Span(
                f"{lab}+residual {i}->{o}",
                mod + "linear_residual_split",
                {"N": rows, "I": i, "O": o, "T": "bf16"},
                lambda x, w, r: r + F.linear(x, w),
                sweep_keys=("BO@0", "BK", "KS"),
                sweep=wide_sweep,
            )
            for lab, i, o in [("o", q, d), ("down", f, d)]
        ),
        Span(
            f"norm+q {d}->{q}",
            mod + "rms_norm_linear",
            {"N": rows, "D": d, "O": q, "T": "bf16"},
            lambda x, nw, w: F.linear(norm(x, nw), w),
            scalars=eps,
        ),
        Span(
            f"norm+qkv {d}->{q}+2x{kv}",
            mod + "rms_norm_qkv",
            {"N": rows, "D": d, "Q": q, "K": kv, "T": "bf16"},
            lambda x, nw, wq, wk, wv: (
                lambda h: (F.linear(h, wq), F.linear(h, wk), F.linear(h, wv))
            )(norm(x, nw)),
            scalars=eps,
        ),
        Span(
            f"norm+qkv {d}->{q}+2x{kv}",
            mod + "rms_norm_qkv_split",
            {"N": rows, "D": d, "Q": q, "K": kv, "T": "bf16"},
            lambda x, nw, wq, wk, wv: (
                lambda h: (F.linear(h, wq), F.linear(h, wk), F.linear(h, wv))
            )(norm(x, nw)),
            scalars=eps,
            sweep_keys=("BK", "KS"),
            sweep=split_sweep,
        ),
        # The attention input up to the cache writes, in one launch and by split-K.
        Span(
            f"norm+qkv+rope {d}->{q}+2x{kv}",
            mod + "rms_norm_qkv_rope",
            rope_generics,
            qkv_rope,
            scalars=eps,
            sweep=[(4, 512), (8, 512), (8, 256), (16, 256)],
        ),
        Span(
            f"norm+qkv+rope {d}->{q}+2x{kv}",
            mod + "rms_norm_qkv_rope_split",
            rope_generics,
            qkv_rope,
            scalars=eps,
            sweep_keys=("BO@0", "BK", "KS"),
            sweep=wide_sweep,
        ),
        Span(
            f"norm+gate/up {d}->2x{f}",
            mod + "rms_norm_gate_up",
            {"N": rows, "D": d, "F": f, "T": "bf16"},
            lambda x, nw, wg, wu: (lambda h: F.silu(F.linear(h, wg)) * F.linear(h, wu))(
                norm(x, nw)
            ),
            scalars=eps,
        ),
        Span(
            f"gate/up {d}->2x{f}",
            mod + "gate_up_silu",
            {"N": rows, "D": d, "F": f, "T": "bf16"},
            lambda x, wg, wu: F.silu(F.linear(x, wg)) * F.linear(x, wu),
        ),
        Span(
            f"o+residual {q}->{d}",
            mod + "linear_residual",
            {"N": rows, "I": q, "O": d, "T": "bf16"},
            lambda x, w, r: r + F.linear(x, w),
        ),
        Span(
            f"down+residual {f}->{d}",
            mod + "linear_residual",
            {"N": rows, "I": f, "O": d, "T": "bf16"},
            lambda x, w, r: r + F.linear(x, w),
        ),
        attention(shape, rows),
        *flash_attention(shape, rows),
        *(
            qkv_attention(shape, rows, op, qkv_rope)
            for op in ("rms_norm_qkv_rope_attention", "rms_norm_qkv_rope_attention_wide")
        ),
    ]


def qkv_attention(shape: dict[str, int], rows: int, op: str, qkv_rope: Callable[..., Any]) -> Span:
    """The attention input and the attention as one chain (`rms_norm_qkv_rope_attention`:
    the q/k/v products' split-K part, the splits that finish them and attend, the combine),
    at the attention row's position and cache; the reference is `rms_norm_qkv_rope`'s
    (cuBLAS products), the rows written into the cache in place, then SDPA."""
    hd = shape["HD"]
    kv, g = shape["KV"] // hd, shape["Q"] // shape["KV"]
    scale = hd**-0.5
    last = min(POS, CACHE - 1) if not DRY else 5
    cache = CACHE if not DRY else 8

    def prepare(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        x, nw, wq, wk, wv, pos, inv, k, v = inputs
        return [x, nw, wq, wk, wv, torch.full_like(pos, last), inv, k, v]

    def reference(
        x: torch.Tensor,
        nw: torch.Tensor,
        wq: torch.Tensor,
        wk: torch.Tensor,
        wv: torch.Tensor,
        pos: torch.Tensor,
        inv: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple:
        qr, kr, vr = qkv_rope(x, nw, wq, wk, wv, pos, inv)
        b, s = k.shape[0], k.shape[1]
        rows_ = torch.arange(b, device=k.device)
        k.index_put_((rows_, pos), kr)
        v.index_put_((rows_, pos), vr)
        mask = (torch.arange(s, device=x.device)[None, :] <= pos[:, None])[:, None, None, :]
        o = F.scaled_dot_product_attention(
            qr.reshape(b, kv * g, 1, hd),
            k.permute(0, 2, 1, 3),
            v.permute(0, 2, 1, 3),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        return o.reshape(b, kv, g, hd), kr, vr

    weights = (shape["Q"] + 2 * shape["KV"]) * shape["D"] * 2
    live = weights + 2 * rows * (last + 1) * kv * hd * 2
    generics = {"N": rows, "D": shape["D"], "KV": kv, "G": g, "HD": hd, "S": cache, "T": "bf16"}
    return Span(
        f"norm+qkv+rope+attention pos {last} of {cache}",
        "std.nn.decode::" + op,
        generics,
        reference,
        sweep_keys=("BK",),
        scalars={"eps": EPS, "scale": scale},
        sweep=[],
        prepare=prepare,
        live_bytes=live,
    )


def attention(
    shape: dict[str, int],
    rows: int,
    op: str = "decode_attention_flash",
    sweep_keys: tuple[str, ...] = ("BS", "BD"),
    sweep: list[tuple[int, ...]] | None = None,
) -> Span:
    """Decode attention of `rows` sequences at position POS of a cache of CACHE positions."""
    hd = shape["HD"]
    kv, g = shape["KV"] // hd, shape["Q"] // shape["KV"]
    scale = hd**-0.5
    last = min(POS, CACHE - 1) if not DRY else 5

    def prepare(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        q, k, v, pos = inputs
        return [q, k, v, torch.full_like(pos, last)]

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, s = k.shape[0], k.shape[1]
        mask = (torch.arange(s, device=q.device)[None, :] <= pos[:, None])[:, None, None, :]
        o = F.scaled_dot_product_attention(
            q.reshape(b, kv * g, 1, hd),
            k.permute(0, 2, 1, 3),
            v.permute(0, 2, 1, 3),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        return o.reshape(b, kv, g, hd)

    cache = CACHE if not DRY else 8
    live = 2 * rows * (last + 1) * kv * hd * 2 + 2 * rows * kv * g * hd * 2
    return Span(
        f"attention pos {last} of {cache}",
        "std.nn.decode::" + op,
        {"B": rows, "S": cache, "KV": kv, "G": g, "HD": hd, "T": "bf16"},
        sdpa,
        sweep_keys=sweep_keys,
        scalars={"scale": scale},
        sweep=[(32, 16), (64, 32), (128, 16), (32, 32)] if sweep is None else sweep,
        prepare=prepare,
        live_bytes=live,
    )


def flash_attention(shape: dict[str, int], rows: int) -> list[Span]:
    """The flash-decoding ops (a split kernel then a combine kernel) at the same position and
    cache as `attention`, each swept over (BS, NS): cache blocks of BS positions, NS splits
    (the combine's NS follows). decode_attention_split and decode_attention_split_short (its
    combine over 32 value columns a program, one step up to 32 splits): splits of 32 to 256
    positions; decode_attention_split_long: of 256 to 1024 (for `--cache 32768`)."""
    cache = CACHE if not DRY else 8

    def splits(length: int) -> int:
        return -(-cache // length)

    short = [
        (bs, splits(n))
        for bs, n in [(16, 64), (64, 64), (32, 128), (64, 128), (32, 256), (32, 32), (16, 32)]
    ]
    long = [(bs, splits(n)) for bs, n in [(64, 256), (32, 512), (64, 1024), (128, 512)]]
    return [
        attention(shape, rows, "decode_attention_split", ("BS", "NS"), short),
        attention(shape, rows, "decode_attention_split_short", ("BS", "NS"), short),
        attention(shape, rows, "decode_attention_split_long", ("BS", "NS"), long),
        # One launch: the last split of each head combines (BN = 32 >= NS).
        attention(
            shape,
            rows,
            "decode_attention_split_once",
            ("BS", "NS"),
            [(bs, ns) for bs, ns in short if ns <= 32],
        ),
    ]


# ---------------------------------------------------------------- timing


def graph_us(
    fn: Callable[..., Any], copies: list[list[torch.Tensor]], reps: int, repeats: int = 5
) -> float:
    """Device microseconds per call of ``fn(*inputs)``: ``reps`` calls captured in one CUDA
    graph, call i reading ``copies[i % len(copies)]``, replayed ``repeats`` times (median)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in copies:
            fn(*c)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(*copies[i % len(copies)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / reps)
    return statistics.median(times)


# ---------------------------------------------------------------- one span


def _outs(v: Any) -> tuple[torch.Tensor, ...]:
    return v if isinstance(v, tuple) else (v,)


def body_function(
    path: Path, device: str, inputs: list[torch.Tensor], compile_mode: str = ""
) -> Callable[..., Any]:
    """The generated PyTorch of the case's one slice (the op's body), numerics exact; with
    ``compile_mode``, the slice's function compiled (torch.compile of the generated function
    itself: each case's is its own code object, so no case recompiles another's)."""
    model = load(path, weights={}, device=device, numerics="exact")
    module = model.module("run", inputs)
    entry = module.ENTRIES["run"]
    (sl,) = entry["slices"]
    fn = getattr(module, sl["function"])
    if compile_mode:
        fn = torch.compile(fn, mode=compile_mode, dynamic=False)
    # The slice takes the values it reads in its own order, and returns what it makes in
    # its own (not the entry's: rms_norm_qkv_rope's v comes first): pick both by name.
    order = [entry["inputs"].index(name) for name in sl["inputs"]]
    pick = [sl["outputs"].index(name) for name in entry["outputs"]]

    def body(*args: torch.Tensor) -> Any:
        made = _outs(fn(*(args[i] for i in order)))
        picked = tuple(made[i] for i in pick)
        return picked if len(picked) > 1 else picked[0]

    return body


def _key(name: str) -> str:
    """A sweep key's generic: ``BO`` of ``BO@0`` (the first stage's BO only)."""
    return name.partition("@")[0]


def _stage(name: str) -> int | None:
    """Which stage of a chain a sweep key sets (``BO@0``: the first), or None for all."""
    at = name.partition("@")[2]
    return int(at) if at else None


def run_span(span: Span, device: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows for one span at one shape: the body's and cuBLAS's times, then one row per
    tile configuration of the kernel (its check and its time)."""
    case = op_case(span.op, span.generics, span.scalars or None)
    # The kernels the op launches in turn (two for a chain: the second takes the op's inputs
    # then the first's results); a sweep's generics replace those of each that has them.
    bound, _ = stages(None, span.op, span.generics)
    base = dict(case.kernel_generics)
    pairs = span.sweep if span.sweep is not None and not args.dry_run else args.sweep
    if len(bound) == 2 and args.dry_run:  # the tiny shapes: several chunks a split, one past I
        pairs = [tuple({"BK": 16, "KS": 3}.get(_key(k), base[_key(k)]) for k in span.sweep_keys)]
    # A staged key (``BO@0``) stands in its config for the generic it sets (``BO``).
    staged = {_key(k) for k in span.sweep_keys if _stage(k) is not None}
    configs = [base] + [
        {k: v for k, v in base.items() if k not in staged} | dict(zip(span.sweep_keys, pair))
        for pair in pairs
        if tuple(base[_key(k)] for k in span.sweep_keys) != pair
    ]
    ncopies = args.copies if device == "cuda" else 1
    # Weights (w*) scaled by 1 / sqrt(fan-in), as a trained layer's are, so that products
    # stay near 1 and the bf16 differences read as a model's would.
    scale = [
        1 / (shape[-1] ** 0.5) if name.startswith("w") else 1.0 for name, shape, _ in case.inputs
    ]
    copies = [
        [t * s if s != 1.0 else t for t, s in zip(case.random_inputs(device, seed=i), scale)]
        for i in range(ncopies)
    ]
    if span.prepare is not None:
        copies = [span.prepare(c) for c in copies]
    inputs = copies[0]
    out: list[dict[str, Any]] = []
    nbytes = sum(t.numel() * t.element_size() for t in inputs)
    nbytes += sum(
        math_prod(s) * torch.empty((), dtype=_dt(d)).element_size() for _, s, d in case.results
    )
    if span.live_bytes is not None:
        nbytes = span.live_bytes
    common = {
        "op": span.op.rsplit("::", 1)[-1],
        "label": span.label,
        "generics": span.generics,
        "bytes": nbytes,
        "floor_us": nbytes / FLOOR_BW * 1e6,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(case.text)
        body = body_function(path, device, inputs)
        want = _outs(body(*inputs))
        dtypes = [d for _, _, d in case.results]
        ref = _outs(span.reference(*inputs))
        ref_diff = max(float((r.float() - w.float()).abs().max()) for r, w in zip(ref, want))
        times: dict[str, float] = {}
        if device == "cuda":
            times["cublas_us"] = graph_us(span.reference, copies, args.reps)
            if not args.no_compile:
                try:
                    compiled = body_function(path, device, inputs, args.compile_mode)
                    got = _outs(compiled(*inputs))
                    times["body_compiled_us"] = graph_us(compiled, copies, args.reps)
                    times["body_compiled_diff"] = max(
                        float((g.float() - w.float()).abs().max()) for g, w in zip(got, want)
                    )
                except Exception as exc:  # the kernel rows still stand
                    traceback.print_exc()
                    times["body_compiled_error"] = f"{type(exc).__name__}: {exc}"[:200]
        for i, kgen in enumerate(configs):
            kernel = " then ".join(k.rsplit("::", 1)[-1] for k, _ in bound)
            row = (
                dict(common)
                | times
                | {
                    "kernel": kernel,
                    "kernel_generics": kgen,
                    "bound": i == 0,
                    "reference_diff": ref_diff,
                }
            )
            extra: list[dict[str, Any]] = []
            try:
                # The swept generics only: the stages' own tiles may differ (flash-decoding's
                # split takes 16 query heads a program, its combine 4).
                chain = [
                    (
                        k,
                        g
                        | {
                            _key(n): kgen.get(n, kgen.get(_key(n)))
                            for n in span.sweep_keys
                            if _key(n) in g and _stage(n) in (None, at)
                        },
                    )
                    for at, (k, g) in enumerate(bound)
                ]
                if not all(resolve(None, k, g)[2] for k, g in chain):
                    row["error"] = "where clause false"
                    out.append(row)
                    continue
                mods = [kernel_module(None, k, g, case.scalars, args.precision) for k, g in chain]
                launch = mods[0].LAUNCH if len(mods) == 1 else _chain(*mods)
                got = _outs(launch(*inputs))
                diff = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
                # The kernel checker's tolerance (linnet kernels): per element, relative to
                # the body's value and the result's scale.
                ok = all(compare(g, w, d)[0] is None for g, w, d in zip(got, want, dtypes))
                row.update(max_diff=diff, ok=ok)
                if device == "cuda":
                    row["kernel_us"] = graph_us(launch, copies, args.reps)
                # The same kernels under other Triton launch options (every kernel of the
                # chain: num_warps, num_stages), each checked and timed as above.
                for opt in args.launch:
                    saved = [(m.PDL_LAUNCH, m.PDL) for m in mods]
                    again = dict(
                        row, kernel_generics=kgen | {"launch": _opt_name(opt)}, bound=False
                    )
                    try:
                        for m in mods:
                            if "pdl" in opt:  # a PDL mode (4, 5: prefetching), not an option
                                m.PDL = opt["pdl"] if m.PDL else 0
                                continue
                            m.PDL_LAUNCH = {k: dict(v, **opt) for k, v in m.PDL_LAUNCH.items()}
                        got = _outs(launch(*inputs))
                        again.update(
                            ok=all(
                                compare(g, w, d)[0] is None for g, w, d in zip(got, want, dtypes)
                            ),
                            max_diff=max(
                                float((g.float() - w.float()).abs().max())
                                for g, w in zip(got, want)
                            ),
                        )
                        if device == "cuda":
                            again["kernel_us"] = graph_us(launch, copies, args.reps)
                    except Exception as exc:
                        traceback.print_exc()
                        again["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    finally:
                        for m, (launch_opts, pdl) in zip(mods, saved):
                            m.PDL_LAUNCH, m.PDL = launch_opts, pdl
                    extra.append(again)
            except Exception as exc:  # one configuration's failure does not hide the others
                traceback.print_exc()
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            out.append(row)
            out.extend(extra)
    return out


def _opt_name(opt: dict[str, int]) -> str:
    """``w4s1`` for num_warps 4, num_stages 1; ``pdl4`` for PDL mode 4."""
    if "pdl" in opt:
        return f"pdl{opt['pdl']}"
    return f"w{opt.get('num_warps', 4)}s{opt.get('num_stages', 3)}"


def _launch_option(text: str) -> dict[str, int]:
    """``w4s1`` -> num_warps 4, num_stages 1; ``pdl4`` -> PDL mode 4 (late, prefetching)."""
    pdl = re.fullmatch(r"pdl([0-5])", text)
    if pdl:
        return {"pdl": int(pdl.group(1))}
    opts = re.fullmatch(r"w(\d+)s(\d+)", text)
    if opts is None:
        raise SystemExit(f"--launch {text!r}: not wNsM (num_warps, num_stages) nor pdlN")
    return {"num_warps": int(opts.group(1)), "num_stages": int(opts.group(2))}


def _chain(first: Any, *rest: Any) -> Callable[..., Any]:
    """A chain's launch: the first kernel on the op's leading inputs it takes, each next one
    on the op's inputs then the results of the one before it (allocated by its launcher, as
    the chain's are)."""
    import inspect

    taken = len(inspect.signature(first.LAUNCH).parameters)

    def launch(*inputs: torch.Tensor) -> Any:
        got = first.LAUNCH(*inputs[:taken])
        for m in rest:
            got = m.LAUNCH(*inputs, *_outs(got))
        return got

    return launch


def math_prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _dt(dtype: str) -> torch.dtype:
    from linnet.lang.emit.torch import TORCH_DTYPES

    return eval(TORCH_DTYPES[dtype], {"torch": torch})


# ---------------------------------------------------------------- main


def main() -> int:
    global CACHE, POS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8b,1b")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--reps", type=int, default=64)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--sweep", default="", help="BO:BK pairs, comma-separated")
    parser.add_argument(
        "--launch",
        default="",
        help="also time each configuration under these Triton launch options: "
        "w4s1 = num_warps 4, num_stages 1; pdl4 = PDL mode 4 (late, "
        "prefetching), pdl5 (early, prefetching) (comma-separated)",
    )
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rows", type=int, default=1, help="rows (batch) of the step")
    parser.add_argument(
        "--cache",
        type=int,
        default=CACHE,
        help="attention: the cache's positions (default %(default)s)",
    )
    parser.add_argument(
        "--pos",
        type=int,
        default=POS,
        help="attention: the last position attended (default %(default)s)",
    )
    parser.add_argument(
        "--compile-mode",
        default="max-autotune-no-cudagraphs",
        help="torch.compile mode of the body column (default: %(default)s)",
    )
    parser.add_argument(
        "--precision",
        default="tf32",
        choices=["tf32", "ieee"],
        help="f32 tl.dot precision (numerics fast launches tf32)",
    )
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    CACHE, POS = args.cache, args.pos
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on the CPU", file=sys.stderr)
        return 2
    args.copies = max(args.copies, 8)
    args.reps = max(args.reps, args.copies)
    args.sweep = (
        [tuple(int(v) for v in p.split(":")) for p in args.sweep.split(",")]
        if args.sweep
        else (DRY_SWEEP if args.dry_run else SWEEP)
    )
    args.launch = [_launch_option(o) for o in args.launch.split(",") if o]
    shapes = DRY_SHAPES if args.dry_run else {k: SHAPES[k] for k in args.shapes.split(",")}
    wanted = {o for o in args.ops.split(",") if o}
    bw = copy_bandwidth(torch.device("cuda")) if device == "cuda" else float("nan")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; floors at {FLOOR_BW / 1e12:.1f} TB/s")
    rows: list[dict[str, Any]] = []
    for name, shape in shapes.items():
        for span in spans(shape, args.rows):
            short = span.op.rsplit("::", 1)[-1]
            if wanted and short not in wanted:
                continue
            print(f"{name} {span.label} ({short})", flush=True)
            try:
                for r in run_span(span, device, args):
                    rows.append({"shape": name} | r)
            except Exception as exc:
                traceback.print_exc()
                rows.append(
                    {
                        "shape": name,
                        "op": short,
                        "label": span.label,
                        "error": f"{type(exc).__name__}: {exc}"[:300],
                    }
                )
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton_version(),
        "copy_bytes_per_s": bw,
        "floor_bytes_per_s": FLOOR_BW,
        "rows": rows,
    }
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "decode_kernels.json").write_text(json.dumps(result, indent=1))
    print(
        f"\nus per call inside a CUDA graph ({args.reps} calls over {args.copies} input "
        "copies); body.c = the op's body compiled (max-autotune-no-cudagraphs); cublas = "
        "the torch.nn.functional form; * = the op's own binding"
    )
    print(
        f"{'shape':<5} {'op':<27} {'product':<24} {'tiles':<26} {'ok':<3} {'diff':>8} "
        f"{'kernel':>8} {'body.c':>8} {'cublas':>8} {'floor':>8} {'%floor':>6}"
    )
    ok = True
    for r in rows:
        if "error" in r and "kernel_generics" not in r:
            print(f"{r['shape']:<5} {r['op']:<27} {r['label']:<24} error: {r['error'][:60]}")
            ok = False
            continue
        kg = r["kernel_generics"]
        tiles = ("*" if r["bound"] else " ") + ",".join(
            f"{k}={kg[k]}"
            for k in kg
            if (k.startswith("B") and k not in r["generics"]) or k in ("KS", "NS", "launch")
        )
        if "error" in r:
            print(
                f"{r['shape']:<5} {r['op']:<27} {r['label']:<24} {tiles:<26} error: "
                f"{r['error'][:50]}"
            )
            ok = ok and r["error"] == "where clause false"
            continue
        ok = ok and r["ok"]
        k_us = r.get("kernel_us", float("nan"))
        print(
            f"{r['shape']:<5} {r['op']:<27} {r['label']:<24} {tiles:<26} "
            f"{'yes' if r['ok'] else 'NO':<3} {r['max_diff']:>8.1e} {k_us:>8.2f} "
            f"{r.get('body_compiled_us', float('nan')):>8.2f} "
            f"{r.get('cublas_us', float('nan')):>8.2f} {r['floor_us']:>8.2f} "
            f"{100 * r['floor_us'] / k_us if k_us == k_us else float('nan'):>6.1f}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
