"""Lowering a loop over repeated blocks once, and instantiating it for the other elements.

``for layer in self.layers { h = layer.decode(h, ...) }`` over a ``[DecoderLayer<...>; 32]``
array runs the same code on 32 blocks that differ only in their paths
(``model.layers.0.`` ... ``model.layers.31.``). Evaluating each iteration costs the whole
abstract interpreter every time; this module evaluates iteration 0 (the *template*) while
recording every call the evaluator makes into the :class:`~linnet.lang.ir.builder.Builder`,
evaluates iteration 1 the same way (the *witness*), and, when the witness made exactly the
template's calls up to renaming, replays the template for iterations 2..N-1 with

* SSA values made inside the iteration renamed to what the builder returns when replayed,
* the loop-carried values (``h``) renamed to the previous iteration's results,
* paths under the template element re-pathed (``model.layers.0.x`` -> ``model.layers.i.x``),
  in operands, call paths and attributes, and ``Call.iteration`` set to ``i``.

Replaying goes through the real builder, so value names, common-subexpression sharing (the
rope tables of layer 0 are reused by every later layer), call spans and locations come out
exactly as evaluating every iteration would make them: the graph is identical, not merely
equivalent. ``tests/test_instantiate.py`` compares ``Graph.dumps()`` both ways.

What makes the replay a proof rather than a guess:

* the elements are copies of element 0 with other paths (:func:`clone_element`, used by
  check/blocks.py), so the same block type, generics, members, shapes and dtypes
  (:func:`same_element` checks element 1);
* the variables the body assigns hold distinct tensors that keep their type, and the body
  does not ``return``;
* the evaluator is deterministic and sees an iteration only through the loop variable and
  the carried values, so a difference between element 0 and element ``i`` that is not a
  path (say, the body reading ``self.layers[0]`` directly, or reading by another name a
  value that is also carried) shows in the witness: iteration 1, evaluated for real, must
  make the template's builder calls under the renaming above;
* a shared (CSE) result of the template that existed before the iteration must not depend on
  anything that changes between iterations (it would be a different value later).

When any of these fails, the remaining iterations are evaluated one by one, as before. Loops
over ranges (``for i in 0..N``) always are: their body may depend on the index. An error in
an iteration is raised by the evaluation of the template (or the witness) exactly as before,
so diagnostics do not change.

>>> from linnet.lang import Program, lower                            # doctest: +SKIP
>>> g = lower(Program.from_file("examples/llama/llama.linnet"), "decode",
...           {"token": [1], "pos": [1]}, llama_8b_config)              # doctest: +SKIP
>>> # 2 layers evaluated, 30 instantiated; the same graph as evaluating all 32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import Span
from linnet.lang.ir.builder import Builder, _concrete, attrs_key
from linnet.lang.ir.graph import Call, ValueType
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import BlockArray, BlockInst, Tensor

if TYPE_CHECKING:
    from linnet.lang.check.core import EvaluatorBase, Frame

# Off only to compare against evaluating every iteration (tests, benchmarks).
ENABLED = True
# Below this many elements there is nothing to gain: template and witness are all of them.
MIN_ELEMENTS = 3

# One recorded builder call. Kinds and fields:
#   ("emit", op, operands, shape, dtype, attrs, hint, span, labels, result, fresh)
#       fresh: the step was appended (False: a common subexpression already had a value)
#   ("effect", op, operands, attrs, span)
#   ("rename", ref, shape, dtype, kind, labels, hint, force, result)
#   ("open", callee, kind, path, span, iteration, repeated)
#   ("close", attributes)  -- the call's attributes when it closed (its results included)
Record = tuple


class Tracer:
    """Stands in for the evaluator's builder: forwards every call and records it.

    >>> from linnet.lang.ir.graph import Graph
    >>> t = Tracer(Builder(Graph("e", "m")))
    >>> t.emit("constant", [], (), "f32", {"value": 1.0, "dtype": "f32"}).ref
    '%t'
    >>> t.records[0][:2]
    ('emit', 'constant')
    """

    recording = True

    def __init__(self, inner: Builder | Tracer):
        self.inner = inner
        self.records: list[Record] = []
        self._open: list[Call | None] = []

    @property
    def graph(self) -> Any:
        return self.inner.graph

    @property
    def depth(self) -> int:
        return self.inner.depth

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
        steps = self.inner.graph.steps  # type: ignore[union-attr]  # recording: a graph
        before = len(steps)
        t = self.inner.emit(op, operands, shape, dtype, attrs, hint, span, labels)
        self.records.append(
            (
                "emit",
                op,
                list(operands),
                shape,
                dtype,
                _copy(attrs or {}),
                hint,
                span,
                labels,
                t.ref,
                len(steps) > before,
            )
        )
        return t

    def effect(
        self, op: str, operands: list[str], attrs: dict[str, Any], span: Span | None
    ) -> None:
        self.inner.effect(op, operands, attrs, span)
        self.records.append(("effect", op, list(operands), _copy(attrs), span))

    def rename_last(self, tensor: Tensor, hint: str, force: bool = False) -> Tensor:
        t = self.inner.rename_last(tensor, hint, force)
        self.records.append(
            (
                "rename",
                tensor.ref,
                tensor.shape,
                tensor.dtype,
                tensor.kind,
                tensor.labels,
                hint,
                force,
                t.ref,
            )
        )
        return t

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
        call = self.inner.open_call(
            callee, kind, path, span, attrs, iteration=iteration, repeated=repeated
        )
        self.records.append(("open", callee, kind, path, span, iteration, repeated))
        return call

    def close_call(self, call: Call | None) -> None:
        self.records.append(("close", _copy(call.attributes) if call is not None else {}))
        self.inner.close_call(call)


def _copy(value: Any) -> Any:
    """A deep copy of JSON-like attributes: replayed steps must not share mutable lists."""
    if isinstance(value, dict):
        return {k: _copy(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) if isinstance(v, dict | list) else v for v in value]
    return value


class Renaming:
    """Template names to one iteration's names: SSA values by table, paths by prefix.

    >>> r = Renaming("model.layers.0", "model.layers.3", 3, "model.layers")
    >>> r.ref("@model.layers.0.mlp.up.weight"), r.ref("@model.layers.10.x"), r.ref("%h")
    ('@model.layers.3.mlp.up.weight', '@model.layers.10.x', '%h')
    """

    def __init__(
        self, old: str, new: str, index: int, repeated: str, values: dict[str, str] | None = None
    ):
        self.old, self.new, self.index, self.repeated = old, new, index, repeated
        self.old_dot = old + "."
        self.values: dict[str, str] = dict(values or {})

    def path(self, path: str) -> str:
        if path == self.old:
            return self.new
        if path.startswith(self.old_dot):
            return self.new + path[len(self.old) :]
        return path

    def ref(self, ref: str) -> str:
        if ref.startswith("%"):
            return self.values.get(ref, ref)
        if ref.startswith("@"):
            return "@" + self.path(ref[1:])
        return ref

    def refs(self, refs: list[str]) -> list[str]:
        return [self.ref(r) for r in refs]

    def attrs(self, value: Any) -> Any:
        """Attributes with refs and paths renamed (a scatter's `path`, a call's `args`)."""
        if isinstance(value, str):
            return self.ref(value) if value[:1] in ("%", "@") else self.path(value)
        if isinstance(value, dict):
            return {k: self.attrs(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.attrs(v) for v in value]
        return value

    def iteration(self, iteration: int | None, repeated: str) -> int | None:
        """`Call.iteration` of a call on the template element (0) becomes this iteration's."""
        return self.index if repeated == self.repeated and iteration == 0 else iteration


