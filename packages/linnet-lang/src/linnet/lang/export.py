"""Export a lowered entry to ONNX or StableHLO: the functions behind `linnet onnx`,
`linnet stablehlo` and the runtimes' ``model.export_onnx`` / ``model.export_stablehlo``
(each runtime lowers the entry with its config and passes its weights here).

    linnet onnx examples/llama/llama.linnet --entry decode --config toy --set B=1 \\
        --input token=1 --input pos=1 -o decode.onnx
    linnet stablehlo examples/llama/llama.linnet --entry prefill --config toy --set B=1 \\
        --input tokens=1,8 -o prefill.mlir

>>> from linnet.lang.export import export_onnx, export_stablehlo       # doctest: +SKIP
>>> export_onnx(graph, weights, "decode.onnx")                         # doctest: +SKIP
[PosixPath('decode.onnx')]
"""

from __future__ import annotations

import copy
import json
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import Frame
from linnet.lang.check.evaluate import Evaluator, Fail
from linnet.lang.check.lowering import find_model
from linnet.lang.diagnostics.core import Diagnostic, LinnetError

# The sizes as polynomials of the dims, and which attributes may be one: the ONNX emitter's
# (a pure-Python module; it imports onnx_ir only when it emits).
from linnet.lang.emit.onnx_rules import SYMBOLIC_ATTRIBUTES
from linnet.lang.emit.stablehlo import argument_order
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.bounds import check_static
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.poly import Poly, SymInt, poly_add, poly_mul, poly_text


def export_onnx(
    graph: Graph,
    params: Mapping[str, Any] | None,
    path: str | Path,
    sources: Mapping[str, str] | None = None,
    check: bool = True,
    external_threshold: int | None = None,
) -> list[Path]:
    """Write ``graph`` as an ONNX model to ``path`` (weights as initializers, as external
    data ``<path>.data`` above ``external_threshold`` bytes, 1 GiB by default); checked with
    ``onnx.checker`` (full check) unless ``check=False``. Returns the files written. Shapes
    that index past a state whatever the values (a prompt longer than the cache) are E0782
    before anything is written (for a graph of :func:`symbolic_dims`, check the concrete
    graph before: :func:`linnet.lang.passes.bounds.check_static`); the model's last output,
    ``linnet.valid``, checks the values (:mod:`linnet.lang.export_checks`).

    >>> export_onnx(graph, {"w": np.ones((4, 4), "float32")}, "m.onnx")  # doctest: +SKIP
    [PosixPath('m.onnx')]
    """
    from linnet.lang.emit import onnx as emit

    if not symbolic_dims_of(graph):  # (a symbolic graph's sizes are the fit's, not the
        check_static(graph, graph.entry)  # caller's: they checked theirs, as _export_graph)
    model = emit.emit_onnx(graph, params, sources)
    if check:
        emit.check(model)
    threshold = emit.EXTERNAL_THRESHOLD if external_threshold is None else external_threshold
    return emit.save_onnx(model, path, threshold)


