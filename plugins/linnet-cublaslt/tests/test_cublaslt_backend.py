"""The cuBLASLt backend on the CPU: probe, match (single linears and sibling groups, found
through the graph's calls), regions, holds, estimate_cost, and the executables' plumbing
(join, split views, staging, fresh outputs) end to end through plans, with the reference
kernel (``torch.matmul`` into the same buffers) standing in for cuBLASLt. The cuBLASLt calls
themselves run only on a GPU: the ``gpu`` tests here and benchmarks/gpu_cublaslt.py.

The Llama tests lower the Llama example that ships in linnet-lang's wheel
(`linnet.lang.bundled.example()`): no Linnet checkout is needed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import linnet.torch.cublaslt as cl
import pytest
import torch
from linnet.backends import CONTRACT, Capabilities, Options, Target
from linnet.lang.bundled import example
from linnet.torch.cublaslt import LINEAR, CublasLt, LinearGemm, spec_for

H200 = Target("cuda", "cuda:0", "NVIDIA H200", (9, 0))
TOKEN = torch.tensor([3], dtype=torch.int32)
POS = torch.tensor([0], dtype=torch.int32)


def llama() -> Path:
    return example("llama") / "llama.linnet"


def config(name: str = "toy", **extra) -> dict:
    data = json.loads((llama().parent / "configs" / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


def decode_graph(name: str = "toy", **extra):
    from linnet.lang import Program, lower

    return lower(
        Program.from_file(llama()), "decode", {"token": [1], "pos": [1]}, config(name, **extra)
    )


class OnCpu(CublasLt):
    """The backend with its probe accepting the CPU: its executables then run the reference
    kernel, so that plans exercise everything but the cuBLASLt call."""

    def probe(self, target):
        return Capabilities(dtypes=("f32", "bf16")) if target.kind == "cpu" else None


# ---------------------------------------------------------------- probe
def test_declares_this_hosts_contract():
    assert CublasLt.contract == CONTRACT
    assert CublasLt.name == "cublaslt"
    assert CublasLt.version == cl.__version__


def test_probe_declines_the_cpu_with_a_reason(monkeypatch):
    monkeypatch.setattr(cl._backend, "_nvmath_installed", lambda: True)
    backend = CublasLt()
    assert backend.probe(Target("cpu")) is None
    assert backend.last_reason == "cuBLASLt runs on CUDA devices only; this target is cpu"
    assert backend.decline_reason(Target("cpu")) == backend.last_reason
    assert backend.probe(Target("tpu")) is None
    assert "tpu" in (backend.last_reason or "")


def test_declining_the_cpu_also_says_nvmath_is_missing(monkeypatch):
    # Every reason at once: on a CPU machine without nvmath-python the user learns both.
    monkeypatch.setitem(sys.modules, "nvmath", None)  # not installed, as find_spec sees it
    backend = CublasLt()
    assert backend.probe(Target("cpu")) is None
    assert backend.last_reason == (
        "cuBLASLt runs on CUDA devices only; this target is cpu; nvmath-python is not "
        "installed either: install `linnet-cublaslt[cu13]` on CUDA 13 or "
        "`linnet-cublaslt[cu12]` on CUDA 12"
    )
    old_gpu = Target("cuda", "cuda:0", "Tesla P100", (6, 0))
    assert "compute capability 7.0" in (backend.decline_reason(old_gpu) or "")
    assert "nvmath-python is not installed either" in (backend.decline_reason(old_gpu) or "")


def test_linnet_backends_on_a_cpu_machine_without_nvmath(monkeypatch, capsys):
    """Issue 46 item 13: on a machine without a GPU or nvmath-python, `linnet backends` lists
    cuBLASLt as unavailable, saying why, never as available."""
    from linnet.backends import cli, discover, here

    monkeypatch.setitem(sys.modules, "nvmath", None)
    machine = here.Machine((here.HOST,), ("no CUDA device: torch sees none",))
    report = here.survey(discover(), machine)
    assert "cublaslt" not in [a.name for a in report.runnable]
    data = json.loads(cli.to_json(discover(), report))
    (entry,) = [a for a in data["unavailable"] if a["name"] == "cublaslt"]
    (cpu,) = entry["targets"]
    assert cpu["state"] == "declines"
    assert (
        "CUDA devices only" in cpu["reason"] and "nvmath-python is not installed" in cpu["reason"]
    )
    text = cli.to_text(discover(), report)
    assert "this machine: cpu; no CUDA device: torch sees none" in text
    assert (
        "  cublaslt 0.1.0 (linnet-cublaslt 0.1.0)\n      cpu: declines: cuBLASLt runs on "
        "CUDA devices only" in text
    )


def test_probe_declines_cuda_without_nvmath_with_an_install_hint(monkeypatch):
    from linnet.torch.cublaslt import _nvmath

    monkeypatch.setattr(_nvmath, "_status", None)
    monkeypatch.setitem(sys.modules, "nvmath", None)  # importing it raises ImportError
    backend = CublasLt()
    assert backend.probe(H200) is None
    assert "nvmath-python is not installed" in (backend.last_reason or "")
    assert "linnet-cublaslt[cu13]" in (backend.last_reason or "")
    assert "linnet-cublaslt[cu12]" in (backend.last_reason or "")


def test_probe_declines_old_gpus_and_other_frameworks():
    backend = CublasLt()
    assert backend.probe(Target("cuda", "cuda:0", "Tesla P100", (6, 0))) is None
    assert "compute capability 7.0" in (backend.last_reason or "")
    assert backend.probe(Target("cuda", capability=(9, 0), framework="jax")) is None
    assert "PyTorch" in (backend.last_reason or "")


def test_probe_accepts_cuda_when_nvmath_loads(monkeypatch):
    from linnet.torch.cublaslt import _nvmath

    monkeypatch.setattr(_nvmath, "_status", (True, "nvmath-python 1.0.0, cuBLASLt 130100"))
    backend = CublasLt()
    caps = backend.probe(H200)
    assert caps is not None and backend.last_reason is None
    assert caps.dtypes == ("f32", "f16", "bf16")
    assert "cuBLASLt 130100" in caps.notes
    volta = backend.probe(Target("cuda", "cuda:0", "Tesla V100", (7, 0)))
    assert volta is not None and "bf16" not in volta.dtypes


def test_the_plugin_never_imports_nvmath_to_decline():
    import subprocess

    # A fresh interpreter: importing the plugin and declining the CPU import no nvmath.

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, linnet.torch.cublaslt as m; "
            "from linnet.backends import Target; m.CublasLt().probe(Target('cpu'));"
            " print('nvmath' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"


# ---------------------------------------------------------------- match
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_match_finds_singles_and_sibling_groups_on_the_toy_llama(dtype):
    graph = decode_graph(T=dtype)
    regions = CublasLt().match(graph, H200)
    groups = [r for r in regions if len(spec_for(r).weights) > 1]
    singles = [r for r in regions if len(spec_for(r).weights) == 1]
    # Per layer one q/k/v group and one gate/up group, 2 layers; a single for every linear:
    # 7 per layer and the LM head.
    assert len(groups) == 4
    assert len(singles) == 15
    expected = []
    for layer in range(2):
        attn, mlp = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
        expected.append((f"{attn}.q_proj.weight", f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"))
        expected.append((f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"))
    assert [r.parameters for r in groups] == expected
    assert sorted(p for r in singles for p in r.parameters) == sorted(
        [p for ps in expected for p in ps]
        + [f"model.layers.{i}.self_attn.o_proj.weight" for i in range(2)]
        + [f"model.layers.{i}.mlp.down_proj.weight" for i in range(2)]
        + ["lm_head.weight"]
    )
    assert all(r.callee == LINEAR for r in regions)
    steps_per_call = 1 if dtype == "f32" else 2  # bf16: the product, then the conversion
    for region in regions:
        assert len(region.steps) == steps_per_call * len(region.parameters)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_regions_read_the_shared_input_and_hand_on_each_calls_result(dtype):
    graph = decode_graph(T=dtype)
    calls = {c.path: c for c in graph.semantic_calls(LINEAR)}
    for region in CublasLt().match(graph, H200):
        paths = [p.removesuffix(".weight") for p in region.parameters]
        (x,) = {calls[p].attributes["args"][0] for p in paths}
        assert region.inputs == (x,)
        assert region.outputs == tuple(calls[p].attributes["results"][0] for p in paths)
        assert region.states == ()
        spec = spec_for(region)
        assert spec is not None and spec.x == x and spec.m == 1
        assert spec.sizes == tuple(graph.parameters[p].shape[0] for p in region.parameters)
        assert all(graph.values[o].dtype == dtype for o in region.outputs)


def test_regions_of_one_kind_share_a_timing():
    regions = CublasLt().match(decode_graph(T="bf16"), H200)
    qkv = [r for r in regions if len(r.parameters) == 3]
    gate_up = [r for r in regions if len(r.parameters) == 2]
    assert len({r.kind for r in qkv}) == 1 and len({r.kind for r in gate_up}) == 1
    assert qkv[0].kind != gate_up[0].kind


TWIN = """
use std.nn.linear::{Linear, LinearBias}

