"""What a checkpoint mapping checks besides names: each config.json value's valid range, and
the keys every Hugging Face config.json carries that never change a causal LM's logits.

A mapping declares one rule per config.json key in its ``ranges`` section (and one per rope
parameter in ``rope.ranges``)::

    "ranges": {"rms_norm_eps": "(0, 1]",
               "num_attention_heads": "int [1, 4096] multiple of num_key_value_heads",
               "num_key_value_heads": "int [1, num_attention_heads]",
               "tie_word_embeddings": "bool"}

A rule is ``bool``, or ``[int] <interval> [multiple of <key>]``: an interval is written as
in mathematics (``[`` and ``]`` include the bound, ``(`` and ``)`` exclude it, ``inf`` is no
bound), and a bound may name another config.json key (``[0, vocab_size)``), checked where
that key is a number. A value outside its rule is E0665, naming the file, the key, the value
and the rule; a value of the wrong kind is E0671.

Pure Python, shared by every runtime.

>>> parse_rule("int [0, vocab_size)").check(5, {"vocab_size": 4})
'outside its valid range int [0, vocab_size) (vocab_size = 4)'
>>> parse_rule("(0, 1]").check(1e-5, {}) is None
True
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys that transformers' `PretrainedConfig` (4.x and 5.x) writes for every model and that
# never change a causal LM's logits: names and versions, the storage dtype, output and
# label bookkeeping, token ids (range-checked against the vocabulary below, never used by
# the math), tokenizer and task metadata, and the generation defaults it keeps for
# `generate` (Linnet's `generate` takes its own). Every `_`-prefixed key (`_name_or_path`,
# `_commit_hash`, `_attn_implementation`...) is transformers' private state: ignored too.
# Family-specific keys that do not change the math (dropouts...) are in each mapping's
# `ignore`; a key in neither is E0655.
PRETRAINED_CONFIG_IGNORE = frozenset(
    {
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_bfloat16",
        "tf_legacy_loss",
        "torchscript",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "is_decoder",
        "cross_attention_hidden_size",
        "tie_encoder_decoder",
        "chunk_size_feed_forward",
        "finetuning_task",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "unk_token_id",
        "decoder_start_token_id",
        "use_cache",
        "initializer_range",
        "gradient_checkpointing",
        "attn_implementation",
        # Generation defaults (`GenerationConfig`'s, kept in config.json by transformers 4.x).
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "epsilon_cutoff",
        "eta_cutoff",
        "encoder_repetition_penalty",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "target_lookbehind",
    }
)
# PretrainedConfig keys whose default is what a decoder-only model computes and whose other
# values change it: another value is E0656 (a mapping's own `require` wins).
PRETRAINED_CONFIG_REQUIRE: dict[str, list[Any]] = {
    "is_encoder_decoder": [False],
    "add_cross_attention": [False],
    "pruned_heads": [{}],
}
TOKEN_IDS = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "unk_token_id",
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
)
# Token ids name rows of the vocabulary (a mapping's own `ranges` win). The ids Linnet never
# reads may also be -1, the "none" that older hub configs write (`"pad_token_id": -1`): a real
# checkpoint is not refused for metadata. bos and eos start and stop generation: rows only.
PRETRAINED_CONFIG_RANGES = {
    key: "int [0, vocab_size)"
    if key in ("bos_token_id", "eos_token_id")
    else "int [-1, vocab_size)"
    for key in TOKEN_IDS
}


def ignored(key: str, mapping: dict) -> bool:
    """Whether config.json's ``key`` is metadata the model never reads: a ``_`` key, a
    PretrainedConfig key in :data:`PRETRAINED_CONFIG_IGNORE` or the mapping's ``ignore``.

    >>> ignored("_model_name_or_path", {}), ignored("unk_token_id", {}), ignored("eps", {})
    (True, True, False)
    """
    return (
        key.startswith("_") or key in PRETRAINED_CONFIG_IGNORE or key in mapping.get("ignore", [])
    )


_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?inf"
_BOUND = rf"(?:{_NUMBER}|[A-Za-z_][\w.]*)"
_RULE = re.compile(
    rf"\s*(?P<int>int\s+)?(?P<open>[\[(])\s*(?P<lo>{_BOUND})\s*,\s*"
    rf"(?P<hi>{_BOUND})\s*(?P<close>[\])])"
    r"(?:\s+multiple\s+of\s+(?P<of>[A-Za-z_][\w.]*))?\s*"
)


@dataclass(frozen=True)
class Rule:
    """One key's valid values: a kind (``bool``, ``int`` or a number) and an interval whose
    bounds are numbers or other config.json keys, and an optional ``multiple of`` key."""

    text: str
    kind: str = "number"
    lo: float | str = -math.inf
    hi: float | str = math.inf
    lo_open: bool = True
    hi_open: bool = True
    of: str | None = None

    def kind_error(self, value: Any) -> str | None:
        """Why ``value`` is not of the rule's kind (E0671), or None."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else "not true or false"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "not an integer" if self.kind == "int" else "not a number"
        if self.kind == "int" and not isinstance(value, int):
            return "not an integer"
        if isinstance(value, float) and not math.isfinite(value):
            return "not a finite number"
        return None

    def check(self, value: Any, lookup: Callable[[str], Any] | dict) -> str | None:
        """Why ``value`` (of the rule's kind) breaks the rule, or None; ``lookup`` resolves
        the keys a bound names (a dict, or a function returning None where absent)."""
        if self.kind == "bool":
            return None
        get = lookup.get if isinstance(lookup, dict) else lookup
        named: list[str] = []

        def bound(b: float | str) -> float | None:
            if not isinstance(b, str):
                return b
            v = get(b)
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None  # an absent or malformed bound key: that key's own rule says so
            named.append(f"{b} = {json.dumps(v)}")
            return v

        lo, hi = bound(self.lo), bound(self.hi)
        low_ok = lo is None or (value > lo if self.lo_open else value >= lo)
        high_ok = hi is None or (value < hi if self.hi_open else value <= hi)
        if not (low_ok and high_ok):
            return f"outside its valid range {self.text}" + (
                f" ({', '.join(named)})" if named else ""
            )
        if self.of is not None:
            m = get(self.of)
            if isinstance(m, int) and not isinstance(m, bool) and m > 0 and value % m:
                return f"not a multiple of `{self.of}` ({json.dumps(m)})"
        return None


