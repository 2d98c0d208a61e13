"""The page pool, the scheduler and the engine as logic: deterministic, no real model (the
reference paged toy of linnet.serve.testing reads every token back through the page table,
so a wrong table, page or share changes the tokens)."""

from __future__ import annotations

import asyncio
import random

import pytest
from linnet.lang.diagnostics.core import LinnetError
from linnet.serve.engine import Engine
from linnet.serve.pages import PagePool, block_keys
from linnet.serve.runner import ModelRunner
from linnet.serve.scheduler import Scheduler, Sequence
from linnet.serve.testing import ToyPagedModel

V = 97


def code(e: pytest.ExceptionInfo[LinnetError]) -> str:
    return e.value.diagnostics[0].code


def make(
    pages: int = 33, page_size: int = 4, max_len: int = 64, max_batch: int = 8, **kw: object
) -> tuple[Engine, ToyPagedModel]:
    toy = ToyPagedModel(V, pages, page_size, max_len)
    engine = Engine(ModelRunner(toy, pages, page_size, max_batch), max_batch=max_batch, **kw)  # type: ignore[arg-type]
    return engine, toy


def prompts(n: int, seed: int = 0, shortest: int = 1, longest: int = 20) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(V) for _ in range(rng.randint(shortest, longest))] for _ in range(n)]


# -- the page pool ------------------------------------------------------------------------


def test_pool_allocates_all_or_nothing_and_never_the_sink():
    pool = PagePool(4, 2)
    assert pool.allocate(4) is None and pool.available() == 3
    got = pool.allocate(3)
    assert got == [1, 2, 3] and pool.allocate(1) is None
    pool.release(got)
    pool.check()
    assert pool.available() == 3


@pytest.mark.parametrize(
    "pages, why",
    [
        ([1, 1], "held 1 times, freed 2"),
        ([0], "sink"),
        ([9], "pool's pages"),
        ([2], "free already"),
    ],
)
def test_pool_refuses_a_double_free(pages, why):
    pool = PagePool(4, 2)
    pool.allocate(1)
    with pytest.raises(LinnetError) as e:
        pool.release(pages)
    assert code(e) == "E0865" and why in str(e.value)
    pool.check()
    assert pool.refs[1] == 1  # nothing changed


def test_prefix_cache_shares_and_evicts_least_recently_released():
    pool = PagePool(4, 2)
    a, b = pool.allocate(1), pool.allocate(1)
    ka, kb = block_keys([1, 2], 2)[0], block_keys([3, 4], 2)[0]
    pool.register(ka, a[0])
    pool.register(kb, b[0])
    pool.release(a)
    pool.release(b)
    assert pool.cached() == 2 and pool.available() == 3
    assert pool.match([kb]) == b and pool.refs[b[0]] == 1  # found again: held, not evictable
    got = pool.allocate(2)  # the free page, then the idle cached one (a), evicted
    assert got == [3, a[0]] and pool.match([ka]) == []
    pool.release(b)
    pool.check()


def test_block_keys_chain_the_whole_prefix():
    assert block_keys([1, 2, 3, 4], 2)[1] != block_keys([9, 2, 3, 4], 2)[1]
    assert len(block_keys([1, 2, 3], 2)) == 1 and block_keys(
        [1, 2, 3, 4], 2, limit=1
    ) == block_keys([1, 2], 2)


# -- the scheduler ------------------------------------------------------------------------


def test_scheduler_refuses_what_can_never_fit_instead_of_hanging():
    s = Scheduler(PagePool(4, 4), max_batch=2, token_budget=8, max_len=64)
    with pytest.raises(LinnetError) as e:  # 20 positions: 5 pages, the pool has 3
        s.add(Sequence(0, list(range(10)), max_tokens=11))
    assert code(e) == "E0863" and "pool has 3" in str(e.value) and "--kv-pages" in str(e.value)
    with pytest.raises(LinnetError) as e:
        s.add(Sequence(1, list(range(60)), max_tokens=10))
    assert code(e) == "E0863" and "cache holds 64" in str(e.value)
    s.add(Sequence(2, list(range(6)), max_tokens=7))  # 12 positions: exactly 3 pages


