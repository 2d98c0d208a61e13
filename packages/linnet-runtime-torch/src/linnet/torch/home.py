"""What the torch runtime keeps under $LINNET_HOME: generated source (imported from files, see
linnet.lang.home, where :func:`import_source` lives: every runtime imports its generated
module the same way) and torch.compile's on-disk caches.

When Linnet first compiles in a process (``compile=`` anything but None/False), it points
inductor's cache (``TORCHINDUCTOR_CACHE_DIR``: FX graphs, AOTAutograd entries, generated
kernels, autotuning results) and Triton's (``TRITON_CACHE_DIR``) into
``$LINNET_HOME/cache/inductor`` and ``$LINNET_HOME/cache/triton``, unless they are set
already, so that a second process planning the same model on the same machine reuses what
the first compiled and tuned; ``linnet cache`` shows and clears them.

>>> sorted(use_compile_caches())
['inductor', 'triton']
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import re
import tempfile
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import coded_error
from linnet.lang.home import MARKER, atomic_write, import_source, linnet_home
from linnet.lang.home_files import (
    DEMO,
    GENERATED,
    Folder,
    HomeFile,
    Tally,
    clear_home,
    home_owner,
    record,
    scan_home,
)

__all__ = [
    "CACHE_NAMES",
    "COMPILE_CACHES",
    "MARKER",
    "CacheEntry",
    "atomic_write",
    "cache_entries",
    "cache_owner",
    "clear_caches",
    "compile_cache_counts",
    "import_source",
    "linnet_home",
    "shown",
    "use_compile_caches",
]

#: (name, environment variable, what it holds): torch.compile's caches Linnet places.
COMPILE_CACHES = (
    (
        "inductor",
        "TORCHINDUCTOR_CACHE_DIR",
        "torch.compile (inductor): FX graphs, AOTAutograd entries, kernels, autotuning results",
    ),
    ("triton", "TRITON_CACHE_DIR", "Triton's compiled kernels and autotuning results"),
)

# The value Linnet gave each variable (so that a later $LINNET_HOME moves it along, while a
# value the user set is never touched), and the directories known to exist.
_SET: dict[str, str] = {}
_MADE: set[str] = set()


def _warn(message: str) -> None:
    from linnet.plan import CacheWarning

    warnings.warn(f"linnet: {message}", CacheWarning, stacklevel=4)


def shown(path: Path | str) -> str:
    """``path`` as progress lines write it: ``$LINNET_HOME/...`` when it is under it.

    >>> shown(linnet_home() / "cache" / "inductor")
    '$LINNET_HOME/cache/inductor'
    """
    p = Path(path)
    try:
        home = linnet_home(create=False)
        rel = p.resolve().relative_to(home.resolve())
    except (LinnetError, OSError, RuntimeError, ValueError):
        return str(p)
    return "$LINNET_HOME" if str(rel) == "." else f"$LINNET_HOME/{rel.as_posix()}"


def _usable_given(env: str, given: str) -> Path:
    """The user's own cache directory ``given`` (from ``env``), or E0830 when torch.compile
    could not write there (it would fail deep inside a compile, with a traceback)."""
    path = Path(given).expanduser()
    fix = (
        f"point {env} at a directory you may write to, or unset it (Linnet then uses "
        f"$LINNET_HOME/cache)"
    )
    if path.exists() and not path.is_dir():
        raise coded_error(
            "E0830",
            f"{env}={given} is a file: torch.compile caches its compiled "
            "artefacts in that directory",
            help=fix,
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise coded_error(
            "E0830", f"{env}={given} cannot be created: {exc.strerror or exc}", help=fix
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise coded_error(
            "E0830",
            f"{env}={given} is not writable: torch.compile caches its compiled artefacts there",
            help=fix,
        )
    return path


def _inductor_default() -> str:
    """The directory inductor picks when ``TORCHINDUCTOR_CACHE_DIR`` is unset (the same
    rule in torch 2.4 .. 2.15; computed here, since importing inductor sets the variable)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.abspath(os.path.join(tempfile.gettempdir(), "torchinductor_" + user))


