"""Cutting an entry's graph into slices: contiguous step ranges run as one function each.

By default each repeated block's call (`model.layers.3`) is a slice and the steps between
them are glue slices. Slices whose steps are the same up to parameter paths and value names
share a **kind**: generated code has one function per kind (one for all 32 layers), so that
`torch.compile` compiles it once. The planner cuts slices around the regions it gives to
backends with :func:`slice_range`.

>>> # tests/test_lowering.py (every layer is one slice kind) cuts the Llama graph
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.ir.graph import Call, Graph

_REPEATED = re.compile(r"(^|\.)\d+(\.|$)")


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
    kind: str = ""
    steps: list[int] = field(default_factory=list)  # the steps run, in order (may skip some)

    def relative(self, path: str) -> str:
        return path[len(self.prefix):] if self.prefix and path.startswith(self.prefix) else path


def default_cuts(graph: Graph) -> list[tuple[int, int, str, str]]:
    """(start, stop, name, prefix) for each default slice, covering every step once."""
    chosen: list[Call] = []
    for call in sorted(graph.calls, key=lambda c: (c.start, -c.stop)):
        if call.kind not in ("fn", "op") or not call.path or not _REPEATED.search(call.path):
            continue
        if call.start == call.stop:
            continue
        if chosen and call.start < chosen[-1].stop:
            continue  # nested inside a chosen call
        # Take the outermost call of each repeated block (the layer, not its q_proj).
        if not _is_block_root(call):
            continue
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


def _is_block_root(call: Call) -> bool:
    # A block method called on the repeated block itself: its path ends in the index.
    return bool(re.search(r"\.\d+$", call.path)) and "." in call.callee.rsplit("::", 1)[-1]


def _identifier(text: str) -> str:
    out = re.sub(r"[^0-9A-Za-z_]", "_", text)
    out = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", out).lower()
    return out.strip("_") or "slice"


def slice_range(graph: Graph, start: int, stop: int, name: str, prefix: str = "") -> Slice:
    """Describe steps ``start..stop`` as a slice: its inputs, outputs, parameters and kind."""
    return slice_steps(graph, list(range(start, stop)), name, prefix)


def slice_steps(graph: Graph, steps: list[int], name: str, prefix: str | None = None) -> Slice:
    """A slice of the given steps (in order; a plan leaves out the ones backends run).
    ``prefix=None`` derives it from the parameters (`model.layers.3.` when all share it)."""
    start = steps[0] if steps else 0
    stop = steps[-1] + 1 if steps else 0
    inside = set(steps)
    made_inside_set: set[str] = set()
    for i in steps:
        made_inside_set.update(graph.steps[i].results)
    used_after: set[str] = set(graph.outputs)
    for i, step in enumerate(graph.steps):
        if i not in inside:
            used_after.update(step.operands)
    sl = Slice(start, stop, name, prefix or "", steps=list(steps))
    seen: set[str] = set()
    made_inside: list[str] = []
    for step in (graph.steps[i] for i in steps):
        for o in step.operands:
            if o in seen:
                continue
            seen.add(o)
            if o.startswith("@"):
                path = o[1:]
                (sl.states if path in graph.states else sl.parameters).append(path)
            elif o not in made_inside_set:
                sl.inputs.append(o)
        made_inside.extend(step.results)
    sl.outputs = [r for r in made_inside if r in used_after]
    if prefix is None:
        sl.prefix = common_prefix(sl.parameters + sl.states)
    sl.kind = slice_kind(graph, sl)
    return sl


def common_prefix(paths: list[str]) -> str:
    """The repeated-block path all ``paths`` share (`model.layers.3.`), or ''."""
    if not paths:
        return ""
    best = ""
    for m in _REPEATED_PREFIX.finditer(paths[0]):
        candidate = paths[0][:m.end()]
        if all(p.startswith(candidate) for p in paths):
            best = candidate
    return best


_REPEATED_PREFIX = re.compile(r"\.\d+\.")


def slice_kind(graph: Graph, sl: Slice) -> str:
    """A hash of the slice's computation with value names and parameter prefixes abstracted."""
    names: dict[str, str] = {}
    for i, v in enumerate(sl.inputs):
        names[v] = f"in{i}"

    def ref(o: str) -> str:
        if o.startswith("@"):
            return "@" + sl.relative(o[1:])
        if o not in names:
            names[o] = f"v{len(names)}"
        return names[o]

    parts: list[Any] = []
    for v in sl.inputs:
        vt = graph.values[v]
        parts.append([list(vt.shape), vt.dtype])
    for step in (graph.steps[i] for i in sl.steps):
        attrs = dict(step.attributes)
        if "path" in attrs:
            attrs["path"] = sl.relative(attrs["path"])
        parts.append([step.op, [ref(o) for o in step.operands], [ref(r) for r in step.results],
                      attrs, [[list(graph.values[r].shape), graph.values[r].dtype]
                              for r in step.results]])
    parts.append([ref(o) for o in sl.outputs])
    for p in sl.parameters + sl.states:
        table = graph.states if p in graph.states else graph.parameters
        parts.append([sl.relative(p), list(table[p].shape), table[p].dtype])
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cut(graph: Graph, cuts: list[tuple[int, int, str, str]] | None = None) -> list[Slice]:
    """Slices for ``cuts`` (default: :func:`default_cuts`)."""
    return [slice_range(graph, a, b, n, p) for a, b, n, p in (cuts or default_cuts(graph))]
