"""A plan and how it runs on PyTorch: its items (generated slices and the regions backends
took), ``plan.run``, ``plan.explain()``, :class:`Captured` (the plan as one CUDA graph) and
the progress line planning prints. :mod:`linnet.torch.plan_builder` makes plans;
:mod:`linnet.torch.planned` holds `plan_for` and `conform`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from linnet.backends import Options, Target
from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import coded_error
from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.passes.shard import COLLECTIVES
from linnet.plan import Candidate, explain_table

import torch

from .context import Context
from .inputs import check_inputs
from .launch_modes import MODES, kernel_namespaces, pdl_mode, pdl_text
from .options import numerics_mode
from .parallel import rank_errors


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

    def __init__(
        self,
        model: Any,
        entry: str,
        graph: Graph,
        items: list[Item],
        candidates: list[Candidate],
        skipped_backends: list[Any],
        options: Options,
        target: Target,
        source_path: str = "",
    ):
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

    def run(
        self, inputs: Sequence[torch.Tensor], context: Context, pdl: int | None = None
    ) -> list[Any]:
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
            raise coded_error(
                "E0720", f"entry `{self.entry}` takes {len(graph.inputs)} inputs, got {len(inputs)}"
            )
        env: dict[str, Any] = {}
        for name, t in zip(graph.inputs, inputs):
            vt = graph.values[name]
            if tuple(t.shape) != vt.shape:
                raise coded_error(
                    "E0751",
                    f"input {name[1:]} has shape {list(t.shape)}; this plan was "
                    f"made for {list(vt.shape)}",
                    help="make a plan for these shapes: model.plan_for(...)",
                )
            env[name] = t
        # The model's own dict: slices name parameters and states apart, and a plain dict
        # lookup is what this loop does most.
        params, states = context._params, context.states
        with numerics_mode(self.model.numerics), torch.inference_mode():
            for item in self.items:
                args = [env[v] for v in item.inputs]
                if item.kind == "slice":
                    res = item.run(
                        *args,
                        *[params[p] for p in item.parameters],
                        *[states[p] for p in item.states],
                    )
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
            return [
                env[o]
                if not o.startswith("@")
                else (states[o[1:]] if o[1:] in states else params[o[1:]]).clone()
                for o in graph.outputs
            ]

    def explain(self) -> str:
        header = (
            f"plan for {self.graph.model}.{self.entry} on {self.target.kind}"
            f" ({self.target.name or self.target.device}); margin "
            f"{self.options.margin:.0%}, measure={self.options.measure}"
            + (
                f", memory budget {self.options.memory} bytes"
                if self.options.memory is not None
                else ""
            )
            + (
                ""
                if self.captured or self.target.kind != "cuda"
                else "; timed for plan.run (host launches counted), not Captured"
            )
        )
        launch = pdl_text(self)
        return (
            explain_table(self.candidates, self.skipped, header)
            + collectives_text(self.graph, self.collective_seconds)
            + whole_text(self)
            + (f"\n{launch}" if launch else "")
        )

    def __repr__(self) -> str:
        return (
            f"Plan({self.graph.model}.{self.entry}: {len(self.regions)} backend regions, "
            f"{sum(1 for i in self.items if i.kind == 'slice')} generated slices)"
        )


def whole_text(plan: Plan) -> str:
    """``plan.explain()``'s line on the whole-run check of a plan for ``plan.run``
    (:func:`faster_whole`), or "" where there was none."""
    if plan.whole_seconds is None:
        return ""
    with_regions, without = plan.whole_seconds
    verdict = "the regions stay" if plan.regions else "the generated source runs alone"
    return (
        f"\nchecked whole by plan.run: {with_regions * 1e6:.1f} us a run with the regions "
        f"taken above, {without * 1e6:.1f} us with none; {verdict}"
    )


def collectives_text(graph: Graph, seconds: dict[int, float] | None = None) -> str:
    """The lines of ``plan.explain()`` that list a rank's collective steps (tensor
    parallelism, linnet.lang.passes.shard): each runs inside a generated slice, in order, with
    its time alone where the plan measured (``seconds`` by step)."""
    seconds = seconds or {}

    found = [(i, s) for i, s in enumerate(graph.steps) if s.op in COLLECTIVES]
    if not found:
        return ""
    tp = graph.config.get("tensor_parallel", {})
    timed = "each timed alone" if seconds else "not timed: measure=False"
    lines = [
        "",
        f"collectives of rank {tp.get('rank', '?')} of {tp.get('world', '?')} "
        f"(torch.distributed, in the generated slices; {timed}):",
    ]
    for i, s in found:
        vt = graph.values[s.results[0]]
        what = (
            s.attributes.get("kind") if s.op == "all_reduce" else f"axis {s.attributes.get('axis')}"
        )
        # The block it ends (the deepest call with a path around it): o_proj, down_proj...
        around = [c for c in graph.calls if c.start <= i < c.stop and c.path]
        path = (
            max(around, key=lambda c: c.depth).path
            if around
            else ("the entry's result" if s.results[0] in graph.outputs else "")
        )
        took = f"  {1e6 * seconds[i]:.1f} us" if i in seconds else ""
        lines.append(
            f"  step {i:4d}  {s.op} {what}  {vt.dtype}{list(vt.shape)}{took}"
            + (f"  [{path}]" if path else "")
            + (f"  ({s.loc})" if s.loc else "")
        )
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

    ``then(inputs, outputs)``, where given, runs after the plan inside the graph (eagerly on
    the first call), on the graph's input buffers and the plan's outputs; what it returns
    is the step's outputs instead, not copied (read them before the next replay, or copy
    them on the stream). It may write the next step's inputs into those buffers (greedy
    decoding's token and position: :func:`linnet.torch.greedy.greedy_next`); :meth:`again`
    then replays without copying any input in. Like a backend's execute, it must not
    synchronise or copy to the host (allocations come from the graph's own pool).

    >>> step = Captured(plan, model.context_for(plan))              # doctest: +SKIP
    >>> logits, = step([token, torch.tensor([pos], dtype=torch.int32)])  # doctest: +SKIP
    """

    def __init__(
        self,
        plan: Plan,
        context: Context,
        pdl: int | None = None,
        then: Callable[[list[torch.Tensor], list[Any]], list[torch.Tensor]] | None = None,
    ):
        if plan.device.type != "cuda":
            raise coded_error(
                "E0750",
                f"Captured replays a CUDA graph, but this plan runs on {plan.device}",
                help="run plan.run(inputs, context) on the CPU, or "
                "load the model with device='cuda'",
            )
        self.plan = plan
        self.context = context
        self.pdl = plan.pdl if pdl is None else _launch_mode(pdl)
        self.then = then
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
                if self.then is not None:
                    outputs = list(self.then(static, outputs))
            self.static_inputs, self.calls = static, 1
            return outputs
        self._load(inputs)
        return self._replay()

    def again(self, known: Sequence[torch.Tensor | None] = ()) -> list[torch.Tensor]:
        """Replays on what the graph's input buffers hold now (what ``then`` wrote at the
        last call) without copying any input in. ``known`` gives, in the entry's input
        order, the host's copy of inputs the host knows (None for others; positions, say),
        for the executables' ``prepare`` (``context.host_inputs``): they must equal what the
        buffers hold. E0766 before a first call, which makes the buffers.

        >>> step = Captured(plan, context, then=greedy)                   # doctest: +SKIP
        >>> step([token, pos]); step.again([None, pos + 1])               # doctest: +SKIP
        """
        if self.calls == 0:
            raise coded_error(
                "E0766",
                "Captured.again replays on the inputs a first call gave, but it has not "
                "been called yet",
                help="call it once with the entry's inputs: step([token, pos])",
            )
        known = list(known)
        if known and len(known) != len(self.static_inputs):
            raise coded_error(
                "E0720",
                f"Captured.again's known lists the entry's inputs in order: "
                f"`{self.plan.entry}` takes {len(self.static_inputs)}, got {len(known)}",
                help="give None for each input the host does not know, e.g. [None, pos]",
            )
        with torch.inference_mode():
            self.context.host_inputs = host_inputs(self.plan.graph, known)
            return self._replay()

    def _replay(self) -> list[torch.Tensor]:
        self.calls += 1
        names = self.plan.graph.inputs
        self.context.inputs = dict(zip(names, self.static_inputs))
        if self.graph is None:
            self._capture()
        prepare_all(self.plan, self.context, "E0757")
        assert self.graph is not None
        self.graph.replay()
        if self.then is not None:
            return list(self.static_outputs)
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_outputs]

    def _load(self, inputs: Sequence[torch.Tensor]) -> None:
        """Copy ``inputs`` into the graph's input buffers, without waiting for the device."""
        if len(inputs) != len(self.static_inputs):
            raise coded_error(
                "E0720",
                f"entry `{self.plan.entry}` takes {len(self.static_inputs)} "
                f"inputs, got {len(inputs)}",
            )
        for i, (dst, src) in enumerate(zip(self.static_inputs, inputs)):
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise coded_error(
                    "E0752",
                    f"Captured was captured for inputs "
                    f"{[(list(t.shape), str(t.dtype)) for t in self.static_inputs]}; "
                    f"got {[(list(t.shape), str(t.dtype)) for t in inputs]}",
                    help="make a plan and a Captured for each input shape and dtype",
                )
            if src.device.type != "cpu":
                dst.copy_(src)
                continue
            if i not in self._staging:
                self._staging[i] = (
                    torch.empty(src.shape, dtype=src.dtype, pin_memory=True),
                    torch.cuda.Event(),
                )
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
                if self.then is not None:
                    self.static_outputs = self.then(self.static_inputs, list(self.static_outputs))
        except Exception as exc:
            raise coded_error(
                "E0753",
                f"the plan could not be captured as a CUDA graph: {exc}",
                help="a backend's execute must not allocate, synchronise or copy to "
                "the host; see `plan.explain()` for which backends run",
            ) from exc
        self.graph = graph


