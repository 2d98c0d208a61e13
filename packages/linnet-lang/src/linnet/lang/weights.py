"""Reading a safetensors file's header: names, shapes and dtypes, without its data.

Pure Python so that `linnet graph --weights` and the checker bind dims from a checkpoint
without torch. A truncated or corrupt file is a Linnet error, never a traceback.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .diagnostics import Diagnostic, LinnetError

SAFETENSORS_DTYPES = {"F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16", "I64": "i64",
                      "I32": "i32", "I16": "i16", "I8": "i8", "U8": "u8", "BOOL": "bool"}
DTYPE_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
               "u8": 1, "bool": 1}


def _corrupt(path: str | Path, why: str) -> LinnetError:
    return LinnetError(Diagnostic(
        "E0650", f"`{path}` is not a readable safetensors file: {why}",
        help="the file may be truncated or not a safetensors file; download or save it again"))


def safetensors_header(path: str | Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset where its data starts.

    >>> safetensors_header("missing.safetensors")   # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    linnet.lang.diagnostics.LinnetError: error[E0651]: ...
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _corrupt(path, f"only {len(head)} bytes")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise _corrupt(path, f"its header claims {n} bytes but the file has {size}")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise LinnetError(Diagnostic("E0651", f"weights file `{path}` not found",
                                     help="check the path")) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path, f"its header is not JSON ({exc})") from None
    except OSError as exc:
        raise LinnetError(Diagnostic("E0651", f"cannot read `{path}`: {exc}")) from None
    if not isinstance(header, dict):
        raise _corrupt(path, "its header is not a JSON object")
    data_size = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = info["data_offsets"]
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            count = 1
            for d in info["shape"]:
                count *= int(d)
        except (KeyError, TypeError, ValueError):
            raise _corrupt(path, f"tensor `{name}` has a malformed entry") from None
        if stop > data_size or stop - start != count * DTYPE_BYTES[dtype]:
            raise _corrupt(path, f"tensor `{name}` lies outside the file (truncated?)")
    return header, 8 + n


def safetensors_shapes(path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Map each tensor name to ``(shape, dtype)`` using Linnet dtype names."""
    header, _ = safetensors_header(path)
    return {name: (tuple(info["shape"]), SAFETENSORS_DTYPES[info["dtype"]])
            for name, info in header.items() if name != "__metadata__"}
