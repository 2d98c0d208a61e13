"""Adversarial suite (issue 38, items 7, 16, 17, 18, 20): checkpoints as users bring them.

Bad values in config.json that used to run (silent wrong results: a negative epsilon gives
NaN logits, a zero rope theta other logits), every dtype the safetensors format defines
(a valid float8 file used to be reported as corrupt), the metadata transformers writes into
every config.json (refused as unmodelled keys), a user's own model whose names are the
checkpoint's (refused for want of a mapping file), and the demo checkpoint every runtime
shares (byte-identical, made without torch or jax). Pure Python: no runtime is needed.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError
from linnet.lang.syntax.program import STD_ROOT
from linnet.lang.weights.checkpoint import (
    checkpoint_config,
    read_checkpoint_config,
    read_mapping,
    validate_mapping,
)
from linnet.lang.weights.rules import PRETRAINED_CONFIG_IGNORE, parse_rule
from linnet.lang.weights.safetensors import (
    UNSUPPORTED_DTYPES,
    checkpoint_shapes,
    resolve_checkpoint,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
FAMILIES = ["llama", "qwen2", "mistral", "gemma", "phi3", "gpt2"]
MAPPINGS = {name: read_mapping(STD_ROOT / "models" / f"{name}.linnet") for name in FAMILIES}
HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def codes(hf: dict, mapping: dict | None = None) -> list[str]:
    try:
        checkpoint_config(hf, mapping or MAPPINGS["llama"], "Llama")
    except LinnetError as err:
        return [d.code for d in err.diagnostics]
    return []


# ---------------------------------------------------------------- item 7: value ranges
# Each ran before (NaN or other logits, or a model of another shape): silent wrong results.
OUT_OF_RANGE = [
    ({"rms_norm_eps": -1}, "rms_norm_eps"),
    ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ({"rms_norm_eps": 2.0}, "rms_norm_eps"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters.rope_theta"),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": -10000.0}},
        "rope_parameters.rope_theta",
    ),
    ({"rope_parameters": None, "rope_theta": -1.0}, "rope_theta"),
    (
        {"rope_parameters": None, "rope_scaling": {"rope_type": "linear", "factor": 0.0}},
        "rope_scaling.factor",
    ),
    (
        {"rope_parameters": {"rope_type": "dynamic", "factor": -2.0, "rope_theta": 1e4}},
        "rope_parameters.factor",
    ),
    ({"rope_parameters": {**LLAMA3, "low_freq_factor": 4.0}}, "rope_parameters.low_freq_factor"),
    ({"rope_parameters": {**LLAMA3, "high_freq_factor": 0.0}}, "rope_parameters.high_freq_factor"),
    (
        {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 0}},
        "rope_parameters.original_max_position_embeddings",
    ),
    ({"num_key_value_heads": 3}, "num_attention_heads"),  # 4 heads over 3 groups
    ({"num_key_value_heads": 8}, "num_key_value_heads"),  # more KV heads than heads
    ({"num_attention_heads": 5000, "num_key_value_heads": 1}, "num_attention_heads"),
    ({"num_hidden_layers": 5000}, "num_hidden_layers"),
    ({"hidden_size": 2**40}, "hidden_size"),
    ({"bos_token_id": 256}, "bos_token_id"),  # the vocabulary is 0..255
    ({"eos_token_id": [2, 999]}, "eos_token_id"),
    ({"pad_token_id": -2}, "pad_token_id"),
    ({"eos_token_id": -1}, "eos_token_id"),
    ({"unk_token_id": 300}, "unk_token_id"),
]


@pytest.mark.parametrize("change,key", OUT_OF_RANGE, ids=[k for _, k in OUT_OF_RANGE])
def test_values_out_of_range_are_coded(change, key):
    hf = {k: v for k, v in {**HF, **change}.items() if v is not None}
    with pytest.raises(LinnetError) as err:
        checkpoint_config(hf, MAPPINGS["llama"], "Llama", name="config.json")
    assert {x.code for x in err.value.diagnostics} == {"E0665"}
    # Names the file, the key, the value and the valid range (a value breaking two rules,
    # more KV heads than heads, say, is reported by both).
    d = next(x for x in err.value.diagnostics if x.message.startswith(f"config.json's `{key}` is "))
    assert "valid range" in d.message or "multiple of" in d.message
    assert "Llama" in d.help


@pytest.mark.parametrize(
    "change",
    [
        {"num_attention_heads": 4.0},
        {"tie_word_embeddings": 3},
        {"rms_norm_eps": "1e-5"},
        {"bos_token_id": 1.5},
        {"eos_token_id": ["2"]},
        {"vocab_size": 0},
    ],
)
def test_values_of_the_wrong_kind_are_E0671(change):
    assert codes({**HF, **change}) == ["E0671"]


def test_values_in_range_run_and_bounds_name_other_keys():
    assert codes(HF) == []
    assert codes({**HF, "rope_parameters": LLAMA3, "eos_token_id": [1, 2, 255]}) == []
    # A bound naming an absent key is not checked (no vocab_size: the token ids' upper bound).
    assert codes({k: v for k, v in HF.items() if k != "vocab_size"} | {"bos_token_id": 10**6}) == []


def test_the_message_shows_the_value_and_the_range(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "rms_norm_eps": -1, "bos_token_id": 300}, indent=2))
    with pytest.raises(LinnetError) as err:
        read_checkpoint_config(path, LLAMA, "Llama")
    eps, bos = err.value.diagnostics
    assert eps.message == "config.json's `rms_norm_eps` is -1, outside its valid range (0, 1]"
    assert bos.message == (
        "config.json's `bos_token_id` is 300, outside its valid range "
        "int [0, vocab_size) (vocab_size = 256)"
    )
    assert eps.span.source.text[eps.span.start : eps.span.stop] == '"rms_norm_eps"'
    assert eps.label == "valid: (0, 1]"


def _read_keys(mapping: dict) -> set[str]:
    """The config.json keys a mapping reads into the model's config (not the metadata)."""
    keys: set[str] = set()
    for section in ("set", "check", "runtime"):
        for spec in mapping.get(section, {}).values():
            spec = {"key": spec} if isinstance(spec, str) else spec
            keys.update([spec["key"]] if isinstance(spec["key"], str) else spec["key"])
            if "else" in spec:
                keys.add(spec["else"])
    return {k for k in keys if "." not in k}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_key_a_shipped_mapping_reads_has_a_range(name):
    """One rule per key, in the mapping: every value a shipped model reads is checked."""
    mapping = MAPPINGS[name]
    assert _read_keys(mapping) <= set(mapping["ranges"]), name
    rope = mapping.get("rope")
    if rope:
        reads = {v for t in rope["types"].values() for v in t.values() if isinstance(v, str)}
        assert reads | {"rope_theta"} <= set(rope["ranges"]), name
    validate_mapping(mapping, name)