def parse_rule(text: Any) -> Rule:
    """A range rule from its text; ValueError for text that is not one.

    >>> parse_rule("int [1, 4096] multiple of num_key_value_heads").of
    'num_key_value_heads'
    """
    if not isinstance(text, str):
        raise ValueError("a rule is a string")
    if text.strip() == "bool":
        return Rule("bool", "bool")
    m = _RULE.fullmatch(text)
    if m is None:
        raise ValueError(f"{json.dumps(text)} is not `bool` or `[int] [lo, hi] [multiple of key]`")

    def value(b: str) -> float | str:
        return b if re.fullmatch(r"[A-Za-z_][\w.]*", b) and b != "inf" else float(b)

    return Rule(
        " ".join(text.split()),
        "int" if m["int"] else "number",
        value(m["lo"]),
        value(m["hi"]),
        m["open"] == "(",
        m["close"] == ")",
        m["of"],
    )


def rule_problems(mapping: dict) -> list[str]:
    """What is wrong with a mapping's ``ranges`` and ``rope.ranges`` (for E0653)."""
    problems = []
    found = mapping.get("rope")
    rope: dict = found if isinstance(found, dict) else {}
    for where, table in (("ranges", mapping.get("ranges")), ("rope.ranges", rope.get("ranges"))):
        if table is None:
            continue
        if not isinstance(table, dict):
            problems.append(f"`{where}` must be an object of config.json keys to rules")
            continue
        for key, text in table.items():
            try:
                parse_rule(text)
            except ValueError as exc:
                problems.append(f"`{where}.{key}`: {exc}")
    return problems


def range_diagnostics(
    value_of: Callable[[str], Any],
    rules: dict[str, str],
    lookup: Callable[[str], Any],
    prefix: str = "",
    skip: set[str] | frozenset = frozenset(),
) -> list[tuple[str, str, str, str]]:
    """``(code, key, why, rule)`` for each key of ``rules`` whose value (``value_of(key)``,
    None where absent or null: not checked) breaks its rule; a list value is checked element
    by element (``eos_token_id: [1, 2]``); ``lookup`` resolves the keys bounds name.
    ``prefix`` is prepended to keys (``rope_scaling.``); keys in ``skip`` were reported
    already.

    >>> range_diagnostics({"rms_norm_eps": -1}.get, {"rms_norm_eps": "(0, 1]"}, {}.get)
    [('E0665', 'rms_norm_eps', 'is -1, outside its valid range (0, 1]', '(0, 1]')]
    """
    out = []
    for key, text in rules.items():
        value = value_of(key)
        if value is None or prefix + key in skip:
            continue
        rule = parse_rule(text)
        for item in value if isinstance(value, list) and rule.kind != "bool" else [value]:
            why = rule.kind_error(item)
            code = "E0671"
            if why is None:
                why, code = rule.check(item, lookup), "E0665"
            if why is not None:
                shown = (
                    json.dumps(item)[:40]
                    if not isinstance(value, list)
                    else f"{json.dumps(value)[:40]} (element {json.dumps(item)[:20]})"
                )
                out.append((code, prefix + key, f"is {shown}, {why}", rule.text))
                break
    return out


def mapping_path(model_file: str | Path) -> Path:
    """Where a model's checkpoint mapping lives: ``llama.linnet`` -> ``llama.hf.json``.

    >>> mapping_path("examples/llama/llama.linnet").name
    'llama.hf.json'
    """
    p = Path(model_file)
    return p.with_name(p.stem + ".hf.json")
