"""The engine's decode by a plan per batch bucket and its prefill by a plan per batch and
length bucket (the default on CUDA): the plans share the page pool with each other, so tokens
equal the unplanned engine's and the dense model's `generate`."""

from __future__ import annotations

import json

import pytest
import torch
from linnet.lang import LinnetError
from linnet.lang.syntax.program import model_file
from linnet.serve.engine import Engine
from linnet.serve.runner import ModelRunner
from linnet.torch import load, random_weights


def test_planned_decode_shares_the_pool_and_changes_no_token() -> None:
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=3)
    prompts = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 4, 6, 2, 9, 10, 12, 1, 5]]
    dense = load(llama, weights=dict(weights), config=cfg)
    want = [dense.generate([p], max_new_tokens=6)[0] for p in prompts]
    got = {}
    for planned in (False, True):
        model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
        runner = ModelRunner(model, 24, 4, max_batch=4, planned=planned)
        engine = Engine(runner, max_batch=4)
        got[planned] = engine.generate(prompts, max_tokens=6)
        # Planned: the batch buckets that ran have one plan each, and no other.
        assert set(runner.steps) == (
            {r for e, r, _ in runner.shapes if e == "decode"} if planned else set()
        )
        # And each (batch, length) bucket of prefill one plan, each of which ran.
        assert set(runner.prefills) == (
            {(b, n) for e, b, n in runner.shapes if e == "prefill"} if planned else set()
        )
        assert all(step is not None for step in runner.prefills.values())
    assert got[True] == got[False] == want


def test_prefill_plans_compile_only_when_asked() -> None:
    """A compiled model's prefill buckets are planned over the generated source uncompiled
    by default (a whole-model compile per bucket pair would stall each new prompt shape),
    and compiled as the model is with ``compile_prefill=True``; decode buckets compile as
    the model does either way."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=3)
    model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
    model.compile = "reduce-overhead"  # what plan_for is asked for, recorded, not run
    asked: list[tuple[str, object, object]] = []

    def plan_for(entry: str, inputs: list, **options: object) -> object:
        asked.append((entry, options["compile"], options["captured"]))
        raise LinnetError([])  # unplannable: the runner falls back to calls

    model.plan_for = plan_for  # type: ignore[method-assign]
    for compile_prefill, want in ((False, None), (True, "reduce-overhead")):
        asked.clear()
        runner = ModelRunner(
            model, 24, 4, max_batch=2, planned=True, compile_prefill=compile_prefill
        )
        runner.prefill([[5, 9, 2]], [0], [[1]])
        assert asked == [("prefill_paged", want, True)]


def test_only_small_prefill_chunks_are_captured() -> None:
    """A captured graph keeps its memory pool while it lives, one per bucket pair: chunks of
    more than ``capture_prefill_tokens`` tokens (rows x length bucket) run op by op."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=3)
    model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
    asked: list[object] = []

    def plan_for(entry: str, inputs: list, **options: object) -> object:
        asked.append((inputs[0].shape[0] * inputs[0].shape[1], options["captured"]))
        raise LinnetError([])

    model.plan_for = plan_for  # type: ignore[method-assign]
    runner = ModelRunner(model, 24, 4, max_batch=2, planned=True, capture_prefill_tokens=16)
    runner.prefill([[5, 9, 2]], [0], [[1]])  # one row of the first length bucket, 16
    runner.prefill([[5, 9, 2], [7, 1]], [0, 0], [[2], [3]])  # two rows: 32 tokens
    assert asked == [(16, True), (32, False)]
    with pytest.raises(LinnetError) as err:
        ModelRunner(model, 24, 4, max_batch=2, capture_prefill_tokens=-1)
    assert "capture_prefill_tokens" in str(err.value)


