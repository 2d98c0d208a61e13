"""Tensor configs: a block's compile-time list of numbers, ``config NAME: Tensor[N; T]``.

A scalar config (``config rope_theta: f32``) is one number; LongRoPE's per-frequency
factors are HD / 2 of them. A config of a rank-1 tensor type takes a list (a JSON array in
the config, a checkpoint mapping's list-valued rope parameter), checked against its type:
each element of the element type (E0613), as many as the type's size (E0881). Its default,
when it has one, is a single number that fills it (``= 1.0``). It reaches the blocks below
by name as scalar configs do.

A body reads it as a tensor of its type. Lowering makes that tensor from rank-0 constants
(the graph has no tensor literals): one ``broadcast`` of the last run of equal values and
one ``select`` per earlier run, so a list of equal values is one step. Common
subexpressions are shared, so every layer reads the same steps.

>>> from linnet.lang.tensors.dims import Dim
>>> runs((1.0, 1.0, 2.0, 3.0, 3.0))
[(0, 2, 1.0), (2, 3, 2.0), (3, 5, 3.0)]
"""

from __future__ import annotations

import math
from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.config_checks import no_value, plain
from linnet.lang.check.core import Frame, fail
from linnet.lang.diagnostics.core import Span
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const, ConstTensor, Tensor

# At most this many elements: each run of equal values is a graph step. A model's lists
# (LongRoPE's factors, one per rotary frequency) have tens of them.
MAX_ELEMENTS = 65536


def tensor_config_value(
    ev: Any,
    m: A.Member,
    frame: Frame,
    config: dict[str, Any],
    given: dict[str, Any] | None,
) -> ConstTensor:
    """The value of the tensor config ``m`` (its type a ``TensorType``): the config's list,
    the one an enclosing block passes down, or its default filling it.

    Raises E0880 for a type a tensor config cannot have, E0613 for a value that is not a
    list of the element type, E0881 for a list of another length."""
    typ = m.type
    assert isinstance(typ, A.TensorType)
    if len(typ.dims) != 1:
        raise fail(
            "E0880",
            f"tensor config `{m.name}` has {len(typ.dims)} axes; a tensor config has one",
            typ.span,
            "not one axis",
            help=f"declare it as a list: `config {m.name}: Tensor[N; f32]`",
        )
    shape, dtype = ev.tensor_type(typ, frame)
    if dtype not in DT.FLOATS and dtype not in DT.INTS and dtype != "bool":
        raise fail(
            "E0880",
            f"tensor config `{m.name}` has element type `{dtype}`; a tensor config's "
            "element type is a concrete one (f32, i32, bool...)",
            typ.dtype.span,
            "not a concrete element type",
            help="its values are numbers known before lowering: name their type, and "
            "convert where the body needs another (`x[i] as T`)",
        )
    size = shape[0].value
    shown = f"Tensor[{ev.src(typ.dims[0])}; {dtype}]"
    if m.name in config:
        return _checked(m, config[m.name], shape, dtype, size, shown, "the config")
    passed = (given or {}).get(m.name)
    if isinstance(passed, ConstTensor):
        if passed.values is None:
            return ConstTensor(None, shape, dtype)
        return _checked(m, list(passed.values), shape, dtype, size, shown, "an enclosing block")
    if isinstance(passed, Const):
        raise fail(
            "E0613",
            f"config `{m.name}` is {shown}, but an enclosing block's `{m.name}` is a scalar",
            m.span,
            "declared here",
            help="declare the enclosing config as the same tensor type, or rename one",
        )
    if m.default is not None:
        fill = ev.value(m.default, frame)
        if not isinstance(fill, Const) or fill.dtype not in ("int", "float", "bool", dtype):
            raise fail(
                "E0880",
                f"the default of tensor config `{m.name}` must be one number, which fills it",
                m.default.span,
                "not a number",
                help=f"write `config {m.name}: {shown} = 1.0`",
            )
        if size is None or not ev.lowering:
            return ConstTensor(None, shape, dtype)
        return _checked(m, [plain(fill.value)] * size, shape, dtype, size, shown, "its default")
    return no_value(
        ev,
        m,
        ConstTensor(None, shape, dtype),
        f"give it in the config (a list of numbers), or a default: "
        f"`config {m.name}: {shown} = 1.0`",
    )


