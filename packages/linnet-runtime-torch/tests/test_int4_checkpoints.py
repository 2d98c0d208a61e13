"""GPTQ and AWQ int4 checkpoints (issue 42, "where quantised weights come from"): linear
weights packed eight 4-bit levels to an int32 with per-group f16 scales and packed zeros
load dequantised, in both runtimes: the model holds exactly the weights a checkpoint of the
dequantised values gives. The packers here follow the formats as AutoGPTQ / GPTQModel
(``gptq``, ``gptq_v2``, act-order ``g_idx``) and AutoAWQ (GEMM: outputs interleaved 0, 2, 4,
6, 1, 3, 5, 7) write them; mismatched tensors are E0694, 8-bit GPTQ E0692."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from linnet.lang import LinnetError
from linnet.torch import load
from safetensors.torch import load_file, save_file
from support import HF_LINEARS, save_hf_checkpoint, saved_hf_llama

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
)
GROUP = 16
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
FORMATS = {
    "gptq": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": GROUP,
        "desc_act": False,
        "sym": True,
    },
    "gptq-act-order": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True},
    "gptq-v2": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": GROUP,
        "checkpoint_format": "gptq_v2",
    },
    "awq": {
        "quant_method": "awq",
        "bits": 4,
        "group_size": GROUP,
        "zero_point": True,
        "version": "gemm",
    },
}


def _pack_rows(levels: np.ndarray) -> np.ndarray:
    """[R, C] 4-bit values -> [R / 8, C] int32, row 8j + k in bits 4k (GPTQ's qweight)."""
    r, c = levels.shape
    out = np.zeros((r // 8, c), np.uint32)
    for k in range(8):
        out |= levels[k::8].astype(np.uint32) << np.uint32(4 * k)
    return out.view(np.int32)


def _pack_columns(levels: np.ndarray, order=range(8)) -> np.ndarray:
    """[R, C] 4-bit values -> [R, C / 8] int32, column 8j + order[k] in bits 4k."""
    r, c = levels.shape
    out = np.zeros((r, c // 8), np.uint32)
    for k, o in enumerate(order):
        out |= levels[:, o::8].astype(np.uint32) << np.uint32(4 * k)
    return out.view(np.int32)


def _quantised(w: np.ndarray, fmt: str, rng: np.random.Generator):
    """Random levels, zeros and scales for an [O, I] weight's shape, packed as ``fmt``, and
    the [O, I] float32 weight they mean."""
    o, i = w.shape
    groups = i // GROUP
    levels = rng.integers(0, 16, (i, o))  # [I, O], as both formats index them
    zeros = rng.integers(0, 16, (groups, o)) if fmt != "gptq" else np.full((groups, o), 8)
    scales = (rng.random((groups, o)) * 0.02 + 0.005).astype(np.float16)
    g_idx = np.arange(i) // GROUP
    if fmt == "gptq-act-order":
        g_idx = rng.permutation(g_idx)
    value = (levels - zeros[g_idx]).astype(np.float32) * scales.astype(np.float32)[g_idx]
    if fmt == "awq":
        packed = {
            "qweight": _pack_columns(levels, AWQ_ORDER),
            "qzeros": _pack_columns(zeros, AWQ_ORDER),
            "scales": scales,
        }
    else:
        stored = zeros - 1 if fmt != "gptq-v2" else zeros  # v1 stores zero - 1
        packed = {
            "qweight": _pack_rows(levels),
            "qzeros": _pack_columns(stored & 15),
            "scales": scales,
            "g_idx": g_idx.astype(np.int32),
        }
    return packed, np.ascontiguousarray(value.T)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A random Llama saved by transformers in float32, then for each format its packed
    directory and a directory of the values the packed tensors mean (the reference)."""
    tensors, config = saved_hf_llama(tmp_path_factory.mktemp("f32"), **SMALL)
    rng = np.random.default_rng(0)
    out = {}
    for fmt, quant in FORMATS.items():
        packed, ref = {}, {}
        for name, w in tensors.items():
            if not any(f"{lin}.weight" in name for lin in HF_LINEARS):
                packed[name] = ref[name] = w
                continue
            parts, value = _quantised(w.numpy(), fmt, rng)
            layer = name.removesuffix("weight")
            packed.update({layer + k: torch.from_numpy(v) for k, v in parts.items()})
            ref[name] = torch.from_numpy(value)
        for kind, ts, cfg in (
            ("q", packed, {**config, "quantization_config": quant}),
            ("ref", ref, config),
        ):
            out[f"{fmt}-{kind}"] = save_hf_checkpoint(
                tmp_path_factory.mktemp(f"{fmt}-{kind}"), ts, cfg
            )
    return out


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_packed_int4_checkpoint_loads_as_its_dequantised_values(saved, fmt):
    q, ref = load(weights=saved[f"{fmt}-q"]), load(weights=saved[f"{fmt}-ref"])
    assert q.params.keys() == ref.params.keys()  # no qzeros, scales or g_idx parameters
    for name, p in ref.params.items():
        assert q.params[name].dtype == p.dtype
        assert torch.equal(q.params[name], p), name
    tokens = torch.tensor([[3, 17, 5, 60, 2, 9]], dtype=torch.int32)
    assert torch.equal(q.prefill(tokens), ref.prefill(tokens))


def test_the_jax_runtime_reads_packed_int4_checkpoints_alike(saved):
    pytest.importorskip("linnet.jax")
    from linnet.jax import load as jload

    for fmt in FORMATS:
        q, ref = jload(weights=saved[f"{fmt}-q"]), jload(weights=saved[f"{fmt}-ref"])
        assert q.params.keys() == ref.params.keys()
        for name, p in ref.params.items():
            assert np.array_equal(np.asarray(q.params[name]), np.asarray(p)), (fmt, name)


def test_a_packed_int4_checkpoint_quantises_again_on_load(saved):
    q = load(weights=saved["awq-q"], quantize={"format": "int4", "group": GROUP})
    ref = load(weights=saved["awq-ref"], quantize={"format": "int4", "group": GROUP})
    assert any(k.endswith("weight_q4") for k in q.params)
    assert all(torch.equal(q.params[k], v) for k, v in ref.params.items())


def _rewrite(src: Path, dst: Path, change=None, config=None) -> Path:
    dst.mkdir()
    tensors = load_file(src / "model.safetensors")
    if change:
        change(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    if config:
        cfg["quantization_config"].update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_mismatched_packed_tensors_are_E0694(saved, tmp_path):
    layer = "model.layers.0.mlp.down_proj."

    def drop_zeros(t):
        del t[layer + "qzeros"]

    def bad_group(t):
        t[layer + "g_idx"][5] = 99

    for why, change, said in (
        ("zeros", drop_zeros, f"has no `{layer}qzeros`"),
        ("g_idx", bad_group, "g_idx gives input 5 group 99 of 3"),
    ):
        d = _rewrite(saved["gptq-q"], tmp_path / why, change)
        with pytest.raises(LinnetError) as err:
            load(weights=d)
        codes = [x.code for x in err.value.diagnostics]
        assert "E0694" in codes and any(said in x.message for x in err.value.diagnostics), (
            why,
            str(err.value),
        )


def test_eight_bit_gptq_is_E0692(saved, tmp_path):
    d = _rewrite(saved["gptq-q"], tmp_path / "bits8", config={"bits": 8})
    with pytest.raises(LinnetError) as err:
        load(weights=d)
    (diag,) = [x for x in err.value.diagnostics if x.code == "E0692"]
    assert "gptq with bits 8" in diag.message
