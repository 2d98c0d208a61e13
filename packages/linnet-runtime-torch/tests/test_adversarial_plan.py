"""Plans, contexts and conform against misbehaving backends (issue 11, items 1-3 and 11, the
spec audit's estimate_cost / context.parameters / join, and compile= names from item 12;
issue 38, items 6, 13, 14 and 15: wrong values of the right shape, plan_for's arguments, two
algorithms for one region, match results that are not Regions of the graph).

Every case must end in a recorded failure (a "failed" candidate, a skipped backend, a
failing finding) or a coded error, and a plan that runs must give model.run's logits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import pytest
import torch
from broken_backends import (
    BAD_OUTPUTS,
    K_CACHE,
    AcrossScatter,
    BadAlgorithm,
    BadOutputs,
    CacheWrite,
    CompileGives,
    CompileRaises,
    DecodeAttention,
    EstimatedSiblings,
    Estimates,
    HandBuilt,
    LyingHolds,
    MadeUpKind,
    MatchGives,
    MatchGivesEach,
    NoMethods,
    NotCallable,
    Raises,
    TwoAlgorithms,
    hand_region,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.backends import CONTRACT, Cost, Region
from linnet.lang import LinnetError
from linnet.plan import BackendWarning, TimingCache, cache_key
from linnet.torch import load, random_weights
from linnet.torch.model import compile_options
from linnet.torch.planned import compare, conform, tolerance_for
from reference_backends import RefLinear, RefSiblings, linear_calls
from support import LLAMA, toy_config

TOKEN = torch.tensor([3], dtype=torch.int32)
POS = torch.tensor([0], dtype=torch.int32)
LINEARS = 15  # 7 per layer, 2 layers, and the LM head


@pytest.fixture(scope="module")
def weights():
    return random_weights(LLAMA, toy_config(), seed=4)


@pytest.fixture(scope="module")
def model(weights):
    # One model for the module: each lowering is done once. Plans never change a model's
    # values (a join lays the same weights out anew), and every test makes its own contexts.
    return load(LLAMA, weights=dict(weights), config=toy_config())


@pytest.fixture(scope="module")
def want(weights):
    """model.run's logits after a prefill of three tokens, then decode of a fourth."""
    m = load(LLAMA, weights=dict(weights), config=toy_config())
    ctx = m.new_context("decode", [TOKEN, POS])
    m.prefill(torch.tensor([[1, 2, 3]], dtype=torch.int32), context=ctx)
    return m.run(
        "decode",
        [torch.tensor([4], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)],
        context=ctx,
    )


def run_plan(model, plan):
    ctx = model.context_for(plan)
    model.prefill(torch.tensor([[1, 2, 3]], dtype=torch.int32), context=ctx)
    (got,) = plan.run(
        [torch.tensor([4], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)], ctx
    )
    return got


def plan(model, backends, measure=False, **kw):
    return model.plan_for(
        "decode", [TOKEN, POS], backends=backends, measure=measure, progress=False, **kw
    )


def code_of(exc: LinnetError) -> str:
    return exc.diagnostics[0].code


# ------------------------------------------------------------ 1: regions across a state write
def test_a_region_reading_k_cache_across_its_scatter_is_refused(model, want):
    p = plan(model, [AcrossScatter()])
    assert p.regions == []
    (record,) = [s for s in p.skipped if s.name == "across-scatter"]
    assert "RegionError" in record.reason and K_CACHE in record.reason
    assert "reads state" in record.reason
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("measure", [False, True])
def test_a_hand_built_region_across_the_scatter_fails_and_never_runs(
    model, want, measure, tmp_path
):
    from linnet.plan import TimingCache

    p = plan(model, [HandBuilt()], measure=measure, cache=TimingCache(tmp_path / "benchmarks.json"))
    (c,) = p.candidates
    assert c.status == "failed" and K_CACHE in c.reason and "cannot run together" in c.reason
    assert "failed" in p.explain() and K_CACHE in p.explain()
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


def test_a_region_with_a_made_up_kind_fails(model):
    p = plan(model, [MadeUpKind()])
    assert len(p.candidates) == LINEARS
    assert all(c.status == "failed" and "region_kind" in c.reason for c in p.candidates)


def test_conform_reports_the_hazard_instead_of_passing(model):
    (finding,) = conform(model, "decode", [TOKEN, POS], HandBuilt())
    assert not finding.passed and K_CACHE in finding.note


