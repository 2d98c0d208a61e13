"""Loading a model, shared by every runtime's ``load`` (pure Python, no array library): the
checked program of a model file (:func:`load_program`, once per file within
:func:`programs_kept`), the user's ``config=`` (:func:`read_config`), ``weights=`` and
``dtype=`` checked (:func:`check_weights_type`, :func:`check_dtype_config`), a checkpoint's
headers and the config they complete (:func:`read_headers`), the entry asked for
(:func:`entry_method`) and the load-time checks' errors (E0601, E0666, E0667, E0713, E0741,
E0743, E0744). Each runtime reads the tensors to its device itself.

>>> entry_method(load_program("std.models.llama")[0], "decode").name
'decode'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from linnet.lang.check.driver import check_program, find_model
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.host.config import load_config
from linnet.lang.host.inputs import error, short
from linnet.lang.host.quantize import stored_quantization
from linnet.lang.pipeline import FLOATS, Numerics
from linnet.lang.syntax.program import Program, model_file
from linnet.lang.weights.checkpoint import fit_checkpoint, merge_config, read_checkpoint_config
from linnet.lang.weights.gguf import is_gguf
from linnet.lang.weights.gguf_load import gguf_headers
from linnet.lang.weights.safetensors import (
    Checkpoint,
    TensorInfo,
    checkpoint_shapes,
    resolve_checkpoint,
)
from linnet.lang.weights.stacked import stack_shapes


def nonfinite_weight(name: str, nan: int, inf: int, first: Sequence[int]) -> Diagnostic:
    """E0666: weight ``name`` holds ``nan`` NaN and ``inf`` infinite values, the first at
    index ``first``; the runtimes' load-time check raises it.

    >>> print(nonfinite_weight("lm_head.weight", 1, 0, [3, 7]).message)
    weight `lm_head.weight` holds 1 NaN value (the first at [3, 7])
    """
    parts = [
        f"{n} {what} value{'s' if n != 1 else ''}"
        for n, what in ((nan, "NaN"), (inf, "infinite"))
        if n
    ]
    return Diagnostic(
        "E0666",
        f"weight `{name}` holds {' and '.join(parts)} (the first at {list(first)})",
        help="one NaN or infinite weight makes every result NaN (greedy decoding then repeats "
        "one token forever): the checkpoint is damaged, or was saved after training "
        "diverged; save or download it again. To load it anyway (to inspect it), pass "
        "check_finite=False",
    )


def check_finite_flag(value: Any) -> None:
    """E0667 unless ``check_finite=`` is True or False (a typo must not mean either).

    >>> check_finite_flag("no")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0667]: check_finite must be True or False, not 'no'...
    """
    if not isinstance(value, bool):
        raise error(
            "E0667",
            f"check_finite must be True or False, not {short(value)}",
            help="load(..., check_finite=False) skips the NaN check of the weights; "
            "leave it out to check them",
        )


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
        raise error(
            "E0744",
            f"config must be a dict, a JSON file or a config name, not {type(config).__name__}",
            help="e.g. config='toy' or config={'H': 4}",
        )

    return load_config(str(config), [], str(model_path))


def check_weights_type(
    weights: Any, is_tensor: Callable[[Any], bool], noun: str, note: str = ""
) -> None:
    """E0741 unless ``weights`` is None, a path, a non-empty list of paths or a dict of
    names to ``is_tensor`` values (``noun``: what the runtime calls them, "tensors").

    >>> check_weights_type(["a.safetensors", "b.safetensors"], lambda v: False, "arrays")
    >>> check_weights_type(3, lambda v: False, "arrays")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0741]: weights must be a safetensors file, ...
    """
    ok = (
        weights is None
        or isinstance(weights, str | os.PathLike)
        or (
            isinstance(weights, list | tuple)
            and bool(weights)
            and all(isinstance(w, str | os.PathLike) for w in weights)
        )
        or (
            isinstance(weights, dict)
            and all(isinstance(k, str) and is_tensor(v) for k, v in weights.items())
        )
    )
    if not ok:
        shown = repr(weights)
        raise error(
            "E0741",
            f"weights must be a safetensors file, a checkpoint directory, an "
            f"index JSON, a list of files or a dict of {noun}, not "
            f"{type(weights).__name__} {shown[:50]}{'...' if len(shown) > 50 else ''}",
            help="e.g. weights='Llama-3.2-1B/'" + (f" ({note})" if note else ""),
        )


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

    decl = find_model(program, None)
    for g in (g.name for g in decl.generics if g.kind == "DType"):
        if g in config and config[g] != convert:
            raise error(
                "E0743",
                f"dtype={convert} converts the weights to {convert}, but the "
                f"config sets `{g}` to {config[g]!r}",
                help=f"drop `{g}` from the config (it follows dtype=), or load with "
                f"dtype={config[g]!r}",
            )


def read_headers(
    weights: Any, program: Program, model_path: Path, config: dict[str, Any], convert: str | None
) -> tuple[Checkpoint, dict[str, Any], dict[str, Any]]:
    """A checkpoint's files, its tensors' shapes and dtypes (as ``convert``, a Linnet float
    name, makes them) and the config they complete: a Hugging Face ``config.json`` beside
    the files merged in (through the model's ``.hf.json`` mapping), then the dims the
    weights determine. Headers only: nothing is read to a device (the runtime does that).

    >>> ckpt, shapes, cfg = read_headers("Llama-3.2-1B/", program, path, {}, "bf16")
    ...                                                                   # doctest: +SKIP
    """
    if is_gguf(weights):  # llama.cpp's format: its metadata is the config (weights/gguf_load.py)
        return gguf_headers(weights, program, model_path, config, convert)  # type: ignore[return-value]
    ckpt = resolve_checkpoint(weights)
    # A mixture of experts' per-expert tensors are its stacked parameters (weights/stacked.py).
    shapes: dict[str, Any] = stack_shapes(dict(checkpoint_shapes(ckpt)))
    ckpt_config = None
    if ckpt.config_path is not None:
        ckpt_config = read_checkpoint_config(
            ckpt.config_path, model_path, find_model(program, None).name, program
        )
        if ckpt_config is not None:
            config = merge_config(config, ckpt_config)
    if convert is not None:
        shapes = {
            k: TensorInfo(s[0], convert if s[1] in FLOATS else s[1], getattr(s, "shard", ""))
            for k, s in shapes.items()
        }
    # A quantised model's saved weights (weight_q8 / weight_q4) reload as they were saved.
    config = {**stored_quantization(shapes), **config}
    config = fit_checkpoint(program, config, shapes, ckpt_config)
    return ckpt, shapes, config


def entry_method(program: Program, entry: str) -> Any:
    """The model's entry ``entry`` (its declaration: ``.params``), or E0601 listing them.

    >>> [p.name for p in entry_method(load_program("std.models.llama")[0], "decode").params]
    ['token', 'pos']
    """
    decl = find_model(program, None)
    method = decl.method(entry)
    if method is None or method.kind != "entry":
        entries = [m.name for m in decl.methods if m.kind == "entry"]
        raise error(
            "E0601",
            f"model `{decl.name}` has no entry `{entry}`",
            help="entries: " + ", ".join(entries),
        )
    return method
