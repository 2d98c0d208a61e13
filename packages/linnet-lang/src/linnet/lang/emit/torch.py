"""Graph → readable PyTorch source. Writes text only: this module never imports torch.

One Python function per slice kind (every layer shares one), one function per entry that
calls them in order, and metadata (``ENTRIES``) the runtime uses to call slices one by one.
Values keep their source names (``q``, ``scores``); a comment with ``file:line`` and the
source line heads each group of steps.

Where PyTorch has a fused call with the same semantics as a std op's body, the whole call
span becomes that call (``F.linear``, ``F.scaled_dot_product_attention``, ``F.embedding``,
``F.rms_norm``): the table :data:`FAST_CALLS`. linnet-runtime-torch's
``tests/test_generated.py`` proves each one equal to the op's body. Every primitive has a rule
in :data:`RULES`; a test fails when one is missing.

The text is meant to be read: each function takes only what its body reads (a fused call or
a shifted read may leave a slice input unread; it is then neither passed nor computed), values
the source never named are named after their op (``mul_1``), no line is over 100 characters,
guards that cannot fire are left out, constants are literals, and the text is compiled before
it is returned (E0910/E0911 otherwise).

>>> from linnet.lang.emit.torch import RULES
>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))
[]
"""

from __future__ import annotations

from typing import Any

from linnet.lang.emit import edge_rules
from linnet.lang.emit.kernel_grad import GRAD_HELPERS, Backwards
from linnet.lang.emit.python_emitter import PythonEmitter
from linnet.lang.emit.python_rules import (
    RESERVED,
    TORCH_INT,
    FastRule,
    Options,
    Rule,
    Scope,
    clamped,
    constant_rule,
    in_range,
    inside_mask,
    internal_error,
    shifted_by,
)
from linnet.lang.emit.triton import (
    HEADER,
    READY,
    KernelText,
    chain_text,
    kernel_text,
    launch_statement,
    runs_table,
)
from linnet.lang.ir.elementwise import by_arity, spelled
from linnet.lang.ir.graph import Call, Graph, Step
from linnet.lang.passes.slices import Slice, cut
from linnet.lang.pipeline import NUMERICS, Numerics  # noqa: F401  (NUMERICS: kept as a name)
from linnet.lang.tensors.dtypes import accumulator

TORCH_DTYPES = {
    "f64": "torch.float64",
    "f32": "torch.float32",
    "f16": "torch.float16",
    "bf16": "torch.bfloat16",
    "i64": "torch.int64",
    "i32": "torch.int32",
    "i16": "torch.int16",
    "i8": "torch.int8",
    "u8": "torch.uint8",
    "bool": "torch.bool",
}


class TorchScope(Scope):
    """A :class:`~linnet.lang.emit.python_rules.Scope` whose constants become torch tensors."""

    def tensor(self, ref: str) -> str:
        """``ref`` as a tensor expression: a constant inlined as a literal (``0``) becomes
        ``torch.full((), 0, ...)`` where a rule calls a tensor method on it (``.reshape``):
        a fill on the device, no copy from the host (a CUDA graph can capture it)."""
        if ref in self.literals:
            return (
                f"torch.full((), {self.literals[ref]}, dtype={TORCH_DTYPES[self.dtype(ref)]}, "
                f"device=DEVICE)"
            )
        return self(ref)


# ---------------------------------------------------------------- primitive rules


def _unary(fmt: str) -> Rule:
    return lambda s, n, numerics: [f"{n(s.results[0])} = {fmt.format(n(s.operands[0]))}"]


def _binary(fmt: str) -> Rule:
    def rule(s: Step, n: Scope, numerics: str) -> list[str]:
        a, b = (n(o) for o in s.operands)
        return [f"{n(s.results[0])} = {fmt.format(a, b)}"]

    return rule


def _div(s: Step, n: Scope, numerics: str) -> list[str]:
    if n.graph.values[s.results[0]].dtype in TORCH_INT:
        return edge_rules.int_division(edge_rules.TORCH, s, n)  # a / 0 is 0
    a, b = (n(o) for o in s.operands)
    return [f"{n(s.results[0])} = {a} / {b}"]