# ------------------------------------------------------------ 2: outputs checked once
@pytest.mark.parametrize(
    "how, measure",
    [(how, False) for how in BAD_OUTPUTS]
    + [(how, True) for how in ("float", "none", "garbage", "slice", "empty")],
)
def test_wrong_outputs_fail_the_candidate_and_the_generated_source_runs(
    model, want, how, measure, tmp_path
):
    from linnet.plan import TimingCache

    p = plan(
        model, [BadOutputs(how)], measure=measure, cache=TimingCache(tmp_path / "benchmarks.json")
    )
    (c,) = p.candidates
    assert c.status == "failed", (how, c.status, c.reason)
    assert c.backend_seconds is None  # never timed: it could not win "fastest"
    assert p.regions == [] and p.executables == []
    text = p.explain()
    assert f"bad-outputs-{how}" in text and "failed" in text
    got = run_plan(model, p)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "how, words",
    [
        ("float", "is a float, not a torch.Tensor"),
        ("none", "returned a NoneType"),
        ("slice", "has shape [1, 1]; the region declares [1, 256]"),
        ("dtype", "torch.float64"),
        ("device", "is on meta"),
        ("empty", "returned 0 values"),
        ("extra", "returned 2 values"),
        ("bare-tensor", "returned a Tensor, not a list"),
    ],
)
def test_the_reason_says_which_output_and_what(model, how, words):
    (c,) = plan(model, [BadOutputs(how)]).candidates
    assert words in c.reason, c.reason


def test_a_good_backend_next_to_a_bad_one_still_runs(model, want):
    p = plan(model, [BadOutputs("slice", every=True), RefLinear()])
    assert sum(c.status == "failed" for c in p.candidates) == LINEARS
    assert len(p.regions) == LINEARS and all(c.backend.name == "ref-linear" for c in p.regions)
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ 3: conform
@pytest.mark.parametrize(
    "how, words",
    [
        ("nan", "NaN"),
        ("empty", "returned 0 values"),
        ("extra", "returned 2 values"),
        ("slice", "shape [1, 1]"),
        ("dtype", "torch.float64"),
        ("float", "not a torch.Tensor"),
        ("none", "NoneType"),
        ("device", "meta"),
        ("int", "torch.int32"),
    ],
)
def test_conform_fails_broken_outputs_and_says_which(model, how, words):
    (f,) = conform(model, "decode", [TOKEN, POS], BadOutputs(how))
    assert not f.passed and words in f.note, f.note
    assert f.region.outputs[0] in f.note  # it names the output


def test_conform_compares_the_states_a_region_writes(model):
    """A region that writes the KV cache is compared on it: a right write passes with a
    difference, a wrong one (its output right) fails and names the state."""
    (ok,) = conform(model, "decode", [TOKEN, POS], CacheWrite())
    assert ok.passed and ok.difference == 0.0, ok
    (bad,) = conform(model, "decode", [TOKEN, POS], CacheWrite(wrong=True))
    assert not bad.passed and f"state {K_CACHE}" in bad.note and "bound" in bad.note, bad


def test_conform_tolerance_is_relative_to_the_reference(model):
    # The LM head's logits are O(1): a 0.5% error passes the default 1%, a 5% one does not.
    (ok,) = conform(model, "decode", [TOKEN, POS], _Scaled(1.005))
    (bad,) = conform(model, "decode", [TOKEN, POS], _Scaled(1.05))
    assert ok.passed and not bad.passed and "bound" in bad.note
    (tight,) = conform(model, "decode", [TOKEN, POS], _Scaled(1.005), tolerance=1e-4)
    assert not tight.passed


@pytest.mark.parametrize("tolerance", [-1.0, math.nan, math.inf, "0.1", True])
def test_conform_rejects_a_bad_tolerance(model, tolerance):
    with pytest.raises(LinnetError) as err:
        conform(model, "decode", [TOKEN, POS], RefLinear(), tolerance=tolerance)
    assert code_of(err.value) == "E0758"


class _Scaled(BadOutputs):
    def __init__(self, scale):
        super().__init__("scaled")
        self.scale = scale

    def compile(self, region, target, options):
        from reference_backends import LinearCall

        return LinearCall(region, scale=self.scale)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-1e4, 1e4, allow_nan=False),
    st.floats(1e-6, 1.0),
    st.floats(-0.5, 0.5, allow_nan=False),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_compare_bounds_the_difference_by_the_reference_scale(value, tolerance, rel, dtype):
    want = torch.tensor([value, 1.0], dtype=dtype)
    got = want.clone()
    got[0] = value * (1 + rel)
    diff, why = compare(got, want, tolerance)
    a, b = float(got[0]), float(want[0])
    bound = tolerance_for(dtype, tolerance) * max(1.0, abs(b))
    assert math.isclose(diff, abs(a - b), rel_tol=1e-9, abs_tol=1e-12)
    if diff <= bound * (1 - 1e-6):
        assert why is None
    elif diff > bound * (1 + 1e-6):
        assert why is not None and "bound" in why


