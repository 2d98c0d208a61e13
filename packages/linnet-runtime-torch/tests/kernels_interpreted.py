"""The kernel cases that run in Triton's interpreter on the CPU: run by
test_kernels_launch.py's test_the_interpreted_cases in a fresh process with TRITON_INTERPRET=1
set before anything imports Triton (not collected on its own: the name is not test_*)."""

import os
from pathlib import Path

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
def interpret():
    """Triton's interpreter: chosen by the parent process, before Triton was imported."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run by test_the_interpreted_cases"


def runs(model, x):
    return model.module("run", [x]).RUNS


def test_interpreter_launches_row_softmax(softmax_model, interpret):
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(5, 24)
    y = model.run("run", [x])
    assert runs(model, x) == {"row_softmax_5_24_1024": [1, 0]}
    torch.testing.assert_close(y, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    text = Path(model.source("run", [x])).read_text()
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


def test_no_triton_under_the_interpreter_runs_the_body(softmax_model, interpret, monkeypatch):
    """TRITON_INTERPRET=1 and no Triton: the module imports (the header's interpreter-only
    lines need Triton) and runs the op's body."""
    import builtins

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
    (y,) = launch("std.nn.activation::softmax", {"R": 4, "C": 8}, x)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    (y,) = launch(
        "std.nn.activation::row_softmax", {"R": 4, "C": 8, "B": 8}, x, program=Program.from_text("")
    )
    torch.testing.assert_close(y, torch.softmax(x, -1))


# A tiled matrix product: a loop over K tiles carrying the accumulator, and a product of two
# [16, 16] tiles that becomes tl.dot (a smaller tile is a broadcast multiply and a sum).
MATMUL = """
kernel mm<M: Dim, N: Dim, K: Dim, BM: Dim, BN: Dim, BK: Dim>(
    a: Tensor[M, K; f32], b: Tensor[K, N; f32],
) -> c: Tensor[M, N; f32] grid((M + BM - 1) / BM, (N + BN - 1) / BN) {
    let rows = program_id(0) * BM + iota<i32>(BM)
    let cols = program_id(1) * BN + iota<i32>(BN)
    let acc = fill<f32>(0.0, BM, BN)
    for kb in 0..(K + BK - 1) / BK {
        let ks = kb * BK + iota<i32>(BK)
        let ma[i, k] = rows[i] < M && ks[k] < K
        let mb[k, j] = ks[k] < K && cols[j] < N
        let x = load(a[rows, ks], ma, 0.0)
        let y = load(b[ks, cols], mb, 0.0)
        let p[i, j] = sum[k] x[i, k] * y[k, j]
        acc = acc + p
    }
    let mc[i, j] = rows[i] < M && cols[j] < N
    store(c[rows, cols], acc, mc)
}

op matmul<M: Dim, N: Dim, K: Dim>(a: Tensor[M, K; f32], b: Tensor[K, N; f32])
    -> Tensor[M, N; f32] kernel mm<M, N, K, TILE, TILE, TILE> {
    let c[i, j] = sum[k] a[i, k] * b[k, j]
    return c
}

model T<M: Dim, N: Dim, K: Dim> {
    entry run(a: Tensor[M, K; f32], b: Tensor[K, N; f32]) -> Tensor[M, N; f32] {
        return matmul(a, b)
    }
}
"""


@pytest.mark.parametrize("tile", [16, 4])
def test_tiled_matmul_through_generated_pytorch(tmp_path, interpret, tile):
    path = tmp_path / "mm.linnet"
    path.write_text(MATMUL.replace("TILE", str(tile)))
    model = load(path, weights={}, numerics="fast")
    a, b = torch.randn(40, 50), torch.randn(50, 24)
    c = model.run("run", [a, b])
    key = f"mm_40_24_50_{tile}_{tile}_{tile}"
    assert {key: [1, 0]} == model.module("run", [a, b]).RUNS
    text = Path(model.source("run", [a, b])).read_text()
    # numerics fast: tl.dot may use tf32 (the interpreter computes in f32 regardless)
    assert ("tl.dot(x, y, input_precision='tf32'" in text) == (tile == 16)
    assert "for kb in range(0, " in text
    torch.testing.assert_close(c, a @ b, atol=1e-4, rtol=1e-4)


def test_compiled_slice_has_no_graph_break_on_the_launch(softmax_model, interpret):
    # Under the interpreter the launch is an opaque custom op (wrap_triton rejects
    # interpreted kernels); on CUDA it is a triton_op (benchmarks/kernels.py shows that).
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(4, 8)
    module = model.module("run", [x])
    fn = getattr(module, module.ENTRIES["run"]["slices"][0]["function"])
    explained = torch._dynamo.explain(fn)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    code = explained.graphs[0].code
    assert f"torch.ops.{module.LIBRARY}.row_softmax_4_8_1024" in code
    compiled = load(softmax_model, weights={}, numerics="fast", compile="aot_eager")
    y = compiled.run("run", [x])
    torch.testing.assert_close(y, torch.softmax(x, -1))
    # Compiled calls do not touch RUNS: a counter read inside the graph made dynamo guard on
    # its value and recompile at every call (seen on the H200: the recompile limit, then a
    # hard failure under fullgraph=True). More calls than the limit, with no recompile:
    before = list(module.RUNS["row_softmax_4_8_1024"])
    whole = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=False)
    for _ in range(torch._dynamo.config.recompile_limit + 2):
        torch.testing.assert_close(whole(x)[0], torch.softmax(x, -1))
    assert module.RUNS["row_softmax_4_8_1024"] == before


INTS = """
kernel divmod<N: Dim>(x: Tensor[N; i32], d: Tensor[N; i32])
    -> (q: Tensor[N; i32], r: Tensor[N; i32]) grid(1) {
    let i = iota<i32>(N)
    let a = load(x[i])
    let b = load(d[i])
    store(q[i], a / b)
    store(r[i], a % b)
}
"""


def test_integer_division_floors_as_the_body_does(tmp_path, interpret):
    path = tmp_path / "ints.linnet"
    path.write_text(INTS)
    x = torch.tensor([7, -7, 7, -7, 6, -6, 0, 5], dtype=torch.int32)
    d = torch.tensor([2, 2, -2, -2, 3, 3, 4, -5], dtype=torch.int32)
    q, r = launch("ints::divmod", {"N": 8}, x, d, program=path)
    assert q.tolist() == torch.div(x, d, rounding_mode="floor").tolist()
    assert r.tolist() == torch.remainder(x, d).tolist()


