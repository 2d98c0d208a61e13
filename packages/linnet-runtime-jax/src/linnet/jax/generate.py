"""`generate` on JAX: token generation on a loaded model's `prefill` and `decode` entries,
with the torch runtime's signature, semantics, checks and coded errors
(:mod:`linnet.lang.host.generate` holds what the two share).

A batch of prompts of different lengths runs as one batch: the prompts are padded on the
right to the longest prompt's length bucket and the batch to a power of two
(:func:`linnet.lang.host.generate.padded`), one `prefill` fills every sequence's cache from position 0, and each
sequence's first token comes from the logits at its own last prompt position; each `decode`
step then feeds each sequence its last token at its own position, so each sequence gets the
tokens it would get alone. Tokens are picked greedily (``temperature=0``, the default: the
argmax, ties to the lowest id), or sampled from ``softmax(logits / temperature)`` kept to
the ``top_k`` most likely tokens and to the smallest set whose probability reaches
``top_p``. A sequence stops after one of ``stop_tokens`` (kept) or ``max_new_tokens``.

On the device: each step is one jitted function, the generated entry and the pick together,
``(params, states, last, pos, done, key, step) -> (last, pos, done, states)`` with the states
(the KV cache) donated, traced once per batch shape and way of picking (greedy, or sampling
with or without ``top_k`` and ``top_p``; with or without a repetition penalty, whose [B, V]
mask of the tokens seen is carried from step to step like the states) and reused by every
step and every later call: temperatures, ``k``, ``p``, penalties, seeds and stop tokens are
arguments, never constants, so no value recompiles it (:data:`TRACES` counts the traces). Sampling draws with ``jax.random``
on the device from a key made of the 64 bits of ``seed`` (``threefry2x32``), folded with the
step: the same seed gives the same tokens, but not the torch runtime's (another generator).
The host reads each step's tokens one step behind: from the second step on, step ``s + 1``
is dispatched before step ``s``'s tokens are copied, so the device does not wait for the
host (a batch that stops costs at most one step computed for nothing).

Edge values mean what they mean in the torch runtime: a tiny positive temperature (down to
5e-324) samples only the most likely tokens, a huge one (1e308) uniformly among those
``top_k`` and ``top_p`` keep; logits that are not all finite stop generation with E0818
naming the step and position (the pick gives -1 there, found in the step's one copy).

>>> model = load("std.models.llama", weights="Llama-3.2-1B/")          # doctest: +SKIP
>>> model.generate([[128000, 791, 6864], [128000, 9906]], max_new_tokens=8,
...                temperature=0.7, top_p=0.9, seed=0)                  # doctest: +SKIP
[[315, 9822, ...], [11, 1917, ...]]
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from linnet.lang.host.generate import (  # noqa: F401  (check_options: Model.generate's)
    OPTIONS,
    PREFILL_LAST,
    Prepared,
    Progress,
    array_prompts_error,
    check_options,
    prepare,
    prompt_lists,
    sampling_seed,
)
from linnet.lang.host.inputs import error

from .inputs import is_array
from .lowering import compiler_options, matmul_precision

#: How many times each of generate's jitted steps was traced ("prefill": the prefill and
#: the first pick; "decode": a decode step and its pick): once per batch shape and way of
#: picking, whatever the number of tokens, calls, seeds or temperatures.
TRACES: Counter[str] = Counter()


class Picking(NamedTuple):
    """How tokens are picked: ``sample`` (else greedy), whether ``top_k`` and ``top_p``
    apply, and whether a repetition penalty does (``penalize``: the steps then carry a
    [B, V] mask of the tokens seen); each combination is one trace of a step. The values (a
    temperature's inverse, ``k``, ``1 - top_p``, the penalty) are the step's arguments."""

    sample: bool
    use_k: bool
    use_p: bool
    penalize: bool = False


#: The smallest penalty the pick divides by: float32's smallest normal (a smaller one
#: rounds to 0 or a subnormal, and a logit of 0 divided by 0 is NaN), as the torch runtime's.
SMALLEST_PENALTY = float(np.finfo(np.float32).tiny)


def settings(
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    vocabulary: int,
    repetition_penalty: float | None = None,
) -> tuple[Picking, tuple[np.float32, np.int32, np.float32, np.float32]]:
    """The way of picking and its values for the options (checked before): the
    temperature's inverse in f32 (its reciprocal in f64, rounded: inf for a temperature too
    small for it, 0 for one too large), ``k`` (where it is below the vocabulary), the
    probability top_p drops, ``1 - top_p``, and the repetition penalty in f32 (1 where
    there is none: None and 1.0 penalise nothing and keep no mask; at least
    :data:`SMALLEST_PENALTY`, inf for one past f32's range).

    >>> settings(0.5, 40, None, 256)
    (Picking(sample=True, use_k=True, use_p=False, penalize=False), (np.float32(2.0), np.int32(40), np.float32(0.0), np.float32(1.0)))
    """
    # Greedy search ignores top_k and top_p (as the torch runtime's): one way of picking.
    use_k = temperature != 0 and top_k is not None and top_k < vocabulary
    use_p = temperature != 0 and top_p is not None and top_p < 1
    with np.errstate(over="ignore", divide="ignore"):
        inverse = (
            np.float32(np.float64(1.0) / np.float64(temperature))
            if temperature
            else np.float32(0.0)
        )
    k = np.int32(top_k if use_k and top_k is not None else 1)
    drop = np.float32(1.0 - top_p if use_p and top_p is not None else 0.0)
    penalize = repetition_penalty is not None and repetition_penalty != 1
    with np.errstate(over="ignore"):
        penalty = np.float32(
            max(float(repetition_penalty), SMALLEST_PENALTY)
            if penalize and repetition_penalty is not None
            else 1.0
        )
    return Picking(temperature != 0, use_k, use_p, penalize), (inverse, k, drop, penalty)


def seen_mask(rows: Any, vocabulary: int) -> Any:
    """[B, V] bools, traceable: True where token ``v`` is in row ``b`` of the int ``rows``
    [B, L] (the padded prompts: padding repeats a row's own last token, so it adds no id);
    ids of ``vocabulary`` or more (no logit is theirs) are left out, as transformers does.

    >>> import jax.numpy as jnp
    >>> seen_mask(jnp.array([[0, 2, 2]]), 4).tolist()
    [[True, False, True, False]]
    """
    import jax.numpy as jnp

    b = jnp.arange(rows.shape[0])[:, None]
    return jnp.zeros((rows.shape[0], vocabulary), bool).at[b, rows].set(True, mode="drop")


def see(seen: Any, token: Any) -> Any:
    """``seen`` [B, V] with each row's ``token`` [B] marked, traceable; a -1 (non-finite
    logits, E0818) marks nothing.

    >>> import jax.numpy as jnp
    >>> see(jnp.zeros((2, 3), bool), jnp.array([2, -1])).tolist()
    [[False, False, True], [False, False, False]]
    """
    import jax.numpy as jnp

    index = jnp.where(token >= 0, token, seen.shape[-1])  # past the end: dropped
    return seen.at[jnp.arange(seen.shape[0]), index].set(True, mode="drop")


def penalize(logits: Any, seen: Any, penalty: Any) -> Any:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` on f32 ``logits`` [B, V],
    traceable: each logit of a ``seen`` token times ``penalty`` where it is negative, else
    divided by it (f32 arithmetic, as transformers and the torch runtime); the others
    unchanged.

    >>> import jax.numpy as jnp
    >>> penalize(jnp.array([[2.0, -2.0, 2.0]]), jnp.array([[True, True, False]]), 2.0).tolist()
    [[1.0, -4.0, 2.0]]
    """
    import jax.numpy as jnp

    return jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)


