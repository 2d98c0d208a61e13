"""Adversarial generation on JAX (issue 46, item 14): every edge value of `generate` and of
`linnet run --runtime jax` has the torch runtime's meaning or its coded error, with the same
message, never a traceback, a NaN or a silent wrong result.

* Arguments: each mistake torch's `generate` codes (E0780, E0794, E0810-E0819) is the same
  code and message here, before anything runs (compared with the torch runtime where it is
  installed).
* Non-finite logits (a NaN weight) stop with E0818 naming the sequence, step, entry and
  position, as in torch, at the first step and at a later one; never a token picked from NaN.
* Temperatures: a tiny positive one (1e-45, 5e-324) is greedy, a huge one (1e308) samples
  uniformly; seeds past 2**32 are their own (jax's own key(seed) folds 2**32 onto 0 without
  64-bit jax: the same tokens for two seeds).
* Prompts as NumPy or jax arrays; float or 3-d arrays are E0810.
* Repetition penalties (issue 41): the torch runtime's E0867 for bad values; extreme finite
  ones give the torch runtime's greedy tokens and never NaN, at any temperature; `pick`
  with a penalty and no mask of the tokens seen is E0868.
* `linnet run --runtime jax` checks its sampling options before jax is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from jax_support import LLAMA, toy_config
from linnet.jax import load, random_weights
from linnet.jax.generate import pick
from linnet.lang import LinnetError

V = 256  # the toy config's vocabulary
PROMPT = [5, 17, 200, 3]


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


@pytest.fixture(scope="module")
def weights():
    return random_weights(LLAMA, toy_config(), seed=0)


@pytest.fixture(scope="module")
def model(weights):
    return load(LLAMA, weights=weights, config=toy_config())


@pytest.fixture(scope="module")
def torch_model(weights):
    """The torch runtime's model on the same weights, where it is installed."""
    torch = pytest.importorskip("torch")
    from linnet.torch import load as torch_load

    return torch_load(
        LLAMA, weights={k: torch.from_numpy(v) for k, v in weights.items()}, config=toy_config()
    )


@pytest.fixture(scope="module")
def greedy(model):
    return model.generate([PROMPT], 6)[0]


# ---------------------------------------------------------------- arguments: torch's codes
BAD = [
    ([], {}, "E0810"),
    ([[1, 2], []], {}, "E0810"),
    ([[1.5]], {}, "E0810"),
    # A string is a text prompt (issue 40): without a tokenizer, E0846 says how to give one.
    ("1,2", {}, "E0846"),
    ([[True, 2]], {}, "E0810"),
    ([PROMPT], {"max_new_tokens": 0}, "E0811"),
    ([PROMPT], {"max_new_tokens": 4.0}, "E0811"),
    ([PROMPT], {"temperature": -1.0}, "E0812"),
    ([PROMPT], {"temperature": float("nan")}, "E0812"),
    ([PROMPT], {"temperature": 1e309}, "E0812"),
    ([PROMPT], {"temperature": "0.7"}, "E0812"),
    ([PROMPT], {"temperature": 1.0, "top_k": 0}, "E0813"),
    ([PROMPT], {"temperature": 1.0, "top_k": 2.0}, "E0813"),
    ([PROMPT], {"temperature": 1.0, "top_k": -(2**70)}, "E0813"),
    ([PROMPT], {"temperature": 1.0, "top_p": 0}, "E0814"),
    ([PROMPT], {"temperature": 1.0, "top_p": 1.5}, "E0814"),
    ([PROMPT], {"temperature": 1.0, "top_p": True}, "E0814"),
    ([PROMPT], {"temperature": 1.0, "seed": 2**64}, "E0815"),
    ([PROMPT], {"temperature": 1.0, "seed": -1}, "E0815"),
    ([PROMPT], {"temperature": 1.0, "seed": 1.0}, "E0815"),
    ([PROMPT], {"seed": "x"}, "E0815"),
    ([PROMPT], {"stop_tokens": 2}, "E0815"),
    ([PROMPT], {"on_token": 3}, "E0815"),
    ([PROMPT], {"on_token": "print"}, "E0815"),
    ([PROMPT], {"stop_tokens": [V]}, "E0819"),
    ([PROMPT], {"stop_tokens": [2, -1]}, "E0819"),
    ([PROMPT], {"stop_tokens": [2**64]}, "E0819"),
    # repetition_penalty is an option since issue 41; transformers' n-gram rule is not.
    ([PROMPT], {"no_repeat_ngram_size": 3}, "E0794"),
    ([PROMPT], {"temprature": 0.5}, "E0794"),
    ([PROMPT], {"top-k": 5}, "E0794"),
    ([[1] * 120], {"max_new_tokens": 10}, "E0817"),
    ([PROMPT], {"max_new_tokens": 2**64}, "E0817"),
    ([PROMPT, [1, 2**64]], {}, "E0780"),
    ([PROMPT, [1, 2**31]], {}, "E0780"),
    ([PROMPT, [1, -(2**63)]], {}, "E0780"),
    ([PROMPT, [1, V]], {}, "E0780"),
    ([PROMPT], {"temperature": 10**400}, "E0812"),
    ([PROMPT], {"repetition_penalty": 0}, "E0867"),
    ([PROMPT], {"repetition_penalty": -1.2}, "E0867"),
    ([PROMPT], {"repetition_penalty": float("nan")}, "E0867"),
    ([PROMPT], {"repetition_penalty": float("inf")}, "E0867"),
    ([PROMPT], {"repetition_penalty": 10**400}, "E0867"),
    ([PROMPT], {"repetition_penalty": True}, "E0867"),
    ([PROMPT], {"repetition_penalty": "1.2"}, "E0867"),
    ([PROMPT], {"repetition_penalty": [1.2]}, "E0867"),
]


