"""``model.export_onnx`` and ``model.export_stablehlo``: the entry lowered as the model runs
it (its config, the dims its weights fixed), then a thin call into linnet-lang's exporters
(:mod:`linnet.lang.export`), with the model's own tensors as the weights.

>>> model = load("examples/llama/llama.linnet", config="toy")            # doctest: +SKIP
>>> model.export_onnx("decode", [token, pos], "decode.onnx")            # doctest: +SKIP
[PosixPath('decode.onnx')]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linnet.lang.export import export_target, program_sources, unwritable


def export_onnx(model: Any, entry: str, inputs: Any, path: str | Path, check: bool = True,
                external_threshold: int | None = None, dynamic: Any = None) -> list[Path]:
    """See :meth:`linnet.torch.Model.export_onnx`."""
    from linnet.lang import lower
    from linnet.lang.export import export_onnx as export
    from linnet.lang.export import symbolic_graph

    target = export_target(path)
    graph = model._checked(entry, list(inputs))
    names = [p.name for p in model._entry_method(entry).params]
    shapes = {n: list(t.shape) for n, t in zip(names, inputs)}
    graph = symbolic_graph(graph, model.program, shapes, model.config, lambda i, c: lower(
        model.program, entry, i, c, model.weight_shapes, check=False), dynamic)
    params = {p: model.params[p] for p in graph.parameters}
    try:
        return export(graph, params, target, program_sources(model.program), check,
                      external_threshold)
    except OSError as exc:
        raise unwritable(target, exc) from None


def export_stablehlo(model: Any, entry: str, inputs: Any, path: str | Path,
                     verify: bool = False) -> list[str]:
    """See :meth:`linnet.torch.Model.export_stablehlo`."""
    from linnet.lang.emit.stablehlo import argument_order
    from linnet.lang.export import export_stablehlo as export

    target = export_target(path)
    graph = model._checked(entry, list(inputs))
    try:
        export(graph, target, program_sources(model.program), verify)
    except OSError as exc:
        raise unwritable(target, exc) from None
    return argument_order(graph)
