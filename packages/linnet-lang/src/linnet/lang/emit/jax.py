"""Graph → readable JAX source (``jax.numpy``, ``jax.lax``). Writes text only: this module
never imports jax.

The structure is the PyTorch emitter's (both subclass :mod:`linnet.lang.emit.python_emitter`'s
``PythonEmitter``, whose slicing, naming, liveness, source-line comments, entry functions and
module layout they share, each writing the hooks that differ: ``returns_states``,
``kernel_parts``, ...; the rule plumbing is :mod:`linnet.lang.emit.python_rules`'s): one Python
function per slice kind (every layer shares one), one function per entry that calls them in
order, and metadata (``ENTRIES``). What differs is that JAX arrays are immutable, so generated
functions are pure: a slice that writes a state (a KV cache) returns the state's new value as
an extra result, and each entry function is ``f(*inputs, params, states) -> (outputs, new_states)``,
ready for ``jax.jit`` with ``states`` donated (linnet-runtime-jax does that, so the cache is
updated in place on the device).

Where JAX has a fused call with the same semantics as a std op's body, the whole call span
becomes that call (``jax.nn.dot_product_attention``, ``jax.nn.silu``, ...): the table
:data:`FAST_CALLS`. linnet-runtime-jax's ``tests/test_jax_generated.py`` proves each one
equal to the op's body. Every primitive has a rule in :data:`RULES` (tests/test_coverage.py checks).

Numerics: ``exact`` writes every matrix product with ``precision=PRECISION``, the module's
``jax.lax.Precision.HIGHEST`` (full f32 products on every backend, no TF32); ``fast`` sets it
to ``None`` (the backend's default: TF32 or bf16 passes for f32 on a GPU). Accumulation dtypes
are the graph's (``preferred_element_type``) in both modes.

>>> from linnet.lang.emit.jax import RULES
>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))
[]
"""

from __future__ import annotations

from typing import Any

from linnet.lang.emit import edge_rules
from linnet.lang.emit.python import docstring, fresh
from linnet.lang.emit.python_emitter import PythonEmitter
from linnet.lang.emit.python_rules import (
    TORCH_INT,
    FastRule,
    Options,
    Rule,
    Scope,
    clamped,
    constant_rule,
    identifier,
    in_range,
    inside_mask,
    internal_error,
    shifted_by,
)
from linnet.lang.ir.elementwise import by_arity, spelled
from linnet.lang.ir.graph import Call, Graph, Step
from linnet.lang.passes.slices import Slice, cut
from linnet.lang.pipeline import NUMERICS, Numerics  # noqa: F401  (NUMERICS: kept as a name)
from linnet.lang.tensors.dtypes import accumulator

JAX_DTYPES = {
    "f64": "jnp.float64",
    "f32": "jnp.float32",
    "f16": "jnp.float16",
    "bf16": "jnp.bfloat16",
    "i64": "jnp.int64",
    "i32": "jnp.int32",
    "i16": "jnp.int16",
    "i8": "jnp.int8",
    "u8": "jnp.uint8",
    "bool": "jnp.bool_",
}

# Names the generated module itself uses (on top of the PyTorch emitter's).
RESERVED = {"jax", "jnp", "lax", "PRECISION"}
# ... and what a module that launches Pallas kernels defines (emit/pallas.py HEADER, READY).
RESERVED |= {
    "os",
    "pl",
    "plgpu",
    "PALLAS",
    "INTERPRET",
    "COMPILER_PARAMS",
    "RUNS",
    "kernels_ready",
    "kernel_jvp",
    "no_tangent",
    "linnet_error",
}


class JaxScope(Scope):
    """A :class:`~linnet.lang.emit.python_rules.Scope` whose constants become JAX arrays."""

    def __call__(self, ref: str) -> str:
        name = super().__call__(ref)
        if name in RESERVED and ref not in self.literals:
            # `jnp` or `lax` as a value's name would hide the module: rename it once.
            del self.names[ref]
            self.used.add(name)
            return super().__call__(ref)
        return name

    def tensor(self, ref: str) -> str:
        """``ref`` as an array expression: a constant inlined as a literal becomes
        ``jnp.asarray(literal, dtype)`` where a rule needs an array (a reshape of it)."""
        if ref in self.literals:
            return f"jnp.asarray({self.literals[ref]}, dtype={JAX_DTYPES[self.dtype(ref)]})"
        return self(ref)


def _dt(n: Scope, ref: str) -> str:
    return JAX_DTYPES[n.dtype(ref)]


