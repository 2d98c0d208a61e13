"""$LINNET_HOME: the per-user cache for generated source and timings.

Default: `$XDG_CACHE_HOME/linnet` (or `~/.cache/linnet`), created with user-only
permissions. Files are written atomically (a temporary file renamed into place), so that a
crash or a second process never leaves a half-written file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def linnet_home() -> Path:
    """The cache directory, created (mode 0700) on first use.

    >>> linnet_home().is_dir()
    True
    """
    root = os.environ.get("LINNET_HOME")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "linnet"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