def pick_tokens(
    logits: Any,
    picking: Picking,
    inverse: Any,
    k: Any,
    drop: Any,
    key: Any,
    penalty: Any = 1.0,
    seen: Any = None,
) -> Any:
    """One token id (int32) per row of ``logits`` [B, V], traceable (the steps run it under
    ``jax.jit``): the argmax when not sampling, else a ``jax.random.categorical`` draw from
    ``logits * inverse`` kept to the ``k`` most likely tokens and to the smallest set whose
    probability exceeds ``1 - drop``; with ``picking.penalize``, the logits of the tokens
    ``seen`` [B, V] marks are penalised by ``penalty`` first (:func:`penalize`). A row
    whose logits are not all finite gives -1.

    >>> import jax, jax.numpy as jnp
    >>> pick_tokens(jnp.array([[0.0, 3.0, 1.0]]), Picking(False, False, False), 0, 1, 0,
    ...             jax.random.key(0)).tolist()
    [1]
    """
    import jax
    import jax.numpy as jnp

    logits = jnp.asarray(logits, jnp.float32)
    # Finite before the penalty: E0818 is about the model's logits; a huge penalty's -inf
    # (and a tiny one's inf) is a meaning, handled below.
    finite = jnp.isfinite(logits).all(axis=-1)
    if picking.penalize:
        logits = penalize(logits, seen, penalty)
    if not picking.sample:
        return jnp.where(finite, jnp.argmax(logits, axis=-1).astype(jnp.int32), -1)
    # Scores relative to each row's largest logit, times the temperature's inverse: an
    # infinite inverse (a tiny temperature) sends every other score to -inf and keeps the
    # largest at 0 (0 * inf would be NaN: kept 0 by the where), a zero one (a huge
    # temperature) every score to 0 (uniform). A row that is not finite is drawn from
    # zeros, so that the draw runs; its token is replaced by -1. The largest is 0 by the
    # where, not by subtracting: a penalised row's largest may be inf (a tiny penalty; its
    # ties are then sampled) or -inf (every token seen), and -inf stays -inf at any
    # temperature (-inf * 0 would be NaN).
    clean = jnp.where(finite[:, None], logits, 0.0)
    top = clean.max(axis=-1, keepdims=True)
    shifted = jnp.where(clean == top, 0.0, clean - top)
    scores = jnp.where(
        shifted == 0, 0.0, jnp.where(shifted == -jnp.inf, -jnp.inf, shifted * inverse)
    )
    # top_k and top_p rank tokens by their logits (``shifted``): an order the temperature
    # keeps but may round into ties (every score 0 at 1e308).
    if picking.use_k:
        kth = jnp.sort(shifted, axis=-1)[:, shifted.shape[-1] - k]
        scores = jnp.where(shifted < kth[:, None], -jnp.inf, scores)
    if picking.use_p:
        # transformers' TopPLogitsWarper: drop the least likely tokens whose probabilities
        # sum to at most 1 - top_p; the most likely token is always kept.
        index = jnp.argsort(jnp.where(scores == -jnp.inf, -jnp.inf, shifted), axis=-1, stable=True)
        cumulative = jnp.cumsum(
            jax.nn.softmax(jnp.take_along_axis(scores, index, axis=-1), axis=-1), axis=-1
        )
        dropped = (cumulative <= drop).at[:, -1].set(False)
        rows = jnp.arange(scores.shape[0])[:, None]
        scores = jnp.where(jnp.zeros_like(dropped).at[rows, index].set(dropped), -jnp.inf, scores)
    picked = jax.random.categorical(key, scores, axis=-1).astype(jnp.int32)
    return jnp.where(finite, picked, -1)


