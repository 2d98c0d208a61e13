"""What a runtime hosting Linnet models on an array library shares, written once.

``linnet.torch`` and ``linnet.jax`` load the same models, check the same entry inputs, run
the same `linnet run` demo and check kernels the same way; only the array library differs.
The parts that do not touch it live here, so that both raise the same coded errors with the
same messages and print the same lines: each runtime passes what it alone knows (a dtype's
name, a host copy of an index input as ints, a function that writes a checkpoint) and keeps
the rest. Named "hosting" because this is the runtimes' side of the compiler: what hosting a
model takes beyond emitting its code.

Sections: entry inputs (E0720, E0722, E0780, E0783, E0784), loading (E0601, E0713, E0741,
E0743, E0744), `linnet run` (E0740, E0786-E0788) and kernel checks. Nothing here imports
torch, jax or NumPy (linnet-lang is pure Python).

>>> error("E0713", "numerics must be 'exact' or 'fast', not 'quick'").diagnostics[0].code
'E0713'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.bounds import InputRange, dim_names
from linnet.lang.ir.graph import Graph

if TYPE_CHECKING:
    import argparse

    from linnet.lang.check.kernel_cases import KernelCase, KernelCheck
    from linnet.lang.ir.graph import ValueType
    from linnet.lang.syntax.program import Program
    from linnet.lang.weights.safetensors import Checkpoint

NUMERICS = ("exact", "fast")
# Linnet's floating-point element types: the ones `dtype=` converts weights to.
FLOATS = ("f64", "f32", "f16", "bf16")

# The examples' model: `get` reads row `i[k]` of a table of V rows, so `i` is an index input.
GATHER_EXAMPLE = """
model M<V: Dim, N: Dim> {
    param t: Tensor[V; f32]
    entry get(i: Tensor[N; i32]) -> Tensor[N; f32] {
        let out[k] = self.t[i[k]]
        return out
    }
}"""

# A comparison's finding: (problem, difference, tolerance, where), or None.
Found = tuple[str, float, float, str] | None


def error(code: str, message: str, help: str = "") -> LinnetError:
    """A :class:`~linnet.lang.LinnetError` of one diagnostic, as the runtimes raise them.

    >>> print(error("E0787", "--tokens 0: decode at least one token", help="e.g. --tokens 16"))
    error[E0787]: --tokens 0: decode at least one token
      = help: e.g. --tokens 16
    """
    return LinnetError(Diagnostic(code, message, help=help))


def short(value: Any) -> str:
    """``repr(value)`` cut to 40 characters, for messages that show what was passed.

    >>> short(list(range(30)))
    '[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11...'
    """
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- entry inputs
def check_count(entry: str, names: Sequence[str], inputs: Any, noun: str,
                example: str = "") -> None:
    """E0784 where ``inputs`` is no list or tuple, E0720 where it holds another number of
    values than the entry's inputs ``names`` (a leading ``%`` is dropped); ``noun`` is what
    the runtime calls one value ("tensor", "array"), ``example`` the call the help shows
    (default: the input names in brackets).

    >>> check_count("decode", ["%token", "%pos"], [1], "tensor")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0720]: entry `decode` takes 2 inputs...
    """
    shown = ", ".join(n.lstrip("%") for n in names)
    if not isinstance(inputs, list | tuple):
        raise error("E0784", f"the inputs of `{entry}` must be a list or tuple of {noun}s, got "
                    f"{type(inputs).__name__}",
                    help=f"pass one {noun} per input: {example or f'[{shown}]'}")
    if len(inputs) != len(names):
        raise error("E0720", f"entry `{entry}` takes {len(names)} inputs ({shown}), "
                    f"got {len(inputs)}")


def bind_inputs(entry: str, names: Sequence[str], given: Sequence[Any],
                named: dict[str, Any]) -> list[Any]:
    """Inputs given by position (``given``) and by name (``named``) in the entry's order:
    E0720 for too many or a missing one, E0783 for an unknown name or one given twice.

    >>> bind_inputs("decode", ["token", "pos"], [7], {"pos": 0})
    [7, 0]
    >>> bind_inputs("decode", ["token", "pos"], [7], {"token": 1})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0783]: input `token` of `decode` is given...
    """
    shown = ", ".join(names)
    out: dict[str, Any] = dict(zip(names, given))
    if len(given) > len(names):
        raise error("E0720", f"entry `{entry}` takes {len(names)} inputs ({shown}), got "
                    f"{len(given) + len(named)}")
    for key, value in named.items():
        if key not in names:
            raise error("E0783", f"entry `{entry}` has no input `{key}`",
                        help=f"its inputs are: {shown}")
        if key in out:
            raise error("E0783", f"input `{key}` of `{entry}` is given twice (by position "
                        "and by name)", help=f"its inputs are, in order: {shown}")
        out[key] = value
    missing = [p for p in names if p not in out]
    if missing:
        raise error("E0720", f"entry `{entry}` takes {len(names)} inputs ({shown}); "
                    f"missing: {', '.join(missing)}")
    return [out[p] for p in names]


def dtype_error(entry: str, name: str, got: str, declared: str, convert: str,
                why: bool = True) -> LinnetError:
    """E0722: input ``name`` of ``entry`` has element type ``got`` (as the array library
    prints it), the entry declares ``declared``; ``convert`` is the call that fixes it.

    >>> print(dtype_error("get", "%i", "float32", "i32", "i.astype(jnp.int32)"))
    error[E0722]: input `i` of `get` is float32, the entry declares i32
      = help: convert it: `i.astype(jnp.int32)` (nothing is converted silently: ...
    """
    return error("E0722", f"input `{name.lstrip('%')}` of `{entry}` is {got}, the entry "
                 f"declares {declared}",
                 help=f"convert it: `{convert}`" + (" (nothing is converted silently: a float "
                                                    "token id or position is a mistake)"
                                                    if why else ""))


def in_range(r: InputRange, lo: int, hi: int) -> bool:
    """Whether an index input whose smallest value is ``lo`` and largest ``hi`` is in its
    range ``r`` (each runtime computes the two on its device, then calls this).

    >>> from linnet.lang import Program, lower
    >>> from linnet.lang.ir.bounds import input_bounds
    >>> g = lower(Program.from_text(GATHER_EXAMPLE), "get", {"i": [1]}, {"V": 4})
    >>> r = input_bounds(g).inputs["%i"]
    >>> in_range(r, 0, 3), in_range(r, 0, 4)
    (True, False)
    """
    return not (r.empty or lo < r.lo or hi >= r.hi)


def range_error(graph: Graph, entry: str, r: InputRange, values: Sequence[int],
                shape: Sequence[int]) -> LinnetError:
    """E0780 for an index input outside its range ``r``: ``values`` are its elements as
    Python ints in row-major order (a host copy: only made on this error path), ``shape``
    its shape. Names the input, the first bad index and value, how many are bad, the range
    and what the input indexes, and says how to fix it.

    >>> from linnet.lang import Program, lower
    >>> from linnet.lang.ir.bounds import input_bounds
    >>> g = lower(Program.from_text(GATHER_EXAMPLE), "get", {"i": [2]}, {"V": 4})
    >>> range_error(g, "get", input_bounds(g).inputs["%i"], [1, 9], [2]).diagnostics[0].message
    'input `i` of `get` has 9 at index [1]; every value must be in [0, 4): `i` indexes axis 0 ...'
    """
    name = r.input.lstrip("%")
    if r.empty:
        return error("E0780", f"no value of input `{name}` of `{entry}` is valid: it indexes "
                     f"{r.lower.describe(graph)} and {r.upper.describe(graph)}",
                     help="the model's indices cannot all be in range for these shapes")
    bad = [k for k, v in enumerate(values) if v < r.lo or v >= r.hi]
    first = bad[0] if bad else 0
    where: list[int] = []
    rest = first
    for size in reversed(list(shape)):  # row-major, as numpy.unravel_index
        where.insert(0, rest % size if size else 0)
        rest = rest // size if size else 0
    value = int(values[first])
    more = f" ({len(bad)} values are out of range)" if len(bad) > 1 else ""
    low = value < r.lo
    use = r.lower if low else r.upper
    message = (f"input `{name}` of `{entry}` has {value} at index {where}{more}; every value "
               f"must be {r.text()}: `{name}` indexes {use.describe(graph)}")
    if low and value < 0:
        help = (f"give values {r.text()}; negative values do not count from the end "
                "in Linnet")
    elif use.target.startswith("@") and use.target[1:] in graph.states:
        names = dim_names(graph, use.size)
        dim = " or ".join(names) if names else "the size of that axis"
        help = (f"give values {r.text()}; the state holds {use.size} entries along "
                f"that axis: to go further, load the model with a larger {dim} in the config")
    else:
        help = (f"give values {r.text()}; the size comes from the weights or the "
                "config: is this input from another vocabulary or model?")
    return error("E0780", message, help=help)


# ---------------------------------------------------------------- loading
def check_numerics(numerics: str) -> None:
    """E0713 unless ``numerics`` is ``"exact"`` or ``"fast"``.

    >>> check_numerics("fast")
    """
    if numerics not in NUMERICS:
        raise error("E0713", f"numerics must be 'exact' or 'fast', not {numerics!r}")


def load_program(path: str | Path) -> tuple[Program, Path]:
    """The checked program of a model file, or of a model the wheel ships by module name
    (``std.models.llama``), and its file; the checker's errors raised together.

    >>> load_program("std.models.llama")[1].name
    'llama.linnet'
    """
    from linnet.lang import Program, check_program
    from linnet.lang.syntax.program import model_file

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
    from linnet.lang.weights.safetensors import (
        TensorInfo,
        checkpoint_shapes,
        resolve_checkpoint,
    )

    ckpt = resolve_checkpoint(weights)
    shapes: dict[str, Any] = dict(checkpoint_shapes(ckpt))
    ckpt_config = None
    if ckpt.config_path is not None:
        ckpt_config = read_checkpoint_config(ckpt.config_path, model_path,
                                             find_model(program, None).name)
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


def parameter_types(model_path: str | Path, config: dict[str, Any]
                    ) -> list[tuple[str, ValueType, bool]]:
    """Each parameter of a model under ``config``, sorted by path: ``(path, type, ones)``,
    ``ones`` for a norm's weight (random weights make those ones, the rest small normal
    numbers). Read from the first entry, lowered for inputs of size 1 in every dim the
    config does not set.

    >>> cfg = {"V": 16, "D": 8, "F": 16, "NL": 1, "H": 2, "KV": 1, "HD": 4, "S": 8, "T": "f32"}
    >>> [(p, t.shape, ones) for p, t, ones in parameter_types("std.models.llama", cfg)][-1]
    ('model.norm.weight', (8,), True)
    """
    from linnet.lang import Program, lower
    from linnet.lang.check.driver import find_model
    from linnet.lang.syntax.program import model_file

    program = Program.from_file(model_file(model_path))
    decl = find_model(program, None)
    entry = next(m for m in decl.methods if m.kind == "entry")

    def size(dim: Any) -> int:
        # A dim the config sets (the batch B, say) takes its value; any other is 1.
        value = config.get(getattr(dim, "name", ""))
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    inputs = {p.name: [size(d) for d in p.type.dims]  # type: ignore[union-attr]
              for p in entry.params}
    graph = lower(program, entry.name, inputs, config)
    return [(path, vt, path.endswith("norm.weight") or path.endswith("layernorm.weight"))
            for path, vt in sorted(graph.parameters.items())]


# ---------------------------------------------------------------- linnet run
def default_model() -> Path:
    """The model `linnet run` runs when none is given: the Llama example, from the
    repository root or as the wheel ships it (E0740 when neither is there).

    >>> default_model().name   # doctest: +SKIP
    'llama.linnet'
    """
    here = Path.cwd() / "examples" / "llama" / "llama.linnet"
    if here.is_file():
        return here
    import linnet.lang

    shipped = Path(linnet.lang.__file__).parent / "examples" / "llama" / "llama.linnet"
    if shipped.is_file():
        return shipped
    raise error("E0740", "no model given and the Llama example was not found",
                help="run from the repository root, or pass a model: `linnet run model.linnet`")


def run_config(args: argparse.Namespace) -> tuple[Path, str | None, dict[str, Any]]:
    """`linnet run`'s model file, config name and config: ``--config``, or the toy config
    for the demo unless the checkpoint brings its own (a Hugging Face config.json).

    >>> run_config(argparse.Namespace(file=None, weights=None, config=None))  # doctest: +SKIP
    (PosixPath('.../examples/llama/llama.linnet'), 'toy', {'V': 256, ...})
    """
    from linnet.lang.cli import load_config
    from linnet.lang.syntax.program import model_file
    from linnet.lang.weights.checkpoint import read_json_object
    from linnet.lang.weights.safetensors import resolve_checkpoint

    model_path = model_file(args.file) if args.file else default_model()
    # A checkpoint with a config.json (a Hugging Face directory) brings its own config; the
    # demo's toy config is the default only without one.
    ckpt_config = resolve_checkpoint(args.weights).config_path if args.weights else None
    own_config = False
    if ckpt_config is not None:
        data, _ = read_json_object(ckpt_config, "E0652", "checkpoint config")
        own_config = "model_type" in data or "architectures" in data
    config_name = args.config or ("toy" if not args.file and not own_config else None)
    config = load_config(config_name, [], str(model_path)) if config_name else {}
    return model_path, config_name, config


def demo_checkpoint(model: Path, config: dict[str, Any], seed: int,
                    write: Callable[[Path], None], tag: str = "") -> Path:
    """The demo's deterministic random checkpoint for ``model``, ``config`` and ``seed``
    under $LINNET_HOME/demo, made once: ``write(path)`` writes the safetensors file (to a
    temporary name, renamed into place). ``tag`` keeps runtimes whose random numbers differ
    apart (``"jax"``).

    >>> demo_checkpoint(Path("llama.linnet"), cfg, 0, write)   # doctest: +SKIP
    PosixPath('/home/me/.cache/linnet/demo/llama-3f2a....safetensors')
    """
    import hashlib

    from linnet.lang.home import linnet_home

    key = hashlib.sha256(f"{tag}{model.read_text()}{sorted(config.items())}{seed}".encode())
    name = f"{model.stem}-{tag + '-' if tag else ''}{key.hexdigest()[:12]}.safetensors"
    path = linnet_home() / "demo" / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        write(tmp)
        tmp.replace(path)
    return path


def announce_demo(model: Path, config_name: str | None, seed: int) -> None:
    """The line `linnet run` prints on stderr before it makes the demo checkpoint.

    >>> announce_demo(Path("llama.linnet"), "small", 0)  # doctest: +SKIP
    linnet: generating a deterministic checkpoint for llama.linnet (small config, seed 0)
    """
    print(f"linnet: generating a deterministic checkpoint for {model.name} "
          f"({config_name} config, seed {seed})", file=sys.stderr)


def run_tokens(args: argparse.Namespace, stop: bool = True
               ) -> tuple[list[int], list[int]] | None:
    """`linnet run`'s ``--prompt`` (and, with ``stop``, ``--stop``) as token lists; None
    after printing the usage error (exit status 2) when they are not integers; E0786 for an
    empty prompt, E0787 for ``--tokens`` below 1.

    >>> run_tokens(argparse.Namespace(prompt="1,2", stop="", tokens=4))  # doctest: +SKIP
    ([1, 2], [])
    """
    try:
        prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
        stops = [int(t) for t in args.stop.split(",") if t.strip()] if stop else []
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
    """
    on = f" ({runtime})" if runtime else ""
    return (f"loaded {model_path} on {device}{on} in {seconds:.2f} s "
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
    from linnet.lang import lower
    from linnet.lang.check.kernel_cases import ENTRY, MODEL, wrapper_program

    wrapper = wrapper_program(program, op, case)
    config = {name: scalar(dtype, name) for name, dtype in case.scalars.items()}
    shapes = {name: list(shape) for name, (shape, _) in case.params.items()}
    return wrapper, lower(wrapper, ENTRY, shapes, config, model=MODEL, check=False)


def scalar_value(dtype: str, u: float) -> Any:
    """A scalar parameter's value from a uniform draw ``u`` in [0, 1): a small positive
    number (an epsilon, a scale), an int in 1..4 or a bool.

    >>> scalar_value("f32", 0.5), scalar_value("i32", 0.5), scalar_value("bool", 0.5)
    (0.501, 3, False)
    """
    if dtype == "bool":
        return u < 0.5
    if dtype.startswith(("i", "u")):
        return 1 + int(u * 4)
    return 1e-3 + u


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
