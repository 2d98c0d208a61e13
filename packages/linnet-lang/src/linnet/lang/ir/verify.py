"""The graph verifier: what every graph that lowering or a pass makes must satisfy.

:func:`verify` checks a :class:`~linnet.lang.ir.graph.Graph`'s invariants, the ones every
emitter, interpreter and backend relies on, and raises a coded internal error (E0920-E0926, E0685)
naming the step or call that breaks one:

* E0920: every operand is an entry input or made by an earlier step (SSA order), and every
  entry output is made;
* E0921: every value is made once (by one step, or as an entry input);
* E0922: call spans lie inside the steps and nest (two calls are disjoint, or one holds
  the other);
* E0923: only a scatter writes a state, and a scatter writes a state (not a parameter or
  a value);
* E0924: every step's op is a primitive of :data:`~linnet.lang.ir.primitives.PRIMITIVES`;
* E0925: every step has its primitive's operand and result count;
* E0926: every value, parameter and state has a type (a known dtype, a shape of sizes
  >= 0), and every ``@path`` names a parameter or a state;
* E0685: every step's result type is the one its primitive's rule in
  :data:`~linnet.lang.ir.shapes.SHAPE_RULES` derives from its operands and attributes (a
  slice's ranges inside its operand, a transpose's perm of its rank, ...).

Lowering runs it after lowering and after every pass when ``LINNET_DEBUG=1`` (and always
in the test suites): :func:`checked` is the switch.

>>> from linnet.lang.ir.graph import Graph, Step, ValueType
>>> g = Graph("e", "m", inputs=["%x"], outputs=["%y"],
...           values={"%x": ValueType((2,), "f32"), "%y": ValueType((2,), "f32")})
>>> g.steps = [Step("exp", ["%x"], ["%y"])]
>>> verify(g)
>>> g.steps = [Step("exp", ["%z"], ["%y"])]
>>> try:
...     verify(g)
... except LinnetError as err:
...     print(err.diagnostics[0].code)
E0920
"""

from __future__ import annotations

import os

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES, Category
from linnet.lang.ir.shapes import mismatch
from linnet.lang.tensors.dtypes import DTYPES

ALWAYS = False
"""Verify after lowering and every pass even without ``LINNET_DEBUG`` (the test suites set
it: see their conftest.py)."""


def checked() -> bool:
    """Whether lowering verifies its graphs: ``LINNET_DEBUG`` is set, or :data:`ALWAYS`.

    >>> isinstance(checked(), bool)
    True
    """
    return ALWAYS or bool(os.environ.get("LINNET_DEBUG"))


def _error(graph: Graph, stage: str, code: str, what: str) -> LinnetError:
    after = f" after {stage}" if stage else ""
    return LinnetError(
        Diagnostic(
            code,
            f"internal error: {what} (the graph of `{graph.model}.{graph.entry}` is "
            f"malformed{after})",
            help="this is a bug in linnet-lang, not in your model: please report it with the "
            "model and the command (`linnet explain " + code + "` says what was checked)",
        )
    )


def verify(graph: Graph, stage: str = "") -> None:
    """Raise a coded :class:`LinnetError` (E0920-E0926, E0685) where ``graph`` breaks an invariant
    of the graph format; ``stage`` (``"lowering"``, a pass's name) is named in the message.

    >>> # verify(lower(program, "decode", inputs, config))
    """
    _verify(graph, stage)


def _type_problem(vt: object) -> str | None:
    if not isinstance(vt, ValueType):
        return f"a {type(vt).__name__}, not a ValueType"
    if vt.dtype not in DTYPES:
        return f"dtype {vt.dtype!r} is not one of {', '.join(DTYPES)}"
    if not isinstance(vt.shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in vt.shape
    ):
        return f"shape {vt.shape!r} is not a tuple of sizes >= 0"
    return None


