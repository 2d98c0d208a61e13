"""FlashInfer's sliding windows and soft-capping (issue 45): the plugin takes
``window_decode_attention`` and ``softcap_decode_attention`` calls with FlashInfer's
``window_left`` (Linnet's window - 1) and ``logits_soft_cap`` (the same cap, the scale applied
before it), and declines with a reason what FlashInfer would compute differently (a window
below 1, a cap of 0 or below). On the CPU the plugin runs against the stand-in wrapper
(flashinfer_fakes.py computes both as FlashInfer's kernels do), compared per region with the
generated source (the op bodies) on a prefilled cache where the window and the cap change the
result; on a GPU (gpu-marked) against FlashInfer itself."""

from __future__ import annotations

import copy

import linnet.torch.flashinfer as fi
import pytest
import torch
from flashinfer_fakes import GPU, CpuFlashInfer, FakeWrapper
from linnet.backends import Options, Target
from linnet.torch.flashinfer import (
    SOFTCAP_DECODE_ATTENTION,
    WINDOW_DECODE_ATTENTION,
    FlashInfer,
)
from linnet.torch.flashinfer.variants import Variant, variant_of, window_left_for

HOPPER = Target("cuda", "cuda:0", "NVIDIA H200", (9, 0))
DIMS = {"V": 256, "D": 256, "F": 512, "NL": 2, "H": 4, "KV": 2, "HD": 64, "S": 64, "T": "bf16"}
PROMPT = 20


def decode_graph(model: str, **extra):
    from linnet.lang import Program, lower
    from linnet.lang.syntax.program import model_file

    program = Program.from_file(model_file(f"std.models.{model}"))
    return lower(program, "decode", {"token": [1], "pos": [1]}, DIMS | extra)


# ---------------------------------------------------------------- the claim and its arguments
def test_window_left_is_the_window_less_one():
    """Linnet's window keeps pos - window < j <= pos (window positions, the current one
    included); FlashInfer's window_left keeps j >= pos - window_left."""
    assert [window_left_for(w) for w in (1, 8, 4096)] == [0, 7, 4095]
    assert window_left_for(0, global_below_one=True) == -1
    with pytest.raises(ValueError):
        window_left_for(0)


def test_windowed_and_soft_capped_layers_are_taken_with_their_arguments():
    """Qwen2 with a global and a windowed layer, Gemma 2 with a windowed and a global
    soft-capped layer: every layer is taken, each with its window and cap."""
    qwen2 = decode_graph("qwen2", layer_windows=[0, 16])
    sites = [site for _, site, _ in FlashInfer().sites(qwen2)]
    assert all(site is not None for site in sites) and len(sites) == 2
    assert [(s.shape.window_left, s.shape.soft_cap) for s in sites] == [(-1, 0.0), (15, 0.0)]
    assert FlashInfer().declined(qwen2) == []
    gemma2 = decode_graph("gemma2", layer_windows=[16, 0], attn_logit_softcapping=20.0)
    sites = [site for _, site, _ in FlashInfer().sites(gemma2)]
    assert all(site is not None for site in sites) and len(sites) == 2
    assert [(s.shape.window_left, s.shape.soft_cap) for s in sites] == [(15, 20.0), (-1, 20.0)]
    assert len(FlashInfer().match(gemma2, HOPPER)) == 2


def test_layers_of_other_windows_plan_their_own_wrapper(installed):
    """window_left and logits_soft_cap are plan() arguments: a windowed and a global layer
    cannot share one planned wrapper."""
    graph = decode_graph("qwen2", layer_windows=[0, 16])
    backend = CpuFlashInfer()
    executables = backend.compile_regions(backend.match(graph, HOPPER), HOPPER, Options())
    assert executables[0].planner is not executables[1].planner
    assert executables[0].planner.shape.variant.plan_options() == {}
    assert executables[1].planner.shape.variant.plan_options() == {"window_left": 15}
    assert Variant(-1, 20.0).plan_options() == {"logits_soft_cap": 20.0}


