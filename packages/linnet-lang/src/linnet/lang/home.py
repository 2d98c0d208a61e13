"""$LINNET_HOME: the per-user cache every Linnet package writes to (generated source, timings,
demo checkpoints).

Default: `$XDG_CACHE_HOME/linnet` (or `~/.cache/linnet`), created with user-only
permissions. :func:`atomic_write` writes a temporary file and renames it into place, so that a
crash, a full disk or a second process never leaves a half-written file behind.

Both raise a :class:`~linnet.lang.LinnetError` (E0660, E0661) that says which path, why and
what to do, never a bare ``OSError``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import stat
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError

# What an errno means for the user, in words (the system's own text follows in brackets).
_REASONS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EEXIST: "a file is in the way",
    errno.EISDIR: "it is a directory",
    errno.ENAMETOOLONG: "the name is too long",
}


def _reason(exc: OSError) -> str:
    words = _REASONS.get(exc.errno or 0)
    system = exc.strerror or str(exc)
    return f"{words} ({system})" if words else system


def linnet_home(*, create: bool = True) -> Path:
    """The cache directory, created (mode 0700) on first use; ``create=False`` only names it.

    Raises E0660 when it cannot be a directory (``$LINNET_HOME`` names a file, or a
    read-only place).

    >>> linnet_home().is_dir()
    True
    """
    root = os.environ.get("LINNET_HOME")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME")
        if not base:
            try:
                base = str(Path.home() / ".cache")
            except (RuntimeError, KeyError):  # no $HOME and no password entry (a container)
                raise LinnetError(
                    Diagnostic(
                        "E0660",
                        "Linnet's cache directory has no place: there is no home directory",
                        help="set LINNET_HOME to a writable directory, such as "
                        "`export LINNET_HOME=/tmp/linnet-$USER`",
                    )
                ) from None
        path = Path(base) / "linnet"
    if not create:
        return path
    where = "$LINNET_HOME" if root else "Linnet's cache directory"
    fix = "set LINNET_HOME to a writable directory, such as `export LINNET_HOME=/tmp/linnet-$USER`"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise LinnetError(
            Diagnostic(
                "E0660",
                f"{where} `{path}` is a file, not a directory",
                help=f"move the file away, or {fix}",
            )
        ) from None
    except OSError as exc:
        raise LinnetError(
            Diagnostic("E0660", f"{where} `{path}` cannot be created: {_reason(exc)}", help=fix)
        ) from None
    _mark_if_new(path)
    return path


# ---------------------------------------------------------------- whose home it is
#: The file that says Linnet made a directory its home: a cache directory tag
#: (https://bford.info/cachedir/, so that backup tools skip it), whose second line says it is
#: Linnet's. `linnet cache clear` removes nothing in a home without it (linnet.lang.home_files).
MARKER = "CACHEDIR.TAG"
_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55\n"
_MARKER_LINE = "# Linnet's cache ($LINNET_HOME), made by Linnet."
MARKER_TEXT = (
    f"{_SIGNATURE}{_MARKER_LINE} `linnet cache clear` removes only the files "
    "Linnet wrote here.\n# For information about cache directory tags see "
    "https://bford.info/cachedir/\n"
)
_MARKED: set[str] = set()


def is_linnet_home(path: Path | str) -> bool:
    """Whether the directory ``path`` holds Linnet's marker (a regular file, not a link):
    Linnet made it, or adopted it as an earlier version's home (``linnet cache clear``).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> is_linnet_home(folder)
    False
    >>> mark_home(folder)
    >>> is_linnet_home(folder)
    True
    """
    marker = os.path.join(path, MARKER)
    try:
        info = os.lstat(marker)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4096:
            return False
        with open(marker, "rb") as f:
            head = f.read(len(_SIGNATURE) + len(_MARKER_LINE))
    except OSError:
        return False
    return head == (_SIGNATURE + _MARKER_LINE).encode()


def mark_home(path: Path | str) -> None:
    """Write Linnet's marker into the directory ``path`` (E0661 when it cannot be written).

    >>> mark_home(linnet_home()); is_linnet_home(linnet_home())
    True
    """
    atomic_write(Path(path) / MARKER, MARKER_TEXT, parents=False, follow_symlinks=False)
    _MARKED.add(str(path))


def _mark_if_new(path: Path) -> None:
    """Mark ``path`` as Linnet's when it holds nothing yet (Linnet just made it, or the user
    made it empty for Linnet). A directory that holds anything else (an earlier version's
    home, or the user's own folder) is not marked here: ``linnet cache clear`` decides."""
    key = str(path)
    if key in _MARKED and os.path.lexists(os.path.join(key, MARKER)):
        return
    if is_linnet_home(path):
        _MARKED.add(key)
        return
    try:
        with os.scandir(path) as entries:
            if next(entries, None) is not None:
                return
        mark_home(path)
    except (OSError, LinnetError):
        pass  # a home that cannot be written fails where Linnet writes to it, with E0661


def _under_home(path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(linnet_home(create=False).resolve())
    except (OSError, RuntimeError):
        return False


def _write_error(path: Path, why: str, exc: OSError | None = None) -> LinnetError:
    code = exc.errno if exc is not None else None
    if code in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space on the disk, or write somewhere else"
    elif code == errno.EISDIR:
        fix = f"give the path of a file, such as `{path / 'out.txt'}`"
    elif code == errno.ENOENT:
        fix = f"create the directory first (`mkdir -p {path.parent}`), or write somewhere else"
    elif code == errno.ENOTDIR:
        fix = "a file is where a directory should be: move it, or write somewhere else"
    else:
        fix = "write to a place you may write to"
    if _under_home(path):
        fix += ", or set LINNET_HOME to a writable directory"
    return LinnetError(Diagnostic("E0661", f"cannot write `{path}`: {why}", help=fix))


def _write_all(f: IO[Any], text: str | bytes) -> None:
    f.write(text)


def _open_args(text: str | bytes) -> dict[str, Any]:
    return {"mode": "wb"} if isinstance(text, bytes) else {"mode": "w", "encoding": "utf-8"}


def atomic_write(
    path: Path | str,
    text: str | bytes,
    *,
    parents: bool = True,
    new_mode: int = 0o600,
    follow_symlinks: bool = True,
) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.
    ``text`` may be ``bytes`` (a binary file, such as a portable StableHLO artifact).

    A file that exists keeps its permission bits; a new one gets ``new_mode``. ``parents``
    creates missing directories (mode 0700). A symbolic link is followed, so its target is
    replaced and the link kept; with ``follow_symlinks=False`` (Linnet's own files under
    $LINNET_HOME) the link itself is replaced by the file and its target is left as it was.
    A read-only target (no write bit) is refused. Every failure (a missing or read-only
    directory, a directory as the target, a full disk) is E0661, and leaves the old file as
    it was.

    >>> p = linnet_home() / "example.txt"; atomic_write(p, "hi"); p.read_text()
    'hi'
    """
    target = Path(path)
    if target.is_symlink():
        if not follow_symlinks:
            _replace_file(target, text, new_mode)
            return
        target = Path(os.path.realpath(target))
    mode = new_mode
    try:
        info = target.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass  # a missing parent is reported below, where it is created or found missing
    except OSError as exc:
        raise _write_error(target, _reason(exc), exc) from None
    else:
        if stat.S_ISDIR(info.st_mode):
            raise _write_error(target, "it is a directory", OSError(errno.EISDIR, "Is a directory"))
        if not stat.S_ISREG(info.st_mode):  # /dev/stdout, a pipe: write through, in order
            try:
                with open(target, **_open_args(text)) as f:
                    _write_all(f, text)
            except OSError as exc:
                raise _write_error(target, _reason(exc), exc) from None
            return
        if not info.st_mode & 0o222 or not os.access(target, os.W_OK):
            raise _write_error(
                target, "the file is read-only", OSError(errno.EACCES, "Permission denied")
            )
        mode = stat.S_IMODE(info.st_mode)
    if parents:
        _make_parent(target)
    _replace_file(target, text, mode)


def _make_parent(target: Path) -> None:
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError as exc:
        raise _write_error(
            target, f"`{parent}` is a file, not a directory", OSError(errno.ENOTDIR, exc.strerror)
        ) from None
    except OSError as exc:
        raise _write_error(target, f"cannot create `{parent}`: {_reason(exc)}", exc) from None


def _replace_file(target: Path, text: str | bytes, mode: int) -> None:
    """Write ``text`` to a new file beside ``target`` and rename it onto ``target`` (a link
    there is replaced, never followed)."""
    parent = target.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=parent)
    except FileNotFoundError as exc:
        raise _write_error(target, f"the directory `{parent}` does not exist", exc) from None
    except OSError as exc:
        raise _write_error(target, _reason(exc), exc) from None
    try:
        with os.fdopen(fd, **_open_args(text)) as f:
            _write_all(f, text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _write_error(target, _reason(exc), exc) from None
        raise


# ---------------------------------------------------------------- generated source
# Every runtime imports its generated module the same way (linnet.torch, linnet.jax).
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
        # A link in Linnet's folder is replaced, never written through (its target may be
        # anyone's file).
        atomic_write(path, text, follow_symlinks=False)
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
