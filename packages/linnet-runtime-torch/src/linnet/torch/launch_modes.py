"""Programmatic dependent launch (PDL) of Linnet's kernels, chosen per plan by timing.

A generated module that launches kernels reads its ``PDL`` mode at each launch (see
``linnet.lang.emit.triton``): 0 off, 1 "early" (the next kernel may be scheduled as soon as
this one starts), 2 "late", the module default (after this kernel's main work), 3 "by grid"
(early for a grid of at most one program an SM, late for larger). Which is fastest depends
on the kernels' neighbours: on the H200, early saved 1.6-2.7% on two planned decode steps
and cost 8% on a third plan (docs/benchmarks/decode.md, session 11). So a plan with Linnet's
kernels, on a GPU that has PDL, times its whole step under each mode as it will run
(captured as a CUDA graph, or by ``plan.run`` for a plan made with ``captured=False``; on
fresh states) and keeps the fastest where it beats the default by the margin;
:class:`~linnet.torch.plans.Captured` and ``plan.run`` launch under the plan's mode, and
``plan.explain()`` says what was timed. ``LINNET_PDL`` set in the environment is the user's
choice: no plan overrides it.

>>> pdl_choice({2: 4.642e-3, 1: 4.592e-3, 3: 4.611e-3, 0: 4.665e-3}, margin=0.01)
1
>>> pdl_choice({2: 1.054e-3, 1: 1.050e-3, 0: 1.056e-3}, margin=0.01)
2
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

# 4 and 5: late and early, each kernel first prefetching into L2 what its first steps load
# (emit/triton.py, PREFETCH). Not in ORDER: a plan does not time them until they are measured
# on a GPU; LINNET_PDL=4 or Captured(plan, ctx, pdl=4) launches under them.
MODES = {
    0: "off",
    1: "early",
    2: "late",
    3: "by grid",
    4: "late, prefetching",
    5: "early, prefetching",
}
DEFAULT = 2  # the generated modules' own default (LINNET_PDL unset)
ORDER = (2, 1, 3, 0)  # the modes a plan times, the default first


def kernel_namespaces(executables: Sequence[Any]) -> list[dict[str, Any]]:
    """The module namespaces of ``executables``' generated functions that can launch kernels
    with PDL (their ``PDL`` is not 0: CUDA, a Triton with ``gdc_wait``, not interpreted, and
    ``LINNET_PDL`` not 0), each once.

    >>> kernel_namespaces([object()])
    []
    """
    seen: dict[int, dict[str, Any]] = {}
    for ex in executables:
        namespace = getattr(getattr(ex, "fn", None), "__globals__", None)
        if isinstance(namespace, dict) and "PDL_LAUNCH" in namespace and namespace.get("PDL"):
            seen[id(namespace)] = namespace
    return list(seen.values())


@contextlib.contextmanager
def pdl_mode(namespaces: Sequence[dict[str, Any]], mode: int | None) -> Iterator[None]:
    """Launch under ``mode`` (None: the modules' own) inside the block, then restore.

    >>> ns = {"PDL": 2, "PDL_LAUNCH": {}}
    >>> with pdl_mode([ns], 1):
    ...     ns["PDL"]
    1
    >>> ns["PDL"]
    2
    """
    if mode is None:
        yield
        return
    before = [(ns, ns["PDL"]) for ns in namespaces]
    for ns in namespaces:
        ns["PDL"] = mode
    try:
        yield
    finally:
        for ns, old in before:
            ns["PDL"] = old


def pdl_choice(seconds: dict[int, float], margin: float) -> int:
    """The mode to launch under: the fastest of ``seconds`` (a whole step's, by mode) where it
    beats the default's by more than ``margin``, else the default."""
    best = min(seconds, key=lambda m: seconds[m])
    base = seconds.get(DEFAULT)
    if base is None or seconds[best] < base * (1 - margin):
        return best
    return DEFAULT


def pdl_possible(plan: Any) -> str | None:
    """Why ``plan`` does not choose a mode (None: it does).

    >>> pdl_possible(cpu_plan)                                      # doctest: +SKIP
    'the plan runs on cpu'
    """
    if "LINNET_PDL" in os.environ:
        return f"LINNET_PDL={os.environ['LINNET_PDL']} is set"
    if plan.device.type != "cuda":
        return f"the plan runs on {plan.device}"
    if getattr(getattr(plan, "model", None), "world", 1) > 1:
        # Each rank plans apart: one that times whole steps, collectives inside, while
        # another does not would wait for it forever.
        return "tensor parallelism: each rank's plan launches under the modules' mode"
    if not kernel_namespaces(plan.executables):
        return "no Linnet kernel region launches with it"
    if torch.cuda.get_device_capability(plan.device)[0] < 9:
        return "the GPU has no programmatic dependent launch (compute capability below 9.0)"
    return None


def time_steps(
    make_step: Callable[[int], Callable[[Sequence[torch.Tensor]], Any]],
    inputs: Sequence[torch.Tensor],
    device: torch.device,
    rounds: int = 3,
    calls: int = 16,
) -> Callable[[Sequence[int]], dict[int, float]]:
    """A timer of a plan's whole step under each mode: ``make_step(mode)`` gives the step as
    the plan runs it, under that mode (``Captured(plan, context, pdl=mode)`` on a context of
    fresh states, as the steps write them; or ``plan.run`` with ``pdl=mode`` for a plan made
    with ``captured=False``), called twice first (a Captured step runs eagerly, then
    captures); then ``rounds`` rounds of ``calls`` queued calls a mode, the modes taking
    turns; each mode's median seconds a call.

    >>> timer = time_steps(lambda m: Captured(plan, ctx, pdl=m), [token, pos],
    ...                    plan.device)                             # doctest: +SKIP
    >>> timer((2, 1))                                               # doctest: +SKIP
    {2: 0.004642, 1: 0.004592}
    """

    def timer(modes: Sequence[int]) -> dict[int, float]:
        steps = {m: make_step(m) for m in modes}
        for step in steps.values():
            step(inputs)  # eagerly
            step(inputs)  # captured
        samples: dict[int, list[float]] = {m: [] for m in modes}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(rounds):
            for m, step in steps.items():
                torch.cuda.synchronize(device)
                start.record()
                for _ in range(calls):
                    step(inputs)
                end.record()
                end.synchronize()
                samples[m].append(start.elapsed_time(end) / 1e3 / calls)
        return {m: statistics.median(s) for m, s in samples.items()}

    return timer


def choose_pdl(
    plan: Any,
    timer: Callable[[Sequence[int]], dict[int, float]],
    margin: float,
    say: Callable[[str], None] | None = None,
) -> None:
    """Set ``plan.pdl`` (the mode), ``plan.pdl_seconds`` and ``plan.pdl_reason`` from
    ``timer`` (see :func:`time_steps`), unless :func:`pdl_possible` says no. A timer that
    raises leaves the modules' own mode, with the reason.

    >>> choose_pdl(plan, time_steps(make_step, inputs, plan.device), 0.01)  # doctest: +SKIP
    >>> plan.pdl, plan.pdl_seconds                                  # doctest: +SKIP
    (1, {2: 0.004642, 1: 0.004592, 3: 0.004611, 0: 0.004665})
    """
    if plan.device.type != "cuda" or not kernel_namespaces(plan.executables):
        return  # nothing to choose, and nothing to say
    why = pdl_possible(plan)
    if why is not None:
        plan.pdl_reason = why
        return
    if say is not None:
        say(
            f"linnet: timing the whole step under {len(ORDER)} launch modes of Linnet's "
            "kernels (programmatic dependent launch)"
        )
    try:
        seconds = timer(ORDER)
    except Exception as exc:  # the plan stays as it is: launches under the modules' mode
        plan.pdl_reason = f"timing the modes raised {type(exc).__name__}: {exc}"
        return
    plan.pdl_seconds = seconds
    plan.pdl = pdl_choice(seconds, margin)
    plan.pdl_reason = ""


def pdl_text(plan: Any) -> str:
    """``plan.explain()``'s line on the launch mode, or "" where the plan chose none.

    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(pdl=1, pdl_seconds={2: 4.642e-3, 1: 4.592e-3, 0: 4.665e-3},
    ...                     pdl_reason="", pdl_margin=0.01)
    >>> print(pdl_text(p))
    launch mode of Linnet's kernels: PDL early (whole captured steps: late 4642.0 us, early 4592.0 us, off 4665.0 us; early saves 1.1% over late, margin 1%)
    """
    seconds = getattr(plan, "pdl_seconds", {})
    if not seconds:
        reason = getattr(plan, "pdl_reason", "")
        return f"launch mode of Linnet's kernels: the modules' own ({reason})" if reason else ""
    times = ", ".join(f"{MODES[m]} {s * 1e6:.1f} us" for m, s in seconds.items())
    chosen, base = plan.pdl, seconds.get(DEFAULT)
    margin = getattr(plan, "pdl_margin", 0.0)
    if chosen == DEFAULT or base is None:
        verdict = f"none beats {MODES[DEFAULT]} by the {margin:.0%} margin"
    else:
        verdict = (
            f"{MODES[chosen]} saves {1 - seconds[chosen] / base:.1%} over "
            f"{MODES[DEFAULT]}, margin {margin:.0%}"
        )
    name = "off" if chosen == 0 else f"PDL {MODES[chosen]}"
    how = "captured steps" if getattr(plan, "captured", True) else "steps by plan.run"
    return f"launch mode of Linnet's kernels: {name} (whole {how}: {times}; {verdict})"


__all__ = [
    "DEFAULT",
    "MODES",
    "choose_pdl",
    "kernel_namespaces",
    "pdl_choice",
    "pdl_mode",
    "pdl_possible",
    "pdl_text",
    "time_steps",
]
