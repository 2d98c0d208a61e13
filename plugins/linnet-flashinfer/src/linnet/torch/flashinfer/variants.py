"""The decode-attention ops the FlashInfer backend takes, and how each maps onto the
arguments of FlashInfer's ``plan()``.

* ``std.nn.attention::decode_attention(q, k_cache, v_cache, pos, scale)``: cache positions
  ``j <= pos[b]``, scores ``q . k * scale``.
* ``window_decode_attention(..., scale, window)``: positions ``pos[b] - window < j <=
  pos[b]`` (the last ``window`` positions, the current one included). FlashInfer's
  ``window_left`` keeps keys ``j >= pos[b] - window_left`` (its mask, ``kv_idx + qo_len +
  window_left >= kv_len + qo_idx`` with one query, ``kv_len = pos[b] + 1``): so
  ``window_left = window - 1``. A window below 1 keeps no position (the body's softmax of
  nothing is NaN): not taken.
* ``softcap_decode_attention(..., scale, window, cap)``: the same window where ``window > 0``
  (else every position), each score ``cap * tanh(q . k * scale / cap)``. FlashInfer's
  ``logits_soft_cap`` computes ``tanh(q . k * (sm_scale / cap))`` and multiplies by ``cap``
  in the softmax's exponent (``sm_scale_log2 = log2(e) * cap``, its ``variants.cuh``): the
  same, the scale applied before the cap. FlashInfer caps only for a positive cap (0 turns
  capping off, which the body does not): a cap of 0 or below is not taken.

The paged forms (std.nn.paged's ``paged_decode_attention`` and its window and soft-cap
forms) are the same ops over a sequence's pages, read through its page table: FlashInfer's
own page table takes them as they are.

The window and the cap must be constants of the graph (each layer's are: its config).

>>> window_left_for(8), window_left_for(0, global_below_one=True)
(7, -1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from linnet.lang.ir.graph import Call, Graph

DECODE_ATTENTION = "std.nn.attention::decode_attention"
WINDOW_DECODE_ATTENTION = "std.nn.attention::window_decode_attention"
SOFTCAP_DECODE_ATTENTION = "std.nn.attention::softcap_decode_attention"
PAGED_DECODE_ATTENTION = "std.nn.paged::paged_decode_attention"
PAGED_WINDOW_DECODE_ATTENTION = "std.nn.paged::paged_window_decode_attention"
PAGED_SOFTCAP_DECODE_ATTENTION = "std.nn.paged::paged_softcap_decode_attention"
DENSE_CALLEES = (DECODE_ATTENTION, WINDOW_DECODE_ATTENTION, SOFTCAP_DECODE_ATTENTION)
PAGED_CALLEES = (
    PAGED_DECODE_ATTENTION,
    PAGED_WINDOW_DECODE_ATTENTION,
    PAGED_SOFTCAP_DECODE_ATTENTION,
)
CALLEES = (*DENSE_CALLEES, *PAGED_CALLEES)
"""The calls this backend takes: over a dense ``[B, S, KV, HD]`` cache, ``(q, k_cache,
v_cache, pos, scale, ...)``; over a paged one (std.nn.paged: a pool of ``[NP, PS, KV, HD]``
pages and a ``[B, MP]`` page table), ``(q, k_pages, v_pages, table, pos, scale, ...)``."""
_EXTRA: dict[str, tuple[str, ...]] = {
    DECODE_ATTENTION: (),
    WINDOW_DECODE_ATTENTION: ("window",),
    SOFTCAP_DECODE_ATTENTION: ("window", "cap"),
    PAGED_DECODE_ATTENTION: (),
    PAGED_WINDOW_DECODE_ATTENTION: ("window",),
    PAGED_SOFTCAP_DECODE_ATTENTION: ("window", "cap"),
}
_SOFTCAP = (SOFTCAP_DECODE_ATTENTION, PAGED_SOFTCAP_DECODE_ATTENTION)


@dataclass(frozen=True)
class Variant:
    """What a call asks of FlashInfer's plan() besides the shapes: ``window_left`` (-1: every
    position) and ``soft_cap`` (0.0: none)."""

    window_left: int = -1
    soft_cap: float = 0.0

    def plan_options(self) -> dict[str, Any]:
        """The plan() keywords for this variant: none for plain decode attention.

        >>> Variant(7, 30.0).plan_options()
        {'window_left': 7, 'logits_soft_cap': 30.0}
        """
        out: dict[str, Any] = {}
        if self.window_left >= 0:
            out["window_left"] = self.window_left
        if self.soft_cap > 0:
            out["logits_soft_cap"] = self.soft_cap
        return out


def literal(graph: Graph, ref: Any) -> float | None:
    """The number ``ref`` is (a literal, or a ``constant`` step's value), else None."""
    if isinstance(ref, bool):
        return None
    if isinstance(ref, int | float):
        return float(ref)
    if isinstance(ref, str) and ref.startswith("%"):
        producer = graph.producers().get(ref)
        if producer is not None:
            step = graph.steps[producer]
            value = step.attributes.get("value")
            if (
                step.op == "constant"
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            ):
                return float(value)
    return None


def window_left_for(window: int, global_below_one: bool = False) -> int:
    """FlashInfer's ``window_left`` for Linnet's ``window`` (keys ``pos - window < j <=
    pos``): ``window - 1``; -1 (every position) for a window below 1 where the op reads that
    as global (``softcap_decode_attention``).

    >>> window_left_for(1)
    0
    """
    if window < 1:
        if not global_below_one:
            raise ValueError(f"a window of {window} keeps no position")
        return -1
    return window - 1


def variant_of(graph: Graph, call: Call) -> tuple[list[Any] | None, Variant, str]:
    """``call``'s ``(q, k_cache, v_cache, pos, scale)`` arguments (paged: ``(q, k_pages,
    v_pages, table, pos, scale)``) and its variant, or None and why FlashInfer cannot run it."""
    args = list(call.attributes.get("args", ()))
    results = list(call.attributes.get("results", ()))
    extra = _EXTRA.get(call.callee)
    if extra is None:
        return None, Variant(), f"not one of {', '.join(CALLEES)}"
    base = (
        ("q", "k_pages", "v_pages", "table", "pos", "scale")
        if call.callee in PAGED_CALLEES
        else ("q", "k_cache", "v_cache", "pos", "scale")
    )
    if len(args) != len(base) + len(extra) or len(results) != 1:
        names = ", ".join((*base, *extra))
        return None, Variant(), f"the call's args/results are not ({names}) -> o"
    given: dict[str, float] = {}
    for name, ref in zip(extra, args[len(base) :], strict=True):
        value = literal(graph, ref)
        if value is None:
            return None, Variant(), f"the {name} {ref!r} is not a constant"
        given[name] = value
    window_left = -1
    if "window" in given:
        window = given["window"]
        if not float(window).is_integer():
            return None, Variant(), f"the window {window} is not a whole number of positions"
        softcap = call.callee in _SOFTCAP
        if int(window) < 1 and not softcap:
            return (
                None,
                Variant(),
                (f"a window of {int(window)} keeps no cache position (the op's result is NaN)"),
            )
        window_left = window_left_for(int(window), global_below_one=softcap)
    cap = given.get("cap", 0.0)
    if "cap" in given and not (cap > 0 and math.isfinite(cap)):
        return (
            None,
            Variant(),
            (
                f"a soft cap of {cap}: FlashInfer's logits_soft_cap caps only with a positive "
                "finite cap (0 turns capping off), which is not the op's cap * tanh(s / cap)"
            ),
        )
    return args[: len(base)], Variant(window_left, cap), ""
