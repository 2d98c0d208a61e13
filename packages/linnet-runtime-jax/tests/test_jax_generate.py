"""`Model.generate` on JAX (issue 46, item 14): greedy generation equals transformers' greedy
`generate` token for token on a random `save_pretrained` directory (a batch of prompts of
different lengths run as one batch, a sliding window shorter than the prompts) and the torch
runtime's tokens on the shared demo checkpoint; sampling with a seed is reproducible and stays
inside top-k / top-p; stop tokens end a sequence; each step is traced once and reused;
`linnet run --runtime jax` takes the sampling options, and lists only what it takes.

torch and transformers build the references only.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from jax_support import LLAMA, toy_config
from linnet.jax import load
from linnet.jax.generate import TRACES, pick
from linnet.lang import LinnetError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STEPS = 24
PROMPTS = [[5, 17, 200, 3, 9, 41, 77, 120, 8, 66, 1], [250, 4], [7, 7, 7, 31, 90, 12]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A small random Mistral (sliding window 4: shorter than the prompts), the directory
    transformers saved it to, and the JAX runtime's model loaded from that directory."""
    cfg = transformers.MistralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        sliding_window=4,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    hf = transformers.MistralForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("mistral")
    hf.save_pretrained(path)
    return hf, path, load("std.models.mistral", weights=path, config={"S": 64})


@pytest.fixture(scope="module")
def greedy(pair):
    return pair[2].generate(PROMPTS, max_new_tokens=STEPS)


def hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_batch_equals_transformers_token_for_token(pair, greedy):
    hf, _, model = pair
    assert greedy == [hf_greedy(hf, p, STEPS) for p in PROMPTS]
    assert model.generate(PROMPTS[1], max_new_tokens=STEPS) == [greedy[1]]  # one prompt alone
    assert model.generate(np.array([PROMPTS[1]], np.int32), STEPS) == [greedy[1]]
    assert model.states == {}  # generation ran on states of its own


def test_greedy_equals_the_torch_runtime_on_the_demo_checkpoint(tmp_path):
    """The one demo generator's checkpoint (what `linnet run` makes) gives both runtimes the
    same tokens, for a batch of prompts of different lengths."""
    import linnet.torch
    from linnet.lang.weights.demo import write_demo

    path = tmp_path / "demo.safetensors"
    write_demo(path, LLAMA, toy_config(), 0)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [42, 9]]
    on_jax = load(LLAMA, weights=path, config="toy").generate(prompts, 16)
    on_torch = linnet.torch.load(LLAMA, weights=path, config="toy").generate(prompts, 16)
    assert on_jax == on_torch


def test_sampling_with_a_seed_is_reproducible(pair, greedy):
    model = pair[2]
    kw = dict(max_new_tokens=12, temperature=1.0, seed=7)
    first = model.generate(PROMPTS, **kw)
    assert model.generate(PROMPTS, **kw) == first
    others = [model.generate(PROMPTS, **(kw | {"seed": s})) for s in (8, 9)]
    assert any(o != first for o in others)  # the seed is used (3 x 12 draws over 256 ids)
    short = [g[:12] for g in greedy]
    assert model.generate(PROMPTS, 12, temperature=1.0, top_k=1, top_p=0.9, seed=3) == short
    # The most likely token alone reaches a tiny top_p.
    assert model.generate(PROMPTS, 12, temperature=0.5, top_k=255, top_p=1e-6, seed=3) == short


def test_samples_stay_within_top_k_and_top_p(pair):
    """Each sampled token is among the k most likely of the model's logits at its step, and
    inside the smallest set reaching top_p (recomputed by a teacher-forced prefill of each
    prompt and the tokens before it: padding after them changes no earlier logit)."""
    model = pair[2]
    out = model.generate(PROMPTS, 10, temperature=2.0, top_k=3, top_p=0.6, seed=0)
    full = [p + t for p, t in zip(PROMPTS, out)]
    longest = max(len(f) for f in full)
    forced = np.array([f + [f[-1]] * (longest - len(f)) for f in full], np.int32)
    logits = np.asarray(model.prefill(forced))
    model.reset()
    for b, (prompt, tokens) in enumerate(zip(PROMPTS, out)):
        for i, t in enumerate(tokens):
            row = logits[b, len(prompt) - 1 + i]
            top = np.argsort(-row)[:3]
            probs = np.exp((row[top] - row[top].max()) / 2.0)
            probs /= probs.sum()
            kept = top[: int(np.searchsorted(np.cumsum(probs), 0.6) + 1)]  # reaching 0.6
            assert t in kept, (b, i, t, top, probs)