def test_launch_seam_errors(interpret, monkeypatch):
    from linnet.lang import LinnetError

    with pytest.raises(LinnetError, match="E0761"):
        launch("std.nn.activation::softmax", {"R": 4, "C": 8}, torch.randn(4, 9))
    with pytest.raises(LinnetError, match="E0764"):
        launch("std.nn.activation::softmax", {"R": 2, "C": 2048}, torch.randn(2, 2048))
    with pytest.raises(LinnetError, match="E0760"):
        launch("std.nn.activation::softmax", {"R": 2}, torch.randn(2, 8))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(LinnetError, match="E0762"):
        launch("std.nn.activation::softmax", {"R": 3, "C": 7}, torch.randn(3, 7))


LOOPS = """
kernel loops<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let i = iota<i32>(N)
    let acc = load(x[i])
    let tot = fill<f32>(0.0, N)
    for a in 0..3 {
        let nxt = acc * 2.0
        let diff = nxt - acc
        acc = nxt
        for b in 0..2 {
            tot = tot + diff
        }
    }
    store(y[i], tot + acc)
}
"""


def test_loops_carry_old_and_new_values(tmp_path, interpret):
    # the old `acc` is read after the new one is made; a loop nested in a loop carries `tot`
    path = tmp_path / "loops.linnet"
    path.write_text(LOOPS)
    x = torch.randn(8)
    (y,) = launch("loops::loops", {"N": 8}, x, program=path)
    acc, tot = x.clone(), torch.zeros(8)
    for _ in range(3):
        nxt = acc * 2
        diff = nxt - acc
        acc = nxt
        for _ in range(2):
            tot = tot + diff
    torch.testing.assert_close(y, tot + acc)


# ---------------------------------------------------------------- the planner's kernel paths
SPAN_OPS = (
    Path(__file__).resolve().parents[2] / "linnet-lang" / "tests" / "spans" / "norm_linear.linnet"
)
# More rows than std.nn.decode's span ops take (64: `linear_gemv_dot64`), so that only this
# file's span op and rms_norm's own kernel claim the model's steps.
ROWS = 65
SPAN_MODEL = (SPAN_OPS.parent / "two_norms.linnet.part").read_text()


@pytest.fixture
def span_model(tmp_path):
    """A model that calls rms_norm then linear, twice, in a file that also defines the span
    op `norm_linear` (and its kernel): the model never calls it."""
    path = tmp_path / "m.linnet"
    path.write_text(SPAN_OPS.read_text() + SPAN_MODEL)
    g = torch.Generator().manual_seed(0)
    weights = {
        "nw": torch.randn(40, generator=g),
        "w": torch.randn(24, 40, generator=g) / 6,
        "nw2": torch.randn(24, generator=g),
        "w2": torch.randn(40, 24, generator=g) / 5,
    }
    return load(path, weights=weights, numerics="fast", config={"D": 40, "O": 24, "T": "f32"})


def kernel_rows(plan):
    return [c for c in plan.candidates if c.backend_name == "linnet-kernels"]


@pytest.fixture
def few_timings(monkeypatch):
    """Plans here time each kind with 1 warm-up call and 3 timed ones (the defaults: 3 and
    20). Interpreted kernels' times say nothing of a GPU's, and what these tests check (each
    kind timed, taken only where its own times save the margin) holds for any times; each
    interpreted kernel then runs 4 times, not 23 (most of these tests' time)."""
    import dataclasses

    from linnet.torch import planned

    real = planned.plan_arguments

    def fewer(*args, **kwargs):
        options, backends = real(*args, **kwargs)
        return dataclasses.replace(options, warmup=1, repeat=3), backends

    monkeypatch.setattr(planned, "plan_arguments", fewer)


def test_plan_runs_a_span_ops_kernel_over_the_calls_it_claims(span_model, interpret):
    x = torch.randn(ROWS, 40)
    want = span_model.run("run", [x])
    plan = span_model.plan_for("run", [x], backends=[], measure=False, progress=False)
    rows = {
        (c.region.callee.rsplit("::", 1)[-1], c.region.start): c.status for c in kernel_rows(plan)
    }
    # Each norm + linear is claimed, and overlaps the norm's own kernel region (rms_norm_rows).
    assert rows == {
        ("norm_linear", 0): "taken",
        ("rms_norm", 0): "overlap",
        ("norm_linear", 10): "taken",
        ("rms_norm", 10): "overlap",
    }
    assert [i.label for i in plan.items] == [
        "linnet-kernels Region(norm_linear @0, 10 steps)",
        "linnet-kernels Region(norm_linear @10, 10 steps)",
        "slice",
    ]
    (got,) = plan.run([x], span_model.context_for(plan))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # The executables launched the span kernel (not the body): their modules count launches.
    ex = plan.items[0].run
    module = __import__("sys").modules[ex.fn.__module__]
    # Once when the plan checked each executable's outputs, once in plan.run. The norms' own
    # regions (rms_norm_rows) are written in a module of their own (one per op whose kernel
    # regions launch, so that span ops over the same steps each launch their own kernel).
    launched = {
        f"norm_linear_rows_{ROWS}_40_24_f32_64_16_1e_05": [2, 0],
        f"norm_linear_rows_{ROWS}_24_40_f32_64_16_1e_06": [2, 0],
    }
    assert launched == module.RUNS
    assert "norm_linear" in plan.explain() and "linnet-kernels" in plan.explain()


def test_a_measured_plan_takes_kernel_regions_only_where_they_save_the_margin(
    span_model, interpret, few_timings
):
    x = torch.randn(ROWS, 40)
    plan = span_model.plan_for("run", [x], backends=[], progress=False)
    rows = kernel_rows(plan)
    assert len(rows) == 4
    for c in rows:  # every kernel region was timed against the op bodies' generated code
        assert c.backend_seconds and c.generated_seconds
        saves = c.generated_seconds - c.backend_seconds >= 0.02 * c.generated_seconds
        assert (c.status in ("taken", "overlap")) == saves, (c.status, c.reason)
    taken = {c.region.start for c in rows if c.status == "taken"}
    assert {i.label for i in plan.items if i.kind == "region"} == {
        f"linnet-kernels {c.region!r}" for c in rows if c.status == "taken"
    }
    assert taken <= {0, 10}


