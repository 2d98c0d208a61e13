"""Gradients on the torch runtime: ``model.value_and_grad`` and ``model.grad`` (issue 18).

The gradient is not taken by torch.autograd: linnet-lang's reverse pass
(:func:`linnet.lang.grad.lower_grad`) turns the entry into one graph computing its outputs
and the gradients, and that graph is emitted and run like any entry (generated source, or
the interpreter with ``interpret=True``), under ``torch.inference_mode``. Ops with a
``grad`` clause are differentiated by their clause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from linnet.lang import Graph
from linnet.lang.compiler import Grad, compile_entry
from linnet.lang.diagnostics.core import coded_error
from linnet.lang.emit.torch import emit_torch

import torch

from .home import import_source
from .inputs import check_inputs
from .interpreter import DTYPES, index_error, run_graph
from .options import numerics_mode

# `model` is a linnet.torch.model.Model (not imported: model.py imports this module).
Model = Any


@dataclass
class GradLowered:
    """A gradient graph and its generated module (None when the model interprets)."""

    graph: Graph
    module: ModuleType | None = None
    path: str = ""


def _wrt_key(wrt: Any) -> tuple[str, ...]:
    if isinstance(wrt, str):
        return (wrt,)
    if isinstance(wrt, list | tuple) and all(isinstance(w, str) for w in wrt):
        return tuple(wrt)
    raise coded_error(
        "E0805",
        f"wrt must be an input name, a parameter path, 'params', or a list "
        f"of them, not {type(wrt).__name__} {str(wrt)[:40]}",
        help="e.g. wrt='params' or wrt=['model.norm.weight', 'x']",
    )


def lowered_grad(
    model: Model, entry: str, inputs: Sequence[torch.Tensor], wrt: Any, seed: str
) -> GradLowered:
    """The gradient graph of ``entry`` for inputs like ``inputs`` (lowered and emitted once
    per shapes, ``wrt`` and seed)."""
    forward = model._checked(entry, inputs)  # E0720-E0722, E0780: the inputs are checked
    key = ("grad", entry, tuple((tuple(t.shape), t.dtype) for t in inputs), _wrt_key(wrt), seed)
    cache = model.__dict__.setdefault("_grad_lowered", {})
    if key in cache:
        return cache[key]
    method = model._entry_method(entry)
    shapes = {p.name: list(t.shape) for p, t in zip(method.params, inputs)}
    # The gradient graph's generated source runs every op's body (no kernel instance).
    graph = compile_entry(
        model.program,
        entry,
        shapes,
        model.config,
        model.weight_shapes,
        model.options,
        check=False,
        grad=Grad(list(_wrt_key(wrt)), seed),
        kernels=False,
    ).graph
    assert graph.inputs[: len(forward.inputs)] == forward.inputs
    lowered = GradLowered(graph)
    if not model.interpret:
        sources = {m.source.name: m.source.text for m in model.program.modules.values()}
        text = emit_torch(
            graph,
            sources,
            numerics=model.numerics,
            origin=model.program.root.source.name,
            device=str(model.options.device),
        )
        module = import_source(text, f"linnet_{graph.model.lower()}_{entry}_grad")
        lowered.module = module
        lowered.path = module.__file__ or ""
    cache[key] = lowered
    return lowered


def _cotangents(graph: Graph, forward_inputs: int, entry: str, given: Any) -> list[torch.Tensor]:
    wanted = graph.inputs[forward_inputs:]
    if given is None:
        given = []
    if isinstance(given, torch.Tensor):
        given = [given]
    if not isinstance(given, list | tuple) or len(given) != len(wanted):
        count = len(given) if isinstance(given, list | tuple) else type(given).__name__
        raise coded_error(
            "E0806",
            f"`{entry}` needs {len(wanted)} cotangent(s), one per float output, got {count}",
            help="pass cotangents=[d_out, ...]: tensors shaped like the outputs",
        )
    out = []
    for ref, t in zip(wanted, given):
        vt = graph.values[ref]
        if (
            not isinstance(t, torch.Tensor)
            or tuple(t.shape) != vt.shape
            or t.dtype != DTYPES[vt.dtype]
        ):
            have = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise coded_error(
                "E0807",
                f"the cotangent `{ref[1:]}` of `{entry}` must be "
                f"{vt.dtype}{list(vt.shape)}, got {have}",
                help="a cotangent has its output's shape and dtype",
            )
        out.append(t)
    return out


def value_and_grad(
    model: Model,
    entry: str,
    inputs: Any,
    wrt: Any = "params",
    cotangents: Any = None,
    context: Any = None,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """See :meth:`linnet.torch.model.Model.value_and_grad`."""
    if isinstance(inputs, dict):
        inputs = model._inputs(entry, [], dict(inputs))
    seed = "scalar" if cotangents is None else "cotangents"
    lowered = lowered_grad(model, entry, inputs, wrt, seed)
    graph = lowered.graph
    n_in = len(model._entry_method(entry).params)
    given = (
        list(inputs) + _cotangents(graph, n_in, entry, cotangents)
        if seed != "scalar"
        else list(inputs)
    )
    check_inputs(graph, given, entry)
    args = [t.to(model.device) for t in given]
    ctx = context if context is not None else model._context_for_graph(graph)
    with numerics_mode(model.numerics), torch.inference_mode():
        if model.interpret:
            outs = run_graph(graph, args, model.params, ctx.states, model.device)
        else:
            assert lowered.module is not None
            module = lowered.module
            fn = getattr(module, module.ENTRIES[entry].get("function", entry))
            try:
                outs = fn(*args, model.params, ctx.states)
            except IndexError as exc:
                raise index_error(entry, str(exc)) from None
    n_out = len(graph.outputs) - len(_targets(graph, wrt))
    values = outs[:n_out]
    names = _names(graph, wrt)
    grads = dict(zip(names, outs[n_out:]))
    return (values[0] if len(values) == 1 else tuple(values)), grads


def _targets(graph: Graph, wrt: Any) -> list[str]:
    from linnet.lang.grad import resolve_wrt

    return resolve_wrt(graph, list(_wrt_key(wrt)))


def _names(graph: Graph, wrt: Any) -> list[str]:
    """The keys of the gradients dict: input names and parameter paths, without % and @."""
    return [ref[1:] for ref in _targets(graph, wrt)]
