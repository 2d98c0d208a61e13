"""Bound ops launch their kernels from generated PyTorch, and fall back to the body, one
case at a time; each case says which path ran (the module's RUNS counters) and compares
with the op's body."""

import builtins
import sys

import pytest
import torch
from linnet.lang import Program
from linnet.torch import load
from linnet.torch.kernels import launch

SOFTMAX = """
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] { return softmax(x) }
}
"""


@pytest.fixture
def softmax_model(tmp_path):
    path = tmp_path / "m.linnet"
    path.write_text(SOFTMAX)
    return path


@pytest.fixture
def interpret(monkeypatch):
    """Triton's interpreter, chosen before any generated module is imported."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def runs(model, x):
    return model.module("run", [x]).RUNS


def test_interpreter_launches_row_softmax(softmax_model, interpret):
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(5, 24)
    y = model.run("run", [x])
    assert runs(model, x) == {"row_softmax_5_24_1024": [1, 0]}
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    text = open(model.source("run", [x])).read()
    assert "@triton.jit" in text and "# std/nn/activation.linnet:21  let v = load(" in text


def test_exact_numerics_runs_the_body(softmax_model, interpret):
    model = load(softmax_model, weights={}, numerics="exact")
    x = torch.randn(3, 8)
    y = model.run("run", [x])
    assert not hasattr(model.module("run", [x]), "RUNS")  # nothing to launch was written
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_where_clause_false_runs_the_body(softmax_model, interpret):
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(2, 1500)  # rows longer than the kernel's 1024-lane tile: B >= C fails
    y = model.run("run", [x])
    assert not hasattr(model.module("run", [x]), "RUNS")
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_cpu_without_interpreter_runs_the_body(softmax_model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(3, 8)
    y = model.run("run", [x])
    assert runs(model, x) == {"row_softmax_3_8_1024": [0, 1]}
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_no_triton_runs_the_body(softmax_model, interpret, monkeypatch):
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("no triton here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_triton)
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(4, 16)
    y = model.run("run", [x])
    module = model.module("run", [x])
    assert module.TRITON is False and module.RUNS == {"row_softmax_4_16_1024": [0, 1]}
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_launch_seam(interpret):
    x = torch.randn(4, 8)
    y, = launch("std.nn.activation::softmax", {"R": 4, "C": 8}, x)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    y, = launch("std.nn.activation::row_softmax", {"R": 4, "C": 8, "B": 8}, x,
                program=Program.from_text(""))
    torch.testing.assert_close(y, torch.softmax(x, -1))
