"""`prefill_last` (issue 41): every std model's entry that gives the logits at position
``at[b]`` of each prompt only (the LM head on B rows, not B * L), and generate's use of it.

* Silent wrong results: on every std model (generated source and the interpreter) its
  logits are ``prefill``'s rows at ``at`` and the cache it leaves is ``prefill``'s, bit for
  bit; generate gives the same tokens through it as a copy of the model without it.
* Crashes / silent clamps: an ``at`` outside [0, L) is E0780 from the input checks (its range
  comes from the graph's bounds), never an IndexError or a wrapped-around row.
* Tracebacks: a model whose ``prefill_last`` has another signature (one input, an i64 or
  f32 ``at``, the hidden states instead of logits, logits of every position) is E0871
  before anything runs, naming the expected signature, never run as something it is not.
"""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
from linnet.lang import LinnetError  # noqa: E402
from linnet.lang.syntax.program import STD_ROOT  # noqa: E402
from linnet.torch import load, random_weights  # noqa: E402

MODELS = ["llama", "mistral", "qwen2", "phi3", "gemma", "gpt2"]
PROMPTS = [[5, 17, 200, 3, 9, 41, 77, 120, 8, 66, 1], [250, 4], [7, 7, 7, 31, 90, 12]]
# The gathered LM head multiplies a [B, D] matrix where prefill's multiplies [B * L, D]:
# the same sums, but a GEMM of another shape may block (and so order) the float32
# accumulation over D differently. Observed: at most 3e-6 on logits of about 1; the cache
# is computed by the same code on the same shapes, so it is compared exactly.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


