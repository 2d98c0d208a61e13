"""Checking an exported model's inputs: its ``linnet.valid`` output, and the runtimes' coded
error when it is false (docs/export.md, "Checking inputs").

An ONNX or StableHLO model cannot raise. Every export therefore returns one more output
after the states, ``linnet.valid`` (a bool scalar, :mod:`linnet.lang.ir.validity`): false
when an index the model uses is outside its axis, where the runtimes would have refused the
call (E0780: a token id past the vocabulary, a negative position; E0782: a prompt longer than
the cache; E0781: an index computed out of range). The other outputs are then meaningless
(indices are clamped into their axes, so nothing is read or written outside a tensor), and
the call is pure: the states passed in are untouched, so a caller that drops this call's
outputs loses nothing.

:func:`check_outputs` raises the runtimes' error for a false flag, from what the model keeps
in its metadata (``linnet.valid``: :func:`describe`):

>>> import onnxruntime as ort                                            # doctest: +SKIP
>>> sess = ort.InferenceSession("decode.onnx")                           # doctest: +SKIP
>>> outs = sess.run(None, feeds)                                         # doctest: +SKIP
>>> check_outputs(sess, feeds, outs)                                     # doctest: +SKIP
Traceback (most recent call last):
linnet.lang.diagnostics.core.LinnetError: error[E0780]: input `token` of `decode` has -1 ...
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.host.inputs import range_error_of, range_parts
from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.ir.validity import index_uses
from linnet.lang.passes.bounds import input_bounds
from linnet.lang.tensors.poly import poly_text

OUTPUT = "linnet.valid"
"""The flag's output name (ONNX) and the metadata key (ONNX metadata, a StableHLO module
attribute) of what it checks."""


# ---------------------------------------------------------------- at export
def describe(graph: Graph) -> dict[str, Any]:
    """What an exported model keeps to explain a false flag: each index input's range (as
    :func:`linnet.lang.host.inputs.range_parts`), the inputs' shapes, the symbolic dims, and the
    axes its indices reach. A range that changes with a symbolic dim (a start position
    before a prompt of L tokens) is left out: the flag still checks it.

    >>> describe(Graph("e", "m"))["inputs"]
    []
    """
    bounds = input_bounds(graph)
    sizes: dict[str, int] = getattr(graph, "symbolic", None) or {}  # linnet.lang.export's
    symbolic = list(sizes)
    others = (
        [input_bounds(_at(graph, {d: v + 1 + k for k, (d, v) in enumerate(sizes.items())}))]
        if symbolic
        else []
    )
    kept = []
    for name, r in bounds.inputs.items():
        if all(
            o.inputs.get(name) is not None
            and (o.inputs[name].lo, o.inputs[name].hi) == (r.lo, r.hi)
            for o in others
        ):
            kept.append(range_parts(graph, r))
    reached = []
    for use in index_uses(graph):
        text = _reach(graph, use.target, use.axis, use.size)
        if text not in reached:
            reached.append(text)
    return {
        "entry": graph.entry,
        "model": graph.model,
        "output": OUTPUT,
        "inputs": kept,
        "shapes": {r.lstrip("%"): [_text(d) for d in graph.values[r].shape] for r in graph.inputs},
        "symbolic": symbolic,
        "indexes": reached[:8],
    }


def _text(size: Any) -> Any:
    """A size for the metadata: an int, or a symbolic size's name (``L``, ``B*L``)."""
    poly = getattr(size, "poly", None)
    if poly is None:
        return int(size)
    return poly_text(poly)


def _reach(graph: Graph, target: str, axis: int, size: int) -> str:
    kind = (
        "state"
        if target[1:] in graph.states
        else "parameter"
        if target.startswith("@")
        else "value"
    )
    return f"axis {axis} (size {_text(size)}) of {kind} `{target.lstrip('@%')}`"


def _at(graph: Graph, dims: Mapping[str, int]) -> Graph:
    """``graph`` with every symbolic size (a SymInt of linnet.lang.export) evaluated at
    ``dims``: what input_bounds reads to see whether a range moves with a dim."""

    def value(x: Any) -> Any:
        poly = getattr(x, "poly", None)
        if poly is not None:
            total = 0
            for mono, c in poly:
                for d in mono:
                    c *= dims[d]
                total += c
            return total
        if isinstance(x, list | tuple):
            return type(x)(value(v) for v in x)
        if isinstance(x, dict):
            return {k: value(v) for k, v in x.items()}
        return x

    import copy

    out = copy.copy(graph)
    out.steps = [copy.copy(s) for s in graph.steps]
    for s in out.steps:
        s.attributes = value(s.attributes)
    out.values = {
        k: ValueType(tuple(value(list(v.shape))), v.dtype) for k, v in graph.values.items()
    }
    for table in ("states", "parameters"):
        setattr(
            out,
            table,
            {
                k: ValueType(tuple(value(list(v.shape))), v.dtype)
                for k, v in getattr(graph, table).items()
            },
        )
    return out


def mlir_attribute(description: Mapping[str, Any]) -> str:
    """The StableHLO module attribute that keeps :func:`describe`'s data: a JSON string.

    >>> mlir_attribute({"a": 1})
    'linnet.valid = "{\\\\22a\\\\22: 1}"'
    """
    text = json.dumps(description, separators=(", ", ": "))
    escaped = "".join(f"\\{ord(c):02X}" if c in '"\\' or ord(c) < 32 else c for c in text)
    return f'{OUTPUT} = "{escaped}"'


