"""``model.export_onnx`` and ``model.export_stablehlo`` of the JAX runtime: the entry lowered
as the model runs it (its config, the dims its weights fixed), then a thin call into
linnet-lang's exporters (:mod:`linnet.lang.export`), with the model's own arrays as the
weights. The same as linnet-runtime-torch's ``linnet.torch.export`` (which this package does
not import: it never depends on torch), with the same code, E0800, for a path it cannot write.

>>> model = load("examples/llama/llama.linnet", config="toy")            # doctest: +SKIP
>>> model.export_onnx("decode", [token, pos], "decode.onnx")            # doctest: +SKIP
[PosixPath('decode.onnx')]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linnet.lang.export import export_target, program_sources, unwritable
from linnet.lang.ir.graph import Graph

from .inputs import check_inputs
from .lowering import lower_entry


def _checked(model: Any, entry: str, inputs: Any) -> Graph:
    """The graph ``model.run`` would call for ``inputs``, after the same input checks."""
    fn = model.function(entry)
    given = fn._ordered(inputs)
    graph = fn.lowered(given).graph
    check_inputs(graph, given, entry)
    return graph


def export_onnx(model: Any, entry: str, inputs: Any, path: str | Path, check: bool = True,
                external_threshold: int | None = None, dynamic: Any = None) -> list[Path]:
    """See :meth:`linnet.jax.Model.export_onnx`."""
    import numpy as np
    from linnet.lang.export import export_onnx as export
    from linnet.lang.export import symbolic_graph

    target = export_target(path)
    graph = _checked(model, entry, inputs)
    fn = model.function(entry)
    prep = fn._prep
    shapes = {n: list(np.shape(t)) for n, t in zip(fn._names, fn._ordered(inputs))}
    graph = symbolic_graph(graph, prep.program, shapes, prep.config, lambda i, c: lower_entry(
        prep.program, entry, i, c, prep.weight_shapes)[0], dynamic)
    params = {p: model.params[p] for p in graph.parameters}
    try:
        return export(graph, params, target, program_sources(model.program), check,
                      external_threshold)
    except OSError as exc:
        raise unwritable(target, exc) from None


def export_stablehlo(model: Any, entry: str, inputs: Any, path: str | Path,
                     verify: bool = False) -> list[str]:
    """See :meth:`linnet.jax.Model.export_stablehlo`."""
    from linnet.lang.emit.stablehlo import argument_order
    from linnet.lang.export import export_stablehlo as export

    target = export_target(path)
    graph = _checked(model, entry, inputs)
    try:
        export(graph, target, program_sources(model.program), verify)
    except OSError as exc:
        raise unwritable(target, exc) from None
    return argument_order(graph)
