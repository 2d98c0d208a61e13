"""A checkpoint's ``config.json`` as a Linnet config, through a mapping beside the model.

A Hugging Face checkpoint describes its model in ``config.json`` with its own names
(``num_attention_heads``, ``rope_scaling``, ...). A model says how those names become its
config in a mapping file beside it, ``<model>.hf.json`` (``examples/llama/llama.hf.json``
for ``llama.linnet``)::

    {
      "architectures": ["LlamaForCausalLM"],      // what checkpoints this model runs
      "model_types": ["llama"],
      "set":     {"H": "num_attention_heads", "rope_theta": {"key": "rope_theta",
                                                              "default": 10000.0}},
      "check":   {"D": "hidden_size"},             // bound by the weights; must agree
      "runtime": {"S": {"key": "max_position_embeddings", "at_most": 4096}},
      "require": {"attention_bias": [false]},      // values the model's math assumes
      "ignore":  ["attention_dropout"],            // keys that do not change the math
      "ranges":  {"rms_norm_eps": "(0, 1]"},       // each value's valid range (rules.py)
      "rope":    {"keys": ["rope_parameters", "rope_scaling"],
                  "types": {"default": {}, "linear": {"rope_factor": "factor"},
                            "dynamic": {"rope_factor": "factor", "rope_max_positions":
                                        {"config": "max_position_embeddings"}}},
                  "ignore": ["rope_type", "rope_theta"]}
    }

Every key of ``config.json`` must be one the mapping reads, requires or ignores (besides
the metadata every transformers config carries and ``_`` keys: :mod:`.rules`): a key that
would change the math and is not modelled is an error, never silently dropped; a value
outside its valid range (``"rms_norm_eps": -1``) is E0665. The values
that come out are facts about the checkpoint: a user's ``config=`` may repeat them but not
contradict them (E0659); ``runtime`` values (the cache length) are only defaults.

Pure Python, shared by every runtime.

>>> hf = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4}
>>> mapping = {"architectures": ["LlamaForCausalLM"], "set": {"H": "num_attention_heads"}}
>>> checkpoint_config(hf, mapping, model="Llama").values
{'H': 4}
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError, SourceFile, Span
from linnet.lang.weights.fp8 import quantization_diagnostic
from linnet.lang.weights.layer_types import layer_values, layers_problems, layers_reads
from linnet.lang.weights.rules import (
    PRETRAINED_CONFIG_RANGES,
    PRETRAINED_CONFIG_REQUIRE,
    ignored,
    mapping_path,
    range_diagnostics,
    rule_problems,
)

MAX_CONFIG_BYTES = 16 * 1024 * 1024
_MISSING = object()
MAPPING_KEYS = {
    "model",
    "architectures",
    "model_types",
    "set",
    "check",
    "runtime",
    "require",
    "require_each",
    "ignore",
    "rope",
    "ranges",
    "layers",
}
# "null": the value a JSON null stands for (Mistral's `"sliding_window": null` is no window).
SPEC_KEYS = {"key", "default", "else", "at_most", "null"}
# A rope type's values besides a parameter's name (required) and a literal: an optional
# parameter, a list-valued one (a tensor config) and a top-level config.json key.
ROPE_SPECS = {"param": {"default", "null"}, "list": set(), "config": {"default"}}


@dataclass
class CheckpointConfig:
    """What a checkpoint's ``config.json`` says, in the model's names.

    ``values`` are facts (``H``, ``rms_norm_eps``...), ``runtime`` defaults a user may
    change (``S``), ``checks`` dims the weights bind that config.json must agree with, and
    ``sources`` the config.json key each name came from.
    """

    values: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    source: SourceFile | None = None
    name: str = "config.json"
    # Where the mapping was inferred (no `<model>.hf.json`): (model decl, model file,
    # config.json path), so that a weights mismatch says the inference was not exact.
    inferred: tuple[Any, str | Path, Path] | None = None

    def span(self, key: str) -> Span | None:
        """Where ``key`` (dotted for nested keys) is written in config.json, if known."""
        return key_span(self.source, key)


def key_span(source: SourceFile | None, key: str) -> Span | None:
    """The span of ``"key"`` in a JSON text (the last part of a dotted key, found after the
    earlier parts), or None."""
    if source is None:
        return None
    pos = 0
    span = None
    for part in key.split("."):
        m = re.compile(r'"' + re.escape(part) + r'"\s*:').search(source.text, pos)
        if m is None:
            return span
        span = Span(source, m.start(), m.start() + len(part) + 2)
        pos = m.end()
    return span


def read_json_object(path: Path, code: str, what: str) -> tuple[dict, SourceFile]:
    """A JSON object read from ``path`` with its text; anything else is error ``code``."""

    def bad(why: str) -> LinnetError:
        return LinnetError(
            Diagnostic(
                code,
                f"{what} `{path}` is not a JSON object: {why}",
                help="restore the file (download or save it again)",
            )
        )

    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise bad(f"it has {size} bytes, more than a config ever needs")
        text = path.read_bytes().decode("utf-8-sig")
        data = json.loads(text)
    except RecursionError:
        raise bad("it nests too deeply") from None
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 ({exc})") from None
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON ({exc})") from None
    except OSError as exc:
        raise LinnetError(Diagnostic(code, f"cannot read {what} `{path}`: {exc}")) from None
    if not isinstance(data, dict):
        raise bad(f"it is a JSON {type(data).__name__}")
    return data, SourceFile(str(path), text)


def read_mapping(model_file: str | Path) -> dict | None:
    """The model's checkpoint mapping (validated), or None when it has none."""
    path = mapping_path(model_file)
    if not path.is_file():
        return None
    data, _ = read_json_object(path, "E0653", "checkpoint mapping")
    validate_mapping(data, str(path))
    return data


