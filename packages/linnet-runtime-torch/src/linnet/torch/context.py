"""Contexts: the parameters and states (KV caches) a model's entries and plans run against."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import torch


class Parameters(MutableMapping[str, torch.Tensor]):
    """``context.parameters``: the model's parameters and the context's states, by path.

    The backend contract says an executable reads parameters *and* states from
    ``context.parameters[path]``; parameters live in the model (one dict shared by every
    context) and states in each context, so this is a view over both. Assigning a path
    replaces the parameter (or, for a state path, the context's state).

    >>> ctx = Context({"w": torch.ones(2)}, {"cache": torch.zeros(3)}, torch.device("cpu"))
    >>> ctx.parameters["cache"] is ctx.states["cache"], "cache" in ctx.parameters
    (True, True)
    >>> sorted(ctx.parameters)
    ['cache', 'w']
    """

    __slots__ = ("_params", "_states")

    def __init__(self, params: dict[str, torch.Tensor], states: dict[str, torch.Tensor]):
        self._params = params
        self._states = states

    def __getitem__(self, path: str) -> torch.Tensor:
        try:
            return self._params[path]
        except KeyError:
            pass
        try:
            return self._states[path]
        except KeyError:
            raise KeyError(path) from None

    def __setitem__(self, path: str, value: torch.Tensor) -> None:
        if path in self._states and path not in self._params:
            self._states[path] = value
        else:
            self._params[path] = value

    def __delitem__(self, path: str) -> None:
        if path in self._params:
            del self._params[path]
        else:
            del self._states[path]

    def __contains__(self, path: object) -> bool:
        return path in self._params or path in self._states

    def __iter__(self) -> Iterator[str]:
        yield from self._params
        yield from (p for p in self._states if p not in self._params)

    def __len__(self) -> int:
        return len(self._params) + sum(1 for p in self._states if p not in self._params)

    def __repr__(self) -> str:
        return f"Parameters({len(self._params)} parameters, {len(self._states)} states)"


# Joined buffers, found from the views that replaced the joined parameters: id(view) ->
# (a weak reference to the view, the joined paths, the buffer). The views live in the
# model's parameter dict, which every context of the model shares, so a join made through
# one context is found by the next: joined once per model, held once. An entry goes when
# its view does (weakref.finalize), before its id can be reused.
_JOINS: dict[int, tuple[Any, tuple[str, ...], torch.Tensor]] = {}


def _join_of(t: torch.Tensor) -> tuple[tuple[str, ...], torch.Tensor] | None:
    entry = _JOINS.get(id(t))
    if entry is None or entry[0]() is not t:
        return None
    return entry[1], entry[2]


def _remember(view: torch.Tensor, key: tuple[str, ...], joined: torch.Tensor) -> None:
    _JOINS[id(view)] = (weakref.ref(view), key, joined)
    weakref.finalize(view, _JOINS.pop, id(view), None)


class Context:
    """What entries and executables read at run time: ``parameters`` and ``states`` by path.
    States are allocated once per context and written in place. ``parameters`` also answers
    for states (the contract's ``context.parameters[path]``; see :class:`Parameters`).

    ``join(paths)`` lays sibling parameters out one after another in one buffer and returns
    it, or None where they cannot be laid out so (different dtypes or trailing shapes, or a
    path already joined with other paths). The buffer is made once per model, the first time
    any of its contexts asks: the parameters become views of it in the model's parameter
    dict, so nothing is copied per step, nothing is held twice, and a later context (or the
    same one) asking for the same paths gets the same buffer.

    ``inputs`` holds the current step's entry inputs as the step reads them on the device (for
    ``Captured``, the graph's own input buffers) and ``host_inputs`` those the caller gave as
    CPU tensors, both by graph value name (``"%pos"``). ``Plan.run`` and ``Captured`` set them
    before each step, so that an executable's ``prepare`` knows which tensor the coming step
    reads and can take a step's positions from the host instead of reading device memory (a
    read that would wait for the device). ``host_inputs`` is empty where the caller gave device
    tensors.

    >>> params = {"q": torch.ones(2, 4), "k": torch.zeros(3, 4)}
    >>> a = Context(params, {}, torch.device("cpu"))
    >>> b = Context(params, {}, torch.device("cpu"))
    >>> a.join(["q", "k"]).data_ptr() == b.join(["q", "k"]).data_ptr()
    True
    """

    def __init__(
        self,
        parameters: Mapping[str, torch.Tensor],
        states: dict[str, torch.Tensor],
        device: torch.device,
    ):
        # A Parameters view (from another context) stands for the model's dict it wraps.
        self._params: dict[str, torch.Tensor] = (
            parameters._params if isinstance(parameters, Parameters) else parameters  # type: ignore[assignment]
        )
        self._states = states
        self._view = Parameters(self._params, states)
        self.device = device
        self.inputs: dict[str, torch.Tensor] = {}
        self.host_inputs: dict[str, torch.Tensor] = {}

    @property
    def parameters(self) -> Parameters:
        """The model's parameters, and this context's states, by path."""
        return self._view

    @parameters.setter
    def parameters(self, value: Mapping[str, torch.Tensor]) -> None:
        self._params = value._params if isinstance(value, Parameters) else value  # type: ignore[assignment]
        self._view = Parameters(self._params, self._states)

    @property
    def states(self) -> dict[str, torch.Tensor]:
        """This context's states (KV caches) by path, written in place."""
        return self._states

    @states.setter
    def states(self, value: dict[str, torch.Tensor]) -> None:
        self._states = value
        self._view = Parameters(self._params, value)

    def join(self, paths: Sequence[str]) -> torch.Tensor | None:
        """One buffer holding the parameters ``paths`` one after another (see the class).

        >>> ctx = Context({"a": torch.ones(1, 2), "b": torch.ones(2, 2)}, {}, torch.device("cpu"))
        >>> ctx.join(["a", "b"]).shape
        torch.Size([3, 2])
        """
        key = tuple(paths)
        params = self._params
        if len(key) < 2 or len(set(key)) != len(key) or any(p not in params for p in key):
            return None
        tensors = [params[p] for p in key]
        owners = [_join_of(t) for t in tensors]
        if owners[0] is not None and all(o is not None and o[0] == key for o in owners):
            return owners[0][1]  # joined before, through this model's parameters
        if any(o is not None for o in owners):
            return None  # some of them are laid out with other parameters already
        first = tensors[0]
        if first.dim() == 0 or any(
            t.dim() != first.dim()
            or t.dtype != first.dtype
            or t.shape[1:] != first.shape[1:]
            or t.device != first.device
            for t in tensors
        ):
            return None
        joined = torch.cat([t.reshape(t.shape[0], -1) for t in tensors]).reshape(
            (sum(t.shape[0] for t in tensors), *tuple(first.shape[1:]))
        )
        offset = 0
        for p, t in zip(key, tensors):
            view = joined[offset : offset + t.shape[0]]
            params[p] = view
            _remember(view, key, joined)
            offset += t.shape[0]
        return joined

    def scratch(self, only: Iterable[str] | None = None) -> Context:
        """A context with copies of the states, for timing and checking without side effects.
        Each copy is an inference tensor exactly where its original is (torch.compile guards
        on that: a compiled slice run on the copies must not compile again for the
        originals). ``only``: copy just those states, the others shared with this context
        (checking one region, which touches its own states: one layer's KV cache, not all).

        >>> ctx = Context({}, {"a": torch.zeros(1), "b": torch.zeros(1)}, torch.device("cpu"))
        >>> part = ctx.scratch(only=["a"])
        >>> part.states["a"] is ctx.states["a"], part.states["b"] is ctx.states["b"]
        (False, True)
        """
        keep = None if only is None else set(only)
        return Context(
            self._params,
            {k: _copy(v) if keep is None or k in keep else v for k, v in self._states.items()},
            self.device,
        )

    def reset(self) -> None:
        """Zero every state (start new sequences)."""
        for t in self._states.values():
            t.zero_()


def _copy(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(t.is_inference()):
        return t.clone()
