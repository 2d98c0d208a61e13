"""Plans on PyTorch: `plan_for`, contexts, `plan.run`, `Captured`, `conform`.

A plan runs an entry as a sequence of items: regions that backends took (their executables)
and generated slices for every step left over, cut around the regions. Backends earn
regions by measurement (see :mod:`linnet.plan`); on CUDA, regions are timed the way a plan
runs under :class:`Captured`: inside a captured CUDA graph, with CUDA events, rotating through
the regions of one kind (each layer's q/k/v) so that the L2 cache does not hold the weights.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from linnet.backends.discovery import probe_all
from linnet.lang import LinnetError
from linnet.lang import __version__ as lang_version
from linnet.lang.check.spans import claim_spans
from linnet.lang.diagnostics.core import coded_error
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.ir.slices import Slice, slice_steps
from linnet.plan import (
    Candidate,
    TimingCache,
    cache_key,
    choose,
    choose_in_context,
    explain_table,
    label_algorithms,
    rotation,
    warn_failed,
)
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
from .home import import_source, shown
from .inputs import check_inputs
from .kernel_paths import KernelPaths
from .launch_modes import (
    MODES,
    choose_pdl,
    kernel_namespaces,
    pdl_mode,
    pdl_text,
    time_steps,
)
from .options import announce_compile, compile_label, compile_options, numerics_mode
from .parallel import rank_errors
from .timing import (  # noqa: F401  (time_rotation and the rest: importable from here too)
    GRAPH_CALLS,
    TIMING,
    host_seconds,
    rotation_calls,
    time_rotation,
    time_run,
    torch_target,
)


# ---------------------------------------------------------------- plan
@dataclass
class Item:
    kind: str  # "slice" or "region"
    run: Any  # the slice function or the executable
    inputs: list[str]
    outputs: list[str]
    parameters: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    output_types: list[ValueType] = field(default_factory=list)
    label: str = ""
    backend: str = ""  # the backend's name, for a region's item


class Plan:
    """An entry planned over backends. ``run(inputs, context)`` runs it step by step;
    ``explain()`` says for every candidate region which backend claimed it, the times and why
    it went where it went."""

    def __init__(self, model: Any, entry: str, graph: Graph, items: list[Item],
                 candidates: list[Candidate], skipped_backends: list[Any], options: Options,
                 target: Target, source_path: str = ""):
        self.model = model
        self.entry = entry
        self.graph = graph
        self.items = items
        self.candidates = candidates
        self.skipped = skipped_backends
        self.options = options
        self.target = target
        self.source_path = source_path
        self.device = model.device
        # How the plan was timed, for how it will run: Captured (True) or plan.run.
        self.captured = options.captured
        # Tensor parallelism: each collective step's time alone, by step (plan_for measures).
        self.collective_seconds: dict[int, float] = {}
        # Linnet's kernels' launch mode (linnet.torch.launch_modes): None is the generated
        # modules' own; plan_for times the whole step under each and sets it.
        self.pdl: int | None = None
        self.pdl_seconds: dict[int, float] = {}
        self.pdl_reason = ""
        self.pdl_margin = options.margin / 2
        self._pdl_namespaces: list[dict[str, Any]] | None = None
        # A plan for plan.run: seconds a run with its regions and with none (faster_whole).
        self.whole_seconds: tuple[float, float] | None = None

    def pdl_namespaces(self) -> list[dict[str, Any]]:
        """The generated kernel modules' namespaces whose launch mode the plan sets."""
        if self._pdl_namespaces is None:
            self._pdl_namespaces = kernel_namespaces(self.executables)
        return self._pdl_namespaces

    @property
    def executables(self) -> list[Any]:
        return [i.run for i in self.items if i.kind == "region"]

    @property
    def regions(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "taken"]

    def run(self, inputs: Sequence[torch.Tensor], context: Context,
            pdl: int | None = None) -> list[Any]:
        """Run the plan once, step by step: backend regions and the generated slices between
        them. Returns the entry's outputs as a list, as :class:`Captured` does. Linnet's
        kernels launch under ``pdl`` (a mode of :mod:`linnet.torch.launch_modes`), by default
        the plan's. A plan made with ``captured=False`` was timed the way this runs.

        >>> logits, = plan.run([token, pos], model.context_for(plan))   # doctest: +SKIP
        """
        mode = self.pdl if pdl is None else _launch_mode(pdl)
        check_inputs(self.graph, inputs, self.entry)  # count, types, dtypes, index ranges
        # Executables were prepared by `context_for`; per-step host work that needs the step's
        # values (FlashInfer's plan) runs inside `execute` here, and in `prepare` under Captured.
        # Inputs given on the host are also handed to executables as `context.host_inputs`.
        context.host_inputs = host_inputs(self.graph, inputs)
        on_device = [t.to(self.device) for t in inputs]
        context.inputs = dict(zip(self.graph.inputs, on_device))
        # A rank's collectives that lose the other ranks (a timeout, a peer gone): E0825.
        ranks = rank_errors(getattr(self.model, "rank", 0), getattr(self.model, "world", 1))
        with pdl_mode(self.pdl_namespaces(), mode), ranks:
            return self._run(on_device, context)

    def _run(self, inputs: list[torch.Tensor], context: Context) -> list[Any]:
        graph = self.graph
        if len(inputs) != len(graph.inputs):
            raise coded_error("E0720", f"entry `{self.entry}` takes {len(graph.inputs)} inputs, got "
                         f"{len(inputs)}")
        env: dict[str, Any] = {}
        for name, t in zip(graph.inputs, inputs):
            vt = graph.values[name]
            if tuple(t.shape) != vt.shape:
                raise coded_error("E0751", f"input {name[1:]} has shape {list(t.shape)}; this plan was "
                             f"made for {list(vt.shape)}",
                             help="make a plan for these shapes: model.plan_for(...)")
            env[name] = t
        # The model's own dict: slices name parameters and states apart, and a plain dict
        # lookup is what this loop does most.
        params, states = context._params, context.states
        with numerics_mode(self.model.numerics), torch.inference_mode():
            for item in self.items:
                args = [env[v] for v in item.inputs]
                if item.kind == "slice":
                    res = item.run(*args, *[params[p] for p in item.parameters],
                                   *[states[p] for p in item.states])
                else:
                    try:
                        res = item.run.execute(args, item.output_types, context)
                    except LinnetError:
                        raise
                    except Exception as exc:
                        raise _executable_error("E0757", item, "execute", exc) from exc
                for name, value in zip(item.outputs, res):
                    env[name] = value
            # A whole state or parameter returned (`return self.cache`) is a copy, as the
            # interpreter and the generated source return it: the next step writes the state.
            return [env[o] if not o.startswith("@") else
                    (states[o[1:]] if o[1:] in states else params[o[1:]]).clone()
                    for o in graph.outputs]

    def explain(self) -> str:
        header = (f"plan for {self.graph.model}.{self.entry} on {self.target.kind}"
                  f" ({self.target.name or self.target.device}); margin "
                  f"{self.options.margin:.0%}, measure={self.options.measure}"
                  + (f", memory budget {self.options.memory} bytes"
                     if self.options.memory is not None else "")
                  + ("" if self.captured or self.target.kind != "cuda" else
                     "; timed for plan.run (host launches counted), not Captured"))
        launch = pdl_text(self)
        return explain_table(self.candidates, self.skipped, header) + collectives_text(
            self.graph, self.collective_seconds) + whole_text(self) + (
            f"\n{launch}" if launch else "")

    def __repr__(self) -> str:
        return (f"Plan({self.graph.model}.{self.entry}: {len(self.regions)} backend regions, "
                f"{sum(1 for i in self.items if i.kind == 'slice')} generated slices)")


