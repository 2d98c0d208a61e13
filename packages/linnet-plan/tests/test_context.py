"""choose_in_context: each kind of taken region checked against the compiled steps around it
(linnet.plan.context), with a timer of fixed figures in place of the framework's."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from linnet.backends.contract import Options
from linnet.plan import Candidate, choose, choose_in_context, layout, rotation, window

US = 1e-6


@dataclass(frozen=True, eq=False)
class FakeRegion:
    """What the decision reads of a Region: its steps, kind, parameters and states."""

    steps: tuple[int, ...]
    kind: str
    parameters: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    callee: str = ""
    path: str = ""

    @property
    def start(self) -> int:
        return self.steps[0]

    @property
    def stop(self) -> int:
        return self.steps[-1] + 1

    def __repr__(self) -> str:
        return f"Region({self.kind} @{self.start})"


class Backend:
    def __init__(self, name: str):
        self.name = name


def candidate(backend, steps, kind, backend_us, generated_us, parameters=()):
    c = Candidate(backend, FakeRegion(tuple(steps), kind, tuple(parameters)))
    c.backend_seconds, c.generated_seconds = backend_us * US, generated_us * US
    return c


@dataclass
class Timer:
    """Slice kinds by a table of their steps (default: the steps themselves), seconds by a
    table of kinds; every timing asked for is counted."""

    times: dict[str, float]
    kinds: dict[tuple[int, ...], str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    missing: tuple[tuple[int, ...], ...] = ()

    def kind(self, steps):
        return self.kinds.get(tuple(steps), str(tuple(steps)))

    def seconds(self, slices):
        kinds = {self.kind(s) for s in slices}
        assert len(kinds) == 1, f"one timing rotates over one kind, not {kinds}"
        if any(tuple(s) in self.missing for s in slices):
            raise LookupError(f"%v{slices[0][0]} was not recorded")
        kind = kinds.pop()
        self.asked.append(kind)
        self.sizes.append(len(slices))
        return self.times[kind] * US


def test_layout_and_window():
    a = Backend("a")
    r = candidate(a, [3, 4], "r", 1, 2)
    q = candidate(a, [7], "q", 1, 2)
    assert layout(10, [r, q]) == [(0, 1, 2), r, (5, 6), q, (8, 9)]
    # r taken or not: the slices around it and r, against the one slice they make without it
    assert window(10, [r, q], [q]) == ([(0, 1, 2), r, (5, 6)], [(0, 1, 2, 3, 4, 5, 6)])
    # between two regions, with nothing around it: alone is its context
    s = candidate(a, [5, 6], "s", 1, 2)
    assert window(10, [r, s, q], [r, q]) == ([s], [(5, 6)])
    # one region over 3..7 in place of r and q: the stretch from 0 to 9 is what changes
    w = candidate(a, [3, 4, 5, 6, 7], "w", 1, 2)
    assert window(10, [r, q], [w]) == ([(0, 1, 2), r, (5, 6), q, (8, 9)], [(0, 1, 2), w, (8, 9)])


def test_a_region_that_cuts_a_fusion_is_dropped_and_what_it_beat_is_taken():
    """The norm kernel saves alone, but compiled together the steps around it are cheaper
    than apart with it: dropped. The fused kernel over the same steps, which lost to it on
    saving alone, is then taken and wins in context."""
    k = Backend("linnet-kernels")
    norm = candidate(k, [2, 3], "norm", 1.0, 4.0)  # saves 3 us alone
    fused = candidate(k, [2, 3, 4, 5], "fused", 3.0, 5.5)  # saves 2.5 us alone
    timer = Timer(
        {
            str((0, 1)): 2.0,
            str((4, 5, 6, 7)): 8.0,  # apart, with the norm taken: 2 + 1 + 8
            str(tuple(range(8))): 10.0,  # together: inductor fuses the norm into the product
            str((6, 7)): 3.0,  # apart, with the fused kernel taken: 2 + 3 + 3
        }
    )
    options = Options()
    assert choose([norm, fused], options).taken == [norm]  # alone, the norm wins
    said = []
    decision = choose_in_context([norm, fused], options, 8, timer, say=said.append)
    assert decision.taken == [fused]
    assert norm.status == "slower in context"
    assert "-1.0 us in context" in norm.reason and "10.0 us compiled without it" in norm.reason
    assert norm.context_seconds == pytest.approx((11.0 * US, 10.0 * US))
    assert fused.status == "taken" and fused.context_seconds == pytest.approx((8.0 * US, 10.0 * US))
    assert "in context it saves" in fused.reason
    assert [s.split(" in context")[0] for s in said] == [
        "checking 1 linnet-kernels region(s) Region(norm @2)",
        "checking 1 linnet-kernels region(s) Region(fused @2)",
    ]
    assert decision.candidates == [norm, fused]


def test_the_margin_in_context_is_of_the_regions_own_generated_time():
    k = Backend("k")
    r = candidate(k, [1], "r", 1.0, 100.0)  # saves 99 us alone
    # in context it saves 1.5 us: under 2% of its 100 us
    timer = Timer({str((0,)): 1.0, str((2,)): 1.0, str((0, 1, 2)): 4.5})
    assert choose_in_context([r], Options(), 3, timer).taken == []
    assert r.status == "slower in context" and "needs 2% of its 100.0 us" in r.reason
    r2 = candidate(k, [1], "r", 1.0, 100.0)
    timer = Timer({str((0,)): 1.0, str((2,)): 1.0, str((0, 1, 2)): 5.5})  # saves 2.5 us
    assert choose_in_context([r2], Options(), 3, timer).taken == [r2]


def test_layers_of_one_kind_share_a_verdict_timed_in_rotation():
    """Four layers, each region between two slices; the first and last layers' surroundings
    differ (the embedding before, the head after): the kind is timed once, rotating over the
    two middle layers, whose surroundings are the most common, and all four follow."""
    k = Backend("k")
    regions = [candidate(k, [4 * i + 1], "r", 1.0, 3.0, parameters=(f"l{i}.w",)) for i in range(4)]
    kinds = {
        (0,): "before",
        (2, 3, 4): "between",
        (6, 7, 8): "between",
        (10, 11, 12): "between",
        (14, 15, 16): "last",
        (0, 1, 2, 3, 4): "t0",
        (2, 3, 4, 5, 6, 7, 8): "tmid",
        (6, 7, 8, 9, 10, 11, 12): "tmid",
        (10, 11, 12, 13, 14, 15, 16): "tlast",
    }
    timer = Timer({"between": 2.0, "tmid": 6.0}, kinds)
    decision = choose_in_context(regions, Options(), 17, timer)
    assert decision.taken == regions
    # two slices apart, one together, each timed once over the two middle layers
    assert timer.asked == ["between", "between", "tmid"]
    assert timer.sizes == [2, 2, 2]
    assert all(r.context_seconds == pytest.approx((5.0 * US, 6.0 * US)) for r in regions)


def test_a_slice_that_cannot_be_timed_leaves_the_region_taken_and_says_so():
    k = Backend("k")
    r = candidate(k, [1], "r", 1.0, 3.0)
    timer = Timer({str((0,)): 1.0, str((2,)): 1.0, str((0, 1, 2)): 1.0}, missing=((2,),))
    decision = choose_in_context([r], Options(), 3, timer)
    assert decision.taken == [r]
    assert "not checked in context (%v2 was not recorded)" in r.reason
    assert r.context_seconds is None


def test_verdicts_are_kept_while_the_surroundings_stay():
    """Dropping one kind re-chooses; a kind whose surroundings did not change is not timed
    again."""
    k = Backend("k")
    small = candidate(k, [1], "small", 1.0, 2.0)  # saves 1 us alone: checked first
    big = candidate(k, [5], "big", 1.0, 9.0)
    timer = Timer(
        {
            str((0,)): 1.0,
            str((2, 3, 4)): 3.0,
            str((0, 1, 2, 3, 4)): 3.0,  # small loses
            str((6,)): 1.0,
            str((0, 1, 2, 3, 4, 6)): 99.0,  # never: big is not next to small
            str((0, 1, 2, 3, 4, 5, 6)): 20.0,
        }
    )
    decision = choose_in_context([small, big], Options(), 7, timer)
    assert decision.taken == [big] and small.status == "slower in context"
    # small: (0,), (2,3,4) apart and (0..4) together; then big: (0..4), (6,) apart, (0..6)
    # together; big was not checked before small's drop (small is checked first)
    assert timer.asked == [
        str((0,)),
        str((2, 3, 4)),
        str((0, 1, 2, 3, 4)),
        str((0, 1, 2, 3, 4)),
        str((6,)),
        str((0, 1, 2, 3, 4, 5, 6)),
    ]


def test_rotation_keeps_one_candidate_per_set_of_parameters():
    k = Backend("k")
    a = candidate(k, [1], "r", 1, 2, parameters=("a",))
    b = candidate(k, [3], "r", 1, 2, parameters=("a",))
    c = candidate(k, [5], "r", 1, 2, parameters=("c",))
    assert rotation([a, b, c]) == [a, c]


def test_one_kernel_replaces_the_pieces_it_lost_to_where_it_is_faster_in_context():
    """A norm, a product and SiLU each win alone and each in context given the others, so
    checking them one at a time keeps them; the one kernel over all three, which lost to the
    product on saving alone, is tried in their place and is faster there."""
    k = Backend("linnet-kernels")
    norm = candidate(k, [2, 3], "norm", 1.0, 2.0)
    gate = candidate(k, [4], "gate", 3.0, 5.0)
    silu = candidate(k, [5], "silu", 1.0, 2.0)
    fused = candidate(k, [2, 3, 4, 5], "fused", 3.5, 5.0)
    timer = Timer(
        {
            str((0, 1)): 1.0,
            str((0, 1, 2, 3)): 3.0,  # the norm in context: saves 1
            str((6, 7, 8, 9)): 4.0,
            str((5, 6, 7, 8, 9)): 5.5,  # SiLU: saves 0.5
            str((4,)): 5.0,  # the product, between two regions: saves 2
            str(tuple(range(10))): 12.0,  # the kernel in context: saves 3.5
        }
    )
    assert choose([norm, gate, silu, fused], Options()).taken == [norm, gate, silu]
    said = []
    decision = choose_in_context([norm, gate, silu, fused], Options(), 10, timer, say=said.append)
    assert decision.taken == [fused]
    assert fused.context_seconds == pytest.approx((8.5 * US, 12.0 * US))
    for piece in (norm, gate, silu):
        assert piece.status == "overlap" and piece.context_seconds is None
        assert piece.reason == (
            "replaced in context by linnet-kernels's Region(fused @2): "
            "8.5 us where these take 10.0 us"
        )
    assert "trying 1 linnet-kernels region(s) Region(fused @2) in context" in said


def test_a_kernel_over_the_same_steps_as_one_region_is_not_tried_again_in_context():
    """Two kernels over the same steps: the timings alone decided between them."""
    k = Backend("k")
    one = candidate(k, [1], "one", 1.0, 3.0)
    other = candidate(Backend("b"), [1], "other", 1.5, 3.0)
    timer = Timer({str((0,)): 1.0, str((2,)): 1.0, str((0, 1, 2)): 9.0})
    decision = choose_in_context([one, other], Options(), 3, timer)
    assert decision.taken == [one] and other.status == "overlap"
    assert timer.asked == [str((0,)), str((2,)), str((0, 1, 2))]  # the check of `one` only


def test_a_kind_covering_less_than_what_it_overlaps_is_not_tried_in_its_place():
    """One product of a fused norm + product kernel that was taken: trying it would compile
    the slices around it for a swap that gives up the fusion; it is left an overlap."""
    k = Backend("k")
    fused = candidate(k, [1, 2, 3], "fused", 1.0, 9.0)
    product = candidate(k, [2], "product", 0.5, 3.0)
    timer = Timer({str((0,)): 1.0, str((4,)): 1.0, str((0, 1, 2, 3, 4)): 12.0})
    decision = choose_in_context([fused, product], Options(), 5, timer)
    assert decision.taken == [fused] and product.status == "overlap"
    assert timer.asked == [str((0,)), str((4,)), str((0, 1, 2, 3, 4))]  # the check of `fused`