@pytest.mark.parametrize(
    "got, want, words",
    [
        ([math.nan, 1.0], [1.0, 1.0], "1 NaN where"),
        ([1.0, 1.0], [math.nan, 1.0], "no NaN where"),
        ([math.inf, 1.0], [1.0, 1.0], "infinities"),
        ([-math.inf, 1.0], [math.inf, 1.0], "infinities"),
    ],
)
def test_compare_never_lets_nan_or_inf_through(got, want, words):
    _, why = compare(torch.tensor(got), torch.tensor(want), 0.01)
    assert why is not None and words in why
    assert compare(torch.tensor(want), torch.tensor(want), 0.01)[1] is None


def test_integer_outputs_must_be_exact_and_bf16_gets_its_rounding():
    assert compare(torch.tensor([255]), torch.tensor([254]), 0.5)[1] is not None
    assert compare(torch.tensor([7]), torch.tensor([7]), 0.0)[1] is None
    assert tolerance_for(torch.bfloat16, 0.001) == 4 * torch.finfo(torch.bfloat16).eps
    assert tolerance_for(torch.float32, 0.001) == 0.001


# ------------------------------------------------------------ 11: plugins
@pytest.mark.parametrize("holds", ["lots", -1, math.nan, 1.5, True, None, 10**3 * 1.0])
def test_a_lying_holds_fails_that_backend_only(model, want, holds):
    p = plan(model, [LyingHolds(holds), RefLinear()], memory=10**9)
    bad = [c for c in p.candidates if c.backend.name.startswith("holds-")]
    assert len(bad) == LINEARS and all(c.status == "failed" and "holds" in c.reason for c in bad)
    assert len(p.regions) == LINEARS  # the other backend still plans
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "what, label, words, measure",
    [
        (None, "none", "compile returned None", False),
        (None, "none", "compile returned None", True),
        (NoMethods(), "no-methods", "no prepare() or execute()", False),
        (NotCallable(), "not-callable", "no prepare() or execute()", False),
        (42, "int", "compile returned a int", False),
    ],
)
def test_compile_giving_no_executable_is_a_failed_candidate(
    model, want, what, label, words, measure, tmp_path
):
    from linnet.plan import TimingCache

    p = plan(
        model, [CompileGives(what, label)], measure=measure, cache=TimingCache(tmp_path / "b.json")
    )
    assert len(p.candidates) == LINEARS
    assert all(c.status == "failed" and words in c.reason for c in p.candidates)
    assert "failed" in p.explain()
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


def test_compile_raising_fails_each_region(model):
    p = plan(model, [CompileRaises(), RefLinear()])
    raised = [c for c in p.candidates if c.backend.name == "compile-raises"]
    assert len(raised) == LINEARS and len(p.regions) == LINEARS
    assert all(c.status == "failed" and "no kernel for this shape" in c.reason for c in raised)


@pytest.mark.parametrize("what, label", [(None, "none"), ("regions", "str"), (3, "int")])
def test_match_giving_garbage_skips_the_backend(model, what, label):
    p = plan(model, [MatchGives(what, label)])
    (record,) = [s for s in p.skipped if s.name == f"match-gives-{label}"]
    assert "match" in record.reason and p.candidates == []


@pytest.mark.parametrize("where", ["prepare", "execute"])
@pytest.mark.parametrize("measure", [False, True])
def test_prepare_or_execute_raising_while_planning_fails_the_candidates(
    model, want, where, measure, tmp_path
):
    from linnet.plan import TimingCache

    p = plan(model, [Raises(where)], measure=measure, cache=TimingCache(tmp_path / "b.json"))
    assert all(
        c.status == "failed" and f"{where} raised RuntimeError" in c.reason for c in p.candidates
    )
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


def test_prepare_raising_in_context_for_is_a_coded_error_naming_the_backend(model):
    # One prepare per executable passes the check run; the next, in context_for, raises.
    p = plan(model, [Raises("prepare", after=1)])
    assert len(p.regions) == LINEARS
    with pytest.raises(LinnetError) as err:
        model.context_for(p)
    assert code_of(err.value) == "E0756"
    assert "prepare-raises-after-1" in str(err.value) and "prepare blew up" in str(err.value)


def test_execute_raising_after_the_check_is_a_coded_error_in_plan_run(model):
    p = plan(model, [Raises("execute", after=1)])
    ctx = model.context_for(p)
    with pytest.raises(LinnetError) as err:
        p.run([TOKEN, POS], ctx)
    assert code_of(err.value) == "E0757" and "execute-raises-after-1" in str(err.value)


@pytest.mark.parametrize(
    "backend, words",
    [
        (CompileGives(None, "none"), "compile returned None"),
        (Raises("prepare"), "prepare raised"),
        (Raises("execute"), "execute raised"),
        (LyingHolds("lots"), "holds='lots'"),
    ],
)
def test_conform_turns_plugin_faults_into_failing_findings(model, backend, words):
    findings = conform(model, "decode", [TOKEN, POS], backend)
    assert len(findings) == LINEARS
    assert all(not f.passed and words in f.note for f in findings)