def whole_text(plan: Plan) -> str:
    """``plan.explain()``'s line on the whole-run check of a plan for ``plan.run``
    (:func:`faster_whole`), or "" where there was none."""
    if plan.whole_seconds is None:
        return ""
    with_regions, without = plan.whole_seconds
    verdict = ("the regions stay" if plan.regions else
               "the generated source runs alone")
    return (f"\nchecked whole by plan.run: {with_regions * 1e6:.1f} us a run with the regions "
            f"taken above, {without * 1e6:.1f} us with none; {verdict}")


def collectives_text(graph: Graph, seconds: dict[int, float] | None = None) -> str:
    """The lines of ``plan.explain()`` that list a rank's collective steps (tensor
    parallelism, linnet.lang.ir.shard): each runs inside a generated slice, in order, with
    its time alone where the plan measured (``seconds`` by step)."""
    seconds = seconds or {}
    from linnet.lang.ir.shard import COLLECTIVES

    found = [(i, s) for i, s in enumerate(graph.steps) if s.op in COLLECTIVES]
    if not found:
        return ""
    tp = graph.config.get("tensor_parallel", {})
    timed = "each timed alone" if seconds else "not timed: measure=False"
    lines = ["", f"collectives of rank {tp.get('rank', '?')} of {tp.get('world', '?')} "
                 f"(torch.distributed, in the generated slices; {timed}):"]
    for i, s in found:
        vt = graph.values[s.results[0]]
        what = s.attributes.get("kind") if s.op == "all_reduce" else \
            f"axis {s.attributes.get('axis')}"
        # The block it ends (the deepest call with a path around it): o_proj, down_proj...
        around = [c for c in graph.calls if c.start <= i < c.stop and c.path]
        path = max(around, key=lambda c: c.depth).path if around else (
            "the entry's result" if s.results[0] in graph.outputs else "")
        took = f"  {1e6 * seconds[i]:.1f} us" if i in seconds else ""
        lines.append(f"  step {i:4d}  {s.op} {what}  {vt.dtype}{list(vt.shape)}{took}"
                     + (f"  [{path}]" if path else "") + (f"  ({s.loc})" if s.loc else ""))
    if seconds:
        lines.append(f"  {1e6 * sum(seconds.values()):.1f} us of collectives a step")
    return "\n".join(lines)