def validate_mapping(data: dict, name: str = "the mapping") -> None:
    """Raise E0653 for a mapping that does not have the documented form."""
    problems = []
    for key in data:
        if key not in MAPPING_KEYS and not key.startswith("_"):
            problems.append(
                f"unknown section `{key}` (sections: " + ", ".join(sorted(MAPPING_KEYS)) + ")"
            )
    for section in ("set", "check", "runtime"):
        for lname, spec in _dict(data.get(section), problems, section).items():
            if isinstance(spec, str):
                continue
            if (
                not isinstance(spec, dict)
                or not isinstance(spec.get("key"), str | list)
                or set(spec) - SPEC_KEYS
            ):
                problems.append(
                    f"`{section}.{lname}` must be a config.json key or "
                    '{"key": ..., "default": ..., "else": ..., "at_most": ...}'
                )
    for section in ("architectures", "model_types", "ignore"):
        value = data.get(section, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"`{section}` must be a list of strings")
    for section in ("require", "require_each"):
        for key, allowed in _dict(data.get(section), problems, section).items():
            if not isinstance(allowed, list):
                problems.append(f"`{section}.{key}` must be a list of the values the model runs")
    rope = _dict(data.get("rope"), problems, "rope")
    for rtype, values in _dict(rope.get("types"), problems, "rope.types").items():
        for lname, spec in _dict(values, problems, f"rope.types.{rtype}").items():
            if isinstance(spec, dict) and not any(
                set(spec) <= form | {kind} and isinstance(spec.get(kind), str)
                for kind, form in ROPE_SPECS.items()
            ):
                problems.append(
                    f"`rope.types.{rtype}.{lname}` must be a rope parameter's name, a value, "
                    '{"param": ..., "default": ..., "null": ...}, {"list": ...} or '
                    '{"config": ..., "default": ...}'
                )
    problems.extend(layers_problems(data.get("layers")))
    problems.extend(rule_problems(data))
    if problems:
        raise LinnetError(
            [
                Diagnostic(
                    "E0653",
                    f"checkpoint mapping `{name}`: {p}",
                    help="see docs/torch.md, `Checkpoint mappings`",
                )
                for p in problems
            ]
        )


