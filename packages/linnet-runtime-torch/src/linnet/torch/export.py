"""``model.export_onnx`` and ``model.export_stablehlo``: the entry lowered as the model runs
it (its config, the dims its weights fixed), then linnet-lang's one export driver
(:func:`linnet.lang.export.export_entry_onnx`), with the model's own tensors as the weights.
What is torch's own is the :class:`~linnet.lang.export.EntryExport` made here.

>>> model = load("examples/llama/llama.linnet", config="toy")            # doctest: +SKIP
>>> model.export_onnx("decode", [token, pos], "decode.onnx")            # doctest: +SKIP
[PosixPath('decode.onnx')]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linnet.lang.compiler import compile_entry
from linnet.lang.export import EntryExport, export_entry_onnx, export_entry_stablehlo


def entry_export(model: Any, entry: str, inputs: Any) -> EntryExport:
    """What the export driver needs of a torch model's ``entry`` for ``inputs``.

    >>> entry_export(model, "decode", [token, pos]).shapes()           # doctest: +SKIP
    {'token': [1], 'pos': [1]}
    """
    given: list[list[Any]] = []  # the inputs as a list, made once (after the path's check)

    def listed() -> list[Any]:
        if not given:
            given.append(list(inputs))
        return given[0]

    def shapes() -> dict[str, list[int]]:
        names = [p.name for p in model._entry_method(entry).params]
        return {n: list(t.shape) for n, t in zip(names, listed())}

    return EntryExport(
        model.program,
        model.config,
        model.params,
        lambda: model._checked(entry, listed()),
        shapes,
        lambda i, c: (
            compile_entry(
                model.program, entry, i, c, model.weight_shapes, check=False, kernels=False
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
    """See :meth:`linnet.torch.Model.export_onnx`."""
    return export_entry_onnx(
        entry_export(model, entry, inputs), path, check, external_threshold, dynamic
    )


def export_stablehlo(
    model: Any, entry: str, inputs: Any, path: str | Path, verify: bool = False
) -> list[str]:
    """See :meth:`linnet.torch.Model.export_stablehlo`."""
    return export_entry_stablehlo(entry_export(model, entry, inputs), path, verify)
