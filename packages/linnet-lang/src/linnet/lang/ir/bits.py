"""Bit reinterpretation (``bitcast<T>(x)``, the ``bitcast`` primitive): which element types
share a width, and a scalar's bits read as another type.

A ``bitcast`` keeps every bit of each element and reads them as ``attributes.dtype``: the
two types have one width (:data:`WIDTHS`), and neither is ``bool`` (whose width is no
runtime's business). The checker refuses any other pair (E0691, :func:`problem`), the
verifier too (``ir/shapes.py``); constant folding and the tests compute with
:func:`bitcast_scalar`. A ``bf16`` is the upper half of an ``f32``: a value becomes one by
rounding to nearest, ties to even, as every runtime converts.

>>> bitcast_scalar(1.0, "f32", "i32"), bitcast_scalar(1065353216, "i32", "f32")
(1065353216, 1.0)
>>> bitcast_scalar(-1, "i8", "u8"), bitcast_scalar(1.0, "bf16", "i16")
(255, 16256)
>>> problem("i32", "f16"), problem("f32", "bool")
('i32 is 32 bits wide and f16 16', 'bool has no bits to reinterpret')
"""

from __future__ import annotations

import math
import struct

import linnet.lang.tensors.dtypes as DT

WIDTHS: dict[str, int] = {d: 8 * n for d, n in DT.BYTES.items() if d != "bool"}
"""The width in bits of each element type a bitcast reads or makes (every one but bool)."""

WEAK: dict[str, str] = {"int": "i32", "float": "f32"}
"""The type a bitcast reads a number literal's bits in (a literal takes the type of the tensor
it meets elsewhere; a bitcast has none to give it)."""

_FLOAT_FORMATS = {"f64": "<d", "f32": "<f", "f16": "<e"}
_INT_FORMATS = {"i64": "<q", "i32": "<i", "i16": "<h", "i8": "<b", "u8": "<B"}
_UNSIGNED = {64: "<Q", 32: "<I", 16: "<H", 8: "<B"}


def problem(src: str, dst: str) -> str | None:
    """Why ``src`` cannot be bitcast to ``dst`` (None: it can).

    >>> problem("f16", "bf16") is None, problem("u8", "i16")
    (True, 'u8 is 8 bits wide and i16 16')
    """
    for dtype in (src, dst):
        if dtype not in WIDTHS:
            return f"{dtype} has no bits to reinterpret"
    if WIDTHS[src] != WIDTHS[dst]:
        return f"{src} is {WIDTHS[src]} bits wide and {dst} {WIDTHS[dst]}"
    return None


def partners(dtype: str) -> list[str]:
    """The other element types of ``dtype``'s width, for messages.

    >>> partners("f16"), partners("bool")
    (['bf16', 'i16'], [])
    """
    width = WIDTHS.get(dtype)
    return sorted(d for d, w in WIDTHS.items() if w == width and d != dtype)


def _pack_float(value: float, fmt: str) -> bytes:
    """``value`` rounded to the format's float (to nearest, ties to even; past the largest
    finite value, infinity), packed."""
    try:
        return struct.pack(fmt, value)
    except OverflowError:  # struct refuses a finite value that rounds to infinity
        return struct.pack(fmt, math.copysign(math.inf, value))


def to_bits(value: float | int, dtype: str) -> int:
    """The bits of ``value`` as an element of ``dtype``, as an unsigned integer. An integer
    out of the type's range wraps (two's complement); a float is rounded to the type first.

    >>> hex(to_bits(1.0, "f32")), hex(to_bits(-1, "i16")), hex(to_bits(float("nan"), "bf16"))
    ('0x3f800000', '0xffff', '0x7fc0')
    """
    width = WIDTHS[dtype]
    if dtype in _INT_FORMATS:
        return int(value) % (1 << width)
    if dtype == "bf16":
        word = struct.unpack("<I", _pack_float(float(value), "<f"))[0]
        if math.isnan(value):
            return (word >> 16) | 0x0040  # a quiet NaN keeps its sign
        return ((word + 0x7FFF + ((word >> 16) & 1)) >> 16) & 0xFFFF
    return int(struct.unpack(_UNSIGNED[width], _pack_float(float(value), _FLOAT_FORMATS[dtype]))[0])


def from_bits(bits: int, dtype: str) -> float | int:
    """The element of ``dtype`` whose bits are ``bits`` (an unsigned integer of its width).

    >>> from_bits(0x3F800000, "f32"), from_bits(0xFF, "i8"), from_bits(0x3F80, "bf16")
    (1.0, -1, 1.0)
    """
    width = WIDTHS[dtype]
    raw = struct.pack(_UNSIGNED[width], bits % (1 << width))
    if dtype in _INT_FORMATS:
        return int(struct.unpack(_INT_FORMATS[dtype], raw)[0])
    if dtype == "bf16":
        return float(struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0])
    return float(struct.unpack(_FLOAT_FORMATS[dtype], raw)[0])


def bitcast_scalar(value: float | int, src: str, dst: str) -> float | int:
    """``value``, an element of ``src``, with its bits read as ``dst`` (same width).

    >>> bitcast_scalar(0x3C00, "i16", "f16"), bitcast_scalar(1.0, "f16", "bf16")
    (1.0, 0.0078125)
    """
    why = problem(src, dst)
    if why is not None:
        raise ValueError(f"cannot bitcast {src} to {dst}: {why}")
    return from_bits(to_bits(value, src), dst)
