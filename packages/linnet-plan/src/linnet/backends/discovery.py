"""Finding backends: the ``linnet.backends`` entry-point group.

A package names its backends in its ``pyproject.toml``::

    [project.entry-points."linnet.backends"]
    my-linear = "my_package:MyLinear"

Each entry point names a function or class that takes nothing and returns a backend. The
first call to :func:`available`, :func:`skipped` or :func:`discover` loads every entry point
once; later calls return what that load found. A plugin that cannot be used never takes the
host down: it is left out, and :func:`skipped` says which distribution it came from and why
(its module failed to import, its factory raised, it lacks part of the contract, it was
written for another contract version, its ``probe`` raised or returned something other than
Capabilities or None when asked about the CPU (:data:`HOST`), or another backend already has
its name). A probe that declines the CPU (returns None) is fine: the backend may run on a GPU.
So ``available()`` means "loaded"; which of them can run on this machine is
:func:`linnet.backends.runnable`'s answer (:mod:`linnet.backends.here`), and ``linnet
backends`` lists only those as available.

>>> from linnet.backends import available, skipped
>>> names = [backend.name for backend in available()]
>>> for record in skipped():
...     print(f"{record.name} ({record.distribution} {record.version}): {record.reason}")

``linnet backends`` prints the same from the command line.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, NamedTuple

from .contract import CONTRACT, Capabilities, Target

GROUP = "linnet.backends"
"""The entry-point group backends are found through."""

ATTRIBUTES = ("name", "version", "contract")
HOST = Target("cpu", "cpu", "cpu")
"""The target every loaded backend's ``probe`` is asked about once, at discovery: a probe
that raises there (or answers neither Capabilities nor None) is broken, and its backend is
left out of :func:`available` rather than listed and then failing in every plan."""
METHODS = ("probe", "match", "compile", "estimate_cost")
PROBE_FAULT = "E0777"
"""The code of a backend whose ``probe`` raised or answered neither Capabilities nor None:
a fault for the plugin's author, reported (``skipped()``, ``linnet backends``, the plan's
"backends not used"), never raised."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkipRecord:
    """A backend that was left out, and why.

    ``name`` is the backend's name (the entry point's name when the backend never loaded);
    ``distribution`` and ``version`` are the installed distribution's; ``path`` is the entry
    point's ``module:attr`` and where the distribution is installed; ``reason`` is a sentence
    for the user; ``detail`` is the exception's text, or "".

    >>> record = SkipRecord("old", "linnet-backend-old", "0.3", "old_backend:Old",
    ...                     "written for backend contract 0, ...")
    >>> print(record)
    old (linnet-backend-old 0.3): written for backend contract 0, ...
    """

    name: str
    distribution: str
    version: str
    path: str
    reason: str
    detail: str = ""
    code: str = ""
    """The error code of a fault the plugin's author should fix (:data:`PROBE_FAULT`: its
    ``probe`` raised or answered neither Capabilities nor None), or ""."""

    def __str__(self) -> str:
        origin = " ".join(part for part in (self.distribution, self.version) if part)
        return f"{self.name} ({origin or 'unknown distribution'}): {self.reason}"

    def to_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "path": self.path,
            "reason": self.reason,
            "detail": self.detail,
            "code": self.code,
        }


@dataclass(frozen=True)
class Found:
    """A backend that loaded, with the distribution it came from."""

    backend: Any
    distribution: str
    version: str
    path: str

    @property
    def name(self) -> str:
        return self.backend.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.backend.name,
            "version": str(self.backend.version),
            "contract": self.backend.contract,
            "distribution": self.distribution,
            "distribution_version": self.version,
            "path": self.path,
        }


@dataclass(frozen=True)
class Discovery:
    """What one load of the entry-point group found: ``found`` sorted by backend name;
    ``skipped``, the plugins that failed to load in (entry point, distribution) order, then
    the duplicates, then the backends whose probe of :data:`HOST` failed."""

    found: tuple[Found, ...]
    skipped: tuple[SkipRecord, ...]
    probe_faults: tuple[SkipRecord, ...] = ()
    """The records of ``skipped`` whose backend loaded but whose probe of :data:`HOST`
    failed (:func:`probe_all` reports them too)."""