# ------------------------------------------------------------ estimate_cost
@pytest.mark.parametrize(
    "what, label, words",
    [
        (RuntimeError("no model"), "raises", "estimate_cost raised RuntimeError"),
        ("fast", "str", "returned a str, not a Cost"),
        (Cost(math.nan), "nan", "seconds=nan"),
        (Cost(-1.0), "negative", "seconds=-1.0"),
        (Cost("1"), "str-seconds", "seconds='1'"),
    ],
)
def test_a_bad_estimate_is_ignored_with_its_reason(model, what, label, words):
    p = plan(model, [Estimates(what, label)])
    assert len(p.regions) == LINEARS
    assert all(c.estimate is None and words in c.estimate_note for c in p.candidates)
    assert "estimate ignored" in p.explain() and words in p.explain()


def test_estimates_order_unmeasured_plans_and_show_in_explain(model, want):
    # Unmeasured, the joined q/k/v (larger) would win over single linears; estimates that
    # make the singles faster per step turn that round.
    singles = Estimates(Cost(1e-6), "fast", name="fast-singles")
    p = plan(model, [EstimatedSiblings(1.0), singles])
    assert {c.backend.name for c in p.regions} == {"fast-singles"}
    assert len(p.regions) == LINEARS
    text = p.explain()
    assert "estimate us" in text and "fastest estimate" in text and "1.0" in text
    # Without estimates the siblings win, the largest regions first.
    p = plan(model, [RefSiblings(), RefLinear()])
    assert {c.backend.name for c in p.regions} == {"ref-siblings", "ref-linear"}
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ context.parameters and join
def test_context_parameters_hold_states_by_path(model):
    ctx = model.new_context("decode", [TOKEN, POS])
    assert ctx.parameters[K_CACHE] is ctx.states[K_CACHE]
    assert K_CACHE in ctx.parameters and "model.embed_tokens.weight" in ctx.parameters
    assert len(ctx.parameters) == len(model.params) + len(ctx.states)
    with pytest.raises(KeyError):
        ctx.parameters["model.nothing"]


def test_join_runs_once_per_model_and_holds_the_weights_once(model):
    p = plan(model, [RefSiblings()])
    paths = [f"model.layers.0.self_attn.{n}_proj.weight" for n in "qkv"]

    def storages():
        return {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in model.params.values()
        }

    first = model.context_for(p)
    joined = first.join(paths)
    before = storages()
    second = model.context_for(p)
    again = second.join(paths)
    assert again is joined and again.data_ptr() == joined.data_ptr()
    assert storages() == before  # no new buffer behind the parameters: nothing held twice
    for ctx in (first, second):
        assert (
            ctx.parameters[paths[1]].data_ptr()
            == joined[p.graph.parameters[paths[0]].shape[0] :].data_ptr()
        )
    # A path joined with other siblings is not laid out again.
    assert second.join(paths[:2]) is None


def test_scratch_contexts_share_the_join(model):
    ctx = model.new_context("decode", [TOKEN, POS])
    paths = ["model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    joined = ctx.join(paths)
    assert joined is not None and ctx.scratch().join(paths) is joined


# ------------------------------------------------------------ compile= names (item 12)
@pytest.mark.parametrize(
    "bad", ["no-such-backend", {"no_such_option": True}, {"max_autotune": "yes"}]
)
def test_a_compile_backend_torch_does_not_know_fails_up_front(model, bad):
    with pytest.raises(LinnetError) as err:
        plan(model, [], compile=bad)
    assert code_of(err.value) == "E0714"
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights={}, config=toy_config(), compile=bad)
    assert code_of(err.value) == "E0714"


def test_known_and_registered_compile_backends_are_accepted():
    from torch._dynamo import register_backend

    @register_backend(name="linnet_test_backend")
    def _mine(gm, example_inputs):
        return gm.forward

    for name in ("inductor", "aot_eager", "eager", "linnet_test_backend"):
        assert compile_options(name) == {"backend": name}


# ------------------------------------------------------------ the output check, as a property
@pytest.fixture(scope="module")
def lm_head(weights):
    m = load(LLAMA, weights=dict(weights), config=toy_config())
    graph = m.graph("decode", [TOKEN, POS])
    return graph, graph.outputs[0]


