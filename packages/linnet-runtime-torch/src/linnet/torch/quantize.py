"""Quantising float weights on load (``load(..., quantize="int8" | "int4")``), on the device.

Round to nearest, per group of ``group`` consecutive inputs of each output row, with f16
scales: the formats ``std.nn.linear::linear_q8`` and ``linear_q4`` define.

* **int8** (symmetric): ``s = max|w| / 127`` rounded to f16, ``q = round(w / s)`` in
  [-127, 127]. The error of a weight is at most half a step, ``s / 2``.
* **int4** (asymmetric, as GGUF's Q4_1): ``m = min w`` and ``d = (max w - min w) / 15``, each
  rounded to f16, ``level = round((w - m) / d)`` in [0, 15]; two levels a byte, input 2j in
  the low nibble. The error is at most ``d / 2`` (plus the rounding of m to f16).

A group whose weights are all equal has ``s = 0`` / ``d = 0`` and quantises exactly.

>>> q, s = quantize_q8(torch.tensor([[1.0, -2.0, 0.5, 0.0]]), 2)
>>> q.tolist(), s.tolist()
([[64, -127, 127, 0]], [[0.0157470703125, 0.003936767578125]])
"""

from __future__ import annotations

from collections.abc import Callable

from linnet.lang.host.quantize import Layout, scale_overflow

import torch


def _groups(w: torch.Tensor, group: int) -> torch.Tensor:
    out, inputs = w.shape
    return w.to(torch.float32).reshape(out, inputs // group, group)


def _scale(values: torch.Tensor, name: str) -> torch.Tensor:
    """f32 scales rounded to f16; one that overflows f16 is E0684 (weights beyond ~8e6)."""
    half = values.to(torch.float16)
    if not bool(torch.isfinite(half).all()):
        raise scale_overflow(name)
    return half


def quantize_q8(w: torch.Tensor, group: int, name: str = "weight") -> tuple[torch.Tensor, ...]:
    """``(q [O, I] int8, s [O, I / group] f16)`` of a float ``w [O, I]`` (module docstring).

    >>> quantize_q8(torch.ones(2, 4), 4)[0].tolist()
    [[127, 127, 127, 127], [127, 127, 127, 127]]
    """
    g = _groups(w, group)
    s = _scale(g.abs().amax(dim=-1) / 127.0, name)
    s32 = s.to(torch.float32).unsqueeze(-1)
    safe = torch.where(s32 == 0, torch.ones_like(s32), s32)
    q = torch.round(g / safe).clamp_(-127, 127).to(torch.int8)
    return q.reshape(w.shape), s


def quantize_q4(w: torch.Tensor, group: int, name: str = "weight") -> tuple[torch.Tensor, ...]:
    """``(q [O, I / 2] uint8, d [O, I / group] f16, m [O, I / group] f16)`` of a float
    ``w [O, I]``: two 4-bit levels a byte, input 2j in the low nibble (module docstring).

    >>> q, d, m = quantize_q4(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), 4)
    >>> q.tolist(), d.tolist(), m.tolist()
    ([[80, 250]], [[0.199951171875]], [[0.0]])
    """
    g = _groups(w, group)
    lo = g.amin(dim=-1)
    m = _scale(lo, name)
    d = _scale((g.amax(dim=-1) - lo) / 15.0, name)
    d32 = d.to(torch.float32).unsqueeze(-1)
    safe = torch.where(d32 == 0, torch.ones_like(d32), d32)
    level = torch.round((g - m.to(torch.float32).unsqueeze(-1)) / safe).clamp_(0, 15)
    level = level.to(torch.uint8).reshape(w.shape)
    return pack_q4(level), d, m


def pack_q4(level: torch.Tensor) -> torch.Tensor:
    """``[O, I]`` levels 0..15 packed two a byte into ``[O, I / 2]`` uint8: input 2j in the
    low nibble, 2j + 1 in the high one (what ``linear_q4`` reads).

    >>> pack_q4(torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)).tolist()
    [[33, 15]]
    """
    return level[:, 0::2] | (level[:, 1::2] << 4)


def dequantize_q8(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float weight ``linear_q8``'s body computes: ``(q * s)`` in f32, rounded to dtype.

    >>> dequantize_q8(torch.tensor([[2, -1]], dtype=torch.int8),
    ...               torch.tensor([[0.5]], dtype=torch.float16), torch.float32).tolist()
    [[1.0, -0.5]]
    """
    out, inputs = q.shape
    group = inputs // s.shape[1]
    w = q.to(torch.float32).reshape(out, -1, group) * s.to(torch.float32).unsqueeze(-1)
    return w.reshape(out, inputs).to(dtype)


def dequantize_q4(
    q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The float weight ``linear_q4``'s body computes: ``d * level + m`` in f32, rounded.

    >>> dequantize_q4(torch.tensor([[33]], dtype=torch.uint8),
    ...               torch.tensor([[0.5]], dtype=torch.float16),
    ...               torch.tensor([[-1.0]], dtype=torch.float16), torch.float32).tolist()
    [[-0.5, 0.0]]
    """
    out = q.shape[0]
    level = torch.stack([q & 15, q >> 4], dim=-1).reshape(out, -1)
    group = level.shape[1] // d.shape[1]
    w = level.to(torch.float32).reshape(out, -1, group) * d.to(torch.float32).unsqueeze(-1) + m.to(
        torch.float32
    ).unsqueeze(-1)
    return w.reshape(out, -1).to(dtype)


def dequantized(params: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``params`` with each quantised weight (``X.weight_q8`` and ``X.weight_scale``, or
    ``X.weight_q4``, ``X.weight_scale`` and ``X.weight_min``) replaced by the float
    ``X.weight`` the op bodies compute, rounded to ``dtype``: a quantised model's weights as
    a float checkpoint has them (to inspect, compare or save them).

    >>> w = dequantized(model.params, torch.float32)["lm_head.weight"]  # doctest: +SKIP
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in params.items():
        if name.endswith((".weight_scale", ".weight_min")):
            continue
        stem = name[: -len("_q8")]
        if name.endswith(".weight_q8"):
            out[stem] = dequantize_q8(t, params[stem + "_scale"], dtype)
        elif name.endswith(".weight_q4"):
            out[stem] = dequantize_q4(t, params[stem + "_scale"], params[stem + "_min"], dtype)
        else:
            out[name] = t
    return out


def quantizer(
    layout: Layout, check: Callable[[str, torch.Tensor], None] | None = None
) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A loader's per-tensor step: each float weight ``layout`` quantises becomes its
    quantised tensors (on its own device), every other tensor passes as it is; ``check``
    (the finite check) sees each float weight first.

    >>> step = quantizer(layout)                     # doctest: +SKIP
    >>> sorted(step("lm_head.weight", w))            # doctest: +SKIP
    ['lm_head.weight_q4', 'lm_head.weight_min', 'lm_head.weight_scale']
    """
    bits = int(layout.config["weight_bits"])
    group = layout.group

    def step(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
        targets = layout.sources.get(name)
        if targets is None:
            return {name: t}
        if check is not None:
            check(name, t)
        with torch.no_grad():
            parts = quantize_q8(t, group, name) if bits == 8 else quantize_q4(t, group, name)
        return dict(zip(targets, (p.contiguous() for p in parts)))

    return step


__all__ = [
    "dequantize_q4",
    "dequantize_q8",
    "dequantized",
    "pack_q4",
    "quantize_q4",
    "quantize_q8",
    "quantizer",
]