def export_stablehlo(
    graph: Graph,
    path: str | Path | None,
    sources: Mapping[str, str] | None = None,
    verify: bool = False,
    portable: bool | str = False,
) -> str:
    """StableHLO text for ``graph``, written to ``path`` (if given); ``verify=True`` parses
    and verifies it with jaxlib first. ``@main`` takes the inputs, the states, then the
    parameters (:func:`linnet.lang.emit.stablehlo.argument_order`); it returns the outputs,
    the states, then ``linnet.valid``. Shapes that index past a state are E0782, as in
    :func:`export_onnx`.

    ``portable``: a StableHLO version (``"1.0.0"``), or True for the oldest the installed
    jaxlib writes: ``path`` gets the portable artifact (VHLO bytecode, written by StableHLO's
    serializer) of the text returned, which holds StableHLO operations only
    (:mod:`linnet.lang.emit.stablehlo_portable`; a version jaxlib does not write is E0946).

    >>> text = export_stablehlo(graph, "prefill.mlir")                  # doctest: +SKIP
    >>> text = export_stablehlo(graph, "prefill.mlirbc", portable="1.0.0")  # doctest: +SKIP
    """
    from linnet.lang.emit import stablehlo as emit

    if portable is not False:
        text, artifact = portable_stablehlo(
            graph, None if portable is True else str(portable), sources, verify
        )
        if path is not None:
            Path(path).write_bytes(artifact)
        return text
    check_static(graph, graph.entry)  # E0782: shapes that index past a state, as model.run
    text = emit.emit_stablehlo(graph, sources)
    if verify:
        emit.verify(text)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def portable_stablehlo(
    graph: Graph,
    version: str | None,
    sources: Mapping[str, str] | None = None,
    verify: bool = False,
) -> tuple[str, bytes]:
    """The portable text of ``graph`` for StableHLO ``version`` (None: the oldest the
    installed jaxlib writes; E0946 for one it does not) and its portable artifact, as
    :func:`export_stablehlo` writes them (``linnet stablehlo --portable``).

    >>> text, artifact = portable_stablehlo(graph, "1.0.0")              # doctest: +SKIP
    """
    from linnet.lang.emit import stablehlo as emit
    from linnet.lang.emit import stablehlo_portable

    check_static(graph, graph.entry)
    target = stablehlo_portable.target(version)
    text = emit.emit_stablehlo(graph, sources, portable=target)
    if verify:
        emit.verify(text)
    return text, stablehlo_portable.serialize(text, target)


# ---------------------------------------------------------------- safetensors, with numpy
_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def read_safetensors(path: str | Path) -> dict[str, Any]:
    """Every tensor of a safetensors file as a numpy array (memory-mapped, bf16 through
    ml_dtypes), for the CLI's ``--weights`` (the runtimes pass their own tensors)."""
    import numpy as np

    p = Path(path)
    with p.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    data = np.memmap(p, dtype=np.uint8, mode="r", offset=8 + size)
    out: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        kind = _ST_DTYPES.get(info["dtype"])
        if kind is None:
            raise LinnetError(
                Diagnostic(
                    "E0931",
                    f"tensor `{name}` of `{path}` is {info['dtype']}, which export does "
                    "not support",
                    help="convert the checkpoint to f32, f16 or bf16",
                )
            )
        if kind == "bfloat16":
            import ml_dtypes

            dt: Any = ml_dtypes.bfloat16
        else:
            dt = np.dtype(kind)
        lo, hi = info["data_offsets"]
        out[name] = data[lo:hi].view(dt).reshape(info["shape"])
    return out


# ---------------------------------------------------------------- what every runtime's
# `model.export_*` shares (E0800, and the sources for the line comments)
def export_target(path: str | Path) -> Path:
    """``path`` as a Path, or E0800 before any work when it cannot be written: no such
    folder, or a folder.

    >>> export_target("decode.onnx").name
    'decode.onnx'
    """
    p = Path(path)
    if p.is_dir():
        raise LinnetError(
            Diagnostic(
                "E0800",
                f"cannot export to `{path}`: it is a folder",
                help="name a file inside it, such as `decode.onnx`",
            )
        )
    if not p.parent.is_dir():
        raise LinnetError(
            Diagnostic(
                "E0800",
                f"cannot export to `{path}`: folder `{p.parent}` does not exist",
                help=f"create it first (`mkdir -p {p.parent}`) or write elsewhere",
            )
        )
    return p


def unwritable(path: Path, exc: OSError) -> LinnetError:
    """E0800 for a write that failed (permissions, a full disk)."""
    return LinnetError(
        Diagnostic(
            "E0800",
            f"cannot export to `{path}`: {exc.strerror or exc}",
            help="check the folder's permissions and free space",
        )
    )


def program_sources(program: Any) -> dict[str, str]:
    """Every module's text by file name: what the exporters' source-line comments read."""
    return {m.source.name: m.source.text for m in program.modules.values()}


