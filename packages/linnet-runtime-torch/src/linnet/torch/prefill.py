"""generate's prefill on the torch runtime: the first new token's logits of each prompt.

A model with a ``prefill_last`` entry (every std model) runs it with each row's last prompt
position (``at``) and gets the logits [B, V] of those positions alone, the LM head applied
to B rows; a model without one runs ``prefill`` ([B, L, V], the LM head on every position)
and keeps one row per sequence (:func:`linnet.lang.host.generate.prefill_entry` picks, and
checks ``prefill_last``'s signature, E0871). Both fill the cache the same way. Shared by
``generate`` (:mod:`linnet.torch.generate`) and its fast path on CUDA
(:mod:`linnet.torch.fast_generate`).

>>> [t.tolist() for t in first_inputs("prefill", torch.tensor([[5, 6, 6]]), [2])]
[[[5, 6, 6]]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang.host.generate import PREFILL_LAST

import torch


def first_inputs(entry: str, tokens: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """The inputs of generate's prefill ``entry`` for the padded prompt rows ``tokens``
    [B, L] of prompt ``lengths``: the rows, and for ``prefill_last`` each row's last prompt
    position (int32, on the rows' device).

    >>> [t.tolist() for t in first_inputs("prefill_last", torch.tensor([[5, 6, 6]]), [2])]
    [[[5, 6, 6]], [1]]
    """
    if entry != PREFILL_LAST:
        return [tokens]
    return [tokens, torch.tensor([n - 1 for n in lengths], dtype=torch.int32, device=tokens.device)]


def first_logits(
    model: Any, entry: str, tokens: torch.Tensor, lengths: Sequence[int], context: Any
) -> torch.Tensor:
    """The logits [B, V] of each row's first new token: generate's prefill ``entry`` run on
    the padded rows ``tokens`` into ``context`` (its cache), ``prefill_last`` giving them
    directly, ``prefill`` ([B, L, V]) kept to each row's last prompt position.

    >>> first_logits(model, "prefill_last", tokens, [3, 1], context).shape  # doctest: +SKIP
    torch.Size([2, 256])
    """
    # The entry by its attribute, as a caller sees it (a wrapper set there is what runs).
    logits = getattr(model, entry)(*first_inputs(entry, tokens, lengths), context=context)
    return last_rows(entry, logits, lengths)


def last_rows(entry: str, logits: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """The logits [B, V] of each row's last prompt position: ``prefill_last``'s as they are,
    ``prefill``'s [B, L, V] kept to row b's position ``lengths[b] - 1``.

    >>> last_rows("prefill", torch.arange(12.0).reshape(2, 3, 2), [3, 1]).tolist()
    [[4.0, 5.0], [6.0, 7.0]]
    """
    if entry == PREFILL_LAST:
        return logits
    last = torch.tensor([n - 1 for n in lengths], device=logits.device)
    return logits[torch.arange(len(lengths), device=logits.device), last]