def pick(
    logits: Any,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: Any = None,
    penalty: float | None = None,
    seen: Any = None,
) -> Any:
    """One token id per row of ``logits`` [B, V], as the torch runtime's ``pick``: the
    argmax when ``temperature`` is 0, else a sample (with the ``jax.random`` ``key``) of
    ``softmax(logits / temperature)`` kept to ``top_k`` and ``top_p``, the logits of the
    tokens ``seen`` [B, V] marks penalised first by ``penalty`` (None and 1.0: none); -1
    for a row whose logits are not all finite. Options are checked as ``generate`` checks
    them (E0868 for a penalty without a ``seen`` of the logits' shape).

    >>> import jax, jax.numpy as jnp
    >>> pick(jnp.array([[0.0, 3.0, 1.0]])).tolist()
    [1]
    >>> pick(jnp.array([[0.0, 3.0, 1.0]]), 1e-300, key=jax.random.key(0)).tolist()  # greedy
    [1]
    >>> pick(jnp.array([[0.0, float("nan"), 1.0]])).tolist()
    [-1]
    >>> pick(jnp.array([[0.0, 3.0, 1.0]]), penalty=4.0,
    ...      seen=jnp.array([[False, True, False]])).tolist()  # 3 / 4 < 1
    [2]
    """
    from linnet.lang.host.options import check_sampling

    import jax

    check_sampling(temperature, top_k, top_p, None, repetition_penalty=penalty)
    picking, values = settings(temperature, top_k, top_p, int(np.shape(logits)[-1]), penalty)
    if picking.penalize and (seen is None or tuple(np.shape(seen)) != tuple(np.shape(logits))):
        raise error(
            "E0868",
            f"pick's repetition penalty needs `seen`, a [B, V] bool mask of the tokens seen "
            f"so far, for logits of shape {list(np.shape(logits))}; it got "
            f"{'none' if seen is None else list(np.shape(seen))}",
            help="build it with seen_mask(prompt_rows, V) and update it with each step's "
            "tokens (see), as generate does",
        )
    if not _PICK:
        _PICK.append(jax.jit(pick_tokens, static_argnums=(1,)))
    inverse, k, drop, penalty_value = values
    key = key if key is not None else jax.random.key(0)
    mask = seen if picking.penalize else None
    return _PICK[0](logits, picking, inverse, k, drop, key, penalty_value, mask)


