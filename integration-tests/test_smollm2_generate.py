"""`Model.generate` on the real SmolLM2-135M-Instruct (float32, the saved directory of
``smollm2_support``) against transformers' `generate`: three prompts of different lengths in
one batch, greedy, token for token, in the torch runtime (at its length and batch buckets:
the batch of 3 runs as 4 rows of 64 positions) and in the JAX runtime.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf", reason="transformers reads the demo GGUF through the gguf package")
pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate")

import smollm2_support as smol  # noqa: E402
from linnet.lang import LinnetError  # noqa: E402
from linnet.lang.host.demo_model import smollm2_gguf  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 24
TEXTS = (
    "The capital of France is",
    "Photosynthesis is the process by which green plants use sunlight, water and",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three daughters. Every morning, before the sun rose, the",
)


@pytest.fixture(scope="module")
def directory() -> Path:
    try:
        return smol.saved_dirs(smollm2_gguf())["float32"]
    except LinnetError as err:
        pytest.skip(f"the demo model is not installed: {err}")


@pytest.fixture(scope="module")
def prompts(directory: Path) -> list[list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    assert len({len(p) for p in ids}) == 3, "three prompts of different lengths"
    return ids


@pytest.fixture(scope="module")
def expected(directory: Path, prompts: list[list[int]]) -> list[list[int]]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    out = []
    with torch.inference_mode():
        for p in prompts:
            x = torch.tensor([p])
            got = hf.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                do_sample=False,
                pad_token_id=0,
            )
            out.append(got[0, len(p) :].tolist())
    return out


@pytest.mark.parametrize("runtime", ["torch", "jax"])
def test_a_batch_of_three_lengths_equals_transformers_generate(
    runtime: str, directory: Path, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    if runtime == "jax":
        pytest.importorskip("jax")
        from linnet.jax import load
    else:
        from linnet.torch import load
    model = load("std.models.llama", weights=directory, config={"S": 128})
    assert model.generate(prompts, STEPS, stop_tokens=[]) == expected
