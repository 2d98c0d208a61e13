"""The decision itself: which claimed regions run, by saving (or estimate, unmeasured), no
overlaps, within the memory budget; the candidates' table for ``plan.explain()``.

It sits below :mod:`linnet.plan.context` (which chooses again where a region loses in
context) and is re-exported by :mod:`linnet.plan`: import from ``linnet.plan``.

>>> from linnet.plan.decide import Candidate, choose
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from linnet.backends.contract import Options, Region


class BackendWarning(UserWarning):
    """A backend's executables failed the check run where the plan was made (they raised,
    or gave outputs that are not the generated source's): those regions run as generated
    source, and ``plan.explain()`` says why for each."""


@dataclass
class Candidate:
    """One region a backend claimed, with its timings and what became of it."""

    backend: Any
    region: Region
    executable: Any = None
    backend_seconds: float | None = None
    generated_seconds: float | None = None
    holds: int = 0
    # taken | below margin | overlap | memory | slower in context | slower whole | failed
    status: str = "pending"
    reason: str = ""
    cached: bool = False
    estimate: float | None = None  # seconds, from the backend's estimate_cost
    estimate_note: str = ""  # why an estimate was ignored (it raised, or was not a Cost)
    # (apart, together) seconds where it was checked in context (see linnet.plan.context)
    context_seconds: tuple[float, float] | None = None
    # What tells this executable apart from the backend's others over the same steps (two
    # algorithms for one region): see label_algorithms. "" where the backend offers one.
    algorithm: str = ""

    @property
    def saving(self) -> float | None:
        if self.backend_seconds is None or self.generated_seconds is None:
            return None
        return self.generated_seconds - self.backend_seconds

    @property
    def backend_name(self) -> str:
        return str(getattr(self.backend, "name", "?"))

    @property
    def label(self) -> str:
        """The backend's name, and the algorithm where it offers several for one region."""
        return self.backend_name + (f"[{self.algorithm}]" if self.algorithm else "")


@dataclass
class Decision:
    taken: list[Candidate] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)


def choose(candidates: list[Candidate], options: Options) -> Decision:
    """Pick the candidates that run: by saving (or size, unmeasured), no overlaps, in budget."""
    decision = Decision(candidates=list(candidates))
    eligible = []
    for c in candidates:
        if c.status == "failed":
            continue
        if type(c.holds) is not int or c.holds < 0:  # a plugin's meta is not to be trusted
            c.status, c.reason = "failed", f"holds={c.holds!r} is not a byte count (int >= 0)"
            continue
        if options.measure:
            saving = c.saving
            if saving is None:
                c.status, c.reason = "failed", "not timed"
                continue
            need = options.margin * (c.generated_seconds or 0.0)
            if saving < need:
                c.status = "below margin"
                c.reason = (
                    f"saves {_pct(saving, c.generated_seconds)} of the generated "
                    f"source's time; needs {options.margin:.0%}"
                )
                continue
        eligible.append(c)
    if options.measure:
        eligible.sort(key=lambda c: (-(c.saving or 0.0), -len(c.region.steps), c.region.start))
        # The set of regions that saves most in total goes first (then the rest, by saving,
        # each refused where it overlaps): one large region that saves more than each of the
        # small ones inside it can save less than they do together (a fused norm and three
        # products against the norm's and each product's own kernels).
        best = _best_set(eligible)
        chosen = {id(c) for c in best}
        eligible = best + [c for c in eligible if id(c) not in chosen]
    else:
        eligible.sort(key=_unmeasured_order)
    used_steps: dict[int, Candidate] = {}
    held = 0
    for c in eligible:
        clash = next((used_steps[s] for s in c.region.steps if s in used_steps), None)
        if clash is not None:
            c.status = "overlap"
            more = "which saves more"
            if options.measure and (clash.saving or 0.0) < (c.saving or 0.0):
                more = "which with the regions taken beside it saves more"
            c.reason = f"overlaps {clash.label}'s {clash.region!r}, {more}"
            continue
        if options.memory is not None and held + c.holds > options.memory:
            c.status = "memory"
            c.reason = (
                f"would hold {c.holds} bytes; the budget has {max(0, options.memory - held)} left"
            )
            continue
        c.status = "taken"
        if options.measure:
            c.reason = f"saves {_pct(c.saving or 0.0, c.generated_seconds)}"
        elif c.estimate is not None:
            c.reason = f"fastest estimate (not measured): {_us(c.estimate)} us"
        else:
            c.reason = "largest match (not measured)"
        held += c.holds
        for s in c.region.steps:
            used_steps[s] = c
        decision.taken.append(c)
    decision.taken.sort(key=lambda c: c.region.start)
    return decision


