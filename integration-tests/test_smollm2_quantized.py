"""SmolLM2-135M-Instruct with quantised weights, in the torch runtime (float32 model dtype),
on the support file's seven [7, 32] rows in one batch (``smollm2_support``).

* The demo GGUF (linears Q4_1) kept quantised (``quantize="int4"``: its blocks repacked as
  int4 group 32, never dequantised) generates the same 64 greedy tokens as the same file
  with ``quantize=False`` (dequantised by the GGUF loader), and the same prefill logits;
* ``quantize="int8"`` on the float checkpoint (the demo GGUF dequantised and saved by
  transformers, ``smollm2_support``) agrees with the float model: greedy tokens for the
  prompts where it measurably does, the prefill's argmax almost everywhere, and perplexity
  within a measured margin.

Every figure asserted here was measured first (benchmarks/quant_accuracy.py gives the whole
table, docs/quantization.md shows it); each constant's comment says what was measured.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf", reason="transformers reads the demo GGUF through the gguf package")
pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate")

import smollm2_support as smol  # noqa: E402
from linnet.lang import LinnetError  # noqa: E402
from linnet.lang.host.demo_model import smollm2_gguf  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = {"S": smol.CACHE_LENGTH}
CI = bool(os.environ.get("CI"))

# The GGUF kept quantised, greedy steps. On the CPU no kernel reads quantised weights: each
# decode step runs linear_q4's body, which dequantises all 210 weights first (measured on 2
# idle cores: 0.4 s a step, twice float's; the whole file takes 53 s with 64 steps, 31 s
# under CI=1 with 16). So under CI=1 the kept model decodes GGUF_CI_STEPS tokens, its prefill logits
# compared in full (equal to the float's bit for bit), and without CI=1 all 64, the
# acceptance's check (measured: every row equal for all 64).
GGUF_CI_STEPS = 16
GGUF_STEPS = GGUF_CI_STEPS if CI else smol.STEPS

# int8 (group 64, the default) against float32, 64 greedy tokens of the support file's seven
# [7, 32] rows: each row agreed for [22, 22, 10, 45, 64, 1, 24] tokens (row 5, the Jupiter
# question, picks another word at its second token: a near-tie of the float model that the
# weights' rounding tips). So INT8_STEPS tokens are decoded and the rows that agreed for 20 or
# more must agree for their first INT8_PREFIX (16, or 8 under CI=1: at least 6 below the
# least of them, 22); the other two rows are printed, not asserted (measured again at 16
# steps: [16, 16, 10, 16, 16, 1, 16]).
INT8_STEPS = 8 if CI else 16
INT8_PREFIX = INT8_STEPS
INT8_ROWS = (0, 1, 3, 4, 6)
# The prefill's argmax (7 x 32 = 224 positions) agreed at 97.77%; asserted >= 95%.
INT8_ARGMAX = 0.95
# Perplexity of the seven rows teacher-forced (217 predictions): int8 / float32 measured
# 1.0023 (11.1644 / 11.1393); asserted < 1.01. (On the benchmark's 281-token text int8 gives
# 1.0006 and int4 at group 64 1.19: the bound tells a broken int8 from a working one.)
INT8_PERPLEXITY = 1.01


@pytest.fixture(scope="module")
def gguf() -> Path:
    try:
        return smollm2_gguf()
    except LinnetError as err:
        pytest.skip(f"the demo model is not installed: {err}")


@pytest.fixture(scope="module")
def directory(gguf: Path) -> Path:
    return smol.saved_dirs(gguf)["float32"]


@pytest.fixture(scope="module")
def rows(directory: Path) -> list[list[int]]:
    return smol.token_rows(directory)


def run(model: Any, rows: list[list[int]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    return smol.linnet_greedy(model, rows, steps)


@pytest.fixture(scope="module")
def float32(gguf: Path, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The file dequantised by the GGUF loader: bit for bit the saved float32 directory's
    weights (test_smollm2.py checks that), so also the reference of the int8 tests."""
    from linnet.torch import load

    model = load("std.models.llama", weights=gguf, config=CONFIG, quantize=False)
    assert "model.layers.0.mlp.down_proj.weight" in model.params
    return run(model, rows, max(GGUF_STEPS, INT8_STEPS))


@pytest.fixture(scope="module")
def kept(gguf: Path) -> Any:
    from linnet.torch import load

    return load("std.models.llama", weights=gguf, config=CONFIG, quantize="int4")