def _initial_environment() -> dict[str, str] | None:
    """The environment this process was started with (Linux), or None where unknown."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _users(env: str, value: str) -> bool:
    """Whether ``value`` of ``env`` is the user's choice, not one torch made for itself.

    Importing parts of torch (torch._dynamo, inductor) sets ``TORCHINDUCTOR_CACHE_DIR`` to
    inductor's default, and inductor's first Triton kernel sets ``TRITON_CACHE_DIR`` to
    ``<inductor's cache>/triton/<device>``: such a value, when the process was not started
    with it, is torch's, and Linnet places the cache itself. Anything else is the user's.
    """
    if _SET.get(env) == value:
        return False
    if env == "TORCHINDUCTOR_CACHE_DIR":
        torchs = os.path.abspath(value) == _inductor_default()
    else:
        torchs = Path(value).parent == Path(_inductor_default()) / "triton"
    if not torchs:
        return True
    initial = _initial_environment()
    return initial is None or initial.get(env) == value


def use_compile_caches() -> dict[str, Path]:
    """Point torch.compile's caches under ``$LINNET_HOME/cache`` (unless the user set them);
    their directories by name (``inductor``, ``triton``). Called before every compile
    Linnet starts (``compile_options``), so it holds before torch.compile first runs.

    A variable the user set is used as it is (E0830 when it names a file or a directory
    that cannot be written); one that torch set to its own default when part of it was
    imported is not the user's, and is replaced. A ``$LINNET_HOME/cache``
    that cannot be created is a warning, and torch keeps its own default place. Also
    turns on Triton's autotuning cache (``TRITON_CACHE_AUTOTUNING=1``, unless set): results
    are keyed by the kernel's source, configurations, arguments' key and GPU.

    >>> use_compile_caches()["inductor"] == linnet_home() / "cache" / "inductor"
    True
    """
    used: dict[str, Path] = {}
    for name, env, _ in COMPILE_CACHES:
        given = os.environ.get(env)
        if given and _users(env, given):
            if given not in _MADE:
                _usable_given(env, given)
                _MADE.add(given)
            used[name] = Path(given)
            continue
        try:
            path = linnet_home() / "cache" / name
            if str(path) not in _MADE:
                path.mkdir(parents=True, exist_ok=True, mode=0o700)
                if not os.access(path, os.W_OK | os.X_OK):
                    raise PermissionError(13, "permission denied")
                _MADE.add(str(path))
        except LinnetError as err:
            _warn(f"{err.diagnostics[0].message}; torch.compile caches in its default place")
            continue
        except OSError as exc:
            _warn(
                f"cannot use {path} for {name}'s cache ({exc.strerror or exc}); "
                "torch.compile caches in its default place"
            )
            continue
        os.environ[env] = _SET[env] = str(path)
        used[name] = path
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    _watch_torch_logs()
    return used


# ---------------------------------------------------------------- reused or compiled
def compile_cache_counts() -> tuple[int, int]:
    """(graphs torch.compile loaded from its caches, graphs it compiled) in this process so
    far, from torch._dynamo's counters (FX graph cache and AOTAutograd cache); (0, 0) where
    this torch does not count them. Compare two readings around a first call.

    >>> hits, misses = compile_cache_counts()
    """
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return 0, 0
    inductor: Any = counters.get("inductor") or {}
    aot: Any = counters.get("aot_autograd") or {}
    hits = int(inductor.get("fxgraph_cache_hit", 0)) + int(aot.get("autograd_cache_hit", 0))
    misses = int(inductor.get("fxgraph_cache_miss", 0)) + int(
        inductor.get("fxgraph_cache_bypass", 0)
    )
    return hits, misses


def caching_off() -> str:
    """Why inductor will not reuse compiled graphs in another process, or ""."""
    try:
        from torch._inductor import config
    except Exception:
        return ""
    if getattr(config, "force_disable_caches", False):
        return "torch._inductor.config.force_disable_caches is on"
    if getattr(config, "fx_graph_cache", True) is False:
        return "inductor's FX graph cache is off (torch._inductor.config.fx_graph_cache)"
    return ""


# ---------------------------------------------------------------- unreadable artefacts
_LOGGERS = ("torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache")
_REPORTED: set[str] = set()


class _UnreadableArtefacts(logging.Filter):
    """Torch logs an unreadable cache entry (truncated, not a pickle) with its traceback and
    compiles again. This turns that record into one CacheWarning that names the file, and
    moves a file under $LINNET_HOME/cache aside, so that no later process trips on it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        if "unable to load compiled graph" not in message:
            return True
        try:
            _report_unreadable(record)
        except Exception:  # reporting must never stop a compile
            return True
        return False