@dataclass(frozen=True)
class EntryExport:
    """What a runtime gives the one export driver (:func:`export_entry_onnx`,
    :func:`export_entry_stablehlo`) for one entry of its model: the rest is the same on
    every runtime. The callables run only after the target path passed E0800.

    ``checked()``: the graph ``model.run`` would call for the inputs, after the same input
    checks; ``shapes()``: each input's shape by parameter name; ``relower(inputs, config)``:
    the entry lowered again as the model lowers it (its weights' shapes), for symbolic dims.

    >>> EntryExport(program, config, params, checked, shapes, relower)  # doctest: +SKIP
    """

    program: Any
    config: Mapping[str, Any]
    params: Mapping[str, Any]
    checked: Callable[[], Graph]
    shapes: Callable[[], Mapping[str, list[int]]]
    relower: Callable[[Any, Any], Graph]


def export_entry_onnx(
    entry: EntryExport,
    path: str | Path,
    check: bool = True,
    external_threshold: int | None = None,
    dynamic: Any = None,
) -> list[Path]:
    """A runtime's ``model.export_onnx``: the entry as the model runs it, its ``dynamic``
    dims made symbolic (:func:`symbolic_graph`), written with the model's own tensors as
    the weights; E0800 for a path it cannot write (before any work where it can tell).

    >>> export_entry_onnx(EntryExport(...), "decode.onnx")              # doctest: +SKIP
    [PosixPath('decode.onnx')]
    """
    target = export_target(path)
    graph = symbolic_graph(
        entry.checked(), entry.program, entry.shapes(), entry.config, entry.relower, dynamic
    )
    params = {p: entry.params[p] for p in graph.parameters}
    try:
        return export_onnx(
            graph, params, target, program_sources(entry.program), check, external_threshold
        )
    except OSError as exc:
        raise unwritable(target, exc) from None


def export_entry_stablehlo(entry: EntryExport, path: str | Path, verify: bool = False) -> list[str]:
    """A runtime's ``model.export_stablehlo``: the entry as the model runs it, written as
    StableHLO text; returns the order of the module's arguments (inputs, then weights).
    E0800 for a path it cannot write.

    >>> export_entry_stablehlo(EntryExport(...), "prefill.mlir")        # doctest: +SKIP
    ['%tokens', 'embed.weight', ...]
    """
    target = export_target(path)
    graph = entry.checked()
    try:
        export_stablehlo(graph, target, program_sources(entry.program), verify)
    except OSError as exc:
        raise unwritable(target, exc) from None
    return argument_order(graph)


# ---------------------------------------------------------------- symbolic dims (ONNX)
# An entry is lowered for concrete shapes. To export it with some dims symbolic (the batch B,
# the prompt length L), it is lowered again at other sizes of those dims; where the graphs
# have the same steps and every number that differs is a polynomial in the dims (a reshape
# to [B * L, D], an iota of length L, a slice to L - 1), those numbers become `SymInt`s,
# which the ONNX emitter computes from the inputs' shapes at run time.
DEFAULT_DYNAMIC = ("B", "L")
"""The dims made symbolic when the caller names none (each only where the graph allows)."""


def symbolic_dims_of(graph: Graph) -> list[str]:
    """The dims a graph made by :func:`symbolic_dims` has symbolic (in order)."""
    return list(getattr(graph, "symbolic", {}))


Relower = Any  # Callable[[dict[str, int]], Graph]: the entry lowered with these dims changed


