"""linnet.lang.ir.stepsets read through an index (``indexed``), as plans analyse thousands of
candidate regions: every answer equals the one read from the whole graph."""

from __future__ import annotations

import random

from linnet.lang.ir.stepsets import (
    StepSetError,
    block_prefix,
    check_runs_at_first,
    fingerprint,
    indexed,
    made_before,
    read_outside,
    step_set,
)
from test_spans import llama_decode


def answers(graph, sets):
    """Every analysis of each step set, errors as their messages."""
    out = []
    for steps in sets:
        s = step_set(graph, steps)
        try:
            check_runs_at_first(graph, steps)
            runs = "runs"
        except StepSetError as exc:
            runs = str(exc)
        exists = made_before(graph, steps[0])
        out.append(
            (
                s,
                fingerprint(graph, s),
                runs,
                block_prefix(graph, s.parameters + s.states),
                read_outside(graph, s.outputs, steps[0], steps[-1] + 1),
                [exists(v) for v in s.inputs],
            )
        )
    return out


def test_indexed_analyses_equal_the_whole_graphs():
    _, graph = llama_decode("std.models.llama", 8, NL=3)  # std's spans claimed
    rng = random.Random(0)
    n = len(graph.steps)
    sets = [list(range(c.start, c.stop)) for c in graph.calls if c.stop > c.start]
    # Steps apart (q, k and v, say) and sets that cannot run at their first step.
    sets += [sorted(rng.sample(range(n), rng.randint(1, 6))) for _ in range(300)]
    plain = answers(graph, sets)
    with indexed(graph):
        with indexed(graph):  # nested: one index
            inner = answers(graph, sets)
        assert answers(graph, sets) == plain
    assert inner == plain
    assert answers(graph, sets) == plain  # the index is gone with the block
    assert any(a[2] != "runs" for a in plain) and any(a[2] == "runs" for a in plain)
    assert any(a[3] for a in plain) and any(a[4] for a in plain)
