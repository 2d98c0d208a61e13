"""``model.export_onnx`` and ``model.export_stablehlo`` of the JAX runtime: the entry lowered
as the model runs it (its config, the dims its weights fixed), then linnet-lang's one export
driver (:func:`linnet.lang.export.export_entry_onnx`, the same as linnet-runtime-torch's,
with the same code, E0800, for a path it cannot write), with the model's own arrays as the
weights. What is JAX's own is the :class:`~linnet.lang.export.EntryExport` made here.

>>> model = load("examples/llama/llama.linnet", config="toy")            # doctest: +SKIP
>>> model.export_onnx("decode", [token, pos], "decode.onnx")            # doctest: +SKIP
[PosixPath('decode.onnx')]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from linnet.lang.compiler import compile_entry
from linnet.lang.export import EntryExport, export_entry_onnx, export_entry_stablehlo
from linnet.lang.ir.graph import Graph

from .inputs import check_inputs


def entry_export(model: Any, entry: str, inputs: Any) -> EntryExport:
    """What the export driver needs of a JAX model's ``entry`` for ``inputs``: the graph
    ``model.run`` would call for them, after the same input checks.

    >>> entry_export(model, "decode", [token, pos]).shapes()           # doctest: +SKIP
    {'token': [1], 'pos': [1]}
    """
    prep = model._prep  # what model.function(entry) lowers with

    def checked() -> Graph:
        fn = model.function(entry)
        given = fn._ordered(inputs)
        graph = fn.lowered(given).graph
        check_inputs(graph, given, entry)
        return graph

    def shapes() -> dict[str, list[int]]:
        fn = model.function(entry)
        return {n: list(np.shape(t)) for n, t in zip(fn._names, fn._ordered(inputs))}

    return EntryExport(
        prep.program,
        prep.config,
        model.params,
        checked,
        shapes,
        # As the model lowers it (linnet.jax.model._compile), less the kernels.
        lambda i, c: (
            compile_entry(
                prep.program,
                entry,
                i,
                c,
                prep.weight_shapes,
                check=False,
                clauses=True,
                kernels=False,
            ).graph
        ),
    )


def export_onnx(
    model: Any,
    entry: str,
    inputs: Any,
    path: str | Path,
    check: bool = True,
    external_threshold: int | None = None,
    dynamic: Any = None,
) -> list[Path]:
    """See :meth:`linnet.jax.Model.export_onnx`."""
    return export_entry_onnx(
        entry_export(model, entry, inputs), path, check, external_threshold, dynamic
    )


def export_stablehlo(
    model: Any, entry: str, inputs: Any, path: str | Path, verify: bool = False
) -> list[str]:
    """See :meth:`linnet.jax.Model.export_stablehlo`."""
    return export_entry_stablehlo(entry_export(model, entry, inputs), path, verify)
