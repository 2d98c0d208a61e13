"""linnet-flashinfer as a distribution: its wheel ships ``linnet/torch/flashinfer/`` only (no
``linnet/__init__.py`` or ``linnet/torch/__init__.py``, which belong to Linnet's own
distributions), keeps FlashInfer in the ``cuda`` extra, installs beside linnet-runtime-torch
and is found through its entry point. Builds real wheels (uv build) and installs them with
``pip install --target``, as integration-tests/conftest.py does.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1]
REPO = PLUGIN.parents[1]
RUNTIME = ("linnet-lang", "linnet-plan", "linnet-runtime-torch")

CHECK = """
import json, sys
import linnet.torch, linnet.torch.flashinfer
from linnet.backends import discover
found = discover()
print(json.dumps({
    "torch_package": linnet.torch.__file__,
    "plugin": linnet.torch.flashinfer.__file__,
    "flashinfer_imported": "flashinfer" in sys.modules,
    "found": {f.name: f.distribution for f in found.found},
    "skipped": [str(r) for r in found.skipped],
}))
"""


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done


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
    if not (REPO / "packages" / "linnet-runtime-torch").is_dir():
        pytest.skip("needs the Linnet workspace (packages/) to build the runtime's wheels")
    out = tmp_path_factory.mktemp("wheels")
    built = {}
    for name, folder in [(n, REPO / "packages" / n) for n in RUNTIME] + [
        ("linnet-flashinfer", PLUGIN)
    ]:
        run([uv, "build", "--wheel", "--out-dir", str(out / name), str(folder)])
        (built[name],) = (out / name).glob("*.whl")
    return built


def install(target: Path, *wheel_files: Path) -> None:
    if has_pip():
        command = [sys.executable, "-m", "pip", "install", "--quiet"]
    else:  # a uv-made virtual environment has no pip
        command = [
            shutil.which("uv") or "uv",
            "pip",
            "install",
            "--quiet",
            "--python",
            sys.executable,
        ]
    run([*command, "--no-deps", "--no-index", "--target", str(target), *map(str, wheel_files)])


def python(site: Path, code: str) -> subprocess.CompletedProcess:
    paths = [str(site), *(p for p in sys.path if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_wheel_ships_only_its_module_and_keeps_flashinfer_optional(wheels):
    with zipfile.ZipFile(wheels["linnet-flashinfer"]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        points = wheel.read(next(n for n in names if n.endswith("entry_points.txt")))
    modules = sorted(n for n in names if not n.split("/")[0].endswith(".dist-info"))
    assert modules == [
        "linnet/torch/flashinfer/__init__.py",
        "linnet/torch/flashinfer/__main__.py",
        "linnet/torch/flashinfer/planning.py",
        "linnet/torch/flashinfer/variants.py",
    ]
    text = metadata.decode()
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    flashinfer = [r for r in requires if "flashinfer-python" in r]
    assert len(flashinfer) == 1, requires
    assert flashinfer[0].replace('"', "'").endswith("extra == 'cuda'"), requires
    assert "Provides-Extra: cuda" in text
    assert "flashinfer = linnet.torch.flashinfer:FlashInfer" in points.decode()
    assert "[linnet.backends]" in points.decode()


@pytest.mark.slow
def test_installed_beside_the_runtime_it_imports_and_is_found(wheels, tmp_path):
    site = tmp_path / "site"
    install(site, *wheels.values())
    done = python(site, CHECK)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    # linnet.torch (the runtime's) and the plugin both come from the one folder.
    assert result["torch_package"] == str(site / "linnet" / "torch" / "__init__.py")
    assert result["plugin"] == str(site / "linnet" / "torch" / "flashinfer" / "__init__.py")
    assert result["found"].get("flashinfer") == "linnet-flashinfer"
    assert not [r for r in result["skipped"] if r.startswith("flashinfer")]
    assert result["flashinfer_imported"] is False  # FlashInfer is imported on first use only


@pytest.mark.slow
def test_apart_from_the_runtime_it_still_imports(wheels, tmp_path):
    """``linnet.torch`` extends its path to every ``linnet/torch`` folder on sys.path, so the
    plugin installed in a folder of its own (the runtime elsewhere) imports too."""
    site = tmp_path / "apart"
    install(site, wheels["linnet-flashinfer"])
    done = python(site, CHECK)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["plugin"] == str(site / "linnet" / "torch" / "flashinfer" / "__init__.py")


def test_the_workspace_imports_it_editable():
    import linnet.torch
    import linnet.torch.flashinfer

    plugin = Path(linnet.torch.flashinfer.__file__).resolve()
    if PLUGIN / "src" not in plugin.parents:
        pytest.skip("installed from a wheel, not editable")
    # Editable: the module stays in plugins/linnet-flashinfer/src, away from linnet.torch,
    # and imports through linnet.torch's extended path.
    assert Path(linnet.torch.__file__).resolve().parent != plugin.parent.parent
