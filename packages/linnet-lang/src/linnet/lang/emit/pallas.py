"""Tile kernels → Pallas kernel functions, and their launches in generated JAX.

Writes text only: this module imports neither jax nor Pallas. For each bound kernel and each
set of concrete generics a call uses, the generated JAX module gets:

* a Pallas kernel function written from the kernel's tile graph (``ir/tiles.py``), one rule
  per tile primitive (:data:`PALLAS_RULES`), names from the source, and the kernel's source
  lines as comments. Tensor parameters and results are whole-array refs (no block specs);
  ``load``/``store`` are ``jax.experimental.pallas.triton``'s masked ``load``/``store`` on
  ``ref.at[index tiles]``, the form that compiles through Pallas's Triton backend on a GPU
  (jax 0.10 to 0.11.2) and runs under ``interpret=True`` on the CPU;
* a launcher (``launch_row_softmax_4_8_1024``) that calls ``pl.pallas_call`` on the
  kernel's grid, inside a ``jax.custom_vjp`` whose backward is the op's ``grad`` clause where
  it has one, else ``jax.vjp`` of the op's body (run again);
* at the call, ``if kernels_ready(key): y = launch_...(x) else: y = <the op's body>(x)``.
  ``kernels_ready`` is true when Pallas is importable and jax's default backend is a GPU, or
  ``LINNET_PALLAS_INTERPRET=1`` was set when the module was imported (``interpret=True``).

As for Triton (``emit/triton.py``), a kernel is launched only under numerics "fast" and where
its ``where`` clause holds for the call's shapes; elsewhere the body is written alone. The
decision is made when JAX traces the call (under ``jax.jit``, once per compilation), and
``RUNS[key]`` counts those traces: [traces that launched it, traces that ran the body].

>>> sorted(PALLAS_RULES) == sorted(TILE_PRIMITIVES - EXPECTED_MISSING)
True
"""

from __future__ import annotations

import ast
import math
import re

from linnet.lang.emit.triton import (
    DOT_MIN,
    Context,
    KernelText,
    Names,
    TileRule,
    _comment,
    _expand,
    instance_name,
    literal,
)
from linnet.lang.emit.triton import (
    RESERVED as TRITON_RESERVED,
)
from linnet.lang.emit.triton import (
    chain_text as triton_chain_text,
)
from linnet.lang.ir.graph import Step
from linnet.lang.ir.tiles import TILE_PRIMITIVES, TileKernel  # noqa: F401 (the doctest)

JNP_DTYPES = {"f64": "jnp.float64", "f32": "jnp.float32", "f16": "jnp.float16",
              "bf16": "jnp.bfloat16", "i64": "jnp.int64", "i32": "jnp.int32",
              "i16": "jnp.int16", "i8": "jnp.int8", "u8": "jnp.uint8", "bool": "jnp.bool_"}
_INTS = {"i8", "i16", "i32", "i64", "u8"}
# Names a kernel function must not shadow: the generated module's own.
RESERVED = (TRITON_RESERVED - {"tl", "triton", "torch"}) | {
    "jax", "jnp", "lax", "pl", "plgpu", "PALLAS", "INTERPRET", "PRECISION", "RUNS"}


class PallasNames(Names):
    """:class:`~linnet.lang.emit.triton.Names` with JAX's literals and reserved names."""

    def fresh(self, base: str) -> str:
        base = safe(base)
        name, n = base, 1
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name

    def tensor(self, ref: str) -> str:
        """``ref`` as a JAX value: a literal becomes a typed 0-d array where a rule needs
        one (a loop-carried value, a stored value, a conversion)."""
        if ref in self.literals:
            return f"jnp.full((), {self.literals[ref]}, {JNP_DTYPES[self.dtype(ref)]})"
        return self(ref)


def safe(name: str) -> str:
    """``name`` as a Python name a Pallas kernel may use.

    >>> safe("jnp"), safe("lambda"), safe("x")
    ('v_jnp', 'v_lambda', 'x')
    """
    import keyword

    name = re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"
    if name[0].isdigit() or name in RESERVED or keyword.iskeyword(name) \
            or keyword.issoftkeyword(name):
        name = "v_" + name
    return name


