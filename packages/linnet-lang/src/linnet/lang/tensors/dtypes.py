"""Element types and the promotion rules (written down in docs/language.md).

* Mixing two tensors widens to the smaller type that holds both: `bf16 + f32 -> f32`,
  `bf16 + f16 -> f32`, `i32 + f16 -> f16`. Nothing narrows implicitly: `as` narrows.
* A number literal is weak: it takes the type of the tensor it meets (`x * 2.0` stays bf16).
* Sums, means and products of 16-bit floats accumulate in f32 and return f32; `max`/`min`
  return their input type. `sum<f64>[k] ...` picks another accumulator.
"""

from __future__ import annotations

FLOATS = ("bf16", "f16", "f32", "f64")
INTS = ("i8", "i16", "i32", "i64", "u8")
DTYPES = (*FLOATS, *INTS, "bool")
BYTES = {
    "f64": 8,
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "i64": 8,
    "i32": 4,
    "i16": 2,
    "i8": 1,
    "u8": 1,
    "bool": 1,
}
"""Bytes an element of each type takes in memory (safetensors' files, a ``bitcast``'s width)."""

_RANK = {
    "bool": 0,
    "u8": 1,
    "i8": 1,
    "i16": 2,
    "i32": 3,
    "i64": 4,
    "f16": 5,
    "bf16": 5,
    "f32": 6,
    "f64": 7,
}


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def is_concrete(dtype: str) -> bool:
    return dtype in DTYPES


def promote(a: str, b: str) -> str | None:
    """The common type of two tensors' dtypes, or None when no implicit rule applies.

    >>> promote("bf16", "f32"), promote("bf16", "f16"), promote("i32", "bf16")
    ('f32', 'f32', 'bf16')
    """
    if a == b:
        return a
    if not (is_concrete(a) and is_concrete(b)):
        return None  # two different generic dtypes never mix implicitly
    if {a, b} == {"bf16", "f16"}:
        return "f32"
    if {a, b} == {"u8", "i8"}:
        return "i16"
    return a if _RANK[a] >= _RANK[b] else b


def accumulator(kind: str, dtype: str) -> str:
    """The default accumulator of a reduction over ``dtype``."""
    if kind in ("max", "min"):
        return dtype
    if dtype in ("bf16", "f16"):
        return "f32"
    if dtype == "bool" or is_int(dtype):
        return "i64" if kind != "mean" else "f32"
    return dtype
