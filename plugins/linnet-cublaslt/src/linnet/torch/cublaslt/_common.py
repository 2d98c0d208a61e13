"""Constants the executable and the cuBLASLt layer share."""

from __future__ import annotations

import torch

A_ALIGNMENT = 16
"""The alignment, in bytes, that plans assume of the input ``x``: activations are fresh
allocations (256 bytes or more), but a view may start anywhere; ``execute`` copies an input
aligned less than this (or not contiguous) into a staging buffer first."""

TORCH_TYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

INSTALL = "install `linnet-cublaslt[cu13]` on CUDA 13 or `linnet-cublaslt[cu12]` on CUDA 12"
"""How to get nvmath-python, the extra a plain install leaves out."""