def _verify(graph: Graph, stage: str) -> None:
    def fail(code: str, what: str) -> LinnetError:
        return _error(graph, stage, code, what)

    for kind, table in (
        ("value", graph.values),
        ("parameter", graph.parameters),
        ("state", graph.states),
    ):
        for name, vt in table.items():
            problem = _type_problem(vt)
            if problem:
                raise fail("E0926", f"{kind} {name} has no valid type: {problem}")
    both = sorted(set(graph.parameters) & set(graph.states))
    if both:
        raise fail("E0926", f"{both[0]} is both a parameter and a state")
    defined: dict[str, int] = {}  # value -> the step that made it (-1: an entry input)
    for name in graph.inputs:
        if not isinstance(name, str) or not name.startswith("%"):
            raise fail("E0926", f"entry input {name!r} is not a value name (%name)")
        if name in defined:
            raise fail("E0921", f"entry input {name} is listed twice")
        if name not in graph.values:
            raise fail("E0926", f"entry input {name} has no type in graph.values")
        defined[name] = -1
    for i, step in enumerate(graph.steps):
        prim = PRIMITIVES.get(step.op)
        where = f"step {i} ({step.op})"
        if prim is None:
            raise fail("E0924", f"{where} is not a primitive of linnet.lang.ir.primitives")
        n = len(step.operands)
        if prim.arity is not None and n != prim.arity:
            raise fail("E0925", f"{where} has {n} operands; {step.op} takes {prim.arity}")
        if prim.arity is None and n < prim.min_arity:
            raise fail(
                "E0925", f"{where} has {n} operands; {step.op} takes at least {prim.min_arity}"
            )
        if len(step.results) != prim.results:
            raise fail(
                "E0925",
                f"{where} makes {len(step.results)} results; {step.op} makes {prim.results}",
            )
        for k, o in enumerate(step.operands):
            if not isinstance(o, str) or not o.startswith(("%", "@")):
                raise fail(
                    "E0926",
                    f"{where} has operand {o!r}: not a value (%name) or a "
                    f"parameter or state (@path)",
                )
            if o.startswith("@"):
                path = o[1:]
                if path not in graph.parameters and path not in graph.states:
                    raise fail(
                        "E0926",
                        f"{where} reads {o}, which is neither a parameter nor a state of the graph",
                    )
                if prim.category is Category.STATE and k == 0 and path not in graph.states:
                    raise fail("E0923", f"{where} writes {o}, a parameter: only states are written")
            elif o not in defined:
                later = next(
                    (j for j in range(i, len(graph.steps)) if o in graph.steps[j].results), None
                )
                made = f"step {later} makes it later" if later is not None else "no step makes it"
                raise fail("E0920", f"{where} reads {o}, which is not defined before it ({made})")
            elif prim.category is Category.STATE and k == 0:
                raise fail("E0923", f"{where} writes {o}, a value: a scatter writes a @state")
        for r in step.results:
            if not isinstance(r, str) or not r.startswith(("%", "@")):
                raise fail("E0926", f"{where} makes {r!r}: not a value name (%name)")
            if r.startswith("@"):
                raise fail(
                    "E0923", f"{where} makes {r}: only a scatter writes a state or parameter"
                )
            if r in defined:
                first = defined[r]
                by = "an entry input" if first < 0 else f"made by step {first}"
                raise fail("E0921", f"{where} makes {r}, already {by}")
            if r not in graph.values:
                raise fail("E0926", f"{where} makes {r}, which has no type in graph.values")
            defined[r] = i
        problem = _type_problem_of(graph, step)
        if problem:
            raise fail("E0685", f"{where} {problem}")
    for o in graph.outputs:
        if not isinstance(o, str):
            raise fail("E0926", f"entry output {o!r} is not a value name or a path")
        if o.startswith("@"):
            if o[1:] not in graph.parameters and o[1:] not in graph.states:
                raise fail("E0926", f"entry output {o} is neither a parameter nor a state")
        elif o not in defined:
            raise fail("E0920", f"entry output {o} is not made by any step")
    _verify_calls(graph, stage)


def _type_problem_of(graph: Graph, step: Step) -> str | None:
    """Why ``step``'s declared result type is not the one its primitive's rule
    (:data:`~linnet.lang.ir.shapes.SHAPE_RULES`) derives from its operands (None: it is)."""
    operands = []
    for o in step.operands:
        vt = (
            graph.states.get(o[1:]) or graph.parameters.get(o[1:])
            if o.startswith("@")
            else graph.values.get(o)
        )
        if vt is None:
            return None  # an undefined operand is reported by its own check
        operands.append(vt)
    return mismatch(step, operands, graph.values.get(step.results[0]) if step.results else None)


def _verify_calls(graph: Graph, stage: str) -> None:
    def fail(code: str, what: str) -> LinnetError:
        return _error(graph, stage, code, what)

    n = len(graph.steps)
    for c in graph.calls:
        if not 0 <= c.start <= c.stop <= n:
            raise fail(
                "E0922",
                f"call {c.index} ({c.callee}) spans steps {c.start}..{c.stop}, "
                f"outside the graph's {n} steps",
            )
    # Sorted by start, longest first, spans nest exactly when each one either lies inside
    # the innermost open span or starts after it ends (a stack walk, linear after the sort).
    # Empty spans (a call that made no step) nest anywhere. A span op's claim
    # (`attributes["span"]`, check/spans.py) is an overlay over the calls it claims, which may lie
    # in different functions (a layer's norm, its attention's q/k/v): it need not nest.
    spans = sorted(
        (c for c in graph.calls if c.start < c.stop and not c.attributes.get("span")),
        key=lambda c: (c.start, -c.stop, c.depth),
    )
    open_calls: list = []
    for c in spans:
        while open_calls and open_calls[-1].stop <= c.start:
            open_calls.pop()
        if open_calls and c.stop > open_calls[-1].stop:
            o = open_calls[-1]
            raise fail(
                "E0922",
                f"call {c.index} ({c.callee}, steps {c.start}..{c.stop}) "
                f"overlaps call {o.index} ({o.callee}, steps "
                f"{o.start}..{o.stop}) without nesting in it",
            )
        open_calls.append(c)