_PICK: list[Callable] = []  # pick_tokens under jax.jit, made on the first pick


def seed_key(seed: int) -> Any:
    """The ``jax.random`` key of a seed in [0, 2**64): its 64 bits as a ``threefry2x32``
    key, so that every seed gives its own key with or without 64-bit jax.

    >>> import jax
    >>> jax.random.key_data(seed_key(2**64 - 1)).tolist()
    [4294967295, 4294967295]
    """
    import jax
    import jax.numpy as jnp

    return jax.random.wrap_key_data(
        jnp.asarray([seed >> 32, seed & 0xFFFFFFFF], jnp.uint32), impl="threefry2x32"
    )


def _prompts(prompts: Any) -> list[list[int]]:
    """The prompts as lists of ints: a list of token lists, one token list, or an integer
    jax or NumPy array [B, L] or [L]."""
    if is_array(prompts):
        dtype = np.dtype(prompts.dtype)
        if np.ndim(prompts) not in (1, 2) or dtype.kind not in "iu":
            raise array_prompts_error("array", dtype.name, np.shape(prompts))
        prompts = np.asarray(prompts).tolist()
    return prompt_lists(prompts, "array")


def _stopped(token: Any, stop_mask: Any) -> Any:
    """Whether each token is a stop token (``stop_mask``: [V] bools; -1 never is)."""
    import jax.numpy as jnp

    return (token >= 0) & stop_mask[jnp.maximum(token, 0)]


def _prefill_inputs(entry: str, tokens: Any, lengths: Any) -> list[Any]:
    """The inputs of generate's prefill ``entry``: the padded rows ``tokens``, and for
    ``prefill_last`` each row's last prompt position (``lengths - 1``)."""
    return [tokens, lengths - 1] if entry == PREFILL_LAST else [tokens]