def _rem(s: Step, n: Scope, numerics: str) -> list[str]:
    return edge_rules.int_remainder(edge_rules.TORCH, s, n)  # an integer a % 0 is a


def _extreme(fn: str, clamp: str) -> Rule:
    def rule(s: Step, n: Scope, numerics: str) -> list[str]:
        a, b = s.operands
        if b in n.literals:
            return [f"{n(s.results[0])} = torch.clamp({n(a)}, {clamp}={n(b)})"]
        if a in n.literals:
            return [f"{n(s.results[0])} = torch.clamp({n(b)}, {clamp}={n(a)})"]
        return [f"{n(s.results[0])} = torch.{fn}({n(a)}, {n(b)})"]

    return rule


def _iota(s: Step, n: Scope, numerics: str) -> list[str]:
    shape, axis = s.attributes["shape"], s.attributes["axis"]
    dtype = TORCH_DTYPES[s.attributes["dtype"]]
    line = f"torch.arange({shape[axis]}, dtype={dtype}, device=DEVICE)"
    if len(shape) > 1:
        view = [1] * len(shape)
        view[axis] = shape[axis]
        line += f".reshape({tuple(view)}).expand({tuple(shape)})"
    return [f"{n(s.results[0])} = {line}"]


def _convert(s: Step, n: Scope, numerics: str) -> list[str]:
    saturated = edge_rules.float_to_int(edge_rules.TORCH, s, n, n.dtype(s.operands[0]))
    if saturated is not None:  # float to integer: NaN is 0, the rest saturates
        return saturated
    return [
        f"{n(s.results[0])} = {n.tensor(s.operands[0])}.to({TORCH_DTYPES[s.attributes['dtype']]})"
    ]


def _bitcast(s: Step, n: Scope, numerics: str) -> list[str]:
    """The same bits as another dtype of their width: a view (no copy), but of a state,
    which would change with the state's next write."""
    x = s.operands[0]
    copy = ".clone()" if x.startswith("@") and x[1:] in n.graph.states else ""
    dtype = TORCH_DTYPES[s.attributes["dtype"]]
    return [f"{n(s.results[0])} = {n.tensor(x)}.view({dtype}){copy}"]


def _reshape(s: Step, n: Scope, numerics: str) -> list[str]:
    return [
        f"{n(s.results[0])} = {n.tensor(s.operands[0])}.reshape({tuple(s.attributes['shape'])})"
    ]


def _transpose(s: Step, n: Scope, numerics: str) -> list[str]:
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.permute({tuple(s.attributes['perm'])})"]


def _slice(s: Step, n: Scope, numerics: str) -> list[str]:
    """A static range of each axis as Python slicing (a view: no gather, no copy), with
    whole axes after the last sliced one left out (`w[0:64]`, `qkv[:, 64:96]`)."""
    x = s.operands[0]
    shape = n.shape(x)
    parts = [
        ":" if (a, b) == (0, size) else f"{a}:{b}"
        for a, b, size in zip(s.attributes["starts"], s.attributes["limits"], shape)
    ]
    while len(parts) > 1 and parts[-1] == ":":
        parts.pop()
    # A view of a state would change with the state's next write: copy it.
    copy = ".clone()" if x.startswith("@") and x[1:] in n.graph.states else ""
    return [f"{n(s.results[0])} = {n.tensor(x)}[{', '.join(parts)}]{copy}"]


def _broadcast(s: Step, n: Scope, numerics: str) -> list[str]:
    src = n(s.operands[0])
    if s.operands[0] in n.literals:
        dtype = TORCH_DTYPES[n.graph.values[s.results[0]].dtype]
        src = f"torch.tensor({src}, dtype={dtype}, device=DEVICE)"
    return [f"{n(s.results[0])} = {src}.expand({tuple(s.attributes['shape'])})"]


