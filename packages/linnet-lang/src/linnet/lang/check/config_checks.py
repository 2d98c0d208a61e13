"""The checks every kind of config shares: one value (``config w: f32``), a config list (one
value per repeated block, :mod:`linnet.lang.check.config_lists`) and a tensor config (one
list for the block, :mod:`linnet.lang.check.const_tensors`).

A config without a value is E0612 when lowering (while checking, before a config is given,
its value is only unknown); a value an enclosing block passes down of another kind of config
(a list to a tensor config, a tensor to a list or one value) is E0613; a value's numbers are
plain Python numbers (a dim-typed config holds a :class:`Dim`).

>>> from linnet.lang.tensors.dims import Dim
>>> plain(Dim.const(4)), plain(2.5)
(4, 2.5)
"""

from __future__ import annotations

from typing import Any, TypeVar

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import fail
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import ConstList, ConstTensor

V = TypeVar("V")


def plain(value: Any) -> Any:
    """``value`` as a plain number: a :class:`Dim`'s value (None when unknown), else as is.

    >>> plain(Dim.const(3))
    3
    """
    return value.value if isinstance(value, Dim) else value


def no_value(ev: Any, m: A.Member, unknown: V, help: str) -> V:
    """What config ``m``, given no value and declared without a default, is: ``unknown``
    while checking (the config comes when lowering); E0612 when lowering, with ``help``
    saying how to give one. ``ev`` is the Evaluator (``ev.lowering``).

    >>> from types import SimpleNamespace
    >>> m = A.Member("config", "w", None, None)
    >>> no_value(SimpleNamespace(lowering=False), m, "unknown", "pass it")
    'unknown'
    """
    if not ev.lowering:
        return unknown
    raise fail(
        "E0612",
        f"config `{m.name}` has no value",
        m.span,
        "declared without a default",
        help=help,
    )


def check_passed_kind(m: A.Member, passed: Any) -> None:
    """E0613 when an enclosing block passes config ``m`` (explicitly or by name) a value of
    another kind of config: a tensor config (``Tensor[N; T]``, one tensor for the block)
    where ``m`` is a config list or one value, or a config list (``[T; N]``, one value per
    repeated block) where ``m`` is a tensor config. Without it the block silently took its
    default. (A scalar reaching a list fills it; a list reaching a scalar is split per
    element or E0873; a scalar reaching a tensor config is E0613 in ``const_tensors``,
    which names the tensor's type.)

    Example, E0613 (the layer's tensor config ``w`` reached by the model's list)::

        pub model M<D: Dim, NL: Dim> {
            config w: [f32; NL] = 3.0
            block layers: [Scale<D>; NL]    // Scale: config w: Tensor[D; f32] = 1.0
        }
    """
    if isinstance(passed, ConstTensor) and not isinstance(m.type, A.TensorType):
        got, fix = "a tensor config (one tensor for the whole block)", "a tensor config"
    elif isinstance(passed, ConstList) and isinstance(m.type, A.TensorType):
        got, fix = "a config list (one value per repeated block)", "a config list"
    else:
        return
    want = (
        "a config list"
        if isinstance(m.type, A.ListType)
        else "a tensor config"
        if isinstance(m.type, A.TensorType)
        else "one value"
    )
    raise fail(
        "E0613",
        f"config `{m.name}` is {want}, but the enclosing block's `{m.name}` is {got}",
        m.span,
        "declared here",
        help=f"declare both as {fix}, or rename one (a config reaches the blocks below by name)",
    )