def test_kernels_false_leaves_linnet_kernels_out_of_the_plan(span_model, interpret):
    x = torch.randn(ROWS, 40)
    plan = span_model.plan_for(
        "run", [x], backends=[], measure=False, progress=False, kernels=False
    )
    assert kernel_rows(plan) == [] and [i.kind for i in plan.items] == ["slice"]
    text = Path(plan.items[0].run.__code__.co_filename).read_text()
    assert "@triton.jit" not in text  # a plan's generated source launches no kernel


def test_the_toy_llama_decode_plans_its_norm_kernels(interpret):
    from linnet.torch import random_weights
    from support import LLAMA, planning_config

    weights = random_weights(LLAMA, planning_config(), seed=4)
    model = load(LLAMA, weights=dict(weights), config=planning_config(), numerics="fast")
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    plan = model.plan_for("decode", [token, pos], backends=[], measure=False, progress=False)
    kinds = {c.region.callee.rsplit("::", 1)[-1] for c in kernel_rows(plan)}
    assert "rms_norm" in kinds
    # Decode attention's kernel regions pass the plan's checks (their kind counts the call's
    # `pos`, which the steps read only through masks hoisted out of the layers), as does the
    # norm, q/k/v and both rotations as one region: its kernel reads the rotations'
    # inv_freq, made before the layers and read there by no step (the angles are hoisted),
    # so the slices before it return it for the region. Unmeasured, the plan takes the
    # largest region over their steps: both with the cache writes between them, as one
    # chain (`rms_norm_qkv_rope_attention`), whose last kernel stores k and v into the cache.
    status = {(c.region.callee.rsplit("::", 1)[-1], c.status) for c in kernel_rows(plan)}
    rows = [(c.region, c.status, c.reason) for c in kernel_rows(plan)]
    assert {
        ("decode_attention_flash", "overlap"),
        ("rms_norm_qkv_rope", "overlap"),
        ("rms_norm_qkv_rope_attention", "taken"),
    } <= status, rows
    assert all(c.status != "failed" for c in kernel_rows(plan)), rows
    assert any(
        c.status == "taken"
        and c.region.writes_state
        and c.region.callee.endswith("::rms_norm_qkv_rope_attention")
        for c in kernel_rows(plan)
    )
    want = load(LLAMA, weights=dict(weights), config=planning_config(), numerics="fast")
    ctx, ctx_want = model.context_for(plan), want.context_for_graph(plan.graph)
    for step in range(3):  # the cache the kernel plan writes is read back by later steps
        (got,) = plan.run([token, pos + step], ctx)
        ref = want.run("decode", [token, pos + step])
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    del ctx_want


def test_the_toy_llama_decode_kernels_store_k_and_v_into_the_cache(interpret):
    """`rms_norm_qkv_rope` and its split-K chains, claimed with the cache writes after them
    (passes/spans.py's `state_writes`): each region's kernel stores k and v into the layer's
    cache itself (an `_into_k_v` instance) and leaves q and both caches as the generated
    source does (conform compares the states a region writes), on caches that already hold
    other positions, for two sequences at different positions (support.py; on CUDA:
    test_kernels_launch.py)."""
    from support import cache_writing_findings, cache_writing_ops, planning_config

    layers = planning_config()["NL"]  # one under CI=1
    findings, made = cache_writing_findings(layers=layers)
    assert sorted(f.region.callee.rsplit("::", 1)[-1] for f in findings) == cache_writing_ops(
        layers
    )
    assert all(f.passed and f.difference is not None for f in findings), findings
    for ex in made:
        runs = ex.fn.__globals__["RUNS"]
        assert any("_into_k_v" in key and n[0] for key, n in runs.items()), runs


def test_the_toy_llama_paged_decode_kernels_store_k_and_v_into_the_pages(interpret):
    """The same kernels claimed with a paged cache's writes (`self.k_pages[page[b], slot[b],
    h, d] = k_rot[b, h, d]`): each stores k and v at the row's page and slot itself (a
    `_into_k_v` instance loading the pages as it loads the slots), and leaves q and both page
    pools as the generated source does, for three sequences in pages out of order in a pool
    of random values (support.py)."""
    from support import PAGED_CACHE_WRITING_OPS, paged_cache_writing_findings

    findings, made = paged_cache_writing_findings()
    assert sorted(f.region.callee.rsplit("::", 1)[-1] for f in findings) == PAGED_CACHE_WRITING_OPS
    assert all(f.passed and f.difference is not None for f in findings), findings
    for ex in made:
        runs = ex.fn.__globals__["RUNS"]
        assert any("_into_k_v" in key and n[0] for key, n in runs.items()), runs


def test_every_kernel_region_of_the_toy_llama_decode_launches_its_kernel(interpret):
    """Each region's executable launches its op's kernel: decode attention's steps read masks
    of `pos` hoisted out of the layers, not `pos`, so a region of exactly its steps had `pos`
    out of scope and ran the op's body instead (every attention kernel region, until
    2026-12-01); and span ops over the same steps each launch their own kernel."""
    from linnet.backends import Options, Target
    from linnet.lang.check.spans import claim_spans
    from linnet.torch import random_weights
    from linnet.torch.kernel_paths import KernelPaths
    from support import LLAMA, planning_config

    model = load(
        LLAMA,
        weights=random_weights(LLAMA, planning_config(), seed=4),
        config=planning_config(),
        numerics="fast",
    )
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    graph = claim_spans(model.graph("decode", [token, pos]), model.program)
    paths = KernelPaths(model.program)
    regions = paths.match(graph, Target("cpu"))
    ops = {r.callee.rsplit("::", 1)[-1] for r in regions}
    assert {
        "decode_attention_flash",
        "decode_attention_split",
        "linear_gemv",
        "linear_split",
        "rms_norm_qkv",
        "rms_norm_qkv_rope",
        "rms_norm_qkv_rope_split",
    } <= ops, ops
    calls = {c.index: c for c in graph.calls}
    for r, ex in zip(regions, paths.compile_regions(regions, Target("cpu"), Options())):
        short = calls[r.index].attributes["kernel"].rsplit("::", 1)[-1]
        launched = list(ex.fn.__globals__.get("RUNS", {}))
        assert launched and all(k.startswith(short) for k in launched), (r, launched)


