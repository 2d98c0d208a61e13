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
        run([*command, "--no-deps", "--no-index", "--target", str(self.path), *map(str, wheels)])

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Python that imports from the site first."""
        paths = [str(self.path), *(p for p in sys.path if p)]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}

    def python(
        self, *args: str, cwd: Path | None = None, **extra: str
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args],
            env=self.env(**extra),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )


def has_pip() -> bool:
    # Asked of the metadata, not the importer: setuptools' distutils hook reacts to looking
    # pip up (and warns).
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def run(command: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Site:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    return Site(tmp_path_factory.mktemp("site"), uv)


ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("linnet-lang", "linnet-plan", "linnet-runtime-torch")


class Venv:
    """A fresh virtual environment (``uv venv``) outside the repository. Third-party
    distributions come from uv.lock's pins, through uv's cache (``--offline``: torch's files
    are hard-linked, not downloaded); Linnet's own only from built wheels (``--no-index``)."""

    def __init__(self, root: Path, uv: str, wheels: dict[str, Path]) -> None:
        self.root = root
        self.uv = uv
        self.wheels = wheels
        self.path = root / "venv"
        root.mkdir(parents=True, exist_ok=True)
        run([uv, "venv", "--quiet", "--python", sys.executable, str(self.path)])
        self.bin = self.path / "bin"
        self.locks = 0

    def install_locked(self, *scope: str) -> None:
        """Third-party dependencies of ``scope`` (uv export's options), as uv.lock pins them."""
        self.locks += 1
        lock = self.root / f"pylock.step{self.locks}.toml"
        run(
            [
                self.uv,
                "export",
                "--quiet",
                "--frozen",
                "--format",
                "pylock.toml",
                "--no-default-groups",
                "--no-emit-workspace",
                *scope,
                "-o",
                str(lock),
            ],
            cwd=ROOT,
        )
        if "[[packages]]" in lock.read_text():
            self.pip("-r", str(lock), "--offline")

    def install(self, *wheels: Path | str) -> None:
        """Wheels (or requirements) resolved against the built wheels and what is installed."""
        links = {str(w.parent) for w in self.wheels.values()}
        self.pip(
            "--no-index", *(f"--find-links={link}" for link in sorted(links)), *map(str, wheels)
        )

    def pip(self, *args: str) -> None:
        run(
            [self.uv, "pip", "install", "--quiet", "--python", str(self.bin / "python"), *args],
            cwd=self.root,
        )

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LINNET_REPO")
        }
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", "")])
        env["LINNET_HOME"] = str(self.root / "home")
        return {**env, **extra}

    def run(
        self, program: str, *args: str, cwd: Path | None = None, **extra: str
    ) -> subprocess.CompletedProcess:
        """``program`` (python, linnet, pytest) of this venv, run outside the repository."""
        return subprocess.run(
            [str(self.bin / program), *args],
            env=self.env(**extra),
            cwd=cwd or self.root,
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture(scope="session")
def built_wheels(tmp_path_factory) -> dict[str, Path]:
    """Each workspace member's wheel, built once a session as a release builds it."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    out = tmp_path_factory.mktemp("wheels")
    wheels: dict[str, Path] = {}
    for name in (*HOSTS, "linnet-flashinfer", "linnet-cublaslt", "linnet-serve"):
        folder = out / name
        run(
            [
                uv,
                "build",
                "--quiet",
                "--package",
                name,
                "--wheel",
                "--no-sources",
                "--offline",
                "--out-dir",
                str(folder),
            ],
            cwd=ROOT,
        )
        (wheels[name],) = folder.glob("*.whl")
    return wheels


@pytest.fixture
def fresh_venv(tmp_path, built_wheels):
    """A factory of fresh, empty venvs that install from ``built_wheels``."""
    uv = shutil.which("uv")
    assert uv is not None
    count = iter(range(100))

    def make() -> Venv:
        return Venv(tmp_path / f"v{next(count)}", uv, built_wheels)

    return make
