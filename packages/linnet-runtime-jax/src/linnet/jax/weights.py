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
from linnet.lang.host.loading import nonfinite_weight
from linnet.lang.weights.gguf import GGUFCheckpoint
from linnet.lang.weights.safetensors import (
    SAFETENSORS_DTYPES,
    Checkpoint,
    checkpoint_shapes,
    checkpoint_unpacking,
    resolve_checkpoint,
    safetensors_header,
    shard_of,
)
from linnet.lang.weights.stacked import stack_tensors


def numpy_dtype(name: str) -> Any:
    """The NumPy dtype of a Linnet dtype name (``bf16`` is ml_dtypes' bfloat16).

    >>> numpy_dtype("f32"), numpy_dtype("bf16").name
    (dtype('float32'), 'bfloat16')
    """
    if name == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(
        {
            "f64": "float64",
            "f32": "float32",
            "f16": "float16",
            "i64": "int64",
            "i32": "int32",
            "i16": "int16",
            "i8": "int8",
            "u8": "uint8",
            "bool": "bool",
        }[name]
    )


def load_safetensors(path: Any, device: Any = None, dtype: str | None = None) -> dict[str, Any]:
    """Every tensor of a checkpoint (a file, a directory, an index or a list of files) as a
    jax array on ``device`` (default: jax's default device); floating-point tensors
    converted to ``dtype`` (a Linnet name, ``"bf16"``) when given.

    >>> params = load_safetensors("model.safetensors")   # doctest: +SKIP
    """
    ckpt = resolve_checkpoint(path)
    checkpoint_shapes(ckpt)  # raises LinnetError E0634-E0638/E0650/E0651, every problem at once
    return load_checkpoint(ckpt, device, dtype)


