"""Compiling an entry, written down once: the typed compile options and the stages of
lowering, in order.

**Options.** :class:`Numerics` is the one definition of the ``numerics`` option ("exact":
every op as its body says, f32 matmuls in full f32; "fast": std ops' fused calls, kernels
launched, TF32 matmuls). :meth:`Numerics.parse` validates a user's value once, with E0713,
for every entry point: ``load`` in both runtimes, ``emit_torch``, ``emit_jax`` and the
CLI's ``--numerics``. It is a ``str`` enum, so ``Numerics.FAST == "fast"`` and the
emitters' string comparisons keep working.

**Stages.** Lowering an entry is the stage ``lower`` (a program and input shapes to a graph,
:func:`linnet.lang.check.lowering.lower`), then :data:`STAGES`, each a :class:`Stage` (a
name and a function Graph -> Graph) run by :func:`run_stages`. ``lower_grad`` adds the stage
``grad`` (:func:`run_stage`). After every stage the graph is verified
(:func:`linnet.lang.ir.verify.verify`, under ``LINNET_DEBUG`` and in the test suites, as
before), and under ``LINNET_DEBUG=stages`` each stage's graph is printed to stderr in the
text format ``linnet graph`` prints; ``linnet graph --stages`` prints them too
(:func:`watch`).

>>> Numerics.parse("fast") is Numerics.FAST, Numerics.FAST == "fast"
(True, True)
>>> [s.name for s in STAGES]
['hoist']
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum
from typing import Any, NamedTuple

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.ir import verify as _verify
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.hoist import hoist_invariants


class Numerics(StrEnum):
    """The ``numerics`` compile option. ``str(Numerics.FAST)`` is ``"fast"``.

    >>> Numerics.EXACT == "exact", [n.value for n in Numerics]
    (True, ['exact', 'fast'])
    """

    EXACT = "exact"
    FAST = "fast"

    @classmethod
    def parse(cls, value: Any) -> Numerics:
        """``value`` as a :class:`Numerics`, or E0713 (the one check of a user's value).

        >>> Numerics.parse("exact")
        <Numerics.EXACT: 'exact'>
        >>> Numerics.parse("fastest")
        Traceback (most recent call last):
        ...
        linnet.lang.diagnostics.core.LinnetError: error[E0713]: numerics must be 'exact' or 'fast', not 'fastest'...
        """
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        raise coded_error(
            "E0713",
            f"numerics must be 'exact' or 'fast', not {value!r}",
            help="numerics='exact' runs every op as its body says (f32 matmuls "
            "in full f32); numerics='fast' uses fused calls, kernels and "
            "TF32 matmuls",
        )


NUMERICS: tuple[str, ...] = tuple(n.value for n in Numerics)
"""The values of :class:`Numerics`, as strings (``("exact", "fast")``)."""


class Stage(NamedTuple):
    """One stage of lowering: its name (what ``--stages`` prints and an E092x verifier
    error names) and its function, Graph -> Graph (it may change the graph in place).

    >>> Stage("hoist", hoist_invariants).name
    'hoist'
    """

    name: str
    run: Callable[[Graph], Graph]


STAGES: tuple[Stage, ...] = (
    # Loop-invariant steps (rope's tables) out of the layers, so every layer's slice is alike.
    Stage("hoist", hoist_invariants),
)
"""The stages every lowered entry goes through after ``lower``, in order."""

# The graphs `watch` collects: (stage name, a copy of the graph after it), innermost last.
_WATCHERS: ContextVar[tuple[list[tuple[str, Graph]], ...]] = ContextVar("_WATCHERS", default=())


def debug_stages() -> bool:
    """Whether ``LINNET_DEBUG`` asks for the stages' graphs (``stages``, alone or in a
    comma-separated list).

    >>> isinstance(debug_stages(), bool)
    True
    """
    return "stages" in os.environ.get("LINNET_DEBUG", "").replace(" ", "").split(",")


@contextmanager
def watch() -> Iterator[list[tuple[str, Graph]]]:
    """Collect every stage's graph lowered inside the block, as (stage name, graph) in
    order (what ``linnet graph --stages`` prints).

    >>> with watch() as seen:
    ...     _ = run_stages(Graph("e", "m"))
    >>> [name for name, _ in seen]
    ['lower', 'hoist']
    """
    seen: list[tuple[str, Graph]] = []
    token = _WATCHERS.set((*_WATCHERS.get(), seen))
    try:
        yield seen
    finally:
        _WATCHERS.reset(token)


def stage_text(name: str, graph: Graph) -> str:
    """A stage's graph as ``LINNET_DEBUG=stages`` and ``linnet graph --stages`` print it:
    a header line, then the graph's text format (:meth:`Graph.summary`).

    >>> stage_text("hoist", Graph("e", "m")).splitlines()[0]
    '# stage hoist: m.e'
    """
    return f"# stage {name}: {graph.model}.{graph.entry}\n{graph.summary()}"


def _after(name: str, graph: Graph, label: str) -> None:
    """What follows every stage: verify, then show the graph to whoever asked."""
    if _verify.checked():
        _verify.verify(graph, label)
    watchers = _WATCHERS.get()
    if watchers:
        kept = copy.deepcopy(graph)  # later stages change the graph in place
        for seen in watchers:
            seen.append((name, kept))
    if debug_stages():
        print(stage_text(name, graph), file=sys.stderr)


def run_stage(stage: Stage, graph: Graph) -> Graph:
    """Run one stage on ``graph``, then verify and show its result (see the module).

    >>> run_stage(Stage("nothing", lambda g: g), Graph("e", "m")).entry
    'e'
    """
    graph = stage.run(graph)
    _after(stage.name, graph, f"stage {stage.name}")
    return graph


def run_stages(graph: Graph, stages: tuple[Stage, ...] | None = None) -> Graph:
    """Run ``stages`` (default :data:`STAGES`) in order on a graph ``lower`` just made; the
    graph is verified and shown as lowering made it (stage ``lower``) and after each.

    >>> run_stages(Graph("e", "m")).model
    'm'
    """
    _after("lower", graph, "lowering")
    for stage in STAGES if stages is None else stages:
        graph = run_stage(stage, graph)
    return graph
