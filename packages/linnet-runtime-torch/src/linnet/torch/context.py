"""Contexts: the parameters and states (KV caches) a model's entries and plans run against."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class Context:
    """What entries and executables read at run time: ``parameters`` and ``states`` by path.
    States are allocated once per context and written in place.

    ``join(paths)`` lays sibling parameters out one after another in one buffer (made once,
    the first time it is asked; the parameters become views of it, so nothing is copied per
    step and nothing is held twice) and returns that buffer, or None where they cannot be laid
    out so (different dtypes or trailing shapes, or a path already joined elsewhere).

    ``inputs`` holds the current step's entry inputs as the step reads them on the device (for
    ``Captured``, the graph's own input buffers) and ``host_inputs`` those the caller gave as
    CPU tensors, both by graph value name (``"%pos"``). ``Plan.run`` and ``Captured`` set them
    before each step, so that an executable's ``prepare`` knows which tensor the coming step
    reads and can take a step's positions from the host instead of reading device memory (a
    read that would wait for the device). ``host_inputs`` is empty where the caller gave device
    tensors.
    """

    def __init__(self, parameters: dict[str, torch.Tensor], states: dict[str, torch.Tensor],
                 device: torch.device):
        self.parameters = parameters
        self.states = states
        self.device = device
        self.inputs: dict[str, torch.Tensor] = {}
        self.host_inputs: dict[str, torch.Tensor] = {}
        self._joined: dict[tuple[str, ...], torch.Tensor] = {}
        self._owner: dict[str, tuple[str, ...]] = {}

    def join(self, paths: Sequence[str]) -> torch.Tensor | None:
        key = tuple(paths)
        if key in self._joined:
            return self._joined[key]
        if len(key) < 2 or any(p not in self.parameters for p in key):
            return None
        if any(p in self._owner for p in key):
            return None
        tensors = [self.parameters[p] for p in key]
        first = tensors[0]
        if any(t.dtype != first.dtype or t.shape[1:] != first.shape[1:] or t.device != first.device
               for t in tensors):
            return None
        joined = torch.cat([t.reshape(t.shape[0], -1) for t in tensors]).reshape(
            (sum(t.shape[0] for t in tensors), *tuple(first.shape[1:])))
        offset = 0
        for p, t in zip(key, tensors):
            self.parameters[p] = joined[offset:offset + t.shape[0]]
            offset += t.shape[0]
            self._owner[p] = key
        self._joined[key] = joined
        return joined

    def scratch(self) -> Context:
        """A context with copies of the states, for timing and checking without side effects.
        Each copy is an inference tensor exactly where its original is (torch.compile guards
        on that: a compiled slice run on the copies must not compile again for the
        originals)."""
        ctx = Context(self.parameters, {k: _copy(v) for k, v in self.states.items()},
                      self.device)
        ctx._joined, ctx._owner = self._joined, self._owner
        return ctx

    def reset(self) -> None:
        """Zero every state (start new sequences)."""
        for t in self.states.values():
            t.zero_()


def _copy(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(t.is_inference()):
        return t.clone()
