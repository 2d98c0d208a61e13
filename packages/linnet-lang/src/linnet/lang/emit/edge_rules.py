"""The edge-value rules of :mod:`linnet.lang.ir.edges` as generated PyTorch and JAX text:
integer ``/`` and ``%`` by zero, float-to-integer conversion and (JAX) ``floor`` of
subnormals. Shared by :mod:`linnet.lang.emit.torch` and :mod:`linnet.lang.emit.jax`, whose
``div``, ``rem``, ``convert`` and ``floor`` rules call these with their library's names.

A guard is written only where an edge value can occur: a division by a literal other than
zero is the plain call (``torch.div(i, 4, rounding_mode='floor')``), as are conversions
between integers and to floats.

>>> TORCH.floor_div, JAX.floor_div
('torch.div({}, {}, rounding_mode={!r})', 'jnp.floor_divide({}, {})')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linnet.lang.ir.edges import FLOAT_BITS, INT_RANGES, nonzero_constant, saturation
from linnet.lang.ir.graph import Step

_INTS = set(INT_RANGES)


@dataclass(frozen=True)
class Library:
    """How one array library spells what the rules need."""

    name: str
    floor_div: str  # format(a, b[, "floor"])
    remainder: str  # format(a, b)
    where: str  # format(condition, a, b)
    dtypes: dict[str, str]
    cast: str  # format(x, dtype)


TORCH = Library(
    "torch",
    "torch.div({}, {}, rounding_mode={!r})",
    "torch.remainder({}, {})",
    "torch.where({}, {}, {})",
    {
        "f64": "torch.float64",
        "f32": "torch.float32",
        "i64": "torch.int64",
        "i32": "torch.int32",
        "i16": "torch.int16",
        "i8": "torch.int8",
        "u8": "torch.uint8",
    },
    "{}.to({})",
)
JAX = Library(
    "jax",
    "jnp.floor_divide({}, {})",
    "jnp.remainder({}, {})",
    "jnp.where({}, {}, {})",
    {
        "f64": "jnp.float64",
        "f32": "jnp.float32",
        "i64": "jnp.int64",
        "i32": "jnp.int32",
        "i16": "jnp.int16",
        "i8": "jnp.int8",
        "u8": "jnp.uint8",
    },
    "{}.astype({})",
)


def _temp(n: Any, s: Step, what: str) -> str:
    """A fresh local for this step (``q_zero``), named after its result."""
    return str(n(f"{s.results[0]}.{what}"))


def _safe_divisor(lib: Library, n: Any, s: Step, b: str) -> tuple[list[str], str, str]:
    """Lines naming where the divisor is 0, and the divisor with 1 there."""
    zero = _temp(n, s, "zero")
    line = f"{zero} = {b} == 0"  # (a comment here would break the line wrapping)
    safe = f"{b}.masked_fill({zero}, 1)" if lib is TORCH else lib.where.format(zero, 1, b)
    return [line], zero, safe


def int_division(lib: Library, s: Step, n: Any) -> list[str]:
    """Integer ``a / b``: rounded toward -inf; 0 where ``b`` is 0 (torch raises, XLA gives
    -1)."""
    a_ref, b_ref = s.operands
    out = n(s.results[0])
    a = n.tensor(a_ref) if a_ref in n.literals and b_ref in n.literals else n(a_ref)

    def call(x: str, y: str) -> str:
        return lib.floor_div.format(x, y, "floor")

    if nonzero_constant(n.graph, b_ref):
        return [f"{out} = {call(a, n(b_ref))}"]
    lines, zero, safe = _safe_divisor(lib, n, s, n.tensor(b_ref))
    if lib is TORCH:
        return [*lines, f"{out} = {call(a, safe)}.masked_fill({zero}, 0)"]
    return [*lines, f"{out} = {lib.where.format(zero, 0, call(a, safe))}"]


def int_remainder(lib: Library, s: Step, n: Any) -> list[str]:
    """``a % b`` (the divisor's sign); for integers ``a`` where ``b`` is 0."""
    a_ref, b_ref = s.operands
    out = n(s.results[0])
    a = n.tensor(a_ref) if a_ref in n.literals and b_ref in n.literals else n(a_ref)
    if n.dtype(s.results[0]) not in _INTS and lib is TORCH:
        # Exact fmod, moved to the divisor's sign: torch.compile's remainder is
        # `a - floor(a / b) * b`, NaN for an infinite b where eager torch gives Python's.
        r, x, y = _temp(n, s, "fmod"), n.tensor(a_ref), n.tensor(b_ref)
        return [
            f"{r} = torch.fmod({x}, {y})",
            f"{out} = torch.where(({r} != 0) & (({r} < 0) != ({y} < 0)), {r} + {y}, {r})",
        ]
    if n.dtype(s.results[0]) not in _INTS or nonzero_constant(n.graph, b_ref):
        return [f"{out} = {lib.remainder.format(a, n(b_ref))}"]
    lines, zero, safe = _safe_divisor(lib, n, s, n.tensor(b_ref))
    return [
        *lines,
        f"{out} = {lib.where.format(zero, n.tensor(a_ref), lib.remainder.format(a, safe))}",
    ]


def float_to_int(lib: Library, s: Step, n: Any, source: str) -> list[str] | None:
    """``x as i32`` for a float ``x``: NaN is 0, the rest truncated and saturated at the
    type's ends (None: not a float-to-integer conversion; the plain cast is right)."""
    dst = s.attributes["dtype"]
    if dst not in _INTS or source not in FLOAT_BITS:
        return None
    compute, lo, top, smallest, largest = saturation(source, dst)
    out, x = n(s.results[0]), n.tensor(s.operands[0])
    lines = []
    if source != compute:
        wide = _temp(n, s, "wide")
        lines.append(f"{wide} = {lib.cast.format(x, lib.dtypes[compute])}")
        x = wide
    inside = _temp(n, s, "inside")
    lines.append(f"{inside} = ({x} >= {lo!r}) & ({x} < {top!r})")
    kept = lib.cast.format(lib.where.format(inside, x, "0.0"), lib.dtypes[dst])
    if lib is TORCH:
        truncated = _temp(n, s, "truncated")
        lines.append(f"{truncated} = {kept}")
        lines.append(
            f"{out} = {truncated}.masked_fill({x} >= {top!r}, {largest})"
            f".masked_fill({x} < {lo!r}, {smallest})"
        )
    else:
        lines.append(
            f"{out} = jnp.where({x} >= {top!r}, {largest}, "
            f"jnp.where({x} < {lo!r}, {smallest}, {kept}))"
        )
    return lines


def jax_floor(s: Step, n: Any) -> list[str]:
    """``jnp.floor`` where the input is not a subnormal below zero, -1 where it is: XLA's CPU
    flushes subnormals to zero (``floor(-1e-45)`` would be -0.0), so the sign is read off the
    bits."""
    out, x = n(s.results[0]), n.tensor(s.operands[0])
    bits = FLOAT_BITS[n.dtype(s.operands[0])]
    floored, sign = _temp(n, s, "floored"), _temp(n, s, "bits")
    return [
        f"{floored} = jnp.floor({x})",
        f"{sign} = lax.bitcast_convert_type({x}, jnp.int{bits})",
        f"{out} = jnp.where(({sign} < 0) & ({sign} != {-(2 ** (bits - 1))}) "
        f"& ({floored} == 0), -1.0, {floored})",
    ]
