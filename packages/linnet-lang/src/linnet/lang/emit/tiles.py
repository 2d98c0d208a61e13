"""What the tile-kernel emitters share: names, the rules that differ only in spelling, and
the kernel function's body.

``emit/triton.py`` (``@triton.jit`` functions) and ``emit/pallas.py`` (Pallas kernels) write
the same tile graph (``ir/tiles.py``) in two dialects of NumPy-like Python. A
:class:`Dialect` holds one's spellings (``tl.permute`` or ``jnp.transpose``, ``.to`` or
``.astype``, its dtype table); :class:`Names` carries it (each emitter's subclass sets
``dialect``), so that a rule written here reads it from the names it is given. What truly
differs (loads and stores, ``tl.dot`` and ``jnp.dot``, the launchers) stays in each module.
Writes text only: imports neither torch, triton nor jax.

>>> from linnet.lang.emit.triton import TRITON
>>> TRITON.cast("x", "bf16")
'x.to(tl.bfloat16)'
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from linnet.lang.ir.elementwise import by_arity, spelled
from linnet.lang.ir.graph import Step, ValueType
from linnet.lang.ir.tiles import TileKernel


@dataclass(frozen=True)
class Dialect:
    """How one emitter spells what every tile rule writes.

    ``name`` and ``code`` are for the error of a primitive it has no form for; ``dtypes``
    maps Linnet's element types to its own; ``reserved`` are names a kernel must not shadow;
    the others are the functions' names (``full``: ``tl.full``), the conversion method
    (``method``: ``to`` for ``x.to(tl.float32)``, see :meth:`cast`) and the bit
    reinterpretation (``bitcast``: a template of ``{x}`` and ``{t}``, see :meth:`reinterpret`).

    >>> from linnet.lang.emit.pallas import PALLAS
    >>> PALLAS.cast("x", "f32"), PALLAS.permute
    ('x.astype(jnp.float32)', 'jnp.transpose')
    """

    name: str
    code: str
    dtypes: dict[str, str]
    reserved: frozenset[str]
    full: str
    broadcast_to: str
    reshape: str
    permute: str
    where: str
    sum: str
    program_id: str
    method: str
    bitcast: str

    def cast(self, expr: str, dtype: str) -> str:
        """``expr`` converted to Linnet's element type ``dtype``."""
        return f"{expr}.{self.method}({self.dtypes[dtype]})"

    def reinterpret(self, expr: str, dtype: str) -> str:
        """``expr``'s bits read as Linnet's element type ``dtype`` (of their width).

        >>> from linnet.lang.emit.triton import TRITON
        >>> TRITON.reinterpret("x", "f32")
        'x.to(tl.float32, bitcast=True)'
        """
        return self.bitcast.format(x=expr, t=self.dtypes[dtype])


# ---------------------------------------------------------------- names


def safe_name(name: str, reserved: frozenset[str]) -> str:
    """``name`` as a Python name a kernel may use: not a keyword, nor in ``reserved``.

    >>> safe_name("lambda", frozenset()), safe_name("tl", frozenset({"tl"}))
    ('v_lambda', 'v_tl')
    """
    name = re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"
    if (
        name[0].isdigit()
        or name in reserved
        or keyword.iskeyword(name)
        or keyword.issoftkeyword(name)
    ):
        name = "v_" + name
    return name


