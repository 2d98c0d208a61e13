import pytest


@pytest.fixture(autouse=True)
def linnet_home(tmp_path, monkeypatch):
    """Each test writes generated source into its own $LINNET_HOME."""
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "linnet-home"))
    return tmp_path / "linnet-home"
