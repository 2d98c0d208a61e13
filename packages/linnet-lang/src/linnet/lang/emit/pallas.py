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
  kernel's grid, inside a ``jax.custom_jvp`` whose tangent is the JVP of the op's body, or
  the transpose of its ``grad`` clause where it has one: forward mode, reverse mode (JAX
  transposes the tangent back: the clause's gradient exactly) and every higher order;
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

from linnet.lang.emit import tile_edges, tiles
from linnet.lang.emit.tiles import (
    Context,
    KernelText,
    Names,
    TileRule,
    carry,
    common_rules,
    expand,
    literal,
    safe_name,
)
from linnet.lang.emit.triton import (
    RESERVED as TRITON_RESERVED,
)
from linnet.lang.emit.triton import (
    chain_text as triton_chain_text,
)
from linnet.lang.ir.graph import Step
from linnet.lang.ir.tiles import TILE_PRIMITIVES, TileKernel  # noqa: F401 (the doctest)

JNP_DTYPES = {
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
_INTS = {"i8", "i16", "i32", "i64", "u8"}
# Names a kernel function must not shadow: the generated module's own.
RESERVED = (TRITON_RESERVED - {"tl", "triton", "torch"}) | {
    "jax",
    "jnp",
    "lax",
    "pl",
    "plgpu",
    "PALLAS",
    "INTERPRET",
    "PRECISION",
    "RUNS",
}

# Pallas's spellings of what the shared rules (emit/tiles.py) write.
PALLAS = tiles.Dialect(
    name="Pallas",
    code="E0560",
    dtypes=JNP_DTYPES,
    reserved=frozenset(RESERVED),
    full="jnp.full",
    broadcast_to="jnp.broadcast_to",
    reshape="jnp.reshape",
    permute="jnp.transpose",
    where="jnp.where",
    sum="jnp.sum",
    program_id="pl.program_id",
    method="astype",
    bitcast="lax.bitcast_convert_type({x}, {t})",
)


class PallasNames(Names):
    """:class:`~linnet.lang.emit.tiles.Names` with JAX's literals and reserved names."""

    dialect = PALLAS


def safe(name: str) -> str:
    """``name`` as a Python name a Pallas kernel may use.

    >>> safe("jnp"), safe("lambda"), safe("x")
    ('v_jnp', 'v_lambda', 'x')
    """
    return safe_name(name, PALLAS.reserved)


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


def _fdiv(s: Step, n: Names, c: Context) -> list[str]:
    """Float ``/`` (integers: tile_edges.int_div, floored and by zero too)."""
    a, b = (n(o) for o in s.operands)
    return [f"{n(s.results[0])} = {a} / {b}"]


def _iota(s: Step, n: Names, c: Context) -> list[str]:
    shape, axis = tuple(s.attributes["shape"]), s.attributes["axis"]
    dtype = JNP_DTYPES[s.attributes["dtype"]]
    return [f"{n(s.results[0])} = lax.broadcasted_iota({dtype}, {shape}, {axis})"]


def _reshape(s: Step, n: Names, c: Context) -> list[str]:
    # A one-element tile to a scalar (Triton has no reshape to rank 0).
    if not s.attributes["shape"]:
        return [f"{n(s.results[0])} = jnp.sum({n.tensor(s.operands[0])})"]
    return tiles.reshape(s, n, c)


def _reduce(s: Step, n: Names, c: Context) -> list[str]:
    kind, acc = s.attributes["kind"], s.attributes["accumulate"]
    src = s.operands[0]
    x = n.tensor(src)
    if n.dtype(src) != acc and kind in ("sum", "mean", "prod"):
        x = f"{x}.astype({JNP_DTYPES[acc]})"
    fn = {
        "sum": "jnp.sum",
        "mean": "jnp.sum",
        "max": "jnp.max",
        "min": "jnp.min",
        "prod": "jnp.prod",
    }[kind]
    operand, x = x, tiles.reduced(s, n, fn, x)
    lines: list[str] = []
    if kind in ("max", "min") and n.dtype(src) not in _INTS | {"bool"}:  # a NaN wins
        lines, x = tile_edges.pallas_nan_through(s, n, operand, x)
    out = n.dtype(s.results[0])
    if out != acc and kind in ("sum", "mean", "prod"):
        x = f"({x}).astype({JNP_DTYPES[out]})"
    return [*lines, f"{n(s.results[0])} = {x}"]


def _dot(s: Step, n: Names, c: Context, layout: tuple[bool, bool]) -> str:
    """jnp.dot (tensor cores through Triton's tl.dot), f32 at full precision (HIGHEST: IEEE)
    unless numerics "fast"."""
    a, b = s.operands
    lhs = f"{n(a)}.T" if layout[0] else n(a)
    rhs = f"{n(b)}.T" if layout[1] else n(b)
    return (
        f"jnp.dot({lhs}, {rhs}, precision={c.precision}, "
        f"preferred_element_type={JNP_DTYPES[s.attributes['accumulate']]})"
    )


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
    shapes = [n.shape(s.operands[i["operand"]]) if isinstance(i, dict) else () for i in index]
    rank = sum(len(t) for t in shapes)
    parts, at = [], 0
    for i, t in zip(index, shapes):
        if isinstance(i, dict):
            parts.append(n(s.operands[i["operand"]]) + (expand(at, len(t), rank) if t else ""))
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
    lines, carried = carry(s, n)
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
# backend (jax 0.10 to 0.11). `atomic_add` counts in scratch buffers that a launcher keeps
# between launches, which a JAX function (whose arrays are values) has no place for: the
# JAX emitter runs the op's body where a kernel has `scratch(...)` (JaxEmitter.kernels_scratch).
EXPECTED_MISSING: frozenset[str] = frozenset({"erf", "atomic_add"})

PALLAS_RULES: dict[str, TileRule] = common_rules(
    _unary,
    _binary,
    "pallas",
    {
        "div": tile_edges.int_div("pallas", _fdiv),
        "rem": tile_edges.int_rem("pallas", _binary("jnp.remainder({}, {})")),
        "maximum": tile_edges.pallas_extreme("maximum"),
        "minimum": tile_edges.pallas_extreme("minimum"),
        "convert": tile_edges.convert,
        "floor": tile_edges.pallas_floor,
        "iota": _iota,
        "reshape": _reshape,
        "reduce": _reduce,
        "contract": tiles.contract(_dot),
        "load": _load,
        "store": _store,
        "for": _for,
    },
)


# ---------------------------------------------------------------- functions


def kernel_function(
    k: TileKernel,
    name: str,
    sources: dict[str, list[str]],
    precision: str = "lax.Precision.HIGHEST",
) -> str:
    """The Pallas kernel function for ``k``: one ref per tensor parameter and result (named
    as in the source), then the body."""
    n = PallasNames(k)
    args = [safe(p) for p, _, _ in k.params + k.results]
    n.used |= set(args)
    for p, _, _ in k.params + k.results:
        n.alias("@" + p, safe(p))
    lines = tiles.kernel_body(k, n, PALLAS_RULES, sources, precision) or ["pass"]
    head = [tiles.kernel_title(k), f"def {name}({', '.join(args)}):"]
    return "\n".join(head + ["    " + line for line in lines])


def launcher_function(k: TileKernel, function: str, name: str, key: str) -> str:
    """``run_*``: the ``pl.pallas_call`` of ``function`` on the kernel's grid (interpreted
    under LINNET_PALLAS_INTERPRET=1); ``launch_*``: it inside a ``jax.custom_jvp`` whose
    tangent is the JVP of ``body``, or the transpose of ``backward`` (the op's grad clause;
    READY's ``kernel_jvp``)."""
    ins = [safe(p) for p, _, _ in k.params]
    many = len(k.results) > 1
    shapes = ", ".join(
        f"jax.ShapeDtypeStruct({shape}, {JNP_DTYPES[dtype]})" for _, shape, dtype in k.results
    )
    out_shape = f"({shapes},)" if many else shapes
    results = ", ".join(r for r, _, _ in k.results)
    lines = [
        f"def run_{key}({', '.join(ins)}):",
        f'    """Launch `{k.short_name}` ({k.loc}) on grid {k.grid}; returns {results}."""',
        f"    out_shape = {out_shape}",
        f"    return pl.pallas_call({function}, out_shape=out_shape, grid={k.grid},",
        "                          interpret=INTERPRET, compiler_params=COMPILER_PARAMS,",
        f"                          name={function!r})({', '.join(ins)})",
        "",
        "",
        f"def {name}(body, backward, {', '.join(ins)}):",
        f'    """`{k.short_name}`; differentiated by JAX through the JVP of `body` (the op\'s'
        ' body),\n    or the transpose of `backward` (its grad clause)."""',
        "    return kernel_jvp(" + f"run_{key}, body, backward)({', '.join(ins)})",
    ]
    return "\n".join(lines)


def kernel_text(
    k: TileKernel, sources: dict[str, list[str]], precision: str, taken: set[str]
) -> KernelText:
    """The kernel function and launcher for ``k``, named ``instance_name(k)`` (made unique
    against ``taken``, which this extends).

    >>> from linnet.lang.syntax.program import Program
    >>> from linnet.lang.check.tile_lowering import lower_kernel
    >>> prog = Program.from_text("use std.nn.activation::{softmax}")
    >>> k = lower_kernel(prog, "std.nn.activation::row_softmax", {"R": 2, "C": 3, "B": 4})
    >>> t = kernel_text(k, {}, "lax.Precision.HIGHEST", set())
    >>> t.launcher, "plgpu.load(x.at[row, cols], mask=mask, other=-1e+30)" in t.source
    ('launch_row_softmax_2_3_4', True)
    """
    name = tiles.unique_instance(k, taken, ("", "launch_", "run_"))
    text = (
        kernel_function(k, name, sources, precision)
        + "\n\n\n"
        + launcher_function(k, name, f"launch_{name}", name)
    )
    return KernelText(k, name, f"launch_{name}", name, text)


def chain_text(texts: list[KernelText], taken: set[str]) -> KernelText:
    """A chain's launcher (`kernel a<...> then b<...>`, or longer): the first kernel's
    ``pallas_call`` on the op's arrays, then each next one's on them and the results of the
    one before it, as one function inside the ``jax.custom_jvp`` (differentiated through
    the op's body or grad clause, as a single kernel's)."""

    def launch(key: str, ins: list[str]) -> list[str]:
        return [
            f"def launch_{key}(body, backward, {', '.join(ins)}):",
            '    """The chain; differentiated by JAX through the JVP of `body` (the op\'s '
            'body),\n    or the transpose of `backward` (its grad clause)."""',
            f"    return kernel_jvp(run_{key}, body, backward)({', '.join(ins)})",
        ]

    return triton_chain_text(texts, taken, "run_", launch)


# The module's own part: written only where a kernel is launched.
HEADER = """import os

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
"""

READY = '''def kernels_ready(key):
    """Whether a bound op launches kernel `key` (Pallas importable, and jax's default backend
    a GPU, or LINNET_PALLAS_INTERPRET=1); counts the answer in RUNS. It is asked when JAX
    traces the call: under jax.jit, once per compilation."""
    ready = PALLAS and (INTERPRET or jax.default_backend() == 'gpu')
    RUNS[key][0 if ready else 1] += 1
    return ready


def kernel_jvp(run, body, backward):
    """`run` (a kernel's launch) as a function JAX differentiates in every mode, to any
    order: a jax.custom_jvp whose primal is the launch and whose tangent is the JVP of `body`
    (the op's body), or, given `backward` (the op's grad clause: the op's tensors and one
    incoming gradient per result -> one gradient per tensor), the clause's transpose.
    Reverse mode transposes the tangent back, so jax.grad gets the body's gradient, or the
    clause's exactly. The rule's primal is the launch again: at each higher order the
    kernel runs forward and the body (or the clause) is differentiated once more."""
    @jax.custom_jvp
    def launch(*args):
        return run(*args)

    def tangent(primals, tangents):
        out = launch(*primals)
        if backward is None:
            return out, jax.jvp(body, primals, tangents)[1]
        outs = out if isinstance(out, tuple) else (out,)
        floats = [jnp.issubdtype(a.dtype, jnp.inexact) for a in primals]
        results = [jnp.issubdtype(o.dtype, jnp.inexact) for o in outs]

        def vjp(*cotangents):  # of the float results -> gradients of the float arguments
            given = iter(cotangents)
            full = [next(given) if r else jnp.zeros_like(o) for o, r in zip(outs, results)]
            grads = backward(*primals, *full)
            return tuple(g for g, f in zip(grads, floats) if f)

        transposed = jax.linear_transpose(vjp, *[o for o, r in zip(outs, results) if r])
        got = iter(transposed(tuple(t for t, f in zip(tangents, floats) if f)))
        made = tuple(next(got) if r else no_tangent(o) for o, r in zip(outs, results))
        return out, (made if isinstance(out, tuple) else made[0])

    launch.defjvp(tangent)
    return launch


def no_tangent(value):
    """The tangent of an integer result: float0 zeros."""
    import numpy
    return numpy.zeros(value.shape, jax.dtypes.float0)


def linnet_error(code, message, help):
    """A coded LinnetError where linnet-lang is importable (a RuntimeError otherwise:
    generated source also runs on its own)."""
    try:
        from linnet.lang.diagnostics.core import Diagnostic, LinnetError
    except ImportError:
        return RuntimeError(f"{code}: {message} (help: {help})")
    return LinnetError(Diagnostic(code, message, help=help))'''


def runs_table(keys: list[str]) -> str:
    """``RUNS``: per kernel instance, [traces that launched it, traces that ran the body]."""
    return tiles.runs_table(keys, "traces")


def launch_statement(
    text: KernelText,
    args: list[str],
    outs: list[str],
    body: list[str],
    body_name: str,
    backward: str | None = None,
) -> tuple[str, frozenset[str], frozenset[str]]:
    """The statements at a bound op's call: the op's ``body`` (its lines, as the emitter
    wrote them) as a local function ``body_name`` of the call's tensor ``args``, then the
    launch if ``kernels_ready``, else that function. ``backward`` names the function of the
    op's grad clause, if it has one. Returns the text (lines after the first indented one
    level for the function body), the names it defines and those it reads."""
    target = ", ".join(outs) + ("," if len(outs) == 1 and len(text.kernel.results) > 1 else "")
    returned = ", ".join(outs) + ("," if len(outs) > 1 else "")
    lines = [
        f"def {body_name}({', '.join(args)}):",
        *["    " + b for b in body],
        f"    return {returned}" if len(outs) == 1 else f"    return ({returned})",
        f"if kernels_ready({text.key!r}):",
        f"    {target} = {text.launcher}({body_name}, {backward or 'None'}, {', '.join(args)})",
        "else:",
        f"    {target} = {body_name}({', '.join(args)})",
    ]
    stored, loaded = tiles.stored_and_loaded(lines)
    stored |= {body_name}
    loaded = ((frozenset(args) | loaded) - stored) | ({backward} if backward else set())
    return tiles.indented(lines), stored, loaded
