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

import ast
import builtins
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from linnet.lang import __version__
from linnet.lang.emit import edge_rules
from linnet.lang.emit.kernel_grad import GRAD_HELPERS, Backwards, math_under_autograd
from linnet.lang.emit.python import (
    WIDTH,
    Draft,
    Statement,
    docstring,
    fresh,
    kept_outputs,
    wrap,
)
from linnet.lang.emit.tiles import literal
from linnet.lang.emit.triton import (
    HEADER,
    READY,
    KernelText,
    chain_text,
    kernel_text,
    launch_statement,
    runs_table,
)
from linnet.lang.ir.graph import Call, Graph, Step
from linnet.lang.ir.kernels import KernelInstance, instance_key
from linnet.lang.ir.slices import Slice, cut
from linnet.lang.pipeline import NUMERICS, Numerics  # noqa: F401  (NUMERICS: kept as a name)
from linnet.lang.tensors.dtypes import accumulator

TORCH_DTYPES = {"f64": "torch.float64", "f32": "torch.float32", "f16": "torch.float16",
                "bf16": "torch.bfloat16", "i64": "torch.int64", "i32": "torch.int32",
                "i16": "torch.int16", "i8": "torch.int8", "u8": "torch.uint8",
                "bool": "torch.bool"}


def identifier(text: str) -> str:
    """A Python name for an SSA value or a parameter path (`%q.1` → `q_1`). Keywords,
    builtins (`float`, `len`, `id`) and the module's own names (`torch`, `F`) get a `v_`
    prefix: generated code calls ``float('-inf')`` and must not find a tensor there.

    >>> identifier("%q.1"), identifier("%float"), identifier("%len"), identifier("@class")
    ('q_1', 'v_float', 'v_len', 'v_class')
    """
    name = re.sub(r"[^0-9A-Za-z_]", "_", text.lstrip("%@"))
    if not name or name[0].isdigit() or keyword.iskeyword(name) or keyword.issoftkeyword(name) \
            or name in RESERVED or name.startswith("__"):
        name = "v_" + name
    return name


# Names the generated module itself uses, and every builtin (a value named `float` would
# shadow the `float('-inf')` of a masked softmax, `len` or `type` any later call of them).
RESERVED = {"torch", "F", "DEVICE", "params", "states", "math", "ENTRIES"} | set(dir(builtins))
# ... and what a module that launches kernels defines (emit/triton.py's HEADER and READY).
RESERVED |= {"os", "types", "triton", "tl", "TRITON", "INTERPRET", "wrap_triton", "LIBRARY",
             "RUNS", "kernels_ready", "kernel_op", "POISON", "new_result", "PDL",
             "PDL_LAUNCH", "pdl_launch", "_PDL_DEVICES", "_PDL_MODE", "contextlib",
             "set_wrap_triton_enabled", "direct", "_LIBRARY", "_SCRATCH", "check_inplace",
             "dot16", "prefetch_l2", "prefetching", "scratch", "warnings", "max_nan",
             "min_nan"}
# ... and emit/kernel_grad.py's helpers for launches under autograd.
RESERVED |= {"kernel_grad_op", "launch_with_grad", "body_backward", "no_backward"}


_ANONYMOUS = re.compile(r"^%t(\.\d+)?$")


@dataclass
class Scope:
    """Names inside one generated function: SSA values, parameters and constants."""

    graph: Graph
    slice: Slice | None = None
    names: dict[str, str] = field(default_factory=dict)
    literals: dict[str, str] = field(default_factory=dict)  # constant steps inlined as literals
    # The values of `names`, kept beside it: rebuilding the set for every new name made
    # emission quadratic in the length of an entry.
    used: set[str] = field(default_factory=set)
    # Where the search for a free `base_N` stopped last time (every earlier N is taken).
    next_suffix: dict[str, int] = field(default_factory=dict)

    def __call__(self, ref: str) -> str:
        if ref in self.literals:
            return self.literals[ref]
        if ref not in self.names:
            anonymous = _ANONYMOUS.match(ref)
            step = self.producers().get(ref) if anonymous else None
            if step is not None:
                # A value the source never named (`%t.37`): named after its op and numbered
                # in this function (`pad_1`, `neg_1`), not after its place in the whole graph.
                base, n = re.sub(r"[^0-9A-Za-z_]", "_", step.op), 1
                first = f"{base}_1"
            else:
                base = identifier(self.slice.relative(ref[1:]) if ref.startswith("@")
                                  and self.slice else ref)
                n = 1
                first = base
            n = self.next_suffix.get(base, n)
            name = first if n == 1 else f"{base}_{n}"
            while name in self.used:
                n += 1
                name = f"{base}_{n}"
            self.next_suffix[base] = n
            self.names[ref] = name
            self.used.add(name)
        return self.names[ref]

    def reserve(self, name: str) -> None:
        """Keep ``name`` (a function the entry calls) from being given to a value."""
        self.used.add(name)

    def tensor(self, ref: str) -> str:
        """``ref`` as a tensor expression: a constant inlined as a literal (``0``) becomes
        ``torch.full((), 0, ...)`` where a rule calls a tensor method on it (``.reshape``):
        a fill on the device, no copy from the host (a CUDA graph can capture it)."""
        if ref in self.literals:
            return (f"torch.full((), {self.literals[ref]}, dtype={TORCH_DTYPES[self.dtype(ref)]}, "
                    f"device=DEVICE)")
        return self(ref)

    def producers(self) -> dict[str, Step]:
        if not hasattr(self, "_producers"):
            self._producers = {r: st for st in self.graph.steps for r in st.results}
        return self._producers

    def shape(self, ref: str) -> tuple[int, ...]:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].shape
        return self.graph.values[ref].shape

    def dtype(self, ref: str) -> str:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].dtype
        return self.graph.values[ref].dtype


