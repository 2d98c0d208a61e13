"""A mixture of experts' per-expert checkpoint tensors, stacked as they load.

A Hugging Face checkpoint stores each expert's weights as tensors of their own,
``model.layers.0.block_sparse_moe.experts.3.w1.weight`` (Mixtral) or
``model.layers.0.mlp.experts.3.gate_proj.weight`` (Qwen2-MoE): transformers 5's
``save_pretrained`` writes them so, although it holds them stacked in memory. std.nn.moe's
experts are stacked parameters (``...experts.w1.weight`` of shape ``[E, F, D]``: expert ``m``
is row ``m`` of the first axis), so that one op and one kernel launch read any of them by
index. The rule is one and by name, for every model: the tensors ``<head>.experts.<m>.<tail>``
for ``m`` = 0 .. E-1 are the parameter ``<head>.experts.<tail>``, stacked in ``m``'s order.

Their shapes are stacked when the headers are read (:func:`stack_shapes`: dims bind and
parameters check against the stacked shapes), the values when the tensors are (each
runtime's loader calls :func:`stack_tensors` with its own ``stack``). A set of experts with a
gap (E0886), experts of different shapes or dtypes (E0887), or a stacked name the checkpoint
also holds (E0888) is a Linnet error naming the tensors.

Pure Python, shared by every runtime.

>>> from linnet.lang.weights.safetensors import TensorInfo
>>> shapes = {f"m.experts.{i}.w1.weight": TensorInfo((4, 2), "f32", "") for i in range(3)}
>>> {k: tuple(v) for k, v in stack_shapes(shapes).items()}
{'m.experts.w1.weight': ((3, 4, 2), 'f32')}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from linnet.lang.diagnostics.core import Diagnostic, LinnetError

from .safetensors import TensorInfo

EXPERT_NAME = re.compile(
    r"^(?P<head>(?:.+\.)?experts)\.(?P<index>0|[1-9][0-9]{0,5})\.(?P<tail>.+)$"
)
V = TypeVar("V")


def expert_groups(names: Iterable[str]) -> dict[str, list[str]]:
    """Each stacked parameter's name and its per-expert tensors, in expert order (not
    validated: :func:`check_groups` does that).

    >>> expert_groups(["a.experts.1.w.weight", "a.experts.0.w.weight", "a.norm.weight"])
    {'a.experts.w.weight': ['a.experts.0.w.weight', 'a.experts.1.w.weight']}
    """
    found: dict[str, dict[int, str]] = {}
    for name in names:
        m = EXPERT_NAME.match(name)
        if m is not None:
            stacked = f"{m['head']}.{m['tail']}"
            found.setdefault(stacked, {})[int(m["index"])] = name
    return {k: [v[i] for i in sorted(v)] for k, v in sorted(found.items())}


def check_groups(shapes: dict[str, Any], groups: dict[str, list[str]]) -> None:
    """E0886 (a gap in the experts' indices), E0887 (experts of different shapes or
    dtypes), E0888 (the stacked name is a tensor of the checkpoint too): every problem of
    every group in one error.

    >>> check_groups({"e.experts.1.w": ((2,), "f32")}, {"e.experts.w": ["e.experts.1.w"]})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0886]: the checkpoint has experts 1 of `e.experts.w` but not expert 0
    ...
    """
    diags: list[Diagnostic] = []
    for stacked, parts in groups.items():
        indices = {int(EXPERT_NAME.match(p)["index"]) for p in parts}  # type: ignore[index]
        missing = sorted(set(range(max(indices) + 1)) - indices)
        if missing:
            shown = ", ".join(str(i) for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
            diags.append(
                Diagnostic(
                    "E0886",
                    f"the checkpoint has experts {_ranges(sorted(indices))} of `{stacked}` "
                    f"but not expert{'s' if len(missing) > 1 else ''} {shown}",
                    help="a mixture of experts' tensors are stacked by index, 0 to E-1, and "
                    "none may be missing: the checkpoint is incomplete (a shard left out?); "
                    "save or download it again",
                )
            )
        kinds = {(tuple(shapes[p][0]), shapes[p][1]) for p in parts}
        if len(kinds) > 1:
            first = (tuple(shapes[parts[0]][0]), shapes[parts[0]][1])
            odd = next(p for p in parts if (tuple(shapes[p][0]), shapes[p][1]) != first)
            diags.append(
                Diagnostic(
                    "E0887",
                    f"the experts of `{stacked}` differ: `{parts[0]}` is "
                    f"{list(first[0])} {first[1]}, `{odd}` is {list(shapes[odd][0])} "
                    f"{shapes[odd][1]}",
                    help="every expert of a layer has the same shape and dtype, so that they "
                    "stack into one [E, ...] parameter; the checkpoint mixes two models or "
                    "two saves",
                )
            )
        if stacked in shapes:
            diags.append(
                Diagnostic(
                    "E0888",
                    f"the checkpoint holds `{stacked}` and its experts one by one "
                    f"(`{parts[0]}`, ...): which one is the parameter is ambiguous",
                    help="keep one form: the stacked tensor, or the per-expert tensors it "
                    "stacks (transformers' save_pretrained writes the per-expert ones)",
                )
            )
    if diags:
        raise LinnetError(diags)


def stack_shapes(shapes: dict[str, Any]) -> dict[str, Any]:
    """``shapes`` (name -> ``(shape, dtype)``, a :class:`TensorInfo` or a plain pair) with
    each expert group replaced by its stacked parameter, ``(E, *shape)`` (the shard of the
    first expert); unchanged where the checkpoint has no experts.

    >>> stack_shapes({"x.weight": ((2,), "f32")})
    {'x.weight': ((2,), 'f32')}
    """
    groups = expert_groups(shapes)
    if not groups:
        return shapes
    check_groups(shapes, groups)
    grouped = {p for parts in groups.values() for p in parts}
    out = {k: v for k, v in shapes.items() if k not in grouped}
    for stacked, parts in groups.items():
        shape, dtype = shapes[parts[0]][0], shapes[parts[0]][1]
        out[stacked] = TensorInfo(
            (len(parts), *shape), dtype, getattr(shapes[parts[0]], "shard", "")
        )
    return out


def stack_tensors(tensors: dict[str, V], stack: Callable[[list[V]], V]) -> dict[str, V]:
    """``tensors`` with each expert group replaced by ``stack(parts)`` in expert order, each
    group's parts dropped as it is stacked (one layer's experts are held twice at most).
    The shapes were checked by :func:`stack_shapes` when the headers were read.

    >>> stack_tensors({"a.experts.0.w": [1], "a.experts.1.w": [2]}, lambda p: [v for x in p for v in x])
    {'a.experts.w': [1, 2]}
    """
    groups = expert_groups(tensors)
    if not groups:
        return tensors
    check_groups({k: _shape_of(v) for k, v in tensors.items()}, groups)
    out = dict(tensors)
    for stacked, parts in groups.items():
        out[stacked] = stack([out.pop(p) for p in parts])
    return out


def _shape_of(value: Any) -> tuple[tuple, str]:
    """A tensor's (shape, dtype) for :func:`check_groups`: anything with ``.shape`` and
    ``.dtype`` (torch, NumPy, JAX), else a list (the doctests')."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return ((len(value),), "list")
    return (tuple(shape), str(value.dtype))


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
