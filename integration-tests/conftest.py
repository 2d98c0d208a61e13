"""Fixtures for tests that build real plugin distributions and install them beside Linnet."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


class Site:
    """A folder that wheels are installed into (``--target``), and a Python that sees it
    before everything the test process sees."""

    def __init__(self, root: Path, uv: str) -> None:
        self.root = root
        self.uv = uv
        self.path = root / "site"
        self.path.mkdir(parents=True, exist_ok=True)

    def build(self, project: Path) -> Path:
        """Build ``project`` (a folder with a pyproject.toml) into a wheel; return it."""
        out = self.root / "wheels" / project.name
        run([self.uv, "build", "--wheel", "--out-dir", str(out), str(project)])
        (wheel,) = out.glob("*.whl")
        return wheel

    def install(self, *wheels: Path) -> None:
        if has_pip():
            command = [sys.executable, "-m", "pip", "install", "--quiet"]
        else:  # a uv-made virtual environment has no pip
            command = [self.uv, "pip", "install", "--quiet", "--python", sys.executable]
        run([*command, "--no-deps", "--no-index", "--target", str(self.path),
             *map(str, wheels)])

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Python that imports from the site first."""
        paths = [str(self.path), *(p for p in sys.path if p)]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}

    def python(self, *args: str, cwd: Path | None = None, **extra: str
               ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], env=self.env(**extra), cwd=cwd,
                              capture_output=True, text=True, timeout=300)


def has_pip() -> bool:
    # Asked of the metadata, not the importer: setuptools' distutils hook reacts to looking
    # pip up (and warns).
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Site:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    return Site(tmp_path_factory.mktemp("site"), uv)
