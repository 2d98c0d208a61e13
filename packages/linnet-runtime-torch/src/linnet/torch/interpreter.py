"""The PyTorch interpreter: runs a graph step by step from a rule table.

It is the semantic reference that generated source is tested against: each rule is the
primitive's definition (docs/graph-format.md) written with torch, with no fast paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.ir.edges import INT_RANGES, saturation
from linnet.lang.ir.elementwise import compiled, spelled
from linnet.lang.ir.graph import Graph, Step
from linnet.lang.ir.primitives import PRIMITIVES, Primitive

import torch

DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}
INTS = {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
_NAMES = {dt: name for name, dt in DTYPES.items()}

Rule = Callable[[Step, list[Any], torch.device], Any]


def _div(step: Step, x: list[Any], device: torch.device) -> Any:
    """Integer ``/`` rounds toward -inf and gives 0 for a zero divisor (linnet.lang.ir.edges;
    torch raises ZeroDivisionError)."""
    a, b = x
    if isinstance(a, torch.Tensor) and a.dtype in INTS:
        zero = b == 0
        return torch.div(a, b.masked_fill(zero, 1), rounding_mode="floor").masked_fill(zero, 0)
    return a / b


def _rem(step: Step, x: list[Any], device: torch.device) -> Any:
    """``%`` takes the divisor's sign; an integer ``a % 0`` is ``a`` (linnet.lang.ir.edges)."""
    a, b = x
    if a.dtype in INTS:
        zero = b == 0
        return torch.where(zero, a, torch.remainder(a, b.masked_fill(zero, 1)))
    return torch.remainder(a, b)


def _convert(step: Step, x: list[Any], device: torch.device) -> Any:
    """Float to integer: NaN is 0, the rest truncated and saturated at the type's ends
    (linnet.lang.ir.edges.saturation; torch's ``.to`` leaves them undefined)."""
    (v,), dtype = x, step.attributes["dtype"]
    if not v.is_floating_point() or dtype not in INT_RANGES:
        return v.to(DTYPES[dtype])
    compute, lo, top, smallest, largest = saturation(_NAMES[v.dtype], dtype)
    w = v.to(DTYPES[compute])
    inside = (w >= lo) & (w < top)
    out = torch.where(inside, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return out.to(DTYPES[dtype]).masked_fill(w >= top, largest).masked_fill(w < lo, smallest)


def _bitcast(step: Step, x: list[Any], device: torch.device) -> Any:
    """The same bits read as ``attributes.dtype``, of their width (``Tensor.view``); a state
    operand is copied: a view of it would change with the state's next write."""
    out = x[0].view(DTYPES[step.attributes["dtype"]])
    return out.clone() if step.operands[0].startswith("@") else out


def index_error(entry: str, detail: str) -> LinnetError:
    """E0781: an index computed inside an entry is out of range while it runs (one that
    no entry input bounds: inputs are checked before the entry runs, error E0780)."""
    return LinnetError(
        Diagnostic(
            "E0781",
            f"an index computed in `{entry}` is out of range: {detail}",
            help="the entry reads or writes outside a tensor for these inputs or weights; states "
            "it wrote before this point may be updated: start from a new context",
        )
    )


def _check_index(step: Step, idx: torch.Tensor, size: int, axis: int, target: str) -> None:
    """Unchecked gathers and scatters: an index outside ``0..size-1`` is an error, as it is
    in generated source (never clamped, never wrapped around as Python does)."""
    if idx.numel() == 0:
        return
    lo, hi = torch.aminmax(idx)
    if int(lo) < 0 or int(hi) >= size:
        bad = int(lo) if int(lo) < 0 else int(hi)
        raise LinnetError(
            Diagnostic(
                "E0781",
                f"step {step.op} at {step.loc or '?'} indexes axis {axis} (size {size}) of "
                f"`{target.lstrip('@%')}` with {bad}",
                help="the entry reads or writes outside a tensor for these inputs or weights; "
                "states it wrote before this point may be updated: start from a new context",
            )
        )


def _take(step: Step, x: list[Any], device: torch.device) -> Any:
    data, idx = x
    axis = step.attributes["axis"]
    size = data.shape[axis]
    if step.attributes["bounds"] != "zero":
        _check_index(step, idx, size, axis, step.operands[0])
    safe = idx.long().clamp(0, size - 1)
    out = torch.index_select(data, axis, safe.reshape(-1))
    out = out.reshape(data.shape[:axis] + idx.shape + data.shape[axis + 1 :])
    if step.attributes["bounds"] == "zero":
        valid = ((idx >= 0) & (idx < size)).reshape(
            (1,) * axis + idx.shape + (1,) * (data.dim() - axis - 1)
        )
        out = torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=device))
    return out