def test_the_example_mapping_is_the_shipped_llama_mapping():
    example = json.loads((ROOT / "examples" / "llama" / "llama.hf.json").read_text())
    shipped = dict(MAPPINGS["llama"])
    assert {k: v for k, v in example.items() if k != "_comment"} == {
        k: v for k, v in shipped.items() if k != "_comment"
    }


@pytest.mark.parametrize("rule", ["(0, 1", "[a b]", "int", "(0, 1] multiple", 3, "[1, 2] or 3"])
def test_a_bad_rule_in_a_mapping_is_E0653(rule):
    with pytest.raises(LinnetError) as err:
        validate_mapping({"ranges": {"x": rule}})
    assert [d.code for d in err.value.diagnostics] == ["E0653"]
    with pytest.raises(LinnetError):
        validate_mapping({"rope": {"ranges": {"factor": rule}}})


def test_rules():
    rule = parse_rule("int [1, num_attention_heads] ")
    assert rule.check(2, {"num_attention_heads": 4}) is None
    assert "num_attention_heads = 4" in rule.check(5, {"num_attention_heads": 4})
    assert parse_rule("(-inf, 0)").check(-1e300, {}) is None
    assert parse_rule("(0, inf)").kind_error(math.inf) == "not a finite number"
    assert parse_rule("bool").kind_error(1) == "not true or false"
    assert parse_rule("[0.5, 1e3] multiple of g").check(6, {"g": 4}) == "not a multiple of `g` (4)"


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([*sorted(MAPPINGS["llama"]["ranges"]), "bos_token_id", "eos_token_id"]),
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.booleans(),
        st.none(),
        st.text(max_size=3),
        st.lists(st.integers(-5, 300), max_size=3),
    ),
)
def test_any_value_of_a_ranged_key_runs_only_in_range(key, value):
    """A value either satisfies its key's rule or is E0665/E0671 (or another coded error
    the other sections give): never silently read."""
    hf = {**HF, key: value}
    found = codes(hf)
    if key in MAPPINGS["llama"]["ranges"] or key.endswith("token_id"):
        rule = parse_rule(MAPPINGS["llama"]["ranges"].get(key, "int [0, vocab_size)"))
        items = value if isinstance(value, list) and rule.kind != "bool" else [value]
        ok = value is None or all(
            rule.kind_error(v) is None and rule.check(v, hf) is None for v in items
        )
        if not ok:
            assert found and set(found) <= {"E0665", "E0671", "E0613"}, (key, value, found)
    assert all(c.startswith("E06") for c in found)


