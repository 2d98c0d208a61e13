"""How a plan is built on PyTorch (:class:`PlanBuilder`): the entry cut into slices around
the regions backends may take, each backend's candidates checked against the generated code
and timed the way a plan runs (:class:`SliceTimes`; on CUDA inside a captured graph, rotating
through a kind's regions), and the winners chosen. :func:`linnet.torch.planned.plan_for`
drives it; :mod:`linnet.torch.plans` holds what it makes.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from linnet.backends import (
    CONTRACT,
    Cost,
    Options,
    Region,
    RegionError,
    SkipRecord,
    Target,
    region_kind,
    skipped,
)
from linnet.backends.discovery import _name_of, _origin_of, probe_all
from linnet.lang import __version__ as lang_version
from linnet.lang.compiler import claim
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.graph import Graph
from linnet.lang.ir.stepsets import made_before
from linnet.lang.passes.shard import COLLECTIVES
from linnet.lang.passes.slices import Slice, slice_steps
from linnet.plan import Candidate, TimingCache, cache_key, label_algorithms, rotation, warn_failed

import torch

from .checking import Finding, References, check_candidate
from .context import Context
from .home import import_source, shown
from .kernel_paths import KernelPaths
from .options import announce_compile, compile_label, compile_options, numerics_mode
from .plans import Item, Progress, host_inputs
from .timing import TIMING, time_rotation, torch_target


def _collective_problem(graph: Graph, region: Region) -> str | None:
    """A backend region may not hold a collective step: the generated slices run those."""
    held = [i for i in region.steps if graph.steps[i].op in COLLECTIVES]
    if held:
        return f"the region holds collective step {held[0]} ({graph.steps[held[0]].op})"
    return None


# ---------------------------------------------------------------- building plans
class PlanBuilder:
    def __init__(
        self,
        model: Any,
        entry: str,
        inputs: list[torch.Tensor],
        options: Options,
        progress: bool | Callable[[str], None],
    ):
        self.model = model
        self.entry = entry
        self.given = list(inputs)
        self.inputs = [t.to(model.device) for t in inputs]
        self.options = options
        self.progress = progress
        self.graph: Graph = model.graph(entry, self.inputs)
        self.device: torch.device = model.device
        self.target = torch_target(self.device)
        self.sources = {m.source.name: m.source.text for m in model.program.modules.values()}
        self.skipped: list[Any] = []

    def say(self, message: str) -> None:
        """A progress line (compiling slices): to ``progress`` if it is a callable, to
        stderr if it is True."""
        if callable(self.progress):
            self.progress(message)
        elif self.progress:
            print(f"linnet: {message}", file=sys.stderr, flush=True)

    # -- backends
    def probe(self, backends: Sequence[Any] | None) -> list[Any]:
        """The backends that run on this target; the others are recorded with why."""
        if backends is None:
            self.skipped.extend(skipped())
        ready, records = probe_all(self.target, None if backends is None else list(backends))
        # Backends left out at discovery for a broken probe are in both lists: once is enough.
        self.skipped.extend(r for r in records if not any(r is k for k in self.skipped))
        return ready

    def kernel_paths(self) -> list[Any]:
        """Linnet's own kernels as a backend (``linnet-kernels``, see
        :mod:`linnet.torch.kernel_paths`), with span ops claimed in the graph; none where
        kernels cannot launch on this target (recorded, with why)."""
        paths = KernelPaths(self.model.program, self.sources)
        if paths.probe(self.target) is None:
            self.skipped.append(
                SkipRecord(
                    paths.name,
                    "linnet-runtime-torch",
                    paths.version,
                    "",
                    paths.last_reason or "declined",
                    "",
                )
            )
            return []
        self.say("finding span ops' claims (check/spans.py)")
        self.graph = claim(self.graph, self.model.program)
        return [paths]

    def candidates(self, backends: list[Any]) -> list[Candidate]:
        """Each backend's regions and executables. A backend whose ``match`` fails is
        recorded in ``skipped``; what ``match`` gave that is not a Region of this graph
        (:func:`match_problem`), a region that is not valid, an executable that is not one
        (``compile`` returned None, say) or declares a ``holds`` that is not a byte count
        or an ``algorithm`` that is not a string, becomes a candidate with status "failed"
        and the reason. Estimates come from ``estimate_cost``; one that raises or is not a
        Cost is ignored, with the reason. Where a backend gives several executables for the
        same steps, each is labelled (:func:`linnet.plan.label_algorithms`) and timed apart.

        >>> candidates = builder.candidates(builder.probe([MyLinear()]))  # doctest: +SKIP
        """
        out: list[Candidate] = []
        for b in backends:
            try:
                found = b.match(self.graph, self.target)
                regions = None if found is None or isinstance(found, str | bytes) else list(found)
            except Exception as exc:
                self.skipped.append(_record(b, f"match raised {type(exc).__name__}: {exc}"))
                continue
            if regions is None:
                self.skipped.append(
                    _record(b, f"match returned a {type(found).__name__}, not a list of Regions")
                )
                continue
            valid: list[Region] = []
            for r in regions:
                problem = match_problem(r, self.graph)
                if problem is not None:  # not a region of this graph: said, never run
                    out.append(
                        Candidate(
                            b,
                            r if isinstance(r, Region) else _no_region(self.graph),
                            status="failed",
                            reason=problem,
                        )
                    )
                    continue
                problem = region_problem(r) or _collective_problem(self.graph, r)
                if problem is None:
                    valid.append(r)
                else:
                    out.append(Candidate(b, r, status="failed", reason=problem))
            regions = valid
            executables: list[Any]
            if hasattr(b, "compile_regions"):
                try:
                    executables = list(b.compile_regions(regions, self.target, self.options))
                except Exception as exc:
                    self.skipped.append(_record(b, f"compile raised {type(exc).__name__}: {exc}"))
                    continue
                if len(executables) != len(regions):
                    self.skipped.append(
                        _record(
                            b,
                            f"compile_regions returned {len(executables)} executables for "
                            f"{len(regions)} regions",
                        )
                    )
                    continue
            else:
                executables = []
                for r in regions:
                    try:
                        executables.append(b.compile(r, self.target, self.options))
                    except Exception as exc:
                        executables.append(_Failed(f"compile raised {type(exc).__name__}: {exc}"))
            for r, ex in zip(regions, executables):
                c = Candidate(b, r, ex)
                problem = ex.reason if isinstance(ex, _Failed) else executable_problem(ex)
                if problem is not None:
                    c.executable, c.status, c.reason = None, "failed", problem
                else:
                    c.holds = ex.meta.holds
                    c.estimate, c.estimate_note = estimate(b, r, self.target)
                out.append(c)
        # Two executables for the same steps (two algorithms): each is timed on its own.
        label_algorithms(out, lambda c: (id(c.backend), c.region.kind, variant_of(c)))
        return out

    def check_outputs(
        self, candidates: list[Candidate], context: Context, keep: bool = True
    ) -> dict[str, Any]:
        """Record the generated source's values (:meth:`record_values`) and check each
        executable once against the generated source (:meth:`check`): one whose
        ``prepare`` or ``execute`` raises, whose outputs are not the region's (count,
        torch.Tensor, shape, dtype, device), or whose outputs or written states are not
        within ``Options.tolerance`` of the generated source's (NaN, zeros, a wrong scale)
        fails with the reason, a :class:`~linnet.plan.BackendWarning` says so, and the
        generated source runs its steps. Done once, where the plan is made, measured or
        not; a plan's runs and replays trust what passed here. Returns the recorded values
        (with ``keep`` False, only the step's inputs: each value is let go once the last
        slice and check that read it ran, which bounds a long prefill's memory).

        >>> env = builder.check_outputs(candidates, context)            # doctest: +SKIP
        """
        env, findings = self.check(candidates, context, keep)
        failed = []
        for c in candidates:
            finding = findings.get(id(c))
            if finding is not None and not finding.passed:
                c.status, c.reason = "failed", finding.note
                failed.append(c)
        # Pointed at the caller of Model.plan_for (here, plan_for, Model.plan_for, caller).
        warn_failed(failed, "the check against the generated source", stacklevel=5)
        return env

    def check(
        self, candidates: list[Candidate], context: Context, keep: bool = True
    ) -> tuple[dict[str, Any], dict[int, Finding]]:
        """(the recorded values, a :class:`~linnet.torch.checking.Finding` by ``id`` of
        each candidate not failed already). Each executable is checked where its region
        starts in the one recorded run of the generated source, on the states as the
        steps before it left them (the KV cache with this step's k and v written, where
        attention reads it), against the generated source of its steps
        (:func:`~linnet.torch.checking.check_candidate`); ``context`` is not changed."""
        live = [c for c in candidates if c.status != "failed"]
        starts: dict[int, list[Candidate]] = {}
        for c in live:
            starts.setdefault(c.region.start, []).append(c)
        references = References(self)
        references.emit([c.region for c in live])
        findings: dict[int, Finding] = {}

        def at(step: int, env: dict[str, Any], states: Context) -> None:
            for c in starts.get(step, []):
                findings[id(c)] = check_candidate(
                    c.executable,
                    c.region,
                    env,
                    states,
                    references,
                    self.options.tolerance,
                    self.device,
                )

        env = self.record_values(candidates, context, at, keep)
        return env, findings

    # -- values at region boundaries, from one run of the generated source
    def record_values(
        self,
        candidates: list[Candidate],
        context: Context,
        at: Callable[[int, dict[str, Any], Context], None] | None = None,
        keep: bool = True,
    ) -> dict[str, Any]:
        """The values of one run of the generated source (on a scratch copy of
        ``context``'s states), cut where every candidate region starts and stops, by
        name. ``at(step, values, states)`` is called where each cut begins, before the
        steps from ``step`` on run: the values made so far and the scratch context (its
        states as the steps before left them; the step's inputs and host inputs set as
        ``plan.run`` sets them). With ``keep`` False a value made by the run leaves the
        values once no later slice or candidate region reads it (those at its last cut
        ran): what is left is the step's inputs."""
        cuts = {0, len(self.graph.steps)}
        for c in candidates:
            cuts.update((c.region.start, c.region.stop))
        bounds = sorted(cuts)
        slices = [
            slice_steps(self.graph, list(range(a, b)), f"part_{i}")
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
            if b > a
        ]
        export_arguments(self.graph, slices, [c.region for c in candidates])
        module = self.emit(slices, "record")
        items = self.slice_items(module, slices)
        env: dict[str, Any] = dict(zip(self.graph.inputs, self.inputs))
        scratch = context.scratch()
        # As plan.run hands them over: the step's inputs, and those given on the host.
        scratch.inputs = dict(zip(self.graph.inputs, self.inputs))
        scratch.host_inputs = host_inputs(self.graph, self.given)
        # The last cut at which each value is read: by a slice starting there, or by a
        # candidate region starting there (checked by `at` before that slice runs).
        last: dict[str, int] = {}
        for sl, item in zip(slices, items):
            for v in item.inputs:
                last[v] = max(last.get(v, -1), sl.start)
        for c in candidates:
            for v in c.region.inputs:
                last[v] = max(last.get(v, -1), c.region.start)
        given = set(self.graph.inputs)
        with numerics_mode(self.model.numerics), torch.inference_mode():
            for sl, item in zip(slices, items):
                if at is not None:
                    at(sl.start, env, scratch)
                res = item.run(
                    *[env[v] for v in item.inputs],
                    *[scratch.parameters[p] for p in item.parameters],
                    *[scratch.states[p] for p in item.states],
                )
                env.update(zip(item.outputs, res))
                if not keep:
                    for v in [v for v in env if v not in given and last.get(v, -1) <= sl.start]:
                        del env[v]
        return env

    def emit(self, slices: list[Slice], label: str) -> Any:
        # Without the program, no kernel launches: a plan's generated source is the op
        # bodies, and a kernel runs only where its region (KernelPaths) measured faster.
        text = emit_torch(
            self.graph,
            self.sources,
            numerics=self.model.numerics,
            origin=self.model.program.root.source.name,
            slices=[slices],
            device=str(self.device),
        )
        module = import_source(text, f"linnet_plan_{label}")
        return module

    def slice_items(self, module: Any, slices: list[Slice], compile: Any = None) -> list[Item]:
        meta = module.ENTRIES[self.graph.entry]["slices"]
        compiled: dict[str, Callable] = {}
        items = []
        for sl, m in zip(slices, meta):
            fn = getattr(module, m["function"])
            if compile:
                if m["function"] not in compiled:
                    compiled[m["function"]] = announce_compile(
                        _torch_compile(fn, compile), m["function"], m.get("kind", ""), self.say
                    )
                fn = compiled[m["function"]]
            items.append(
                Item(
                    "slice",
                    fn,
                    list(sl.inputs),
                    list(sl.outputs),
                    list(sl.parameters),
                    list(sl.states),
                    label=sl.name,
                )
            )
        return items

    # -- timing
    def keys(
        self, backend: Any, kind: str, variant: str = "", algorithm: str = ""
    ) -> tuple[str, str]:
        """The timing cache's keys for a backend's regions of ``kind`` (its ``variant``, and
        its ``algorithm`` where it offers several executables for the same steps) and for
        the generated source of the same steps. A key without an algorithm is what every
        version wrote: timings of backends with one executable per region stay valid,
        and one that older versions gave every algorithm (the first one's) is never read
        for any of them."""
        what = (
            kind
            + (f"/{variant}" if variant else "")
            + (f"/algorithm={algorithm}" if algorithm else "")
        )
        bkey = cache_key(self.timing_key(), backend.name, str(backend.version), CONTRACT, what)
        return bkey, self.generated_key(kind)

    def timing_key(self) -> str:
        """The target's part of a timing cache key, with the timing method's version and, for
        a plan that runs by ``plan.run`` on CUDA, that its timings count the host's launches
        (they differ from captured ones most for small regions)."""
        eager = "/launched" if self.device.type == "cuda" and not self.options.captured else ""
        return f"{self.target.key()}/timing{TIMING}{eager}"

    def generated_key(self, kind: str) -> str:
        """The timing cache's key for the generated source of steps of ``kind`` (a region's
        steps or a slice's: both are fingerprints of what the steps compute)."""
        # "bodies": the generated source of a plan launches no kernel (see `emit`).
        return cache_key(
            self.timing_key(),
            "generated",
            f"{lang_version}/{self.model.numerics}/bodies/{compile_label(self.options.compile)}",
            CONTRACT,
            kind,
        )

    def time_candidates(
        self, candidates: list[Candidate], env: dict[str, Any], context: Context, cache: TimingCache
    ) -> None:
        groups: dict[tuple[int, str, str, str], list[Candidate]] = {}
        for c in candidates:
            groups.setdefault(group_key(c), []).append(c)
        progress = Progress(len(groups), "linnet: timing regions", self.progress)
        generated_times: dict[str, float] = {}
        for (_, kind, variant, algorithm), group in groups.items():
            backend = group[0].backend
            # Timed on these values: a cache read to position 1 is not one read to 1,000.
            kind = kind + workload(group[0].region.inputs, env)
            bkey, gkey = self.keys(backend, kind, variant, algorithm)
            b_seconds = cache.get(bkey)
            g_seconds = generated_times.get(kind, cache.get(gkey))
            cached = b_seconds is not None and g_seconds is not None
            scratch = context.scratch()
            try:
                if b_seconds is None:
                    b_seconds = self.time_backend(group, env, scratch)
                    cache.put(
                        bkey,
                        b_seconds,
                        backend=backend.name,
                        kind=kind,
                        region=repr(group[0].region),
                        **({"algorithm": algorithm} if algorithm else {}),
                    )
            except Exception as exc:
                for c in group:
                    c.status, c.reason = "failed", f"timing raised {type(exc).__name__}: {exc}"
                progress.step(f"{group[0].label}: failed")
                continue
            if g_seconds is None:
                g_seconds = self.time_generated(group, env, scratch)
                cache.put(
                    gkey, g_seconds, backend="generated", kind=kind, region=repr(group[0].region)
                )
            generated_times[kind] = g_seconds
            for c in group:
                c.backend_seconds, c.generated_seconds, c.cached = b_seconds, g_seconds, cached
            progress.step(f"{group[0].label} {group[0].region!r}" + (" (cached)" if cached else ""))
        cache.flush()
        reused = sum(1 for g in groups.values() if g[0].cached)
        if reused:  # a second process: no region was compiled or timed for these
            self.say(
                f"reused the timings of {reused} of {len(groups)} region kinds from "
                f"{shown(cache.path)}"
            )

    def time_backend(self, group: list[Candidate], env: dict[str, Any], context: Context) -> float:
        chosen = rotation(group)
        calls = []
        for c in chosen:
            args = [env[v] for v in c.region.inputs]
            types = [self.graph.values[o] for o in c.region.outputs]
            calls.append(lambda ex=c.executable, a=args, t=types: ex.execute(a, t, context))

        def prepare() -> None:
            for c in chosen:
                c.executable.prepare(context)

        with numerics_mode(self.model.numerics), torch.inference_mode():
            return time_rotation(calls, self.device, self.options, prepare)

    def time_generated(
        self, group: list[Candidate], env: dict[str, Any], context: Context
    ) -> float:
        slices = [slice_steps(self.graph, list(c.region.steps), "region") for c in rotation(group)]
        return self.time_slices(slices, env, context, f"{group[0].region!r}")

    def time_slices(
        self, slices: list[Slice], env: dict[str, Any], context: Context, label: str
    ) -> float:
        """Median seconds per slice of the generated source (compiled as the plan compiles
        it) running each of ``slices`` (of one kind) in turn on the recorded values."""
        module = self.emit(slices[:1], "region")
        fn = getattr(module, module.ENTRIES[self.graph.entry]["slices"][0]["function"])
        if self.options.compile:
            fn = announce_compile(
                _torch_compile(fn, self.options.compile), label, slices[0].kind, self.say
            )
        calls = []
        for sl in slices:
            args = (
                [env[v] for v in sl.inputs]
                + [context.parameters[p] for p in sl.parameters]
                + [context.states[p] for p in sl.states]
            )
            calls.append(lambda a=args: fn(*a))
        with numerics_mode(self.model.numerics), torch.inference_mode():
            return time_rotation(calls, self.device, self.options)

    # -- the plan's items
    def items(self, taken: list[Candidate]) -> tuple[list[Item], str]:
        starts = {c.region.start: c for c in taken}
        claimed = {s for c in taken for s in c.region.steps}
        slices: list[Slice] = []
        order: list[Any] = []
        pending: list[int] = []

        def flush() -> None:
            if pending:
                sl = slice_steps(self.graph, list(pending), self.slice_name(pending[0]))
                slices.append(sl)
                order.append(sl)
                pending.clear()

        for i in range(len(self.graph.steps)):
            if i in starts:
                flush()
                order.append(starts[i])
            elif i not in claimed:
                pending.append(i)
        flush()
        export_arguments(self.graph, slices, [c.region for c in taken])
        module = self.emit(slices, "plan") if slices else None
        slice_items = iter(self.slice_items(module, slices, self.options.compile) if module else [])
        items = []
        for entry in order:
            if isinstance(entry, Slice):
                items.append(next(slice_items))
            else:
                r = entry.region
                items.append(
                    Item(
                        "region",
                        entry.executable,
                        list(r.inputs),
                        list(r.outputs),
                        output_types=[self.graph.values[o] for o in r.outputs],
                        label=f"{entry.label} {r!r}",
                        backend=entry.backend_name,
                    )
                )
        return items, (module.__file__ if module else "")

    def slice_name(self, step: int) -> str:
        best = None
        for call in self.graph.calls:
            if (
                call.start <= step < call.stop
                and call.iteration is not None
                and (best is None or call.depth < best.depth)
            ):
                best = call
        if best is None:
            return "slice"
        return best.callee.rsplit("::", 1)[-1].replace(".", "_").lower() + "_part"


def export_arguments(graph: Graph, slices: list[Slice], regions: Sequence[Region]) -> None:
    """Each slice also returns the values it makes that a region reads where no later step
    does: a kernel region reads its call's arguments (``kernel_paths.with_arguments``), and
    a value made before the layers and read there only by hoisted steps (the rotations'
    ``inv_freq``, read by ``rms_norm_qkv_rope``'s kernel) is otherwise no slice's output."""
    wanted = {v for r in regions for v in r.inputs}
    for sl in slices:
        made = [v for i in (sl.steps or range(sl.start, sl.stop)) for v in graph.steps[i].results]
        sl.outputs += [v for v in made if v in wanted and v not in sl.outputs]


class SliceTimes:
    """The :class:`linnet.plan.SliceTimer` of a plan being made: slices of the generated
    source timed on the values one run recorded (``record_values``), compiled as the plan
    compiles them, and kept in the timing cache by kind (a second process reuses them)."""

    def __init__(
        self, builder: PlanBuilder, env: dict[str, Any], context: Context, cache: TimingCache
    ):
        self.builder, self.env, self.context, self.cache = builder, env, context, cache
        self.slices: dict[tuple[int, ...], Slice] = {}

    def slice(self, steps: tuple[int, ...]) -> Slice:
        if steps not in self.slices:
            self.slices[steps] = slice_steps(self.builder.graph, list(steps), "context")
        return self.slices[steps]

    def kind(self, steps: tuple[int, ...]) -> str:
        return self.slice(steps).kind

    def seconds(self, slices: list[tuple[int, ...]]) -> float:
        chosen = [self.slice(s) for s in slices]
        values = workload(chosen[0].inputs, self.env)
        key = self.builder.generated_key(chosen[0].kind + values)
        seconds = self.cache.get(key)
        if seconds is not None:
            return seconds
        for sl in chosen:
            missing = [v for v in sl.inputs if v not in self.env]
            if missing:  # made inside a region the recording did not cut at
                raise LookupError(
                    f"{missing[0]}, read by steps {sl.start}..{sl.stop}, was not recorded"
                )
        seconds = self.builder.time_slices(
            chosen, self.env, self.context.scratch(), f"steps {chosen[0].start}..{chosen[0].stop}"
        )
        self.cache.put(
            key,
            seconds,
            backend="generated",
            kind=chosen[0].kind,
            region=f"steps {chosen[0].start}..{chosen[0].stop}",
        )
        return seconds


class _Failed:
    """Stands for an executable that ``compile`` did not give (it raised)."""

    def __init__(self, reason: str):
        self.reason = reason


def workload(inputs: Sequence[str], env: dict[str, Any]) -> str:
    """What a region's time follows in its input values beyond their shapes, for its timing
    cache key: the largest value of each integer input, to the next power of two (the
    positions attention reads a cache up to, the pages a table names). A region timed at
    position 1 is not reused by a plan at position 1,000; timings within a factor of two of
    the positions share a key. Empty where no input is an integer tensor.

    >>> workload(["pos", "x"], {"pos": torch.tensor([3, 600]), "x": torch.ones(2)})
    '/values<1024'
    """
    marks = []
    for name in inputs:
        t = env.get(name)
        if (
            isinstance(t, torch.Tensor)
            and t.numel()
            and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)
        ):
            top = int(t.max())
            marks.append(str(1 << top.bit_length()) if top > 0 else str(top))
    return f"/values<{','.join(marks)}" if marks else ""


def group_key(c: Candidate) -> tuple[int, str, str, str]:
    """Candidates that share one timing (and one verdict in context): one backend, one
    region kind, one variant, one algorithm (where the backend offers several executables
    for the same steps: :func:`linnet.plan.label_algorithms`)."""
    return (id(c.backend), c.region.kind, variant_of(c), c.algorithm)


def variant_of(c: Candidate) -> str:
    """What tells apart one backend's candidates over the same steps: for Linnet's kernels,
    the op whose kernel runs (`linear_gemv` and `linear_gemv_row` claim the same steps with
    different kernels, so they share a region kind but must be timed, and cached, apart)."""
    return c.region.callee if isinstance(c.backend, KernelPaths) else ""


def region_problem(region: Region) -> str | None:
    """Why ``region`` cannot run as it says, or None. Regions are rebuilt from their steps
    (``Region.of_steps``: operands and state order) and must declare the values that
    rebuild makes and uses later as their outputs, and read at least what it reads
    (a backend may declare more inputs, if they are made before the region: FlashInfer
    declares the positions)."""
    graph = region.graph
    steps = tuple(region.steps)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in steps) or steps != tuple(
        sorted(set(steps))
    ):
        return f"its steps {list(steps)[:8]} are not step numbers in increasing order"
    try:
        rebuilt = Region.of_steps(graph, steps, region.index)
    except RegionError as exc:
        return f"its steps cannot run together: {exc}"
    if set(region.outputs) != set(rebuilt.outputs) or len(region.outputs) != len(rebuilt.outputs):
        return (
            f"it declares outputs {list(region.outputs)}, but its steps make "
            f"{list(rebuilt.outputs)} for later steps (build regions with Region.of or "
            "Region.of_steps)"
        )
    exists = made_before(graph, region.start)
    missing = [v for v in rebuilt.inputs if v not in region.inputs]
    foreign = [v for v in region.inputs if not exists(v)]
    if missing or foreign:
        return (
            f"it declares inputs {list(region.inputs)}; its steps read "
            f"{list(rebuilt.inputs)}"
            + (f" and {foreign} are not made before step {region.start}" if foreign else "")
        )
    try:
        kind = region_kind(region)
    except Exception as exc:
        return f"its kind cannot be computed ({type(exc).__name__}: {exc})"
    if region.kind != kind:
        # Timings are cached and shared by kind: a made-up kind would borrow another's.
        return (
            f"its kind {region.kind!r} is not what its steps compute ({kind}); after "
            "changing a region, set its kind to linnet.backends.region_kind(region)"
        )
    return None