def _acc(n: Scope, ref: str) -> str:
    """The accumulator of the op body's `sum` over ``ref``'s dtype: f32 for 16-bit floats
    and f32, f64 for f64. Fused forms accumulate in it, not in a hard-coded f32, which made
    f64 products 1e-7 off the body (issue 46 item 3); a body's explicit ``as f32`` (the
    norms' statistics, gelu) stays f32, as the body computes it at every T."""
    return JAX_DTYPES[accumulator("sum", n.dtype(ref))]


def _cast(want: str, have: str) -> str:
    """``.astype(want)``, or nothing where the value already has that dtype."""
    return "" if want == have else f".astype({want})"


# ---------------------------------------------------------------- primitive rules
def _unary(fmt: str) -> Rule:
    return lambda s, n, numerics: [f"{n(s.results[0])} = {fmt.format(n.tensor(s.operands[0]))}"]


def _binary(fmt: str) -> Rule:
    def rule(s: Step, n: Scope, numerics: str) -> list[str]:
        a, b = (n(o) for o in s.operands)
        if all(o in n.literals for o in s.operands):  # keep the graph's dtype, not Python's
            a = n.tensor(s.operands[0])
        return [f"{n(s.results[0])} = {fmt.format(a, b)}"]

    return rule


def _div(s: Step, n: Scope, numerics: str) -> list[str]:
    if n.graph.values[s.results[0]].dtype in TORCH_INT:
        return edge_rules.int_division(edge_rules.JAX, s, n)  # a / 0 is 0, not XLA's -1
    a, b = (n(o) for o in s.operands)
    return [f"{n(s.results[0])} = {a} / {b}"]


def _rem(s: Step, n: Scope, numerics: str) -> list[str]:
    return edge_rules.int_remainder(edge_rules.JAX, s, n)  # an integer a % 0 is a


def _floor(s: Step, n: Scope, numerics: str) -> list[str]:
    return edge_rules.jax_floor(s, n)  # -1 for a subnormal below 0 (XLA flushes them)


def _select(s: Step, n: Scope, numerics: str) -> list[str]:
    c, a, b = s.operands
    expr = f"jnp.where({n(c)}, {n(a)}, {n(b)})"
    if a in n.literals and b in n.literals:
        expr += f".astype({JAX_DTYPES[n.graph.values[s.results[0]].dtype]})"
    return [f"{n(s.results[0])} = {expr}"]


def _iota(s: Step, n: Scope, numerics: str) -> list[str]:
    shape, axis = tuple(s.attributes["shape"]), s.attributes["axis"]
    dtype = JAX_DTYPES[s.attributes["dtype"]]
    return [f"{n(s.results[0])} = lax.broadcasted_iota({dtype}, {shape}, {axis})"]


def _convert(s: Step, n: Scope, numerics: str) -> list[str]:
    saturated = edge_rules.float_to_int(edge_rules.JAX, s, n, n.dtype(s.operands[0]))
    if saturated is not None:  # float to integer: NaN is 0, the rest saturates
        return saturated
    return [
        f"{n(s.results[0])} = {n.tensor(s.operands[0])}.astype({JAX_DTYPES[s.attributes['dtype']]})"
    ]


def _bitcast(s: Step, n: Scope, numerics: str) -> list[str]:
    dtype = JAX_DTYPES[s.attributes["dtype"]]
    return [f"{n(s.results[0])} = lax.bitcast_convert_type({n.tensor(s.operands[0])}, {dtype})"]


def _reshape(s: Step, n: Scope, numerics: str) -> list[str]:
    return [
        f"{n(s.results[0])} = jnp.reshape({n.tensor(s.operands[0])}, "
        f"{tuple(s.attributes['shape'])})"
    ]


def _transpose(s: Step, n: Scope, numerics: str) -> list[str]:
    return [
        f"{n(s.results[0])} = jnp.transpose({n.tensor(s.operands[0])}, "
        f"{tuple(s.attributes['perm'])})"
    ]


def _slice(s: Step, n: Scope, numerics: str) -> list[str]:
    """A static range of each axis as Python slicing (``lax.slice`` under jit), with whole
    axes after the last sliced one left out (``w[0:64]``, ``qkv[:, 64:96]``). Arrays are
    values: a slice of a state is not changed by the state's next write, so no copy."""
    x = s.operands[0]
    parts = [
        ":" if (a, b) == (0, size) else f"{a}:{b}"
        for a, b, size in zip(s.attributes["starts"], s.attributes["limits"], n.shape(x))
    ]
    while len(parts) > 1 and parts[-1] == ":":
        parts.pop()
    return [f"{n(s.results[0])} = {n.tensor(x)}[{', '.join(parts)}]"]


