"""Appends steps and calls to a graph while lowering; in the checker it records nothing."""

from __future__ import annotations

from typing import Any

from linnet.lang.diagnostics.core import Span
from linnet.lang.ir.graph import Call, Graph, Step, ValueType
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Tensor


class Builder:
    """Lowering's sink. With ``graph=None`` (the checker) emitting only computes types."""

    def __init__(self, graph: Graph | None):
        self.graph = graph
        self._used: dict[str, int] = {}
        self._call_index = 0
        self.depth = 0
        self._seen: dict[tuple, str] = {}
        self._key_of: dict[str, tuple] = {}  # result name -> its CSE key, for renames
        self._last_fresh: str | None = None  # the result of the last step emitted (not shared)
        # The calls closed since the last step was emitted, innermost first: each recorded
        # that step's result as its own, and a rename of it must reach every one of them
        # (`let h = f(x)` where f's body ends `return g(y) as T`: f and g end at one step).
        self._tail_calls: list[Call] = []
        # Per open op call, innermost last: the conversions it made. When the call closes
        # (its arguments known then: a replayed layer's call gets them only at its close), a conversion of an argument that a product inside the
        # call reads stops being shared: a later op call converting the same argument for
        # its own product (k_proj's `linear_q8` converting the x q_proj's converted to f32)
        # makes its own. Shared, it would tie the two calls together and neither would stand
        # alone as one node of a span op's pattern (a kernel claiming the first leaves the
        # second without its input), as a library takes a mixed-precision product whole.
        # Other shared values (rope's cos and sin tables for q and k, a norm's and a
        # residual's f32 copies of one h) stay shared.
        self._op_keys: list[list[tuple]] = []
        # `file:line` of each span's start, per (source, offset), for this run only: a cache
        # shared by every run would keep every program's source alive and never shrink.
        self._locs: dict[tuple[int, int], tuple[Span, str]] = {}

    @property
    def recording(self) -> bool:
        return self.graph is not None

    def fresh(self, hint: str) -> str:
        hint = hint or "t"
        n = self._used.get(hint, 0)
        self._used[hint] = n + 1
        return f"%{hint}" if n == 0 else f"%{hint}.{n}"

    def emit(
        self,
        op: str,
        operands: list[str],
        shape: tuple[Dim, ...],
        dtype: str,
        attrs: dict[str, Any] | None = None,
        hint: str = "",
        span: Span | None = None,
        labels: tuple[str, ...] | None = None,
    ) -> Tensor:
        if self.graph is None:
            return Tensor("%?", shape, dtype, labels=labels)
        attrs = attrs or {}
        # Common subexpressions (each layer's rope tables, say) are computed once. Steps that
        # read a state are never shared: a write may come between them.
        states = self.graph.states
        shared = not any(o[1:] in states for o in operands if o.startswith("@"))
        name = self.emit_step(
            op,
            operands,
            ValueType(tuple(_concrete(d) for d in shape), dtype),
            attrs,
            hint,
            self._loc(span),
            attrs_key(attrs) if shared else None,
        )
        return Tensor(name, shape, dtype, labels=labels)

    def emit_step(
        self,
        op: str,
        operands: list[str],
        vtype: ValueType,
        attrs: dict[str, Any],
        hint: str,
        loc: str,
        key_attrs: str | None,
    ) -> str:
        """:meth:`emit` with the concrete type, the location and the attributes' part of the
        common-subexpression key (:func:`attrs_key`; None: never shared) already computed, as
        replaying a recorded step does (check/instantiate.py). Returns the result's name."""
        assert self.graph is not None
        key = None
        if key_attrs is not None:
            key = (op, tuple(operands), key_attrs)
            hit = self._seen.get(key)
            if hit is not None:
                self._last_fresh = None
                return hit
        name = self.fresh(hint)
        self._last_fresh = name
        if key is not None:
            self._seen[key] = name
            self._key_of[name] = key
            if self._op_keys and op == "convert":
                self._op_keys[-1].append(key)
        self.graph.values[name] = vtype
        self.graph.steps.append(Step(op, list(operands), [name], dict(attrs), loc))
        self._tail_calls = []
        return name

    def effect(
        self, op: str, operands: list[str], attrs: dict[str, Any], span: Span | None
    ) -> None:
        if self.graph is not None:
            self.graph.steps.append(Step(op, list(operands), [], dict(attrs), self._loc(span)))
            self._tail_calls = []

    def rename_last(self, tensor: Tensor, hint: str, force: bool = False) -> Tensor:
        """Give the value the last step made a source name (`let q = ...` names it `%q`)."""
        g = self.graph
        # Only a value the last step just made can take a name; a shared (CSE) value keeps
        # the name it already has, which other steps use.
        if (
            g is None
            or not g.steps
            or g.steps[-1].results != [tensor.ref]
            or tensor.ref != self._last_fresh
        ):
            return tensor
        old = tensor.ref
        if not (force or old.startswith("%t")) or hint in ("", "_"):
            return tensor
        new = self.fresh(hint)
        g.steps[-1].results = [new]
        g.values[new] = g.values.pop(old)
        self._last_fresh = new
        key = self._key_of.pop(old, None)
        if key is not None:
            self._seen[key] = new
            self._key_of[new] = key
        # Calls that just closed recorded the old name as their result: every one of them,
        # nested or not (an enclosing call's inner calls can end before it does).
        for call in self._tail_calls:
            results = call.attributes.get("results")
            if results and old in results:
                call.attributes["results"] = [new if r == old else r for r in results]
        return Tensor(new, tensor.shape, tensor.dtype, tensor.kind, tensor.labels)

    def _loc(self, span: Span | None) -> str:
        if span is None:
            return ""
        key = (id(span.source), span.start)
        hit = self._locs.get(key)
        if hit is None or hit[0].source is not span.source:
            hit = (span, f"{span.source.name}:{span.line}")
            self._locs[key] = hit
        return hit[1]

    def open_call(
        self,
        callee: str,
        kind: str,
        path: str,
        span: Span | None,
        attrs: dict[str, Any] | None = None,
        iteration: int | None = None,
        repeated: str = "",
    ) -> Call | None:
        if self.graph is None:
            return None
        call = Call(
            callee,
            kind,
            len(self.graph.steps),
            -1,
            self._call_index,
            path,
            self.depth,
            self._loc(span),
            dict(attrs or {}),
            iteration,
            repeated,
        )
        self._call_index += 1
        self.graph.calls.append(call)
        self.depth += 1
        if kind == "op":
            self._op_keys.append([])
        return call

    def close_call(self, call: Call | None) -> None:
        if call is None or self.graph is None:
            return
        call.stop = len(self.graph.steps)
        self.depth -= 1
        self._tail_calls.append(call)
        if call.kind == "op" and self._op_keys:
            keys = self._op_keys.pop()
            if not keys:  # most op calls convert nothing: no scan of their steps
                return
            args = {a for a in call.attributes.get("args") or [] if isinstance(a, str)}
            product_operands = {
                o
                for step in self.graph.steps[call.start : call.stop]
                if step.op == "contract"
                for o in step.operands
            }
            for key in keys:
                name = self._seen.get(key)
                if name is not None and key[1][0] in args and name in product_operands:
                    del self._seen[key]
                    self._key_of.pop(name, None)


def attrs_key(attrs: dict[str, Any]) -> str:
    """The attributes' part of a step's common-subexpression key."""
    return repr(sorted(attrs.items()))


def _concrete(d: Dim) -> int:
    v = d.value
    if v is None:
        raise ValueError(f"dimension {d} is not concrete while lowering")
    return v
