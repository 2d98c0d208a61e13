"""How plans time what they run, on PyTorch: a region kind's rotation inside a captured CUDA
graph (as :class:`~linnet.torch.plans.Captured` runs it), the host's time to issue the same
calls (charged too where a plan will run by ``plan.run``), and whole ``plan.run`` calls.

>>> len(rotation_calls([print], 16))
16
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from linnet.backends import Options, Target

import torch


def torch_target(device: torch.device) -> Target:
    """The :class:`~linnet.backends.Target` of a torch device, with the versions timings
    depend on (torch's, CUDA's, the GPU's name and compute capability).

    >>> torch_target(torch.device("cpu")).kind
    'cpu'
    """
    versions: list[tuple[str, str]] = [("torch", str(torch.__version__))]
    if device.type == "cuda":
        versions.append(("cuda", str(torch.version.cuda)))
        props = torch.cuda.get_device_properties(device)
        return Target(
            "cuda", str(device), props.name, (props.major, props.minor), "torch", tuple(versions)
        )
    return Target(device.type, str(device), device.type, None, "torch", tuple(versions))


#: The fewest calls a timed CUDA graph makes. Replaying a graph has a fixed cost (the host's
#: launch) that the events around it measure; a kind with one region (SiLU x up, the LM head:
#: a parameter-free kind rotates over one) was charged all of it (on the H200, inferred: SiLU
#: x up timed 10.7 us in an 8B plan, its kernel 1.3 us alone at F = 4096; decode.md).
GRAPH_CALLS = 16
#: The timing method's version, in every timing cache key: timings made before
#: ``GRAPH_CALLS`` (one call's graph for a one-region kind) are not reused.
TIMING = 2


def rotation_calls(
    calls: Sequence[Callable[..., Any]], minimum: int = GRAPH_CALLS
) -> list[Callable[..., Any]]:
    """``calls`` in turn, the whole turn repeated until there are at least ``minimum``.

    >>> len(rotation_calls([print], 16)), len(rotation_calls([print] * 5, 16))
    (16, 20)
    """
    if not calls:
        return []
    return list(calls) * -(-minimum // len(calls))


def time_rotation(
    calls: Sequence[Callable[..., Any]],
    device: torch.device,
    options: Options,
    prepare: Callable[[], None] | None = None,
) -> float:
    """Median seconds per call, calling each of ``calls`` in turn (one per region of a kind).

    On CUDA the rotation is captured in a CUDA graph and timed with events, as `Captured`
    runs, the turn repeated to at least ``GRAPH_CALLS`` calls (:func:`rotation_calls`) so that
    the graph's fixed cost is shared as in a whole step. For a plan that will run by
    ``plan.run`` (``options.captured`` False) each call is also charged its host time: the
    same calls launched from the host, the time to issue them (:func:`host_seconds`). A
    region then has to save more device time than it costs the host, as it must in a
    ``plan.run`` that the host's launches already pace. On the CPU it is timed by the wall
    clock.
    """
    prepare = prepare or (lambda: None)
    for _ in range(options.warmup):
        prepare()
        for c in calls:
            c()
    if device.type == "cuda":
        seconds = graph_seconds(calls, device, options, prepare)
        if not options.captured:
            seconds += host_seconds(calls, device, options, prepare)
        return seconds
    times = []
    for _ in range(options.repeat):
        prepare()
        t0 = time.perf_counter()
        for c in calls:
            c()
        times.append((time.perf_counter() - t0) / len(calls))
    return statistics.median(times)


def host_seconds(
    calls: Sequence[Callable[..., Any]],
    device: torch.device,
    options: Options,
    prepare: Callable[[], None] | None = None,
) -> float:
    """Median seconds the host takes to issue one of ``calls`` (the turn repeated to at
    least ``GRAPH_CALLS``), from an idle device, not waiting for it: what each region or
    compiled slice costs ``plan.run`` in Python and launches beside its device time."""
    prepare = prepare or (lambda: None)
    queued = rotation_calls(calls)
    times = []
    for _ in range(options.repeat):
        prepare()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for c in queued:
            c()
        times.append((time.perf_counter() - t0) / len(queued))
    torch.cuda.synchronize(device)
    return statistics.median(times)


def graph_seconds(
    calls: Sequence[Callable[..., Any]],
    device: torch.device,
    options: Options,
    prepare: Callable[[], None],
) -> float:
    """Median seconds per call of ``calls`` in turn inside a captured CUDA graph, timed with
    events (after :func:`time_rotation`'s warm-up): the device's time, as `Captured` runs it."""
    torch.cuda.synchronize(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        prepare()
        for c in calls:
            c()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    captured = rotation_calls(calls)
    with torch.cuda.graph(graph):
        for c in captured:
            c()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(options.repeat):
        prepare()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(captured))
    return statistics.median(times)


def time_run(plan: Any, inputs: list[torch.Tensor], rounds: int = 3, calls: int = 8) -> float:
    """Median seconds of one ``plan.run`` on a context of fresh states (the runs write them):
    two calls first (compiling), then ``rounds`` of ``calls`` runs queued, each round
    waiting for the device at its end. ``inputs`` are given as the plan was asked for them
    (a prompt on the host is range-checked there; one on the device costs ``plan.run`` a
    synchronisation, and is timed with it).

    >>> time_run(plan, [prompt])                                    # doctest: +SKIP
    0.00617
    """
    context = plan.model.context_for(plan)
    for _ in range(2):
        plan.run(inputs, context)
    samples = []
    for _ in range(rounds):
        if plan.device.type == "cuda":
            torch.cuda.synchronize(plan.device)
        t0 = time.perf_counter()
        for _ in range(calls):
            plan.run(inputs, context)
        if plan.device.type == "cuda":
            torch.cuda.synchronize(plan.device)
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


__all__ = [
    "GRAPH_CALLS",
    "TIMING",
    "graph_seconds",
    "host_seconds",
    "rotation_calls",
    "time_rotation",
    "time_run",
    "torch_target",
]