def _first_step(model: Any, tokens: Any, picking: Picking, entry: str = "prefill") -> Callable:
    """The jitted prefill and first pick for prompts shaped like ``tokens``:
    ``(params, states, tokens, lengths, key, inverse, k, drop, penalty, stop_mask) ->
    (token, done, states, seen)``, the states donated; ``seen`` is the [B, V] mask of the
    prompt's tokens and the first token's where ``picking.penalize``, else None. ``entry``
    is the prefill run (:func:`linnet.lang.host.generate.prefill_entry`): ``prefill_last``
    gives each row's logits at ``lengths - 1`` alone, ``prefill`` every position's."""
    key = (entry, tuple(tokens.shape), picking)
    found = model._generation.get(key)
    if found is not None:
        return found
    import jax
    import jax.numpy as jnp

    lengths = np.zeros(tokens.shape[:1], np.int32)
    prefill = model.function(entry).lowered(_prefill_inputs(entry, tokens, lengths)).function

    def first(
        params: dict,
        states: dict,
        tokens: Any,
        lengths: Any,
        key: Any,
        inverse: Any,
        k: Any,
        drop: Any,
        penalty: Any,
        stop_mask: Any,
    ) -> tuple:
        TRACES["prefill"] += 1  # runs while tracing only
        (logits, *_), states = prefill(*_prefill_inputs(entry, tokens, lengths), params, states)
        if entry != PREFILL_LAST:
            logits = logits[jnp.arange(logits.shape[0]), lengths - 1]
        rows = logits
        # The prompts' tokens, built on the device (padding repeats a row's last token).
        seen = seen_mask(tokens, rows.shape[-1]) if picking.penalize else None
        token = pick_tokens(
            rows, picking, inverse, k, drop, jax.random.fold_in(key, 0), penalty, seen
        )
        if seen is not None:
            seen = see(seen, token)
        return token, _stopped(token, stop_mask), states, seen

    options = compiler_options(model.numerics)  # as Function's jit: bf16 rounds as in the graph
    found = model._generation[key] = jax.jit(first, donate_argnums=(1,), compiler_options=options)
    return found


def _decode_step(model: Any, batch: int, picking: Picking) -> Callable:
    """The jitted decode step and its pick for ``batch`` sequences: ``(params, states, last,
    pos, done, key, step, inverse, k, drop, penalty, stop_mask, seen) -> (last, pos, done,
    step + 1, states, seen)``, the states and ``seen`` (the tokens seen, where
    ``picking.penalize``; else None) donated (the step counts on the device: nothing is copied to it). A finished sequence (``done``) keeps its last token and position (it
    writes the same cache entry again; its logits are not used); a -1 (non-finite logits,
    reported by the host) is fed as token 0."""
    key = ("decode", batch, picking)
    found = model._generation.get(key)
    if found is not None:
        return found
    import jax
    import jax.numpy as jnp

    one = np.zeros(batch, np.int32)
    decode = model.function("decode").lowered([one, one]).function

    def step(
        params: dict,
        states: dict,
        last: Any,
        pos: Any,
        done: Any,
        key: Any,
        index: Any,
        inverse: Any,
        k: Any,
        drop: Any,
        penalty: Any,
        stop_mask: Any,
        seen: Any,
    ) -> tuple:
        TRACES["decode"] += 1  # runs while tracing only
        (logits, *_), states = decode(jnp.maximum(last, 0), pos, params, states)
        picked = pick_tokens(
            logits, picking, inverse, k, drop, jax.random.fold_in(key, index), penalty, seen
        )
        token = jnp.where(done, last, picked)
        return (
            token,
            pos + jnp.where(done, 0, 1),
            done | _stopped(picked, stop_mask),
            index + 1,
            states,
            see(seen, token) if picking.penalize else None,
        )

    options = compiler_options(model.numerics)
    found = model._generation[key] = jax.jit(step, donate_argnums=(1, 12), compiler_options=options)
    return found


