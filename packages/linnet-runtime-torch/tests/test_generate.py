"""`Model.generate` (issue 19): greedy generation equals transformers' greedy `generate` token
for token, for a batch of prompts of different lengths run as one batch; sampling with a
seed is deterministic and stays inside top-k / top-p; stop tokens end a sequence; mistakes
are coded (E0810-E0817)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from linnet.lang import LinnetError  # noqa: E402
from linnet.torch import load  # noqa: E402
from linnet.torch.generate import pick  # noqa: E402

STEPS = 24
PROMPTS = [[5, 17, 200, 3, 9, 41, 77, 120, 8, 66, 1], [250, 4], [7, 7, 7, 31, 90, 12]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A small random Mistral (sliding window 4: shorter than the prompts) and its linnet
    model, loaded from the directory transformers saved."""
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
    return hf, load("std.models.mistral", weights=path, config={"S": 64})


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


def test_greedy_batch_equals_transformers_token_for_token(pair):
    hf, model = pair
    got = model.generate(PROMPTS, max_new_tokens=STEPS)
    assert got == [hf_greedy(hf, p, STEPS) for p in PROMPTS]
    assert model.generate(PROMPTS[1], max_new_tokens=STEPS) == [got[1]]  # one prompt alone
    assert model.generate(torch.tensor([PROMPTS[1]]), STEPS) == [got[1]]


def test_sampling_with_a_seed_is_deterministic(pair):
    _, model = pair
    kw = dict(max_new_tokens=12, temperature=1.0, seed=7)
    first = model.generate(PROMPTS, **kw)
    assert model.generate(PROMPTS, **kw) == first
    others = [model.generate(PROMPTS, **(kw | {"seed": s})) for s in (8, 9)]
    assert any(o != first for o in others)  # the seed is used (3 x 12 draws over 256 ids)
    assert model.generate(PROMPTS, 12, temperature=1.0, top_k=1, seed=3) == model.generate(
        PROMPTS, 12
    )  # top_k=1 is greedy
    assert model.generate(PROMPTS, 12, temperature=0.5, top_p=1e-6, seed=3) == model.generate(
        PROMPTS, 12
    )  # the most likely token alone reaches a tiny top_p


def test_samples_stay_within_top_k(pair):
    """Each sampled token is among the k most likely of the model's logits at its step
    (recomputed by a teacher-forced prefill of the prompt and the tokens before it)."""
    _, model = pair
    prompt = PROMPTS[0]
    tokens = model.generate([prompt], 10, temperature=2.0, top_k=3, seed=0)[0]
    full = torch.tensor([prompt + tokens], dtype=torch.int32)
    logits = model.prefill(full)[0]
    for i, t in enumerate(tokens):
        top = torch.topk(logits[len(prompt) - 1 + i], 3).indices.tolist()
        assert t in top


def test_pick_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    seen = {int(pick(logits, 1.0, top_p=0.8, generator=gen)) for _ in range(200)}
    assert seen == {0, 1}  # 0.5 + 0.3 reaches 0.8; 0.15 and 0.05 are dropped
    seen = {int(pick(logits, 1.0, top_p=0.81, generator=gen)) for _ in range(300)}
    assert seen == {0, 1, 2}


def test_stop_tokens_end_each_sequence(pair):
    _, model = pair
    greedy = model.generate(PROMPTS, max_new_tokens=STEPS)
    stop = greedy[0][3]
    got = model.generate(PROMPTS, max_new_tokens=STEPS, stop_tokens=[stop])
    for full, cut in zip(greedy, got):
        end = full.index(stop) + 1 if stop in full else len(full)
        assert cut == full[:end]


