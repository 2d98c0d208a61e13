"""The edge-value rules of :mod:`linnet.lang.ir.edges` in tile kernels: Triton (generated
PyTorch's ``@triton.jit`` functions, :mod:`.triton`) and Pallas (generated JAX's kernel
functions, :mod:`.pallas`), so that a kernel gives what its op's body gives on every
runtime (docs/language.md, "Edge values"):

* ``max``/``min`` with a NaN give NaN, elementwise and as reductions. Triton's
  ``tl.maximum`` and ``tl.max`` skip NaN by default (``maxnumf``: the interpreter's
  ``np.fmax``); kernels pass ``propagate_nan=tl.PropagateNan.ALL`` and reduce with
  HEADER's ``max_nan``/``min_nan`` (:data:`TRITON_HEADER`). Pallas's Triton backend lowers
  ``jnp.maximum`` and ``jnp.max`` to ``maxnumf`` too, so a Pallas kernel puts the NaN back
  with ``jnp.where``.
* Integer ``a / 0`` is 0 and ``a % 0`` is ``a``; ``MIN / -1`` wraps to ``MIN``. Triton's and
  XLA's integer division by zero give -1 or garbage (the interpreter, NumPy's 0 with a
  warning), and ``MIN / -1`` traps on x86: the divisor is made 1 where it is 0 or -1.
* A float converted to an integer type: NaN is 0, the rest truncated and saturated at the
  type's ends (C, LLVM's ``fptosi`` and NumPy leave it undefined).
* ``floor`` of a negative subnormal is -1: XLA's CPU, which Pallas's interpreter runs on,
  flushes subnormals to zero, and so does compiled Triton on CUDA (libdevice's ``floorf``
  under ``nvvm-reflect-ftz``: ``floor(-1e-45)`` is -0.0 there), so the sign is read from the
  bits (as the JAX emitter does).

Each rule takes the step, the kernel's names and the context, as
:data:`linnet.lang.emit.triton.TILE_RULES` and :data:`linnet.lang.emit.pallas.PALLAS_RULES`
(which use them) do.

>>> "propagate_nan=tl.PropagateNan.ALL" in TRITON_HEADER, sorted(HEADER_NAMES)
(True, ['_interpreter_fast_paths', '_tree_reduce', 'max_nan', 'min_nan'])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from linnet.lang.emit import edge_rules, tiles
from linnet.lang.ir.edges import FLOAT_BITS, INT_RANGES, saturation
from linnet.lang.ir.graph import Step

if TYPE_CHECKING:
    from linnet.lang.emit.tiles import Context, Names

_INTS = set(INT_RANGES)
_HALF = {"bf16", "f16"}

TRITON_HEADER = """

# NaN-propagating max and min (Linnet's edge rule: a NaN wins), for `tl.reduce`: `tl.max`
# and `tl.min` combine with `tl.maximum`'s default, which skips NaN (emit/tile_edges.py).
@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


