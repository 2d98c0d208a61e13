"""Graph passes, each a function Graph -> Graph run in a listed order after lowering."""

from __future__ import annotations

from .graph import Graph


def hoist_invariants(graph: Graph) -> Graph:
    """Move steps that depend only on the entry's inputs and constants to the front.

    Rope's frequency table and angles are the same for every layer: computed once up front,
    they stop making layer 0 look different from the others (so every layer's slice has one
    kind and is compiled once) and are not recomputed per layer.
    """
    invariant: set[str] = set(graph.inputs)
    hoisted: list[int] = []
    for i, step in enumerate(graph.steps):
        if step.op == "scatter" or not step.results:
            continue
        if all(o in invariant for o in step.operands):
            hoisted.append(i)
            invariant.update(step.results)
    if not hoisted:
        return graph
    hoisted_set = set(hoisted)
    kept = [i for i in range(len(graph.steps)) if i not in hoisted_set]
    order = hoisted + kept
    new_index = {old: new for new, old in enumerate(order)}
    offset = len(hoisted)
    kept_before = [0] * (len(graph.steps) + 1)
    for i in range(len(graph.steps)):
        kept_before[i + 1] = kept_before[i] + (0 if i in hoisted_set else 1)
    for call in graph.calls:
        inside = [i for i in range(call.start, call.stop) if i not in hoisted_set]
        if inside:
            call.start, call.stop = new_index[inside[0]], new_index[inside[-1]] + 1
        else:
            call.start = call.stop = offset + kept_before[call.start]
    # The entry's own call spans everything.
    for call in graph.calls:
        if call.kind == "entry":
            call.start = 0
    graph.steps = [graph.steps[i] for i in order]
    return graph


PASSES = [hoist_invariants]


def run_passes(graph: Graph) -> Graph:
    for p in PASSES:
        graph = p(graph)
    return graph
