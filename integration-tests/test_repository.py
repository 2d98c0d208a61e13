"""The repository's own layout: every test module's file name is unique across the packages.
pytest imports test modules by their base name (rootdir-relative, no __init__.py), so two
`test_adversarial_grad.py` in two packages stop a run that collects both (CI's does)."""

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["packages", "plugins", "integration-tests"]


def test_every_test_module_name_is_unique():
    seen = defaultdict(list)
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("test_*.py"):
            if ".venv" not in path.parts and "site-packages" not in path.parts:
                seen[path.name].append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}