_lock = threading.Lock()
_cache: Discovery | None = None


def discover(refresh: bool = False) -> Discovery:
    """Load every backend of the ``linnet.backends`` entry-point group, once.

    Later calls return the first load's result; ``refresh=True`` reads the entry points
    again (after installing a plugin into a running process, say).

    >>> found = discover()
    >>> [f.name for f in found.found] == [b.name for b in available()]
    True
    """
    global _cache
    with _lock:
        if _cache is None or refresh:
            _cache = _load_all(metadata.entry_points(group=GROUP))
        return _cache


def available(refresh: bool = False) -> list[Any]:
    """The backends found through entry points, sorted by name: every one that loaded and
    meets the contract, whether or not it can run on this machine
    (:func:`linnet.backends.runnable` keeps those that can). ``plan_for`` takes these and
    asks each about its target.

    >>> sorted(b.name for b in available()) == [b.name for b in available()]
    True
    """
    return [found.backend for found in discover(refresh).found]


def skipped(refresh: bool = False) -> list[SkipRecord]:
    """The backends left out, each with its distribution, version, path and reason.

    >>> all(record.reason for record in skipped())
    True
    """
    return list(discover(refresh).skipped)


def probe_all(
    target: Target, backends: Iterable[Any] | None = None
) -> tuple[list[Any], list[SkipRecord]]:
    """Ask each backend whether it runs on ``target``.

    Returns the backends whose ``probe`` gave :class:`Capabilities`, in the order given, and a
    record for each of the others: one that declined (``probe`` returned None; the reason
    its optional ``decline_reason(target)`` gives is part of the record's), one whose
    ``probe`` raised or returned something else (code :data:`PROBE_FAULT`), and one that
    does not meet the contract (a backend passed in by hand is checked as a discovered one
    is). ``backends`` defaults to :func:`available`.

    >>> from linnet.backends import Target
    >>> capable, records = probe_all(Target("cpu"))
    """
    capable: list[Any] = []
    # Backends whose probe already failed at discovery are not in available(): say so here,
    # as if they had been probed again, so that a plan over every backend lists them.
    records: list[SkipRecord] = list(discover().probe_faults) if backends is None else []
    for backend in available() if backends is None else backends:
        outcome = probe_outcome(backend, target)
        if outcome.state == "runs":
            capable.append(backend)
        else:
            origin = _origin_of(backend)
            records.append(
                SkipRecord(
                    _name_of(backend),
                    origin.distribution,
                    origin.version,
                    origin.path,
                    outcome.sentence,
                    outcome.detail,
                    outcome.code,
                )
            )
    return capable, records


class Outcome(NamedTuple):
    """What asking one backend about one target gave (:func:`probe_outcome`).

    ``state``: ``"runs"`` (``probe`` gave Capabilities), ``"declines"`` (it gave None) or
    ``"fault"`` (it raised or gave something else: ``code`` is :data:`PROBE_FAULT`; or the
    object does not meet the contract). ``reason``: why not, for the user: the backend's own
    ``decline_reason(target)`` for a decline ("" where it gives none). ``detail``: the
    exception's text, or "".

    >>> Outcome("declines", Target("cpu"), "needs a GPU").sentence
    'declined cpu: needs a GPU'
    """

    state: str
    target: Target
    reason: str = ""
    detail: str = ""
    code: str = ""
    capabilities: Capabilities | None = None

    @property
    def sentence(self) -> str:
        """The reason as the planner lists it under "backends not used"."""
        if self.state == "declines":
            return f"declined {self.target.kind}" + (f": {self.reason}" if self.reason else "")
        return self.reason


