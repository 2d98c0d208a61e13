"""The timing cache: $LINNET_HOME/benchmarks.json.

Keys name everything a timing depends on: the target (device model, framework and CUDA
versions), the backend's name and version, the contract version and the region kind. Writes
are atomic (a temporary file renamed into place) and serialised by a lock file, and each
write merges with what is on disk, so two processes planning at once lose no entries. A file
that is corrupt or not ours is moved aside (never deleted), reported, and rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from linnet.lang.home import linnet_home

FORMAT = "linnet.benchmarks"
VERSION = 1


class CacheWarning(UserWarning):
    """The timing cache was unreadable and has been moved aside and rebuilt."""


def cache_key(target_key: str, backend: str, version: str, contract: int, kind: str) -> str:
    return json.dumps([target_key, backend, version, contract, kind], separators=(",", ":"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # Windows: best effort
            pass
        yield
    finally:
        os.close(fd)


class TimingCache:
    """Seconds per region kind, persisted in ``benchmarks.json``.

    >>> cache = TimingCache(Path(tempfile.mkdtemp()) / "benchmarks.json")
    >>> cache.put("k", 1.5e-5); cache.get("k")
    1.5e-05
    """

    def __init__(self, path: Path | None = None):
        self.path = path or linnet_home() / "benchmarks.json"
        self.entries: dict[str, dict[str, Any]] = self._read()
        self.pending: dict[str, dict[str, Any]] = {}

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            warnings.warn(f"linnet: cannot read the timing cache {self.path}: {exc}; timing "
                          "again", CacheWarning, stacklevel=3)
            return {}
        try:
            data = json.loads(text)
            if not (isinstance(data, dict) and data.get("format") == FORMAT
                    and data.get("version") == VERSION and isinstance(data.get("entries"), dict)):
                raise ValueError("not a linnet.benchmarks v1 file")
            return {k: v for k, v in data["entries"].items()
                    if isinstance(v, dict) and isinstance(v.get("seconds"), int | float)}
        except ValueError as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            warnings.warn(f"linnet: the timing cache {self.path} is unreadable ({exc}); moved it "
                          f"to {aside.name} and starting a new one", CacheWarning, stacklevel=3)
            return {}

    def get(self, key: str) -> float | None:
        entry = self.pending.get(key) or self.entries.get(key)
        return None if entry is None else float(entry["seconds"])

    def put(self, key: str, seconds: float, **info: Any) -> None:
        self.pending[key] = {"seconds": seconds, "measured": time.time(), **info}

    def flush(self) -> None:
        """Merge pending timings into the file, atomically, under the lock."""
        if not self.pending:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _locked(self.path):
            current = self._read()
            current.update(self.pending)
            text = json.dumps({"format": FORMAT, "version": VERSION, "entries": current},
                              indent=1, sort_keys=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp",
                                       dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        self.entries = current
        self.pending = {}