@dataclass
class Names:
    """Python names inside one kernel function: values keep their source names. Each
    emitter's subclass sets :attr:`dialect`."""

    dialect: ClassVar[Dialect]

    kernel: TileKernel
    names: dict[str, str] = field(default_factory=dict)
    literals: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    producers: dict[str, Step] = field(default_factory=dict)

    uses: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for s in self.kernel.walk():
            for r in s.results:
                self.producers[r] = s
            reads = s.operands + (s.attributes["yields"] if s.op == "for" else [])
            for o in reads:
                self.uses[o] = self.uses.get(o, 0) + 1

    def fresh(self, base: str) -> str:
        base = safe_name(base, self.dialect.reserved)
        name, n = base, 1
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name

    def __call__(self, ref: str) -> str:
        if ref in self.literals:
            return self.literals[ref]
        if ref not in self.names:
            if re.match(r"^%t(\.\d+)?$", ref) and ref in self.producers:
                base = self.producers[ref].op
            else:
                base = re.sub(r"\.\d+$", "", ref.lstrip("%@"))
            self.names[ref] = self.fresh(base)
        return self.names[ref]

    def alias(self, ref: str, name: str) -> None:
        self.names[ref] = name

    def value(self, ref: str) -> ValueType:
        if ref.startswith("@"):
            for n, shape, dtype in self.kernel.params + self.kernel.results:
                if n == ref[1:]:
                    return ValueType(shape, dtype)
        return self.kernel.values[ref]

    def shape(self, ref: str) -> tuple[int, ...]:
        return self.value(ref).shape

    def dtype(self, ref: str) -> str:
        return self.value(ref).dtype

    def tensor(self, ref: str) -> str:
        """``ref`` as a value of the dialect: a literal becomes a typed 0-d tile where a rule
        needs one (a loop-carried value, a stored value, a conversion)."""
        if ref in self.literals:
            d = self.dialect
            return f"{d.full}((), {self.literals[ref]}, {d.dtypes[self.dtype(ref)]})"
        return self(ref)


def literal(value: object) -> str:
    """A constant as Python text (``float('inf')`` for infinity).

    >>> literal(True), literal(float("-inf")), literal(2)
    ('True', "float('-inf')", '2')
    """
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        if math.isnan(value):
            return "float('nan')"
    return repr(value)


def expand(start: int, count: int, rank: int) -> str:
    """The subscript that puts ``count`` axes at ``start..`` of a rank-``rank`` tile
    (``[:, None]``); empty when it would be every axis.

    >>> expand(0, 1, 2), expand(1, 1, 1)
    ('[:, None]', '')
    """
    if count == rank:
        return ""
    parts = ["None"] * start + [":"] * count + ["None"] * (rank - start - count)
    return "[" + ", ".join(parts) + "]"


# ---------------------------------------------------------------- rules


@dataclass
class Context:
    """What a rule may need beside the step: the dot precision and how to write a body."""

    precision: str  # Triton: "ieee" (full f32) or "tf32"; Pallas: a lax.Precision
    body: Callable[[list[Step], Names, int], list[str]]
    indent: int = 0


TileRule = Callable[[Step, Names, Context], list[str]]


def common_rules(
    unary: Callable[[str], TileRule],
    binary: Callable[[str], TileRule],
    column: str,
    by_hand: dict[str, TileRule],
) -> dict[str, TileRule]:
    """A dialect's table (``TILE_RULES``, ``PALLAS_RULES``): the element-wise math of its
    ``column`` of :data:`linnet.lang.ir.elementwise.SPELLINGS` (``tl.exp({0})``, ``{0} + {1}``)
    made by its ``unary`` and ``binary`` rule makers, the rules both dialects write alike
    (below: they read their spellings from the names' dialect), and its own rules
    ``by_hand``.

    >>> rules = common_rules(lambda f: f, lambda f: f, "triton", {})
    >>> rules["exp"], rules["add"], rules["select"] is select
    ('tl.exp({0})', '{0} + {1}', True)
    """
    shared: dict[str, TileRule] = {
        "select": select,
        "convert": convert,
        "bitcast": bitcast,
        "constant": constant,
        "transpose": transpose,
        "broadcast": broadcast,
        "program_id": program_id,
    }
    return spelled(column, by_arity(unary, binary), shared | by_hand)


def constant(s: Step, n: Names, c: Context) -> list[str]:
    n.literals[s.results[0]] = literal(s.attributes["value"])
    return []


def convert(s: Step, n: Names, c: Context) -> list[str]:
    dtype = s.attributes["dtype"]
    if dtype == "bool":
        return [f"{n(s.results[0])} = {n.tensor(s.operands[0])} != 0"]
    return [f"{n(s.results[0])} = {n.dialect.cast(n.tensor(s.operands[0]), dtype)}"]


def bitcast(s: Step, n: Names, c: Context) -> list[str]:
    dtype = s.attributes["dtype"]
    return [f"{n(s.results[0])} = {n.dialect.reinterpret(n.tensor(s.operands[0]), dtype)}"]


