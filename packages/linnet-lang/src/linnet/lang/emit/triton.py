"""Tile kernels → `@triton.jit` functions, and their launches in generated PyTorch.

Writes text only: this module imports neither torch nor triton. For each bound kernel and
each set of concrete generics a call uses, the generated PyTorch module gets:

* a ``@triton.jit`` function written from the kernel's tile graph (``ir/tiles.py``), one
  rule per tile primitive (:data:`TILE_RULES`), names from the source, and the kernel's
  source lines as comments;
* a launcher (``launch_row_softmax_4_8_1024``) that makes the inputs contiguous,
  allocates the results and launches the kernel on its grid. Strides are ``tl.constexpr``
  arguments known when the module is written (the inputs are contiguous). Under
  torch.compile (not interpreted) it goes through a ``torch.library.triton_op`` whose body
  launches with ``torch.library.wrap_triton``, so compiled code does not break its graph;
* at the call, ``if kernels_ready(key, x): y = launch_...(x) else: <the op's body>``.
  ``kernels_ready`` is true when Triton is importable and the tensors are on CUDA, or
  ``TRITON_INTERPRET=1`` was set before the module was imported and they are on the CPU.

The emitter launches a kernel only under numerics "fast" and where the kernel's ``where``
clause holds for the call's shapes (``kernel_applies`` in the graph); elsewhere it writes the
body alone, as without kernels. ``RUNS[key]`` counts, per kernel instance, the calls that
launched it and the calls that ran the body instead (tests read it).

>>> sorted(TILE_RULES) == sorted(TILE_PRIMITIVES - EXPECTED_MISSING)
True
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

from linnet.lang.emit import tile_edges, tiles
from linnet.lang.emit.tiles import (  # noqa: F401 (emit/pallas.py and others import them here)
    DOT_MIN,
    Context,
    KernelText,
    TileRule,
    carry,
    common_rules,
    expand,
    instance_name,
    literal,
    safe_name,
)

# The module text around the kernels: emit/torch.py imports it here with the kernel writers.
from linnet.lang.emit.triton_module import HEADER, READY, runs_table  # noqa: F401
from linnet.lang.ir.graph import Step
from linnet.lang.ir.tiles import TILE_PRIMITIVES, TileKernel  # noqa: F401 (the doctest)

TL_DTYPES = {
    "f64": "tl.float64",
    "f32": "tl.float32",
    "f16": "tl.float16",
    "bf16": "tl.bfloat16",
    "i64": "tl.int64",
    "i32": "tl.int32",
    "i16": "tl.int16",
    "i8": "tl.int8",
    "u8": "tl.uint8",
    "bool": "tl.int1",
}
# What the launcher allocates results as (emit/torch.py's table; not imported from there, which
# imports this module).
TORCH_DTYPES = {k: v.replace("tl.", "torch.") for k, v in TL_DTYPES.items()} | {
    "bool": "torch.bool"
}
_INTS = {"i8", "i16", "i32", "i64", "u8"}
# `dot16`, `prefetch_l2`, `max_nan` and `min_nan` are HEADER's, which kernels call.
RESERVED = (
    {"tl", "triton", "torch", "math", "dot16", "prefetch_l2"}
    | set(dir(builtins))
    | tile_edges.HEADER_NAMES
)

# Triton's spellings of what the shared rules (emit/tiles.py) write.
TRITON = tiles.Dialect(
    name="Triton",
    code="E0532",
    dtypes=TL_DTYPES,
    reserved=frozenset(RESERVED),
    full="tl.full",
    broadcast_to="tl.broadcast_to",
    reshape="tl.reshape",
    permute="tl.permute",
    where="tl.where",
    sum="tl.sum",
    program_id="tl.program_id",
    method="to",
    bitcast="{x}.to({t}, bitcast=True)",
)


# ---------------------------------------------------------------- names


class Names(tiles.Names):
    """Python names inside one kernel function: values keep their source names."""

    dialect = TRITON


def safe(name: str) -> str:
    """``name`` as a Python name a kernel may use: not a keyword, a builtin or `tl`.

    >>> safe("lambda"), safe("range"), safe("x")
    ('v_lambda', 'v_range', 'x')
    """
    return safe_name(name, TRITON.reserved)


# ---------------------------------------------------------------- rules


_HALF = {"bf16", "f16"}


def _wide(s: Step, n: tiles.Names, ref: str) -> str:
    """An operand of 16-bit floats read as f32: each element-wise step computes in f32 and
    rounds its result once, as torch does (and Triton's interpreter multiplies bf16 wrongly)."""
    if ref not in n.literals and n.dtype(ref) in _HALF:
        return f"{n(ref)}.to(tl.float32)"
    return n(ref)


def _narrow(s: Step, n: tiles.Names, expr: str) -> str:
    dtype = n.dtype(s.results[0])
    if dtype in _HALF and any(o not in n.literals and n.dtype(o) in _HALF for o in s.operands):
        return f"({expr}).to({TL_DTYPES[dtype]})"
    return expr


def _unary(fmt: str) -> TileRule:
    def rule(s: Step, n: tiles.Names, c: Context) -> list[str]:
        return [f"{n(s.results[0])} = {_narrow(s, n, fmt.format(_wide(s, n, s.operands[0])))}"]

    return rule


def _binary(fmt: str) -> TileRule:
    def rule(s: Step, n: tiles.Names, c: Context) -> list[str]:
        a, b = (_wide(s, n, o) for o in s.operands)
        return [f"{n(s.results[0])} = {_narrow(s, n, fmt.format(a, b))}"]

    return rule


def _bool_tile(n: tiles.Names, ref: str, shape: tuple[int, ...]) -> str:
    """A bool operand as a ``shape`` tile: a scalar bool (an `atomic_add`'s count compared,
    say) is broadcast through int8, as Triton's interpreter splats a scalar bool into an int
    tile (3.9: a mask of that "has unsupported dtype"); compiled code folds it."""
    if ref in n.literals or n.shape(ref) or not shape or n.dtype(ref) != "bool":
        return n(ref)
    return f"(tl.zeros({shape}, tl.int8) + {n(ref)}.to(tl.int8) != 0)"


def _logical(op: str) -> TileRule:
    def rule(s: Step, n: tiles.Names, c: Context) -> list[str]:
        shape = n.shape(s.results[0])
        a, b = (_bool_tile(n, o, shape) for o in s.operands)
        return [f"{n(s.results[0])} = {a} {op} {b}"]

    return rule


def _select(s: Step, n: tiles.Names, c: Context) -> list[str]:
    cond, a, b = s.operands
    return [
        f"{n(s.results[0])} = tl.where({_bool_tile(n, cond, n.shape(s.results[0]))}, "
        f"{n.tensor(a)}, {n.tensor(b)})"
    ]


def _fdiv(s: Step, n: tiles.Names, c: Context) -> list[str]:
    """Float ``/`` (integers: tile_edges.int_div, by zero too)."""
    wa, wb = (_wide(s, n, o) for o in s.operands)
    return [f"{n(s.results[0])} = {_narrow(s, n, f'{wa} / {wb}')}"]


def _frem(s: Step, n: tiles.Names, c: Context) -> list[str]:
    """Float ``%``, the divisor's sign (integers: tile_edges.int_rem, by zero too)."""
    wa, wb = (_wide(s, n, o) for o in s.operands)
    return [f"{n(s.results[0])} = {_narrow(s, n, f'{wa} - {wb} * tl.floor({wa} / {wb})')}"]


def _iota(s: Step, n: tiles.Names, c: Context) -> list[str]:
    shape, axis = s.attributes["shape"], s.attributes["axis"]
    expr = f"tl.arange(0, {shape[axis]})"
    if len(shape) > 1:
        expr = f"tl.broadcast_to({expr}{expand(axis, 1, len(shape))}, {tuple(shape)})"
    if s.attributes["dtype"] != "i32":
        expr += f".to({TL_DTYPES[s.attributes['dtype']]})"
    return [f"{n(s.results[0])} = {expr}"]


def _reshape(s: Step, n: tiles.Names, c: Context) -> list[str]:
    if not s.attributes["shape"]:  # a one-element tile to a scalar
        return [f"{n(s.results[0])} = tl.sum({_flat(n, s.operands[0])}, axis=0)"]
    return tiles.reshape(s, n, c)


def _flat(n: tiles.Names, ref: str) -> str:
    shape = n.shape(ref)
    return n(ref) if len(shape) == 1 else f"tl.reshape({n(ref)}, ({math.prod(shape)},))"


def _reduce(s: Step, n: tiles.Names, c: Context) -> list[str]:
    kind, acc = s.attributes["kind"], s.attributes["accumulate"]
    src = s.operands[0]
    x = n(src)
    if n.dtype(src) != acc and kind in ("sum", "mean"):
        x = f"{x}.to({TL_DTYPES[acc]})"
    elif n.dtype(src) in _HALF:  # max and min of 16-bit floats: exact in f32
        x = f"{x}.to(tl.float32)"
    fn = {"sum": "tl.sum", "mean": "tl.sum"}.get(kind)
    if kind in ("max", "min"):  # a NaN wins (tile_edges: tl.max skips it)
        x = tile_edges.triton_reduced(s, n, kind, x)
    elif fn is None:
        raise tiles.unsupported(TRITON, f"a `{kind}` reduction", s)
    else:
        x = tiles.reduced(s, n, fn, x)
    out = n.dtype(s.results[0])
    if out in _HALF:
        x = f"({x}).to({TL_DTYPES[out]})"
    return [f"{n(s.results[0])} = {x}"]


def _widened(n: tiles.Names, ref: str) -> str | None:
    """The 16-bit float tile that f32 tile ``ref`` was converted from (``x.to(tl.float32)``
    of a bf16 or f16 ``x``), or None."""
    p = n.producers.get(ref)
    if p is None or p.op != "convert" or n.dtype(ref) != "f32":
        return None
    src = p.operands[0]
    return src if n.dtype(src) in _HALF else None


def _dot(s: Step, n: tiles.Names, c: Context, layout: tuple[bool, bool]) -> str:
    """tl.dot (tensor cores), f32 at full precision unless numerics "fast" ("tf32").

    A product of two f32 tiles that are both widened from the same 16-bit type (``load(...)
    as f32`` of bf16 data, say) is a dot of the 16-bit tiles with an f32 accumulator: each
    product of two bf16 values is exact in f32, so only the order of the f32 sums differs
    from the f32 dot, and the tensor cores take it at their 16-bit rate, where a full
    precision f32 dot is FMA on the CUDA cores. It is written ``dot16(a, b)`` (HEADER's,
    which works around the interpreter's bf16 dot)."""
    a, b = s.operands
    acc = s.attributes["accumulate"]
    wa, wb = _widened(n, a), _widened(n, b)
    if acc == "f32" and wa is not None and wb is not None and n.dtype(wa) == n.dtype(wb):
        lhs = f"tl.trans({n(wa)})" if layout[0] else n(wa)
        rhs = f"tl.trans({n(wb)})" if layout[1] else n(wb)
        return f"dot16({lhs}, {rhs})"
    lhs = f"tl.trans({n(a)})" if layout[0] else n(a)
    rhs = f"tl.trans({n(b)})" if layout[1] else n(b)
    prec = f", input_precision={c.precision!r}" if n.dtype(a) == "f32" else ""
    return (
        f"tl.dot({lhs}, {rhs}{prec}, out_dtype={TL_DTYPES[acc]})"
        if acc in ("f32", "f16", "i32")
        else f"tl.dot({lhs}, {rhs}{prec}).to({TL_DTYPES[acc]})"
    )


def pointer(s: Step, n: tiles.Names) -> str:
    """The pointers a `load` or `store` reads or writes: the tensor's base plus, per axis,
    its index times its stride; each index tile's axes take their place in the tile."""
    base = s.operands[0]
    name = safe(base[1:])
    index = s.attributes["index"]
    shapes = [n.shape(s.operands[i["operand"]]) if isinstance(i, dict) else () for i in index]
    rank = sum(len(t) for t in shapes)
    terms, at = [], 0
    for axis, (i, t) in enumerate(zip(index, shapes)):
        stride = f"{name.upper()}_STRIDE_{axis}"
        if isinstance(i, dict):
            term = n(s.operands[i["operand"]]) + (expand(at, len(t), rank) if t else "")
            at += len(t)
        else:
            if i == 0:
                continue
            term = str(i)
        terms.append(f"{term} * {stride}")
    return " + ".join([n(base), *terms])


def _operand(s: Step, n: tiles.Names, key: str) -> str | None:
    v = s.attributes.get(key)
    if isinstance(v, dict):
        return n(s.operands[v["operand"]])
    return None if v is None else literal(v)


def _load(s: Step, n: tiles.Names, c: Context) -> list[str]:
    args = [pointer(s, n)]
    mask = _operand(s, n, "mask")
    if mask is not None:
        args.append(f"mask={mask}")
        other = _operand(s, n, "other")
        if other is None:  # the spec's default: masked-off lanes read 0
            dtype = n.dtype(s.results[0])
            other = "False" if dtype == "bool" else ("0" if dtype in _INTS else "0.0")
        args.append(f"other={other}")
    return [f"{n(s.results[0])} = tl.load({', '.join(args)})"]


def _store(s: Step, n: tiles.Names, c: Context) -> list[str]:
    value = s.operands[s.attributes["value"]["operand"]]
    args = [pointer(s, n), n(value)]
    mask = _operand(s, n, "mask")
    if mask is not None:
        args.append(f"mask={mask}")
    return [f"tl.store({', '.join(args)})"]


def _atomic_add(s: Step, n: tiles.Names, c: Context) -> list[str]:
    """One lane adds (a scalar atomic); the barriers make it the whole program's: every
    lane's stores are done before the count is released, and what each lane does after it
    comes after the count's acquire."""
    value = s.operands[s.attributes["value"]["operand"]]
    return [
        "tl.debug_barrier()  # every lane's loads and stores before the count",
        f"{n(s.results[0])} = tl.atomic_add({pointer(s, n)}, {n(value)}, sem='acq_rel', "
        "scope='gpu')",
        "tl.debug_barrier()  # and every lane's next steps after it",
    ]


def _for(s: Step, n: tiles.Names, c: Context) -> list[str]:
    a = s.attributes
    lines, _ = carry(s, n)
    step = f", {a['step']}" if a["step"] != 1 else ""
    lines.append(f"for {n(a['var'])} in range({a['start']}, {a['stop']}{step}):")
    body = c.body(a["body"], n, c.indent + 1)
    for arg, y in zip(a["carried"], a["yields"]):
        if n(y) != n(arg):
            body.append(f"{n(arg)} = {n.tensor(y)}")
    lines += ["    " + line for line in body] or ["    pass"]
    return lines


# Primitives a kernel may not use yet, and why: `pow` has no Triton function that runs in
# both the interpreter and compiled code of every Triton we support (3.6 to 3.9).
EXPECTED_MISSING: frozenset[str] = frozenset({"pow"})

TILE_RULES: dict[str, TileRule] = common_rules(
    _unary,
    _binary,
    "triton",
    {
        "div": tile_edges.int_div("triton", _fdiv),
        "rem": tile_edges.int_rem("triton", _frem),
        "floor": tile_edges.triton_floor,
        "maximum": tile_edges.triton_extreme("maximum"),
        "minimum": tile_edges.triton_extreme("minimum"),
        "convert": tile_edges.convert,
        "iota": _iota,
        "reshape": _reshape,
        "reduce": _reduce,
        "contract": tiles.contract(_dot),
        "load": _load,
        "store": _store,
        "atomic_add": _atomic_add,
        "for": _for,
        "and": _logical("&"),
        "or": _logical("|"),
        "select": _select,
    },
)


# ---------------------------------------------------------------- functions


# Programmatic dependent launch (Hopper and later; see ``pdl_launch`` in HEADER): a kernel
# launched with it may be scheduled while the kernel before it in the stream drains. So
# before any load or store it waits for that kernel to finish (its writes visible, and its
# reads of what this kernel may overwrite done). Every program waits, so the order holds
# from kernel to kernel down the stream. It then lets the next kernel be scheduled: at once
# (USE_PDL 1, "early"), or after its main work, before its first store outside a loop
# (USE_PDL 2, "late"; a kernel that stores only inside loops lets it go at its exit).
# Early hides more of the next kernel's launch, but its programs then wait on SMs as they
# free, which can crowd a large grid onto the first SMs to free.
PDL_ARG = "USE_PDL"
PDL_PROLOGUE = [
    f"if {PDL_ARG}:  # launched with programmatic dependent launch (pdl_launch)",
    "    tl.extra.cuda.gdc_wait()  # the kernel before this one has finished",
    f"if {PDL_ARG} == 1:  # the next kernel may be scheduled now (it waits too)",
    "    tl.extra.cuda.gdc_launch_dependents()",
]
PDL_LATE = [
    f"if {PDL_ARG} == 2:  # the next kernel may be scheduled now (it waits too)",
    "    tl.extra.cuda.gdc_launch_dependents()",
]


# Prefetch under PDL (LINNET_PDL 4 "late, prefetching" and 5 "early, prefetching"): before
# it waits for the kernel before it, each program asks L2 for the lines its first steps will
# load from its tensor parameters (the loads at the top level, and those of the first
# iteration of each top-level loop, whose places follow from program ids, iotas and
# constants alone): HEADER's `prefetch_l2`, one `prefetch.global.L2` a 128-byte line, masked
# by the tensor's bounds only. A prefetch loads no register, so it cannot give the kernel
# stale data (the kernel's own loads come after the wait) and nothing waits on it. It brings
# the lines into L2 (the point of coherence: a store by the kernel before still lands there)
# while that kernel drains, so that the first loads after the wait hit L2 rather than wait on
# DRAM. (Session 15 built this with volatile loads whose values were dropped: Triton issues
# those one element at a time, 16-bit loads where the kernel's own are 16-byte vectors, and
# on the H200 they made the 8B step 8% slower.) A kernel with nothing to prefetch has no
# PREFETCH argument.
PREFETCH_ARG = "PREFETCH"
_NOT_PURE = {"load", "store", "atomic_add", "for"}


def _index_operands(load: Step) -> list[tuple[int, str]]:
    """(axis, operand) of each index of ``load`` that is a tile (not a constant)."""
    return [
        (axis, load.operands[i["operand"]])
        for axis, i in enumerate(load.attributes["index"])
        if isinstance(i, dict)
    ]


def prefetch_loads(k: TileKernel) -> list[tuple[Step, Step | None]]:
    """The loads ``k``'s programs can issue before their PDL wait: (the load, the top-level
    ``for`` whose first iteration it is in, or None at the top level), in kernel order. A
    load qualifies where it reads a tensor parameter and every value its indices depend on is
    pure (no load, store, atomic or loop result) and, inside a loop, not carried from one
    iteration to the next (the loop's index is its start), and at least one index is a tile
    (a load of constant places is one element, not worth a prefetch). Its mask does not
    matter: the prefetch is masked by the tensor's bounds.

    >>> from linnet.lang.syntax.program import Program
    >>> from linnet.lang.check.tile_lowering import lower_kernel
    >>> prog = Program.from_text('''
    ... kernel total<N: Dim, B: Dim>(x: Tensor[N; f32], n: Tensor[1; i32]) -> y: Tensor[1; f32]
    ...     grid(1) {
    ...     let acc = fill(0.0, B)
    ...     for i in 0..N / B {
    ...         let cols = i * B + iota<i32>(B)
    ...         acc = acc + load(x[cols], cols < load(n[0]), 0.0)
    ...     }
    ...     store(y[0], sum[c] acc[c])
    ... }''')
    >>> [(s.operands[0], loop is not None) for s, loop in
    ...  prefetch_loads(lower_kernel(prog, "main::total", {"N": 16, "B": 4}))]
    [('@x', True)]
    """
    params = {"@" + p for p, _, _ in k.params}
    made: dict[str, tuple[Step, Step | None]] = {}
    for s in k.steps:
        for r in s.results:
            made[r] = (s, None)
        if s.op == "for":
            for b in s.attributes["body"]:
                for r in b.results:
                    made[r] = (b, s)

    def pure(ref: str, loop: Step | None, seen: set[str]) -> bool:
        if ref in seen or ref.startswith("@"):
            return True
        seen.add(ref)
        if loop is not None and ref == loop.attributes["var"]:
            return True
        if ref not in made:  # a loop's carried value, or another loop's index
            return False
        step, at = made[ref]
        if step.op in _NOT_PURE or at not in (None, loop):
            return False
        return all(pure(o, loop, seen) for o in step.operands)

    found: list[tuple[Step, Step | None]] = []
    for s in k.steps:
        inner: list[tuple[Step, Step | None]] = [(s, None)] if s.op == "load" else []
        a = s.attributes
        if (
            s.op == "for"
            and isinstance(a["start"], int)
            and isinstance(a["stop"], int)
            and a["stop"] > a["start"]
        ):
            inner = [(b, s) for b in a["body"] if b.op == "load"]
        for load, loop in inner:
            index = _index_operands(load)
            if load.operands[0] in params and index and all(pure(o, loop, set()) for _, o in index):
                found.append((load, loop))
    return found


def prefetch_lines(
    k: TileKernel, n: tiles.Names, precision: str, loads: list[tuple[Step, Step | None]]
) -> list[str]:
    """``if PREFETCH:`` and, under it, the values the indices of :func:`prefetch_loads`'
    loads need (each step again under a fresh name; a loop's index as its start) and, for
    each load, HEADER's ``prefetch_l2`` of its places masked by the tensor's bounds (one L2
    prefetch a 128-byte line, no register loaded). Empty where there is nothing
    to prefetch. Called after the body is written: the body's names stay as they were.
    ``loads`` is ``prefetch_loads(k)``."""
    if not loads:
        return []
    names, literals = dict(n.names), dict(n.literals)
    shapes = {p: shape for p, shape, _ in k.params}
    lines: list[str] = []
    done: set[str] = set()

    def need(ref: str, loop: Step | None, steps: list[Step]) -> None:
        if ref in done or ref.startswith("@") or ref in n.literals:
            return
        done.add(ref)
        producer = next(
            st for st in k.steps + (loop.attributes["body"] if loop else []) if ref in st.results
        )
        for o in producer.operands:
            need(o, loop, steps)
        steps.append(producer)

    def no_body(steps: list[Step], names_: tiles.Names, depth: int) -> list[str]:
        raise AssertionError("a prefetched index is pure: it has no loop")

    try:
        loops: list[Step | None] = []
        for _, at in loads:  # each once, in order (steps are not hashable)
            if not any(at is x for x in loops):
                loops.append(at)
        for loop in loops:
            if loop is not None:  # the loop's steps again, as its first iteration's
                n.literals[loop.attributes["var"]] = str(loop.attributes["start"])
                done -= {r for st in loop.attributes["body"] for r in st.results}
            for load, at in loads:
                if at is not loop:
                    continue
                steps: list[Step] = []
                for _, o in _index_operands(load):
                    need(o, loop, steps)
                for st in steps:
                    for r in st.results:
                        n.alias(r, n.fresh("pre_" + names.get(r, "v")))
                    lines += TILE_RULES[st.op](st, n, Context(precision, no_body, 1))
                lines.append(f"prefetch_l2({pointer(load, n)}, {_bounds(load, n, shapes)})")
            if loop is not None:
                del n.literals[loop.attributes["var"]]
    finally:
        n.names, n.literals = names, literals
    return [
        f"if {PREFETCH_ARG}:  # warm L2 with the first loads, before the wait (LINNET_PDL 4, 5)",
        *("    " + line for line in lines),
    ]


def _bounds(load: Step, n: tiles.Names, shapes: dict[str, tuple[int, ...]]) -> str:
    """``load``'s lanes whose every index is inside the tensor (a tile index's axes in
    their places, as :func:`pointer` lays them out)."""
    tensor = shapes[load.operands[0][1:]]
    index = _index_operands(load)
    rank = sum(len(n.shape(o)) for _, o in index)
    terms, at = [], 0
    for axis, o in index:
        t = n.shape(o)
        x = n(o) + (expand(at, len(t), rank) if t else "")
        at += len(t)
        terms.append(f"({x} >= 0) & ({x} < {tensor[axis]})")
    return " & ".join(terms)


def with_pdl(lines: list[str]) -> list[str]:
    """A kernel body's lines with PDL_PROLOGUE first and PDL_LATE before its first store
    outside a loop (and before that store's source comment)."""
    at = next((i for i, line in enumerate(lines) if line.startswith("tl.store(")), None)
    if at is None:
        return PDL_PROLOGUE + lines
    if at and lines[at - 1].startswith("# "):
        at -= 1
    return PDL_PROLOGUE + lines[:at] + PDL_LATE + lines[at:]


def kernel_function(
    k: TileKernel,
    name: str,
    sources: dict[str, list[str]],
    precision: str = "ieee",
    prefetched: list[tuple[Step, Step | None]] | None = None,
) -> str:
    """The ``@triton.jit`` function for ``k``: pointers for the tensor parameters, results
    and scratch buffers, then each one's strides as ``tl.constexpr``, then ``USE_PDL`` (0, or how it was
    launched with programmatic dependent launch: it then waits for the kernel before it)."""
    n = Names(k)
    tensors = k.params + k.results + k.scratch
    n.used |= {safe(p) for p, _, _ in tensors}
    args = [safe(p) for p, _, _ in tensors]
    for p, _, _ in tensors:
        n.alias("@" + p, safe(p))
    for p, shape, _ in tensors:
        args += [f"{safe(p).upper()}_STRIDE_{i}: tl.constexpr" for i in range(len(shape))]
        n.used |= {f"{safe(p).upper()}_STRIDE_{i}" for i in range(len(shape))}
    args.append(f"{PDL_ARG}: tl.constexpr")
    n.used.add(PDL_ARG)
    lines = with_pdl(tiles.kernel_body(k, n, TILE_RULES, sources, precision))
    n.used.add(PREFETCH_ARG)
    early = prefetch_lines(k, n, precision, prefetch_loads(k) if prefetched is None else prefetched)
    if early:
        args.append(f"{PREFETCH_ARG}: tl.constexpr")
        lines = early + lines
    head = [tiles.kernel_title(k), "@triton.jit", f"def {name}({', '.join(args)}):"]
    return "\n".join(head + ["    " + line for line in lines])


def launcher_function(
    k: TileKernel, function: str, name: str, key: str, prefetches: bool | None = None
) -> str:
    """The Python functions that launch ``function`` on the kernel's grid: ``run_*``
    allocates the results on the inputs' device and launches, the inputs' strides and the
    results' passed as constants (a kernel compiles once per layout); ``op_*`` is it as a
    custom op (what torch.compile sees); ``launch_*`` copies an input whose last axis is
    not contiguous (``rows_in_place``) and calls the op under torch.compile, ``run_*``
    otherwise."""
    ins = [safe(p) for p, _, _ in k.params]
    device = f"{ins[0]}.device" if ins else "DEVICE"
    outs = ", ".join(safe(r) for r, _, _ in k.results) + ("," if len(k.results) > 1 else "")
    many = len(k.results) > 1
    ret = (
        ("tuple[" + ", ".join(["torch.Tensor"] * len(k.results)) + "]") if many else "torch.Tensor"
    )
    typed = ", ".join(f"{p}: torch.Tensor" for p in ins)
    alloc = [
        f"    {safe(r)} = torch.empty({shape}, dtype={TORCH_DTYPES[dtype]}, device={device})"
        for r, shape, dtype in k.results
    ]
    # What a launch writes into: NaN instead of leftovers when a checker asks (POISON).
    results_new = [
        f"    {safe(r)} = new_result({shape}, {TORCH_DTYPES[dtype]}, {device})"
        for r, shape, dtype in k.results
    ]
    # Scratch buffers: the launcher's own, kept between launches (see `scratch` in HEADER).
    kept = [
        f"    {safe(r)} = scratch({key!r}, {r!r}, {shape}, {TORCH_DTYPES[dtype]}, {device})"
        for r, shape, dtype in k.scratch
    ]
    # A parameter's strides are its tensor's own where it has the parameter's shape (a view
    # whose rows are contiguous, such as one half of a joined product, is read where it is;
    # `strides_as`), else the contiguous ones (a state read as another shape); results and
    # scratch are allocated contiguous.
    strides, params_strides = [], []
    for p, shape, _ in k.params:
        st = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        if shape:
            params_strides.append(f"    {safe(p)}_st = strides_as({safe(p)}, {tuple(shape)}, {st})")
        strides += [f"{safe(p).upper()}_STRIDE_{i}={safe(p)}_st[{i}]" for i in range(len(shape))]
    for p, shape, _ in k.results + k.scratch:
        st = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        strides += [f"{safe(p).upper()}_STRIDE_{i}={v}" for i, v in enumerate(st)]
    args = [safe(p) for p, _, _ in k.params + k.results + k.scratch] + strides
    results = ", ".join(r for r, _, _ in k.results)
    inplace = [safe(p) for p in k.inplace]
    # A state the kernel stores into is written where it is: never a contiguous copy.
    checks = [f"    check_inplace({p}, {p!r}, {k.short_name!r})" for p in inplace]
    lines = [
        f"def run_{key}({typed}) -> {ret}:",
        f'    """Launch `{k.short_name}` ({k.loc}) on grid {k.grid}; returns {results}."""',
        *results_new,
        *kept,
        *params_strides,
        f"    pdl = pdl_launch({device}, {math.prod(k.grid)})",
        f"    wrap_triton({function})[{k.grid}]({', '.join(args)}, {PDL_ARG}=pdl, "
        + (
            f"{PREFETCH_ARG}=prefetching(pdl), "
            if (bool(prefetch_loads(k)) if prefetches is None else prefetches)
            else ""
        )
        + "**PDL_LAUNCH[pdl])",
        f"    return {outs}",
        "",
        "",
        f"def fake_{key}({', '.join(ins)}):",
        '    """What `run_' + key + '` returns, without running it (for torch.compile)."""',
        *alloc,
        f"    return {outs}",
        "",
        "",
        f"op_{key} = kernel_op({key!r}, run_{key}, fake_{key}"
        + (f", mutates={tuple(inplace)!r}" if inplace else "")
        + (", opaque=True)" if k.scratch else ")"),
        "",
        "",
        f"def {name}({', '.join(ins)}):",
        f'    """`{k.short_name}` on inputs read in place where their rows are contiguous; a '
        'custom op under torch.compile."""',
        *checks,
        *[
            f"    {safe(p)} = rows_in_place({safe(p)}, {tuple(shape)})"
            for p, shape, _ in k.params
            if safe(p) not in inplace
        ],
        "    if torch.compiler.is_compiling():",
        f"        return op_{key}({', '.join(ins)})",
        "    with direct():  # the kernel itself, not wrap_triton's higher-order op",
        f"        return run_{key}({', '.join(ins)})",
    ]
    return "\n".join(lines)


def kernel_text(
    k: TileKernel, sources: dict[str, list[str]], precision: str, taken: set[str]
) -> KernelText:
    name = tiles.unique_instance(k, taken, ("", "launch_"))
    loads = prefetch_loads(k)  # once: the kernel's PREFETCH block and its launcher's argument
    text = (
        kernel_function(k, name, sources, precision, loads)
        + "\n\n\n"
        + launcher_function(k, name, f"launch_{name}", name, bool(loads))
    )
    return KernelText(k, name, f"launch_{name}", name, text)


def chain_text(
    texts: list[KernelText],
    taken: set[str],
    stage: str = "launch_",
    tail: Callable[[str, list[str]], list[str]] | None = None,
) -> KernelText:
    """A chain's launcher (`kernel a<...> then b<...>`, or longer): the first kernel on the
    op's tensors, then each next one on them and the results of the one before it (its
    scratch, allocated by its launcher); the last one's results are the op's. Each stage
    stays a custom op of its own under torch.compile. Pallas's (emit/pallas.py) calls the
    stages' ``run_*`` (``stage``) inside one function and adds ``tail(key, inputs)``, its
    ``launch_*``."""
    first, last = texts[0], texts[-1]
    written = "".join(f"_{safe(p)}" for p in last.kernel.inplace)
    key = (
        first.key
        + "".join(f"_then_{t.kernel.short_name}" for t in texts[1:])
        + (f"_into{written}" if written else "")
    )
    base, i = key, 1
    names = {"launch_", stage}
    while any(f"{n}{key}" in taken for n in names) or key in taken:
        i += 1
        key = f"{base}_{i}"
    taken |= {key} | {f"{n}{key}" for n in names}
    k1, kn = first.kernel, last.kernel
    # The op's tensors are the last kernel's leading parameters; the first takes the
    # leading ones of those it needs, each other all of them (checked: check/checker.py).
    # ... then the states it stores into, their positions (and pages: `redirect_stores`), last.
    ops = len(kn.params) - len(texts[-2].kernel.results) - kn.tail
    ins = [safe(p) for p, _, _ in kn.params[:ops]]
    into = [safe(p) for p, _, _ in kn.params[len(kn.params) - kn.tail :]] if kn.tail else []
    used = set(ins + into)
    results: list[list[str]] = []  # each stage's but the last, named apart from the rest
    for j, t in enumerate(texts[:-1]):
        mine = []
        for r, _, _ in t.kernel.results:
            name = safe(r)
            while name in used:
                name = f"{name}_{j + 1}"
            used.add(name)
            mine.append(name)
        results.append(mine)
    if len(texts) == 2:
        doc = (
            f'    """`{k1.short_name}` then `{kn.short_name}`, which reads its '
            f'{", ".join(results[0])}\n    ({k1.loc}, {kn.loc})."""'
        )
    else:
        doc = (
            '    """'
            + " then ".join(f"`{t.kernel.short_name}`" for t in texts)
            + ", each reading the results\n    of the one before ("
            + ", ".join(t.kernel.loc for t in texts)
            + ')."""'
        )
    lines = [f"def {stage}{key}({', '.join(ins + into)}):", doc]
    for j, t in enumerate(texts[:-1]):
        args = ins[: len(k1.params)] if j == 0 else ins + results[j - 1]
        # a launcher of one result returns it, not a tuple
        lines.append(f"    {', '.join(results[j])} = {stage}{t.key}({', '.join(args)})")
    lines.append(f"    return {stage}{last.key}({', '.join(ins + results[-1] + into)})")
    if tail is not None:
        lines += ["", "", *tail(key, ins)]
    return KernelText(
        last.kernel,
        last.function,
        f"launch_{key}",
        key,
        "\n\n\n".join(t.source for t in texts) + "\n\n\n" + "\n".join(lines),
    )


def launch_statement(
    text: KernelText, args: list[str], outs: list[str], body: list[str], backward: str | None = None
) -> tuple[str, frozenset[str], frozenset[str]]:
    """The statement at a bound op's call: the launch if ``kernels_ready``, else the op's
    ``body`` (its lines as the emitter wrote them). ``args`` are the call's tensor arguments
    (the kernel's parameters, in order), ``outs`` the names of its results. Returns the text
    (lines after the first indented one level for the function body), the names it defines
    and those it reads. With ``backward`` (emit/kernel_grad.py) the launch goes through
    ``launch_with_grad``, so that autograd differentiates it with that function."""
    tensors = args
    target = ", ".join(outs) + ("," if len(outs) == 1 and len(text.kernel.results) > 1 else "")
    launch = (
        f"launch_with_grad({text.launcher}, {backward}, {', '.join(tensors)})"
        if backward
        else f"{text.launcher}({', '.join(tensors)})"
    )
    lines = [
        f"if kernels_ready({text.key!r}, {', '.join(tensors)}):",
        f"    {target} = {launch}",
        "else:",
    ] + ["    " + b for b in body]
    stored, loaded = tiles.stored_and_loaded(lines)
    return tiles.indented(lines), stored, loaded - stored


def kernel_args(call_args: list[Any], kernel: Any) -> dict[str, Any]:
    """The scalar arguments a call passes to the kernel's scalar parameters (by position)."""
    out = {}
    for p, a in zip(kernel.params, call_args):
        if not isinstance(a, str) and a is not None:
            out[p.name] = a
    return out
