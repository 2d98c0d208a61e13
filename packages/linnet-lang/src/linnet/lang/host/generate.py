"""What ``Model.generate`` is in every runtime, written once: its options and their checks,
the checks against the model made before anything runs, and the host's side of each step.

``linnet.torch`` and ``linnet.jax`` generate the same way: the prompts padded on the right
to the longest, one prefill from position 0, each sequence's first token from the logits
at its own last prompt position, then one ``decode`` step per token at each sequence's own
position; a finished sequence repeats its last token at a position that no longer moves.
The prefill is the model's ``prefill_last`` entry where it has one (the logits at each
row's last prompt position only: the LM head on B rows, not B * L), else ``prefill``
(every position's logits, one row kept per sequence): :func:`prefill_entry`.
:func:`prepare` is the checks and padding both runtimes run before anything else.
Each runtime picks the tokens on its device (its own random numbers); what the host does
with each step's tokens, and every check and coded error, is here, so that a mistake is the
same error with the same message whichever runtime runs the model.

Codes: E0810 (prompts), E0811 (``max_new_tokens``), E0812-E0815 (the sampling options,
:func:`linnet.lang.host.options.check_sampling`; ``stop_tokens`` and ``on_token``), E0867
(``repetition_penalty``, :func:`linnet.lang.host.options.check_penalty`), E0816 (no
``prefill``/``decode``), E0817 (past the cache), E0818 (non-finite logits), E0819 (a stop
token outside the vocabulary), E0870 (``fast``), E0871 (a ``prefill_last`` of another
signature), E0794 (an option ``generate`` does not have), E0780 (a prompt id outside the
vocabulary, the prefill entry's own message). Pure Python: nothing here imports an array
library.

>>> progress = Progress([[1, 2, 3], [4]], stop_tokens=[9])
>>> progress.take(0, [7, 9]), progress.take(1, [8, 9]), progress.out
(True, True, [[7, 8], [9]])
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from linnet.lang.check.hints import did_you_mean
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.host.inputs import error, range_error
from linnet.lang.host.options import (
    check_penalty,
    check_sampling,
    is_int,
    sampling_values,
    stop_token_error,
)
from linnet.lang.passes.bounds import bounds_for

#: ``generate``'s keyword options: ``Model.generate(**options)`` checks the names against
#: these (E0794 for another). The last three are for text prompts only
#: (:mod:`linnet.lang.text.generation`; E0847 with token ids).
OPTIONS = (
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "stop_tokens",
    "on_token",
    "max_new_tokens",
    "fast",
    "stop",
    "callback",
    "skip_special_tokens",
)


def check_options(options: dict[str, Any]) -> None:
    """E0794 for a keyword option ``generate`` does not have (transformers'
    ``no_repeat_ngram_size``, a misspelt ``top-k``), before anything runs: not Python's
    TypeError.

    >>> check_options({"temperature": 0.7, "top_k": 40})
    >>> check_options({"tempreature": 0.7})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0794]: generate has no option ...
    """
    for name in options:
        if name not in OPTIONS:
            raise error(
                "E0794",
                f"generate has no option `{name}`",
                help=did_you_mean(name, OPTIONS, "its options are: " + ", ".join(OPTIONS)),
            )


def array_prompts_error(kind: str, dtype: Any, shape: Sequence[int]) -> LinnetError:
    """E0810 for prompts given as an array that holds no token ids (floats, or not 1 or 2
    dims); ``kind`` is what the runtime calls its arrays ("tensor", "array").

    >>> array_prompts_error("array", "float32", [2, 3]).diagnostics[0].message
    'prompts must be token ids: a list of lists of ints or an integer array [B, L], not a float32 array of shape [2, 3]'
    """
    return error(
        "E0810",
        f"prompts must be token ids: a list of lists of ints or an integer "
        f"{kind} [B, L], not a {dtype} {kind} of shape {list(shape)}",
        help="e.g. [[1, 2, 3], [4, 5]]",
    )


def prompt_lists(prompts: Any, kind: str = "tensor") -> list[list[int]]:
    """The prompts as lists of ints: a list of token lists, or one token list (a runtime
    turns its own integer arrays into lists first); E0810 for anything else or an empty
    prompt. ``kind`` names the runtime's arrays in the message.

    >>> prompt_lists([1, 2, 3]), prompt_lists([[1, 2], [3]])
    ([[1, 2, 3]], [[1, 2], [3]])
    """
    if isinstance(prompts, Sequence) and prompts and all(is_int(t) for t in prompts):
        prompts = [prompts]
    if (
        not isinstance(prompts, Sequence)
        or isinstance(prompts, str)
        or not prompts
        or not all(
            isinstance(p, Sequence) and not isinstance(p, str) and all(is_int(t) for t in p)
            for p in prompts
        )
    ):
        raise error(
            "E0810",
            "prompts must be token ids: a non-empty list of lists of ints "
            f"(or one list, or an integer {kind} [B, L])",
            help="e.g. model.generate([[1, 2, 3], [4, 5]], max_new_tokens=8)",
        )
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise error(
            "E0810",
            f"prompt {empty[0]} is empty: prefill needs at least one token",
            help="start each prompt with at least one token (a BOS token, say)",
        )
    return [[int(t) for t in p] for p in prompts]


def check_generate(
    model: Any,
    max_new_tokens: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    seed: Any,
    stop_tokens: Any,
    on_token: Any,
    repetition_penalty: Any = None,
) -> None:
    """``generate``'s arguments, before anything runs: the model's entries (E0816),
    ``max_new_tokens`` (E0811), the sampling options (E0812-E0815, ``repetition_penalty``
    E0867), ``stop_tokens`` and ``on_token`` (E0815). ``model`` needs only ``entries``.

    >>> from types import SimpleNamespace
    >>> check_generate(SimpleNamespace(entries=["prefill", "decode"]), 4, 0.7, 40, 0.9, 0,
    ...                [2], None)
    """
    missing = [e for e in ("prefill", "decode") if e not in model.entries]
    if missing:
        raise error(
            "E0816",
            f"generate runs a model's `prefill` and `decode` entries; this "
            f"model has no {' and no '.join(f'`{m}`' for m in missing)} (entries: "
            f"{', '.join(model.entries)})",
            help="give the model `entry prefill<L: Dim>(tokens: Tensor[B, L; i32]) -> "
            "Tensor[B, L, V; f32]` and `entry decode(token: Tensor[B; i32], pos: "
            "Tensor[B; i32]) -> Tensor[B, V; f32]`, as std.models.llama does",
        )
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise error(
            "E0811",
            f"max_new_tokens must be a positive int, not {max_new_tokens!r}",
            help="e.g. max_new_tokens=16",
        )
    check_sampling(temperature, top_k, top_p, seed)
    check_penalty(repetition_penalty)
    if (
        not isinstance(stop_tokens, Sequence | set | frozenset)
        or isinstance(stop_tokens, str)
        or not all(is_int(t) for t in stop_tokens)
    ):
        raise error(
            "E0815",
            f"stop_tokens must be a list of token ids, not {stop_tokens!r}",
            help="e.g. stop_tokens=[2] (the tokenizer's EOS id)",
        )
    if on_token is not None and not callable(on_token):
        raise error(
            "E0815",
            f"on_token must be None or a function of (step, tokens), not "
            f"{type(on_token).__name__} {on_token!r:.40}",
            help="e.g. on_token=lambda step, tokens: print(step, tokens)",
        )


#: The shortest length prefill runs a prompt at.
FIRST_LENGTH = 16


@dataclass(frozen=True)
class Ladder:
    """The prompt lengths prefill runs at (its length buckets): powers of two from
    :data:`FIRST_LENGTH` up to ``doubling_until``, then ``per_octave`` evenly spaced
    lengths per doubling. A prompt runs at the first that holds it, so it runs at most
    ``1 + 1 / per_octave`` times its length from ``doubling_until`` (2x below), and a cache
    of S holds about ``log2(doubling_until / 16) + per_octave * log2(S / doubling_until)``
    shapes: once each has run (``Model.warm_up``), a prompt of a length not seen before
    compiles nothing new.

    >>> COARSE, FINE
    (Ladder(doubling_until=256, per_octave=2), Ladder(doubling_until=64, per_octave=4))
    """

    doubling_until: int
    per_octave: int


#: Where padding is nearly free and each shape costs a compile: CUDA, where a short prompt's
#: prefill is bound by reading the weights, and torch.compile or XLA compile each shape.
#: 16, 32, ..., 256, then 384, 512, 768, 1024, ...: at most 1.5x a prompt's length from 256.
COARSE = Ladder(256, 2)
#: Where prefill's time grows with its length from the first tokens and a shape costs little
#: to make: generated source on the CPU (lowered and imported, nothing compiled).
#: 16, 32, 64, then 80, 96, 112, 128, 160, 192, ...: at most 1.25x a prompt's length from 64.
FINE = Ladder(64, 4)


def length_buckets(limit: int, ladder: Ladder = COARSE) -> list[int]:
    """Every prompt length prefill runs at on ``ladder``, up to a cache of ``limit``
    positions (the last is ``limit`` itself).

    >>> length_buckets(1024)
    [16, 32, 64, 128, 256, 384, 512, 768, 1024]
    >>> length_buckets(100)
    [16, 32, 64, 100]
    >>> length_buckets(300, FINE)
    [16, 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 300]
    """
    out, b = [], FIRST_LENGTH
    while b < limit:
        out.append(b)
        if b < ladder.doubling_until:
            b *= 2
        else:  # a step of the octave b is in: its power of two over per_octave
            b += (1 << (b.bit_length() - 1)) // ladder.per_octave
    return [*out, limit]


def length_bucket(length: int, limit: int | None, ladder: Ladder = COARSE) -> int:
    """The length a prompt of ``length`` tokens runs prefill at: the first of
    :func:`length_buckets` that holds it, or ``length`` itself where the cache's length
    ``limit`` is not known (None) or is shorter (prefill then says E0782).

    >>> length_bucket(5, 1024), length_bucket(300, 1024), length_bucket(1000, 1024)
    (16, 384, 1024)
    >>> length_bucket(150, 1024), length_bucket(150, 1024, FINE)
    (256, 160)
    >>> length_bucket(5, None), length_bucket(2000, 1024)
    (5, 2000)
    """
    if limit is None or length > limit:
        return length
    return next(b for b in length_buckets(limit, ladder) if b >= length)


def ladder_of(model: Any) -> Ladder:
    """The :class:`Ladder` ``model`` runs prompts on: its ``prompt_ladder`` (a runtime's
    models say which suits them), else :data:`COARSE`.

    >>> ladder_of(object())
    Ladder(doubling_until=256, per_octave=2)
    """
    ladder = getattr(model, "prompt_ladder", COARSE)
    return ladder if isinstance(ladder, Ladder) else COARSE


def batch_bucket(size: int) -> int:
    """The batch a generation of ``size`` prompts runs as: the next power of two (extra rows
    repeat the last prompt and are dropped), so batch sizes, too, compile a few shapes.

    >>> [batch_bucket(n) for n in (1, 2, 3, 5, 8)]
    [1, 2, 4, 8, 8]
    """
    return 1 << (size - 1).bit_length()


def check_fast(fast: Any) -> None:
    """E0870 unless ``generate``'s ``fast`` is True or False.

    >>> check_fast(False)
    >>> check_fast("no")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0870]: generate's fast must be True or False, ...
    """
    if not isinstance(fast, bool):
        raise error(
            "E0870",
            f"generate's fast must be True or False, not {fast!r:.60}",
            help="fast=False runs each entry call by call (for debugging); the default, "
            "True, runs the planned, captured (torch on CUDA) or jitted (JAX) steps",
        )


def check_positive_sizes(batch_sizes: Any, longest: Any) -> None:
    """E0866 unless ``batch_sizes`` is a non-empty list of positive ints and ``longest`` None
    or a positive int (``Model.warm_up``'s arguments).

    >>> check_positive_sizes([1, 4], 100)
    >>> check_positive_sizes([0], None)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0866]: warm_up's batch_sizes must be ...
    """
    sizes = list(batch_sizes) if isinstance(batch_sizes, list | tuple | range) else None
    if not sizes or not all(is_int(b) and b > 0 for b in sizes):
        raise error(
            "E0866",
            f"warm_up's batch_sizes must be a non-empty list of positive ints, not "
            f"{batch_sizes!r:.60}",
            help="e.g. model.warm_up(batch_sizes=[1, 4]): the batch sizes generate will run",
        )
    if longest is not None and not (is_int(longest) and longest > 0):
        raise error(
            "E0866",
            f"warm_up's longest must be None or a positive int, not {longest!r:.60}",
            help="e.g. model.warm_up(longest=1000): the longest prompt, in tokens",
        )


def padded(
    batch: list[list[int]], limit: int | None = None, ladder: Ladder = COARSE
) -> list[list[int]]:
    """The prompts as the rows prefill runs: each padded on the right with its own last token
    (a valid id for any vocabulary; the padding is written into the cache but never
    attended) to the longest prompt's :func:`length_bucket` on ``ladder`` (``limit``: the
    cache's length, :func:`cache_length`), and the batch padded to its
    :func:`batch_bucket` with copies of the last row. Without ``limit``: the longest, and
    the batch as it is.

    >>> padded([[1, 2, 3], [4]])
    [[1, 2, 3], [4, 4, 4]]
    >>> [len(r) for r in padded([[1, 2, 3], [4], [5, 6]], limit=64)]
    [16, 16, 16, 16]
    """
    longest = max(len(p) for p in batch)
    width = length_bucket(longest, limit, ladder)
    rows = [p + [p[-1]] * (width - len(p)) for p in batch]
    if limit is None:
        return rows
    return rows + [rows[-1]] * (batch_bucket(len(rows)) - len(rows))


def stop_tokens_of(model: Any, stop_tokens: Any) -> tuple[Any, str]:
    """``(stop tokens, where they came from)``: ``stop_tokens`` as given, or where it is None
    the model's own (``model.stop_tokens``: the checkpoint's end-of-sequence tokens, from its
    generation_config.json or config.json as transformers reads them); ``[]`` is none.

    >>> class M: stop_tokens, stop_tokens_source = (2,), "generation_config.json"
    >>> stop_tokens_of(M(), None), stop_tokens_of(M(), [7])
    (((2,), 'generation_config.json'), ([7], 'stop_tokens'))
    """
    if stop_tokens is not None:
        return stop_tokens, "stop_tokens"
    return (
        tuple(getattr(model, "stop_tokens", ())),
        getattr(model, "stop_tokens_source", "") or "model.stop_tokens",
    )


def check_vocabulary(
    model: Any,
    rows: list[list[int]],
    stop_tokens: Any,
    zeros: Callable[[tuple[int, ...]], Any],
    stops_from: str = "stop_tokens",
    entry: str = "prefill",
) -> int | None:
    """Before anything runs: every prompt id in the range the token input of ``entry`` (the
    prefill generate runs: :func:`prefill_entry`) takes (E0780, the message the entry
    itself gives, also for ids no int32 holds, such as 2**64), and every stop token an id
    the model can emit (E0819: one it cannot would never stop a sequence). ``rows`` are the
    padded prompts; ``zeros(shape)`` is an int32 array of the runtime's, to lower ``entry``
    for (the graph it then runs; ``prefill_last``'s logits must be [B, V], E0871). Returns
    the vocabulary (the logits' last dim), None where it is not a number.

    >>> check_vocabulary(model, [[1, 2]], [2], lambda s: np.zeros(s, np.int32))  # doctest: +SKIP
    256
    """
    shape = (len(rows), len(rows[0]))
    inputs = [zeros(shape)] + ([zeros(shape[:1])] if entry == PREFILL_LAST else [])
    graph = model.graph(entry, inputs)
    if entry == PREFILL_LAST:
        check_last_logits(model, graph, shape[0], zeros)
    r = bounds_for(graph).inputs.get(graph.inputs[0])
    flat = [t for row in rows for t in row]
    if r is not None and any(t < r.lo or t >= r.hi for t in flat):
        raise range_error(graph, entry, r, flat, shape)
    logits = graph.values[graph.outputs[0]].shape
    vocabulary = logits[-1] if logits and isinstance(logits[-1], int) else None
    for t in stop_tokens:
        if t < 0 or (vocabulary is not None and t >= vocabulary):
            raise stop_token_error(t, vocabulary, stops_from)
    return vocabulary


def cache_length(model: Any, one: Any) -> int | None:
    """The positions the model's ``decode`` entry takes (its KV cache's length: ``pos``'s
    upper bound), or None where its graph does not bound ``pos``; ``one`` is a one-element
    int32 array of the runtime's.

    >>> cache_length(model, np.zeros(1, np.int32))                         # doctest: +SKIP
    1024
    """
    graph = model.graph("decode", [one, one])
    r = next((r for name, r in bounds_for(graph).inputs.items() if name == "%pos"), None)
    return None if r is None else r.hi


def check_cache(model: Any, prompt: int, tokens: int, one: Any) -> None:
    """E0817 before anything runs when the last decode step would pass the positions the
    model's decode entry takes (its KV cache's length); ``prompt`` is the longest prompt and
    ``one`` a one-element int32 array of the runtime's (to lower ``decode`` for).

    >>> check_cache(model, 60, 10, np.zeros(1, np.int32))                  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0817]: a prompt of 60 tokens and ...
    """
    graph = model.graph("decode", [one, one])
    r = next((r for name, r in bounds_for(graph).inputs.items() if name == "%pos"), None)
    last = prompt + tokens - 2  # the position of the last decode step
    if r is None or tokens < 2 or last < r.hi:
        return
    raise error(
        "E0817",
        f"a prompt of {prompt} tokens and max_new_tokens={tokens} decode up "
        f"to position {last}, but `decode` takes positions below {r.hi} "
        f"({r.upper.describe(graph)})",
        help=f"generate at most {max(1, r.hi - prompt + 1)} tokens after this prompt, "
        "or load the model with a longer cache (config={'S': ...})",
    )


#: The entry generate's prefill runs where a model has it, and the signature it must have:
#: the logits at position ``at[b]`` of each row only, the cache filled as ``prefill`` does.
PREFILL_LAST = "prefill_last"
PREFILL_LAST_SIGNATURE = (
    "entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i32]) -> Tensor[B, V; f32]"
)


def _text(node: Any) -> str:
    """A syntax node's source text, its runs of white space as one space."""
    return " ".join(node.span.source.text[node.span.start : node.span.stop].split())