def run_loop(
    ev: EvaluatorBase,
    stmt: A.For,
    frame: Frame,
    arr: BlockArray,
    run_one: Callable[[BlockInst], None],
) -> None:
    """Run ``for var in arr { body }``, instantiating the template where it provably applies.

    ``run_one(item)`` evaluates the body once with the loop variable bound to ``item``.
    """
    items = list(arr.items)
    # Lowering for `--grad` records each call's grad clause while evaluating it: a replayed
    # iteration would not, so every iteration is evaluated.
    if not (
        ENABLED
        and ev.lowering
        and len(items) >= MIN_ELEMENTS
        and not frame.in_kernel
        and ev.grad_templates is None
    ):
        for item in items:
            run_one(item)
        return
    builder = ev.builder
    before = _bindings(frame)
    template = _traced(ev, builder, run_one, items[0])
    plan = _carried(frame, before, template.records, items[0].path)
    # Elements may differ in per-element configs (a config list's items): every element must
    # be the template's copy, else a witness equal to the template would let a different
    # element (a sliding-window layer after global ones) be replayed as the template.
    if plan is None or not all(
        item.decl is items[0].decl and same_element(items[0], item, items[0].path, item.path)
        for item in items[1:]
    ):
        for item in items[1:]:
            run_one(item)
        return
    names, ins, outs = plan
    witness = _traced(ev, builder, run_one, items[1])
    after = [frame.lookup_local(n) for n in names]
    r = _renaming(arr, items, 1, ins, outs)
    if not (
        frame.returned is None
        and _same_types(outs, after)
        and _matches(template.records, witness.records, r)
        and [t.ref for t in after] == [r.ref(o.ref) for o in outs]
    ):
        for item in items[2:]:
            run_one(item)
        return
    carried: list[Tensor] = after  # type: ignore[assignment]
    base = builder
    while isinstance(base, Tracer):  # a loop inside a loop being traced
        base = base.inner
    assert base.graph is not None  # lowering
    records = compile_records(template.records, items[0].path, base.graph.states, base._loc)
    for k in range(2, len(items)):
        renaming = _renaming(arr, items, k, ins, carried)
        _replay(builder, records, renaming)
        carried = [Tensor(renaming.ref(o.ref), o.shape, o.dtype, o.kind, o.labels) for o in outs]
    _rebind(frame, names, carried)