# ---------------------------------------------------------------- rules


def _unary(fmt: str) -> TileRule:
    def rule(s: Step, n: Names, c: Context) -> list[str]:
        return [f"{n(s.results[0])} = {fmt.format(n.tensor(s.operands[0]))}"]
    return rule


def _binary(fmt: str) -> TileRule:
    def rule(s: Step, n: Names, c: Context) -> list[str]:
        a, b = (n(o) for o in s.operands)
        if all(o in n.literals for o in s.operands):  # keep the graph's dtype, not Python's
            a = n.tensor(s.operands[0])
        return [f"{n(s.results[0])} = {fmt.format(a, b)}"]
    return rule


def _div(s: Step, n: Names, c: Context) -> list[str]:
    a, b = (n(o) for o in s.operands)
    if n.dtype(s.results[0]) in _INTS:  # Linnet's integer division floors, as jnp's does
        return [f"{n(s.results[0])} = jnp.floor_divide({n.tensor(s.operands[0])}, {b})"]
    return [f"{n(s.results[0])} = {a} / {b}"]


def _constant(s: Step, n: Names, c: Context) -> list[str]:
    n.literals[s.results[0]] = literal(s.attributes["value"])
    return []


def _iota(s: Step, n: Names, c: Context) -> list[str]:
    shape, axis = tuple(s.attributes["shape"]), s.attributes["axis"]
    dtype = JNP_DTYPES[s.attributes["dtype"]]
    return [f"{n(s.results[0])} = lax.broadcasted_iota({dtype}, {shape}, {axis})"]


def _convert(s: Step, n: Names, c: Context) -> list[str]:
    dtype = s.attributes["dtype"]
    if dtype == "bool":
        return [f"{n(s.results[0])} = {n.tensor(s.operands[0])} != 0"]
    return [f"{n(s.results[0])} = {n.tensor(s.operands[0])}.astype({JNP_DTYPES[dtype]})"]


def _reshape(s: Step, n: Names, c: Context) -> list[str]:
    shape = tuple(s.attributes["shape"])
    src = s.operands[0]
    out = n(s.results[0])
    if not shape:  # a one-element tile to a scalar (Triton has no reshape to rank 0)
        return [f"{out} = jnp.sum({n.tensor(src)})"]
    have = n.shape(src)
    if src not in n.literals and have and [d for d in shape if d != 1] == list(have) \
            and 1 not in have:
        # Only new axes of size 1 (`rows[i] < M` in a [BM, BK] mask): `rows[:, None]`.
        return [f"{out} = {n(src)}[" + ", ".join("None" if d == 1 else ":" for d in shape)
                + "]"]
    return [f"{out} = jnp.reshape({n.tensor(src)}, {shape})"]


def _transpose(s: Step, n: Names, c: Context) -> list[str]:
    perm = tuple(s.attributes["perm"])
    return [f"{n(s.results[0])} = jnp.transpose({n(s.operands[0])}, {perm})"]


def _broadcast(s: Step, n: Names, c: Context) -> list[str]:
    src = s.operands[0]
    shape = tuple(s.attributes["shape"])
    out = n(s.results[0])
    if src in n.literals:
        return [f"{out} = jnp.full({shape}, {n(src)}, {JNP_DTYPES[n.dtype(s.results[0])]})"]
    have = n.shape(src)
    x = n(src)
    if have and len(have) < len(shape):  # numpy's rule: new axes on the left
        x += _expand(len(shape) - len(have), len(have), len(shape))
    return [f"{out} = jnp.broadcast_to({x}, {shape})"]