def label_algorithms(
    candidates: list[Candidate], key: Callable[[Candidate], Hashable] | None = None
) -> None:
    """Set ``algorithm`` on each candidate whose backend offers more than one executable for
    the same steps (two algorithms for one region), so that each is timed, cached and
    decided apart: the executable's ``meta.algorithm`` where it declares one, else (where
    two of one ``key``, by default backend and region kind, claim the same steps) the
    executable's class name; ``#2``, ``#3`` ... after the first where even those are equal.
    Candidates of a kind whose regions all differ keep ``algorithm`` "" (and the timing
    cache keys they always had) unless their executable names an algorithm.

    >>> label_algorithms([])
    """
    key = key or (lambda c: (id(c.backend), c.region.kind))
    live = [c for c in candidates if c.status != "failed" and c.executable is not None]
    shared: dict[Hashable, set[tuple[int, ...]]] = {}
    twice: set[Hashable] = set()
    for c in live:
        steps = tuple(c.region.steps)
        seen = shared.setdefault(key(c), set())
        if steps in seen:
            twice.add(key(c))
        seen.add(steps)
    count: dict[tuple, int] = {}
    for c in live:
        declared = getattr(getattr(c.executable, "meta", None), "algorithm", "")
        name = declared if isinstance(declared, str) else ""
        if not name and key(c) in twice:
            name = type(c.executable).__qualname__
        if not name:
            continue
        slot = (key(c), tuple(c.region.steps), name)
        count[slot] = count.get(slot, 0) + 1
        c.algorithm = name if count[slot] == 1 else f"{name}#{count[slot]}"


def warn_failed(candidates: list[Candidate], what: str, stacklevel: int = 3) -> None:
    """One :class:`BackendWarning` per backend with candidates in ``candidates`` that
    failed: how many of its regions, the first one's reason, that the generated source runs
    them. ``what`` says what they failed ("the check against the generated source").

    >>> warn_failed([], "the check")
    """
    by_backend: dict[int, list[Candidate]] = {}
    for c in candidates:
        if c.status == "failed":
            by_backend.setdefault(id(c.backend), []).append(c)
    for failed in by_backend.values():
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        regions = f"{len(failed)} region{'s' if len(failed) != 1 else ''}"
        warnings.warn(
            f"linnet: {regions} of backend `{first.backend_name}` failed {what} "
            f"and run as generated source: {first.region!r}: {first.reason}{more}; "
            "plan.explain() lists each",
            BackendWarning,
            stacklevel=stacklevel,
        )


def _best_set(eligible: list[Candidate]) -> list[Candidate]:
    """The candidates, no two of which share a step, whose savings add up to the most
    (weighted interval scheduling over each region's span of steps, start to stop; spans
    that only interleave count as overlapping, which never takes two that share a step), or
    the greedy choice by saving where that adds up to as much (so ties keep the order the
    greedy choice always gave).

    >>> _best_set([])
    []
    """
    greedy: list[Candidate] = []
    used: set[int] = set()
    for c in eligible:
        if not used.intersection(c.region.steps):
            greedy.append(c)
            used.update(c.region.steps)
    spans = sorted(eligible, key=lambda c: (c.region.stop, c.region.start))
    stops = [c.region.stop for c in spans]
    # best[i]: the most the first i spans (by stop) save, and the set that does it.
    best: list[tuple[float, list[Candidate]]] = [(0.0, [])]
    for i, c in enumerate(spans):
        # The spans ending at or before this one's start, by bisection on their stops.
        lo, hi = 0, i
        while lo < hi:
            mid = (lo + hi) // 2
            if stops[mid] <= c.region.start:
                lo = mid + 1
            else:
                hi = mid
        with_c = best[lo][0] + (c.saving or 0.0)
        if with_c > best[i][0]:
            best.append((with_c, [*best[lo][1], c]))
        else:
            best.append(best[i])
    total, chosen = best[-1]
    if total <= sum(c.saving or 0.0 for c in greedy) * (1 + 1e-12):
        return greedy
    return chosen


