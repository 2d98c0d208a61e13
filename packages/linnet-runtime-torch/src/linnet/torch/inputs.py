"""Entry inputs checked before anything runs: count, type, dtype and index ranges.

One function, :func:`check_inputs`, is called by ``Model.run``, ``Plan.run`` and
``Captured``, so the interpreter, the generated source and a plan reject the same bad input
with the same coded error. The valid range of each input that is used as an index (a token
id into the embedding, a position into the KV cache) comes from
:func:`linnet.lang.passes.bounds.input_bounds`, derived once per lowered graph.

Host (CPU) tensors are always checked: a min and a max, microseconds. Device tensors are
checked by ``Model.run`` and ``Plan.run`` at the cost of one synchronisation per call (all
inputs' minima and maxima come back in one copy); ``Captured`` does not check them (its
device inputs are the previous step's argmax, in range by construction), so a replay never
waits for the device. See docs/torch.md, "Bad inputs".

Under ``torch.export`` the inputs are fake tensors with no values to read: each range
becomes assertions that the exported program carries and checks on every call
(:func:`traced_range_checks`). Fake tensors outside export (a ``FakeTensorMode`` run for
shapes) are skipped, like meta tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.host.paged import PAGED_ENTRIES, check_paged_inputs
from linnet.lang.host.inputs import check_count, dtype_error, error, in_range, range_error, short
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.bounds import InputRange, bounds_for

import torch
from torch._subclasses.fake_tensor import is_fake

from .interpreter import DTYPES


def _type_error(entry: str, name: str, value: Any, graph: Graph | None) -> LinnetError:
    want = ""
    if graph is not None and name in graph.values:
        vt = graph.values[name]
        torch_dtype = str(DTYPES[vt.dtype])
        want = f"torch.tensor(..., dtype={torch_dtype}) of shape {list(vt.shape)}"
    example = want or "torch.tensor(...)"
    return error(
        "E0721",
        f"input `{name.lstrip('%')}` of `{entry}` must be a torch.Tensor, "
        f"got {type(value).__name__} {short(value)}",
        help=f"wrap it: {example}"
        + (" (torch.from_numpy for a NumPy array)" if type(value).__module__ == "numpy" else ""),
    )


def check_inputs(
    graph: Graph, inputs: Sequence[Any], entry: str, device_inputs: bool = True
) -> None:
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
    exporting = torch.compiler.is_exporting()
    for name, t in zip(graph.inputs, inputs):
        r = bounds.inputs.get(name)
        if r is None or t.numel() == 0 or t.device.type == "meta":
            continue  # a meta tensor has a shape and no values: nothing to range-check
        if exporting:
            traced_range_checks(graph, entry, t, r)
        elif is_fake(t):
            continue  # shapes only (FakeTensorMode): no values, as on meta
        elif t.device.type == "cpu":
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
    if entry in PAGED_ENTRIES and not exporting:
        _check_paged(graph, entry, inputs, device_inputs)


def _check_paged(graph: Graph, entry: str, inputs: Sequence[Any], device_inputs: bool) -> None:
    """A paged entry's positions against the cache's S (E0690), where they have values."""
    named = {name[1:]: t for name, t in zip(graph.inputs, inputs)}
    wanted = {k: named[k] for k in ("pos", "start", "n") if k in named}
    if any(
        t.device.type == "meta" or is_fake(t) or (t.device.type != "cpu" and not device_inputs)
        for t in wanted.values()
    ):
        return
    check_paged_inputs(graph, entry, {k: t.reshape(-1).tolist() for k, t in wanted.items()})


def _range_error(graph: Graph, entry: str, t: torch.Tensor, r: InputRange) -> LinnetError:
    # The message's first bad index and value, read from a flat host copy as ints.
    return range_error(graph, entry, r, t.reshape(-1).long().tolist(), tuple(t.shape))


def traced_range_checks(
    graph: Graph, entry: str, t: torch.Tensor, r: InputRange, read: bool | None = None
) -> None:
    """The range check of index input ``t`` as operations ``torch.export`` keeps in the
    program, for a tensor that has no values yet (a fake tensor being traced): the exported
    program refuses an out-of-range value on every call instead of reading past an axis (or
    clamping to its last entry). ``int(t.min())`` would be a data-dependent guard that export
    cannot trace (issue 46 item 6).

    On the CPU, ``torch._assert_async`` (no synchronisation; RuntimeError with an E0780
    message naming the input, its range and what it indexes). On a GPU that would be a
    device-side assert, which leaves the CUDA context unusable, so there the program reads
    the minimum and maximum (one synchronisation, as eager checks do) and ``torch._check``
    turns them into runtime assertions: a RuntimeError naming the bound (``u1 <= 255``).
    ``read`` picks the second form (None: off the CPU). A range no value satisfies is E0780
    at export time.

    >>> from linnet.lang import Program, lower
    >>> from linnet.lang.passes.bounds import bounds_for
    >>> g = lower(Program.from_text(GATHER), "get", {"i": [1]}, {"V": 4})
    >>> traced_range_checks(g, "get", torch.tensor([5]), bounds_for(g).inputs["%i"])
    Traceback (most recent call last):
    ...
    RuntimeError: error[E0780]: input `i` of `get` has a value of 4 or more; every value must be in [0, 4)...
    """
    if r.empty:
        raise range_error(graph, entry, r, [], tuple(t.shape))
    name = r.input.lstrip("%")
    where = f"every value must be {r.text()}: `{name}` indexes"
    low = (
        f"error[E0780]: input `{name}` of `{entry}` has a value below {r.lo}; {where} "
        f"{r.lower.describe(graph)}"
    )
    high = (
        f"error[E0780]: input `{name}` of `{entry}` has a value of {r.hi} or more; "
        f"{where} {r.upper.describe(graph)}"
    )
    bounded = (r.lo > _MIN, r.hi < _MAX)
    lo, hi = torch.aminmax(t)
    if read is None:
        read = t.device.type != "cpu"
    if not read:
        if bounded[0]:
            torch._assert_async(lo >= r.lo, low)
        if bounded[1]:
            torch._assert_async(hi < r.hi, high)
        return
    lo_v, hi_v = lo.item(), hi.item()
    if bounded[0]:
        torch._check(lo_v >= r.lo, lambda: low)
    if bounded[1]:
        torch._check(hi_v < r.hi, lambda: high)


# Outside these the range has no end on that side (InputRange.text: "at least 0").
_MIN, _MAX = -(2**63), 2**63
# The doctest's model: one gather from a table of V entries.
GATHER = """
model M<V: Dim> {
    param t: Tensor[V; f32]
    entry get(i: Tensor[1; i32]) -> Tensor[1; f32] {
        let out[k] = self.t[i[k]]
        return out
    }
}"""
