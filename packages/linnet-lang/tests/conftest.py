"""Every graph the tests lower is verified after lowering and after each pass."""

import pytest
from linnet.lang.ir import verify


@pytest.fixture(autouse=True)
def verify_graphs(monkeypatch):
    """As under LINNET_DEBUG=1 (without its other effects: the CLI's tracebacks)."""
    monkeypatch.setattr(verify, "ALWAYS", True)