def test_chunked_prefill_keeps_the_token_budget_and_page_boundaries():
    s = Scheduler(PagePool(32, 4), max_batch=4, token_budget=10, max_len=64)
    long = s.add(Sequence(0, list(range(30)), max_tokens=2))
    plan = s.schedule()
    assert [(c.start, c.n) for c in plan.prefill] == [(0, 8)]  # 10 rounded to whole pages
    s.finish_step(plan)
    plan = s.schedule()
    assert [(c.start, c.n) for c in plan.prefill] == [(8, 8)]
    assert long.registered == 2  # the first chunk's pages are in the prefix cache


def test_newest_is_preempted_and_comes_back_first():
    pool = PagePool(5, 2)  # 4 pages
    s = Scheduler(pool, max_batch=4, token_budget=64, max_len=64)
    a = s.add(Sequence(0, [1, 2, 3], max_tokens=4))  # 2 pages
    b = s.add(Sequence(1, [4, 5, 6], max_tokens=4))  # 2 pages
    plan = s.schedule()
    s.finish_step(plan)
    a.tokens.append(7)
    b.tokens.append(8)
    plan = s.schedule()  # both decode at position 3: in their second pages, no new page
    assert plan.decode == [a, b] and not plan.preempted
    s.finish_step(plan)
    a.tokens.append(9)
    b.tokens.append(9)
    plan = s.schedule()  # position 4 needs a third page each: b (newest) gives way
    assert plan.preempted == [b] and plan.decode == [a] and list(s.waiting) == [b]
    assert b.pages == [] and b.computed == 0 and b.generated == [8, 9]
    pool.check()


# -- the engine ---------------------------------------------------------------------------


def test_engine_matches_the_dense_reference():
    engine, toy = make()
    batch = prompts(12, seed=1)
    out = engine.generate(batch, max_tokens=6)
    assert out == [toy.reference(p, 6) for p in batch]
    assert engine.stats()["pages_used"] == 0
    engine.pool.check()


def test_preemption_loses_no_request_and_changes_no_token():
    # 12 pages of 4 for 16 requests of up to 20 + 12 tokens: far fewer than they need.
    engine, toy = make(pages=13, max_batch=16, token_budget=16)
    batch = prompts(16, seed=2, longest=20)
    out = engine.generate(batch, max_tokens=12)
    assert out == [toy.reference(p, 12) for p in batch]
    assert engine.metrics.preemptions > 0
    assert engine.stats()["pages_used"] == 0
    engine.pool.check()


def test_shared_prefixes_are_computed_once():
    engine, toy = make(pages=40, token_budget=64)
    system = list(range(1, 17))  # 4 whole pages
    batch = [[*system, 50 + i, 60 + i] for i in range(6)]
    engine.generate(batch[:1], max_tokens=2)
    prefilled = engine.metrics.cached_prompt_tokens
    out = engine.generate(batch[1:], max_tokens=4)
    assert out == [toy.reference(p, 4) for p in batch[1:]]
    assert engine.metrics.cached_prompt_tokens - prefilled == 5 * 16


def test_a_prompt_of_whole_pages_keeps_its_last_token_to_compute():
    engine, toy = make()
    p = list(range(8))  # exactly 2 pages: the second is never shared (its logits are needed)
    assert engine.generate([p, p], max_tokens=3) == [toy.reference(p, 3)] * 2
    assert engine.generate([p], max_tokens=3) == [toy.reference(p, 3)]


def test_stop_tokens_and_lengths():
    engine, toy = make()
    p = [5, 6, 7]
    ref = toy.reference(p, 8)
    stop = ref[2]
    (out,) = engine.generate([p], max_tokens=8, stop_tokens=[stop])
    assert out == ref[: ref.index(stop) + 1]
    r = engine.submit(p, max_tokens=3)
    engine.run_until_idle()
    assert r.finish_reason == "length" and r.tokens == ref[:3]


def test_sampling_is_reproducible_by_seed():
    engine, _ = make()
    p = [[1, 2, 3], [4, 5]]
    a = engine.generate(p, max_tokens=8, temperature=1.0, top_k=20, seed=3)
    b = engine.generate(p, max_tokens=8, temperature=1.0, top_k=20, seed=3)
    greedy = engine.generate(p, max_tokens=8)
    assert a == b and a != greedy


