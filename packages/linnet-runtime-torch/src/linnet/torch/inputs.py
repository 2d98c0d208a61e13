"""Entry inputs checked before anything runs: count, type, dtype and index ranges.

One function, :func:`check_inputs`, is called by ``Model.run``, ``Plan.run`` and
``Captured``, so the interpreter, the generated source and a plan reject the same bad input
with the same coded error. The valid range of each input that is used as an index (a token
id into the embedding, a position into the KV cache) comes from
:func:`linnet.lang.ir.bounds.input_bounds`, derived once per lowered graph.

Host (CPU) tensors are always checked: a min and a max, microseconds. Device tensors are
checked by ``Model.run`` and ``Plan.run`` at the cost of one synchronisation per call (all
inputs' minima and maxima come back in one copy); ``Captured`` does not check them (its
device inputs are the previous step's argmax, in range by construction), so a replay never
waits for the device. See docs/torch.md, "Bad inputs".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.hosting import check_count, dtype_error, error, in_range, range_error, short
from linnet.lang.ir.bounds import InputRange, bounds_for
from linnet.lang.ir.graph import Graph

import torch

from .interpreter import DTYPES


def _type_error(entry: str, name: str, value: Any, graph: Graph | None) -> LinnetError:
    want = ""
    if graph is not None and name in graph.values:
        vt = graph.values[name]
        torch_dtype = str(DTYPES[vt.dtype])
        want = f"torch.tensor(..., dtype={torch_dtype}) of shape {list(vt.shape)}"
    example = want or "torch.tensor(...)"
    return error("E0721", f"input `{name.lstrip('%')}` of `{entry}` must be a torch.Tensor, "
                 f"got {type(value).__name__} {short(value)}",
                 help=f"wrap it: {example}" + (" (torch.from_numpy for a NumPy array)"
                                               if type(value).__module__ == "numpy" else ""))


def check_inputs(graph: Graph, inputs: Sequence[Any], entry: str,
                 device_inputs: bool = True) -> None:
    """Check ``inputs`` of ``graph`` (an entry lowered for their shapes) before it runs.

    Raises a coded :class:`~linnet.lang.LinnetError`: E0720 for a wrong count, E0721 for a
    value that is not a tensor, E0722 for a wrong dtype, E0780 for a value outside the range
    its input may take (naming the input, the first bad index and value, the range and what
    the input indexes). ``device_inputs=False`` skips range checks of tensors that are not on
    the CPU (no synchronisation; ``Captured`` replays).

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<V: Dim> {
    ...     param t: Tensor[V; f32]
    ...     entry get(i: Tensor[1; i32]) -> Tensor[1; f32] {
    ...         let out[k] = self.t[i[k]]
    ...         return out
    ...     }
    ... }''')
    >>> g = lower(prog, "get", {"i": [1]}, {"V": 4})
    >>> check_inputs(g, [torch.tensor([3], dtype=torch.int32)], "get")
    >>> check_inputs(g, [torch.tensor([4], dtype=torch.int32)], "get")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0780]: input `i` of `get` has 4 at index [0]...
    """
    check_count(entry, graph.inputs, inputs, "tensor")
    for name, t in zip(graph.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise _type_error(entry, name, t, graph)
        vt = graph.values[name]
        want = DTYPES[vt.dtype]
        if t.dtype != want:
            raise dtype_error(entry, name, str(t.dtype), vt.dtype, f"{name[1:]}.to({want})")
    bounds = bounds_for(graph)
    if not bounds.inputs:
        return
    checks: list[tuple[torch.Tensor, InputRange]] = []
    device_checks: list[tuple[torch.Tensor, InputRange]] = []
    for name, t in zip(graph.inputs, inputs):
        r = bounds.inputs.get(name)
        if r is None or t.numel() == 0 or t.device.type == "meta":
            continue  # a meta tensor has a shape and no values: nothing to range-check
        if t.device.type == "cpu":
            checks.append((t, r))
        elif device_inputs:
            device_checks.append((t, r))
    for t, r in checks:
        lo, hi = torch.aminmax(t)
        if not in_range(r, int(lo), int(hi)):
            raise _range_error(graph, entry, t, r)
    if device_checks:
        # One copy to the host for every device input: one synchronisation, not one each.
        ends = torch.stack([torch.stack(torch.aminmax(t)).long() for t, _ in device_checks])
        for (t, r), (lo, hi) in zip(device_checks, ends.cpu().tolist()):
            if not in_range(r, lo, hi):
                raise _range_error(graph, entry, t.cpu(), r)


def _range_error(graph: Graph, entry: str, t: torch.Tensor, r: InputRange) -> LinnetError:
    # The message's first bad index and value, read from a flat host copy as ints.
    return range_error(graph, entry, r, t.reshape(-1).long().tolist(), tuple(t.shape))