def _watch_torch_logs() -> None:
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UnreadableArtefacts) for f in logger.filters):
            logger.addFilter(_UnreadableArtefacts())


def _artefact_of(tb: types.TracebackType | None) -> str | None:
    """The file torch was reading, from the frames of its failed load (``subdir`` and
    ``path`` in FxGraphCache/AOTAutogradCache lookups)."""
    found = None
    while tb is not None:
        local = tb.tb_frame.f_locals
        subdir, path = local.get("subdir"), local.get("path")
        if isinstance(path, str):
            candidate = os.path.join(subdir, path) if isinstance(subdir, str) else path
            if os.path.isfile(candidate):
                found = candidate
        tb = tb.tb_next
    return found


def _report_unreadable(record: logging.LogRecord) -> None:
    exc = record.exc_info[1] if record.exc_info else None
    why = f"{type(exc).__name__}: {exc}" if exc is not None else record.getMessage()
    path = _artefact_of(record.exc_info[2]) if record.exc_info else None
    if path is not None and path in _REPORTED:
        return
    what = f"`{shown(path)}`" if path else "an entry of torch.compile's cache"
    where = ""
    if path is not None:
        _REPORTED.add(path)
        cache = linnet_home(create=False) / "cache"
        # Only a file torch read as its own, in the cache Linnet placed (not a link), is
        # moved: it is recorded then, so that `linnet cache clear` may remove it.
        if shown(path).startswith("$LINNET_HOME/cache/") and not Path(path).is_symlink():
            aside = _move_aside(Path(path), cache / "unreadable")
            where = (
                f"; moved it to {shown(aside)}"
                if aside
                else "; it could not be moved aside and is left as it is"
            )
        else:
            where = "; it is in your own cache directory: left it as it is"
    message = (
        f"{what} could not be read ({why}): compiling again{where} "
        "(`linnet cache clear --only inductor` empties the cache)"
    )
    from linnet.plan import CacheWarning

    warnings.warn_explicit(message, CacheWarning, "linnet", 0, module="linnet.torch.home")


def _move_aside(path: Path, folder: Path) -> Path | None:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, aside = tempfile.mkstemp(prefix=f"{stamp}-{path.name[:40]}-", dir=folder)
        os.close(fd)
        os.replace(path, aside)
    except OSError:
        return None
    record(aside)  # Linnet's to remove (`linnet cache clear`): it moved it
    return Path(aside)


# ---------------------------------------------------------------- `linnet cache`
# Which files under torch.compile's and Triton's caches are theirs. Inductor names each file by
# a base32 hash, with a letter before it and suffixes after (`5a/c<hash>.so.load_ok`,
# `locks/c<hash>.lock`, `fxgraph/kq/f<hash>/<hash>`). Triton keeps each compilation in a
# directory named by a hash, whose `__grp__<kernel>.json` lists its files; beside them, an
# autotuning result (`<fn>.autotune.json`), a compiled launcher, its `lock`, and the temporary
# folders of interrupted writes. Anything else (a user's `notes.txt`, `backup-<hash>.tar`, a
# `results.json` in a Triton directory) is not theirs, and is kept.
_HASH = re.compile(r"(?<![A-Za-z0-9])(?:[a-z0-9]{32,}|[A-Z0-9]{32,})(?![A-Za-z0-9])")
_HASH_NAMED = re.compile(r"^[a-z]?(?P<hash>[a-z0-9]{32,}|[A-Z0-9]{32,})(?:\.[A-Za-z0-9_]+)*$")
_TRITON_TMP = re.compile(r"^tmp\.pid_\d+_[0-9a-f-]{36}$")