def _same(a: Any, b: Any) -> bool:
    """Whether two dims are written alike, spaces aside (``KV*G`` is ``KV * G``)."""
    return _text(a).replace(" ", "") == _text(b).replace(" ", "")


def _signature_problem(method: Any) -> str | None:
    """What makes the declared ``prefill_last`` entry ``method`` differ from
    :data:`PREFILL_LAST_SIGNATURE` (inputs ``[B, L]`` and ``[B]`` i32, one ``[B, V]``
    result), or None where nothing does."""
    from linnet.lang.syntax.tree import TensorType

    def tensor(t: Any, rank: int, dtype: str | None) -> bool:
        return (
            isinstance(t, TensorType)
            and len(t.dims) == rank
            and (dtype is None or t.dtype.name == dtype)
        )

    params, results = method.params, method.results
    if len(params) != 2:
        names = ", ".join(f"`{p.name}`" for p in params) or "none"
        return f"it takes {len(params)} input(s) ({names}), not 2 (`tokens` and `at`)"
    tokens, at = params
    if not tensor(tokens.type, 2, "i32"):
        return f"its first input `{tokens.name}: {_text(tokens.type)}` is no [B, L] i32 tensor"
    if not tensor(at.type, 1, "i32"):
        return f"its second input `{at.name}: {_text(at.type)}` is no [B] i32 tensor"
    batch = _text(tokens.type.dims[0])
    if not _same(at.type.dims[0], tokens.type.dims[0]):
        return (
            f"its input `{at.name}` has {_text(at.type.dims[0])} rows, not `{tokens.name}`'s "
            f"{batch} (one position per sequence)"
        )
    if len(results) != 1 or not tensor(results[0].type, 2, None):
        shown = ", ".join(_text(r.type) for r in results)
        return f"it returns {shown or 'nothing'}, not one [B, V] tensor of logits"
    if not _same(results[0].type.dims[0], tokens.type.dims[0]):
        return (
            f"it returns {_text(results[0].type)}, whose first dim is not `{tokens.name}`'s "
            f"{batch} (one row of logits per sequence)"
        )
    return None


