"""Adversarial suite (issue 40, item 2): GGUF files as users bring them.

Files that are not GGUF, truncated or empty; architectures no shipped model runs, or that the
model named does not; quant types Linnet does not dequantise; tensors missing, stray or past
the layer count; metadata missing, of the wrong kind or unmodelled (a mixture of experts, a
per-layer head count); rope scaling stored as tensors; a ``config=`` that contradicts the
file; tokenizers Linnet cannot rebuild. Each is a coded error naming the file, read before any
tensor is dequantised, and the file is never changed. Also: `linnet run x.gguf` picks the
model from the file, and the tokenizer matches transformers' GGUF tokenizer.

The files are tiny and random, written as llama.cpp's converter writes them (gguf_files.py).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import pytest
from linnet.lang import LinnetError
from linnet.lang.host.loading import load_program, read_headers

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from gguf_files import hf_model, write_gguf


def headers(path: Path, model: str = "std.models.llama", config: dict | None = None) -> tuple:
    program, model_path = load_program(model)
    return read_headers(str(path), program, model_path, dict(config or {}), None)


def codes(err: LinnetError) -> list[str]:
    return [d.code for d in err.diagnostics]


def expect(
    code: str,
    path: Path,
    model: str = "std.models.llama",
    config: dict | None = None,
    text: str = "",
) -> LinnetError:
    before = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    with pytest.raises(LinnetError) as info:
        headers(path, model, config)
    assert code in codes(info.value), str(info.value)
    assert text in str(info.value)
    if before is not None:  # never a lost or changed user file
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    return info.value


@pytest.fixture(scope="module")
def llama() -> object:
    return hf_model("llama")


@pytest.fixture
def good(tmp_path: Path, llama: object) -> Path:
    return write_gguf(tmp_path / "llama.gguf", "llama", llama, quant="Q8_0")


def test_a_good_file_gives_the_config_and_shapes(good: Path) -> None:
    ckpt, shapes, cfg = headers(good)
    assert ckpt.family.model == "std.models.llama"
    assert (cfg["H"], cfg["KV"], cfg["rope_theta"], cfg["tie_word_embeddings"]) == (
        4,
        2,
        10000.0,
        False,
    )
    assert shapes["model.layers.1.self_attn.k_proj.weight"][0] == (32, 64)
    assert ckpt.tensors["model.layers.0.mlp.up_proj.weight"].quant == "Q8_0"
    assert ckpt.stop_tokens().tokens == (2,)


# ---------------------------------------------------------------- not GGUF, truncated


@pytest.mark.parametrize(
    "content", [b"", b"GGU", b"\x00" * 64, b'{"a": 1}', b"GGUF\x03\x00\x00\x00" + b"\xff" * 16]
)
def test_a_file_that_is_not_gguf_is_E0851(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    expect("E0851", path)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.97])
def test_a_truncated_file_is_E0851(tmp_path: Path, good: Path, keep: float) -> None:
    data = good.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    expect("E0851", path)


def test_a_missing_file_is_E0651(tmp_path: Path) -> None:
    expect("E0651", tmp_path / "nowhere.gguf")


def test_without_the_gguf_package_a_gguf_file_is_E0850(good: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    expect("E0850", good, text="linnet-lang[gguf]")


# ---------------------------------------------------------------- architectures


def test_an_unknown_architecture_is_E0852(tmp_path: Path, llama: object) -> None:
    path = write_gguf(tmp_path / "falcon.gguf", "llama", llama, arch="falcon")
    err = expect("E0852", path, text="'falcon'")
    assert "std.models.llama" in str(err)  # the help lists what loads


def test_a_file_of_another_family_than_the_model_is_E0852(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "qwen.gguf", "qwen2", hf_model("qwen2"))
    expect("E0852", path, "std.models.llama", text="std.models.qwen2")


def test_a_model_without_a_mapping_is_E0852(tmp_path: Path, good: Path) -> None:
    model = tmp_path / "mine.linnet"
    model.write_text((Path(load_program("std.models.llama")[1])).read_text())
    expect("E0852", good, str(model), text="mine.hf.json")


def test_a_mixture_of_experts_is_E0852(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "moe.gguf",
        "llama",
        llama,
        meta={"llama.expert_count": 8, "llama.expert_used_count": 2},
    )
    expect("E0852", path, text="8 experts")


# ---------------------------------------------------------------- tensors


def test_an_unsupported_quant_type_is_E0853(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "iq4.gguf", "llama", llama, quant={"blk.0.ffn_up.weight": "IQ4_NL"}
    )
    expect("E0853", path, text="IQ4_NL")


def test_a_missing_tensor_is_E0854_by_its_gguf_name(tmp_path: Path, llama: object) -> None:
    path = write_gguf(tmp_path / "gap.gguf", "llama", llama, drop=("blk.1.attn_v.weight",))
    expect("E0854", path, text="blk.1.attn_v.weight")


def test_a_stray_tensor_is_E0854(tmp_path: Path, llama: object) -> None:
    import numpy as np

    path = write_gguf(
        tmp_path / "stray.gguf",
        "llama",
        llama,
        extra={"blk.0.ffn_gate_exps.weight": np.zeros((4, 64), np.float32)},
    )
    expect("E0854", path, text="blk.0.ffn_gate_exps.weight")


def test_a_tensor_past_the_block_count_is_E0854(tmp_path: Path, llama: object) -> None:
    import numpy as np

    path = write_gguf(
        tmp_path / "past.gguf",
        "llama",
        llama,
        extra={"blk.2.attn_norm.weight": np.ones(64, np.float32)},
    )
    expect("E0854", path, text="blk.2.attn_norm.weight")


def test_rope_factors_stored_as_a_tensor_are_E0856(tmp_path: Path, llama: object) -> None:
    import numpy as np

    path = write_gguf(
        tmp_path / "rope.gguf", "llama", llama, extra={"rope_freqs.weight": np.ones(8, np.float32)}
    )
    expect("E0856", path, text="rope_freqs.weight")


# ---------------------------------------------------------------- metadata


def test_a_missing_block_count_is_E0855(tmp_path: Path, llama: object) -> None:
    path = write_gguf(tmp_path / "nb.gguf", "llama", llama, meta={"llama.block_count": None})
    expect("E0855", path, text="llama.block_count")


def test_a_value_of_the_wrong_kind_is_E0855(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "kind.gguf", "llama", llama, meta={"llama.attention.head_count": "four"}
    )
    expect("E0855", path, text="llama.attention.head_count")


def test_an_unmodelled_key_is_E0855(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "swa.gguf", "llama", llama, meta={"llama.attention.sliding_window": 16}
    )
    expect("E0855", path, text="llama.attention.sliding_window")


def test_per_layer_head_counts_that_differ_are_E0855(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "kv.gguf", "llama", llama, meta={"llama.attention.head_count_kv": [2, 4]}
    )
    expect("E0855", path, text="differs between layers")


def test_equal_per_layer_head_counts_load(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "kv.gguf", "llama", llama, meta={"llama.attention.head_count_kv": [2, 2]}
    )
    assert headers(path)[2]["KV"] == 2


def test_a_value_out_of_range_is_the_mapping_s_E0665(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "eps.gguf", "llama", llama, meta={"llama.attention.layer_norm_rms_epsilon": -1.0}
    )
    expect("E0665", path, text="eps.gguf's metadata")


def test_a_rope_scaling_the_model_lacks_is_E0657(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "longrope.gguf",
        "llama",
        llama,
        meta={
            "llama.rope.scaling.type": "longrope",
            "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 64,
        },
    )
    expect("E0657", path, text="longrope")


def test_yarn_rope_scaling_is_read(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "yarn.gguf",
        "llama",
        llama,
        meta={
            "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 64,
        },
    )
    values = headers(path)[2]
    assert values["rope_yarn"] is True and values["rope_factor"] == 4.0
    assert values["rope_original_max_positions"] == 64 and values["rope_beta_fast"] == 32.0


def test_linear_rope_scaling_is_read(tmp_path: Path, llama: object) -> None:
    path = write_gguf(
        tmp_path / "lin.gguf",
        "llama",
        llama,
        meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0},
    )
    assert headers(path)[2]["rope_factor"] == 2.0


def test_partial_rotary_is_refused_not_ignored(tmp_path: Path, llama: object) -> None:
    path = write_gguf(tmp_path / "rot.gguf", "llama", llama, meta={"llama.rope.dimension_count": 8})
    expect("E0656", path, text="partial_rotary_factor")


def test_a_config_that_contradicts_the_file_is_E0659(good: Path) -> None:
    expect("E0659", good, config={"H": 8}, text="llama.gguf's metadata")


def test_a_config_may_set_the_runtime_length(good: Path) -> None:
    assert headers(good, config={"S": 32})[2]["S"] == 32


# ---------------------------------------------------------------- picking the model


def test_linnet_run_picks_the_model_from_the_file(tmp_path: Path) -> None:
    from linnet.lang.host.run import run_setup

    path = write_gguf(tmp_path / "q.gguf", "qwen2", hf_model("qwen2"))
    setup = run_setup(argparse.Namespace(file=str(path), weights=None, config=None, set=[]))
    assert (setup.model.name, setup.weights, setup.config_name) == ("qwen2.linnet", str(path), None)
    assert "GGUF architecture qwen2" in setup.notes[0]
    setup = run_setup(argparse.Namespace(file=None, weights=str(path), config=None, set=[]))
    assert setup.model.name == "qwen2.linnet"


def test_linnet_run_with_two_files_is_E0795(tmp_path: Path, good: Path) -> None:
    from linnet.lang.host.run import run_setup

    other = tmp_path / "other.gguf"
    other.write_bytes(good.read_bytes())
    with pytest.raises(LinnetError) as info:
        run_setup(argparse.Namespace(file=str(good), weights=str(other), config=None, set=[]))
    assert codes(info.value) == ["E0795"]


def test_an_unknown_architecture_is_E0852_before_anything_loads(
    tmp_path: Path, llama: object
) -> None:
    from linnet.lang.host.run import model_for_weights

    path = write_gguf(tmp_path / "f.gguf", "llama", llama, arch="falcon")
    with pytest.raises(LinnetError) as info:
        model_for_weights(str(path))
    assert codes(info.value) == ["E0852"]


def test_load_without_a_model_or_an_architecture_is_E0857(tmp_path: Path) -> None:
    from linnet.lang.host.run import model_for_weights

    bare = tmp_path / "w.safetensors"  # no config.json beside it
    bare.write_bytes(b"")
    for weights in (str(bare), None, {"w": 1}):
        with pytest.raises(LinnetError) as info:
            model_for_weights(weights)
        assert codes(info.value) == ["E0857"]


# ---------------------------------------------------------------- tokenizers


def test_an_unknown_pre_tokenizer_is_E0858(tmp_path: Path, llama: object) -> None:
    from linnet.lang.weights.gguf_tokenizer import tokenizer_parts

    path = write_gguf(
        tmp_path / "t.gguf", "llama", llama, meta={"tokenizer.ggml.pre": "mystery-bpe"}
    )
    with pytest.raises(LinnetError) as info:
        tokenizer_parts(path)
    assert codes(info.value) == ["E0858"] and "mystery-bpe" in str(info.value)


def test_a_file_without_a_tokenizer_is_E0858(tmp_path: Path, llama: object) -> None:
    from linnet.lang.weights.gguf_tokenizer import tokenizer_parts

    path = write_gguf(tmp_path / "t.gguf", "llama", llama, tokenizer=False)
    with pytest.raises(LinnetError) as info:
        tokenizer_parts(path)
    assert codes(info.value) == ["E0858"]


def test_an_eos_id_past_the_vocabulary_is_E0858(tmp_path: Path, llama: object) -> None:
    from linnet.lang.weights.gguf_tokenizer import tokenizer_parts

    path = write_gguf(
        tmp_path / "t.gguf", "llama", llama, meta={"tokenizer.ggml.eos_token_id": 10_000}
    )
    with pytest.raises(LinnetError) as info:
        tokenizer_parts(path)
    assert codes(info.value) == ["E0858"]


def test_a_null_config_value_is_the_mapping_s_null_not_its_default() -> None:
    # A Hugging Face Mistral with `"sliding_window": null` attends to every token; the
    # mapping's default (4096, MistralConfig's) used to apply instead: a silent window.
    from linnet.lang.syntax.program import STD_ROOT
    from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping

    mapping = read_mapping(STD_ROOT / "models" / "mistral.linnet")
    hf = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "num_attention_heads": 4,
        "sliding_window": None,
    }
    assert checkpoint_config(hf, mapping, "Mistral").values["sliding_window"] == 0
    del hf["sliding_window"]
    assert checkpoint_config(hf, mapping, "Mistral").values["sliding_window"] == 4096


def _corpus(count: int = 200) -> list[str]:
    import random

    rng = random.Random(0)
    base = [
        "Hello, world!",
        "  leading spaces",
        "tabs\tand\nnewlines\n\n",
        "emoji 😀🎉",
        "日本語のテキスト",
        "中文字符",
        "12345 67 8.9",
        "<|im_start|>user\nhi<|im_end|>\n",
        "don't won't I'm",
        "   ",
        "\n",
        "Ünïcödé",
        "x = f(y) + 3 * z**2",
        "the theme",
    ]
    alphabet = list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,!?'\"\n\t-_😀日本éü<|>")
    return base + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        for _ in range(count - len(base))
    ]


def _tokenizer_file(tmp_path: Path, kind: str, llama: object) -> Path:
    """A small real tokenizer: byte-level BPE (every byte, a few merges) or SentencePiece BPE
    (pieces with scores, byte fallback tokens)."""
    if kind == "gpt2":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        chars = list(bytes_to_unicode().values())
        merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġt h", "Ġth e"]
        merged = [m.replace(" ", "") for m in merges]
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *chars, *dict.fromkeys(merged)]
        meta = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        }
    else:
        pieces = [
            "▁",
            *"abcdefghijklmnopqrstuvwxyzABCXYZ0123456789.,!?'",
            "▁t",
            "he",
            "▁the",
            "in",
            "▁a",
            "er",
            "on",
            "▁th",
            "▁i",
            "ing",
        ]
        tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces]
        types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
        scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
        meta = {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.unknown_token_id": 0,
        }
    meta.update({"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2})
    return write_gguf(tmp_path / f"{kind}.gguf", "llama", llama, tokenizer=False, meta=meta)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_tokenizer_matches_transformers_gguf_tokenizer(
    tmp_path: Path, llama: object, kind: str
) -> None:
    from linnet.lang.weights.gguf_tokenizer import tokenizer_parts
    from transformers import AutoTokenizer

    path = _tokenizer_file(tmp_path, kind, llama)
    parts = tokenizer_parts(path)
    assert set(parts) == {
        "backend",
        "bos_token_id",
        "eos_token_ids",
        "chat_template",
        "add_bos_token",
        "add_eos_token",
        "name",
    }
    assert (parts["bos_token_id"], parts["eos_token_ids"]) == (1, [2])
    assert parts["add_bos_token"] is (kind == "llama")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in _corpus():
        ids = parts["backend"].encode(text, add_special_tokens=False).ids
        if kind == "llama" and text[:1].isspace():
            # SentencePiece (and llama.cpp) put `▁` before the text even where it starts with
            # a space; transformers' GGUF conversion does not (its Metaspace "first").
            assert ids[0] == parts["backend"].token_to_id("▁")
            continue
        assert ids == reference(text, add_special_tokens=False).input_ids, text
        decoded = parts["backend"].decode(ids, skip_special_tokens=False)
        assert decoded == reference.decode(ids, skip_special_tokens=False), text
        if kind == "gpt2":  # byte-level: every string round-trips
            assert decoded == text


def test_merges_naming_pieces_the_vocabulary_lacks_are_E0858(tmp_path: Path, llama: object) -> None:
    from linnet.lang.weights.gguf_tokenizer import tokenizer_parts

    path = write_gguf(
        tmp_path / "m.gguf", "llama", llama, meta={"tokenizer.ggml.merges": ["q z", "qz w"]}
    )
    with pytest.raises(LinnetError) as info:  # was a bare Exception from tokenizers
        tokenizer_parts(path)
    assert codes(info.value) == ["E0858"]
