"""`generate`: token generation on a loaded model's `prefill` and `decode` entries.

A batch of prompts of different lengths runs as one batch: the prompts are padded on the
right to the longest prompt's length bucket and the batch to a power of two
(:func:`linnet.lang.host.generate.padded`: a new prompt length compiles nothing once its
bucket has run), one prefill fills every sequence's cache from position 0, and each
sequence's first token comes from the logits at its own last prompt position: the model's
`prefill_last` entry where it has one (those logits alone, :mod:`linnet.torch.prefill`),
else `prefill`. Every
`decode` step then feeds each sequence its last token at its own position
(``pos[b] = len(prompt[b]) + step``): a position is written before any later step reads it,
and a step reads only positions up to its own, so the padding a short prompt leaves in the
cache is never attended. Each sequence therefore gets the tokens it would get alone.

Tokens are picked greedily (``temperature=0``, the default: the argmax, ties to the lowest
id, as transformers' greedy search), or sampled from ``softmax(logits / temperature)`` kept
to the ``top_k`` most likely tokens and to the smallest set whose probability reaches
``top_p`` (transformers' warpers, in that order). Sampling runs on the logits' device
(inverse-CDF: one uniform per row, drawn from a CPU ``torch.Generator`` seeded with
``seed``): the same seed gives the same tokens on every device, and no step waits for
the device to pick. A sequence stops after it emits one of ``stop_tokens`` (the stop token is kept) or
after ``max_new_tokens``.

Edge values have one meaning each: a tiny positive temperature (down to the smallest
double) samples among the most likely tokens only (greedy, but for exact ties), a huge one
samples uniformly among the tokens top_k and top_p keep; logits that are not all finite
(a NaN weight, say) stop generation with E0818 naming the step and position, checked in
the copy of each step's tokens to the host that generation makes anyway (no extra
synchronisation).

Mistakes are coded errors E0810-E0819 and E0794 (an option generate does not have); prompt
ids outside the vocabulary are E0780, as from ``prefill`` itself. The checks, the errors and
the host's side of each step are :mod:`linnet.lang.host.generate`'s, shared with
``linnet.jax``'s generate.

>>> model = load("std.models.llama", weights="Llama-3.2-1B/")          # doctest: +SKIP
>>> model.generate([[128000, 791, 6864], [128000, 9906]], max_new_tokens=8,
...                temperature=0.7, top_p=0.9, seed=0)                  # doctest: +SKIP
[[315, 9822, ...], [11, 1917, ...]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# OPTIONS and check_options are re-exported: Model.generate checks its options with them.
from linnet.lang.host.generate import (  # noqa: F401
    OPTIONS,
    Progress,
    array_prompts_error,
    check_options,
    prepare,
    prompt_lists,
    sampling_seed,
)
from linnet.lang.host.inputs import error

import torch

from .fast_generate import applies, generate_fast
from .prefill import first_inputs, first_logits


def _prompts(prompts: Any) -> list[list[int]]:
    """The prompts as lists of ints: a list of token lists, one token list, or a tensor."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2) or prompts.is_floating_point():
            raise array_prompts_error("tensor", prompts.dtype, prompts.shape)
        prompts = prompts.tolist()
    return prompt_lists(prompts, "tensor")