def reshape(s: Step, n: Names, c: Context) -> list[str]:
    """A reshape to a shape of rank one or more (each emitter writes the one to a scalar)."""
    shape = tuple(s.attributes["shape"])
    src = s.operands[0]
    out = n(s.results[0])
    have = n.shape(src)
    if (
        src not in n.literals
        and have
        and [d for d in shape if d != 1] == list(have)
        and 1 not in have
    ):
        # Only new axes of size 1 (`rows[i] < M` in a [BM, BK] mask): `rows[:, None]`.
        return [f"{out} = {n(src)}[" + ", ".join("None" if d == 1 else ":" for d in shape) + "]"]
    return [f"{out} = {n.dialect.reshape}({n.tensor(src)}, {shape})"]


def transpose(s: Step, n: Names, c: Context) -> list[str]:
    perm = tuple(s.attributes["perm"])
    return [f"{n(s.results[0])} = {n.dialect.permute}({n(s.operands[0])}, {perm})"]


def broadcast(s: Step, n: Names, c: Context) -> list[str]:
    src = s.operands[0]
    shape = tuple(s.attributes["shape"])
    out = n(s.results[0])
    d = n.dialect
    if src in n.literals:
        return [f"{out} = {d.full}({shape}, {n(src)}, {d.dtypes[n.dtype(s.results[0])]})"]
    have = n.shape(src)
    x = n(src)
    if have and len(have) < len(shape):  # numpy's rule: new axes on the left
        x += expand(len(shape) - len(have), len(have), len(shape))
    return [f"{out} = {d.broadcast_to}({x}, {shape})"]


def select(s: Step, n: Names, c: Context) -> list[str]:
    cond, a, b = s.operands
    return [f"{n(s.results[0])} = {n.dialect.where}({n(cond)}, {n.tensor(a)}, {n.tensor(b)})"]


def program_id(s: Step, n: Names, c: Context) -> list[str]:
    return [f"{n(s.results[0])} = {n.dialect.program_id}({s.attributes['axis']})"]


def reduced(s: Step, n: Names, fn: str, x: str) -> str:
    """``x`` (the `reduce` step's operand, converted) reduced by ``fn`` over the step's axes,
    one at a time, the last first, so that the other axes keep their numbers (Triton, and
    Pallas's Triton backend, reduce one axis per op); a mean divided by the count."""
    axes = sorted(s.attributes["axes"])
    for axis in reversed(axes):
        x = f"{fn}({x}, axis={axis})"
    if s.attributes["kind"] == "mean":
        x = f"{x} / {math.prod(n.shape(s.operands[0])[a] for a in axes)}"
    return x


# Below this many elements a side, a product of two tiles is a broadcast multiply and a sum:
# tl.dot (and Pallas's jnp.dot through it) needs every side of both operands to be at least 16.
DOT_MIN = 16


def dot_layout(s: Step, n: Names) -> tuple[bool, bool] | None:
    """Whether a `contract` step is a matrix product of two tiles at least DOT_MIN a side
    (a dot: tensor cores): then whether each operand is to be transposed first; else None."""
    a, b = s.operands
    ins, out_labels = s.attributes["spec"].split("->")
    la, lb = ins.split(",")
    size = dict(zip(la, n.shape(a))) | dict(zip(lb, n.shape(b)))
    summed = [x for x in dict.fromkeys(la + lb) if x not in out_labels]
    if len(la) == 2 and len(lb) == 2 and len(out_labels) == 2 and len(summed) == 1:
        k = summed[0]
        m = next(x for x in la if x != k)
        nn = next(x for x in lb if x != k)
        if out_labels == m + nn and all(size[x] >= DOT_MIN for x in (m, nn, k)):
            return la != m + k, lb != k + nn
    return None


