"""Continuous batching as pure logic: which sequences run each step, with which pages.

Each step runs at most one prefill call and one decode call on the model's paged entries
(``prefill_paged``, ``decode_paged``). :meth:`Scheduler.schedule` plans a step:

1. **Decode**: every running sequence whose tokens but the last have their KV computed
   feeds that last token at its position. One that needs a new page (its position starts
   a page) gets one; where none is left, the newest running sequence is **preempted**
   (vLLM's recompute: its pages are released and it waits again, first in line, with the
   tokens it generated as part of its prompt), until the page is found or the sequence
   needing it was the one preempted.
2. **Prefill**: running sequences whose tokens are not computed yet get a chunk each, in
   arrival order, within ``token_budget`` tokens a step (chunked prefill: a long prompt
   never stalls the decode batch for long); then waiting sequences are admitted, first come
   first served, while the batch has room (``max_batch``) and the pool has the pages for
   the whole prompt. A prompt's leading whole pages already in the prefix cache are taken
   from it (:meth:`linnet.serve.pages.PagePool.match`): its prefill starts after them.

:meth:`Scheduler.finish_step` records what ran: each sequence's computed positions grow,
and pages whose positions are all computed enter the prefix cache. What the tokens are
(sampling, stop tokens) is the engine's (:mod:`linnet.serve.engine`); nothing here imports
an array library.

>>> from linnet.serve.pages import PagePool
>>> s = Scheduler(PagePool(9, 4), max_batch=4, token_budget=64, max_len=32)
>>> seq = s.add(Sequence(0, [1, 2, 3, 4, 5], max_tokens=3))
>>> plan = s.schedule(); [(c.seq.id, c.start, c.n) for c in plan.prefill], plan.decode
([(0, 0, 5)], [])
>>> s.finish_step(plan); seq.tokens.append(9); [q.id for q in s.schedule().decode]
[0]
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from .errors import option_error, too_long
from .pages import PagePool, block_keys


@dataclass(eq=False)
class Sequence:
    """One request's tokens and pages. ``tokens`` is the prompt, then every token
    generated (the engine appends them); ``computed`` the positions whose KV is in
    ``pages``; ``prompt_len`` the original prompt's length (so a preempted sequence still
    knows what it generated)."""

    id: int
    tokens: list[int]
    max_tokens: int
    prompt_len: int = -1
    pages: list[int] = field(default_factory=list)
    computed: int = 0
    registered: int = 0  # leading pages entered in the prefix cache
    cached_tokens: int = 0  # prompt positions the prefix cache gave at the last admission
    arrival: int = -1
    preemptions: int = 0
    finished: bool = False

    def __post_init__(self) -> None:
        if self.prompt_len < 0:
            self.prompt_len = len(self.tokens)

    @property
    def generated(self) -> list[int]:
        """The tokens generated so far."""
        return self.tokens[self.prompt_len :]

    def decoding(self) -> bool:
        """Whether its next step is a decode (only its last token's KV is missing)."""
        return self.computed > 0 and self.computed == len(self.tokens) - 1


@dataclass
class Chunk:
    """A prefill call's row: ``seq``'s tokens ``start .. start + n``."""

    seq: Sequence
    start: int
    n: int

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens[self.start : self.start + self.n]

    def last(self) -> bool:
        """Whether the chunk ends the sequence's tokens (its logits give the next one)."""
        return self.start + self.n == len(self.seq.tokens)


@dataclass
class Plan:
    """One step: the decode batch and the prefill chunks (either may be empty), and the
    sequences preempted while planning it."""

    decode: list[Sequence] = field(default_factory=list)
    prefill: list[Chunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    """The waiting queue, the running batch and the pages each sequence holds (see the
    module's text). ``max_len`` is the model's cache length S: a sequence never passes it.

    >>> Scheduler(PagePool(4, 2), max_batch=0, token_budget=8, max_len=8)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0862]: max_batch must be a positive int, not 0
      = help: e.g. max_batch=32
    """

    def __init__(self, pool: PagePool, max_batch: int, token_budget: int, max_len: int) -> None:
        for name, value, example in (
            ("max_batch", max_batch, "max_batch=32"),
            ("token_budget", token_budget, "token_budget=512"),
            ("max_len", max_len, "max_len=1024"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise option_error(name, value, "a positive int", example)
        if token_budget < pool.page_size:
            raise option_error(
                "token_budget",
                token_budget,
                f"at least the page size ({pool.page_size})",
                f"token_budget={max(512, pool.page_size)}",
            )
        self.pool = pool
        self.max_batch = max_batch
        self.token_budget = token_budget
        self.max_len = max_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.arrivals = itertools.count()
        self.preemptions = 0
        self.cached_tokens = 0  # prompt positions the prefix cache gave, all admissions

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    def pages_for(self, positions: int) -> int:
        """Pages that hold ``positions`` positions."""
        return -(-positions // self.page_size)

    def check_fits(self, prompt: int, max_tokens: int) -> None:
        """E0863 for a request that could never run: past the cache's length, or needing
        more pages than the whole pool (waiting would not help: refuse, never hang)."""
        # The last token generated is never fed back: positions 0 .. prompt + max_tokens - 2.
        positions = prompt + max_tokens - 1
        if positions > self.max_len:
            raise too_long(
                prompt,
                max_tokens,
                f"it needs {positions} positions and the model's cache holds {self.max_len}",
                f"ask for at most {max(0, self.max_len - prompt + 1)} tokens after this "
                "prompt, shorten the prompt, or load the model with a longer cache "
                "(config={'S': ...})",
            )
        pages = self.pages_for(positions)
        if pages > self.pool.usable:
            raise too_long(
                prompt,
                max_tokens,
                f"it needs {pages} pages of {self.page_size} positions and the pool has "
                f"{self.pool.usable}",
                "ask for fewer tokens, or give the engine more pages (kv_pages=..., "
                "`linnet serve --kv-pages N`)",
            )

    def add(self, seq: Sequence) -> Sequence:
        """Queue ``seq`` (checked with :meth:`check_fits`) at the end of the waiting line."""
        self.check_fits(seq.prompt_len, seq.max_tokens)
        seq.arrival = next(self.arrivals)
        self.waiting.append(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Take ``seq`` out (finished, cancelled, failed) and release its pages at once."""
        seq.finished = True
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._drop_pages(seq)

    def _drop_pages(self, seq: Sequence) -> None:
        pages, seq.pages = seq.pages, []
        seq.computed = seq.registered = 0
        self.pool.release(pages)

    def preempt(self, seq: Sequence) -> None:
        """Recompute later: release ``seq``'s pages and put it back first in the waiting
        line (ahead of newer arrivals), its generated tokens now part of its prompt."""
        self.running.remove(seq)
        self._drop_pages(seq)
        seq.preemptions += 1
        self.preemptions += 1
        # Preempted sequences are older than anything waiting: first in line, oldest first.
        at = 0
        while at < len(self.waiting) and self.waiting[at].arrival < seq.arrival:
            at += 1
        self.waiting.insert(at, seq)

    def schedule(self) -> Plan:
        """Plan the next step (see the module's text)."""
        plan = Plan()
        # 1. Decode, oldest first: the newest are preempted for the oldest's pages.
        for seq in sorted(self.running, key=lambda s: s.arrival):
            if seq not in self.running or not seq.decoding():
                continue
            while len(seq.pages) * self.page_size < len(seq.tokens):
                got = self.pool.allocate(1)
                if got is not None:
                    seq.pages += got
                    continue
                victim = max(self.running, key=lambda s: s.arrival)
                self.preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            if seq in self.running:
                plan.decode.append(seq)
        plan.decode = [s for s in plan.decode if s in self.running]
        # 2. Prefill chunks of the running, then admissions, within the token budget.
        budget = self.token_budget
        for seq in sorted(self.running, key=lambda s: s.arrival):
            if budget <= 0:
                break
            if seq.decoding() or seq.computed >= len(seq.tokens):
                continue
            chunk = self._chunk(seq, budget)
            plan.prefill.append(chunk)
            budget -= chunk.n
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if not self._admit(seq):
                break  # first come first served: nothing overtakes the head of the line
            self.waiting.popleft()
            self.running.append(seq)
            chunk = self._chunk(seq, budget)
            plan.prefill.append(chunk)
            budget -= chunk.n
        return plan

    def _chunk(self, seq: Sequence, budget: int) -> Chunk:
        left = len(seq.tokens) - seq.computed
        n = min(left, budget)
        if n < left:
            # Chunks end on page boundaries where the budget allows: each call then fills
            # whole pages, which enter the prefix cache as soon as the chunk has run.
            aligned = (seq.computed + n) // self.page_size * self.page_size - seq.computed
            n = aligned if aligned > 0 else n
        return Chunk(seq, seq.computed, n)

    def _admit(self, seq: Sequence) -> bool:
        """Give ``seq`` its pages: the prefix cache's for its leading whole pages (at most
        all but its last token's: that token's logits are what prefill is for), new ones
        for the rest of its tokens; False, holding nothing, where the pool lacks them."""
        shareable = (len(seq.tokens) - 1) // self.page_size
        keys = block_keys(seq.tokens, self.page_size, shareable)
        shared = self.pool.match(keys)
        need = self.pages_for(len(seq.tokens)) - len(shared)
        fresh = self.pool.allocate(need)
        if fresh is None:
            self.pool.release(shared)
            self.pool.hits -= len(shared)
            return False
        seq.pages = shared + fresh
        seq.computed = len(shared) * self.page_size
        seq.registered = len(shared)
        seq.cached_tokens = seq.computed
        self.cached_tokens += seq.computed
        return True

    def finish_step(self, plan: Plan) -> None:
        """Record that ``plan`` ran: each row's positions are computed (the engine appends
        the token a last chunk or a decode picked), and pages now full enter the prefix
        cache."""
        for chunk in plan.prefill:
            if not chunk.seq.finished and chunk.seq in self.running:
                chunk.seq.computed = chunk.start + chunk.n
        for seq in plan.decode:
            if not seq.finished and seq in self.running:
                seq.computed = len(seq.tokens)
        for seq in {id(s): s for s in [*plan.decode, *(c.seq for c in plan.prefill)]}.values():
            if seq.finished or seq not in self.running:
                continue
            full = seq.computed // self.page_size
            if full > seq.registered:
                keys = block_keys(seq.tokens, self.page_size, full)
                for i in range(seq.registered, full):
                    self.pool.register(keys[i], seq.pages[i])
                seq.registered = full
