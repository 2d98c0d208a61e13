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
after ``max_new_tokens``; left out, ``stop_tokens`` are the model's own (``model.stop_tokens``:
the checkpoint's end-of-sequence tokens, from its generation_config.json or config.json, as
transformers stops), and ``stop_tokens=[]`` runs every sequence to ``max_new_tokens``.

Edge values have one meaning each: a tiny positive temperature (down to the smallest
double) samples among the most likely tokens only (greedy, but for exact ties), a huge one
samples uniformly among the tokens top_k and top_p keep; logits that are not all finite
(a NaN weight, say) stop generation with E0818 naming the step and position, checked in
the copy of each step's tokens to the host that generation makes anyway (no extra
synchronisation).

Mistakes are coded errors E0810-E0819 and E0794 (an option generate does not have); prompt
ids outside the vocabulary are E0780, as from ``prefill`` itself.

>>> model = load("std.models.llama", weights="Llama-3.2-1B/")          # doctest: +SKIP
>>> model.generate([[128000, 791, 6864], [128000, 9906]], max_new_tokens=8,
...                temperature=0.7, top_p=0.9, seed=0)                  # doctest: +SKIP
[[315, 9822, ...], [11, 1917, ...]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.check.hints import did_you_mean
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.hosting import check_sampling, range_error, stop_token_error

import torch

# generate's keyword options: Model.generate(**options) checks the names against these.
OPTIONS = ("temperature", "top_k", "top_p", "seed", "stop_tokens", "on_token",
           "max_new_tokens")


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


def check_options(options: dict[str, Any]) -> None:
    """E0794 for a keyword option ``generate`` does not have (``repetition_penalty``, a
    misspelt ``top-k``), before anything runs: not Python's TypeError.

    >>> check_options({"temperature": 0.7, "top_k": 40})
    >>> check_options({"tempreature": 0.7})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0794]: generate has no option ...
    """
    for name in options:
        if name not in OPTIONS:
            raise _error("E0794", f"generate has no option `{name}`",
                         help=did_you_mean(name, OPTIONS, "its options are: "
                                           + ", ".join(OPTIONS)))


def _check(model: Any, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any,
           seed: Any, stop_tokens: Any, on_token: Any) -> None:
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
    check_sampling(temperature, top_k, top_p, seed)
    if not isinstance(stop_tokens, Sequence | set | frozenset) or isinstance(stop_tokens, str) \
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_tokens):
        raise _error("E0815", f"stop_tokens must be a list of token ids, not {stop_tokens!r}",
                     help="e.g. stop_tokens=[2] (the tokenizer's EOS id)")
    if on_token is not None and not callable(on_token):
        raise _error("E0815", f"on_token must be None or a function of (step, tokens), not "
                     f"{type(on_token).__name__} {on_token!r:.40}",
                     help="e.g. on_token=lambda step, tokens: print(step, tokens)")


