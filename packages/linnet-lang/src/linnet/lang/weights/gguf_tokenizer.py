"""A GGUF file's tokenizer, rebuilt from its ``tokenizer.ggml.*`` metadata as a
``tokenizers.Tokenizer`` (the Hugging Face ``tokenizers`` library), with the ids and the chat
template :class:`linnet.lang.text.Tokenizer` takes (``Tokenizer.from_parts(**parts)``).

Two tokenizer models, as llama.cpp names them in ``tokenizer.ggml.model``:

* ``gpt2``: byte-level BPE. The vocabulary and merges are in the file; how text is split
  before the merges apply is named by ``tokenizer.ggml.pre`` (llama.cpp's pre-tokenizer
  names: ``gpt2``, ``smollm``, ``llama-bpe``/``llama3``, ``qwen2``...), each mapped here to
  the regular expressions llama.cpp splits with.
* ``llama``: SentencePiece BPE with byte fallback (``<0x0A>`` tokens): the merges come from
  the file, or from the pieces' scores where it has none; a space becomes ``▁`` and one is
  put before the text where ``tokenizer.ggml.add_space_prefix`` says (default: yes).

Tokens llama.cpp marks as control (``<|im_end|>``) are special tokens, matched whole and
skipped when decoding with ``skip_special_tokens``; user-defined ones are matched whole.
Anything else (another tokenizer model, a pre-tokenizer whose splitting is not known here)
is E0858: a tokenizer that splits text differently from the model's gives wrong ids
silently.

>>> parts = tokenizer_parts("SmolLM2-135M-Instruct.Q4_1.gguf")   # doctest: +SKIP
>>> parts["backend"].encode("Hello").ids, parts["eos_token_ids"]  # doctest: +SKIP
([19556], [2])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import coded_error

# llama.cpp's pre-tokenizer regular expressions (llama-vocab.cpp), by `tokenizer.ggml.pre`.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Each pre-tokenizer Linnet rebuilds: the regular expressions text is split by, in order.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,),
    "gpt2": (_GPT2,),
    # SmolLM's digits are split one by one first (its tokenizer.json's `Digits` step).
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "llama-bpe": (_LLAMA3,),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "dbrx": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
}
_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6


def tokenizer_parts(path: str | Path) -> dict[str, Any]:
    """The tokenizer of the GGUF file at ``path``: ``backend`` (a ``tokenizers.Tokenizer``),
    ``bos_token_id``, ``eos_token_ids`` (a list), ``chat_template`` (or None),
    ``add_bos_token``, ``add_eos_token`` and ``name`` (the file's ``general.name``, else its
    file name). E0858 for a tokenizer this module cannot rebuild exactly.

    >>> tokenizer_parts("smollm2.gguf")["add_bos_token"]   # doctest: +SKIP
    False
    """
    from linnet.lang.weights.gguf import open_reader, read_metadata

    p = Path(path)
    meta = read_metadata(open_reader(p))
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not isinstance(kind, str):
        raise coded_error(
            "E0858",
            f"`{p}` has no tokenizer (no `tokenizer.ggml.model` and "
            "`tokenizer.ggml.tokens` metadata)",
            help="pass token ids, or load a tokenizer from the model's Hugging "
            "Face checkpoint (its tokenizer.json)",
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        backend = _byte_level(p, meta, tokens)
    elif kind == "llama":
        backend = _sentencepiece(p, meta, tokens, types)
    else:
        raise coded_error(
            "E0858",
            f"`{p}`'s tokenizer is of model {kind!r}, which Linnet "
            "does not rebuild from GGUF metadata (it rebuilds `gpt2` and "
            "`llama`)",
            help="pass token ids, or load the tokenizer from the model's Hugging Face checkpoint",
        )
    _add_special(backend, tokens, types)
    eos = _token_id(p, meta, "eos_token_id", len(tokens))
    default_bos = kind == "llama"  # llama.cpp adds BOS for SentencePiece unless told not to
    return {
        "backend": backend,
        "bos_token_id": _token_id(p, meta, "bos_token_id", len(tokens)),
        "eos_token_ids": [] if eos is None else [eos],
        "chat_template": meta.get("tokenizer.chat_template"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "name": str(meta.get("general.name") or p.stem),
    }


def _token_id(p: Path, meta: dict[str, Any], key: str, vocabulary: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocabulary:
        raise coded_error(
            "E0858",
            f"`{p}`'s `tokenizer.ggml.{key}` is {value!r:.40}, not a token id in [0, {vocabulary})",
            help="the file is damaged; download it again",
        )
    return value


def _byte_level(p: Path, meta: dict[str, Any], tokens: list[str]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    if pre not in PRE_TOKENIZERS:
        raise coded_error(
            "E0858",
            f"`{p}`'s tokenizer splits text with llama.cpp's pre-tokenizer {pre!r} "
            "(`tokenizer.ggml.pre`), which Linnet does not know",
            help="pre-tokenizers Linnet rebuilds: "
            + ", ".join(sorted(PRE_TOKENIZERS))
            + "; pass token ids, or load the tokenizer from the model's Hugging Face "
            "checkpoint",
        )
    merges = [_merge(m) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Tokenizer(
        _bpe(p, models, vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False)
    )
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _bpe(p: Path, models: Any, **args: Any) -> Any:
    """``tokenizers.models.BPE(**args)``; E0858 where the file's merges name pieces its
    vocabulary lacks (the library refuses them)."""
    try:
        return models.BPE(**args)
    except Exception as exc:  # tokenizers raises a bare Exception
        raise coded_error(
            "E0858",
            f"`{p}`'s tokenizer cannot be built: {exc}",
            help="its `tokenizer.ggml.merges` and `tokenizer.ggml.tokens` do "
            "not agree: the file is damaged; download it again",
        ) from None


def _merge(text: Any) -> tuple[str, str]:
    left, _, right = str(text).partition(" ")
    return left, right


def _sentencepiece(p: Path, meta: dict[str, Any], tokens: list[str], types: list[int]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if meta.get("tokenizer.ggml.merges"):
        merges = [_merge(m) for m in meta["tokenizer.ggml.merges"]]
    else:
        merges = _merges_from_scores(tokens, scores, types)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk_token = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    backend = Tokenizer(
        _bpe(
            p,
            models,
            vocab=vocab,
            merges=merges,
            unk_token=unk_token,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps: list[Any] = [normalizers.Replace(" ", "▁")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("▁"))
    backend.normalizer = normalizers.Sequence(steps)
    strip = (
        [decoders.Strip(content=" ", left=1)]
        if meta.get("tokenizer.ggml.add_space_prefix", True)
        else []
    )
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return backend


def _merges_from_scores(
    tokens: list[str], scores: list[float], types: list[int]
) -> list[tuple[str, str]]:
    """SentencePiece BPE's merges: every split of a piece into two pieces of the vocabulary,
    the merge of the higher-scored piece first (SentencePiece merges by piece score)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for i, piece in enumerate(tokens):
        if types[i] in (_CONTROL, _BYTE) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-float(scores[i]), vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def _add_special(backend: Any, tokens: list[str], types: list[int]) -> None:
    from tokenizers import AddedToken

    # Each is in the vocabulary already: adding it keeps its id and matches it whole.
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _CONTROL and t
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _USER_DEFINED and t
    ]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