# Two of Triton's interpreter's costs that change no value (nothing changes off it):
# * It reduces with its own combine functions (tl.sum's, tl.max's) in NumPy, and with any other
#   one element at a time: a Python call of the combine function per element of the tile, most
#   of an interpreted attention kernel's time (its row maxima). max_nan and min_nan are
#   associative, so it reduces with them as a tree instead: the same function on adjacent
#   pairs of slices along the axis, in order, log2(n) calls, the same values (ties keep the
#   earlier element, as the one-at-a-time fold does). Compiled Triton reduces as a tree too.
# * Each integer +, - and * also worked out its overflow check (in int64, compared with the
#   type's range) for `device_assert`, which drops it unless Triton debugs (`debug`); off
#   debugging it is no longer worked out: a third of an interpreted decode kernel's time.
if INTERPRET and TRITON:
    max_nan.fn.linnet_tree_reduce = min_nan.fn.linnet_tree_reduce = True

    def _tree_reduce(ops, input):
        import numpy as np

        (x,) = input
        data = x.handle.data
        axis = ops.axis
        if axis is None:
            data, axis = data.reshape(-1), 0
        n = data.shape[axis]
        cut = [slice(None)] * data.ndim
        while n > 1:
            half = n // 2
            cut[axis] = slice(0, 2 * half, 2)
            a = ops.to_tensor(data[tuple(cut)], x.dtype)
            cut[axis] = slice(1, 2 * half, 2)
            b = ops.to_tensor(data[tuple(cut)], x.dtype)
            pairs = ops.combine_fn.fn(a, b).handle.data.astype(data.dtype, copy=False)
            cut[axis] = slice(2 * half, n)
            data = np.concatenate([pairs, data[tuple(cut)]], axis) if n % 2 else pairs
            n = data.shape[axis]
        data = data.squeeze(axis)
        if ops.keep_dims:  # as the interpreter's own reductions keep the reduced axes
            data = np.expand_dims(data, ops.axis if ops.axis is not None else
                                  tuple(range(x.handle.data.ndim)))
        elif ops.axis is None:
            data = data.item()
        return [ops.to_tensor(data, x.dtype)]

    def _interpreter_fast_paths():
        import dataclasses

        from triton.runtime import interpreter

        builder = getattr(interpreter, 'interpreter_builder', None)
        options = getattr(builder, 'options', None)
        if dataclasses.is_dataclass(options) and not getattr(options, 'debug', True) and \
                getattr(options, 'sanitize_overflow', False):
            builder.options = dataclasses.replace(options, sanitize_overflow=False)
        reduce_ops = getattr(interpreter, 'ReduceOps', None)
        plain = getattr(reduce_ops, 'apply_impl', None)
        if plain is None or getattr(plain, 'linnet_tree_reduce', False):
            return  # another Triton, or another generated module installed it already

        def apply_impl(self, input):
            tree = getattr(getattr(self.combine_fn, 'fn', None), 'linnet_tree_reduce', False)
            if tree and len(input) == 1 and input[0].handle.data.size > 0:
                return _tree_reduce(self, input)
            return plain(self, input)

        apply_impl.linnet_tree_reduce = True
        apply_impl.plain = plain  # the interpreter's own, one element at a time
        reduce_ops.apply_impl = apply_impl

    _interpreter_fast_paths()
"""
"""What the generated PyTorch module's Triton header adds (:data:`.triton.HEADER`)."""

HEADER_NAMES = frozenset({"max_nan", "min_nan", "_tree_reduce", "_interpreter_fast_paths"})
"""The names :data:`TRITON_HEADER` defines (a kernel's values must not shadow them)."""


def _constant(n: Names, ref: str) -> Any:
    """The value of ``ref`` where a ``constant`` step makes it, else None."""
    p = n.producers.get(ref)
    return p.attributes.get("value") if p is not None and p.op == "constant" else None


def _temp(n: Names, s: Step, what: str) -> str:
    return n(f"{s.results[0]}.{what}")


# ---------------------------------------------------------------- max and min
def _wide(n: Names, ref: str) -> str:
    """Triton: a 16-bit float operand read as f32 (each step computes in f32, as torch)."""
    if ref in n.literals:
        return n.tensor(ref)  # tl.maximum wants tensors: a typed scalar
    return f"{n(ref)}.to(tl.float32)" if n.dtype(ref) in _HALF else n(ref)


def triton_extreme(fn: str) -> tiles.TileRule:
    """``tl.maximum``/``tl.minimum``; for floats ``propagate_nan=tl.PropagateNan.ALL``."""

    def rule(s: Step, n: Names, c: Context) -> list[str]:
        a, b = (_wide(n, o) for o in s.operands)
        dtype = n.dtype(s.results[0])
        nan = ", propagate_nan=tl.PropagateNan.ALL" if dtype in FLOAT_BITS else ""
        expr = f"tl.{fn}({a}, {b}{nan})"
        if dtype in _HALF and any(o not in n.literals and n.dtype(o) in _HALF for o in s.operands):
            expr = f"({expr}).to({n.dialect.dtypes[dtype]})"
        return [f"{n(s.results[0])} = {expr}"]

    return rule


def triton_reduced(s: Step, n: Names, kind: str, x: str) -> str:
    """A Triton `max` or `min` reduction of ``x`` over the step's axes (one at a time, the
    last first, as :func:`.tiles.reduced`): for floats ``tl.reduce`` with HEADER's
    NaN-propagating ``max_nan``/``min_nan``, for integers ``tl.max``/``tl.min``."""
    for axis in reversed(sorted(s.attributes["axes"])):
        if n.dtype(s.operands[0]) in FLOAT_BITS:
            x = f"tl.reduce({x}, {axis}, {kind}_nan)"
        else:
            x = f"tl.{kind}({x}, axis={axis})"
    return x