def _dict(value: Any, problems: list[str], where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"`{where}` must be an object")
        return {}
    return value


def lookup(hf: dict, key: str) -> Any:
    """``hf[key]``, following dots into nested objects; ``_MISSING`` when absent or null."""
    value: Any = hf
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return _MISSING if value is None else value


def _spec(spec: Any) -> dict:
    return {"key": spec} if isinstance(spec, str) else dict(spec)


def _keys(spec: dict) -> list[str]:
    key = spec["key"]
    return [key] if isinstance(key, str) else list(key)


def checkpoint_config(
    hf: dict,
    mapping: dict,
    model: str = "the model",
    source: SourceFile | None = None,
    name: str = "config.json",
) -> CheckpointConfig:
    """The model's config from a checkpoint's config.json ``hf`` through ``mapping``.

    Every problem is reported at once: an architecture the model does not run (E0654), a
    key the mapping neither reads nor ignores (E0655), a value the model's math does not
    cover (E0656), an unknown rope type (E0657), a value outside the range its mapping
    declares (E0665), a value of the wrong kind (E0671).

    >>> checkpoint_config({"rope_scaling": {"rope_type": "yarn"}},
    ...                   {"rope": {"keys": ["rope_scaling"], "types": {"default": {}}}}
    ...                   )   # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    linnet.lang.diagnostics.core.LinnetError: error[E0657]: ...
    """
    out = CheckpointConfig(source=source, name=name)
    diags: list[Diagnostic] = []
    reported: set[str] = set()

    def diag(code: str, message: str, key: str, label: str, help: str) -> None:
        reported.add(key)
        diags.append(Diagnostic(code, message, out.span(key), label if source else "", help=help))

    architecture_errors(hf, mapping, model, name, diag)
    rope_sections = list(mapping.get("rope", {}).get("keys", []))
    # transformers' generic requirements, unless the mapping ignores or requires the key.
    require = {
        **{
            k: v for k, v in PRETRAINED_CONFIG_REQUIRE.items() if k not in mapping.get("ignore", [])
        },
        **mapping.get("require", {}),
    }
    read = {
        "architectures",
        "model_type",
        *rope_sections,
        *require,
        *mapping.get("require_each", {}),
    }
    for section in ("set", "check", "runtime"):
        for spec in mapping.get(section, {}).values():
            spec = _spec(spec)
            read.update(k.split(".")[0] for k in _keys(spec))
            if "else" in spec:
                read.add(str(spec["else"]).split(".")[0])
    if "layers" in mapping:
        read.update(layers_reads(mapping["layers"]))
    # Quantised weights: float8 with scales load dequantised (weights/fp8.py), the rest
    # is E0692 (whatever the model).
    if "quantization_config" in hf:
        read.add("quantization_config")
        refused = quantization_diagnostic(hf["quantization_config"], name)
        if refused is not None:
            diag(refused.code, refused.message, "quantization_config", "not loaded", refused.help)
    for key in hf:
        if key not in read and not ignored(key, mapping):
            diag(
                "E0655",
                f"{name} sets `{key}`, which model `{model}` does not model",
                key,
                "not read by the model",
                help="a key that changes the model's math needs the model to implement it; "
                "if it does not change the math, add it to `ignore` in the model's "
                "checkpoint mapping",
            )
    for key, allowed in require.items():
        value = lookup(hf, key)
        if value is not _MISSING and not any(_same(value, a) for a in allowed):
            shown = (
                f"runs only {' or '.join(json.dumps(a) for a in allowed)}"
                if allowed
                else "does not implement it"
            )
            diag(
                "E0656",
                f"{name} sets `{key}` to {json.dumps(value)[:40]}; model `{model}` {shown}",
                key,
                "not what the model computes",
                help="use a model that implements it, or a checkpoint of this architecture",
            )
    # `require_each`: every element of a list (Qwen2's `layer_types`, one per layer).
    for key, allowed in mapping.get("require_each", {}).items():
        value = lookup(hf, key)
        if value is _MISSING or value is None:
            continue
        items = value if isinstance(value, list) else [value]
        bad = [v for v in items if not any(_same(v, a) for a in allowed)]
        if bad:
            diag(
                "E0656",
                f"{name} sets `{key}` to {json.dumps(value)[:60]}; model `{model}` "
                f"runs only {' or '.join(json.dumps(a) for a in allowed)} in each element",
                key,
                "not what the model computes",
                help="use a model that implements it, or a checkpoint of this architecture",
            )
    for section in ("set", "check", "runtime"):
        for lname, spec in mapping.get(section, {}).items():
            spec = _spec(spec)
            key, value = _first(hf, _keys(spec))
            if value is _MISSING and "null" in spec:
                # A key written as null (`lookup` reads it as absent) is the mapping's `null`
                # value, not its default: Mistral's `"sliding_window": null` is no window.
                nulls = [k for k in _keys(spec) if _is_null(hf, k)]
                if nulls:
                    key, value = nulls[0], spec["null"]
            if value is _MISSING and "else" in spec:
                key, value = str(spec["else"]), lookup(hf, str(spec["else"]))
            if value is _MISSING:
                if "default" not in spec:
                    continue
                value = spec["default"]
            if not _scalar(value) or (section != "set" and not _positive_int(value)):
                want = "a positive integer" if section != "set" else "a number or a bool"
                diag(
                    "E0671",
                    f"{name}'s `{key}` is {json.dumps(value)[:40]}, not {want}",
                    key,
                    "read as " + lname,
                    help="restore config.json from the checkpoint",
                )
                continue
            if section == "runtime" and "at_most" in spec:
                value = min(int(value), int(spec["at_most"]))
            {"set": out.values, "check": out.checks, "runtime": out.runtime}[section][lname] = value
            out.sources[lname] = key
    rope_config(hf, mapping.get("rope", {}), model, name, out, diag, reported)
    if "layers" in mapping:
        # Per-layer config lists (`layer_windows`...) from `layer_types`: layer_types.py.
        lists, sources = layer_values(hf, mapping["layers"], diag, name)
        out.values.update(lists)
        out.sources.update(sources)
    ranges = {
        **mapping.get("ranges", {}),
        **{k: v for k, v in PRETRAINED_CONFIG_RANGES.items() if k not in mapping.get("ranges", {})},
    }
    # A bound naming a key reported already (a vocab_size of 0) is not checked against.
    range_errors(
        lambda k: _value(hf, k),
        ranges,
        lambda k: None if k in reported else _value(hf, k),
        "",
        model,
        name,
        diag,
        reported,
    )
    if diags:
        raise LinnetError(diags)
    return out


