"""A request's options and its handle: the tokens as they come, streamed to any thread or
event loop, its end, and its cancellation.

>>> params = SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=1)
>>> params.check(vocabulary=100); params.greedy
False
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from linnet.lang.host.inputs import error
from linnet.lang.host.options import check_sampling, is_int, sampling_values, stop_token_error


@dataclass
class SamplingParams:
    """How a request's tokens are picked and when it stops: ``generate``'s options
    (``temperature`` 0 is greedy; ``top_k``, ``top_p``, ``seed``; ``stop_tokens``, kept as
    the last token) and ``max_tokens``, checked with ``generate``'s codes (E0811-E0815,
    E0819) by :meth:`check`."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_tokens: Sequence[int] = ()

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    def check(self, vocabulary: int | None = None) -> None:
        """E0811 for ``max_tokens``, E0812-E0815 for the sampling options, E0819 for a
        stop token outside ``[0, vocabulary)``; then every value as a Python number.

        >>> SamplingParams(max_tokens=0).check()
        Traceback (most recent call last):
        ...
        linnet.lang.diagnostics.core.LinnetError: error[E0811]: max_tokens must be a positive int, not 0
          = help: e.g. max_tokens=16
        """
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise error(
                "E0811",
                f"max_tokens must be a positive int, not {self.max_tokens!r}",
                help="e.g. max_tokens=16",
            )
        check_sampling(self.temperature, self.top_k, self.top_p, self.seed)
        self.temperature, self.top_k, self.top_p, self.seed, _ = sampling_values(
            self.temperature, self.top_k, self.top_p, self.seed, None
        )
        self.max_tokens = int(self.max_tokens)
        stops = self.stop_tokens
        if (
            not isinstance(stops, Sequence | set | frozenset)
            or isinstance(stops, str)
            or not all(is_int(t) for t in stops)
        ):
            raise error(
                "E0815",
                f"stop_tokens must be a list of token ids, not {stops!r}",
                help="e.g. stop_tokens=[2] (the tokenizer's EOS id)",
            )
        for t in stops:
            if t < 0 or (vocabulary is not None and t >= vocabulary):
                raise stop_token_error(int(t), vocabulary)
        self.stop_tokens = tuple(int(t) for t in stops)


@dataclass(eq=False)
class Request:
    """One request's handle (:meth:`linnet.serve.Engine.submit` gives it): ``tokens``
    grows as they are generated; :meth:`stream` yields each new piece in an event loop,
    :meth:`wait` blocks a thread; :meth:`cancel` ends it and frees its pages at once.
    ``finish_reason`` is ``stop`` (a stop token), ``length`` (``max_tokens``),
    ``cancelled`` or ``error`` (``error`` then holds the LinnetError)."""

    id: int
    prompt: list[int]
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: Exception | None = None
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0
    _done: threading.Event = field(default_factory=threading.Event)
    _listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = field(
        default_factory=list
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cancel: Callable[[Request], None] | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _emit(self, new: list[int], finish: str | None = None) -> None:
        """The engine's thread: tokens appended, and the end where ``finish`` is given."""
        with self._lock:
            self.tokens += new
            if finish is not None:
                self.finish_reason = finish
            listeners = list(self._listeners)
        for loop, queue in listeners:
            # A closed loop (RuntimeError): nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, (new, finish))
        if finish is not None:
            self._done.set()

    def wait(self, timeout: float | None = None) -> list[int]:
        """Block until the request ends; its tokens (raises its error, if it failed)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish in {timeout} s")
        if self.error is not None:
            raise self.error
        return self.tokens

    async def stream(self) -> AsyncIterator[list[int]]:
        """The request's tokens as they come, a list of new ids at a time (the tokens
        already generated first); ends when the request does (raising its error if it
        failed). Leaving the loop early does not cancel: call :meth:`cancel`.

        >>> async for ids in engine.submit([1, 2, 3]).stream():   # doctest: +SKIP
        ...     print(ids)
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            sent = list(self.tokens)
            finish = self.finish_reason
            if finish is None:
                self._listeners.append((loop, queue))
        try:
            if sent:
                yield sent
            while finish is None:
                new, finish = await queue.get()
                if new:
                    yield new
        finally:
            with self._lock:
                if (loop, queue) in self._listeners:
                    self._listeners.remove((loop, queue))
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """End the request now: its pages are freed at once, ``finish_reason`` is
        ``cancelled``; nothing happens to a request that has ended already."""
        if self._cancel is not None and not self.done:
            self._cancel(self)