def test_conform_runs_each_kernel_region_both_ways(span_model, interpret):
    from linnet.torch.kernel_paths import KernelPaths

    findings = span_model.conform("run", [torch.randn(ROWS, 40)], KernelPaths(span_model.program))
    assert len(findings) == 4 and all(f.passed for f in findings), findings


def two_span_ops(tmp_path):
    """The span model with `norm_linear` and `norm_linear_wide`, a copy bound to other tiles:
    two span ops over the same steps."""
    other = (
        SPAN_OPS.read_text()
        .split("/// Two products of one norm")[0]
        .replace("pub op norm_linear<", "pub op norm_linear_wide<")
        .replace(
            "kernel norm_linear_rows<N, D, O, T, 64, 16>",
            "kernel norm_linear_rows<N, D, O, T, 64, 32>",
        )
    )
    other = other[other.index("/// linear(rms_norm(x, nw, eps), w), rows of up to 64") :]
    path = tmp_path / "m.linnet"
    path.write_text(SPAN_OPS.read_text() + other + SPAN_MODEL)
    return path


def test_each_span_op_over_the_same_steps_launches_its_own_kernel(tmp_path, interpret):
    """The emitter launches the first of equally long bound calls at a step: a region's
    executable must launch its own op's kernel, not another claim's of the same steps (the
    H200 runs of 2026-12-01 timed `linear_gemv`'s kernel for every op over its steps)."""
    from linnet.backends import Options, Target
    from linnet.lang.check.spans import claim_spans
    from linnet.torch.kernel_paths import KernelPaths

    path = two_span_ops(tmp_path)
    g = torch.Generator().manual_seed(0)
    weights = {
        "nw": torch.randn(40, generator=g),
        "w": torch.randn(24, 40, generator=g),
        "nw2": torch.randn(24, generator=g),
        "w2": torch.randn(40, 24, generator=g),
    }
    model = load(path, weights=weights, numerics="fast", config={"D": 40, "O": 24, "T": "f32"})
    x = torch.randn(ROWS, 40)
    paths = KernelPaths(model.program)
    graph = claim_spans(model.graph("run", [x]), model.program)
    target = Target("cpu")
    regions = [
        r
        for r in paths.match(graph, target)
        if r.callee.endswith(("::norm_linear", "::norm_linear_wide"))
    ]
    steps = {(r.callee.rsplit("::", 1)[-1], tuple(r.steps)) for r in regions}
    assert {op for op, _ in steps} == {"norm_linear", "norm_linear_wide"}
    # Both ops claim the same steps at each place.
    assert all(
        {op for op, st2 in steps if st2 == st} == {"norm_linear", "norm_linear_wide"}
        for _, st in steps
    )
    for r, ex in zip(regions, paths.compile_regions(regions, target, Options())):
        tiles = "_f32_64_32_" if r.callee.endswith("_wide") else "_f32_64_16_"
        launched = [k for k in ex.fn.__globals__["RUNS"] if "norm_linear_rows" in k]
        assert launched and all(tiles in k for k in launched), (r.callee, launched)


def test_two_span_ops_over_the_same_steps_are_timed_apart(tmp_path, interpret, few_timings):
    """`norm_linear` and a copy bound to other tiles claim the same steps (one region kind):
    each kernel is timed, and cached, on its own."""
    from linnet.plan import TimingCache

    path = two_span_ops(tmp_path)
    g = torch.Generator().manual_seed(0)
    weights = {
        "nw": torch.randn(40, generator=g),
        "w": torch.randn(24, 40, generator=g),
        "nw2": torch.randn(24, generator=g),
        "w2": torch.randn(40, 24, generator=g),
    }
    model = load(path, weights=weights, numerics="fast", config={"D": 40, "O": 24, "T": "f32"})
    cache = TimingCache(tmp_path / "t.json")
    plan = model.plan_for("run", [torch.randn(ROWS, 40)], backends=[], progress=False, cache=cache)
    ops = {c.region.callee.rsplit("::", 1)[-1] for c in kernel_rows(plan)}
    assert {"norm_linear", "norm_linear_wide"} <= ops
    import json

    entries = json.loads(cache.path.read_text())["entries"]
    kinds = [json.loads(k)[-1] for k in entries if json.loads(k)[1] == "linnet-kernels"]
    variants = {kind.rsplit("/", 1)[-1] for kind in kinds if "/" in kind}
    assert {"m::norm_linear", "m::norm_linear_wide"} <= variants, kinds


def test_a_kernel_that_cannot_be_written_fails_its_own_regions_only(
    tmp_path, interpret, monkeypatch
):
    """Where writing one span op's kernel raises a coded error (here made to, for
    `norm_linear_wide`: a checked program reaches none such today), its regions are failed
    candidates with that error as the reason; the other kernel regions still run."""
    from linnet.lang import LinnetError
    from linnet.lang.diagnostics.core import Diagnostic
    from linnet.torch.kernel_paths import KernelPaths

    path = two_span_ops(tmp_path)
    real = KernelPaths._compile

    def failing(self, regions, target):
        if any(r.callee.endswith("norm_linear_wide") for r in regions):
            raise LinnetError(Diagnostic("E0532", "a kernel uses `x`, which has no Triton form"))
        return real(self, regions, target)

    monkeypatch.setattr(KernelPaths, "_compile", failing)
    g = torch.Generator().manual_seed(0)
    weights = {
        "nw": torch.randn(40, generator=g),
        "w": torch.randn(24, 40, generator=g),
        "nw2": torch.randn(24, generator=g),
        "w2": torch.randn(40, 24, generator=g),
    }
    model = load(path, weights=weights, numerics="fast", config={"D": 40, "O": 24, "T": "f32"})
    x = torch.randn(ROWS, 40)
    from linnet.plan import BackendWarning

    with pytest.warns(BackendWarning, match="2 regions of backend `linnet-kernels` failed.*E0532"):
        plan = model.plan_for("run", [x], backends=[], measure=False, progress=False)
    wide = [c for c in kernel_rows(plan) if c.region.callee.endswith("norm_linear_wide")]
    assert wide and all(c.status == "failed" and "E0532" in c.reason for c in wide)
    assert any(c.status == "taken" for c in kernel_rows(plan))
    assert not any("kernels" in getattr(s, "name", "") for s in plan.skipped)
    (got,) = plan.run([x], model.context_for(plan))
    torch.testing.assert_close(got, model.run("run", [x]), atol=2e-5, rtol=1e-5)