def _checked(
    m: A.Member,
    raw: Any,
    shape: tuple[Dim, ...],
    dtype: str,
    size: int | None,
    shown: str,
    where: str,
) -> ConstTensor:
    if isinstance(raw, tuple):
        raw = list(raw)
    values = _elements(raw, dtype) if isinstance(raw, list) else None
    if values is None:
        raise fail(
            "E0613",
            f"config `{m.name}` is {shown}, but the value {where} gives is {_shown(raw)}",
            m.span,
            "declared here",
            help=f"give a list of {dtype} values"
            + (f", {size} of them" if size is not None else "")
            + ": `[1.0, 1.5, ...]`",
        )
    if len(values) > MAX_ELEMENTS or (size is not None and len(values) != size):
        raise fail(
            "E0881",
            f"config `{m.name}` is {shown}"
            + (f" ({size} values)" if size is not None else "")
            + f", but the list {where} gives has {len(values)}",
            m.span,
            "declared here",
            help=f"give one value per element of `{shown}`"
            + (f" ({size})" if size is not None else "")
            + "; a checkpoint's list (LongRoPE's `short_factor` and `long_factor`) has one "
            "per rotary frequency, head_dim / 2",
        )
    return ConstTensor(tuple(values), shape, dtype)


def _elements(raw: list, dtype: str) -> list[Any] | None:
    out: list[Any] = []
    for x in raw:
        x = plain(x)
        if dtype == "bool":
            if not isinstance(x, bool):
                return None
        elif isinstance(x, bool) or not isinstance(x, int | float):
            return None
        elif dtype in DT.FLOATS:
            if not math.isfinite(x):
                return None
            x = float(x)
        elif not float(x).is_integer():
            return None
        else:
            x = int(x)
        out.append(x)
    return out


def _shown(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def runs(values: tuple[Any, ...]) -> list[tuple[int, int, Any]]:
    """The runs of equal consecutive values: ``(start, stop, value)``."""
    out: list[tuple[int, int, Any]] = []
    for i, v in enumerate(values):
        if out and out[-1][2] == v and type(out[-1][2]) is type(v):
            out[-1] = (out[-1][0], i + 1, v)
        else:
            out.append((i, i + 1, v))
    return out


def materialize(ev: Any, c: ConstTensor, span: Span | None) -> Tensor:
    """The tensor a body reads for the tensor config ``c``: a broadcast of its last run of
    equal values, then, from the last run back, ``select(iota < stop, value, rest)``."""
    if c.values is None or any(d.value is None for d in c.shape) or not DT.is_concrete(c.dtype):
        return Tensor("%?", c.shape, c.dtype)
    n = len(c.values)
    b = ev.builder
    shape = (Dim.const(n),)

    def constant(value: Any, dtype: str) -> Tensor:
        t: Tensor = b.emit("constant", [], (), dtype, {"value": value, "dtype": dtype}, span=span)
        return t

    parts = runs(c.values)
    last = constant(parts[-1][2], c.dtype)
    acc: Tensor = b.emit("broadcast", [last.ref], shape, c.dtype, {"shape": [n]}, span=span)
    if len(parts) == 1:
        return acc
    index = b.emit("iota", [], shape, "i32", {"shape": [n], "axis": 0, "dtype": "i32"}, span=span)
    for _, stop, value in reversed(parts[:-1]):
        below = b.emit("lt", [index.ref, constant(stop, "i32").ref], shape, "bool", span=span)
        acc = b.emit(
            "select", [below.ref, constant(value, c.dtype).ref, acc.ref], shape, c.dtype, span=span
        )
    return acc