def test_pick_top_p_keeps_the_smallest_set_reaching_p():
    import jax

    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    keys = jax.random.split(jax.random.key(0), 300)
    seen = {int(pick(logits, 1.0, top_p=0.8, key=k)[0]) for k in keys[:200]}
    assert seen == {0, 1}  # 0.5 + 0.3 reaches 0.8; 0.15 and 0.05 are dropped
    seen = {int(pick(logits, 1.0, top_p=0.81, key=k)[0]) for k in keys}
    assert seen == {0, 1, 2}


def test_stop_tokens_end_each_sequence(pair, greedy):
    model = pair[2]
    stop = greedy[0][3]
    steps: list[int] = []
    got = model.generate(
        PROMPTS,
        max_new_tokens=STEPS,
        stop_tokens=[stop],
        on_token=lambda step, tokens: steps.append(step),
    )
    for full, cut in zip(greedy, got):
        end = full.index(stop) + 1 if stop in full else len(full)
        assert cut == full[:end]
    assert steps == list(range(max(len(c) for c in got)))


def test_each_step_is_traced_once_and_reused(pair):
    """The decode step (with its pick) is traced once per batch shape and way of picking:
    no token, no later call, no other seed, temperature, k, p or stop token traces it
    again (nor the prefill step, for the same prompt shape)."""
    model = pair[2]
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [9, 2], [6, 5, 3]]  # PROMPTS' shape
    before = TRACES.copy()
    model.generate(prompts, 20, temperature=0.9, top_k=7, top_p=0.95, seed=1)
    after_first = TRACES.copy()
    assert after_first["decode"] - before["decode"] <= 1  # 19 decode steps, at most 1 trace
    assert after_first["prefill"] - before["prefill"] <= 1
    for options in (
        {"temperature": 0.3, "top_k": 50, "top_p": 0.5, "seed": 2},
        {"temperature": 2.5, "top_k": 2, "top_p": 0.99, "seed": 2**64 - 1, "stop_tokens": [0, 255]},
    ):
        model.generate(prompts, 31, **options)
    assert after_first == TRACES


def test_new_prompt_lengths_trace_nothing_after_warm_up(pair):
    """After warm_up, prompts of lengths never seen and other batch sizes (within the warmed
    buckets) trace neither step again, and give each prompt's tokens alone."""
    model = pair[2]
    shapes = model.warm_up(batch_sizes=[1, 2], longest=40, progress=lambda line: None)
    traces = TRACES.copy()
    # warm_up traced the first step generate runs: prefill_last's (the LM head on B rows)
    # at every bucket shape; generate never traces prefill's.
    assert {key[1] for key in model._generation if key[0] == "prefill_last"} >= set(shapes)
    assert {key[0] for key in model._generation} == {"prefill_last", "decode"}
    prompts = [[3, 1, 4, 1, 5, 9, 2][:n] for n in (1, 4, 7)] + [[7] * 23, [9, 8] * 15]
    alone = [model.generate([p], 4)[0] for p in prompts]
    assert model.generate(prompts[3:], 4) == alone[3:]
    assert model.generate(prompts[:2], 4) == alone[:2]
    assert traces == TRACES


# ---------------------------------------------------------------- repetition_penalty (issue 41)
def hf_penalized(hf, prompt: list[int], steps: int, penalty: float) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
            repetition_penalty=penalty,
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_with_a_repetition_penalty_equals_transformers(pair, greedy):
    """Before: E0794 (generate had no `repetition_penalty`)."""
    hf, _, model = pair
    got = model.generate(PROMPTS, STEPS, repetition_penalty=1.3, stop_tokens=[])
    assert got == [hf_penalized(hf, p, STEPS, 1.3) for p in PROMPTS]
    assert got != greedy  # the penalty changes tokens here (a silent no-op would not)
    assert model.generate(PROMPTS, STEPS, repetition_penalty=1.0) == greedy


