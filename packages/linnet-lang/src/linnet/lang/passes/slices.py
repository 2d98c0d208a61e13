"""Cutting an entry's graph into slices: contiguous step ranges run as one function each.

By default each iteration of a repeated block (the call lowering marks with
``Call.iteration``, `model.layers.3`) is a slice and the steps between them are glue slices.
Slices whose steps are the same up to parameter paths and value names share a **kind** (the
fingerprint of :func:`linnet.lang.ir.stepsets.fingerprint`, the same one a plan's regions
carry): generated code has one function per kind (one for all 32 layers), so that
`torch.compile` compiles it once. The planner cuts slices around the regions it gives to
backends with :func:`slice_steps`.

>>> # [(s.name, s.prefix) for s in cut(graph)][:2]  # [('glue_0', ''), ('forward', 'model.layers.0.')]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from linnet.lang.ir.graph import Call, Graph
from linnet.lang.ir.stepsets import block_prefix, fingerprint, step_set


@dataclass
class Slice:
    start: int
    stop: int
    name: str
    prefix: str  # parameter paths inside the slice are relative to this ("model.layers.0.")
    inputs: list[str] = field(default_factory=list)  # SSA values made before the slice
    outputs: list[str] = field(default_factory=list)  # values used after it (or entry outputs)
    parameters: list[str] = field(default_factory=list)  # absolute paths read
    states: list[str] = field(default_factory=list)  # absolute paths read or written
    kind: str = ""  # the fingerprint of its steps (ir.stepsets.fingerprint)
    steps: list[int] = field(default_factory=list)  # the steps run, in order (may skip some)

    def relative(self, path: str) -> str:
        return path[len(self.prefix) :] if self.prefix and path.startswith(self.prefix) else path


def default_cuts(graph: Graph) -> list[tuple[int, int, str, str]]:
    """(start, stop, name, prefix) for each default slice, covering every step once."""
    chosen: list[Call] = []
    for call in sorted(graph.calls, key=lambda c: (c.start, -c.stop)):
        # An iteration of a repeated block (the layer, not its q_proj): lowering records it.
        if call.iteration is None or call.kind not in ("fn", "op") or call.start == call.stop:
            continue
        if chosen and call.start < chosen[-1].stop:
            continue  # nested inside a chosen call
        chosen.append(call)
    cuts: list[tuple[int, int, str, str]] = []
    pos = 0
    glue = 0
    for call in chosen:
        if call.start > pos:
            cuts.append((pos, call.start, f"glue_{glue}", ""))
            glue += 1
        method = call.callee.rsplit("::", 1)[-1]
        cuts.append((call.start, call.stop, _identifier(method), call.path + "."))
        pos = call.stop
    if pos < len(graph.steps) or not cuts:
        cuts.append((pos, len(graph.steps), f"glue_{glue}", ""))
    return cuts


def _identifier(text: str) -> str:
    out = re.sub(r"[^0-9A-Za-z_]", "_", text)
    out = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", out).lower()
    return out.strip("_") or "slice"


def slice_range(graph: Graph, start: int, stop: int, name: str, prefix: str = "") -> Slice:
    """Describe steps ``start..stop`` as a slice: its inputs, outputs, parameters and kind."""
    return slice_steps(graph, list(range(start, stop)), name, prefix)


def slice_steps(graph: Graph, steps: list[int], name: str, prefix: str | None = None) -> Slice:
    """A slice of the given steps (in order; a plan leaves out the ones backends run).
    ``prefix=None`` derives it from the parameters (`model.layers.3.` when all lie in one
    iteration of a repeated block). Inputs, outputs, parameters, states and the kind come
    from :mod:`linnet.lang.ir.stepsets`, as a backend's region over the same steps does.

    >>> # slice_steps(graph, list(range(call.start, call.stop)), "layer").kind
    """
    start = steps[0] if steps else 0
    stop = steps[-1] + 1 if steps else 0
    analysed = step_set(graph, steps)
    sl = Slice(
        start,
        stop,
        name,
        prefix or "",
        inputs=list(analysed.inputs),
        outputs=list(analysed.outputs),
        parameters=list(analysed.parameters),
        states=list(analysed.states),
        steps=list(steps),
    )
    if prefix is None:
        sl.prefix = block_prefix(graph, sl.parameters + sl.states)
    sl.kind = fingerprint(graph, analysed)
    return sl


def slice_kind(graph: Graph, sl: Slice) -> str:
    """The slice's fingerprint (:func:`linnet.lang.ir.stepsets.fingerprint` of its steps):
    what it computes with value names and parameter paths abstracted. A region of a plan
    over the same steps has the same ``kind``.

    >>> # slice_kind(graph, sl) == sl.kind
    """
    return fingerprint(graph, step_set(graph, sl.steps or range(sl.start, sl.stop)))


def cut(graph: Graph, cuts: list[tuple[int, int, str, str]] | None = None) -> list[Slice]:
    """Slices for ``cuts`` (default: :func:`default_cuts`)."""
    return [slice_range(graph, a, b, n, p) for a, b, n, p in (cuts or default_cuts(graph))]
