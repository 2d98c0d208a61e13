"""The launch mode of Linnet's kernels (programmatic dependent launch), chosen per plan by
timing its whole step as it runs: the choice, what the plan and Captured launch under, what
explain says. The timing itself needs a Hopper GPU (the gpu-marked test at the end)."""

from types import SimpleNamespace

import pytest
import torch
from linnet.lang import LinnetError
from linnet.torch import load, random_weights
from linnet.torch.launch_modes import (
    DEFAULT,
    ORDER,
    choose_pdl,
    kernel_namespaces,
    pdl_choice,
    pdl_mode,
    pdl_text,
    time_steps,
)
from linnet.torch.planned import Captured
from support import LLAMA, toy_config


def _kernel_module(mode: int = 2) -> dict:
    """A generated module's namespace, as far as launch modes go (emit/triton.py's HEADER)."""
    return {"PDL": mode, "PDL_LAUNCH": {0: {}, 1: {"launch_pdl": True}, 2: {"launch_pdl": True}}}


def _executable(namespace: dict) -> SimpleNamespace:
    fn = eval("lambda: None", namespace)  # its __globals__ is the namespace
    return SimpleNamespace(fn=fn)


def _plan(namespaces: list[dict], device: str = "cuda") -> SimpleNamespace:
    return SimpleNamespace(
        device=torch.device(device),
        pdl=None,
        pdl_seconds={},
        pdl_reason="",
        pdl_margin=0.01,
        executables=[_executable(ns) for ns in namespaces],
    )


@pytest.mark.parametrize(
    "seconds, expected",
    [
        ({2: 4.642, 1: 4.592, 3: 4.611, 0: 4.665}, 1),  # early beats late by 1.1%: early
        ({2: 1.054, 1: 1.050, 3: 1.052, 0: 1.056}, 2),  # 0.4%: under the margin, late stays
        ({2: 5.000, 1: 5.310, 3: 4.900, 0: 4.924}, 3),  # by grid the fastest, 2% better
        ({2: 5.000, 1: 5.310, 3: 5.100, 0: 4.800}, 0),  # without PDL the fastest: off
        ({1: 2.0, 0: 3.0}, 1),  # no default timed: the fastest
    ],
)
def test_the_fastest_mode_where_it_beats_the_default_by_the_margin(seconds, expected):
    assert pdl_choice(seconds, margin=0.01) == expected


def test_a_mode_holds_inside_the_block_and_is_restored_after_an_error():
    a, b = _kernel_module(2), _kernel_module(2)
    with pytest.raises(RuntimeError), pdl_mode([a, b], 1):
        assert (a["PDL"], b["PDL"]) == (1, 1)
        raise RuntimeError("a launch failed")
    assert (a["PDL"], b["PDL"]) == (2, 2)
    with pdl_mode([a], None):  # None: the modules' own
        assert a["PDL"] == 2


def test_only_modules_that_can_launch_with_pdl_are_set():
    live, off = _kernel_module(2), _kernel_module(0)
    plain = {"x": 1}
    exes = [
        _executable(live),
        _executable(live),
        _executable(off),
        _executable(plain),
        SimpleNamespace(),
        SimpleNamespace(fn=len),
    ]
    assert kernel_namespaces(exes) == [live]  # once, and not the module PDL is off in


