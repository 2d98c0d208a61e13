"""A checkpoint's end-of-sequence tokens: where transformers' ``generate`` stops.

A Hugging Face checkpoint names them in ``generation_config.json`` (``eos_token_id``: one id
or a list). Where that file is missing, transformers builds its generation config from
``config.json`` and takes that file's ``eos_token_id``; where the file is there, its value
counts, even when it has none (then nothing stops generation early). This module reads them
the same way, so that ``Model.generate`` and `linnet run` stop where transformers does.

A value that is no token id (a string, a negative number, an id past ``vocab_size``) is
E0798, naming the file: a stop token that can never be emitted would silently never stop.

>>> read_stop_tokens(None)
StopTokens(tokens=(), source='')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class StopTokens:
    """The token ids generation stops after by default, and where they were read
    (``"generation_config.json's eos_token_id"``; empty for none)."""

    tokens: tuple[int, ...] = ()
    source: str = ""


def read_stop_tokens(directory: str | Path | None) -> StopTokens:
    """The end-of-sequence tokens of the Hugging Face checkpoint in ``directory`` (None: a
    checkpoint that is no directory's, or a dict of tensors: none), as transformers finds
    them: ``generation_config.json``'s ``eos_token_id`` where that file exists, else
    ``config.json``'s (a config.json that names no model, a Linnet config, gives none).

    >>> import json, tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text(json.dumps({"model_type": "llama",
    ...                                                 "eos_token_id": [2, 7]}))
    >>> read_stop_tokens(d)
    StopTokens(tokens=(2, 7), source="config.json's eos_token_id")
    >>> _ = (d / "generation_config.json").write_text('{"eos_token_id": 5}')
    >>> read_stop_tokens(d).tokens
    (5,)
    """
    from linnet.lang.weights.checkpoint import read_json_object

    if directory is None:
        return StopTokens()
    folder = Path(directory)
    config_json = folder / "config.json"
    hf: dict[str, Any] = {}
    if config_json.is_file():
        hf, _ = read_json_object(config_json, "E0652", "checkpoint config")
        if "model_type" not in hf and "architectures" not in hf:
            hf = {}  # a Linnet config named config.json: no token ids in it
    vocabulary = hf.get("vocab_size")
    vocabulary = (
        vocabulary
        if isinstance(vocabulary, int) and not isinstance(vocabulary, bool) and vocabulary > 0
        else None
    )
    generation = folder / GENERATION_CONFIG
    if generation.is_file():
        data, _ = read_json_object(generation, "E0798", "generation config")
        source = f"{GENERATION_CONFIG}'s eos_token_id"
        return StopTokens(token_ids(data.get("eos_token_id"), generation, vocabulary), source)
    if not hf or hf.get("eos_token_id") is None:
        return StopTokens()
    return StopTokens(
        token_ids(hf["eos_token_id"], config_json, vocabulary), "config.json's eos_token_id"
    )


def checkpoint_stop_tokens(ckpt: Any) -> StopTokens:
    """The end-of-sequence tokens of a checkpoint :func:`linnet.lang.host.loading.read_headers`
    returned: a GGUF file's own (its metadata names them), else those of the Hugging Face
    files in the checkpoint's directory (:func:`read_stop_tokens`).

    >>> from linnet.lang.weights.safetensors import Checkpoint
    >>> checkpoint_stop_tokens(Checkpoint((Path("w.safetensors"),)))
    StopTokens(tokens=(), source='')
    """
    own = getattr(ckpt, "stop_tokens", None)
    return own() if callable(own) else read_stop_tokens(ckpt.directory)


def token_ids(value: Any, path: Path, vocabulary: int | None = None) -> tuple[int, ...]:
    """``eos_token_id`` (None, an id or a list of ids) as a tuple of ids in
    ``[0, vocabulary)``; E0798 naming ``path`` for anything else.

    >>> token_ids([2, 2, 9], Path("generation_config.json"))
    (2, 9)
    >>> token_ids("</s>", Path("generation_config.json"))
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0798]: generation_config.json's ...
    """
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    out: list[int] = []
    for item in items:
        if (
            isinstance(item, bool)
            or not isinstance(item, int)
            or item < 0
            or (vocabulary is not None and item >= vocabulary)
        ):
            limit = f"[0, {vocabulary}) (config.json's vocab_size)" if vocabulary else "0 or more"
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise LinnetError(
                Diagnostic(
                    "E0798",
                    f"{path.name}'s `eos_token_id` is {shown}, not token ids: each must "
                    f"be an int in {limit}",
                    help=f"restore `{path}` from the checkpoint, or correct "
                    "its `eos_token_id`: it names the tokens generation stops after (null: none)",
                )
            )
        if item not in out:
            out.append(item)
    return tuple(out)