@pytest.mark.parametrize(
    "callee,index,value,reason",
    [
        (WINDOW_DECODE_ATTENTION, 5, 0, "keeps no cache position"),
        (WINDOW_DECODE_ATTENTION, 5, -3, "keeps no cache position"),
        (WINDOW_DECODE_ATTENTION, 5, 2.5, "not a whole number"),
        (WINDOW_DECODE_ATTENTION, 5, "%not_a_constant", "is not a constant"),
        (SOFTCAP_DECODE_ATTENTION, 6, 0.0, "positive finite cap"),
        (SOFTCAP_DECODE_ATTENTION, 6, -5.0, "positive finite cap"),
        (SOFTCAP_DECODE_ATTENTION, 6, float("inf"), "positive finite cap"),
    ],
)
def test_what_flashinfer_would_compute_otherwise_is_declined(callee, index, value, reason):
    """A window below 1 (the op keeps no position: NaN), a cap of 0 or below (FlashInfer
    then does not cap, the op does): declined with the reason, never run differently."""
    model, extra = (
        ("qwen2", {"layer_windows": [16, 16]})
        if callee == WINDOW_DECODE_ATTENTION
        else ("gemma2", {"layer_windows": [16, 0]})
    )
    graph = copy.deepcopy(decode_graph(model, **extra))
    call = graph.semantic_calls(callee)[0]
    call.attributes["args"][index] = value
    args, _, why = variant_of(graph, call)
    assert args is None and reason in why
    site, why = fi.analyse(graph, call)
    assert site is None and reason in why
    assert any(reason in r for c, r in FlashInfer().declined(graph) if c.index == call.index)


def test_a_soft_capped_call_without_a_window_is_global():
    graph = decode_graph("gemma2", layer_windows=[0, 0], attn_logit_softcapping=20.0)
    for call in graph.semantic_calls(SOFTCAP_DECODE_ATTENTION):
        _, variant, _ = variant_of(graph, call)
        assert variant == Variant(-1, 20.0)


# ---------------------------------------------------------------- end to end
def _model(name: str, device: str = "cpu", **extra):
    from linnet.lang.syntax.program import model_file
    from linnet.torch import load, random_weights

    path = model_file(f"std.models.{name}")
    cfg = DIMS | extra
    weights = random_weights(path, cfg, seed=3, scale=0.2, device=device)
    return load(path, weights=weights, config=cfg, device=device)


def _conform(model, backend, device: str = "cpu"):
    """Per-region findings of ``backend`` on a decode step at position PROMPT + 3 after a
    PROMPT-token prefill (a window of 8 leaves out most of the cache)."""
    prompt = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    token = torch.tensor([7], dtype=torch.int32)
    pos = torch.tensor([PROMPT + 3], dtype=torch.int32)
    context = model.new_context("decode", [token, pos])
    model.prefill(prompt.to(torch.int32).to(device), context=context)
    return model.conform("decode", [token.to(device), pos.to(device)], backend, context=context)


CASES = {
    # (model, config): a windowed and a global layer; soft-capped ones with a small cap (the
    # scores are about its size: tanh is far from linear there).
    "window": ("qwen2", {"layer_windows": [8, 0]}),
    "softcap-window": ("gemma2", {"layer_windows": [8, 0], "attn_logit_softcapping": 0.5}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_windowed_and_capped_decode_equals_the_op_bodies(installed, case):
    name, extra = CASES[case]
    findings = _conform(_model(name, **extra), CpuFlashInfer(workspace_bytes=1 << 16))
    assert len(findings) == 2 and all(f.passed for f in findings), findings
    planned = sorted(
        (w.planned.get("window_left", -1), w.planned.get("logits_soft_cap", 0.0))
        for w in FakeWrapper.made
    )
    assert planned == sorted(
        {(7, extra.get("attn_logit_softcapping", 0.0) or 0.0)}
        | {(-1, extra.get("attn_logit_softcapping", 0.0) or 0.0)}
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_off_by_one_window_or_a_cap_after_the_scale_would_be_caught(
    installed, monkeypatch, case
):
    """The comparison above sees the arguments: a window_left one larger (the window's
    inclusive end misread), or the cap given as cap / scale, differs from the op body."""
    name, extra = CASES[case]
    model = _model(name, **extra)
    wrong = (
        (lambda self: {"window_left": self.window_left + 1} if self.window_left >= 0 else {})
        if case == "window"
        else (lambda self: {"logits_soft_cap": self.soft_cap * 8.0} if self.soft_cap else {})
    )
    monkeypatch.setattr(Variant, "plan_options", wrong)
    findings = _conform(model, CpuFlashInfer(workspace_bytes=1 << 16))
    assert not all(f.passed for f in findings), findings


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("case", sorted(CASES))
def test_flashinfer_windows_and_caps_equal_the_op_bodies_on_a_gpu(case):
    """FlashInfer itself (its window_left and logits_soft_cap kernels) against the generated
    source of window_decode_attention and softcap_decode_attention, per layer, bf16."""
    name, extra = CASES[case]
    model = _model(name, device="cuda", **extra)
    findings = _conform(model, FlashInfer(), device="cuda")
    assert len(findings) == 2 and all(f.passed for f in findings), findings
