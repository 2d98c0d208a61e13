"""The OpenAI-compatible HTTP server (starlette; :func:`serve` runs it under uvicorn).

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (``stream`` false: one
JSON body; true: server-sent events, a ``data:`` chunk per piece of text and ``data:
[DONE]``; ``usage`` counts, in the last chunk with ``stream_options.include_usage``),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text).

A request is read into a prompt (chat messages through the tokenizer's chat template;
a completion's text or token ids) and :class:`linnet.serve.request.SamplingParams`, and
submitted to the engine; its tokens come back as text, cut at ``stop`` strings
(:class:`linnet.lang.text.stream.StopStrings`). A mistake is an OpenAI-shaped error body
``{"error": {"message", "type", "param", "code"}}`` with the Linnet code: 400 for a bad
field, an unknown model or a prompt that can never fit, 429 when the queue is full, 503
once the engine is closed; never a traceback. A client that goes away mid-stream cancels
its request, which frees its pages at once.

>>> app = build_app(engine)                                       # doctest: +SKIP
>>> serve(engine, host="127.0.0.1", port=8000)                    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from linnet.lang.diagnostics.core import LinnetError
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .engine import Engine
from .errors import bad_request
from .request import Request, SamplingParams

#: HTTP status of each engine code; every other code is a 400.
STATUS = {"E0864": 429, "E0877": 503}
#: The tokens a chat reply may take where the request does not say (and the cache allows).
CHAT_TOKENS = 256


def error_response(e: LinnetError) -> JSONResponse:
    """An OpenAI-shaped error body for ``e``, with its code and help.

    >>> from linnet.serve.errors import queue_full
    >>> error_response(queue_full(3)).status_code
    429
    """
    d = e.diagnostics[0]
    status = STATUS.get(d.code, 400)
    kind = {429: "rate_limit_error", 503: "service_unavailable"}.get(
        status, "invalid_request_error"
    )
    message = d.message + (f" (help: {d.help})" if d.help else "")
    body = {"error": {"message": message, "type": kind, "param": None, "code": d.code}}
    return JSONResponse(body, status_code=status)


def internal_error(e: Exception) -> JSONResponse:
    """A 500 with an OpenAI-shaped body for an error that is no user mistake (the model
    failed): the request fails, the server goes on, and no traceback reaches the client.

    >>> internal_error(KeyError("w")).status_code
    500
    """
    body = {
        "error": {
            "message": f"the model failed on this request: {type(e).__name__}: {e}",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    return JSONResponse(body, status_code=500)


def _field(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is not None and (
        not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    ):
        raise bad_request(
            f"`{name}` must be {what}, not {json.dumps(value)[:60]}",
            f"send `{name}` as {what}, or leave it out",
        )
    return value


class Server:
    """The routes over one engine (its tokenizer turns text into ids and back)."""

    def __init__(self, engine: Engine, name: str | None = None) -> None:
        self.engine = engine
        self.name = name or engine.name
        self.created = int(time.time())

    # -- reading a request ---------------------------------------------------------------

    async def _body(self, http: HTTPRequest) -> dict[str, Any]:
        try:
            body = json.loads(await http.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not JSON: {e}", "send a JSON object") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object", 'send {"model": ...}')
        model = body.get("model")
        if model is not None and model != self.name:
            raise bad_request(
                f"this server serves the model {self.name!r}, not {model!r}",
                f'send "model": "{self.name}" (GET /v1/models lists it)',
            )
        for name in ("n", "best_of"):
            if body.get(name) not in (None, 1):
                raise bad_request(
                    f"`{name}` must be 1 here", f"send one request a choice, drop `{name}`"
                )
        if body.get("logprobs") not in (None, False) or body.get("echo"):
            raise bad_request("logprobs and echo are not supported", "drop `logprobs` and `echo`")
        return body

    def _tokenizer(self) -> Any:
        if self.engine.tokenizer is None:
            raise bad_request(
                "this model has no tokenizer: text requests cannot be encoded",
                "serve a checkpoint with its tokenizer (a GGUF file or a directory with "
                "tokenizer.json), or send token ids to /v1/completions",
            )
        return self.engine.tokenizer

    def _params(self, body: dict[str, Any], prompt: int, default_tokens: int) -> SamplingParams:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            # As much as the cache allows, up to the default.
            max_tokens = max(1, min(default_tokens, self.engine.runner.max_len - prompt + 1))
        temperature = body.get("temperature")
        stops = list(self.engine.stop_tokens)
        ignore_eos = _field(body, "ignore_eos", (bool,), "true or false")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_k=None if body.get("top_k") in (None, -1, 0) else body.get("top_k"),
            top_p=body.get("top_p"),
            seed=body.get("seed"),
            stop_tokens=[] if ignore_eos else stops,
        )

    def _stops(self, body: dict[str, Any]) -> list[str]:
        stop = body.get("stop")
        if stop is None:
            return []
        if isinstance(stop, str):
            return [stop]
        if (
            isinstance(stop, list)
            and all(isinstance(s, str) and s for s in stop)
            and len(stop) <= 4
        ):
            return list(stop)
        raise bad_request(
            f"`stop` must be a string or a list of up to 4 non-empty strings, not {json.dumps(stop)[:60]}",
            'e.g. "stop": ["\\n\\n"]',
        )

    def _chat_prompt(self, body: dict[str, Any]) -> list[int]:
        from linnet.lang.text.chat import check_messages

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request(
                "`messages` must be a non-empty list of {role, content} objects",
                'e.g. "messages": [{"role": "user", "content": "Hi"}]',
            )
        tokenizer = self._tokenizer()
        return list(tokenizer.encode_chat(check_messages(messages)))

    def _completion_prompt(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return list(self._tokenizer().encode(prompt))
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            return list(prompt)
        raise bad_request(
            "`prompt` must be a non-empty string or a list of token ids (one prompt a request)",
            'e.g. "prompt": "Once upon a time"',
        )

    # -- the routes ----------------------------------------------------------------------

    async def health(self, http: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok", **self.engine.stats()})

    async def metrics(self, http: HTTPRequest) -> Response:
        return PlainTextResponse(self.engine.prometheus(), media_type="text/plain; version=0.0.4")

    async def models(self, http: HTTPRequest) -> Response:
        card = {"id": self.name, "object": "model", "created": self.created, "owned_by": "linnet"}
        return JSONResponse({"object": "list", "data": [card]})

    async def chat(self, http: HTTPRequest) -> Response:
        return await self._complete(http, chat=True)

    async def completions(self, http: HTTPRequest) -> Response:
        return await self._complete(http, chat=False)

    async def _complete(self, http: HTTPRequest, chat: bool) -> Response:
        try:
            body = await self._body(http)
            ids = self._chat_prompt(body) if chat else self._completion_prompt(body)
            params = self._params(body, len(ids), CHAT_TOKENS if chat else 16)
            stops = self._stops(body)
            stream = _field(body, "stream", (bool,), "true or false")
            options = _field(body, "stream_options", (dict,), "an object") or {}
            request = self.engine.submit(ids, params)
        except LinnetError as e:
            return error_response(e)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        reply = Reply(self, request, rid, chat, stops)
        if stream:
            usage = bool(options.get("include_usage"))
            return StreamingResponse(reply.events(usage), media_type="text/event-stream")
        return await reply.whole()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.engine.start()
        yield


class Reply:
    """One request's answer: its tokens as text (detokenised as they come, cut at stop
    strings), as one body or as server-sent events."""

    def __init__(self, server: Server, request: Request, rid: str, chat: bool, stops: list[str]):
        from linnet.lang.text.stream import StopStrings, TextStream

        self.server = server
        self.request = request
        self.rid = rid
        self.chat = chat
        tokenizer = server.engine.tokenizer
        self.text = TextStream(tokenizer) if tokenizer is not None else None
        self.cut = StopStrings(stops)
        self.finish: str | None = None

    def _pieces(self, ids: list[int]) -> str:
        if self.text is None:  # a model without a tokenizer: ids as text
            return "".join(f" {t}" for t in ids)
        out = ""
        for t in ids:
            piece, stopped = self.cut.feed(self.text.add(t))
            out += piece
            if stopped:
                self.finish = "stop"
                self.request.cancel()  # a stop string: no more tokens needed
                break
        return out

    def _tail(self) -> str:
        if self.finish == "stop" and self.cut.stopped:
            return ""
        rest = self.text.finish() if self.text is not None else ""
        piece, stopped = self.cut.feed(rest)
        return piece + ("" if stopped else self.cut.finish())

    def _reason(self) -> str:
        if self.finish is not None:
            return self.finish
        return "length" if self.request.finish_reason == "length" else "stop"

    def _usage(self) -> dict[str, int]:
        prompt, done = len(self.request.prompt), len(self.request.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def _chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            kind = "text_completion"
        return {
            "id": self.rid,
            "object": kind,
            "created": self.server.created,
            "model": self.server.name,
            "choices": [choice],
        }

    async def events(self, usage: bool) -> AsyncIterator[str]:
        """Server-sent events; a client gone mid-stream cancels the request (its pages
        are freed at once)."""
        try:
            if self.chat:
                yield _sse(self._chunk("", None, first=True))
            try:
                async for ids in self.request.stream():
                    if self.finish is not None:
                        break
                    text = self._pieces(ids)
                    if text:
                        yield _sse(self._chunk(text, None))
            except LinnetError as e:
                yield _sse(json.loads(bytes(error_response(e).body)))
                return
            except Exception as e:  # the model failed: say so in the stream, no traceback
                yield _sse(json.loads(bytes(internal_error(e).body)))
                return
            tail = self._tail()
            yield _sse(self._chunk(tail or None if self.chat else tail, self._reason()))
            if usage:
                last = self._chunk(None, None)
                last["choices"] = []
                last["usage"] = self._usage()
                yield _sse(last)
            yield "data: [DONE]\n\n"
        finally:
            self.request.cancel()  # nothing if it ended; a client gone mid-stream frees pages

    async def whole(self) -> Response:
        text = ""
        try:
            async for ids in self.request.stream():
                if self.finish is not None:
                    break
                text += self._pieces(ids)
        except LinnetError as e:
            return error_response(e)
        except Exception as e:  # the model failed: a 500, never a traceback
            return internal_error(e)
        finally:
            self.request.cancel()
        text += self._tail()
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": self._reason(),
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": self._reason(), "logprobs": None}
            kind = "text_completion"
        return JSONResponse(
            {
                "id": self.rid,
                "object": kind,
                "created": self.server.created,
                "model": self.server.name,
                "choices": [choice],
                "usage": self._usage(),
            }
        )


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def build_app(engine: Engine, name: str | None = None) -> Starlette:
    """The starlette app serving ``engine`` (it starts the engine's thread on startup)."""
    return Server(engine, name).app()


def serve(
    engine: Engine, host: str = "127.0.0.1", port: int = 8000, name: str | None = None
) -> None:
    """Serve ``engine`` under uvicorn until interrupted; the engine is closed after."""
    import uvicorn

    try:
        uvicorn.run(build_app(engine, name), host=host, port=port, log_level="warning")
    finally:
        engine.close()


class Background:
    """A server on a thread of this process (tests, the load generator's smoke run):
    ``url`` once started; :meth:`stop` ends it and closes the engine.

    >>> with Background(engine) as server:                        # doctest: +SKIP
    ...     print(server.url)
    http://127.0.0.1:40123/v1
    """

    def __init__(self, engine: Engine, name: str | None = None, host: str = "127.0.0.1") -> None:
        import socket
        import threading

        import uvicorn

        self.engine = engine
        sock = socket.socket()
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        sock.close()
        config = uvicorn.Config(
            build_app(engine, name), host=host, port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://{host}:{self.port}/v1"
        self.base = f"http://{host}:{self.port}"

    def start(self) -> Background:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.close()

    def __enter__(self) -> Background:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