def prefill_error(model: Any, problem: str) -> LinnetError:
    """E0871: the model's ``prefill_last`` entry is not what generate runs it as
    (``problem``), pointing at its declaration where the model has one."""
    method = None
    try:
        from linnet.lang.host.loading import entry_method

        method = entry_method(model.program, PREFILL_LAST)
    except (AttributeError, LinnetError):  # a model object without a program: no span
        pass
    return LinnetError(
        Diagnostic(
            "E0871",
            f"generate runs a model's `{PREFILL_LAST}` entry for the first token of each "
            f"prompt, and this model's `{PREFILL_LAST}` does not fit: {problem}",
            span=None if method is None else method.span,
            label="" if method is None else "declared here",
            help=f"declare it as `{PREFILL_LAST_SIGNATURE}` (the logits at position at[b] "
            f"of row b, the cache filled as `prefill` does, as std.models.llama does), or "
            f"rename it: generate then runs `prefill`",
        )
    )


def prefill_entry(model: Any) -> str:
    """The entry generate's prefill runs: ``prefill_last`` where the model declares it with
    :data:`PREFILL_LAST_SIGNATURE`, ``prefill`` where it has none (a model written before
    it); E0871, before anything runs, for a ``prefill_last`` of another signature (never
    run as something it is not). The output's width is checked once lowered
    (:func:`check_last_logits`).

    >>> from types import SimpleNamespace
    >>> prefill_entry(SimpleNamespace(entries=["prefill", "decode"]))
    'prefill'
    >>> from linnet.lang.host.loading import load_program
    >>> prefill_entry(SimpleNamespace(entries=["prefill_last"],
    ...                               program=load_program("std.models.llama")[0]))
    'prefill_last'
    """
    if PREFILL_LAST not in model.entries:
        return "prefill"
    from linnet.lang.host.loading import entry_method

    problem = _signature_problem(entry_method(model.program, PREFILL_LAST))
    if problem is not None:
        raise prefill_error(model, problem)
    return PREFILL_LAST


