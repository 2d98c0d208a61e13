"""The backend template (plugins/template), copied as a third party would: it builds,
installs, is found by discovery, and its own tests pass."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "plugins" / "template"

FIND = """
import json, sys
import linnet_backend_example
torch_imported = "torch" in sys.modules
from linnet.backends import discover
found = discover()
print(json.dumps({"torch": torch_imported,
                  "found": {f.name: f.distribution for f in found.found},
                  "skipped": [str(r) for r in found.skipped]}))
"""


@pytest.fixture(scope="module")
def copied(plugin_site, tmp_path_factory):
    project = tmp_path_factory.mktemp("copy") / "linnet-backend-example"
    shutil.copytree(
        TEMPLATE,
        project,
        ignore=shutil.ignore_patterns(
            "__pycache__", ".pytest_cache", "*.egg-info", "build", "dist"
        ),
    )
    plugin_site.install(plugin_site.build(project))
    return project


@pytest.mark.slow
def test_template_is_found(plugin_site, copied):
    done = plugin_site.python("-c", FIND)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["found"].get("example-linear") == "linnet-backend-example"
    assert not [r for r in result["skipped"] if r.startswith("example-linear")]
    # Finding backends must stay cheap: the template imports torch only when it runs.
    assert result["torch"] is False


def renames() -> list[tuple[str, str]]:
    """The template README's rename table: (here, yours) pairs, as a third party reads it."""
    text = (TEMPLATE / "README.md").read_text()
    section = text[text.index("## 1. Copy and rename") : text.index("## 2.")]
    pairs = re.findall(r"^\|.*\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|$", section, re.MULTILINE)
    assert len(pairs) == 4, pairs
    return pairs


def copy_renamed(into: Path, pairs: list[tuple[str, str]]) -> Path:
    """Copy the template to ``into`` and rename it the way the README says."""
    project = into / pairs[0][1]
    shutil.copytree(
        TEMPLATE,
        project,
        ignore=shutil.ignore_patterns(
            "__pycache__", ".pytest_cache", "*.egg-info", "build", "dist"
        ),
    )
    for path in project.rglob("*"):
        if path.is_file():
            text = path.read_text()
            for here, yours in pairs:
                text = text.replace(here, yours)
            path.write_text(text)
    package = dict(pairs)["linnet_backend_example"]
    (project / "src" / "linnet_backend_example").rename(project / "src" / package)
    return project


def test_readme_renames_everything():
    """After the README's renames no trace of the example's names is left to clash."""
    pairs = renames()
    assert [here for here, _ in pairs] == [
        "linnet-backend-example",
        "linnet_backend_example",
        "example-linear",
        "ExampleLinear",
    ]
    for path in TEMPLATE.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.name != "README.md":
            text = path.read_text()
            for here, _ in pairs:
                text = text.replace(here, "")
            assert not re.search(r"[Ee]xample[-_A-Z]", text), (
                path,
                re.findall(r".{20}[Ee]xample[-_A-Z].{20}", text),
            )


CONTRACT_DECLARATIONS = [
    TEMPLATE / "src" / "linnet_backend_example" / "__init__.py",
    ROOT
    / "plugins"
    / "linnet-flashinfer"
    / "src"
    / "linnet"
    / "torch"
    / "flashinfer"
    / "__init__.py",
    ROOT / "plugins" / "linnet-cublaslt" / "src" / "linnet" / "torch" / "cublaslt" / "_backend.py",
]


@pytest.mark.parametrize("source", CONTRACT_DECLARATIONS, ids=lambda p: p.parts[-2])
def test_contract_is_a_literal(source):
    """`contract = CONTRACT` would claim every future contract: each backend class states the
    number it was written for, as an int literal."""
    tree = ast.parse(source.read_text())
    declared = [
        node.value
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["contract"]
    ]
    assert declared, f"no `contract = ...` in a class of {source}"
    for value in declared:
        assert isinstance(value, ast.Constant) and type(value.value) is int, (
            f"{source}: contract = {ast.unparse(value)}: write the number, e.g. `contract = 1`"
        )
    assert not re.search(
        r"^\s*contract\s*(:[^=]*)?=\s*CONTRACT\b", source.read_text(), re.MULTILINE
    )