def test_warm_plans_every_bucket_and_changes_no_token() -> None:
    """`Engine.warm` plans each batch bucket's decode step up front, running it once on
    empty rows (the sink page alone): the tokens afterwards equal a cold engine's."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=4)
    prompts = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 4, 6]]
    got, lines = {}, []
    for warm in (False, True):
        model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
        runner = ModelRunner(model, 24, 4, max_batch=4, planned=True)
        engine = Engine(runner, max_batch=4)
        if warm:
            assert engine.warm(lines.append) is engine
            assert set(runner.steps) == {1, 2, 4}
            assert len(lines) == 3 and lines[-1].startswith("decode step for 4 rows")
        got[warm] = engine.generate(prompts, max_tokens=5)
    assert got[True] == got[False]
    # Unplanned (the CPU's default): nothing to warm.
    model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
    runner = ModelRunner(model, 24, 4, max_batch=4)
    assert runner.warm() == [] and runner.steps == {}


def test_batch_buckets_are_the_sizes_planned_and_padded_to() -> None:
    """``batch_buckets=`` chooses the decode steps' batch sizes (fewer plans to warm): warm
    plans those alone, a smaller batch pads to the next, and the tokens equal the default
    buckets'. A list that is not positive ints ending at ``max_batch`` is E0862."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=4)
    prompts = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 4, 6]]
    got = {}
    for buckets in (None, [4, 2]):
        model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
        runner = ModelRunner(model, 24, 4, max_batch=4, planned=True, batch_buckets=buckets)
        if buckets:
            assert runner.buckets == [2, 4] and runner.warm() == [2, 4]
            assert set(runner.steps) == {2, 4}
        got[bool(buckets)] = Engine(runner, max_batch=4).generate(prompts, max_tokens=5)
        if buckets:
            shapes = {(entry, rows) for entry, rows, _ in runner.shapes}
            assert {rows for entry, rows in shapes if entry == "decode"} <= {2, 4}
            # Prefill pads its rows to powers of two whatever the decode buckets: a prompt
            # alone is one row, not two.
            runner.prefill([[5, 9, 2, 7, 1]], [0], [[1, 2]])
            assert ("prefill", 1) in {(entry, rows) for entry, rows, _ in runner.shapes}
    assert got[True] == got[False]
    for bad in ([], [0, 4], [2, 8], "4", [2.0, 4]):
        with pytest.raises(LinnetError) as err:
            ModelRunner(model, 24, 4, max_batch=4, batch_buckets=bad)
        assert err.value.diagnostics[0].code == "E0862" and "batch_buckets" in str(err.value)


def test_decode_is_planned_half_way_through_pages_of_each_rows_own() -> None:
    """A bucket's decode step is timed where attention reads as it will when serving: every
    row half way through the longest sequence, through pages of its own (not position 1
    through the sink page, where every attention looks alike); a pool smaller than the
    bucket's rows at that length shortens the position, never leaves the pool."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=3)
    model = load(llama, weights=dict(weights), config=cfg, kv_pages=24, kv_page_size=4)
    asked: list[list[torch.Tensor]] = []

    def plan_for(entry: str, inputs: list, **options: object) -> object:
        asked.append(inputs)
        raise LinnetError([])

    model.plan_for = plan_for  # type: ignore[method-assign]
    runner = ModelRunner(model, 24, 4, max_batch=4, planned=True)
    for rows in (1, 4):
        pos, table = runner.planning_rows(rows)
        pages = int(pos[0]) // 4 + 1
        # Half way (S = 16 in the toy config: position 7), or what 23 usable pages allow.
        assert int(pos[0]) == min(runner.max_len // 2, max(1, 23 // rows) * 4) - 1
        assert (pos == pos[0]).all() and table.shape == (rows, runner.columns)
        used = table[:, :pages].flatten().tolist()
        assert len(set(used)) == len(used) and 0 not in used and max(used) < 24
        assert (table[:, pages:] == 0).all()
    with pytest.raises(LinnetError):
        runner.decode([5, 6], [3, 4], [[1], [2]])
    entry_inputs = asked[-1]
    assert entry_inputs[1].tolist() == runner.planning_rows(2)[0].tolist()
    assert entry_inputs[2].tolist() == runner.planning_rows(2)[1].tolist()
    # A pool of 3 usable pages for 4 rows: position 3 (one page a row), pages shared round.
    small = ModelRunner(model, 4, 4, max_batch=4, planned=True)
    pos, table = small.planning_rows(4)
    assert pos.tolist() == [3] * 4 and table[:, 0].tolist() == [1, 2, 3, 1]


def test_a_short_prefill_runs_as_one_decode_step() -> None:
    """A step's prefill of at most the largest batch bucket's tokens in all runs as one
    `decode_paged` call, a row a token (the decode buckets are planned and captured
    already): each chunk's last logits equal `prefill_paged`'s, a prefix-cache hit's tail
    included, and the pages hold the same K and V after."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=6)
    tables = [[1, 2], [3, 4], [5]]
    logits, shapes = {}, {}
    for by_decode in (True, False):
        model = load(llama, weights=dict(weights), config=cfg, kv_pages=8, kv_page_size=4)
        runner = ModelRunner(model, 8, 4, max_batch=8, prefill_by_decode=by_decode)
        first = runner.prefill([[5, 9, 2, 7, 1], [3, 3]], [0, 0], tables[:2])  # 7 tokens
        tails = runner.prefill([[4, 6], [8], [10, 11, 12]], [5, 2, 0], tables)  # 6 tokens
        # A decode step after, reading every position: the pages hold the same K and V.
        after = runner.decode([13, 14, 15], [7, 3, 3], tables)
        logits[by_decode] = torch.cat([first, tails, after])
        shapes[by_decode] = sorted(runner.shapes)
    # 7 and 6 tokens: two calls of the 8-row bucket, then the 4-row decode step.
    assert shapes[True] == [("decode", 4, 1), ("decode", 8, 1)]
    assert [e for e, _, _ in shapes[False]] == ["decode", "prefill", "prefill"], shapes
    torch.testing.assert_close(logits[True], logits[False], atol=1e-5, rtol=1e-5)
    # Beyond the largest bucket's tokens, or off: prefill_paged as before.
    model = load(llama, weights=dict(weights), config=cfg, kv_pages=8, kv_page_size=4)
    runner = ModelRunner(model, 8, 4, max_batch=4)
    runner.prefill([[5, 9, 2, 7, 1]], [0], tables[:1])
    assert [e for e, _, _ in runner.shapes] == ["prefill"]