def _hash_like(text: str) -> bool:
    """Whether ``text`` holds a hash (32 or more lower- or upper-case letters and digits,
    with at least two of each: a word is not one).

    >>> _hash_like("c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.so"), _hash_like("notes")
    (True, False)
    """
    for m in _HASH.finditer(text):
        token = m.group()
        if sum(c.isdigit() for c in token) >= 2 and sum(c.isalpha() for c in token) >= 2:
            return True
    return False


def _hash_named(name: str) -> bool:
    """Whether ``name`` is a hash (a letter before it, suffixes after), as inductor names.

    >>> _hash_named("c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.so.load_ok")
    True
    >>> _hash_named("backup-c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.tar")
    False
    """
    m = _HASH_NAMED.match(name)
    return m is not None and _hash_like(m["hash"])


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _triton_file(f: HomeFile, directory: str, name: str) -> bool:
    """A file of Triton's in its cache directory ``directory`` (named by a hash)."""
    if not _hash_named(directory):
        return False
    if name == "lock":
        return f.size == 0
    data = _json(f.read(1 << 22)) if name.endswith(".json") else None
    if name.startswith("__grp__"):
        return isinstance(data, dict) and "child_paths" in data
    if name.endswith(".autotune.json"):
        return isinstance(data, dict) and "configs_timings" in data
    if (
        name.endswith(".so")
        and f.read(4) == b"\x7fELF"
        and name.startswith(("cuda_utils", "__triton_launcher", "hip_utils"))
    ):
        return True
    for group in f.siblings():  # a file its compilation's group lists
        if group.startswith("__grp__") and group != name:
            listed = _json(f.sibling(group))
            children = listed.get("child_paths") if isinstance(listed, dict) else None
            if isinstance(children, dict | list) and name in children:
                return True
    return False


def _compiled(f: HomeFile) -> bool:
    """A file torch.compile or Triton wrote (see above)."""
    parts = f.inner.split("/")
    if _hash_named(parts[-1]):
        return True
    if len(parts) >= 3 and _TRITON_TMP.match(parts[-2]) and _hash_named(parts[-3]):
        return True  # a write Triton did not finish
    return len(parts) >= 2 and _triton_file(f, parts[-2], parts[-1])


_ASIDE = re.compile(r"^\d{8}T\d{6}-(?P<name>.+)-[a-z0-9_]{8}$")


def _unreadable(f: HomeFile) -> bool:
    """A file of torch's that Linnet moved aside (recorded when it moved it)."""
    return "/" not in f.inner and f.recorded()


def _unreadable_legacy(f: HomeFile) -> bool:
    """One an earlier version moved aside: its name, of a file named by a hash."""
    m = _ASIDE.match(f.name)
    return "/" not in f.inner and m is not None and _hash_like(m["name"])


#: The caches `linnet cache` lists, in its order (known without scanning the home).
CACHE_NAMES = ("timings", "generated", "inductor", "triton", "unreadable", "demo")


def _folders() -> list[Folder]:
    """Every cache under $LINNET_HOME the torch runtime lists, in `linnet cache`'s order
    (:data:`CACHE_NAMES`)."""
    from linnet.plan.cache import TIMINGS

    compiled = [Folder(name, f"cache/{name}", _compiled, what) for name, _, what in COMPILE_CACHES]
    return [
        TIMINGS,
        GENERATED,
        *compiled,
        Folder(
            "unreadable",
            "cache/unreadable",
            _unreadable,
            "compiled artefacts torch could not read, set aside",
            legacy=_unreadable_legacy,
        ),
        DEMO,
    ]