def pallas_extreme(fn: str) -> tiles.TileRule:
    """``jnp.maximum``/``jnp.minimum``, NaN put back for floats (Pallas's Triton backend
    lowers them to ``maxnumf``/``minnumf``, which skip it)."""

    def rule(s: Step, n: Names, c: Context) -> list[str]:
        a, b = (n(o) for o in s.operands)
        if all(o in n.literals for o in s.operands):
            a = n.tensor(s.operands[0])
        out = n(s.results[0])
        expr = f"jnp.{fn}({a}, {b})"
        if n.dtype(s.results[0]) not in FLOAT_BITS:
            return [f"{out} = {expr}"]
        return [f"{out} = jnp.where({a} != {a}, {a}, jnp.where({b} != {b}, {b}, {expr}))"]

    return rule


def pallas_nan_through(s: Step, n: Names, x: str, reduced: str) -> tuple[list[str], str]:
    """``reduced`` (a `max` or `min` reduction of ``x``) NaN where a NaN was reduced: the
    sum of ``x``'s NaNs (the other elements as 0) is NaN exactly there. Returns the line
    that sums them and the expression."""
    nans = _temp(n, s, "nans")
    line = f"{nans} = {tiles.reduced(s, n, 'jnp.sum', f'jnp.where({x} != {x}, {x}, 0)')}"
    return [line], f"jnp.where({nans} != {nans}, {nans}, {reduced})"


# ---------------------------------------------------------------- integer / and %
def _guarded(
    s: Step, n: Names, c: Context, dialect: str
) -> tuple[list[str], str, str, str, str | None]:
    """Lines making the divisor safe: ``(lines, a, b, divisor, zero)``; ``zero`` names where
    ``b`` is 0 (None where it cannot be), and where ``b`` is -1 the divisor is 1 too."""
    a_ref, b_ref = s.operands
    dtype = n.dtype(s.results[0])
    a = n.tensor(a_ref) if a_ref in n.literals and b_ref in n.literals else n(a_ref)
    b = n(b_ref)
    value = _constant(n, b_ref)
    if isinstance(value, int) and value != 0:  # (-1: the rules write the result directly)
        return [], a, b, b, None
    where = "tl.where" if dialect == "triton" else "jnp.where"
    zero = _temp(n, s, "zero")
    special = f"({b} == 0)" if dtype == "u8" else f"({b} == 0) | ({b} == -1)"
    safe = _temp(n, s, "divisor")
    cast = n.dialect.cast(f"{where}({special}, 1, {b})", dtype)
    return [f"{zero} = {b} == 0", f"{safe} = {cast}"], a, b, safe, zero


def int_div(dialect: str, float_rule: tiles.TileRule) -> tiles.TileRule:
    """Integer ``a / b``: rounded toward -inf; 0 where ``b`` is 0; ``MIN / -1`` is ``MIN``
    (``float_rule`` for floats)."""

    def rule(s: Step, n: Names, c: Context) -> list[str]:
        if n.dtype(s.results[0]) not in _INTS:
            return float_rule(s, n, c)
        lines, a, b, d, zero = _guarded(s, n, c, dialect)
        out, result = n(s.results[0]), n.dtype(s.results[0])
        dtype = n.dialect.dtypes[result]
        if _constant(n, s.operands[1]) == -1:  # -a, wrapping (MIN / -1 is MIN)
            return [f"{out} = {n.dialect.cast(f'(0 - {a})', result)}"]
        if dialect == "triton":
            # Triton's `//` truncates toward zero: step down where the signs differ and it
            # was inexact.
            lines += [
                f"{out} = {a} // {d}",
                f"{out} = {out} - (({out} * {d} != {a}) & (({a} < 0) != ({d} < 0))).to({dtype})",
            ]
            where = "tl.where"
        else:
            lines.append(f"{out} = jnp.floor_divide({n.tensor(s.operands[0])}, {d})")
            where = "jnp.where"
        if zero is not None:
            cast = n.dialect.cast
            if result != "u8":  # -a, wrapping (MIN / -1 is MIN)
                lines.append(f"{out} = {cast(f'{where}({b} == -1, 0 - {a}, {out})', result)}")
            lines.append(f"{out} = {cast(f'{where}({zero}, 0, {out})', result)}")
        return lines

    return rule