def _renaming(
    arr: BlockArray, items: list[BlockInst], k: int, ins: list[Tensor], carried: list[Tensor]
) -> Renaming:
    """The renaming of the template for iteration ``k``, starting from the carried values."""
    return Renaming(
        items[0].path, items[k].path, k, arr.path, {t.ref: c.ref for t, c in zip(ins, carried)}
    )


def _traced(
    ev: EvaluatorBase, builder: Any, run_one: Callable[[BlockInst], None], item: BlockInst
) -> Tracer:
    tracer = Tracer(builder)
    ev.builder = tracer  # type: ignore[assignment]
    try:
        run_one(item)
    finally:
        ev.builder = builder
    return tracer


def _bindings(frame: Frame) -> list[tuple[dict[str, Any], str, Any]]:
    return [(scope, name, value) for scope in frame.scopes for name, value in scope.items()]


def _carried(
    frame: Frame, before: list[tuple[dict[str, Any], str, Any]], records: list[Record], element: str
) -> tuple[list[str], list[Tensor], list[Tensor]] | None:
    """The loop-carried variables (names, values in, values out), or None: evaluate instead.

    Carried values must be tensors that keep their type, distinct before and after: their
    names are renamed, so each must mean one thing in the template.
    """
    if frame.returned is not None or any(name not in scope for scope, name, _ in before):
        return None
    names: list[str] = []
    ins: list[Tensor] = []
    outs: list[Tensor] = []
    for scope, name, value in before:
        now = scope[name]
        if now is value:
            continue
        if not (
            isinstance(value, Tensor)
            and isinstance(now, Tensor)
            and value.kind == "value"
            and now.kind == "value"
            and value.shape == now.shape
            and value.dtype == now.dtype
            and value.labels == now.labels
        ):
            return None
        names.append(name)
        ins.append(value)
        outs.append(now)
    if len({n for n in names}) != len(names):
        return None  # shadowed names: the same variable name in two scopes
    in_refs = {t.ref for t in ins}
    if len(in_refs) != len(ins) or len({t.ref for t in outs}) != len(outs):
        return None
    # Another variable may hold a carried value (`let h = x` before the loop): a use of `x`
    # in the body would then be renamed like a use of `h`. The witness shows it, as a use
    # the renaming gets wrong in iteration 1, unless the value never changes (then it is
    # right in every iteration).
    # A template result that existed before the iteration (a CSE hit on an older value) is
    # the same value in every iteration only if none of its operands changes between them.
    moving = "@" + element + "."
    made: set[str] = set()
    for r in records:
        if r[0] == "emit":
            operands, result, fresh = r[2], r[9], r[10]
            if fresh or result in made:
                made.add(result)
            elif result in in_refs or any(o in in_refs or o.startswith(moving) for o in operands):
                return None
        elif r[0] == "rename" and (r[8] != r[1] or r[1] in made):
            made.add(r[8])
    return names, ins, outs


