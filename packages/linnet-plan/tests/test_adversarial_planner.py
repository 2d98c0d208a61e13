"""The framework-neutral planner under attack (issue 38, items 13-15): plan_for's arguments,
candidates offering two algorithms for one region, and failed candidates whose region is
whatever a backend's `match` gave.

The torch side (the same cases through `model.plan_for` and `conform`) is in
packages/linnet-runtime-torch/tests/test_adversarial_plan.py.
"""

from __future__ import annotations

import math
import warnings
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.backends import ExecutableMeta, Options, Region
from linnet.lang import Graph, LinnetError, check_file, lower
from linnet.plan import (
    BackendWarning,
    Candidate,
    TimingCache,
    choose,
    explain_table,
    label_algorithms,
    warn_failed,
)
from linnet.plan.arguments import check_backends, check_cache, check_progress, plan_options

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


@cache
def decode() -> Graph:
    import json

    config = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    return lower(check_file(LLAMA), "decode", {"token": [1], "pos": [1]}, config, check=False)


def code(call) -> str:
    with pytest.raises(LinnetError) as err:
        call()
    assert err.value.diagnostics[0].help  # every refusal says what to write instead
    return err.value.diagnostics[0].code


# ------------------------------------------------------------ item 13: the arguments
@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-5, 5),
        st.booleans(),
        st.none(),
        st.text(max_size=4),
    )
)
def test_margin_is_a_fraction_in_zero_to_one(margin):
    good = (
        not isinstance(margin, bool)
        and isinstance(margin, int | float)
        and math.isfinite(margin)
        and 0 <= margin < 1
    )
    if good:
        assert plan_options(margin=margin).margin == margin
    else:
        assert code(lambda: plan_options(margin=margin)) == "E0772"


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-5, 2**70),
        st.booleans(),
        st.none(),
        st.text(max_size=4),
    )
)
def test_memory_is_none_or_a_byte_count(memory):
    good = memory is None or (
        not isinstance(memory, bool)
        and isinstance(memory, int | float)
        and math.isfinite(memory)
        and memory >= 0
    )
    if good:
        got = plan_options(memory=memory).memory
        assert got is None if memory is None else (isinstance(got, int) and got == int(memory))
    else:
        assert code(lambda: plan_options(memory=memory)) == "E0771"


@pytest.mark.parametrize("name", ["measure", "kernels", "captured"])
@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, [True]])
def test_flags_are_true_or_false(name, value):
    expected = "E0765" if name == "captured" else "E0774"
    assert code(lambda: plan_options(**{name: value})) == expected
    assert getattr(plan_options(**{name: False}), name, False) is False


class Named:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize(
    "backends, words",
    [
        ("cublaslt", "is a string"),
        (b"x", "is a string"),
        (Named("a"), "not a list"),
        ({"a": Named("a")}, "not a list"),
        (7, "not a list"),
        ([None], "backends[0] is None"),
        (["cublaslt"], "backends[0] is 'cublaslt'"),
        ([Named], "is the class Named"),
        ([Named("a"), 2.5], "backends[1] is 2.5"),
        ([{"name": "a"}], "(a dict)"),
        ([(Named("a"),)], "(a tuple)"),
        ([Named("a"), Named("a")], "both named `a`"),
    ],
)
def test_backends_is_a_list_of_backend_objects(backends, words):
    with pytest.raises(LinnetError) as err:
        check_backends(backends)
    assert err.value.diagnostics[0].code == "E0773" and words in str(err.value)


def test_backend_objects_that_break_the_contract_are_left_to_the_planner():
    """An object meant as a backend (it is no value, name or class) is the planner's to
    probe and record as skipped with why; the same object twice is refused."""
    odd = object()
    assert check_backends([odd, Named("a"), Named(3)])[0] is odd
    assert check_backends(iter([Named("a")]))[0].name == "a"
    with pytest.raises(LinnetError) as err:
        check_backends([odd, odd])
    assert "backends[1] is backends[0] again" in str(err.value)


def test_progress_and_cache_take_what_plan_for_uses(tmp_path):
    for good in (True, False, None, print):
        check_progress(good)
    for bad in ("log.txt", 3, [print]):
        assert code(lambda bad=bad: check_progress(bad)) == "E0775"
    check_cache(None)
    check_cache(TimingCache(tmp_path / "b.json"))
    for bad in ("benchmarks.json", tmp_path / "b.json", {}, 3):
        assert code(lambda bad=bad: check_cache(bad)) == "E0776"


# ------------------------------------------------------------ item 14: two algorithms
class Exe:
    def __init__(self, algorithm=""):
        self.meta = ExecutableMeta(algorithm=algorithm)


class OtherExe(Exe):
    pass


def head() -> Region:
    g = decode()
    c = [c for c in g.calls if c.callee == "std.nn.linear::linear"][-1]
    return Region.of(g, c.start, c.stop, c.index)