@pytest.mark.parametrize(("prompts", "options", "code"), BAD)
def test_a_bad_argument_is_the_torch_runtimes_error(model, prompts, options, code):
    """Before: `Model.generate` did not exist on JAX (AttributeError)."""
    options = {"max_new_tokens": 4} | options
    with pytest.raises(LinnetError) as err:
        model.generate(prompts, **options)
    assert code_of(err) == code, str(err.value)
    assert "Traceback" not in str(err.value)


@pytest.mark.parametrize(("prompts", "options", "code"), BAD[::3])
def test_the_same_message_as_torch(model, torch_model, prompts, options, code):
    options = {"max_new_tokens": 4} | options
    with pytest.raises(LinnetError) as on_jax:
        model.generate(prompts, **options)
    with pytest.raises(LinnetError) as on_torch:
        torch_model.generate(prompts, **options)
    # The one word that differs: what each runtime calls its arrays.
    assert str(on_jax.value) == str(on_torch.value).replace("tensor", "array")


def test_a_model_without_prefill_is_coded(tmp_path):
    src = tmp_path / "m.linnet"
    src.write_text(
        "pub model M {\n    entry run(x: Tensor[2; f32]) -> Tensor[2; f32] {\n"
        "        return x\n    }\n}\n"
    )
    with pytest.raises(LinnetError) as info:
        load(src).generate([[1]], 2)
    assert code_of(info) == "E0816"


@pytest.mark.parametrize(
    ("prompts", "words"),
    [
        (np.array([[1.0, 2.0]], np.float32), "not a float32 array of shape [1, 2]"),
        (np.zeros((1, 1, 2), np.int32), "not a int32 array of shape [1, 1, 2]"),
        (np.array([[True]]), "not a bool array"),
    ],
)
def test_arrays_that_are_not_token_ids(model, prompts, words):
    with pytest.raises(LinnetError) as err:
        model.generate(prompts, 2)
    assert code_of(err) == "E0810" and words in str(err.value)


def test_prompts_as_arrays(model, greedy):
    import jax.numpy as jnp

    assert model.generate(np.array([PROMPT], np.int64), 6) == [greedy]
    assert model.generate(jnp.asarray(PROMPT, jnp.int32), 6) == [greedy]  # one prompt, 1-d


# ---------------------------------------------------------------- non-finite logits
@pytest.fixture(scope="module")
def nan_model(weights):
    """The toy Llama with one NaN in its final norm: every logit is NaN."""
    broken = {k: v.copy() for k, v in weights.items()}
    broken["model.norm.weight"][7] = np.nan
    # load refuses a NaN weight (E0666); skipped here to reach generate's own check
    return load(LLAMA, weights=broken, config=toy_config(), check_finite=False)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"temperature": 1.0, "seed": 0},
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 1},
    ],
)
def test_nan_logits_stop_generation_with_a_coded_error(nan_model, options):
    seen: list[int] = []
    with pytest.raises(LinnetError) as err:
        nan_model.generate([PROMPT], 6, on_token=lambda step, tokens: seen.append(step), **options)
    assert code_of(err) == "E0818"
    text = str(err.value)
    assert "sequence 0 at step 0" in text and "`prefill` at position 3" in text
    assert seen == []  # no token was reported before the error


