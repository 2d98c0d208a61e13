"""`generate` on JAX: token generation on a loaded model's `prefill` and `decode` entries,
with the torch runtime's signature, semantics, checks and coded errors
(:mod:`linnet.lang.host.generate` holds what the two share).

A batch of prompts of different lengths runs as one batch: the prompts are padded on the
right to the longest, one `prefill` fills every sequence's cache from position 0, and each
sequence's first token comes from the logits at its own last prompt position; each `decode`
step then feeds each sequence its last token at its own position, so each sequence gets the
tokens it would get alone. Tokens are picked greedily (``temperature=0``, the default: the
argmax, ties to the lowest id), or sampled from ``softmax(logits / temperature)`` kept to
the ``top_k`` most likely tokens and to the smallest set whose probability reaches
``top_p``. A sequence stops after one of ``stop_tokens`` (kept) or ``max_new_tokens``.

On the device: each step is one jitted function, the generated entry and the pick together,
``(params, states, last, pos, done, key, step) -> (last, pos, done, states)`` with the states
(the KV cache) donated, traced once per batch shape and way of picking (greedy, or sampling
with or without ``top_k`` and ``top_p``) and reused by every step and every later call:
temperatures, ``k``, ``p``, seeds and stop tokens are arguments, never constants, so no
value recompiles it (:data:`TRACES` counts the traces). Sampling draws with ``jax.random``
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
    Progress,
    array_prompts_error,
    check_cache,
    check_generate,
    check_options,
    check_vocabulary,
    padded,
    prompt_lists,
    sampling_seed,
    stop_tokens_of,
)
from linnet.lang.host.inputs import error

from .inputs import is_array
from .lowering import compiler_options, matmul_precision

#: How many times each of generate's jitted steps was traced ("prefill": the prefill and
#: the first pick; "decode": a decode step and its pick): once per batch shape and way of
#: picking, whatever the number of tokens, calls, seeds or temperatures.
TRACES: Counter[str] = Counter()


class Picking(NamedTuple):
    """How tokens are picked: ``sample`` (else greedy), and whether ``top_k`` and ``top_p``
    apply; each combination is one trace of a step. The values (a temperature's inverse,
    ``k``, ``1 - top_p``) are the step's arguments."""

    sample: bool
    use_k: bool
    use_p: bool