def probe_outcome(backend: Any, target: Target) -> Outcome:
    """Ask ``backend`` whether it runs on ``target``, never raising but for
    KeyboardInterrupt: a probe that raises (SystemExit included) or answers neither
    :class:`Capabilities` nor None is a ``"fault"`` with code :data:`PROBE_FAULT`. A probe
    that declines (None) is asked why through the backend's optional
    ``decline_reason(target)`` (see :class:`linnet.backends.contract.ExplainsDeclines`).

    >>> from linnet.backends import Target
    >>> class Gpu:
    ...     name, version, contract = "gpu", "1", 1
    ...     def probe(self, target): return None
    ...     def decline_reason(self, target): return "runs on CUDA only"
    ...     def match(self, graph, target): return []
    ...     def compile(self, region, target, options): ...
    ...     def estimate_cost(self, region, target): return None
    >>> probe_outcome(Gpu(), Target("cpu")).reason
    'runs on CUDA only'
    """
    try:
        problem = contract_problem(backend)
        if problem is not None:
            return Outcome("fault", target, *problem)
        capabilities = backend.probe(target)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return Outcome(
            "fault",
            target,
            f"probe for {target.kind} raised {type(exc).__name__}",
            _exception_text(exc),
            PROBE_FAULT,
        )
    if capabilities is None:
        return Outcome("declines", target, _decline_reason(backend, target))
    if not isinstance(capabilities, Capabilities):
        return Outcome(
            "fault",
            target,
            f"probe for {target.kind} returned a "
            f"{type(capabilities).__name__}, not Capabilities or None",
            "",
            PROBE_FAULT,
        )
    return Outcome("runs", target, capabilities=capabilities)


def _decline_reason(backend: Any, target: Target) -> str:
    """The sentence the backend's optional ``decline_reason(target)`` gives, or "". The
    reason is a courtesy: one that raises or is not a string never breaks planning, and
    says so in place of the reason."""
    explain = getattr(backend, "decline_reason", None)
    if not callable(explain):
        return ""
    try:
        why = explain(target)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"(its decline_reason raised {_exception_text(exc)})"
    if why is None:
        return ""
    if not isinstance(why, str):
        return f"(its decline_reason returned a {type(why).__name__}, not a sentence)"
    return " ".join(why.split())  # one line: it is listed beside the target's name


def contract_problem(backend: Any) -> tuple[str, str] | None:
    """Why ``backend`` cannot be used under this host's contract, as (reason, detail), or
    None when it has every attribute and method and declares :data:`CONTRACT`."""
    if hasattr(backend, "contract"):
        declared = backend.contract
        if type(declared) is not int:
            return (
                f"declares contract {declared!r}, which is not a contract version; this "
                f"host implements backend contract {CONTRACT}",
                "",
            )
        if declared != CONTRACT:
            upgrade = "the plugin" if declared < CONTRACT else "the host (linnet-plan)"
            return (
                f"written for backend contract {declared}, but this host implements "
                f"contract {CONTRACT}: upgrade {upgrade}",
                "",
            )
    missing = [a for a in ATTRIBUTES if not hasattr(backend, a)]
    missing += [m for m in METHODS if not callable(getattr(backend, m, None))]
    if missing:
        listed = ", ".join(missing)
        return (
            f"{type(backend).__name__} is not a backend: it lacks {listed}",
            f"a backend has {', '.join(ATTRIBUTES)} and the methods {', '.join(METHODS)}",
        )
    if not isinstance(backend.name, str) or not backend.name:
        return f"its name {backend.name!r} is not a non-empty string", ""
    return None


class _Origin(NamedTuple):
    distribution: str
    version: str
    path: str


def _load_all(entry_points: Iterable[Any]) -> Discovery:
    origins = [(ep, _origin(ep)) for ep in entry_points]
    # Sorted so that what is found, and which duplicate wins, does not depend on sys.path.
    origins.sort(key=lambda pair: (pair[0].name, pair[1].distribution, pair[0].value))
    loaded: list[Found] = []
    records: list[SkipRecord] = []
    # A plugin that prints while it imports must not corrupt `linnet backends --format json`.
    with contextlib.redirect_stdout(sys.stderr):
        for ep, origin in origins:
            outcome = _load_one(ep, origin)
            if isinstance(outcome, SkipRecord):
                records.append(outcome)
            else:
                loaded.append(outcome)
    found, duplicates = _drop_duplicates(loaded)
    records.extend(duplicates)
    working, faults = [], []
    with contextlib.redirect_stdout(sys.stderr):
        for f in found:
            answer = probe_outcome(f.backend, HOST)
            if answer.state == "fault":
                faults.append(
                    SkipRecord(
                        f.name,
                        f.distribution,
                        f.version,
                        f.path,
                        answer.reason,
                        answer.detail,
                        answer.code,
                    )
                )
            else:
                working.append(f)
    records.extend(faults)
    for record in records:
        logger.info("skipped backend %s", record)
    return Discovery(tuple(working), tuple(records), tuple(faults))