def relowering(
    program: Any,
    entry: str,
    inputs: Mapping[str, Any],
    config: Mapping[str, Any],
    lower_fn: Any,
    model: str | None = None,
) -> Relower:
    """A function lowering ``entry`` again with some dims changed: ``relower({"B": 3})``.
    The inputs' shapes follow from their declared types (``tokens: Tensor[B, L; i32]``);
    the dims go in the config. ``lower_fn(inputs, config)`` lowers (the caller's way: with
    its weights, or the gradient graph).

    >>> relower = relowering(program, "prefill", {"tokens": [1, 6]}, config,
    ...                      lambda i, c: lower(program, "prefill", i, c))  # doctest: +SKIP
    >>> relower({"B": 2, "L": 5}).inputs                                 # doctest: +SKIP
    """
    decl = find_model(program, model)
    method = decl.method(entry)
    module = decl.module
    assert method is not None and module is not None  # the graph was lowered from them

    def relower(dims: dict[str, int], base: Mapping[str, int]) -> Graph:
        env: dict[str, Any] = {k: Dim.const(v) for k, v in {**base, **dims}.items()}
        ev = Evaluator(program, Builder(Graph(entry=entry, model=decl.name)), dict(config))
        frame = Frame(module, env)
        shapes: dict[str, Any] = {}
        for p in method.params:
            given = inputs[p.name]
            if not isinstance(p.type, A.TensorType):
                shapes[p.name] = given
                continue
            try:
                sizes = [ev.eval_dim(d, frame).value for d in p.type.dims]
            except Fail as f:  # a size the new dims do not determine: lowering's own error
                raise LinnetError(f.diag) from None
            old = list(given[0] if isinstance(given, tuple) else given)
            new = [int(s) if s is not None else o for s, o in zip(sizes, old)]
            shapes[p.name] = (new, given[1]) if isinstance(given, tuple) else new
        return lower_fn(shapes, {**config, **dims})

    return relower


def symbolic_graph(
    graph: Graph,
    program: Any,
    inputs: Mapping[str, Any],
    config: Mapping[str, Any],
    lower_fn: Any,
    dynamic: Any = None,
) -> Graph:
    """:func:`symbolic_dims` for a graph ``lower_fn(inputs, config)`` lowered: what the
    runtimes' ``model.export_onnx(..., dynamic=...)`` call, each with its own lowering.

    >>> g = symbolic_graph(graph, program, {"tokens": [1, 6]}, config,
    ...                    lambda i, c: lower(program, "prefill", i, c), "B,L")  # doctest: +SKIP
    """
    if dynamic is not None and not isinstance(dynamic, str | list | tuple):
        raise LinnetError(
            Diagnostic(
                "E0935",
                f'`dynamic` is a list of dim names or a string such as "B,L", got '
                f"{type(dynamic).__name__} {dynamic!r}",
                help='pass dynamic=["B", "L"], dynamic="none" (all concrete) or leave it out '
                "(B and L where the graph allows)",
            )
        )
    relower = relowering(program, graph.entry, inputs, config, lower_fn, graph.model)
    return symbolic_dims(graph, relower, dynamic)


def symbolic_dims(graph: Graph, relower: Relower, dynamic: Any = None) -> Graph:
    """``graph`` with the sizes that depend on the ``dynamic`` dims made :class:`SymInt`s,
    for :func:`linnet.lang.emit.onnx.emit_onnx` (``graph.symbolic``: each dim's value).

    ``dynamic``: the dim names (a list, or ``"B,L"``); ``None`` tries
    :data:`DEFAULT_DYNAMIC` (each where the graph allows, else it stays concrete); ``[]`` or
    ``"none"`` keeps every dim concrete. A named dim the entry lacks is E0935; one the graph
    changes structure with is E0936; one that other sizes cannot be lowered for (weights or a
    `where` clause fix it) E0937; one no input's or state's axis measures E0938.

    >>> g = symbolic_dims(graph, relower, ["B", "L"])                    # doctest: +SKIP
    >>> g.values[g.inputs[0]].shape                                      # doctest: +SKIP
    (<B=2>, <L=5>)
    """
    if isinstance(dynamic, str):
        dynamic = (
            []
            if dynamic.strip().lower() == "none"
            else [d.strip() for d in dynamic.split(",") if d.strip()]
        )
    if dynamic is None:
        chosen: list[str] = []
        result = graph
        for name in DEFAULT_DYNAMIC:
            if name not in graph.dims:
                continue
            try:
                result = _fit(graph, relower, [*chosen, name])
            except LinnetError:
                continue  # only the default: this dim stays concrete
            chosen.append(name)
        return result
    names = list(dict.fromkeys(dynamic))
    for name in names:
        if name not in graph.dims:
            known = ", ".join(sorted(graph.dims)) or "none"
            raise LinnetError(
                Diagnostic(
                    "E0935",
                    f"`{graph.model}.{graph.entry}` has no dim `{name}` to make symbolic",
                    help=f"its dims: {known} (the batch is usually `B`, a prompt's length `L`)",
                )
            )
    return _fit(graph, relower, names) if names else graph