def _launch_mode(pdl: Any) -> int:
    """``pdl`` if it is a launch mode of Linnet's kernels, else error E0759."""
    if isinstance(pdl, bool) or pdl not in MODES:
        raise coded_error(
            "E0759",
            f"pdl={pdl!r} is not a launch mode of Linnet's kernels",
            help="0 off, 1 early, 2 late, 3 by grid, 4 late and 5 early with "
            "prefetching, or None for the plan's choice (plan.pdl)",
        )
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
    what = item.label[len(backend) :].strip() if item.label.startswith(backend) else item.label
    return coded_error(
        code,
        f"backend `{backend}`'s executable for {what} raised in "
        f"{method}: {type(exc).__name__}: {exc}",
        help=f"it passed a check run when the plan was made; plan again without "
        f"`{backend}` (plan_for(..., backends=[...])) and report this to its "
        "authors",
    )


def host_inputs(graph: Graph, inputs: Sequence[Any]) -> dict[str, torch.Tensor]:
    """The entry inputs given as CPU tensors, by graph value name (see Context.host_inputs)."""
    return {
        name: t
        for name, t in zip(graph.inputs, inputs)
        if isinstance(t, torch.Tensor) and t.device.type == "cpu"
    }


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
        line = (
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {what}"
        )
        if self.sink is not None:
            self.sink(line)
        elif self.tty:
            print("\r" + line[:110].ljust(110), end="", file=sys.stderr, flush=True)
            if self.done == self.total:
                print(file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