# A chain (`kernel part_sums<...> then add_parts<...>`): the first kernel writes KS partial
# sums a row (scratch), the second adds them; the module's RUNS counts the chain as one.
CHAIN = (SPAN_OPS.parents[1] / "chains" / "row_total.linnet").read_text()


@pytest.mark.parametrize("shape", [(3, 40), (1, 5), (2, 64)])
def test_a_chain_launches_both_kernels_and_equals_the_body(tmp_path, interpret, shape):
    # 40 columns: 10 chunks of 4 over 4 splits of 3 (the last split has 1); 5 columns: splits
    # 2..3 past the end write zeros; 64: every split full.
    path = tmp_path / "chain.linnet"
    path.write_text(CHAIN)
    model = load(path, weights={}, numerics="fast")
    x = torch.randn(*shape)
    y = model.run("run", [x])
    key = f"part_sums_{shape[0]}_{shape[1]}_f32_4_4_then_add_parts"
    runs = model.module("run", [x]).RUNS
    assert runs == {key: [1, 0]}
    torch.testing.assert_close(y, x.sum(-1), atol=1e-5, rtol=1e-5)
    (y,) = launch(
        "chain::row_total",
        {"R": shape[0], "C": shape[1], "T": "f32"},
        x,
        program=Program.from_file(path),
    )
    torch.testing.assert_close(y, x.sum(-1), atol=1e-5, rtol=1e-5)
    # A chain takes the op's tensors, not the first kernel's or the scratch: else E0761.
    from linnet.lang import LinnetError

    with pytest.raises(LinnetError, match="E0761"):
        launch(
            "chain::row_total",
            {"R": shape[0], "C": shape[1], "T": "f32"},
            x,
            x,
            program=Program.from_file(path),
        )
    # Under torch.compile each kernel of the chain is a custom op of its own.
    module = model.module("run", [x])
    fn = getattr(module, module.ENTRIES["run"]["slices"][0]["function"])
    explained = torch._dynamo.explain(fn)(x)
    assert explained.graph_break_count == 0
    code = explained.graphs[0].code
    assert f"torch.ops.{module.LIBRARY}.part_sums_" in code
    assert f"torch.ops.{module.LIBRARY}.add_parts_" in code


def test_linnet_kernels_checks_a_chain(tmp_path, interpret):
    from linnet.torch.testing import check_kernels

    path = tmp_path / "chain.linnet"
    path.write_text(CHAIN)
    seen = []
    assert check_kernels(path, count=3, on_check=seen.append) == []
    assert len(seen) == 3 and all(c.case.kernel == "chain::part_sums then add_parts" for c in seen)


# A chain of three (row_total.linnet's kernels with `pair_sums` between): each kernel reads
# the results of the one before it.
THREE = (
    CHAIN[: CHAIN.index("pub op row_total")]
    + (SPAN_OPS.parents[1] / "chains" / "row_total_three.linnet").read_text()
)


def test_a_chain_of_three_launches_each_kernel_and_equals_the_body(tmp_path, interpret):
    path = tmp_path / "three.linnet"
    path.write_text(THREE)
    model = load(path, weights={}, numerics="fast")
    x = torch.randn(3, 40)
    y = model.run("run3", [x])
    assert model.module("run3", [x]).RUNS == {
        "part_sums_3_40_f32_4_4_then_pair_sums_then_add_parts": [1, 0]
    }
    torch.testing.assert_close(y, x.sum(-1), atol=1e-5, rtol=1e-5)
    from linnet.torch.testing import check_kernels

    seen = []
    assert check_kernels(path, count=2, on_check=seen.append) == []
    assert {c.case.kernel for c in seen} == {"three::part_sums then pair_sums then add_parts"}
    # The launch seam takes the op's tensors and launches each of the three in turn (it
    # took the first kernel's parameters past two stages: issue 38 item 21's E0761).
    (y,) = launch(
        "three::row_total3", {"R": 3, "C": 40, "T": "f32"}, x, program=Program.from_file(path)
    )
    torch.testing.assert_close(y, x.sum(-1), atol=1e-5, rtol=1e-5)


def test_the_toy_llama_decode_planned_in_context_runs_as_its_generated_source(
    interpret, monkeypatch, few_timings
):
    """Every real kernel region of the toy Llama's decode (span ops over the same steps,
    chains, attention with its hoisted masks) through the check in context and its
    replacements, with a cost model in place of the clock: a region's steps take 1 us each
    alone, its kernel nothing; a compiled slice costs 5 us plus 0.1 us a step, so cutting a
    slice in two costs 5 us. A region of fewer than about 50 steps in the middle of a slice
    (the attention input with the attention, 42) is dropped and the kinds it had beaten are
    tried; one next to another region, or of more steps, stays. The plan that results runs
    as the generated source does."""
    from linnet.torch import random_weights
    from linnet.torch.planned import PlanBuilder, SliceTimes
    from support import LLAMA, planning_config

    monkeypatch.setattr(PlanBuilder, "time_backend", lambda self, group, env, context: 1e-9)
    monkeypatch.setattr(
        PlanBuilder,
        "time_generated",
        lambda self, group, env, context: 1e-6 * len(group[0].region.steps),
    )
    monkeypatch.setattr(SliceTimes, "seconds", lambda self, slices: 5e-6 + 1e-7 * len(slices[0]))
    weights = random_weights(LLAMA, planning_config(), seed=4)
    model = load(LLAMA, weights=dict(weights), config=planning_config(), numerics="fast")
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    said = []
    plan = model.plan_for(
        "decode", [token, pos], backends=[], compile="aot_eager", progress=said.append
    )
    rows = kernel_rows(plan)
    statuses = {c.status for c in rows}
    assert statuses <= {"taken", "below margin", "overlap", "slower in context", "failed"}
    assert "slower in context" in statuses and "taken" in statuses, statuses
    assert all(c.context_seconds is not None for c in rows if c.status == "taken")
    assert any(m.startswith("checking ") for m in said)
    # no two taken regions share a step
    steps = [s for c in plan.regions for s in c.region.steps]
    assert len(steps) == len(set(steps))
    want = load(LLAMA, weights=dict(weights), config=planning_config(), numerics="fast")
    ctx = model.context_for(plan)
    for step in range(2):
        (got,) = plan.run([token, pos + step], ctx)
        ref = want.run("decode", [token, pos + step])
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_one_launch_flash_decoding_combines_in_each_heads_last_split(interpret):
    """`decode_attention_split_once`: each split counts itself (`atomic_add`) and the head's
    last one combines them all (support.py's case: 4 splits; positions in the first split,
    across three, at the cache's end). Its counters are back at 0 after each launch (the
    launcher keeps them), so the second launch, at other positions, is right too."""
    from support import one_launch_attention_errors

    results = one_launch_attention_errors("cpu", "f32")
    assert len(results) == 2 and all(e < 1e-5 and c == 0 for e, c in results), results


