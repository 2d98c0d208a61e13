"""What Linnet wrote under $LINNET_HOME, and removing only that (`linnet cache clear`).

$LINNET_HOME may be any directory (``LINNET_HOME=$HOME``, a link to a user's folder), and a
user may put files into Linnet's folders. So clearing removes a file only when two things
hold (issue 38, item 1):

- **the home is Linnet's**: it holds Linnet's marker (:data:`linnet.lang.home.MARKER`),
  written when Linnet made the directory (or found it empty). A home of an earlier version
  (no marker) whose every entry has one of Linnet's names is adopted (marked) by the first
  clear; any other directory is refused with E0745, and nothing in it is touched;
- **the file is Linnet's own**, by the rule of its folder (:class:`Folder`): generated
  source whose name carries its content's hash, a timing cache in Linnet's format, a file
  whose content hash Linnet recorded when it wrote or moved it (:func:`record`), torch's and
  Triton's files named by hashes. Everything else is counted and kept.

Symbolic links are never followed and never removed (a link to a user's folder inside the
home, a cache folder that is a link); the home itself may be a link (it is resolved once).
Directories are walked through file descriptors, never opening a link (a folder swapped
for a link while clearing is not entered), and only directories that clearing emptied are
removed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import LinnetError, coded_error
from linnet.lang.home import MARKER, is_linnet_home, linnet_home, mark_home

#: Linnet's record of the files it wrote (or moved) under the home whose names do not say
#: their content: one JSON object a line, ``{"path": "demo/x.safetensors", "sha256": ...}``.
MANIFEST = "linnet-files.jsonl"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: A leftover of an interrupted atomic write (``<name>.<8 random>.tmp``, tempfile's names).
_TMP = re.compile(r"^(?P<base>.+)\.[a-z0-9_]{8}\.tmp$")


def home_path() -> Path:
    """$LINNET_HOME, resolved once (a link to the home is followed here, and no link after).

    >>> home_path() == linnet_home().resolve()
    True
    """
    return Path(os.path.realpath(linnet_home(create=False)))


# ---------------------------------------------------------------- the record of files
def _sha256_fd(fd: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def record(path: Path | str) -> None:
    """Record that Linnet wrote the file ``path`` under $LINNET_HOME, with its content hash:
    ``linnet cache clear`` removes it only while its content is still what Linnet wrote.
    A file outside the home, a link, or a record that cannot be written is left unrecorded
    (it is then kept by a clear, never lost).

    >>> p = linnet_home() / "demo" / "x.safetensors"                    # doctest: +SKIP
    >>> record(p)                                                          # doctest: +SKIP
    """
    try:
        home = home_path()
        where = Path(os.path.realpath(Path(path).parent)) / Path(path).name
        rel = where.relative_to(home).as_posix()
        fd = os.open(where, os.O_RDONLY | _NOFOLLOW)
        try:
            digest, size = _sha256_fd(fd)
        finally:
            os.close(fd)
        line = json.dumps({"path": rel, "sha256": digest, "size": size}) + "\n"
        out = os.open(home / MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
        try:
            os.write(out, line.encode())  # one short append: whole, among other writers
        finally:
            os.close(out)
    except (OSError, ValueError, LinnetError):
        pass


def _recorded(home: Path) -> dict[str, dict[int, set[str]]]:
    """The record: each relative path's sizes and content hashes ({} without a record)."""
    out: dict[str, dict[int, set[str]]] = {}
    try:
        fd = os.open(home / MANIFEST, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
    except OSError:
        return out
    for line in raw.splitlines():
        try:
            item = json.loads(line)
            path, digest, size = item["path"], item["sha256"], item["size"]
        except (ValueError, TypeError, KeyError):
            continue  # a torn or foreign line: what it named is not Linnet's, so kept
        if isinstance(path, str) and isinstance(digest, str) and isinstance(size, int):
            out.setdefault(path, {}).setdefault(size, set()).add(digest)
    return out


def _rewrite_record(home: Path, removed: set[str]) -> None:
    """Drop the lines of removed files from the record (a line added meanwhile may be lost:
    its file is then kept by a later clear, never removed wrongly)."""
    if not removed:
        return
    try:
        fd = os.open(home / MANIFEST, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    kept = []
    for line in lines:
        try:
            if json.loads(line)["path"] in removed:
                continue
        except (ValueError, TypeError, KeyError):
            pass
        kept.append(line.decode(errors="replace"))
    from linnet.lang.home import atomic_write

    with contextlib.suppress(LinnetError):
        atomic_write(
            home / MANIFEST, "".join(k + "\n" for k in kept), parents=False, follow_symlinks=False
        )


# ---------------------------------------------------------------- a file, as a rule sees it
class HomeFile:
    """A regular file under a cache folder, as a folder's rule sees it: ``rel`` (its path
    under the home), ``inner`` (under its folder), ``name``, ``size``; its bytes are read
    without following links, once."""

    def __init__(
        self,
        dir_fd: int | None,
        dirpath: str,
        name: str,
        rel: str,
        inner: str,
        size: int,
        record: dict[str, dict[int, set[str]]],
    ):
        self.dir_fd, self.dirpath, self.name = dir_fd, dirpath, name
        self.rel, self.inner, self.size = rel, inner, size
        self._record = record
        self._digest: str | None = None

    def _open(self) -> int:
        if self.dir_fd is not None:
            return os.open(self.name, os.O_RDONLY | _NOFOLLOW, dir_fd=self.dir_fd)
        return os.open(os.path.join(self.dirpath, self.name), os.O_RDONLY | _NOFOLLOW)

    def read(self, limit: int = 1 << 26) -> bytes:
        """Its first ``limit`` bytes (b"" when it cannot be read)."""
        try:
            fd = self._open()
        except OSError:
            return b""
        with os.fdopen(fd, "rb") as f:
            return f.read(limit)

    def sha256(self) -> str:
        """Its content's SHA-256 (hex; "" when it cannot be read)."""
        if self._digest is None:
            try:
                fd = self._open()
                try:
                    self._digest = _sha256_fd(fd)[0]
                finally:
                    os.close(fd)
            except OSError:
                self._digest = ""
        return self._digest

    def siblings(self) -> list[str]:
        """The names in its directory ([] when it cannot be listed)."""
        try:
            return os.listdir(self.dir_fd if self.dir_fd is not None else self.dirpath)
        except OSError:
            return []

    def sibling(self, name: str, limit: int = 1 << 20) -> bytes:
        """The first ``limit`` bytes of the file ``name`` beside it, not through a link
        (b"" when there is none)."""
        other = HomeFile(self.dir_fd, self.dirpath, name, "", "", 0, {})
        return other.read(limit)

    def recorded(self) -> bool:
        """Whether Linnet recorded writing this file with the content it has now."""
        sizes = self._record.get(self.rel)
        return bool(sizes and self.size in sizes and self.sha256() in sizes[self.size])


@dataclass(frozen=True)
class Folder:
    """One of Linnet's caches under the home: its ``name`` (as `linnet cache` lists it), its
    folder ``rel`` to the home ("" for files in the home itself, with ``member`` saying which
    names belong to it), and ``owns``, the rule that says a file is Linnet's own. ``legacy``
    recognises an earlier version's files (which it did not record) when a home is adopted:
    they are recorded then."""

    name: str
    rel: str
    owns: Callable[[HomeFile], bool]
    what: str = ""
    member: Callable[[str], bool] | None = None
    legacy: Callable[[HomeFile], bool] | None = None
    #: Names in the home that the folder uses and a clear leaves (a lock file).
    extra: tuple[str, ...] = ()


@dataclass
class Tally:
    """What a folder holds: Linnet's own files (``files``, ``bytes``: removed by a clear),
    the files that are not Linnet's (``kept``, kept by a clear; ``examples`` names a few)
    and the links in it (``links``: never followed, never removed)."""

    files: int = 0
    bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    links: int = 0
    examples: list[str] = field(default_factory=list)

    def keep(self, rel: str, size: int = 0) -> None:
        self.kept += 1
        self.kept_bytes += size
        if len(self.examples) < 3:
            self.examples.append(rel)

    def note(self) -> str:
        """What was left, in words ("" when nothing was)."""
        parts = []
        if self.kept:
            parts.append(
                f"{self.kept} file(s) not Linnet's kept, such as "
                + ", ".join(f"`{e}`" for e in self.examples)
            )
        if self.links:
            parts.append(f"{self.links} link(s) kept, not followed")
        return "; ".join(parts)


# ---------------------------------------------------------------- rules shared by runtimes
def is_temporary(name: str, base: Callable[[str], Any]) -> bool:
    """Whether ``name`` is a leftover of an interrupted atomic write of a file that ``base``
    accepts (``<name>.<8 random>.tmp``).

    >>> is_temporary("benchmarks.json.k2x_9a0b.tmp", lambda n: n == "benchmarks.json")
    True
    """
    m = _TMP.match(name)
    return bool(m and base(m["base"]))


_GENERATED = re.compile(r"^.+_(?P<digest>[0-9a-f]{20})\.py$")


def _generated(f: HomeFile) -> bool:
    """Generated source (:func:`linnet.lang.home.import_source`): its name carries the hash
    of its content, so a file the user wrote or edited there is not Linnet's."""
    if "/" in f.inner:
        return False
    m = _GENERATED.match(f.name)
    if m:
        return f.sha256().startswith(m["digest"])
    return is_temporary(f.name, _GENERATED.match)


_DEMO = re.compile(r"^.+-[0-9a-f]{12}\.safetensors$")
_DEMO_OLD_TMP = re.compile(r"^.+-[0-9a-f]{12}\.tmp$")


def _demo(f: HomeFile) -> bool:
    """A demo checkpoint Linnet recorded (with the content it wrote)."""
    if "/" in f.inner:
        return False
    return f.recorded() or is_temporary(f.name, _DEMO.match)


def _is_safetensors(f: HomeFile) -> bool:
    head = f.read(8)
    if len(head) != 8:
        return False
    n = int.from_bytes(head, "little")
    if not 2 <= n <= min(f.size - 8, 1 << 26):
        return False
    try:
        header = json.loads(f.read(8 + n)[8:])
    except ValueError:
        return False
    return isinstance(header, dict)


def _demo_legacy(f: HomeFile) -> bool:
    """An earlier version's demo checkpoint: its name (``<model>-<12 hex>.safetensors``) and
    a safetensors header; or its old temporary name."""
    if "/" in f.inner:
        return False
    return bool(_DEMO.match(f.name) and _is_safetensors(f)) or bool(_DEMO_OLD_TMP.match(f.name))


GENERATED = Folder("generated", "generated", _generated, "generated source, imported from files")
DEMO = Folder(
    "demo", "demo", _demo, "`linnet run`'s generated demo checkpoints", legacy=_demo_legacy
)


# ---------------------------------------------------------------- whose home
def _top_level_ours(home: Path, folders: Iterable[Folder]) -> list[str]:
    """The entries of ``home`` that none of Linnet's names accounts for (an earlier version's
    home has none)."""
    folders = list(folders)
    dirs = {f.rel.split("/")[0] for f in folders if f.rel}
    subdirs: dict[str, set[str]] = {}
    for f in folders:
        parts = f.rel.split("/")
        if len(parts) == 2:
            subdirs.setdefault(parts[0], set()).add(parts[1])
    foreign = []
    for entry in sorted(os.listdir(home)):
        path = home / entry
        if entry == MANIFEST or any(entry in f.extra for f in folders):
            continue
        if any(f.member is not None and not f.rel and f.member(entry) for f in folders):
            continue
        if entry in dirs and path.is_dir() and not path.is_symlink():
            inner = subdirs.get(entry)
            if inner is None:
                continue
            extra = sorted(set(os.listdir(path)) - inner)
            foreign += [f"{entry}/{e}" for e in extra]
            continue
        foreign.append(entry)
    return foreign


def home_owner(folders: Iterable[Folder]) -> tuple[str, Path, list[str]]:
    """Whose $LINNET_HOME is: ``("missing" | "linnet" | "earlier" | "foreign", the resolved
    home, the entries that are not Linnet's)``. "earlier": no marker, and every entry has one
    of Linnet's names (an earlier version's home, adopted by the next clear).

    >>> home_owner([GENERATED, DEMO])[0]
    'linnet'
    """
    home = home_path()
    if not home.is_dir():
        return "missing", home, []
    if is_linnet_home(home):
        return "linnet", home, []
    try:
        foreign = _top_level_ours(home, folders)
    except OSError as exc:
        return "foreign", home, [f"(unreadable: {exc.strerror or exc})"]
    return ("foreign" if foreign else "earlier"), home, foreign


def _refuse(home: Path, foreign: list[str]) -> LinnetError:
    shown = ", ".join(f"`{e}`" for e in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
    return coded_error(
        "E0745",
        f"$LINNET_HOME `{home}` was not made by Linnet (it has no {MARKER} of "
        f"Linnet's) and holds files that are not Linnet's ({shown}): `linnet cache "
        "clear` removes nothing there",
        help="point LINNET_HOME at a directory of Linnet's own (Linnet makes it on first use, "
        "such as `export LINNET_HOME=~/.cache/linnet`); if this is an earlier Linnet's "
        "home, move the other files out of it and clear again",
    )


# ---------------------------------------------------------------- walking without links
def _real_dir(home: Path, rel: str) -> tuple[Path | None, bool]:
    """``home/rel`` when each part of it is a directory and none a link; (None, True) when a
    part is a link (kept, not followed); (None, False) when it does not exist."""
    path = home
    for part in [p for p in rel.split("/") if p]:
        path = path / part
        try:
            info = os.lstat(path)
        except OSError:
            return None, False
        if stat.S_ISLNK(info.st_mode):
            return None, True
        if not stat.S_ISDIR(info.st_mode):
            return None, False
    return path, False


def _walk(top: Path) -> Iterator[tuple[str, list[str], list[str], int | None]]:
    """Bottom-up (dirpath, dirnames, filenames, dir_fd or None). Links are never opened:
    they are among the filenames (with anything else that is not a directory); a directory
    swapped for a link meanwhile is not entered (O_NOFOLLOW); one that cannot be read is
    E0831."""
    if not hasattr(os, "O_DIRECTORY") or os.open not in os.supports_dir_fd:
        # No directory descriptors (Windows): paths, still without following links.
        for dirpath, dirnames, filenames in os.walk(top, topdown=False, onerror=_unreadable):
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            yield dirpath, [d for d in dirnames if d not in links], filenames + links, None
        return
    try:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        _unreadable(exc)
        return
    try:
        yield from _fd_walk(fd, str(top))
    finally:
        os.close(fd)


def _fd_walk(dir_fd: int, dirpath: str) -> Iterator[tuple[str, list[str], list[str], int | None]]:
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        exc.filename = dirpath
        _unreadable(exc)
        return
    dirs: list[str] = []
    files: list[str] = []
    for name in names:
        info = _lstat(dirpath, dir_fd, name)
        (dirs if info is not None and stat.S_ISDIR(info.st_mode) else files).append(name)
    for name in dirs:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                continue  # swapped for a link or a file, or gone, meanwhile: not entered
            exc.filename = os.path.join(dirpath, name)
            _unreadable(exc)
            continue
        try:
            yield from _fd_walk(fd, os.path.join(dirpath, name))
        finally:
            os.close(fd)
    yield dirpath, dirs, files, dir_fd


def _unreadable(exc: OSError) -> None:
    raise coded_error(
        "E0831",
        f"cannot read `{exc.filename}`: {exc.strerror or exc}",
        help="fix its permissions and run `linnet cache clear` again",
    )


def _lstat(dirpath: str, dir_fd: int | None, name: str) -> os.stat_result | None:
    try:
        if dir_fd is not None:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return os.lstat(os.path.join(dirpath, name))
    except OSError:
        return None


def _unlink(dirpath: str, dir_fd: int | None, name: str) -> None:
    try:
        if dir_fd is not None:
            os.unlink(name, dir_fd=dir_fd)
        else:
            os.unlink(os.path.join(dirpath, name))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise coded_error(
            "E0831",
            f"cannot remove `{os.path.join(dirpath, name)}`: {exc.strerror or exc}",
            help="fix its permissions (or those of its directory) and run "
            "`linnet cache clear` again",
        ) from None


def _rmdir(dirpath: str, dir_fd: int | None, name: str) -> None:
    with contextlib.suppress(OSError):  # not empty (a file came meanwhile): kept
        if dir_fd is not None:
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.rmdir(os.path.join(dirpath, name))


def _listdir(dirpath: str, dir_fd: int | None) -> list[str]:
    try:
        return os.listdir(dir_fd if dir_fd is not None else dirpath)
    except OSError:
        return ["?"]


def _scan_folder(
    home: Path,
    folder: Folder,
    record: dict[str, dict[int, set[str]]],
    remove: bool,
    take: Callable[[HomeFile], bool],
    removed: set[str],
) -> Tally:
    tally = Tally()
    top, linked = _real_dir(home, folder.rel)
    if top is None:
        tally.links += linked
        return tally
    prefix = f"{folder.rel}/" if folder.rel else ""
    if not folder.rel:  # files in the home itself: only the names of this folder
        fd = (
            os.open(top, os.O_RDONLY | os.O_DIRECTORY)
            if hasattr(os, "O_DIRECTORY") and os.open in os.supports_dir_fd
            else None
        )
        try:
            names = sorted(n for n in os.listdir(top) if folder.member and folder.member(n))
            doomed = [
                name
                for name in names
                if _consider(str(top), fd, name, name, name, tally, record, take)
            ]
            for name in doomed if remove else ():
                _unlink(str(top), fd, name)
                removed.add(name)
        finally:
            if fd is not None:
                os.close(fd)
        return tally
    emptied: set[str] = set()
    for dirpath, dirnames, filenames, dir_fd in _walk(top):
        inner_dir = os.path.relpath(dirpath, top)
        inner_dir = "" if inner_dir == "." else inner_dir.replace(os.sep, "/") + "/"
        changed = False
        for name in dirnames:  # real directories (links are among the filenames)
            if remove and f"{inner_dir}{name}" in emptied:
                _rmdir(dirpath, dir_fd, name)
                changed = True
        # Every file of the directory is judged before any is removed (a rule may read a
        # sibling: Triton's group file lists its compilation's files).
        doomed = [
            name
            for name in filenames
            if _consider(
                dirpath,
                dir_fd,
                name,
                f"{prefix}{inner_dir}{name}",
                f"{inner_dir}{name}",
                tally,
                record,
                take,
            )
        ]
        for name in doomed if remove else ():
            _unlink(dirpath, dir_fd, name)
            removed.add(f"{prefix}{inner_dir}{name}")
            changed = True
        if remove and changed and not _listdir(dirpath, dir_fd):
            emptied.add(inner_dir.rstrip("/"))
    if remove and "" in emptied:
        _rmdir(str(top.parent), None, top.name)
    return tally


def _consider(
    dirpath: str,
    dir_fd: int | None,
    name: str,
    rel: str,
    inner: str,
    tally: Tally,
    record: dict[str, dict[int, set[str]]],
    take: Callable[[HomeFile], bool],
) -> bool:
    """Count one entry in ``tally``; whether it is Linnet's own (a regular file its folder's
    rule takes: never a link, a fifo or a socket)."""
    info = _lstat(dirpath, dir_fd, name)
    if info is None:
        return False
    if stat.S_ISLNK(info.st_mode):
        tally.links += 1
        return False
    if not stat.S_ISREG(info.st_mode):
        tally.keep(rel)
        return False
    if not take(HomeFile(dir_fd, dirpath, name, rel, inner, info.st_size, record)):
        tally.keep(rel, info.st_size)
        return False
    tally.files += 1
    tally.bytes += info.st_size
    return True


# ---------------------------------------------------------------- scan, adopt, clear
def scan_home(folders: Iterable[Folder]) -> tuple[str, Path, dict[str, Tally]]:
    """What each folder holds, nothing removed: ``(owner, home, {name: Tally})`` (see
    :func:`home_owner`; in a home that is not Linnet's, nothing counts as Linnet's).

    >>> owner, home, tallies = scan_home([GENERATED, DEMO]); owner
    'linnet'
    """
    folders = list(folders)
    owner, home, _ = home_owner(folders)
    if owner == "missing":
        return owner, home, {f.name: Tally() for f in folders}
    record = _recorded(home)
    out = {}
    for folder in folders:
        take: Callable[[HomeFile], bool] = folder.owns
        if owner == "foreign":
            take = _nothing
        elif owner == "earlier" and folder.legacy is not None:
            take = _either(folder.owns, folder.legacy)
        out[folder.name] = _scan_folder(home, folder, record, False, take, set())
    return owner, home, out


def _nothing(f: HomeFile) -> bool:
    return False


def _either(
    a: Callable[[HomeFile], bool], b: Callable[[HomeFile], bool]
) -> Callable[[HomeFile], bool]:
    return lambda f: a(f) or b(f)


def _adopt(home: Path, folders: list[Folder]) -> None:
    """Record an earlier version's files that its folders' rules recognise, then mark the
    home as Linnet's."""
    for folder in folders:
        if folder.legacy is None:
            continue
        legacy = folder.legacy
        found: list[str] = []

        def take(
            f: HomeFile, legacy: Callable[[HomeFile], bool] = legacy, found: list[str] = found
        ) -> bool:
            if legacy(f):
                found.append(str(home / f.rel))
            return False

        _scan_folder(home, folder, {}, False, take, set())
        for path in found:
            record(path)
    mark_home(home)


def clear_home(
    folders: Iterable[Folder], names: list[str] | None = None
) -> tuple[Path, str, dict[str, Tally]]:
    """Remove Linnet's own files from the folders ``names`` (default: all); ``(home, owner
    before, {name: Tally of what was removed and kept})``. A home that is not Linnet's is
    E0745 (nothing removed); an earlier version's home is adopted first; a file that cannot
    be removed is E0831.

    >>> home, owner, done = clear_home([GENERATED, DEMO], ["demo"]); list(done)
    ['demo']
    """
    folders = list(folders)
    owner, home, foreign = home_owner(folders)
    if owner == "missing":
        return home, owner, {f.name: Tally() for f in folders if not names or f.name in names}
    if owner == "foreign":
        raise _refuse(home, foreign)
    if owner == "earlier":
        _adopt(home, folders)
    record = _recorded(home)
    out: dict[str, Tally] = {}
    removed: set[str] = set()
    try:
        for folder in folders:
            if names and folder.name not in names:
                continue
            out[folder.name] = _scan_folder(home, folder, record, True, folder.owns, removed)
    finally:
        _rewrite_record(home, removed)
    return home, owner, out