# ---------------------------------------------------------------- primitive rules
Rule = Callable[[Step, Scope, str], list[str]]


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


TORCH_INT = {"i8", "i16", "i32", "i64", "u8"}


def _extreme(fn: str, clamp: str) -> Rule:
    def rule(s: Step, n: Scope, numerics: str) -> list[str]:
        a, b = s.operands
        if b in n.literals:
            return [f"{n(s.results[0])} = torch.clamp({n(a)}, {clamp}={n(b)})"]
        if a in n.literals:
            return [f"{n(s.results[0])} = torch.clamp({n(b)}, {clamp}={n(a)})"]
        return [f"{n(s.results[0])} = torch.{fn}({n(a)}, {n(b)})"]
    return rule


def _constant(s: Step, n: Scope, numerics: str) -> list[str]:
    n.literals[s.results[0]] = literal(s.attributes["value"])
    return []


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
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.to({TORCH_DTYPES[s.attributes['dtype']]})"]


def _reshape(s: Step, n: Scope, numerics: str) -> list[str]:
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.reshape({tuple(s.attributes['shape'])})"]


def _transpose(s: Step, n: Scope, numerics: str) -> list[str]:
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.permute({tuple(s.attributes['perm'])})"]


def _slice(s: Step, n: Scope, numerics: str) -> list[str]:
    """A static range of each axis as Python slicing (a view: no gather, no copy), with
    whole axes after the last sliced one left out (`w[0:64]`, `qkv[:, 64:96]`)."""
    x = s.operands[0]
    shape = n.shape(x)
    parts = [":" if (a, b) == (0, size) else f"{a}:{b}"
             for a, b, size in zip(s.attributes["starts"], s.attributes["limits"], shape)]
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


def _shift(n: Scope, idx: str, size: int) -> int | None:
    """If ``idx`` is `iota(size) + c` (or `- c`), the shift c; else None."""
    producers = n.producers()
    step = producers.get(idx)
    if step is None or step.op not in ("add", "sub"):
        return None
    a, b = (producers.get(o) for o in step.operands)
    if a is None or b is None:
        return None
    if a.op == "iota" and b.op == "constant":
        iota, const, sign = a, b, (1 if step.op == "add" else -1)
    elif b.op == "iota" and a.op == "constant" and step.op == "add":
        iota, const, sign = b, a, 1
    else:
        return None
    if iota.attributes["shape"] != [size] or not isinstance(const.attributes["value"], int):
        return None
    return sign * const.attributes["value"]


def _range(n: Scope, ref: str, depth: int = 0) -> tuple[int, int] | None:
    """Bounds ``lo <= v <= hi`` of every element of an integer value, where they follow from
    the steps that made it (iota, constants, ``%`` by a positive constant, ``+``/``-``,
    reshapes); None if unknown. A zero-bounds index within its axis needs no guard."""
    if ref in n.literals:
        step = n.producers().get(ref)
        v = step.attributes.get("value") if step is not None else None
        return (v, v) if isinstance(v, int) and not isinstance(v, bool) else None
    step = n.producers().get(ref)
    if step is None or depth > 32 or n.graph.values[ref].dtype not in TORCH_INT:
        return None
    op = step.op
    if op == "constant":
        v = step.attributes.get("value")
        return (v, v) if isinstance(v, int) and not isinstance(v, bool) else None
    if op == "iota":
        return (0, step.attributes["shape"][step.attributes["axis"]] - 1)
    if op in ("reshape", "broadcast", "transpose", "convert", "slice"):
        src = step.operands[0]
        if src.startswith("@") or n.graph.values[src].dtype not in TORCH_INT:
            return None
        return _range(n, src, depth + 1)
    if op in ("add", "sub", "rem", "maximum", "minimum"):
        a, b = (None if o.startswith("@") else _range(n, o, depth + 1) for o in step.operands)
        if op == "rem":  # torch.remainder takes the divisor's sign: [0, c) for c > 0
            return (0, b[1] - 1) if b is not None and b[0] == b[1] and b[0] > 0 else None
        if a is None or b is None:
            return None
        if op == "add":
            return (a[0] + b[0], a[1] + b[1])
        if op == "sub":
            return (a[0] - b[1], a[1] - b[0])
        if op == "maximum":
            return (max(a[0], b[0]), max(a[1], b[1]))
        return (min(a[0], b[0]), min(a[1], b[1]))
    return None


def _in_range(n: Scope, ref: str, size: int) -> bool:
    r = _range(n, ref)
    return r is not None and r[0] >= 0 and r[1] < size


def _inside(n: Scope, indices: list[str], shape: tuple[int, ...], guarded: list[bool]) -> str:
    """The mask of the positions where each ``guarded`` index is within its axis, broadcast
    over the axes after the indexed ones: ``((i >= 0) & (i < 8))[..., None]`` (a gather or
    a scatter-add under bounds zero; the JAX emitter's too)."""
    valid = " & ".join(f"({n.tensor(r)} >= 0) & ({n.tensor(r)} < {shape[a]})"
                       for a, r in enumerate(indices) if guarded[a])
    trailing = len(shape) - len(indices)
    return f"({valid})" + ("[..., " + ", ".join(["None"] * trailing) + "]" if trailing else "")


def _take(s: Step, n: Scope, numerics: str) -> list[str]:
    x, idx = s.operands
    axis = s.attributes["axis"]
    size = n.shape(x)[axis]
    out = n(s.results[0])
    shift = _shift(n, idx, size) if s.attributes["bounds"] == "zero" else None
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
    guard = s.attributes["bounds"] == "zero" and not _in_range(n, idx, size)
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
        lines.append(f"{out} = torch.where((({i} >= 0) & ({i} < {size})).reshape({view}), "
                     f"{out}, 0)")
    return lines


