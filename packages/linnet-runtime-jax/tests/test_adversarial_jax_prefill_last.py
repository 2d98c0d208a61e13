"""`prefill_last` on JAX (issue 41): every std model's entry that gives the logits at
position ``at[b]`` of each prompt only, and generate's jitted first step on it.

* Silent wrong results: on every std model its logits are ``prefill``'s rows at ``at`` and
  the states (the KV cache) it leaves are ``prefill``'s, bit for bit; generate's jitted first step runs
  it (``prefill`` is never traced) and gives a copy of the model without it the same tokens.
* Crashes / silent clamps: an ``at`` outside [0, L) is E0780 (XLA would clamp the gather
  to the last row without a word).
* Tracebacks: a ``prefill_last`` of another signature is E0871 before anything runs.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from linnet.jax import load, random_weights
from linnet.lang import LinnetError
from linnet.lang.syntax.program import STD_ROOT

MODELS = ["llama", "mistral", "qwen2", "phi3", "gemma", "gpt2"]
PROMPTS = [[5, 17, 200, 3, 9, 41, 77, 120, 8, 66, 1], [250, 4], [7, 7, 7, 31, 90, 12]]
# The LM head on [B, D] rows where prefill's runs on [B * L, D]: a dot of another shape
# may order the float32 sums over D differently (the torch runtime's differ by a few 1e-6
# on logits of about 1; XLA's CPU dots happen to agree exactly). The states are computed by
# the same code on the same shapes, so they are compared exactly.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


def toy(name: str) -> dict:
    data = json.loads((STD_ROOT / "models" / "configs" / name / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def toy_model(name: str, path=None):
    weights = random_weights(f"std.models.{name}", toy(name), scale=0.2)
    return load(path or f"std.models.{name}", weights=weights, config=toy(name))


@pytest.mark.parametrize("name", MODELS)
def test_prefill_last_is_prefills_rows_and_leaves_its_states(name):
    model = toy_model(name)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 256, (3, 9)).astype(np.int32)
    at = np.array([8, 3, 0], np.int32)
    full_fn, last_fn = model.function("prefill"), model.function("prefill_last")
    (full,), full_states = full_fn(model.params, full_fn.new_states([tokens]), [tokens])
    (last,), last_states = last_fn(model.params, last_fn.new_states([tokens, at]), [tokens, at])
    assert last.shape == (3, 256) and last.dtype == np.float32
    np.testing.assert_allclose(np.asarray(last), np.asarray(full)[np.arange(3), at], **TOLERANCE)
    assert full_states.keys() == last_states.keys()
    for path, state in full_states.items():
        np.testing.assert_array_equal(np.asarray(last_states[path]), np.asarray(state))


@pytest.mark.parametrize("bad", [9, -1, 2**31 - 1])
def test_an_at_outside_the_prompt_is_the_range_error(bad):
    model = toy_model("llama")
    with pytest.raises(LinnetError) as err:
        model.prefill_last(np.zeros((2, 9), np.int32), np.array([0, bad], np.int32))
    assert code_of(err) == "E0780"
    text = str(err.value)
    assert "input `at` of `prefill_last`" in text and "[0, 9)" in text, text


def test_generate_traces_prefill_last_and_a_model_without_it_gives_the_same_tokens(tmp_path):
    text = (STD_ROOT / "models" / "llama.linnet").read_text()
    stripped, count = re.subn(
        r"\n    /// Logits at position at\[b\].*?\n    entry prefill_last.*?\n    }\n", "\n",
        text, flags=re.S,
    )  # fmt: skip
    assert count == 1
    (tmp_path / "old.linnet").write_text(stripped)
    new, old = toy_model("llama"), toy_model("llama", tmp_path / "old.linnet")
    assert "prefill_last" not in old.entries
    got = new.generate(PROMPTS, 8, stop_tokens=[])
    assert got == old.generate(PROMPTS, 8, stop_tokens=[])
    sampled = dict(temperature=0.8, top_k=20, seed=3, stop_tokens=[])
    assert new.generate(PROMPTS, 8, **sampled) == old.generate(PROMPTS, 8, **sampled)
    assert {key[0] for key in new._generation} == {"prefill_last", "decode"}
    assert {key[0] for key in old._generation} == {"prefill", "decode"}
    assert set(new._functions) == {"prefill_last", "decode"}
    # Without jit, op by op: the same entry and the same tokens.
    assert new.generate(PROMPTS, 3, stop_tokens=[], fast=False) == [g[:3] for g in got]


LLAMA_ENTRY = """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i32]) -> Tensor[B, V; f32] {
        let h = self.model.prefill_last(tokens, at)
"""
# The last position of the bucket, not of each prompt: no `at`.
NO_AT = """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32]) -> Tensor[B, V; f32] {
        let all = self.model.prefill(tokens)
        let rows[b: B, t: L, d] = all[(b, t), d]
        let h[b, d] = rows[b, L - 1, d]
"""


def test_a_prefill_last_without_at_is_coded(tmp_path):
    text = (STD_ROOT / "models" / "llama.linnet").read_text()
    assert LLAMA_ENTRY in text
    path = tmp_path / "llama_missigned.linnet"
    path.write_text(text.replace(LLAMA_ENTRY, NO_AT))
    model = toy_model("llama", path)
    with pytest.raises(LinnetError) as err:
        model.generate(PROMPTS, 4)
    assert code_of(err) == "E0871" and "takes 1 input(s)" in str(err.value)
    assert not model._generation  # nothing traced, nothing ran