def _reduce(s: Step, n: Scope, numerics: str) -> list[str]:
    kind, axes, acc = s.attributes["kind"], tuple(s.attributes["axes"]), s.attributes["accumulate"]
    x = n(s.operands[0])
    dtype = TORCH_DTYPES[acc]
    if kind == "sum":
        expr = f"{x}.sum(dim={axes}, dtype={dtype})"
    elif kind == "mean":
        expr = f"{x}.mean(dim={axes}, dtype={dtype})"
    elif kind in ("max", "min"):
        expr = f"{x}.{'amax' if kind == 'max' else 'amin'}(dim={axes})"
    else:  # prod: one axis at a time, last first so that indices stay valid
        expr = f"{x}.to({dtype})"
        for axis in sorted(axes, reverse=True):
            expr = f"torch.prod({expr}, dim={axis})"
    return [f"{n(s.results[0])} = {expr}"]


def _contract(s: Step, n: Scope, numerics: str) -> list[str]:
    a, b = s.operands
    acc = s.attributes["accumulate"]
    spec = s.attributes["spec"]
    # n.tensor: a constant operand (a reverse pass's seed of 1) is a tensor, not a literal.
    ta, tb = n.tensor(a), n.tensor(b)
    if n.dtype(a) == acc:
        expr = f"torch.einsum({spec!r}, {ta}, {tb})"
    elif numerics == Numerics.EXACT:
        dt = TORCH_DTYPES[acc]
        expr = f"torch.einsum({spec!r}, {ta}.to({dt}), {tb}.to({dt}))"
    else:
        expr = f"torch.einsum({spec!r}, {ta}, {tb}).to({TORCH_DTYPES[acc]})"
    return [f"{n(s.results[0])} = {expr}"]


def _take(s: Step, n: Scope, numerics: str) -> list[str]:
    x, idx = s.operands
    axis = s.attributes["axis"]
    size = n.shape(x)[axis]
    out = n(s.results[0])
    shift = shifted_by(n, idx, size) if s.attributes["bounds"] == "zero" else None
    if shift is not None:
        # x[..., i + c, ...] reading 0 outside: a slice and a pad, not a gather.
        rank = len(n.shape(x))
        if abs(shift) >= size:
            return [f"{out} = torch.zeros_like({n(x)})"]
        start, keep = (shift, size - shift) if shift >= 0 else (0, size + shift)
        left, right = (0, shift) if shift >= 0 else (-shift, 0)
        pad = (0, 0) * (rank - 1 - axis) + (left, right)
        return [f"{out} = F.pad({n(x)}.narrow({axis}, {start}, {keep}), {pad})"]
    out_shape = tuple(n.graph.values[s.results[0]].shape)
    idx_shape = n.shape(idx)
    if idx in n.literals and isinstance(n.producers()[idx].attributes.get("value"), int):
        # x[..., 3, ...]: one known position (rank 0), a view; outside the axis, zeros
        # (bounds zero) or an IndexError that the runtime reports (unchecked).
        v = n.producers()[idx].attributes["value"]
        if s.attributes["bounds"] == "zero" and not 0 <= v < size:
            return [f"{out} = {n(x)}.new_zeros({out_shape})"]
        # A view of a state would change with the state's next write: copy it.
        copy = ".clone()" if x.startswith("@") and x[1:] in n.graph.states else ""
        return [f"{out} = {n(x)}.select({axis}, {v}){copy}"]
    lines = []
    i = n.tensor(idx)
    # A guard that cannot fire (the index is within the axis by construction) is not written.
    guard = s.attributes["bounds"] == "zero" and not in_range(n, idx, size)
    if guard:
        lines.append(f"{out}_index = {i}.clamp(0, {size - 1})")
        index = f"{out}_index"
    else:
        index = i
    flat = index if len(idx_shape) == 1 else f"{index}.reshape(-1)"
    expr = f"torch.index_select({n(x)}, {axis}, {flat})"
    if len(idx_shape) != 1:
        expr += f".reshape({out_shape})"
    lines.append(f"{out} = {expr}")
    if guard:
        rank = len(n.shape(x))
        view = (1,) * axis + tuple(idx_shape) + (1,) * (rank - axis - 1)
        lines.append(
            f"{out} = torch.where((({i} >= 0) & ({i} < {size})).reshape({view}), {out}, 0)"
        )
    return lines