def _value(hf: dict, key: str) -> Any:
    value = lookup(hf, key)
    return None if value is _MISSING else value


def range_errors(
    value_of: Any,
    rules: dict[str, str],
    bound: Any,
    prefix: str,
    model: str,
    name: str,
    diag: Any,
    reported: set[str],
) -> None:
    """E0665 (E0671 for the wrong kind) for each value outside its mapping's rule."""
    for code, key, why, rule in range_diagnostics(value_of, rules, bound, prefix, reported):
        diag(
            code,
            f"{name}'s `{key}` {why}",
            key,
            f"valid: {rule}",
            help=f"model `{model}` computes with `{key}` in {rule}; a value outside it "
            "gives wrong or non-finite results. Restore config.json from the "
            "checkpoint, or correct the value",
        )


def architecture_errors(hf: dict, mapping: dict, model: str, name: str, diag: Any) -> None:
    archs = hf.get("architectures")
    allowed = mapping.get("architectures", [])
    if archs is not None and allowed:
        listed = archs if isinstance(archs, list) else [archs]
        if not any(a in allowed for a in listed):
            diag(
                "E0654",
                f"the checkpoint is a {', '.join(map(str, listed))} ({name}'s "
                f"`architectures`), but model `{model}` runs {', '.join(allowed)}",
                "architectures",
                "this checkpoint's architecture",
                help="load the checkpoint with a model of its architecture, or pass "
                "the checkpoint this model was written for",
            )
            return
    kind = hf.get("model_type")
    types = mapping.get("model_types", [])
    if kind is not None and types and kind not in types:
        diag(
            "E0654",
            f"the checkpoint's `model_type` is {json.dumps(kind)} ({name}), but "
            f"model `{model}` runs {', '.join(types)}",
            "model_type",
            "this checkpoint's model type",
            help="load the checkpoint with a model of its architecture",
        )