@pytest.mark.parametrize(
    "call,code",
    [
        (lambda m: m.generate([], 4), "E0810"),
        (lambda m: m.generate([[1, 2], []], 4), "E0810"),
        (lambda m: m.generate([[1.5]], 4), "E0810"),
        (lambda m: m.generate([[1]], 0), "E0811"),
        (lambda m: m.generate([[1]], 4, temperature=-1.0), "E0812"),
        (lambda m: m.generate([[1]], 4, temperature=1.0, top_k=0), "E0813"),
        (lambda m: m.generate([[1]], 4, temperature=1.0, top_p=1.5), "E0814"),
        (lambda m: m.generate([[1]], 4, seed="x"), "E0815"),
        (lambda m: m.generate([[1]], 4, stop_tokens=2), "E0815"),
        (lambda m: m.generate([[1] * 60], 10), "E0817"),
    ],
)
def test_mistakes_are_coded(pair, call, code):
    with pytest.raises(LinnetError) as info:
        call(pair[1])
    assert info.value.diagnostics[0].code == code


def test_a_model_without_prefill_is_coded(tmp_path):
    src = tmp_path / "m.linnet"
    src.write_text(
        "pub model M {\n    entry run(x: Tensor[2; f32]) -> Tensor[2; f32] {\n"
        "        return x\n    }\n}\n"
    )
    with pytest.raises(LinnetError) as info:
        load(src).generate([[1]], 2)
    assert info.value.diagnostics[0].code == "E0816"


def test_linnet_run_a_shipped_model_generates(pair, capsys, tmp_path):
    from linnet.lang.cli import main

    hf, model = pair
    path = tmp_path / "ckpt"
    hf.save_pretrained(path)
    prompt = ",".join(map(str, PROMPTS[2]))
    greedy = model.generate([PROMPTS[2]], 6)[0]
    assert (
        main(
            [
                "run",
                "std.models.mistral",
                "--weights",
                str(path),
                "--prompt",
                prompt,
                "--tokens",
                "6",
            ]
        )
        == 0
    )
    assert f"decoded 6 tokens: {greedy}" in capsys.readouterr().out
    sampled = model.generate([PROMPTS[2]], 6, temperature=0.9, top_k=20, seed=5)[0]
    argv = [
        "run",
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
    assert main(argv) == 0
    assert f"decoded 6 tokens: {sampled}" in capsys.readouterr().out
    assert main([*argv, "--stop", str(sampled[1])]) == 0
    cut = sampled[: sampled.index(sampled[1]) + 1]
    assert f"decoded {len(cut)} tokens: {cut}" in capsys.readouterr().out


def test_new_prompt_lengths_and_batch_sizes_lower_nothing_after_warm_up(pair):
    """generate runs a few bucketed shapes (host/generate.padded): after warm_up, prompts of
    lengths never seen and batches of other sizes lower (and compile) nothing, and the
    padding changes no token (transformers' greedy tokens, each prompt alone)."""
    import random

    hf, model = pair  # S=64: prompt buckets 16, 32, 64
    lines: list[str] = []
    before = set(model._lowered)
    shapes = model.warm_up(batch_sizes=[1, 3], progress=lines.append)
    assert shapes == [(1, 16), (1, 32), (1, 64), (4, 16), (4, 32), (4, 64)]
    assert len(lines) == 6 and lines[0].startswith("warm-up 1/6")
    lowered = set(model._lowered)
    # warm_up ran the entry generate runs: prefill_last (the LM head on B rows) at every
    # bucket shape, and never prefill.
    assert {key[1][0][0] for key in lowered if key[0] == "prefill_last"} >= set(shapes)
    assert {key[0] for key in lowered - before} <= {"prefill_last", "decode"}
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in rng.sample(range(1, 60), 5)]
    for prompt in prompts:
        assert model.generate([prompt], 3) == [hf_greedy(hf, prompt, 3)]
    assert model.generate(prompts[:3], 3) == [hf_greedy(hf, p, 3) for p in prompts[:3]]
    assert set(model._lowered) == lowered


