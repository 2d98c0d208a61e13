"""Checkpoint tensors that are read as other tensors: float8 weights with their scales
(:mod:`.fp8`) and GPTQ / AWQ packed int4 weights (:mod:`.gptq`), each dequantised as it is
read. One plan for the headers (``checkpoint_shapes``: the tensors the model sees) and for
both runtimes' readers (what each stored tensor becomes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.weights.fp8 import (
    Fp8Weight,
    configured_block,
    dequantized,
    fp8_weights,
    quantization_of,
)
from linnet.lang.weights.gptq import Int4Weight, dequantized_int4, int4_weights, method_of


@dataclass
class Unpacking:
    """What a checkpoint's stored tensors become: ``fp8`` (a float8 weight: itself,
    dequantised), ``int4`` (a ``qweight``: its layer's ``weight``), and ``dropped`` (scales,
    zeros, group indices: read only as companions, never parameters)."""

    fp8: dict[str, Fp8Weight] = field(default_factory=dict)
    int4: dict[str, Int4Weight] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.fp8 or self.int4)

    def companions(self) -> set[str]:
        """The tensors to read first (small: scales, zeros, group indices)."""
        out = {w.scale for w in self.fp8.values()}
        for w in self.int4.values():
            out |= {w.qzeros, w.scales} | ({w.g_idx} if w.g_idx else set())
        return out

    def name(self, stored: str) -> str:
        """The parameter a stored tensor is read as."""
        return self.int4[stored].out if stored in self.int4 else stored

    def dtype(self, stored: str) -> str:
        """The float type a dequantised tensor takes (the checkpoint's other floats')."""
        return (self.fp8.get(stored) or self.int4[stored]).dtype

    def numpy(self, stored: str, data: Any, companions: dict[str, Any]) -> Any:
        """The float32 values (NumPy) of the stored tensor ``data`` (its raw array: the bytes
        of a float8 weight as uint8, a ``qweight`` as int32)."""
        if stored in self.fp8:
            w = self.fp8[stored]
            return dequantized(data, companions[w.scale], w.block)
        q = self.int4[stored]
        g_idx = companions[q.g_idx] if q.g_idx else None
        return dequantized_int4(q, data, companions[q.qzeros], companions[q.scales], g_idx)


def unpacking_of(
    tensors: dict[str, tuple[tuple[int, ...], str]], config_path: Any
) -> tuple[Unpacking, list[Diagnostic]]:
    """The :class:`Unpacking` of a checkpoint's tensors (``{name: (shape, safetensors
    dtype)}``) and its config.json's ``quantization_config``, and any problems (E0693,
    E0694).

    >>> unpacking_of({"w": ((2, 2), "BF16")}, None)
    (Unpacking(fp8={}, int4={}, dropped=set()), [])
    """
    quant = quantization_of(config_path)
    fp8, fp8_dropped, problems = fp8_weights(tensors, configured_block(quant))
    int4, int4_dropped, more = int4_weights(tensors, method_of(quant))
    return Unpacking(fp8, int4, fp8_dropped | int4_dropped), problems + more
