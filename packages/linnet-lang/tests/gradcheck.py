"""Checking a gradient graph against torch.autograd (a test helper; not shipped).

The reference is autograd through linnet-runtime-torch's interpreter: each of its rules is a
primitive's definition written with torch, so autograd of a forward graph run by it is what
PyTorch says the gradient of that graph is. The gradient graph (the reverse pass's output)
is run by the same interpreter, without autograd.

:func:`widen` turns every floating-point type of a graph into f64 first, so that the
comparison tests the VJP rules' mathematics, not the rounding of f16 and bf16.
"""

from __future__ import annotations

import copy

import numpy as np
from linnet.lang.grad import differentiate
from linnet.lang.ir.graph import Graph, ValueType

FLOATS = {"f16", "bf16", "f32", "f64"}


def widen(graph: Graph) -> Graph:
    """A copy of ``graph`` computing in f64 wherever it computes in a float type."""
    g = copy.deepcopy(graph)

    def vt(v: ValueType) -> ValueType:
        return ValueType(v.shape, "f64") if v.dtype in FLOATS else v

    g.values = {k: vt(v) for k, v in g.values.items()}
    g.parameters = {k: vt(v) for k, v in g.parameters.items()}
    g.states = {k: vt(v) for k, v in g.states.items()}
    for step in g.steps:
        for key in ("dtype", "accumulate"):
            if step.attributes.get(key) in FLOATS:
                step.attributes[key] = "f64"
    return g


def autograd_reference(
    graph: Graph, wrt: list[str], inputs: list, params: dict, cotangents: list
) -> tuple[list, list]:
    """(outputs, gradients) of ``graph`` by torch.autograd through the interpreter;
    ``wrt`` are graph refs (``%x``, ``@path``); ``cotangents`` one per float output."""
    import torch
    from linnet.torch.interpreter import run_graph

    leaves = {}
    ins = []
    for ref, x in zip(graph.inputs, inputs):
        if ref in wrt:
            x = x.detach().clone().requires_grad_(True)
            leaves[ref] = x
        ins.append(x)
    ps = {}
    for path, x in params.items():
        if "@" + path in wrt:
            x = x.detach().clone().requires_grad_(True)
            leaves["@" + path] = x
        ps[path] = x
    with torch.enable_grad():
        outs = run_graph(graph, ins, ps, {k: v.clone() for k, v in _states(graph).items()})
        floats = [(o, c) for o, c in zip(outs, cotangents) if o.is_floating_point()]
        total = sum(
            ((o * c).sum() for o, c in floats if o.requires_grad),
            torch.zeros((), dtype=torch.float64),
        )
        targets = [leaves[r] for r in wrt]
        grads = (
            torch.autograd.grad(total, targets, allow_unused=True)
            if total.requires_grad
            else [None] * len(targets)
        )
    grads = [torch.zeros_like(t) if d is None else d for t, d in zip(targets, grads)]
    return [o.detach() for o in outs], [d.detach() for d in grads]


def _states(graph: Graph) -> dict:
    import torch
    from linnet.torch.interpreter import DTYPES

    return {p: torch.zeros(v.shape, dtype=DTYPES[v.dtype]) for p, v in graph.states.items()}


def check_against_autograd(
    graph: Graph,
    wrt: list[str],
    inputs: list,
    params: dict,
    rtol: float = 1e-9,
    atol: float = 1e-9,
    clauses: dict | None = None,
    seed: int = 0,
) -> Graph:
    """Differentiate ``graph`` (seed: cotangents) and compare with autograd; returns the
    gradient graph. ``inputs`` and ``params`` are torch tensors of the graph's types."""
    import torch
    from linnet.torch.interpreter import DTYPES, run_graph

    grad_graph = differentiate(graph, wrt, "cotangents", clauses)
    rng = np.random.default_rng(seed)
    cotangents = []
    for o in graph.outputs:
        v = graph.values[o]
        if v.dtype in FLOATS:
            cotangents.append(torch.tensor(rng.standard_normal(v.shape), dtype=DTYPES[v.dtype]))
    want_out, want_grads = autograd_reference(graph, wrt, inputs, params, cotangents)
    got = run_graph(
        grad_graph,
        list(inputs) + cotangents,
        params,
        {k: v.clone() for k, v in _states(graph).items()},
    )
    n = len(graph.outputs)
    for a, b in zip(got[:n], want_out):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
    for ref, a, b in zip(wrt, got[n:], want_grads):
        torch.testing.assert_close(
            a,
            b,
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            msg=lambda m, ref=ref: f"gradient for {ref}: {m}",
        )
    return grad_graph