def test_a_plan_takes_the_mode_its_timer_says(monkeypatch):
    monkeypatch.delenv("LINNET_PDL", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    plan = _plan([_kernel_module()])
    asked = []

    def timer(modes):
        asked.append(tuple(modes))
        return {2: 4.642e-3, 1: 4.592e-3, 3: 4.611e-3, 0: 4.665e-3}

    said = []
    choose_pdl(plan, timer, 0.01, said.append)
    assert asked == [ORDER] and ORDER[0] == DEFAULT
    assert plan.pdl == 1 and plan.pdl_seconds[1] == 4.592e-3 and plan.pdl_reason == ""
    assert said and "launch modes" in said[0]
    assert pdl_text(plan) == (
        "launch mode of Linnet's kernels: PDL early (whole captured steps: late 4642.0 us, "
        "early 4592.0 us, by grid 4611.0 us, off 4665.0 us; early saves 1.1% over late, "
        "margin 1%)"
    )
    plan.captured = False  # a plan for plan.run timed whole plan.run calls
    assert "PDL early (whole steps by plan.run: late 4642.0 us," in pdl_text(plan)


@pytest.mark.parametrize(
    "setup, reason",
    [
        ("env", "LINNET_PDL=1 is set"),
        ("ranks", "tensor parallelism"),
        ("ampere", "compute capability below 9.0"),
        ("raises", "timing the modes raised RuntimeError: capture failed"),
    ],
)
def test_where_a_plan_does_not_choose_it_says_why(monkeypatch, setup, reason):
    monkeypatch.delenv("LINNET_PDL", raising=False)
    if setup == "env":
        monkeypatch.setenv("LINNET_PDL", "1")
    major = 8 if setup == "ampere" else 9
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
    plan = _plan([_kernel_module()])
    if setup == "ranks":
        plan.model = SimpleNamespace(world=2)

    def timer(modes):
        raise RuntimeError("capture failed")

    choose_pdl(plan, timer, 0.01)
    assert plan.pdl is None and not plan.pdl_seconds and reason in plan.pdl_reason
    assert (
        pdl_text(plan) == f"launch mode of Linnet's kernels: the modules' own ({plan.pdl_reason})"
    )


def test_nothing_to_choose_says_nothing():
    for plan in (_plan([_kernel_module()], device="cpu"), _plan([_kernel_module(0)])):
        choose_pdl(plan, lambda modes: pytest.fail("timed"), 0.01)
        assert plan.pdl is None and pdl_text(plan) == ""


def test_captured_launches_under_the_plans_mode_unless_told():
    plan = SimpleNamespace(device=torch.device("cuda"), pdl=1)
    assert Captured(plan, None).pdl == 1
    assert Captured(plan, None, pdl=0).pdl == 0
    plan.pdl = None
    assert Captured(plan, None).pdl is None  # the modules' own
    assert Captured(plan, None, pdl=4).pdl == 4  # late, prefetching (not timed by plans)
    for bad in ("early", 6, -1, True, 1.5):
        with pytest.raises(LinnetError) as err:
            Captured(plan, None, pdl=bad)
        assert err.value.diagnostics[0].code == "E0759" and "launch mode" in str(err.value)


def test_a_cpu_plan_explains_no_launch_mode():
    model = load(LLAMA, weights=random_weights(LLAMA, toy_config(), seed=4), config=toy_config())
    i32 = lambda v: torch.tensor([v], dtype=torch.int32)  # noqa: E731
    plan = model.plan_for("decode", [i32(3), i32(0)], backends=[], progress=False)
    assert plan.pdl is None and "launch mode" not in plan.explain()


@pytest.mark.gpu
def test_a_gpu_plan_times_each_mode_and_captures_under_its_choice(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a GPU of compute capability 9.0 or later")
    pytest.importorskip("triton")
    monkeypatch.delenv("LINNET_PDL", raising=False)
    cfg = toy_config()
    model = load(
        LLAMA,
        weights=random_weights(LLAMA, cfg, seed=4, device="cuda"),
        config=cfg,
        device="cuda",
        numerics="fast",
    )
    i32 = lambda v: torch.tensor([v], dtype=torch.int32)  # noqa: E731
    inputs = [i32(3), i32(4)]
    # Unmeasured, a plan takes every kernel region and times nothing; the choice is then
    # made on it with the real timer, as plan_for makes it on a measured plan.
    plan = model.plan_for("decode", inputs, backends=[], progress=False, measure=False)
    assert plan.pdl is None and plan.pdl_namespaces()
    choose_pdl(
        plan,
        time_steps(lambda m: Captured(plan, model.context_for(plan), pdl=m), inputs, plan.device),
        plan.pdl_margin,
    )
    assert set(plan.pdl_seconds) == set(ORDER) and plan.pdl in ORDER, plan.pdl_reason
    assert all(s > 0 for s in plan.pdl_seconds.values())
    assert "launch mode of Linnet's kernels" in plan.explain()
    want = plan.run(inputs, model.context_for(plan))[0]
    ref = load(
        LLAMA, weights=random_weights(LLAMA, cfg, seed=4, device="cuda"), config=cfg, device="cuda"
    ).run("decode", inputs)
    torch.testing.assert_close(want, ref, atol=1e-4, rtol=1e-4)  # the kernels, the body
    for mode in ORDER:  # each launch mode, captured, gives the eager plan's logits exactly
        step = Captured(plan, model.context_for(plan), pdl=mode)
        for _ in range(3):  # eager, capture, replay
            (got,) = step(inputs)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        # and plan.run under it (how a plan made with captured=False times the modes)
        (got,) = plan.run(inputs, model.context_for(plan), pdl=mode)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    with pytest.raises(LinnetError) as err:
        plan.run(inputs, model.context_for(plan), pdl="early")
    assert err.value.diagnostics[0].code == "E0759"