def _load_one(ep: Any, origin: _Origin) -> Found | SkipRecord:
    def skip(reason: str, detail: str = "", name: str = ep.name) -> SkipRecord:
        return SkipRecord(name, *origin, reason, detail)

    match = metadata.EntryPoint.pattern.match(ep.value or "")
    if match is None or not match.group("attr"):
        return skip(f"its entry point {ep.value!r} does not name an object as 'module:attr'")
    module_name, attr = match.group("module"), match.group("attr")
    try:
        target: Any = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SyntaxError, SystemExit... a plugin never stops the host
        return skip(
            f"its module {module_name} failed to import ({type(exc).__name__})",
            _exception_text(exc),
        )
    try:
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError as exc:
        return skip(f"its module {module_name} has no {attr}", _exception_text(exc))
    if not callable(target):
        return skip(
            f"{ep.value} is a {type(target).__name__}, not a function or class that "
            "returns a backend"
        )
    try:
        backend = target()
        problem = contract_problem(backend)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return skip(f"{ep.value}() raised {type(exc).__name__}", _exception_text(exc))
    if problem is not None:
        return skip(*problem, name=_name_of(backend, ep.name))
    return Found(backend, *origin)


def _drop_duplicates(loaded: Sequence[Found]) -> tuple[list[Found], list[SkipRecord]]:
    """Keep the first backend of each name in (name, distribution) order."""
    kept: dict[str, Found] = {}
    records: list[SkipRecord] = []
    for found in sorted(loaded, key=lambda f: (f.name, f.distribution)):
        first = kept.get(found.name)
        if first is None:
            kept[found.name] = found
            continue
        winner = first.distribution or "an unknown distribution"
        records.append(
            SkipRecord(
                found.name,
                found.distribution,
                found.version,
                found.path,
                f"another backend named {found.name}, from {winner}, comes first in "
                "(name, distribution) order",
                f"kept {first.path}; uninstall one of the two distributions to choose",
            )
        )
    return list(kept.values()), records


def _origin(ep: Any) -> _Origin:
    """The distribution an entry point came from."""
    dist = getattr(ep, "dist", None)
    name = version = location = ""
    if dist is not None:
        with contextlib.suppress(Exception):
            name = getattr(dist, "name", None) or dist.metadata["Name"] or ""
        with contextlib.suppress(Exception):
            version = dist.version or ""
        with contextlib.suppress(Exception):
            location = str(dist.locate_file(""))
    value = str(ep.value)
    return _Origin(name, version, f"{value} ({location})" if location else value)


def _origin_of(backend: Any) -> _Origin:
    """Where a backend came from: its entry point's distribution when discovery loaded it,
    else the distribution of its top-level package when that has exactly one."""
    if _cache is not None:
        for found in _cache.found:
            if found.backend is backend:
                return _Origin(found.distribution, found.version, found.path)
    cls = type(backend)
    path = f"{cls.__module__}:{cls.__qualname__}"
    top = cls.__module__.split(".", 1)[0]
    with contextlib.suppress(Exception):
        names = set(metadata.packages_distributions().get(top, []))
        if len(names) == 1:  # `linnet` is shared by many distributions: no single answer
            dist = metadata.distribution(names.pop())
            return _Origin(dist.metadata["Name"], dist.version, path)
    return _Origin("", "", path)


def _name_of(backend: Any, default: str = "") -> str:
    try:
        name = getattr(backend, "name", None)
    except Exception:  # a property that raises: the record still needs a name
        name = None
    if isinstance(name, str) and name:
        return name
    return default or type(backend).__name__


def _exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
