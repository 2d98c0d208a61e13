"""Shared helpers for the runtime tests."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def toy_config(**extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data
