"""Adversarial generation and command-line arguments (issue 38, items 8, 9 and 13): every
edge value of `generate`, `linnet run` and `linnet kernels` has a meaning or a coded error,
never a traceback, a NaN or a silent wrong result.

* Non-finite logits (a NaN weight: greedy used to repeat token 0 forever, sampling raised
  torch's RuntimeError) stop with E0818 naming the sequence, step, entry and position.
* Temperatures: a tiny positive one (1e-45, 5e-324) is greedy, a huge one (1e308) samples
  uniformly; neither is NaN or a traceback.
* Seeds, prompt ids and stop tokens past their ranges, a non-callable ``on_token``, an option
  generate lacks: E0815, E0780, E0819, E0794 before anything runs.
* Repetition penalties (issue 41): zero, negative, NaN, inf, bool, a string, 10**400 are
  E0867 (in `generate` and `linnet run --repetition-penalty`, before torch is imported);
  extreme finite ones (1e308, 5e-324) have a meaning, never NaN; `pick` with a penalty and
  no mask of the tokens seen is E0868, not a silent no-op.
* `linnet run` checks its sampling options before torch is imported; `linnet kernels`
  refuses a device the machine lacks (E0710, E0711) and an ``--op`` that names nothing
  (E0793, with a did-you-mean).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from linnet.lang import LinnetError
from linnet.torch import load, random_weights
from linnet.torch.generate import pick
from support import LLAMA, toy_config

V, S = 256, 128  # the toy config's vocabulary and cache length
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
def nan_model(weights):
    """The toy Llama with one NaN in its final norm: every logit is NaN."""
    broken = {k: v.clone() for k, v in weights.items()}
    broken["model.norm.weight"][7] = float("nan")
    # load refuses a NaN weight (E0666); skipped here to reach generate's own check
    return load(LLAMA, weights=broken, config=toy_config(), check_finite=False)


@pytest.fixture(scope="module")
def greedy(model):
    return model.generate([PROMPT], 6)[0]


# ---------------------------------------------------------------- item 8: non-finite logits
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"temperature": 1.0, "seed": 0},
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 1},
    ],
)
def test_nan_logits_stop_generation_with_a_coded_error(nan_model, options):
    # Before: greedy returned [0, 0, 0, ...] (argmax of NaN), sampling a RuntimeError from
    # torch.multinomial.
    seen: list[int] = []
    with pytest.raises(LinnetError) as err:
        nan_model.generate([PROMPT], 6, on_token=lambda step, tokens: seen.append(step), **options)
    assert code_of(err) == "E0818"
    text = str(err.value)
    assert "sequence 0 at step 0" in text and "`prefill` at position 3" in text
    assert seen == []  # no token was reported before the error


def test_non_finite_logits_at_a_later_step_name_it(weights, greedy):
    """Sequence 1's decode logits turn to inf at its third step: E0818 names that sequence,
    step and position; sequence 0 alone is unaffected."""
    model = load(LLAMA, weights=weights, config=toy_config())
    decode = model.decode

    def poisoned(token, pos, context=None):
        logits = decode(token, pos, context=context)
        if pos.numel() > 1 and int(pos[1]) == 4:  # prompt [1, 2]: step 3 reads position 4
            logits = logits.clone()
            logits[1, 9] = float("inf")
        return logits

    model.decode = poisoned
    with pytest.raises(LinnetError) as err:
        model.generate([PROMPT, [1, 2]], 6)
    assert code_of(err) == "E0818"
    assert "sequence 1 at step 3 (`decode` at position 4, after 3 generated token(s))" in str(
        err.value
    )
    assert model.generate([PROMPT], 6) == [greedy]


def test_pick_marks_a_non_finite_row_minus_one():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, float("nan"), 1.0], [float("-inf"), 1, 2]])
    gen = torch.Generator().manual_seed(0)
    assert pick(logits).tolist() == [1, -1, -1]
    assert pick(logits, 1.0, top_k=2, top_p=0.9, generator=gen).tolist()[1:] == [-1, -1]


# ---------------------------------------------------------------- item 13: temperatures
@pytest.mark.parametrize(("temperature", "seed"), [(1e-45, 0), (5e-324, 1), (1e-300, 2)])
def test_a_tiny_temperature_is_greedy(model, greedy, temperature, seed):
    # Before: 1e-45 and 5e-324 made logits / temperature overflow to inf - inf = NaN, and
    # torch.multinomial raised.
    assert model.generate([PROMPT], 6, temperature=temperature, seed=seed)[0] == greedy


def test_a_tiny_temperature_samples_only_exact_ties():
    logits = torch.tensor([[1.0, 5.0, 5.0, 4.999]])
    gen = torch.Generator().manual_seed(0)
    seen = {int(pick(logits, 5e-324, generator=gen)) for _ in range(60)}
    assert seen == {1, 2}


def test_a_huge_temperature_samples_uniformly(model):
    logits = torch.tensor([[0.0, 30.0, -30.0, 5.0]])
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(
        torch.cat([pick(logits, 1e308, generator=gen) for _ in range(400)]), minlength=4
    )
    assert (counts > 60).all(), counts  # about 100 each
    assert {int(pick(logits, 1e308, top_k=2, generator=gen)) for _ in range(60)} == {1, 3}
    out = model.generate([PROMPT], 5, temperature=1e308, seed=3)[0]
    assert len(out) == 5 and all(0 <= t < V for t in out)


# ---------------------------------------------------------------- items 9, 13: arguments
@pytest.mark.parametrize(
    ("options", "code", "words"),
    [
        ({"temperature": 1.0, "seed": 2**64}, "E0815", "[0, 2**64)"),
        ({"temperature": 1.0, "seed": -1}, "E0815", "not -1"),
        ({"temperature": 1.0, "seed": 2**200}, "E0815", "seed"),
        ({"temperature": 1.0, "seed": 1.0}, "E0815", "seed"),
        ({"on_token": 3}, "E0815", "on_token must be None or a function"),
        ({"on_token": "print"}, "E0815", "on_token"),
        ({"stop_tokens": [V]}, "E0819", f"stop token {V} (in stop_tokens)"),
        ({"stop_tokens": [2, -1]}, "E0819", "its ids are [0, 256)"),
        ({"stop_tokens": [2**64]}, "E0819", "stop token"),
        # repetition_penalty is an option since issue 41; transformers' n-gram rule is not.
        ({"no_repeat_ngram_size": 3}, "E0794", "generate has no option `no_repeat_ngram_size`"),
        ({"temprature": 0.5}, "E0794", "did you mean `temperature`?"),
        ({"top-k": 5}, "E0794", "top_k"),
        ({"temperature": float("nan")}, "E0812", "nan"),
        ({"temperature": 1e309}, "E0812", "inf"),
        ({"temperature": "0.7"}, "E0812", "'0.7'"),
        ({"temperature": 1.0, "top_k": 2.0}, "E0813", "top_k"),
        ({"temperature": 1.0, "top_k": -(2**70)}, "E0813", "top_k"),
        ({"temperature": 1.0, "top_p": 0}, "E0814", "top_p"),
        ({"temperature": 1.0, "top_p": True}, "E0814", "top_p"),
        ({"max_new_tokens": 2**64}, "E0817", "max_new_tokens="),
        ({"max_new_tokens": 4.0}, "E0811", "max_new_tokens"),
        # Before: an OverflowError from the division (10**400 passed `< inf`).
        ({"temperature": 10**400, "seed": 0}, "E0812", "finite number"),
        ({"repetition_penalty": 0}, "E0867", "repetition_penalty must be None or a finite"),
        ({"repetition_penalty": -1.2}, "E0867", "not -1.2"),
        ({"repetition_penalty": float("nan")}, "E0867", "nan"),
        ({"repetition_penalty": float("inf")}, "E0867", "inf"),
        ({"repetition_penalty": 10**400}, "E0867", "repetition_penalty"),
        ({"repetition_penalty": True}, "E0867", "not True"),
        ({"repetition_penalty": "1.2"}, "E0867", "'1.2'"),
        ({"repetition_penalty": [1.2]}, "E0867", "[1.2]"),
    ],
)
def test_bad_generate_arguments_are_coded(model, options, code, words):
    options = {"max_new_tokens": 4} | options
    with pytest.raises(LinnetError) as err:
        model.generate([PROMPT], **options)
    assert code_of(err) == code and words in str(err.value), str(err.value)


@pytest.mark.parametrize("bad", [2**64, 2**31, -(2**63), V])
def test_prompt_ids_out_of_range_are_the_prefill_error(model, bad):
    # Before: 2**64 a ValueError, 2**31 a RuntimeError from torch.tensor(..., int32).
    with pytest.raises(LinnetError) as err:
        model.generate([PROMPT, [1, bad]], 4)
    assert code_of(err) == "E0780"
    assert f"input `tokens` of `prefill` has {bad} at index [1, 1]" in str(err.value)


def test_the_edges_of_the_ranges_run(model, greedy):
    stops = [V - 1, 0, greedy[2]]
    end = next(i + 1 for i, t in enumerate(greedy) if t in stops)
    assert model.generate([PROMPT], 6, stop_tokens=stops) == [greedy[:end]]
    last = 2**64 - 1
    assert model.generate([PROMPT], 3, temperature=1.0, seed=last) == model.generate(
        [PROMPT], 3, temperature=1.0, seed=last
    )
    huge_k = model.generate([PROMPT], 3, temperature=1.0, top_k=10**30, seed=4)
    assert huge_k == model.generate([PROMPT], 3, temperature=1.0, seed=4)  # k >= V: all kept
    assert model.generate([[V - 1, 0]], 1, on_token=lambda step, tokens: None)[0][0] in range(V)


# ---------------------------------------------------------------- issue 41: repetition penalty
@pytest.mark.parametrize("penalty", [1e308, 1e30, 5e-324, 1e-45, 1e-30])
def test_extreme_penalties_have_a_meaning(model, penalty):
    """Every finite penalty above 0 runs, greedy and sampling, and never picks from NaN:
    a penalty below float32's smallest normal acts as it (dividing a logit of 0 by a
    penalty rounded to 0 was NaN), a huge one sends seen negative logits to -inf."""
    greedy = model.generate([PROMPT, [1]], 6, repetition_penalty=penalty, stop_tokens=[])
    sampled = model.generate(
        [PROMPT, [1]], 6, temperature=0.8, top_p=0.9, seed=0, repetition_penalty=penalty
    )
    assert all(0 <= t < V for row in greedy + sampled for t in row)


def test_pick_on_penalised_rows_that_overflow():
    """Rows a penalty pushes to -inf (every token seen and negative, a huge penalty) or to
    inf (a tiny penalty): ties, never NaN or -1; a seen logit of 0 stays 0."""
    every = torch.ones((1, 4), dtype=torch.bool)
    negative = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    gen = torch.Generator().manual_seed(0)
    assert pick(negative, penalty=1e300, seen=every).tolist() == [0]  # all -inf: the lowest
    drawn = {int(pick(negative, 1.0, generator=gen, penalty=1e300, seen=every)) for _ in range(80)}
    assert drawn == {0, 1, 2, 3}  # all -inf: uniform, as ties
    seen = torch.tensor([[True, True, True, False]])
    # 5 and 4 divided by 1.2e-38 overflow to inf: tied (greedy: the lowest id); 0 stays 0.
    mixed = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    assert pick(mixed, penalty=5e-324, seen=seen).tolist() == [1]
    drawn = {
        int(pick(mixed, 0.5, top_p=0.9, generator=gen, penalty=5e-324, seen=seen))
        for _ in range(80)
    }
    assert drawn == {1, 2}
    # 2 and 1 stay finite (1.7e38, 8.5e37): the larger alone, as in the limit.
    small = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    drawn = {int(pick(small, 1.0, generator=gen, penalty=1e-45, seen=seen)) for _ in range(40)}
    assert drawn == {1}


@pytest.mark.parametrize("seen", [None, torch.zeros((1, 3), dtype=torch.bool)])
def test_pick_with_a_penalty_needs_the_seen_mask(seen):
    with pytest.raises(LinnetError) as err:
        pick(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), penalty=1.3, seen=seen)
    assert code_of(err) == "E0868" and "[1, 4]" in str(err.value)


def test_random_weights_checks_its_seed():
    with pytest.raises(LinnetError) as err:
        random_weights(LLAMA, toy_config(), seed=2**64)
    assert code_of(err) == "E0815"


# ---------------------------------------------------------------- `linnet run`
@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--temperature", "nan"], "E0812"),
        (["--temperature", "-1"], "E0812"),
        (["--temperature", "inf"], "E0812"),
        (["--top-k", "0"], "E0813"),
        (["--top-k", "-3"], "E0813"),
        (["--top-p", "0"], "E0814"),
        (["--top-p", "1.5"], "E0814"),
        (["--top-p", "nan"], "E0814"),
        (["--sampling-seed", "-1"], "E0815"),
        (["--sampling-seed", str(2**64)], "E0815"),
        (["--seed", "-1"], "E0815"),
        (["--seed", str(2**64)], "E0815"),
        (["--stop", "2,-1"], "E0819"),
        (["--stop", str(V)], "E0819"),
        (["--prompt", f"1,{2**64}"], "E0780"),
        (["--repetition-penalty", "0"], "E0867"),
        (["--repetition-penalty", "-1.3"], "E0867"),
        (["--repetition-penalty", "nan"], "E0867"),
        (["--repetition-penalty", "inf"], "E0867"),
    ],
)
def test_cli_run_bad_options(capsys, argv, code):
    from linnet.lang.cli import main

    rc = main(["run", str(LLAMA), "--config", "toy", "--tokens", "2", *argv])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"error[{code}]" in err and "Traceback" not in err


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_cli_run_jax_checks_its_seed(capsys, seed):
    pytest.importorskip("linnet.jax")
    from linnet.lang.cli import main

    # Before: NumPy's ValueError for -1 from the demo checkpoint's generator.
    assert main(["run", "--runtime", "jax", "--seed", seed]) == 1
    err = capsys.readouterr().err
    assert "error[E0815]: --seed must be an int in [0, 2**64)" in err and "Traceback" not in err


def test_cli_run_a_tiny_temperature_runs(capsys):
    from linnet.lang.cli import main

    # Before: torch.multinomial's RuntimeError (probabilities of NaN).
    assert (
        main(
            [
                "run",
                str(LLAMA),
                "--config",
                "toy",
                "--tokens",
                "2",
                "--temperature",
                "1e-45",
                "--sampling-seed",
                "3",
            ]
        )
        == 0
    )
    assert "decoded 2 tokens" in capsys.readouterr().out


def test_cli_repetition_penalty_is_checked_before_importing_torch(tmp_path):
    code = (
        "import sys\nfrom linnet.lang.cli import main\n"
        "rc = main(['run', '--repetition-penalty', '0'])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    env = os.environ | {"LINNET_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stdout.split() == ["1", "False"], done.stdout + done.stderr
    assert "error[E0867]: --repetition-penalty must be a finite number > 0" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "demo").exists()


def test_cli_run_checks_options_before_importing_torch(tmp_path):
    """The options are refused before a checkpoint is made and before torch is imported."""
    code = (
        "import sys\nfrom linnet.lang.cli import main\n"
        "rc = main(['run', '--temperature', '-1', '--top-k', '0'])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    env = os.environ | {"LINNET_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stdout.split() == ["1", "False"], done.stdout + done.stderr
    assert "error[E0812]" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "demo").exists()


# ---------------------------------------------------------------- `linnet kernels`
def kernels(capsys, *argv: str) -> tuple[int, str]:
    from linnet.lang.cli import main

    rc = main(["kernels", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out + out.err


@pytest.mark.parametrize(
    ("device", "code"),
    [
        ("tpu", "E0710"),
        ("cuda:x", "E0710"),
        ("cuda", "E0711"),
        ("cuda:7", "E0711"),
        ("xla", "E0711"),
    ],
)
def test_kernels_on_a_device_this_machine_lacks(capsys, device, code):
    if torch.cuda.is_available() and code == "E0711":
        pytest.skip("this machine has CUDA")
    rc, text = kernels(capsys, "--std", "--op", "rms_norm", "--device", device)
    assert rc == 1 and f"error[{code}]" in text and "case(s) checked" not in text


def test_kernels_through_pallas_on_a_device_that_is_none(capsys):
    pytest.importorskip("linnet.jax")
    # Before: a usage message and exit status 2, unlike the torch runtime's check.
    rc, text = kernels(capsys, "--std", "--runtime", "jax", "--device", "tpu")
    assert rc == 1 and "error[E0710]" in text


@pytest.mark.parametrize("device", ["xla", "vulkan"])
def test_a_device_torch_names_but_cannot_use_here(capsys, device):
    """Before: `linnet run --device xla` said the checkpoint was corrupt (E0650, with torch's
    dispatcher listing), `linnet kernels --device xla` a RuntimeError traceback."""
    from linnet.lang.cli import main

    assert main(["run", str(LLAMA), "--config", "toy", "--tokens", "1", "--device", device]) == 1
    err = capsys.readouterr().err
    assert (
        f"error[E0711]: device `{device}` was asked for, but this torch cannot use it" in err
        and "E0650" not in err
        and len(err) < 600
    ), err


def test_check_kernels_refuses_a_device_this_machine_lacks():
    from linnet.torch.testing import check_kernels

    with pytest.raises(LinnetError) as err:
        check_kernels(LLAMA, ops=["rms_norm"], device="tpu")
    assert code_of(err) == "E0710"


@pytest.mark.parametrize(
    ("op", "hint"),
    [
        ("rms_nrom", "did you mean `rms_norm`?"),
        ("std.nn.norm::rms_nrom", "did you mean `std.nn.norm::rms_norm`?"),
    ],
)
def test_kernels_op_that_names_nothing(capsys, op, hint):
    # Before: "no op here is bound to a kernel: nothing to check", exit status 0.
    rc, text = kernels(capsys, "--std", "--op", "rms_norm", "--op", op, "--device", "cpu")
    assert rc == 1 and "error[E0793]" in text and hint in text
    assert "case(s) checked" not in text  # refused before any kernel ran


def test_kernels_op_names_are_checked_over_every_file(capsys, tmp_path):
    """An --op of the std library is no error for a file that binds no kernel, checked with
    --std: the names are checked over all the files at once."""
    own = tmp_path / "plain.linnet"
    own.write_text("pub fn f(x: f32) -> f32 { return x }\n")
    rc, text = kernels(
        capsys,
        "--std",
        str(own),
        "--op",
        "silu_mul",
        "--count",
        "1",
        "--max-size",
        "8",
        "--dtype",
        "f32",
        "--device",
        "cpu",
    )
    assert rc == 0 and "silu_mul" in text and "every kernel agrees with its op" in text, text
    rc, text = kernels(capsys, str(own), "--op", "silu_mul", "--device", "cpu")
    assert rc == 1 and "error[E0793]" in text and "none" in text


def test_check_kernels_refuses_an_op_that_names_nothing():
    from linnet.torch.testing import check_kernels

    with pytest.raises(LinnetError) as err:
        check_kernels(LLAMA, ops=["rms_nrom"], device="cpu")
    assert code_of(err) == "E0793" and "rms_norm" in str(err.value)
