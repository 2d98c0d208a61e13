"""Every module of linnet.torch imports on its own, in a fresh interpreter (an import
cycle shows as a partially initialised module when one is imported first); the
import-graph walk is in integration-tests/test_import_graph.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "linnet" / "torch"
NAMES = sorted(
    "linnet.torch" + ("" if p.stem == "__init__" else "." + p.stem) for p in ROOT.glob("*.py")
)


def test_each_module_imports_first() -> None:
    assert "linnet.torch.options" in NAMES and "linnet.torch.planned" in NAMES
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    for m in [k for k in sys.modules if k.startswith('linnet.torch')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *NAMES], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from linnet.torch.model import compile_options  # the old path still works
    from linnet.torch.options import compile_options as same

    assert compile_options is same
