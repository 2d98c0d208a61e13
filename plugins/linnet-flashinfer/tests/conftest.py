"""Fixtures every test file of the plugin shares."""

import linnet.torch.flashinfer as fi
import linnet.torch.flashinfer.planning as planning
import pytest
from flashinfer_fakes import FakeWrapper, fake_flashinfer


@pytest.fixture(autouse=True)
def linnet_home(tmp_path, monkeypatch):
    """Each test writes generated source and timings into its own $LINNET_HOME."""
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "linnet-home"))


@pytest.fixture
def installed(monkeypatch):
    """FlashInfer 'installed' (the stand-in wrapper of flashinfer_fakes.py)."""
    monkeypatch.setattr(fi, "_flashinfer_installed", lambda: True)
    monkeypatch.setattr(planning, "_flashinfer", fake_flashinfer)
    FakeWrapper.made.clear()
