"""The timing cache: $LINNET_HOME/benchmarks.json.

Keys name everything a timing depends on: the target (device model, framework and CUDA
versions), the backend's name and version, the contract version and the region kind. Writes
are atomic (a temporary file renamed into place) and serialised by a lock file, and each
write merges with what is on disk, so two processes planning at once lose no entries.

A cache never stops a plan: when it cannot be read or written, the planner times again and
goes on, with a :class:`CacheWarning` that says why. It never loses what it holds either:
a file that could not be read (permissions, a directory in its place) is never written
over; a corrupt one (not UTF-8, not JSON, nested too deeply, not ours) is moved aside under
a name of its own, ``benchmarks.json.corrupt-<time>-<random>``, and rebuilt; entries it
does not understand are kept on disk and never used.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.home import atomic_write, is_linnet_home, linnet_home
from linnet.lang.home_files import Folder, HomeFile, is_temporary, record

FORMAT = "linnet.benchmarks"
VERSION = 1


class CacheWarning(UserWarning):
    """The timing cache could not be read or written: timings are measured again, and not
    saved where saving would lose what the file holds."""


class _Unusable(Exception):
    """The file (or its lock) exists but cannot be read or replaced: leave it as it is."""


class _Corrupt(Exception):
    """The file was read, and is not a timing cache."""


def cache_key(target_key: str, backend: str, version: str, contract: int, kind: str) -> str:
    return json.dumps([target_key, backend, version, contract, kind], separators=(",", ":"))


def _seconds(entry: Any) -> float | None:
    """An entry's seconds, or None for anything a planner must not trust (NaN, negative, ...)."""
    if not isinstance(entry, dict):
        return None
    value = entry.get("seconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise _Unusable(f"cannot open its lock file {lock.name} ({_why(exc)})") from None
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):  # Windows, or a file system without locks: best effort
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
        #: Why nothing can be saved (a $LINNET_HOME that cannot be used), or None.
        self.unsaved: str | None = None
        #: In $LINNET_HOME (not a path the caller gave): a file there that is not a timing
        #: cache is moved aside only where Linnet made the home (it may be the user's own,
        #: such as ~/benchmarks.json under LINNET_HOME=$HOME).
        self._in_home = path is None
        if path is None:
            try:
                path = linnet_home() / "benchmarks.json"
            except LinnetError as err:
                try:
                    path = linnet_home(create=False) / "benchmarks.json"
                except LinnetError:  # no home directory at all: the path only names it
                    path = Path("$LINNET_HOME") / "benchmarks.json"
                self.unsaved = err.diagnostics[0].message
                self._warn(
                    f"{self.unsaved}; timings are measured again and not saved "
                    "(set LINNET_HOME to a writable directory)"
                )
        self.path = path
        self.entries: dict[str, Any] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        if self.unsaved is None:
            self.entries = self._open()

    @staticmethod
    def _warn(message: str, stacklevel: int = 4) -> None:
        warnings.warn(f"linnet: {message}", CacheWarning, stacklevel=stacklevel)

    def _load(self) -> dict[str, Any]:
        """The entries on disk ({} when there is no file). Raises _Unusable or _Corrupt."""
        try:
            raw = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except IsADirectoryError:
            raise _Unusable("it is a directory") from None
        except OSError as exc:
            raise _Unusable(f"cannot read it ({_why(exc)})") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"byte {exc.start} is not UTF-8") from None
        except RecursionError:
            raise _Corrupt("nested too deeply") from None
        except ValueError as exc:
            raise _Corrupt(str(exc)) from None
        if not (
            isinstance(data, dict)
            and data.get("format") == FORMAT
            and data.get("version") == VERSION
            and isinstance(data.get("entries"), dict)
        ):
            raise _Corrupt("not a linnet.benchmarks v1 file")
        return data["entries"]

    def _move_aside(self, why: str) -> str:
        """Under the lock: move the corrupt file to a name no other file has; say where."""
        if self._in_home and not is_linnet_home(self.path.parent):
            raise _Unusable(
                f"it is not a timing cache of Linnet's ({why}), in a "
                "$LINNET_HOME that Linnet did not make (it may be yours)"
            )
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(time.time()))
        try:
            fd, aside = tempfile.mkstemp(
                prefix=f"{self.path.name}.corrupt-{stamp}-", dir=self.path.parent
            )
            os.close(fd)
        except OSError as exc:
            raise _Unusable(
                f"it is unreadable ({why}) and cannot be moved aside ({_why(exc)})"
            ) from None
        try:
            os.replace(self.path, aside)  # onto the placeholder: atomic, and unique
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(aside)
            raise _Unusable(
                f"it is unreadable ({why}) and cannot be moved aside ({_why(exc)})"
            ) from None
        record(aside)  # Linnet's to remove (`linnet cache clear`): it moved it
        return (
            f"the timing cache {self.path} is unreadable ({why}); moved it to "
            f"{Path(aside).name} and starting a new one"
        )

    def _read_locked(self) -> dict[str, Any]:
        """Under the lock: the entries on disk, a corrupt file moved aside (and said so)."""
        try:
            return self._load()
        except _Corrupt as exc:
            self._warn(self._move_aside(str(exc)), stacklevel=5)
            return {}

    def _open(self) -> dict[str, Any]:
        try:
            return self._load()
        except _Unusable as exc:
            self._warn(
                f"cannot use the timing cache {self.path}: {exc}; timing again, and "
                "left it as it is"
            )
            return {}
        except _Corrupt:
            pass
        try:  # moving aside only under the lock: another process may be rewriting it
            with _locked(self.path):
                return self._read_locked()
        except _Unusable as exc:
            self._warn(
                f"the timing cache {self.path} is unusable: {exc}; timing again, and "
                "left it as it is (new timings are not saved until it is moved away)"
            )
            return {}

    def get(self, key: str) -> float | None:
        """The seconds stored for ``key``; None when there are none or they are not usable."""
        seconds = _seconds(self.pending.get(key))
        return seconds if seconds is not None else _seconds(self.entries.get(key))

    def put(self, key: str, seconds: float, **info: Any) -> None:
        self.pending[key] = {"seconds": seconds, "measured": time.time(), **info}

    def flush(self) -> None:
        """Merge pending timings into the file, atomically, under the lock.

        When that cannot be done without risking the file's entries, it warns and keeps the
        timings pending (in memory, for this process): a later flush may save them.
        """
        if not self.pending:
            return
        if self.unsaved is not None:
            self._warn(f"timings not saved: {self.unsaved}", stacklevel=3)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            self._warn(
                f"timings not saved: cannot create {self.path.parent} ({_why(exc)})", stacklevel=3
            )
            return
        try:
            with _locked(self.path):
                current = self._read_locked()
                current.update(self.pending)
                text = json.dumps(
                    {"format": FORMAT, "version": VERSION, "entries": current},
                    indent=1,
                    sort_keys=True,
                )
                atomic_write(self.path, text, parents=False)
        except _Unusable as exc:
            self._warn(f"timings not saved to {self.path}: {exc}; left it as it is", stacklevel=3)
            return
        except LinnetError as err:
            self._warn(f"timings not saved: {err.diagnostics[0].message}", stacklevel=3)
            return
        self.entries = current
        self.pending = {}


# ---------------------------------------------------------------- `linnet cache clear`
_NAME = "benchmarks.json"


def _timings_member(name: str) -> bool:
    return (
        name == _NAME
        or name.startswith(_NAME + ".corrupt-")
        or is_temporary(name, lambda base: base == _NAME)
    )


def _timings_owned(f: HomeFile) -> bool:
    """The timing cache (in Linnet's format), a file Linnet moved aside (recorded), or a
    leftover of an interrupted write of it."""
    if f.name == _NAME:
        try:
            data = json.loads(f.read())
        except (ValueError, RecursionError):
            return False
        return isinstance(data, dict) and data.get("format") == FORMAT
    if f.name.startswith(_NAME + ".corrupt-"):
        return f.recorded()
    return is_temporary(f.name, lambda base: base == _NAME)


#: The timing cache among $LINNET_HOME's folders (linnet.lang.home_files): its files are in
#: the home itself; the lock file is Linnet's and is left.
TIMINGS = Folder(
    "timings",
    "",
    _timings_owned,
    "the planner's timings of region kinds",
    member=_timings_member,
    extra=(_NAME + ".lock",),
)
