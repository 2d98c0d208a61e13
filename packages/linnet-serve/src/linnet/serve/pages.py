"""The page pool: which KV pages are free, who holds each, and which hold a known prefix.

A model loaded with ``kv_pages=NP, kv_page_size=PS`` keeps NP pages of PS positions per
layer. Page 0 is the sink: never given to a sequence (empty batch rows and unused table
entries point at it). :class:`PagePool` hands out pages 1..NP-1:

* a free list and a refcount per page: :meth:`PagePool.allocate` takes pages (all or
  none), :meth:`PagePool.release` drops one reference of each; a page released more often
  than it was held is E0865, never a page given to two sequences;
* a prefix cache: a page whose PS positions are all computed is registered under the hash
  of every token up to its end (:func:`block_keys`: a chain of whole-page blocks), so a
  later prompt that starts with the same tokens takes the same pages
  (:meth:`PagePool.match`) instead of computing them again. A cached page nobody holds
  stays cached until its room is needed: :meth:`allocate` then evicts the least recently
  released first (LRU).

Pure Python: no model, no array library.

>>> pool = PagePool(5, page_size=2)
>>> a = pool.allocate(2); a, pool.available()
([1, 2], 2)
>>> keys = block_keys([7, 8, 9, 10], 2)
>>> pool.register(keys[0], a[0]); pool.release(a); pool.available()
4
>>> pool.match(keys), pool.available()          # the first page is found again
([1], 3)
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence

from .errors import page_error

SINK = 0


def block_keys(tokens: Sequence[int], page_size: int, limit: int | None = None) -> list[bytes]:
    """The prefix-cache key of each whole page of ``tokens`` (at most ``limit`` pages): page
    i's key hashes every token of pages 0..i, so two pages share a key only where the
    sequences agree up to the page's end (their KV is then the same).

    >>> a, b = block_keys([1, 2, 3, 4, 5], 2), block_keys([1, 2, 3, 9], 2)
    >>> len(a), a[0] == b[0], a[1] == b[1]
    (2, True, False)
    """
    whole = len(tokens) // page_size
    if limit is not None:
        whole = min(whole, limit)
    keys: list[bytes] = []
    key = b""
    for i in range(whole):
        block = array("q", tokens[i * page_size : (i + 1) * page_size]).tobytes()
        key = hashlib.blake2b(key + block, digest_size=16).digest()
        keys.append(key)
    return keys


class PagePool:
    """Pages 1..``num_pages - 1`` of a paged KV cache of ``page_size`` positions a page: a
    free list, a refcount per page and the prefix cache (see the module's text).

    >>> pool = PagePool(3, page_size=4)
    >>> pool.allocate(3) is None, pool.allocate(2)   # only 2 pages besides the sink
    (True, [1, 2])
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.refs = [0] * num_pages
        self.free: deque[int] = deque(range(1, num_pages))
        self.key_of: dict[int, bytes] = {}
        self.page_of: dict[bytes, int] = {}
        # Cached pages nobody holds, least recently released first: evicted in this order.
        self.idle: OrderedDict[int, None] = OrderedDict()
        self.hits = 0  # pages found by match(), for the metrics

    @property
    def usable(self) -> int:
        """The pages a sequence may hold (all but the sink)."""
        return self.num_pages - 1

    def available(self) -> int:
        """Pages :meth:`allocate` can give now: the free ones and the cached ones nobody
        holds."""
        return len(self.free) + len(self.idle)

    def used(self) -> int:
        """Pages some sequence holds."""
        return self.usable - self.available()

    def cached(self) -> int:
        """Pages in the prefix cache (held or not)."""
        return len(self.key_of)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` pages, each held once, or None (and nothing taken) where fewer are
        available; free pages first, then cached pages nobody holds, least recently
        released first (their cache entry is dropped)."""
        if n > self.available():
            return None
        out: list[int] = []
        for _ in range(n):
            if self.free:
                page = self.free.popleft()
            else:
                page, _ = self.idle.popitem(last=False)
                del self.page_of[self.key_of.pop(page)]
            self.refs[page] = 1
            out.append(page)
        return out

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference to each page; a page nobody holds any more goes back to the
        free list, or, where it is cached, to the idle pages eviction takes from. E0865,
        and nothing changed, for a page not held (freed twice, the sink, outside the pool).
        """
        counts: dict[int, int] = {}
        for page in pages:
            counts[page] = counts.get(page, 0) + 1
        for page, n in counts.items():
            if page == SINK:
                raise page_error(page, "it is the sink page, which no sequence holds")
            if not 0 < page < self.num_pages:
                raise page_error(page, f"the pool's pages are 1..{self.num_pages - 1}")
            if self.refs[page] < n:
                held = self.refs[page]
                raise page_error(
                    page,
                    "it is free already" if held == 0 else f"it is held {held} times, freed {n}",
                )
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                if page in self.key_of:
                    self.idle[page] = None
                else:
                    self.free.append(page)

    def register(self, key: bytes, page: int) -> None:
        """Record that ``page`` (held, every position computed) holds the block ``key``
        names; where another page holds it already, nothing changes (the first stays)."""
        if key in self.page_of or page in self.key_of:
            return
        self.page_of[key] = page
        self.key_of[page] = key

    def match(self, keys: Sequence[bytes]) -> list[int]:
        """The cached pages of the longest prefix of ``keys`` (from :func:`block_keys`),
        each now held once more by the caller (who releases them as its own)."""
        out: list[int] = []
        for key in keys:
            page = self.page_of.get(key)
            if page is None:
                break
            if self.refs[page] == 0:
                del self.idle[page]
            self.refs[page] += 1
            out.append(page)
        self.hits += len(out)
        return out

    def check(self) -> None:
        """Assert the pool's invariants (tests): every page is exactly one of free, idle
        cached, or held; the cache's two maps agree."""
        held = {p for p in range(1, self.num_pages) if self.refs[p] > 0}
        free, idle = set(self.free), set(self.idle)
        assert len(free) == len(self.free), "a page is twice in the free list"
        assert not (held & free) and not (held & idle) and not (free & idle)
        assert held | free | idle == set(range(1, self.num_pages))
        assert idle <= set(self.key_of) and not (free & set(self.key_of))
        assert {v: k for k, v in self.page_of.items()} == self.key_of