def same_element(a: Any, b: Any, old: str, new: str) -> bool:
    """Whether two elements of a block array are the same block, their paths aside."""
    if isinstance(a, BlockInst):
        if not (
            isinstance(b, BlockInst)
            and a.decl is b.decl
            and _path_of(a.path, old, new) == b.path
            and a.env == b.env
            and list(a.members) == list(b.members)
        ):
            return False
        return all(same_element(a.members[k], b.members[k], old, new) for k in a.members)
    if isinstance(a, Tensor):
        return (
            isinstance(b, Tensor)
            and "@" + _path_of(a.ref[1:], old, new) == b.ref
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.kind == b.kind
        )
    if isinstance(a, BlockArray):
        return (
            isinstance(b, BlockArray)
            and a.element is b.element
            and a.count == b.count
            and _path_of(a.path, old, new) == b.path
            and len(a.items) == len(b.items)
            and all(same_element(x, y, old, new) for x, y in zip(a.items, b.items))
        )
    return type(a) is type(b) and a == b


def clone_element(inst: BlockInst, old: str, new: str) -> BlockInst:
    """Element ``i`` of a block array from element 0: the same members under new paths.

    Instantiating a block is deterministic in everything but its path (the generics, the
    member conditions, shapes and dtypes are the array's, not the element's), so lowering
    instantiates element 0 and copies it, rather than evaluating every member again.

    >>> from linnet.lang.tensors.dims import Dim
    >>> a = BlockInst(None, "layers.0", {}, {"w": Tensor("@layers.0.w", (Dim.const(2),), "f32",
    ...                                                   kind="param")})  # type: ignore[arg-type]
    >>> clone_element(a, "layers.0", "layers.5").members["w"].ref
    '@layers.5.w'
    """
    members: dict[str, Any] = {}
    for name, v in inst.members.items():
        if isinstance(v, Tensor):
            v = Tensor("@" + _path_of(v.ref[1:], old, new), v.shape, v.dtype, v.kind, v.labels)
        elif isinstance(v, BlockInst):
            v = clone_element(v, old, new)
        elif isinstance(v, BlockArray):
            v = BlockArray(
                v.element,
                _path_of(v.path, old, new),
                v.count,
                [clone_element(item, old, new) for item in v.items],
            )
        members[name] = v
    return BlockInst(
        inst.decl,
        _path_of(inst.path, old, new),
        dict(inst.env),
        members,
        inst.iteration,
        _path_of(inst.repeated, old, new),
    )


def _path_of(path: str, old: str, new: str) -> str:
    if path == old:
        return new
    return new + path[len(old) :] if path.startswith(old + ".") else path