class Captured:
    """Runs a plan once, then captures it whole as one CUDA graph and replays it.

    The first call runs the plan eagerly on the graph's own input buffers (made from its
    inputs), the second captures it. Before every replay the inputs are copied into those
    buffers and each executable's ``prepare(context)`` runs (host work such as FlashInfer's
    per-step planning).
    Give inputs the host already knows (positions) as CPU tensors: they are copied in without
    waiting for the device (through pinned buffers) and handed to ``prepare`` as
    ``context.host_inputs``, so a step never waits for the previous one to finish. Device
    inputs (the last step's argmax) are copied on the device. Outputs are fresh tensors each
    call. Linnet's kernels launch under ``pdl`` (a mode of :mod:`linnet.torch.launch_modes`),
    by default the plan's (``plan.pdl``), and the graph keeps it.

    >>> step = Captured(plan, model.context_for(plan))              # doctest: +SKIP
    >>> logits, = step([token, torch.tensor([pos], dtype=torch.int32)])  # doctest: +SKIP
    """

    def __init__(self, plan: Plan, context: Context, pdl: int | None = None):
        if plan.device.type != "cuda":
            raise coded_error("E0750", f"Captured replays a CUDA graph, but this plan runs on "
                         f"{plan.device}", help="run plan.run(inputs, context) on the CPU, or "
                         "load the model with device='cuda'")
        self.plan = plan
        self.context = context
        self.pdl = plan.pdl if pdl is None else _launch_mode(pdl)
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list[torch.Tensor] = []
        self.static_outputs: list[Any] = []
        # Per host input: a pinned buffer and the event after its last copy to the device.
        self._staging: dict[int, tuple[torch.Tensor, torch.cuda.Event]] = {}

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # Executables' buffers are made under inference mode (plans run under it), and only
        # inference mode may update them in place: prepare and replay run under it too.
        with torch.inference_mode():
            return self._call(inputs)

    def _call(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        device = self.plan.device
        names = self.plan.graph.inputs
        # Host inputs are range-checked (a min and a max); device inputs are not: no wait.
        check_inputs(self.plan.graph, inputs, self.plan.entry, device_inputs=False)
        self.context.host_inputs = host_inputs(self.plan.graph, inputs)
        if self.calls == 0:
            # The first step runs eagerly, on the tensors the graph will read: torch.compile
            # guards on its inputs (inference tensors or not, say), and a slice compiled for
            # other tensors would compile again, and max-autotune tune again, inside the
            # capture, where neither can run.
            static = [t.to(device, copy=True) for t in inputs]
            self.context.inputs = dict(zip(names, static))
            with pdl_mode(self.plan.pdl_namespaces(), self.pdl):
                outputs = list(self.plan._run(static, self.context))
            self.static_inputs, self.calls = static, 1
            return outputs
        self.calls += 1
        self._load(inputs)
        self.context.inputs = dict(zip(names, self.static_inputs))
        if self.graph is None:
            self._capture()
        prepare_all(self.plan, self.context, "E0757")
        assert self.graph is not None
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_outputs]

    def _load(self, inputs: Sequence[torch.Tensor]) -> None:
        """Copy ``inputs`` into the graph's input buffers, without waiting for the device."""
        if len(inputs) != len(self.static_inputs):
            raise coded_error("E0720", f"entry `{self.plan.entry}` takes {len(self.static_inputs)} "
                         f"inputs, got {len(inputs)}")
        for i, (dst, src) in enumerate(zip(self.static_inputs, inputs)):
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise coded_error("E0752", f"Captured was captured for inputs "
                             f"{[(list(t.shape), str(t.dtype)) for t in self.static_inputs]}; "
                             f"got {[(list(t.shape), str(t.dtype)) for t in inputs]}",
                             help="make a plan and a Captured for each input shape and dtype")
            if src.device.type != "cpu":
                dst.copy_(src)
                continue
            if i not in self._staging:
                self._staging[i] = (torch.empty(src.shape, dtype=src.dtype, pin_memory=True),
                                    torch.cuda.Event())
            stage, copied = self._staging[i]
            copied.synchronize()  # the last copy out of `stage` (long done, a step ago)
            stage.copy_(src)
            dst.copy_(stage, non_blocking=True)
            copied.record()

    def _capture(self) -> None:
        prepare_all(self.plan, self.context, "E0757")
        torch.cuda.synchronize(self.plan.device)
        graph = torch.cuda.CUDAGraph()
        try:
            with pdl_mode(self.plan.pdl_namespaces(), self.pdl), torch.cuda.graph(graph):
                self.static_outputs = self.plan._run(self.static_inputs, self.context)
        except Exception as exc:
            raise coded_error("E0753", f"the plan could not be captured as a CUDA graph: {exc}",
                         help="a backend's execute must not allocate, synchronise or copy to "
                              "the host; see `plan.explain()` for which backends run") from exc
        self.graph = graph


