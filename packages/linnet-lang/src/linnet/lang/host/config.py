"""Config files: what `--config` and ``config=`` read (a JSON file, or a config named beside
the model in its ``configs/`` folder) and `--set NAME=VALUE` overrides, shared by the `linnet`
command line, `linnet run` (:mod:`linnet.lang.host.run`) and the runtimes' ``load`` (E0640-E0642,
E0645-E0647, E0664). Here, not in the CLI, so that hosting a model imports no command line.

>>> load_config(None, ["B=1", "T=bf16"])
{'B': 1, 'T': 'bf16'}
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError


def parse_value(text: str) -> Any:
    """`4` → 4, `1e-5` → 1e-05, `true` → True, `bf16` → 'bf16', and a list in brackets →
    a list: a JSON array (a tensor config's `[1, 2.5]`), else comma-separated values each
    read as above (a config list's `[8, 0]`, `[True, 0]`).

    >>> parse_value("[8, 0, true]"), parse_value("[]"), parse_value("[1.5, 2e-1]")
    ([8, 0, True], [], [1.5, 0.2])
    >>> parse_value("[True, bf16]")
    [True, 'bf16']
    """
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        try:
            value = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError):
            value = None
        if isinstance(value, list):
            return value
        inner = stripped[1:-1].strip()
        return [parse_value(part.strip()) for part in inner.split(",")] if inner else []
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def config_path(path: str, model_file: str | None = None) -> Path:
    """Where `--config PATH` is read from: the path, or a named config beside the model:
    `configs/<model>/PATH.json` (a folder of several models, as `std/models/`), else
    `configs/PATH.json`.

    >>> from linnet.lang.syntax.program import model_file
    >>> config_path("toy", str(model_file("std.models.qwen2"))).parts[-3:]
    ('configs', 'qwen2', 'toy.json')
    """
    p = Path(path)
    if not p.is_file() and model_file is not None:
        for candidate in named_config_paths(model_file, path):
            if candidate.is_file():
                return candidate
    return p


def named_config_paths(model_file: str | Path, name: str) -> list[Path]:
    """Where a config named ``name`` of the model in ``model_file`` may be, in order.

    >>> [str(p) for p in named_config_paths("m/llama.linnet", "toy")]
    ['m/configs/llama/toy.json', 'm/configs/toy.json']
    """
    folder = Path(model_file).parent / "configs"
    return [folder / Path(model_file).stem / f"{name}.json", folder / f"{name}.json"]


def config_names(model_file: str | Path) -> list[str]:
    """The named configs of the model in ``model_file`` (what `--config NAME` takes).

    >>> from linnet.lang.syntax.program import model_file
    >>> config_names(model_file("std.models.gpt2"))
    ['toy']
    """
    folder = Path(model_file).parent / "configs"
    own = folder / Path(model_file).stem
    found = {p.stem for p in own.glob("*.json")} if own.is_dir() else set()
    if not own.is_dir():  # a folder of one model's configs
        found |= {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()
    return sorted(found)


class _DuplicateKey(Exception):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"`{name}` is not a JSON number")


def parse_config(raw: bytes, path: str) -> dict[str, Any]:
    """A config file's bytes as a dict: UTF-8 (a leading BOM is skipped), one JSON object,
    no key twice, no NaN or Infinity.

    >>> parse_config(b'\\xef\\xbb\\xbf{"D": 64, "_note": "x"}', "cfg.json")
    {'D': 64, '_note': 'x'}
    """
    skip = 3 if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start + skip
        line = raw[:at].count(b"\n") + 1
        utf16 = raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
        raise LinnetError(
            Diagnostic(
                "E0645",
                f"config `{path}` is not UTF-8 text: byte {at} (line {line}) is 0x{raw[at]:02x}",
                help="save the file as UTF-8" + (" (it looks like UTF-16)" if utf16 else ""),
            )
        ) from None
    try:
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
    except _DuplicateKey as exc:
        raise LinnetError(
            Diagnostic(
                "E0664",
                f"config `{path}` gives `{exc.args[0]}` twice",
                help="keep one of them: JSON readers disagree on which one counts",
            )
        ) from None
    except RecursionError:
        raise LinnetError(
            Diagnostic(
                "E0646",
                f"config `{path}` is nested too deeply to read",
                help='a config is one flat JSON object of names to values: `{"D": 64}`',
            )
        ) from None
    except ValueError as exc:  # json.JSONDecodeError, NaN
        raise LinnetError(
            Diagnostic(
                "E0641",
                f"config `{path}` is not valid JSON: {exc}",
                help="a config is one JSON object of names to values",
            )
        ) from None
    if not isinstance(data, dict):
        raise LinnetError(
            Diagnostic(
                "E0641",
                f"config `{path}` is not a JSON object",
                help='write `{"D": 64, "T": "f32"}`',
            )
        )
    return data


def load_config(path: str | None, sets: list[str], model_file: str | None = None) -> dict:
    """Read a JSON config (a path, or a name under the model's `configs/` folder) plus
    `--set NAME=VALUE` overrides. Keys starting with `_` are comments.

    >>> load_config(None, ["B=1", "T=bf16"])
    {'B': 1, 'T': 'bf16'}
    """
    config: dict[str, Any] = {}
    if path:
        p = config_path(path, model_file)
        try:
            raw = p.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            names = config_names(model_file) if model_file is not None else []
            listed = f"; this model's named configs: {', '.join(names)}" if names else ""
            raise LinnetError(
                Diagnostic(
                    "E0640",
                    f"config `{path}` not found",
                    help="pass a JSON file, or the name of one in the "
                    "model's configs/ folder" + listed,
                )
            ) from None
        except IsADirectoryError:
            raise LinnetError(
                Diagnostic(
                    "E0647", f"config `{path}` is a directory", help="pass the JSON file inside it"
                )
            ) from None
        except OSError as exc:
            raise LinnetError(
                Diagnostic(
                    "E0647",
                    f"config `{path}` cannot be read: {exc.strerror or exc}",
                    help="check the file's permissions",
                )
            ) from None
        data = parse_config(raw, path)
        config.update({k: v for k, v in data.items() if not k.startswith("_")})
    for item in sets:
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise LinnetError(
                Diagnostic("E0642", f"`--set {item}` needs NAME=VALUE", help="e.g. `--set B=1`")
            )
        config[k.strip()] = parse_value(v.strip())
    return config