NO_RESET = """
kernel block_total<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[1; f32]
    grid((N + B - 1) / B) scratch(parts: Tensor[(N + B - 1) / B; f32], seen: Tensor[1; i32]) {
    let p = program_id(0)
    let cols = p * B + iota<i32>(B)
    let v = load(x[cols], cols < N)
    store(parts[p], sum[c] v[c])
    let last = atomic_add(seen[0], 1) == (N + B - 1) / B - 1
    let blocks = iota<i32>(B)
    let got = load(parts[blocks], blocks < (N + B - 1) / B && last, 0)
    store(y[0], sum[c] got[c], last)
    RESET
}

op total<N: Dim>(x: Tensor[N; f32]) -> Tensor[1; f32] kernel block_total<N, 8>
where N <= 64 {
    let s = sum[i] x[i]
    let y[j: 1] = s
    return y
}
"""


@pytest.mark.parametrize("reset", [True, False])
def test_a_kernel_that_leaves_its_counter_set_is_a_finding(tmp_path, interpret, reset):
    """A kernel whose last program does not set its count back would start the next launch
    from it: `linnet kernels` reports it (the right kernel passes)."""
    from linnet.torch.testing import check_kernels

    path = tmp_path / "counts.linnet"
    path.write_text(NO_RESET.replace("RESET", "store(seen[0], 0, last)" if reset else ""))
    findings = check_kernels(path, count=2, seed=0)
    if reset:
        assert findings == []
    else:
        assert findings and "left its scratch buffer `seen` non-zero" in findings[0].problem, (
            findings
        )