def check_last_logits(
    model: Any, graph: Any, batch: int, zeros: Callable[[tuple[int, ...]], Any]
) -> None:
    """E0871 unless the lowered ``prefill_last`` ``graph`` (for ``batch`` rows) gives one
    [batch, V] output, V the width of ``decode``'s logits (lowered for one row with
    ``zeros``, an int32 array maker of the runtime's): the first token's logits must be
    the ones decode's steps give.

    >>> check_last_logits(model, graph, 4, lambda s: np.zeros(s, np.int32))  # doctest: +SKIP
    """
    shapes = [list(graph.values[o].shape) for o in graph.outputs]
    one = zeros((1,))
    decode = model.graph("decode", [one, one])
    logits = list(decode.values[decode.outputs[0]].shape) if decode.outputs else []
    width = logits[-1] if len(logits) == 2 else None
    fits = len(shapes) == 1 and len(shapes[0]) == 2 and shapes[0][0] == batch
    if fits and (width is None or shapes[0][1] == width):
        return
    want = f"[{batch}, {width if width is not None else 'V'}]"
    raise prefill_error(
        model,
        f"for {batch} rows of prompts it gives {' and '.join(map(str, shapes)) or 'nothing'}, "
        f"not the logits {want} (`decode`'s are {logits} for one sequence)",
    )


