"""A GGUF file as the weights of ``load(model, weights="x.gguf")``: its config and headers, the
way :func:`linnet.lang.host.loading.read_headers` reads a safetensors checkpoint's, and the shipped
model that runs it when none is named (``load(weights="x.gguf")``, `linnet run x.gguf`).

The file's metadata becomes the config.json the model's ``.hf.json`` mapping reads
(:func:`linnet.lang.weights.gguf.hf_config`), so every check a Hugging Face checkpoint gets
(unmodelled keys, value ranges, a ``config=`` that contradicts the file, dims the weights
contradict) applies to GGUF too. The tensors are dequantised to the model's float type: the
config's ``T`` (or ``dtype=``), else f32.

Pure Python, shared by every runtime; the runtimes turn :meth:`GGUFCheckpoint.arrays` into
their arrays.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.weights.gguf import GGUFCheckpoint, read_gguf
from linnet.lang.weights.gguf_names import ARCHITECTURES, family_for

_FLOATS = ("f64", "f32", "f16", "bf16")
# GGUF value types: byte sizes of the fixed-size ones; 8 is a string, 9 an array.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_headers(
    weights: Any, program: Any, model_path: Path, config: dict[str, Any], convert: str | None
) -> tuple[GGUFCheckpoint, dict[str, Any], dict[str, Any]]:
    """:func:`linnet.lang.host.loading.read_headers` for a GGUF file: the checkpoint, its
    tensors' shapes and dtypes (the float type they load as) and the config they complete.
    No tensor is dequantised here.

    >>> ckpt, shapes, cfg = gguf_headers("smollm2.gguf", program, path, {}, None)
    ...                                                                  # doctest: +SKIP
    """
    from linnet.lang.check.driver import find_model
    from linnet.lang.weights.checkpoint import (
        checkpoint_config,
        fit_checkpoint,
        merge_config,
        read_mapping,
    )
    from linnet.lang.weights.safetensors import TensorInfo

    decl = find_model(program, None)
    mapping = read_mapping(model_path)
    if mapping is None:
        raise coded_error(
            "E0852",
            f"model `{decl.name}` has no checkpoint mapping "
            f"`{Path(model_path).with_suffix('').name}.hf.json`, which reading a GGUF file "
            "needs (it says which Hugging Face architecture the model runs)",
            help="load the file with a shipped model ("
            + ", ".join(sorted({m for ms in ARCHITECTURES.values() for m in ms}))
            + "), or write the "
            "mapping (docs/models.md)",
        )
    ckpt = read_gguf(weights, list(mapping.get("architectures", [])), decl.name)
    ckpt_config = checkpoint_config(ckpt.hf_config, mapping, decl.name, None, ckpt.config_name)
    config = merge_config(config, ckpt_config)
    ckpt.dtype = convert or _config_dtype(decl, config)
    shapes: dict[str, Any] = {
        name: TensorInfo(t.shape, ckpt.dtype) for name, t in ckpt.tensors.items()
    }
    config = fit_checkpoint(program, config, shapes, ckpt_config)
    return ckpt, shapes, config


def _config_dtype(decl: Any, config: dict[str, Any]) -> str:
    """The float type the config gives the model's element type, else f32."""
    for g in decl.generics:
        if g.kind == "DType" and config.get(g.name) in _FLOATS:
            return str(config[g.name])
    return "f32"