def _unmeasured_order(c: Candidate) -> tuple:
    """Estimated candidates first, least estimated seconds per step covered first (the
    steps a region claims are what overlapping candidates compete for); then the rest, the
    largest regions first."""
    if c.estimate is not None:
        return (0, c.estimate / len(c.region.steps), -len(c.region.steps), c.region.start)
    return (1, 0.0, -len(c.region.steps), c.region.start)


def _pct(saving: float, base: float | None) -> str:
    if not base:
        return "?"
    return f"{saving / base:.1%}"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def explain_table(candidates: list[Candidate], skipped: list[Any], header: str = "") -> str:
    """The text of ``plan.explain()``: every candidate region, its times and its fate."""
    lines = [header] if header else []
    rows = [
        (
            "region",
            "steps",
            "backend",
            "estimate us",
            "backend us",
            "generated us",
            "saving",
            "decision",
        )
    ]
    for c in sorted(candidates, key=lambda c: (_first_step(c.region), c.backend_name)):
        r = c.region
        what, span = _where(r)
        saving = "-" if c.saving is None else _pct(c.saving, c.generated_seconds)
        decision = c.status + (f": {c.reason}" if c.reason else "")
        if c.cached:
            decision += " (cached timing)"
        if c.estimate_note:
            decision += f" (estimate ignored: {c.estimate_note})"
        rows.append(
            (
                what,
                span,
                c.label,
                _us(c.estimate),
                _us(c.backend_seconds),
                _us(c.generated_seconds),
                saving,
                decision,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(7)]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:7])) + "  " + row[7]
        )
    if skipped:
        lines.append("")
        lines.append("backends not used:")
        for s in skipped:
            name = getattr(s, "name", "?")
            dist = getattr(s, "distribution", "")
            reason = getattr(s, "reason", str(s))
            detail = getattr(s, "detail", "")
            code = getattr(s, "code", "")  # E0777: a probe at fault, for the plugin's author
            lines.append(
                f"  {name}"
                + (f" ({dist})" if dist else "")
                + ": "
                + (f"error[{code}]: " if code else "")
                + reason
                + (f" [{detail}]" if detail else "")
            )
    taken = sum(1 for c in candidates if c.status == "taken")
    lines.append("")
    lines.append(
        f"{taken} of {len(candidates)} candidate regions taken by backends; the rest "
        "of the entry runs as generated source."
    )
    return "\n".join(lines)


def _first_step(region: Region) -> int:
    """Where ``region`` stands in the table: its first step; -1 for what a backend's
    ``match`` gave that names no steps of the graph (recorded as a failed candidate)."""
    try:
        return int(region.steps[0])
    except Exception:
        return -1


def _where(r: Region) -> tuple[str, str]:
    """The table's region and steps cells. A failed candidate's region may be anything a
    backend made (steps outside the graph, of another graph, none): never trust it here."""
    try:
        # "+ writes": the region's steps end with state writes (a kernel that stores k and
        # v into the cache, beside the same op's region without them).
        what = (
            (r.callee.rsplit("::", 1)[-1] if r.callee else "steps")
            + (" + writes" if r.callee and r.writes_state else "")
            + (f" [{r.path}]" if r.path else "")
        )
        span = f"{r.start}..{r.stop}" + (
            "" if len(r.steps) == r.stop - r.start else f" ({len(r.steps)})"
        )
        return what, span
    except Exception:
        return "-", "-"