def test_the_cpu_runs_prompts_on_the_fine_ladder(pair, tmp_path):
    """On the CPU (generated source, no compile=) prefill runs a prompt at most 1.25x its
    length from 64 tokens (FINE: its time grows with the padded length); compile= keeps the
    coarse ladder (each shape a torch.compile). Before: a 70-token prompt ran at 128."""
    from linnet.lang.host.generate import COARSE, FINE

    hf = pair[0]
    hf.save_pretrained(tmp_path)
    longer = load("std.models.mistral", weights=tmp_path, config={"S": 128})
    assert longer.prompt_ladder is FINE
    assert load("std.models.mistral", weights=tmp_path, compile=True).prompt_ladder is COARSE
    prompt = [(7 * i) % 250 + 3 for i in range(70)]
    assert longer.generate([prompt], 3) == [hf_greedy(hf, prompt, 3)]
    widths = {key[1][0][0][1] for key in longer._lowered if key[0] == "prefill_last"}
    assert widths == {80}


@pytest.mark.parametrize(
    "args", [{"batch_sizes": []}, {"batch_sizes": 4}, {"batch_sizes": [0]}, {"longest": 0}]
)
def test_warm_up_arguments_are_checked(pair, args):
    with pytest.raises(LinnetError) as info:
        pair[1].warm_up(**args)
    assert info.value.diagnostics[0].code == "E0866"


def test_sampling_follows_the_distribution_and_never_picks_a_dropped_token():
    """pick samples softmax(logits / T) by inverse CDF on the logits' device: frequencies
    match the probabilities, and a token top_k drops (probability 0) never comes."""
    import math

    logits = torch.tensor([[0.0, math.log(3.0), -1e30, 0.0]]).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    picked = pick(logits, temperature=1.0, generator=gen)
    counts = torch.bincount(picked, minlength=4).tolist()
    assert counts[2] == 0
    assert abs(counts[1] / 4000 - 0.6) < 0.03  # 3 / (1 + 3 + 0 + 1)
    assert abs(counts[0] / 4000 - 0.2) < 0.03
    kept = pick(logits, temperature=1.0, top_k=2, generator=gen)
    assert set(kept.tolist()) <= {0, 1, 3} and (kept == 1).float().mean() > 0.5


def test_fast_must_be_a_bool(pair):
    with pytest.raises(LinnetError) as info:
        pair[1].generate(PROMPTS, 2, fast="no")
    assert info.value.diagnostics[0].code == "E0870"
    assert pair[1].generate(PROMPTS, 3, fast=False) == pair[1].generate(PROMPTS, 3)