def _broadcast(s: Step, n: Scope, numerics: str) -> list[str]:
    shape = tuple(s.attributes["shape"])
    if s.operands[0] in n.literals:
        dtype = JAX_DTYPES[n.graph.values[s.results[0]].dtype]
        return [f"{n(s.results[0])} = jnp.full({shape}, {n(s.operands[0])}, dtype={dtype})"]
    return [f"{n(s.results[0])} = jnp.broadcast_to({n(s.operands[0])}, {shape})"]


def _reduce(s: Step, n: Scope, numerics: str) -> list[str]:
    kind, axes, acc = s.attributes["kind"], tuple(s.attributes["axes"]), s.attributes["accumulate"]
    x = n.tensor(s.operands[0])
    # Accumulate in `acc`: the operand is converted first (as torch's `sum(dtype=)` does).
    wide = x if n.dtype(s.operands[0]) == acc else f"{x}.astype({JAX_DTYPES[acc]})"
    if kind in ("sum", "mean", "prod"):
        fn = {"sum": "jnp.sum", "mean": "jnp.mean", "prod": "jnp.prod"}[kind]
        expr = f"{fn}({wide}, axis={axes})"
    else:  # max, min: exact in any dtype
        expr = f"jnp.{'max' if kind == 'max' else 'min'}({x}, axis={axes})"
    want = n.graph.values[s.results[0]].dtype
    if kind in ("sum", "mean", "prod") and want != acc:
        expr += f".astype({JAX_DTYPES[want]})"
    return [f"{n(s.results[0])} = {expr}"]


def _contract(s: Step, n: Scope, numerics: str) -> list[str]:
    a, b = s.operands
    acc = JAX_DTYPES[s.attributes["accumulate"]]
    spec = s.attributes["spec"]
    x, y = n.tensor(a), n.tensor(b)
    if numerics == Numerics.EXACT and n.dtype(a) != s.attributes["accumulate"]:
        x, y = f"{x}.astype({acc})", f"{y}.astype({acc})"
    expr = f"jnp.einsum({spec!r}, {x}, {y}, precision=PRECISION, preferred_element_type={acc})"
    want = n.graph.values[s.results[0]].dtype
    if JAX_DTYPES[want] != acc:
        expr += f".astype({JAX_DTYPES[want]})"
    return [f"{n(s.results[0])} = {expr}"]


def _take(s: Step, n: Scope, numerics: str) -> list[str]:
    x, idx = s.operands
    axis = s.attributes["axis"]
    size = n.shape(x)[axis]
    out = n(s.results[0])
    rank = len(n.shape(x))
    shift = shifted_by(n, idx, size) if s.attributes["bounds"] == "zero" else None
    if shift is not None:
        # x[..., i + c, ...] reading 0 outside: a slice and a pad, not a gather.
        if abs(shift) >= size:
            return [f"{out} = jnp.zeros_like({n(x)})"]
        start, keep = (shift, size - shift) if shift >= 0 else (0, size + shift)
        left, right = (0, shift) if shift >= 0 else (-shift, 0)
        pads = tuple((left, right) if a == axis else (0, 0) for a in range(rank))
        return [
            f"{out} = jnp.pad(lax.slice_in_dim({n(x)}, {start}, {start + keep}, "
            f"axis={axis}), {pads})"
        ]
    out_shape = tuple(n.graph.values[s.results[0]].shape)
    idx_shape = n.shape(idx)
    if idx in n.literals and isinstance(n.producers()[idx].attributes.get("value"), int):
        v = n.producers()[idx].attributes["value"]
        if not 0 <= v < size:
            if s.attributes["bounds"] == "zero":
                return [f"{out} = jnp.zeros({out_shape}, dtype={_dt(n, x)})"]
            return [f"{out} = jnp.take({n(x)}, {v}, axis={axis}, mode='fill')"]
        return [f"{out} = lax.index_in_dim({n(x)}, {v}, axis={axis}, keepdims=False)"]
    i = n.tensor(idx)
    if in_range(n, idx, size):
        return [f"{out} = jnp.take({n(x)}, {i}, axis={axis})"]
    if s.attributes["bounds"] == "zero":
        view = (1,) * axis + tuple(idx_shape) + (1,) * (rank - axis - 1)
        return [
            f"{out}_index = jnp.clip({i}, 0, {size - 1})",
            f"{out} = jnp.take({n(x)}, {out}_index, axis={axis})",
            f"{out} = jnp.where((({i} >= 0) & ({i} < {size})).reshape({view}), {out}, 0)",
        ]
    # Unchecked: the runtime checks every input-derived index before the call; one it could
    # not follow reads NaN (floats) outside the axis, never a clamped neighbour.
    return [f"{out} = jnp.take({n(x)}, {i}, axis={axis}, mode='fill')"]


