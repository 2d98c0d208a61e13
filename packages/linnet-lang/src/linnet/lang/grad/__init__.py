"""Reverse-mode differentiation as a graph-to-graph transform (issue 18).

* :data:`~linnet.lang.grad.rules.VJP_RULES`: one vector-Jacobian product per primitive.
* :func:`~linnet.lang.grad.reverse.differentiate`: a lowered entry's graph -> the graph of
  its outputs and its gradients with respect to chosen inputs and parameters.
* :func:`lower_grad`: lower an entry and differentiate it, with the ``grad`` clauses of the
  ops it calls used as their backward (each lowered once per call).

Every emitter (generated PyTorch, the interpreters, and future JAX, ONNX or StableHLO
targets) runs a gradient graph with no code of its own: it is an ordinary graph.

>>> from linnet.lang import Program
>>> prog = Program.from_text('''
... model M { entry run(x: Tensor[3; f32]) -> f32 {
...     let s = sum[i](x[i] * x[i])
...     return s } }''')
>>> g = lower_grad(prog, "run", {"x": [3]}, wrt=["x"])
>>> g.outputs
['%s', '%d_x']
"""

from __future__ import annotations

from typing import Any

from linnet.lang.grad.reverse import SEEDS, ClauseTemplate, differentiate, resolve_wrt
from linnet.lang.grad.rules import VJP_RULES, Tape
from linnet.lang.ir.graph import Graph
from linnet.lang.pipeline import GRAD, Stage, run_stage
from linnet.lang.syntax.program import Program

__all__ = [
    "SEEDS",
    "VJP_RULES",
    "ClauseTemplate",
    "Tape",
    "differentiate",
    "has_grad_clauses",
    "lower_grad",
    "resolve_wrt",
]


def has_grad_clauses(program: Program) -> bool:
    """Whether any op or function of the program's modules has a ``grad`` clause.

    >>> has_grad_clauses(Program.from_text("pub fn f(x: f32) -> f32 { return x }"))
    False
    """
    import linnet.lang.syntax.tree as A

    for module in program.modules.values():
        for item in module.items:
            funcs = item.methods if isinstance(item, A.BlockDecl) else [item]
            if any(isinstance(f, A.FuncDecl) and f.grad is not None for f in funcs):
                return True
    return False


def lower_grad(
    program: Program,
    entry: str,
    inputs: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    weights: dict[str, tuple] | None = None,
    model: str | None = None,
    wrt: list[str] | str = "params",
    seed: str = "scalar",
    check: bool = True,
    clauses: bool = True,
) -> Graph:
    """Lower ``entry`` (as :func:`linnet.lang.lower` does) and differentiate it.

    ``wrt``: input names and parameter paths, or ``"params"`` (every float parameter).
    ``seed``: ``"scalar"`` (the entry returns a loss) or ``"cotangents"`` (one cotangent
    input per float output). ``clauses=False`` differentiates every op by its body, even
    where it has a ``grad`` clause (to compare the two).

    >>> # lower_grad(Program.from_file("model.linnet"), "loss", {"tokens": [1, 8]}, cfg)
    """
    from linnet.lang.check.lowering import lower

    # Recording clauses evaluates every layer (no instantiation): only when there is one.
    templates: dict[int, ClauseTemplate] | None = (
        {} if clauses and has_grad_clauses(program) else None
    )
    graph = lower(
        program, entry, inputs, config, weights, model, check=check, grad_clauses=templates
    )
    # The stage GRAD after lowering's (linnet.lang.pipeline.ORDER): verified and shown like them.
    return run_stage(Stage(GRAD, lambda g: differentiate(g, wrt, seed, templates)), graph)