@dataclass(frozen=True)
class Prepared:
    """A generation checked and padded, as both runtimes run it (:func:`prepare`): the
    prompts (``batch``), the rows prefill runs (``rows``: padded to a length and a batch
    bucket), each row's prompt length, the stop tokens, the vocabulary (None: not a
    number), the prefill entry (:func:`prefill_entry`) and the sampling options as Python
    numbers (temperature, top_k, top_p, seed, repetition_penalty:
    :func:`~linnet.lang.host.options.sampling_values`; ``np.float32(0.5)`` is 0.5).

    >>> p = Prepared([[1, 2]], [[1, 2, 2]], [2], (), 256, "prefill_last", (0.0,) + (None,) * 4)
    >>> p.last
    [1]
    """

    batch: list[list[int]]
    rows: list[list[int]]
    lengths: list[int]
    stop_tokens: tuple[int, ...]
    vocabulary: int | None
    entry: str
    sampling: tuple[float, int | None, float | None, int | None, float | None]

    @property
    def last(self) -> list[int]:
        """Each row's last prompt position: where its first token's logits are."""
        return [n - 1 for n in self.lengths]


def prepare(
    model: Any,
    batch: list[list[int]],
    max_new_tokens: Any,
    zeros: Callable[[tuple[int, ...]], Any],
    *,
    temperature: Any = 0.0,
    top_k: Any = None,
    top_p: Any = None,
    seed: Any = None,
    stop_tokens: Any = None,
    on_token: Any = None,
    repetition_penalty: Any = None,
    fast: Any = True,
) -> Prepared:
    """Everything ``generate`` checks and computes before anything runs, in both runtimes'
    order: the options (:func:`check_generate`, :func:`check_fast`), the prefill entry
    (:func:`prefill_entry`, E0871), the cache's length (:func:`check_cache`, E0817), the
    padded rows (:func:`padded`) and the prompt ids and stop tokens against the
    vocabulary (:func:`check_vocabulary`, E0780, E0819). ``batch`` holds the prompts as
    lists (:func:`prompt_lists`); ``zeros(shape)`` makes an int32 array of the runtime's,
    to lower the entries for.

    >>> p = prepare(model, [[1, 2, 3], [4]], 8, lambda s: np.zeros(s, np.int32))  # doctest: +SKIP
    >>> p.entry, p.lengths                                                        # doctest: +SKIP
    ('prefill_last', [3, 1])
    """
    stops, stops_from = stop_tokens_of(model, stop_tokens)
    check_generate(
        model,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stops,
        on_token,
        repetition_penalty,
    )
    check_fast(fast)
    entry = prefill_entry(model)
    one = zeros((1,))
    check_cache(model, max(len(p) for p in batch), max_new_tokens, one)
    # Prefill and decode run at a few bucketed shapes (padded): a prompt of a new length or
    # a new batch size lowers and compiles nothing once its bucket has run.
    rows = padded(batch, cache_length(model, one), ladder_of(model))
    vocabulary = check_vocabulary(model, rows, stops, zeros, stops_from, entry)
    lengths = [len(p) for p in batch] + [len(batch[-1])] * (len(rows) - len(batch))
    sampling = sampling_values(temperature, top_k, top_p, seed, repetition_penalty)
    return Prepared(batch, rows, lengths, tuple(stops), vocabulary, entry, sampling)