def _same_types(a: list[Tensor], b: list[Any]) -> bool:
    return all(
        isinstance(y, Tensor)
        and x.shape == y.shape
        and x.dtype == y.dtype
        and x.kind == y.kind
        and x.labels == y.labels
        for x, y in zip(a, b)
    )


def _rebind(frame: Frame, names: list[str], values: list[Tensor]) -> None:
    for name, value in zip(names, values):
        for scope in reversed(frame.scopes):
            if name in scope:
                scope[name] = value
                break


def _matches(template: list[Record], witness: list[Record], r: Renaming) -> bool:
    """Whether the witness made the template's builder calls under ``r`` (extended as it goes)."""
    if len(template) != len(witness):
        return False
    for t, w in zip(template, witness):
        kind = t[0]
        if w[0] != kind:
            return False
        if kind == "emit":
            if (
                t[1] != w[1]
                or r.refs(t[2]) != w[2]
                or t[3] != w[3]
                or t[4] != w[4]
                or r.attrs(t[5]) != w[5]
                or t[6] != w[6]
                or t[7] is not w[7]
                or t[8] != w[8]
            ):
                return False
            r.values[t[9]] = w[9]
        elif kind == "effect":
            if t[1] != w[1] or r.refs(t[2]) != w[2] or r.attrs(t[3]) != w[3] or t[4] is not w[4]:
                return False
        elif kind == "rename":
            if r.ref(t[1]) != w[1] or t[2:8] != w[2:8]:
                return False
            r.values[t[8]] = w[8]
        elif kind == "open":
            if (
                t[1] != w[1]
                or t[2] != w[2]
                or r.path(t[3]) != w[3]
                or t[4] is not w[4]
                or r.iteration(t[5], t[6]) != w[5]
                or r.path(t[6]) != w[6]
            ):
                return False
        elif kind == "close" and r.attrs(t[1]) != w[1]:
            return False
    return True


def _replay(builder: Any, records: list[Record], r: Renaming) -> None:
    """Make the template's builder calls again for one iteration, renamed by ``r``.

    ``records`` come from :func:`compile_records`: each carries plans (:func:`_leaf_plan`,
    :func:`_attrs_plan`) that say which of its strings the renaming changes.
    """
    opened: list[Call | None] = []
    values = r.values
    get = values.get
    new = r.new
    fast = type(builder) is Builder  # a nested loop's replay records through a Tracer
    for t in records:
        kind = t[0]
        if kind == "emit":
            # Fields 11-15: type, location, CSE key, operand plans, attribute plan.
            operands = [
                get(p[1], p[1]) if p[0] == 0 else p[1] if p[0] == 2 else p[1] + new + p[2]
                for p in t[14]
            ]
            plan = t[15]
            attrs = t[5] if plan is None else _attrs(plan, r)
            if fast:
                key = t[13]
                if key is not None and plan is not None and plan[0]:
                    key = attrs_key(attrs)  # the attributes name renamed values or paths
                values[t[9]] = builder.emit_step(t[1], operands, t[11], attrs, t[6], t[12], key)
            else:
                values[t[9]] = builder.emit(
                    t[1], operands, t[3], t[4], attrs or None, t[6], t[7], t[8]
                ).ref
        elif kind == "rename":
            res = builder.rename_last(
                Tensor(_leaf(t[9], values, new), t[2], t[3], t[4], t[5]), t[6], t[7]
            )
            values[t[8]] = res.ref
        elif kind == "effect":
            builder.effect(t[1], [_leaf(p, values, new) for p in t[5]], _attrs(t[6], r), t[4])
        elif kind == "open":
            opened.append(
                builder.open_call(
                    t[1],
                    t[2],
                    _leaf(t[7], values, new),
                    t[4],
                    None,
                    iteration=r.iteration(t[5], t[6]),
                    repeated=_leaf(t[8], values, new),
                )
            )
        else:
            call = opened.pop()
            if call is not None:
                call.attributes = _attrs(t[2], r)  # a new dict: renames edit its results
            builder.close_call(call)


