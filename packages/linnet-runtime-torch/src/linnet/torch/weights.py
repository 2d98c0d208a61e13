"""Reading safetensors checkpoints onto a device, shard by shard, never through pickle.

Which files make a checkpoint, and whether their headers and index agree, is decided in
pure Python by :mod:`linnet.lang.weights.safetensors` (shared by every runtime); this module reads the
tensors. On the CPU each tensor is copied out of the memory-mapped file, so that the model
owns its memory: overwriting or truncating the file afterwards cannot change a loaded
model or kill the process (SIGBUS). On CUDA the copy to the device is that copy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.weights.fp8 import block_scales
from linnet.lang.weights.gguf import GGUFCheckpoint
from linnet.lang.weights.safetensors import (
    Checkpoint,
    checkpoint_shapes,
    checkpoint_unpacking,
    resolve_checkpoint,
)
from linnet.lang.weights.stacked import stack_tensors
from linnet.lang.weights.unpacking import Unpacking

import torch

Step = Callable[[str, torch.Tensor], dict[str, torch.Tensor]]


def _target(device: torch.device) -> str:
    return str(device) if device.type != "cuda" or device.index is not None else "cuda:0"


def load_safetensors(
    path: Any, device: torch.device, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint (a file, a directory, an index or a list of files),
    placed on ``device``; floating-point tensors converted to ``dtype`` when given.

    The headers (and the index) are validated first, in pure Python, so a truncated or
    corrupt file, a missing shard or a stray tensor is a Linnet error naming the file, not
    a crash inside the reader.

    >>> params = load_safetensors("model.safetensors", torch.device("cpu"))  # doctest: +SKIP
    """
    ckpt = resolve_checkpoint(path)
    checkpoint_shapes(ckpt)  # raises LinnetError E0634-E0638/E0650/E0651, every problem at once
    return load_checkpoint(ckpt, device, dtype)