def sampling_seed(seed: int | None) -> int:
    """The seed sampling draws from: ``seed``, or a fresh one in [0, 2**64) for None.

    >>> sampling_seed(7)
    7
    >>> 0 <= sampling_seed(None) < 2**64
    True
    """
    return seed if seed is not None else secrets.randbits(64)


def not_finite(
    batch: list[list[int]], b: int, step: int, generated: int, prefill: str = "prefill"
) -> LinnetError:
    """E0818: sequence ``b``'s logits at ``step`` (after ``generated`` tokens of its own) are
    not all finite; ``batch`` holds the prompts (their lengths give the position),
    ``prefill`` names the entry step 0 ran (``prefill`` or ``prefill_last``).

    >>> print(not_finite([[1, 2, 3]], 0, 0, 0).diagnostics[0].message)
    the logits of sequence 0 at step 0 (`prefill` at position 2, after 0 generated token(s)) are not all finite: no token can be picked from NaN or infinity
    """
    position = len(batch[b]) + step - 1
    entry = prefill if step == 0 else "decode"
    return error(
        "E0818",
        f"the logits of sequence {b} at step {step} (`{entry}` at position "
        f"{position}, after {generated} generated token(s)) are not all finite: "
        "no token can be picked from NaN or infinity",
        help="a NaN or infinite weight, or a config value out of range (a "
        "negative rms_norm_eps, say), makes the logits non-finite: check "
        "the checkpoint and the config; `model.prefill` on the prompt shows "
        "the logits",
    )