def executable_problem(ex: Any) -> str | None:
    """Why what ``compile`` returned is not an executable, or None."""
    if ex is None:
        return "compile returned None, not an executable"
    lacks = [m for m in ("prepare", "execute") if not callable(getattr(ex, m, None))]
    if lacks:
        return (
            f"compile returned a {type(ex).__name__}, not an executable: it has no "
            + " or ".join(f"{m}()" for m in lacks)
        )
    try:
        holds = ex.meta.holds
    except Exception as exc:
        return f"its executable has no meta.holds ({type(exc).__name__}: {exc})"
    if type(holds) is not int or holds < 0:
        return f"its executable declares holds={holds!r}; holds is a number of bytes, an int >= 0"
    algorithm = getattr(ex.meta, "algorithm", "")
    if not isinstance(algorithm, str):
        return (
            f"its executable declares algorithm={algorithm!r}; algorithm is a name (a "
            "str) that tells it apart from the backend's other executables for the "
            "same steps"
        )
    return None


def match_problem(region: Any, graph: Graph) -> str | None:
    """Why what a backend's ``match`` gave is not a Region of ``graph`` whose steps are step
    numbers of it, or None (then :func:`region_problem` checks what the steps do)."""
    if not isinstance(region, Region):
        return (
            f"match gave {_shown(region, 60)} (a {type(region).__name__}), not a Region "
            "(build regions with Region.of or Region.of_steps)"
        )
    if region.graph is not graph:
        other = region.graph
        what = (
            f"{other.model}.{other.entry}, {len(other.steps)} steps"
            if isinstance(other, Graph)
            else f"a {type(other).__name__}"
        )
        return (
            f"its region is of another graph ({what}), not of the graph match was "
            f"given ({graph.model}.{graph.entry}, {len(graph.steps)} steps): build "
            "regions from the graph passed to this match, not one kept from an earlier "
            "call"
        )
    steps = region.steps
    if (
        not isinstance(steps, tuple | list | range)
        or not steps
        or any(not isinstance(i, int) or isinstance(i, bool) for i in steps)
    ):
        return f"its steps {_shown(steps, 40)} are not a non-empty sequence of step numbers"
    outside = [i for i in steps if not 0 <= i < len(graph.steps)]
    if outside:
        return (
            f"its step {outside[0]} is outside the graph, whose steps are 0..{len(graph.steps) - 1}"
        )
    return None


