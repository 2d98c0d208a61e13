"""The backend template (plugins/template), copied as a third party would: it builds,
installs, is found by discovery, and its own tests pass."""

from __future__ import annotations

import json
import shutil
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
    shutil.copytree(TEMPLATE, project, ignore=shutil.ignore_patterns(
        "__pycache__", ".pytest_cache", "*.egg-info", "build", "dist"))
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


@pytest.mark.slow
def test_template_tests_pass(plugin_site, copied):
    done = plugin_site.python("-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=copied,
                              LINNET_REPO=str(ROOT))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout, done.stdout