def settings(
    temperature: float, top_k: int | None, top_p: float | None, vocabulary: int
) -> tuple[Picking, tuple[np.float32, np.int32, np.float32]]:
    """The way of picking and its values for the options (checked before): the
    temperature's inverse in f32 (its reciprocal in f64, rounded: inf for a temperature too
    small for it, 0 for one too large), ``k`` (where it is below the vocabulary) and the
    probability top_p drops, ``1 - top_p``.

    >>> settings(0.5, 40, None, 256)
    (Picking(sample=True, use_k=True, use_p=False), (np.float32(2.0), np.int32(40), np.float32(0.0)))
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
    return Picking(temperature != 0, use_k, use_p), (inverse, k, drop)


def pick_tokens(logits: Any, picking: Picking, inverse: Any, k: Any, drop: Any, key: Any) -> Any:
    """One token id (int32) per row of ``logits`` [B, V], traceable (the steps run it under
    ``jax.jit``): the argmax when not sampling, else a ``jax.random.categorical`` draw from
    ``logits * inverse`` kept to the ``k`` most likely tokens and to the smallest set whose
    probability exceeds ``1 - drop``. A row whose logits are not all finite gives -1.

    >>> import jax, jax.numpy as jnp
    >>> pick_tokens(jnp.array([[0.0, 3.0, 1.0]]), Picking(False, False, False), 0, 1, 0,
    ...             jax.random.key(0)).tolist()
    [1]
    """
    import jax
    import jax.numpy as jnp

    logits = jnp.asarray(logits, jnp.float32)
    finite = jnp.isfinite(logits).all(axis=-1)
    if not picking.sample:
        return jnp.where(finite, jnp.argmax(logits, axis=-1).astype(jnp.int32), -1)
    # Scores relative to each row's largest logit, times the temperature's inverse: an
    # infinite inverse (a tiny temperature) sends every other score to -inf and keeps the
    # largest at 0 (0 * inf would be NaN: kept 0 by the where), a zero one (a huge
    # temperature) every score to 0 (uniform). A row that is not finite is drawn from
    # zeros, so that the draw runs; its token is replaced by -1.
    clean = jnp.where(finite[:, None], logits, 0.0)
    shifted = clean - clean.max(axis=-1, keepdims=True)
    scores = jnp.where(shifted == 0, 0.0, shifted * inverse)
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
) -> Any:
    """One token id per row of ``logits`` [B, V], as the torch runtime's ``pick``: the
    argmax when ``temperature`` is 0, else a sample (with the ``jax.random`` ``key``) of
    ``softmax(logits / temperature)`` kept to ``top_k`` and ``top_p``; -1 for a row whose
    logits are not all finite. Options are checked as ``generate`` checks them.

    >>> import jax, jax.numpy as jnp
    >>> pick(jnp.array([[0.0, 3.0, 1.0]])).tolist()
    [1]
    >>> pick(jnp.array([[0.0, 3.0, 1.0]]), 1e-300, key=jax.random.key(0)).tolist()  # greedy
    [1]
    >>> pick(jnp.array([[0.0, float("nan"), 1.0]])).tolist()
    [-1]
    """
    from linnet.lang.host.options import check_sampling

    import jax

    check_sampling(temperature, top_k, top_p, None)
    picking, values = settings(temperature, top_k, top_p, int(np.shape(logits)[-1]))
    if not _PICK:
        _PICK.append(jax.jit(pick_tokens, static_argnums=(1,)))
    return _PICK[0](logits, picking, *values, key if key is not None else jax.random.key(0))


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


def _first_step(model: Any, tokens: Any, picking: Picking) -> Callable:
    """The jitted prefill and first pick for prompts shaped like ``tokens``:
    ``(params, states, tokens, lengths, key, inverse, k, drop, stop_mask) -> (token, done,
    states)``, the states donated."""
    key = ("prefill", tuple(tokens.shape), picking)
    found = model._generation.get(key)
    if found is not None:
        return found
    import jax
    import jax.numpy as jnp

    prefill = model.function("prefill").lowered([tokens]).function

    def first(
        params: dict,
        states: dict,
        tokens: Any,
        lengths: Any,
        key: Any,
        inverse: Any,
        k: Any,
        drop: Any,
        stop_mask: Any,
    ) -> tuple:
        TRACES["prefill"] += 1  # runs while tracing only
        (logits, *_), states = prefill(tokens, params, states)
        rows = logits[jnp.arange(logits.shape[0]), lengths - 1]
        token = pick_tokens(rows, picking, inverse, k, drop, jax.random.fold_in(key, 0))
        return token, _stopped(token, stop_mask), states

    options = compiler_options(model.numerics)  # as Function's jit: bf16 rounds as in the graph
    found = model._generation[key] = jax.jit(first, donate_argnums=(1,), compiler_options=options)
    return found


def _decode_step(model: Any, batch: int, picking: Picking) -> Callable:
    """The jitted decode step and its pick for ``batch`` sequences: ``(params, states, last,
    pos, done, key, step, inverse, k, drop, stop_mask) -> (last, pos, done, step + 1,
    states)``, the states donated (the step counts on the device: nothing is copied to it). A finished sequence (``done``) keeps its last token and position (it
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
        stop_mask: Any,
    ) -> tuple:
        TRACES["decode"] += 1  # runs while tracing only
        (logits, *_), states = decode(jnp.maximum(last, 0), pos, params, states)
        picked = pick_tokens(logits, picking, inverse, k, drop, jax.random.fold_in(key, index))
        return (
            jnp.where(done, last, picked),
            pos + jnp.where(done, 0, 1),
            done | _stopped(picked, stop_mask),
            index + 1,
            states,
        )

    options = compiler_options(model.numerics)
    found = model._generation[key] = jax.jit(step, donate_argnums=(1,), compiler_options=options)
    return found