def gguf_architecture(path: str | Path) -> str:
    """The ``general.architecture`` of a GGUF file, read from its first metadata entries
    without parsing the rest (its vocabulary can be 10^5 strings): `linnet run x.gguf` picks
    the model before anything else is read. E0651 for a missing file, E0851 for one that is
    not GGUF, E0855 for one without the key.

    >>> gguf_architecture("SmolLM2-135M-Instruct.Q4_1.gguf")   # doctest: +SKIP
    'llama'
    """
    from linnet.lang.weights.gguf import _corrupt

    p = Path(path)
    if not p.is_file():
        raise coded_error("E0651", f"weights file `{p}` not found", help="check the path")
    try:
        with p.open("rb") as f:
            head = f.read(24)
            if len(head) < 24 or head[:4] != b"GGUF":
                raise _corrupt(p, "it does not start with a GGUF header")
            (count,) = struct.unpack("<Q", head[16:24])
            for _ in range(min(count, 4096)):
                key = _string(f)
                (kind,) = struct.unpack("<I", _read(f, 4))
                if key == "general.architecture" and kind == 8:
                    return _string(f)
                _skip(f, kind)
    except (OSError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(p, str(exc)) from None
    raise coded_error(
        "E0855",
        f"`{p}` has no `general.architecture` metadata string",
        help="every GGUF model file names its architecture; the file was not "
        "written by llama.cpp's converter, or is damaged",
    )


def _read(f: Any, n: int) -> bytes:
    data: bytes = f.read(n)
    if len(data) != n:
        raise ValueError("the file ends inside its metadata")
    return data


def _string(f: Any) -> str:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > 1 << 20:
        raise ValueError(f"a metadata string of {n} bytes")
    return _read(f, n).decode("utf-8")


# GGUF's unsigned and signed integer metadata types (0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
# 10 u64, 11 i64) and their struct formats: what an expert count is written as.
_UINTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}


def _skip(f: Any, kind: int) -> None:
    if kind in _SIZES:
        _read(f, _SIZES[kind])
    elif kind == 8:
        _string(f)
    elif kind == 9:
        (item, n) = struct.unpack("<IQ", _read(f, 12))
        if item in _SIZES:
            f.seek(_SIZES[item] * n, 1)
        else:
            for _ in range(n):
                _skip(f, item)
    else:
        raise ValueError(f"unknown metadata value type {kind}")


def gguf_model(path: str | Path) -> tuple[str, str]:
    """The shipped model that runs a GGUF file, and why (``"architecture llama"``); E0852
    for an architecture none runs.

    >>> gguf_model("SmolLM2-135M-Instruct.Q4_1.gguf")   # doctest: +SKIP
    ('std.models.llama', 'GGUF architecture llama')
    """
    arch = gguf_architecture(path)
    if arch not in ARCHITECTURES:
        known = "; ".join(f"{a} ({', '.join(m)})" for a, m in ARCHITECTURES.items())
        raise coded_error(
            "E0852",
            f"`{path}` is a GGUF file of architecture {arch!r}, which no model Linnet ships runs",
            help=f"the GGUF architectures Linnet loads: {known}. For "
            "another, load the model's Hugging Face (safetensors) checkpoint with a model "
            "written for it",
        )
    if _expert_count(path, arch) > 0:  # a mixture of experts: its family (Mixtral in `llama`)
        fam = family_for(arch, None, experts=True)
        if fam is not None:
            return fam.model, f"GGUF architecture {arch} with {arch}.expert_count"
    return ARCHITECTURES[arch][0], f"GGUF architecture {arch}"


def _expert_count(path: str | Path, arch: str) -> int:
    """``{arch}.expert_count`` of a GGUF file (0 where it has none), read as
    :func:`gguf_architecture` reads: metadata entries in turn, values skipped, no vocabulary
    parsed. The file's header was checked by :func:`gguf_architecture` first."""
    key_wanted = f"{arch}.expert_count"
    try:
        with Path(path).open("rb") as f:
            head = f.read(24)
            (count,) = struct.unpack("<Q", head[16:24])
            for _ in range(min(count, 4096)):
                key = _string(f)
                (kind,) = struct.unpack("<I", _read(f, 4))
                if key == key_wanted and kind in _UINTS:
                    (value,) = struct.unpack(_UINTS[kind], _read(f, struct.calcsize(_UINTS[kind])))
                    return int(value)
                _skip(f, kind)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return 0  # read_gguf reports a damaged file with its code
    return 0