def _gather(step: Step, x: list[Any], device: torch.device) -> Any:
    data, *indices = x
    if step.attributes["bounds"] != "zero":
        for a, i in enumerate(indices):
            _check_index(step, i, data.shape[a], a, step.operands[0])
    safe = [i.long().clamp(0, data.shape[a] - 1) for a, i in enumerate(indices)]
    out = data[tuple(safe)]
    if step.attributes["bounds"] == "zero":
        valid = torch.ones((), dtype=torch.bool, device=device)
        for a, i in enumerate(indices):
            valid = valid & (i >= 0) & (i < data.shape[a])
        valid = valid.reshape(valid.shape + (1,) * (data.dim() - len(indices)))
        out = torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=device))
    return out


def _reduce(step: Step, x: list[Any], device: torch.device) -> Any:
    (data,) = x
    kind, axes = step.attributes["kind"], tuple(step.attributes["axes"])
    acc = DTYPES[step.attributes["accumulate"]]
    if kind == "sum":
        return data.to(acc).sum(dim=axes)
    if kind == "mean":
        return data.to(acc).mean(dim=axes)
    if kind == "max":
        return data.amax(dim=axes)
    if kind == "min":
        return data.amin(dim=axes)
    out = data.to(acc)
    for axis in sorted(axes, reverse=True):
        out = torch.prod(out, dim=axis)
    return out


def _contract(step: Step, x: list[Any], device: torch.device) -> Any:
    a, b = x
    acc = DTYPES[step.attributes["accumulate"]]
    return torch.einsum(step.attributes["spec"], a.to(acc), b.to(acc))


def _iota(step: Step, x: list[Any], device: torch.device) -> Any:
    shape, axis = step.attributes["shape"], step.attributes["axis"]
    view = [1] * len(shape)
    view[axis] = shape[axis]
    out = torch.arange(shape[axis], dtype=DTYPES[step.attributes["dtype"]], device=device)
    return out.reshape(view).expand(shape)


def _constant(step: Step, x: list[Any], device: torch.device) -> Any:
    return torch.tensor(
        step.attributes["value"], dtype=DTYPES[step.attributes["dtype"]], device=device
    )


def _scatter(step: Step, x: list[Any], device: torch.device) -> None:
    state, value, *indices = x
    if not indices:
        state.copy_(value)
    else:
        for a, i in enumerate(indices):
            _check_index(step, i, state.shape[a], a, step.operands[0])
        state.index_put_(tuple(i.long() for i in indices), value)


def _scatter_add(step: Step, x: list[Any], device: torch.device) -> Any:
    """A new tensor: ``data`` with ``value`` added at the positions (coinciding ones add up);
    bounds zero drops positions outside the axes, unchecked ones are checked (E0781)."""
    data, value, *indices = x
    if not indices:
        return data + value
    zero = step.attributes["bounds"] == "zero"
    if not zero:
        for a, i in enumerate(indices):
            _check_index(step, i, data.shape[a], a, step.operands[0])
    safe = tuple(i.long().clamp(0, data.shape[a] - 1) for a, i in enumerate(indices))
    if zero:
        valid = torch.ones((), dtype=torch.bool, device=device)
        for a, i in enumerate(indices):
            valid = valid & (i >= 0) & (i < data.shape[a])
        valid = valid.reshape(valid.shape + (1,) * (data.dim() - len(indices)))
        value = torch.where(valid, value, torch.zeros((), dtype=value.dtype, device=device))
    return torch.index_put(data, safe, value, accumulate=True)


def _slice(step: Step, x: torch.Tensor) -> torch.Tensor:
    view = x[
        tuple(slice(a, b) for a, b in zip(step.attributes["starts"], step.attributes["limits"]))
    ]
    # A view of a state would change with the state's next write: a @path operand is copied.
    return view.clone() if step.operands[0].startswith("@") else view