def _clamped(s: Step, n: Scope, out: str, indices: list[str], shape: tuple[int, ...],
             clamp: str = "{}.long().clamp(0, {})", plain: str = "{}.long()"
             ) -> tuple[list[str], list[str], list[bool]]:
    """The indices of a gather or a scatter-add (``x[i, j]``): under bounds zero, one that
    may fall outside its axis is clamped into it first (``out_i0 = ...``; :func:`_inside`
    masks its positions after); the others are used as they are. Returns the clamping lines,
    the index expressions and which indices are guarded; ``clamp`` and ``plain`` spell them
    (the JAX emitter's: ``jnp.clip({}, 0, {})`` and ``{}``)."""
    lines, names = [], []
    guarded = [s.attributes["bounds"] == "zero" and not _in_range(n, r, shape[a])
               for a, r in enumerate(indices)]
    for axis, ref in enumerate(indices):
        i = n.tensor(ref)
        if guarded[axis]:
            lines.append(f"{out}_i{axis} = {clamp.format(i, shape[axis] - 1)}")
            names.append(f"{out}_i{axis}")
        else:
            names.append(plain.format(i))
    return lines, names, guarded


def _gather(s: Step, n: Scope, numerics: str) -> list[str]:
    x, *indices = s.operands
    shape = n.shape(x)
    out = n(s.results[0])
    lines, names, guarded = _clamped(s, n, out, indices, shape)
    lines.append(f"{out} = {n(x)}[{', '.join(names)}]")
    if any(guarded):
        mask = _inside(n, indices, shape, guarded)
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
    lines, names, guarded = _clamped(s, n, out, indices, shape)
    v = n.tensor(value)
    if any(guarded):
        mask = _inside(n, indices, shape, guarded)
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
    return [f"{out} = {x}.clone()",
            f"torch.distributed.all_reduce({out}, op=torch.distributed.ReduceOp.{op})"]


def _all_gather(s: Step, n: Scope, numerics: str) -> list[str]:
    out, x = n(s.results[0]), n.tensor(s.operands[0])
    world, axis = s.attributes["world"], s.attributes["axis"]
    return [f"{out}_parts = [torch.empty_like({x}) for _ in range({world})]",
            f"torch.distributed.all_gather({out}_parts, {x}.contiguous())",
            f"{out} = torch.cat({out}_parts, dim={axis})"]


RULES: dict[str, Rule] = {
    "neg": _unary("-{}"), "not": _unary("~{}"), "exp": _unary("torch.exp({})"),
    "log": _unary("torch.log({})"), "sqrt": _unary("torch.sqrt({})"),
    "rsqrt": _unary("torch.rsqrt({})"), "sin": _unary("torch.sin({})"),
    "cos": _unary("torch.cos({})"), "tanh": _unary("torch.tanh({})"),
    "sigmoid": _unary("torch.sigmoid({})"), "erf": _unary("torch.erf({})"),
    "abs": _unary("torch.abs({})"), "floor": _unary("torch.floor({})"),
    "add": _binary("{} + {}"), "sub": _binary("{} - {}"), "mul": _binary("{} * {}"),
    "div": _div, "rem": _rem, "pow": _binary("torch.pow({}, {})"),
    "maximum": _extreme("maximum", "min"), "minimum": _extreme("minimum", "max"),
    "lt": _binary("{} < {}"), "le": _binary("{} <= {}"), "gt": _binary("{} > {}"),
    "ge": _binary("{} >= {}"), "eq": _binary("{} == {}"), "ne": _binary("{} != {}"),
    "and": _binary("{} & {}"), "or": _binary("{} | {}"),
    "select": lambda s, n, nu: [f"{n(s.results[0])} = torch.where("
                                f"{', '.join(n(o) for o in s.operands)})"],
    "convert": _convert, "constant": _constant, "iota": _iota, "reshape": _reshape,
    "transpose": _transpose, "broadcast": _broadcast, "reduce": _reduce,
    "contract": _contract, "take": _take, "gather": _gather, "scatter": _scatter,
    "scatter_add": _scatter_add,
    "slice": _slice,
    "all_reduce": _all_reduce, "all_gather": _all_gather,  # tensor parallelism (issue 21)
}


# ---------------------------------------------------------------- fast calls
FastRule = Callable[[Call, Scope, list[str], list[str]], list[str]]


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


