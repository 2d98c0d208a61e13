"""Reading safetensors checkpoints for JAX, memory-mapped, never through torch or pickle.

Which files make a checkpoint and whether their headers and index agree is decided in pure
Python by :mod:`linnet.lang.weights.safetensors` (the PyTorch runtime uses the same code, so a
bad checkpoint is the same coded error, E0634-E0651, in both). Each shard is then
memory-mapped with NumPy and every tensor is a view of the file's pages (``bf16`` through
``ml_dtypes``, which jax ships), placed on the device with ``jax.device_put``. On the CPU the
view is copied first, so the model owns its memory: overwriting or truncating the file
afterwards cannot change a loaded model or kill the process (SIGBUS).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.weights.safetensors import (
    SAFETENSORS_DTYPES,
    Checkpoint,
    checkpoint_shapes,
    resolve_checkpoint,
    safetensors_header,
)


def numpy_dtype(name: str) -> Any:
    """The NumPy dtype of a Linnet dtype name (``bf16`` is ml_dtypes' bfloat16).

    >>> numpy_dtype("f32"), numpy_dtype("bf16").name
    (dtype('float32'), 'bfloat16')
    """
    if name == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f64": "float64", "f32": "float32", "f16": "float16", "i64": "int64",
                     "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8",
                     "bool": "bool"}[name])


def load_safetensors(path: Any, device: Any = None, dtype: str | None = None) -> dict[str, Any]:
    """Every tensor of a checkpoint (a file, a directory, an index or a list of files) as a
    jax array on ``device`` (default: jax's default device); floating-point tensors
    converted to ``dtype`` (a Linnet name, ``"bf16"``) when given.

    >>> params = load_safetensors("model.safetensors")   # doctest: +SKIP
    """
    ckpt = resolve_checkpoint(path)
    checkpoint_shapes(ckpt)  # raises LinnetError E0634-E0638/E0650/E0651, every problem at once
    return load_checkpoint(ckpt, device, dtype)


def load_checkpoint(ckpt: Checkpoint, device: Any = None,
                    dtype: str | None = None) -> dict[str, Any]:
    """The tensors of a checkpoint whose headers :func:`checkpoint_shapes` validated, each
    read from a memory map of its shard straight to ``device``."""
    import jax

    on_cpu = (device is None and jax.default_backend() == "cpu") or (
        device is not None and device.platform == "cpu")
    convert = numpy_dtype(dtype) if dtype is not None else None
    out: dict[str, Any] = {}
    for shard in ckpt.files:
        try:
            header, start = safetensors_header(shard)
            data = np.memmap(shard, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise LinnetError(Diagnostic(
                "E0650", f"`{shard}` could not be read as safetensors: {exc}",
                help="the file may be truncated or corrupt; save or download it again")) \
                from None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            lo, hi = info["data_offsets"]
            kind = numpy_dtype(SAFETENSORS_DTYPES[info["dtype"]])
            view = data[start + lo:start + hi].view(kind).reshape(info["shape"])
            floating = view.dtype.kind == "f" or view.dtype.name == "bfloat16"
            if convert is not None and floating and view.dtype != convert:
                view = view.astype(convert)  # a new array: it does not share the file's pages
            elif on_cpu:
                view = np.array(view, copy=True)
            out[name] = jax.device_put(view, device)
        del data
    return out


def save_safetensors(tensors: dict[str, Any], path: str) -> None:
    """Write arrays (NumPy or jax) to a safetensors file, through ``safetensors.numpy``.

    >>> save_safetensors({"w": np.zeros((2, 2), np.float32)}, "/tmp/w.safetensors")  # doctest: +SKIP
    """
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()}, path)