def _reduce(s: Step, n: Names, c: Context) -> list[str]:
    kind, axes, acc = s.attributes["kind"], sorted(s.attributes["axes"]), s.attributes["accumulate"]
    src = s.operands[0]
    x = n.tensor(src)
    if n.dtype(src) != acc and kind in ("sum", "mean", "prod"):
        x = f"{x}.astype({JNP_DTYPES[acc]})"
    fn = {"sum": "jnp.sum", "mean": "jnp.sum", "max": "jnp.max", "min": "jnp.min",
          "prod": "jnp.prod"}[kind]
    # One axis at a time, the last first, so that the other axes keep their numbers (the
    # Triton backend reduces one axis per op).
    for axis in reversed(axes):
        x = f"{fn}({x}, axis={axis})"
    if kind == "mean":
        x = f"{x} / {math.prod(n.shape(src)[a] for a in axes)}"
    out = n.dtype(s.results[0])
    if out != acc and kind in ("sum", "mean", "prod"):
        x = f"({x}).astype({JNP_DTYPES[out]})"
    return [f"{n(s.results[0])} = {x}"]


def _contract(s: Step, n: Names, c: Context) -> list[str]:
    a, b = s.operands
    spec = s.attributes["spec"]
    acc = s.attributes["accumulate"]
    ins, out_labels = spec.split("->")
    la, lb = ins.split(",")
    out = n(s.results[0])
    sa, sb = n.shape(a), n.shape(b)
    size = dict(zip(la, sa)) | dict(zip(lb, sb))
    summed = [x for x in dict.fromkeys(la + lb) if x not in out_labels]
    # A matrix product of two tiles at least DOT_MIN a side: jnp.dot (tensor cores through
    # Triton's tl.dot), f32 at full precision (HIGHEST: IEEE) unless numerics "fast".
    if len(la) == 2 and len(lb) == 2 and len(out_labels) == 2 and len(summed) == 1:
        k = summed[0]
        m = next(x for x in la if x != k)
        nn = next(x for x in lb if x != k)
        if out_labels == m + nn and all(size[x] >= DOT_MIN for x in (m, nn, k)):
            lhs = n(a) if la == m + k else f"{n(a)}.T"
            rhs = n(b) if lb == k + nn else f"{n(b)}.T"
            return [f"{out} = jnp.dot({lhs}, {rhs}, precision={c.precision}, "
                    f"preferred_element_type={JNP_DTYPES[acc]})"]
    # Otherwise: both operands laid out over every label (the result's, then the summed
    # ones), multiplied with broadcasting, and summed over the summed labels.
    order = list(out_labels) + summed
    parts = []
    for ref, labels in ((a, la), (b, lb)):
        perm = tuple(sorted(range(len(labels)), key=lambda i: order.index(labels[i])))
        x = n(ref)
        if perm != tuple(range(len(labels))):
            x = f"jnp.transpose({x}, {perm})"
        kept = sorted(labels, key=order.index)
        if len(kept) < len(order):
            x += "[" + ", ".join(":" if lab in kept else "None" for lab in order) + "]"
        if n.dtype(ref) != acc:
            x = f"{x}.astype({JNP_DTYPES[acc]})"
        parts.append(x)
    expr = f"{parts[0]} * {parts[1]}"
    for axis in reversed(range(len(out_labels), len(order))):
        expr = f"jnp.sum({expr}, axis={axis})"
    return [f"{out} = {expr}"]


def _select(s: Step, n: Names, c: Context) -> list[str]:
    cond, a, b = s.operands
    return [f"{n(s.results[0])} = jnp.where({n(cond)}, {n.tensor(a)}, {n.tensor(b)})"]


def _program_id(s: Step, n: Names, c: Context) -> list[str]:
    return [f"{n(s.results[0])} = pl.program_id({s.attributes['axis']})"]


def _tile_shape(s: Step, n: Names) -> tuple[int, ...]:
    """The shape a `load` reads or a `store` writes: each index tile's axes in order."""
    out: list[int] = []
    for i in s.attributes["index"]:
        if isinstance(i, dict):
            out += n.shape(s.operands[i["operand"]])
    return tuple(out)


