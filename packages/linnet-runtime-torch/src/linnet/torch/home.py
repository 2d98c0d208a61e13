"""Generated source under $LINNET_HOME, imported from files (see linnet.lang.home)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from types import ModuleType

from linnet.lang.home import atomic_write, linnet_home

__all__ = ["atomic_write", "import_source", "linnet_home"]


def import_source(text: str, stem: str = "linnet_generated") -> ModuleType:
    """Write generated source to a content-hashed file under $LINNET_HOME and import it.

    The file is imported, never exec'd from a string: tracebacks point into it, a debugger
    steps through it, and `@triton.jit` can read its functions' source.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    name = f"{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    path = linnet_home() / "generated" / f"{name}.py"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        atomic_write(path, text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
