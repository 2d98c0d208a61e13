"""`load(..., quantize=)` on the std decoder models (issue 42).

* Crashes: a quantised ``std.nn.decoder::Proj`` without a bias (every Llama-family
  projection) read its absent ``bias`` outside the ``with_bias`` branch, so lowering any std
  model with ``quantize="int8"`` or ``"int4"`` failed with E0340 ("`bias` is not present").
* Silent wrong results: the quantised model's logits equal the float model's run on the
  weights that ``linnet.torch.quantize`` dequantises (the op bodies' definition), for a model
  whose projections have no bias (llama) and one whose q/k/v projections have one (qwen2).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from linnet.lang.syntax.program import STD_ROOT  # noqa: E402
from linnet.torch import load, random_weights  # noqa: E402
from linnet.torch.quantize import (  # noqa: E402
    dequantize_q4,
    dequantize_q8,
    quantize_q4,
    quantize_q8,
)

TOKENS = [[5, 17, 200, 3, 9, 41], [250, 4, 7, 7, 31, 90]]


def toy(name: str) -> dict:
    data = json.loads((STD_ROOT / "models" / "configs" / name / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def dequantised(model, weights: dict, fmt: str) -> dict:
    """``weights`` with each weight the quantised model holds in int8/int4 replaced by the
    float weight its op body computes from them."""
    out = dict(weights)
    for name in weights:
        stem = name[: -len("weight")]
        if fmt == "int8" and stem + "weight_q8" in model.params:
            q, s = model.params[stem + "weight_q8"], model.params[stem + "weight_scale"]
            out[name] = dequantize_q8(q, s, torch.float32)
        elif fmt == "int4" and stem + "weight_q4" in model.params:
            p = model.params
            out[name] = dequantize_q4(
                p[stem + "weight_q4"],
                p[stem + "weight_scale"],
                p[stem + "weight_min"],
                torch.float32,
            )
    return out


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_a_quantised_std_model_runs_its_dequantised_weights(name: str, fmt: str) -> None:
    config = toy(name)
    weights = random_weights(f"std.models.{name}", config, scale=0.2)
    model = load(f"std.models.{name}", weights=weights, config=config, quantize=fmt)
    held = [k for k in model.params if k.endswith(".weight_q8" if fmt == "int8" else ".weight_q4")]
    assert held, "no weight was quantised"
    # The quantised tensors are what quantize_q8/q4 make of the float weights.
    stem = held[0][: -len("weight_q8")]
    group = config.get("weight_group") or model.config["weight_group"]
    made = (quantize_q8 if fmt == "int8" else quantize_q4)(weights[stem + "weight"], group)
    assert torch.equal(made[0], model.params[held[0]])
    floats = load(f"std.models.{name}", weights=dequantised(model, weights, fmt), config=config)
    tokens = torch.tensor(TOKENS, dtype=torch.int32)
    got, want = model.prefill(tokens), floats.prefill(tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(
        want, load(f"std.models.{name}", weights=weights, config=config).prefill(tokens)
    )
