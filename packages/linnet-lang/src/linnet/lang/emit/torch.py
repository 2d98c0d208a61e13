"""Graph → readable PyTorch source. Writes text only: this module never imports torch.

One Python function per slice kind (every layer shares one), one function per entry that
calls them in order, and metadata (``ENTRIES``) the runtime uses to call slices one by one.
Values keep their source names (``q``, ``scores``); a comment with ``file:line`` and the
source line heads each group of steps.

Where PyTorch has a fused call with the same semantics as a std op's body, the whole call
span becomes that call (``F.linear``, ``F.scaled_dot_product_attention``, ``F.embedding``,
``F.rms_norm``): the table :data:`FAST_CALLS`. ``tests/test_emit_torch.py`` proves each one
equal to the op's body. Every primitive has a rule in :data:`RULES`; a test fails when one
is missing.

>>> from linnet.lang.emit.torch import RULES
>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))
[]
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from linnet.lang import __version__
from linnet.lang.ir.graph import Call, Graph, Step
from linnet.lang.ir.slices import Slice, cut

TORCH_DTYPES = {"f64": "torch.float64", "f32": "torch.float32", "f16": "torch.float16",
                "bf16": "torch.bfloat16", "i64": "torch.int64", "i32": "torch.int32",
                "i16": "torch.int16", "i8": "torch.int8", "u8": "torch.uint8",
                "bool": "torch.bool"}
NUMERICS = ("exact", "fast")


def identifier(text: str) -> str:
    """A Python name for an SSA value or a parameter path (`%q.1` → `q_1`)."""
    name = re.sub(r"[^0-9A-Za-z_]", "_", text.lstrip("%@"))
    if not name or name[0].isdigit() or keyword.iskeyword(name) or name in RESERVED:
        name = "v_" + name
    return name


RESERVED = {"torch", "F", "DEVICE", "params", "states", "math"}


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
            base = identifier(self.slice.relative(ref[1:]) if ref.startswith("@") and self.slice
                              else ref)
            name, n = base, self.next_suffix.get(base, 1)
            if n > 1:
                name = f"{base}_{n}"
            while name in self.used:
                n += 1
                name = f"{base}_{n}"
            self.next_suffix[base] = n
            self.names[ref] = name
            self.used.add(name)
        return self.names[ref]

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


def literal(value: object) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        if math.isnan(value):
            return "float('nan')"
        return repr(value)
    return repr(value)


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
    a, b = (n(o) for o in s.operands)
    if n.graph.values[s.results[0]].dtype in TORCH_INT:
        return [f"{n(s.results[0])} = torch.div({a}, {b}, rounding_mode='floor')"]
    return [f"{n(s.results[0])} = {a} / {b}"]


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
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.to({TORCH_DTYPES[s.attributes['dtype']]})"]


def _reshape(s: Step, n: Scope, numerics: str) -> list[str]:
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.reshape({tuple(s.attributes['shape'])})"]


def _transpose(s: Step, n: Scope, numerics: str) -> list[str]:
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.permute({tuple(s.attributes['perm'])})"]


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
    if n.dtype(a) == acc:
        expr = f"torch.einsum({spec!r}, {n(a)}, {n(b)})"
    elif numerics == "exact":
        dt = TORCH_DTYPES[acc]
        expr = f"torch.einsum({spec!r}, {n(a)}.to({dt}), {n(b)}.to({dt}))"
    else:
        expr = f"torch.einsum({spec!r}, {n(a)}, {n(b)}).to({TORCH_DTYPES[acc]})"
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
    if s.attributes["bounds"] == "zero":
        lines.append(f"{out}_index = {i}.clamp(0, {size - 1})")
        index = f"{out}_index"
    else:
        index = i
    flat = index if len(idx_shape) == 1 else f"{index}.reshape(-1)"
    expr = f"torch.index_select({n(x)}, {axis}, {flat})"
    if len(idx_shape) != 1:
        expr += f".reshape({out_shape})"
    lines.append(f"{out} = {expr}")
    if s.attributes["bounds"] == "zero":
        rank = len(n.shape(x))
        view = (1,) * axis + tuple(idx_shape) + (1,) * (rank - axis - 1)
        lines.append(f"{out} = torch.where((({i} >= 0) & ({i} < {size})).reshape({view}), "
                     f"{out}, 0)")
    return lines


def _gather(s: Step, n: Scope, numerics: str) -> list[str]:
    x, *indices = s.operands
    shape = n.shape(x)
    out = n(s.results[0])
    lines = []
    names = []
    for axis, ref in enumerate(indices):
        i = n.tensor(ref)
        if s.attributes["bounds"] == "zero":
            lines.append(f"{out}_i{axis} = {i}.long().clamp(0, {shape[axis] - 1})")
            names.append(f"{out}_i{axis}")
        else:
            names.append(f"{i}.long()")
    lines.append(f"{out} = {n(x)}[{', '.join(names)}]")
    if s.attributes["bounds"] == "zero":
        valid = " & ".join(f"({n.tensor(r)} >= 0) & ({n.tensor(r)} < {shape[a]})"
                           for a, r in enumerate(indices))
        trailing = len(shape) - len(indices)
        mask = f"({valid})" + ("[..., " + ", ".join(["None"] * trailing) + "]" if trailing else "")
        lines.append(f"{out} = torch.where({mask}, {out}, 0)")
    return lines


def _scatter(s: Step, n: Scope, numerics: str) -> list[str]:
    state, value, *indices = s.operands
    if not indices:
        return [f"{n(state)}.copy_({n(value)})"]
    idx = ", ".join(f"{n.tensor(i)}.long()" for i in indices)
    return [f"{n(state)}.index_put_(({idx},), {n(value)})"]


RULES: dict[str, Rule] = {
    "neg": _unary("-{}"), "not": _unary("~{}"), "exp": _unary("torch.exp({})"),
    "log": _unary("torch.log({})"), "sqrt": _unary("torch.sqrt({})"),
    "rsqrt": _unary("torch.rsqrt({})"), "sin": _unary("torch.sin({})"),
    "cos": _unary("torch.cos({})"), "tanh": _unary("torch.tanh({})"),
    "sigmoid": _unary("torch.sigmoid({})"), "erf": _unary("torch.erf({})"),
    "abs": _unary("torch.abs({})"), "floor": _unary("torch.floor({})"),
    "add": _binary("{} + {}"), "sub": _binary("{} - {}"), "mul": _binary("{} * {}"),
    "div": _div, "rem": _binary("torch.remainder({}, {})"), "pow": _binary("torch.pow({}, {})"),
    "maximum": _extreme("maximum", "min"), "minimum": _extreme("minimum", "max"),
    "lt": _binary("{} < {}"), "le": _binary("{} <= {}"), "gt": _binary("{} > {}"),
    "ge": _binary("{} >= {}"), "eq": _binary("{} == {}"), "ne": _binary("{} != {}"),
    "and": _binary("{} & {}"), "or": _binary("{} | {}"),
    "select": lambda s, n, nu: [f"{n(s.results[0])} = torch.where("
                                f"{', '.join(n(o) for o in s.operands)})"],
    "convert": _convert, "constant": _constant, "iota": _iota, "reshape": _reshape,
    "transpose": _transpose, "broadcast": _broadcast, "reduce": _reduce,
    "contract": _contract, "take": _take, "gather": _gather, "scatter": _scatter,
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


def _fast_softmax(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    return [f"{out[0]} = torch.softmax({args[0]}, dim=-1)"]


def _fast_decode_attention(call: Call, n: Scope, args: list[str], out: list[str]) -> list[str]:
    q, k, v, pos, scale = args
    s = n.shape(call.attributes["args"][1])[1]
    o = out[0]
    # One query a row: two batched products over the cache in place (the permutes are views)
    # and an f32 softmax. SDPA with a boolean mask takes a slow general path for this shape.
    return [
        f"{o}_mask = (torch.arange({s}, device=DEVICE) <= {pos}[:, None])[:, None, None, :]",
        f"{o}_scores = torch.matmul({q}, {k}.permute(0, 2, 3, 1)).float() * {scale}",
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


FAST_CALLS: dict[str, FastRule] = {
    "std.nn.linear::linear": _fast_linear,
    "std.nn.linear::linear_bias": _fast_linear,
    "std.nn.embedding::embedding": _fast_embedding,
    "std.nn.norm::rms_norm": _fast_rms_norm,
    "std.nn.activation::silu": _fast_silu,
    "std.nn.activation::softmax": _fast_softmax,
    "std.nn.attention::decode_attention": _fast_decode_attention,
    "std.nn.attention::causal_attention": _fast_causal_attention,
}


# ---------------------------------------------------------------- functions
def _is_std(loc: str) -> bool:
    return loc.startswith("std/")


@dataclass
class Options:
    numerics: str = "exact"
    fast: bool = True  # use FAST_CALLS where they apply


def _output(graph: Graph, scope: Scope, ref: str) -> str:
    """An entry's output: a value, or a whole state or parameter (``return self.cache``),
    returned as a copy (as the interpreter does): the next call writes the state in place,
    and a result the caller holds must not change under them."""
    if ref.startswith("@"):
        path = ref[1:]
        table = "states" if path in graph.states else "params"
        return f"{table}[{path!r}].clone()"
    return scope(ref)


class TorchEmitter:
    def __init__(self, sources: dict[str, str] | None = None, options: Options | None = None):
        self.sources = {name: text.splitlines() for name, text in (sources or {}).items()}
        self.options = options or Options()
        self.functions: list[str] = []
        self.kinds: dict[str, str] = {}  # slice kind -> function name
        self.used_names: set[str] = set()
        self.entries: list[str] = []
        self.metadata: list[str] = []

    def comment(self, loc: str) -> str:
        if "|" in loc:
            user, std = loc.split("|", 1)
            return self.comment(user) + "  [" + self.comment(std)[2:].split("  ")[0] + "]"
        file, _, line = loc.rpartition(":")
        text = ""
        lines = self.sources.get(file)
        if lines and line.isdigit() and 0 < int(line) <= len(lines):
            text = "  " + lines[int(line) - 1].strip()
        short = file if _is_std(file) else file.rsplit("/", 1)[-1]
        return f"# {short}:{line}{text}"

    def user_loc(self, graph: Graph, index: int, own: str) -> str:
        """The line of the user's model behind a step; std library lines are added after it."""
        if not _is_std(own):
            return own
        best = None
        for call in graph.calls:
            if call.start <= index < call.stop and call.loc and not _is_std(call.loc) \
                    and call.kind != "entry" and (best is None or call.depth > best.depth):
                best = call
        return f"{best.loc}|{own}" if best else own

    def fast_call(self, graph: Graph, index: int, stop: int, starts: dict[int, list[Call]],
                  users_outside: Callable[[int, int], set[str]]) -> Call | None:
        if not self.options.fast:
            return None
        for call in sorted(starts.get(index, []), key=lambda c: c.start - c.stop):
            if call.callee not in FAST_CALLS or call.stop > stop or call.stop <= call.start:
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

    def slice_function(self, graph: Graph, sl: Slice) -> str:
        """The function for ``sl``'s kind (emitted once per kind); returns its name."""
        if sl.kind in self.kinds:
            return self.kinds[sl.kind]
        name = sl.name
        n = 2
        while name in self.used_names:
            name = f"{sl.name}_{n}"
            n += 1
        self.used_names.add(name)
        self.kinds[sl.kind] = name
        scope = Scope(graph, sl)
        params = [scope("@" + p) for p in sl.parameters + sl.states]
        inputs = [scope(v) for v in sl.inputs]
        body: list[str] = []
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

        last_loc = None
        order = sl.steps or list(range(sl.start, sl.stop))
        members = set(order)
        k = 0
        while k < len(order):
            i = order[k]
            step = graph.steps[i]
            call = self.fast_call(graph, i, sl.stop, starts, users_outside)
            if call is not None and not all(j in members for j in range(call.start, call.stop)):
                call = None
            if call is not None and not all(
                    a in scope.names or a in scope.literals for a in call.attributes["args"]
                    if isinstance(a, str) and a.startswith("%")):
                call = None  # the fused call reads a value this slice does not have
            if call is not None:
                args = [scope(a) if isinstance(a, str) else literal(a)
                        for a in call.attributes["args"]]
                outs = [scope(r) for r in call.attributes["results"]]
                lines = FAST_CALLS[call.callee](call, scope, args, outs)
                loc = self.user_loc(graph, call.start, call.loc)
                k += call.stop - call.start
            else:
                lines = RULES[step.op](step, scope, self.options.numerics)
                loc = self.user_loc(graph, i, step.loc)
                k += 1
            if lines and loc and loc != last_loc:
                body.append(self.comment(loc))
                last_loc = loc
            body.extend(lines)
        outputs = [scope(v) for v in sl.outputs]
        # Inputs that are constants made in an earlier slice stay parameters of this function.
        signature = ", ".join(inputs + params)
        where = (f"Steps {sl.start}..{sl.stop}" if len(order) == sl.stop - sl.start
                 else f"{len(order)} of steps {sl.start}..{sl.stop}")
        doc = (f'    """{where} of {graph.model}.{graph.entry}'
               + (f" (and every slice of this kind, e.g. `{sl.prefix.rstrip('.')}`)"
                  if sl.prefix else "") + '."""')
        lines = [f"def {name}({signature}):", doc]
        lines += ["    " + b for b in body]
        ret = ", ".join(outputs)
        lines.append(f"    return {ret}" + ("," if len(outputs) == 1 else "") if outputs
                     else "    return ()")
        self.functions.append("\n".join(lines))
        return name

    def entry_function(self, graph: Graph, slices: list[Slice]) -> str:
        scope = Scope(graph)
        inputs = [scope(v) for v in graph.inputs]
        lines = [f"def {identifier(graph.entry)}({', '.join(inputs)}, params, states):"]
        shapes = ", ".join(f"{v[1:]} {graph.values[v].dtype}{list(graph.values[v].shape)}"
                           for v in graph.inputs)
        outs = ", ".join(f"{scope.dtype(v)}{list(scope.shape(v))}" for v in graph.outputs)
        lines.append(f'    """Entry {graph.model}.{graph.entry}({shapes}) -> {outs}."""')
        for sl in slices:
            fn = self.slice_function(graph, sl)
            args = [scope(v) for v in sl.inputs]
            args += [f"params[{p!r}]" for p in sl.parameters]
            args += [f"states[{p!r}]" for p in sl.states]
            outputs = [scope(v) for v in sl.outputs]
            target = ", ".join(outputs) + ("," if len(outputs) == 1 else "")
            call = f"{fn}({', '.join(args)})"
            lines.append(f"    {target} = {call}" if outputs else f"    {call}")
        lines.append(f"    return ({', '.join(_output(graph, scope, v) for v in graph.outputs)},)")
        self.metadata.append(self.entry_metadata(graph, slices))
        return "\n".join(lines)

    def entry_metadata(self, graph: Graph, slices: list[Slice]) -> str:
        rows = []
        for sl in slices:
            rows.append(
                f"        dict(function={self.kinds[sl.kind]!r}, kind={sl.kind!r}, "
                f"start={sl.start}, stop={sl.stop}, inputs={sl.inputs!r}, "
                f"outputs={sl.outputs!r}, parameters={sl.parameters!r}, states={sl.states!r}),")
        return (f"    {graph.entry!r}: dict(\n        inputs={graph.inputs!r},\n"
                f"        outputs={graph.outputs!r},\n        slices=[\n"
                + "\n".join("    " + r for r in rows) + "\n        ],\n    ),")

    def module(self, graphs: list[Graph], origin: str,
               slices: list[list[Slice]] | None = None) -> str:
        """The module's text. With ``slices`` (one list per graph), only those slice
        functions are written, for a plan's runner to call (no entry function)."""
        if slices is not None:
            entries = []
            for g, sls in zip(graphs, slices):
                for sl in sls:
                    self.slice_function(g, sl)
                self.metadata.append(self.entry_metadata(g, sls))
        else:
            entries = [self.entry_function(g, cut(g)) for g in graphs]
        header = [
            f'"""PyTorch source generated by linnet-lang {__version__} from {origin}.',
            "",
            "Do not edit: regenerate with `linnet torch`. Each function below is one slice of an",
            "entry; slices of one kind (every layer) share a function. Comments give the .linnet",
            f'line each group of steps came from. Numerics: {self.options.numerics}.',
            '"""',
            "",
            "import torch",
            "import torch.nn.functional as F",
            "",
            "DEVICE = torch.device('cpu')  # the runtime sets this to the model's device",
            "",
        ]
        body = "\n\n\n".join(self.functions + entries)
        meta = "ENTRIES = {\n" + "\n".join(self.metadata) + "\n}\n"
        return "\n".join(header) + "\n" + body + "\n\n\n" + meta


def emit_torch(graphs: Graph | list[Graph], sources: dict[str, str] | None = None,
               numerics: str = "exact", fast: bool = True, origin: str = "",
               slices: list[list[Slice]] | None = None) -> str:
    """PyTorch source for one or more lowered entries of a model.

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
    >>> src = emit_torch(lower(prog, "run", {"x": [3]}))
    >>> "def run(x, params, states):" in src
    True
    """
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}")
    graphs = [graphs] if isinstance(graphs, Graph) else list(graphs)
    emitter = TorchEmitter(sources, Options(numerics, fast))
    return emitter.module(graphs, origin or (graphs[0].model if graphs else "?"), slices)