# How a gather's or a scatter-add's index is clamped into its axis, and used (torch's clamped).
_CLAMP = ("jnp.clip({}, 0, {})", "{}")


def _gather(s: Step, n: Scope, numerics: str) -> list[str]:
    x, *indices = s.operands
    shape = n.shape(x)
    out = n(s.results[0])
    lines, names, guarded = clamped(s, n, out, indices, shape, *_CLAMP)
    if s.attributes["bounds"] == "zero" or all(
        in_range(n, r, shape[a]) for a, r in enumerate(indices)
    ):
        lines.append(f"{out} = {n(x)}[{', '.join(names)}]")
    else:  # unchecked: NaN outside (see _take)
        lines.append(f"{out} = {n(x)}.at[{', '.join(names)}].get(mode='fill')")
    if any(guarded):
        mask = inside_mask(n, indices, shape, guarded)
        lines.append(f"{out} = jnp.where({mask}, {out}, 0)")
    return lines


def _scatter(s: Step, n: Scope, numerics: str) -> list[str]:
    state, value, *indices = s.operands
    name = n(state)
    dtype = _dt(n, state)
    if not indices:
        shape = tuple(n.shape(state))
        return [
            f"{name} = jnp.broadcast_to({n.tensor(value)}, {shape}){_cast(dtype, _dt(n, value))}"
        ]
    idx = ", ".join(n.tensor(i) for i in indices)
    # A new value of the state (arrays are immutable): the slice returns it, the entry puts
    # it in `states`; under jit with the states donated, XLA updates the buffer in place.
    return [f"{name} = {name}.at[{idx}].set({n.tensor(value)}{_cast(dtype, _dt(n, value))})"]


def _scatter_add(s: Step, n: Scope, numerics: str) -> list[str]:
    """A copy of the operand with ``value`` added at the positions (``.at[...].add``: arrays
    are values, so the operand the backward pass still reads is left as it was); coinciding
    positions add up. Under bounds zero a position outside adds nothing: its index is
    clamped and its value masked to 0 (jax would wrap a negative index, not drop it)."""
    x, value, *indices = s.operands
    out = n(s.results[0])
    shape = n.shape(x)
    v = n.tensor(value)
    if not indices:
        return [f"{out} = {n.tensor(x)} + {v}"]
    lines, names, guarded = clamped(s, n, out, indices, shape, *_CLAMP)
    if any(guarded):
        mask = inside_mask(n, indices, shape, guarded)
        lines.append(f"{out}_v = jnp.where({mask}, {v}, 0)")
        v = f"{out}_v"
    lines.append(f"{out} = {n.tensor(x)}.at[{', '.join(names)}].add({v})")
    return lines


def _one_process(s: Step, n: Scope, numerics: str) -> list[str]:
    from linnet.lang.passes.shard import one_process

    raise one_process(s, "generated JAX")


RULES: dict[str, Rule] = spelled(
    "jax",
    by_arity(_unary, _binary),
    {
        "floor": _floor,
        "div": _div,
        "rem": _rem,
        "select": _select,
        "convert": _convert,
        "bitcast": _bitcast,
        "constant": constant_rule,
        "iota": _iota,
        "reshape": _reshape,
        "transpose": _transpose,
        "broadcast": _broadcast,
        "reduce": _reduce,
        "contract": _contract,
        "take": _take,
        "gather": _gather,
        "scatter": _scatter,
        "scatter_add": _scatter_add,
        "slice": _slice,
        # A rank's graph (linnet.lang.passes.shard) communicates; the generated JAX function is one
        # process with no named mesh axis to psum over: E0963, not an identity.
        "all_reduce": _one_process,
        "all_gather": _one_process,
    },
)
"""The elementwise math spelled in :data:`linnet.lang.ir.elementwise.SPELLINGS` (its ``jax``
column), and the rules written here."""