def compile_records(
    records: list[Record], element: str, states: Any, loc: Callable[[Span | None], str]
) -> list[Record]:
    """The template's records with what every replay would compute again computed once.

    Emit records gain the concrete type, the location, the attributes' CSE key (None when the
    step reads a state: never shared; renaming keeps that, since an element's states are
    renamed to the same element's states; ``loc`` is the builder's), a plan for each operand and one for the
    attributes. Renames, effects, calls gain plans for their names, operands and attributes.
    """
    out = []
    for t in records:
        kind = t[0]
        if kind == "emit":
            vtype = ValueType(tuple(_concrete(d) for d in t[3]), t[4])
            shared = not any(o[1:] in states for o in t[2] if o.startswith("@"))
            plan = _attrs_plan(t[5], element)
            t = (
                *t,
                vtype,
                loc(t[7]),
                attrs_key(t[5]) if shared else None,
                [_leaf_plan(o, element) for o in t[2]],
                None
                if plan is not None and not plan[0] and all(k == "c" for _, k, _ in plan[1])
                else plan,
            )
        elif kind == "rename":
            t = (*t, _leaf_plan(t[1], element))
        elif kind == "effect":
            t = (*t, [_leaf_plan(o, element) for o in t[2]], _attrs_plan(t[3], element))
        elif kind == "open":
            t = (*t, _leaf_plan(t[3], element), _leaf_plan(t[6], element))
        else:
            t = (*t, _attrs_plan(t[1], element))
        out.append(t)
    return out


def _leaf_plan(s: Any, element: str) -> tuple:
    """How the renaming changes one string: (0, name) a value, looked up; (1, "@" or "",
    rest) a path under the template element, ``rest`` after it; (2, s) not at all."""
    if isinstance(s, str):
        if s[:1] == "%":
            return (0, s)
        at = "@" if s[:1] == "@" else ""
        path = s[len(at) :]
        if path == element or path.startswith(element + "."):
            return (1, at, path[len(element) :])
    return (2, s)


def _leaf(plan: tuple, values: dict[str, str], new: str) -> Any:
    kind = plan[0]
    if kind == 0:
        return values.get(plan[1], plan[1])
    if kind == 1:
        return plan[1] + new + plan[2]
    return plan[1]


def _attrs_plan(attrs: dict[str, Any], element: str) -> tuple[bool, list[tuple]]:
    """(whether any string is renamed, one plan a key): ("c", v) kept, ("s", leaf) a renamed
    string, ("l", leaves) a list of scalars and strings, copied, ("g", v) anything else,
    renamed (and copied) by :meth:`Renaming.attrs`."""
    renamed = False
    plan: list[tuple] = []
    for key, v in attrs.items():
        if isinstance(v, str):
            leaf = _leaf_plan(v, element)
            if leaf[0] == 2:
                plan.append((key, "c", v))
            else:
                renamed = True
                plan.append((key, "s", leaf))
        elif isinstance(v, list) and not any(isinstance(x, list | dict) for x in v):
            leaves = [_leaf_plan(x, element) for x in v]
            renamed = renamed or any(leaf[0] != 2 for leaf in leaves)
            plan.append((key, "l", leaves))
        elif isinstance(v, list | dict):
            renamed = True  # not worth a plan: rare; Renaming.attrs handles any nesting
            plan.append((key, "g", v))
        else:
            plan.append((key, "c", v))
    return renamed, plan


def _attrs(plan: tuple[bool, list[tuple]], r: Renaming) -> dict[str, Any]:
    values, new = r.values, r.new
    out: dict[str, Any] = {}
    for key, kind, v in plan[1]:
        if kind == "c":
            out[key] = v
        elif kind == "s":
            out[key] = _leaf(v, values, new)
        elif kind == "l":
            out[key] = [_leaf(x, values, new) for x in v]
        else:
            out[key] = r.attrs(v)
    return out
