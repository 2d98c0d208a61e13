"""FlashInfer over a paged KV cache: the plugin takes std.nn.paged's decode attention calls
(``paged_decode_attention`` and its window and soft-cap forms, what every std model's
``decode_paged`` runs) and hands FlashInfer the model's own page pool and, from the entry's
page table, the pages each row holds. On the CPU against the stand-in wrapper
(flashinfer_fakes.py), compared per region with the generated source (the op bodies) on a
pool of random pages read through shuffled tables; on a GPU (gpu-marked) against FlashInfer
itself. A table that changes between steps with the same page counts (a row's pages
swapped: the serving engine's slots) is copied in without a new plan and still read right;
a page outside the pool is a coded error, never a read past it."""

from __future__ import annotations

import linnet.torch.flashinfer as fi
import linnet.torch.flashinfer.planning as planning
import pytest
import torch
from flashinfer_fakes import GPU, CpuFlashInfer, FakeWrapper
from linnet.backends import Options, Target
from linnet.torch.flashinfer import (
    PAGED_DECODE_ATTENTION,
    PAGED_SOFTCAP_DECODE_ATTENTION,
    PAGED_WINDOW_DECODE_ATTENTION,
    FlashInfer,
    paged_layout,
)

HOPPER = Target("cuda", "cuda:0", "NVIDIA H200", (9, 0))
NP, PS = 12, 16
DIMS = {"V": 256, "D": 256, "F": 512, "NL": 2, "H": 4, "KV": 2, "HD": 64, "S": 64, "T": "bf16"}
MP = DIMS["S"] // PS
# Three rows: 21 positions over pages 7 and 2, 49 over four pages out of order, and an empty
# slot (position 0 of the sink page, a table of zeros).
POS = [20, 48, 0]
TABLES = [[7, 2, 0, 0], [5, 11, 3, 9], [0, 0, 0, 0]]
CASES = {
    "plain": ("llama", {}),
    "window": ("qwen2", {"layer_windows": [8, 0]}),
    "softcap-window": ("gemma2", {"layer_windows": [8, 0], "attn_logit_softcapping": 0.5}),
}


def paged_graph(model: str, **extra):
    from linnet.lang import Program, lower
    from linnet.lang.syntax.program import model_file

    program = Program.from_file(model_file(f"std.models.{model}"))
    config = DIMS | {"kv_pages": NP, "kv_page_size": PS} | extra
    return lower(program, "decode_paged", {"token": [3], "pos": [3], "table": [3, MP]}, config)