def _check_states(model: Any, tokens: Any, states: dict[str, Any], entry: str = "prefill") -> None:
    """E0731 where ``decode`` needs states that the prefill ``entry`` (for ``tokens``) does
    not make, or of another shape: generate carries prefill's states into decode (the KV
    cache)."""
    one = np.zeros(tokens.shape[0], np.int32)
    for path, vt in model.graph("decode", [one, one]).states.items():
        have = states.get(path)
        if have is None or tuple(have.shape) != tuple(vt.shape):
            raise error(
                "E0731",
                f"`decode` needs the state `{path}` as {list(vt.shape)}, "
                f"but `{entry}` makes it {None if have is None else list(have.shape)}",
                help="generate carries prefill's states (the KV cache) into decode: "
                "declare the same states, of the same shapes, for both",
            )


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
    any lengths; one list or an integer array [B, L] also do); returns each prompt's new
    tokens, ending at its first stop token (or where ``stop_when(b, token)`` is True: a
    text prompt's stop string, :mod:`linnet.lang.text.generation`). ``on_token(step,
    tokens)`` is called after each step with the batch's tokens of that step. The model's own states are not touched: the
    generation runs on fresh ones. ``repetition_penalty`` (None or 1.0: none) penalises
    the logits of every token already in a sequence, prompt and generated, as transformers'
    does, before the temperature, ``top_k`` and ``top_p`` (in greedy search too): a [B, V]
    mask of the tokens seen, carried on the device from step to step. Everything is checked before anything runs (the torch
    runtime's checks and codes), but for non-finite logits, found at their step (E0818).

    ``fast=False`` runs the same steps without jit (``jax.disable_jit``), op by op, for
    debugging: the same tokens, far slower.

    >>> model.generate([[1, 2, 3], [4]], max_new_tokens=4)                 # doctest: +SKIP
    [[17, 9, 9, 30], [5, 5, 211, 2]]
    >>> model.generate([[1, 2, 3]], 4, temperature=0.8, top_k=40, seed=1)  # doctest: +SKIP
    [[17, 230, 9, 41]]
    """
    import jax

    batch = _prompts(prompts)
    ready = prepare(
        model,
        batch,
        max_new_tokens,
        lambda shape: np.zeros(shape, np.int32),
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
    options = (temperature, top_k, top_p, seed, on_token, stop_when, repetition_penalty)
    if not fast:
        with jax.disable_jit():
            return _generate(model, ready, max_new_tokens, *options)
    return _generate(model, ready, max_new_tokens, *options)


def _generate(
    model: Any,
    ready: Prepared,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    on_token: Callable[[int, list[int]], None] | None,
    stop_when: Callable[[int, int], bool] | None,
    repetition_penalty: float | None,
) -> list[list[int]]:
    """:func:`generate` once :func:`~linnet.lang.host.generate.prepare` has checked and
    padded it (``ready``): the jitted steps, or the same op by op under ``jax.disable_jit``."""
    import jax

    batch, rows, vocabulary = ready.batch, ready.rows, ready.vocabulary
    stops = sorted({int(t) for t in ready.stop_tokens})
    size = vocabulary if vocabulary is not None else max(stops, default=0) + 1
    picking, values = settings(temperature, top_k, top_p, size, repetition_penalty)
    mask = np.zeros(size, bool)
    mask[stops] = True
    # Everything a step takes is on the device once: no step copies anything to it.
    tokens, lengths, stop_mask, *values = jax.device_put(
        [np.asarray(rows, np.int32), np.asarray(ready.lengths, np.int32), mask, *values],
        model.device,
    )
    key = jax.device_put(seed_key(sampling_seed(seed) if picking.sample else 0), model.device)
    states = model.function(ready.entry).new_states(_prefill_inputs(ready.entry, tokens, lengths))
    _check_states(model, tokens, states, ready.entry)
    first = _first_step(model, tokens, picking, ready.entry)
    step = _decode_step(model, len(rows), picking)  # traced on its first call only
    progress = Progress(batch, ready.stop_tokens, on_token, stop_when, ready.entry)
    with matmul_precision(model.numerics), warnings.catch_warnings():
        # jax's CPU backend cannot reuse donated buffers and says so once per compile.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        last, done, states, seen = first(
            model.params, states, tokens, lengths, key, *values, stop_mask
        )
        pos, index = lengths, jax.device_put(np.int32(1), model.device)
        for s in range(max_new_tokens):
            current, more = last, s + 1 < max_new_tokens
            if more and s > 0:
                # Step s + 1 is dispatched before step s's tokens are read: the device goes
                # on while the host copies, checks and reports them. (Not after prefill: the
                # first decode step compiles, which on_token(0) should not time.)
                last, pos, done, index, states, seen = step(
                    model.params, states, last, pos, done, key, index, *values, stop_mask, seen
                )
            # The step's one copy to the host: its tokens, -1 where the logits are not finite.
            if not progress.take(s, np.asarray(current).tolist()[: len(batch)]):
                break
            if more and s == 0:
                last, pos, done, index, states, seen = step(
                    model.params, states, last, pos, done, key, index, *values, stop_mask, seen
                )
    return progress.out
