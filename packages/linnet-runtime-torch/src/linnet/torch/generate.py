"""`generate`: token generation on a loaded model's `prefill` and `decode` entries.

A batch of prompts of different lengths runs as one batch: the prompts are padded on the
right to the longest, one `prefill` fills every sequence's cache from position 0, and each
sequence's first token comes from the logits at its own last prompt position. Every
`decode` step then feeds each sequence its last token at its own position
(``pos[b] = len(prompt[b]) + step``): a position is written before any later step reads it,
and a step reads only positions up to its own, so the padding a short prompt leaves in the
cache is never attended. Each sequence therefore gets the tokens it would get alone.

Tokens are picked greedily (``temperature=0``, the default: the argmax, ties to the lowest
id, as transformers' greedy search), or sampled from ``softmax(logits / temperature)`` kept
to the ``top_k`` most likely tokens and to the smallest set whose probability reaches
``top_p`` (transformers' warpers, in that order). Sampling draws from a CPU
``torch.Generator`` seeded with ``seed``: the same seed gives the same tokens, on every
device. A sequence stops after it emits one of ``stop_tokens`` (the stop token is kept) or
after ``max_new_tokens``.

Mistakes are coded errors E0810-E0817.

>>> model = load("std.models.llama", weights="Llama-3.2-1B/")          # doctest: +SKIP
>>> model.generate([[128000, 791, 6864], [128000, 9906]], max_new_tokens=8,
...                temperature=0.7, top_p=0.9, seed=0)                  # doctest: +SKIP
[[315, 9822, ...], [11, 1917, ...]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import Diagnostic

import torch


def _error(code: str, message: str, help: str = "") -> LinnetError:
    return LinnetError(Diagnostic(code, message, help=help))


def _prompts(prompts: Any) -> list[list[int]]:
    """The prompts as lists of ints: a list of token lists, one token list, or a tensor."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2) or prompts.is_floating_point():
            raise _error("E0810", f"prompts must be token ids: a list of lists of ints or an "
                         f"integer tensor [B, L], not a {prompts.dtype} tensor of shape "
                         f"{list(prompts.shape)}", help="e.g. [[1, 2, 3], [4, 5]]")
        prompts = prompts.tolist()
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
    if isinstance(prompts, Sequence) and prompts and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts or not all(
            isinstance(p, Sequence) and not isinstance(p, str) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompts):
        raise _error("E0810", "prompts must be token ids: a non-empty list of lists of ints "
                     "(or one list, or an integer tensor [B, L])",
                     help="e.g. model.generate([[1, 2, 3], [4, 5]], max_new_tokens=8)")
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise _error("E0810", f"prompt {empty[0]} is empty: prefill needs at least one token",
                     help="start each prompt with at least one token (a BOS token, say)")
    return [list(p) for p in prompts]


def _check(model: Any, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any,
           seed: Any, stop_tokens: Any) -> None:
    missing = [e for e in ("prefill", "decode") if e not in model.entries]
    if missing:
        raise _error("E0816", f"generate runs a model's `prefill` and `decode` entries; this "
                     f"model has no {' and no '.join(f'`{m}`' for m in missing)} (entries: "
                     f"{', '.join(model.entries)})",
                     help="give the model `entry prefill<L: Dim>(tokens: Tensor[B, L; i32]) -> "
                          "Tensor[B, L, V; f32]` and `entry decode(token: Tensor[B; i32], pos: "
                          "Tensor[B; i32]) -> Tensor[B, V; f32]`, as std.models.llama does")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise _error("E0811", f"max_new_tokens must be a positive int, not {max_new_tokens!r}",
                     help="e.g. max_new_tokens=16")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
            or not temperature >= 0 or temperature == float("inf"):
        raise _error("E0812", f"temperature must be a finite number >= 0, not {temperature!r}",
                     help="0 picks the most likely token (greedy); 0.7 samples, 1.0 samples "
                          "the model's distribution")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 1):
        raise _error("E0813", f"top_k must be None or an int >= 1, not {top_k!r}",
                     help="e.g. top_k=50 keeps the 50 most likely tokens")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, int | float)
                              or not 0 < top_p <= 1):
        raise _error("E0814", f"top_p must be None or a number in (0, 1], not {top_p!r}",
                     help="e.g. top_p=0.9 keeps the most likely tokens that reach 90%")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _error("E0815", f"seed must be None or an int, not {seed!r}", help="e.g. seed=0")
    if not isinstance(stop_tokens, Sequence | set | frozenset) or isinstance(stop_tokens, str) \
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_tokens):
        raise _error("E0815", f"stop_tokens must be a list of token ids, not {stop_tokens!r}",
                     help="e.g. stop_tokens=[2] (the tokenizer's EOS id)")