def test_a_step_runs_its_decode_rows_and_short_chunks_as_one_call() -> None:
    """`ModelRunner.step` (what the Engine calls): decode rows and prefill chunks that fit
    the largest batch bucket together run as one `decode_paged` call, with the logits of the
    decode rows and of each chunk's last token equal to a decode call and a prefill call."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=7)
    got, shapes = {}, {}
    for merged in (True, False):
        model = load(llama, weights=dict(weights), config=cfg, kv_pages=8, kv_page_size=4)
        runner = ModelRunner(model, 8, 4, max_batch=8, prefill_by_decode=merged)
        runner.prefill([[5, 9, 2, 7, 1, 4, 4, 6]], [0], [[1, 2]])  # 8 tokens: the bucket
        runner.shapes.clear()
        decode = ([3], [8], [[1, 2, 3]])
        prefill = ([[11, 12, 13], [8, 9]], [0, 0], [[4], [5]])
        got[merged] = runner.step(decode, prefill)
        shapes[merged] = sorted(runner.shapes)
    assert shapes[True] == [("decode", 8, 1)]  # 1 + 5 rows in the 8-row bucket: one call
    assert shapes[False] == [("decode", 1, 1), ("prefill", 2, 16)]
    assert got[True].shape[0] == 3
    torch.testing.assert_close(got[True], got[False], atol=1e-5, rtol=1e-5)


def test_a_long_chunk_does_not_pad_the_short_ones() -> None:
    """One step's prefill rows of unlike lengths run as calls of like lengths (each padded
    to its own longest row's bucket, not the step's), and the logits come back in the rows'
    order, equal to one call each."""
    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"}
    weights = random_weights(llama, {**cfg, "B": 1}, seed=5)
    model = load(llama, weights=dict(weights), config=cfg, kv_pages=40, kv_page_size=4)
    rows = [[3, 1, 4], list(range(1, 70)), [5, 9], [2, 6, 5, 3]]  # the second is long
    tables = [[1], list(range(2, 20)), [20], [21]]
    runner = ModelRunner(model, 40, 4, max_batch=4, prefill_call_tokens=32)
    together = runner.prefill(rows, [0] * 4, tables)
    assert {(b, n) for e, b, n in runner.shapes if e == "prefill"} == {(1, 128), (4, 16)}
    for b, row in enumerate(rows):  # each row alone, into fresh pages of the same content
        alone = ModelRunner(model, 40, 4, max_batch=4).prefill([row], [0], [tables[b]])
        torch.testing.assert_close(together[b], alone[0], atol=1e-5, rtol=1e-5)