def rope_config(
    hf: dict,
    rope: dict,
    model: str,
    name: str,
    out: CheckpointConfig,
    diag: Any,
    reported: set[str] | None = None,
) -> None:
    """The rope type's values (``rope_scaling`` or transformers 5's ``rope_parameters``)."""
    if not rope:
        return
    found = [(k, hf[k]) for k in rope.get("keys", []) if isinstance(hf.get(k), dict)]
    for k in rope.get("keys", []):
        if hf.get(k) is not None and not isinstance(hf.get(k), dict):
            diag(
                "E0671",
                f"{name}'s `{k}` is {json.dumps(hf[k])[:40]}, not an object",
                k,
                "expected an object",
                help="restore config.json from the checkpoint",
            )
            return

    def rope_type(params: dict) -> Any:
        return params.get("rope_type", params.get("type", "default"))

    types = rope.get("types", {})
    if len({json.dumps(rope_type(p)) for _, p in found}) > 1:
        diag(
            "E0656",
            f"{name}'s {' and '.join(f'`{k}`' for k, _ in found)} give different rope types",
            found[-1][0],
            "contradicts the other",
            help="keep one of them (transformers 5 writes `rope_parameters`)",
        )
        return
    key, params = found[0] if found else ("rope_scaling", {})
    kind = rope_type(params)
    if kind not in types:
        what = "rope_type" if "rope_type" in params else "type"
        diag(
            "E0657",
            f"{name}'s `{key}` has rope type {json.dumps(kind)}, which model "
            f"`{model}` does not implement",
            f"{key}.{what}",
            "unknown rope type",
            help="rope types it implements: " + ", ".join(types),
        )
        return
    wanted = types[kind]
    reads = {v for v in wanted.values() if isinstance(v, str)} | {
        str(v.get("param", v.get("list")))
        for v in wanted.values()
        if isinstance(v, dict) and "config" not in v
    }
    for lname, spec in wanted.items():
        if isinstance(spec, dict) and "config" in spec:  # a top-level config.json key
            key_ = str(spec.get("config"))
            value = lookup(hf, key_)
            if value is _MISSING and "default" in spec:
                value = spec["default"]  # what the transformers config class defaults it to
            if not _scalar(value) or isinstance(value, bool):
                diag(
                    "E0671",
                    f"{name}'s `{key_}` (for rope type {json.dumps(kind)}) is "
                    + ("missing" if value is _MISSING else json.dumps(value)[:40])
                    + ", not a number",
                    key_,
                    "rope parameter",
                    help="restore config.json from the checkpoint",
                )
                continue
            out.values[lname] = value
            out.sources[lname] = key_
    for k in params:
        if k not in reads and k not in rope.get("ignore", []) and k not in ("rope_type", "type"):
            diag(
                "E0655",
                f"{name}'s `{key}` sets `{k}`, which model `{model}` does not "
                f"model for rope type {json.dumps(kind)}",
                f"{key}.{k}",
                "not read by the model",
                help="it changes the rotary frequencies; the model must implement it",
            )
    for lname, spec in wanted.items():
        if isinstance(spec, dict):
            if "config" not in spec:
                rope_parameter(params, key, kind, lname, spec, name, out, diag)
            continue
        if not isinstance(spec, str):
            out.values[lname] = spec
            out.sources[lname] = f"{key}.rope_type"
            continue
        value = params.get(spec, _MISSING)
        if value is _MISSING and spec == "original_max_position_embeddings":
            value = lookup(hf, "max_position_embeddings")  # what transformers falls back to
        if value is _MISSING or not _scalar(value) or isinstance(value, bool):
            diag(
                "E0671",
                f"{name}'s `{key}` (rope type {json.dumps(kind)}) needs a number "
                f"`{spec}`" + ("" if value is _MISSING else f", not {json.dumps(value)}"),
                f"{key}.{spec}",
                "rope parameters",
                help="restore config.json from the checkpoint",
            )
            continue
        out.values[lname] = value
        out.sources[lname] = f"{key}.{spec}"
    if found:
        # The rope parameters' own ranges (`factor` >= 1...); bounds name other parameters
        # (`low_freq_factor` below `high_freq_factor`) or top-level keys.
        def bound(k: str) -> Any:
            if f"{key}.{k}" in seen or k in seen:
                return None
            return params[k] if params.get(k) is not None else _value(hf, k)

        seen = reported if reported is not None else set()

        range_errors(
            lambda k: params.get(k),
            rope.get("ranges", {}),
            bound,
            f"{key}.",
            model,
            name,
            diag,
            seen,
        )