def _launch_mode(pdl: Any) -> int:
    """``pdl`` if it is a launch mode of Linnet's kernels, else error E0759."""
    if isinstance(pdl, bool) or pdl not in MODES:
        raise coded_error("E0759", f"pdl={pdl!r} is not a launch mode of Linnet's kernels",
                     help="0 off, 1 early, 2 late, 3 by grid, 4 late and 5 early with "
                          "prefetching, or None for the plan's choice (plan.pdl)")
    return int(pdl)


def prepare_all(plan: Plan, context: Context, code: str = "E0756") -> None:
    """Each of the plan's executables' ``prepare(context)``; one that raises is a coded error
    naming its backend and region (``E0756`` where a context is made for the plan, ``E0757``
    before a replay).

    >>> prepare_all(plan, model.context_for_graph(plan.graph))      # doctest: +SKIP
    """
    for item in plan.items:
        if item.kind != "region":
            continue
        try:
            item.run.prepare(context)
        except LinnetError:
            raise
        except Exception as exc:
            raise _executable_error(code, item, "prepare", exc) from exc


def _executable_error(code: str, item: Item, method: str, exc: BaseException) -> LinnetError:
    backend = item.backend or "?"
    what = item.label[len(backend):].strip() if item.label.startswith(backend) else item.label
    return coded_error(code, f"backend `{backend}`'s executable for {what} raised in "
                  f"{method}: {type(exc).__name__}: {exc}",
                  help=f"it passed a check run when the plan was made; plan again without "
                       f"`{backend}` (plan_for(..., backends=[...])) and report this to its "
                       "authors")


def host_inputs(graph: Graph, inputs: Sequence[Any]) -> dict[str, torch.Tensor]:
    """The entry inputs given as CPU tensors, by graph value name (see Context.host_inputs)."""
    return {name: t for name, t in zip(graph.inputs, inputs)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu"}


class Progress:
    """A one-line progress bar on stderr (a line per update when stderr is not a terminal)."""

    def __init__(self, total: int, label: str, enabled: bool | Callable[[str], None]):
        self.total, self.done, self.label = total, 0, label
        self.sink = enabled if callable(enabled) else None
        self.enabled = bool(enabled)
        self.tty = sys.stderr.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        filled = int(width * self.done / max(1, self.total))
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                f"{self.done}/{self.total} {what}")
        if self.sink is not None:
            self.sink(line)
        elif self.tty:
            print("\r" + line[:110].ljust(110), end="", file=sys.stderr, flush=True)
            if self.done == self.total:
                print(file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)


def _collective_problem(graph: Graph, region: Region) -> str | None:
    """A backend region may not hold a collective step: the generated slices run those."""
    from linnet.lang.ir.shard import COLLECTIVES

    held = [i for i in region.steps if graph.steps[i].op in COLLECTIVES]
    if held:
        return f"the region holds collective step {held[0]} ({graph.steps[held[0]].op})"
    return None