def _points(
    graph: Graph, names: list[str], skip: int
) -> tuple[dict[str, int], list[dict], dict, dict]:
    """The sizes lowered at: per dim a start of at least 2 (size 1 broadcasts), every corner
    of start and start + 1, and check points at start + 2 and far beyond every number of
    the graph (a polynomial of degree at most one in each dim is fixed by the corners; the
    checks catch any other, and a branch on the size between them). No size is a
    number the graph has already (HD / 2 = 8 would let lowering share an iota of length L = 8
    with the frequencies' one), nor another dim's; ``skip`` moves past that many more."""
    taken: set[int] = set()
    for where, _, nums in _structure(graph):
        if where != "calls":  # step indices are no sizes
            taken.update(int(n) for n in nums if isinstance(n, int) and not isinstance(n, bool))
    start: dict[str, int] = {}
    for d in names:
        n = max(graph.dims[d], 2) + skip
        while any(n + i in taken for i in range(3)):
            n += 1
        start[d] = n
        taken.update(n + i for i in range(3))
    corners = []
    for mask in range(1 << len(names)):
        corners.append({d: start[d] + (mask >> i & 1) for i, d in enumerate(names)})
    top = 2 * max(taken, default=8) + 1
    far = {d: top + 2 * i for i, d in enumerate(names)}
    return start, corners, {d: start[d] + 2 for d in names}, far