pub model Twin<D: Dim, B: Dim, T: DType> {
    block alpha: Linear<D, D, T>
    block beta: Linear<D, D, T>
    block q_proj: Linear<D, D, T>
    block k_proj: Linear<D, D, T>
    block up: LinearBias<D, D, T>
    block gate: LinearBias<D, D, T>

    entry run(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        let a = self.alpha(x)
        let b = self.beta(x)
        let q = self.q_proj(a)
        let k = self.k_proj(b)
        return q + k + self.up(x) * self.gate(x)
    }
}
"""


def twin_graph(dtype: str = "f32", rows: int = 2):
    from linnet.lang import Program, lower

    return lower(
        Program.from_text(TWIN, "twin"), "run", {"x": [rows, 8]}, {"D": 8, "B": rows, "T": dtype}
    )


def test_siblings_are_found_by_their_input_not_their_names():
    regions = CublasLt().match(twin_graph(), H200)
    groups = [r.parameters for r in regions if len(r.parameters) > 1]
    # alpha and beta read x: siblings. q_proj and k_proj read different values: not.
    assert groups == [("alpha.weight", "beta.weight")]
    assert sorted(r.parameters[0] for r in regions if len(r.parameters) == 1) == [
        "alpha.weight",
        "beta.weight",
        "k_proj.weight",
        "q_proj.weight",
    ]


def test_biased_linears_are_not_taken():
    graph = twin_graph()
    assert len(graph.semantic_calls("std.nn.linear::linear_bias")) == 2
    taken = {p for r in CublasLt().match(graph, H200) for p in r.parameters}
    assert not taken & {"up.weight", "up.bias", "gate.weight", "gate.bias"}


def test_empty_calls_are_skipped():
    graph = decode_graph()
    call = graph.semantic_calls(LINEAR)[0]
    call.stop = call.start  # as lowering leaves a call it shared with an earlier one
    regions = CublasLt().match(graph, H200)
    assert all(call.index != r.index or len(r.parameters) > 1 for r in regions)
    assert [r.parameters for r in regions if r.start == call.start] == []


def test_match_on_volta_leaves_bf16_out():
    volta = Target("cuda", "cuda:0", "Tesla V100", (7, 0))
    assert CublasLt().match(decode_graph(T="bf16"), volta) == []
    assert len(CublasLt().match(decode_graph(T="f32"), volta)) == 19


# ---------------------------------------------------------------- compile, holds, cost
def test_compile_declares_buffers_and_a_share_of_the_workspace():
    graph = decode_graph(T="bf16")
    backend = CublasLt()
    regions = backend.match(graph, H200)
    executables = backend.compile_regions(regions, H200, Options())
    assert all(isinstance(e, LinearGemm) and e.kernel == "cublaslt" for e in executables)
    share = -(-cl.WORKSPACE_BYTES // len(regions))
    for region, ex in zip(regions, executables):
        spec = spec_for(region)
        buffers = (spec.m * spec.n + spec.m * spec.k) * 2
        assert ex.meta.holds == buffers + share  # no weight copies: every join succeeds
    alone = backend.compile(regions[0], H200, Options())
    assert alone.meta.holds > executables[0].meta.holds  # the whole workspace


def test_estimate_cost_is_bytes_over_bandwidth():
    graph = decode_graph("llama-3.2-1b")
    backend = CublasLt()
    regions = backend.match(graph, H200)
    qkv = next(r for r in regions if len(r.parameters) == 3)
    cost = backend.estimate_cost(qkv, H200)
    weights = (2048 + 512 + 512) * 2048 * 2
    moved = weights + (2048 + 3072) * 2
    assert cost is not None and cost.bytes == moved
    assert cost.seconds == pytest.approx(moved / 4.18e12 + cl.LAUNCH_SECONDS)
    assert 5e-6 < cost.seconds < 20e-6  # ~3 us of streaming and a launch
    singles = [
        r for r in regions if len(r.parameters) == 1 and r.start in range(qkv.start, qkv.stop)
    ]
    assert len(singles) == 3
    assert cost.seconds < sum(backend.estimate_cost(r, H200).seconds for r in singles)
    assert backend.estimate_cost(qkv, Target("cpu")) is None
    other = backend.estimate_cost(qkv, Target("cuda", name="Some Future GPU"))
    assert other is not None and other.seconds == pytest.approx(
        moved / cl.DEFAULT_BANDWIDTH + cl.LAUNCH_SECONDS
    )
    assert CublasLt(bandwidth=1e12).estimate_cost(qkv, H200).seconds == pytest.approx(
        moved / 1e12 + cl.LAUNCH_SECONDS
    )
    assert cl.bandwidth_of(Target("cuda", name="NVIDIA GH200 480GB")) == 3.6e12


# ---------------------------------------------------------------- plans on the CPU
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_plan_over_every_region_matches_the_generated_source(dtype):
    from linnet.torch import load, random_weights

    cfg = config(T=dtype)
    weights = random_weights(llama(), cfg, seed=3)
    model = load(llama(), weights=dict(weights), config=cfg)
    reference = load(llama(), weights=dict(weights), config=cfg)
    plan = model.plan_for("decode", [TOKEN, POS], backends=[OnCpu()], measure=False, progress=False)
    taken = [c.region for c in plan.regions]
    # Largest first: both groups of each layer, then o, down and the LM head alone.
    assert sorted(len(r.parameters) for r in taken) == [1] * 5 + [2, 2, 3, 3]
    ctx = model.context_for(plan)
    (got,) = plan.run([TOKEN, POS], ctx)
    want = reference.run("decode", [TOKEN, POS])
    tol = 1e-5 if dtype == "f32" else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    # q, k and v were joined by the context: the parameters are now views of one buffer.
    q, k = (ctx.parameters[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qk")
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
    findings = model.conform("decode", [TOKEN, POS], OnCpu())
    assert len(findings) == 19 and all(f.passed for f in findings), findings


def test_sibling_outputs_are_views_of_one_buffer_in_order():
    from linnet.torch import Context

    graph = decode_graph()
    backend = OnCpu()
    region = next(r for r in backend.match(graph, Target("cpu")) if len(r.parameters) == 3)
    (ex,) = backend.compile_regions([region], Target("cpu"), Options())
    assert ex.kernel == "torch"
    gen = torch.Generator().manual_seed(0)
    params = {p: torch.randn(*graph.parameters[p].shape, generator=gen) for p in region.parameters}
    ctx = Context(dict(params), {}, torch.device("cpu"))
    x = torch.randn(1, 64, generator=gen)
    ex.prepare(ctx)
    q, k, v = ex.execute([x], [graph.values[o] for o in region.outputs], ctx)
    for got, path in zip((q, k, v), region.parameters):
        torch.testing.assert_close(got, x @ params[path].t())
    assert q.data_ptr() + 64 * 4 == k.data_ptr() and k.data_ptr() + 32 * 4 == v.data_ptr()
    assert ex.copied == 0 and ctx.join(list(region.parameters)) is not None
    # The same buffers the next run: nothing allocated.
    q2, _, _ = ex.execute([x * 2], [], ctx)
    assert q2.data_ptr() == q.data_ptr()
    torch.testing.assert_close(q2, 2 * x @ params[region.parameters[0]].t())
    # An input that is not contiguous is staged, and the result is the same.
    wide = torch.randn(64, 2, generator=gen)
    q3, _, _ = ex.execute([wide[:, :1].t()], [], ctx)
    torch.testing.assert_close(q3, wide[:, :1].t() @ params[region.parameters[0]].t())


def test_results_the_entry_returns_are_fresh_each_run():
    from linnet.torch import load, random_weights

    cfg = config()  # f32: the LM head's result is the entry's output itself
    model = load(llama(), weights=random_weights(llama(), cfg, seed=1), config=cfg)
    plan = model.plan_for("decode", [TOKEN, POS], backends=[OnCpu()], measure=False, progress=False)
    head = next(c.executable for c in plan.regions if c.region.parameters == ("lm_head.weight",))
    assert head.spec.fresh
    ctx = model.context_for(plan)
    (first,) = plan.run([TOKEN, POS], ctx)
    kept = first.clone()
    (second,) = plan.run(
        [torch.tensor([7], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)], ctx
    )
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, kept)


SHARED = """
use std.nn.linear::{Linear}