def _check_length(model: Any, prompt: int, tokens: int) -> None:
    """E0817 before anything runs when the last decode step would pass the positions the
    model's decode entry takes (its KV cache's length)."""
    from linnet.lang.ir.bounds import bounds_for

    one = torch.zeros(1, dtype=torch.int32)
    graph = model.graph("decode", [one, one])
    r = next((r for name, r in bounds_for(graph).inputs.items() if name == "%pos"), None)
    last = prompt + tokens - 2  # the position of the last decode step
    if r is None or tokens < 2 or last < r.hi:
        return
    raise _error("E0817", f"a prompt of {prompt} tokens and max_new_tokens={tokens} decode up "
                 f"to position {last}, but `decode` takes positions below {r.hi} "
                 f"({r.upper.describe(graph)})",
                 help=f"generate at most {max(1, r.hi - prompt + 1)} tokens after this prompt, "
                      "or load the model with a longer cache (config={'S': ...})")


def pick(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
         top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of ``logits`` [B, V]: the argmax when ``temperature`` is 0,
    else a sample of ``softmax(logits / temperature)`` kept to ``top_k`` and ``top_p``.

    >>> pick(torch.tensor([[0.0, 3.0, 1.0]])).tolist()
    [1]
    >>> pick(torch.tensor([[0.0, 3.0, 1.0]]), temperature=1.0, top_k=1).tolist()
    [1]
    """
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    scores = logits / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        # transformers' TopPLogitsWarper: drop the least likely tokens whose probabilities sum
        # to at most 1 - top_p; the most likely token is always kept.
        ordered, index = torch.sort(scores, descending=False, dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)
        drop[..., -1] = False
        scores = scores.masked_fill(drop.scatter(-1, index, drop), float("-inf"))
    probs = scores.softmax(dim=-1).cpu()
    return torch.multinomial(probs, 1, generator=generator)[:, 0].to(logits.device)


def generate(model: Any, prompts: Any, max_new_tokens: int = 16, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             stop_tokens: Sequence[int] = (), on_token: Callable[[int, list[int]], None]
             | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens after each prompt (a list of token-id lists of
    any lengths; one list or an integer tensor [B, L] also do); returns each prompt's new
    tokens, ending at its first stop token. ``on_token(step, tokens)`` is called after each
    step with the batch's tokens of that step (timing, streaming). The model's own cache is
    not touched: the generation runs in a fresh context.

    >>> model.generate([[1, 2, 3], [4]], max_new_tokens=4)                 # doctest: +SKIP
    [[17, 9, 9, 30], [5, 5, 211, 2]]
    >>> model.generate([[1, 2, 3]], 4, temperature=0.8, top_k=40, seed=1)  # doctest: +SKIP
    [[17, 230, 9, 41]]
    """
    batch = _prompts(prompts)
    _check(model, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens)
    stops = {int(t) for t in stop_tokens}
    lengths = [len(p) for p in batch]
    longest = max(lengths)
    _check_length(model, longest, max_new_tokens)
    # Right padding with each prompt's own last token: a valid id for any vocabulary.
    rows = [p + [p[-1]] * (longest - len(p)) for p in batch]
    tokens = torch.tensor(rows, dtype=torch.int32)
    generator = None
    if temperature != 0:
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        else:
            generator.seed()
    context = model.new_context("prefill", [tokens])
    logits = model.prefill(tokens, context=context)
    last = torch.tensor([n - 1 for n in lengths], device=logits.device)
    step_logits = logits[torch.arange(len(batch), device=logits.device), last]
    out: list[list[int]] = [[] for _ in batch]
    done = [False] * len(batch)
    pos = list(lengths)
    for step in range(max_new_tokens):
        picked = pick(step_logits, temperature, top_k, top_p, generator).tolist()
        for b, token in enumerate(picked):
            if not done[b]:
                out[b].append(int(token))
                done[b] = int(token) in stops
        if on_token is not None:
            on_token(step, [o[-1] for o in out])
        if all(done) or step == max_new_tokens - 1:
            break
        # A finished sequence repeats its last token at a position that no longer moves: it
        # writes the same cache entry again, and its logits are not used.
        feed = torch.tensor([o[-1] for o in out], dtype=torch.int32)
        at = torch.tensor(pos, dtype=torch.int32)
        step_logits = model.decode(feed, at, context=context)
        pos = [p + (0 if done[b] else 1) for b, p in enumerate(pos)]
    return out
