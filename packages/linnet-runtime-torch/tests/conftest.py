import pytest
from linnet.lang.ir import verify


@pytest.fixture(autouse=True)
def linnet_home(tmp_path, monkeypatch):
    """Each test writes generated source into its own $LINNET_HOME."""
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "linnet-home"))
    return tmp_path / "linnet-home"


@pytest.fixture(autouse=True)
def verify_graphs(monkeypatch):
    """Every graph lowered is verified after lowering and each pass (as under LINNET_DEBUG=1,
    without its other effects)."""
    monkeypatch.setattr(verify, "ALWAYS", True)
