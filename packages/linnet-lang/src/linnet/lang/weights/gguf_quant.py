"""GGUF blocks kept quantised: llama.cpp's Q8_0, Q4_0 and Q4_1 repacked, once at load, into
the layouts of ``std.nn.linear::linear_q8`` and ``linear_q4`` (group 32), with no float copy.

Each format is a run of 32-weight blocks along a row, each block an f16 scale ``d`` (and for
Q4_1 an f16 offset ``m``) then its levels:

* **Q8_0** (34 bytes): 32 int8 ``q``; ``w = d * q``. Kept as ``weight_q8 = q``,
  ``weight_scale = d``.
* **Q4_0** (18 bytes): 16 bytes, weight j in the low nibble of byte j and weight j + 16 in
  its high nibble; ``w = d * (level - 8)``. Kept as levels repacked (weight 2j low, 2j + 1
  high), ``weight_scale = d``, ``weight_min = -8 d`` (exact in f16).
* **Q4_1** (20 bytes): as Q4_0 after ``d`` and ``m``; ``w = d * level + m``.

The kept model computes each weight as ``gguf.quants.dequantize`` does, in f32 (the products
are exact), rounded to the model's float type as the dequantising loader rounds it: kept and
dequantised give equal weights, and equal results up to the order of f32 sums.

>>> KEPT["Q4_1"], KEPT["Q8_0"]
('int4', 'int8')
"""

from __future__ import annotations

from typing import Any

#: GGUF quant type -> the format it is kept in.
KEPT = {"Q8_0": "int8", "Q4_0": "int4", "Q4_1": "int4"}
#: Weights per GGUF block: the group of the kept format.
GROUP = 32
_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def repacked(tensor: Any) -> tuple[Any, ...]:
    """The arrays that replace a Q8_0, Q4_0 or Q4_1 :class:`~linnet.lang.weights.gguf.GGUFTensor`
    ``[O, I]``: ``(q int8 [O, I], d f16 [O, I / 32])`` or ``(q uint8 [O, I / 2],
    d f16 [O, I / 32], m f16 [O, I / 32])``, rows un-permuted as the dequantising loader
    does, each in memory of its own.

    >>> q, d, m = repacked(ckpt.tensors["model.layers.0.mlp.up_proj.weight"])  # doctest: +SKIP
    """
    import numpy as np

    rows, cols = tensor.shape
    groups = cols // GROUP
    raw = np.asarray(tensor.blocks, dtype=np.uint8).reshape(rows, groups, _BYTES[tensor.quant])
    d = raw[..., 0:2].copy().view(np.float16).reshape(rows, groups)
    if tensor.quant == "Q8_0":
        parts: tuple[Any, ...] = (raw[..., 2:].copy().view(np.int8).reshape(rows, cols), d)
    else:
        if tensor.quant == "Q4_1":
            m = raw[..., 2:4].copy().view(np.float16).reshape(rows, groups)
            qs = raw[..., 4:]
        else:
            m = (d.astype(np.float32) * -8.0).astype(np.float16)
            qs = raw[..., 2:]
        # GGUF: weight j low nibble, j + 16 high; linear_q4: weight 2j low, 2j + 1 high.
        level = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(rows, cols)
        packed = level[:, 0::2] | (level[:, 1::2] << 4)
        parts = (packed.astype(np.uint8), d, m)
    if tensor.permute_heads is not None:
        heads = tensor.permute_heads
        parts = tuple(
            p.reshape(heads, rows // heads // 2, 2, *p.shape[1:]).swapaxes(1, 2).reshape(p.shape)
            for p in parts
        )
    return tuple(np.ascontiguousarray(p) for p in parts)


def keepable(tensor: Any) -> bool:
    """Whether ``tensor`` can be kept quantised: a Q8_0/Q4_0/Q4_1 matrix stored as the model's
    parameter (not transposed, no offset added) whose rows are whole blocks.

    >>> keepable(ckpt.tensors["model.norm.weight"])  # doctest: +SKIP
    False
    """
    return (
        tensor.quant in KEPT
        and len(tensor.shape) == 2
        and not tensor.transpose
        and not tensor.offset
        and tensor.shape[1] % GROUP == 0
    )


__all__ = ["GROUP", "KEPT", "keepable", "repacked"]
