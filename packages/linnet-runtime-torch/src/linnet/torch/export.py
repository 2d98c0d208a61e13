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

from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import Diagnostic


def _target(path: str | Path) -> Path:
    """E0800 before any work when ``path`` cannot be written: no such folder, or a folder."""
    p = Path(path)
    if p.is_dir():
        raise LinnetError(Diagnostic("E0800", f"cannot export to `{path}`: it is a folder",
                                     help="name a file inside it, such as `decode.onnx`"))
    if not p.parent.is_dir():
        raise LinnetError(Diagnostic(
            "E0800", f"cannot export to `{path}`: folder `{p.parent}` does not exist",
            help=f"create it first (`mkdir -p {p.parent}`) or write elsewhere"))
    return p


def _unwritable(path: Path, exc: OSError) -> LinnetError:
    return LinnetError(Diagnostic("E0800", f"cannot export to `{path}`: "
                                  f"{exc.strerror or exc}",
                                  help="check the folder's permissions and free space"))


def _sources(model: Any) -> dict[str, str]:
    return {m.source.name: m.source.text for m in model.program.modules.values()}


def export_onnx(model: Any, entry: str, inputs: Any, path: str | Path, check: bool = True,
                external_threshold: int | None = None) -> list[Path]:
    """See :meth:`linnet.torch.Model.export_onnx`."""
    from linnet.lang.export import export_onnx as export

    target = _target(path)
    graph = model._checked(entry, list(inputs))
    params = {p: model.params[p] for p in graph.parameters}
    try:
        return export(graph, params, target, _sources(model), check, external_threshold)
    except OSError as exc:
        raise _unwritable(target, exc) from None


def export_stablehlo(model: Any, entry: str, inputs: Any, path: str | Path,
                     verify: bool = False) -> list[str]:
    """See :meth:`linnet.torch.Model.export_stablehlo`."""
    from linnet.lang.emit.stablehlo import argument_order
    from linnet.lang.export import export_stablehlo as export

    target = _target(path)
    graph = model._checked(entry, list(inputs))
    try:
        export(graph, target, _sources(model), verify)
    except OSError as exc:
        raise _unwritable(target, exc) from None
    return argument_order(graph)
