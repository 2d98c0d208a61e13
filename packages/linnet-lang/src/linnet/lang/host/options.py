"""`linnet run`'s and ``Model.generate``'s options, checked before anything is loaded or an
array library imported (pure Python): ``--nproc`` (E0824) and the ranks' timeout (E0827),
``--prompt``/``--stop``/``--tokens`` (E0786, E0787, E0819), the seed and the sampling options
(E0812-E0815, E0867), and the prompt's length against the decode entry's positions (E0788).

>>> check_seed(0), rank_timeout("2.5", "--rank-timeout")
(None, 2.5)
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.host.inputs import error
from linnet.lang.host.run import check_threads
from linnet.lang.passes.bounds import bounds_for

if TYPE_CHECKING:
    import argparse


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system says it).

    >>> usable_cores() >= 1
    True
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: Ranks `--nproc` may start per usable CPU core (each rank is a process of its own).
RANKS_PER_CORE = 4


def check_nproc(nproc: Any) -> int:
    """`linnet run --nproc`: an int from 1 to :data:`RANKS_PER_CORE` ranks per usable core,
    checked before anything is imported or started; E0824 otherwise. (On CUDA the runtime
    also checks it against the GPUs: one rank each.)

    >>> check_nproc(1)
    1
    """
    cores = usable_cores()
    most = RANKS_PER_CORE * cores
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise LinnetError(
            Diagnostic(
                "E0824",
                f"--nproc {nproc}: start at least one rank",
                help="e.g. --nproc 2 (tensor parallelism over 2 ranks)",
            )
        )
    if nproc > most:
        shown = (
            f"{nproc}"
            if len(str(nproc)) <= 12
            else f"{str(nproc)[:6]}... ({len(str(nproc))} digits)"
        )
        raise LinnetError(
            Diagnostic(
                "E0824",
                f"--nproc {shown}: more ranks than this machine can start ({cores} "
                f"usable CPU core(s) run at most {most} ranks, each a process of its own)",
                help=f"start at most {most} ranks here (and at most one per GPU with --device "
                "cuda)",
            )
        )
    return nproc


#: Seconds a rank waits for the others, to join and in each collective, before E0825
#: (``LINNET_RANK_TIMEOUT`` or ``linnet run --rank-timeout`` sets it).
DEFAULT_TIMEOUT = 300.0
TIMEOUT_ENV = "LINNET_RANK_TIMEOUT"
_MOST_TIMEOUT = 7 * 24 * 3600.0


def rank_timeout(given: Any = None, name: str = TIMEOUT_ENV) -> float:
    """The seconds a rank waits for the others: ``given`` (an option, named ``name``), else
    ``$LINNET_RANK_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`; E0827 when it is not a number of
    seconds above 0.

    >>> rank_timeout(), rank_timeout("2.5", "--rank-timeout")
    (300.0, 2.5)
    """
    raw = str(given).strip() if given is not None else os.environ.get(TIMEOUT_ENV, "").strip()
    if given is None and not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= _MOST_TIMEOUT):
        shown = f"{name} {raw}" if name.startswith("-") else f"{name}={raw!r}"
        raise error(
            "E0827",
            f"{shown}: the time a rank waits for the others must be a "
            "number of seconds above 0 (at most a week)",
            help=f"e.g. {name}{' ' if name.startswith('-') else '='}600, or leave it "
            f"out for the default {DEFAULT_TIMEOUT:.0f} s",
        )
    return value


def run_tokens(
    args: argparse.Namespace, stop: bool = True
) -> tuple[list[int], list[int] | None] | None:
    """`linnet run`'s ``--prompt`` (and, with ``stop``, ``--stop``) as token lists; None
    after printing the usage error (exit status 2) when they are not integers; E0786 for an
    empty prompt, E0787 for ``--tokens`` below 1. The stop tokens are None where ``--stop``
    is not given (the checkpoint's own end-of-sequence tokens), ``[]`` for ``--stop none``.

    >>> import argparse
    >>> run_tokens(argparse.Namespace(prompt="1,2", stop="none", tokens=4))
    ([1, 2], [])
    >>> run_tokens(argparse.Namespace(prompt="1,2", stop=None, tokens=4))
    ([1, 2], None)
    """
    try:
        prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
        text = args.stop if stop else "none"
        stops = (
            None
            if text is None
            else []
            if text.strip().lower() == "none"
            else [int(t) for t in text.split(",") if t.strip()]
        )
    except ValueError:
        what = "--prompt and --stop take" if stop else "--prompt takes"
        print(f"linnet run: {what} comma-separated integers", file=sys.stderr)
        return None
    if not prompt:
        raise error(
            "E0786",
            "--prompt is empty: prefill needs at least one token",
            help="e.g. --prompt 1,2,3",
        )
    if args.tokens < 1:
        raise error(
            "E0787", f"--tokens {args.tokens}: decode at least one token", help="e.g. --tokens 16"
        )
    return prompt, stops


# A seed is a 64-bit unsigned int: what torch.Generator.manual_seed and NumPy keep of it (a
# negative seed or 2**64 would be wrapped or refused with a raw OverflowError).
SEED_RANGE = (0, 2**64)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer other than a bool: a Python int or any registered
    integral type (NumPy's, say: ``np.int64(3)`` from an array is a fine ``top_k``).

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number other than a bool: a Python int or float, or any
    registered real type (``np.float32(0.7)`` is a fine temperature).

    >>> is_real(0.7), is_real(2), is_real(False), is_real("0.7")
    (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_real(value: Any) -> float | None:
    """``value`` as a finite Python float where it is a real number other than a bool
    (:func:`is_real`), else None: NaN, infinities, an int past a double's range (10**400)
    and ``np.float32("inf")`` (which NumPy compares as no larger than the largest double,
    having rounded that to float32 first) are not.

    >>> finite_real(0.5), finite_real(10**400), finite_real(float("nan")), finite_real(True)
    (0.5, None, None, None)
    """
    if not is_real(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def sampling_values(
    temperature: Any, top_k: Any, top_p: Any, seed: Any, repetition_penalty: Any
) -> tuple[float, int | None, float | None, int | None, float | None]:
    """The sampling options, once checked (:func:`check_sampling`), as Python numbers: a NumPy
    scalar becomes the float or int it holds, so that no array library sees another
    library's scalar and every runtime computes with the same doubles.

    >>> sampling_values(0, None, 1, None, None)
    (0.0, None, 1.0, None, None)
    """
    return (
        float(temperature),
        None if top_k is None else int(top_k),
        None if top_p is None else float(top_p),
        None if seed is None else int(seed),
        None if repetition_penalty is None else float(repetition_penalty),
    )


def check_seed(seed: Any, name: str = "seed", optional: bool = True) -> None:
    """E0815 unless ``seed`` is an int in [0, 2**64) (or None when ``optional``); ``name``
    is how the caller spells it (``seed``, ``--sampling-seed``).

    >>> check_seed(2**64 - 1)
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0815]: seed must be None or an int in ...
    """
    if seed is None and optional:
        return
    if not is_int(seed) or not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        none = "None or " if optional else ""
        raise error(
            "E0815",
            f"{name} must be {none}an int in [0, 2**64), not {seed!r}",
            help=f"e.g. {name}{' ' if name.startswith('--') else '='}0 (the same "
            "seed gives the same numbers)",
        )


def check_penalty(penalty: Any, name: str = "repetition_penalty") -> None:
    """E0867 unless ``penalty`` (``generate``'s ``repetition_penalty``) is None (none) or a
    finite number > 0 (1 penalises nothing); ``name`` is how the caller spells it
    (``--repetition-penalty``, whose None is the option left out).

    >>> check_penalty(1.3), check_penalty(None)
    (None, None)
    >>> check_penalty(0.0)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0867]: repetition_penalty must be None ...
    """
    if penalty is None:
        return
    # An int past a double's range (10**400) is no finite float: float() of it overflows.
    number = finite_real(penalty)
    if number is None or not number > 0:
        cli = name.startswith("--")
        none = "" if cli else "None or "
        example = f"{name} 1.2" if cli else f"{name}=1.2"
        raise error(
            "E0867",
            f"{name} must be {none}a finite number > 0, not {penalty!r}",
            help=f"e.g. {example} makes tokens already in the sequence less likely (1 "
            "changes nothing; below 1 makes them more likely)",
        )


def check_sampling(
    temperature: Any,
    top_k: Any,
    top_p: Any,
    seed: Any,
    cli: bool = False,
    repetition_penalty: Any = None,
) -> None:
    """The rules of `generate`'s sampling options, shared by ``Model.generate`` and `linnet
    run` (which checks its options with ``cli=True`` before it imports an array library):
    E0812 ``temperature`` (a finite number >= 0), E0813 ``top_k`` (None or an int >= 1),
    E0814 ``top_p`` (None or a number in (0, 1]), E0815 ``seed`` (see :func:`check_seed`),
    E0867 ``repetition_penalty`` (None or a finite number > 0: :func:`check_penalty`).

    >>> check_sampling(0.7, 40, 0.9, 0)
    >>> check_sampling(float("nan"), None, None, None)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0812]: temperature must be a finite ...
    """

    def named(keyword: str) -> str:
        return "--" + keyword.replace("_", "-") if cli else keyword

    def example(keyword: str, value: str) -> str:
        return f"{named(keyword)} {value}" if cli else f"{keyword}={value}"

    # An int past a double's range (10**400) is no finite number: dividing by it overflows.
    number = finite_real(temperature)
    if number is None or not number >= 0:
        raise error(
            "E0812",
            f"{named('temperature')} must be a finite number >= 0, not {temperature!r}",
            help="0 picks the most likely token (greedy); 0.7 samples, 1.0 samples "
            "the model's distribution",
        )
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise error(
            "E0813",
            f"{named('top_k')} must be {'' if cli else 'None or '}an int >= 1, not {top_k!r}",
            help=f"e.g. {example('top_k', '50')} keeps the 50 most likely tokens",
        )
    if top_p is not None and not 0 < (finite_real(top_p) or 0.0) <= 1:
        raise error(
            "E0814",
            f"{named('top_p')} must be {'' if cli else 'None or '}a number "
            f"in (0, 1], not {top_p!r}",
            help=f"e.g. {example('top_p', '0.9')} keeps the most likely tokens that reach 90%",
        )
    check_seed(seed, named("sampling_seed") if cli else "seed", optional=True)
    check_penalty(repetition_penalty, named("repetition_penalty"))


def check_run_options(args: argparse.Namespace, stops: Sequence[int] | None) -> None:
    """`linnet run`'s numeric options checked before anything is loaded or imported: the
    sampling options (:func:`check_sampling`), ``--seed``, the ``--stop`` ids ``stops``
    (E0819 for a negative one; the model's vocabulary bounds them from above once loaded),
    and ``--threads`` (E0799).

    >>> import argparse
    >>> check_run_options(argparse.Namespace(temperature=0.0, top_k=None, top_p=None,
    ...                                      sampling_seed=None, seed=0), [2])
    """
    check_sampling(
        args.temperature,
        args.top_k,
        args.top_p,
        args.sampling_seed,
        cli=True,
        repetition_penalty=getattr(args, "repetition_penalty", None),
    )
    check_seed(args.seed, "--seed", optional=False)
    for token in stops or []:
        if token < 0:
            raise stop_token_error(token, None, "--stop")
    check_threads(getattr(args, "threads", None), usable_cores())


def stop_token_error(token: int, vocabulary: int | None, name: str = "stop_tokens") -> LinnetError:
    """E0819: a stop token the model can never emit (negative, or ``vocabulary`` or more),
    so it would never stop a sequence.

    >>> stop_token_error(300, 256).diagnostics[0].message
    'stop token 300 (in stop_tokens) is not a token id of this model: its ids are [0, 256)'
    """
    ids = f"[0, {vocabulary})" if vocabulary is not None else "at least 0"
    return error(
        "E0819",
        f"stop token {token} (in {name}) is not a token id of this model: its ids are {ids}",
        help="a stop token is an id the model emits (the tokenizer's EOS id, say); "
        "one outside the vocabulary would never end a sequence",
    )


def check_length(model: Any, prompt: int, tokens: int, one: Any) -> None:
    """E0788 before prefill when decoding ``tokens`` after a ``prompt``-token prompt would
    run past the positions ``model``'s decode entry accepts (the KV cache's length);
    ``one`` is a one-element i32 input of the runtime's (to lower ``decode`` for).

    >>> check_length(model, 4, 16, torch.zeros(1, dtype=torch.int32))   # doctest: +SKIP
    """
    if "decode" not in model.entries:
        return
    graph = model.graph("decode", [one, one])
    r = next((r for name, r in bounds_for(graph).inputs.items() if name == "%pos"), None)
    last = prompt + tokens - 2  # the position of the last decode step
    if r is None or tokens < 2 or last < r.hi:
        return
    raise error(
        "E0788",
        f"a prompt of {prompt} tokens and --tokens {tokens} decode up to position "
        f"{last}, but `decode` takes positions below {r.hi} ({r.upper.describe(graph)})",
        help=f"decode at most --tokens {max(1, r.hi - prompt + 1)} after this prompt, or "
        "give a config with a longer cache (--config)",
    )
