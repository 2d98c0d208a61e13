"""Which backends can run on this machine, and why the others cannot.

:func:`~linnet.backends.available` lists the backends that loaded and meet the contract; a
backend for CUDA loads on a machine without a GPU too. This module asks each of them about
every target of this machine (:func:`this_machine`: the CPU, and each CUDA device torch sees
where torch is installed; torch is never imported where it is not) and keeps what each
``probe`` answered: it runs there, it declines (with the reason the backend's optional
``decline_reason(target)`` gives), or its probe is at fault (raised, or answered neither
Capabilities nor None: code :data:`~linnet.backends.discovery.PROBE_FAULT`, never a
traceback). A backend is *runnable here* when it runs on at least one target. ``linnet
backends`` prints this; :func:`runnable` gives the backends.

>>> from linnet.backends import runnable
>>> names = [backend.name for backend in runnable()]
>>> report = survey()
>>> for entry in report.not_runnable:  # doctest: +SKIP
...     print(entry.name, "; ".join(outcome_text(result) for result in entry.results))
cublaslt cpu: declines: cuBLASLt runs on CUDA devices only; this target is cpu; ...
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .contract import Capabilities, Target
from .discovery import (
    HOST,
    Discovery,
    Found,
    Outcome,
    _exception_text,
    discover,
    probe_outcome,
)


@dataclass(frozen=True)
class Machine:
    """This machine's targets (the CPU first, then each CUDA device) and ``notes``: sentences
    saying why there is no CUDA target (torch is not installed, sees no device, ...) or why a
    device was left out.

    >>> Machine((Target("cpu", "cpu", "cpu"),), ("torch is not installed",)).describe()
    'cpu; torch is not installed'
    """

    targets: tuple[Target, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """The targets, then the notes, on one line."""
        return "; ".join([", ".join(_where(t) for t in self.targets) or "none", *self.notes])

    def to_json(self) -> dict[str, Any]:
        return {"targets": [_target_json(t) for t in self.targets], "notes": list(self.notes)}


def this_machine() -> Machine:
    """The targets a plan could have here: the CPU, and every CUDA device torch sees (as the
    torch runtime describes a device to backends: kind, ``cuda:N``, the device's name and
    compute capability, framework ``"torch"``). torch is imported only where it is installed;
    a torch that fails to import or cannot query CUDA gives a note, never an exception.

    >>> this_machine().targets[0].kind
    'cpu'
    """
    notes: list[str] = []
    # An installed torch may print while it imports: never into `linnet backends --format json`.
    with contextlib.redirect_stdout(sys.stderr):
        torch, note = _torch()
        cuda: list[Target] = []
        if torch is not None:
            cuda, more = _cuda_targets(torch)
            notes += more
        elif note:
            notes.append(note)
    return Machine((HOST, *cuda), tuple(notes))


def _torch() -> tuple[Any, str]:
    """torch, or None and why."""
    if sys.modules.get("torch") is None:  # asked of the import system: nothing is imported
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return None, "no CUDA device looked for: torch is not installed"
    try:
        import torch
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a broken install: say so, and probe the CPU alone
        return None, f"no CUDA device looked for: torch failed to import ({_exception_text(exc)})"
    return torch, ""


def _cuda_targets(torch: Any) -> tuple[list[Target], list[str]]:
    version = str(getattr(torch, "__version__", "?"))
    cuda_version = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        # An old driver makes is_available() warn and return False: the warning is the reason.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return [], [
            f"no CUDA device: torch {version} could not query CUDA ({_exception_text(exc)})"
        ]
    if count == 0:
        if cuda_version is None:
            why = f"torch {version} is built without CUDA"
        else:
            why = f"torch {version} (CUDA {cuda_version}) sees none"
            said = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message)]
            if said:
                why += f" ({said[0]})"
        return [], [f"no CUDA device: {why}"]
    versions = (("torch", version), ("cuda", str(cuda_version)))
    targets: list[Target] = []
    notes: list[str] = []
    for index in range(count):
        try:
            props = torch.cuda.get_device_properties(index)
            targets.append(
                Target(
                    "cuda",
                    f"cuda:{index}",
                    str(props.name),
                    (int(props.major), int(props.minor)),
                    "torch",
                    versions,
                )
            )
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            notes.append(
                f"cuda:{index} left out: torch could not read its properties "
                f"({_exception_text(exc)})"
            )
    return targets, notes


@dataclass(frozen=True)
class Availability:
    """One loaded backend (``found``) and what its ``probe`` answered for each target of the
    machine (``results``, one :class:`~linnet.backends.discovery.Outcome` each, in the
    machine's order). ``runnable``: it runs on at least one.
    """

    found: Found
    results: tuple[Outcome, ...]

    @property
    def name(self) -> str:
        return self.found.name

    @property
    def runnable(self) -> bool:
        return any(r.state == "runs" for r in self.results)

    @property
    def runs_on(self) -> list[Target]:
        return [r.target for r in self.results if r.state == "runs"]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.found.to_json(),
            "runnable": self.runnable,
            "targets": [outcome_json(r) for r in self.results],
        }


@dataclass(frozen=True)
class Survey:
    """What :func:`survey` found: the ``machine``, the ``backends`` that loaded (in
    :func:`~linnet.backends.available`'s order) with each one's answers, and the
    ``discovery`` they came from (its ``skipped`` are the plugins that did not load)."""

    machine: Machine
    backends: tuple[Availability, ...]
    discovery: Discovery

    @property
    def runnable(self) -> list[Availability]:
        return [a for a in self.backends if a.runnable]

    @property
    def not_runnable(self) -> list[Availability]:
        return [a for a in self.backends if not a.runnable]


def survey(discovery: Discovery | None = None, machine: Machine | None = None) -> Survey:
    """Ask every loaded backend of ``discovery`` (default: :func:`discover`) about every
    target of ``machine`` (default: :func:`this_machine`, looked at only where there is a
    backend to ask). A probe that prints writes to stderr.

    >>> report = survey()
    >>> [a.name for a in report.runnable] == [b.name for b in runnable()]
    True
    """
    discovery = discover() if discovery is None else discovery
    if machine is None:
        # Without a backend there is nothing to ask: spare `linnet backends` torch's import.
        machine = this_machine() if discovery.found else Machine((HOST,))
    backends = []
    with contextlib.redirect_stdout(sys.stderr):
        for found in discovery.found:
            backends.append(
                Availability(
                    found, tuple(probe_outcome(found.backend, target) for target in machine.targets)
                )
            )
    return Survey(machine, tuple(backends), discovery)


def runnable(refresh: bool = False) -> list[Any]:
    """The backends that can run on this machine: of :func:`~linnet.backends.available`'s,
    those whose ``probe`` accepts at least one of its targets (:func:`this_machine`).
    ``plan_for`` needs no such filter (it asks each backend about its own target); this
    answers "is my backend usable here?".

    >>> from linnet.backends import available
    >>> all(b in available() for b in runnable())
    True
    """
    return [a.found.backend for a in survey(discover(refresh)).runnable]


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """An :class:`~linnet.backends.discovery.Outcome` as JSON: the target, ``state``
    (``runs``, ``declines``, ``fault``), ``reason``, ``detail``, ``code`` and, where it runs,
    the Capabilities' dtypes and notes.

    >>> outcome_json(Outcome("declines", Target("cpu", "cpu"), "needs a GPU"))["state"]
    'declines'
    """
    out: dict[str, Any] = {
        "target": _target_json(outcome.target),
        "state": outcome.state,
        "reason": outcome.reason,
        "detail": outcome.detail,
        "code": outcome.code,
    }
    if isinstance(outcome.capabilities, Capabilities):
        out["dtypes"] = [str(d) for d in _sequence(outcome.capabilities.dtypes)]
        out["notes"] = str(outcome.capabilities.notes)
    return out


def outcome_text(outcome: Outcome) -> str:
    """One line for ``linnet backends``: ``cpu: runs``, ``cpu: declines: why`` or
    ``cuda:0: error[E0777]: probe for cuda raised OSError``.

    >>> outcome_text(Outcome("declines", Target("cpu", "cpu"), "runs on CUDA only"))
    'cpu: declines: runs on CUDA only'
    """
    where = _where(outcome.target)
    if outcome.state == "runs":
        return f"{where}: runs"
    if outcome.state == "declines":
        return f"{where}: declines: " + (outcome.reason or "(the backend gives no reason)")
    return f"{where}: " + (f"error[{outcome.code}]: " if outcome.code else "") + outcome.reason


def _where(target: Target) -> str:
    where = target.device or target.kind
    if target.kind == "cuda" and target.name:
        where += (
            f" ({target.name}"
            + (
                f", compute capability {target.capability[0]}.{target.capability[1]}"
                if target.capability
                else ""
            )
            + ")"
        )
    return where


def _target_json(target: Target) -> dict[str, Any]:
    return {
        "kind": target.kind,
        "device": target.device,
        "name": target.name,
        "capability": list(target.capability) if target.capability else None,
        "framework": target.framework,
    }


def _sequence(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()
