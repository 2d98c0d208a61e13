"""Generated source against the interpreter, fast std calls against their bodies."""

from pathlib import Path

import pytest
import torch
from linnet.lang import Program, lower
from linnet.lang.emit.torch import FAST_CALLS, RULES, emit_torch
from linnet.lang.ir.primitives import PRIMITIVES
from linnet.torch import load, random_weights, run_graph
from linnet.torch.home import import_source
from linnet.torch.interpreter import missing_rules
from support import LLAMA, toy_config


def test_every_primitive_has_a_rule_everywhere():
    assert sorted(set(PRIMITIVES) - set(RULES)) == []
    assert missing_rules() == []


# Each fast call, with inputs, in a one-entry model that calls it.
FAST_CASES = {
    "std.nn.linear::linear": (
        "use std.nn.linear::{linear}",
        "linear(x, w)",
        {"x": ([3, 8], "f32"), "w": ([5, 8], "f32")},
        "[3, 5]",
    ),
    "std.nn.linear::linear_bias": (
        "use std.nn.linear::{linear_bias}",
        "linear_bias(x, w, b)",
        {"x": ([3, 8], "f32"), "w": ([5, 8], "f32"), "b": ([5], "f32")},
        "[3, 5]",
    ),
    "std.nn.embedding::embedding": (
        "use std.nn.embedding::{embedding}",
        "embedding(ids, t)",
        {"ids": ([4], "i32"), "t": ([10, 6], "f32")},
        "[4, 6]",
    ),
    "std.nn.norm::rms_norm": (
        "use std.nn.norm::{rms_norm}",
        "rms_norm(x, w, 1e-5)",
        {"x": ([3, 8], "f32"), "w": ([8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::silu": (
        "use std.nn.activation::{silu}",
        "silu(x)",
        {"x": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::silu_mul": (
        "use std.nn.activation::{silu_mul}",
        "silu_mul(x, u)",
        {"x": ([3, 8], "f32"), "u": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::softmax": (
        "use std.nn.activation::{softmax}",
        "softmax(x)",
        {"x": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.attention::decode_attention": (
        "use std.nn.attention::{decode_attention}",
        "decode_attention(q, kc, vc, pos, 0.25)",
        {
            "q": ([2, 2, 3, 16], "f32"),
            "kc": ([2, 12, 2, 16], "f32"),
            "vc": ([2, 12, 2, 16], "f32"),
            "pos": ([2], "i32"),
        },
        "[2, 2, 3, 16]",
    ),
    "std.nn.attention::causal_attention": (
        "use std.nn.attention::{causal_attention}",
        "causal_attention(q, k, v, 0.25)",
        {"q": ([2, 5, 2, 3, 16], "f32"), "k": ([2, 5, 2, 16], "f32"), "v": ([2, 5, 2, 16], "f32")},
        "[2, 5, 2, 3, 16]",
    ),
    # Issue 19's fast calls: sliding windows, Gemma's norm, LayerNorm, tanh gelu, Conv1D.
    "std.nn.attention::window_attention": (
        "use std.nn.attention::{window_attention}",
        "window_attention(q, k, v, 0.25, 3)",
        {"q": ([2, 7, 2, 3, 16], "f32"), "k": ([2, 7, 2, 16], "f32"), "v": ([2, 7, 2, 16], "f32")},
        "[2, 7, 2, 3, 16]",
    ),
    "std.nn.attention::window_decode_attention": (
        "use std.nn.attention::{window_decode_attention}",
        "window_decode_attention(q, kc, vc, pos, 0.25, 5)",
        {
            "q": ([2, 2, 3, 16], "f32"),
            "kc": ([2, 12, 2, 16], "f32"),
            "vc": ([2, 12, 2, 16], "f32"),
            "pos": ([2], "i32"),
        },
        "[2, 2, 3, 16]",
    ),
    "std.nn.norm::rms_norm_offset": (
        "use std.nn.norm::{rms_norm_offset}",
        "rms_norm_offset(x, w, 1e-5)",
        {"x": ([3, 8], "f32"), "w": ([8], "f32")},
        "[3, 8]",
    ),
    "std.nn.norm::layer_norm": (
        "use std.nn.norm::{layer_norm}",
        "layer_norm(x, w, b, 1e-5)",
        {"x": ([3, 8], "f32"), "w": ([8], "f32"), "b": ([8], "f32")},
        "[3, 8]",
    ),
    "std.nn.activation::gelu_tanh": (
        "use std.nn.activation::{gelu_tanh}",
        "gelu_tanh(x)",
        {"x": ([3, 8], "f32")},
        "[3, 8]",
    ),
    "std.nn.linear::linear_in_out_bias": (
        "use std.nn.linear::{linear_in_out_bias}",
        "linear_in_out_bias(x, w, b)",
        {"x": ([3, 8], "f32"), "w": ([8, 5], "f32"), "b": ([5], "f32")},
        "[3, 5]",
    ),
}


def fast_case_program(use: str, call: str, inputs: dict, out: str) -> Program:
    params = ", ".join(
        f"{n}: Tensor[{', '.join(str(d) for d in s)}; {t}]" for n, (s, t) in inputs.items()
    )
    return Program.from_text(f"""
{use}
model M {{
    entry run({params}) -> Tensor[{out.strip("[]")}; f32] {{
        return {call}
    }}
}}
""")


def random_input(shape, dtype, gen):
    if dtype == "i32":
        return torch.randint(
            0,
            shape[0] if len(shape) == 1 and shape[0] > 2 else 10,
            shape,
            generator=gen,
            dtype=torch.int32,
        )
    return torch.randn(shape, generator=gen)


@pytest.mark.parametrize("callee", sorted(FAST_CALLS))
def test_fast_call_equals_the_op_body(callee):
    use, call, inputs, out = FAST_CASES[callee]
    graph = lower(
        fast_case_program(use, call, inputs, out), "run", {n: s for n, (s, _) in inputs.items()}
    )
    assert graph.semantic_calls(callee), "the case must call the op"
    gen = torch.Generator().manual_seed(0)
    args = [random_input(s, t, gen) for s, t in inputs.values()]
    if callee in (
        "std.nn.attention::decode_attention",
        "std.nn.attention::window_decode_attention",
    ):
        args[3] = torch.tensor([4, 11], dtype=torch.int32)
    fast = import_source(emit_torch(graph, fast=True), "fast_case")
    body = import_source(emit_torch(graph, fast=False), "body_case")
    fast_text = Path(fast.__file__).read_text()
    assert "F." in fast_text or "torch.softmax" in fast_text
    got = fast.run(*args, {}, {})[0]
    want = body.run(*args, {}, {})[0]
    ref = run_graph(graph, args, {}, {})[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(want, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("callee", ["decode_attention", "window_decode_attention"])
def test_cpu_decode_reads_the_cache_only_up_to_the_furthest_position(callee):
    """On the CPU a decode step's attention reads the positions up to max(pos) only (the rest
    are masked out): equal to the op body at the cache's first and last positions; a CUDA
    or meta module reads all S (fixed shapes for CUDA graphs, no wait on pos)."""
    use, call, inputs, out = FAST_CASES[f"std.nn.attention::{callee}"]
    graph = lower(
        fast_case_program(use, call, inputs, out), "run", {n: s for n, (s, _) in inputs.items()}
    )
    cpu = emit_torch(graph, fast=True)
    assert "cache_reach(" in cpu
    for device in ("cuda", "cuda:1", "meta"):
        assert "cache_reach" not in emit_torch(graph, fast=True, device=device)
    fast = import_source(cpu, "reach_case")
    body = import_source(emit_torch(graph, fast=False), "reach_body")
    gen = torch.Generator().manual_seed(1)
    args = [random_input(s, t, gen) for s, t in inputs.values()]
    length = list(inputs.values())[1][0][1]
    for pos in ([0, 0], [length - 1, 2], [3, 3]):
        args[3] = torch.tensor(pos, dtype=torch.int32)
        torch.testing.assert_close(
            fast.run(*args, {}, {})[0], body.run(*args, {}, {})[0], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_llama_generated_matches_interpreter(dtype):
    cfg = toy_config(T=dtype)
    weights = random_weights(LLAMA, cfg, seed=1)
    tol = 1e-5 if dtype == "f32" else 3e-2
    models = [load(LLAMA, weights=weights, config=cfg, interpret=i) for i in (False, True)]
    tokens = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], dtype=torch.int32)
    prefill = [m.prefill(tokens) for m in models]
    torch.testing.assert_close(prefill[0], prefill[1], rtol=tol, atol=tol)
    token = torch.tensor([7, 8], dtype=torch.int32)
    pos = torch.tensor([5, 5], dtype=torch.int32)
    decode = [m.decode(token, pos) for m in models]
    torch.testing.assert_close(decode[0], decode[1], rtol=tol, atol=tol)


def test_generated_source_is_a_content_hashed_file(linnet_home):
    cfg = toy_config()
    model = load(LLAMA, weights=random_weights(LLAMA, cfg), config=cfg)
    token = torch.tensor([1], dtype=torch.int32)
    path = model.source("decode", [token, token])
    assert path.startswith(str(linnet_home / "generated"))
    text = Path(path).read_text()
    assert "def decode(token, pos, params, states):" in text
    assert "# llama.linnet:" in text
    assert (linnet_home.stat().st_mode & 0o777) == 0o700


def test_states_persist_across_calls_and_contexts_are_separate():
    cfg = toy_config()
    model = load(LLAMA, weights=random_weights(LLAMA, cfg, seed=2), config=cfg)
    tokens = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    model.prefill(tokens)
    step = model.decode(torch.tensor([4], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))
    longer = model.prefill(
        torch.tensor([[1, 2, 3, 4]], dtype=torch.int32),
        context=model.new_context("prefill", [tokens]),
    )
    torch.testing.assert_close(step[0], longer[0, -1], rtol=1e-5, atol=1e-5)


def test_numerics_fast_runs_close_to_exact():
    cfg = toy_config(T="bf16")
    w = random_weights(LLAMA, cfg, seed=3)
    tokens = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    exact = load(LLAMA, weights=w, config=cfg, numerics="exact").prefill(tokens)
    fast = load(LLAMA, weights=w, config=cfg, numerics="fast").prefill(tokens)
    torch.testing.assert_close(exact, fast, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("shift", ["i + 2", "i - 3", "i + 9", "i - 8", "i + 0"])
def test_shifted_reads_equal_the_interpreter(shift):
    prog = Program.from_text(f"""
model M {{
    entry run(x: Tensor[3, 8; f32]) -> Tensor[3, 8; f32] {{
        let y[r, i: 8] = x[r, {shift}] + 0.5
        return y
    }}
}}
""")
    graph = lower(prog, "run", {"x": [3, 8]})
    x = torch.randn(3, 8)
    got = import_source(emit_torch(graph), "shift_case").run(x, {}, {})[0]
    torch.testing.assert_close(got, run_graph(graph, [x], {}, {})[0])


def test_two_models_of_one_source_on_two_devices_run_side_by_side():
    """Issue 38 item 19: the generated module kept DEVICE as a global that each model set,
    and one module served every model of a source text, so a cpu model run after a meta one
    made its tensors on meta ("Tensor on device meta is not on the expected device cpu").
    The device is written into the text: a module per device."""
    cfg = toy_config()
    w = random_weights(LLAMA, cfg, seed=0)
    i32 = lambda v: torch.tensor([v], dtype=torch.int32)  # noqa: E731
    cpu = load(LLAMA, weights=w, config=cfg)
    want = [cpu.run("decode", [i32(1), i32(p)]) for p in (0, 1)]
    cpu = load(LLAMA, weights=w, config=cfg)
    first = cpu.run("decode", [i32(1), i32(0)])
    meta = load(LLAMA, weights={k: v.to("meta") for k, v in w.items()}, config=cfg, device="meta")
    for tokens in ([i32(1), i32(0)], [i32(1).to("meta"), i32(0).to("meta")]):
        out = meta.run("decode", tokens)
        assert out.device.type == "meta" and out.shape == want[0].shape
    second = cpu.run("decode", [i32(1), i32(1)])
    assert second.device.type == "cpu"
    torch.testing.assert_close([first, second], want, rtol=0, atol=0)
    assert cpu.module("decode", [i32(1), i32(0)]) is not meta.module("decode", [i32(1), i32(0)])