def contract_by_sum(s: Step, n: Names) -> str:
    """A `contract` step without a dot: both operands laid out over every label (the
    result's, then the summed ones), multiplied with broadcasting, and summed over the
    summed labels."""
    a, b = s.operands
    acc = s.attributes["accumulate"]
    ins, out_labels = s.attributes["spec"].split("->")
    la, lb = ins.split(",")
    summed = [x for x in dict.fromkeys(la + lb) if x not in out_labels]
    d = n.dialect
    order = list(out_labels) + summed
    parts = []
    for ref, labels in ((a, la), (b, lb)):
        perm = tuple(sorted(range(len(labels)), key=lambda i: order.index(labels[i])))
        x = n(ref)
        if perm != tuple(range(len(labels))):
            x = f"{d.permute}({x}, {perm})"
        kept = sorted(labels, key=order.index)
        if len(kept) < len(order):
            x += "[" + ", ".join(":" if lab in kept else "None" for lab in order) + "]"
        if n.dtype(ref) != acc:
            x = d.cast(x, acc)
        parts.append(x)
    expr = f"{parts[0]} * {parts[1]}"
    for axis in reversed(range(len(out_labels), len(order))):
        expr = f"{d.sum}({expr}, axis={axis})"
    return expr


# Writes a dot (``tl.dot(a, b, ...)``) of a `contract` step, given which operands
# dot_layout transposes.
DotWriter = Callable[[Step, Names, Context, tuple[bool, bool]], str]


def contract(dot: DotWriter) -> TileRule:
    """The `contract` rule: a dot (written by ``dot``) where :func:`dot_layout` finds one,
    else :func:`contract_by_sum`. Each emitter's table holds ``contract(its _dot)``.
    """

    def rule(s: Step, n: Names, c: Context) -> list[str]:
        out = n(s.results[0])
        layout = dot_layout(s, n)
        expr = contract_by_sum(s, n) if layout is None else dot(s, n, c, layout)
        return [f"{out} = {expr}"]

    return rule


def carry(s: Step, n: Names) -> tuple[list[str], list[str]]:
    """A `for` step's carried values: the lines that start them and their variables. A value
    read only to start the loop is the loop's variable itself; a yield made by a step of the
    body after which nothing reads the old value is written into the variable (`acc = acc +
    p` rather than `add = acc + p` then `acc = add`)."""
    a = s.attributes
    lines, carried = [], []
    for init, arg, res in zip(s.operands, a["carried"], s.results):
        if init not in n.literals and init.startswith("%") and n.uses.get(init) == 1:
            var = n(init)
        else:
            var = n.fresh(re.sub(r"\.\d+$", "", arg.lstrip("%")))
            lines.append(f"{var} = {n.tensor(init)}")
        n.alias(arg, var)
        n.alias(res, var)
        carried.append(var)
    body_steps = a["body"]
    for arg, y in zip(a["carried"], a["yields"]):
        at = next((i for i, st in enumerate(body_steps) if y in st.results), None)
        if (
            at is None
            or n.uses.get(y) != 1
            or y in n.names
            or any(
                arg in st.operands or arg in st.attributes.get("yields", [])
                for later in body_steps[at + 1 :]
                for st in n.kernel.walk([later])
            )
        ):
            continue
        n.alias(y, n(arg))
    return lines, carried


def unsupported(d: Dialect, what: str, s: Step) -> Exception:
    """The error of a kernel using ``what``, which dialect ``d`` has no form for."""
    from linnet.lang.diagnostics import Diagnostic, LinnetError

    where = f" (from {s.loc})" if s.loc else ""
    return LinnetError(
        Diagnostic(
            d.code,
            f"a kernel uses {what}{where}, which has no {d.name} form yet",
            help="rewrite that part of the kernel, or run the op's body (numerics 'exact' "
            "never launches kernels)",
        )
    )


# ---------------------------------------------------------------- functions


@dataclass
class KernelText:
    """One kernel instance as generated text."""

    kernel: TileKernel
    function: str  # the kernel function's name
    launcher: str  # the launcher's name
    key: str  # its RUNS key
    source: str  # both functions' text


def instance_name(k: TileKernel) -> str:
    """``row_softmax_4_8_1024``: the kernel's name and its generics' values (after the name,
    ``into_k_v`` where it stores results ``k`` and ``v`` into states: ir/tiles.py's
    ``redirect_stores``)."""
    parts = (
        [k.short_name]
        + (["into", *k.inplace] if k.inplace else [])
        + [str(v) for v in k.generics.values()]
    )
    parts += [re.sub(r"[^0-9A-Za-z]", "_", literal(v)) for v in k.scalars.values()]
    return re.sub(r"_+", "_", "_".join(parts)).strip("_")


