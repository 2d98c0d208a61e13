"""Float8 checkpoints: linear weights stored as float8 e4m3 with their scales, dequantised as
they load.

This is how transformers' ``fp8`` quantisation (block scales, ``weight_scale_inv``: DeepSeek
and Qwen's FP8 releases), compressed-tensors' ``float-quantized`` format and fbgemm's
``fbgemm_fp8`` (a scale a tensor or a row, ``weight_scale``: the FP8 releases of
Llama and Mistral) save a model. A weight ``X.weight`` of dtype ``F8_E4M3`` whose scale
``X.weight_scale_inv`` or ``X.weight_scale`` is in the checkpoint is read as the float
tensor ``value(bits) * scale`` (the scale broadcast over its block), in the checkpoint's
float type; its scales and a static activation scale (``X.input_scale``) are not parameters
of the model. Activations stay in the model's float type (no float8 product), so the
outputs are those of the dequantised weights, a little closer to the unquantised model's than
an engine computing in float8. A float8 tensor without a scale is still refused (E0723).

The headers decide (no ``config.json`` needed); a ``config.json`` whose
``quantization_config`` names another method (GPTQ, AWQ, bitsandbytes...) is E0692.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.weights.gptq import METHODS as INT4
from linnet.lang.weights.gptq import method_of

FP8 = "F8_E4M3"
# A float8 weight's scale, by the names the formats give it: transformers' `fp8` (block
# scales, multiplied despite the name) and compressed-tensors' / fbgemm's.
SCALE_SUFFIXES = ("_scale_inv", "_scale")
# A static activation scale beside a float8 weight (compressed-tensors): not used here.
ACTIVATION_SCALE = "input_scale"
# quantization_config methods whose weights are float8 with scales (see `accepted`).
METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors")


@dataclass(frozen=True)
class Fp8Weight:
    """A float8 weight's scale tensor and the block of weights each scale element covers
    (``(rows, columns)``; the whole tensor for one scale, ``(1, columns)`` for a row's)."""

    scale: str
    block: tuple[int, int]
    dtype: str  # the float type it is read as (the checkpoint's other float tensors')


def e4m3_value(bits: int) -> float:
    """The value of a float8 e4m3 (``fn``: no infinities, NaN at S.1111.111) byte.

    >>> [e4m3_value(b) for b in (0x00, 0x38, 0x01, 0x7E, 0xC0)]
    [0.0, 1.0, 0.001953125, 448.0, -2.0]
    """
    sign = -1.0 if bits & 0x80 else 1.0
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e4m3_table() -> Any:
    """The 256 values of float8 e4m3 as a float32 NumPy array indexed by the byte.

    >>> float(e4m3_table()[0x38])
    1.0
    """
    import numpy as np

    return np.array([e4m3_value(b) for b in range(256)], dtype=np.float32)


def _side(n: int, blocks: int) -> int | None:
    """The block length that cuts ``n`` into ``blocks`` blocks (the last maybe partial):
    several can (40 in 3: 14 to 19); a power of two first (the formats' 128), else the
    smallest."""
    fits = [b for b in range(max(1, -(-n // blocks)), n + 1) if -(-n // b) == blocks]
    return next((b for b in fits if b & (b - 1) == 0), fits[0] if fits else None)


def _block(
    name: str,
    shape: tuple[int, ...],
    scale: str,
    sshape: tuple[int, ...],
    configured: tuple[int, int] | None = None,
) -> tuple[int, int] | Diagnostic:
    """The block each scale element covers (``configured``: config.json's
    ``weight_block_size``, where it gives one), or E0693 where the scale's shape fits none of
    the layouts (one scale, one a row, one a block of rows and columns)."""
    rows, cols = shape
    if math.prod(sshape) == 1:
        return (rows, cols)
    if sshape in ((rows,), (rows, 1)):
        return (1, cols)
    if len(sshape) == 2 and sshape[0] >= 1 and sshape[1] >= 1:
        if configured is not None:
            br, bc = configured
            if (-(-rows // br), -(-cols // bc)) == sshape:
                return (br, bc)
        else:
            r, c = _side(rows, sshape[0]), _side(cols, sshape[1])
            if r is not None and c is not None:
                return (r, c)
    return Diagnostic(
        "E0693",
        f"float8 weight `{name}` {list(shape)} has scale `{scale}` of shape {list(sshape)}, "
        "which is not one scale, one a row or one a block of rows and columns",
        help="the checkpoint's scales do not belong to its weights; download or save it again",
    )


def fp8_weights(
    tensors: dict[str, tuple[tuple[int, ...], str]],
    configured: tuple[int, int] | None = None,
) -> tuple[dict[str, Fp8Weight], set[str], list[Diagnostic]]:
    """The float8 weights of a checkpoint's tensors (``{name: (shape, safetensors dtype)}``)
    that have a scale: ``({weight: Fp8Weight}, the names that are not parameters (their
    scales and activation scales), problems)``; ``configured``: the scales' block
    (:func:`configured_block`), where the checkpoint's config gives one.

    >>> fp8_weights({"a.weight": ((4, 8), "F8_E4M3"), "a.weight_scale": ((4, 1), "F32"),
    ...              "b": ((4,), "BF16")})[:2]
    ({'a.weight': Fp8Weight(scale='a.weight_scale', block=(1, 8), dtype='bf16')}, {'a.weight_scale'})
    """
    floats = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
    found: dict[str, Fp8Weight] = {}
    dropped: set[str] = set()
    diags: list[Diagnostic] = []
    scales = {n + s for n, (_, dt) in tensors.items() if dt == FP8 for s in SCALE_SUFFIXES}
    others = [floats[dt] for n, (_, dt) in tensors.items() if dt in floats and n not in scales]
    dtype = max(set(others), key=others.count) if others else "bf16"
    for name, (shape, dt) in tensors.items():
        if dt != FP8:
            continue
        scale = next((name + s for s in SCALE_SUFFIXES if name + s in tensors), None)
        if scale is None:
            continue  # refused as an unsupported dtype (E0723)
        sshape, sdt = tuple(tensors[scale][0]), tensors[scale][1]
        if len(shape) != 2 or sdt not in floats:
            diags.append(
                Diagnostic(
                    "E0693",
                    f"float8 weight `{name}` {list(shape)} with scale `{scale}` "
                    f"({sdt}): Linnet dequantises float8 matrices with float scales",
                    help="load the model's unquantised release",
                )
            )
            continue
        block = _block(name, tuple(shape), scale, sshape, configured)
        if isinstance(block, Diagnostic):
            diags.append(block)
            continue
        found[name] = Fp8Weight(scale, block, dtype)
        dropped.add(scale)
        base = name.rsplit(".", 1)[0]
        if base + "." + ACTIVATION_SCALE in tensors:
            dropped.add(base + "." + ACTIVATION_SCALE)
    return found, dropped, diags


def accepted(quantization: Any) -> str | None:
    """``None`` where a ``config.json``'s ``quantization_config`` describes weights Linnet
    loads dequantised (float8 with scales; GPTQ and AWQ int4: :mod:`.gptq`), else why not.

    >>> accepted({"quant_method": "fp8", "weight_block_size": [128, 128]}) is None
    True
    >>> accepted({"quant_method": "bitsandbytes", "load_in_4bit": True})
    'quantised with `bitsandbytes`'
    """
    if not isinstance(quantization, dict):
        return "set to " + json.dumps(quantization)[:40]
    method = quantization.get("quant_method")
    if method in INT4:
        if method_of(quantization) is None:
            return (
                f"{method} with bits {quantization.get('bits', quantization.get('w_bit'))}, "
                f"version {quantization.get('version', quantization.get('checkpoint_format'))} "
                "(Linnet reads 4-bit GPTQ, gptq or gptq_v2 format, and AWQ's gemm layout)"
            )
        return None
    if method not in METHODS:
        return f"quantised with `{method}`"
    if method == "fp8" and quantization.get("fmt", "e4m3") != "e4m3":
        return f"float8 `{quantization.get('fmt')}` (Linnet reads e4m3)"
    if method == "compressed-tensors":
        groups = quantization.get("config_groups") or {}
        for group in groups.values() if isinstance(groups, dict) else [None]:
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict) or (weights.get("num_bits"), weights.get("type")) != (
                8,
                "float",
            ):
                shown = json.dumps(weights)[:60] if weights is not None else "none"
                return f"compressed-tensors weights {shown} (Linnet reads 8-bit float weights)"
    return None


def quantization_diagnostic(quantization: Any, name: str = "config.json") -> Diagnostic | None:
    """E0692 where ``quantization_config`` is a method Linnet does not load, else None."""
    why = accepted(quantization)
    if why is None:
        return None
    return Diagnostic(
        "E0692",
        f"{name}: the checkpoint's weights are {why}, which Linnet does not load yet",
        help="load the model's unquantised release (bf16) and quantise it as it loads with "
        "quantize='int8' or 'int4', or its GGUF file; float8 checkpoints (fp8, fbgemm_fp8, "
        "compressed-tensors float-quantized) and 4-bit GPTQ and AWQ (gemm) load dequantised",
    )


def quantization_of(config_path: Any) -> dict[str, Any] | None:
    """``quantization_config`` of the ``config.json`` at ``config_path``, or None where there
    is none (a config that cannot be read is reported where the config is read, not here).

    >>> quantization_of(None) is None
    True
    """
    if config_path is None:
        return None
    try:
        quant = json.loads(Path(config_path).read_text()).get("quantization_config")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return quant if isinstance(quant, dict) else None


def configured_block(quant: dict[str, Any] | None) -> tuple[int, int] | None:
    """``weight_block_size`` of a ``quantization_config`` (transformers' `fp8`), or None.

    >>> configured_block({"quant_method": "fp8", "weight_block_size": [128, 128]})
    (128, 128)
    """
    block = (quant or {}).get("weight_block_size")
    if not isinstance(block, list) or len(block) != 2:
        return None
    if all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
        return (block[0], block[1])
    return None


def block_scales(scale: Any, shape: tuple[int, int], block: tuple[int, int], repeat: Any) -> Any:
    """``scale`` laid over a ``shape`` weight: one scale (as it is), one a row (``[O, 1]``)
    or each element repeated over its block and cut to the weight's shape (``repeat(x, n,
    axis)`` repeats each element ``n`` times: NumPy's ``np.repeat``, torch's
    ``repeat_interleave``)."""
    rows, cols = shape
    br, bc = block
    if (br, bc) == (rows, cols):
        return scale.reshape(())
    if (br, bc) == (1, cols):
        return scale.reshape(rows, 1)
    grid = scale.reshape(-(-rows // br), -(-cols // bc))
    return repeat(repeat(grid, br, 0)[:rows], bc, 1)[:, :cols]


def dequantized(bits: Any, scale: Any, block: tuple[int, int]) -> Any:
    """A float8 weight's float32 values (NumPy): ``bits`` its bytes as ``uint8 [O, I]``,
    ``scale`` its scales (any float NumPy array), ``block`` as :class:`Fp8Weight`'s.

    >>> import numpy as np
    >>> dequantized(np.array([[0x38, 0xC0]], np.uint8), np.array([[0.5]], np.float32), (1, 2))
    array([[ 0.5, -1. ]], dtype=float32)
    """
    import numpy as np

    scales = block_scales(scale.astype(np.float32), bits.shape, block, np.repeat)
    return (e4m3_table()[bits] * scales).astype(np.float32)