@settings(max_examples=150, deadline=None)
@given(
    container=st.sampled_from(["list", "tuple", "bare", "none", "dict"]),
    count=st.integers(0, 3),
    shape=st.lists(st.sampled_from([0, 1, 2, 64, 256]), min_size=0, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.bool]),
    meta=st.booleans(),
    scalar=st.booleans(),
)
def test_output_check_accepts_exactly_the_declared_outputs(
    lm_head, container, count, shape, dtype, meta, scalar
):
    from linnet.torch.planned import output_problem

    graph, name = lm_head
    device = "meta" if meta else "cpu"
    value = 1.5 if scalar else torch.zeros(shape, dtype=dtype, device=device)
    values = [value] * count
    got = {
        "list": values,
        "tuple": tuple(values),
        "bare": value,
        "none": None,
        "dict": dict(enumerate(values)),
    }[container]
    right = (
        container in ("list", "tuple")
        and count == 1
        and not scalar
        and not meta
        and shape == [1, 256]
        and dtype == torch.float32
    )
    problem = output_problem(got, [name], graph, torch.device("cpu"))
    assert (problem is None) == right, (problem, container, count, shape, dtype, meta)
    if problem is not None:
        assert name in problem  # it says which output the region declares


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    trailing=st.lists(st.sampled_from([(3,), (2,), (3, 2)]), min_size=4, max_size=4),
    dtypes=st.lists(st.sampled_from([torch.float32, torch.float16]), min_size=4, max_size=4),
)
def test_join_lays_out_or_declines_and_is_shared_by_every_context(rows, trailing, dtypes):
    from linnet.torch.context import Context

    n = len(rows)
    params = {f"p{i}": torch.randn(rows[i], *trailing[i]).to(dtypes[i]) for i in range(n)}
    originals = {k: v.clone() for k, v in params.items()}
    paths = list(params)
    a = Context(params, {"s": torch.zeros(2)}, torch.device("cpu"))
    b = Context(params, {"s": torch.zeros(2)}, torch.device("cpu"))
    joined = a.join(paths)
    layable = n >= 2 and len({(trailing[i], dtypes[i]) for i in range(n)}) == 1
    assert (joined is not None) == layable
    if joined is None:
        assert b.join(paths) is None
        return
    assert b.join(paths) is joined and b.scratch().join(paths) is joined
    assert joined.shape[0] == sum(rows)
    for k in paths:  # same values, now views of the one buffer
        assert torch.equal(params[k], originals[k])
        assert params[k].untyped_storage().data_ptr() == joined.untyped_storage().data_ptr()
    assert a.parameters["s"] is a.states["s"] and b.parameters["s"] is b.states["s"]