def seen_mask(rows: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """[B, V] bools: True where token ``v`` is in row ``b`` of ``rows`` [B, L] (the padded
    prompts: padding repeats a row's own last token, so it adds no id), built once on
    ``rows``' device for ``repetition_penalty``. Ids of ``vocabulary`` or more (an
    embedding larger than the logits) are left out: no logit is theirs, as transformers
    drops them.

    >>> seen_mask(torch.tensor([[0, 2, 2]]), 4).tolist()
    [[True, False, True, False]]
    """
    ids = rows.long().clamp(0, vocabulary)
    mask = torch.zeros((rows.shape[0], vocabulary + 1), dtype=torch.bool, device=rows.device)
    return mask.scatter_(1, ids, True)[:, :vocabulary].contiguous()


#: The smallest penalty :func:`penalize` divides by: float32's smallest normal. A smaller
#: one (5e-324 is no float32) would round to 0, and a logit of 0 divided by it is NaN.
SMALLEST_PENALTY = float(torch.finfo(torch.float32).tiny)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` on float32 ``logits`` [B, V]: each
    logit of a ``seen`` token (a [B, V] bool mask, :func:`seen_mask`) times ``penalty``
    where it is negative, else divided by it (the same float32 arithmetic, so the same
    bits); the others unchanged. A penalty below :data:`SMALLEST_PENALTY` acts as it, and a
    huge one sends the seen negative logits to -inf (never picked), the others to 0.

    >>> logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    >>> penalize(logits, torch.tensor([[True, True, False, False]]), 2.0).tolist()
    [[1.0, -4.0, 2.0, -2.0]]
    """
    penalty = max(penalty, SMALLEST_PENALTY)
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def pick(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    penalty: float | None = None,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row of ``logits`` [B, V]: the argmax when ``temperature`` is 0,
    else a sample of ``softmax(logits / temperature)`` kept to ``top_k`` and ``top_p``.
    With a ``penalty`` (``repetition_penalty``; None and 1.0 change nothing), the logits of
    the tokens ``seen`` [B, V] marks are penalised first (:func:`penalize`), in greedy too.
    A row whose logits are not all finite gives -1 (no token id: :func:`generate` reports
    it as E0818, and ``decode`` refuses it), never a token picked from NaN.

    >>> pick(torch.tensor([[0.0, 3.0, 1.0]])).tolist()
    [1]
    >>> pick(torch.tensor([[0.0, 3.0, 1.0]]), temperature=1.0, top_k=1).tolist()
    [1]
    >>> pick(torch.tensor([[0.0, 3.0, 1.0]]), temperature=1e-300).tolist()  # as greedy
    [1]
    >>> pick(torch.tensor([[0.0, float("nan"), 1.0]])).tolist()
    [-1]
    >>> pick(torch.tensor([[0.0, 3.0, 1.0]]), penalty=4.0,
    ...      seen=torch.tensor([[False, True, False]])).tolist()  # 3 / 4 < 1
    [2]
    """
    logits = logits.float()
    # Finite before the penalty: E0818 is about the model's logits; a huge penalty's -inf
    # (and a tiny one's inf) is a meaning, handled below.
    finite = torch.isfinite(logits).all(dim=-1)
    if penalty is not None and penalty != 1:
        if seen is None or tuple(seen.shape) != tuple(logits.shape):
            raise error(
                "E0868",
                f"pick's repetition penalty needs `seen`, a [B, V] bool mask of the "
                f"tokens seen so far, for logits of shape {list(logits.shape)}; it got "
                f"{'none' if seen is None else list(seen.shape)}",
                help="build it with seen_mask(prompt_rows, V) and update it with each "
                "step's tokens, as generate does",
            )
        logits = penalize(logits, seen, penalty)
    if temperature == 0:
        return torch.where(finite, logits.argmax(dim=-1), -1)
    # Scores relative to each row's largest logit, divided in float64: a tiny temperature
    # (5e-324 is no float32) sends every other score to -inf and keeps the largest at 0
    # (sampling the most likely tokens only), where logits / temperature would give
    # inf - inf = NaN; a huge one sends every score to 0 (uniform). A row that is not
    # finite is sampled as zeros, so that multinomial runs; its token is replaced by -1.
    # The largest is 0 by the where, not by subtracting: a penalised row's largest may be
    # inf (a tiny penalty; its ties are then sampled) or -inf (every token seen).
    clean = torch.where(finite[:, None], logits, 0.0)
    top = clean.amax(dim=-1, keepdim=True)
    shifted = torch.where(clean == top, 0.0, clean - top).double()
    scores = (shifted / temperature).float()
    # top_k and top_p rank tokens by their logits (``shifted``), an order dividing by the
    # temperature keeps but may round into ties (every score 0 at 1e308).
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(shifted, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(shifted < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        # transformers' TopPLogitsWarper: drop the least likely tokens whose probabilities sum
        # to at most 1 - top_p; the most likely token is always kept.
        index = torch.argsort(
            shifted.masked_fill(scores == float("-inf"), float("-inf")), dim=-1, stable=True
        )
        cumulative = scores.gather(-1, index).softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)
        drop[..., -1] = False
        scores = scores.masked_fill(drop.scatter(-1, index, drop), float("-inf"))
    # Inverse-CDF sampling on the logits' device: one uniform per row, drawn on the host from
    # the seeded generator (the same seed gives the same draws on every device), then the
    # first token whose cumulative probability passes it. A token of probability 0 spans
    # no interval, so it is never picked; nothing waits for the device.
    probs = scores.softmax(dim=-1)
    cumulative = probs.cumsum(dim=-1)
    draws = torch.rand((probs.shape[0], 1), generator=generator)
    draws = draws.to(probs.device, non_blocking=True) * cumulative[:, -1:]
    picked = torch.searchsorted(cumulative, draws, right=True)[:, 0]
    picked = picked.clamp_max(probs.shape[-1] - 1)
    return torch.where(finite, picked, -1)


def picker(
    tokens: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
    repetition_penalty: float | None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`pick` with what it keeps between steps: for a repetition penalty, the tokens
    each row has seen (the prompt rows ``tokens``, then every pick), a mask on the logits'
    device made at the first step and updated on the device after each (no mask without a
    penalty, or with 1).

    >>> picks = picker(torch.tensor([[0, 1]]), 0.0, None, None, None, 2.0)
    >>> picks(torch.tensor([[3.0, 2.5, 2.0]])).tolist()  # token 0 seen: 3 / 2 < 2.5 / 2 < 2
    [2]
    """
    penalty = None
    if repetition_penalty is not None and repetition_penalty != 1:
        penalty = float(repetition_penalty)
    seen: torch.Tensor | None = None

    def step(logits: torch.Tensor) -> torch.Tensor:
        nonlocal seen
        if penalty is not None and seen is None:
            seen = seen_mask(tokens.to(logits.device), logits.shape[-1])
        chosen = pick(logits, temperature, top_k, top_p, generator, penalty, seen)
        if seen is not None:  # the picked tokens are seen from now on; -1 (E0818) is none
            index = chosen.clamp_min(0)[:, None]
            seen.scatter_(1, index, seen.gather(1, index) | (chosen >= 0)[:, None])
        return chosen

    return step


def generate(
    model: Any,
    prompts: Any,
    max_new_tokens: int = 16,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens: Sequence[int] | None = None,
    on_token: Callable[[int, list[int]], None] | None = None,
    stop_when: Callable[[int, int], bool] | None = None,
    repetition_penalty: float | None = None,
    fast: bool = True,
) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens after each prompt (a list of token-id lists of
    any lengths; one list or an integer tensor [B, L] also do); returns each prompt's new
    tokens, ending at its first stop token (or where ``stop_when(b, token)`` is True: a
    text prompt's stop string, :mod:`linnet.lang.text.generation`). ``on_token(step,
    tokens)`` is called after each step with the batch's tokens of that step (timing, streaming). The model's own cache is
    not touched: the generation runs in a fresh context. ``repetition_penalty`` (None or
    1.0: none) penalises the logits of every token already in a sequence, its prompt's and
    its generated ones, as transformers' does, before the temperature, ``top_k`` and
    ``top_p`` (and in greedy search): a [B, V] mask of the tokens seen, kept on the logits'
    device. Everything is checked before
    anything runs (prompt ids and stop tokens against the vocabulary, the options' types
    and ranges, the cache's length), but for non-finite logits, found at their step (E0818).

    On CUDA (one process, generated source, no autograd) ``decode`` runs planned and
    captured, steps queued on the device (:mod:`linnet.torch.fast_generate`): the first call
    for a batch size plans, later calls reuse. ``fast=False`` runs the entries one call at a
    time instead, for debugging; on the CPU both are the same path.

    >>> model.generate([[1, 2, 3], [4]], max_new_tokens=4)                 # doctest: +SKIP
    [[17, 9, 9, 30], [5, 5, 211, 2]]
    >>> model.generate([[1, 2, 3]], 4, temperature=0.8, top_k=40, seed=1)  # doctest: +SKIP
    [[17, 230, 9, 41]]
    >>> model.generate([[1, 2, 3]], 4, repetition_penalty=1.3)            # doctest: +SKIP
    [[17, 9, 30, 41]]
    """
    batch = _prompts(prompts)
    ready = prepare(
        model,
        batch,
        max_new_tokens,
        lambda shape: torch.zeros(shape, dtype=torch.int32),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_tokens=stop_tokens,
        on_token=on_token,
        repetition_penalty=repetition_penalty,
        fast=fast,
    )
    # Checked; now as Python numbers (np.float32(0.7) is a fine temperature).
    temperature, top_k, top_p, seed, repetition_penalty = ready.sampling
    rows, lengths = ready.rows, ready.lengths
    tokens = torch.tensor(rows, dtype=torch.int32)
    generator = None
    if temperature != 0:
        generator = torch.Generator()
        generator.manual_seed(sampling_seed(seed))
    progress = Progress(batch, ready.stop_tokens, on_token, stop_when, ready.entry)
    picks = picker(tokens, temperature, top_k, top_p, generator, repetition_penalty)
    if applies(model, fast):
        greedy = temperature == 0 and repetition_penalty in (None, 1)
        return generate_fast(
            model,
            batch,
            rows,
            lengths,
            max_new_tokens,
            progress,
            picks,
            greedy,
            entry=ready.entry,
        )
    context = model.new_context(ready.entry, first_inputs(ready.entry, tokens, lengths))
    step_logits = first_logits(model, ready.entry, tokens, lengths, context)
    pos = list(lengths)
    for step in range(max_new_tokens):
        # The step's one copy to the host: its tokens, -1 where the logits are not finite.
        picked = picks(step_logits).tolist()
        if not progress.take(step, picked[: len(batch)]) or step == max_new_tokens - 1:
            break
        # A finished sequence (and a row that only fills the batch's bucket) repeats its last
        # token at a position that no longer moves: it writes the same cache entry again,
        # and its logits are not used.
        feed = [o[-1] for o in progress.out]
        feed += [feed[-1]] * (len(rows) - len(batch))
        step_logits = model.decode(
            torch.tensor(feed, dtype=torch.int32),
            torch.tensor(pos, dtype=torch.int32),
            context=context,
        )
        pos = [p + (0 if b >= len(batch) or progress.done[b] else 1) for b, p in enumerate(pos)]
    return progress.out
