"""The std ops' gradients against torch.autograd (issue 18), in f32 to 1e-4 relative.

Each std op is called by a one-entry model whose inputs are the op's tensor arguments; the
gradient graph (with respect to every float input) runs in the PyTorch interpreter and as
generated PyTorch source, and both match autograd through the interpreter of the forward.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
from gradcheck import autograd_reference, check_against_autograd
from linnet.lang import Program, lower
from linnet.lang.check.kernel_cases import integer_range
from linnet.lang.emit.torch import emit_torch

torch = pytest.importorskip("torch")

# name: (use line, entry params, call, result type, input shapes)
STD = {
    "silu": ("activation::{silu}", "x: Tensor[4, 6; f32]", "silu(x)", "Tensor[4, 6; f32]"),
    "gelu": ("activation::{gelu}", "x: Tensor[4, 6; f32]", "gelu(x)", "Tensor[4, 6; f32]"),
    "softmax": ("activation::{softmax}", "x: Tensor[4, 6; f32]", "softmax(x)", "Tensor[4, 6; f32]"),
    "linear": (
        "linear::{linear}",
        "x: Tensor[3, 5; f32], w: Tensor[4, 5; f32]",
        "linear(x, w)",
        "Tensor[3, 4; f32]",
    ),
    "linear_bias": (
        "linear::{linear_bias}",
        "x: Tensor[3, 5; f32], w: Tensor[4, 5; f32], b: Tensor[4; f32]",
        "linear_bias(x, w, b)",
        "Tensor[3, 4; f32]",
    ),
    # Quantised products: the gradient is with respect to x alone (the f32 inputs). The int8
    # levels and packed int4 bytes have none (integers), and the f16 scales and offsets are
    # not differentiated here: a quantised model is run, not trained.
    "linear_q8": (
        "linear::{linear_q8}",
        "x: Tensor[3, 8; f32], q: Tensor[4, 8; i8], s: Tensor[4, 2; f16]",
        "linear_q8<3, 8, 4, 2, 4, f32>(x, q, s)",
        "Tensor[3, 4; f32]",
    ),
    "linear_q4": (
        "linear::{linear_q4}",
        "x: Tensor[3, 8; f32], q: Tensor[4, 4; u8], d: Tensor[4, 2; f16], m: Tensor[4, 2; f16]",
        "linear_q4<3, 8, 4, 2, 4, f32>(x, q, d, m)",
        "Tensor[3, 4; f32]",
    ),
    "rms_norm": (
        "norm::{rms_norm}",
        "x: Tensor[3, 8; f32], w: Tensor[8; f32]",
        "rms_norm(x, w, 1e-5)",
        "Tensor[3, 8; f32]",
    ),
    "layer_norm": (
        "norm::{layer_norm}",
        "x: Tensor[3, 8; f32], w: Tensor[8; f32], b: Tensor[8; f32]",
        "layer_norm(x, w, b, 1e-5)",
        "Tensor[3, 8; f32]",
    ),
    "embedding": (
        "embedding::{embedding}",
        "ids: Tensor[5; i32], table: Tensor[6, 4; f32]",
        "embedding(ids, table)",
        "Tensor[5, 4; f32]",
    ),
    "rope": (
        "rope::{rope}",
        "x: Tensor[3, 2, 8; f32], pos: Tensor[3; i32]",
        "rope(x, pos, 10000.0)",
        "Tensor[3, 2, 8; f32]",
    ),
    "causal_attention": (
        "attention::{causal_attention}",
        "q: Tensor[1, 4, 2, 2, 8; f32], k: Tensor[1, 4, 2, 8; f32], v: Tensor[1, 4, 2, 8; f32]",
        "causal_attention(q, k, v, 0.35)",
        "Tensor[1, 4, 2, 2, 8; f32]",
    ),
    "decode_attention": (
        "attention::{decode_attention}",
        "q: Tensor[2, 2, 2, 8; f32], kc: Tensor[2, 5, 2, 8; f32], "
        "vc: Tensor[2, 5, 2, 8; f32], pos: Tensor[2; i32]",
        "decode_attention(q, kc, vc, pos, 0.35)",
        "Tensor[2, 2, 2, 8; f32]",
    ),
}


def _graph(name: str):
    use, params, call, result = STD[name]
    source = (
        f"use std.nn.{use}\nmodel M {{\n    entry run({params}) -> {result} {{\n"
        f"        return {call}\n    }}\n}}\n"
    )
    program = Program.from_text(source)
    shapes = {
        pname: [int(d) for d in dims.split(", ")]
        for pname, dims in re.findall(r"(\w+): Tensor\[([\d, ]+);", params)
    }
    return lower(program, "run", shapes), source


def _inputs(graph, rng):
    out = []
    for ref in graph.inputs:
        vt = graph.values[ref]
        if vt.dtype == "i32":
            out.append(torch.tensor(rng.integers(0, 3, size=vt.shape), dtype=torch.int32))
        elif vt.dtype in ("i8", "u8"):  # quantised levels, packed nibbles: their whole range
            ints = rng.integers(*integer_range(vt.dtype), size=vt.shape)
            out.append(torch.tensor(ints).to(torch.int8 if vt.dtype == "i8" else torch.uint8))
        elif vt.dtype == "f16":  # group scales and offsets
            out.append(torch.tensor(rng.standard_normal(vt.shape) * 0.05, dtype=torch.float16))
        else:
            out.append(torch.tensor(rng.standard_normal(vt.shape), dtype=torch.float32))
    return out


def _import(text: str, name: str, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(STD))
def test_std_op_gradient_matches_autograd(name, tmp_path):
    graph, _source = _graph(name)
    rng = np.random.default_rng(len(name))
    inputs = _inputs(graph, rng)
    wrt = [r for r in graph.inputs if graph.values[r].dtype == "f32"]
    grad_graph = check_against_autograd(graph, wrt, inputs, {}, rtol=1e-4, atol=1e-5, seed=1)
    # The same gradient graph as generated PyTorch source (fast calls and all).
    module = _import(emit_torch(grad_graph, origin=name), f"grad_std_{name}", tmp_path)
    cot = torch.tensor(
        np.random.default_rng(1).standard_normal(graph.values[graph.outputs[0]].shape),
        dtype=torch.float32,
    )
    got = module.run(*inputs, cot, {}, {})
    _, want = autograd_reference(graph, wrt, inputs, {}, [cot])
    for a, b in zip(got[1:], want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