# ------------------------------------------------------------ issue 38, item 6: wrong values
def plan_warned(model, backends, measure, tmp_path, **kw):
    """The plan, and the BackendWarnings planning gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = plan(
            model, backends, measure=measure, cache=TimingCache(tmp_path / "benchmarks.json"), **kw
        )
    return p, [w for w in caught if issubclass(w.category, BackendWarning)]


@pytest.mark.parametrize("measure", [False, True])
@pytest.mark.parametrize(
    "how, words",
    [
        ("nan", "256 NaN where the generated source has none"),
        ("inf", "infinities"),
        ("zeros", "differs by"),
        ("scaled", "differs by"),
    ],
)
def test_wrong_values_of_the_right_shape_are_never_taken(
    model, want, how, words, measure, tmp_path
):
    """The outputs have the region's count, shape, dtype and device; only their values are
    wrong. Measured or not, the candidate fails where the plan is made (as conform fails
    it), a BackendWarning says so, and the generated source runs the LM head."""
    p, warned = plan_warned(model, [BadOutputs(how)], measure, tmp_path)
    (c,) = p.candidates
    assert c.status == "failed" and words in c.reason and "%logits" in c.reason, c.reason
    assert c.backend_seconds is None and p.regions == []  # never timed, never taken
    assert "failed" in p.explain() and words in p.explain()
    (w,) = warned
    assert f"bad-outputs-{how}" in str(w.message) and words in str(w.message)
    if not measure:  # the same either way: run and conformed once
        torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)
        (finding,) = conform(model, "decode", [TOKEN, POS], BadOutputs(how))
        assert not finding.passed and words in finding.note  # the one check, both ways


def test_zeros_are_wrong_where_every_reference_value_is_small(tmp_path):
    """Weights a 40th of the usual scale: every logit is below 0.01, where the absolute
    bound alone (0.01 x max(1, max|ref|)) admitted zeros. The 2-norm bound fails them."""
    small = load(
        LLAMA, weights=random_weights(LLAMA, toy_config(), seed=4, scale=5e-4), config=toy_config()
    )
    assert small.run("decode", [TOKEN, POS]).abs().max() < 0.01
    for measure in (False, True):
        p, warned = plan_warned(small, [BadOutputs("zeros")], measure, tmp_path)
        (c,) = p.candidates
        assert c.status == "failed" and "of its size in the 2-norm" in c.reason, c.reason
        assert warned and p.regions == []
    assert compare(torch.zeros(3), torch.tensor([0.004, -0.002, 0.003]), 0.01)[1]
    assert (
        compare(
            torch.tensor([4.04, -2.02, 3.03]) * 1e-3, torch.tensor([0.004, -0.002, 0.003]), 0.01
        )[1]
        is None
    )


@pytest.mark.parametrize("measure", [False, True])
def test_a_wrong_state_write_is_never_taken(model, want, measure, tmp_path):
    """k_rot (the output) is right, the cache it writes is doubled: compared on the state,
    on copies, the region fails; the right write passes and the plan runs as model.run."""
    p, warned = plan_warned(model, [CacheWrite(wrong=True)], measure, tmp_path)
    (c,) = p.candidates
    assert c.status == "failed" and f"state {K_CACHE} differs by" in c.reason, c.reason
    assert warned and p.regions == []
    torch.testing.assert_close(run_plan(model, p), want, rtol=1e-5, atol=1e-5)
    good, warned = plan_warned(model, [CacheWrite()], False, tmp_path)
    assert [c.status for c in good.candidates] == ["taken"] and not warned
    torch.testing.assert_close(run_plan(model, good), want, rtol=1e-5, atol=1e-5)


def test_attention_is_checked_on_the_cache_the_step_wrote(model, want, tmp_path):
    """Decode attention reads the KV cache the step's scatter has just written: checked on a
    cache without that write (fresh zeros at position 0), zeros would equal the generated
    source's. Each region is checked where it stands in the recorded run, so zeros fail,
    in plan_for and in conform, and a right executable passes."""
    p, warned = plan_warned(model, [DecodeAttention(zeros=True)], False, tmp_path)
    assert len(p.candidates) == 2 and p.regions == [] and warned
    assert all(c.status == "failed" and "differs by" in c.reason for c in p.candidates)
    findings = conform(model, "decode", [TOKEN, POS], DecodeAttention(zeros=True))
    assert len(findings) == 2 and not any(f.passed for f in findings)
    good, warned = plan_warned(model, [DecodeAttention()], False, tmp_path)
    assert len(good.regions) == 2 and not warned
    torch.testing.assert_close(run_plan(model, good), want, rtol=1e-5, atol=1e-5)
    assert all(f.passed for f in conform(model, "decode", [TOKEN, POS], DecodeAttention()))


def test_the_check_leaves_the_planning_context_and_inputs_alone(model, tmp_path):
    """Each side of a check writes copies of the states its region touches: a plan whose
    regions write the cache (right or wrong) leaves a given conform context as it was."""
    ctx = model.new_context("decode", [TOKEN, POS])
    model.prefill(torch.tensor([[1, 2, 3]], dtype=torch.int32), context=ctx)
    before = {k: v.clone() for k, v in ctx.states.items()}
    for backend in (CacheWrite(), CacheWrite(wrong=True), DecodeAttention(zeros=True)):
        conform(
            model, "decode", [TOKEN, torch.tensor([3], dtype=torch.int32)], backend, context=ctx
        )
    assert all(torch.equal(before[k], ctx.states[k]) for k in before)


# ------------------------------------------------------------ issue 38, item 15: match results
def _head(graph):
    c = linear_calls(graph)[-1]
    return c.start, c.stop, c.index


MATCH_RESULTS = {
    "str": (lambda g: ["lm_head"], "match gave 'lm_head' (a str), not a Region"),
    "none": (lambda g: [None], "(a NoneType), not a Region"),
    "dict": (lambda g: [{"steps": [1]}], "(a dict), not a Region"),
    "tuple": (lambda g: [(0, 1)], "(a tuple), not a Region"),
    "other-graph": (lambda g: [Region.of(dataclasses.replace(g), *_head(g))], "of another graph"),
    "empty-steps": (lambda g: [hand_region(g, ())], "not a non-empty sequence"),
    "none-steps": (lambda g: [hand_region(g, None)], "not a non-empty sequence"),
    "str-steps": (lambda g: [hand_region(g, "165")], "not a non-empty sequence"),
    "bool-steps": (lambda g: [hand_region(g, (True,))], "not a non-empty sequence"),
    "past-the-end": (lambda g: [hand_region(g, (len(g.steps) + 5,))], "outside the graph"),
    "negative": (lambda g: [hand_region(g, (-1,))], "outside the graph"),
}


@pytest.mark.parametrize("label", list(MATCH_RESULTS))
def test_match_results_that_are_not_regions_of_the_graph_are_failed_candidates(model, label):
    """Each is a failed candidate with the reason, in plan.explain() and in conform; the
    backend's good region beside it still runs."""
    extra, words = MATCH_RESULTS[label]
    backend = MatchGivesEach(extra, label)
    p = plan(model, [backend])
    assert len(p.candidates) == 2, p.candidates
    bad = [c for c in p.candidates if c.status == "failed"]
    assert len(bad) == 1 and words in bad[0].reason, [c.reason for c in p.candidates]
    assert len(p.regions) == 1  # the LM head
    text = p.explain()
    assert words in text and "1 of 2 candidate regions taken" in text
    findings = conform(model, "decode", [TOKEN, POS], backend)
    assert len(findings) == 2 and sum(not f.passed for f in findings) == 1
    assert any(words in f.note for f in findings) and repr(findings)