# ---------------------------------------------------------------- item 17: metadata keys
def test_transformers_metadata_and_underscore_keys_are_ignored():
    hub = {
        **HF,
        "_name_or_path": "meta-llama/Llama-3.2-1B",
        "_model_name_or_path": "x",
        "_commit_hash": "abc",
        "_attn_implementation_autoset": True,
        "unk_token_id": 0,
        "pad_token_id": -1,  # older hub configs say "no pad token" so
        "torchscript": False,
        "use_bfloat16": False,
        "tf_legacy_loss": False,
        "pruned_heads": {},
        "is_decoder": False,
        "temperature": 0.6,
        "top_p": 0.9,
        "max_length": 4096,
        "do_sample": True,
        "num_beams": 1,
        "output_attentions": False,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
        "use_cache": True,
        "tokenizer_class": "LlamaTokenizer",
        "initializer_range": 0.02,
    }
    for name in ("llama", "qwen2", "mistral", "gemma", "phi3"):
        hf = {
            **hub,
            "architectures": MAPPINGS[name]["architectures"],
            "model_type": MAPPINGS[name]["model_types"][0],
        }
        if name == "gemma":
            hf["hidden_act"] = "gelu_pytorch_tanh"
        if name in ("qwen2", "phi3"):
            hf.pop("head_dim")  # they have no head_dim key
        assert codes(hf, MAPPINGS[name]) == [], name


@pytest.mark.parametrize(
    "change,code",
    [
        # float8, GPTQ and AWQ weights load dequantised; other methods are refused
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "E0692"),
        ({"logit_softcap": 30.0}, "E0655"),
        ({"pruned_heads": {"0": [1]}}, "E0656"),
        ({"per_layer_config": {"0": {"num_attention_heads": 2}}}, "E0655"),
    ],
)
def test_keys_that_change_the_math_stay_errors(change, code):
    mapping = dict(MAPPINGS["qwen2"])
    hf = {**HF, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **change}
    hf.pop("head_dim")
    mapping_codes = codes(hf, mapping)
    assert code in mapping_codes, mapping_codes


def test_metadata_lists_hold_no_key_a_mapping_reads():
    for name, mapping in MAPPINGS.items():
        assert not _read_keys(mapping) & PRETRAINED_CONFIG_IGNORE, name
        assert not set(mapping["ignore"]) & PRETRAINED_CONFIG_IGNORE, name  # one place each


# ---------------------------------------------------------------- item 16: dtypes
def header_file(path: Path, dtype: str, shape: list[int], nbytes: int) -> Path:
    header = {"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * nbytes)
    return path


READ = {
    "F64": 64,
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "I64": 64,
    "I32": 32,
    "I16": 16,
    "I8": 8,
    "U8": 8,
    "BOOL": 8,
}


@pytest.mark.parametrize("dtype", sorted(READ))
def test_every_read_dtype_is_read(tmp_path, dtype):
    path = header_file(tmp_path / "a.safetensors", dtype, [2, 4], 8 * READ[dtype] // 8)
    assert checkpoint_shapes(resolve_checkpoint(path))["x"][0] == (2, 4)


@pytest.mark.parametrize("dtype", sorted(UNSUPPORTED_DTYPES))
def test_every_other_dtype_of_the_format_is_unsupported_not_corrupt(tmp_path, dtype):
    bits = UNSUPPORTED_DTYPES[dtype][0]
    path = header_file(tmp_path / "a.safetensors", dtype, [2, 4], 8 * bits // 8)
    with pytest.raises(LinnetError) as err:
        checkpoint_shapes(resolve_checkpoint(path))
    d = err.value.diagnostics[0]
    assert d.code == "E0723" and dtype in d.message and "`x`" in d.message
    # A truncated file of that dtype is still corrupt.
    cut = header_file(tmp_path / "b.safetensors", dtype, [2, 4], 8 * bits // 8 - 1)
    with pytest.raises(LinnetError) as err:
        checkpoint_shapes(resolve_checkpoint(cut))
    assert err.value.diagnostics[0].code == "E0650"


def test_the_dtype_list_is_the_format_s():
    """Every dtype safetensors' own reader accepts is read or named as unsupported (the
    reader's error lists its dtypes when given an unknown one)."""
    safe_open = pytest.importorskip("safetensors").safe_open
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = header_file(Path(tmp) / "a.safetensors", "NOPE", [1], 1)
        with pytest.raises(Exception) as err:
            safe_open(str(path), "np")
    listed = set(re.findall(r"`([A-Z0-9_]+)`", str(err.value)))
    assert listed and listed - {"NOPE"} == set(READ) | set(UNSUPPORTED_DTYPES)


@pytest.mark.parametrize(
    "dtype,shape,nbytes", [("F4", [3], 2), ("F6_E2M3", [3], 3), ("F7", [1], 1), ("f32", [1], 4)]
)
def test_sub_byte_ends_and_unknown_dtypes_are_corrupt(tmp_path, dtype, shape, nbytes):
    path = header_file(tmp_path / "a.safetensors", dtype, shape, nbytes)
    with pytest.raises(LinnetError) as err:
        checkpoint_shapes(resolve_checkpoint(path))
    assert err.value.diagnostics[0].code == "E0650"


# ---------------------------------------------------------------- item 18: inferred mappings
TINY = """\
use std.nn.linear::{Linear}

pub model Tiny<vocab_size: Dim, hidden_size: Dim, B: Dim, T: DType> {
    config scale: f32 = 1.0
    param embed: Tensor[vocab_size, hidden_size; T]
    block head: Linear<hidden_size, vocab_size, T>

    entry forward(tokens: Tensor[B; i32]) -> Tensor[B, vocab_size; f32] {
        let h[b, d] = self.embed[tokens[b], d] * scale
        return self.head(h) as f32
    }
}
"""


@pytest.fixture
def tiny(tmp_path):
    from linnet.lang import Program

    path = tmp_path / "tiny.linnet"
    path.write_text(TINY)
    return path, Program.from_file(path)


def test_a_mapping_is_inferred_where_names_match(tiny, tmp_path):
    path, program = tiny
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "tiny",
                "vocab_size": 16,
                "hidden_size": 8,
                "scale": 0.5,
                "_name_or_path": "me/tiny",
                "torch_dtype": "float32",
                "bos_token_id": 1,
                "tie_word_embeddings": False,
            }
        )
    )
    cfg = read_checkpoint_config(config, path, "Tiny", program)
    assert cfg.values == {"scale": 0.5}
    assert cfg.checks == {"vocab_size": 16, "hidden_size": 8}
    assert cfg.inferred is not None


@pytest.mark.parametrize(
    "extra,named",
    [
        ({"num_attention_heads": 4}, "`num_attention_heads`"),
        ({"rope_scaling": {"factor": 2.0}}, "`rope_scaling`"),
        ({"scale": {"a": 1}}, "`scale`"),
    ],
)
def test_an_inexact_mapping_is_E0670_naming_the_keys(tiny, tmp_path, extra, named):
    path, program = tiny
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "tiny", "vocab_size": 16, **extra}))
    with pytest.raises(LinnetError) as err:
        read_checkpoint_config(config, path, "Tiny", program)
    d = err.value.diagnostics[0]
    assert d.code == "E0670" and named in d.message and "`scale`" in d.message.split("configs")[1]


