"""The demo checkpoint `linnet run` makes when no weights are given: one generator for every
runtime, so `linnet run` and `linnet run --runtime jax` decode the same tokens.

The numbers come from NumPy's PCG64 generator (``numpy.random.default_rng(seed)``), drawn in
f32 parameter by parameter in path order (norm weights are ones), and the file is written
here byte by byte: the same model, config and seed give a byte-identical safetensors file
without torch or jax. NumPy is imported only here (both runtimes depend on it; the
language package does not).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from linnet.lang.ir.graph import ValueType

# Part of the demo file's name: a change to how the numbers are drawn or written changes it,
# so that a file made by an earlier generator (or by one runtime's own, before there was one
# generator) is never taken for this one's.
GENERATOR = "numpy-pcg64-f32-v1"
SCALE = 0.02
_SAFETENSORS = {
    "f64": "F64",
    "f32": "F32",
    "f16": "F16",
    "bf16": "BF16",
    "i64": "I64",
    "i32": "I32",
    "i16": "I16",
    "i8": "I8",
    "u8": "U8",
    "bool": "BOOL",
}


def demo_weights(
    model_path: str | Path, config: dict[str, Any], seed: int = 0, scale: float = SCALE
) -> dict[str, tuple[str, Any]]:
    """Deterministic random parameters for a model and config, ``path -> (dtype, array)``
    with NumPy arrays of the raw values (a ``bf16`` parameter as its f32 numbers, converted
    when written): norm weights are ones, the rest normal with standard deviation ``scale``.

    >>> w = demo_weights("std.models.llama", {"V": 16, "D": 8, "F": 16, "NL": 1, "H": 2,
    ...                                       "KV": 1, "HD": 4, "S": 8, "T": "f32"})
    >>> w["model.norm.weight"][1].tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for path, vt, ones in parameter_types(model_path, config):
        if ones:
            values = np.ones(vt.shape, dtype=np.float32)
        else:
            values = rng.standard_normal(vt.shape, dtype=np.float32) * np.float32(scale)
        out[path] = (vt.dtype, values)
    return out


def _raw(dtype: str, values: Any) -> bytes:
    """``values`` (f32 NumPy numbers) as the little-endian bytes of ``dtype``."""
    import numpy as np

    if dtype == "bf16":
        # Round to nearest even on the f32 bits (as torch's and ml_dtypes' conversions do).
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype("<u2").tobytes()
    kinds = {
        "f64": "<f8",
        "f32": "<f4",
        "f16": "<f2",
        "i64": "<i8",
        "i32": "<i4",
        "i16": "<i2",
        "i8": "i1",
        "u8": "u1",
        "bool": "?",
    }
    return np.ascontiguousarray(values).astype(kinds[dtype]).tobytes()


def safetensors_bytes(tensors: dict[str, tuple[str, Any]]) -> bytes:
    """A safetensors file of ``tensors`` (``name -> (Linnet dtype, array)``), tensors in name
    order, its header padded to 8 bytes as the format's own writer pads it.

    >>> import numpy as np
    >>> raw = safetensors_bytes({"w": ("f32", np.ones(2, np.float32))})
    >>> raw[8:].split(b"}}")[0] + b"}}"
    b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    """
    header: dict[str, Any] = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        dtype, values = tensors[name]
        raw = _raw(dtype, values)
        header[name] = {
            "dtype": _SAFETENSORS[dtype],
            "shape": list(values.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_demo(
    path: str | Path, model_path: str | Path, config: dict[str, Any], seed: int = 0
) -> None:
    """Write the demo checkpoint of ``model_path``, ``config`` and ``seed`` to ``path``.

    >>> write_demo("/tmp/demo.safetensors", "std.models.llama", toy, 0)   # doctest: +SKIP
    """
    Path(path).write_bytes(safetensors_bytes(demo_weights(model_path, config, seed)))


def parameter_types(
    model_path: str | Path, config: dict[str, Any]
) -> list[tuple[str, ValueType, bool]]:
    """Each parameter of a model under ``config``, sorted by path: ``(path, type, ones)``,
    ``ones`` for a norm's weight (random weights make those ones, the rest small normal
    numbers). Read from the first entry, lowered for inputs of size 1 in every dim the
    config does not set.

    >>> cfg = {"V": 16, "D": 8, "F": 16, "NL": 1, "H": 2, "KV": 1, "HD": 4, "S": 8, "T": "f32"}
    >>> [(p, t.shape, ones) for p, t, ones in parameter_types("std.models.llama", cfg)][-1]
    ('model.norm.weight', (8,), True)
    """
    from linnet.lang.check.driver import find_model, lower
    from linnet.lang.syntax.program import Program, model_file

    program = Program.from_file(model_file(model_path))
    decl = find_model(program, None)
    entry = next(m for m in decl.methods if m.kind == "entry")

    def size(dim: Any) -> int:
        # A dim the config sets (the batch B, say) takes its value; any other is 1.
        value = config.get(getattr(dim, "name", ""))
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    inputs = {
        p.name: [size(d) for d in p.type.dims]  # type: ignore[union-attr]
        for p in entry.params
    }
    graph = lower(program, entry.name, inputs, config)
    return [
        (path, vt, path.endswith("norm.weight") or path.endswith("layernorm.weight"))
        for path, vt in sorted(graph.parameters.items())
    ]
