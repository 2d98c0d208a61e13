"""Tests of the example backend. Run them after installing it (see README.md): `pytest`.

They need no Linnet checkout: the Llama example they lower ships inside linnet-lang's wheel
(`linnet.lang.bundled.example()`).
"""

from __future__ import annotations

import json
import types

import pytest
import torch
from linnet.backends import CONTRACT, Options, Target, available, runnable, skipped
from linnet.lang.bundled import example
from linnet_backend_example import LINEAR, ExampleLinear


@pytest.fixture(scope="module")
def decode_graph():
    """The toy Llama's decode entry, lowered for one token."""
    from linnet.lang import Program, lower

    llama = example("llama")
    config = json.loads((llama / "configs" / "toy.json").read_text())
    config = {key: value for key, value in config.items() if not key.startswith("_")}
    program = Program.from_file(llama / "llama.linnet")
    return lower(program, "decode", {"token": [1], "pos": [1]}, config)


def test_linnet_finds_it():
    assert "example-linear" in [backend.name for backend in available()], (
        "install this package (`pip install -e .`) so that its entry point is registered"
    )
    assert [r for r in skipped() if r.name == "example-linear"] == []


def test_declares_this_hosts_contract():
    # A literal in the class, compared with the installed host's number here: when a new
    # linnet-plan implements another contract, this fails and says to port the backend.
    assert isinstance(ExampleLinear.contract, int)
    assert ExampleLinear.contract == CONTRACT, (
        f"written for contract {ExampleLinear.contract}, the host implements {CONTRACT}"
    )


def test_probe_accepts_cpu_and_cuda():
    backend = ExampleLinear()
    assert backend.probe(Target("cpu")) is not None
    assert backend.probe(Target("cuda", capability=(9, 0))) is not None
    assert backend.probe(Target("tpu")) is None


def test_decline_reason_says_why_probe_declines():
    backend = ExampleLinear()
    assert backend.decline_reason(Target("cpu")) is None
    assert "this target is tpu" in (backend.decline_reason(Target("tpu")) or "")


def test_linnet_can_run_it_here():
    # `linnet backends` lists it under "available": it runs on this machine's CPU.
    assert "example-linear" in [backend.name for backend in runnable()]


def test_match_finds_every_linear(decode_graph):
    regions = ExampleLinear().match(decode_graph, Target("cpu"))
    # 7 per layer (q, k, v, o, gate, up, down) in 2 layers, and lm_head.
    assert len(regions) == 15
    assert all(region.callee == LINEAR for region in regions)
    assert [r.parameters for r in regions][-1] == ("lm_head.weight",)


def test_execute_computes_the_ops_math(decode_graph):
    region = ExampleLinear().match(decode_graph, Target("cpu"))[0]
    executable = ExampleLinear().compile(region, Target("cpu"), Options())
    (weight_path,) = region.parameters
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*decode_graph.values[region.inputs[0]].shape, generator=generator)
    w = torch.randn(*decode_graph.parameters[weight_path].shape, generator=generator)
    context = types.SimpleNamespace(parameters={weight_path: w})

    executable.prepare(context)
    (y,) = executable.execute([x], [], context)

    # std.nn.linear::linear: y[n, o] = sum_i x[n, i] * w[o, i]
    torch.testing.assert_close(y, torch.einsum("ni,oi->no", x, w))
    assert list(y.shape) == list(decode_graph.values[region.outputs[0]].shape)
