"""scripts/release, run in a scratch copy of this work tree: one package released alone gets a
tagged, installable wheel that installs beside the other packages' current wheels; a release
that cannot go on stops with rc 2 and a sentence, leaving git as it was."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def scratch(tmp_path) -> Path:
    """The work tree as it is (tracked and new files, uncommitted edits too), as a fresh repo."""
    if shutil.which("uv") is None or shutil.which("git") is None:
        pytest.skip("needs uv and git on PATH")
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    clone = tmp_path / "clone"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    git(clone, "init", "--quiet")
    git(clone, "add", "-A")
    git(
        clone,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "commit",
        "--quiet",
        "-m",
        "scratch",
    )
    git(clone, "config", "user.name", "t")
    git(clone, "config", "user.email", "t@example.com")
    return clone


def release(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(clone / "scripts" / "release"), *args],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_member_has_one_version_source():
    """No member writes its version in pyproject.toml: hatch reads the `__version__` line."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = [
        f for pattern in root["tool"]["uv"]["workspace"]["members"] for f in ROOT.glob(pattern)
    ] + [ROOT / "plugins" / "template"]
    assert (
        len(folders) == 8
    )  # 5 packages (linnet-runtime-jax: issue 16, linnet-serve: issue 44), 2 plugins, the template
    for folder in folders:
        project = tomllib.loads((folder / "pyproject.toml").read_text())
        assert "version" not in project["project"], folder
        assert project["project"]["dynamic"] == ["version"], folder
        source = folder / project["tool"]["hatch"]["version"]["path"]
        assert len(re.findall(r'^__version__ = "', source.read_text(), re.MULTILINE)) == 1
        # Our packages admit each other's next minor versions: each releases alone.
        for text in project["project"]["dependencies"]:
            if text.startswith("linnet-"):
                assert text.endswith(">=0.1,<1"), (folder, text)


@pytest.mark.slow
def test_release_one_package_alone(scratch):
    done = release(scratch, "linnet-plan", "0.2.0", "--offline")
    assert done.returncode == 0, done.stdout + done.stderr
    assert git(scratch, "tag", "--list").split() == ["linnet-plan-v0.2.0"]
    assert git(scratch, "log", "-1", "--format=%s").strip() == "release linnet-plan 0.2.0"
    assert git(scratch, "status", "--porcelain", "--untracked-files=no") == ""
    source = scratch / "packages/linnet-plan/src/linnet/backends/__init__.py"
    assert '__version__ = "0.2.0"' in source.read_text()
    changelog = (scratch / "packages/linnet-plan/CHANGELOG.md").read_text()
    assert re.search(
        r"^## Unreleased\n\n## 0\.2\.0 \(\d{4}-\d\d-\d\d\)\n- Backend contract",
        changelog,
        re.MULTILINE,
    ), changelog
    assert "(unreleased)" not in changelog
    (wheel,) = (scratch / "dist" / "linnet-plan-0.2.0").glob("*.whl")
    assert wheel.name == "linnet_plan-0.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("linnet_plan-0.2.0.dist-info/METADATA").decode()
    assert "Version: 0.2.0" in metadata
    assert "Requires-Dist: linnet-lang<1,>=0.1" in metadata
    # The smoke test installed it alone, then beside every other member at 0.1.0.
    assert "linnet-plan 0.2.0 imports alone" in done.stdout
    installed = dict(re.findall(r"^(linnet-[a-z-]+) +(\S+)$", done.stdout, re.MULTILINE))
    assert installed == {
        "linnet-lang": "0.1.0",
        "linnet-plan": "0.2.0",
        "linnet-runtime-torch": "0.1.0",
        "linnet-runtime-jax": "0.1.0",
        "linnet-flashinfer": "0.1.0",
        "linnet-cublaslt": "0.1.0",
        "linnet-serve": "0.1.0",
    }
    # The lock holds no member version: a release leaves it matching.
    check = subprocess.run(
        ["uv", "lock", "--check", "--offline"], cwd=scratch, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_refusals_leave_git_as_it_was(scratch):
    head = git(scratch, "rev-parse", "HEAD")
    cases = {
        ("linnet-nope", "0.2.0"): "is not a workspace member",
        ("linnet-plan", "0.1.0"): "is not newer",
        ("linnet-plan", "0.0.9"): "is not newer",
        ("linnet-plan", "v0.2"): "is not a release version",
        ("linnet-plan", "0.2.0; rm -rf /"): "is not a release version",
        # runtime-torch and the plugins require linnet-plan<1: a 1.0 would break them.
        ("linnet-plan", "1.0.0"): "widen that range",
    }
    for args, message in cases.items():
        done = release(scratch, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    git(scratch, "tag", "linnet-lang-v0.2.0")
    done = release(scratch, "linnet-lang", "0.2.0")
    assert done.returncode == 2 and "exists already" in done.stderr, done.stderr
    (scratch / "packages/linnet-plan/README.md").write_text("edited\n")
    done = release(scratch, "linnet-plan", "0.2.0")
    assert done.returncode == 2 and "uncommitted changes" in done.stderr, done.stderr
    assert git(scratch, "rev-parse", "HEAD") == head
    assert git(scratch, "tag", "--list").split() == ["linnet-lang-v0.2.0"]
    assert (
        '__version__ = "0.1.0"'
        in (scratch / "packages/linnet-plan/src/linnet/backends/__init__.py").read_text()
    )


def test_a_failed_build_undoes_the_commit_and_tag(scratch):
    # A pyproject that hatch refuses (a version both static and dynamic): the build fails
    # after the commit and tag, and the release must take both back.
    pyproject = scratch / "packages/linnet-plan/pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'dynamic = ["version"]', 'dynamic = ["version"]\nversion = "0.1.0"'
        )
    )
    git(scratch, "commit", "--quiet", "-am", "break the build")
    head = git(scratch, "rev-parse", "HEAD")
    done = release(scratch, "linnet-plan", "0.2.0", "--offline", "--no-beside")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "undone: the release commit and tag linnet-plan-v0.2.0 are removed" in done.stderr
    assert git(scratch, "rev-parse", "HEAD") == head
    assert git(scratch, "tag", "--list") == ""
