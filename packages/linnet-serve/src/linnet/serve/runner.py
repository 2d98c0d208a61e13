"""The engine's side of a model: a step's rows as the tensors of the paged entries, padded to
a few shapes.

A model loaded with a paged KV cache (``linnet.torch.load(..., kv_pages=NP,
kv_page_size=PS)``) has two entries the engine calls:

* ``decode_paged(token[B] i32, pos[B] i32, table[B, MP] i32) -> logits[B, V] f32``;
* ``prefill_paged(tokens[B, L] i32, start[B] i32, n[B] i32, table[B, MP] i32) ->
  logits[B, V] f32``: row b's ``n[b]`` tokens at positions ``start[b]..``, the first
  ``start[b]`` already in its pages; the last real token's logits.

``MP = ceil(S / PS)`` table columns. :class:`ModelRunner` pads each call to a **bucket**:
the batch to the next power of two (at most ``max_batch``), a prefill's length to
:func:`linnet.lang.host.generate.length_bucket`'s ladder, so that each bucket lowers and
captures once however requests come and go. Padding rows are the contract's empty slots
(token 0, position 0, a table row of zeros: every write lands in the sink page 0).

>>> batch_buckets(12)
[1, 2, 4, 8, 12]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

from linnet.lang.host.generate import length_bucket
from linnet.lang.host.inputs import error

from .errors import option_error

ENTRIES = ("decode_paged", "prefill_paged")


class Runner(Protocol):
    """What :class:`linnet.serve.Engine` needs of a model (see :class:`ModelRunner`). A
    runner that also has ``step(decode, prefill)`` (ModelRunner's) is given each engine
    step whole, so that it can run the decode rows and short prefill chunks as one call."""

    num_pages: int
    page_size: int
    max_len: int
    vocabulary: int | None

    def prefill(
        self, rows: Sequence[Sequence[int]], starts: Sequence[int], tables: Sequence[list[int]]
    ) -> Any: ...

    def decode(
        self, tokens: Sequence[int], positions: Sequence[int], tables: Sequence[list[int]]
    ) -> Any: ...


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes steps run at: powers of two below ``max_batch``, then itself.

    >>> batch_buckets(1), batch_buckets(8)
    ([1], [1, 2, 4, 8])
    """
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def checked_buckets(buckets: Any, max_batch: int) -> list[int]:
    """``batch_buckets=`` as the runner keeps it (sorted, each once; None: the powers of
    two, :func:`batch_buckets`), or E0862: positive ints, the largest ``max_batch`` (every
    batch the scheduler makes fits one).

    >>> checked_buckets([32, 8, 16], 32), checked_buckets(None, 8)
    ([8, 16, 32], [1, 2, 4, 8])
    """
    if buckets is None:
        return batch_buckets(max_batch)
    example = f"batch_buckets=[8, 16, {max_batch}]"
    if isinstance(buckets, str | bytes) or not hasattr(buckets, "__iter__"):
        raise option_error("batch_buckets", buckets, "a list of batch sizes", example)
    sizes = list(buckets)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise option_error("batch_buckets", buckets, "a list of positive ints", example)
    if max(sizes) != max_batch:
        raise option_error(
            "batch_buckets", buckets, f"a list whose largest is max_batch ({max_batch})", example
        )
    return sorted(set(sizes))


def bucket(size: int, buckets: Sequence[int]) -> int:
    """The first of ``buckets`` that holds ``size`` rows.

    >>> bucket(3, [1, 2, 4, 8])
    4
    """
    return next(b for b in buckets if b >= size)


def prefill_groups(
    lengths: Sequence[int], buckets: Sequence[int], max_len: int | None, call_tokens: int
) -> list[list[int]]:
    """The prefill rows of one step (their chunks' ``lengths``) as calls: each call pads its
    rows to a batch bucket and its longest row's length bucket, so one long chunk among
    short ones would make every row as long. Rows are taken longest first and cut into the
    runs that cost least, a call costing its padded tokens plus ``call_tokens`` (what reading
    every weight once costs, in tokens). Row indices, each call's in order.

    >>> prefill_groups([380, 20, 30, 25], [1, 2, 4], 1024, 256)  # one long row alone
    [[0], [2, 3, 1]]
    >>> prefill_groups([300, 280, 290, 270], [1, 2, 4], 1024, 256)  # alike: one call
    [[0, 2, 1, 3]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: the cheapest calls for order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # the last call takes order[i:j]; its longest row is order[i]
            rows = bucket(j - i, buckets) if j - i <= buckets[-1] else float("inf")
            cost = best[i] + rows * length_bucket(lengths[order[i]], max_len) + call_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def paged_entries_error(model: Any) -> Any:
    """E0869: ``model`` has no paged entries (loaded without ``kv_pages``, or a model whose
    attention is not paged)."""
    entries = list(getattr(model, "entries", []))
    missing = [e for e in ENTRIES if e not in entries]
    return error(
        "E0869",
        f"serving needs the model's paged entries, and it has no "
        f"{' and no '.join(f'`{m}`' for m in missing)} (entries: {', '.join(entries) or 'none'})",
        help="load the model with a paged KV cache: linnet.torch.load(model, weights=..., "
        "kv_pages=N, kv_page_size=P), or Engine.load(...), which does",
    )


class ModelRunner:
    """A loaded model's paged entries behind :class:`Runner`: rows in, padded int32 tensors
    to the model, its logits [rows, V] back (on the model's device).

    >>> runner = ModelRunner(model, num_pages=64, page_size=16, max_batch=8)  # doctest: +SKIP
    >>> runner.decode([5], [3], [[1]]).shape                                 # doctest: +SKIP
    torch.Size([1, 49152])
    """

    def __init__(
        self,
        model: Any,
        num_pages: int,
        page_size: int,
        max_batch: int,
        planned: bool | None = None,
        progress: Any = False,
        compile_prefill: bool = False,
        capture_prefill_tokens: int = 512,
        prefill_call_tokens: int = 256,
        prefill_by_decode: bool = True,
        batch_buckets: Sequence[int] | None = None,
    ) -> None:
        if any(e not in getattr(model, "entries", ()) for e in ENTRIES):
            raise paged_entries_error(model)
        for name, value in (("kv_pages", num_pages), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise option_error(name, value, "a positive int", f"{name}=16")
        for name, value, default in (
            ("capture_prefill_tokens", capture_prefill_tokens, 512),
            ("prefill_call_tokens", prefill_call_tokens, 256),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise option_error(name, value, "an int >= 0", f"{name}={default}")
        if num_pages < 2:
            raise option_error("kv_pages", num_pages, "at least 2 (page 0 is the sink)", "64")
        self.model = model
        self.num_pages = num_pages
        self.page_size = page_size
        config = getattr(model, "config", {}) or {}
        self.max_len = int(config.get("S", 0)) or num_pages * page_size
        self.columns = -(-self.max_len // page_size)
        vocabulary = config.get("V")
        self.vocabulary = int(vocabulary) if isinstance(vocabulary, int) else None
        # The batch sizes steps are padded to, each planned and captured once (Engine.warm
        # plans them all before the first request): fewer buckets warm faster and pad more.
        self.buckets = checked_buckets(batch_buckets, max_batch)
        # Prefill calls pad their rows to powers of two whatever the decode buckets: a
        # prefill's cost is its padded tokens' (2 prompts padded to 8 rows would cost 4x).
        self.prefill_buckets = checked_buckets(None, max_batch)
        self.device = getattr(model, "device", "cpu")
        self.shapes: set[tuple[str, int, int]] = set()  # (entry, B, L): what ran, for tests
        # Decode by a plan per batch bucket (every backend and Linnet's kernels, timed once;
        # on CUDA replayed as one graph), in the context the model's own calls use, so the
        # buckets and prefill_paged share one page pool. Default: on CUDA.
        device_type = getattr(self.device, "type", str(self.device))
        self.planned = device_type == "cuda" if planned is None else planned
        self.progress = progress
        self.steps: dict[int, Any] = {}
        # Planned prefill by (batch bucket, length bucket): its step, or None where it could
        # not be planned or captured (that bucket then runs call by call).
        self.prefills: dict[tuple[int, int], Any] = {}
        # Prefill buckets come in many (batch, length) pairs; compiling the whole model for
        # each (the model's `compile=`) makes each new pair's first request wait, while a
        # prefill's time is its products': the generated source, captured, unless asked.
        self.compile_prefill = compile_prefill
        # A captured graph keeps its own memory pool (a prefill's activations and scores) for
        # as long as it lives, one per bucket pair: only chunks of up to this many tokens
        # (rows x length bucket), whose launches would cost more than their work, replay as
        # graphs; larger ones run op by op, the device's work hiding the launches.
        self.capture_prefill_tokens = capture_prefill_tokens
        # A prefill call's cost beyond its padded tokens (reading every weight once), in
        # tokens: rows are split into calls of like lengths where that saves more padding.
        self.prefill_call_tokens = prefill_call_tokens
        # A step's prefill of few tokens in all (a prefix-cache hit's tail, a short prompt)
        # runs as one decode step, a row a token: the decode buckets are planned and
        # captured already, where each new (batch, length) prefill bucket plans, compiles
        # and captures its own step on first use and pads every chunk to its length bucket.
        self.prefill_by_decode = prefill_by_decode

    def _table(self, tables: Sequence[list[int]], rows: int) -> Any:
        """The page table, on the host."""
        import torch

        out = torch.zeros((rows, self.columns), dtype=torch.int32)
        for b, pages in enumerate(tables):
            out[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        return out

    def decode(
        self, tokens: Sequence[int], positions: Sequence[int], tables: Sequence[list[int]]
    ) -> Any:
        """``decode_paged`` on these rows (padded to a bucket); logits [len(tokens), V]."""
        import torch

        rows = bucket(len(tokens), self.buckets)
        pad = rows - len(tokens)
        token = torch.tensor([*tokens, *[0] * pad], dtype=torch.int32)
        pos = torch.tensor([*positions, *[0] * pad], dtype=torch.int32)
        self.shapes.add(("decode", rows, 1))
        table = self._table(tables, rows)
        if self.planned:
            # Given on the host: the captured step copies them in without waiting for the
            # device, and backends that plan on the host (FlashInfer's page table) read them
            # there (context.host_inputs).
            logits = self._step(rows)([token, pos, table])[0]
        else:
            dev = self.device
            logits = self.model.decode_paged(token.to(dev), pos.to(dev), table.to(dev))
        return logits[: len(tokens)]

    def warm(self, progress: Any = None) -> list[int]:
        """Plan (and on CUDA capture) the decode step of every batch bucket now, each run
        once on empty rows (token 0 at position 0 through a table of zeros: every write
        lands in the sink page, no sequence's page is touched), so that no request waits
        for a plan later. ``progress`` (a callable taking a line) hears of each bucket.
        The buckets planned, smallest first; none where decode is not planned (the CPU's
        default). Plans reuse the timings cached under ``$LINNET_HOME``.

        >>> runner.warm(print)                                    # doctest: +SKIP
        decode step for 1 row: planned in 41.2 s (1/6)
        [1, 2, 4, 8, 16, 32]
        """
        import time

        if not self.planned:
            return []
        for i, rows in enumerate(self.buckets):
            t0 = time.perf_counter()
            self.decode([0] * rows, [0] * rows, [[]] * rows)
            if progress is not None:
                progress(
                    f"decode step for {rows} row{'s' if rows > 1 else ''}: planned in "
                    f"{time.perf_counter() - t0:.1f} s ({i + 1}/{len(self.buckets)})"
                )
        return list(self.buckets)

    def _step(self, rows: int) -> Any:
        """The batch bucket ``rows``'s planned decode step, made on first use: a
        :class:`~linnet.torch.plans.Captured` graph on CUDA, else the plan's ``run``."""
        if rows not in self.steps:
            import torch

            one = torch.ones(rows, dtype=torch.int32)
            pos, table = self.planning_rows(rows)
            cuda = getattr(self.device, "type", str(self.device)) == "cuda"
            plan = self.model.plan_for(
                "decode_paged",
                [one, pos, table],
                compile=getattr(self.model, "compile", None) or None,
                captured=cuda,
                measure=cuda,
                progress=self.progress,
            )
            self.steps[rows] = self._runnable(plan)
        return self.steps[rows]

    def planning_rows(self, rows: int) -> tuple[Any, Any]:
        """The positions and page table a batch bucket's decode step is planned (timed) at:
        every row half way through the longest sequence (``max_len // 2``, fewer where the
        pool holds less), through pages of its own (numbered from 1, shared round the pool
        only where it is smaller than ``rows`` such sequences). Attention's cost follows the
        positions it reads: timed at position 1 through the sink page, the backends that
        skip masked pages looked alike whatever their speed at real lengths. Planning runs
        in a context of its own (its own zeroed pool), so no sequence's page is written.

        >>> runner = ModelRunner(model, 65, 16, max_batch=4)            # doctest: +SKIP
        >>> pos, table = runner.planning_rows(2)                        # doctest: +SKIP
        >>> pos.tolist(), table[:, :3].tolist()                         # doctest: +SKIP
        ([511, 511], [[1, 2, 3], [33, 34, 35]])
        """
        import torch

        usable = self.num_pages - 1  # page 0 is the sink
        at = max(0, min(self.max_len // 2, max(1, usable // rows) * self.page_size) - 1)
        pages = at // self.page_size + 1
        table = torch.zeros((rows, self.columns), dtype=torch.int32)
        numbers = torch.arange(rows * pages, dtype=torch.int32) % usable + 1
        table[:, :pages] = numbers.reshape(rows, pages)
        return torch.full((rows,), at, dtype=torch.int32), table

    def captures_prefill(self, size: int, length: int) -> bool:
        """Whether a prefill bucket of ``size`` rows of ``length`` tokens replays as one CUDA
        graph (on CUDA): at most ``capture_prefill_tokens`` tokens.

        >>> runner = ModelRunner(model, 64, 16, max_batch=8)                  # doctest: +SKIP
        >>> runner.captures_prefill(2, 256), runner.captures_prefill(2, 1024)  # doctest: +SKIP
        (True, False)
        """
        return size * length <= self.capture_prefill_tokens

    def _runnable(self, plan: Any, captured: bool = True) -> Any:
        """``plan`` in the model's shared context (one page pool for every plan and the
        model's own calls): a :class:`~linnet.torch.plans.Captured` graph on CUDA (unless
        ``captured`` is False), else the plan's ``run``."""
        ctx = self.model.context_for(plan, shared=True)
        if captured and getattr(self.device, "type", str(self.device)) == "cuda":
            from linnet.torch.plans import Captured

            return Captured(plan, ctx)
        return lambda inputs: plan.run(inputs, ctx)

    def _prefill_step(self, size: int, length: int, inputs: list[Any]) -> Any:
        """The (batch, length) bucket's planned ``prefill_paged``, made on first use: over
        the generated source alone (no backend timed: prompts come in many shapes), compiled
        as the model is only with ``compile_prefill=True`` (a whole-model compile for each
        bucket pair otherwise stalls the first request of each new shape), replayed as one
        graph on CUDA so a chunk costs one launch of the host's, not one per op. None where
        it cannot be planned (call by call instead)."""
        from linnet.lang import LinnetError

        key = (size, length)
        if key not in self.prefills:
            captured = self.captures_prefill(size, length)
            try:
                plan = self.model.plan_for(
                    "prefill_paged",
                    inputs,
                    backends=[],
                    compile=(getattr(self.model, "compile", None) or None)
                    if self.compile_prefill
                    else None,
                    measure=False,
                    progress=False,
                    captured=captured,
                )
                self.prefills[key] = self._runnable(plan, captured)
            except LinnetError:
                self.prefills[key] = None
        return self.prefills[key]

    def prefill(
        self, rows: Sequence[Sequence[int]], starts: Sequence[int], tables: Sequence[list[int]]
    ) -> Any:
        """``prefill_paged`` on these rows (each a chunk of tokens from ``starts[b]``), in
        calls of rows of like lengths (:func:`prefill_groups`), each padded to a batch and a
        length bucket; logits [len(rows), V] of each chunk's last token, in the rows'
        order."""
        import torch

        if self.prefill_by_decode and all(rows) and sum(map(len, rows)) <= self.buckets[-1]:
            return self.prefill_as_decode(rows, starts, tables)
        groups = prefill_groups(
            [len(r) for r in rows], self.prefill_buckets, self.max_len, self.prefill_call_tokens
        )
        if len(groups) == 1:
            return self._prefill_call(rows, starts, tables)
        parts = [
            self._prefill_call([rows[i] for i in g], [starts[i] for i in g], [tables[i] for i in g])
            for g in groups
        ]
        logits = torch.cat(parts)
        order = torch.tensor([i for g in groups for i in g])
        return logits[torch.argsort(order).to(logits.device)]

    def step(
        self,
        decode: tuple[Sequence[int], Sequence[int], Sequence[list[int]]],
        prefill: tuple[Sequence[Sequence[int]], Sequence[int], Sequence[list[int]]],
    ) -> Any:
        """One engine step: ``decode``'s rows (tokens, positions, tables) and ``prefill``'s
        chunks (rows, starts, tables); logits of the decode rows, then of each chunk's last
        token. Where they fit the largest batch bucket together (``prefill_by_decode``), as
        one ``decode_paged`` call, a chunk's tokens rows of their own; else a decode call
        and the prefill's.

        >>> runner.step(([5], [3], [[1]]), ([[7, 8]], [0], [[2]])).shape  # doctest: +SKIP
        torch.Size([2, 49152])
        """
        import torch

        tokens, positions, tables = decode
        rows, starts, chunk_tables = prefill
        if (
            self.prefill_by_decode
            and rows
            and all(rows)
            and len(tokens) + sum(map(len, rows)) <= self.buckets[-1]
        ):
            return self.prefill_as_decode(
                [*([t] for t in tokens), *rows],
                [*positions, *starts],
                [*tables, *chunk_tables],
            )
        parts = []
        if tokens:
            parts.append(self.decode(tokens, positions, tables))
        if rows:
            parts.append(self.prefill(rows, starts, chunk_tables))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def prefill_as_decode(
        self, rows: Sequence[Sequence[int]], starts: Sequence[int], tables: Sequence[list[int]]
    ) -> Any:
        """Prefill these chunks by one ``decode_paged`` call, a row a token (token t of chunk
        b at position ``starts[b] + t``, through b's table): each layer writes every row's
        K and V before any row's attention reads, so a token sees the chunk's earlier
        tokens as ``prefill_paged`` lets it. Logits [len(rows), V] of each chunk's last
        token. At most the largest batch bucket of tokens in all.

        >>> runner.prefill_as_decode([[5, 9], [7]], [0, 3], [[1], [2]]).shape  # doctest: +SKIP
        torch.Size([2, 49152])
        """
        import torch

        tokens = [t for row in rows for t in row]
        positions = [s + i for row, s in zip(rows, starts, strict=True) for i in range(len(row))]
        per_token = [t for row, t in zip(rows, tables, strict=True) for _ in row]
        logits = self.decode(tokens, positions, per_token)
        last = torch.tensor(list(itertools.accumulate(len(r) for r in rows))) - 1
        return logits[last.to(logits.device)]

    def _prefill_call(
        self, rows: Sequence[Sequence[int]], starts: Sequence[int], tables: Sequence[list[int]]
    ) -> Any:
        """One ``prefill_paged`` call on these rows, padded to a batch and a length bucket."""
        import torch

        size = bucket(len(rows), self.prefill_buckets)
        length = length_bucket(max(len(r) for r in rows), self.max_len)
        tokens = torch.zeros((size, length), dtype=torch.int32)
        n = torch.ones(size, dtype=torch.int32)  # an empty row: token 0 at position 0, sink
        start = torch.zeros(size, dtype=torch.int32)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = torch.tensor(list(row), dtype=torch.int32)
            n[b] = len(row)
            start[b] = starts[b]
        self.shapes.add(("prefill", size, length))
        table = self._table(tables, size)
        step = self._prefill_step(size, length, [tokens, start, n, table]) if self.planned else None
        if step is not None:
            from linnet.lang import LinnetError

            try:
                # Host tensors: copied in without waiting for the device.
                return step([tokens, start, n, table])[0][: len(rows)]
            except LinnetError as exc:
                if exc.diagnostics[0].code != "E0753":  # not a capture failure: the user's
                    raise
                self.prefills[(size, length)] = None
        dev = self.device
        logits = self.model.prefill_paged(tokens.to(dev), start.to(dev), n.to(dev), table.to(dev))
        return logits[: len(rows)]
