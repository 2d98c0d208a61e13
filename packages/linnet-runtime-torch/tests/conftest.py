import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


@pytest.fixture(autouse=True)
def linnet_home(tmp_path, monkeypatch):
    """Each test writes generated source into its own $LINNET_HOME."""
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "linnet-home"))
    return tmp_path / "linnet-home"


def toy_config(**extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data
