"""The pure-Python parts of checkpoint loading: shard resolution, header and index checks,
config.json through a model's mapping. Every bad input is a LinnetError, never a traceback.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError
from linnet.lang.weights.checkpoint import (
    CheckpointConfig,
    check_dims,
    checkpoint_config,
    merge_config,
    read_checkpoint_config,
    read_mapping,
    validate_mapping,
)
from linnet.lang.weights.safetensors import (
    checkpoint_shapes,
    resolve_checkpoint,
    safetensors_shapes,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
MAPPING = read_mapping(LLAMA)
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
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], str]]) -> None:
    header, offset = {}, 0
    for name, (shape, dtype) in tensors.items():
        size = {"F32": 4, "BF16": 2}[dtype]
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_llama31_config():
    cfg = checkpoint_config(HF, MAPPING, "Llama")
    assert cfg.values == {
        "H": 4,
        "KV": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "rope_llama3": True,
        "rope_factor": 8.0,
        "rope_low_freq_factor": 1.0,
        "rope_high_freq_factor": 4.0,
        "rope_original_max_positions": 8192,
    }
    assert cfg.runtime == {"S": 4096}  # max_position_embeddings capped: a runtime choice
    assert cfg.checks == {"V": 256, "D": 64, "F": 128, "NL": 2, "HD": 16}
    assert merge_config({"S": 65536}, cfg)["S"] == 65536


LLAMA_31_8B = """{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
}"""


def test_a_real_llama_31_config(tmp_path):
    (tmp_path / "config.json").write_text(LLAMA_31_8B)
    cfg = read_checkpoint_config(tmp_path / "config.json", LLAMA, "Llama")
    assert cfg.values["rope_llama3"] is True and cfg.values["rope_factor"] == 8.0
    assert (cfg.values["H"], cfg.values["KV"], cfg.runtime["S"]) == (32, 8, 4096)
    assert cfg.checks == {"V": 128256, "D": 4096, "F": 14336, "NL": 32}


def test_transformers_defaults_for_absent_keys():
    hf = {
        k: v
        for k, v in HF.items()
        if k not in ("rope_theta", "rms_norm_eps", "num_key_value_heads", "rope_scaling")
    }
    cfg = checkpoint_config(hf, MAPPING, "Llama")
    assert cfg.values["rope_theta"] == 10000.0 and cfg.values["rms_norm_eps"] == 1e-6
    assert cfg.values["KV"] == 4  # num_key_value_heads defaults to the heads
    assert "rope_llama3" not in cfg.values


def test_rope_without_original_max_falls_back_to_max_positions():
    rope = {k: v for k, v in HF["rope_scaling"].items() if k != "original_max_position_embeddings"}
    cfg = checkpoint_config({**HF, "rope_scaling": rope}, MAPPING, "Llama")
    assert cfg.values["rope_original_max_positions"] == 131072


@pytest.mark.parametrize(
    "change,code",
    [
        ({"architectures": ["Qwen2ForCausalLM"]}, "E0654"),
        ({"model_type": "mistral"}, "E0654"),
        ({"logit_softcap": 30.0}, "E0655"),
        ({"hidden_act": "gelu"}, "E0656"),
        ({"mlp_bias": True}, "E0656"),
        # yarn is implemented (issue 45); `su`, Phi-3's older name for longrope, is not Llama's.
        ({"rope_scaling": {"rope_type": "su", "factor": 4.0}}, "E0657"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "E0671"),  # YaRN needs its factor
        ({"rope_scaling": {"type": "longrope", "factor": 4.0}}, "E0657"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": "8"}}, "E0671"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 32}}, "E0655"),
        ({"rope_scaling": 8.0}, "E0671"),
        ({"rope_parameters": {"rope_type": "default"}}, "E0656"),
        ({"num_attention_heads": "4"}, "E0671"),
        ({"hidden_size": 0}, "E0671"),
        ({"num_hidden_layers": 10**400}, "E0671"),
        ({"max_position_embeddings": True}, "E0671"),
        ({"rms_norm_eps": float("nan")}, "E0671"),
    ],
)
def test_config_json_mistakes(change, code):
    with pytest.raises(LinnetError) as err:
        checkpoint_config({**HF, **change}, MAPPING, "Llama")
    assert code in [d.code for d in err.value.diagnostics]


def test_contradictions_name_both_sources():
    cfg = checkpoint_config(HF, MAPPING, "Llama")
    with pytest.raises(LinnetError) as err:
        merge_config({"H": 8, "S": 16}, cfg)
    d = err.value.diagnostics[0]
    assert d.code == "E0659" and "config=" in d.message and "num_attention_heads" in d.message
    with pytest.raises(LinnetError) as err:
        check_dims(cfg, {"D": 32, "V": 256})
    assert [d.code for d in err.value.diagnostics] == ["E0658"]
    assert "hidden_size = 64" in err.value.diagnostics[0].message
    check_dims(cfg, {"D": 64, "V": 256, "B": 1})  # agreeing dims pass


def test_spans_point_into_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "rope_scaling": {"rope_type": "su"}}, indent=2))
    with pytest.raises(LinnetError) as err:
        read_checkpoint_config(path, LLAMA, "Llama")
    d = err.value.diagnostics[0]
    assert d.span is not None and d.span.source.text[d.span.start : d.span.stop] == '"rope_type"'


@pytest.mark.parametrize(
    "mapping",
    [
        {"set": {"H": 4}},
        {"sets": {}},
        {"ignore": "x"},
        {"require": {"a": True}},
        {"rope": []},
        {"check": {"D": {"key": "a", "typo": 1}}},
    ],
)
def test_bad_mappings(mapping):
    with pytest.raises(LinnetError) as err:
        validate_mapping(mapping)
    assert {d.code for d in err.value.diagnostics} == {"E0653"}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(HF), "rope_parameters", "x"]), JSON, max_size=6))
def test_any_config_json_is_a_config_or_a_coded_error(changes):
    try:
        cfg = checkpoint_config({**HF, **changes}, MAPPING, "Llama")
    except LinnetError as err:
        assert all(d.code.startswith("E06") for d in err.diagnostics)
        return
    assert isinstance(cfg, CheckpointConfig)


# ---------------------------------------------------------------- shards and indexes


def test_directory_index_and_list(tmp_path):
    write_safetensors(tmp_path / "a.safetensors", {"x": ([2, 3], "F32")})
    write_safetensors(tmp_path / "b.safetensors", {"y": ([4], "BF16")})
    shapes = safetensors_shapes(tmp_path)
    assert shapes == {"x": ((2, 3), "f32"), "y": ((4,), "bf16")}
    assert shapes["y"].shard == "b.safetensors"
    index = {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert resolve_checkpoint(tmp_path).index is not None
    assert safetensors_shapes(tmp_path) == shapes
    assert safetensors_shapes([tmp_path / "a.safetensors"]) == {"x": ((2, 3), "f32")}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(index=JSON, header=st.binary(max_size=64))
def test_any_index_or_header_is_read_or_a_coded_error(tmp_path, index, header):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "a.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    try:
        checkpoint_shapes(resolve_checkpoint(tmp_path))
    except LinnetError as err:
        assert all(
            d.code in ("E0634", "E0635", "E0636", "E0637", "E0650", "E0651", "E0723")
            for d in err.diagnostics
        )


@pytest.mark.parametrize("bad", [3, None, b"x", [], [3], {"a": 1}, 2.5])
def test_weights_values_that_are_not_checkpoints(bad):
    with pytest.raises(LinnetError) as err:
        resolve_checkpoint(bad)
    assert err.value.diagnostics[0].code == "E0639"
