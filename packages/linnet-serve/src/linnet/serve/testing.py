"""A reference paged model for tests of the engine and the server: no weights, no compiler,
and every logit a function of the whole token history read back **through the page table**,
so a wrong table, a page shared that should not be, or a page freed too early changes the
tokens generated.

Its "KV cache" is a pool ``[num_pages, page_size]`` of token ids; ``decode_paged`` and
``prefill_paged`` keep the paged entries' contract (:mod:`linnet.serve.runner`): they write
each row's tokens at their positions into the pages the table names, then read positions
``0..last`` back through the table. The next token (the argmax) is a hash of that history,
:func:`next_token`; :meth:`ToyPagedModel.reference` computes it densely, without pages.

>>> model = ToyPagedModel(vocabulary=50, num_pages=8, page_size=4, max_len=32)
>>> import torch
>>> t = torch.tensor([[1, 2, 3, 0]], dtype=torch.int32)
>>> logits = model.prefill_paged(t, torch.tensor([0]), torch.tensor([3]),
...                              torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0]]))
>>> int(logits.argmax()) == model.reference([1, 2, 3], 1)[0]
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MULTIPLIER = 1_000_003
MODULUS = (1 << 61) - 1


def next_token(history: Sequence[int], vocabulary: int) -> int:
    """The toy model's greedy token after ``history``: a polynomial hash of every token.

    >>> next_token([1, 2, 3], 100) == next_token([1, 2, 3], 100), next_token([1], 100)
    (True, 39)
    """
    h = 0
    for t in history:
        h = (h * MULTIPLIER + int(t) + 1) % MODULUS
    return (h * 2_654_435_761 + 17) % MODULUS % vocabulary


class ToyPagedModel:
    """The reference paged model (see the module's text). ``entries`` and ``config`` are
    what :class:`linnet.serve.runner.ModelRunner` reads."""

    entries = ("prefill", "decode", "prefill_paged", "decode_paged")

    def __init__(
        self, vocabulary: int, num_pages: int, page_size: int, max_len: int, delay: float = 0.0
    ) -> None:
        import torch

        self.config = {"V": vocabulary, "S": max_len}
        self.vocabulary = vocabulary
        self.page_size = page_size
        self.pool = torch.full((num_pages, page_size), -1, dtype=torch.int64)
        self.device = torch.device("cpu")
        self.delay = delay  # seconds a call sleeps: a stand-in for a real model's step time
        self.calls: list[tuple[str, int]] = []

    def _logits(self, history: list[int]) -> Any:
        import torch

        # Every token gets a finite logit; the hash's token the largest, so greedy picks it
        # and sampling still has a whole distribution to draw from.
        want = next_token(history, self.vocabulary)
        ids = torch.arange(self.vocabulary, dtype=torch.float32)
        distance = torch.remainder(ids - want, self.vocabulary)
        return -0.5 * torch.minimum(distance, self.vocabulary - distance)

    def _read(self, table: Any, last: int) -> list[int]:
        ps = self.page_size
        return [int(self.pool[int(table[p // ps]), p % ps]) for p in range(last + 1)]

    def _write(self, table: Any, pos: int, token: int) -> None:
        ps = self.page_size
        self.pool[int(table[pos // ps]), pos % ps] = int(token)

    def _sleep(self) -> None:
        if self.delay:
            import time

            time.sleep(self.delay)

    def decode_paged(self, token: Any, pos: Any, table: Any) -> Any:
        """One token a row at its position; the logits after it."""
        import torch

        self._sleep()
        self.calls.append(("decode", int(token.shape[0])))
        out = []
        for b in range(token.shape[0]):
            self._write(table[b], int(pos[b]), int(token[b]))
            out.append(self._logits(self._read(table[b], int(pos[b]))))
        return torch.stack(out)

    def prefill_paged(self, tokens: Any, start: Any, n: Any, table: Any) -> Any:
        """Row b's ``n[b]`` tokens at ``start[b]..``; the logits after the last."""
        import torch

        self._sleep()
        self.calls.append(("prefill", int(tokens.shape[0])))
        out = []
        for b in range(tokens.shape[0]):
            first, count = int(start[b]), int(n[b])
            for i in range(count):
                self._write(table[b], first + i, int(tokens[b, i]))
            out.append(self._logits(self._read(table[b], first + count - 1)))
        return torch.stack(out)

    def reference(
        self, prompt: Sequence[int], max_tokens: int, stops: Sequence[int] = ()
    ) -> list[int]:
        """The greedy tokens after ``prompt``, computed without pages."""
        history, out = list(prompt), []
        for _ in range(max_tokens):
            token = next_token(history, self.vocabulary)
            out.append(token)
            history.append(token)
            if token in stops:
                break
        return out
