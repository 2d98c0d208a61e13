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

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph


def export_onnx(graph: Graph, params: Mapping[str, Any] | None, path: str | Path,
                sources: Mapping[str, str] | None = None, check: bool = True,
                external_threshold: int | None = None) -> list[Path]:
    """Write ``graph`` as an ONNX model to ``path`` (weights as initializers, as external
    data ``<path>.data`` above ``external_threshold`` bytes, 1 GiB by default); checked with
    ``onnx.checker`` (full check) unless ``check=False``. Returns the files written.

    >>> export_onnx(graph, {"w": np.ones((4, 4), "float32")}, "m.onnx")  # doctest: +SKIP
    [PosixPath('m.onnx')]
    """
    from linnet.lang.emit import onnx as emit

    model = emit.emit_onnx(graph, params, sources)
    if check:
        emit.check(model)
    threshold = emit.EXTERNAL_THRESHOLD if external_threshold is None else external_threshold
    return emit.save_onnx(model, path, threshold)


def export_stablehlo(graph: Graph, path: str | Path | None,
                     sources: Mapping[str, str] | None = None, verify: bool = False) -> str:
    """StableHLO text for ``graph``, written to ``path`` (if given); ``verify=True`` parses
    and verifies it with jaxlib first. ``@main`` takes the inputs, the states, then the
    parameters (:func:`linnet.lang.emit.stablehlo.argument_order`).

    >>> text = export_stablehlo(graph, "prefill.mlir")                  # doctest: +SKIP
    """
    from linnet.lang.emit import stablehlo as emit

    text = emit.emit_stablehlo(graph, sources)
    if verify:
        emit.verify(text)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------- safetensors, with numpy
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
              "BOOL": "bool"}


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
            raise LinnetError(Diagnostic(
                "E0931", f"tensor `{name}` of `{path}` is {info['dtype']}, which export does "
                         "not support", help="convert the checkpoint to f32, f16 or bf16"))
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
        raise LinnetError(Diagnostic("E0800", f"cannot export to `{path}`: it is a folder",
                                     help="name a file inside it, such as `decode.onnx`"))
    if not p.parent.is_dir():
        raise LinnetError(Diagnostic(
            "E0800", f"cannot export to `{path}`: folder `{p.parent}` does not exist",
            help=f"create it first (`mkdir -p {p.parent}`) or write elsewhere"))
    return p


def unwritable(path: Path, exc: OSError) -> LinnetError:
    """E0800 for a write that failed (permissions, a full disk)."""
    return LinnetError(Diagnostic("E0800", f"cannot export to `{path}`: "
                                  f"{exc.strerror or exc}",
                                  help="check the folder's permissions and free space"))


def program_sources(program: Any) -> dict[str, str]:
    """Every module's text by file name: what the exporters' source-line comments read."""
    return {m.source.name: m.source.text for m in program.modules.values()}
