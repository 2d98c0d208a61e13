"""Quantising float weights on load (``load(..., quantize="int8" | "int4")``), on the host.

The same round-to-nearest formats as ``linnet.torch.quantize`` (the std ops ``linear_q8`` and
``linear_q4`` define them): int8 symmetric, ``s = max|w| / 127`` per group rounded to f16;
int4 asymmetric, ``m = min w`` and ``d = (max w - min w) / 15`` rounded to f16, two levels a
byte with input 2j in the low nibble. Computed in f32 NumPy, one tensor at a time.

>>> q, s = quantize_q8(np.array([[1.0, -2.0, 0.5, 0.0]], np.float32), 2)
>>> q.tolist(), s.tolist()
([[64, -127, 127, 0]], [[0.0157470703125, 0.003936767578125]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from linnet.lang.host.quantize import Layout, scale_overflow


def _groups(w: Any, group: int) -> np.ndarray:
    a = np.asarray(w, dtype=np.float32)
    return a.reshape(a.shape[0], a.shape[1] // group, group)


def _half(values: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    if not np.isfinite(half).all():
        raise scale_overflow(name)
    return half


def _rint(x: np.ndarray) -> np.ndarray:
    # Half to even, as torch.round.
    return np.rint(x)


def quantize_q8(w: Any, group: int, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """``(q [O, I] int8, s [O, I / group] f16)`` of a float ``w [O, I]``.

    >>> quantize_q8(np.ones((1, 4), np.float32), 4)[0].tolist()
    [[127, 127, 127, 127]]
    """
    g = _groups(w, group)
    s = _half(np.abs(g).max(axis=-1) / np.float32(127.0), name)
    s32 = s.astype(np.float32)[..., None]
    safe = np.where(s32 == 0, np.float32(1.0), s32)
    q = np.clip(_rint(g / safe), -127, 127).astype(np.int8)
    return q.reshape(g.shape[0], -1), s


def quantize_q4(w: Any, group: int, name: str = "weight") -> tuple[np.ndarray, ...]:
    """``(q [O, I / 2] uint8, d [O, I / group] f16, m [O, I / group] f16)`` of ``w [O, I]``.

    >>> q, d, m = quantize_q4(np.array([[0.0, 1.0, 2.0, 3.0]], np.float32), 4)
    >>> q.tolist(), d.tolist(), m.tolist()
    ([[80, 250]], [[0.199951171875]], [[0.0]])
    """
    g = _groups(w, group)
    lo = g.min(axis=-1)
    m = _half(lo, name)
    d = _half((g.max(axis=-1) - lo) / np.float32(15.0), name)
    d32 = d.astype(np.float32)[..., None]
    safe = np.where(d32 == 0, np.float32(1.0), d32)
    level = np.clip(_rint((g - m.astype(np.float32)[..., None]) / safe), 0, 15)
    level = level.astype(np.uint8).reshape(g.shape[0], -1)
    return (level[:, 0::2] | (level[:, 1::2] << 4)).astype(np.uint8), d, m


def dequantized(params: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """``params`` with each quantised weight replaced by the float ``X.weight`` the op
    bodies compute (f32, then ``dtype``), as NumPy arrays.

    >>> w = dequantized(model.params, np.float32)["lm_head.weight"]  # doctest: +SKIP
    """
    out: dict[str, Any] = {}
    for name, t in params.items():
        if name.endswith((".weight_scale", ".weight_min")):
            continue
        stem = name[: -len("_q8")]
        if name.endswith(".weight_q8"):
            q = np.asarray(t, dtype=np.float32)
            s = np.asarray(params[stem + "_scale"]).astype(np.float32)
            w = q.reshape(q.shape[0], s.shape[1], -1) * s[..., None]
            out[stem] = w.reshape(q.shape).astype(dtype)
        elif name.endswith(".weight_q4"):
            packed = np.asarray(t, dtype=np.uint8)
            level = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
            d = np.asarray(params[stem + "_scale"]).astype(np.float32)
            m = np.asarray(params[stem + "_min"]).astype(np.float32)
            w = level.astype(np.float32).reshape(packed.shape[0], d.shape[1], -1) * d[..., None]
            out[stem] = (w + m[..., None]).reshape(level.shape).astype(dtype)
        else:
            out[name] = t
    return out


def quantizer(layout: Layout) -> Callable[[str, Any], dict[str, np.ndarray]]:
    """The per-tensor step of a load: each float weight ``layout`` quantises becomes its
    quantised arrays; every other passes as it is.

    >>> sorted(quantizer(layout)("lm_head.weight", w))   # doctest: +SKIP
    ['lm_head.weight_q4', 'lm_head.weight_min', 'lm_head.weight_scale']
    """
    bits, group = int(layout.config["weight_bits"]), layout.group

    def step(name: str, t: Any) -> dict[str, Any]:
        targets = layout.sources.get(name)
        if targets is None:
            return {name: t}
        parts = quantize_q8(t, group, name) if bits == 8 else quantize_q4(t, group, name)
        return dict(zip(targets, parts))

    return step


__all__ = ["dequantized", "quantize_q4", "quantize_q8", "quantizer"]
