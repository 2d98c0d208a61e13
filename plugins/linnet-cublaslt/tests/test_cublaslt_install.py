"""The distribution: its wheel ships linnet/torch/cublaslt only, declares nvmath-python in
extras only, and Linnet finds the backend through the ``linnet.backends`` entry point, both
where the workspace installs it (editable) and from wheels installed beside
linnet-runtime-torch's (the way integration-tests/ installs plugins)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from linnet.backends import discover

PLUGIN = Path(__file__).resolve().parents[1]
ROOT = PLUGIN.parents[1]
RUNTIME = ROOT / "packages" / "linnet-runtime-torch"

FIND = """
import json, sys
import linnet.torch.cublaslt as plugin
from linnet.backends import Target, discover
found = discover()
backend = next(f for f in found.found if f.name == "cublaslt")
print(json.dumps({
    "module": plugin.__file__,
    "nvmath": "nvmath" in sys.modules,
    "distribution": backend.distribution,
    "path": backend.path,
    "skipped": [str(r) for r in found.skipped if r.name == "cublaslt"],
    "reason": (backend.backend.probe(Target("cpu")), backend.backend.last_reason)[1],
}))
"""


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


def has_pip() -> bool:
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    if not RUNTIME.is_dir():  # run from a copy of the plugin, outside the workspace
        pytest.skip("needs the Linnet workspace (packages/) to build the runtime's wheel")
    out = tmp_path_factory.mktemp("wheels")
    built = {}
    for name, project in (("plugin", PLUGIN), ("runtime", RUNTIME)):
        run([uv, "build", "--wheel", "--out-dir", str(out / name), str(project)])
        (built[name],) = (out / name).glob("*.whl")
    return built


def test_the_workspace_install_is_discovered():
    found = {f.name: f for f in discover().found}
    assert "cublaslt" in found, [str(r) for r in discover().skipped]
    assert found["cublaslt"].distribution == "linnet-cublaslt"
    assert found["cublaslt"].path.startswith("linnet.torch.cublaslt:CublasLt")


@pytest.mark.slow
def test_the_wheel_ships_the_module_and_optional_nvmath(wheels):
    with zipfile.ZipFile(wheels["plugin"]) as wheel:
        names = wheel.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(info).decode()
        entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
    code = [n for n in names if ".dist-info/" not in n]
    assert code and all(n.startswith("linnet/torch/cublaslt/") for n in code), code
    assert "linnet/__init__.py" not in names and "linnet/torch/__init__.py" not in names
    assert "[linnet.backends]\ncublaslt = linnet.torch.cublaslt:CublasLt" in entry_points
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    nvmath = [line for line in requires if "nvmath-python" in line]
    assert len(nvmath) == 2 and all("extra ==" in line for line in nvmath), nvmath
    for cuda in ("cu12", "cu13"):
        assert any(
            f"nvmath-python[{cuda}]" in line and f"extra == {cuda!r}" in line.replace('"', "'")
            for line in nvmath
        ), nvmath


@pytest.mark.slow
def test_the_installed_wheel_is_discovered(wheels, tmp_path):
    site = tmp_path / "site"
    uv = shutil.which("uv")
    assert uv is not None
    if has_pip():
        command = [sys.executable, "-m", "pip", "install", "--quiet"]
    else:  # a uv-made virtual environment has no pip
        command = [uv, "pip", "install", "--quiet", "--python", sys.executable]
    run(
        [
            *command,
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheels["plugin"]),
            str(wheels["runtime"]),
        ]
    )
    paths = [str(site), *(p for p in sys.path if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, "-c", FIND], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["module"] == str(site / "linnet" / "torch" / "cublaslt" / "__init__.py")
    assert result["distribution"] == "linnet-cublaslt"
    assert str(site) in result["path"]
    assert result["nvmath"] is False  # found and probed without importing nvmath
    cpu = "cuBLASLt runs on CUDA devices only; this target is cpu"
    if importlib.util.find_spec("nvmath") is None:  # every reason at once (issue 46 item 13)
        assert result["reason"].startswith(f"{cpu}; nvmath-python is not installed either")
    else:
        assert result["reason"] == cpu
    # The workspace's editable install of the same distribution is the only one left out.
    assert all("another backend named cublaslt" in r for r in result["skipped"])

    listed = subprocess.run(
        [sys.executable, "-m", "linnet.lang.cli", "backends", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    backend = next(b for b in data["available"] + data["unavailable"] if b["name"] == "cublaslt")
    assert backend["distribution"] == "linnet-cublaslt" and backend["version"] == "0.1.0"
    # "available" means it can run here: never on a machine without a CUDA device.
    if not any(t["kind"] == "cuda" for t in data["machine"]["targets"]):
        assert backend in data["unavailable"] and backend["runnable"] is False
