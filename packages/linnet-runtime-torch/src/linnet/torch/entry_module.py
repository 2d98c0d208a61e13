"""``Model.as_module``: one entry of a loaded model as a ``torch.nn.Module``, for
``torch.export`` and AOTInductor (docs/torch.md, "Exporting with torch.export").

The module's parameters are the model's parameters and its buffers the context's states (the
KV caches), registered under their paths (``model.layers.0.self_attn.k_cache``) and sharing
memory with the model: nothing is copied. ``forward`` checks its inputs as ``Model.run`` does
(under ``torch.export`` the range checks become assertions the program keeps:
:func:`linnet.torch.inputs.traced_range_checks`) and runs the entry against the module's own
tensors, so an exported program reads its weights as parameters and writes its caches as
buffer mutations, which ``torch.export`` carries and AOTInductor compiles.

>>> decode = model.as_module("decode", [token, pos])                # doctest: +SKIP
>>> program = torch.export.export(decode, (token, pos))             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang.host.inputs import error

import torch

from .context import Context
from .inputs import check_inputs


class EntryModule(torch.nn.Module):
    """``entry`` of ``model`` as a module: see :meth:`linnet.torch.Model.as_module`.

    >>> decode = EntryModule(model, "decode", [token, pos], None)      # doctest: +SKIP
    >>> sorted(decode.state_dict())[:1]                                 # doctest: +SKIP
    ['lm_head.weight']
    """

    _linnet_model: Any  # the Model (set past nn.Module's __setattr__: not a submodule)

    def __init__(
        self, model: Any, entry: str, inputs: Sequence[torch.Tensor], context: Context | None
    ):
        super().__init__()
        if context is not None and not isinstance(context, Context):
            raise error(
                "E0785",
                f"context must be a linnet.torch.Context, got {type(context).__name__}",
                help=f"make one: model.new_context({entry!r}, inputs)",
            )
        if model.interpret:
            raise error(
                "E0734",
                f"`{entry}` of a model loaded with interpret=True cannot be a "
                "module: the interpreter reads every index back to check it as it "
                "runs, which torch.export cannot trace",
                help="load the model without interpret=True (the generated source): "
                "its inputs are range-checked in the module instead",
            )
        _static(entry, inputs)
        graph = model._lower(entry, inputs).graph
        ctx = context if context is not None else model._context_for_graph(graph)
        model._check_context(graph, ctx, entry)
        # A plain attribute, not a submodule: the model is not an nn.Module.
        object.__setattr__(self, "_linnet_model", model)
        self.entry = entry
        self._where: dict[str, tuple[torch.nn.Module, str]] = {}
        for path, p in model.params.items():
            self._put(
                path,
                torch.nn.Parameter(p, requires_grad=p.requires_grad)
                if p.is_floating_point()
                else p,
                parameter=p.is_floating_point(),
            )
        for path, state in ctx.states.items():
            self._put(path, state, parameter=False)

    def _put(self, path: str, t: torch.Tensor, parameter: bool) -> None:
        """Register ``t`` at ``path``, one submodule per dotted part, so that the
        ``state_dict`` (and an exported program's) names it by its path. A part that is
        already an attribute there (``forward``, or a tensor that is also a prefix of
        another path) gets a ``_`` appended."""
        parent: torch.nn.Module = self
        *prefix, last = path.split(".")
        for part in prefix:
            name, child = part, parent._modules.get(part)
            while child is None and hasattr(parent, name):
                name += "_"
                child = parent._modules.get(name)
            if child is None:
                child = torch.nn.Module()
                parent.add_module(name, child)
            parent = child
        name = last
        while hasattr(parent, name):
            name += "_"
        if parameter:
            parent.register_parameter(name, t)  # type: ignore[arg-type]
        else:
            parent.register_buffer(name, t)
        self._where[path] = (parent, name)

    def _tensors(self, paths: Any) -> dict[str, torch.Tensor]:
        out = {}
        for path in paths:
            parent, name = self._where[path]
            out[path] = getattr(parent, name)
        return out

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Run the entry on ``inputs`` against this module's parameters and buffers."""
        model = self._linnet_model
        _static(self.entry, inputs)
        lowered = model._lower(self.entry, inputs)
        graph = lowered.graph
        check_inputs(graph, list(inputs), self.entry)
        states = self._tensors(p for p in graph.states if p in self._where)
        model._check_context(graph, Context({}, states, model.device), self.entry)
        params = self._tensors(model.params)
        inputs = tuple(t.to(model.device) for t in inputs)
        return model._execute(lowered, self.entry, list(inputs), params, states)


def _static(entry: str, inputs: Sequence[Any]) -> None:
    """E0733 for inputs of symbolic sizes (``torch.export`` with ``dynamic_shapes``): an
    entry is lowered, and its source generated, for one set of sizes."""
    for t in inputs:
        if isinstance(t, torch.Tensor) and not all(isinstance(d, int) for d in t.shape):
            raise error(
                "E0733",
                f"`{entry}` was given an input of symbolic shape "
                f"{list(t.shape)}: Linnet lowers an entry for static sizes",
                help="export one program per shape (torch.export.export without "
                "dynamic_shapes); the ONNX export takes symbolic dims: "
                "model.export_onnx(..., dynamic=...)",
            )
