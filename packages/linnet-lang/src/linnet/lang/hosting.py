"""What a runtime hosting Linnet models on an array library shares, written once.

``linnet.torch`` and ``linnet.jax`` load the same models, check the same entry inputs, run
the same `linnet run` demo and check kernels the same way; only the array library differs.
The parts that do not touch it live here, so that both raise the same coded errors with the
same messages and print the same lines: each runtime passes what it alone knows (a dtype's
name, a host copy of an index input as ints, a function that writes a checkpoint) and keeps
the rest. Named "hosting" because this is the runtimes' side of the compiler: what hosting a
model takes beyond emitting its code.

Sections: loading (E0601, E0713, E0741, E0743, E0744), `linnet run` and generate's options
(E0740, E0786-E0788, E0812-E0815, E0819) and kernel checks; entry inputs (E0720, E0722,
E0780, E0783, E0784) are in :mod:`linnet.lang.host.inputs`, imported here too, and the rest
of ``Model.generate`` (E0794, E0810-E0819) in :mod:`linnet.lang.host.generate`. Nothing here
imports torch, jax or NumPy (linnet-lang is pure Python).

>>> error("E0713", "numerics must be 'exact' or 'fast', not 'quick'").diagnostics[0].code
'E0713'
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The runtimes' kernel checks draw scalar parameters with scalar_value.
from linnet.lang.check.kernel_cases import scalar_value  # noqa: F401
from linnet.lang.diagnostics.core import Diagnostic, LinnetError

# Entry inputs live in linnet.lang.host.inputs; the runtimes import them from here too.
from linnet.lang.host.inputs import (  # noqa: F401
    GATHER_EXAMPLE,
    bind_inputs,
    check_count,
    dtype_error,
    error,
    in_range,
    range_error,
    range_error_of,
    range_parts,
    short,
)
from linnet.lang.host.run import RunSetup, default_model, run_setup  # noqa: F401

# NUMERICS (the values of linnet.lang.pipeline.Numerics) is what the runtimes re-export.
from linnet.lang.pipeline import NUMERICS, Numerics  # noqa: F401
from linnet.lang.weights.demo import parameter_types  # noqa: F401  (the runtimes' random_weights)

if TYPE_CHECKING:
    import argparse

    from linnet.lang.check.kernel_cases import KernelCase, KernelCheck
    from linnet.lang.ir.graph import Graph
    from linnet.lang.syntax.program import Program
    from linnet.lang.weights.safetensors import Checkpoint

# Linnet's floating-point element types: the ones `dtype=` converts weights to.
FLOATS = ("f64", "f32", "f16", "bf16")

# A comparison's finding: (problem, difference, tolerance, where), or None.
Found = tuple[str, float, float, str] | None


def nonfinite_weight(name: str, nan: int, inf: int, first: Sequence[int]) -> Diagnostic:
    """E0666: weight ``name`` holds ``nan`` NaN and ``inf`` infinite values, the first at
    index ``first``; the runtimes' load-time check raises it.

    >>> print(nonfinite_weight("lm_head.weight", 1, 0, [3, 7]).message)
    weight `lm_head.weight` holds 1 NaN value (the first at [3, 7])
    """
    parts = [f"{n} {what} value{'s' if n != 1 else ''}"
             for n, what in ((nan, "NaN"), (inf, "infinite")) if n]
    return Diagnostic(
        "E0666", f"weight `{name}` holds {' and '.join(parts)} (the first at {list(first)})",
        help="one NaN or infinite weight makes every result NaN (greedy decoding then repeats "
             "one token forever): the checkpoint is damaged, or was saved after training "
             "diverged; save or download it again. To load it anyway (to inspect it), pass "
             "check_finite=False")


def check_finite_flag(value: Any) -> None:
    """E0667 unless ``check_finite=`` is True or False (a typo must not mean either).

    >>> check_finite_flag("no")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0667]: check_finite must be True or False, not 'no'...
    """
    if not isinstance(value, bool):
        raise error("E0667", f"check_finite must be True or False, not {short(value)}",
                    help="load(..., check_finite=False) skips the NaN check of the weights; "
                         "leave it out to check them")


# ---------------------------------------------------------------- loading
def check_numerics(numerics: str) -> Numerics:
    """E0713 unless ``numerics`` is ``"exact"`` or ``"fast"``: :meth:`Numerics.parse`, the
    one check every entry point makes.

    >>> check_numerics("fast")
    <Numerics.FAST: 'fast'>
    """
    return Numerics.parse(numerics)


def load_program(path: str | Path) -> tuple[Program, Path]:
    """The checked program of a model file, or of a model the wheel ships by module name
    (``std.models.llama``), and its file; the checker's errors raised together.

    >>> load_program("std.models.llama")[1].name
    'llama.linnet'
    """
    from linnet.lang.check.driver import check_program
    from linnet.lang.syntax.program import Program, model_file

    model_path = model_file(path)  # a file, or a shipped model by name (std.models.llama)
    kept = _KEPT[-1] if _KEPT else None
    key = model_path.resolve()
    if kept is not None and key in kept:
        return kept[key], model_path
    program = Program.from_file(model_path)
    errors = check_program(program)
    if errors:
        raise LinnetError(errors)
    if kept is not None:
        kept[key] = program
    return program, model_path


_KEPT: list[dict[Path, Program]] = []


@contextmanager
def programs_kept() -> Iterator[None]:
    """Within the block, :func:`load_program` parses and checks each model file once and
    returns that same checked program for it again: for a run that loads the same files many
    times over (the conformance suite loads each case's model on every runtime), while the
    files do not change. Outside it every call reads the file afresh.

    >>> with programs_kept():
    ...     load_program("std.models.llama")[0] is load_program("std.models.llama")[0]
    True
    """
    _KEPT.append({})
    try:
        yield
    finally:
        _KEPT.pop()


def read_config(config: dict[str, Any] | str | Path | None, model_path: Path) -> dict[str, Any]:
    """The user's ``config=`` as a dict: a dict as given (keys starting with ``_`` are
    comments), a JSON file, or a name in the model's configs/ folder (E0744 otherwise).

    >>> read_config({"H": 4, "_note": "a comment"}, Path("llama.linnet"))
    {'H': 4}
    """
    if config is None:
        return {}
    if isinstance(config, dict):
        return {k: v for k, v in config.items() if not str(k).startswith("_")}
    if not isinstance(config, str | Path):
        raise error("E0744", f"config must be a dict, a JSON file or a config name, not "
                    f"{type(config).__name__}", help="e.g. config='toy' or config={'H': 4}")
    from linnet.lang.cli import load_config

    return load_config(str(config), [], str(model_path))


def check_weights_type(weights: Any, is_tensor: Callable[[Any], bool], noun: str,
                       note: str = "") -> None:
    """E0741 unless ``weights`` is None, a path, a non-empty list of paths or a dict of
    names to ``is_tensor`` values (``noun``: what the runtime calls them, "tensors").

    >>> check_weights_type(["a.safetensors", "b.safetensors"], lambda v: False, "arrays")
    >>> check_weights_type(3, lambda v: False, "arrays")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0741]: weights must be a safetensors file, ...
    """
    ok = weights is None or isinstance(weights, str | os.PathLike) or (
        isinstance(weights, list | tuple) and bool(weights)
        and all(isinstance(w, str | os.PathLike) for w in weights)) or (
        isinstance(weights, dict) and all(isinstance(k, str) and is_tensor(v)
                                          for k, v in weights.items()))
    if not ok:
        shown = repr(weights)
        raise error("E0741", f"weights must be a safetensors file, a checkpoint directory, an "
                    f"index JSON, a list of files or a dict of {noun}, not "
                    f"{type(weights).__name__} {shown[:50]}{'...' if len(shown) > 50 else ''}",
                    help="e.g. weights='Llama-3.2-1B/'" + (f" ({note})" if note else ""))


def check_dtype_config(program: Program, config: dict[str, Any], convert: str | None) -> None:
    """E0743 where ``dtype=`` converts the weights to ``convert`` (a Linnet name) and the
    config sets one of the model's `DType` generics to another type.

    >>> check_dtype_config(load_program("std.models.llama")[0], {"T": "f32"}, "bf16")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0743]: dtype=bf16 converts the weights...
    """
    if convert is None:
        return
    from linnet.lang.check.driver import find_model

    decl = find_model(program, None)
    for g in (g.name for g in decl.generics if g.kind == "DType"):
        if g in config and config[g] != convert:
            raise error("E0743", f"dtype={convert} converts the weights to {convert}, but the "
                        f"config sets `{g}` to {config[g]!r}",
                        help=f"drop `{g}` from the config (it follows dtype=), or load with "
                             f"dtype={config[g]!r}")


def read_headers(weights: Any, program: Program, model_path: Path, config: dict[str, Any],
                 convert: str | None) -> tuple[Checkpoint, dict[str, Any], dict[str, Any]]:
    """A checkpoint's files, its tensors' shapes and dtypes (as ``convert``, a Linnet float
    name, makes them) and the config they complete: a Hugging Face ``config.json`` beside
    the files merged in (through the model's ``.hf.json`` mapping), then the dims the
    weights determine. Headers only: nothing is read to a device (the runtime does that).

    >>> ckpt, shapes, cfg = read_headers("Llama-3.2-1B/", program, path, {}, "bf16")
    ...                                                                   # doctest: +SKIP
    """
    from linnet.lang.check.driver import find_model
    from linnet.lang.weights.checkpoint import (
        fit_checkpoint,
        merge_config,
        read_checkpoint_config,
    )
    from linnet.lang.weights.gguf import is_gguf
    from linnet.lang.weights.safetensors import (
        TensorInfo,
        checkpoint_shapes,
        resolve_checkpoint,
    )

    if is_gguf(weights):  # llama.cpp's format: its metadata is the config (weights/gguf_load.py)
        from linnet.lang.weights.gguf_load import gguf_headers

        return gguf_headers(weights, program, model_path, config, convert)  # type: ignore[return-value]
    ckpt = resolve_checkpoint(weights)
    shapes: dict[str, Any] = dict(checkpoint_shapes(ckpt))
    ckpt_config = None
    if ckpt.config_path is not None:
        ckpt_config = read_checkpoint_config(ckpt.config_path, model_path,
                                             find_model(program, None).name, program)
        if ckpt_config is not None:
            config = merge_config(config, ckpt_config)
    if convert is not None:
        shapes = {k: TensorInfo(s[0], convert if s[1] in FLOATS else s[1],
                                getattr(s, "shard", "")) for k, s in shapes.items()}
    config = fit_checkpoint(program, config, shapes, ckpt_config)
    return ckpt, shapes, config


def entry_method(program: Program, entry: str) -> Any:
    """The model's entry ``entry`` (its declaration: ``.params``), or E0601 listing them.

    >>> [p.name for p in entry_method(load_program("std.models.llama")[0], "decode").params]
    ['token', 'pos']
    """
    from linnet.lang.check.driver import find_model

    decl = find_model(program, None)
    method = decl.method(entry)
    if method is None or method.kind != "entry":
        entries = [m.name for m in decl.methods if m.kind == "entry"]
        raise error("E0601", f"model `{decl.name}` has no entry `{entry}`",
                    help="entries: " + ", ".join(entries))
    return method


# ---------------------------------------------------------------- linnet run
def run_config(args: argparse.Namespace) -> RunSetup:
    """`linnet run`'s model, config and weights (:func:`linnet.lang.host.run.run_setup`):
    every path, name and ``--set`` key checked before anything is loaded or imported.

    >>> run_config(argparse.Namespace(file=None, weights=None, config=None, set=[]))
    ...                                                                   # doctest: +SKIP
    RunSetup(model=PosixPath('.../examples/llama/llama.linnet'), config_name='toy', ...)
    """
    return run_setup(args)


def demo_checkpoint(model: Path, config: dict[str, Any], seed: int,
                    write: Callable[[Path], None] | None = None) -> Path:
    """The demo's deterministic random checkpoint for ``model``, ``config`` and ``seed``
    under $LINNET_HOME/demo, made once (to a temporary name, renamed into place) by the one
    generator every runtime shares (:mod:`linnet.lang.weights.demo`): `linnet run` and
    `linnet run --runtime jax` load the same file and decode the same tokens. ``write``
    (a function of the path) writes it instead (tests).

    >>> demo_checkpoint(Path("llama.linnet"), cfg, 0)   # doctest: +SKIP
    PosixPath('/home/me/.cache/linnet/demo/llama-3f2a....safetensors')
    """
    import contextlib
    import hashlib
    import tempfile

    from linnet.lang.home import linnet_home
    from linnet.lang.home_files import record
    from linnet.lang.weights.demo import GENERATOR, write_demo

    key = hashlib.sha256(f"{GENERATOR}{model.read_text()}{sorted(config.items())}{seed}"
                         .encode())
    name = f"{model.stem}-{key.hexdigest()[:12]}.safetensors"
    path = linnet_home() / "demo" / name
    if not path.is_file() or path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A name of its own (two processes making it at once), renamed onto the place: a
        # link there is replaced, never written through.
        fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            if write is None:
                write_demo(Path(tmp), model, config, seed)
            else:
                write(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        record(path)  # so that `linnet cache clear` knows the file as Linnet's
    return path


def announce_demo(model: Path, config_name: str | None, seed: int) -> None:
    """The line `linnet run` prints on stderr before it makes the demo checkpoint.

    >>> announce_demo(Path("llama.linnet"), "small", 0)  # doctest: +SKIP
    linnet: generating a deterministic checkpoint for llama.linnet (small config, seed 0)
    """
    which = f"{config_name} config" if config_name else "no named config: --set and defaults"
    print(f"linnet: generating a deterministic checkpoint for {model.name} "
          f"({which}, seed {seed})", file=sys.stderr)


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
        raise LinnetError(Diagnostic("E0824", f"--nproc {nproc}: start at least one rank",
                                     help="e.g. --nproc 2 (tensor parallelism over 2 ranks)"))
    if nproc > most:
        shown = f"{nproc}" if len(str(nproc)) <= 12 else f"{str(nproc)[:6]}... " \
                                                        f"({len(str(nproc))} digits)"
        raise LinnetError(Diagnostic(
            "E0824", f"--nproc {shown}: more ranks than this machine can start ({cores} "
                     f"usable CPU core(s) run at most {most} ranks, each a process of its own)",
            help=f"start at most {most} ranks here (and at most one per GPU with --device "
                 "cuda)"))
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
        raise error("E0827", f"{shown}: the time a rank waits for the others must be a "
                    "number of seconds above 0 (at most a week)",
                    help=f"e.g. {name}{' ' if name.startswith('-') else '='}600, or leave it "
                         f"out for the default {DEFAULT_TIMEOUT:.0f} s")
    return value


def run_tokens(args: argparse.Namespace, stop: bool = True
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
        stops = None if text is None else [] if text.strip().lower() == "none" else \
            [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        what = "--prompt and --stop take" if stop else "--prompt takes"
        print(f"linnet run: {what} comma-separated integers", file=sys.stderr)
        return None
    if not prompt:
        raise error("E0786", "--prompt is empty: prefill needs at least one token",
                    help="e.g. --prompt 1,2,3")
    if args.tokens < 1:
        raise error("E0787", f"--tokens {args.tokens}: decode at least one token",
                    help="e.g. --tokens 16")
    return prompt, stops


# A seed is a 64-bit unsigned int: what torch.Generator.manual_seed and NumPy keep of it (a
# negative seed or 2**64 would be wrapped or refused with a raw OverflowError).
SEED_RANGE = (0, 2**64)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    if not _is_int(seed) or not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        none = "None or " if optional else ""
        raise error("E0815", f"{name} must be {none}an int in [0, 2**64), not {seed!r}",
                    help=f"e.g. {name}{' ' if name.startswith('--') else '='}0 (the same "
                         "seed gives the same numbers)")


def check_sampling(temperature: Any, top_k: Any, top_p: Any, seed: Any,
                   cli: bool = False) -> None:
    """The rules of `generate`'s sampling options, shared by ``Model.generate`` and `linnet
    run` (which checks its options with ``cli=True`` before it imports an array library):
    E0812 ``temperature`` (a finite number >= 0), E0813 ``top_k`` (None or an int >= 1),
    E0814 ``top_p`` (None or a number in (0, 1]), E0815 ``seed`` (see :func:`check_seed`).

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

    if not isinstance(temperature, int | float) or isinstance(temperature, bool) \
            or not 0 <= temperature < float("inf"):
        raise error("E0812", f"{named('temperature')} must be a finite number >= 0, not "
                    f"{temperature!r}",
                    help="0 picks the most likely token (greedy); 0.7 samples, 1.0 samples "
                         "the model's distribution")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise error("E0813", f"{named('top_k')} must be {'' if cli else 'None or '}an int "
                    f">= 1, not {top_k!r}",
                    help=f"e.g. {example('top_k', '50')} keeps the 50 most likely tokens")
    if top_p is not None and (not isinstance(top_p, int | float) or isinstance(top_p, bool)
                              or not 0 < top_p <= 1):
        raise error("E0814", f"{named('top_p')} must be {'' if cli else 'None or '}a number "
                    f"in (0, 1], not {top_p!r}",
                    help=f"e.g. {example('top_p', '0.9')} keeps the most likely tokens that "
                         "reach 90%")
    check_seed(seed, named("sampling_seed") if cli else "seed", optional=True)


def check_run_options(args: argparse.Namespace, stops: Sequence[int] | None) -> None:
    """`linnet run`'s numeric options checked before anything is loaded or imported: the
    sampling options (:func:`check_sampling`), ``--seed``, the ``--stop`` ids ``stops``
    (E0819 for a negative one; the model's vocabulary bounds them from above once loaded),
    and ``--threads`` (E0799).

    >>> import argparse
    >>> check_run_options(argparse.Namespace(temperature=0.0, top_k=None, top_p=None,
    ...                                      sampling_seed=None, seed=0), [2])
    """
    from linnet.lang.host.run import check_threads

    check_sampling(args.temperature, args.top_k, args.top_p, args.sampling_seed, cli=True)
    check_seed(args.seed, "--seed", optional=False)
    for token in stops or []:
        if token < 0:
            raise stop_token_error(token, None, "--stop")
    check_threads(getattr(args, "threads", None), usable_cores())


def stop_token_error(token: int, vocabulary: int | None, name: str = "stop_tokens"
                     ) -> LinnetError:
    """E0819: a stop token the model can never emit (negative, or ``vocabulary`` or more),
    so it would never stop a sequence.

    >>> stop_token_error(300, 256).diagnostics[0].message
    'stop token 300 (in stop_tokens) is not a token id of this model: its ids are [0, 256)'
    """
    ids = f"[0, {vocabulary})" if vocabulary is not None else "at least 0"
    return error("E0819", f"stop token {token} (in {name}) is not a token id of this model: "
                 f"its ids are {ids}",
                 help="a stop token is an id the model emits (the tokenizer's EOS id, say); "
                      "one outside the vocabulary would never end a sequence")


def check_length(model: Any, prompt: int, tokens: int, one: Any) -> None:
    """E0788 before prefill when decoding ``tokens`` after a ``prompt``-token prompt would
    run past the positions ``model``'s decode entry accepts (the KV cache's length);
    ``one`` is a one-element i32 input of the runtime's (to lower ``decode`` for).

    >>> check_length(model, 4, 16, torch.zeros(1, dtype=torch.int32))   # doctest: +SKIP
    """
    from linnet.lang.ir.bounds import bounds_for

    if "decode" not in model.entries:
        return
    graph = model.graph("decode", [one, one])
    r = next((r for name, r in bounds_for(graph).inputs.items() if name == "%pos"), None)
    last = prompt + tokens - 2  # the position of the last decode step
    if r is None or tokens < 2 or last < r.hi:
        return
    raise error(
        "E0788", f"a prompt of {prompt} tokens and --tokens {tokens} decode up to position "
        f"{last}, but `decode` takes positions below {r.hi} ({r.upper.describe(graph)})",
        help=f"decode at most --tokens {max(1, r.hi - prompt + 1)} after this prompt, or "
             "give a config with a longer cache (--config)")


def loaded_line(model_path: Path, device: Any, seconds: float, entries: Sequence[str],
                runtime: str = "", extra: str = "") -> str:
    """`linnet run`'s first line: what was loaded where, how fast, and its entries.

    >>> loaded_line(Path("llama.linnet"), "cpu", 0.5, ["prefill", "decode"], runtime="jax")
    'loaded llama.linnet on cpu (jax) in 0.50 s (entries: prefill, decode)'
    >>> from linnet.lang.syntax.program import model_file
    >>> loaded_line(model_file("std.models.qwen2"), "cpu", 0.5, ["prefill"])
    'loaded std.models.qwen2 on cpu in 0.50 s (entries: prefill)'
    """
    from linnet.lang.syntax.program import STD_ROOT

    on = f" ({runtime})" if runtime else ""
    shown: Path | str = model_path
    if Path(model_path).resolve().is_relative_to(STD_ROOT.resolve()):  # a shipped model
        shown = "std." + ".".join(Path(model_path).resolve().relative_to(
            STD_ROOT.resolve()).with_suffix("").parts)
    return (f"loaded {shown} on {device}{on} in {seconds:.2f} s "
            f"(entries: {', '.join(entries)}{extra})")


def prefill_line(tokens: int, ms: float) -> str:
    """The line timing prefill.

    >>> prefill_line(3, 12.0)
    'prefill 3 tokens: 12.0 ms (includes lowering and compiling on the first call)'
    """
    return (f"prefill {tokens} tokens: {ms:.1f} ms "
            "(includes lowering and compiling on the first call)")


def token_line(step: int, position: int, token: int, ms: float) -> str:
    """The line of one decode step.

    >>> token_line(1, 3, 42, 1.5)
    '  token   1 at position    3:     42       1.50 ms'
    """
    return f"  token {step:3d} at position {position:4d}: {token:6d}   {ms:8.2f} ms"


def summary_lines(out: Sequence[int], times: Sequence[float], first: str) -> list[str]:
    """`linnet run`'s last two lines: the tokens, and the median decode step after the
    first (``first`` says what the first one includes).

    >>> summary_lines([5, 6, 7], [9.0, 1.0, 3.0], "includes lowering")[1]
    'per-token decode: median 3.00 ms after the first (first: 9.0 ms, includes lowering)'
    """
    rest = sorted(times[1:])
    steady = rest[len(rest) // 2] if len(times) > 1 else float("nan")
    return [f"decoded {len(out)} tokens: {list(out)}",
            f"per-token decode: median {steady:.2f} ms after the first (first: "
            f"{times[0] if times else float('nan'):.1f} ms, {first})"]


# ---------------------------------------------------------------- kernel checks
def case_graph(program: Program, op: Any, case: KernelCase,
               scalar: Callable[[str, str], Any]) -> tuple[Program, Graph]:
    """The one-op wrapper program of a kernel check's ``case`` and its entry's graph;
    ``scalar(dtype, name)`` gives each scalar parameter's value.

    >>> wrapper, graph = case_graph(program, op, case, scalar)   # doctest: +SKIP
    """
    from linnet.lang.check.driver import lower
    from linnet.lang.check.kernel_cases import ENTRY, MODEL, wrapper_program

    wrapper = wrapper_program(program, op, case)
    config = {name: scalar(dtype, name) for name, dtype in case.scalars.items()}
    shapes = {name: list(shape) for name, (shape, _) in case.params.items()}
    return wrapper, lower(wrapper, ENTRY, shapes, config, model=MODEL, check=False)


def shape_found(name: str, got: Sequence[int], want: Sequence[int]) -> tuple[Found, float]:
    """A comparison's finding for results of different shapes.

    >>> shape_found("result", [2], [3])[0][0]
    "result has shape [2], the body's [3]"
    """
    return ((f"{name} has shape {list(got)}, the body's {list(want)}", float("inf"), 0.0, ""),
            float("inf"))


def nan_found(name: str, count: int, first: Sequence[int]) -> tuple[Found, float]:
    """A comparison's finding for ``count`` NaN elements where the body has numbers.

    >>> nan_found("result", 2, [0, 1])[0][3]
    'result[0, 1]'
    """
    from linnet.lang.check.kernel_cases import position

    return ((f"{count} element(s) of the {name} are NaN where the body's are not (lanes the "
             "kernel never stored?), the first", float("inf"), 0.0,
             position(name, list(first))), float("inf"))


# Float types whose body rounds every step to few bits: their results are also held to the
# exact result (the body in f64) where the body's own rounding leaves it far from it.
SHORT_FLOATS = ("bf16", "f16")


def exact_case(case: KernelCase, wide: str = "f64") -> KernelCase | None:
    """``case`` with its 16-bit float tensors and results (and a dtype generic bound to
    such a type) in ``wide`` (f64; JAX without x64: f32, 2^16 times finer than bf16): the
    case whose body gives the (all but) exact result that the body's own 16-bit evaluation
    approximates. None for a case with no 16-bit tensor.

    >>> from linnet.lang.check.kernel_cases import KernelCase
    >>> exact_case(KernelCase("m::f", "m::k", {"T": "bf16"}, {"x": ((3,), "bf16"),
    ...                       "i": ((3,), "i32")}, {}, [((3,), "bf16")])).params
    {'x': ((3,), 'f64'), 'i': ((3,), 'i32')}
    """
    from dataclasses import replace

    def widen(dtype: Any) -> Any:
        return wide if dtype in SHORT_FLOATS else dtype

    if not any(d in SHORT_FLOATS for _, d in [*case.params.values(), *case.results]):
        return None
    return replace(case, generics={k: widen(v) for k, v in case.generics.items()},
                   params={n: (s, widen(d)) for n, (s, d) in case.params.items()},
                   results=[(s, widen(d)) for s, d in case.results])


def no_further_than_the_body(compare: Callable[[Any, Any, str, str], tuple[Found, float]],
                             want: Sequence[Any],
                             exact: Callable[[], Sequence[Any] | None],
                             as_f64: Callable[[Any], Any]
                             ) -> Callable[[Any, Any, str, str], tuple[Found, float]]:
    """``compare``, except that a 16-bit result found to differ from the body's (``want``)
    passes where every element is within the tolerance of the exact result (``exact()``: the
    body of :func:`exact_case`, widened, run only the first time a result needs it; None
    where there is none) plus twice the body's largest distance from it. An
    op whose body rounds an intermediate (a product) and then amplifies it (a softmax of
    scores tens of units apart, as random inputs give) has a 16-bit body far from the exact
    result, and a kernel that rounds elsewhere is as far, by other amounts at other elements;
    a kernel that is wrong is farther. ``as_f64`` makes a runtime's tensor a numpy float64
    array.

    >>> checked = no_further_than_the_body(compare, want, run_exact, np.asarray)  # doctest: +SKIP
    """
    made: list[Sequence[Any] | None] = []

    def checked(got: Any, body: Any, dtype: str, name: str) -> tuple[Found, float]:
        import numpy as np
        from linnet.lang.check.kernel_cases import TOLERANCES

        found, diff = compare(got, body, dtype, name)
        k = next((i for i, w in enumerate(want) if w is body), None)
        if found is None or found[0] != "differs" or dtype not in SHORT_FLOATS or k is None:
            return found, diff
        if not made:
            made.append(exact())
        if made[0] is None:
            return found, diff
        g, w, x = as_f64(got), as_f64(body), as_f64(made[0][k])
        rtol, atol = TOLERANCES[dtype]
        finite = np.isfinite(x)
        scale = max(1.0, float(np.abs(x[finite]).max()) if finite.any() else 1.0)
        off = np.abs(w - x)
        worst = float(off[finite].max()) if finite.any() else 0.0
        limit = atol * scale + rtol * np.abs(x) + 2 * worst
        with np.errstate(invalid="ignore"):
            ok = ~finite | (np.abs(g - x) <= limit)
        return (None, diff) if bool(ok.all()) else (found, diff)

    return checked


class KernelFault(Exception):
    """What a guarded kernel launch found wrong while it ran (an access outside every
    tensor of the launch, two programs racing on an element): its message is the finding's
    problem. A runtime's guard raises it before the access it stops.

    >>> str(KernelFault("`store` writes 4 bytes past the end of `y`"))
    '`store` writes 4 bytes past the end of `y`'
    """


def check_launch(case: KernelCase, want: Sequence[Any],
                 launch: Callable[[], tuple[Sequence[Any], int, bool]],
                 compare: Callable[[Any, Any, str, str], tuple[Found, float]],
                 via: str = "") -> KernelCheck:
    """One kernel check: ``launch()`` runs the kernel, returning its results, how many
    launches ran and whether f32 products ran in TF32; each result is compared with the
    body's (``want``) by the runtime's ``compare(got, want, dtype, name)``. A launch that
    raises, or that launches nothing, is a finding (a :class:`KernelFault` says what its
    guard found); ``via`` names the launcher in findings.

    >>> check_launch(case, want, lambda: (outs, 1, False), compare)   # doctest: +SKIP
    KernelCheck(case=..., difference=0.0, finding=None)
    """
    from linnet.lang.check.kernel_cases import KernelCheck, finding

    try:
        got, launches, tf32 = launch()
    except KernelFault as exc:
        return KernelCheck(case, float("inf"), finding(case, str(exc), via=via))
    except Exception as exc:  # a kernel that fails to compile or run is a finding
        return KernelCheck(case, float("inf"), finding(
            case, f"the launch failed: {type(exc).__name__}: {str(exc).splitlines()[0]}",
            via=via))
    if launches == 0:
        return KernelCheck(case, float("inf"), finding(
            case, "the kernel did not launch (the generated code ran the body)", via=via))
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want)):
        name = "result" if len(want) == 1 else f"result {k}"
        dtype = case.results[k][1]
        found, diff = compare(g, w, "tf32" if tf32 and dtype == "f32" else dtype, name)
        worst = max(worst, diff)
        if found is not None:
            problem, diff, tol, where = found
            return KernelCheck(case, diff, finding(case, problem, diff, tol, where, via=via))
    return KernelCheck(case, worst)