@dataclass
class CacheEntry:
    """One of the caches under $LINNET_HOME, as ``linnet cache info`` lists it: its name,
    where it is, how many of Linnet's files and bytes it holds (what ``linnet cache clear``
    removes), what it is for, and a note (a variable that moves it elsewhere, files that are
    not Linnet's, kept)."""

    name: str
    path: Path
    files: int
    bytes: int
    what: str
    note: str = ""
    #: Under $LINNET_HOME (cleared by ``linnet cache clear``); False for the user's own.
    ours: bool = True
    #: Files in it that are not Linnet's (kept by a clear), and links (never followed).
    kept: int = 0
    links: int = 0


def _size(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``, or of the file ``path``; links are not followed."""
    if path.is_symlink():
        return 1, 0
    if path.is_file():
        try:
            return 1, path.stat().st_size
        except OSError:
            return 1, 0
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, n)).st_size
    return files, size


def _entries(tallies: dict[str, Tally], home: Path, owner: str) -> list[CacheEntry]:
    out = []
    for folder in _folders():
        if folder.name not in tallies and owner != "missing":
            continue
        path = home / folder.rel if folder.rel else home / "benchmarks.json"
        env = next((e for n, e, _ in COMPILE_CACHES if n == folder.name), None)
        given = os.environ.get(env) if env else None
        if env and given and _users(env, given):
            files, size = _size(Path(given)) if Path(given).exists() else (0, 0)
            out.append(
                CacheEntry(
                    folder.name,
                    Path(given),
                    files,
                    size,
                    folder.what,
                    f"{env} is set: yours, not cleared",
                    ours=False,
                )
            )
            continue
        t = tallies.get(folder.name) or Tally()
        note = t.note()
        if folder.name == "timings" and home.is_dir():
            aside = len(list(home.glob("benchmarks.json.corrupt-*")))
            note = "; ".join(
                n for n in (f"{aside} unreadable file(s) set aside" if aside else "", note) if n
            )
        out.append(
            CacheEntry(
                folder.name, path, t.files, t.bytes, folder.what, note, kept=t.kept, links=t.links
            )
        )
    return out


def cache_entries() -> list[CacheEntry]:
    """Every cache the runtime writes under $LINNET_HOME, with the files and bytes of
    Linnet's own in it (nothing is created or removed: a cache not written yet has 0 files;
    in a home Linnet did not make, none is Linnet's).

    >>> [e.name for e in cache_entries()]
    ['timings', 'generated', 'inductor', 'triton', 'unreadable', 'demo']
    """
    owner, home, tallies = scan_home(_folders())
    return _entries(tallies, home, owner)


def cache_owner() -> tuple[str, Path, list[str]]:
    """Whose $LINNET_HOME is (:func:`linnet.lang.home_files.home_owner`): "linnet",
    "earlier" (an earlier version's, adopted by the next clear), "foreign" (refused by a
    clear, E0745) or "missing"; the home; the entries that are not Linnet's.

    >>> cache_owner()[0]
    'linnet'
    """
    return home_owner(_folders())


def clear_caches(names: list[str] | None = None) -> list[CacheEntry]:
    """Remove Linnet's own files from the caches ``names`` (default: all) under
    $LINNET_HOME; those cleared, with what was removed (``files``, ``bytes``) and kept.
    Only what Linnet wrote is removed, in a home Linnet made (E0745 otherwise: see
    :mod:`linnet.lang.home_files`); a cache a variable moved elsewhere (the user's
    ``TORCHINDUCTOR_CACHE_DIR``) is never touched. A file that cannot be removed is E0831.

    >>> [e.name for e in clear_caches(["demo"])]
    ['demo']
    """
    folders = [f for f in _folders() if not _moved(f.name)]
    chosen = [n for n in (names or [f.name for f in folders]) if any(f.name == n for f in folders)]
    if names is not None and not chosen:
        return []
    home, owner, tallies = clear_home(folders, chosen)
    return [e for e in _entries(tallies, home, owner) if e.name in tallies]


def _moved(name: str) -> bool:
    """Whether a variable the user set moves the cache ``name`` out of $LINNET_HOME."""
    env = next((e for n, e, _ in COMPILE_CACHES if n == name), None)
    given = os.environ.get(env) if env else None
    return bool(env and given and _users(env, given))