def test_two_executables_for_one_region_are_told_apart():
    backend = Named("b")
    named = [Candidate(backend, head(), Exe("slow")), Candidate(backend, head(), Exe("fast"))]
    label_algorithms(named)
    assert [c.algorithm for c in named] == ["slow", "fast"]
    by_class = [Candidate(backend, head(), Exe()), Candidate(backend, head(), OtherExe())]
    label_algorithms(by_class)
    assert [c.algorithm for c in by_class] == ["Exe", "OtherExe"]
    by_order = [Candidate(backend, head(), Exe()) for _ in range(3)]
    label_algorithms(by_order)
    assert [c.algorithm for c in by_order] == ["Exe", "Exe#2", "Exe#3"]
    assert by_order[1].label == "b[Exe#2]"


def test_one_executable_per_region_keeps_no_label():
    """A backend with one executable per region keeps algorithm "" (the timing cache keys
    older versions wrote), also where two backends claim the same steps."""
    alone = [Candidate(Named("a"), head(), Exe()), Candidate(Named("b"), head(), Exe())]
    label_algorithms(alone)
    assert [c.algorithm for c in alone] == ["", ""]
    failed = [
        Candidate(Named("a"), head(), Exe(), status="failed"),
        Candidate(Named("a"), head(), Exe()),
    ]
    label_algorithms(failed)  # a failed candidate is not an algorithm of the other
    assert [c.algorithm for c in failed] == ["", ""]


def test_the_faster_algorithm_is_taken_and_the_other_overlaps():
    backend = Named("b")
    slow, fast = Candidate(backend, head(), Exe()), Candidate(backend, head(), OtherExe())
    label_algorithms([slow, fast])
    slow.backend_seconds, fast.backend_seconds = 2e-6, 1e-6
    for c in (slow, fast):
        c.generated_seconds = 3e-6
    decision = choose([slow, fast], Options())
    assert decision.taken == [fast] and slow.status == "overlap"
    assert "b[OtherExe]" in slow.reason


# ------------------------------------------------------------ item 15: failed, never dropped
def test_explain_lists_failed_candidates_whatever_their_region_holds():
    """A failed candidate's region may be a stand-in with no steps, steps outside the graph
    (with a callee, so explain would look the steps up) or of another graph: the table is
    made all the same, each row with its reason."""
    g = decode()
    regions = [
        Region(g, (), None, (), (), (), (), ""),
        Region(
            g, (len(g.steps) + 3,), None, (), (), (), (), "", "std.nn.linear::linear", "lm_head"
        ),
        Region(g, "nope", None, (), (), (), (), "", "x::y"),  # type: ignore[arg-type]
        Region(g, (None,), None, (), (), (), (), "", "x::y"),
    ]  # type: ignore[arg-type]
    cands = [
        Candidate(Named("b"), r, status="failed", reason=f"reason {i}")
        for i, r in enumerate(regions)
    ]
    text = explain_table(cands, [])
    assert all(f"failed: reason {i}" in text for i in range(len(regions)))
    assert "0 of 4 candidate regions taken" in text
    assert all(isinstance(repr(r), str) for r in regions)


def test_failed_candidates_give_one_warning_per_backend():
    a, b = Named("a"), Named("b")
    cands = [
        Candidate(a, head(), status="failed", reason="NaN"),
        Candidate(a, head(), status="failed", reason="zeros"),
        Candidate(b, head(), status="failed", reason="raised"),
        Candidate(b, head(), status="taken"),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_failed(cands, "the check")
    messages = [str(w.message) for w in caught if w.category is BackendWarning]
    assert len(messages) == 2
    assert "2 regions of backend `a` failed the check" in messages[0]
    assert "NaN (and 1 more)" in messages[0] and "1 region of backend `b`" in messages[1]


# ------------------------------------------------------------ the set that saves most
def _timed(region: Region, backend: float, generated: float, name: str = "b") -> Candidate:
    c = Candidate(Named(name), region, Exe())
    c.backend_seconds, c.generated_seconds = backend, generated
    return c


def test_small_regions_that_save_more_together_beat_one_large_region():
    """A fused region over a norm and its products saved more than each small region inside
    it, and less than they do together; choosing by each region's own saving took the fused
    one (measured on an H200: `rms_norm_qkv_q8` 20.1 us taken where the norm and the three
    products' own kernels took about 17). The plan takes the set that saves most."""
    g = decode()
    assert len(g.steps) >= 6
    whole = Region.of_steps(g, range(0, 6))
    parts = [Region.of_steps(g, range(i, i + 2)) for i in (0, 2, 4)]
    fused = _timed(whole, 20e-6, 220e-6, "fused")
    small = [_timed(r, 2e-6, 70e-6, f"part{i}") for i, r in enumerate(parts)]  # 68 us each
    decision = choose([fused, *small], Options())
    assert decision.taken == small and fused.status == "overlap"
    assert "which with the regions taken beside it saves more" in fused.reason
    # Where the fused region saves more than the parts together, it is taken.
    fused.backend_seconds = 1e-6  # saves 219 us > 3 * 68
    for c in (fused, *small):
        c.status, c.reason = "pending", ""
    decision = choose([fused, *small], Options())
    assert decision.taken == [fused]
    assert all(c.status == "overlap" and "which saves more" in c.reason for c in small)