def _vocabulary(model: Any, tokens: list[list[int]], stop_tokens: Any,
                stops_from: str = "stop_tokens") -> None:
    """Before anything runs: every prompt id in the range ``prefill``'s token input takes
    (E0780, the message ``prefill`` itself gives, also for ids no int32 holds, such as
    2**64), and every stop token an id the model can emit (E0819: one it cannot would never
    stop a sequence). The graph is the one ``prefill`` runs (lowered once for both)."""
    from linnet.lang.ir.bounds import bounds_for

    shape = (len(tokens), len(tokens[0]))
    graph = model.graph("prefill", [torch.zeros(shape, dtype=torch.int32)])
    r = bounds_for(graph).inputs.get(graph.inputs[0])
    flat = [t for row in tokens for t in row]
    if r is not None and any(t < r.lo or t >= r.hi for t in flat):
        raise range_error(graph, "prefill", r, flat, shape)
    logits = graph.values[graph.outputs[0]].shape
    vocabulary = logits[-1] if logits else None
    for t in stop_tokens:
        if t < 0 or (isinstance(vocabulary, int) and t >= vocabulary):
            raise stop_token_error(t, vocabulary if isinstance(vocabulary, int) else None,
                                   stops_from)


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
    """
    logits = logits.float()
    finite = torch.isfinite(logits).all(dim=-1)
    if temperature == 0:
        return torch.where(finite, logits.argmax(dim=-1), -1)
    # Scores relative to each row's largest logit, divided in float64: a tiny temperature
    # (5e-324 is no float32) sends every other score to -inf and keeps the largest at 0
    # (sampling the most likely tokens only), where logits / temperature would give
    # inf - inf = NaN; a huge one sends every score to 0 (uniform). A row that is not
    # finite is sampled as zeros, so that multinomial runs; its token is replaced by -1.
    clean = torch.where(finite[:, None], logits, 0.0)
    shifted = (clean - clean.amax(dim=-1, keepdim=True)).double()
    scores = (shifted / temperature).float()
    # top_k and top_p rank tokens by their logits (``shifted``), an order dividing by the
    # temperature keeps but may round into ties (every score 0 at 1e308).
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(shifted, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(shifted < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        # transformers' TopPLogitsWarper: drop the least likely tokens whose probabilities sum
        # to at most 1 - top_p; the most likely token is always kept.
        index = torch.argsort(shifted.masked_fill(scores == float("-inf"), float("-inf")),
                              dim=-1, stable=True)
        cumulative = scores.gather(-1, index).softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)
        drop[..., -1] = False
        scores = scores.masked_fill(drop.scatter(-1, index, drop), float("-inf"))
    probs = scores.softmax(dim=-1).cpu()
    picked = torch.multinomial(probs, 1, generator=generator)[:, 0].to(logits.device)
    return torch.where(finite, picked, -1)


def _not_finite(batch: list[list[int]], b: int, step: int, out: list[list[int]]
                ) -> LinnetError:
    """E0818: sequence ``b``'s logits at ``step`` are not all finite."""
    position = len(batch[b]) + step - 1
    entry = "prefill" if step == 0 else "decode"
    return _error("E0818", f"the logits of sequence {b} at step {step} (`{entry}` at position "
                  f"{position}, after {len(out[b])} generated token(s)) are not all finite: "
                  "no token can be picked from NaN or infinity",
                  help="a NaN or infinite weight, or a config value out of range (a "
                       "negative rms_norm_eps, say), makes the logits non-finite: check "
                       "the checkpoint and the config; `model.prefill` on the prompt shows "
                       "the logits")


def generate(model: Any, prompts: Any, max_new_tokens: int = 16, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             stop_tokens: Sequence[int] | None = None, on_token: Callable[[int, list[int]], None]
             | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens after each prompt (a list of token-id lists of
    any lengths; one list or an integer tensor [B, L] also do); returns each prompt's new
    tokens, ending at its first stop token (``stop_tokens``; None: the model's own,
    ``model.stop_tokens``; ``[]``: none). ``on_token(step, tokens)`` is called after each
    step with the batch's tokens of that step (timing, streaming). The model's own cache is
    not touched: the generation runs in a fresh context. Everything is checked before
    anything runs (prompt ids and stop tokens against the vocabulary, the options' types
    and ranges, the cache's length), but for non-finite logits, found at their step (E0818).

    >>> model.generate([[1, 2, 3], [4]], max_new_tokens=4)                 # doctest: +SKIP
    [[17, 9, 9, 30], [5, 5, 211, 2]]
    >>> model.generate([[1, 2, 3]], 4, temperature=0.8, top_k=40, seed=1)  # doctest: +SKIP
    [[17, 230, 9, 41]]
    """
    batch = _prompts(prompts)
    stops_from = "stop_tokens"
    if stop_tokens is None:  # the checkpoint's end-of-sequence tokens
        stop_tokens = tuple(getattr(model, "stop_tokens", ()))
        stops_from = getattr(model, "stop_tokens_source", "") or "model.stop_tokens"
    _check(model, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens, on_token)
    stops = {int(t) for t in stop_tokens}
    lengths = [len(p) for p in batch]
    longest = max(lengths)
    # Right padding with each prompt's own last token: a valid id for any vocabulary.
    rows = [p + [p[-1]] * (longest - len(p)) for p in batch]
    _vocabulary(model, rows, stop_tokens, stops_from)
    _check_length(model, longest, max_new_tokens)
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
        # The step's one copy to the host: its tokens, -1 where the logits are not finite.
        picked = pick(step_logits, temperature, top_k, top_p, generator).tolist()
        for b, token in enumerate(picked):
            if not done[b]:
                if token < 0:
                    raise _not_finite(batch, b, step, out)
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