def test_pick_penalizes_the_seen_tokens_before_the_warpers():
    import jax
    import jax.numpy as jnp
    from linnet.jax.generate import penalize, see, seen_mask

    logits = np.array([[3.0, -1.0, 2.0, -0.5, 2.5]] * 2, np.float32)
    seen = seen_mask(jnp.array([[0, 1, 1], [4, 4, 4]]), 5)
    assert seen.tolist() == [[True, True, False, False, False], [False] * 4 + [True]]
    assert penalize(logits, seen, 2.0).tolist() == [
        [1.5, -2.0, 2.0, -0.5, 2.5],
        [3.0, -1.0, 2.0, -0.5, 1.25],
    ]
    assert pick(logits, penalty=2.0, seen=seen).tolist() == [4, 0]
    assert pick(logits).tolist() == [0, 0]
    key = jax.random.key(0)
    assert pick(logits, 5.0, top_k=1, key=key, penalty=2.0, seen=seen).tolist() == [4, 0]
    # A generated token is marked (token 2 in row 0); a -1 (non-finite logits) marks nothing.
    marked = see(seen, jnp.array([2, -1], jnp.int32))
    assert marked.tolist() == [[True, True, True, False, False], [False] * 4 + [True]]
    only_negative = np.array([[-2.0, -1.0, -3.0, -0.5]], np.float32)
    mask = np.array([[False, False, False, True]])
    assert pick(only_negative, penalty=3.0, seen=mask).tolist() == [1]


def test_sampling_with_a_penalty_and_a_seed_is_reproducible(pair):
    model = pair[2]
    kw = dict(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=5, repetition_penalty=1.3)
    first = model.generate(PROMPTS, **kw)
    assert model.generate(PROMPTS, **kw) == first
    # The penalty comes before the temperature: a tiny one samples the penalised argmax.
    assert model.generate(
        PROMPTS, 12, temperature=1e-300, seed=1, repetition_penalty=1.3, stop_tokens=[]
    ) == model.generate(PROMPTS, 12, repetition_penalty=1.3, stop_tokens=[])


def test_penalties_are_values_not_traces(pair):
    """The penalty is an argument of the steps, never a constant: other penalties (and
    seeds, temperatures) trace neither step again; only its presence is a way of picking."""
    model = pair[2]
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [9, 2], [6, 5, 3]]  # PROMPTS' shape
    model.generate(prompts, 6, temperature=0.9, top_k=7, seed=1, repetition_penalty=1.3)
    model.generate(prompts, 6, repetition_penalty=1.3)
    traces = TRACES.copy()
    for penalty in (0.5, 2.0, 1e30, 5e-324):
        model.generate(prompts, 9, temperature=0.4, top_k=50, seed=3, repetition_penalty=penalty)
        model.generate(prompts, 9, repetition_penalty=penalty)
    assert traces == TRACES


# ---------------------------------------------------------------- `linnet run --runtime jax`
def test_linnet_run_on_jax_samples_as_generate_does(pair, capsys):
    """Before: every sampling option was E0790 with `--runtime jax`."""
    from linnet.lang.cli import main

    _, path, model = pair
    prompt = ",".join(map(str, PROMPTS[2]))
    sampled = model.generate([PROMPTS[2]], 6, temperature=0.9, top_k=20, seed=5)[0]
    argv = [
        "run",
        "--runtime",
        "jax",
        "std.models.mistral",
        "--weights",
        str(path),
        "--prompt",
        prompt,
        "--tokens",
        "6",
        "--temperature",
        "0.9",
        "--top-k",
        "20",
        "--sampling-seed",
        "5",
    ]
    stop = sampled[3]
    cut = sampled[: sampled.index(stop) + 1]
    assert main([*argv, "--stop", str(stop)]) == 0
    out = capsys.readouterr().out
    assert f"decoded {len(cut)} tokens: {cut}" in out and "(jax)" in out
    assert f"token   1 at position    6: {sampled[1]:6d}" in out
    penalized = model.generate([PROMPTS[2]], 6, repetition_penalty=1.3, stop_tokens=[])[0]
    assert main([*argv[:-6], "--stop", "none", "--repetition-penalty", "1.3"]) == 0
    assert f"decoded 6 tokens: {penalized}" in capsys.readouterr().out


