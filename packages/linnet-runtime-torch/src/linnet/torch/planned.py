"""Plans on PyTorch: `plan_for`, contexts, `plan.run`, `Captured`, `conform`.

A plan runs an entry as a sequence of items: regions that backends took (their executables)
and generated slices for every step left over, cut around the regions. Backends earn
regions by measurement (see :mod:`linnet.plan`); on CUDA, regions are timed the way a plan
runs under :class:`Captured`: inside a captured CUDA graph, with CUDA events, rotating through
the regions of one kind (each layer's q/k/v) so that the L2 cache does not hold the weights.

This module drives planning (`plan_for`, `conform`); a plan and how it runs are in
:mod:`linnet.torch.plans`, how one is built in :mod:`linnet.torch.plan_builder`. ``Plan``,
``Captured``, ``PlanBuilder``, ``SliceTimes`` and ``prepare_all`` are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from linnet.backends import Options
from linnet.lang.compiler import claim
from linnet.lang.diagnostics.core import coded_error
from linnet.lang.ir.stepsets import indexed
from linnet.plan import TimingCache, choose, choose_in_context
from linnet.plan.arguments import check_backends, check_cache, check_progress, plan_options

import torch

from .checking import (  # noqa: F401  (Finding, compare and the rest: importable from here too)
    Finding,
    References,
    check_candidate,
    compare,
    output_problem,
    run_once,
    same_device,
    tolerance_for,
    written_states,
)
from .context import Context
from .kernel_paths import KernelPaths, Unbuilt
from .launch_modes import choose_pdl, time_steps
from .options import compile_options
from .parallel import time_collectives
from .plan_builder import PlanBuilder, SliceTimes, group_key
from .plans import Captured, Plan, prepare_all  # noqa: F401  (prepare_all: importable here too)
from .timing import (  # noqa: F401  (time_rotation and the rest: importable from here too)
    GRAPH_CALLS,
    TIMING,
    host_seconds,
    rotation_calls,
    time_rotation,
    time_run,
    torch_target,
)


def plan_for(
    model: Any,
    entry: str,
    inputs: Sequence[torch.Tensor],
    backends: Sequence[Any] | None = None,
    compile: Any = None,
    memory: int | None = None,
    measure: bool = True,
    margin: float = 0.02,
    progress: bool | Callable[[str], None] = True,
    cache: TimingCache | None = None,
    kernels: bool = True,
    captured: bool = True,
) -> Plan:
    """See :meth:`linnet.torch.Model.plan_for`."""
    options, backends = plan_arguments(
        backends, compile, memory, measure, margin, progress, cache, kernels, captured
    )
    builder = PlanBuilder(model, entry, list(inputs), options, progress)
    ready = builder.probe(backends)
    if kernels and model.numerics == "fast":
        ready += builder.kernel_paths()
    # Thousands of candidate regions are analysed over the claimed graph, which nothing
    # changes from here: through an index of it made once (stepsets.indexed).
    with indexed(builder.graph):
        candidates = builder.candidates(ready)
        context = model.context_for_graph(builder.graph)
        live = [c for c in candidates if c.status != "failed"]
        timed = False
        cache = cache if cache is not None else TimingCache()
        if live and measure:
            # One run of the generated source records every region's inputs; each executable
            # runs once there and must give the region's outputs, within tolerance of the
            # generated source's, before it is timed.
            env = builder.check_outputs(live, context)
            live = [c for c in live if c.status != "failed"]
            if live:
                builder.time_candidates(live, env, context, cache)
                timed = True
        elif live:
            check_what_is_taken(builder, candidates, context, options)
        if timed and options.compile:
            # Compiled, the steps between regions fuse: each kind of region taken is checked
            # against the compiled steps around it (linnet.plan.context).
            decision = choose_in_context(
                candidates,
                options,
                len(builder.graph.steps),
                SliceTimes(builder, env, context, cache),
                key=group_key,
                say=builder.say,
            )
            cache.flush()
        else:
            decision = choose(candidates, options)
        items, path = builder.items(decision.taken)
        plan = Plan(
            model,
            entry,
            builder.graph,
            items,
            candidates,
            builder.skipped,
            options,
            builder.target,
            path,
        )
        if measure and not captured and decision.taken and getattr(model, "world", 1) == 1:
            # Run by plan.run, the regions are checked whole: against the generated source alone
            # (one compiled slice, no region), each timed as plan.run runs it. Not under tensor
            # parallelism: ranks whose choices differ would run collectives that never meet.
            builder.say("checking the plan whole against the generated source alone, by plan.run")
            bare_items, bare_path = builder.items([])
            bare = Plan(
                model,
                entry,
                builder.graph,
                bare_items,
                candidates,
                builder.skipped,
                options,
                builder.target,
                bare_path,
            )
            plan = faster_whole(plan, bare, lambda p: time_run(p, list(inputs)), options.margin)
        if measure and getattr(model, "world", 1) > 1:  # tensor parallelism: every rank times
            plan.collective_seconds = time_collectives(builder.graph, model.device)
        if measure:  # Linnet's kernels' launch mode, by the whole step as it runs (launch_modes)
            contexts: list[Context] = []  # one, of fresh states, made only if the modes are timed

            def step_for(mode: int) -> Callable[[Sequence[torch.Tensor]], Any]:
                if not contexts:
                    contexts.append(model.context_for(plan))
                if captured:
                    return Captured(plan, contexts[0], pdl=mode)
                return lambda ins: plan.run(ins, contexts[0], pdl=mode)

            choose_pdl(
                plan, time_steps(step_for, list(inputs), plan.device), plan.pdl_margin, builder.say
            )
        return plan


def check_what_is_taken(
    builder: PlanBuilder, candidates: list[Any], context: Context, options: Options
) -> None:
    """An unmeasured plan's check: the candidates it would take are checked against the
    generated source (:meth:`PlanBuilder.check_outputs`), and while one fails, it is set
    aside and the choice made again, its replacements checked in turn. Candidates never
    taken are never run (a kernel variant not taken is not compiled for this shape: a
    serving engine plans each new prefill shape on first use). No recorded value is kept
    after the check that last reads it.

    >>> check_what_is_taken(builder, candidates, context, options)  # doctest: +SKIP
    """
    checked: set[int] = set()
    # Kernels that could not be written fail in the first check whether taken or not: their
    # coded error is news for whoever wrote them, and running them costs nothing.
    unbuilt = [c for c in candidates if c.status != "failed" and isinstance(c.executable, Unbuilt)]
    while True:
        for c in candidates:  # choose() marks what it does not take; choose afresh
            if c.status != "failed":
                c.status, c.reason = "pending", ""
        taken = choose(candidates, options).taken
        unchecked = [c for c in [*unbuilt, *taken] if id(c) not in checked]
        unbuilt = []
        if not unchecked:
            break
        builder.check_outputs(unchecked, context, keep=False)
        checked.update(id(c) for c in unchecked)
        if all(c.status != "failed" for c in taken):
            break
    for c in candidates:
        if c.status != "failed":
            c.status, c.reason = "pending", ""


def plan_arguments(
    backends: Any = None,
    compile: Any = None,
    memory: Any = None,
    measure: Any = True,
    margin: Any = 0.02,
    progress: Any = True,
    cache: Any = None,
    kernels: Any = True,
    captured: Any = True,
) -> tuple[Options, list[Any] | None]:
    """``plan_for``'s arguments checked, before anything is lowered or timed: the plan's
    :class:`~linnet.backends.Options` and the backends as a list (None: every available
    one). A value it cannot use is a coded error naming the argument (see
    :mod:`linnet.plan.arguments`; ``compile=`` as :func:`~linnet.torch.options.compile_options`
    checks it, E0714).

    >>> options, backends = plan_arguments(margin=0.05)
    >>> options.margin, backends
    (0.05, None)
    """
    compile_options(compile)
    options = plan_options(
        margin=margin,
        measure=measure,
        memory=memory,
        compile=compile,
        captured=captured,
        kernels=kernels,
    )
    check_progress(progress)
    check_cache(cache)
    return options, check_backends(backends)


def faster_whole(plan: Plan, bare: Plan, timer: Callable[[Plan], float], margin: float) -> Plan:
    """``plan`` if, run whole, it saves ``margin`` of ``bare``'s time (the same entry with no
    region: the generated source alone), else ``bare``, its regions' candidates then status
    "slower whole" with both times. Either way the plan returned records both times
    (``whole_seconds``: with its regions, without) for ``explain()``. Regions are chosen
    piece by piece, each timed alone and in its stretch; a plan that runs by ``plan.run``
    pays each one's host time in a sequence whose host and device times overlap in ways no
    piece shows, so the whole run decides.

    >>> faster_whole(plan, bare, lambda p: time_run(p, [prompt]), 0.02)  # doctest: +SKIP
    """
    with_regions, without = timer(plan), timer(bare)
    kept = with_regions < without * (1 - margin)
    chosen = plan if kept else bare
    chosen.whole_seconds = (with_regions, without)
    if not kept:
        taken = plan.regions
        for c in taken:
            c.status = "slower whole"
            c.reason = (
                f"{c.reason}; but the plan with its {len(taken)} regions took "
                f"{with_regions * 1e6:.1f} us a plan.run, the generated source alone "
                f"{without * 1e6:.1f} us (needs {margin:.0%} less)"
            )
    return chosen


# ---------------------------------------------------------------- conformance
def conform(
    model: Any,
    entry: str,
    inputs: Sequence[torch.Tensor],
    backend: Any,
    tolerance: float = 0.01,
    context: Context | None = None,
) -> list[Finding]:
    """Run every region ``backend`` takes both ways, on the same inputs: a finding each.

    A region passes when the backend gives exactly the region's outputs (as many as it
    declares, each a torch.Tensor of the declared shape and dtype on the model's device)
    and each is within tolerance of the generated source's: ``max|a - b| <= tol * max(1,
    max|b|)`` where ``b`` is the generated source's output and ``tol`` is ``tolerance``
    (relative to the output's scale), at least 4 units of rounding of the output's dtype,
    and 0 for integer outputs; NaN and infinities must sit where the reference has them.
    A region the backend cannot compile, prepare or execute fails with the reason in its
    note, as does what ``match`` gave that is not a Region of the graph. A region that
    writes states (a kernel that stores k and v into the KV cache) is compared on them too:
    each state it writes, as each side left it, within the same bound. This is the check
    ``plan_for`` makes of every executable (:mod:`linnet.torch.checking`): each region runs
    where it stands in one run of the generated source, on the states the steps before it
    left. ``context`` gives the states that run starts from (a prefilled KV cache, say); it
    is not modified: everything runs on copies.

    >>> for f in conform(model, "decode", [token, pos], MyLinear()):  # doctest: +SKIP
    ...     print(f.region, f.difference, f.passed, f.note)
    """
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, int | float)
        or not math.isfinite(tolerance)
        or tolerance < 0
    ):
        raise coded_error(
            "E0758",
            f"tolerance must be a finite number >= 0, not {tolerance!r}",
            help="e.g. tolerance=0.01: 1% of the reference's largest magnitude",
        )
    options = Options(measure=False, tolerance=float(tolerance))
    builder = PlanBuilder(model, entry, list(inputs), options, progress=False)
    ready = builder.probe([backend])
    if ready and isinstance(backend, KernelPaths):  # span ops' claims are its regions too
        builder.graph = claim(builder.graph, model.program)
    if not ready:
        reason = builder.skipped[-1].reason if builder.skipped else "declined"
        raise coded_error(
            "E0754", f"backend `{getattr(backend, 'name', backend)}` cannot run here: {reason}"
        )
    candidates = builder.candidates(ready)
    if builder.skipped:
        raise coded_error("E0755", f"backend `{backend.name}` failed: {builder.skipped[-1].reason}")
    context = context if context is not None else model.context_for_graph(builder.graph)
    live = [c for c in candidates if c.status != "failed"]
    found = builder.check(live, context)[1] if live else {}
    return [
        found[id(c)] if id(c) in found else Finding(c.region, None, False, c.reason)
        for c in candidates
    ]