# ---------------------------------------------------------------- building plans
class PlanBuilder:
    def __init__(self, model: Any, entry: str, inputs: list[torch.Tensor], options: Options,
                 progress: bool | Callable[[str], None]):
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
            self.skipped.append(SkipRecord(paths.name, "linnet-runtime-torch", paths.version,
                                           "", paths.last_reason or "declined", ""))
            return []
        self.say("finding span ops' claims (check/spans.py)")
        self.graph = claim_spans(self.graph, self.model.program)
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
                regions = None if found is None or isinstance(found, str | bytes) \
                    else list(found)
            except Exception as exc:
                self.skipped.append(_record(b, f"match raised {type(exc).__name__}: {exc}"))
                continue
            if regions is None:
                self.skipped.append(_record(b, f"match returned a {type(found).__name__}, not "
                                               "a list of Regions"))
                continue
            valid: list[Region] = []
            for r in regions:
                problem = match_problem(r, self.graph)
                if problem is not None:  # not a region of this graph: said, never run
                    out.append(Candidate(b, r if isinstance(r, Region) else
                                         _no_region(self.graph), status="failed",
                                         reason=problem))
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
                    self.skipped.append(_record(b, f"compile raised {type(exc).__name__}: "
                                                   f"{exc}"))
                    continue
                if len(executables) != len(regions):
                    self.skipped.append(_record(
                        b, f"compile_regions returned {len(executables)} executables for "
                           f"{len(regions)} regions"))
                    continue
            else:
                executables = []
                for r in regions:
                    try:
                        executables.append(b.compile(r, self.target, self.options))
                    except Exception as exc:
                        executables.append(_Failed(f"compile raised {type(exc).__name__}: "
                                                   f"{exc}"))
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

    def check_outputs(self, candidates: list[Candidate], context: Context) -> dict[str, Any]:
        """Record the generated source's values (:meth:`record_values`) and check each
        executable once against the generated source (:meth:`check`): one whose
        ``prepare`` or ``execute`` raises, whose outputs are not the region's (count,
        torch.Tensor, shape, dtype, device), or whose outputs or written states are not
        within ``Options.tolerance`` of the generated source's (NaN, zeros, a wrong scale)
        fails with the reason, a :class:`~linnet.plan.BackendWarning` says so, and the
        generated source runs its steps. Done once, where the plan is made, measured or
        not; a plan's runs and replays trust what passed here. Returns the recorded values.

        >>> env = builder.check_outputs(candidates, context)            # doctest: +SKIP
        """
        env, findings = self.check(candidates, context)
        failed = []
        for c in candidates:
            finding = findings.get(id(c))
            if finding is not None and not finding.passed:
                c.status, c.reason = "failed", finding.note
                failed.append(c)
        # Pointed at the caller of Model.plan_for (here, plan_for, Model.plan_for, caller).
        warn_failed(failed, "the check against the generated source", stacklevel=5)
        return env

    def check(self, candidates: list[Candidate], context: Context
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
                findings[id(c)] = check_candidate(c.executable, c.region, env, states,
                                                  references, self.options.tolerance,
                                                  self.device)

        env = self.record_values(candidates, context, at)
        return env, findings

    # -- values at region boundaries, from one run of the generated source
    def record_values(self, candidates: list[Candidate], context: Context,
                      at: Callable[[int, dict[str, Any], Context], None] | None = None
                      ) -> dict[str, Any]:
        """The values of one run of the generated source (on a scratch copy of
        ``context``'s states), cut where every candidate region starts and stops, by
        name. ``at(step, values, states)`` is called where each cut begins, before the
        steps from ``step`` on run: the values made so far and the scratch context (its
        states as the steps before left them; the step's inputs and host inputs set as
        ``plan.run`` sets them)."""
        cuts = {0, len(self.graph.steps)}
        for c in candidates:
            cuts.update((c.region.start, c.region.stop))
        bounds = sorted(cuts)
        slices = [slice_steps(self.graph, list(range(a, b)), f"part_{i}")
                  for i, (a, b) in enumerate(itertools.pairwise(bounds)) if b > a]
        export_arguments(self.graph, slices, [c.region for c in candidates])
        module = self.emit(slices, "record")
        items = self.slice_items(module, slices)
        env: dict[str, Any] = dict(zip(self.graph.inputs, self.inputs))
        scratch = context.scratch()
        # As plan.run hands them over: the step's inputs, and those given on the host.
        scratch.inputs = dict(zip(self.graph.inputs, self.inputs))
        scratch.host_inputs = host_inputs(self.graph, self.given)
        with numerics_mode(self.model.numerics), torch.inference_mode():
            for sl, item in zip(slices, items):
                if at is not None:
                    at(sl.start, env, scratch)
                res = item.run(*[env[v] for v in item.inputs],
                               *[scratch.parameters[p] for p in item.parameters],
                               *[scratch.states[p] for p in item.states])
                env.update(zip(item.outputs, res))
        return env

    def emit(self, slices: list[Slice], label: str) -> Any:
        # Without the program, no kernel launches: a plan's generated source is the op
        # bodies, and a kernel runs only where its region (KernelPaths) measured faster.
        text = emit_torch(self.graph, self.sources, numerics=self.model.numerics,
                          origin=self.model.program.root.source.name, slices=[slices],
                          device=str(self.device))
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
                        _torch_compile(fn, compile), m["function"], m.get("kind", ""),
                        self.say)
                fn = compiled[m["function"]]
            items.append(Item("slice", fn, list(sl.inputs), list(sl.outputs),
                              list(sl.parameters), list(sl.states), label=sl.name))
        return items

    # -- timing
    def keys(self, backend: Any, kind: str, variant: str = "", algorithm: str = ""
             ) -> tuple[str, str]:
        """The timing cache's keys for a backend's regions of ``kind`` (its ``variant``, and
        its ``algorithm`` where it offers several executables for the same steps) and for
        the generated source of the same steps. A key without an algorithm is what every
        version wrote: timings of backends with one executable per region stay valid,
        and one that older versions gave every algorithm (the first one's) is never read
        for any of them."""
        what = kind + (f"/{variant}" if variant else "") + (
            f"/algorithm={algorithm}" if algorithm else "")
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
        return cache_key(self.timing_key(), "generated", f"{lang_version}/{self.model.numerics}/"
                         f"bodies/{compile_label(self.options.compile)}", CONTRACT, kind)

    def time_candidates(self, candidates: list[Candidate], env: dict[str, Any],
                        context: Context, cache: TimingCache) -> None:
        groups: dict[tuple[int, str, str, str], list[Candidate]] = {}
        for c in candidates:
            groups.setdefault(group_key(c), []).append(c)
        progress = Progress(len(groups), "linnet: timing regions", self.progress)
        generated_times: dict[str, float] = {}
        for (_, kind, variant, algorithm), group in groups.items():
            backend = group[0].backend
            bkey, gkey = self.keys(backend, kind, variant, algorithm)
            b_seconds = cache.get(bkey)
            g_seconds = generated_times.get(kind, cache.get(gkey))
            cached = b_seconds is not None and g_seconds is not None
            scratch = context.scratch()
            try:
                if b_seconds is None:
                    b_seconds = self.time_backend(group, env, scratch)
                    cache.put(bkey, b_seconds, backend=backend.name, kind=kind,
                              region=repr(group[0].region),
                              **({"algorithm": algorithm} if algorithm else {}))
            except Exception as exc:
                for c in group:
                    c.status, c.reason = "failed", f"timing raised {type(exc).__name__}: {exc}"
                progress.step(f"{group[0].label}: failed")
                continue
            if g_seconds is None:
                g_seconds = self.time_generated(group, env, scratch)
                cache.put(gkey, g_seconds, backend="generated", kind=kind,
                          region=repr(group[0].region))
            generated_times[kind] = g_seconds
            for c in group:
                c.backend_seconds, c.generated_seconds, c.cached = b_seconds, g_seconds, cached
            progress.step(f"{group[0].label} {group[0].region!r}"
                          + (" (cached)" if cached else ""))
        cache.flush()
        reused = sum(1 for g in groups.values() if g[0].cached)
        if reused:  # a second process: no region was compiled or timed for these
            self.say(f"reused the timings of {reused} of {len(groups)} region kinds from "
                     f"{shown(cache.path)}")

    def time_backend(self, group: list[Candidate], env: dict[str, Any],
                     context: Context) -> float:
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

    def time_generated(self, group: list[Candidate], env: dict[str, Any],
                       context: Context) -> float:
        slices = [slice_steps(self.graph, list(c.region.steps), "region")
                  for c in rotation(group)]
        return self.time_slices(slices, env, context, f"{group[0].region!r}")

    def time_slices(self, slices: list[Slice], env: dict[str, Any], context: Context,
                    label: str) -> float:
        """Median seconds per slice of the generated source (compiled as the plan compiles
        it) running each of ``slices`` (of one kind) in turn on the recorded values."""
        module = self.emit(slices[:1], "region")
        fn = getattr(module, module.ENTRIES[self.graph.entry]["slices"][0]["function"])
        if self.options.compile:
            fn = announce_compile(_torch_compile(fn, self.options.compile), label,
                                  slices[0].kind, self.say)
        calls = []
        for sl in slices:
            args = [env[v] for v in sl.inputs] + [context.parameters[p] for p in sl.parameters] \
                + [context.states[p] for p in sl.states]
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
        slice_items = iter(self.slice_items(module, slices, self.options.compile)
                           if module else [])
        items = []
        for entry in order:
            if isinstance(entry, Slice):
                items.append(next(slice_items))
            else:
                r = entry.region
                items.append(Item("region", entry.executable, list(r.inputs), list(r.outputs),
                                  output_types=[self.graph.values[o] for o in r.outputs],
                                  label=f"{entry.label} {r!r}",
                                  backend=entry.backend_name))
        return items, (module.__file__ if module else "")

    def slice_name(self, step: int) -> str:
        best = None
        for call in self.graph.calls:
            if call.start <= step < call.stop and call.iteration is not None and (
                    best is None or call.depth < best.depth):
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
        made = [v for i in (sl.steps or range(sl.start, sl.stop))
                for v in graph.steps[i].results]
        sl.outputs += [v for v in made if v in wanted and v not in sl.outputs]