@pytest.mark.gpu
def test_cuda_generate_plans_once_and_equals_the_eager_path(pair, tmp_path, monkeypatch):
    """On CUDA generate plans decode once per batch bucket and replays it captured: greedy
    tokens equal fast=False's (the entries call by call) and transformers', prompts of new
    lengths reuse the plan, and a seeded sample is the same on both paths."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("LINNET_HOME", str(tmp_path))
    hf = pair[0]
    hf.save_pretrained(tmp_path / "mistral")
    model = load(
        "std.models.mistral", weights=tmp_path / "mistral", config={"S": 64}, device="cuda"
    )
    got = model.generate(PROMPTS, max_new_tokens=STEPS)
    assert got == model.generate(PROMPTS, max_new_tokens=STEPS, fast=False)
    assert got == [hf_greedy(hf, p, STEPS) for p in PROMPTS]
    assert list(model._fast_steps) == [4]
    # Greedy steps after the first ran as the captured greedy step (pick inside the graph).
    greedy = model._fast_steps[4].greedy_step
    assert greedy is not None and greedy.graph is not None
    others = [[9, 8, 7, 6, 5, 4, 3], [1, 2], [40] * 20]
    again = model.generate(others, max_new_tokens=STEPS)
    assert list(model._fast_steps) == [4] and len(again) == 3
    assert again == model.generate(others, max_new_tokens=STEPS, fast=False)
    # A length bucket's prefill is captured at its second call and replayed from then on.
    assert model.generate(PROMPTS, max_new_tokens=STEPS) == got
    assert model.generate(PROMPTS, max_new_tokens=STEPS) == got
    prefills = model._fast_steps[4].prefills
    assert prefills[("prefill_last", 16)] is not None
    assert prefills[("prefill_last", 16)].graph is not None
    # The fast path's prefill is prefill_last too (the LM head on B rows): never prefill.
    assert "prefill_last" in {key[0] for key in model._lowered}
    assert "prefill" not in {key[0] for key in model._lowered}
    sampled = [
        model.generate(PROMPTS, 12, temperature=0.8, top_k=20, seed=3, fast=f)
        for f in (True, False)
    ]
    assert sampled[0] == sampled[1]


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


def test_greedy_with_a_repetition_penalty_equals_transformers(pair):
    """Before: E0794 (generate had no `repetition_penalty`)."""
    hf, model = pair
    got = model.generate(PROMPTS, STEPS, repetition_penalty=1.3, stop_tokens=[])
    assert got == [hf_penalized(hf, p, STEPS, 1.3) for p in PROMPTS]
    plain = model.generate(PROMPTS, STEPS, stop_tokens=[])
    assert got != plain  # the penalty changes tokens here (a silent no-op would not)
    for none in (None, 1.0, 1):
        assert model.generate(PROMPTS, STEPS, repetition_penalty=none, stop_tokens=[]) == plain
    # A penalty below 1 rewards repeating, as transformers' does.
    assert model.generate(PROMPTS[2], 12, repetition_penalty=0.7, stop_tokens=[]) == [
        hf_penalized(hf, PROMPTS[2], 12, 0.7)
    ]


def test_pick_penalizes_the_seen_tokens_before_the_warpers():
    from linnet.torch.generate import penalize, seen_mask

    logits = torch.tensor([[3.0, -1.0, 2.0, -0.5, 2.5], [3.0, -1.0, 2.0, -0.5, 2.5]])
    seen = seen_mask(torch.tensor([[0, 1, 1], [4, 4, 4]]), 5)
    assert seen.tolist() == [[True, True, False, False, False], [False] * 4 + [True]]
    out = penalize(logits, seen, 2.0)
    # Seen: positive divided, negative multiplied; unseen unchanged (the same float32 ops).
    assert out.tolist() == [[1.5, -2.0, 2.0, -0.5, 2.5], [3.0, -1.0, 2.0, -0.5, 1.25]]
    assert pick(logits, penalty=2.0, seen=seen).tolist() == [4, 0]
    assert pick(logits).tolist() == [0, 0]
    # Before the temperature and top_k: top_k=1 keeps the penalised argmax.
    gen = torch.Generator().manual_seed(0)
    assert pick(logits, 5.0, top_k=1, generator=gen, penalty=2.0, seen=seen).tolist() == [4, 0]
    # A seen negative logit multiplied: token 3 (-0.5) falls below token 1 (-1 unseen).
    only_negative = torch.tensor([[-2.0, -1.0, -3.0, -0.5]])
    mask = torch.tensor([[False, False, False, True]])
    assert pick(only_negative, penalty=3.0, seen=mask).tolist() == [1]


def test_tokens_seen_in_the_prompt_or_only_generated_are_penalized(pair, monkeypatch):
    """generate's mask on hand-made logits (the model's entries run, their logits replaced):
    token 9 in the first prompt only is penalised from the first step; token 7, generated,
    from the step after it."""
    _, model = pair
    prefill_last, decode = model.prefill_last, model.decode

    def logits(rows: int, values: dict[int, float]) -> torch.Tensor:
        out = torch.full((rows, 256), -4.0)
        for token, value in values.items():
            out[:, token] = value
        return out

    # generate's first step runs prefill_last (the std model has it): [B, V] logits.
    def fake_prefill(tokens, at, context=None):
        prefill_last(tokens, at, context=context)
        return logits(tokens.shape[0], {9: 5.0, 7: 4.0, 5: 3.0})

    def fake_decode(token, pos, context=None):
        decode(token, pos, context=context)
        return logits(token.shape[0], {9: 5.0, 7: 4.0, 5: 3.0})

    monkeypatch.setattr(model, "prefill_last", fake_prefill)
    monkeypatch.setattr(model, "decode", fake_decode)
    assert model.generate([[9, 1]], 4, stop_tokens=[]) == [[9, 9, 9, 9]]
    # 9 (prompt): 5/2 = 2.5; 7 wins (4), then 7 is seen: 2 < 5's 3; then 5 seen: 1.5.
    got = model.generate([[9, 1], [2]], 4, repetition_penalty=2.0, stop_tokens=[])
    assert got == [[7, 5, 9, 9], [9, 7, 5, 9]]


def test_sampling_with_a_penalty_and_a_seed_is_deterministic(pair):
    _, model = pair
    kw = dict(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=5, repetition_penalty=1.3)
    first = model.generate(PROMPTS, **kw)
    assert model.generate(PROMPTS, **kw) == first
    # The penalty comes before the temperature: a tiny one samples the penalised argmax.
    assert model.generate(
        PROMPTS, 12, temperature=1e-300, seed=1, repetition_penalty=1.3, stop_tokens=[]
    ) == model.generate(PROMPTS, 12, repetition_penalty=1.3, stop_tokens=[])


def test_linnet_run_takes_a_repetition_penalty(pair, capsys, tmp_path):
    from linnet.lang.cli import main

    hf, model = pair
    path = tmp_path / "ckpt"
    hf.save_pretrained(path)
    penalized = model.generate([PROMPTS[2]], 8, repetition_penalty=1.3, stop_tokens=[])[0]
    argv = ["run", "std.models.mistral", "--weights", str(path), "--tokens", "8"]
    prompt = ",".join(map(str, PROMPTS[2]))
    argv += ["--prompt", prompt, "--stop", "none", "--repetition-penalty", "1.3"]
    assert main(argv) == 0
    assert f"decoded 8 tokens: {penalized}" in capsys.readouterr().out


@pytest.mark.gpu
def test_a_repetition_penalty_on_cuda_is_the_cpus(pair, tmp_path):
    """On CUDA the mask of the tokens seen lives on the GPU (built from the prompts, updated
    by a scatter each step): greedy tokens are the CPU's, sampling is reproducible."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    hf, model = pair
    hf.save_pretrained(tmp_path)
    on_gpu = load("std.models.mistral", weights=tmp_path, config={"S": 64}, device="cuda")
    kw = dict(repetition_penalty=1.3, stop_tokens=[])
    assert on_gpu.generate(PROMPTS, STEPS, **kw) == model.generate(PROMPTS, STEPS, **kw)
    sampled = dict(temperature=0.8, top_k=40, top_p=0.9, seed=11, **kw)
    assert on_gpu.generate(PROMPTS, 16, **sampled) == on_gpu.generate(PROMPTS, 16, **sampled)


def test_numpy_scalars_are_options_and_prompt_ids(pair):
    """np.float32(0.8), np.int64(20) and prompt ids taken from an array are what they hold:
    the same tokens as the Python numbers. Before: E0812/E0813 (not an int or float) and
    E0810 (a list of np.int64 is no list of ints)."""
    import numpy as np

    model = pair[1]
    plain = model.generate(PROMPTS, 6, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    numpy_options = dict(
        temperature=np.float32(0.8),
        top_k=np.int64(20),
        top_p=np.float64(0.9),
        seed=np.uint64(3),
        repetition_penalty=np.float32(1.0),
    )
    assert model.generate(PROMPTS, np.int64(6), **numpy_options) == plain
    ids = [list(np.array(p, dtype=np.int64)) for p in PROMPTS]
    assert model.generate(ids, 6) == model.generate(PROMPTS, 6)
    with pytest.raises(LinnetError) as info:
        model.generate(PROMPTS, 2, temperature=np.float32("nan"))
    assert info.value.diagnostics[0].code == "E0812"
    with pytest.raises(LinnetError) as info:
        model.generate(PROMPTS, 2, top_k=np.bool_(True))
    assert info.value.diagnostics[0].code == "E0813"
