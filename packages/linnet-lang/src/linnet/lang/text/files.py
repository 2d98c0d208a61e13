"""The files of a transformers checkpoint around its tokenizer.json: special tokens as a
config writes them, chat templates (a string, named templates, or files beside the config)
and generation_config.json's EOS ids. Malformed ones are E0842 (E0798 for the generation
config, as when a model is loaded), naming the file.

>>> token_text({"content": "</s>", "special": True})
'</s>'
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import coded_error


def token_text(value: Any) -> str | None:
    """A special token as a config writes it: a string, or an AddedToken's object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (``what`` names it in E0842 for anything else)."""
    from linnet.lang.weights.checkpoint import read_json_object

    return read_json_object(path, "E0842", what)[0]


def templates(value: Any, where: str) -> str | dict[str, str] | None:
    """A config's ``chat_template``: a string, a list of ``{"name", "template"}``, or a dict
    of them; E0842 naming ``where`` for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return dict(value)
    raise coded_error(
        "E0842",
        f"the chat template in {where} is neither a string nor a list "
        f"of named templates: {json.dumps(value)[:60]}",
        help='restore it: "chat_template": "{% for message in messages %}..." '
        'or [{"name": "default", "template": "..."}]',
    )


def template_files(
    folder: Path, template: str | dict[str, str] | None
) -> str | dict[str, str] | None:
    """The template files beside the config, which take precedence over its template
    (transformers reads chat_template.jinja and additional_chat_templates/)."""
    found: dict[str, str] = {}

    def read(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise coded_error(
                "E0842",
                f"chat template `{path}` cannot be read: {e}",
                help="restore the file from the checkpoint",
            ) from None

    if (folder / "chat_template.jinja").is_file():
        found["default"] = read(folder / "chat_template.jinja")
    elif (folder / "chat_template.json").is_file():
        data = read_json(folder / "chat_template.json", "chat template")
        value = templates(data.get("chat_template"), str(folder / "chat_template.json"))
        if isinstance(value, dict):
            found.update(value)
        elif value is not None:
            found["default"] = value
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            found[file.stem] = read(file)
    if not found:
        return template
    if len(found) == 1 and "default" in found:
        return found["default"]
    return found


def generation_eos(folder: Path) -> list[int]:
    """generation_config.json's ``eos_token_id`` (an id or a list; E0798 otherwise)."""
    from linnet.lang.weights.generation import GENERATION_CONFIG, token_ids

    path = folder / GENERATION_CONFIG
    if not path.is_file():
        return []
    from linnet.lang.weights.checkpoint import read_json_object

    data = read_json_object(path, "E0798", "generation config")[0]
    return list(token_ids(data.get("eos_token_id"), path))


def require(module: str) -> Any:
    """The module ``module`` (``tokenizers`` or ``jinja2``), imported now; E0840 where it is
    not installed (linnet-lang itself needs neither).

    >>> require("json").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise coded_error(
            "E0840",
            f"text in and out (tokenizers, chat templates) needs the "
            f"`{module}` package, which is not installed here",
            help="install linnet-lang's text extra: `pip install "
            "'linnet-lang[text]'` (tokenizers and jinja2)",
        ) from None
