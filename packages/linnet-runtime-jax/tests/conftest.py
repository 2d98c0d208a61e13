import sys
from pathlib import Path

import pytest
from linnet.lang.ir import verify

# The NumPy reference (reference.py) and the random programs (indexgen.py) of linnet-lang's
# tests run against the generated JAX too.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "linnet-lang" / "tests"))


@pytest.fixture(autouse=True)
def linnet_home(tmp_path, monkeypatch):
    """Each test writes generated source into its own $LINNET_HOME."""
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "linnet-home"))
    return tmp_path / "linnet-home"


@pytest.fixture(autouse=True)
def verify_graphs(monkeypatch):
    """Every graph lowered is verified after lowering and each pass."""
    monkeypatch.setattr(verify, "ALWAYS", True)
