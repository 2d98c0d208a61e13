"""The stage ``hoist``: loop-invariant steps out of the layers
(:data:`linnet.lang.pipeline.STAGES` lists the order the stages run in after lowering).

>>> from linnet.lang.ir.graph import Graph
>>> hoist_invariants(Graph("e", "m")).steps
[]
"""

from __future__ import annotations

from linnet.lang.ir.graph import Graph


def hoist_invariants(graph: Graph) -> Graph:
    """Move steps that depend only on the entry's inputs and constants to the front.

    Rope's frequency table and angles are the same for every layer: computed once up front,
    they stop making layer 0 look different from the others (so every layer's slice has one
    kind and is compiled once) and are not recomputed per layer.
    """
    # The iterations of repeated blocks (lowering marks them; their nested calls lie inside).
    repeated = [c for c in graph.calls if c.iteration is not None]
    in_repeated = [False] * len(graph.steps)
    for c in repeated:
        for i in range(c.start, c.stop):
            in_repeated[i] = True
    if not repeated:
        return graph
    # Hoisted steps go just before the first layer; they may read what ran before it.
    first = min(c.start for c in repeated)
    # Invariant: made from the entry's inputs and constants alone (no parameter, no state).
    invariant: set[str] = set(graph.inputs)
    hoisted: list[int] = []
    for i, step in enumerate(graph.steps):
        if step.op == "scatter" or not step.results:
            continue
        if not all(o in invariant for o in step.operands):
            continue
        invariant.update(step.results)
        # Only code inside repeated blocks (layers) moves: elsewhere it runs once anyway.
        if i >= first and in_repeated[i]:
            hoisted.append(i)
    if not hoisted:
        return graph
    hoisted_set = set(hoisted)
    kept = [i for i in range(len(graph.steps)) if i not in hoisted_set]
    order = kept[:first] + hoisted + kept[first:]
    new_index = {old: new for new, old in enumerate(order)}
    kept_before = [0] * (len(graph.steps) + 1)
    for i in range(len(graph.steps)):
        kept_before[i + 1] = kept_before[i] + (0 if i in hoisted_set else 1)
    for call in graph.calls:
        inside = [i for i in range(call.start, call.stop) if i not in hoisted_set]
        if call.kind == "entry":
            call.start, call.stop = 0, len(graph.steps)
        elif inside:
            call.start, call.stop = new_index[inside[0]], new_index[inside[-1]] + 1
            if call.start >= first and call.start < first + len(hoisted):
                call.start = first + len(hoisted)
        else:
            pos = kept_before[call.start]
            call.start = call.stop = pos + (len(hoisted) if pos >= first else 0)
    graph.steps = [graph.steps[i] for i in order]
    return graph