class SliceTimes:
    """The :class:`linnet.plan.SliceTimer` of a plan being made: slices of the generated
    source timed on the values one run recorded (``record_values``), compiled as the plan
    compiles them, and kept in the timing cache by kind (a second process reuses them)."""

    def __init__(self, builder: PlanBuilder, env: dict[str, Any], context: Context,
                 cache: TimingCache):
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
        key = self.builder.generated_key(chosen[0].kind)
        seconds = self.cache.get(key)
        if seconds is not None:
            return seconds
        for sl in chosen:
            missing = [v for v in sl.inputs if v not in self.env]
            if missing:  # made inside a region the recording did not cut at
                raise LookupError(f"{missing[0]}, read by steps {sl.start}..{sl.stop}, was not "
                                  "recorded")
        seconds = self.builder.time_slices(chosen, self.env, self.context.scratch(),
                                           f"steps {chosen[0].start}..{chosen[0].stop}")
        self.cache.put(key, seconds, backend="generated", kind=chosen[0].kind,
                       region=f"steps {chosen[0].start}..{chosen[0].stop}")
        return seconds


class _Failed:
    """Stands for an executable that ``compile`` did not give (it raised)."""

    def __init__(self, reason: str):
        self.reason = reason


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
    if any(not isinstance(i, int) or isinstance(i, bool) for i in steps) or \
            steps != tuple(sorted(set(steps))):
        return f"its steps {list(steps)[:8]} are not step numbers in increasing order"
    try:
        rebuilt = Region.of_steps(graph, steps, region.index)
    except RegionError as exc:
        return f"its steps cannot run together: {exc}"
    if set(region.outputs) != set(rebuilt.outputs) or \
            len(region.outputs) != len(rebuilt.outputs):
        return (f"it declares outputs {list(region.outputs)}, but its steps make "
                f"{list(rebuilt.outputs)} for later steps (build regions with Region.of or "
                "Region.of_steps)")
    made_before = set(graph.inputs)
    for step in graph.steps[:region.start]:
        made_before.update(step.results)
    missing = [v for v in rebuilt.inputs if v not in region.inputs]
    foreign = [v for v in region.inputs if v not in made_before]
    if missing or foreign:
        return (f"it declares inputs {list(region.inputs)}; its steps read "
                f"{list(rebuilt.inputs)}" + (f" and {foreign} are not made before step "
                                              f"{region.start}" if foreign else ""))
    try:
        kind = region_kind(region)
    except Exception as exc:
        return f"its kind cannot be computed ({type(exc).__name__}: {exc})"
    if region.kind != kind:
        # Timings are cached and shared by kind: a made-up kind would borrow another's.
        return (f"its kind {region.kind!r} is not what its steps compute ({kind}); after "
                "changing a region, set its kind to linnet.backends.region_kind(region)")
    return None


