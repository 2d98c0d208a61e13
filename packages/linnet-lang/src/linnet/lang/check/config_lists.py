"""Config lists: one scalar per element of a repeated block (per-layer variants).

A model whose layers differ in a config value (Gemma 2's alternating sliding-window and
global layers, Qwen2's first `max_window_layers` layers global) declares a list config and
passes it to the elements of its repeated block::

    config layer_windows: [i32; NL] = 0
    block layers: [DecoderLayer<...>(sliding_window = layer_windows); NL]

Element ``i`` of ``layers`` gets ``sliding_window = layer_windows[i]``; everything else is
an ordinary block config (it reaches nested blocks by name, it is known when lowering). A
list is only passed on: used as a value it is E0873; a length other than the array's is
E0872 (the value given) or E0874 (the array it is passed to).

>>> from linnet.lang.tensors.values import Const
>>> from linnet.lang.tensors.dims import Dim
>>> lst = ConstList((Const(Dim.const(0), "int"), Const(Dim.const(4), "int")), "i32", Dim.const(2))
>>> [given["w"].value for given in element_configs({"w": lst}, 2)]
[Dim(0), Dim(4)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.config_checks import no_value, plain
from linnet.lang.check.core import fail
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const, ConstList

if TYPE_CHECKING:
    from collections.abc import Callable

    from linnet.lang.check.core import Frame


def named_list(expr: A.Expr, frame: Frame) -> ConstList | None:
    """The config list ``expr`` names (a config of the enclosing block), else None."""
    if isinstance(expr, A.Name):
        v = frame.env.get(expr.name)
        if isinstance(v, ConstList):
            return v
    return None


def list_config_value(
    ev: Any,  # the Evaluator (check/evaluate.py imports this module: no import back)
    m: A.Member,
    frame: Frame,
    raw: Any,
    has_raw: bool,
    convert: Callable[[A.Member, str, Any], Const],
) -> ConstList:
    """The value of list config ``m``: ``raw`` (the user's config or what an enclosing block
    passes: a list, a :class:`ConstList` or one scalar for every element) when ``has_raw``,
    else its default (a scalar for every element, or another list config)."""
    assert isinstance(m.type, A.ListType)
    elem = m.type.element.name
    count = ev.eval_dim(m.type.count, frame)
    if not has_raw:
        if m.default is None:
            return no_value(
                ev,
                m,
                ConstList(None, elem, count),
                f"pass it: `--set {m.name}=...`, or give a default: "
                f"`config {m.name}: [{elem}; ...] = 0`",
            )
        raw = named_list(m.default, frame) or ev.value(m.default, frame)
    scalar = A.Member("config", m.name, m.type.element, m.span)
    if isinstance(raw, ConstList):
        if raw.items is None or count.value is None:
            return ConstList(None, elem, count)
        values: list[Any] = [plain(c.value) for c in raw.items]
    elif isinstance(raw, Const):
        if not raw.known or count.value is None:
            return ConstList(None, elem, count)
        values = [plain(raw.value)] * count.value
    elif isinstance(raw, list | tuple):
        values = list(raw)
    elif isinstance(raw, bool | int | float):
        if count.value is None:
            return ConstList(None, elem, count)
        values = [raw] * count.value
    else:
        values = [raw]  # reported by `convert` as a value of the wrong type
    if count.value is None:
        return ConstList(None, elem, count)
    if len(values) != count.value:
        raise fail(
            "E0872",
            f"config `{m.name}` is a list of {count.value} values, "
            f"but the value given has {len(values)}",
            m.span,
            "declared here",
            help=f"give {count.value} values, one per element of the repeated block "
            "(or one value for all of them)",
        )
    return ConstList(tuple(convert(scalar, elem, v) for v in values), elem, count)


def element_configs(lists: dict[str, ConstList], n: int) -> list[dict[str, Const]]:
    """Per element ``i`` of an array of ``n`` blocks, each list's item ``i`` (unknown
    items while checking)."""
    out: list[dict[str, Const]] = []
    for i in range(n):
        out.append(
            {
                name: (lst.items[i] if lst.items is not None else Const(None, lst.dtype))
                for name, lst in lists.items()
            }
        )
    return out


def scalar_configs(decl: A.BlockDecl) -> set[str]:
    """The names of ``decl``'s one-value configs (neither a config list nor a tensor
    config): those a config list can give one item each."""
    return {
        m.name
        for m in decl.members
        if m.kind == "config" and not isinstance(m.type, A.ListType | A.TensorType)
    }


def split_lists(
    decl: A.BlockDecl, typ: A.BlockType, given: dict[str, Any], count: Dim, span_of: A.ArrayType
) -> dict[str, ConstList]:
    """The config lists a repeated block member passes its elements, one item each: the
    explicit `(name = list)` arguments whose config in the element is a scalar."""
    scalars = scalar_configs(decl)
    out: dict[str, ConstList] = {}
    for arg in typ.config:
        v = given.get(arg.name)
        if not isinstance(v, ConstList) or arg.name not in scalars:
            continue
        if count.value is not None and v.count.value is not None and v.count != count:
            raise fail(
                "E0874",
                f"config list `{arg.name}` has {v.count.value} values, but `{decl.name}` is "
                f"repeated {count.value} times",
                arg.span,
                f"{v.count.value} values",
                help="declare the list with the array's count: `config ...: [i32; N]` for "
                "`[Block<...>; N]`",
                secondary=[(span_of.count.span, f"{count.value} elements")],
            )
        out[arg.name] = v
    return out


def not_repeated(decl: A.BlockDecl, typ: A.BlockType, given: dict[str, Any]) -> None:
    """E0874 for a config list passed explicitly to a scalar config of a block that is not
    repeated (there is no element to give each item to)."""
    scalars = scalar_configs(decl)
    for arg in typ.config:
        if isinstance(given.get(arg.name), ConstList) and arg.name in scalars:
            raise fail(
                "E0874",
                f"config list `{arg.name}` is passed to one `{decl.name}`, whose "
                f"`{arg.name}` is one value",
                arg.span,
                "a list, one value per repeated block",
                help="pass a list to the elements of a repeated block, "
                f"`block layers: [{decl.name}<...>({arg.name} = ...); N]`, or pass one value",
            )


def list_used_as_value(name: str, span: Any) -> Exception:
    """E0873: a config list read as one value (it only parametrises repeated blocks)."""
    return fail(
        "E0873",
        f"config `{name}` is a list, one value per repeated block; it has no single value here",
        span,
        "a config list",
        help=f"pass it to the elements of a repeated block, `block layers: "
        f"[Layer<...>(x = {name}); N]`, where each element reads its own value as config `x`",
    )
