"""$LINNET_HOME: the per-user cache every Linnet package writes to (generated source, timings,
demo checkpoints).

Default: `$XDG_CACHE_HOME/linnet` (or `~/.cache/linnet`), created with user-only
permissions. :func:`atomic_write` writes a temporary file and renames it into place, so that a
crash or a second process never leaves a half-written file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    >>> p = linnet_home() / "example.txt"; atomic_write(p, "hi"); p.read_text()
    'hi'
    """
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
