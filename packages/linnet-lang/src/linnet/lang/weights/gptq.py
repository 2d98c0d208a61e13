"""GPTQ and AWQ int4 checkpoints: linear weights packed eight 4-bit levels to an int32, with
per-group f16 scales and packed zero points, dequantised as they load.

A layer ``X`` of such a checkpoint holds ``X.qweight`` (int32), ``X.qzeros`` (int32),
``X.scales`` (f16) and, for GPTQ, ``X.g_idx`` (each input's group); its config.json's
``quantization_config`` says which (``quant_method`` ``gptq`` or ``awq``, ``bits`` 4). The
weight ``X.weight [O, I]`` is read as ``(level - zero) * scale`` of each input's group, in
float32, then the model's float type:

- GPTQ (AutoGPTQ / GPTQModel, ``checkpoint_format`` ``gptq``): ``qweight [I / 8, O]`` packs
  inputs ``8j .. 8j + 7`` of an output into row ``j`` (input ``8j + k`` in bits ``4k``);
  ``qzeros [G, O / 8]`` packs outputs the same way and stores ``zero - 1`` in four bits (so
  a zero of 0 is stored as 15; ``gptq_v2``: the zero itself); ``g_idx [I]`` is each input's group (act-order checkpoints
  permute it).
- AWQ (AutoAWQ's GEMM layout, ``version`` ``gemm``): ``qweight [I, O / 8]`` packs outputs
  ``8j .. 8j + 7`` of an input into column ``j`` in the order 0, 2, 4, 6, 1, 3, 5, 7 (output
  ``8j + order[k]`` in bits ``4k``), ``qzeros [G, O / 8]`` likewise, and input ``i`` is in group
  ``i // (I / G)``.

The weights are not kept in 4 bits (that needs the checkpoint's groups to be Linnet's
``linear_q4`` layout, and a zero point that is not a power-of-two multiple of the scale to be
rounded: not yet); ``quantize="int4"`` quantises the dequantised weights again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError

METHODS = ("gptq", "awq")
# AutoAWQ's packing order: output 8j + AWQ_ORDER[k] is in bits 4k of column j.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
COMPANIONS = ("qzeros", "scales", "g_idx")


@dataclass(frozen=True)
class Int4Weight:
    """How ``<layer>.qweight`` becomes ``<layer>.weight``: the method, the companions' names,
    the weight's ``(outputs, inputs)``, the group count and whether the stored zeros are
    one less than the zeros (GPTQ's v1 format)."""

    method: str
    out: str
    qzeros: str
    scales: str
    g_idx: str | None
    shape: tuple[int, int]
    groups: int
    zero_offset: int
    dtype: str


def method_of(quantization: Any) -> dict[str, Any] | None:
    """The ``quantization_config`` where it is GPTQ or AWQ int4 in a layout Linnet reads
    (:data:`METHODS`), else None.

    >>> method_of({"quant_method": "gptq", "bits": 4, "group_size": 128})["quant_method"]
    'gptq'
    >>> method_of({"quant_method": "awq", "bits": 4, "version": "gemv"}) is None
    True
    """
    if not isinstance(quantization, dict) or quantization.get("quant_method") not in METHODS:
        return None
    if quantization.get("bits", quantization.get("w_bit")) != 4:
        return None
    if (
        quantization["quant_method"] == "awq"
        and str(quantization.get("version", "gemm")).lower() != "gemm"
    ):
        return None
    if quantization["quant_method"] == "gptq" and quantization.get(
        "checkpoint_format", "gptq"
    ) not in (
        "gptq",
        "gptq_v2",
    ):
        return None
    return quantization


def int4_weights(
    tensors: dict[str, tuple[tuple[int, ...], str]], quantization: dict[str, Any] | None
) -> tuple[dict[str, Int4Weight], set[str], list[Diagnostic]]:
    """The packed int4 weights of a checkpoint's tensors (``{name: (shape, safetensors
    dtype)}``) under a GPTQ or AWQ ``quantization`` (:func:`method_of`): ``({qweight name:
    Int4Weight}, the companions' names, problems (E0694))``.

    >>> w, dropped, _ = int4_weights(
    ...     {"a.qweight": ((4, 16), "I32"), "a.qzeros": ((1, 2), "I32"),
    ...      "a.scales": ((1, 16), "F16"), "a.g_idx": ((32,), "I32"), "e": ((9, 4), "BF16")},
    ...     {"quant_method": "gptq", "bits": 4})
    >>> w["a.qweight"].shape, w["a.qweight"].groups, sorted(dropped)
    ((16, 32), 1, ['a.g_idx', 'a.qzeros', 'a.scales'])
    """
    if quantization is None:
        return {}, set(), []
    method = quantization["quant_method"]
    floats = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
    names = {n for n in tensors if n.endswith(".qweight")}
    companions = {n.removesuffix("qweight") + c for n in names for c in COMPANIONS}
    others = [floats[dt] for n, (_, dt) in tensors.items() if dt in floats and n not in companions]
    dtype = max(set(others), key=others.count) if others else "f16"
    offset = (
        1 if method == "gptq" and quantization.get("checkpoint_format", "gptq") == "gptq" else 0
    )
    found: dict[str, Int4Weight] = {}
    dropped: set[str] = set()
    diags: list[Diagnostic] = []
    for name in sorted(names):
        base = name.removesuffix("qweight")
        shape, dt = tensors[name]
        zeros, scales = tensors.get(base + "qzeros"), tensors.get(base + "scales")
        g_idx = tensors.get(base + "g_idx")
        why = ""
        if zeros is None or scales is None:
            why = f"has no `{base}qzeros` and `{base}scales` beside it"
        elif dt != "I32" or zeros[1] != "I32" or scales[1] not in floats:
            why = f"is {dt} with qzeros {zeros[1]} and scales {scales[1]} (int32, int32, float)"
        elif len(shape) != 2 or len(scales[0]) != 2 or len(zeros[0]) != 2:
            why = "or its qzeros or scales is not a matrix"
        else:
            groups, outputs = scales[0]
            inputs = shape[0] * 8 if method == "gptq" else shape[0]
            packed_out = shape[1] if method == "gptq" else shape[1] * 8
            if packed_out != outputs or tuple(zeros[0]) != (groups, -(-outputs // 8)):
                why = (
                    f"{list(shape)} does not fit scales {list(scales[0])} and qzeros "
                    f"{list(zeros[0])} as {method} lays them out"
                )
            elif groups < 1 or inputs % groups:
                why = f"has {inputs} inputs in {groups} groups"
            elif g_idx is not None and tuple(g_idx[0]) != (inputs,):
                why = f"has g_idx {list(g_idx[0])} for {inputs} inputs"
        if why:
            diags.append(
                Diagnostic(
                    "E0694",
                    f"{method} weight `{name}` {why}",
                    help="the checkpoint's packed tensors do not belong together; download "
                    "or save it again",
                )
            )
            continue
        found[name] = Int4Weight(
            method,
            base + "weight",
            base + "qzeros",
            base + "scales",
            base + "g_idx" if g_idx is not None and method == "gptq" else None,
            (outputs, inputs),
            groups,
            offset,
            dtype,
        )
        dropped.update(base + c for c in COMPANIONS if base + c in tensors)
    return found, dropped, diags


def _nibbles(packed: Any, axis: int) -> Any:
    """Each int32 of ``packed`` as its eight 4-bit values (bits 4k at position k), laid
    along ``axis`` (0: rows become 8 rows each; 1: columns become 8 columns each)."""
    import numpy as np

    shifts = np.arange(8, dtype=np.uint32) * 4
    bits = packed.astype(np.uint32)
    if axis == 0:
        return ((bits[:, None, :] >> shifts[None, :, None]) & 15).reshape(-1, bits.shape[1])
    return ((bits[:, :, None] >> shifts[None, None, :]) & 15).reshape(bits.shape[0], -1)


def dequantized_int4(w: Int4Weight, qweight: Any, qzeros: Any, scales: Any, g_idx: Any) -> Any:
    """The float32 ``[O, I]`` weight (NumPy) of a GPTQ or AWQ layer.

    >>> import numpy as np
    >>> w = Int4Weight("gptq", "a.weight", "", "", None, (1, 8), 1, 1, "f32")
    >>> q = np.array([[0x76543210]], np.int32)          # inputs 0..7 at levels 0..7
    >>> z = np.array([[0x7]], np.int32)                 # stored zero 7: zero 8
    >>> dequantized_int4(w, q, z, np.array([[0.5]], np.float16), None)
    array([[-4. , -3.5, -3. , -2.5, -2. , -1.5, -1. , -0.5]], dtype=float32)
    """
    import numpy as np

    outputs, inputs = w.shape
    if w.method == "gptq":
        levels = _nibbles(qweight, 0)  # [I, O]
        zeros = _nibbles(qzeros, 1)[:, :outputs]
    else:
        order = np.argsort(AWQ_ORDER)  # output 8j + c is nibble order[c] of column j
        columns = (np.arange(-(-outputs // 8) * 8) // 8) * 8
        pick = columns + np.tile(order, -(-outputs // 8))
        levels = _nibbles(qweight, 1)[:, pick][:, :outputs]
        zeros = _nibbles(qzeros, 1)[:, pick][:, :outputs]
    if g_idx is None:
        groups = np.arange(inputs) // (inputs // w.groups)
    else:
        groups = np.asarray(g_idx).astype(np.int64)
        bad = np.flatnonzero((groups < 0) | (groups >= w.groups))
        if bad.size:
            raise LinnetError(
                Diagnostic(
                    "E0694",
                    f"gptq weight `{w.out}`: g_idx gives input {int(bad[0])} group "
                    f"{int(groups[bad[0]])} of {w.groups}",
                    help="the checkpoint's packed tensors do not belong together; download "
                    "or save it again",
                )
            )
    # GPTQ's v1 stores zero - 1 in four bits: a zero of 0 is stored as 15, read back as 0.
    zero = ((zeros.astype(np.int64) + w.zero_offset) & 15).astype(np.float32)[groups]
    weight = (levels.astype(np.float32) - zero) * scales.astype(np.float32)[groups]
    return np.ascontiguousarray(weight.T)