def rope_parameter(
    params: dict, key: str, kind: Any, lname: str, spec: dict, name: str, out: Any, diag: Any
) -> None:
    """One rope parameter a ``{"param": ...}`` or ``{"list": ...}`` spec reads: an optional
    number (its ``default`` where absent, its ``null`` value where written as null), or a
    required list of numbers (LongRoPE's `short_factor`, a tensor config)."""
    if "list" in spec:
        k = str(spec["list"])
        value = params.get(k)
        good = (
            isinstance(value, list)
            and len(value) > 0
            and all(_scalar(x) and not isinstance(x, bool) for x in value)
        )
        if not good:
            shown = "" if value is None else f", not {json.dumps(value)[:40]}"
            diag(
                "E0671",
                f"{name}'s `{key}` (rope type {json.dumps(kind)}) needs a list of numbers "
                f"`{k}`{shown}",
                f"{key}.{k}",
                "rope parameters",
                help="restore config.json from the checkpoint",
            )
            return
    else:
        k = str(spec["param"])
        value = params.get(k, _MISSING)
        if value is None and "null" in spec:
            value = spec["null"]  # transformers reads a null as it reads this value
        elif value is None or value is _MISSING:
            value = spec.get("default")
        if not _scalar(value):
            diag(
                "E0671",
                f"{name}'s `{key}` (rope type {json.dumps(kind)}) has `{k}` "
                f"{json.dumps(value)[:40]}, not a number",
                f"{key}.{k}",
                "rope parameters",
                help="restore config.json from the checkpoint",
            )
            return
    out.values[lname] = value
    out.sources[lname] = f"{key}.{k}"


def _is_null(hf: dict, key: str) -> bool:
    """Whether ``hf`` writes ``key`` (dotted for nested keys) as JSON null."""
    value: Any = hf
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return value is None


def _first(hf: dict, keys: list[str]) -> tuple[str, Any]:
    for k in keys:
        value = lookup(hf, k)
        if value is not _MISSING:
            return k, value
    return keys[0], _MISSING


def _scalar(value: Any) -> bool:
    # Integers past 2^53 are no size or count a checkpoint has (and would not fit a dim).
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) <= 2**53
    return isinstance(value, bool | float) and (
        not isinstance(value, float) or math.isfinite(value)
    )


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value > 0


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return bool(a == b)