def reference(s: Step, n: Names) -> str:
    """``x.at[rows[:, None], cols[None, :]]``: the elements a `load` or `store` touches. Each
    index tile's axes take their place in the tile (Linnet's outer indexing, written as
    NumPy's broadcasting advanced indexing)."""
    index = s.attributes["index"]
    tiles = [n.shape(s.operands[i["operand"]]) if isinstance(i, dict) else () for i in index]
    rank = sum(len(t) for t in tiles)
    parts, at = [], 0
    for i, t in zip(index, tiles):
        if isinstance(i, dict):
            parts.append(n(s.operands[i["operand"]]) + (_expand(at, len(t), rank) if t else ""))
            at += len(t)
        else:
            parts.append(str(i))
    return f"{n(s.operands[0])}.at[{', '.join(parts)}]"


def _operand(s: Step, n: Names, key: str, shape: tuple[int, ...]) -> str | None:
    v = s.attributes.get(key)
    if isinstance(v, dict):
        ref = s.operands[v["operand"]]
        if n.shape(ref) != shape:  # the Triton backend wants a mask of the tile's shape
            return f"jnp.broadcast_to({n(ref)}, {shape})"
        return n(ref)
    return None if v is None else literal(v)


def _load(s: Step, n: Names, c: Context) -> list[str]:
    shape = _tile_shape(s, n)
    args = [reference(s, n)]
    mask = _operand(s, n, "mask", shape)
    if mask is not None and shape:
        args.append(f"mask={mask}")
        other = _operand(s, n, "other", shape)
        if other is None:  # the spec's default: masked-off lanes read 0
            dtype = n.dtype(s.results[0])
            other = "False" if dtype == "bool" else ("0" if dtype in _INTS else "0.0")
        args.append(f"other={other}")
    elif mask is not None:  # one element: read it where the mask holds, else `other`
        other = _operand(s, n, "other", shape) or "0"
        return [f"{n(s.results[0])} = jnp.where({mask}, {args[0]}.get(), {other})"]
    return [f"{n(s.results[0])} = plgpu.load({', '.join(args)})"]


def _store(s: Step, n: Names, c: Context) -> list[str]:
    shape = _tile_shape(s, n)
    value = s.operands[s.attributes["value"]["operand"]]
    ref_dtype = n.dtype(s.operands[0])
    v = n.tensor(value)
    if n.dtype(value) != ref_dtype:
        v = f"{v}.astype({JNP_DTYPES[ref_dtype]})"
    if n.shape(value) != shape or value in n.literals:  # a scalar stored over a tile
        v = f"jnp.broadcast_to({v}, {shape})"
    args = [reference(s, n), v]
    mask = _operand(s, n, "mask", shape)
    if mask is not None:
        args.append(f"mask={mask}")
    return [f"plgpu.store({', '.join(args)})"]