def test_without_a_program_a_model_without_a_mapping_is_E0670(tiny, tmp_path):
    path, _ = tiny
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "tiny", "vocab_size": 16}))
    with pytest.raises(LinnetError) as err:
        read_checkpoint_config(config, path, "Tiny")
    assert err.value.diagnostics[0].code == "E0670"


# ---------------------------------------------------------------- item 20: the demo
def test_the_demo_checkpoint_is_byte_identical_and_readable(tmp_path):
    pytest.importorskip("numpy")
    from linnet.lang.weights.demo import write_demo

    config = json.loads((ROOT / "examples" / "llama" / "configs" / "toy.json").read_text())
    config.pop("_comment")
    write_demo(tmp_path / "a.safetensors", LLAMA, config, 0)
    write_demo(tmp_path / "b.safetensors", LLAMA, config, 0)
    write_demo(tmp_path / "c.safetensors", LLAMA, config, 1)
    a = (tmp_path / "a.safetensors").read_bytes()
    assert a == (tmp_path / "b.safetensors").read_bytes()
    assert a != (tmp_path / "c.safetensors").read_bytes()
    shapes = checkpoint_shapes(resolve_checkpoint(tmp_path / "a.safetensors"))
    assert shapes["lm_head.weight"] == ((256, 64), "f32")
    # The safetensors reader agrees with the writer, value for value.
    np = pytest.importorskip("numpy")
    load_file = pytest.importorskip("safetensors.numpy").load_file
    tensors = load_file(str(tmp_path / "a.safetensors"))
    assert set(tensors) == set(shapes)
    assert np.all(tensors["model.norm.weight"] == 1.0)
    assert 0.015 < float(tensors["lm_head.weight"].std()) < 0.025


def test_the_demo_writes_bf16_as_torch_rounds_it(tmp_path):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from linnet.lang.weights.demo import safetensors_bytes
    from safetensors.torch import load as load_bytes

    values = np.array([1.0, -2.5, 3.14159, 1e-8, 65504.0, 0.1, 1.00390625, 1.01171875], np.float32)
    raw = safetensors_bytes({"w": ("bf16", values), "v": ("f16", values)})
    loaded = load_bytes(raw)
    want = torch.from_numpy(values)
    assert torch.equal(loaded["w"], want.to(torch.bfloat16))
    assert torch.equal(loaded["v"], want.to(torch.float16))
