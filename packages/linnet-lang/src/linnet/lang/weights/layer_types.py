"""Per-layer config lists from config.json's ``layer_types`` (a mapping's ``layers`` section).

transformers names each layer's attention in ``layer_types`` (``"sliding_attention"`` or
``"full_attention"``), or computes the list when config.json has none: Gemma 2 and 3 from a
pattern (every ``sliding_window_pattern``-th layer global), Qwen2 and Qwen3 from
``max_window_layers`` (layers from there on slide, when ``use_sliding_window``). A mapping
says how, and which config list each type sets per layer::

    "layers": {
      "key": "layer_types", "count": "num_hidden_layers",
      "pattern": {"key": "sliding_window_pattern", "default": 2},   // or "after": {...}
      "types": {"full_attention": {"layer_windows": 0},
                "sliding_attention": {"layer_windows": {"key": "sliding_window"}}}
    }

Each type's value is a number or ``{"key": ..., "default": ...}`` (config.json keys, first
present wins). A type the mapping lacks is E0656, a list of another length than
``count`` E0875, a value that is not a number E0671.

>>> spec = {"key": "layer_types", "count": "num_hidden_layers",
...         "types": {"full_attention": {"w": 0}, "sliding_attention": {"w": {"key": "sw"}}}}
>>> hf = {"num_hidden_layers": 2, "sw": 8, "layer_types": ["sliding_attention", "full_attention"]}
>>> layer_values(hf, spec, lambda *a: None)
({'w': [8, 0]}, {'w': 'layer_types'})
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

LAYERS_KEYS = {"key", "count", "pattern", "after", "types"}


def layers_problems(spec: Any) -> list[str]:
    """What is wrong with a mapping's ``layers`` section (E0653's problems)."""
    if spec is None:
        return []
    if not isinstance(spec, dict) or set(spec) - LAYERS_KEYS:
        return ["`layers` must be an object with " + ", ".join(sorted(LAYERS_KEYS))]
    problems = []
    if not isinstance(spec.get("key"), str) or not isinstance(spec.get("count"), str):
        problems.append("`layers.key` and `layers.count` must be config.json keys")
    types = spec.get("types")
    if not isinstance(types, dict) or not all(isinstance(v, dict) for v in types.values()):
        problems.append("`layers.types` must map each layer type to its config values")
    for rule in ("pattern", "after"):
        if rule in spec and not (isinstance(spec[rule], dict) and "key" in spec[rule]):
            problems.append(f'`layers.{rule}` must be {{"key": ..., "default": ...}}')
    return problems


def layers_reads(spec: dict) -> set[str]:
    """The top-level config.json keys a ``layers`` section reads."""
    keys = {spec["key"], spec["count"]}
    for rule in ("pattern", "after"):
        if rule in spec:
            keys.add(spec[rule]["key"])
            if "when" in spec[rule]:
                keys.add(spec[rule]["when"])
    for values in spec.get("types", {}).values():
        for v in values.values():
            if isinstance(v, dict):
                keys.update(k.split(".")[0] for k in _keys(v))
    return keys


def _keys(v: dict) -> list[str]:
    key = v["key"]
    return [key] if isinstance(key, str) else list(key)


def _get(hf: dict, key: str) -> Any:
    value: Any = hf
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def default_types(hf: dict, spec: dict, count: int) -> list[str]:
    """``layer_types`` as transformers computes it when config.json has none."""
    if "pattern" in spec:
        rule = spec["pattern"]
        p = _get(hf, rule["key"])
        p = rule.get("default", 0) if p is None else p
        if not _number(p) or int(p) < 1:
            return ["full_attention"] * count
        return ["sliding_attention" if (i + 1) % int(p) else "full_attention" for i in range(count)]
    if "after" in spec:
        rule = spec["after"]
        if "when" in rule and _get(hf, rule["when"]) is not True:
            return ["full_attention"] * count
        first = _get(hf, rule["key"])
        first = rule.get("default", count) if first is None else first
        if not _number(first):
            return ["full_attention"] * count
        return ["sliding_attention" if i >= first else "full_attention" for i in range(count)]
    return ["full_attention"] * count


def layer_values(
    hf: dict, spec: dict, diag: Callable[[str, str, str, str, str], None], name: str = "config.json"
) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """The config lists (one value per layer) ``spec`` reads from ``hf``, and the key each
    came from; problems go to ``diag(code, message, key, label, help)``."""
    key, count = spec["key"], _get(hf, spec["count"])
    if not (_number(count) and int(count) == count and count >= 1):
        return {}, {}  # reported by the range checks (num_hidden_layers)
    count = int(count)
    given = _get(hf, key)
    types = given if given is not None else default_types(hf, spec, count)
    source = (
        key if given is not None else spec.get("pattern", spec.get("after", {})).get("key", key)
    )
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        diag(
            "E0671",
            f"{name}'s `{key}` is {json.dumps(types)[:60]}, not a list of layer types",
            key,
            "expected a list of strings",
            "restore config.json from the checkpoint",
        )
        return {}, {}
    if len(types) != count:
        diag(
            "E0875",
            f"{name}'s `{key}` names {len(types)} layers, but `{spec['count']}` is {count}",
            key,
            f"{len(types)} layer types",
            f"give one type per layer ({count}), or drop `{key}` to have the model's default",
        )
        return {}, {}
    allowed = spec.get("types", {})
    bad = sorted({t for t in types if t not in allowed})
    if bad:
        diag(
            "E0656",
            f"{name}'s `{key}` has {', '.join(json.dumps(b) for b in bad)}; the model runs "
            + " and ".join(json.dumps(a) for a in allowed)
            + " layers",
            key,
            "not what the model computes",
            "use a model that implements this attention, or a checkpoint of this architecture",
        )
        return {}, {}
    out: dict[str, list[Any]] = {}
    sources: dict[str, str] = {}
    for t in types:
        for lname, v in allowed[t].items():
            if isinstance(v, dict):
                present = [k for k in _keys(v) if _get(hf, k) is not None]
                value = _get(hf, present[0]) if present else v.get("default")
                if not _number(value):
                    k = present[0] if present else _keys(v)[0]
                    diag(
                        "E0671",
                        f"{name}'s `{k}` is "
                        + ("missing" if value is None else json.dumps(value)[:40])
                        + f", but a {t} layer needs a number there",
                        k,
                        f"read for a {t} layer",
                        "restore config.json from the checkpoint",
                    )
                    return {}, {}
            else:
                value = v
            out.setdefault(lname, []).append(value)
            sources[lname] = source
    return out, sources