def int_rem(dialect: str, float_rule: tiles.TileRule) -> tiles.TileRule:
    """``a % b``: the divisor's sign; for integers ``a`` where ``b`` is 0 (``float_rule``
    for floats)."""

    def rule(s: Step, n: Names, c: Context) -> list[str]:
        if n.dtype(s.results[0]) not in _INTS:
            return float_rule(s, n, c)
        lines, a, _, d, zero = _guarded(s, n, c, dialect)
        out = n(s.results[0])
        if _constant(n, s.operands[1]) == -1:  # every integer's remainder by -1 is 0
            return [f"{out} = {n.dialect.cast(f'({a} * 0)', n.dtype(s.results[0]))}"]
        if dialect == "triton":
            # Triton's `%` takes the dividend's sign; Linnet's (torch.remainder) the divisor's.
            lines += [
                f"{out} = {a} % {d}",
                f"{out} = tl.where(({out} != 0) & (({out} < 0) != ({d} < 0)), {out} + {d}, {out})",
            ]
            where = "tl.where"
        else:
            lines.append(f"{out} = jnp.remainder({n.tensor(s.operands[0])}, {d})")
            where = "jnp.where"
        if zero is not None:
            lines.append(f"{out} = {where}({zero}, {n.tensor(s.operands[0])}, {out})")
        return lines

    return rule


# ---------------------------------------------------------------- float -> integer
# An 8-bit integer widened to f32 without the conversion instruction (I2F, a sixteenth of the
# FMA rate on Hopper, the bound of a dequantising GEMV, issue 42): the byte is placed in the
# low mantissa bits of 2^23 (0x4B000000) and 2^23 taken away, exact for every value below
# 2^23; an int8 is first offset by 128 into 0..255. Integer ops and one FADD, full rate.
_MAGIC_F32 = {
    "u8": "(({x}).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0",
    "i8": "(({x}).to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0",
}


def convert(s: Step, n: Names, c: Context) -> list[str]:
    """``x as i32`` of a float ``x``: NaN is 0, the rest truncated and saturated at the
    type's ends; an i8 or u8 tile to f32 in Triton through the magic number (exact, see
    ``_MAGIC_F32``); any other conversion is the plain cast (:func:`.tiles.convert`)."""
    src, dst = n.dtype(s.operands[0]), s.attributes["dtype"]
    if dst == "f32" and src in _MAGIC_F32 and n.dialect.method == "to":
        x = n.tensor(s.operands[0])
        return [f"{n(s.results[0])} = {_MAGIC_F32[src].format(x=x)}"]
    if dst not in _INTS or src not in FLOAT_BITS:
        return tiles.convert(s, n, c)
    compute, lo, top, smallest, largest = saturation(src, dst)
    d = n.dialect
    x = n.tensor(s.operands[0])
    lines = []
    if src != compute:
        wide = _temp(n, s, "wide")
        lines.append(f"{wide} = {d.cast(x, compute)}")
        x = wide
    kept = _temp(n, s, "truncated")
    inside = f"({x} >= {lo!r}) & ({x} < {top!r})"
    lines.append(f"{kept} = {d.cast(f'{d.where}({inside}, {x}, 0.0)', dst)}")
    out = f"{d.where}({x} >= {top!r}, {largest}, {d.where}({x} < {lo!r}, {smallest}, {kept}))"
    lines.append(f"{n(s.results[0])} = {d.cast(out, dst)}")
    return lines


# ---------------------------------------------------------------- floor
def triton_floor(s: Step, n: Names, c: Context) -> list[str]:
    """``tl.floor``, -1 for a negative subnormal (compiled Triton flushes f32 subnormals to
    zero, so the sign is read from the bits, which no flush touches); a 16-bit float is
    floored as f32 (where none is subnormal) and rounded back; an integer is its own floor."""
    out, dt = n(s.results[0]), n.dtype(s.operands[0])
    if dt not in FLOAT_BITS:
        return [f"{out} = {n.tensor(s.operands[0])}"]
    x = _wide(n, s.operands[0])
    bits = 32 if dt in _HALF else FLOAT_BITS[dt]
    floored, sign = _temp(n, s, "floored"), _temp(n, s, "bits")
    value = (
        f"tl.where(({sign} < 0) & ({sign} != {-(2 ** (bits - 1))}) & ({floored} == 0), "
        f"-1.0, {floored})"
    )
    if dt in _HALF:
        value = f"({value}).to({'tl.bfloat16' if dt == 'bf16' else 'tl.float16'})"
    return [
        f"{floored} = tl.floor({x})",
        f"{sign} = ({x}).to(tl.int{bits}, bitcast=True)",
        f"{out} = {value}",
    ]


def pallas_floor(s: Step, n: Names, c: Context) -> list[str]:
    """``jnp.floor``, -1 for a negative subnormal (XLA's CPU flushes it: the sign is read
    from the bits, as :func:`.edge_rules.jax_floor` does); an integer is its own floor."""
    if n.dtype(s.operands[0]) not in FLOAT_BITS:
        return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}"]
    return edge_rules.jax_floor(s, n)
