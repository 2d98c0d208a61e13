"""`generate`'s fast path on CUDA: the decode step planned and replayed as one CUDA graph.

The first call for a batch bucket (:func:`linnet.lang.host.generate.padded`) plans
``decode`` over every available backend and Linnet's kernels (``Model.plan_for``, with a
progress bar; the timings go to the cache under ``$LINNET_HOME``, so a second process plans
without timing again), makes a context for the plan and a :class:`~linnet.torch.plans.Captured`
step, and keeps the three on the model: every later call with a batch of that bucket reuses
them, whatever its prompts' lengths. The prefill entry (``prefill_last`` where the model
has it) is captured per length bucket into the plan's context (:func:`prefill_logits`): the
bucket's first call plans it over the generated source (compiled where the model is) and
runs it, the second captures it, later ones replay it.

Each step stays on the device: the token picked (:func:`linnet.torch.generate.pick`: greedy
or sampled there) feeds the next replay without a copy to the host; the host gives only
each step's positions (which it knows) through pinned memory. The host reads a step's
tokens (one small copy) after it has queued the next step, so the device never waits for
it; a batch that stops costs at most one step computed for nothing. Greedy decoding
(``temperature=0``, no repetition penalty) captures its pick with the step: the step's
graph ends in :func:`linnet.torch.greedy.greedy_next`, one kernel that picks each row's
token and writes it and the next position into the graph's inputs, so a step is one
replay and one copy of its tokens to the host. A finished sequence's
rows go on being computed at later positions (their cache rows are its own, so no other
sequence sees them) and their tokens are dropped.

>>> model = load("std.models.llama", weights="Llama-3.2-1B/", device="cuda")   # doctest: +SKIP
>>> model.generate([[128000, 791, 6864]], 256)   # plans once, then replays   # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.host.generate import Progress

import torch

from .greedy import greedy_next
from .plans import Captured
from .prefill import first_inputs, first_logits, last_rows


@dataclass
class FastStep:
    """One batch bucket's decode plan, its context (the KV cache generate uses) and its
    captured step, kept on the model (``model._fast_steps``)."""

    plan: Any
    context: Any
    step: Captured
    # One generation at a time uses the context (its KV cache).
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The greedy step: the plan with its pick captured after it (made on first use).
    greedy_step: Captured | None = None
    # Per (prefill entry, length bucket): its captured prefill, or None where it could not be
    # planned or captured (that bucket's prefill then runs call by call).
    prefills: dict[tuple[str, int], Captured | None] = field(default_factory=dict)

    def greedy(self) -> Captured:
        """The plan captured with :func:`~linnet.torch.greedy.greedy_next` after it."""
        if self.greedy_step is None:
            self.greedy_step = Captured(self.plan, self.context, then=_greedy_then)
        return self.greedy_step


def _greedy_then(inputs: list[torch.Tensor], outputs: list[Any]) -> list[torch.Tensor]:
    """After a decode step, inside its graph: pick each row's token and write it and the
    next position (``inputs``: token, pos) for the next replay."""
    return [greedy_next(outputs[0], inputs[0], inputs[1])]


def prefill_logits(
    model: Any, fast: FastStep, entry: str, tokens: torch.Tensor, lengths: list[int]
) -> torch.Tensor:
    """The first new token's logits [B, V] (:func:`~linnet.torch.prefill.first_logits`), from
    the prefill ``entry`` captured for the rows' length bucket into the batch bucket's
    context: a prefill is then one replay, where call by call its launches, not the GPU,
    set the time to the first token at short prompts. The bucket's first call plans the
    entry over the generated source alone (no timing) and runs it eagerly; the second
    captures it; later ones replay. A bucket whose plan or capture fails (a coded error:
    generated source that waits for the host, say) runs call by call from then on.

    >>> prefill_logits(model, fast_step(model, 1), "prefill_last", rows, [3])  # doctest: +SKIP
    """
    key = (entry, int(tokens.shape[1]))
    inputs = first_inputs(entry, tokens, lengths)
    if key not in fast.prefills:
        try:
            plan = model.plan_for(
                entry,
                inputs,
                backends=[],
                compile=model.compile or None,
                measure=False,
                progress=False,
            )
            fast.prefills[key] = Captured(plan, fast.context)
        except LinnetError:
            fast.prefills[key] = None
    step = fast.prefills[key]
    if step is not None:
        try:
            (logits,) = step(inputs)
        except LinnetError as exc:
            if exc.diagnostics[0].code != "E0753":  # not a capture failure: the user's to see
                raise
            fast.prefills[key] = None
        else:
            return last_rows(entry, logits, lengths)
    return first_logits(model, entry, tokens, lengths, fast.context)


def applies(model: Any, fast: bool) -> bool:
    """Whether ``generate`` takes the fast path: on CUDA, one process, generated source (not
    the interpreter), without autograd, unless ``fast=False``.

    >>> applies(load("std.models.llama"), True)         # a CPU model      # doctest: +SKIP
    False
    """
    return (
        fast
        and model.device.type == "cuda"
        and model.world == 1
        and not model.interpret
        and not model.autograd
    )


def fast_step(model: Any, rows: int) -> FastStep:
    """The batch bucket ``rows``'s :class:`FastStep`, planned on first use.

    >>> fast_step(model, 1).plan.explain()                                  # doctest: +SKIP
    """
    steps: dict[int, FastStep] = model.__dict__.setdefault("_fast_steps", {})
    if rows not in steps:
        one = torch.ones(rows, dtype=torch.int32)
        plan = model.plan_for("decode", [one, one], compile=model.compile or None, captured=True)
        context = model.context_for(plan)
        steps[rows] = FastStep(plan, context, Captured(plan, context))
    return steps[rows]


def generate_fast(
    model: Any,
    batch: list[list[int]],
    rows: list[list[int]],
    lengths: list[int],
    max_new_tokens: int,
    progress: Progress,
    pick_step: Callable[[torch.Tensor], torch.Tensor],
    greedy: bool = False,
    *,
    entry: str = "prefill",
) -> list[list[int]]:
    """The generation ``generate`` checked and padded (``rows``, each row's prompt length in
    ``lengths``), on the fast path; ``pick_step(logits)`` picks each step's tokens on the
    device (-1 where not finite); ``entry`` is the prefill entry to run
    (:func:`linnet.lang.host.generate.prefill_entry`). ``greedy``: ``pick_step`` is the
    plain argmax, so the steps after the first pick inside their graph
    (:meth:`FastStep.greedy`).

    >>> generate_fast(model, batch, rows, lengths, 8, progress, pick)        # doctest: +SKIP
    """
    fast = fast_step(model, len(rows))
    with fast.lock:
        tokens = torch.tensor(rows, dtype=torch.int32)
        step_logits = prefill_logits(model, fast, entry, tokens, lengths)
        # Two pinned buffers for the tokens on their way to the host, used in turn: step s's
        # is read before step s + 2 writes its buffer.
        pinned = [torch.empty(len(rows), dtype=torch.int64, pin_memory=True) for _ in range(2)]
        tokens = pick_step(step_logits)
        for s in range(max_new_tokens):
            host = pinned[s % 2]
            host.copy_(tokens, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            if s + 1 < max_new_tokens:
                # Queue step s + 1 before reading step s's tokens. A -1 (logits not finite)
                # is fed as 0, so the embedding stays in range; the host stops at the -1.
                pos = torch.tensor([n + s for n in lengths], dtype=torch.int32)
                if not greedy:
                    feed = tokens.clamp_min(0).to(torch.int32)
                    tokens = pick_step(fast.step([feed, pos])[0])
                elif s == 0:  # the first replay takes step 0's token and positions
                    feed = tokens.clamp_min(0).to(torch.int32)
                    tokens = fast.greedy()([feed, pos])[0]
                else:  # the graph wrote this step's token and positions at the last one
                    tokens = fast.greedy().again([None, pos])[0]
            copied.synchronize()
            if not progress.take(s, host.tolist()[: len(batch)]):
                break
    return progress.out