def test_batch_buckets_bound_the_shapes():
    engine, _ = make(max_batch=8)
    engine.generate(prompts(7, seed=4), max_tokens=5)
    sizes = {b for entry, b, _ in engine.runner.shapes}  # type: ignore[attr-defined]
    assert sizes <= {1, 2, 4, 8}


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"max_tokens": 0}, "E0811"),
        ({"temperature": -1.0}, "E0812"),
        ({"top_k": 0, "temperature": 1.0}, "E0813"),
        ({"top_p": 1.5}, "E0814"),
        ({"stop_tokens": [V]}, "E0819"),
        ({"max_tokens": 100}, "E0863"),
    ],
)
def test_bad_requests_are_refused_before_they_queue(options, expected):
    engine, _ = make()
    with pytest.raises(LinnetError) as e:
        engine.submit([1, 2, 3], **options)
    assert code(e) == expected
    assert not engine.scheduler.waiting


def test_bad_prompts():
    engine, _ = make()
    for prompt in ([], [V], "hello"):
        with pytest.raises(LinnetError) as e:
            engine.submit(prompt, max_tokens=2)  # type: ignore[arg-type]
        assert code(e) == "E0810"


def test_queue_full_is_refused():
    engine, _ = make(max_queue=2)
    engine.submit([1], max_tokens=2)
    engine.submit([2], max_tokens=2)
    with pytest.raises(LinnetError) as e:
        engine.submit([3], max_tokens=2)
    assert code(e) == "E0864"
    engine.run_until_idle()
    engine.submit([3], max_tokens=2)  # room again


def test_cancel_frees_pages_at_once():
    engine, _ = make()
    r = engine.submit(list(range(10)), max_tokens=20)
    engine.step()
    engine.step()
    assert engine.stats()["pages_used"] > 0
    r.cancel()
    assert engine.stats()["pages_used"] == 0 and r.finish_reason == "cancelled"
    assert engine.step() is False
    engine.pool.check()


def test_closed_engine_refuses():
    engine, _ = make()
    r = engine.submit([1, 2], max_tokens=4)
    engine.close()
    assert r.finish_reason == "cancelled"
    with pytest.raises(LinnetError) as e:
        engine.submit([1], max_tokens=2)
    assert code(e) == "E0877"


@pytest.mark.parametrize(
    "options",
    [{"max_batch": 0}, {"token_budget": 2}, {"max_queue": 0}],
)
def test_bad_engine_options(options):
    with pytest.raises(LinnetError) as e:
        make(**options)
    assert code(e) == "E0862"


def test_a_bad_batch_buckets_flag_is_refused_before_the_model_loads():
    """`linnet serve --batch-buckets` is checked with the other options, before anything is
    loaded: E0862 naming it, not a failure after minutes of loading."""
    import argparse

    from linnet.serve.cli import check_args

    base = dict(port=8000, max_batch=32, kv_pages=64, page_size=16, token_budget=512)
    check_args(argparse.Namespace(**base, max_queue=8, batch_buckets=[8, 16, 32]))
    with pytest.raises(LinnetError) as e:
        check_args(argparse.Namespace(**base, max_queue=8, batch_buckets=[8, 16]))
    assert code(e) == "E0862" and "batch_buckets" in str(e.value)


def test_a_model_without_paged_entries():
    class Dense:
        entries = ("prefill", "decode")

    with pytest.raises(LinnetError) as e:
        ModelRunner(Dense(), 8, 4, 4)
    assert code(e) == "E0869" and "kv_pages" in str(e.value)


def test_streams_on_the_engine_thread_in_an_event_loop():
    engine, toy = make()
    toy.delay = 0.002
    engine.start()
    try:

        async def one(p: list[int]) -> list[int]:
            out: list[int] = []
            async for ids in engine.submit(p, max_tokens=5).stream():
                out += ids
            return out

        async def every(batch: list[list[int]]) -> list[list[int]]:
            return list(await asyncio.gather(*(one(p) for p in batch)))

        batch = prompts(6, seed=5)
        assert asyncio.run(every(batch)) == [toy.reference(p, 5) for p in batch]
    finally:
        engine.close()


def test_a_failing_model_fails_its_requests_not_the_engine():
    engine, toy = make()

    calls = {"n": 0}
    real = toy.decode_paged

    def flaky(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            from linnet.lang.host.inputs import error

            raise error("E0780", "a token outside the vocabulary", help="-")
        return real(*args)

    toy.decode_paged = flaky  # type: ignore[method-assign]
    r = engine.submit([1, 2, 3], max_tokens=4)
    engine.run_until_idle()
    assert r.finish_reason == "error" and engine.stats()["pages_used"] == 0
    with pytest.raises(LinnetError):
        r.wait()
    assert engine.generate([[4, 5]], max_tokens=3) == [toy.reference([4, 5], 3)]