def load_checkpoint(
    ckpt: Checkpoint | GGUFCheckpoint,
    device: torch.device,
    dtype: torch.dtype | None = None,
    blocks: dict[str, tuple[int, int, int]] | None = None,
    step: Step | None = None,
    repack: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint whose headers :func:`checkpoint_shapes` validated.

    Each shard is opened once (``safe_open``) and read tensor by tensor straight to
    ``device``: no shard is ever held whole in host memory. ``blocks`` (tensor parallelism,
    linnet.torch.parallel) maps a tensor to the ``(axis, start, stop)`` block this rank
    holds: only that block is read (``get_slice``). ``step`` turns each tensor, as it is
    read, into the tensors kept (quantisation on load, :func:`linnet.torch.quantize.quantizer`),
    so a float weight is never held beside the whole model. ``repack`` (a GGUF file) names
    the weights kept quantised: their blocks become the tensors named, never a float copy.
    """
    blocks = blocks or {}
    if isinstance(ckpt, GGUFCheckpoint):
        return load_gguf(ckpt, device, dtype, blocks, step, repack)
    from safetensors import SafetensorError, safe_open

    # Float8 and GPTQ / AWQ weights are read dequantised (linnet.lang.weights.unpacking);
    # their scales and zeros (small) are read first, wherever their shards are.
    unpack = checkpoint_unpacking(ckpt)
    extra = _tensors(ckpt, unpack.companions(), device) if unpack else {}
    # GPTQ / AWQ companions go through NumPy (the one definition): made host arrays once.
    arrays = {k: v.cpu().numpy() for k, v in extra.items()} if unpack.int4 else {}
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.files:
        try:
            with safe_open(str(shard), framework="pt", device=_target(device)) as f:
                for stored in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    if stored in unpack.dropped:
                        continue
                    name = unpack.name(stored)
                    where = blocks.get(name)
                    if stored in unpack.fp8 or stored in unpack.int4:
                        t = _unpacked(unpack, stored, f.get_tensor(stored), extra, arrays)
                        t = t.to(dtype or _torch_dtype(unpack.dtype(stored)))
                        if where is not None:
                            axis, start, stop = where
                            t = t.narrow(axis, start, stop - start).contiguous()
                    elif where is None:
                        t = _owned(f.get_tensor(name), dtype)
                    else:
                        axis, start, stop = where
                        index = tuple([slice(None)] * axis + [slice(start, stop)])
                        t = _owned(f.get_slice(name)[index], dtype)
                    out.update(step(name, t) if step is not None else {name: t})
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise LinnetError(
                Diagnostic(
                    "E0650",
                    f"`{shard}` could not be read as safetensors: {exc}",
                    help="the file may be truncated or corrupt; save or download it again",
                )
            ) from None
    # A mixture of experts' per-expert tensors are its stacked parameters (weights/stacked.py).
    return stack_tensors(out, torch.stack)


def _tensors(ckpt: Checkpoint, names: set[str], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of ``ckpt``, whichever shards hold them."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.files:
        with safe_open(str(shard), framework="pt", device=_target(device)) as f:
            out.update((n, f.get_tensor(n)) for n in f.keys() if n in names)  # noqa: SIM118
    return out


def _torch_dtype(name: str) -> torch.dtype:
    from .interpreter import DTYPES

    return DTYPES[name]


def _unpacked(
    unpack: Unpacking,
    stored: str,
    data: torch.Tensor,
    extra: dict[str, torch.Tensor],
    arrays: dict[str, Any],
) -> torch.Tensor:
    """A float8 weight dequantised where it is (:func:`_fp8`), a GPTQ / AWQ ``qweight``
    through the NumPy definition (:meth:`Unpacking.numpy`; ``arrays``: the companions as
    NumPy arrays), in float32."""
    if stored in unpack.fp8:
        w = unpack.fp8[stored]
        return _fp8(data, extra[w.scale], w.block)
    return torch.from_numpy(unpack.numpy(stored, data.cpu().numpy(), arrays)).to(data.device)


def _fp8(bits: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """A float8 e4m3 weight times its scales (each over its block), in float32: the values
    :func:`linnet.lang.weights.fp8.dequantized` gives."""
    scales = block_scales(
        scale.to(torch.float32),
        (bits.shape[0], bits.shape[1]),
        block,
        lambda x, n, axis: x.repeat_interleave(n, axis),
    )
    return bits.to(torch.float32) * scales


def load_gguf(
    ckpt: GGUFCheckpoint,
    device: torch.device,
    dtype: torch.dtype | None = None,
    blocks: dict[str, tuple[int, int, int]] | None = None,
    step: Step | None = None,
    repack: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of a GGUF file, each dequantised on the host (in float32, NumPy) and
    placed on ``device`` as ``dtype`` (default: the float type the model's config gives,
    :attr:`GGUFCheckpoint.dtype`), one tensor at a time; ``blocks``, ``step`` and
    ``repack`` (weights kept quantised: :func:`linnet.lang.weights.gguf_quant.repacked`) as
    for :func:`load_checkpoint`.

    >>> params = load_gguf(read_gguf("smollm2.gguf"), torch.device("cpu"))  # doctest: +SKIP
    """
    from .interpreter import DTYPES

    target = dtype or DTYPES[ckpt.dtype]
    out: dict[str, torch.Tensor] = {}
    from linnet.lang.weights.gguf_quant import repacked

    repack = repack or {}
    for name, tensor in ckpt.tensors.items():
        if name in repack:
            parts = (torch.from_numpy(p).to(_target(device)) for p in repacked(tensor))
            out.update(zip(repack[name], parts))
            continue
        values = tensor.dequantized()
        t = torch.from_numpy(values)  # owned memory: dequantized() never returns the file's
        where = (blocks or {}).get(name)
        if where is not None:
            axis, start, stop = where
            t = t.narrow(axis, start, stop - start)
        t = t.to(device=_target(device), dtype=target).contiguous()
        out.update(step(name, t) if step is not None else {name: t})
    return out


def _owned(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` converted to ``dtype`` (floats only), in memory of its own on the CPU."""
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        return t.to(dtype)  # a new tensor: it does not share the file's pages
    if t.device.type == "cpu":
        # safetensors hands out CPU tensors backed by the memory-mapped file.
        return t.clone()
    return t


def checkpoint_files(path: str | Path) -> tuple[Path, ...]:
    """The shard files of a checkpoint (see :func:`linnet.lang.weights.safetensors.resolve_checkpoint`).

    >>> checkpoint_files("Llama-3.2-1B/")   # doctest: +SKIP
    (PosixPath('Llama-3.2-1B/model.safetensors'),)
    """
    return resolve_checkpoint(path).files


def check_finite_weights(
    params: dict[str, torch.Tensor], shapes: dict[str, Any] | None = None
) -> None:
    """E0666 for each floating-point weight holding a NaN or an infinity (``shapes``, the
    checkpoint's headers, name the shard each is in).

    Cheap: one sum per tensor, on its device, and one synchronisation for the lot (a NaN or
    infinity anywhere makes the sum non-finite, so a finite sum proves the tensor finite).
    Only a tensor whose sum is not finite is looked at again: summed in f64, where finite
    values cannot overflow, then element by element to say where.

    >>> check_finite_weights({"w": torch.tensor([1.0, float("nan")])})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0666]: weight `w` holds 1 NaN ...
    """
    # A meta tensor has a shape and no values (a model loaded to size it): nothing to check.
    floats = [
        (k, t)
        for k, t in params.items()
        if t.is_floating_point() and t.numel() and t.device.type != "meta"
    ]
    suspects = []
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for k, t in floats:
        by_device.setdefault(t.device, []).append((k, t))
    with torch.no_grad():
        for group in by_device.values():
            sums = torch.stack([t.sum().to(torch.float32) for _, t in group])
            suspects += [k for (k, _), ok in zip(group, torch.isfinite(sums).tolist()) if not ok]
        diags = []
        for k in suspects:
            t = params[k]
            if t.dtype != torch.float64 and bool(torch.isfinite(t.sum(dtype=torch.float64))):
                continue  # the sum overflowed f32; every value is finite
            diag = nonfinite_diagnostic(k, t, shapes)
            if diag is not None:
                diags.append(diag)
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


def nonfinite_diagnostic(
    name: str, t: torch.Tensor, shapes: dict[str, Any] | None
) -> Diagnostic | None:
    """E0666 for weight ``name`` naming how many NaN and infinite values it holds and where
    the first is; None when it holds none."""
    from linnet.lang.host.loading import nonfinite_weight
    from linnet.lang.weights.safetensors import shard_of

    nan = torch.isnan(t)
    inf = torch.isinf(t)
    n_nan, n_inf = int(nan.sum()), int(inf.sum())
    if not n_nan and not n_inf:
        return None
    first = torch.nonzero(nan | inf)[0].tolist()
    where = shard_of(shapes.get(name)) if shapes else ""
    return nonfinite_weight(name + where, n_nan, n_inf, first)
