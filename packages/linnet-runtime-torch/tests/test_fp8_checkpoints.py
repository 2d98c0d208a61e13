"""Float8 checkpoints (issue 42, "where quantised weights come from"): linear weights saved as
float8 e4m3 with their scales, one a tensor, one a row or one a block (transformers' `fp8`,
fbgemm's, compressed-tensors' float-quantized), load dequantised, in both runtimes: the model
holds exactly the weights a checkpoint of the dequantised values gives, and computes what it
computes. Another quantisation method is E0692, a scale that fits no layout E0693, a float8
tensor without a scale still E0723."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from linnet.lang import LinnetError
from linnet.lang.weights.fp8 import dequantized, e4m3_table
from linnet.torch import load
from safetensors.torch import load_file, save_file
from support import HF_LINEARS, save_hf_checkpoint, saved_hf_llama

transformers = pytest.importorskip("transformers")

# Dims that blocks of 16 do not divide (40 = 16 + 16 + 8): the last block of each is partial.
SMALL = dict(
    vocab_size=96,
    hidden_size=40,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=10,
    max_position_embeddings=64,
)
# The three layouts of a weight's scales, as the formats save them.
FORMATS = {
    "fp8-blocks": (
        "weight_scale_inv",
        (16, 16),
        {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]},
    ),
    "fbgemm-rows": ("weight_scale", "rows", {"quant_method": "fbgemm_fp8"}),
    "compressed-tensor": (
        "weight_scale",
        "tensor",
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {
                "group_0": {
                    "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                    "targets": ["Linear"],
                }
            },
            "ignore": ["lm_head"],
        },
    ),
}


def _scales(w: torch.Tensor, layout) -> torch.Tensor:
    """Scales mapping each block's largest magnitude to e4m3's 448."""
    a = w.abs()
    if layout == "tensor":
        return (a.max() / 448).reshape(1)
    if layout == "rows":
        return (a.amax(1, keepdim=True) / 448).clamp_min(1e-12)
    br, bc = layout
    rows, cols = w.shape
    grid = torch.zeros(math.ceil(rows / br), math.ceil(cols / bc))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            grid[i, j] = a[i * br : (i + 1) * br, j * bc : (j + 1) * bc].max() / 448
    return grid.clamp_min(1e-12)


def _expand(s: torch.Tensor, shape, layout) -> torch.Tensor:
    if layout == "tensor":
        return s.reshape(())
    if layout == "rows":
        return s
    br, bc = layout
    return s.repeat_interleave(br, 0)[: shape[0]].repeat_interleave(bc, 1)[:, : shape[1]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A random Llama saved by transformers in float32, then for each format its float8
    directory and a directory of the float8 weights' dequantised values (the reference)."""
    base = tmp_path_factory.mktemp("f32")
    tensors, config = saved_hf_llama(base, **SMALL)
    out = {"f32": base}
    for fmt, (suffix, layout, quant) in FORMATS.items():
        fp8, ref = dict(tensors), dict(tensors)
        for name, w in tensors.items():
            if not any(f"{lin}.weight" in name for lin in HF_LINEARS):
                continue
            s = _scales(w, layout)
            q = (w / _expand(s, w.shape, layout)).to(torch.float8_e4m3fn)
            fp8[name] = q
            fp8[name + suffix.removeprefix("weight")] = s
            if fmt == "compressed-tensor":
                fp8[name.removesuffix("weight") + "input_scale"] = torch.ones(1)
            ref[name] = q.to(torch.float32) * _expand(s, w.shape, layout)
        for kind, ts, cfg in (
            ("fp8", fp8, {**config, "quantization_config": quant}),
            ("ref", ref, config),
        ):
            out[f"{fmt}-{kind}"] = save_hf_checkpoint(
                tmp_path_factory.mktemp(f"{fmt}-{kind}"), ts, cfg
            )
    return out


def test_the_e4m3_table_is_torchs_float8_e4m3fn():
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    theirs = bits.view(torch.float8_e4m3fn).to(torch.float32).numpy()
    ours = e4m3_table()
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)])
    assert np.isnan(ours).sum() == 2  # S.1111.111 only: e4m3fn has no infinities