@pytest.fixture(scope="module")
def int8(directory: Path, rows: list[list[int]]) -> tuple[Any, np.ndarray, np.ndarray]:
    from linnet.torch import load

    model = load("std.models.llama", weights=directory, config=CONFIG, quantize="int8")
    return (model, *run(model, rows, INT8_STEPS))


def perplexity(logits: np.ndarray, rows: list[list[int]]) -> float:
    """The perplexity of every row's tokens after its first, teacher-forced (rows of one
    length: the geometric mean of the rows' perplexities)."""
    return float(np.exp(np.mean([np.log(smol.perplexity(x, r)) for x, r in zip(logits, rows)])))


def test_the_gguf_kept_quantised_holds_its_q4_1_blocks(kept: Any) -> None:
    """Every linear weight of the file is int4 at group 32 (Q4_1's block), nothing of them
    in float; the Q8_0 embedding (tied to the LM head) is dequantised."""
    q4 = {k: v for k, v in kept.params.items() if k.endswith(".weight_q4")}
    assert len(q4) == 30 * 7 and all(v.dtype == torch.uint8 for v in q4.values())
    scale = kept.params["model.layers.0.mlp.down_proj.weight_scale"]
    assert scale.dtype == torch.float16 and tuple(scale.shape) == (576, 1536 // 32)
    assert not any(k.endswith("proj.weight") for k in kept.params)
    assert kept.params["model.embed_tokens.weight"].dtype == torch.float32


def test_the_gguf_kept_quantised_generates_what_the_dequantised_file_does(
    kept: Any, float32: tuple[np.ndarray, np.ndarray], rows: list[list[int]]
) -> None:
    """The acceptance's check: 64 greedy tokens of every row equal (GGUF_STEPS under CI=1).
    The repacked blocks dequantise (in linear_q4's body) to exactly the GGUF loader's float
    weights, and the body then runs the float model's product: the prefill logits are equal
    too (measured: max |difference| 0)."""
    logits, tokens = run(kept, rows, GGUF_STEPS)
    ref_logits, ref_tokens = float32
    for b in range(len(rows)):
        same = smol.agreeing_prefix(tokens[b], ref_tokens[b, :GGUF_STEPS])
        assert same == GGUF_STEPS, f"row {b} differs at step {same}"
    np.testing.assert_array_equal(logits, ref_logits)


def test_int8_holds_int8_weights(int8: Any) -> None:
    """The model really is quantised (a quantize= that silently did nothing would pass the
    agreement tests): every linear of the 30 layers in int8 with f16 group-64 scales, the
    embedding (tied to the LM head) in float32."""
    model = int8[0]
    q8 = {k: v for k, v in model.params.items() if k.endswith(".weight_q8")}
    assert len(q8) == 30 * 7
    assert all(v.dtype == torch.int8 for v in q8.values())
    scale = model.params["model.layers.0.mlp.down_proj.weight_scale"]
    assert scale.dtype == torch.float16 and tuple(scale.shape) == (576, 1536 // 64)
    assert model.params["model.embed_tokens.weight"].dtype == torch.float32
    assert not any(k.endswith("proj.weight") for k in model.params)


def test_int8_greedy_tokens_agree_with_float(
    int8: Any, float32: tuple[np.ndarray, np.ndarray], rows: list[list[int]]
) -> None:
    (_, logits, tokens), (ref_logits, ref_tokens) = int8, float32
    ref_tokens = ref_tokens[:, :INT8_STEPS]
    prefixes = [smol.agreeing_prefix(a, b) for a, b in zip(tokens, ref_tokens, strict=True)]
    agree = float((logits.argmax(-1) == ref_logits.argmax(-1)).mean())
    print(f"int8: greedy tokens agree for {prefixes} of {INT8_STEPS}; prefill argmax {agree:.2%}")
    assert not np.array_equal(logits, ref_logits), "int8 logits equal float's: not quantised"
    short = {b: prefixes[b] for b in INT8_ROWS if prefixes[b] < INT8_PREFIX}
    assert not short, f"rows agree only for {short} tokens (all rows: {prefixes})"
    assert agree >= INT8_ARGMAX, f"prefill argmax agrees at {agree:.2%} of positions"


def test_int8_perplexity_is_within_a_percent_of_float(
    int8: Any, float32: tuple[np.ndarray, np.ndarray], rows: list[list[int]]
) -> None:
    ours, theirs = perplexity(int8[1], rows), perplexity(float32[0], rows)
    print(f"int8 perplexity {ours:.4f}, float32 {theirs:.4f}: {ours / theirs:.4f}x")
    assert ours / theirs < INT8_PERPLEXITY, f"int8 perplexity {ours} vs float32 {theirs}"
