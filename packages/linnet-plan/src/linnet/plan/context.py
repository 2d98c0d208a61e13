"""Checking a plan's regions in context: what taking a region costs the compiled steps
around it.

A region is timed alone against the generated source of the same steps alone. Under a
compiler (torch.compile's inductor) that comparison is not what the step pays: the steps
between two regions are compiled as one slice, and the compiler fuses across them (an RMSNorm
into the product after it, SiLU x up into the down product). Taking a region cuts that slice
in two, so its steps stop being fused with their neighbours. On the H200 (8B decode,
docs/benchmarks/decode.md, session 8) regions that each saved 1-7 us alone added up to
0.56 ms a step and the step gained 0.03 ms.

:func:`choose_in_context` therefore times, for each kind of taken region, the stretch of the
plan that taking it changes (:func:`window`): the slices next to it plus its own time ("with
it") against the one slice those steps make without it. A kind that does not save the margin
there is dropped ("slower in context") and the plan is chosen again without it. Checked one
at a time, pieces that each win given the others (a norm, two products and SiLU) stay; so a
kind that lost to several taken regions (one kernel for norm + gate/up + SiLU) is then tried
in their place, and replaces them where it is faster there. The timing is the framework's (a
:class:`SliceTimer`); this module decides.

>>> from linnet.plan import choose_in_context, layout
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, TypeAlias

from linnet.backends.contract import Options

from .decide import Candidate, Decision, _pct, _us, choose

Steps: TypeAlias = tuple[int, ...]
Entry: TypeAlias = "Steps | Candidate"  # a slice's steps, or a taken region


class SliceTimer(Protocol):
    """The framework's side of the check: what a slice computes, and how long slices take.

    ``kind(steps)``: the fingerprint of the generated source over those steps (slices of one
    kind compute the same thing on different parameters). ``seconds(slices)``: median seconds
    per slice of the generated source (compiled as the plan compiles it) running each of
    ``slices`` in turn; they share one kind. It raises ``LookupError`` where a slice cannot
    be run on what was recorded (the check is then skipped for that region, and said so).
    """

    def kind(self, steps: Steps) -> str: ...

    def seconds(self, slices: list[Steps]) -> float: ...


def layout(n_steps: int, taken: Sequence[Candidate]) -> list[Entry]:
    """The plan's order of execution: each taken region where its first step stands, and the
    steps no region takes, in order, as slices (tuples of step numbers) between them.

    >>> layout(5, [])
    [(0, 1, 2, 3, 4)]
    """
    starts = {c.region.start: c for c in taken}
    claimed = {s for c in taken for s in c.region.steps}
    out: list[Entry] = []
    pending: list[int] = []
    for i in range(n_steps):
        if i in starts:
            if pending:
                out.append(tuple(pending))
                pending = []
            out.append(starts[i])
        elif i not in claimed:
            pending.append(i)
    if pending:
        out.append(tuple(pending))
    return out


def window(
    n_steps: int, before: Sequence[Candidate], after: Sequence[Candidate]
) -> tuple[list[Entry], list[Entry]]:
    """The stretch of the plan that changes between taking ``before`` and taking ``after``,
    as each lays it out: the entries (slices and regions) of each over the same steps, the
    regions the two share as its borders.

    For one region taken (``before``) or not (``after``): the slices next to it and the
    region, against the one slice the same steps make without it.

    >>> # apart, together = window(n, taken, [t for t in taken if t is not region])
    """
    ids = {id(a) for a in after}
    kept = [t for t in before if id(t) in ids]
    held = {id(k) for k in kept}
    changed = {s for t in [*before, *after] if id(t) not in held for s in t.region.steps}
    steps = set(changed)
    for e in layout(n_steps, kept):
        if isinstance(e, tuple) and changed & set(e):
            steps |= set(e)

    def inside(entries: list[Entry]) -> list[Entry]:
        return [e for e in entries if steps & set(e if isinstance(e, tuple) else e.region.steps)]

    return inside(layout(n_steps, before)), inside(layout(n_steps, after))


def rotation(group: Sequence[Candidate]) -> list[Candidate]:
    """The candidates of one kind that a timing rotates through: one per distinct set of
    parameters and states (what keeps the weights out of the L2 cache between calls).

    >>> rotation([])
    []
    """
    seen: set[tuple] = set()
    out = []
    for c in group:
        key = tuple(c.region.parameters) + tuple(c.region.states)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out or list(group[:1])


def _default_key(c: Candidate) -> Hashable:
    return (id(c.backend), c.region.kind, c.algorithm)


def choose_in_context(
    candidates: list[Candidate],
    options: Options,
    n_steps: int,
    timer: SliceTimer,
    key: Callable[[Candidate], Hashable] = _default_key,
    say: Callable[[str], None] = lambda message: None,
) -> Decision:
    """:func:`~linnet.plan.choose`, then the taken regions checked where they stand.

    Candidates of one kind (``key``: backend and region kind by default) are timed and
    decided together, on the members whose surroundings are alike (the most common; the
    first and last layers may differ and follow the verdict). Each comparison times only the
    stretch of the plan that changes (:func:`window`): its slices by ``timer``, its regions
    by their own timing. In turn, until nothing changes:

    1. **Check**, smallest saving first: a kind is kept when taking it saves at least
       ``options.margin`` of its steps' generated time alone over not taking it. A kind that
       does not is dropped, status "slower in context", and the rest are chosen again.
    2. **Replace**: a kind that lost to several taken regions whose steps it all covers (one
       kernel for norm + gate/up + SiLU, against a norm, two products and SiLU apart)
       replaces them where, in context, it saves the margin of its own generated time over
       them. They get status "overlap" (replaced), and the rest are chosen again.

    Only comparisons whose stretch changed are timed again. Each kept candidate records
    ``context_seconds = (with it, without it)``.

    >>> # decision = choose_in_context(candidates, options, len(graph.steps), timer)
    """
    dropped: list[Candidate] = []
    verdicts: dict[tuple, tuple[float, float] | str] = {}

    def compare(
        purpose: str,
        group: list[Candidate],
        taken: list[Candidate],
        change: Callable[[Candidate, list[Candidate]], list[Candidate]],
    ) -> tuple[float, float] | str:
        """(seconds taking ``taken``, seconds taking ``change(member, taken)``). Every
        member counts, not one per set of the region's own parameters: the stretches of a
        parameter-free kind (SiLU x up) hold each layer's weights."""
        members = list(group)
        shapes = {id(m): window(n_steps, taken, change(m, taken)) for m in members}
        signatures = {id(m): _signature(timer, key, *shapes[id(m)]) for m in members}
        common, _ = Counter(signatures.values()).most_common(1)[0]
        alike = [m for m in members if signatures[id(m)] == common]
        vkey = (purpose, key(group[0]), common)
        if vkey not in verdicts:
            say(f"{purpose} {len(group)} {group[0].label} region(s) {group[0].region!r} in context")
            verdicts[vkey] = _costs(timer, alike, shapes)
        return verdicts[vkey]

    while True:
        gone = {id(d) for d in dropped}
        live = [c for c in candidates if id(c) not in gone]
        for c in live:  # what a round found is said again by the next (choose resets reasons)
            c.context_seconds = None
        decision = choose(live, options)
        decision.candidates = list(candidates)
        taken = decision.taken
        # 1. each kind taken, with it against without it
        loser = None
        for group in sorted(_groups(taken, key), key=lambda g: sum(c.saving or 0.0 for c in g)):
            verdict = compare("checking", group, taken, _leaving)
            if isinstance(verdict, str):  # could not be checked: the region stays
                for c in group:
                    c.reason += f"; not checked in context ({verdict})"
                continue
            with_it, without = verdict
            if without - with_it < options.margin * (group[0].generated_seconds or 0.0):
                loser = (group, with_it, without)
                break
            for c in group:
                c.context_seconds = (with_it, without)
                c.reason += (
                    f"; in context it saves {_us(without - with_it)} us "
                    f"({_us(without)} without it, {_us(with_it)} with it)"
                )
        if loser is not None:
            group, with_it, without = loser
            for c in group:
                c.status = "slower in context"
                c.context_seconds = (with_it, without)
                c.reason = (
                    f"saves {_pct(c.saving or 0.0, c.generated_seconds)} alone, "
                    f"{_us(without - with_it)} us in context (needs "
                    f"{options.margin:.0%} of its {_us(c.generated_seconds)} us): the "
                    f"stretch around it takes {_us(without)} us compiled without it, "
                    f"{_us(with_it)} us with it"
                )
            dropped.extend(group)
            continue
        # 2. a kind that lost to several taken regions, in their place
        replaced = None
        waiting = [c for c in live if c.status == "overlap"]
        for group in sorted(_groups(waiting, key), key=lambda g: -sum(c.saving or 0.0 for c in g)):
            if not all(_replaces_several(c, taken) for c in group):
                continue  # not a fusion of what is taken: the timings alone decided
            verdict = compare("trying", group, taken, _swapping)
            if isinstance(verdict, str):
                continue
            now, instead = verdict
            if now - instead >= options.margin * (group[0].generated_seconds or 0.0):
                replaced = (group, now, instead)
                break
        if replaced is None:
            return decision
        group, now, instead = replaced
        name = f"{group[0].label}'s {group[0].region!r}"
        for x in group:
            for c in _overlapping(x, taken):
                c.status, c.context_seconds = "overlap", None
                c.reason = (
                    f"replaced in context by {name}: {_us(instead)} us where these "
                    f"take {_us(now)} us"
                )
                dropped.append(c)