@pytest.mark.parametrize("layout", [(16, 16), (1, 40), (40, 40), (3, 7)])
def test_numpy_and_torch_dequantise_alike(layout):
    from linnet.torch.weights import _fp8

    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 256, (40, 40), generator=g, dtype=torch.int32).to(torch.uint8)
    bits[bits & 0x7F == 0x7F] = 0  # no NaN
    grid = (math.ceil(40 / layout[0]), math.ceil(40 / layout[1]))
    scale = torch.rand(grid, generator=g) + 0.5
    got = _fp8(bits.view(torch.float8_e4m3fn), scale, layout).numpy()
    want = dequantized(bits.numpy(), scale.numpy(), layout)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_float8_checkpoint_loads_as_its_dequantised_values(saved, fmt):
    fp8, ref = load(weights=saved[f"{fmt}-fp8"]), load(weights=saved[f"{fmt}-ref"])
    assert fp8.params.keys() == ref.params.keys()  # no scale became a parameter
    for name, p in ref.params.items():
        assert fp8.params[name].dtype == p.dtype == torch.float32
        assert torch.equal(fp8.params[name], p), name
    tokens = torch.tensor([[3, 17, 5, 60, 2, 9]], dtype=torch.int32)
    assert torch.equal(fp8.prefill(tokens), ref.prefill(tokens))
    # The float8 weights are near the float32 ones they were made from (448 levels a block).
    f32 = load(weights=saved["f32"])
    err = (fp8.prefill(tokens) - f32.prefill(tokens)).abs().max()
    assert 0 < err < 0.1


def test_a_float8_checkpoint_quantises_on_load_as_its_values_do(saved):
    quantize = {"format": "int8", "group": 8}  # 8 divides 40 and 56
    fp8 = load(weights=saved["fp8-blocks-fp8"], quantize=quantize)
    ref = load(weights=saved["fp8-blocks-ref"], quantize=quantize)
    assert any(k.endswith("weight_q8") for k in fp8.params)
    assert fp8.params.keys() == ref.params.keys()
    assert all(torch.equal(fp8.params[k], v) for k, v in ref.params.items())


def test_a_float8_checkpoint_loads_in_bf16(saved):
    fp8 = load(weights=saved["fbgemm-rows-fp8"], dtype=torch.bfloat16)
    ref = load(weights=saved["fbgemm-rows-ref"], dtype=torch.bfloat16)
    assert all(torch.equal(fp8.params[k], v) for k, v in ref.params.items())


def test_the_jax_runtime_reads_float8_checkpoints_alike(saved):
    pytest.importorskip("linnet.jax")
    from linnet.jax import load as jload

    for fmt in FORMATS:
        fp8, ref = jload(weights=saved[f"{fmt}-fp8"]), jload(weights=saved[f"{fmt}-ref"])
        assert fp8.params.keys() == ref.params.keys()
        for name, p in ref.params.items():
            assert np.array_equal(np.asarray(fp8.params[name]), np.asarray(p)), (fmt, name)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_another_quantisation_method_is_E0692(saved, tmp_path):
    d = _copy(saved["f32"], tmp_path / "bnb")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LinnetError) as err:
        load(weights=d)
    (diag,) = [x for x in err.value.diagnostics if x.code == "E0692"]
    assert "quantised with `bitsandbytes`" in diag.message and "quantize='int8'" in diag.help
    assert "Traceback" not in str(err.value)


def test_a_scale_that_fits_no_layout_is_E0693(saved, tmp_path):
    d = _copy(saved["fp8-blocks-fp8"], tmp_path / "bad")
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    tensors[name] = torch.ones(3, 4, 2)  # a scale of three dims
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LinnetError) as err:
        load(weights=d)
    (diag,) = [x for x in err.value.diagnostics if x.code == "E0693"]
    assert "q_proj.weight" in diag.message and "[3, 4, 2]" in diag.message


def test_a_float8_tensor_without_a_scale_is_still_E0723(saved, tmp_path):
    d = _copy(saved["fp8-blocks-fp8"], tmp_path / "lone")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight_scale_inv"]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LinnetError) as err:
        load(weights=d)
    codes = [x.code for x in err.value.diagnostics]
    assert "E0723" in codes
    assert any("down_proj.weight" in x.message for x in err.value.diagnostics)