def test_paged_layout_reads_each_rows_pages_in_its_order():
    assert paged_layout([21, 49, 1], PS, TABLES) == (
        [0, 2, 6, 7],
        [7, 2, 5, 11, 3, 9, 0],
        [5, 1, 1],
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_paged_layer_is_taken_with_the_pool_and_table(case):
    name, extra = CASES[case]
    graph = paged_graph(name, **extra)
    found = FlashInfer().sites(graph)
    assert len(found) == 2 and all(site is not None for _, site, _ in found), found
    for call, site, _ in found:
        assert call.callee in (
            PAGED_DECODE_ATTENTION,
            PAGED_WINDOW_DECODE_ATTENTION,
            PAGED_SOFTCAP_DECODE_ATTENTION,
        )
        shape = site.shape
        assert (shape.pool, shape.page, shape.table_width, shape.cache) == (NP, PS, MP, MP * PS)
        assert site.region.inputs[site.table_index] == "%table"
        assert site.region.inputs[site.pos_index] == "%pos"
    windows = sorted(site.shape.window_left for _, site, _ in found)
    assert windows == ([-1, -1] if case == "plain" else [-1, 7])


def test_a_table_made_inside_the_entry_is_declined():
    """FlashInfer plans on the host from the entry's inputs: a table computed in the entry
    is not current then."""
    import copy

    graph = copy.deepcopy(paged_graph("llama"))
    call = graph.semantic_calls(PAGED_DECODE_ATTENTION)[0]
    call.attributes["args"][3] = "%qs"  # any value the entry makes
    site, why = fi.analyse(graph, call)
    assert site is None and "computed inside the entry" in why


def _model(name: str, device: str = "cpu", **extra):
    from linnet.lang.syntax.program import model_file
    from linnet.torch import load, random_weights

    path = model_file(f"std.models.{name}")
    cfg = DIMS | extra
    weights = random_weights(path, cfg, seed=3, scale=0.2, device=device)
    return load(path, weights=weights, config=cfg, device=device, kv_pages=NP, kv_page_size=PS)


def _inputs(device: str, tables=TABLES):
    i32 = torch.int32
    return [
        torch.tensor([7, 9, 0], dtype=i32, device=device),
        torch.tensor(POS, dtype=i32, device=device),
        torch.tensor(tables, dtype=i32, device=device),
    ]


def _conform(model, backend, device: str = "cpu", tables=TABLES):
    """Per-region findings of ``backend`` on one paged decode step over a pool of random
    pages (every page, the sink included, holds values: a page read in place of another
    changes the result)."""
    inputs = _inputs(device, tables)
    context = model.new_context("decode_paged", inputs)
    generator = torch.Generator(device=device).manual_seed(1)
    for path, state in context.states.items():
        if path.endswith(("k_pages", "v_pages")):
            state.copy_(
                torch.randn(state.shape, generator=generator, device=device).to(state.dtype)
            )
    return model.conform("decode_paged", inputs, backend, context=context)


@pytest.mark.parametrize("case", sorted(CASES))
def test_paged_decode_equals_the_op_bodies(installed, case):
    name, extra = CASES[case]
    findings = _conform(_model(name, **extra), CpuFlashInfer(workspace_bytes=1 << 16))
    assert len(findings) == 2 and all(f.passed for f in findings), findings
    wrapper = FakeWrapper.made[-1]
    assert wrapper.planned["page_size"] == PS
    assert wrapper.indices[:7].tolist() == [7, 2, 5, 11, 3, 9, 0]


def test_a_wrong_page_would_be_caught(installed, monkeypatch):
    """The comparison sees which pages are read: the dense layout's pages (row b's pages
    b * MP ..) in place of the table's differ from the op body."""
    monkeypatch.setattr(
        planning,
        "paged_layout",
        lambda lengths, page_size, tables: planning.layout(lengths, page_size, MP),
    )
    findings = _conform(_model("llama"), CpuFlashInfer(workspace_bytes=1 << 16))
    assert not all(f.passed for f in findings), findings


def _planner(installed_tables=TABLES):
    graph = paged_graph("llama")
    backend = CpuFlashInfer(workspace_bytes=1 << 16)
    (call, *_) = backend.compile_regions(backend.match(graph, HOPPER)[:1], HOPPER, Options())
    return call.planner


class _Context:
    def __init__(self, pos, table):
        self.inputs = {"%pos": pos, "%table": table}
        self.host_inputs = {"%pos": pos, "%table": table}


def test_new_pages_with_the_same_counts_are_copied_without_a_plan(installed):
    """The serving engine moves rows between slots and hands out new pages: with each row's
    page count unchanged, FlashInfer's schedule stands and only the indices (and last-page
    lengths) are written; a new page count plans again."""
    planner = _planner()
    pos, table = torch.tensor(POS, dtype=torch.int32), torch.tensor(TABLES, dtype=torch.int32)
    planner.setup(torch.device("cpu"))
    planner._follow(pos, table)
    planner._refresh(_Context(pos, table))
    wrapper = planner.wrapper
    assert wrapper.plan_calls == 1
    swapped = [[9, 4, 0, 0], [1, 10, 6, 8], [0, 0, 0, 0]]
    table2 = torch.tensor(swapped, dtype=torch.int32)
    planner._follow(pos, table2)
    planner._refresh(_Context(pos, table2))
    assert wrapper.plan_calls == 1
    assert wrapper.indices[:7].tolist() == [9, 4, 1, 10, 6, 8, 0]
    longer = torch.tensor([POS[0] + 12, POS[1], POS[2]], dtype=torch.int32)  # a third page
    planner._follow(longer, table2)
    planner._refresh(_Context(longer, table2))
    assert wrapper.plan_calls == 2
    assert wrapper.indptr.tolist() == [0, 3, 7, 8]


def test_a_page_outside_the_pool_is_refused(installed):
    """A table read from the device (Captured does not range-check device inputs) that names
    a page past the pool is refused before FlashInfer reads it (the runtime reports the
    error as E0757, naming the backend)."""
    planner = _planner()
    pos = torch.tensor(POS, dtype=torch.int32)
    bad = torch.tensor([[7, NP, 0, 0], *TABLES[1:]], dtype=torch.int32)
    planner.setup(torch.device("cpu"))
    planner._follow(pos, bad)
    with pytest.raises(ValueError, match=f"names page {NP}, outside the KV cache's pool"):
        planner._refresh(None)
    assert planner.reads == 1  # read from the tensors: no host copy was given


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("case", sorted(CASES))
def test_flashinfer_paged_decode_equals_the_op_bodies_on_a_gpu(case):
    """FlashInfer itself over the model's page pool against the generated source of the
    paged decode ops, per layer, bf16."""
    name, extra = CASES[case]
    model = _model(name, device="cuda", **extra)
    findings = _conform(model, FlashInfer(), device="cuda")
    assert len(findings) == 2 and all(f.passed for f in findings), findings


def test_many_paged_steps_with_tables_that_change(installed):
    """Steps as the serving engine runs them, through plan.run: rows advance across page
    boundaries (a new page a row: plan() again), then swap slots and get other pages with the
    same counts (only the indices are copied in), every step equal to the op bodies' step on a
    copy of the same pool. Each step's positions and table come from the host."""
    model = _model("llama")
    i32 = torch.int32
    tables = [[7, 2, 0, 0], [5, 11, 3, 4]]
    plan = model.plan_for(
        "decode_paged",
        [
            torch.tensor([1, 2], dtype=i32),
            torch.tensor([0, 0], dtype=i32),
            torch.tensor(tables, dtype=i32),
        ],
        backends=[CpuFlashInfer(workspace_bytes=1 << 16)],
        measure=False,
        progress=False,
    )
    assert len(plan.regions) == 2
    ctx = model.context_for(plan)
    ref = model.new_context(
        "decode_paged", [torch.zeros(2, dtype=i32)] * 2 + [torch.tensor(tables, dtype=i32)]
    )
    generator = torch.Generator().manual_seed(2)
    for path, state in ctx.states.items():
        if path.endswith(("k_pages", "v_pages")):
            state.copy_(torch.randn(state.shape, generator=generator).to(state.dtype))
            ref.states[path].copy_(state)
    planner = plan.executables[0].planner
    plans = planner.plans
    tokens = [5, 7]
    errors = []
    # Row 0 from position 28 (its second page) into its third at 32; row 1 from 44 (its
    # third page) into its fourth at 48. At step 8 both rows get other pages: the same
    # counts.
    for step in range(12):
        if step == 8:
            tables = [[9, 1, 6, 0], [10, 8, 2, 3]]
        table = torch.tensor(tables, dtype=i32)
        pos = torch.tensor([28 + step, 44 + step], dtype=i32)
        token = torch.tensor(tokens, dtype=i32)
        got = plan.run([token, pos, table], ctx)[0]
        want = model.run("decode_paged", [token, pos, table], context=ref)
        # bf16 throughout, and each side writes its own K and V into its pool a step; the
        # stand-in keeps probabilities in f32 where the std op rounds them to bf16 (a wrong
        # page or length is off by 10-70%).
        errors.append(((got - want).norm() / want.norm()).item())
        tokens = want.argmax(-1).tolist()
    assert max(errors) < 0.03, errors
    # plan() at the first step and when both rows reached a new page (step 4: positions 32
    # and 48); the new pages at step 8 kept every row's count: copied in without a plan.
    assert planner.plans - plans == 2
    assert planner.indices == (9, 1, 6, 10, 8, 2, 3)
    assert planner.wrapper.indices[:7].tolist() == [9, 1, 6, 10, 8, 2, 3]


def test_plans_of_two_batch_sizes_share_one_page_pool(installed):
    """The serving engine's buckets: a plan a batch size, all in the model's shared context
    (one page pool). A plan made after another has run meets that run's inputs in the
    context; its wrapper, fixed to its own batch in CUDA-graph mode, must plan only for its
    own rows (on an H100 the 8-row bucket's context planned the 4-row step's positions:
    "the runtime batch size 4 mismatches the batch size set during initialization 8").
    Steps of both sizes, interleaved, equal the op bodies' steps."""
    model = _model("llama")
    i32 = torch.int32
    backend = CpuFlashInfer(workspace_bytes=1 << 16)
    tables = {2: [[7, 2, 0, 0], [5, 11, 3, 4]], 3: [[7, 2, 0, 0], [5, 11, 3, 4], [9, 1, 0, 0]]}
    plans, contexts = {}, {}
    refs = {}
    errors = []
    for step, rows in enumerate([2, 2, 3, 2, 3, 3, 2]):
        table = torch.tensor(tables[rows], dtype=i32)
        pos = torch.tensor([20 + step, 40 + step, 10 + step][:rows], dtype=i32)
        token = torch.tensor([5, 7, 3][:rows], dtype=i32)
        if rows not in plans:
            plans[rows] = model.plan_for(
                "decode_paged",
                [token, pos, table],
                backends=[backend],
                measure=False,
                progress=False,
            )
            assert len(plans[rows].regions) == 2
            contexts[rows] = model.context_for(plans[rows], shared=True)
            refs[rows] = model.new_context("decode_paged", [token, pos, table])
        ctx, ref = contexts[rows], refs[rows]
        assert ctx is contexts[2]  # one pool for both sizes
        for path, state in ctx.states.items():  # the same pages on both sides
            if path.endswith(("k_pages", "v_pages")):
                ref.states[path].copy_(state)
        got = plans[rows].run([token, pos, table], ctx)[0]
        want = model.run("decode_paged", [token, pos, table], context=ref)
        errors.append(((got - want).norm() / want.norm()).item())
    assert max(errors) < 0.03, errors