# ------------------------------------------------------------ issue 38, item 14: two algorithms
@pytest.mark.parametrize("how", ["named", "class", "order"])
def test_two_algorithms_for_one_region_are_timed_apart_and_the_faster_taken(
    model, monkeypatch, tmp_path, how
):
    """The slow one comes first. Both save against a generated source timed at 1 s: each
    must be timed (and cached) on its own, so the fast one saves more and is taken."""
    from linnet.torch.planned import PlanBuilder

    monkeypatch.setattr(PlanBuilder, "time_generated", lambda self, *a: 1.0)
    backend = TwoAlgorithms(how)
    cache_path = tmp_path / "benchmarks.json"
    for round in (1, 2):  # timed, then read from the cache
        p = plan(model, [backend], measure=True, cache=TimingCache(cache_path))
        slow, fast = p.candidates
        assert slow.algorithm != fast.algorithm and slow.algorithm and fast.algorithm
        assert slow.backend_seconds >= backend.delay > fast.backend_seconds, (
            slow.backend_seconds,
            fast.backend_seconds,
        )
        assert p.regions == [fast] and slow.status == "overlap"
        assert all(c.cached == (round == 2) for c in p.candidates)
        assert fast.label in p.explain() and slow.label in p.explain()
    entries = json.loads(cache_path.read_text())["entries"]
    kinds = [json.loads(k)[4] for k in entries if json.loads(k)[1] == backend.name]
    assert len(kinds) == 2 and all("/algorithm=" in k for k in kinds)
    if how == "named":
        assert {slow.algorithm, fast.algorithm} == {"slow", "fast"}


def test_a_timing_older_versions_gave_every_algorithm_is_not_read(model, monkeypatch, tmp_path):
    """Before issue 38 a backend's algorithms shared one key (the region kind): an entry
    there holds the first one's timing. Their keys now name the algorithm, so it is read
    for neither; a backend with one executable per region keeps the key it had."""
    from linnet.torch.planned import PlanBuilder

    monkeypatch.setattr(PlanBuilder, "time_generated", lambda self, *a: 1.0)
    graph = model.graph("decode", [TOKEN, POS])
    kind = Region.of(graph, *_head(graph)).kind
    builder = PlanBuilder(model, "decode", [TOKEN, POS], default_options(), progress=False)
    path = tmp_path / "benchmarks.json"
    stale = {
        cache_key(builder.timing_key(), name, "1.0", CONTRACT, kind): {"seconds": 1e-9}
        for name in ("two-algorithms-named", "ref-linear")
    }
    path.write_text(json.dumps({"format": "linnet.benchmarks", "version": 1, "entries": stale}))
    p = plan(model, [TwoAlgorithms("named")], measure=True, cache=TimingCache(path))
    assert not any(c.cached for c in p.candidates)
    assert p.candidates[0].backend_seconds >= 0.005
    one = plan(model, [RefLinear()], measure=True, cache=TimingCache(path))
    (head,) = [c for c in one.candidates if c.region.kind == kind]
    assert head.cached and head.backend_seconds == 1e-9 and head.algorithm == ""


def test_an_algorithm_that_is_not_a_string_fails_the_candidate(model):
    p = plan(model, [BadAlgorithm()])
    assert len(p.candidates) == LINEARS and p.regions == []
    assert all(c.status == "failed" and "algorithm=3" in c.reason for c in p.candidates)


# ------------------------------------------------------------ issue 38, item 13: arguments
def default_options():
    from linnet.plan.arguments import plan_options

    return plan_options()