@pytest.mark.slow
def test_renamed_copy_from_wheels(fresh_venv, tmp_path):
    """The template job: copied out of the repository, renamed as the README says, built,
    installed from built wheels only into a fresh venv, its own tests pass there; a copy
    declaring another contract shows up in skipped(), `linnet backends` and `linnet plan`."""
    venv = fresh_venv()
    venv.install_locked("--package", "linnet-runtime-torch")
    venv.install_locked("--only-group", "dev")  # pytest, for the copy's own tests
    pairs = renames()
    project = copy_renamed(tmp_path / "third-party", pairs)  # to linnet-backend-mylib
    old = copy_renamed(
        tmp_path / "old-contract",
        [
            ("linnet-backend-example", "linnet-backend-oldc"),
            ("linnet_backend_example", "linnet_backend_oldc"),
            ("example-linear", "oldc-linear"),
            ("ExampleLinear", "OldcLinear"),
        ],
    )
    init = old / "src" / "linnet_backend_oldc" / "__init__.py"
    init.write_text(init.read_text().replace("    contract = 1\n", "    contract = 2\n"))
    wheels = []
    for folder in (project, old):
        out = tmp_path / "built" / folder.name
        subprocess.run(
            [
                venv.uv,
                "build",
                "--quiet",
                "--wheel",
                "--offline",
                "--out-dir",
                str(out),
                str(folder),
            ],
            check=True,
            capture_output=True,
        )
        wheels += list(out.glob("*.whl"))
    venv.install(*wheels)
    done = venv.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout and "skipped" not in done.stdout, done.stdout

    done = venv.run("python", "-c", SKIPPED)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["available"] == ["mylib-linear"]
    (record,) = result["skipped"]
    assert record["name"] == "oldc-linear"
    assert record["distribution"] == "linnet-backend-oldc"
    assert "contract 2" in record["reason"], record

    text = venv.run("linnet", "backends")
    assert text.returncode == 0, text.stderr
    assert "mylib-linear" in text.stdout
    assert "skipped:" in text.stdout and "oldc-linear (linnet-backend-oldc 0.1.0)" in text.stdout
    assert "no installed package names one" not in text.stdout

    model = venv.run(
        "python", "-c", "from linnet.lang.bundled import example; print(example() / 'llama.linnet')"
    ).stdout.strip()
    plan = venv.run(
        "linnet",
        "plan",
        model,
        "--entry",
        "decode",
        "--config",
        "toy",
        "--input",
        "token=1",
        "--input",
        "pos=1",
        "--no-measure",
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "backends not used:" in plan.stdout
    assert "oldc-linear (linnet-backend-oldc)" in plan.stdout, plan.stdout
    chosen = venv.run(
        "linnet",
        "plan",
        model,
        "--entry",
        "decode",
        "--config",
        "toy",
        "--input",
        "token=1",
        "--input",
        "pos=1",
        "--no-measure",
        "--backend",
        "mylib-linear",
    )
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "oldc-linear (linnet-backend-oldc 0.1.0)" in chosen.stdout, chosen.stdout


SKIPPED = """
import json
from linnet.backends import available, skipped
print(json.dumps({"available": [b.name for b in available()],
                  "skipped": [r.to_json() for r in skipped()]}))
"""


def test_backends_text_names_skipped_plugins_when_none_loaded():
    """`linnet backends` with every plugin skipped: it says so, never "no package names one"."""
    from linnet.backends.cli import to_text
    from linnet.backends.discovery import Discovery, SkipRecord

    record = SkipRecord(
        "oldc-linear",
        "linnet-backend-oldc",
        "0.1.0",
        "oldc:Oldc",
        "written for backend contract 2; this linnet-plan implements 1",
    )
    text = to_text(Discovery(found=(), skipped=(record,)))
    assert "available: none (1 skipped: see below)" in text
    assert "no installed package names one" not in text
    assert "skipped:\n  oldc-linear (linnet-backend-oldc 0.1.0): written for" in text
    assert "no installed package names one" in to_text(Discovery(found=(), skipped=()))