def executable_problem(ex: Any) -> str | None:
    """Why what ``compile`` returned is not an executable, or None."""
    if ex is None:
        return "compile returned None, not an executable"
    lacks = [m for m in ("prepare", "execute") if not callable(getattr(ex, m, None))]
    if lacks:
        return (f"compile returned a {type(ex).__name__}, not an executable: it has no "
                + " or ".join(f"{m}()" for m in lacks))
    try:
        holds = ex.meta.holds
    except Exception as exc:
        return f"its executable has no meta.holds ({type(exc).__name__}: {exc})"
    if type(holds) is not int or holds < 0:
        return (f"its executable declares holds={holds!r}; holds is a number of bytes, an "
                "int >= 0")
    algorithm = getattr(ex.meta, "algorithm", "")
    if not isinstance(algorithm, str):
        return (f"its executable declares algorithm={algorithm!r}; algorithm is a name (a "
                "str) that tells it apart from the backend's other executables for the "
                "same steps")
    return None


def match_problem(region: Any, graph: Graph) -> str | None:
    """Why what a backend's ``match`` gave is not a Region of ``graph`` whose steps are step
    numbers of it, or None (then :func:`region_problem` checks what the steps do)."""
    if not isinstance(region, Region):
        return (f"match gave {_shown(region, 60)} (a {type(region).__name__}), not a Region "
                "(build regions with Region.of or Region.of_steps)")
    if region.graph is not graph:
        other = region.graph
        what = (f"{other.model}.{other.entry}, {len(other.steps)} steps"
                if isinstance(other, Graph) else f"a {type(other).__name__}")
        return (f"its region is of another graph ({what}), not of the graph match was "
                f"given ({graph.model}.{graph.entry}, {len(graph.steps)} steps): build "
                "regions from the graph passed to this match, not one kept from an earlier "
                "call")
    steps = region.steps
    if not isinstance(steps, tuple | list | range) or not steps or any(
            not isinstance(i, int) or isinstance(i, bool) for i in steps):
        return f"its steps {_shown(steps, 40)} are not a non-empty sequence of step numbers"
    outside = [i for i in steps if not 0 <= i < len(graph.steps)]
    if outside:
        return (f"its step {outside[0]} is outside the graph, whose steps are "
                f"0..{len(graph.steps) - 1}")
    return None


def _shown(value: Any, width: int) -> str:
    """``repr(value)``, cut to ``width`` characters; a repr that raises is not shown."""
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__} whose repr raised"
    return text if len(text) <= width else text[:width - 3] + "..."


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
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
            not math.isfinite(seconds) or seconds < 0:
        return None, f"estimate_cost gave seconds={seconds!r}, not a finite time >= 0"
    return float(seconds), ""


def _record(backend: Any, reason: str) -> Any:
    """A skip record for a backend that failed after its probe (match, compile)."""
    from linnet.backends.discovery import _name_of, _origin_of

    origin = _origin_of(backend)
    return SkipRecord(_name_of(backend), origin.distribution, origin.version, origin.path,
                      reason, "")


def _torch_compile(fn: Callable, compile: Any) -> Callable:
    return torch.compile(fn, dynamic=False, **(compile_options(compile) or {}))