def test_flash_decoding_of_bf16_tiles_dots_them_at_their_width(interpret):
    """bf16 query, keys and values: the split kernel's two products are `dot16` of the bf16
    tiles (HEADER's; interpreted it widens them first, as the interpreter's own bf16 dot
    multiplies raw bits) and the result is the attention's, within bf16's rounding."""
    torch.manual_seed(0)
    b, s, kv, g, hd, last = 1, 64, 2, 4, 32, 50
    q = torch.randn(b, kv, g, hd).bfloat16()
    k, v = torch.randn(2, b, s, kv, hd).bfloat16()
    pos = torch.tensor([last], dtype=torch.int32)
    (o,) = launch(
        "std.nn.decode::decode_attention_split",
        dict(B=b, S=s, KV=kv, G=g, HD=hd, T="bf16"),
        q,
        k,
        v,
        pos,
        scalars={"scale": hd**-0.5},
    )
    live = slice(0, last + 1)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().reshape(b, kv * g, 1, hd),
        k.float().permute(0, 2, 1, 3)[:, :, live],
        v.float().permute(0, 2, 1, 3)[:, :, live],
        scale=hd**-0.5,
        enable_gqa=True,
    )
    torch.testing.assert_close(o.float(), want.reshape(b, kv, g, hd), atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------- guarded memory (issue 38)
GUARDED = """
kernel order_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; i32] grid(N)
    scratch(seen: Tensor[1; i32]) {
    let i = program_id(0)
    let before = atomic_add(seen[0], 1)
    store(y[i], before)
    store(seen[0], 0, before == N - 1)
}

kernel scatter_k<N: Dim>(x: Tensor[N; f32], at: Tensor[N; i32]) -> y: Tensor[N; f32] grid(N) {
    let i = program_id(0)
    store(y[load(at[i])], load(x[i]))
}

kernel race_k<N: Dim>(x: Tensor[N; f32], at: Tensor[N; i32]) -> y: Tensor[N; f32] grid(N)
    scratch(t: Tensor[N; f32]) {
    let i = program_id(0)
    store(t[i], load(x[i]))
    store(y[i], load(t[load(at[i])]))
}

kernel last_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[1; f32] grid(N) {
    store(y[0], load(x[program_id(0)]))
}

kernel wild_k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid((N + B - 1) / B) {
    let cols = program_id(0) * B + iota<i32>(B)
    store(y[cols], load(x[cols], cols < N, 0.0))
}
"""


@pytest.fixture
def guarded(tmp_path, interpret):
    path = tmp_path / "guarded.linnet"
    path.write_text(GUARDED)
    return path


def test_guarded_launches_run_the_programs_in_reverse(guarded):
    """The order the interpreter runs programs in, as each counts: 0 first, or N - 1 first
    under ``reverse`` (a kernel right only in one order shows in the other)."""
    from linnet.torch.guarded import guarded_launches

    x = torch.zeros(5)
    (y,) = launch("guarded::order_k", {"N": 5}, x, program=guarded)
    assert y.tolist() == [0, 1, 2, 3, 4]
    with guarded_launches(reverse=True) as guard:
        (y,) = launch("guarded::order_k", {"N": 5}, x, program=guarded)
    assert y.tolist() == [4, 3, 2, 1, 0] and guard.launches == 1


def test_a_wild_store_is_stopped_before_it_runs(guarded):
    """Item 11: a store past `y` at an index read from data raises WildAccess before the
    interpreter writes there (unguarded it overwrites the allocator's memory: SIGABRT)."""
    from linnet.torch.guarded import WildAccess, guarded_launches

    x = torch.arange(4.0)
    at = torch.tensor([3, 2, 1, 0], dtype=torch.int32)
    with guarded_launches():
        (y,) = launch("guarded::scatter_k", {"N": 4}, x, at, program=guarded)
    assert y.tolist() == [3.0, 2.0, 1.0, 0.0]  # in range: the guard lets it run
    at[2] = 1 << 20
    with guarded_launches(), pytest.raises(WildAccess) as info:
        launch("guarded::scatter_k", {"N": 4}, x, at, program=guarded)
    message = str(info.value)
    assert "`store` in program (2,) writes outside every tensor of the launch" in message
    assert "past the end of" in message and "stopped before it ran" in message


def test_programs_racing_through_data_are_found(guarded):
    from linnet.torch.guarded import Race, guarded_launches

    x = torch.arange(4.0)
    own = torch.arange(4, dtype=torch.int32)  # each program reads back its own store
    with guarded_launches():
        (y,) = launch("guarded::race_k", {"N": 4}, x, own, program=guarded)
    assert y.tolist() == x.tolist()
    for reverse in (False, True):  # program 1 reads program 2's element: before or after
        with guarded_launches(reverse), pytest.raises(Race) as info:
            launch(
                "guarded::race_k",
                {"N": 4},
                x,
                torch.tensor([0, 2, 2, 3], dtype=torch.int32),
                program=guarded,
            )
        assert "programs race on `t`" in str(info.value), str(info.value)
        assert "t[2]" in str(info.value) and "no `atomic_add` orders them" in str(info.value)


def test_two_programs_storing_one_element_race_only_with_different_values(guarded):
    from linnet.torch.guarded import Race, guarded_launches

    with guarded_launches():
        (y,) = launch("guarded::last_k", {"N": 3}, torch.ones(3), program=guarded)
    assert y.tolist() == [1.0]
    with guarded_launches(), pytest.raises(Race, match="store different values into y"):
        launch("guarded::last_k", {"N": 3}, torch.arange(3.0), program=guarded)


def test_launch_refuses_a_kernel_out_of_bounds_for_its_generics(guarded):
    """A store past the end whatever the data: E0548 before anything is written."""
    from linnet.lang import LinnetError

    with pytest.raises(LinnetError, match="E0548") as info:
        launch("guarded::wild_k", {"N": 5, "B": 4}, torch.ones(5), program=guarded)
    assert "`store` writes y[5]" in str(info.value)
    (y,) = launch("guarded::wild_k", {"N": 8, "B": 4}, torch.ones(8), program=guarded)
    assert y.tolist() == [1.0] * 8


def test_a_kernel_follows_the_edge_value_rules_as_its_body_does(interpret):
    """tests/kernels/edges.linnet: NaN through max and min (elementwise and reduced),
    integer / and % by 0 and MIN / -1, floats past i32 and i8, floors of subnormals; the
    kernel gives its body's values, which are the rules' (before: Triton's tl.maximum and
    tl.max skipped NaN, 7 / 0 and 7 % 0 gave 0, inf as i32 gave -2147483648)."""
    from test_adversarial_edges import (
        KERNEL_EDGES,
        KERNEL_INPUTS,
        kernel_results_agree,
        kernel_rules,
    )

    args = [
        torch.tensor(KERNEL_INPUTS[k], dtype=torch.float32 if k in "xyz" else torch.int32)
        for k in "xyzab"
    ]
    fast = load(KERNEL_EDGES, weights={}, numerics="fast")
    got = fast.run("run", args)
    assert fast.module("run", args).RUNS == {"edge_tiles_8": [1, 0]}
    text = Path(fast.source("run", args)).read_text()
    assert "propagate_nan=tl.PropagateNan.ALL" in text and "tl.reduce(" in text
    want = load(KERNEL_EDGES, weights={}, numerics="exact").run("run", args)
    kernel_results_agree(got, want, kernel_rules())


def test_a_kernel_reads_bits_as_its_body_does(interpret):
    """tests/kernels/bitcast.linnet: `bitcast<T>(x)` in a kernel is `x.to(T, bitcast=True)`:
    a byte's low nibble in an f32's mantissa (1 + n / 128, int4 dequantisation's trick, no
    conversion instruction), i32 words read as f32 and back (NaN payloads, a subnormal, -0.0),
    f16 as i16, u8 as i8, two programs of 4 lanes; the kernel gives its body's bits, which
    are its inputs'."""
    from test_adversarial_edges import (
        KERNEL_BITS,
        bits_kernel_args,
        bits_kernel_rules,
        signed_bits,
    )

    args = bits_kernel_args()
    fast = load(KERNEL_BITS, weights={}, numerics="fast")
    got = fast.run("run", args)
    assert fast.module("run", args).RUNS == {"bits_tiles_8_4": [1, 0]}
    text = Path(fast.source("run", args)).read_text()
    assert text.count("bitcast=True)") == 5
    want = load(KERNEL_BITS, weights={}, numerics="exact").run("run", args)
    rules = bits_kernel_rules(args)
    for k, (g, w) in enumerate(zip(got, want)):
        assert signed_bits(g) == signed_bits(w) == rules[k], k
    # ... and `linnet kernels`' sampled sizes (partial last tiles) and random data
    from linnet.torch.testing import check_kernels

    assert check_kernels(KERNEL_BITS, count=4, device="cpu") == []


# A row maximum and a column minimum of a padded tile (`tl.reduce` with HEADER's max_nan and
# min_nan): Triton's interpreter called the combine function once an element (a decode
# attention kernel's row maxima were most of `linnet kernels --std`'s time); HEADER has it
# reduce with them as a tree.
EXTREMES = """
kernel extremes_k<R: Dim, C: Dim, BR: Dim, BC: Dim>(x: Tensor[R, C; f32])
    -> (hi: Tensor[R; f32], lo: Tensor[C; f32]) grid(1) {
    let r = iota<i32>(BR)
    let c = iota<i32>(BC)
    let m[i, j] = r[i] < R && c[j] < C
    let low = load(x[r, c], m, -1e30)
    let high = load(x[r, c], m, 1e30)
    let top[i] = max[j] low[i, j]
    let bottom[j] = min[i] high[i, j]
    store(hi[r], top, r < R)
    store(lo[c], bottom, c < C)
}

op extremes<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> (Tensor[R; f32], Tensor[C; f32])
    kernel extremes_k<R, C, 4, 16> where R <= 4 && C <= 16 {
    let hi[i] = max[j] x[i, j]
    let lo[j] = min[i] x[i, j]
    return hi, lo
}

model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> (Tensor[R; f32], Tensor[C; f32]) {
        let (hi, lo) = extremes(x)
        return hi, lo
    }
}
"""


@pytest.mark.parametrize("shape", [(3, 5), (4, 16), (1, 1), (2, 9)])
def test_max_and_min_reductions_run_as_a_tree_with_the_folds_values(tmp_path, interpret, shape):
    from triton.runtime.interpreter import ReduceOps

    path = tmp_path / "extremes.linnet"
    path.write_text(EXTREMES)
    model = load(path, weights={}, numerics="fast")
    x = torch.randn(*shape)
    x[0, shape[1] // 2] = float("nan")  # a NaN wins its row's max and its column's min
    if shape[0] > 1:
        x[-1, -1] = -0.0
    hi, lo = model.run("run", [x])
    module = model.module("run", [x])
    assert list(module.RUNS.values()) == [[1, 0]]
    torch.testing.assert_close(hi, x.amax(1), equal_nan=True)
    torch.testing.assert_close(lo, x.amin(0), equal_nan=True)
    # The tree: a call of max_nan on each level's pairs (4 for the 16 lanes of a row), where
    # the interpreter's own reduction calls it once an element of the tile (60).
    tree = ReduceOps.apply_impl
    assert tree.linnet_tree_reduce
    combine, calls = module.max_nan.fn, []

    def counted(a, b):
        calls.append(a.shape)
        return combine(a, b)

    counted.linnet_tree_reduce = True
    module.max_nan.fn = counted
    try:
        again = model.run("run", [x])
        assert len(calls) == 4 and calls[0] == [4, 8], calls
        # ... with the values of the interpreter's own reduction, bit for bit
        ReduceOps.apply_impl = tree.plain
        calls.clear()
        folded = model.run("run", [x])
        assert len(calls) == 4 * 15
    finally:
        ReduceOps.apply_impl = tree
        module.max_nan.fn = combine
    for a, b, c in zip(again, folded, (hi, lo)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        assert torch.equal(a.view(torch.int32), c.view(torch.int32))


WRAPS = """
kernel wraps_k<N: Dim>(a: Tensor[N; i32], b: Tensor[N; i32]) -> y: Tensor[N; i32] grid(1) {
    let i = iota<i32>(N)
    let p = load(a[i])
    let q = load(b[i])
    store(y[i], p * q + p - q)
}
"""


def test_integer_arithmetic_skips_the_overflow_check_triton_drops(tmp_path, interpret):
    """Triton's `device_assert` drops an integer overflow check unless Triton debugs, so the
    header has the interpreter stop working it out (a third of an interpreted decode kernel's
    time): the results, wrapped as on a GPU, are the same either way."""
    import dataclasses

    from triton.runtime.interpreter import interpreter_builder

    path = tmp_path / "wraps.linnet"
    path.write_text(WRAPS)
    a = torch.tensor([3, -7, 2**30, -(2**31), 46341, 0, 1, 2**31 - 1], dtype=torch.int32)
    b = torch.tensor([5, 9, 4, -1, 46341, -3, 2**31 - 1, 2], dtype=torch.int32)
    (fast,) = launch("wraps::wraps_k", {"N": 8}, a, b, program=path)
    options = interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow
    want = (a.long() * b.long() + a.long() - b.long() + 2**31) % 2**32 - 2**31
    assert fast.tolist() == want.tolist()  # wrapped: no overflow check raised
    interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=True)
    try:
        (checked,) = launch("wraps::wraps_k", {"N": 8}, a, b, program=path)
    finally:
        interpreter_builder.options = options
    assert torch.equal(checked, fast)


def test_a_kernel_reads_the_halves_of_a_joined_product_in_place(interpret, monkeypatch):
    """The launcher passes an input's own strides: the gate and up halves of one joined
    [N, 2F] product (a backend's sibling GEMM) are read where they are, not copied; an input
    whose last axis is not contiguous is still copied first (wide loads a row), and right."""
    copied = []
    contiguous = torch.Tensor.contiguous

    def counted(self, *args, **kwargs):
        if not self.is_contiguous():
            copied.append(tuple(self.shape))
        return contiguous(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", counted)
    joined = torch.randn(3, 2 * 40)
    gate, up = joined[:, :40], joined[:, 40:]
    assert not gate.is_contiguous() and gate.stride() == (80, 1)
    (y,) = launch("std.nn.activation::silu_mul", {"N": 3, "F": 40, "T": "f32"}, gate, up)
    assert copied == []
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up)
    columns = torch.randn(40, 3).t()  # [3, 40], its last axis strided
    (y,) = launch("std.nn.activation::silu_mul", {"N": 3, "F": 40, "T": "f32"}, columns, up)
    assert copied == [(3, 40)]
    torch.testing.assert_close(y, torch.nn.functional.silu(columns) * up)


def test_the_toy_llama_paged_prefill_plans_its_attention_kernel(interpret):
    """A prefill over the page pool, planned as the serving engine plans it (no backend,
    unmeasured): `paged_prefill_attention_flash` claims each layer's attention and the plan
    gives the model's own logits, on a second chunk that reads the first chunk's pages too."""
    import json

    from linnet.lang.syntax.program import model_file
    from linnet.torch import random_weights
    from support import planning_config

    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    cfg["NL"] = planning_config()["NL"]  # one layer under CI=1
    weights = random_weights(llama, {**cfg, "B": 1}, seed=6)
    paged = dict(kv_pages=9, kv_page_size=16, numerics="fast")
    model = load(llama, weights=dict(weights), config=cfg, **paged)
    want = load(llama, weights=dict(weights), config=cfg, **{**paged, "numerics": "exact"})
    mp = -(-int(cfg["S"]) // 16)
    table = torch.zeros((2, mp), dtype=torch.int32)
    table[0, :3], table[1, :3] = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(0, cfg["V"], (2, 20), generator=gen, dtype=torch.int32)
    later = torch.randint(0, cfg["V"], (2, 20), generator=gen, dtype=torch.int32)
    start, n = torch.tensor([0, 0], dtype=torch.int32), torch.tensor([20, 13], dtype=torch.int32)
    plan = model.plan_for(
        "prefill_paged", [first, start, n, table], backends=[], measure=False, progress=False
    )
    taken = [c.region.callee.rsplit("::", 1)[-1] for c in kernel_rows(plan) if c.status == "taken"]
    assert taken.count("paged_prefill_attention_flash") == cfg["NL"], taken
    ctx = model.context_for(plan)
    for tokens, at in ((first, start), (later, n)):  # the second chunk starts where each ended
        (got,) = plan.run([tokens, at, n, table], ctx)
        ref = want.prefill_paged(tokens, at, n, table)
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