def _gather(s: Step, n: Scope, numerics: str) -> list[str]:
    x, *indices = s.operands
    shape = n.shape(x)
    out = n(s.results[0])
    lines, names, guarded = clamped(s, n, out, indices, shape)
    lines.append(f"{out} = {n(x)}[{', '.join(names)}]")
    if any(guarded):
        mask = inside_mask(n, indices, shape, guarded)
        lines.append(f"{out} = torch.where({mask}, {out}, 0)")
    return lines


def _scatter(s: Step, n: Scope, numerics: str) -> list[str]:
    state, value, *indices = s.operands
    # n.tensor: a literal value (`self.s[i] = 1.0`) must be a tensor for copy_ and index_put_
    if not indices:
        return [f"{n(state)}.copy_({n.tensor(value)})"]
    idx = ", ".join(f"{n.tensor(i)}.long()" for i in indices)
    return [f"{n(state)}.index_put_(({idx},), {n.tensor(value)})"]


def _scatter_add(s: Step, n: Scope, numerics: str) -> list[str]:
    """Value semantics: a new tensor (``torch.index_put``, not the in-place method), so the
    operand (a forward value the backward pass still reads) is left as it was."""
    x, value, *indices = s.operands
    out = n(s.results[0])
    shape = n.shape(x)
    lines, names, guarded = clamped(s, n, out, indices, shape)
    v = n.tensor(value)
    if any(guarded):
        mask = inside_mask(n, indices, shape, guarded)
        lines.append(f"{out}_v = torch.where({mask}, {v}, 0)")
        v = f"{out}_v"
    if not indices:
        lines.append(f"{out} = {n.tensor(x)} + {v}")
    else:
        idx = ", ".join(names)
        lines.append(f"{out} = torch.index_put({n.tensor(x)}, ({idx},), {v}, accumulate=True)")
    return lines


_REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def _all_reduce(s: Step, n: Scope, numerics: str) -> list[str]:
    """torch.distributed on the default group (the runtime started it: docs/parallel.md),
    into a copy: the operand is a value, never written in place."""
    out, x = n(s.results[0]), n.tensor(s.operands[0])
    op = _REDUCE_OPS[s.attributes["kind"]]
    return [
        f"{out} = {x}.clone()",
        f"torch.distributed.all_reduce({out}, op=torch.distributed.ReduceOp.{op})",
    ]


def _all_gather(s: Step, n: Scope, numerics: str) -> list[str]:
    out, x = n(s.results[0]), n.tensor(s.operands[0])
    world, axis = s.attributes["world"], s.attributes["axis"]
    return [
        f"{out}_parts = [torch.empty_like({x}) for _ in range({world})]",
        f"torch.distributed.all_gather({out}_parts, {x}.contiguous())",
        f"{out} = torch.cat({out}_parts, dim={axis})",
    ]


RULES: dict[str, Rule] = spelled(
    "torch",
    by_arity(_unary, _binary),
    {
        "div": _div,
        "rem": _rem,
        "maximum": _extreme("maximum", "min"),
        "minimum": _extreme("minimum", "max"),
        "select": lambda s, n, nu: [
            f"{n(s.results[0])} = torch.where({', '.join(n(o) for o in s.operands)})"
        ],
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
        "all_reduce": _all_reduce,
        "all_gather": _all_gather,  # tensor parallelism (issue 21)
    },
)
"""The elementwise math spelled in :data:`linnet.lang.ir.elementwise.SPELLINGS` (its
``torch`` column), and the rules written here."""