def test_non_finite_logits_at_a_later_step_name_it(weights, model, torch_model):
    """Token t's embedding row is NaN, and sequence 1 emits t at step 2: its decode logits
    at step 3 are NaN. E0818 names that sequence, step and position, with the torch
    runtime's message; the first steps' tokens were reported."""
    prompts = [PROMPT, [1, 2]]
    clean = model.generate(prompts, 6)
    t = clean[1][2]
    # Only sequence 1 feeds t, and only from step 3 on.
    assert t not in clean[0][:3] + clean[1][:2] + PROMPT + [1, 2], clean
    broken = {k: v.copy() for k, v in weights.items()}
    broken["model.embed_tokens.weight"][t] = np.nan
    poisoned = load(LLAMA, weights=broken, config=toy_config(), check_finite=False)
    seen: list[int] = []
    with pytest.raises(LinnetError) as err:
        poisoned.generate(prompts, 6, on_token=lambda step, tokens: seen.append(step))
    assert code_of(err) == "E0818"
    assert "sequence 1 at step 3 (`decode` at position 4, after 3 generated token(s))" in str(
        err.value
    )
    assert seen == [0, 1, 2]
    import torch
    from linnet.torch import load as torch_load

    on_torch = torch_load(
        LLAMA,
        weights={k: torch.from_numpy(v) for k, v in broken.items()},
        config=toy_config(),
        check_finite=False,
    )
    with pytest.raises(LinnetError) as torch_err:
        on_torch.generate(prompts, 6)
    assert str(torch_err.value) == str(err.value)


def test_pick_marks_a_non_finite_row_minus_one():
    import jax

    logits = np.array([[0.0, 3.0, 1.0], [0.0, np.nan, 1.0], [-np.inf, 1, 2]], np.float32)
    assert pick(logits).tolist() == [1, -1, -1]
    assert pick(logits, 1.0, top_k=2, top_p=0.9, key=jax.random.key(0)).tolist()[1:] == [-1, -1]


# ---------------------------------------------------------------- temperatures and seeds
@pytest.mark.parametrize(("temperature", "seed"), [(1e-45, 0), (5e-324, 1), (1e-300, 2)])
def test_a_tiny_temperature_is_greedy(model, greedy, temperature, seed):
    # 1 / 5e-324 is no float32 (nor float64): logits * inf would be NaN at the largest.
    assert model.generate([PROMPT], 6, temperature=temperature, seed=seed)[0] == greedy


def test_a_tiny_temperature_samples_only_exact_ties():
    import jax

    logits = np.array([[1.0, 5.0, 5.0, 4.999]], np.float32)
    seen = {int(pick(logits, 5e-324, key=k)[0]) for k in jax.random.split(jax.random.key(0), 60)}
    assert seen == {1, 2}


def test_a_huge_temperature_samples_uniformly(model):
    import jax

    logits = np.array([[0.0, 30.0, -30.0, 5.0]], np.float32)
    keys = jax.random.split(jax.random.key(0), 400)
    counts = np.bincount([int(pick(logits, 1e308, key=k)[0]) for k in keys], minlength=4)
    assert (counts > 60).all(), counts  # about 100 each
    assert {int(pick(logits, 1e308, top_k=2, key=k)[0]) for k in keys[:60]} == {1, 3}
    out = model.generate([PROMPT], 5, temperature=1e308, seed=3)[0]
    assert len(out) == 5 and all(0 <= t < V for t in out)


def test_seeds_past_32_bits_are_their_own(model):
    """jax.random.key(2**32) is key(0) in 32-bit jax: two seeds, one stream, silently."""
    runs = {
        s: model.generate([PROMPT], 8, temperature=1.0, seed=s)[0]
        for s in (0, 2**32, 2**63, 2**64 - 1)
    }
    assert len({tuple(r) for r in runs.values()}) == 4, runs
    assert model.generate([PROMPT], 8, temperature=1.0, seed=2**64 - 1)[0] == runs[2**64 - 1]


def test_the_edges_of_the_ranges_run(model, greedy):
    stops = [V - 1, 0, greedy[2]]
    end = next(i + 1 for i, t in enumerate(greedy) if t in stops)
    assert model.generate([PROMPT], 6, stop_tokens=stops) == [greedy[:end]]
    huge_k = model.generate([PROMPT], 3, temperature=1.0, top_k=10**30, seed=4)
    assert huge_k == model.generate([PROMPT], 3, temperature=1.0, seed=4)  # k >= V: all kept
    assert model.generate([[V - 1, 0]], 1, on_token=lambda step, tokens: None)[0][0] in range(V)
    assert model.generate([PROMPT], 1) == [greedy[:1]]  # prefill alone: no decode step


