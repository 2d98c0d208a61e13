"""Tensor parallelism on torch.distributed (issue 21): 2 CPU processes with gloo.

Two runs of two ranks each, started once for the module (spawning costs seconds): one under
``torchrun`` (tests/parallel_ranks.py: ``load(..., world=2)``, the generated source and the
interpreter, 16 greedy tokens, a plan), one through ``linnet run --nproc 2``. Each must
match the single-process model on the same random weights (a safetensors file): f32
prefill logits within 1e-5, the same 16 greedy tokens. The errors run in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from linnet.lang import LinnetError
from linnet.torch import load
from linnet.torch.model import random_weights
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
PROMPT = [[3, 17, 100, 255, 9]]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    from linnet.lang.cli import load_config

    path = tmp_path_factory.mktemp("tp") / "toy.safetensors"
    w = random_weights(LLAMA, load_config("toy", [], str(LLAMA)), seed=7)
    save_file({k: v.contiguous() for k, v in w.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def single(weights):
    return load(LLAMA, weights=str(weights), config="toy")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def ranks(weights, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("tp") / "rank0.json"
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(HERE / "parallel_ranks.py"),
            str(weights),
            str(out),
        ]
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def cli_run(weights) -> str:
    return _run(
        [
            sys.executable,
            "-m",
            "linnet.lang.cli",
            "run",
            str(LLAMA),
            "--weights",
            str(weights),
            "--config",
            "toy",
            "--prompt",
            "3,17,100,255,9",
            "--tokens",
            "16",
            "--nproc",
            "2",
        ]
    ).stdout


def test_prefill_logits_match_one_process(ranks, single):
    tokens = torch.tensor(PROMPT, dtype=torch.int32)
    want = single.prefill(tokens, context=single.new_context("prefill", [tokens]))
    assert ranks["world"] == 2 and ranks["rank"] == 0
    for key in ("prefill", "prefill_interpreted"):
        got = torch.tensor(ranks[key])
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=key)


def test_16_greedy_tokens_equal(ranks, single):
    want = single.generate(PROMPT, max_new_tokens=16)
    assert ranks["generated"] == want and len(want[0]) == 16


def test_a_plan_runs_on_each_rank_and_explains_its_collectives(ranks, single):
    one = torch.tensor([5], dtype=torch.int32)
    want = single.decode(one, one, context=single.new_context("decode", [one, one]))
    torch.testing.assert_close(torch.tensor(ranks["plan_decode"]), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(ranks["decode"]), want, rtol=1e-5, atol=1e-5)
    text = ranks["explain"]
    assert "collectives of rank 0 of 2" in text
    # the embedding's, one after o and one after down in each of the 2 layers, the logits'
    assert text.count(" all_reduce sum ") == 5 and text.count(" all_gather axis 1 ") == 1
    for block in (
        "model.embed_tokens",
        "model.layers.1.self_attn.o_proj",
        "model.layers.1.mlp.down_proj",
        "the entry's result",
    ):
        assert f"[{block}]" in text, block
    assert "not timed: measure=False" in text and " us  [" not in text
    # Measured (every rank plans alike): each collective's time alone, and their sum.
    timed = ranks["explain_measured"]
    assert "each timed alone" in timed and timed.count(" us  [") == 6
    assert "us of collectives a step" in timed


def test_each_rank_holds_only_its_blocks(ranks, single):
    held = ranks["held"]
    whole = {p: list(t.shape) for p, t in single.params.items()}
    assert held["model.layers.0.self_attn.q_proj.weight"] == [32, 64]  # of [64, 64]
    assert held["model.layers.1.self_attn.o_proj.weight"] == [64, 32]
    assert held["model.layers.0.mlp.gate_proj.weight"] == [64, 64]  # of [128, 64]
    assert held["model.embed_tokens.weight"] == [128, 64] and held["lm_head.weight"] == [128, 64]
    assert held["model.norm.weight"] == whole["model.norm.weight"]
    assert sum(torch.Size(s).numel() for s in held.values()) < 0.6 * sum(
        torch.Size(s).numel() for s in whole.values()
    )


def test_the_rank_runs_generated_source_with_collectives(ranks):
    src = ranks["source"]
    assert "torch.distributed.all_reduce(" in src and "torch.distributed.all_gather(" in src


def test_linnet_run_nproc_2_matches_one_process(cli_run, weights, capsys):
    from linnet.lang.cli import main

    assert (
        main(
            [
                "run",
                str(LLAMA),
                "--weights",
                str(weights),
                "--config",
                "toy",
                "--prompt",
                "3,17,100,255,9",
                "--tokens",
                "16",
            ]
        )
        == 0
    )
    one = capsys.readouterr().out
    decoded = [line for line in one.splitlines() if line.startswith("decoded")]
    assert decoded and decoded == [
        line for line in cli_run.splitlines() if line.startswith("decoded")
    ]
    assert "rank 0 of 2" in cli_run and cli_run.count("loaded ") == 1  # rank 0 prints


# ---------------------------------------------------------------- errors, in this process
def test_world_without_a_process_group_is_E0821(weights, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=str(weights), config="toy", world=2)
    d = err.value.diagnostics[0]
    assert d.code == "E0821" and "torchrun" in d.help and "--nproc 2" in d.help


@pytest.mark.parametrize("world", [0, -1, True, 2.0, "2"])
def test_a_bad_world_is_E0821(weights, world):
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=str(weights), config="toy", world=world)
    assert err.value.diagnostics[0].code == "E0821"


def test_grad_with_world_is_E0823(weights):
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=str(weights), config="toy", world=2, grad=True)
    assert err.value.diagnostics[0].code == "E0823"


def test_a_collective_outside_a_process_group_is_E0820():
    from linnet.lang.ir.graph import Step
    from linnet.torch.interpreter import RULES

    for op, attrs in (("all_reduce", {"kind": "sum"}), ("all_gather", {"axis": 0})):
        step = Step(op, ["%x"], ["%y"], {"world": 2, **attrs}, "m.linnet:4")
        with pytest.raises(LinnetError) as err:
            RULES[op](step, [torch.ones(2)], torch.device("cpu"))
        d = err.value.diagnostics[0]
        assert d.code == "E0820" and "not initialised" in d.message and "m.linnet:4" in d.message


def test_nproc_0_is_E0824(weights, capsys):
    from linnet.lang.cli import main

    assert (
        main(["run", str(LLAMA), "--weights", str(weights), "--config", "toy", "--nproc", "0"]) == 1
    )
    assert "E0824" in capsys.readouterr().err