ARGUMENTS = [
    (dict(memory="lots"), "E0771", "not a number of bytes"),
    (dict(memory=-1), "E0771", "negative"),
    (dict(memory=math.nan), "E0771", "finite"),
    (dict(memory=math.inf), "E0771", "finite"),
    (dict(memory=True), "E0771", "bool"),
    (dict(memory=[1]), "E0771", "list"),
    (dict(margin="2%"), "E0772", "string"),
    (dict(margin=-0.01), "E0772", "negative"),
    (dict(margin=1.0), "E0772", "none would ever be taken"),
    (dict(margin=2), "E0772", "none would ever be taken"),
    (dict(margin=math.nan), "E0772", "finite"),
    (dict(margin=None), "E0772", "NoneType"),
    (dict(margin=True), "E0772", "bool"),
    (dict(backends="cublaslt"), "E0773", "is a string"),
    (dict(backends=b"cublaslt"), "E0773", "is a string"),
    (dict(backends=RefLinear()), "E0773", "not a list of backends"),
    (dict(backends={"ref": RefLinear()}), "E0773", "not a list of backends"),
    (dict(backends=3), "E0773", "not a list of backends"),
    (dict(backends=[None]), "E0773", "backends[0] is None"),
    (dict(backends=["cublaslt"]), "E0773", "backends[0] is 'cublaslt'"),
    (dict(backends=[RefLinear]), "E0773", "is the class RefLinear"),
    (dict(backends=[RefLinear(), 3]), "E0773", "backends[1] is 3"),
    (dict(backends=[[RefLinear()]]), "E0773", "(a list)"),
    (dict(backends=[RefLinear(), RefLinear()]), "E0773", "both named `ref-linear`"),
    (dict(measure="no"), "E0774", "measure='no'"),
    (dict(measure=0), "E0774", "measure=0"),
    (dict(measure=None), "E0774", "measure=None"),
    (dict(kernels="yes"), "E0774", "kernels='yes'"),
    (dict(captured="no"), "E0765", "captured='no'"),
    (dict(compile=1.5), "E0714", "compile must be"),
    (dict(compile=["inductor"]), "E0714", "compile must be"),
    (dict(progress="plan.log"), "E0775", "progress='plan.log'"),
    (dict(progress=3), "E0775", "progress=3"),
    (dict(cache="benchmarks.json"), "E0776", "cache='benchmarks.json'"),
    (dict(cache={}), "E0776", "cache={}"),
]


@pytest.mark.parametrize(
    "kw, code, words", ARGUMENTS, ids=[f"{next(iter(a[0]))}-{i}" for i, a in enumerate(ARGUMENTS)]
)
def test_plan_for_arguments_are_checked_before_anything_runs(model, monkeypatch, kw, code, words):
    """A coded error naming the argument, before lowering, matching or timing (never a
    TypeError deep in the planner, nor eight backends named by a string's characters)."""
    from linnet.torch import planned

    monkeypatch.setattr(planned.PlanBuilder, "__init__", _never)
    call = {"backends": [RefLinear()], "measure": False, "progress": False, **kw}
    for run in (
        lambda: model.plan_for("decode", [TOKEN, POS], **call),
        lambda: planned.plan_for(model, "decode", [TOKEN, POS], **call),
    ):
        with pytest.raises(LinnetError) as err:
            run()
        assert code_of(err.value) == code and words in str(err.value), str(err.value)
        assert err.value.diagnostics[0].help


def _never(*args, **kwargs):
    raise AssertionError("planning started before the arguments were checked")


@pytest.mark.parametrize(
    "kw",
    [
        dict(margin=0),
        dict(margin=0.5),
        dict(memory=1e9),
        dict(memory=0),
        dict(progress=None),
        dict(backends=(RefLinear(),)),
        dict(backends=iter([RefLinear()])),
        dict(kernels=False),
        dict(cache=None),
    ],
)
def test_good_plan_for_arguments_still_plan(model, kw):
    call = {"backends": [RefLinear()], "measure": False, "progress": False, **kw}
    p = model.plan_for("decode", [TOKEN, POS], **call)
    assert len(p.regions) == LINEARS  # RefLinear holds 0 bytes: within any budget


def test_linnet_plan_refuses_a_margin_of_two(capsys):
    from linnet.lang.cli import main
    from support import LLAMA as FILE

    rc = main(
        [
            "plan",
            str(FILE),
            "--entry",
            "decode",
            "--config",
            "toy",
            "--input",
            "token=1",
            "--input",
            "pos=1",
            "--no-measure",
            "--margin",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "E0772" in err and "margin=2.0" in err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_linnet_kernels_pass_the_plans_check_on_cuda(dtype, monkeypatch):
    """The check plan_for now makes of every executable must not drop right kernels: on a
    GPU, each of Linnet's kernel regions in the toy Llama decode (norms, the fused
    norm + q/k/v + rope spans, those that write the cache, attention) is within tolerance
    of the generated source's outputs and written states, at two positions of two
    sequences."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = toy_config(B=2, T=dtype)
    m = load(
        LLAMA,
        weights=random_weights(LLAMA, config, seed=4, device="cuda"),
        config=config,
        numerics="fast",
        device="cuda",
    )
    token = torch.tensor([3, 7], dtype=torch.int32, device="cuda")
    pos = torch.tensor([5, 9], dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = m.plan_for("decode", [token, pos], backends=[], measure=False, progress=False)
    kernels = [c for c in p.candidates if c.backend_name == "linnet-kernels"]
    assert kernels, p.explain()
    wrong = [(c.region, c.reason) for c in kernels if c.status == "failed"]
    assert not wrong, wrong
    assert not [w for w in caught if issubclass(w.category, BackendWarning)]
    got = p.run([token, pos], m.context_for(p))[0]
    want = load(
        LLAMA,
        weights=random_weights(LLAMA, config, seed=4, device="cuda"),
        config=config,
        numerics="fast",
        device="cuda",
    ).run("decode", [token, pos])
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.05)
