"""A checkpoint mapping inferred where it is exact, for a model without a ``<model>.hf.json``.

A user's own model whose config names are the checkpoint's config.json keys (a model
declared ``model Tiny<vocab_size: Dim, hidden_size: Dim, ...>`` with ``config
rms_norm_eps: f32``) and whose parameter paths are the checkpoint's tensor names needs no
mapping file: each config.json key maps to the config of the same name, one to one (a Dim
is checked against the weights, any other config set from it), and transformers' metadata
and ``_`` keys are ignored (:mod:`.rules`). Where a key names nothing in the model (or a
parameter path names no tensor of its shape, found when the model is lowered), the mapping
is not exact and E0670 says which keys and paths did not match: then the file is needed.

Pure Python, shared by every runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.weights.rules import ignored, mapping_path

# Set in an inferred mapping (never in a file: `_` keys of a mapping are comments).
INFERRED = "_inferred"
_WEIGHT_CODES = ("E0630", "E0631", "E0632", "E0633")


def model_config_names(decl: Any) -> tuple[set[str], dict[str, str]]:
    """The model's Dim generics and its ``config`` members with their types.

    >>> from linnet.lang.host.loading import load_program
    >>> from linnet.lang.check.driver import find_model
    >>> dims, configs = model_config_names(find_model(load_program("std.models.gpt2")[0], None))
    >>> sorted(dims)[:3], configs["layer_norm_eps"]
    (['B', 'F', 'H'], 'f32')
    """
    dims = {g.name for g in decl.generics if g.kind == "Dim"}
    configs = {m.name: getattr(m.type, "name", "") for m in decl.members if m.kind == "config"}
    return dims, configs


def infer_mapping(hf: dict, decl: Any, model_file: str | Path, config_path: str | Path) -> dict:
    """The mapping of config.json ``hf`` onto model ``decl`` where every key that is not
    metadata names one of its configs; E0670 naming the keys that do not otherwise.

    >>> from linnet.lang.host.loading import load_program
    >>> from linnet.lang.check.driver import find_model
    >>> decl = find_model(load_program("std.models.gpt2")[0], None)
    >>> infer_mapping({"model_type": "mine", "H": 4, "layer_norm_eps": 1e-5}, decl,
    ...               "gpt2.linnet", "config.json")["set"]
    {'layer_norm_eps': 'layer_norm_eps'}
    """
    dims, configs = model_config_names(decl)
    mapping: dict[str, Any] = {
        "model": decl.name,
        "set": {},
        "check": {},
        "require": {},
        INFERRED: True,
    }
    unmatched = []
    for key, value in hf.items():
        if key in ("architectures", "model_type") or ignored(key, {}):
            continue
        if key in dims:
            mapping["check"][key] = key
        elif key in configs and not isinstance(value, dict | list):
            mapping["set"][key] = key
        elif key == "tie_word_embeddings":
            # A model that does not declare it has its own output weights: untied only.
            mapping["require"][key] = [False]
        else:
            unmatched.append(key)
    if unmatched:
        many = len(unmatched) > 1
        raise LinnetError(
            not_exact(
                decl,
                model_file,
                config_path,
                f"config.json key{'s' if many else ''} "
                f"{_names(unmatched)} name{'' if many else 's'} no config of the model (its "
                f"configs: {_names(sorted(dims | set(configs)), 40)})",
            )
        )
    return mapping


def not_exact(decl: Any, model_file: str | Path, config_path: str | Path, why: str) -> Diagnostic:
    """E0670: model ``decl`` has no mapping file and the one inferred is not exact."""
    return Diagnostic(
        "E0670",
        f"the checkpoint has a config.json (`{config_path}`), but model "
        f"`{decl.name}` has no checkpoint mapping `{mapping_path(model_file).name}` and "
        f"none can be inferred: {why}",
        help=f"write `{mapping_path(model_file)}` saying which config.json keys the model "
        "reads (see docs/models.md, `Checkpoint mappings`), name the model's configs "
        "and parameters as the checkpoint does, or load the safetensors files without "
        "the config.json beside them and give config=",
    )


def weights_not_exact(
    decl: Any, model_file: str | Path, config_path: str | Path, diags: list[Diagnostic]
) -> list[Diagnostic]:
    """``diags`` (a lowering's) with E0670 first where the inferred mapping's parameter paths
    did not equal the checkpoint's tensors (E0630-E0633 among them, kept after it)."""
    weights = [d for d in diags if d.code in _WEIGHT_CODES]
    if not weights:
        return diags
    shown = "; ".join(d.message for d in weights[:4]) + (
        f"; and {len(weights) - 4} more" if len(weights) > 4 else ""
    )
    return [
        not_exact(
            decl,
            model_file,
            config_path,
            f"its parameter paths are not the checkpoint's tensor names and shapes ({shown})",
        ),
        *diags,
    ]


def _names(keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(f"`{k}`" for k in keys[:limit])
    return (
        shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "") if keys else "none"
    )