def unique_instance(k: TileKernel, taken: set[str], prefixes: tuple[str, ...]) -> str:
    """``instance_name(k)``, numbered until no prefix of ``prefixes`` (``""``, ``"launch_"``)
    with it is in ``taken``; the names it makes are added to ``taken``.

    >>> from linnet.lang.syntax.program import Program
    >>> from linnet.lang.check.tile_lowering import lower_kernel
    >>> prog = Program.from_text("use std.nn.activation::{softmax}")
    >>> k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 2, "C": 3, "B": 4})
    >>> taken = {"row_softmax_2_3_4"}
    >>> unique_instance(k, taken, ("", "launch_")), sorted(taken)
    ('row_softmax_2_3_4_2', ['launch_row_softmax_2_3_4_2', 'row_softmax_2_3_4', 'row_softmax_2_3_4_2'])
    """
    base = instance_name(k)
    name, i = base, 1
    while any(f"{p}{name}" in taken for p in prefixes):
        i += 1
        name = f"{base}_{i}"
    taken |= {f"{p}{name}" for p in prefixes}
    return name


def kernel_body(
    k: TileKernel,
    n: Names,
    rules: dict[str, TileRule],
    sources: dict[str, list[str]],
    precision: str,
) -> list[str]:
    """The lines of ``k``'s function body, each step by its rule in ``rules``, each run of
    lines from one source line after that line as a comment."""
    last: list[str | None] = [None]

    def body(steps: list[Step], names: Names, depth: int) -> list[str]:
        out: list[str] = []
        for s in steps:
            rule = rules.get(s.op)
            if rule is None:
                raise unsupported(names.dialect, f"`{s.op}`", s)
            lines = rule(s, names, Context(precision, body, depth))
            if lines and s.loc and s.loc != last[0]:
                out.append(comment(s.loc, sources))
                last[0] = s.loc
            out += lines
        return out

    return body(k.steps, n, 0)


def kernel_title(k: TileKernel) -> str:
    """``# kernel row_softmax<R=4, ...> (file:line), grid (4,)``, cut to 100 characters."""
    gen = ", ".join(f"{g}={v}" for g, v in k.generics.items())
    title = f"# kernel {k.short_name}<{gen}> ({k.loc}), grid {k.grid}"
    return title if len(title) <= 100 else title[:97] + "..."


def comment(loc: str, sources: dict[str, list[str]]) -> str:
    """``# file:line  the source line``, cut to 92 characters.

    >>> comment("m.linnet:2", {"m.linnet": ["let a = 1", "  let b = a * 2"]})
    '# m.linnet:2  let b = a * 2'
    """
    file, _, line = loc.rpartition(":")
    text = ""
    src = sources.get(file)
    if src and line.isdigit() and 0 < int(line) <= len(src):
        text = "  " + src[int(line) - 1].strip()
    out = f"# {file}:{line}{text}"
    return out if len(out) <= 92 else out[:89].rstrip() + "..."


def runs_table(keys: list[str], counted: str) -> str:
    """``RUNS``: per kernel instance, [``counted`` that launched it, those that ran the body].

    >>> print(runs_table(["k"], "calls"))
    # Per kernel instance: [calls that launched it, calls that ran the op's body].
    RUNS = {'k': [0, 0]}
    """
    inner = ", ".join(f"{k!r}: [0, 0]" for k in keys)
    return (
        f"# Per kernel instance: [{counted} that launched it, {counted} that ran the op's "
        f"body].\nRUNS = {{{inner}}}"
    )


def stored_and_loaded(lines: list[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The names ``lines`` (Python statements) assign and those they read.

    >>> stored_and_loaded(["y = f(x)"]) == ({"y"}, {"f", "x"})
    True
    """
    tree = ast.parse("\n".join(lines))
    names = [x for x in ast.walk(tree) if isinstance(x, ast.Name)]
    return (
        frozenset(x.id for x in names if isinstance(x.ctx, ast.Store)),
        frozenset(x.id for x in names if isinstance(x.ctx, ast.Load)),
    )


def indented(lines: list[str]) -> str:
    """The lines after the first indented one level (for a function body).

    >>> print(indented(["if a:", "    b = 1"]))
    if a:
            b = 1
    """
    return lines[0] + "".join("\n    " + line for line in lines[1:])