def _fast_decode_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, pos, scale = args
    s = n.shape(call.attributes["args"][1])[1]
    o = out[0]
    wide = _widen(n, call.attributes["args"][0])
    # One query a row: two batched products over the cache in place (the permutes are views)
    # and the softmax in f32 (f64 for f64). SDPA with a boolean mask takes a slow general
    # path for this shape.
    return [
        f"{o}_mask = (torch.arange({s}, device=DEVICE) <= {pos}[:, None])[:, None, None, :]",
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
    return [f"{out[0]} = (F.rms_norm({x}.float(), ({d},), eps={eps}) * (1.0 + {w}.float()))"
            f".to({x}.dtype)"]


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


def _fast_window_decode_attention(call: Call, n: Scope, args: list[str],
                                  out: list[str]) -> list[str]:
    q, k, v, pos, scale, window = args
    s = n.shape(call.attributes["args"][1])[1]
    o = out[0]
    wide = _widen(n, call.attributes["args"][0])
    return [
        f"{o}_i = torch.arange({s}, device=DEVICE)",
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


# ---------------------------------------------------------------- functions


def launch_args(call: Call) -> list[str]:
    """The tensors a bound call's launch passes: its tensor arguments, then, for each state
    it writes (``writes``: check/spans.py's ``state_writes``), the state and its positions."""
    out = [a for a in call.attributes.get("args", []) if isinstance(a, str)]
    for w in call.attributes.get("writes") or []:
        out += [w["state"], w["at"]]
    return out


def _is_std(loc: str) -> bool:
    return loc.startswith("std/")


@dataclass
class Options:
    numerics: Numerics = Numerics.EXACT
    fast: bool = True  # use FAST_CALLS where they apply
    device: str = "cpu"  # the model's torch device, written into the module (DEVICE)


def _internal(code: str, message: str, help: str = "") -> Exception:
    from linnet.lang.diagnostics import Diagnostic, LinnetError

    return LinnetError(Diagnostic(code, message, help=help or (
        "this is a bug in linnet-lang's PyTorch emitter, not in your model: please report it "
        "with the model and the command; `linnet run` (the interpreter) runs the model "
        "meanwhile")))


def _statement(text: str, step: int, op: str, loc: str) -> Statement:
    """Parse one generated statement; a rule that wrote something that is not one valid
    Python statement is an internal error (E0910) naming the step and its source line."""
    if text.startswith("#"):
        return Statement(text, comment=True)
    where = f"step {step} (`{op}`" + (f", from {loc.replace('|', ' via ')}" if loc else "") + ")"
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise _internal("E0910", f"the PyTorch emitter wrote invalid Python for {where}: "
                        f"{exc.msg}: `{text}`") from None
    if len(tree.body) != 1:
        raise _internal("E0910", f"the PyTorch emitter wrote {len(tree.body)} statements on one "
                        f"line for {where}: `{text}`")
    node = tree.body[0]
    for sub in ast.walk(node):
        # `0.clamp(0, 1)` parses as `(0.).clamp` on some inputs and fails at run time on all
        # of them: a method called on a literal is never what a rule means.
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Constant) \
                and not isinstance(sub.value.value, str):
            raise _internal("E0910", f"the PyTorch emitter called `.{sub.attr}` on the literal "
                            f"{sub.value.value!r} for {where}: `{text}`")
    reads = frozenset(s.id for s in ast.walk(node)
                      if isinstance(s, ast.Name) and isinstance(s.ctx, ast.Load))
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        return Statement(text, frozenset(t.id for t in node.targets if isinstance(t, ast.Name)),
                         reads)
    return Statement(text, reads=reads, effect=True)


class TorchEmitter:
    """Writes a module of generated Python: one function per slice kind, one per entry
    calling them in turn, and ``ENTRIES``. The spelling is PyTorch's; emit/jax.py's subclass
    swaps the attributes below and overrides the hooks where its text differs
    (:meth:`returned_states`, :meth:`kernel_text`, :meth:`launch_statement`,
    :meth:`kernel_parts`, :meth:`finish_header`, :meth:`internal`, and :meth:`module` for
    the header)."""

    # What a subclass writing another framework's Python swaps (emit/jax.py): the rules, the
    # fused calls and the scope that names values and writes constants as tensors.
    rules: dict[str, Rule] = RULES
    fast_calls: dict[str, FastRule] = FAST_CALLS
    scope_class: type[Scope] = Scope
    # ... how the entry treats the states its slices write: False (PyTorch), a slice writes
    # them in place; True (JAX's immutable arrays), a slice returns each state it writes
    # (:meth:`returned_states`), the entry stores it in its copy of `states` and returns the
    # new states after its outputs (`ENTRIES` rows then say which slice `writes` which);
    returns_states = False
    # ... whether a kernel may store results into states (a call's `writes`: the KV-cache
    # writes of a decode step in the kernel that makes k and v): PyTorch's launches write
    # the state in place; JAX's immutable arrays would need Pallas's aliasing;
    kernels_write_states = True
    kernels_scratch = True  # kernels with scratch buffers launch (emit/triton.py's `scratch`)
    # ... the fused calls whose torch function's CPU backward cannot be differentiated again
    # (SDPA's CPU flash kernel: issue 46 item 5): where autograd records the call, a CPU
    # module runs them under SDPA's math backend (emit/kernel_grad.py's math_under_autograd);
    cpu_autograd_math = frozenset({"std.nn.attention::causal_attention",
                                   "std.nn.attention::window_attention"})
    # ... the names the generated module defines, which no entry function may take;
    module_names: set[str] = RESERVED
    # ... and the words the module's docstring and errors name it by.
    framework, command = "PyTorch", "linnet torch"

    def __init__(self, sources: dict[str, str] | None = None, options: Options | None = None):
        self.sources = {name: text.splitlines() for name, text in (sources or {}).items()}
        self.options = options or Options()
        self.functions: list[str] = []
        self.kinds: dict[str, str] = {}  # slice kind -> function name
        self.used_names: set[str] = set()
        self.entries: list[str] = []
        self.metadata: list[str] = []
        self._repeated_user: dict[int, list[int | None]] = {}
        # The kernel instances of the calls this module launches (the graphs' own,
        # ir/kernels.py), by instance_key.
        self.kernels: dict[str, KernelInstance] = {}
        self.kernel_texts: dict[tuple, KernelText] = {}
        self.backwards: Backwards | None = None  # launches under autograd (emit/kernel_grad)

    def comment(self, loc: str, width: int = WIDTH - 4) -> str:
        if "|" in loc:
            user, std = loc.split("|", 1)
            where = "  [" + self.comment(std)[2:].split("  ")[0] + "]"
            head = self.comment(user, width - len(where))
            return head + where
        file, _, line = loc.rpartition(":")
        text = ""
        lines = self.sources.get(file)
        if lines and line.isdigit() and 0 < int(line) <= len(lines):
            text = "  " + lines[int(line) - 1].strip()
        short = file if _is_std(file) else file.rsplit("/", 1)[-1]
        out = f"# {short}:{line}{text}"
        if len(out) > width:  # a long source line: its start, so the comment fits the width
            out = out[:max(width - 3, len(f"# {short}:{line}"))].rstrip() + "..."
        return out

    def _best_call(self, graph: Graph, index: int) -> Call | None:
        best = None
        for call in graph.calls:
            if call.start <= index < call.stop and call.loc and not _is_std(call.loc) \
                    and call.kind != "entry" and (best is None or call.depth > best.depth):
                best = call
        return best

    def _first_repeated_user(self, graph: Graph) -> list[int | None]:
        """For each step, the first step inside a repeated block (a layer) that reads what
        it makes, directly or through other steps; its own index when it is inside one."""
        key = id(graph)
        if key not in self._repeated_user:
            inside = [False] * len(graph.steps)
            for c in graph.calls:
                if c.iteration is not None:  # a layer's call: its span holds every nested one
                    for i in range(c.start, c.stop):
                        inside[i] = True
            users = graph.users()
            found: list[int | None] = [None] * len(graph.steps)
            for i in range(len(graph.steps) - 1, -1, -1):
                if inside[i]:
                    found[i] = i
                    continue
                best = None
                for r in graph.steps[i].results:
                    for u in users.get(r, []):
                        f = found[u] if u > i else None
                        if f is not None and (best is None or f < best):
                            best = f
                found[i] = best
            self._repeated_user[key] = found
        return self._repeated_user[key]

    def user_loc(self, graph: Graph, index: int, own: str) -> str:
        """The line of the user's model behind a step; std library lines are added after it.
        A step hoisted out of a layer (rope's tables) points at the line in the layer that
        reads it, not at the entry's call of the whole model."""
        if not _is_std(own):
            return own
        best = self._best_call(graph, index)
        user = self._first_repeated_user(graph)[index]
        # Hoisted: the step sits in a call (the whole model's) around the layer that reads
        # it, outside that layer. A step of its own call (the embedding) keeps its line.
        if user is not None and user != index and (
                best is None or best.start <= user < best.stop):
            deeper = self._best_call(graph, user)
            if deeper is not None and (best is None or deeper.depth > best.depth):
                best = deeper
        return f"{best.loc}|{own}" if best else own

    def kernel_launch(self, graph: Graph, index: int, stop: int, starts: dict[int, list[Call]],
                      users_outside: Callable[[int, int], set[str]], members: set[int],
                      scope: Scope) -> tuple[Call, KernelText] | None:
        """A call of a bound op starting at step ``index`` whose kernel this module
        launches (numerics fast, its instance recorded in the graph, the `where` clause
        true), with its kernel's text; None otherwise. See emit/triton.py."""
        if self.options.numerics != Numerics.FAST or not graph.kernels:
            return None
        # The longest first: a span op's call (check/spans.py) over an op call it contains.
        for call in sorted(starts.get(index, []), key=lambda c: c.start - c.stop):
            if not call.attributes.get("kernel") or not call.attributes.get("kernel_applies") \
                    or call.stop > stop or call.stop <= call.start:
                continue
            results = call.attributes.get("results") or []
            if any(not isinstance(r, str) for r in results) or not all(
                    j in members for j in range(call.start, call.stop)):
                continue
            if call.attributes.get("writes") and (not self.kernels_write_states
                                                  or self.backwards is not None):
                continue  # its kernel stores into states: the call without the writes
            found = graph.kernels.get(instance_key(call.attributes))
            if found is None:
                continue  # not recorded (check/kernel_instances.py): the op's body runs
            self.kernels[found.key] = found
            if not self.kernels_scratch and self.uses_scratch(call):
                continue  # its kernel keeps scratch buffers, which this target cannot
            if users_outside(call.start, call.stop) - set(results):
                continue
            if not all(a in scope.names or a in scope.literals for a in launch_args(call)
                       if a.startswith("%")):
                continue
            return call, self.kernel_text(call)
        return None

    def uses_scratch(self, call: Call) -> bool:
        """Whether a kernel the call launches declares `scratch(...)` buffers."""
        return self.kernels[instance_key(call.attributes)].scratch

    def kernel_text(self, call: Call) -> KernelText:
        """The kernel instance a bound call launches, written once per module."""
        precision = "tf32" if self.options.numerics == Numerics.FAST else "ieee"
        return self.stage_texts(call, precision, kernel_text, chain_text)

    def stage_texts(self, call: Call, precision: str, text_of: Callable[..., Any],
                    chain_of: Callable[..., Any]) -> Any:
        """The text of the kernel a call binds, or of its chain's kernels and the launcher
        that runs them in turn, written once per module (``text_of`` and ``chain_of``:
        emit/triton.py's or emit/pallas.py's)."""
        # Lowered once at lowering time (check/kernel_instances.py), the state writes
        # redirected; a kernel that does not lower or accesses out of bounds for these
        # shapes raises its coded error here, where its launch would be written.
        kernels = self.kernels[instance_key(call.attributes)].launched()
        writes = [(w["result"], w["positions"]) for w in call.attributes.get("writes") or []]
        key = (*((k.name, repr(sorted(k.generics.items())), repr(sorted(k.scalars.items())))
                 for k in kernels), repr(writes))
        if key not in self.kernel_texts:
            texts = [text_of(k, self.sources, precision, self.used_names) for k in kernels]
            self.kernel_texts[key] = texts[0] if len(texts) == 1 else chain_of(
                texts, self.used_names)
        return self.kernel_texts[key]

    def launch_statement(self, text: Any, args: list[str], outs: list[str], body: list[str],
                         call: Call, scope: Scope, backward: Any = None
                         ) -> tuple[str, frozenset[str], frozenset[str]]:
        """The statement at a bound op's call (emit/triton.py's; emit/jax.py writes Pallas's)."""
        return launch_statement(text, args, outs, body, backward)

    def fast_call(self, graph: Graph, index: int, stop: int, starts: dict[int, list[Call]],
                  users_outside: Callable[[int, int], set[str]]) -> Call | None:
        if not self.options.fast:
            return None
        for call in sorted(starts.get(index, []), key=lambda c: c.start - c.stop):
            if call.callee not in self.fast_calls or call.stop > stop or call.stop <= call.start:
                continue
            results = call.attributes.get("results") or []
            if any(not isinstance(r, str) for r in results):
                continue
            escaping = users_outside(call.start, call.stop)
            if escaping - set(results):
                continue  # a value of the span is shared with later steps (CSE): keep steps
            if any(isinstance(a, str) and a.startswith("%") and graph.producers().get(a, -1)
                   >= call.start for a in call.attributes.get("args", [])):
                continue
            return call
        return None

    def draft(self, graph: Graph, sl: Slice, constants: dict[int, str] | None = None) -> Draft:
        """The body of ``sl``'s function; ``constants`` (input position -> literal) are
        inputs known when lowering, written as literals instead of passed in."""
        scope = self.scope_class(graph, sl)
        for j, lit in (constants or {}).items():
            scope.literals[sl.inputs[j]] = lit
        params = [scope("@" + p) for p in sl.parameters + sl.states]
        inputs = [scope(v) for v in sl.inputs]
        body: list[Statement] = []
        starts: dict[int, list[Call]] = {}
        for c in graph.calls:
            starts.setdefault(c.start, []).append(c)
        users = graph.users()

        def users_outside(a: int, b: int) -> set[str]:
            out = set()
            for step in graph.steps[a:b]:
                for r in step.results:
                    if r in graph.outputs or r in sl.outputs or any(
                            u < a or u >= b for u in users.get(r, [])):
                        out.add(r)
            return out

        order = sl.steps or list(range(sl.start, sl.stop))
        members = set(order)
        last_loc: list[str | None] = [None]

        def run(k: int, end: int, out: list[Statement], launching: bool = True) -> None:
            while k < end:
                i = order[k]
                step = graph.steps[i]
                launch = self.kernel_launch(graph, i, sl.stop, starts, users_outside, members,
                                            scope) if launching else None
                if launch is not None:
                    # A bound op: its kernel where kernels_ready, else its body (emit/triton).
                    kcall, text = launch
                    stop_k = k + kcall.stop - kcall.start
                    loc = self.user_loc(graph, kcall.start, kcall.loc)
                    if loc and loc != last_loc[0]:
                        out.append(Statement(self.comment(loc), comment=True))
                    last_loc[0] = loc
                    inner: list[Statement] = []
                    run(k, stop_k, inner, launching=False)
                    # The tensors only: scalar arguments are constants of the kernel.
                    args = [scope(a) for a in launch_args(kcall)]
                    outs = [scope(r) for r in kcall.attributes["results"]]
                    backward = (self.backwards.backward(graph, kcall, text.key)
                                if self.backwards is not None else None)
                    line, targets, reads = self.launch_statement(
                        text, args, outs, [st.text for st in inner], kcall, scope, backward)
                    out.append(Statement(line, targets, reads))
                    last_loc[0] = None
                    k = stop_k
                    continue
                call = self.fast_call(graph, i, sl.stop, starts, users_outside)
                if call is not None and not all(j in members
                                                for j in range(call.start, call.stop)):
                    call = None
                if call is not None and not all(
                        a in scope.names or a in scope.literals for a in call.attributes["args"]
                        if isinstance(a, str) and a.startswith("%")):
                    call = None  # the fused call reads a value this slice does not have
                if call is not None:
                    args = [scope(a) if isinstance(a, str) else literal(a)
                            for a in call.attributes["args"]]
                    outs = [scope(r) for r in call.attributes["results"]]
                    lines = self.fast_calls[call.callee](call, scope, args, outs)
                    loc = self.user_loc(graph, call.start, call.loc)
                    op = call.callee
                    if call.callee in self.cpu_autograd_math \
                            and self.options.device.split(":")[0] == "cpu":
                        if loc and loc != last_loc[0]:
                            out.append(Statement(self.comment(loc), comment=True))
                        tensors = [a for a, v in zip(args, call.attributes["args"])
                                   if isinstance(v, str) and a.isidentifier()]
                        out.append(Statement(*math_under_autograd(tensors, lines)))
                        last_loc[0] = loc
                        k += call.stop - call.start
                        continue
                    k += call.stop - call.start
                else:
                    lines = self.rules[step.op](step, scope, self.options.numerics)
                    loc = self.user_loc(graph, i, step.loc)
                    op = step.op
                    k += 1
                if lines and loc and loc != last_loc[0]:
                    out.append(Statement(self.comment(loc), comment=True))
                    last_loc[0] = loc
                out.extend(_statement(line, i, op, loc) for line in lines)

        run(0, len(order), body)
        outputs = [scope(v) for v in sl.outputs]
        where = (f"Steps {sl.start}..{sl.stop}" if len(order) == sl.stop - sl.start
                 else f"{len(order)} of steps {sl.start}..{sl.stop}")
        doc = (f"{where} of {graph.model}.{graph.entry}"
               + (f" (and every slice of this kind, e.g. `{sl.prefix.rstrip('.')}`)"
                  if sl.prefix else "") + ".")
        return Draft(sl.name, inputs, params, outputs, body, doc)

    def function_name(self, sl: Slice) -> str:
        if sl.kind in self.kinds:
            return self.kinds[sl.kind]
        name = fresh(identifier(sl.name), self.used_names)
        self.used_names.add(name)
        self.kinds[sl.kind] = name
        return name

    def write_function(self, name: str, draft: Draft, keep: set[int] | None,
                       narrow: bool) -> tuple[list[int], list[int]]:
        """Write the function; returns the positions of the inputs and of the parameters
        and states it takes. ``narrow``: leave out the ones its body does not read (the
        entry function calls it); otherwise keep them, named `_x` (a plan calls it with
        every input of its slice)."""
        body, live = draft.finish(keep)
        taken_in = [j for j, v in enumerate(draft.inputs) if v in live]
        taken_p = [j for j, v in enumerate(draft.params) if v in live]
        if narrow:
            signature = [draft.inputs[j] for j in taken_in] + [draft.params[j] for j in taken_p]
        else:
            taken_in, taken_p = list(range(len(draft.inputs))), list(range(len(draft.params)))
            signature = [v if v in live else "_" + v for v in draft.inputs + draft.params]
        outs = [draft.outputs[j] for j in (range(len(draft.outputs)) if keep is None
                                           else sorted(keep))]
        doc = docstring(draft.doc)
        lines = [f"def {name}({', '.join(signature)}):", doc]
        lines += ["    " + st.text for st in body]
        ret = ", ".join(outs)
        lines.append(f"    return {ret}" + ("," if len(outs) == 1 else "") if outs
                     else "    return ()")
        self.functions.append("\n".join(lines))
        return taken_in, taken_p

    def slice_function(self, graph: Graph, sl: Slice) -> str:
        """The function for ``sl``'s kind (emitted once per kind, taking every input of the
        slice, as a plan calls it); returns its name."""
        if sl.kind in self.kinds:
            return self.kinds[sl.kind]
        name = self.function_name(sl)
        self.write_function(name, self.draft(graph, sl), None, narrow=False)
        return name

    def constants(self, graph: Graph, slices: list[Slice]) -> dict[str, dict[int, str]]:
        """Per kind, the inputs that are constants known when lowering (the same one in
        every slice of the kind): written as literals, not passed between slices."""
        producers = {r: st for st in graph.steps for r in st.results}
        found: dict[str, dict[int, str]] = {}
        for sl in slices:
            mine = {}
            for j, v in enumerate(sl.inputs):
                st = producers.get(v)
                if st is not None and st.op == "constant":
                    mine[j] = literal(st.attributes["value"])
            found[sl.kind] = mine if sl.kind not in found else {
                j: lit for j, lit in found[sl.kind].items() if mine.get(j) == lit}
        return found

    def returned_states(self, graph: Graph, sl: Slice) -> list[str]:
        """The states ``sl``'s function returns as extra results, where
        :attr:`returns_states`; none here: PyTorch writes a state in place (``index_put_``)."""
        return []

    def entry_function(self, graph: Graph, slices: list[Slice]) -> str:
        """The entry's function: each slice's function called in turn (written here, once
        per kind, returning only what a later slice or the entry reads), its outputs
        returned. Its row of ``ENTRIES`` is added to :attr:`metadata`."""
        # Where states are returned, each slice's written states become outputs of it
        # ("@path"), so that liveness keeps the writes and the entry stores the new values.
        writes = {id(sl): self.returned_states(graph, sl) for sl in slices}
        slices = [replace(sl, outputs=sl.outputs + ["@" + p for p in writes[id(sl)]])
                  if writes[id(sl)] else sl for sl in slices]
        written = {"@" + p for ps in writes.values() for p in ps}
        constants = self.constants(graph, slices)
        drafts: dict[str, Draft] = {}
        for sl in slices:
            if sl.kind not in drafts:
                self.function_name(sl)
                drafts[sl.kind] = self.draft(graph, sl, constants[sl.kind])
        keep = kept_outputs(slices, drafts, set(graph.outputs) | written)
        taken: dict[str, tuple[list[int], list[int]]] = {}
        for sl in slices:
            if sl.kind not in taken:
                taken[sl.kind] = self.write_function(self.kinds[sl.kind], drafts[sl.kind],
                                                     keep[sl.kind], narrow=True)
        scope = self.scope_class(graph)
        for fn in self.kinds.values():
            scope.reserve(fn)
        if self.returns_states:
            scope.reserve("states")
        for sl in slices:  # the local names of the new states (`self_attn_k_cache`)
            for o in sl.outputs:
                if o.startswith("@"):
                    scope.reserve(identifier(sl.relative(o[1:])))
        inputs = [scope(v) for v in graph.inputs]
        read = {v for sl in slices for j in taken[sl.kind][0] for v in [sl.inputs[j]]}
        read |= set(graph.outputs)
        # The entry's own inputs are its declared signature (the runtime passes all of them):
        # one the model never reads is named `_x`, Python's mark of an unused argument.
        signature = [n if v in read else "_" + n for v, n in zip(graph.inputs, inputs)]
        name = identifier(graph.entry)
        while name in self.used_names or name in self.module_names:
            name = "entry_" + name
        self.used_names.add(name)
        lines = [f"def {name}({', '.join([*signature, 'params', 'states'])}):"]
        shapes = ", ".join(f"{v[1:]} {graph.values[v].dtype}{list(graph.values[v].shape)}"
                           for v in graph.inputs)
        outs = ", ".join(f"{scope.dtype(v)}{list(scope.shape(v))}" for v in graph.outputs)
        arrow = f"({outs}), and the new states" if self.returns_states else outs
        lines.append(docstring(f"Entry {graph.model}.{graph.entry}({shapes}) -> {arrow}."))
        if self.returns_states:
            lines.append("    states = dict(states)  # the caller's dict is not changed")
        rows = []
        for sl in slices:
            fn = self.kinds[sl.kind]
            tin, tp = taken[sl.kind]
            paths = sl.parameters + sl.states
            args = [scope(sl.inputs[j]) for j in tin]
            args += [f"{'states' if paths[j] in graph.states else 'params'}[{paths[j]!r}]"
                     for j in tp]
            kept = [sl.outputs[j] for j in sorted(keep[sl.kind])]
            outputs = [identifier(sl.relative(o[1:])) if o.startswith("@") else scope(o)
                       for o in kept]
            target = ", ".join(outputs) + ("," if len(outputs) == 1 else "")
            call = f"{fn}({', '.join(args)})"
            lines.append(f"    {target} = {call}" if outputs else f"    {call}")
            lines += [f"    states[{o[1:]!r}] = {local}" for o, local in zip(kept, outputs)
                      if o.startswith("@")]
            row = dict(function=fn, kind=sl.kind, start=sl.start, stop=sl.stop,
                       inputs=[sl.inputs[j] for j in tin],
                       outputs=[o for o in kept if not o.startswith("@")],
                       parameters=[paths[j] for j in tp if paths[j] not in graph.states],
                       states=[paths[j] for j in tp if paths[j] in graph.states])
            if self.returns_states:
                row["writes"] = [o[1:] for o in kept if o.startswith("@")]
            rows.append(row)
        results = ", ".join(self.entry_output(graph, scope, v) for v in graph.outputs)
        lines.append(f"    return ({results},)" + (", states" if self.returns_states else ""))
        self.metadata.append(self.entry_metadata(graph, rows, name))
        return "\n".join(lines)

    def entry_output(self, graph: Graph, scope: Scope, ref: str) -> str:
        """An entry's output: a value, or a whole state or parameter (``return self.cache``),
        returned as a copy (as the interpreter does): the next call writes the state in
        place, and a result the caller holds must not change under them. Where states are
        returned (JAX's immutable arrays), no copy is needed."""
        if ref.startswith("@"):
            path = ref[1:]
            table = "states" if path in graph.states else "params"
            return f"{table}[{path!r}]" + ("" if self.returns_states else ".clone()")
        return scope(ref)

    def entry_metadata(self, graph: Graph, rows: list[dict], function: str = "") -> str:
        out = [f"    {graph.entry!r}: dict("]
        if function:  # the entry's function: `v_input` for an entry named `input`
            out.append(f"        function={function!r},")
        out += [f"        inputs={graph.inputs!r},", f"        outputs={graph.outputs!r},",
                "        slices=["]
        for row in rows:
            out.append("            dict(")
            out += [f"                {k}={v!r}," for k, v in row.items()]
            out.append("            ),")
        out += ["        ],", "    ),"]
        return "\n".join(out)

    def module(self, graphs: list[Graph], origin: str,
               slices: list[list[Slice]] | None = None) -> str:
        """The module's text. With ``slices`` (one list per graph), only those slice
        functions are written, for a plan's runner to call (no entry function)."""
        if slices is not None:
            entries = []
            for g, sls in zip(graphs, slices):
                for sl in sls:
                    self.slice_function(g, sl)
                self.metadata.append(self.entry_metadata(g, [
                    dict(function=self.kinds[sl.kind], kind=sl.kind, start=sl.start,
                         stop=sl.stop, inputs=sl.inputs, outputs=sl.outputs,
                         parameters=sl.parameters, states=sl.states) for sl in sls]))
        else:
            self.backwards = Backwards()
            entries = [self.entry_function(g, cut(g)) for g in graphs]
            # Each launch's backward pass, as entries of their own (emit/kernel_grad.py).
            while self.backwards is not None and len(self.backwards.graphs) > len(entries) \
                    - len(graphs):
                g = self.backwards.graphs[len(entries) - len(graphs)]
                # Its own slice kinds: a body with kernels off must not share a function
                # with the same steps where they launch.
                sls = cut(g)
                for sl in sls:
                    sl.kind = f"{g.entry}:{sl.kind}"
                entries.append(self.entry_function(g, sls))
        header = [
            *self.doc_head(origin),
            f'line each group of steps came from. Numerics: {self.options.numerics}.',
            '"""',
            "",
            "import torch",
            "import torch.nn.functional as F",
            "",
            f"DEVICE = torch.device({self.options.device!r})  # the model's: a module per device",
            "",
        ]
        return self.module_text(header, entries, origin)

    def doc_head(self, origin: str) -> list[str]:
        """The first lines of the generated module's docstring."""
        return [
            f'"""{self.framework} source generated by linnet-lang {__version__} from {origin}.',
            "",
            f"Do not edit: regenerate with `{self.command}`. Each function below is one slice of an",
            "entry; slices of one kind (every layer) share a function. Comments give the .linnet",
        ]

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

    def module_text(self, header: list[str], entries: list[str], origin: str) -> str:
        """The module: ``header`` (its docstring, imports and constants), the kernels its
        functions launch, the slices' functions, ``entries`` and ``ENTRIES``, with lines
        wrapped at :data:`WIDTH`; compiled first (E0911 where it does not)."""
        written = "\n".join(self.functions + entries)
        # The kernels this module launches, first; one whose every call turned out dead is
        # not written.
        texts = [t for t in self.kernel_texts.values()
                 if re.search(rf"[ (]{re.escape(t.launcher)}[(,]", written)]
        if texts:
            lines, runs, functions = self.kernel_parts(texts)
            at = max(i for i, h in enumerate(header) if h.startswith(("import ", "from "))) + 1
            header[at:at] = lines.rstrip("\n").split("\n")
            header += [runs, "", ""]
            self.functions[:0] = functions
        body = "\n\n\n".join(self.functions + entries)
        self.finish_header(header, body)
        meta = "ENTRIES = {\n" + "\n".join(self.metadata) + "\n}\n"
        text = "\n".join(header) + "\n" + body + "\n\n\n" + meta
        text = "\n".join(w for line in text.split("\n") for w in wrap(line))
        try:
            compile(text, origin or "<linnet>", "exec")
        except SyntaxError as exc:
            shown = (exc.text or "").strip()
            raise self.internal("E0911", f"the generated {self.framework} module does not "
                                f"compile: {exc.msg} at line {exc.lineno}: `{shown}`") from None
        return text

    @staticmethod
    def internal(code: str, message: str) -> Exception:
        """An internal error of this emitter (a bug in it, not in the model)."""
        return _internal(code, message)


def emit_torch(graphs: Graph | list[Graph], sources: dict[str, str] | None = None,
               numerics: str = "exact", fast: bool = True, origin: str = "",
               slices: list[list[Slice]] | None = None, device: str = "cpu") -> str:
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
