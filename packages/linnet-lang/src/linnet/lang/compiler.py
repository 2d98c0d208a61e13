"""Compiling an entry in one place: what the runtimes and the CLI call instead of assembling
the stages of :mod:`linnet.lang.pipeline` themselves.

:func:`compile_entry` runs, in the order :data:`linnet.lang.pipeline.ORDER` lists them:
``lower`` and :data:`~linnet.lang.pipeline.STAGES` (:func:`linnet.lang.check.lowering.lower`),
``grad`` where a :class:`Grad` is asked for (:func:`linnet.lang.grad.lower_grad`), the check
of the inputs' static bounds where asked (E0782: a prompt longer than the cache), the
caller's own stages (the torch runtime's ``shard``), then ``kernels``: the kernel instances
the graph launches, recorded under numerics "fast"
(:func:`linnet.lang.check.kernel_instances.with_kernels`) on a copy, so that the graph a
runtime caches and plans from launches nothing. A plan's stage ``spans`` is :func:`claim`.
Each stage is verified and shown as :mod:`linnet.lang.pipeline` says (``LINNET_DEBUG=stages``,
``linnet graph --stages``).

This module sits above ``check/`` and ``grad/`` (lowering runs the pipeline's stages, so the
pipeline itself cannot import lowering).

>>> from linnet.lang.syntax.program import Program
>>> prog = Program.from_text('''
... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
>>> out = compile_entry(prog, "run", {"x": [3]}, options=CompileOptions("fast"))
>>> out.graph.entry, out.emitted is not out.graph, out.clauses
('run', True, None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.lowering import lower
from linnet.lang.check.spans import claim_spans
from linnet.lang.grad import has_grad_clauses, lower_grad
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.bounds import check_static
from linnet.lang.pipeline import (
    KERNELS,
    SPANS,
    CompileOptions,
    Numerics,
    Stage,
    run_stage,
)
from linnet.lang.syntax.program import Program


@dataclass(frozen=True)
class Grad:
    """The gradient graph of an entry instead of the entry (the stage ``grad``): ``wrt``,
    input names and parameter paths or ``"params"``; ``seed``, ``"scalar"`` or
    ``"cotangents"`` (as :func:`linnet.lang.grad.lower_grad` takes them).

    >>> Grad(["x"]).seed
    'scalar'
    """

    wrt: list[str] | str = "params"
    seed: str = "scalar"


@dataclass(frozen=True)
class Compiled:
    """An entry compiled: ``graph``, after every stage but ``kernels`` (what a runtime
    caches, checks inputs against and plans from: it launches nothing); ``emitted``, what
    the emitters take (``graph`` with its kernel instances recorded under numerics "fast",
    else ``graph`` itself); ``clauses``, each call's ``grad`` clause by call index where they
    were recorded (a Pallas kernel's backward under ``jax.grad``), else None.

    >>> Compiled(Graph("e", "m"), Graph("e", "m")).clauses is None
    True
    """

    graph: Graph
    emitted: Graph
    clauses: dict[int, Any] | None = None


def compile_entry(
    program: Program,
    entry: str,
    inputs: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    weights: dict[str, tuple] | None = None,
    options: CompileOptions | None = None,
    *,
    model: str | None = None,
    check: bool = True,
    grad: Grad | None = None,
    clauses: bool = False,
    check_bounds: bool = False,
    stages: tuple[Stage, ...] = (),
    kernels: bool = True,
) -> Compiled:
    """Compile ``entry`` of ``program`` for inputs of these shapes (see the module).

    ``inputs``, ``config``, ``weights``, ``model`` and ``check`` are
    :func:`linnet.lang.check.lowering.lower`'s (``check=False`` where the program was
    checked already, as a runtime's ``load`` does). ``options``: the
    :class:`~linnet.lang.pipeline.CompileOptions` (default: exact numerics). ``grad``: the
    entry's gradient graph instead. ``clauses``: record each call's ``grad`` clause where the
    program has one (:attr:`Compiled.clauses`). ``check_bounds``: E0782 where an input
    cannot fit the entry's states (what the runtimes check before running). ``stages``: the
    caller's own stages, run after lowering's and before ``kernels``. ``kernels=False``
    records no kernel instance (an interpreter, or a graph that is only printed).

    >>> from linnet.lang.syntax.program import Program
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> f32 {
    ...     let s = sum[i](x[i] * x[i])
    ...     return s } }''')
    >>> compile_entry(prog, "run", {"x": [3]}, grad=Grad(["x"])).graph.outputs
    ['%s', '%d_x']
    """
    options = options if options is not None else CompileOptions()
    recorded: dict[int, Any] | None = None
    if grad is not None:
        graph = lower_grad(
            program,
            entry,
            inputs,
            config,
            weights,
            model,
            wrt=grad.wrt,
            seed=grad.seed,
            check=check,
        )
    else:
        # Recording clauses lowers every layer on its own: only where there is a clause.
        recorded = {} if clauses and has_grad_clauses(program) else None
        graph = lower(
            program, entry, inputs, config, weights, model, check=check, grad_clauses=recorded
        )
    if check_bounds:
        check_static(graph, entry)
    for stage in stages:
        graph = run_stage(stage, graph)
    emitted = graph
    if kernels and options.numerics == Numerics.FAST:
        emitted = run_stage(
            Stage(KERNELS, lambda g: with_kernels(g, program, options.numerics)), graph
        )
    return Compiled(graph, emitted, recorded)


def claim(graph: Graph, program: Program | None) -> Graph:
    """The stage ``spans``: a copy of ``graph`` with every span of a span op recorded as a
    call of it (the std library's span ops and ``program``'s own;
    :func:`linnet.lang.check.spans.claim_spans`), verified and shown as every stage is. A
    plan runs it on the graph it plans; ``graph`` itself is left as it is.

    >>> claim(Graph("e", "m"), None).calls
    []
    """
    return run_stage(Stage(SPANS, lambda g: claim_spans(g, program)), graph)


__all__ = ["Compiled", "Grad", "claim", "compile_entry"]