def _for(s: Step, n: Names, c: Context) -> list[str]:
    """A loop as ``lax.fori_loop`` over a function of the index and the carried values (a
    Python loop would be unrolled when traced)."""
    a = s.attributes
    lines = []
    carried = []
    for init, arg, res in zip(s.operands, a["carried"], s.results):
        if init not in n.literals and init.startswith("%") and n.uses.get(init) == 1:
            var = n(init)  # read only to start the loop: the loop's variable itself
        else:
            var = n.fresh(re.sub(r"\.\d+$", "", arg.lstrip("%")))
            lines.append(f"{var} = {n.tensor(init)}")
        n.alias(arg, var)
        n.alias(res, var)
        carried.append(var)
    body_steps = a["body"]
    for arg, y in zip(a["carried"], a["yields"]):
        # `acc = acc + p` rather than `add = acc + p`: the new value is made by a step of
        # the body after which nothing reads the old one (as emit/triton.py writes it).
        at = next((i for i, st in enumerate(body_steps) if y in st.results), None)
        if at is None or n.uses.get(y) != 1 or y in n.names or any(
                arg in st.operands or arg in st.attributes.get("yields", [])
                for later in body_steps[at + 1:] for st in n.kernel.walk([later])):
            continue
        n.alias(y, n(arg))
    index = n(a["var"])
    fn = n.fresh(f"loop_{index}")
    count = max(0, -(-(a["stop"] - a["start"]) // a["step"]))
    head = [f"def {fn}({index if a['start'] == 0 and a['step'] == 1 else index + '_i'}, carry):"]
    body = []
    if not (a["start"] == 0 and a["step"] == 1):
        body.append(f"{index} = {a['start']} + {index}_i * {a['step']}")
    state = ", ".join(carried) + ("," if len(carried) == 1 else "")
    if carried:
        body.append(f"{state} = carry")
    body += c.body(a["body"], n, c.indent + 1)
    yields = [n.tensor(y) for y in a["yields"]]
    body.append(f"return ({', '.join(yields)}{',' if len(yields) == 1 else ''})")
    lines += head + ["    " + line for line in body]
    target = f"{state} = " if carried else ""
    lines.append(f"{target}lax.fori_loop(0, {count}, {fn}, ({state}))")
    return lines


# Primitives a kernel may not use yet, and why: `erf` has no lowering in Pallas's Triton
# backend (jax 0.10 to 0.11).
EXPECTED_MISSING: frozenset[str] = frozenset({"erf"})

PALLAS_RULES: dict[str, TileRule] = {
    "neg": _unary("-{}"), "not": _unary("~{}"), "exp": _unary("jnp.exp({})"),
    "log": _unary("jnp.log({})"), "sqrt": _unary("jnp.sqrt({})"),
    "rsqrt": _unary("lax.rsqrt({})"), "sin": _unary("jnp.sin({})"),
    "cos": _unary("jnp.cos({})"), "tanh": _unary("jnp.tanh({})"),
    "sigmoid": _unary("jax.nn.sigmoid({})"), "abs": _unary("jnp.abs({})"),
    "floor": _unary("jnp.floor({})"),
    "add": _binary("{} + {}"), "sub": _binary("{} - {}"), "mul": _binary("{} * {}"),
    "div": _div, "rem": _binary("jnp.remainder({}, {})"), "pow": _binary("jnp.power({}, {})"),
    "maximum": _binary("jnp.maximum({}, {})"), "minimum": _binary("jnp.minimum({}, {})"),
    "lt": _binary("{} < {}"), "le": _binary("{} <= {}"), "gt": _binary("{} > {}"),
    "ge": _binary("{} >= {}"), "eq": _binary("{} == {}"), "ne": _binary("{} != {}"),
    "and": _binary("{} & {}"), "or": _binary("{} | {}"),
    "select": _select, "convert": _convert, "constant": _constant, "iota": _iota,
    "reshape": _reshape, "transpose": _transpose, "broadcast": _broadcast,
    "reduce": _reduce, "contract": _contract,
    "program_id": _program_id, "load": _load, "store": _store, "for": _for,
}


def _unsupported(what: str, s: Step) -> Exception:
    from linnet.lang.diagnostics import Diagnostic, LinnetError

    where = f" (from {s.loc})" if s.loc else ""
    return LinnetError(Diagnostic(
        "E0560", f"a kernel uses {what}{where}, which has no Pallas form yet",
        help="rewrite that part of the kernel, or run the op's body (numerics 'exact' "
             "never launches kernels)"))


# ---------------------------------------------------------------- functions


def kernel_function(k: TileKernel, name: str, sources: dict[str, list[str]],
                    precision: str = "lax.Precision.HIGHEST") -> str:
    """The Pallas kernel function for ``k``: one ref per tensor parameter and result (named
    as in the source), then the body."""
    n = PallasNames(k)
    args = [safe(p) for p, _, _ in k.params + k.results]
    n.used |= set(args)
    for p, _, _ in k.params + k.results:
        n.alias("@" + p, safe(p))
    last: list[str | None] = [None]

    def body(steps: list[Step], names: Names, depth: int) -> list[str]:
        out: list[str] = []
        for s in steps:
            rule = PALLAS_RULES.get(s.op)
            if rule is None:
                raise _unsupported(f"`{s.op}`", s)
            lines = rule(s, names, Context(precision, body, depth))
            if lines and s.loc and s.loc != last[0]:
                out.append(_comment(s.loc, sources))
                last[0] = s.loc
            out += lines
        return out

    lines = body(k.steps, n, 0) or ["pass"]
    gen = ", ".join(f"{g}={v}" for g, v in k.generics.items())
    title = f"# kernel {k.short_name}<{gen}> ({k.loc}), grid {k.grid}"
    head = [title if len(title) <= 100 else title[:97] + "...",
            f"def {name}({', '.join(args)}):"]
    return "\n".join(head + ["    " + line for line in lines])


def launcher_function(k: TileKernel, function: str, name: str, key: str) -> str:
    """``run_*``: the ``pl.pallas_call`` of ``function`` on the kernel's grid (interpreted
    under LINNET_PALLAS_INTERPRET=1); ``launch_*``: it inside a ``jax.custom_vjp`` whose
    backward is ``backward`` (the op's grad clause, or ``jax.vjp`` of its body)."""
    ins = [safe(p) for p, _, _ in k.params]
    many = len(k.results) > 1
    shapes = ", ".join(f"jax.ShapeDtypeStruct({shape}, {JNP_DTYPES[dtype]})"
                       for _, shape, dtype in k.results)
    out_shape = f"({shapes},)" if many else shapes
    results = ", ".join(r for r, _, _ in k.results)
    lines = [f"def run_{key}({', '.join(ins)}):",
             f'    """Launch `{k.short_name}` ({k.loc}) on grid {k.grid}; returns {results}."""',
             f"    out_shape = {out_shape}",
             f"    return pl.pallas_call({function}, out_shape=out_shape, grid={k.grid},",
             "                          interpret=INTERPRET, compiler_params=COMPILER_PARAMS,",
             f"                          name={function!r})({', '.join(ins)})",
             "", "",
             f"def {name}(body, backward, {', '.join(ins)}):",
             f'    """`{k.short_name}` forward; under jax.grad, `backward` (the op\'s grad clause,'
             ' or the\n    vjp of its `body`)."""',
             "    return kernel_vjp(" + f"run_{key}, body, backward)({', '.join(ins)})"]
    return "\n".join(lines)


def kernel_text(k: TileKernel, sources: dict[str, list[str]], precision: str,
                taken: set[str]) -> KernelText:
    """The kernel function and launcher for ``k``, named ``instance_name(k)`` (made unique
    against ``taken``, which this extends).

    >>> from linnet.lang.syntax.program import Program
    >>> from linnet.lang.ir.tiles import lower_kernel
    >>> prog = Program.from_text("use std.nn.activation::{softmax}")
    >>> k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 2, "C": 3, "B": 4})
    >>> t = kernel_text(k, {}, "lax.Precision.HIGHEST", set())
    >>> t.launcher, "plgpu.load(x.at[row, cols], mask=mask, other=-1e+30)" in t.source
    ('launch_row_softmax_2_3_4', True)
    """
    base = instance_name(k)
    name, i = base, 1
    while name in taken or f"launch_{name}" in taken or f"run_{name}" in taken:
        i += 1
        name = f"{base}_{i}"
    taken |= {name, f"launch_{name}", f"run_{name}"}
    text = kernel_function(k, name, sources, precision) + "\n\n\n" + launcher_function(
        k, name, f"launch_{name}", name)
    return KernelText(k, name, f"launch_{name}", name, text)


def chain_text(first: KernelText, second: KernelText, taken: set[str]) -> KernelText:
    """A chain's launcher (`kernel a<...> then b<...>`): ``first``'s ``pallas_call`` on
    the op's arrays, then ``second``'s on them and ``first``'s results, as one function
    inside the ``jax.custom_vjp`` (its backward is the op's, as a single kernel's)."""
    def launch(key: str, ins: list[str]) -> list[str]:
        return [f"def launch_{key}(body, backward, {', '.join(ins)}):",
                '    """The chain forward; under jax.grad, `backward` (the op\'s grad clause, '
                'or the vjp\n    of its `body`)."""',
                f"    return kernel_vjp(run_{key}, body, backward)({', '.join(ins)})"]

    return triton_chain_text(first, second, taken, "run_", launch)


# The module's own part: written only where a kernel is launched.
HEADER = '''import os

try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu
    PALLAS = True
    # Pallas's Triton backend: masked loads and stores of whole-array refs, the model of
    # Linnet's kernels (linnet-runtime-jax's README says why not Mosaic GPU).
    COMPILER_PARAMS = plgpu.CompilerParams(num_warps=4, num_stages=1)
except ImportError:  # no Pallas: every bound op runs its body
    PALLAS = False
    COMPILER_PARAMS = None

# Pallas's interpreter runs kernels on any backend (the CPU's): read once, when imported.
INTERPRET = os.environ.get('LINNET_PALLAS_INTERPRET') == '1'
'''

READY = '''def kernels_ready(key):
    """Whether a bound op launches kernel `key` (Pallas importable, and jax's default backend
    a GPU, or LINNET_PALLAS_INTERPRET=1); counts the answer in RUNS. It is asked when JAX
    traces the call: under jax.jit, once per compilation."""
    ready = PALLAS and (INTERPRET or jax.default_backend() == 'gpu')
    RUNS[key][0 if ready else 1] += 1
    return ready


def kernel_vjp(run, body, backward):
    """`run` (a kernel's launch) as a function whose backward pass is `backward(residuals,
    cotangents)` if given (the op's grad clause), else the vjp of `body` (the op's body, run
    again from the saved inputs)."""
    @jax.custom_vjp
    def launch(*args):
        return run(*args)

    def forward(*args):
        return run(*args), args

    def reverse(args, cotangent):
        if backward is not None:
            return tuple(backward(*args, cotangent))
        return jax.vjp(body, *args)[1](cotangent)

    launch.defvjp(forward, reverse)
    return launch'''


def runs_table(keys: list[str]) -> str:
    """``RUNS``: per kernel instance, [traces that launched it, traces that ran the body]."""
    inner = ", ".join(f"{k!r}: [0, 0]" for k in keys)
    return ("# Per kernel instance: [traces that launched it, traces that ran the op's body].\n"
            f"RUNS = {{{inner}}}")


def launch_statement(text: KernelText, args: list[str], outs: list[str], body: list[str],
                     body_name: str, backward: str | None = None
                     ) -> tuple[str, frozenset[str], frozenset[str]]:
    """The statements at a bound op's call: the op's ``body`` (its lines, as the emitter
    wrote them) as a local function ``body_name`` of the call's tensor ``args``, then the
    launch if ``kernels_ready``, else that function. ``backward`` names the function of the
    op's grad clause, if it has one. Returns the text (lines after the first indented one
    level for the function body), the names it defines and those it reads."""
    target = ", ".join(outs) + ("," if len(outs) == 1 and len(text.kernel.results) > 1 else "")
    returned = ", ".join(outs) + ("," if len(outs) > 1 else "")
    lines = [f"def {body_name}({', '.join(args)}):",
             *["    " + b for b in body],
             f"    return {returned}" if len(outs) == 1 else f"    return ({returned})",
             f"if kernels_ready({text.key!r}):",
             f"    {target} = {text.launcher}({body_name}, {backward or 'None'}, "
             f"{', '.join(args)})",
             "else:",
             f"    {target} = {body_name}({', '.join(args)})"]
    tree = ast.parse("\n".join(lines))
    stored = frozenset(x.id for x in ast.walk(tree)
                       if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)) | {body_name}
    loaded = frozenset(args) | frozenset(
        x.id for x in ast.walk(tree) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load))
    loaded = (loaded - stored) | ({backward} if backward else set())
    indented = lines[0] + "".join("\n    " + line for line in lines[1:])
    return indented, stored, loaded