# ---------------------------------------------------------------- issue 41: repetition penalty
@pytest.mark.parametrize("penalty", [1e308, 1e30, 5e-324, 1e-45])
def test_extreme_penalties_have_a_meaning(model, torch_model, penalty):
    """Every finite penalty above 0 runs, greedy and sampling, never picking from NaN (a
    penalty below f32's smallest normal acts as it, a huge one is inf in f32); greedy gives
    the torch runtime's tokens."""
    greedy = model.generate([PROMPT, [1]], 6, repetition_penalty=penalty, stop_tokens=[])
    assert greedy == torch_model.generate(
        [PROMPT, [1]], 6, repetition_penalty=penalty, stop_tokens=[]
    )
    sampled = model.generate(
        [PROMPT, [1]], 6, temperature=0.8, top_p=0.9, seed=0, repetition_penalty=penalty
    )
    assert all(0 <= t < V for row in sampled for t in row)


def test_pick_on_penalised_rows_that_overflow():
    """Rows a penalty pushes to -inf (every token seen and negative, a huge penalty) or to
    inf (a tiny penalty): ties, never NaN or -1, at any temperature."""
    import jax

    every = np.ones((1, 4), bool)
    negative = np.array([[-1.0, -2.0, -0.5, -3.0]], np.float32)
    keys = jax.random.split(jax.random.key(0), 80)
    assert pick(negative, penalty=1e300, seen=every).tolist() == [0]
    for temperature in (1.0, 1e308):  # -inf * a zero inverse would be NaN
        drawn = {
            int(pick(negative, temperature, key=k, penalty=1e300, seen=every)[0]) for k in keys
        }
        assert drawn == {0, 1, 2, 3}
    seen = np.array([[True, True, True, False]])
    mixed = np.array([[0.0, 5.0, 4.0, -1.0]], np.float32)
    assert pick(mixed, penalty=5e-324, seen=seen).tolist() == [1]
    drawn = {int(pick(mixed, 0.5, top_p=0.9, key=k, penalty=5e-324, seen=seen)[0]) for k in keys}
    assert drawn == {1, 2}


@pytest.mark.parametrize("seen", [None, np.zeros((1, 3), bool)])
def test_pick_with_a_penalty_needs_the_seen_mask(seen):
    with pytest.raises(LinnetError) as err:
        pick(np.array([[0.0, 3.0, 1.0, 2.0]], np.float32), penalty=1.3, seen=seen)
    assert code_of(err) == "E0868" and "[1, 4]" in str(err.value)


# ---------------------------------------------------------------- `linnet run --runtime jax`
@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--temperature", "nan"], "E0812"),
        (["--top-k", "0"], "E0813"),
        (["--top-p", "1.5"], "E0814"),
        (["--sampling-seed", "-1"], "E0815"),
        (["--stop", "2,-1"], "E0819"),
        (["--stop", str(V)], "E0819"),
        (["--prompt", f"1,{2**64}"], "E0780"),
        (["--rank-timeout", "5"], "E0790"),
        (["--repetition-penalty", "0"], "E0867"),
        (["--repetition-penalty", "nan"], "E0867"),
    ],
)
def test_cli_run_on_jax_bad_options(capsys, argv, code):
    """Before: every sampling option was E0790 ("decodes greedily")."""
    from linnet.lang.cli import main

    if "--rank-timeout" in argv:  # an option `linnet run` has where the torch runtime is
        pytest.importorskip("linnet.torch")

    rc = main(["run", "--runtime", "jax", str(LLAMA), "--config", "toy", "--tokens", "2", *argv])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"error[{code}]" in err and "Traceback" not in err


def test_cli_run_on_jax_checks_options_before_importing_jax(tmp_path):
    code = (
        "import sys\nfrom linnet.lang.cli import main\n"
        "rc = main(['run', '--runtime', 'jax', '--temperature', '1', '--top-p', '2'])\n"
        "print(rc, 'jax' in sys.modules)\n"
    )
    env = os.environ | {"LINNET_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stdout.split() == ["1", "False"], done.stdout + done.stderr
    assert "error[E0814]" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "demo").exists()