def _lowered(graph: Graph, relower: Relower, dims: dict[str, int], names: list[str]) -> Graph:
    try:
        return relower(dims, graph.dims)
    except LinnetError as err:
        first = err.diagnostics[0]
        at = ", ".join(f"{k} = {v}" for k, v in dims.items())
        raise LinnetError(
            Diagnostic(
                "E0937",
                f"cannot make {_names(names)} of `{graph.model}.{graph.entry}` symbolic: "
                f"lowering it at {at} fails ({first.code}: {first.message})",
                help="a dim that weights or a `where` clause fix cannot vary; keep it concrete "
                "(leave it out of --dynamic), or export from smaller example sizes",
            )
        ) from None


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _leaves(x: Any, out: list) -> Any:
    """A value's numbers in order (``out``) and its shape with each number as None."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int | float):
        out.append(x)
        return None
    if isinstance(x, list | tuple):
        return [_leaves(v, out) for v in x]
    if isinstance(x, dict):
        return {k: _leaves(v, out) for k, v in sorted(x.items())}
    return repr(x)


def _rebuild(x: Any, it: Any) -> Any:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int | float):
        return next(it)
    if isinstance(x, tuple):
        return tuple(_rebuild(v, it) for v in x)
    if isinstance(x, list):
        return [_rebuild(v, it) for v in x]
    if isinstance(x, dict):
        return {k: _rebuild(x[k], it) for k in x}
    return x


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _structure(g: Graph) -> list[tuple[str, Any, list]]:
    """Every place of a graph, as (where, its form with numbers blanked, its numbers)."""
    out: list[tuple[str, Any, list]] = []

    def add(where: str, x: Any) -> None:
        nums: list = []
        form = _leaves(x, nums)
        out.append((where, form, nums))

    add("inputs", (g.inputs, g.outputs))
    for i, s in enumerate(g.steps):
        add(f"s{i}", (s.op, s.operands, s.results))
        for k in sorted(s.attributes):
            add(f"s{i}.{k}", s.attributes[k])
    for c in g.calls:
        add("calls", (c.callee, c.kind, c.start, c.stop, c.path))
    for table in ("values", "states", "parameters"):
        vts = getattr(g, table)
        add(table, sorted(vts))
        for k in sorted(vts):
            add(f"{table}:{k}", (vts[k].dtype, list(vts[k].shape)))
    return out


def _fit(graph: Graph, relower: Relower, names: list[str]) -> Graph:
    """Lower at the corners and the check point; fit each number that differs. A graph that
    changes structure is tried once more at other sizes (sizes that coincide with another
    number of the graph let lowering merge steps), then E0936."""
    try:
        return _fit_at(graph, relower, names, 0)
    except LinnetError as err:
        if err.diagnostics[0].code != "E0936":
            raise
        return _fit_at(graph, relower, names, 7)


def _fit_at(graph: Graph, relower: Relower, names: list[str], skip: int) -> Graph:

    start, corners, check_at, far = _points(graph, names, skip)
    graphs = [_lowered(graph, relower, c, names) for c in corners]
    checks = [check_at]
    graphs.append(_lowered(graph, relower, check_at, names))
    try:  # far sizes catch a branch on the dim (`if L > 16`) that the near ones do not cross
        graphs.append(relower(far, graph.dims))
        checks.append(far)
    except LinnetError:
        pass  # sizes that large are not allowed (a `where` clause, a cache of S positions)
    forms = [_structure(g) for g in graphs]
    base = graphs[0]
    n = len(corners)
    for form, dims in zip(forms[1:], [*corners[1:], *checks]):
        if len(form) != len(forms[0]) or any(
            a[0] != b[0] or a[1] != b[1] or len(a[2]) != len(b[2]) for a, b in zip(forms[0], form)
        ):
            bad = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(forms[0], form))
                    if a[0] != b[0] or a[1] != b[1] or len(a[2]) != len(b[2])
                ),
                min(len(form), len(forms[0])),
            )
            changed = [d for d in names if dims[d] != start[d]]
            raise _structure_error(graph, base, bad, forms[0], changed, dims)
    fitted: dict[int, list] = {}
    for k, (where, _, nums) in enumerate(forms[0]):
        row = []
        for j, v0 in enumerate(nums):
            values = [f[k][2][j] for f in forms]
            if all(_same(v, v0) for v in values):
                row.append(v0)
                continue
            step_at = re.fullmatch(r"s(\d+)\.(\w+)", where)
            if step_at is not None:
                i = int(step_at.group(1))
                if step_at.group(2) not in SYMBOLIC_ATTRIBUTES.get(base.steps[i].op, ()):
                    raise _attribute_error(graph, base, i, step_at.group(2), names)
            elif where.startswith("parameters:"):
                raise LinnetError(
                    Diagnostic(
                        "E0937",
                        f"cannot make {_names(names)} of `{graph.model}.{graph.entry}` "
                        f"symbolic: the shape of parameter `{where.split(':', 1)[1]}` "
                        "depends on it",
                        help="a weight's shape is fixed when it is exported: keep this dim "
                        "concrete (leave it out of --dynamic)",
                    )
                )
            elif not where.startswith(("values:", "states:")):
                raise _structure_error(graph, base, k, forms[0], names, check_at)
            poly = _solve(values[:n], corners, names, start)
            if poly is None or any(_value(poly, at) != v for at, v in zip(checks, values[n:])):
                raise _attribute_error(
                    graph,
                    base,
                    int(step_at.group(1)) if step_at else None,
                    step_at.group(2) if step_at else where,
                    names,
                )
            row.append(SymInt(int(v0), poly))
        fitted[k] = row
    out = copy.deepcopy(base)
    places = {k: iter(row) for k, row in fitted.items()}
    index = {where: k for k, (where, _, _) in enumerate(forms[0])}
    for i, s in enumerate(out.steps):
        for key in s.attributes:
            s.attributes[key] = _rebuild(s.attributes[key], places[index[f"s{i}.{key}"]])
    for table in ("values", "states", "parameters"):
        vts = getattr(out, table)
        for k in vts:
            it = places[index[f"{table}:{k}"]]
            vts[k] = type(vts[k])(tuple(_rebuild(list(vts[k].shape), it)), vts[k].dtype)
    out.symbolic = {d: start[d] for d in names}  # type: ignore[attr-defined]
    _check_measured(out, names)
    return out


def _solve(values: list, corners: list[dict], names: list[str], start: dict) -> Poly | None:
    """The polynomial of degree at most one in each dim through ``values`` at the corners
    (Möbius inversion over the corners, then expanded about zero); None when a coefficient is
    not a whole number (a size is always one; a float constant such as `L as f32` too)."""
    k = len(names)
    poly: Poly = ()
    for s in range(1 << k):
        g = 0.0
        t = s
        while True:  # every subset t of s
            sign = -1 if bin(s ^ t).count("1") % 2 else 1
            g += sign * values[t]
            if t == 0:
                break
            t = (t - 1) & s
        if g != int(g):
            return None
        term: Poly = (((), int(g)),) if g else ()
        for i, d in enumerate(names):
            if s >> i & 1:
                term = poly_mul(term, (((d,), 1), ((), -start[d])) if start[d] else (((d,), 1),))
        poly = poly_add(poly, term)
    return poly


def _value(poly: Poly, dims: Mapping[str, int]) -> int:
    total = 0
    for mono, c in poly:
        v = c
        for d in mono:
            v *= dims[d]
        total += v
    return total


def _structure_error(
    graph: Graph, base: Graph, k: int, form: list, changed: list[str], dims: dict[str, int]
) -> LinnetError:
    where = form[k][0] if k < len(form) else "the end of the graph"
    step = None
    if where.startswith("s") and where[1:].split(".")[0].isdigit():
        i = int(where[1:].split(".")[0])
        step = f"step {i} ({base.steps[i].op}) at {base.steps[i].loc or '?'}"
    at = step or {
        "inputs": "its inputs or outputs",
        "calls": "its calls (a loop over the dim)",
    }.get(where.split(":")[0], where)
    sizes = ", ".join(f"{d} = {dims[d]}" for d in changed)
    return LinnetError(
        Diagnostic(
            "E0936",
            f"cannot make {_names(changed)} of `{graph.model}.{graph.entry}` symbolic: "
            f"the graph changes structure with it ({at} differs at {sizes})",
            help="ONNX can make a dim symbolic only where the steps stay the same for every size; "
            "keep this one concrete (leave it out of --dynamic) and export once per size",
        )
    )


def _attribute_error(
    graph: Graph, base: Graph, i: int | None, what: str, names: list[str]
) -> LinnetError:
    if i is not None:
        s = base.steps[i]
        key = what.split(".", 1)[-1]
        at = f"attribute `{key}` of step {i} ({s.op}) at {s.loc or '?'}"
    else:
        at = f"`{what}`"
    return LinnetError(
        Diagnostic(
            "E0936",
            f"cannot make {_names(names)} of `{graph.model}.{graph.entry}` symbolic: "
            f"{at} changes with it in a way ONNX cannot compute from the inputs' shapes",
            help="only sizes, reshape and broadcast targets, iota lengths, slice bounds and "
            "constants that are whole-number polynomials of the dims can be symbolic; keep "
            "this dim concrete (leave it out of --dynamic) and export once per size",
        )
    )


def _check_measured(graph: Graph, names: list[str]) -> None:
    """E0938 unless an input's or a state's axis has each dim as its size (ONNX reads it
    there, with `Shape`)."""
    have = set()
    for vt in [*(graph.values[r] for r in graph.inputs), *graph.states.values()]:
        for d in vt.shape:
            if (
                isinstance(d, SymInt)
                and len(d.poly) == 1
                and d.poly[0][1] == 1
                and len(d.poly[0][0]) == 1
            ):
                have.add(d.poly[0][0][0])
    for name in names:
        if name not in have:
            axes = sorted(
                {
                    poly_text(d.poly)
                    for r in graph.inputs
                    for d in graph.values[r].shape
                    if isinstance(d, SymInt) and any(name in m for m, _ in d.poly)
                }
            )
            seen = f" (its inputs' axes have sizes {', '.join(axes)})" if axes else ""
            raise LinnetError(
                Diagnostic(
                    "E0938",
                    f"cannot make `{name}` of `{graph.model}.{graph.entry}` symbolic: no "
                    f"input or state has an axis of size `{name}`{seen}",
                    help=f"the exported model reads `{name}` from an input's shape; give the entry "
                    f"an input with an axis of exactly `{name}`, or keep it concrete",
                )
            )