def plan_for(model: Any, entry: str, inputs: Sequence[torch.Tensor],
             backends: Sequence[Any] | None = None, compile: Any = None,
             memory: int | None = None, measure: bool = True, margin: float = 0.02,
             progress: bool | Callable[[str], None] = True, cache: TimingCache | None = None,
             kernels: bool = True, captured: bool = True) -> Plan:
    """See :meth:`linnet.torch.Model.plan_for`."""
    options, backends = plan_arguments(backends, compile, memory, measure, margin, progress,
                                       cache, kernels, captured)
    builder = PlanBuilder(model, entry, list(inputs), options, progress)
    ready = builder.probe(backends)
    if kernels and model.numerics == "fast":
        ready += builder.kernel_paths()
    candidates = builder.candidates(ready)
    context = model.context_for_graph(builder.graph)
    live = [c for c in candidates if c.status != "failed"]
    timed = False
    cache = cache if cache is not None else TimingCache()
    if live:
        # One run of the generated source records every region's inputs; each executable
        # runs once there and must give the region's outputs, within tolerance of the
        # generated source's, before it is timed (or, unmeasured, taken).
        env = builder.check_outputs(live, context)
        live = [c for c in live if c.status != "failed"]
        if measure and live:
            builder.time_candidates(live, env, context, cache)
            timed = True
    if timed and options.compile:
        # Compiled, the steps between regions fuse: each kind of region taken is checked
        # against the compiled steps around it (linnet.plan.context).
        decision = choose_in_context(candidates, options, len(builder.graph.steps),
                                     SliceTimes(builder, env, context, cache),
                                     key=group_key, say=builder.say)
        cache.flush()
    else:
        decision = choose(candidates, options)
    items, path = builder.items(decision.taken)
    plan = Plan(model, entry, builder.graph, items, candidates, builder.skipped, options,
                builder.target, path)
    if measure and not captured and decision.taken and getattr(model, "world", 1) == 1:
        # Run by plan.run, the regions are checked whole: against the generated source alone
        # (one compiled slice, no region), each timed as plan.run runs it. Not under tensor
        # parallelism: ranks whose choices differ would run collectives that never meet.
        builder.say("checking the plan whole against the generated source alone, by plan.run")
        bare_items, bare_path = builder.items([])
        bare = Plan(model, entry, builder.graph, bare_items, candidates, builder.skipped,
                    options, builder.target, bare_path)
        plan = faster_whole(plan, bare, lambda p: time_run(p, list(inputs)), options.margin)
    if measure and getattr(model, "world", 1) > 1:  # tensor parallelism: every rank times
        from .parallel import time_collectives

        plan.collective_seconds = time_collectives(builder.graph, model.device)
    if measure:  # Linnet's kernels' launch mode, by the whole step as it runs (launch_modes)
        contexts: list[Context] = []  # one, of fresh states, made only if the modes are timed

        def step_for(mode: int) -> Callable[[Sequence[torch.Tensor]], Any]:
            if not contexts:
                contexts.append(model.context_for(plan))
            if captured:
                return Captured(plan, contexts[0], pdl=mode)
            return lambda ins: plan.run(ins, contexts[0], pdl=mode)

        choose_pdl(plan, time_steps(step_for, list(inputs), plan.device), plan.pdl_margin,
                   builder.say)
    return plan


def plan_arguments(backends: Any = None, compile: Any = None, memory: Any = None,
                   measure: Any = True, margin: Any = 0.02, progress: Any = True,
                   cache: Any = None, kernels: Any = True, captured: Any = True
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
    options = plan_options(margin=margin, measure=measure, memory=memory, compile=compile,
                           captured=captured, kernels=kernels)
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
            c.reason = (f"{c.reason}; but the plan with its {len(taken)} regions took "
                        f"{with_regions * 1e6:.1f} us a plan.run, the generated source alone "
                        f"{without * 1e6:.1f} us (needs {margin:.0%} less)")
    return chosen


# ---------------------------------------------------------------- conformance
def conform(model: Any, entry: str, inputs: Sequence[torch.Tensor], backend: Any,
            tolerance: float = 0.01, context: Context | None = None) -> list[Finding]:
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
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or \
            not math.isfinite(tolerance) or tolerance < 0:
        raise coded_error("E0758", f"tolerance must be a finite number >= 0, not {tolerance!r}",
                     help="e.g. tolerance=0.01: 1% of the reference's largest magnitude")
    options = Options(measure=False, tolerance=float(tolerance))
    builder = PlanBuilder(model, entry, list(inputs), options, progress=False)
    ready = builder.probe([backend])
    if ready and isinstance(backend, KernelPaths):  # span ops' claims are its regions too
        builder.graph = claim_spans(builder.graph, model.program)
    if not ready:
        reason = builder.skipped[-1].reason if builder.skipped else "declined"
        raise coded_error("E0754", f"backend `{getattr(backend, 'name', backend)}` cannot run here: "
                     f"{reason}")
    candidates = builder.candidates(ready)
    if builder.skipped:
        raise coded_error("E0755", f"backend `{backend.name}` failed: {builder.skipped[-1].reason}")
    context = context if context is not None else model.context_for_graph(builder.graph)
    live = [c for c in candidates if c.status != "failed"]
    found = builder.check(live, context)[1] if live else {}
    return [found[id(c)] if id(c) in found else Finding(c.region, None, False, c.reason)
            for c in candidates]