def _shown(value: Any, width: int) -> str:
    """``repr(value)``, cut to ``width`` characters; a repr that raises is not shown."""
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__} whose repr raised"
    return text if len(text) <= width else text[: width - 3] + "..."


def _no_region(graph: Graph) -> Region:
    """The region a failed candidate stands for where ``match`` gave no Region at all:
    no steps (``plan.explain()`` shows "-"), never run."""
    return Region(graph, (), None, (), (), (), (), "")


def estimate(backend: Any, region: Region, target: Target) -> tuple[float | None, str]:
    """(seconds, "") from ``estimate_cost``, or (None, why it was ignored); None from the
    backend is no estimate, and nothing to explain."""
    try:
        cost = backend.estimate_cost(region, target)
    except Exception as exc:
        return None, f"estimate_cost raised {type(exc).__name__}: {exc}"
    if cost is None:
        return None, ""
    if not isinstance(cost, Cost):
        return None, f"estimate_cost returned a {type(cost).__name__}, not a Cost"
    seconds = cost.seconds
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        return None, f"estimate_cost gave seconds={seconds!r}, not a finite time >= 0"
    return float(seconds), ""


def _record(backend: Any, reason: str) -> Any:
    """A skip record for a backend that failed after its probe (match, compile)."""
    origin = _origin_of(backend)
    return SkipRecord(
        _name_of(backend), origin.distribution, origin.version, origin.path, reason, ""
    )


def _torch_compile(fn: Callable, compile: Any) -> Callable:
    return torch.compile(fn, dynamic=False, **(compile_options(compile) or {}))