def load_checkpoint(
    ckpt: Checkpoint | GGUFCheckpoint,
    device: Any = None,
    dtype: str | None = None,
    check_finite: bool = False,
    repack: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """The tensors of a checkpoint whose headers :func:`checkpoint_shapes` validated, each
    read from a memory map of its shard straight to ``device``; with ``check_finite``, each
    floating-point tensor is checked for NaN and infinite values on the way (E0666, every
    such tensor of every shard in one error); ``repack``: a GGUF file's weights kept
    quantised (:func:`load_gguf`)."""
    import jax

    if isinstance(ckpt, GGUFCheckpoint):
        return load_gguf(ckpt, device, dtype, check_finite, repack)
    on_cpu = (device is None and jax.default_backend() == "cpu") or (
        device is not None and device.platform == "cpu"
    )
    convert = numpy_dtype(dtype) if dtype is not None else None
    # Float8 and GPTQ / AWQ weights are read dequantised (linnet.lang.weights.unpacking);
    # their scales and zeros (small) are read first, wherever their shards are.
    unpack = checkpoint_unpacking(ckpt)
    extra = _companions(ckpt, unpack.companions()) if unpack else {}
    out: dict[str, Any] = {}
    nonfinite: list[Diagnostic] = []
    for shard in ckpt.files:
        try:
            header, start = safetensors_header(shard)
            data = np.memmap(shard, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise LinnetError(
                Diagnostic(
                    "E0650",
                    f"`{shard}` could not be read as safetensors: {exc}",
                    help="the file may be truncated or corrupt; save or download it again",
                )
            ) from None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in unpack.dropped:
                continue
            lo, hi = info["data_offsets"]
            if name in unpack.fp8 or name in unpack.int4:
                raw = data[start + lo : start + hi]
                raw = (raw if name in unpack.fp8 else raw.view(np.int32)).reshape(info["shape"])
                view = unpack.numpy(name, raw, extra)
                view = view.astype(numpy_dtype(dtype or unpack.dtype(name)))
                name = unpack.name(name)
            else:
                kind = numpy_dtype(SAFETENSORS_DTYPES[info["dtype"]])
                view = data[start + lo : start + hi].view(kind).reshape(info["shape"])
            if check_finite:
                bad = finite_diagnostic(name, view, {name: _shard(ckpt, shard)})
                if bad is not None:
                    nonfinite.append(bad)
            floating = view.dtype.kind == "f" or view.dtype.name == "bfloat16"
            if convert is not None and floating and view.dtype != convert:
                view = view.astype(convert)  # a new array: it does not share the file's pages
            elif on_cpu:
                view = np.array(view, copy=True)
            out[name] = jax.device_put(view, device)
        del data
    raise_nonfinite(nonfinite)
    # A mixture of experts' per-expert tensors are its stacked parameters (weights/stacked.py).
    return stack_tensors(out, _stack_on_device)


def _companions(ckpt: Checkpoint, names: set[str]) -> dict[str, np.ndarray]:
    """The tensors ``names`` of ``ckpt`` (scales, zeros, group indices) as NumPy arrays of
    their own dtypes, whichever shards hold them."""
    out: dict[str, np.ndarray] = {}
    for shard in ckpt.files:
        header, start = safetensors_header(shard)
        data = np.memmap(shard, dtype=np.uint8, mode="r")
        for name in names & header.keys():
            info = header[name]
            lo, hi = info["data_offsets"]
            kind = numpy_dtype(SAFETENSORS_DTYPES[info["dtype"]])
            view = data[start + lo : start + hi].view(kind).reshape(info["shape"])
            out[name] = np.array(view)
        del data
    return out


def _stack_on_device(parts: list[Any]) -> Any:
    """Experts' tensors stacked where they are (one device array, then the parts go)."""
    import jax.numpy as jnp

    return jnp.stack(parts)


def load_gguf(
    ckpt: GGUFCheckpoint,
    device: Any = None,
    dtype: str | None = None,
    check_finite: bool = False,
    repack: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """The tensors of a GGUF file, each dequantised on the host (float32, NumPy), checked
    for NaN and infinite values with ``check_finite`` (E0666), converted to ``dtype`` (a
    Linnet name; default the float type the model's config gives, ``ckpt.dtype``) and placed
    on ``device``, one tensor at a time; the weights ``repack`` names are kept quantised
    (:func:`linnet.lang.weights.gguf_quant.repacked`).

    >>> params = load_gguf(read_gguf("smollm2.gguf"))   # doctest: +SKIP
    """
    from linnet.lang.weights.gguf_quant import repacked

    import jax

    kind = numpy_dtype(dtype or ckpt.dtype)
    out: dict[str, Any] = {}
    nonfinite: list[Diagnostic] = []
    repack = repack or {}
    for name, tensor in ckpt.tensors.items():
        if name in repack:  # kept quantised: the blocks repacked, never dequantised
            out.update(
                {k: jax.device_put(v, device) for k, v in zip(repack[name], repacked(tensor))}
            )
            continue
        values = tensor.dequantized()
        if check_finite:
            bad = finite_diagnostic(name, values, None)
            if bad is not None:
                nonfinite.append(bad)
        out[name] = jax.device_put(values.astype(kind, copy=False), device)
    raise_nonfinite(nonfinite)
    return out


def _shard(ckpt: Checkpoint, shard: Any) -> Any:
    from linnet.lang.weights.safetensors import TensorInfo

    return TensorInfo((), "", shard.name if len(ckpt.files) > 1 else "")


def save_safetensors(tensors: dict[str, Any], path: str) -> None:
    """Write arrays (NumPy or jax) to a safetensors file, through ``safetensors.numpy``.

    >>> save_safetensors({"w": np.zeros((2, 2), np.float32)}, "/tmp/w.safetensors")  # doctest: +SKIP
    """
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()}, path)


def check_finite_weights(params: dict[str, Any], shapes: dict[str, Any] | None = None) -> None:
    """E0666 for each floating-point weight holding a NaN or an infinity (``shapes``, the
    checkpoint's headers, name the shard each is in), as the torch runtime checks them.
    Checked on the host (:func:`finite_diagnostic`): no compilation, and a checkpoint is
    checked there as it is read (:func:`load_checkpoint`), before it reaches the device.

    >>> check_finite_weights({"w": np.array([1.0, np.inf], np.float32)})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0666]: weight `w` holds 1 infinite ...
    """
    diags = [
        d
        for k, v in params.items()
        if (d := finite_diagnostic(k, np.asarray(v), shapes)) is not None
    ]
    raise_nonfinite(diags)


def raise_nonfinite(diags: list[Diagnostic]) -> None:
    """Raise the E0666 diagnostics, ten at most and a count of the rest."""
    if diags:
        raise LinnetError(
            diags[:10]
            + (
                [
                    Diagnostic(
                        "E0666",
                        f"... and {len(diags) - 10} more weights with NaN or infinite values",
                    )
                ]
                if len(diags) > 10
                else []
            )
        )


# Exponent bits of each float: all set is an infinity or a NaN.
_EXPONENT = {2: 0x7C00, 4: 0x7F800000, 8: 0x7FF0000000000000}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_CHUNK = 1 << 22


def _all_finite(a: np.ndarray) -> bool:
    """Whether host array ``a`` (a float) holds no NaN or infinity, cheaply: a 32- or
    64-bit array is summed once (any NaN or infinity makes the sum non-finite; a finite sum
    proves every value finite), and only where that overflows, or for 16-bit floats (which
    NumPy sums slowly), the exponent bits are tested in chunks of 4M elements."""
    if a.dtype.itemsize >= 4:
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.sum(a)):
                return True
    mask_value = 0x7F80 if a.dtype.name == "bfloat16" else _EXPONENT[a.dtype.itemsize]
    uint = _UINT[a.dtype.itemsize]
    bits = np.ascontiguousarray(a).reshape(-1).view(uint)
    mask: Any = uint(mask_value)
    buf = np.empty(min(_CHUNK, bits.size), uint)
    for i in range(0, bits.size, _CHUNK):
        part = bits[i : i + _CHUNK]
        np.bitwise_and(part, mask, out=buf[: part.size])
        if (buf[: part.size] == mask).any():
            return False
    return True


def finite_diagnostic(name: str, a: np.ndarray, shapes: dict[str, Any] | None) -> Diagnostic | None:
    """E0666 for weight ``name`` (a host array) if it holds a NaN or an infinity, naming how
    many and where the first is; None otherwise (and for integer arrays)."""
    if not _floating(a.dtype) or not a.size or _all_finite(a):
        return None
    wide = a.astype(np.float64)
    nan, inf = np.isnan(wide), np.isinf(wide)
    first = np.argwhere(nan | inf)[0].tolist()
    where = shard_of(shapes.get(name)) if shapes else ""
    return nonfinite_weight(name + where, int(nan.sum()), int(inf.sum()), first)


def _floating(dtype: Any) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"