class Progress:
    """The host's side of generation: each step's tokens (one copy to the host per step,
    -1 where a row's logits were not finite) appended to the sequences not yet stopped,
    E0818 for a -1 in one of them, ``on_token(step, tokens)`` called with the batch's last
    tokens, and whether another step is needed. ``stop_when(b, token)``, where given, is
    called with each token a sequence takes; True ends that sequence there (a stop string
    reached in its text: :mod:`linnet.lang.text.generation`). ``prefill`` names the entry
    that gave step 0's logits, for E0818.

    >>> progress = Progress([[1, 2]], stop_tokens=[], on_token=print)
    >>> progress.take(0, [5])
    0 [5]
    True
    >>> progress.take(1, [-1])
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0818]: the logits of sequence 0 at step 1 ...
    """

    def __init__(
        self,
        batch: list[list[int]],
        stop_tokens: Any,
        on_token: Callable[[int, list[int]], None] | None = None,
        stop_when: Callable[[int, int], bool] | None = None,
        prefill: str = "prefill",
    ):
        self.batch = batch
        self.prefill = prefill
        self.stops = {int(t) for t in stop_tokens}
        self.on_token = on_token
        self.stop_when = stop_when
        self.out: list[list[int]] = [[] for _ in batch]
        self.done = [False] * len(batch)

    def take(self, step: int, picked: Sequence[int]) -> bool:
        """Record ``step``'s tokens (one per sequence); True while a sequence goes on."""
        for b, token in enumerate(picked):
            if not self.done[b]:
                if token < 0:
                    raise not_finite(self.batch, b, step, len(self.out[b]), self.prefill)
                self.out[b].append(int(token))
                self.done[b] = int(token) in self.stops
                if self.stop_when is not None and self.stop_when(b, int(token)):
                    self.done[b] = True
        if self.on_token is not None:
            self.on_token(step, [o[-1] for o in self.out])
        return not all(self.done)