def _groups(cands: list[Candidate], key: Callable[[Candidate], Hashable]) -> list[list[Candidate]]:
    groups: dict[Hashable, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(key(c), []).append(c)
    return list(groups.values())


def _without(taken: Sequence[Candidate], leave: Sequence[Candidate]) -> list[Candidate]:
    gone = {id(x) for x in leave}
    return [t for t in taken if id(t) not in gone]


def _leaving(c: Candidate, taken: Sequence[Candidate]) -> list[Candidate]:
    """``taken`` without ``c``."""
    return _without(taken, [c])


def _swapping(c: Candidate, taken: Sequence[Candidate]) -> list[Candidate]:
    """``taken`` with ``c`` in place of the regions it overlaps."""
    return [*_without(taken, _overlapping(c, taken)), c]


def _overlapping(c: Candidate, taken: Sequence[Candidate]) -> list[Candidate]:
    own = set(c.region.steps)
    return [t for t in taken if own & set(t.region.steps)]


def _replaces_several(c: Candidate, taken: Sequence[Candidate]) -> bool:
    """Whether ``c`` is one kernel for what several taken regions do apart: it covers every
    step of each taken region it overlaps, and more than one region's (one over the same
    steps: the timings alone decided between them). A kind covering less than what it
    overlaps (one product of a fused norm + gate/up) is not tried: each try compiles."""
    over = _overlapping(c, taken)
    own = set(c.region.steps)
    covered = {s for t in over for s in t.region.steps}
    return (
        bool(over)
        and covered <= own
        and not (len(over) == 1 and tuple(over[0].region.steps) == tuple(c.region.steps))
    )


def _signature(
    timer: SliceTimer, key: Callable[[Candidate], Hashable], before: list[Entry], after: list[Entry]
) -> tuple:
    def kinds(entries: list[Entry]) -> tuple:
        return tuple(timer.kind(e) if isinstance(e, tuple) else ("region", key(e)) for e in entries)

    return kinds(before), kinds(after)


def _costs(
    timer: SliceTimer, members: list[Candidate], shapes: dict[int, tuple[list[Entry], list[Entry]]]
) -> tuple[float, float] | str:
    """Seconds of the stretch before and after the change: each position's slices timed in
    rotation over ``members`` (their entries line up: one signature), each region by its own
    timing; or why that could not be done."""
    totals = []
    for side in (0, 1):
        total = 0.0
        for position, entry in enumerate(shapes[id(members[0])][side]):
            if isinstance(entry, tuple):
                try:
                    total += timer.seconds(
                        [
                            shapes[id(m)][side][position]  # type: ignore[misc]
                            for m in members
                        ]
                    )
                except LookupError as exc:
                    return str(exc) or type(exc).__name__
            else:
                total += entry.backend_seconds or 0.0
        totals.append(total)
    return totals[0], totals[1]
