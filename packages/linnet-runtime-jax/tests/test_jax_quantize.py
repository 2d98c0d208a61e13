"""Quantised weights in the JAX runtime (issue 42): ``load(..., quantize=...)`` quantises on
the host as ``linnet.torch`` does on its device (the same arrays, bit for bit, where torch is
installed to compare), a quantised model equals the float model holding its weights
dequantised, a GGUF file's Q8_0/Q4_0/Q4_1 weights are kept as they are, and saved quantised
weights reload as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from linnet.jax import load, random_weights
from linnet.jax.quantize import dequantized, quantize_q4, quantize_q8
from linnet.lang import LinnetError

MODELS = Path(__file__).resolve().parents[2] / "linnet-lang/src/linnet/lang/std/models"
TOKENS = np.array([[3, 17, 42, 9, 60, 7]], dtype=np.int32)


def toy(family: str) -> dict:
    cfg = json.loads((MODELS / "configs" / family / "toy.json").read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def weights(family: str) -> dict[str, np.ndarray]:
    return random_weights(MODELS / f"{family}.linnet", toy(family), seed=1, scale=0.05)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantised_model_equals_its_weights_dequantised(family: str, fmt: str) -> None:
    w = weights(family)
    model = load(f"std.models.{family}", weights=w, config="toy", quantize=fmt)
    kept = [k for k in model.params if k.endswith(("_q8", "_q4"))]
    assert len(kept) == 7 * toy(family)["NL"] + (0 if toy(family)["tie_word_embeddings"] else 1)
    plain = load(
        f"std.models.{family}", weights=dequantized(model.params, np.float32), config="toy"
    )
    np.testing.assert_allclose(
        np.asarray(model.prefill(TOKENS)), np.asarray(plain.prefill(TOKENS)), rtol=1e-6, atol=1e-6
    )
    reference = load(f"std.models.{family}", weights=w, config="toy")
    assert (
        np.abs(np.asarray(model.prefill(TOKENS)) - np.asarray(reference.prefill(TOKENS))).max()
        > 1e-6
    )


def test_the_quantisers_equal_torch_bit_for_bit() -> None:
    torch = pytest.importorskip("torch")
    from linnet.torch import quantize as tq

    w = (np.random.default_rng(3).standard_normal((32, 256)) * 0.05).astype(np.float32)
    w[0, :64] = 0.0
    for group in (32, 128):
        for mine, theirs in zip(quantize_q8(w, group), tq.quantize_q8(torch.from_numpy(w), group)):
            np.testing.assert_array_equal(mine, theirs.numpy())
        for mine, theirs in zip(quantize_q4(w, group), tq.quantize_q4(torch.from_numpy(w), group)):
            np.testing.assert_array_equal(mine, theirs.numpy())


def test_saved_quantised_weights_reload(tmp_path: Path) -> None:
    from linnet.jax.weights import save_safetensors

    model = load("std.models.llama", weights=weights("llama"), config="toy", quantize="int8")
    save_safetensors(dict(model.params), str(tmp_path / "model.safetensors"))
    again = load("std.models.llama", weights=str(tmp_path / "model.safetensors"), config="toy")
    assert again.config["weight_bits"] == 8
    np.testing.assert_array_equal(
        np.asarray(again.prefill(TOKENS)), np.asarray(model.prefill(TOKENS))
    )


def test_kept_gguf_equals_the_file_dequantised(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from gguf_files import hf_model, write_gguf

    path = write_gguf(tmp_path / "q.gguf", "mistral", hf_model("mistral"), quant="Q4_0")
    kept = load("std.models.mistral", weights=str(path), quantize="int4")
    plain = load("std.models.mistral", weights=str(path))  # the CPU: dequantised
    assert any(k.endswith("_q4") for k in kept.params)
    assert not any(k.endswith("_q4") for k in plain.params)
    np.testing.assert_array_equal(
        np.asarray(kept.prefill(TOKENS)), np.asarray(plain.prefill(TOKENS))
    )


@pytest.mark.parametrize("value", ["q4", {"format": "int4", "group": 5}])
def test_a_bad_quantize_value_is_E0681(value: object) -> None:
    with pytest.raises(LinnetError) as err:
        load("std.models.llama", weights=weights("llama"), config="toy", quantize=value)
    assert {d.code for d in err.value.diagnostics} == {"E0681"}