pub model Shared<D: Dim, B: Dim, T: DType> {
    block p: Linear<D, D, T>
    block q: Linear<D, D, T>
    block r: Linear<D, D, T>

    entry run(x: Tensor[B, D; T]) -> Tensor[B, D; T] {
        let y = self.p(x) + self.q(x)
        return self.q(y) * self.r(y)
    }
}
"""


def test_a_group_that_cannot_be_joined_copies_once_and_counts_it(tmp_path):
    from linnet.torch import load

    path = tmp_path / "shared.linnet"
    path.write_text(SHARED)
    cfg = {"D": 8, "B": 2, "T": "f32"}
    gen = torch.Generator().manual_seed(1)
    weights = {f"{n}.weight": torch.randn(8, 8, generator=gen) / 3 for n in "pqr"}
    model = load(path, weights=dict(weights), config=cfg)
    x = torch.randn(2, 8, generator=gen)
    plan = model.plan_for("run", [x], backends=[OnCpu()], measure=False, progress=False)
    groups = [c for c in plan.regions if len(c.region.parameters) == 2]
    assert [c.region.parameters for c in groups] == [
        ("p.weight", "q.weight"),
        ("q.weight", "r.weight"),
    ]
    # q's weight is in both groups: one of the two joins will be declined, and each counts
    # the copy it would then make.
    assert all(c.executable.declared_copy == 2 * 8 * 8 * 4 for c in groups)
    ctx = model.context_for(plan)
    (got,) = plan.run([x], ctx)
    w = weights
    y = x @ w["p.weight"].t() + x @ w["q.weight"].t()
    torch.testing.assert_close(got, (y @ w["q.weight"].t()) * (y @ w["r.weight"].t()))
    assert sorted(c.executable.copied for c in groups) == [0, 2 * 8 * 8 * 4]


# ---------------------------------------------------------------- on a GPU
GPU = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("LINNET_GPU_TESTS") != "1",
    reason="needs a CUDA device and LINNET_GPU_TESTS=1",
)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_conforms_and_replays_captured_on_a_gpu(dtype):
    from linnet.torch import load, random_weights
    from linnet.torch.planned import Captured

    device = torch.device("cuda")
    cfg = config(T=dtype)
    weights = random_weights(llama(), cfg, seed=0, device=device)
    model = load(llama(), weights=dict(weights), config=cfg, device=device)
    token, pos = TOKEN.to(device), POS.to(device)
    findings = model.conform("decode", [token, pos], CublasLt())
    assert len(findings) == 19 and all(f.passed for f in findings), findings
    plan = model.plan_for(
        "decode", [token, pos], backends=[CublasLt()], measure=False, progress=False
    )
    ctx = model.context_for(plan)
    ref_ctx = model.new_context("decode", [token, pos])
    step = Captured(plan, ctx)
    for i in range(4):
        inputs = [
            torch.tensor([5 + i], dtype=torch.int32, device=device),
            torch.tensor([i], dtype=torch.int32, device=device),
        ]
        (got,) = step(inputs)
        want = model.run("decode", inputs, context=ref_ctx)
        assert int(got.argmax()) == int(want.argmax())
