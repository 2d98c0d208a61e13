"""Reading safetensors weights onto a device: memory-mapped, never through pickle."""

from __future__ import annotations

from pathlib import Path

from linnet.lang.diagnostics import Diagnostic, LinnetError
from linnet.lang.weights import safetensors_header

import torch


def load_safetensors(path: str | Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, placed on ``device``.

    The header is validated first (pure Python), so a truncated or corrupt file is a
    Linnet error naming the file and the tensor, not a crash inside the reader.
    """
    safetensors_header(path)  # raises LinnetError E0650/E0651 with a clear message
    from safetensors import SafetensorError, safe_open

    target = str(device) if device.type != "cuda" or device.index is not None else "cuda:0"
    try:
        out = {}
        with safe_open(str(path), framework="pt", device=target) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                out[name] = f.get_tensor(name)
        return out
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise LinnetError(Diagnostic(
            "E0650", f"`{path}` could not be read as safetensors: {exc}",
            help="the file may be truncated or corrupt; save or download it again")) from None