def toy(name: str) -> dict:
    data = json.loads((STD_ROOT / "models" / "configs" / name / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@pytest.fixture(scope="module")
def weights():
    # scale 0.2: logits spread over several units, so no greedy pick is a near tie.
    return {name: random_weights(f"std.models.{name}", toy(name), scale=0.2) for name in MODELS}


@pytest.mark.parametrize("mode", ["generated", "interpret"])
@pytest.mark.parametrize("name", MODELS)
def test_prefill_last_is_prefills_rows_and_leaves_its_cache(weights, name, mode):
    model = load(
        f"std.models.{name}", weights=weights[name], config="toy", interpret=mode == "interpret"
    )
    tokens = torch.randint(0, 256, (3, 9), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(torch.int32)
    at = torch.tensor([8, 3, 0], dtype=torch.int32)
    full_ctx = model.new_context("prefill", [tokens])
    last_ctx = model.new_context("prefill_last", [tokens, at])
    full = model.prefill(tokens, context=full_ctx)
    last = model.prefill_last(tokens, at, context=last_ctx)
    assert last.shape == (3, 256) and last.dtype == torch.float32
    torch.testing.assert_close(last, full[torch.arange(3), at.long()], **TOLERANCE)
    assert full_ctx.states.keys() == last_ctx.states.keys()
    for path, state in full_ctx.states.items():
        assert torch.equal(state, last_ctx.states[path]), path


@pytest.mark.parametrize("mode", ["generated", "interpret"])
@pytest.mark.parametrize("bad", [9, -1, 2**31 - 1, -(2**31)])
def test_an_at_outside_the_prompt_is_the_range_error(weights, mode, bad):
    # A gather at 9 of 9 rows: an IndexError (CPU), a device assert (CUDA) or, at -1, the
    # last row read silently; refused before anything runs, naming `at` and its range.
    model = load("std.models.llama", weights=weights["llama"], config="toy",
                 interpret=mode == "interpret")  # fmt: skip
    tokens = torch.zeros((2, 9), dtype=torch.int32)
    with pytest.raises(LinnetError) as err:
        model.prefill_last(tokens, torch.tensor([0, bad], dtype=torch.int32))
    assert code_of(err) == "E0780"
    text = str(err.value)
    assert "input `at` of `prefill_last`" in text and "[0, 9)" in text, text


def without_prefill_last(name: str, tmp_path) -> str:
    """A copy of std.models.<name> without its prefill_last entry: a model written before
    it (its std imports resolve from anywhere)."""
    text = (STD_ROOT / "models" / f"{name}.linnet").read_text()
    stripped, count = re.subn(
        r"\n    /// Logits at position at\[b\].*?\n    entry prefill_last.*?\n    }\n", "\n",
        text, flags=re.S,
    )  # fmt: skip
    assert count == 1
    path = tmp_path / f"{name}_old.linnet"
    path.write_text(stripped)
    return str(path)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_generate_runs_prefill_last_and_a_model_without_it_still_generates(weights, tmp_path, name):
    """generate runs prefill_last where the model has it (prefill is never lowered), and
    prefill where it has none; the tokens are the same (greedy and sampled)."""
    new = load(f"std.models.{name}", weights=weights[name], config="toy")
    old = load(without_prefill_last(name, tmp_path), weights=weights[name], config=toy(name))
    assert "prefill_last" in new.entries and "prefill_last" not in old.entries
    got = new.generate(PROMPTS, 8, stop_tokens=[])
    assert got == old.generate(PROMPTS, 8, stop_tokens=[])
    sampled = dict(temperature=0.8, top_k=20, seed=3, stop_tokens=[])
    assert new.generate(PROMPTS, 8, **sampled) == old.generate(PROMPTS, 8, **sampled)
    assert {key[0] for key in new._lowered} == {"prefill_last", "decode"}
    assert {key[0] for key in old._lowered} == {"prefill", "decode"}
    # One prompt alone gets the tokens it gets in the batch (its own last position).
    assert new.generate([PROMPTS[1]], 8, stop_tokens=[]) == [got[1]]


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_the_interpreter_and_compile_generate_through_prefill_last(weights, mode):
    model = load("std.models.qwen2", weights=weights["qwen2"], config="toy", **{mode: True})
    generated = load("std.models.qwen2", weights=weights["qwen2"], config="toy")
    assert model.generate(PROMPTS, 6, stop_tokens=[]) == generated.generate(
        PROMPTS, 6, stop_tokens=[]
    )
    assert {key[0] for key in model._lowered} == {"prefill_last", "decode"}


def test_prompt_ids_and_nan_logits_name_the_entry_that_runs(weights):
    """E0780 for a prompt id past the vocabulary and E0818 for non-finite first logits are
    prefill_last's, as the runtime's own checks of that entry would say."""
    model = load("std.models.llama", weights=weights["llama"], config="toy")
    with pytest.raises(LinnetError) as err:
        model.generate([[1, 2], [3, 256]], 4)
    assert code_of(err) == "E0780"
    assert "input `tokens` of `prefill_last` has 256 at index [1, 1]" in str(err.value)
    broken = {k: v.clone() for k, v in weights["llama"].items()}
    broken["model.norm.weight"][3] = float("nan")
    nan = load("std.models.llama", weights=broken, config="toy", check_finite=False)
    with pytest.raises(LinnetError) as err:
        nan.generate([[1, 2, 3, 4]], 4)
    assert code_of(err) == "E0818" and "`prefill_last` at position 3" in str(err.value)


LLAMA_ENTRY = """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i32]) -> Tensor[B, V; f32] {
        let h = self.model.prefill_last(tokens, at)
        let logits = if tie_word_embeddings { linear(h, self.model.embed_tokens.weight) } else { self.lm_head(h) }
        return logits as f32
    }
"""
# prefill_last entries of other signatures (each a valid model: load accepts it).
MISSIGNED = {
    # The old way: no `at`, the last position of the bucket.
    "no at": (
        """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32]) -> Tensor[B, V; f32] {
        let h = self.model.prefill(tokens)
        let rows[b: B, t: L, d] = h[(b, t), d]
        let last[b, d] = rows[b, L - 1, d]
        return self.lm_head(last) as f32
    }
""",
        "takes 1 input(s)",
    ),
    "at as i64": (
        """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i64]) -> Tensor[B, V; f32] {
        let h = self.model.prefill(tokens)
        let rows[b: B, t: L, d] = h[(b, t), d]
        let last[b, d] = rows[b, at[b], d]
        return self.lm_head(last) as f32
    }
""",
        "second input `at: Tensor[B; i64]` is no [B] i32 tensor",
    ),
    "inputs swapped": (
        """    entry prefill_last<L: Dim>(at: Tensor[B; i32], tokens: Tensor[B, L; i32]) -> Tensor[B, V; f32] {
        let h = self.model.prefill_last(tokens, at)
        return self.lm_head(h) as f32
    }
""",
        "first input `at: Tensor[B; i32]` is no [B, L] i32 tensor",
    ),
    "every position": (
        """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i32]) -> Tensor[B, L, V; f32] {
        let h = self.model.prefill(tokens)
        let logits = self.lm_head(h)
        let out[b: B, t: L, v] = logits[(b, t), v] as f32 + (at[b] * 0) as f32
        return out
    }
""",
        "not one [B, V] tensor of logits",
    ),
    # Rank and rows right, but the hidden states (D = 64), not logits: found once lowered.
    "no LM head": (
        """    entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i32]) -> Tensor[B, D; f32] {
        return self.model.prefill_last(tokens, at) as f32
    }
""",
        "gives [4, 64], not the logits [4, 256]",
    ),
}


@pytest.mark.parametrize("case", list(MISSIGNED))
def test_a_prefill_last_of_another_signature_is_coded(weights, tmp_path, case):
    entry, words = MISSIGNED[case]
    text = (STD_ROOT / "models" / "llama.linnet").read_text()
    assert LLAMA_ENTRY in text
    path = tmp_path / "llama_missigned.linnet"
    path.write_text(text.replace(LLAMA_ENTRY, entry))
    model = load(path, weights=weights["llama"], config=toy("llama"))
    ran: list[str] = []
    model.run = lambda entry, *a, **k: ran.append(entry)  # nothing may run
    with pytest.raises(LinnetError) as err:
        model.generate(PROMPTS, 4)
    assert code_of(err) == "E0871" and not ran
    text = str(err.value)
    assert words in text, text
    assert "entry prefill_last<L: Dim>(tokens: Tensor[B, L; i32], at: Tensor[B; i32])" in text
    assert "llama_missigned.linnet:" in text, text  # the declaration's place