def _check_states(model: Any, tokens: Any, states: dict[str, Any]) -> None:
    """E0731 where ``decode`` needs states that ``prefill`` (for ``tokens``) does not make,
    or of another shape: generate carries prefill's states into decode (the KV cache)."""
    one = np.zeros(tokens.shape[0], np.int32)
    for path, vt in model.graph("decode", [one, one]).states.items():
        have = states.get(path)
        if have is None or tuple(have.shape) != tuple(vt.shape):
            raise error(
                "E0731",
                f"`decode` needs the state `{path}` as {list(vt.shape)}, "
                f"but `prefill` makes it {None if have is None else list(have.shape)}",
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
) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens after each prompt (a list of token-id lists of
    any lengths; one list or an integer array [B, L] also do); returns each prompt's new
    tokens, ending at its first stop token (or where ``stop_when(b, token)`` is True: a
    text prompt's stop string, :mod:`linnet.lang.text.generation`). ``on_token(step,
    tokens)`` is called after each step with the batch's tokens of that step. The model's own states are not touched: the
    generation runs on fresh ones. Everything is checked before anything runs (the torch
    runtime's checks and codes), but for non-finite logits, found at their step (E0818).

    >>> model.generate([[1, 2, 3], [4]], max_new_tokens=4)                 # doctest: +SKIP
    [[17, 9, 9, 30], [5, 5, 211, 2]]
    >>> model.generate([[1, 2, 3]], 4, temperature=0.8, top_k=40, seed=1)  # doctest: +SKIP
    [[17, 230, 9, 41]]
    """
    import jax

    batch = _prompts(prompts)
    stop_tokens, stops_from = stop_tokens_of(model, stop_tokens)
    check_generate(model, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens, on_token)
    rows = padded(batch)
    vocabulary = check_vocabulary(
        model, rows, stop_tokens, lambda shape: np.zeros(shape, np.int32), stops_from
    )
    check_cache(model, len(rows[0]), max_new_tokens, np.zeros(1, np.int32))
    stops = sorted({int(t) for t in stop_tokens})
    size = vocabulary if vocabulary is not None else max(stops, default=0) + 1
    picking, values = settings(temperature, top_k, top_p, size)
    mask = np.zeros(size, bool)
    mask[stops] = True
    # Everything a step takes is on the device once: no step copies anything to it.
    tokens, lengths, stop_mask, *values = jax.device_put(
        [np.asarray(rows, np.int32), np.asarray([len(p) for p in batch], np.int32), mask, *values],
        model.device,
    )
    key = jax.device_put(seed_key(sampling_seed(seed) if picking.sample else 0), model.device)
    states = model.function("prefill").new_states([tokens])
    _check_states(model, tokens, states)
    first = _first_step(model, tokens, picking)
    step = _decode_step(model, len(batch), picking)  # traced on its first call only
    progress = Progress(batch, stop_tokens, on_token, stop_when)
    with matmul_precision(model.numerics), warnings.catch_warnings():
        # jax's CPU backend cannot reuse donated buffers and says so once per compile.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        last, done, states = first(model.params, states, tokens, lengths, key, *values, stop_mask)
        pos, index = lengths, jax.device_put(np.int32(1), model.device)
        for s in range(max_new_tokens):
            current, more = last, s + 1 < max_new_tokens
            if more and s > 0:
                # Step s + 1 is dispatched before step s's tokens are read: the device goes
                # on while the host copies, checks and reports them. (Not after prefill: the
                # first decode step compiles, which on_token(0) should not time.)
                last, pos, done, index, states = step(
                    model.params, states, last, pos, done, key, index, *values, stop_mask
                )
            # The step's one copy to the host: its tokens, -1 where the logits are not finite.
            if not progress.take(s, np.asarray(current).tolist()):
                break
            if more and s == 0:
                last, pos, done, index, states = step(
                    model.params, states, last, pos, done, key, index, *values, stop_mask
                )
    return progress.out