def _group(step: Step) -> Any:
    """The process group a collective step runs on: the default one, of ``world`` ranks."""
    import torch.distributed as dist

    world = step.attributes["world"]
    have = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    if have != world:
        raise LinnetError(
            Diagnostic(
                "E0820",
                f"step {step.op} at {step.loc or '?'} runs across {world} ranks, but "
                + (
                    "torch.distributed is not initialised in this process"
                    if have is None
                    else f"this process group has {have}"
                ),
                help=f"load the model with world={have or 1} under torchrun, or start the ranks "
                f"with `linnet run --nproc {world}` (docs/parallel.md)",
            )
        )
    return dist


def _all_reduce(step: Step, x: list[Any], device: torch.device) -> Any:
    dist = _group(step)
    out = x[0].clone()  # the operand stays as it was: values are never written in place
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[
        step.attributes["kind"]
    ]
    dist.all_reduce(out, op=op)
    return out


def _all_gather(step: Step, x: list[Any], device: torch.device) -> Any:
    dist = _group(step)
    part = x[0].contiguous()
    parts = [torch.empty_like(part) for _ in range(step.attributes["world"])]
    dist.all_gather(parts, part)
    return torch.cat(parts, dim=step.attributes["axis"])


def _max(fn: Callable) -> Rule:
    return lambda s, x, d: fn(*x)


def _spelled(text: str, p: Primitive) -> Rule:
    """A rule from the ``torch`` column of linnet.lang.ir.elementwise: the text that
    generated PyTorch holds (``torch.exp({0})``), evaluated on the operands."""
    fn = compiled(text, p.arity or 0, {"torch": torch})
    return lambda s, x, d: fn(*x)


RULES: dict[str, Rule] = spelled(
    "torch",
    _spelled,
    {
        "div": _div,
        "rem": _rem,
        "maximum": _max(torch.maximum),
        "minimum": _max(torch.minimum),
        "select": lambda s, x, d: torch.where(x[0], x[1], x[2]),
        "convert": _convert,
        "bitcast": _bitcast,
        "constant": _constant,
        "iota": _iota,
        "reshape": lambda s, x, d: x[0].reshape(s.attributes["shape"]),
        "transpose": lambda s, x, d: x[0].permute(s.attributes["perm"]),
        "broadcast": lambda s, x, d: x[0].expand(s.attributes["shape"]),
        "reduce": _reduce,
        "contract": _contract,
        "take": _take,
        "gather": _gather,
        "scatter": _scatter,  # in place: the state tensor is updated, no result
        "scatter_add": _scatter_add,  # a new tensor (the reverse pass's transpose of gathers)
        "slice": lambda s, x, d: _slice(s, x[0]),
        # Tensor parallelism (issue 21): torch.distributed's collectives on the default group.
        "all_reduce": _all_reduce,
        "all_gather": _all_gather,
    },
)
"""One rule per primitive (``tests/test_coverage.py`` in linnet-lang checks it covers
:data:`~linnet.lang.ir.primitives.PRIMITIVES`): ``rule(step, operands, device)``."""


def missing_rules() -> list[str]:
    return sorted(set(PRIMITIVES) - set(RULES))


def run_graph(
    graph: Graph,
    inputs: list[torch.Tensor],
    params: dict[str, torch.Tensor],
    states: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Run ``graph`` step by step; states are updated in place.

    >>> # model.decode(token, pos) with `load(..., interpret=True)` runs this
    """
    device = torch.device(device)
    env: dict[str, Any] = dict(zip(graph.inputs, inputs))
    for step in graph.steps:
        args = []
        for o in step.operands:
            if o.startswith("@"):
                path = o[1:]
                args.append(states[path] if path in states else params[path])
            else:
                args.append(env[o])
        out = RULES[step.op](step, args, device)
        if step.results:
            env[step.results[0]] = out
    return [_output(o, env, params, states) for o in graph.outputs]


def _output(
    ref: str, env: dict[str, Any], params: dict[str, torch.Tensor], states: dict[str, torch.Tensor]
) -> torch.Tensor:
    """An output is a value or a whole state or parameter (``return self.cache``): those
    are returned as copies, as generated source does, so that the next call's in-place
    writes do not change a result the caller holds."""
    if ref.startswith("@"):
        path = ref[1:]
        return (states[path] if path in states else params[path]).clone()
    return env[ref]