# ---------------------------------------------------------------- at run time
def description_of(model: Any) -> dict[str, Any]:
    """What an exported model says its ``linnet.valid`` checks: ``model`` is an
    onnxruntime ``InferenceSession``, an ``onnx.ModelProto``, the path of a ``.onnx`` or
    ``.mlir`` file, StableHLO text, or the description itself. E0806 when none is found."""
    if isinstance(model, Mapping):
        return dict(model)
    meta = None
    if hasattr(model, "get_modelmeta"):  # onnxruntime.InferenceSession
        meta = model.get_modelmeta().custom_metadata_map.get(OUTPUT)
    elif hasattr(model, "metadata_props"):  # onnx.ModelProto
        meta = next((p.value for p in model.metadata_props if p.key == OUTPUT), None)
    elif isinstance(model, Path) or (
        isinstance(model, str)
        and "\n" not in model
        and not model.lstrip().startswith(("module", "//"))
    ):
        path = Path(model)
        if path.suffix == ".onnx":
            import onnx

            proto = onnx.load(str(path), load_external_data=False)
            meta = next((p.value for p in proto.metadata_props if p.key == OUTPUT), None)
        else:
            meta = _from_mlir(path.read_text(encoding="utf-8"))
    elif isinstance(model, str):
        meta = _from_mlir(model)
    if meta is None:
        raise LinnetError(
            Diagnostic(
                "E0945",
                f"no `{OUTPUT}` description in {_what(model)}",
                help="export the model with this linnet-lang (`linnet onnx`, `linnet stablehlo`, "
                "`model.export_onnx`): its last output is the flag this checks",
            )
        )
    return json.loads(meta) if isinstance(meta, str) else dict(meta)


def _what(model: Any) -> str:
    return (
        f"`{model}`"
        if isinstance(model, str | Path) and len(str(model)) < 200
        else type(model).__name__
    )


def _from_mlir(text: str) -> str | None:
    found = re.search(re.escape(OUTPUT) + r' = "((?:[^"\\]|\\.)*)"', text)
    if found is None:
        return None
    return re.sub(
        r"\\([0-9A-Fa-f]{2})|\\(.)",
        lambda m: chr(int(m.group(1), 16)) if m.group(1) else m.group(2),
        found.group(1),
    )


def check_outputs(model: Any, inputs: Mapping[str, Any], outputs: Sequence[Any]) -> None:
    """Raise the runtimes' coded error when an exported model's ``linnet.valid`` output
    (the last of ``outputs``) is false: E0780 naming the input, its first bad index and
    value and the range (as ``model.run`` would have), E0782 when the inputs' shapes make an
    index leave its axis (a prompt longer than the cache), E0781 for an index the model
    computed out of range. ``model``: see :func:`description_of`; ``inputs``: the arrays
    fed, by name.

    >>> check_outputs({"entry": "e", "inputs": []}, {}, [True])   # valid: nothing raised
    """
    import numpy as np

    if not outputs:
        raise LinnetError(
            Diagnostic(
                "E0945", "no outputs to check: pass every output of the call (the flag is the last)"
            )
        )
    flag = np.asarray(outputs[-1])
    if flag.dtype != np.bool_ or flag.shape != ():
        raise LinnetError(
            Diagnostic(
                "E0945",
                f"the last output is {flag.dtype}{list(flag.shape)}, not the bool scalar "
                f"`{OUTPUT}`",
                help="pass every output of the call, in order (onnxruntime: sess.run(None, ...))",
            )
        )
    if bool(flag):
        return
    desc = description_of(model)
    entry = desc.get("entry", "the entry")
    for parts in desc.get("inputs", []):
        value = inputs.get(parts["input"])
        if value is None:
            continue
        arr = np.asarray(value)
        if arr.size and (int(arr.min()) < parts["lo"] or int(arr.max()) >= parts["hi"]):
            raise range_error_of(entry, parts, arr.reshape(-1).astype(np.int64).tolist(), arr.shape)
    reached = "; ".join(desc.get("indexes", [])) or "an axis"
    shapes = {k: list(np.shape(v)) for k, v in inputs.items()}
    moved = [
        f"`{k}` is {shapes[k]}"
        for k, want in desc.get("shapes", {}).items()
        if k in shapes and any(isinstance(w, str) for w in want)
    ]
    if moved:  # symbolic sizes: the shapes (with the values) left an axis
        raise LinnetError(
            Diagnostic(
                "E0782",
                f"the inputs of `{entry}` (input {', '.join(moved)}) make the exported "
                f"model index outside one of: {reached}",
                help="an input is longer than the axis it indexes (a prompt longer than the KV "
                "cache), or a position plus the prompt's length passes its end; shorten "
                "it, or export the model with a larger size in the config",
            )
        )
    raise LinnetError(
        Diagnostic(
            "E0781",
            f"an index computed in `{entry}` is out of range: the exported model "
            f"indexes outside one of: {reached}, for these inputs",
            help="the entry reads or writes outside a tensor for these inputs or weights; the "
            "call's outputs are meaningless: keep the states you passed in",
        )
    )
