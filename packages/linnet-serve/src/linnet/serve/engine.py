"""``linnet.serve.Engine``: many requests on one model with a paged KV cache.

Requests are submitted from any thread (:meth:`Engine.submit`) and run by one engine thread
(:meth:`Engine.start`), or step by step (:meth:`Engine.step`, for tests and scripts). Each
step the scheduler (:mod:`linnet.serve.scheduler`) plans a decode batch and prefill chunks,
the model's paged entries run them (:mod:`linnet.serve.runner`), and each row whose tokens
are all computed gets its next token, picked on the logits' device by
:func:`linnet.torch.generate.pick` (greedy, or sampled with the request's temperature,
top_k, top_p and its own seeded generator). A request ends at one of its stop tokens (kept),
at ``max_tokens``, or when cancelled; its pages are released at once.

Requests join and leave the running batch between steps (continuous batching); what runs
is padded to a few batch and length buckets, each lowered and captured once. When pages
run out the newest running request is preempted and recomputed later; a request that
could never fit is refused at submit (E0863), as is one past a full queue (E0864).

>>> engine = Engine.load("model.gguf", kv_pages=256, page_size=16)   # doctest: +SKIP
>>> engine.start()                                                    # doctest: +SKIP
>>> engine.submit([1, 2, 3], max_tokens=8).wait()                     # doctest: +SKIP
[1268, 314, 260, 3575, 282, 4649, 30, 2]
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import LinnetError
from linnet.lang.host.generate import prompt_lists, sampling_seed
from linnet.lang.host.inputs import error

from .errors import closed, option_error, queue_full
from .metrics import Metrics, prometheus
from .pages import PagePool
from .request import Request, SamplingParams
from .runner import ModelRunner, Runner
from .scheduler import Plan, Scheduler
from .scheduler import Sequence as Seq


class Engine:
    """The serving engine over ``runner`` (a :class:`linnet.serve.runner.Runner`: a loaded
    model's paged entries, or the reference toy of :mod:`linnet.serve.testing`).
    ``max_batch`` caps the running requests, ``token_budget`` the prefill tokens a step,
    ``max_queue`` the waiting requests; ``stop_tokens`` are every request's default stops
    (the model's EOS ids). ``name`` is what the server calls the model.

    >>> from linnet.serve.testing import ToyPagedModel
    >>> toy = ToyPagedModel(vocabulary=64, num_pages=9, page_size=4, max_len=32)
    >>> engine = Engine(ModelRunner(toy, 9, 4, max_batch=4))
    >>> engine.generate([[1, 2, 3], [4, 5]], max_tokens=3) == [
    ...     toy.reference([1, 2, 3], 3), toy.reference([4, 5], 3)]
    True
    """

    def __init__(
        self,
        runner: Runner,
        *,
        max_batch: int = 32,
        token_budget: int = 512,
        max_queue: int = 256,
        stop_tokens: Sequence[int] = (),
        name: str = "model",
        tokenizer: Any = None,
    ) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise option_error("max_queue", max_queue, "a positive int", "max_queue=256")
        self.runner = runner
        self.pool = PagePool(runner.num_pages, runner.page_size)
        self.scheduler = Scheduler(self.pool, max_batch, token_budget, runner.max_len)
        self.max_queue = max_queue
        self.stop_tokens = tuple(int(t) for t in stop_tokens)
        self.name = name
        self.tokenizer = tokenizer
        self.metrics = Metrics()
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._ids = itertools.count()
        self._live: dict[int, tuple[Seq, Request, Any]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        weights: Any = None,
        *,
        kv_pages: int = 512,
        page_size: int = 16,
        max_batch: int = 32,
        token_budget: int = 512,
        max_queue: int = 256,
        device: str = "cpu",
        batch_buckets: Sequence[int] | None = None,
        config: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        **options: Any,
    ) -> Engine:
        """Load ``model`` (a `.linnet` file, a shipped model's name, a GGUF file or a
        checkpoint directory, as ``linnet.torch.load`` takes) with a paged KV cache of
        ``kv_pages`` pages of ``page_size`` positions, and make its engine; the model's
        tokenizer and stop tokens come with it. ``batch_buckets``: the batch sizes decode
        steps are padded to, each planned and captured once (default: the powers of two up
        to ``max_batch``, then it); fewer buckets warm up sooner and pad more rows.

        >>> Engine.load("std.models.llama", kv_pages=64, page_size=16)     # doctest: +SKIP
        """
        import inspect

        from linnet.torch import load

        if "kv_pages" not in inspect.signature(load).parameters:
            raise error(
                "E0869",
                "this linnet-runtime-torch has no paged KV cache: `linnet.torch.load` takes "
                "no kv_pages",
                help="install a linnet-runtime-torch with the paged KV cache (issue 44)",
            )
        if (
            weights is None
            and model is not None
            and (str(model).endswith(".gguf") or Path(model).is_dir())
        ):
            # A GGUF file or a checkpoint directory is the weights: they name the model.
            model, weights = None, model
        loaded = load(
            model,
            weights=weights,
            device=device,
            config=config,
            tokenizer=tokenizer,
            kv_pages=kv_pages,
            kv_page_size=page_size,
            **options,
        )
        runner = ModelRunner(loaded, kv_pages, page_size, max_batch, batch_buckets=batch_buckets)
        stops = list(getattr(loaded, "stop_tokens", ()))
        tok = getattr(loaded, "tokenizer", None)
        if tok is not None:
            stops += [t for t in tok.eos_token_ids if t not in stops]
        return cls(
            runner,
            max_batch=max_batch,
            token_budget=token_budget,
            max_queue=max_queue,
            stop_tokens=stops,
            name=name or Path(str(model or weights)).name,
            tokenizer=tok,
        )

    # -- requests ------------------------------------------------------------------------

    def submit(
        self, prompt: Sequence[int], params: SamplingParams | None = None, **options: Any
    ) -> Request:
        """Queue a prompt (token ids) with ``params`` (or its fields as keywords:
        ``max_tokens=8, temperature=0.7``); its :class:`Request` handle. Checked before it
        is queued: the options (E0811-E0815, E0819), the prompt (E0810), whether it can
        ever fit (E0863), the queue (E0864), the engine (E0877). Stop tokens default to
        the engine's.

        >>> engine.submit([1, 2, 3], max_tokens=8, temperature=0.7, seed=1)  # doctest: +SKIP
        """
        if params is None:
            params = SamplingParams(**{"stop_tokens": self.stop_tokens, **options})
        elif options:
            raise error(
                "E0876",
                "give the sampling options as SamplingParams or as keywords, not both",
                help="e.g. engine.submit(ids, max_tokens=8)",
            )
        params.check(self.runner.vocabulary)
        (ids,) = prompt_lists([list(prompt)] if isinstance(prompt, Sequence) else prompt)
        if self.runner.vocabulary is not None:
            bad = [t for t in ids if not 0 <= t < self.runner.vocabulary]
            if bad:
                raise error(
                    "E0810",
                    f"prompt token {bad[0]} is not a token id of this model: its ids are "
                    f"[0, {self.runner.vocabulary})",
                    help="encode the prompt with the model's own tokenizer",
                )
        generator = None
        if not params.greedy:
            import torch

            generator = torch.Generator()
            generator.manual_seed(sampling_seed(params.seed))
        with self._wake:
            if self._closed:
                raise closed()
            self.scheduler.check_fits(len(ids), params.max_tokens)
            if len(self.scheduler.waiting) >= self.max_queue:
                raise queue_full(self.max_queue)
            rid = next(self._ids)
            request = Request(rid, ids, params, _cancel=self._cancel)
            seq = self.scheduler.add(Seq(rid, list(ids), params.max_tokens))
            self._live[rid] = (seq, request, generator)
            self.metrics.prompt_tokens += len(ids)
            self._wake.notify_all()
        return request

    def _cancel(self, request: Request) -> None:
        with self._wake:
            if request.id in self._live:
                self._finish(request.id, "cancelled")

    def _finish(self, rid: int, reason: str, problem: Exception | None = None) -> None:
        """End request ``rid`` (under the lock): its pages released, its stream closed."""
        seq, request, _ = self._live.pop(rid)
        self.scheduler.abort(seq)
        request.error = problem
        request.preemptions = seq.preemptions
        self.metrics.requests[reason] = self.metrics.requests.get(reason, 0) + 1
        request._emit([], reason)

    # -- steps ---------------------------------------------------------------------------

    def step(self) -> bool:
        """Run one step; False where there was nothing to run."""
        with self._wake:
            plan = self.scheduler.schedule()
            self.metrics.preemptions += len(plan.preempted)
            if plan.empty():
                return False
            self.metrics.cached_prompt_tokens = self.scheduler.cached_tokens
            decode = (
                [s.tokens[-1] for s in plan.decode],
                [len(s.tokens) - 1 for s in plan.decode],
                [list(s.pages) for s in plan.decode],
            )
            prefill = (
                [c.tokens for c in plan.prefill],
                [c.start for c in plan.prefill],
                [list(c.seq.pages) for c in plan.prefill],
            )
            running = len(self.scheduler.running)
            self.metrics.peak_running = max(self.metrics.peak_running, running)
        # The model runs outside the lock: submits and cancels go on meanwhile. A page a
        # cancel frees now is written by this step at most, and handed out no sooner than
        # the next schedule, after it.
        try:
            logits = []
            step = getattr(self.runner, "step", None)
            if step is not None:  # ModelRunner's: decode rows and short chunks in one call
                logits.append(step(decode, prefill))
            else:
                if plan.decode:
                    logits.append(self.runner.decode(*decode))
                if plan.prefill:
                    logits.append(self.runner.prefill(*prefill))
        except LinnetError as e:
            with self._wake:
                self._fail(plan, e)
            return True
        with self._wake:
            self.metrics.steps += 1
            self.scheduler.finish_step(plan)
            rows = [*plan.decode, *(c.seq if c.last() else None for c in plan.prefill)]
            self._take(rows, logits)
        return True

    def _fail(self, plan: Plan, problem: Exception) -> None:
        for seq in {id(s): s for s in [*plan.decode, *(c.seq for c in plan.prefill)]}.values():
            if seq.id in self._live:
                self._finish(seq.id, "error", problem)

    def _take(self, rows: list[Seq | None], logits: list[Any]) -> None:
        """Pick each finished row's next token, append it, end the requests that stop."""
        import torch
        from linnet.torch.generate import pick

        if not logits:
            return
        stacked = torch.cat(logits) if len(logits) > 1 else logits[0]
        live = [(i, seq) for i, seq in enumerate(rows) if seq is not None and seq.id in self._live]
        picked: dict[int, int] = {}
        greedy = [i for i, seq in live if self._live[seq.id][1].params.greedy]
        if greedy:
            index = torch.tensor(greedy, device=stacked.device)
            picked.update(zip(greedy, pick(stacked.index_select(0, index)).tolist()))
        for i, seq in live:
            if i in picked:
                continue
            params, generator = self._live[seq.id][1].params, self._live[seq.id][2]
            row = stacked[i : i + 1]
            one = pick(row, params.temperature, params.top_k, params.top_p, generator)
            picked[i] = int(one.item())
        now = time.perf_counter()
        for i, seq in live:
            token = picked[i]
            request = self._live[seq.id][1]
            if token < 0:
                problem = error(
                    "E0818",
                    f"the logits of request {seq.id} at position {len(seq.tokens) - 1} are "
                    "not all finite: no token can be picked from NaN or infinity",
                    help="check the checkpoint and the config (a NaN weight, say)",
                )
                self._finish(seq.id, "error", problem)
                continue
            seq.tokens.append(token)
            if request.first_token_at is None:
                request.first_token_at = now
                request.cached_tokens = seq.cached_tokens
                self.metrics.ttft.observe(now - request.submitted)
            elif request.last_token_at is not None:
                self.metrics.itl.observe(now - request.last_token_at)
            request.last_token_at = now
            self.metrics.tokens_generated += 1
            if token in request.params.stop_tokens:
                reason: str | None = "stop"
            elif len(seq.generated) >= seq.max_tokens:
                reason = "length"
            else:
                reason = None
            request._emit([token])
            if reason is not None:
                self._finish(seq.id, reason)

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Step until nothing is left to run (this thread; not with :meth:`start`); the
        steps run."""
        steps = 0
        while (max_steps is None or steps < max_steps) and self.step():
            steps += 1
        return steps

    def generate(self, prompts: Any, **options: Any) -> list[list[int]]:
        """Each prompt's generated tokens (all submitted at once, so they share steps);
        ``options`` as :meth:`submit`'s. Runs the steps here unless the engine thread runs.

        >>> engine.generate([[1, 2, 3], [4]], max_tokens=4)              # doctest: +SKIP
        [[17, 9, 9, 30], [5, 5, 211, 2]]
        """
        requests = [self.submit(p, **options) for p in prompt_lists(prompts)]
        if self._thread is None:
            self.run_until_idle()
        return [r.wait() for r in requests]

    # -- the engine thread ---------------------------------------------------------------

    def warm(self, progress: Any = None) -> Engine:
        """Plan every decode step the engine can run (one a batch bucket; on CUDA each
        captured as a graph) before requests come, as a server does at start; ``progress``
        (a callable taking a line) hears of each. Without it the first step of each batch
        size plans while its requests wait. Nothing to do where steps are not planned (the
        CPU by default). Returns the engine.

        >>> engine = Engine.load("model.gguf", device="cuda").warm(print)  # doctest: +SKIP
        """
        warm = getattr(self.runner, "warm", None)
        if warm is not None:
            with self._lock:
                warm(progress)
        return self

    def start(self) -> Engine:
        """Run steps on a thread of its own until :meth:`close`."""
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="linnet-serve", daemon=True)
                self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not (self.scheduler.waiting or self.scheduler.running):
                    self._wake.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as e:
                with self._wake:
                    for rid in list(self._live):
                        self._finish(rid, "error", e)

    def close(self) -> None:
        """Stop the engine thread; requests not finished end as ``cancelled``."""
        with self._wake:
            self._closed = True
            for rid in list(self._live):
                self._finish(rid, "cancelled")
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    # -- what it holds -------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Running and waiting requests and pages (used, free, cached, total)."""
        with self._lock:
            return {
                "running": len(self.scheduler.running),
                "waiting": len(self.scheduler.waiting),
                "pages_used": self.pool.used(),
                "pages_free": self.pool.available(),
                "pages_cached": self.pool.cached(),
                "pages_total": self.pool.usable,
                "page_size": self.pool.page_size,
                "peak_running": self.metrics.peak_running,
                "preemptions": self.metrics.preemptions,
            }

    def prometheus(self) -> str:
        """The metrics as Prometheus text (:mod:`linnet.serve.metrics`)."""
        with self._lock:
            return prometheus(
                self.metrics,
                len(self.scheduler.running),
                len(self.scheduler.waiting),
                self.pool.used(),
                self.pool.available(),
                self.pool.cached(),
            )