def merge_config(user: dict[str, Any], ckpt: CheckpointConfig) -> dict[str, Any]:
    """The config to lower with: the checkpoint's values, its runtime defaults, the user's.

    A user's value for a fact the checkpoint states must equal it (E0659 names both); a
    runtime default (the cache length ``S``) is the user's to change.

    >>> merge_config({"S": 64}, CheckpointConfig(values={"H": 4}, runtime={"S": 128}))
    {'H': 4, 'S': 64}
    """
    diags = []
    for key, value in user.items():
        for table in (ckpt.values, ckpt.checks):
            if key in table and not _same(value, table[key]):
                diags.append(
                    Diagnostic(
                        "E0659",
                        f"config= sets `{key}` to {json.dumps(value)}, but the checkpoint's "
                        f"{ckpt.name} has {ckpt.sources.get(key, key)} = {json.dumps(table[key])}",
                        ckpt.span(ckpt.sources.get(key, key)),
                        f"read as `{key}`" if ckpt.source else "",
                        help=f"drop `{key}` from config= (the checkpoint says it); to run the "
                        "weights with other values, edit a copy of the checkpoint's "
                        "config.json",
                    )
                )
    if diags:
        raise LinnetError(diags)
    return {**ckpt.values, **ckpt.runtime, **user}


def check_dims(ckpt: CheckpointConfig, dims: dict[str, int]) -> None:
    """E0658 for each dim config.json states that the weights' shapes contradict.

    >>> check_dims(CheckpointConfig(checks={"D": 128}, sources={"D": "hidden_size"}),
    ...            {"D": 64})   # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    linnet.lang.diagnostics.core.LinnetError: error[E0658]: ...
    """
    diags = []
    for key, value in ckpt.checks.items():
        if key in dims and dims[key] != value:
            diags.append(contradiction(ckpt, key, f"the weights' shapes give {key} = {dims[key]}"))
    if diags:
        raise LinnetError(diags)


def contradiction(ckpt: CheckpointConfig, key: str, other: str) -> Diagnostic:
    """E0658: config.json's value for ``key`` and ``other`` (what the weights say) differ."""
    hf_key = ckpt.sources.get(key, key)
    value = ckpt.checks.get(key, ckpt.values.get(key))
    return Diagnostic(
        "E0658",
        f"the checkpoint's {ckpt.name} has {hf_key} = {json.dumps(value)} ({key}), but {other}",
        ckpt.span(hf_key),
        "contradicts the weights" if ckpt.source else "",
        help="config.json and the safetensors files come from different checkpoints; "
        "download or save the checkpoint again",
    )


def read_checkpoint_config(
    config_path: str | Path, model_file: str | Path, model: str = "the model", program: Any = None
) -> CheckpointConfig | None:
    """Read a checkpoint's config.json for the model in ``model_file`` through its mapping.

    A JSON object with neither ``model_type`` nor ``architectures`` is not a Hugging Face
    config (a Linnet config someone named config.json, say): None. For a model without a
    mapping file, the mapping is inferred from ``program`` where it is exact (each key names
    a config of the model: :mod:`.infer`); otherwise, or without ``program``, E0670: its
    values (rope scaling, say) would otherwise be silently ignored.

    >>> cfg = read_checkpoint_config("Llama-3.2-1B/config.json",
    ...                              "examples/llama/llama.linnet")   # doctest: +SKIP
    >>> cfg.values["H"]                                               # doctest: +SKIP
    32
    """
    path = Path(config_path)
    hf, source = read_json_object(path, "E0652", "checkpoint config")
    if "model_type" not in hf and "architectures" not in hf:
        return None
    mapping = read_mapping(model_file)
    if mapping is None and program is not None:
        from linnet.lang.check.driver import find_model
        from linnet.lang.weights.infer import infer_mapping

        decl = find_model(program, None)
        mapping = infer_mapping(hf, decl, model_file, path)
        out = checkpoint_config(hf, mapping, model, source, path.name)
        out.inferred = (decl, model_file, path)
        return out
    if mapping is None:
        raise LinnetError(
            Diagnostic(
                "E0670",
                f"the checkpoint has a config.json (`{path}`), but model `{model}` has "
                f"no checkpoint mapping `{mapping_path(model_file).name}` to read it with",
                help=f"write `{mapping_path(model_file)}` saying which config.json keys the model "
                "reads (see docs/torch.md), or load the safetensors files without the "
                "config.json beside them and give config=",
            )
        )
    if mapping.get("model", model) != model:
        raise LinnetError(
            Diagnostic(
                "E0653",
                f"checkpoint mapping `{mapping_path(model_file)}` is for model "
                f"`{mapping['model']}`, but the model loaded is `{model}`",
                help="set its `model` to the model's name, or load that model",
            )
        )
    return checkpoint_config(hf, mapping, model, source, path.name)