def _fast_linear(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = F.linear({', '.join(args)})"]


def _fast_embedding(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = F.embedding({args[0]}, {args[1]})"]


def _fast_rms_norm(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, eps = args
    d = n.shape(call.attributes["args"][0])[-1]
    return [f"{out[0]} = {w} * F.rms_norm({x}.float(), ({d},), eps={eps}).to({x}.dtype)"]


def _fast_silu(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = F.silu({args[0]})"]


def _fast_silu_mul(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = F.silu({args[0]}) * {args[1]}"]


def _fast_softmax(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = torch.softmax({args[0]}, dim=-1)"]


def _widen(n: Scope, ref: str) -> str:
    """``.float()``, or ``.double()`` for f64: to the accumulator of the body's `sum` over
    ``ref``'s dtype (a hard-coded ``.float()`` computed f64 attention in f32: issue 46 item
    3). A body's explicit ``as f32`` (the norms' statistics, gelu) stays ``.float()``."""
    return ".double()" if accumulator("sum", n.dtype(ref)) == "f64" else ".float()"


CACHE_REACH = '''def cache_reach(pos, length):
    """How many cache positions a decode step reads: up to the furthest of `pos` (every later
    one is masked out), or all `length` under torch.compile (a count read from a tensor
    would compile again for each) and for a tensor without values (torch.export's fake
    tensors). On the CPU, reading `pos` costs no wait for a device."""
    if torch.compiler.is_compiling() or type(pos) is not torch.Tensor:
        return length
    return min(length, int(pos.max()) + 1)'''


def _reach(n: Scope, pos: str, k: str, v: str, s: int, o: str) -> tuple[list[str], str, str, str]:
    """A decode step's cache reach: on the CPU (:data:`CACHE_REACH`, a decode step there read
    all S positions, 13% of SmolLM2's step at S=1024), only the positions written so far (so
    its sums run in another order than a full read's: equal to float rounding);
    elsewhere all ``s`` (a CUDA graph needs fixed shapes, and reading ``pos`` would wait for
    the device). Returns the lines first, the length and the two caches to read."""
    if n.options is None or torch_device_type(n.options.device) != "cpu":
        return [], str(s), k, v
    return (
        [f"{o}_n = cache_reach({pos}, {s})"],
        f"{o}_n",
        f"{k}[:, :{o}_n]",
        f"{v}[:, :{o}_n]",
    )


def torch_device_type(device: str) -> str:
    """The type of a torch device string: ``"cuda"`` for ``"cuda:1"``.

    >>> torch_device_type("cuda:1"), torch_device_type("cpu")
    ('cuda', 'cpu')
    """
    return device.split(":", 1)[0]


def _fast_decode_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, pos, scale = args
    s = n.shape(call.attributes["args"][1])[1]
    o = out[0]
    wide = _widen(n, call.attributes["args"][0])
    first, s_, k, v = _reach(n, pos, k, v, s, o)
    # One query a row: two batched products over the cache in place (the permutes are views)
    # and the softmax in f32 (f64 for f64). SDPA with a boolean mask takes a slow general
    # path for this shape.
    return [
        *first,
        f"{o}_mask = (torch.arange({s_}, device=DEVICE) <= {pos}[:, None])[:, None, None, :]",
        f"{o}_scores = torch.matmul({q}, {k}.permute(0, 2, 3, 1)){wide} * {scale}",
        f"{o}_p = torch.softmax({o}_scores.masked_fill(~{o}_mask, float('-inf')), dim=-1)",
        f"{o} = torch.matmul({o}_p.to({q}.dtype), {v}.permute(0, 2, 1, 3))",
    ]


def _fast_causal_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, scale = args
    b, seq, kv, g, hd = n.shape(call.attributes["args"][0])
    o = out[0]
    return [
        f"{o} = F.scaled_dot_product_attention({q}.reshape({b}, {seq}, {kv * g}, {hd})"
        f".transpose(1, 2), {k}.transpose(1, 2), {v}.transpose(1, 2), is_causal=True, "
        f"scale={scale}, enable_gqa=True)",
        f"{o} = {o}.transpose(1, 2).reshape({b}, {seq}, {kv}, {g}, {hd})",
    ]


def _fast_rms_norm_offset(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, eps = args
    d = n.shape(call.attributes["args"][0])[-1]
    # Gemma: the (1 + w) scale in f32 too, then one conversion (the op body's order).
    return [
        f"{out[0]} = (F.rms_norm({x}.float(), ({d},), eps={eps}) * (1.0 + {w}.float()))"
        f".to({x}.dtype)"
    ]


def _fast_layer_norm(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, b, eps = args
    d = n.shape(call.attributes["args"][0])[-1]
    return [f"{out[0]} = F.layer_norm({x}.float(), ({d},), eps={eps}).to({x}.dtype) * {w} + {b}"]


def _fast_gelu_tanh(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = F.gelu({args[0]}.float(), approximate='tanh').to({args[0]}.dtype)"]


def _fast_linear_in_out(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    x, w, b = args
    return [f"{out[0]} = F.linear({x}, {w}.t(), {b})"]  # weight stored [in, out] (Conv1D)


def _fast_window_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, scale, window = args
    b, seq, kv, g, hd = n.shape(call.attributes["args"][0])
    o = out[0]
    # Key s is seen from query t when t - window < s <= t: a boolean mask for SDPA.
    return [
        f"{o}_i = torch.arange({seq}, device=DEVICE)",
        f"{o}_mask = ({o}_i[None, :] <= {o}_i[:, None]) & ({o}_i[:, None] - {o}_i[None, :] "
        f"< {window})",
        f"{o} = F.scaled_dot_product_attention({q}.reshape({b}, {seq}, {kv * g}, {hd})"
        f".transpose(1, 2), {k}.transpose(1, 2), {v}.transpose(1, 2), attn_mask={o}_mask, "
        f"scale={scale}, enable_gqa=True)",
        f"{o} = {o}.transpose(1, 2).reshape({b}, {seq}, {kv}, {g}, {hd})",
    ]


def _fast_window_decode_attention(
    call: Call, n: Scope, args: list[str], out: list[str]
) -> list[str]:
    q, k, v, pos, scale, window = args
    s = n.shape(call.attributes["args"][1])[1]
    o = out[0]
    wide = _widen(n, call.attributes["args"][0])
    first, s_, k, v = _reach(n, pos, k, v, s, o)
    return [
        *first,
        f"{o}_i = torch.arange({s_}, device=DEVICE)",
        f"{o}_mask = (({o}_i <= {pos}[:, None]) & ({pos}[:, None] - {o}_i < {window}))"
        f"[:, None, None, :]",
        f"{o}_scores = torch.matmul({q}, {k}.permute(0, 2, 3, 1)){wide} * {scale}",
        f"{o}_p = torch.softmax({o}_scores.masked_fill(~{o}_mask, float('-inf')), dim=-1)",
        f"{o} = torch.matmul({o}_p.to({q}.dtype), {v}.permute(0, 2, 1, 3))",
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


class TorchEmitter(PythonEmitter):
    """Writes a module of generated PyTorch in :class:`~linnet.lang.emit.python_emitter.
    PythonEmitter`'s structure: PyTorch's rules and fused calls, Triton's launches, and a
    header with ``DEVICE``, the model's torch device."""

    rules: dict[str, Rule] = RULES
    fast_calls: dict[str, FastRule] = FAST_CALLS
    scope_class: type[Scope] = TorchScope
    # the fused calls run under SDPA's math backend on CPU under autograd (see the base)
    cpu_autograd_math = frozenset(
        {"std.nn.attention::causal_attention", "std.nn.attention::window_attention"}
    )
    module_names: set[str] = RESERVED
    framework, command = "PyTorch", "linnet torch"

    def kernel_text(self, call: Call) -> KernelText:
        """The kernel instance a bound call launches, written once per module."""
        precision = "tf32" if self.options.numerics == Numerics.FAST else "ieee"
        return self.stage_texts(call, precision, kernel_text, chain_text)

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
        """The statement at a bound op's call (emit/triton.py's; emit/jax.py writes Pallas's)."""
        return launch_statement(text, args, outs, body, backward)

    def module(
        self, graphs: list[Graph], origin: str, slices: list[list[Slice]] | None = None
    ) -> str:
        """The module's text. With ``slices`` (one list per graph), only those slice
        functions are written, for a plan's runner to call (no entry function)."""
        if slices is not None:
            entries = []
            for g, sls in zip(graphs, slices):
                for sl in sls:
                    self.slice_function(g, sl)
                self.metadata.append(
                    self.entry_metadata(
                        g,
                        [
                            dict(
                                function=self.kinds[sl.kind],
                                kind=sl.kind,
                                start=sl.start,
                                stop=sl.stop,
                                inputs=sl.inputs,
                                outputs=sl.outputs,
                                parameters=sl.parameters,
                                states=sl.states,
                            )
                            for sl in sls
                        ],
                    )
                )
        else:
            self.backwards = Backwards()
            entries = [self.entry_function(g, cut(g)) for g in graphs]
            # Each launch's backward pass, as entries of their own (emit/kernel_grad.py).
            while self.backwards is not None and len(self.backwards.graphs) > len(entries) - len(
                graphs
            ):
                g = self.backwards.graphs[len(entries) - len(graphs)]
                # Its own slice kinds: a body with kernels off must not share a function
                # with the same steps where they launch.
                sls = cut(g)
                for sl in sls:
                    sl.kind = f"{g.entry}:{sl.kind}"
                entries.append(self.entry_function(g, sls))
        header = [
            *self.doc_head(origin),
            f"line each group of steps came from. Numerics: {self.options.numerics}.",
            '"""',
            "",
            "import torch",
            "import torch.nn.functional as F",
            "",
            f"DEVICE = torch.device({self.options.device!r})  # the model's: a module per device",
            "",
        ]
        return self.module_text(header, entries, origin)

    def kernel_parts(self, texts: list[Any]) -> tuple[str, str, list[str]]:
        """What a module that launches the kernels ``texts`` adds (emit/triton.py's): lines
        after its imports, its table of runs, and the functions before the slices'."""
        functions = [READY] + [t.source for t in texts]
        if self.backwards is not None and self.backwards.functions:
            functions[1:1] = [GRAD_HELPERS, *self.backwards.functions]
        return HEADER, runs_table([t.key for t in texts]), functions

    def finish_header(self, header: list[str], body: str) -> None:
        """Imports that only some modules need, added to ``header`` once ``body`` is known."""
        if "torch.distributed." in body:  # a rank's graph (tensor parallelism, issue 21)
            header.insert(header.index("import torch") + 1, "import torch.distributed")
        if "cache_reach(" in body:  # a CPU module's decode attention (_reach)
            header += [CACHE_REACH, "", ""]

    @staticmethod
    def internal(code: str, message: str) -> Exception:
        """An internal error of this emitter (a bug in it, not in the model)."""
        return internal_error(code, message)


def emit_torch(
    graphs: Graph | list[Graph],
    sources: dict[str, str] | None = None,
    numerics: str = "exact",
    fast: bool = True,
    origin: str = "",
    slices: list[list[Slice]] | None = None,
    device: str = "cpu",
) -> str:
    """PyTorch source for one or more lowered entries of a model.

    Under numerics "fast", each call of an op bound to a kernel whose instance the graph
    holds (recorded at lowering time: :func:`linnet.lang.check.kernel_instances.with_kernels`)
    launches the kernel where it can (see :mod:`linnet.lang.emit.triton`); elsewhere the
    op's body runs.

    The text always compiles: a rule that writes invalid Python is an internal error
    (E0910, naming the step and its source line) and so is a module that does not compile
    (E0911), never a file that fails when imported.

    ``device`` is the torch device the module makes its tensors on (``DEVICE``, a constant
    of the text): two models of one source on two devices import two modules, so neither
    can move the other's (issue 38 item 19).

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
    >>> src = emit_torch(lower(prog, "run", {"x": [3]}))
    >>> "def run(x, params, states):" in src
    True
    """
    graphs = [graphs] if isinstance(graphs, Graph) else list(graphs)
    emitter = TorchEmitter(sources, Options(Numerics.parse(numerics), fast, str(device)))
    return emitter.module(graphs, origin or (graphs[0].model if graphs else "?"), slices)
