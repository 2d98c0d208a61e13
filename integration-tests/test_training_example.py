"""The training example (examples/tinylm, issue 18): a tiny causal LM trained on the CPU with
the gradients Linnet generates, its loss falling, and the same run by torch.autograd of the
generated forward agreeing with it step by step."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _train_module():
    spec = importlib.util.spec_from_file_location("tinylm_train", ROOT / "examples/tinylm/train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_loss_falls_and_matches_autograd():
    train = _train_module()
    steps = 300
    losses = train.train(steps)
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    vocab = train.load_model().config["V"]
    assert abs(losses[0] - math.log(vocab)) < 0.5  # starts near chance
    head, tail = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert tail < 0.5 < 2.0 < head, (head, tail)  # and learns the task
    reference = train.train(steps, use_autograd=True)
    for i, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (i, a, b)


def test_one_step_gradients_match_autograd_for_every_parameter():
    train = _train_module()
    model = train.load_model(seed=3)
    tokens, targets = train.batches(1, model.config["B"], 16, model.config["V"], 5)[0]
    loss, grads = model.value_and_grad("loss", [tokens, targets])
    ref_loss, ref = train.autograd_loss(model, tokens, targets)
    assert set(grads) == set(ref) == set(model.params)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for path in ref:
        scale = float(ref[path].abs().max())
        torch.testing.assert_close(
            grads[path], ref[path], rtol=1e-4, atol=1e-4 * scale, msg=lambda m, p=path: f"{p}: {m}"
        )


def test_the_script_runs_from_the_command_line(capsys):
    assert _train_module().main(["--steps", "20"]) == 0
    assert "linnet gradients: loss" in capsys.readouterr().out
