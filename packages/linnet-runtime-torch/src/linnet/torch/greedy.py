"""Greedy decoding's pick as one kernel, for `generate`'s captured steps on CUDA.

:func:`linnet.torch.generate.pick` with ``temperature=0`` is the argmax of each row of
logits (ties to the lowest id), or -1 where a row is not all finite; in PyTorch that is
five kernels on the logits (``isfinite``, ``all``, ``argmax``, ``where``) and two more to
feed the token to the next step (``clamp``, a cast), each reading or writing a few hundred
kilobytes in a few microseconds, most of it launch time: about 3% of a 1B model's 1.2 ms
decode step on an H100. :func:`greedy_next` does the whole of it in one Triton kernel,
one program per row: the pick (-1 for a row that is not finite), the next step's token
(the pick, 0 for -1: a valid id, so the embedding stays in range; the host stops at the
-1) written into the step's token buffer, and the step's position advanced by one in
place. :class:`linnet.torch.plans.Captured` runs it inside the step's CUDA graph (its
``then``), so a greedy step is one graph replay and one copy of the picks to the host.

Without Triton (or on tensors Triton cannot run on) the same is written in PyTorch:
:func:`greedy_next_reference`, which the kernel is tested equal to (under Triton's
interpreter on the CPU, and on CUDA).

>>> logits = torch.tensor([[0.0, 3.0, 3.0], [1.0, float("nan"), 0.0]])
>>> feed, pos = torch.zeros(2, dtype=torch.int32), torch.tensor([4, 9], dtype=torch.int32)
>>> greedy_next_reference(logits, feed, pos).tolist(), feed.tolist(), pos.tolist()
([1, -1], [1, 0], [5, 10])
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:  # Triton comes with torch on Linux; without it the PyTorch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - every CI and GPU machine has Triton
    triton = None

#: The logits each program reads per iteration of its loop over the vocabulary.
BLOCK = 2048


def greedy_next_reference(
    logits: torch.Tensor, feed: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """The greedy pick of each row of ``logits`` [B, V] (int64; -1 where the row is not all
    finite), with ``feed`` [B] (int32) set to the picks (0 for -1) and ``pos`` [B] advanced
    by one, in place: what :func:`greedy_next` computes, in PyTorch.

    >>> feed, pos = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    >>> greedy_next_reference(torch.tensor([[0.5, -1.0]]), feed, pos).tolist()
    [0]
    """
    logits = logits.float()
    finite = torch.isfinite(logits).all(dim=-1)
    picked = torch.where(finite, logits.argmax(dim=-1), -1)
    feed.copy_(picked.clamp_min(0))
    pos.add_(1)
    return picked


def _greedy_kernel(logits, stride, V, feed, pos, out, BLOCK: tl.constexpr):  # type: ignore
    """The Triton source of :func:`greedy_next` (one program per row), jitted by
    :func:`_jitted` in the mode ``TRITON_INTERPRET`` says at its first launch."""
    row = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.zeros([BLOCK], tl.int32)
    bad = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        at = start + lanes
        inside = at < V
        x = tl.load(logits + row * stride + at, mask=inside, other=float("-inf"))
        x = x.to(tl.float32)
        # NaN is the one value unequal to itself; +-inf the ones whose abs is inf.
        bad |= (inside & ((x != x) | (tl.abs(x) == float("inf")))).to(tl.int32)
        # Strictly greater: each lane keeps its first (lowest) index of a tie.
        take = x > best
        best = tl.where(take, x, best)
        where = tl.where(take, at, where)
    top = tl.max(best, axis=0)
    # Of the lanes holding the largest logit, the lowest index (torch.argmax's tie rule).
    index = tl.min(tl.where(best == top, where, V), axis=0)
    nonfinite = tl.max(bad, axis=0) > 0
    tl.store(out + row, tl.where(nonfinite, -1, index).to(tl.int64))
    tl.store(feed + row, tl.where(nonfinite, 0, index).to(feed.dtype.element_ty))
    tl.store(pos + row, tl.load(pos + row) + 1)


def _triton_runs(logits: torch.Tensor) -> bool:
    """Whether Triton can run on ``logits``: CUDA tensors, or any under its interpreter."""
    return triton is not None and (
        logits.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    )


def greedy_next(
    logits: torch.Tensor, feed: torch.Tensor, pos: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`greedy_next_reference` as one Triton kernel (where Triton runs on ``logits``;
    else the reference): returns the picks (int64 [B], -1 for a row not all finite; into
    ``out`` where given), sets ``feed`` to them (0 for -1) and advances ``pos`` by one, in
    place. ``logits`` [B, V] is float32, bfloat16 or float16 with unit stride along V;
    ``feed`` and ``pos`` are contiguous int32 or int64 [B]. Allocates nothing but ``out``
    where it is None, so it can run inside a CUDA graph capture.

    >>> logits = torch.randn(4, 50_000, device="cuda")                       # doctest: +SKIP
    >>> feed = torch.zeros(4, dtype=torch.int32, device="cuda"); pos = feed.clone()  # doctest: +SKIP
    >>> bool((greedy_next(logits, feed, pos) == logits.argmax(-1)).all())   # doctest: +SKIP
    True
    """
    rows, vocabulary = logits.shape
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if not _triton_runs(logits) or logits.stride(-1) != 1:
        out.copy_(greedy_next_reference(logits, feed, pos))
        return out
    _launch(logits, vocabulary, feed, pos, out)
    return out


#: The kernel jitted per mode (compiled, or Triton's interpreter): Triton decides which
#: when a function is decorated, and tests switch ``TRITON_INTERPRET`` after import.
_JITTED: dict[bool, Any] = {}


def _jitted() -> Any:
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if interpret not in _JITTED:
        _JITTED[interpret] = triton.jit(_greedy_kernel)
    return _JITTED[interpret]


def _launch(logits: torch.Tensor, vocabulary: int, feed: Any, pos: Any, out: Any) -> None:
    _jitted()[(logits.shape[0],)](
        logits, logits.stride(0), vocabulary, feed, pos, out, BLOCK=BLOCK, num_warps=8
    )
