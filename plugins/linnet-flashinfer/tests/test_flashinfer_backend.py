"""The FlashInfer backend on the CPU: probe, match, regions, compile, and the planning logic
(pos read in prepare, once a step; never under capture) end to end against a stand-in for
FlashInfer's wrapper (flashinfer_fakes.py). The kernels themselves run only on a GPU:
benchmarks/gpu_flashinfer.py.

The graph tests lower the Llama example that ships in linnet-lang's wheel
(`linnet.lang.bundled.example()`): no Linnet checkout is needed.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path

import linnet.torch.flashinfer as fi
import linnet.torch.flashinfer.planning as planning
import pytest
import torch
from flashinfer_fakes import GPU, CpuFlashInfer, FakeWrapper
from linnet.backends import CONTRACT, Capabilities, Options, Target
from linnet.lang.bundled import example
from linnet.torch.flashinfer import DECODE_ATTENTION, FlashInfer, layout, page_size_for

HOPPER = Target("cuda", "cuda:0", "NVIDIA H200", (9, 0))
AMPERE = Target("cuda", "cuda:0", "NVIDIA A100", (8, 0))


def llama() -> Path:
    return example("llama") / "llama.linnet"


def config(name: str = "toy", **extra) -> dict:
    data = json.loads((llama().parent / "configs" / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


# The toy Llama in a dtype and head dim FlashInfer takes (the toy is f32 with head dim 16).
TOY = {"T": "bf16", "HD": 64}


def lowered(entry: str, inputs: dict, **extra):
    from linnet.lang import Program, lower

    return lower(Program.from_file(llama()), entry, inputs, config(**extra))


@pytest.fixture(scope="module")
def decode_graph():
    return lowered("decode", {"token": [1], "pos": [1]}, **TOY)


# ---------------------------------------------------------------- probe
def test_declares_this_hosts_contract():
    assert FlashInfer.contract == CONTRACT
    assert FlashInfer().name == "flashinfer"


def test_probe_declines_cpu_with_a_reason(installed):
    backend = FlashInfer()
    assert backend.probe(Target("cpu")) is None
    assert (
        backend.decline_reason(Target("cpu")) == "FlashInfer runs on CUDA GPUs; this target is cpu"
    )


def test_declining_also_says_flashinfer_is_missing(monkeypatch):
    # Every reason at once: no GPU (or one before Hopper) and no flashinfer-python.
    monkeypatch.setattr(fi, "_flashinfer_installed", lambda: False)
    backend = FlashInfer()
    assert backend.decline_reason(Target("cpu")) == (
        "FlashInfer runs on CUDA GPUs; this target is cpu; flashinfer-python is not installed "
        "either: pip install 'linnet-flashinfer[cuda]' (see the linnet-flashinfer README)"
    )
    ampere = backend.decline_reason(AMPERE) or ""
    assert "compute capability 8.0" in ampere and "flashinfer-python is not installed" in ampere
    assert backend.decline_reason(HOPPER) == (
        "flashinfer-python is not installed: pip install 'linnet-flashinfer[cuda]' (see the "
        "linnet-flashinfer README)"
    )


def test_flashinfer_installed_asks_without_importing(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # what a missing module looks like
    assert fi._flashinfer_installed() is False


def test_linnet_backends_on_a_cpu_machine_without_flashinfer(monkeypatch):
    """Issue 46 item 13: on a machine without a GPU or flashinfer-python, `linnet backends`
    lists FlashInfer as unavailable, saying why, never as available."""
    from linnet.backends import cli, discover, here

    monkeypatch.setattr(fi, "_flashinfer_installed", lambda: False)
    machine = here.Machine((here.HOST,), ("no CUDA device: torch sees none",))
    report = here.survey(discover(), machine)
    assert "flashinfer" not in [a.name for a in report.runnable]
    data = json.loads(cli.to_json(discover(), report))
    assert "flashinfer" not in [a["name"] for a in data["available"]]
    (entry,) = [a for a in data["unavailable"] if a["name"] == "flashinfer"]
    (cpu,) = entry["targets"]
    assert cpu["state"] == "declines"
    assert "CUDA GPUs" in cpu["reason"] and "flashinfer-python is not installed" in cpu["reason"]
    # A Hopper machine with FlashInfer missing: the GPU is fine, the library is the reason.
    gpu = here.survey(discover(), here.Machine((here.HOST, HOPPER)))
    (entry,) = [a for a in gpu.not_runnable if a.name == "flashinfer"]
    assert entry.results[1].reason.startswith("flashinfer-python is not installed")


def test_probe_declines_gpus_before_hopper(installed):
    backend = FlashInfer()
    assert backend.probe(AMPERE) is None
    reason = backend.decline_reason(AMPERE)
    assert reason is not None and "8.0" in reason and "Hopper" in reason
    assert "A100" in reason
    unknown = Target("cuda", "cuda:0", "some GPU", None)
    assert backend.probe(unknown) is None
    assert "compute capability" in (backend.decline_reason(unknown) or "")


def test_probe_accepts_hopper_and_later(installed):
    backend = FlashInfer()
    for capability in ((9, 0), (10, 0), (12, 0)):
        target = Target("cuda", "cuda:0", "GPU", capability)
        assert backend.decline_reason(target) is None
        caps = backend.probe(target)
        assert isinstance(caps, Capabilities)
        assert set(caps.dtypes) == {"bf16", "f16"}


def test_probe_declines_hopper_without_flashinfer(monkeypatch):
    monkeypatch.setattr(fi, "_flashinfer_installed", lambda: False)
    backend = FlashInfer()
    assert backend.probe(HOPPER) is None
    assert "pip install 'linnet-flashinfer[cuda]'" in (backend.decline_reason(HOPPER) or "")


def test_importing_the_plugin_does_not_import_flashinfer():
    # This process may have imported it for another reason; ask a fresh one.
    import subprocess

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, linnet.torch.flashinfer; print('flashinfer' in sys.modules)",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


# ---------------------------------------------------------------- match
def test_match_takes_one_region_per_layer(decode_graph):
    regions = FlashInfer().match(decode_graph, HOPPER)
    calls = decode_graph.semantic_calls(DECODE_ATTENTION)
    assert len(calls) == 2 and len(regions) == 2  # the toy has 2 layers
    for layer, (region, call) in enumerate(zip(regions, calls)):
        assert region.callee == DECODE_ATTENTION
        assert region.path == f"model.layers.{layer}.self_attn"
        assert (region.start, region.stop, region.index) == (call.start, call.stop, call.index)
        assert region.steps == tuple(range(call.start, call.stop))
        q, k, v, pos, scale = call.attributes["args"]
        assert scale == pytest.approx(64**-0.5)
        assert region.parameters == ()
        assert region.states == (k[1:], v[1:])
        assert region.states == (
            f"model.layers.{layer}.self_attn.k_cache",
            f"model.layers.{layer}.self_attn.v_cache",
        )
        assert region.outputs == tuple(call.attributes["results"])
        assert not region.writes_state
        # The query, the values hoisted out of the call (the mask made from pos and the
        # constants), then the entry's pos, which the call names as its argument.
        assert region.inputs[0] == q
        assert region.inputs[-1] == pos == "%pos" and pos in decode_graph.inputs
        hoisted = region.inputs[1:-1]
        producers = decode_graph.producers()
        assert hoisted and all(producers[value] < region.start for value in hoisted)
        mask = [value for value in hoisted if decode_graph.values[value].dtype == "bool"]
        assert len(mask) == 1 and decode_graph.values[mask[0]].shape == (1, 1, 1, 128)
    # Both layers compute the same thing on different caches: one kind, timed once.
    assert regions[0].kind == regions[1].kind


def test_match_takes_grouped_query_heads_at_8b_shapes():
    graph = lowered("decode", {"token": [8], "pos": [8]}, name="llama-3-8b", NL=2, V=512)
    regions = FlashInfer().match(graph, HOPPER)
    assert len(regions) == 2
    site, _ = fi.analyse(graph, graph.semantic_calls(DECODE_ATTENTION)[0])
    assert site is not None
    assert (
        site.shape.batch,
        site.shape.cache,
        site.shape.kv_heads,
        site.shape.group,
        site.shape.head_dim,
        site.shape.dtype,
    ) == (8, 2048, 8, 4, 128, "bf16")


def test_match_leaves_prefill_alone():
    graph = lowered("prefill", {"tokens": [1, 8]}, **TOY)
    assert len(graph.semantic_calls("std.nn.attention::causal_attention")) == 2
    assert graph.semantic_calls(DECODE_ATTENTION) == []
    assert FlashInfer().match(graph, HOPPER) == []


def test_match_declines_what_flashinfer_cannot_run_with_reasons():
    f32 = lowered("decode", {"token": [1], "pos": [1]})  # the toy as it is: f32, head dim 16
    assert FlashInfer().match(f32, HOPPER) == []
    reasons = [reason for _, reason in FlashInfer().declined(f32)]
    assert len(reasons) == 2 and all("dtype f32" in r for r in reasons)

    hd16 = lowered("decode", {"token": [1], "pos": [1]}, T="bf16")
    assert FlashInfer().match(hd16, HOPPER) == []
    assert all("head dim 16" in r for _, r in FlashInfer().declined(hd16))
    assert len(FlashInfer(head_dims=None).match(hd16, HOPPER)) == 2


def test_windowed_and_soft_capped_layers_are_taken():
    """Issue 45: a model with a global and a sliding-window layer (Qwen2's `layer_windows`),
    and Gemma 2's soft-capped layers: FlashInfer takes every layer, the windowed and capped
    ones with its window_left and logits_soft_cap (test_adversarial_flashinfer_variants.py
    checks the arguments and the results). (It used to decline both kinds.)"""
    from linnet.lang import Program, lower
    from linnet.lang.syntax.program import model_file

    dims = {"V": 256, "D": 256, "F": 512, "NL": 2, "H": 4, "KV": 2, "HD": 64, "S": 64}
    dims |= {"T": "bf16"}
    inputs = {"token": [1], "pos": [1]}
    qwen2 = Program.from_file(model_file("std.models.qwen2"))
    graph = lower(qwen2, "decode", inputs, dims | {"layer_windows": [0, 16]})
    assert len(FlashInfer().match(graph, HOPPER)) == 2
    assert FlashInfer().declined(graph) == []
    gemma2 = Program.from_file(model_file("std.models.gemma2"))
    capped = lower(gemma2, "decode", inputs, dims | {"layer_windows": [16, 0]})
    assert len(FlashInfer().match(capped, HOPPER)) == 2
    assert FlashInfer().declined(capped) == []


def test_match_declines_a_pos_computed_inside_the_entry(decode_graph):
    graph = copy.deepcopy(decode_graph)
    call = graph.semantic_calls(DECODE_ATTENTION)[0]
    computed = next(
        s.results[0] for s in graph.steps if s.op == "reshape" and s.operands == ["%pos"]
    )
    call.attributes["args"][3] = computed
    site, reason = fi.analyse(graph, call)
    assert site is None and "computed inside the entry" in reason


def test_cuda_core_kernel_takes_only_its_group_sizes():
    graph = lowered("decode", {"token": [1], "pos": [1]}, T="bf16", HD=64, H=10, KV=2)
    assert len(FlashInfer().match(graph, HOPPER)) == 2  # tensor cores: any group
    assert FlashInfer(use_tensor_cores=False).match(graph, HOPPER) == []
    assert "5 query heads per KV head" in FlashInfer(use_tensor_cores=False).declined(graph)[0][1]


# ---------------------------------------------------------------- layout
def test_page_table_views_the_std_cache_as_pages():
    assert page_size_for(2048, 16) == 16
    assert page_size_for(1152, 16) == 16
    assert page_size_for(100, 16) == 4
    assert page_size_for(128, 128) == 128
    # Rows of 1, 17 and 32 positions in pages of 16, 4 pages a row.
    assert layout([1, 17, 32], 16, 4) == ([0, 1, 3, 5], [0, 4, 5, 8, 9], [1, 1, 16])
    # One page a row: indptr = arange(B + 1), indices = arange(B) * 1, last = lengths.
    assert layout([5, 9], 128, 1) == ([0, 1, 2], [0, 1], [5, 9])


# ---------------------------------------------------------------- compile
def test_layers_share_one_wrapper_and_split_its_memory(decode_graph):
    backend = FlashInfer()
    regions = backend.match(decode_graph, HOPPER)
    executables = backend.compile_regions(regions, HOPPER, Options())
    assert len(executables) == 2
    planner = executables[0].planner
    assert executables[1].planner is planner
    out_bytes = 1 * 2 * 2 * 64 * 2  # [B, KV, G, HD] bf16
    assert planner.shared_bytes >= fi.WORKSPACE_BYTES + fi.INT_WORKSPACE_BYTES
    assert sum(e.meta.holds for e in executables) == planner.shared_bytes + 2 * out_bytes
    single = backend.compile(regions[0], HOPPER, Options())
    assert single.meta.holds == planner.shared_bytes + out_bytes
    assert single.planner is not planner


# ---------------------------------------------------------------- end to end (stand-in)


def toy_model(**extra):
    from linnet.torch import load, random_weights

    cfg = config(**{**TOY, **extra})
    weights = random_weights(llama(), cfg, seed=3, scale=0.2)
    return load(llama(), weights=weights, config=cfg)


def i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def first(outputs):
    """The entry's one output (plan.run returns a list, or the tensor itself)."""
    return outputs[0] if isinstance(outputs, list | tuple) else outputs


def test_conform_against_the_generated_source(installed):
    model = toy_model()
    findings = model.conform("decode", [i32(3), i32(5)], CpuFlashInfer(workspace_bytes=1 << 16))
    assert len(findings) == 2
    assert all(f.passed and f.difference is not None for f in findings), findings
    (wrapper,) = FakeWrapper.made
    assert wrapper.use_tensor_cores and wrapper.planned["page_size"] == 16


def test_plan_runs_many_steps_with_rows_at_different_positions(installed):
    model = toy_model(S=64)
    backend = CpuFlashInfer(workspace_bytes=1 << 16)
    token, pos = i32(1, 2), i32(0, 0)
    plan = model.plan_for("decode", [token, pos], backends=[backend], measure=False, progress=False)
    assert len(plan.regions) == 2
    ctx = model.context_for(plan)
    ref = model.new_context("decode", [token, pos])
    prompt = torch.randint(
        0, 256, (2, 20), dtype=torch.int32, generator=torch.Generator().manual_seed(0)
    )
    model.prefill(prompt, context=ctx)
    model.prefill(prompt, context=ref)
    planner = plan.executables[0].planner
    # plan_for ran each executable once, to check its outputs, and context_for prepared them
    # after that: count this loop's reads.
    host_reads, reads, plans = planner.host_reads, planner.reads, planner.plans
    tokens = [5, 7]
    steps = 24
    pages = []
    for i in range(steps):
        # Row 0 overwrites the prefilled positions from 3 on (positions past it must be
        # masked); row 1 continues after the prompt, across page boundaries (16, 32).
        pos = i32(3 + i, 20 + i)
        got = first(plan.run([i32(*tokens), pos], ctx))
        want = model.run("decode", [i32(*tokens), pos], context=ref)
        # bf16 throughout; the stand-in keeps probabilities in f32 where the std op rounds
        # them to bf16 (an off-by-one length is off by 10-70%).
        assert ((got - want).norm() / want.norm()).item() < 0.03
        torch.testing.assert_close(got, want, atol=0.15, rtol=0.05)
        tokens = want.argmax(-1).tolist()
        pages.append(tuple(-(-(p + 1) // 16) for p in pos.tolist()))
    assert planner.lengths == (3 + steps, 20 + steps)
    # plan.run calls no prepare: the first layer of each step plans, from the positions the
    # caller gave on the host (on the CPU every input is), never reading the device tensor.
    assert planner.host_reads - host_reads == steps and planner.reads == reads
    # plan() only when a row's page count changes; otherwise the last-page lengths alone.
    changes = 1 + sum(a != b for a, b in itertools.pairwise(pages))
    assert planner.plans - plans == changes == 3  # (1, 2) -> (1, 3) at pos 32 -> (2, 3) at 16
    (wrapper,) = FakeWrapper.made
    assert wrapper.plan_calls == planner.plans


def test_replan_always_plans_every_step(installed):
    model = toy_model(S=64)
    plan = model.plan_for(
        "decode",
        [i32(1), i32(0)],
        backends=[CpuFlashInfer(workspace_bytes=1 << 16, replan="always")],
        measure=False,
        progress=False,
    )
    ctx = model.context_for(plan)
    for i in range(5):
        plan.run([i32(1), i32(i)], ctx)
    assert plan.executables[0].planner.plans == 5


def test_captured_steps_plan_in_prepare_and_never_read_under_capture(installed, monkeypatch):
    """What Captured does, without a GPU: an eager step, prepare + capture, then for each
    replay: copy the inputs in, prepare every executable, replay (the stand-in runs with
    whatever the last plan wrote into the buffers)."""
    model = toy_model(S=64)
    token = i32(1, 2)
    plan = model.plan_for(
        "decode",
        [token, i32(0, 0)],
        backends=[CpuFlashInfer(workspace_bytes=1 << 16)],
        measure=False,
        progress=False,
    )
    ctx = model.context_for(plan)
    for state in ctx.states.values():
        state.normal_(generator=torch.Generator().manual_seed(1))
    executables = plan.executables
    planner = executables[0].planner
    # Captured runs prepare, capture and replay under inference mode (the plan's buffers
    # are inference tensors); so does this stand-in.
    with torch.inference_mode():
        static = [token.clone(), i32(4, 9)]  # Captured's input buffers
        plan.run(static, ctx)  # the first call runs eagerly, on them
        assert ctx.inputs["%token"] is static[0] and ctx.inputs["%pos"] is static[1]
        for ex in executables:
            ex.prepare(ctx)
        reads, host_reads = planner.reads, planner.host_reads
        monkeypatch.setattr(fi, "_capturing", lambda: True)
        monkeypatch.setattr(planning, "_capturing", lambda: True)
        recorded = []  # "capture": execute records; it must not read pos or plan
        for ex in executables:
            q = torch.randn(2, 2, 2, 64).to(torch.bfloat16)
            inputs = [None] * len(ex.site.region.inputs)
            inputs[ex.site.q_index], inputs[ex.site.pos_index] = q, static[1]
            ex.execute(inputs, [], ctx)
            recorded.append((ex, inputs))
        assert planner.reads == reads and planner.source is static[1]
        device_reads = 0
        for step, positions in enumerate([(5, 10), (6, 11), (30, 40), (31, 41), (32, 42)]):
            static[1].copy_(i32(*positions))  # Captured copies the new inputs in
            # ... and hands prepare the positions the caller gave on the host; given on the
            # device (odd steps here), prepare reads the input buffer instead.
            on_host = step % 2 == 0
            ctx.host_inputs = {"%pos": i32(*positions)} if on_host else {}
            for ex in executables:
                ex.prepare(ctx)
            device_reads += not on_host
            # one read a step, whatever the layers: of the host copy, or of the device
            assert planner.reads == reads + device_reads
            assert planner.host_reads == host_reads + step + 1 - device_reads
            assert planner.lengths == tuple(p + 1 for p in positions)
            for ex, inputs in recorded:  # "replay"
                (out,) = ex.execute(inputs, [], ctx)
                assert planner.reads == reads + device_reads
                q = inputs[ex.site.q_index]
                k = ctx.states[ex.site.k_cache].float()
                v = ctx.states[ex.site.v_cache].float()
                for b, p in enumerate(positions):
                    for h in range(2):
                        for g in range(2):
                            scores = k[b, : p + 1, h] @ q[b, h, g].float() * 64**-0.5
                            want = torch.softmax(scores, 0) @ v[b, : p + 1, h]
                            torch.testing.assert_close(
                                out[b, h, g].float(), want, atol=2e-2, rtol=2e-2
                            )


@pytest.mark.parametrize("split_kv, options", [("auto", {}), ("off", {"disable_split_kv": True})])
def test_split_kv_reaches_plan_and_the_timing_key(installed, split_kv, options):
    model = toy_model(S=64)
    backend = CpuFlashInfer(workspace_bytes=1 << 16, split_kv=split_kv)
    assert (split_kv == "auto") == ("split" not in backend.version)
    plan = model.plan_for(
        "decode", [i32(1), i32(0)], backends=[backend], measure=False, progress=False
    )
    plan.run([i32(1), i32(3)], model.context_for(plan))
    (wrapper,) = FakeWrapper.made
    planned = {
        k: v for k, v in wrapper.planned.items() if k in ("disable_split_kv", "fixed_split_size")
    }
    assert planned == options


def test_split_kv_is_checked():
    with pytest.raises(ValueError, match="split_kv must be 'auto' or 'off'"):
        FlashInfer(split_kv="sometimes")
    with pytest.raises(ValueError, match="fails under CUDA graphs"):
        FlashInfer(split_kv=8)


def test_prepare_plans_for_the_tensor_the_coming_step_reads(installed):
    """A plan run eagerly (its executes saw one pos tensor) and then replayed (Captured's
    prepare, with pos given on the device): prepare follows context.inputs, not the tensor
    the last execute saw."""
    model = toy_model(S=64)
    plan = model.plan_for(
        "decode",
        [i32(1, 2), i32(0, 0)],
        backends=[CpuFlashInfer(workspace_bytes=1 << 16)],
        measure=False,
        progress=False,
    )
    ctx = model.context_for(plan)
    planner = plan.executables[0].planner
    with torch.inference_mode():
        eager_pos = i32(4, 9)
        plan.run([i32(1, 2), eager_pos], ctx)
        assert planner.lengths == (5, 10)
        static = i32(30, 40)  # the graph's input buffer, as Captured hands it over
        ctx.inputs, ctx.host_inputs = {"%pos": static}, {}
        for ex in plan.executables:
            ex.prepare(ctx)
        assert planner.source is static and planner.lengths == (31, 41)
        reads = planner.reads
        static.copy_(i32(31, 41))
        for ex in plan.executables:
            ex.prepare(ctx)
        assert planner.lengths == (32, 42) and planner.reads == reads + 1


def test_capture_before_any_plan_is_an_error(installed, decode_graph, monkeypatch):
    backend = FlashInfer()
    (ex, _) = backend.compile_regions(backend.match(decode_graph, HOPPER), HOPPER, Options())
    monkeypatch.setattr(fi, "_capturing", lambda: True)
    monkeypatch.setattr(planning, "_capturing", lambda: True)
    inputs = [None] * len(ex.site.region.inputs)
    inputs[ex.site.q_index] = torch.zeros(1, 2, 2, 64, dtype=torch.bfloat16)
    inputs[ex.site.pos_index] = i32(0)
    with pytest.raises(RuntimeError, match="run the step once outside the graph"):
        ex.execute(inputs, [], None)


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    from linnet.backends import available, skipped

    (point,) = [e for e in entry_points(group="linnet.backends") if e.name == "flashinfer"]
    assert point.value == "linnet.torch.flashinfer:FlashInfer"
    assert point.dist is not None and point.dist.name == "linnet-flashinfer"
    assert "flashinfer" in [b.name for b in available()]
    assert not [r for r in skipped() if r.name == "flashinfer"]


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("pos_on", ["host", "device"])
def test_captured_replays_equal_eager_steps_on_a_gpu(pos_on):
    """Graph safety: 48 steps of a FlashInfer plan under Captured (planned in prepare before
    each replay) against the same plan run eagerly (planned in execute) on its own context,
    both fed the same tokens, rows at different positions across page boundaries. Same
    kernels both ways: any stale plan shows as a large difference."""
    from linnet.torch import load, random_weights
    from linnet.torch.planned import Captured

    device = torch.device("cuda")
    cfg = config(**TOY, S=128)
    model = load(
        llama(),
        weights=random_weights(llama(), cfg, seed=3, scale=0.2, device=device),
        config=cfg,
        device=device,
    )
    backend = FlashInfer()
    findings = model.conform("decode", [i32(3, 4).to(device), i32(5, 17).to(device)], backend)
    assert len(findings) == 2 and all(f.passed for f in findings), findings
    plan = model.plan_for(
        "decode", [i32(1, 2), i32(0, 0)], backends=[backend], measure=False, progress=False
    )
    assert len(plan.regions) == 2, plan.explain()
    captured_ctx, eager_ctx = model.context_for(plan), model.context_for(plan)
    prompt = torch.randint(
        0,
        cfg["V"],
        (2, 20),
        dtype=torch.int32,
        device=device,
        generator=torch.Generator(device).manual_seed(0),
    )
    model.prefill(prompt, context=captured_ctx)
    model.prefill(prompt, context=eager_ctx)
    step = Captured(plan, captured_ctx)
    # plan_for ran each executable once to check its outputs, and context_for prepared them
    # after that (which may read the checked step's positions): count the loop's reads.
    reads = plan.executables[0].planner.reads
    tokens = [5, 7]
    for i in range(48):
        pos = i32(3 + i, 20 + i)  # row 0 overwrites prefilled positions; row 1 continues
        if pos_on == "device":
            pos = pos.to(device)
        token = i32(*tokens).to(device)
        (got,) = step([token, pos])
        (want,) = plan.run([token, pos], eager_ctx)
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
        tokens = want.argmax(-1).tolist()
    planner = plan.executables[0].planner
    if pos_on == "host":
        assert planner.reads == reads  # never read back from the device
