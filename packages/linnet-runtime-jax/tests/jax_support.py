"""Shared helpers for linnet-runtime-jax's tests."""

import json
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def toy_config(**extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


@contextmanager
def x64():
    """64-bit jax inside the block (the random programs use i64 and f64)."""
    import jax

    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)