# A load-time lowering reports these (the weights, the config and what binds dims, the
# model's own `where` clauses).
_LOAD_CODES = re.compile(r"E06(0[23]|1[23]|3\d|5\d|7\d)|E0881")


def fit_checkpoint(
    program: Any,
    config: dict[str, Any],
    shapes: dict[str, tuple],
    ckpt_config: CheckpointConfig | None,
) -> dict[str, Any]:
    """Lower the first entry once with the checkpoint's shapes, before reading any tensor:
    a checkpoint that does not fit the model (or its own config.json) fails at load.
    Runtimes call it between reading the headers and reading the tensors.

    Returns the config to run with: ``config`` plus the dims config.json states (so that a
    stray tensor name such as ``model.layers.99999999.x`` is an unexpected weight, not a
    model of 10^8 layers). Only mistakes of the weights and the config are raised here;
    anything else (an entry's rule about its input shapes, say) waits for the first call.

    >>> cfg = fit_checkpoint(program, {"H": 4, "KV": 2, "S": 64},
    ...                      safetensors_shapes("ckpt/"), None)   # doctest: +SKIP
    """
    from linnet.lang.check.driver import find_model, lower, probe_inputs

    decl = find_model(program, None)
    entry = next(m for m in decl.methods if m.kind == "entry")
    checks = dict(ckpt_config.checks) if ckpt_config is not None else {}
    full = {**checks, **config}
    inputs = probe_inputs(entry, full)
    try:
        lower(program, entry.name, inputs, full, shapes, check=False)
        return full
    except LinnetError as err:
        diags = [
            d
            for d in err.diagnostics
            if _LOAD_CODES.fullmatch(d.code)
            or (d.code == "E0460" and d.label == "model declared here")
        ]
    if not diags:
        return full  # not about the weights or the config: the first call reports it
    if ckpt_config is not None:
        diags = [_from_config_json(d, ckpt_config) for d in diags]
    if checks and not any(d.code == "E0631" for d in diags):
        # Which stated dim is wrong: lower again with the dims the weights give.
        try:
            graph = lower(program, entry.name, inputs, config, shapes, check=False)
        except LinnetError:
            pass
        else:
            assert ckpt_config is not None
            check_dims(ckpt_config, graph.dims)  # raises E0658 naming key and value
    if ckpt_config is not None and ckpt_config.inferred is not None:
        from linnet.lang.weights.infer import weights_not_exact

        diags = weights_not_exact(*ckpt_config.inferred, diags)
    if ckpt_config is not None and any(d.code in ("E0460", "E0603", "E0632") for d in diags):
        used = ", ".join(
            f"{ckpt_config.sources.get(k, k)} = {json.dumps(v)} ({k})"
            for k, v in {**ckpt_config.values, **checks}.items()
            if isinstance(v, int) and not isinstance(v, bool)
        )
        diags.append(
            Diagnostic(
                "E0658",
                f"the checkpoint's {ckpt_config.name} and its weights disagree: the "
                f"model was lowered with {used} from {ckpt_config.name}",
                help="config.json and the safetensors files come from different "
                "checkpoints; download or save the checkpoint again",
            )
        )
    raise LinnetError(diags)


def _from_config_json(d: Diagnostic, ckpt: CheckpointConfig) -> Diagnostic:
    """A list of the wrong length (E0881) that config.json gave: said where it stands there."""
    m = re.match(r"config `(\w+)`", d.message)
    if m is None or d.code != "E0881" or m.group(1) not in ckpt.sources:
        return d
    source = ckpt.sources[m.group(1)]
    return Diagnostic(
        d.code,
        f"{d.message}: the checkpoint's {ckpt.name} `{source}`",
        ckpt.span(source),
        f"read as `{m.group(1)}`" if ckpt.source else "",
        help=d.help,
    )
