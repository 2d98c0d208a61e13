"""Generated source under $LINNET_HOME, imported from files (see linnet.lang.home)."""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from linnet.lang.home import atomic_write, linnet_home

__all__ = ["atomic_write", "import_source", "linnet_home"]


class _VerifiedSource(importlib.abc.Loader):
    """Runs the text that was verified, compiled in memory under the file's name.

    Python's own loader would read ``__pycache__/*.pyc`` beside the file when its header
    matches the file's mtime and size, and write one: a planted or stale .pyc would run
    instead of the source we checked. This loader reads no bytecode and writes none, and
    compiles ``text`` itself (not the file again: it may have changed since it was checked).
    Tracebacks, debuggers and ``inspect.getsource`` (``@triton.jit``) still read the file,
    which holds the same text.
    """

    def __init__(self, text: str, path: Path):
        self.text = text
        self.path = path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        code = compile(self.text, str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self.text


def import_source(text: str, stem: str = "linnet_generated") -> ModuleType:
    """Write generated source to a content-hashed file under $LINNET_HOME and import it.

    The file is imported, never exec'd from an anonymous string: tracebacks point into it, a
    debugger steps through it, and `@triton.jit` can read its functions' source. What runs is
    ``text`` itself, compiled in memory: no bytecode is read from or written to
    ``__pycache__`` (a tampered .pyc beside the file never runs).

    >>> m = import_source("def f():\\n    return 1\\n", "linnet_doctest")
    >>> m.f(), m.__file__.endswith(".py")
    (1, True)
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    name = f"{stem}_{digest}"
    path = linnet_home() / "generated" / f"{name}.py"
    loaded = sys.modules.get(name)
    # The same text imported before, from this $LINNET_HOME: its file is where it says.
    if loaded is not None and getattr(loaded, "__file__", None) == str(path) and path.is_file():
        return loaded
    if _read(path) != text.encode("utf-8"):
        atomic_write(path, text)
    loader = _VerifiedSource(text, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__cached__ = None  # type: ignore[attr-defined]  # no bytecode file: none is used
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
