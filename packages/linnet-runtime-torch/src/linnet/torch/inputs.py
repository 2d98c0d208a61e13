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
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.ir.bounds import InputRange, bounds_for, dim_names
from linnet.lang.ir.graph import Graph

import torch

from .interpreter import DTYPES


def _error(code: str, message: str, help: str = "") -> LinnetError:
    return LinnetError(Diagnostic(code, message, help=help))


def _type_error(entry: str, name: str, value: Any, graph: Graph | None) -> LinnetError:
    want = ""
    if graph is not None and name in graph.values:
        vt = graph.values[name]
        torch_dtype = str(DTYPES[vt.dtype])
        want = f"torch.tensor(..., dtype={torch_dtype}) of shape {list(vt.shape)}"
    example = want or "torch.tensor(...)"
    return _error("E0721", f"input `{name.lstrip('%')}` of `{entry}` must be a torch.Tensor, "
                  f"got {type(value).__name__} {_short(value)}",
                  help=f"wrap it: {example}" + (" (torch.from_numpy for a NumPy array)"
                                                if type(value).__module__ == "numpy" else ""))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    if not isinstance(inputs, list | tuple):
        raise _error("E0784", f"the inputs of `{entry}` must be a list or tuple of tensors, got "
                     f"{type(inputs).__name__}",
                     help=f"pass one tensor per input: [{', '.join(n.lstrip('%') for n in graph.inputs)}]")
    if len(inputs) != len(graph.inputs):
        raise _error("E0720", f"entry `{entry}` takes {len(graph.inputs)} inputs "
                     f"({', '.join(n.lstrip('%') for n in graph.inputs)}), got {len(inputs)}")
    for name, t in zip(graph.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise _type_error(entry, name, t, graph)
        vt = graph.values[name]
        want = DTYPES[vt.dtype]
        if t.dtype != want:
            raise _error("E0722", f"input `{name[1:]}` of `{entry}` is {t.dtype}, the entry "
                         f"declares {vt.dtype}",
                         help=f"convert it: `{name[1:]}.to({want})` (nothing is converted "
                              "silently: a float token id or position is a mistake)")
    bounds = bounds_for(graph)
    if not bounds.inputs:
        return
    checks: list[tuple[torch.Tensor, InputRange]] = []
    device_checks: list[tuple[torch.Tensor, InputRange]] = []
    for name, t in zip(graph.inputs, inputs):
        r = bounds.inputs.get(name)
        if r is None or t.numel() == 0:
            continue
        if t.device.type == "cpu":
            checks.append((t, r))
        elif device_inputs:
            device_checks.append((t, r))
    for t, r in checks:
        lo, hi = torch.aminmax(t)
        if r.empty or int(lo) < r.lo or int(hi) >= r.hi:
            raise _range_error(graph, entry, t, r)
    if device_checks:
        # One copy to the host for every device input: one synchronisation, not one each.
        ends = torch.stack([torch.stack(torch.aminmax(t)).long() for t, _ in device_checks])
        for (t, r), (lo, hi) in zip(device_checks, ends.cpu().tolist()):
            if r.empty or lo < r.lo or hi >= r.hi:
                raise _range_error(graph, entry, t.cpu(), r)


def _range_error(graph: Graph, entry: str, t: torch.Tensor, r: InputRange) -> LinnetError:
    name = r.input.lstrip("%")
    flat = t.reshape(-1).long()
    bad = ((flat < r.lo) | (flat >= r.hi)).nonzero()
    first = int(bad[0]) if len(bad) else 0
    index = list(torch.unravel_index(torch.tensor(first), t.shape)) if t.dim() else []
    where = [int(i) for i in index]
    value = int(flat[first])
    count = len(bad)
    more = f" ({count} values are out of range)" if count > 1 else ""
    if r.empty:
        return _error("E0780", f"no value of input `{name}` of `{entry}` is valid: it indexes "
                      f"{r.lower.describe(graph)} and {r.upper.describe(graph)}",
                      help="the model's indices cannot all be in range for these shapes")
    low = value < r.lo
    use = r.lower if low else r.upper
    message = (f"input `{name}` of `{entry}` has {value} at index {where}{more}; every value "
               f"must be {r.text()}: `{name}` indexes {use.describe(graph)}")
    if low and value < 0:
        help = (f"give values {r.text()}; negative values do not count from the end "
                "in Linnet")
    elif use.target.startswith("@") and use.target[1:] in graph.states:
        names = dim_names(graph, use.size)
        dim = " or ".join(names) if names else "the size of that axis"
        help = (f"give values {r.text()}; the state holds {use.size} entries along "
                f"that axis: to go further, load the model with a larger {dim} in the config")
    else:
        help = (f"give values {r.text()}; the size comes from the weights or the "
                "config: is this input from another vocabulary or model?")
    return _error("E0780", message, help=help)