@pytest.mark.parametrize("torch_installed", [False, True])
def test_run_help_lists_what_the_runtimes_take(monkeypatch, torch_installed):
    """Without linnet-runtime-torch, `linnet run --help` lists only what JAX takes (the
    sampling options, not --compile, --interpret, --nproc or --rank-timeout)."""
    import linnet.jax.cli as jax_cli

    monkeypatch.setattr(jax_cli, "_torch_installed", lambda: torch_installed)
    commands = argparse.ArgumentParser(prog="linnet").add_subparsers()
    jax_cli.register_run(commands)
    text = commands.choices["run"].format_help()
    for taken in (
        "--temperature",
        "--top-k",
        "--top-p",
        "--sampling-seed",
        "--stop",
        "--numerics",
        "--device",
        "--runtime",
    ):
        assert taken in text
    for torch_only in ("--compile", "--interpret", "--nproc", "--rank-timeout"):
        assert (torch_only in text) == torch_installed, torch_only


@pytest.mark.gpu
def test_generate_on_the_gpu(tmp_path):
    """On a GPU (states donated: the KV cache written in place): the CPU's greedy tokens on the
    demo checkpoint, sampling reproducible per seed, each step traced once."""
    import jax
    from linnet.lang.weights.demo import write_demo

    if jax.default_backend() != "gpu":
        pytest.skip("needs jax with a GPU backend")
    path = tmp_path / "demo.safetensors"
    write_demo(path, LLAMA, toy_config(), 0)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [42, 9]]
    on_gpu = load(LLAMA, weights=path, config="toy", device="gpu")
    on_cpu = load(LLAMA, weights=path, config="toy", device="cpu")
    assert on_gpu.generate(prompts, 16) == on_cpu.generate(prompts, 16)
    kw = dict(temperature=0.8, top_k=40, top_p=0.9, seed=11)
    first = on_gpu.generate(prompts, 32, **kw)
    traces = TRACES.copy()
    assert on_gpu.generate(prompts, 32, **kw) == first
    other = on_gpu.generate(prompts, 64, **(kw | {"seed": 12, "temperature": 1.1}))
    assert [o[:32] for o in other] != first
    assert traces == TRACES


def test_fast_false_runs_without_jit_and_gives_the_same_tokens(pair):
    model = pair[2]
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    assert model.generate(prompts, 3, fast=False) == model.generate(prompts, 3)
    with pytest.raises(LinnetError) as info:
        model.generate(prompts, 3, fast=None)
    assert info.value.diagnostics[0].code == "E0870"


@pytest.mark.gpu
def test_a_repetition_penalty_on_the_gpu(tmp_path):
    """On a GPU the mask of the tokens seen is carried (donated) like the KV cache: the
    CPU's greedy tokens on the demo checkpoint, sampling reproducible, other penalties
    trace nothing."""
    import jax
    from linnet.lang.weights.demo import write_demo

    if jax.default_backend() != "gpu":
        pytest.skip("needs jax with a GPU backend")
    path = tmp_path / "demo.safetensors"
    write_demo(path, LLAMA, toy_config(), 0)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [42, 9]]
    on_gpu = load(LLAMA, weights=path, config="toy", device="gpu")
    on_cpu = load(LLAMA, weights=path, config="toy", device="cpu")
    kw = dict(repetition_penalty=1.3, stop_tokens=[])
    assert on_gpu.generate(prompts, 16, **kw) == on_cpu.generate(prompts, 16, **kw)
    sampled = dict(temperature=0.8, top_k=40, top_p=0.9, seed=11, **kw)
    first = on_gpu.generate(prompts, 32, **sampled)
    traces = TRACES.copy()
    assert on_gpu.generate(prompts, 32, **sampled) == first
    on_gpu.generate(prompts, 32, **(sampled | {"repetition_penalty": 0.8}))
    assert traces == TRACES


def test_numpy_scalars_are_options_and_prompt_ids(pair):
    """np.float32(0.8), np.int64(20) and prompt ids taken from an array are what they hold:
    the same tokens as the Python numbers (and hashable static options for the jitted
    steps). Before: E0812/E0813 and E0810."""
    model = pair[2]
    plain = model.generate(PROMPTS, 6, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    numpy_options = dict(
        temperature=np.float32(0.8), top_k=np.int64(20), top_p=np.float64(0.9), seed=np.uint64(3)
    )
    assert model.generate(PROMPTS, np.int64(6), **numpy_options) == plain
    ids = [list(np.array(p, dtype=np.int64)) for p in PROMPTS]
    assert model.generate(ids, 6) == model.generate(PROMPTS, 6)
    with pytest.raises(LinnetError) as info:
        model.generate(PROMPTS, 2, temperature=np.float32("inf"))
    assert info.value.diagnostics[0].code == "E0812"