# ---------------------------------------------------------------- fast calls
def _fast_linear(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, *bias = args
    # The body: products accumulated in f32 (for 16-bit T; f64 for f64) converted back to
    # T; then the bias, in T.
    t, acc = _dt(n, call.attributes["args"][0]), _acc(n, call.attributes["args"][0])
    line = (
        f"{out[0]} = jnp.matmul({x}, {w}.T, precision=PRECISION, "
        f"preferred_element_type={acc})" + _cast(t, acc)
    )
    return [line] + [f"{out[0]} = {out[0]} + {bias[0]}" for _ in bias]


def _fast_embedding(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    ids, table = args
    rows = n.shape(call.attributes["args"][1])[0]
    # The body reads zeros outside the table; the runtime rejects such token ids anyway.
    return [
        f"{out[0]} = jnp.take({table}, {ids}, axis=0, mode='fill', fill_value=0)"
        if not in_range(n, call.attributes["args"][0], rows)
        else f"{out[0]} = jnp.take({table}, {ids}, axis=0)"
    ]


def _fast_rms_norm(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, eps = args
    t = _dt(n, call.attributes["args"][0])
    o = out[0]
    return [
        f"{o}_x = {x}.astype(jnp.float32)",
        f"{o}_ms = jnp.mean({o}_x * {o}_x, axis=-1, keepdims=True)",
        f"{o} = {w} * ({o}_x * lax.rsqrt({o}_ms + {eps})){_cast(t, 'jnp.float32')}",
    ]


def _silu_f32(call: Call, n: Scope, x: str) -> str:
    """silu of ``x`` as the body computes it: in f32, rounded to T once (as F.silu). On bf16,
    jax.nn.silu rounds sigmoid(x) to bf16 before the product: 40% of results a step off."""
    t = _dt(n, call.attributes["args"][0])
    return f"jax.nn.silu({x}{_cast('jnp.float32', t)}){_cast(t, 'jnp.float32')}"


def _fast_silu(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = {_silu_f32(call, n, args[0])}"]


def _fast_silu_mul(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = {_silu_f32(call, n, args[0])} * {args[1]}"]


def _fast_softmax(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = jax.nn.softmax({args[0]}, axis=-1)"]


def _fast_decode_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, pos, scale = args
    s = n.shape(call.attributes["args"][1])[1]
    t, acc = _dt(n, call.attributes["args"][0]), _acc(n, call.attributes["args"][0])
    o = out[0]
    # One query a row: two products over the whole cache, scores and softmax in the body's
    # accumulator; positions after pos[b] are masked (zeros or an older sequence's keys).
    return [
        f"{o}_mask = (jnp.arange({s}) <= {pos}[:, None])[:, None, None, :]",
        f"{o}_scores = jnp.einsum('bhgd,bjhd->bhgj', {q}, {k}, precision=PRECISION, "
        f"preferred_element_type={acc}) * {scale}",
        f"{o}_p = jax.nn.softmax(jnp.where({o}_mask, {o}_scores, -jnp.inf), axis=-1)",
        f"{o} = jnp.einsum('bhgj,bjhd->bhgd', {o}_p{_cast(t, acc)}, {v}, "
        f"precision=PRECISION, preferred_element_type={acc}){_cast(t, acc)}",
    ]


def _prefill_attention(
    call: Call, n: Scope, args: list[str], out: list[str], seen: str
) -> list[str]:
    """Prefill attention as the body computes it, for f64: jax.nn.dot_product_attention
    rounds scores and softmax to f32 whatever its inputs. ``seen`` is the [T, S] mask over
    ``{out}_i`` (positions)."""
    q, k, v = args[:3]
    scale = args[3]
    seq = n.shape(call.attributes["args"][0])[1]
    t, acc = _dt(n, call.attributes["args"][0]), _acc(n, call.attributes["args"][0])
    o = out[0]
    return [
        f"{o}_i = jnp.arange({seq})",
        f"{o}_scores = jnp.einsum('bthgd,bshd->bhgts', {q}, {k}, precision=PRECISION, "
        f"preferred_element_type={acc}) * {scale}",
        f"{o}_p = jax.nn.softmax(jnp.where({seen}, {o}_scores, -jnp.inf), axis=-1)",
        f"{o} = jnp.einsum('bhgts,bshd->bthgd', {o}_p{_cast(t, acc)}, {v}, "
        f"precision=PRECISION, preferred_element_type={acc}){_cast(t, acc)}",
    ]


def _fast_causal_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, scale = args
    b, seq, kv, g, hd = n.shape(call.attributes["args"][0])
    o = out[0]
    if _acc(n, call.attributes["args"][0]) != "jnp.float32":
        return _prefill_attention(call, n, args, out, f"{o}_i[None, :] <= {o}_i[:, None]")
    # jax.nn.dot_product_attention takes [B, T, N, H] queries over [B, S, K, H] keys, query
    # head n reading key head n // (N / K): the op's (h, g) order flattened. Its XLA path
    # computes the scores and the softmax in f32 (f64 inputs too: _prefill_attention then).
    return [
        f"{o} = jax.nn.dot_product_attention(jnp.reshape({q}, ({b}, {seq}, {kv * g}, {hd})), "
        f"{k}, {v}, scale={scale}, is_causal=True)",
        f"{o} = jnp.reshape({o}, ({b}, {seq}, {kv}, {g}, {hd}))",
    ]


def _fast_rms_norm_offset(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, eps = args
    t = _dt(n, call.attributes["args"][0])
    o = out[0]
    # Gemma: the (1 + w) scale in f32 too, then one conversion (the op body's order).
    return [
        f"{o}_x = {x}.astype(jnp.float32)",
        f"{o}_ms = jnp.mean({o}_x * {o}_x, axis=-1, keepdims=True)",
        f"{o} = ({o}_x * lax.rsqrt({o}_ms + {eps}) * (1.0 + {w}{_cast('jnp.float32', t)}))"
        f"{_cast(t, 'jnp.float32')}",
    ]


def _fast_layer_norm(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, b, eps = args
    t = _dt(n, call.attributes["args"][0])
    o = out[0]
    # Statistics in f32 with the centred (two-pass) variance, as the body; jax.nn.standardize
    # would take E[x^2] - E[x]^2, which loses digits when the mean is large.
    return [
        f"{o}_x = {x}.astype(jnp.float32)",
        f"{o}_c = {o}_x - jnp.mean({o}_x, axis=-1, keepdims=True)",
        f"{o}_var = jnp.mean({o}_c * {o}_c, axis=-1, keepdims=True)",
        f"{o} = ({o}_c * lax.rsqrt({o}_var + {eps})){_cast(t, 'jnp.float32')} * {w} + {b}",
    ]


def _fast_gelu_tanh(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    t = _dt(n, call.attributes["args"][0])
    # jax.nn.gelu's approximate form is the tanh one (0.044715 x^3), computed in f32.
    return [
        f"{out[0]} = jax.nn.gelu({args[0]}{_cast('jnp.float32', t)}, approximate=True)"
        f"{_cast(t, 'jnp.float32')}"
    ]


def _fast_linear_in_out(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, b = args
    t, acc = _dt(n, call.attributes["args"][0]), _acc(n, call.attributes["args"][0])
    # The weight is stored [in, out] (GPT-2's Conv1D): no transpose; f32 products (f64 for
    # f64), then T.
    return [
        f"{out[0]} = jnp.matmul({x}, {w}, precision=PRECISION, "
        f"preferred_element_type={acc}){_cast(t, acc)} + {b}"
    ]


def _fast_window_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, scale, window = args
    b, seq, kv, g, hd = n.shape(call.attributes["args"][0])
    o = out[0]
    # Key s is seen from query t when t - window < s <= t: a boolean [T, S] mask broadcast
    # over batch and heads (the window may be a traced value, so not local_window_size=).
    seen = f"({o}_i[None, :] <= {o}_i[:, None]) & ({o}_i[:, None] - {o}_i[None, :] < {window})"
    if _acc(n, call.attributes["args"][0]) != "jnp.float32":
        return _prefill_attention(call, n, args, out, seen)
    return [
        f"{o}_i = jnp.arange({seq})",
        f"{o}_mask = {seen}",
        f"{o} = jax.nn.dot_product_attention(jnp.reshape({q}, ({b}, {seq}, {kv * g}, {hd})), "
        f"{k}, {v}, mask={o}_mask[None, None], scale={scale})",
        f"{o} = jnp.reshape({o}, ({b}, {seq}, {kv}, {g}, {hd}))",
    ]


def _fast_window_decode_attention(
    call: Call, n: Scope, args: list[str], out: list[str]
) -> list[str]:
    q, k, v, pos, scale, window = args
    s = n.shape(call.attributes["args"][1])[1]
    t, acc = _dt(n, call.attributes["args"][0]), _acc(n, call.attributes["args"][0])
    o = out[0]
    # decode_attention's two products, with cache positions outside the window masked too.
    return [
        f"{o}_i = jnp.arange({s})",
        f"{o}_mask = (({o}_i <= {pos}[:, None]) & ({pos}[:, None] - {o}_i < {window}))"
        f"[:, None, None, :]",
        f"{o}_scores = jnp.einsum('bhgd,bjhd->bhgj', {q}, {k}, precision=PRECISION, "
        f"preferred_element_type={acc}) * {scale}",
        f"{o}_p = jax.nn.softmax(jnp.where({o}_mask, {o}_scores, -jnp.inf), axis=-1)",
        f"{o} = jnp.einsum('bhgj,bjhd->bhgd', {o}_p{_cast(t, acc)}, {v}, "
        f"precision=PRECISION, preferred_element_type={acc}){_cast(t, acc)}",
    ]


FAST_CALLS: dict[str, FastRule] = {
    "std.nn.linear::linear": _fast_linear,
    "std.nn.linear::linear_bias": _fast_linear,
    "std.nn.embedding::embedding": _fast_embedding,
    "std.nn.norm::rms_norm": _fast_rms_norm,
    "std.nn.activation::silu": _fast_silu,
    "std.nn.activation::softmax": _fast_softmax,
    "std.nn.attention::decode_attention": _fast_decode_attention,
    "std.nn.attention::causal_attention": _fast_causal_attention,
    "std.nn.attention::window_attention": _fast_window_attention,
    "std.nn.attention::window_decode_attention": _fast_window_decode_attention,
    "std.nn.norm::rms_norm_offset": _fast_rms_norm_offset,
    "std.nn.norm::layer_norm": _fast_layer_norm,
    "std.nn.activation::gelu_tanh": _fast_gelu_tanh,
    "std.nn.linear::linear_in_out_bias": _fast_linear_in_out,
    "std.nn.activation::silu_mul": _fast_silu_mul,
}


# ---------------------------------------------------------------- functions
# An internal error's help: a bug in this emitter, and what runs the model meanwhile.
_HELP = (
    "this is a bug in linnet-lang's JAX emitter, not in your model: please report it with "
    "the model and the command; `linnet jax --no-fast` (bodies instead of fused calls) or "
    "the PyTorch runtime runs the model meanwhile"
)


def written_states(graph: Graph, sl: Slice) -> list[str]:
    """The states ``sl`` writes, in the order of its first write of each."""
    out: list[str] = []
    for i in sl.steps or range(sl.start, sl.stop):
        st = graph.steps[i]
        if st.op == "scatter" and st.operands[0][1:] not in out:
            out.append(st.operands[0][1:])
    return out


class JaxEmitter(PythonEmitter):
    """:class:`~linnet.lang.emit.python_emitter.PythonEmitter`'s structure with JAX's rules;
    slices return the states they write."""

    rules = RULES
    fast_calls = FAST_CALLS
    scope_class = JaxScope
    returns_states = True
    kernels_write_states = False  # a Pallas kernel's results are new arrays
    kernels_scratch = False  # nor can it keep scratch buffers between launches
    cpu_autograd_math = frozenset()  # JAX's fused attention differentiates to any order
    module_names = RESERVED
    framework, command = "JAX", "linnet jax"
    # Grad clauses lowered per call (call index -> ClauseTemplate): a launched kernel's
    # backward. Without them (or for a call not in them) it is the vjp of the op's body.
    clauses: dict[int, Any] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clause_functions: list[str] = []

    def kernel_text(self, call: Call) -> Any:
        """The Pallas kernel instance a bound call launches, written once per module (the
        PyTorch emitter's hook, which writes Triton's); see emit/pallas.py."""
        from linnet.lang.emit import pallas

        # Kernels launch under numerics "fast" alone, as in generated PyTorch: products take
        # the backend's default precision there, as the module's PRECISION does.
        return self.stage_texts(call, "PRECISION", pallas.kernel_text, pallas.chain_text)

    def launch_statement(
        self,
        text: Any,
        args: list[str],
        outs: list[str],
        body: list[str],
        call: Call,
        scope: Scope,
        backward: Any = None,
    ) -> tuple[str, frozenset[str], frozenset[str]]:
        """The op's body as a local function, then its Pallas launch or that function."""
        from linnet.lang.emit.pallas import launch_statement

        name = fresh(identifier(call.callee.rsplit("::", 1)[-1]) + "_body", scope.used)
        scope.reserve(name)
        template = (self.clauses or {}).get(call.index)
        backward = self.clause_function(call, template, scope.graph) if template else None
        return launch_statement(text, args, outs, body, name, backward)

    def clause_function(self, call: Call, template: Any, graph: Graph) -> str:
        """A module-level function of the op's ``grad`` clause as lowered for this call
        (a :class:`~linnet.lang.grad.reverse.ClauseTemplate`): the call's tensor arguments
        and one incoming gradient per result -> one gradient per tensor argument. It is the
        kernel's backward under jax.grad."""
        mini = Graph(graph.entry, graph.model, parameters=graph.parameters, states=graph.states)
        mini.values = {
            **{t: graph.values[t] for t in template.targets if t in graph.values},
            **template.values,
        }
        mini.steps = list(template.steps)
        scope = self.scope_class(mini)
        name = fresh(identifier(call.callee.rsplit("::", 1)[-1]) + "_grad", self.used_names)
        self.used_names.add(name)
        params = [scope(t) for t in template.targets] + [scope(g) for g in template.incoming]
        lines = [
            f"def {name}({', '.join(params)}):",
            docstring(
                f"The grad clause of `{call.callee}` ({template.loc}) for this call: "
                "the kernel's backward under jax.grad."
            ),
        ]
        last = None
        for step in template.steps:
            rows = self.rules[step.op](step, scope, self.options.numerics)
            if rows and step.loc and step.loc != last:
                lines.append("    " + self.comment(step.loc))
                last = step.loc
            lines += ["    " + r for r in rows]
        outs = []
        for target, ret in zip(template.targets, template.returned):
            want = graph.values[target] if target in graph.values else graph.parameters[target[1:]]
            have = mini.values.get(ret, want)
            expr = scope.tensor(ret)
            if tuple(have.shape) != tuple(want.shape):
                expr = f"jnp.reshape({expr}, {tuple(want.shape)})"
            if have.dtype != want.dtype:
                expr += f".astype({JAX_DTYPES[want.dtype]})"
            outs.append(expr)
        lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        from linnet.lang.emit.kernel_grad import NOT_LINEAR, clause_not_linear

        problem = clause_not_linear(call, template, graph)
        if problem is not None:
            # JAX differentiates the launch through the clause's transpose (emit/pallas.py's
            # kernel_jvp), which a clause that is not linear has not: differentiating the
            # launch is E0561, never a gradient silently other than the clause's.
            lines = [
                *lines[:2],
                f"    raise linnet_error({NOT_LINEAR!r}, {problem[0]!r}, {problem[1]!r})",
            ]
        self.clause_functions.append("\n".join(lines))
        return name

    def returned_states(self, graph: Graph, sl: Slice) -> list[str]:
        """The states ``sl`` writes: its function returns their new values."""
        return written_states(graph, sl)

    def module(
        self, graphs: list[Graph], origin: str, slices: list[list[Slice]] | None = None
    ) -> str:
        """The module's text: every entry's functions (plans are PyTorch's alone)."""
        entries = [self.entry_function(g, cut(g)) for g in graphs]
        precision = (
            "jax.lax.Precision.HIGHEST  # exact: full f32 products on every backend"
            if self.options.numerics == Numerics.EXACT
            else "None  # fast: the backend's default (TF32 or bf16 passes for f32 on a GPU)"
        )
        header = [
            *self.doc_head(origin),
            "line each group of steps came from. Functions are pure: an entry returns its outputs",
            "and the new states (jit it with the states donated to update them in place).",
            f"Numerics: {self.options.numerics}.",
            '"""',
            "",
            "import jax",
            "import jax.numpy as jnp",
            "import jax.scipy.special",
            "from jax import lax",
            "",
            f"PRECISION = {precision}",
            "",
            "",
        ]
        return self.module_text(header, entries, origin)

    def kernel_parts(self, texts: list[Any]) -> tuple[str, str, list[str]]:
        """emit/pallas.py's header and table of runs; its kernels, then the grad clauses'
        functions (:meth:`clause_function`), before the slices' functions."""
        from linnet.lang.emit.pallas import HEADER, READY, runs_table

        return (
            HEADER,
            runs_table([t.key for t in texts]),
            [READY] + [t.source for t in texts] + self.clause_functions,
        )

    def finish_header(self, header: list[str], body: str) -> None:
        """Nothing to add: the header imports all a JAX module reads."""

    @staticmethod
    def internal(code: str, message: str) -> Exception:
        """An internal error of the JAX emitter; its help names what runs the model meanwhile."""
        return internal_error(code, message, help=_HELP)


def emit_jax(
    graphs: Graph | list[Graph],
    sources: dict[str, str] | None = None,
    numerics: str = "exact",
    fast: bool = True,
    origin: str = "",
    clauses: dict[int, Any] | None = None,
) -> str:
    """JAX source for one or more lowered entries of a model (text; jax is not imported).

    Each entry becomes ``f(*inputs, params, states) -> (outputs, new_states)``, a pure
    function; ``fast=False`` lowers std ops from their bodies instead of fused JAX calls.
    Under numerics "fast", each call of an op bound to a kernel whose instance the graph
    holds (:func:`linnet.lang.check.kernel_instances.with_kernels`) launches the kernel through
    ``pl.pallas_call`` where it can (see :mod:`linnet.lang.emit.pallas`); without, the op's
    body runs. Under jax.grad a launched kernel's backward is the op's ``grad`` clause where
    ``clauses`` (``lower(..., grad_clauses=clauses)``: call index -> clause) has its call,
    else the vjp of the op's body.

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
    >>> src = emit_jax(lower(prog, "run", {"x": [3]}))
    >>> "def run(x, params, states):" in src and "import jax.numpy as jnp" in src
    True
    """
    graphs = [graphs] if isinstance(graphs, Graph) else list(graphs)
    emitter = JaxEmitter(sources, Options(Numerics.parse(numerics), fast))
    emitter.clauses = clauses
    return emitter.module(graphs, origin or (graphs[0].model if graphs else "?"))
