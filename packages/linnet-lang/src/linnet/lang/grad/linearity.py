"""Whether a grad clause is linear in its incoming gradients (issue 46, item 4).

Generated JAX differentiates a Pallas kernel launch through a ``jax.custom_jvp`` whose
tangent is the JVP of the op's body, or, for an op with a ``grad`` clause, the *transpose*
of the clause (emit/pallas.py's ``kernel_jvp``): JAX's reverse mode transposes that back, so
``jax.grad`` gets exactly the clause's gradient and forward mode gets its transpose. Only a
map that is linear in the incoming gradients has a transpose: ``jax.linear_transpose`` drops
a term that does not depend on them without a word (``dy * 0.0 + 7.0`` would give zeros),
and fails with a bare error on a product of two of them. So the emitter asks this module
first, and a clause that is not linear is a coded error (E0561) when the launch is
differentiated, never a silently different gradient.

Every value of the clause's steps gets a :data:`Kind`: ``zero`` (a constant 0), ``const``
(computed from the op's arguments and constants alone), ``linear`` (a linear function of
the incoming gradients) or ``nonlinear``; one rule per primitive (:data:`LINEARITY_RULES`)
says what its result is. Each returned gradient of a floating-point parameter must be
``linear`` or ``zero``.

>>> from linnet.lang.ir.graph import Step
>>> steps = [Step("constant", [], ["%c"], {"value": 7.0, "dtype": "f32"}),
...          Step("mul", ["%dy", "%x"], ["%a"]), Step("add", ["%a", "%c"], ["%b"])]
>>> nonlinear_gradients(steps, ["%dy"], ["%a", "%b"])
[(1, 'adds a term that does not depend on the incoming gradients (`add`)')]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from linnet.lang.ir.elementwise import SPELLINGS
from linnet.lang.ir.graph import Step
from linnet.lang.ir.primitives import PRIMITIVES

# What a value is, as a function of the incoming gradients.
ZERO, CONST, LINEAR, NONLINEAR = "zero", "const", "linear", "nonlinear"
Kind = str
# A rule: the step and its operands' kinds -> the result's kind, and why it is nonlinear
# (the first cause found; None when it is not).
Rule = Callable[[Step, list[Kind]], tuple[Kind, str | None]]


def _where(step: Step) -> str:
    return f"`{step.op}`" + (f" at {step.loc.split('|')[-1]}" if step.loc else "")


def _unchanged(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    """Elements kept, moved, converted or summed: the operand's kind (the first operand's;
    a gather's indices must not depend on the incoming gradients)."""
    if any(k in (LINEAR, NONLINEAR) for k in kinds[1:]):
        return (
            NONLINEAR,
            f"indexes with a value computed from the incoming gradients ({_where(step)})",
        )
    return kinds[0], None


def _convert(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    if kinds[0] == LINEAR and not str(step.attributes.get("dtype", "f")).startswith(("f", "bf")):
        return NONLINEAR, f"converts a gradient to {step.attributes['dtype']} ({_where(step)})"
    return kinds[0], None


def _nonlinear_in_any(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    """A function that is linear in none of its operands (exp, max, a comparison, ...)."""
    if LINEAR in kinds:
        return NONLINEAR, f"applies `{step.op}` to a gradient ({_where(step)})"
    return (CONST, None)


def _add(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    """x + y, x - y: linear where each term is linear or zero."""
    if LINEAR in kinds and CONST in kinds:
        return (
            NONLINEAR,
            f"adds a term that does not depend on the incoming gradients ({_where(step)})",
        )
    if LINEAR in kinds:
        return LINEAR, None
    return (ZERO, None) if all(k == ZERO for k in kinds) else (CONST, None)


def _product(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    """x * y and contractions: linear where one factor is linear and the other is not."""
    if ZERO in kinds:
        return ZERO, None
    if kinds.count(LINEAR) > 1:
        return (
            NONLINEAR,
            f"multiplies two values computed from the incoming gradients ({_where(step)})",
        )
    return (LINEAR, None) if LINEAR in kinds else (CONST, None)


def _div(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    if kinds[1] == LINEAR:
        return (
            NONLINEAR,
            f"divides by a value computed from the incoming gradients ({_where(step)})",
        )
    return kinds[0], None


def _select(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    cond, a, b = kinds
    if cond == LINEAR:
        return (
            NONLINEAR,
            f"selects on a value computed from the incoming gradients ({_where(step)})",
        )
    if LINEAR in (a, b) and CONST in (a, b):
        return (
            NONLINEAR,
            f"selects between a gradient and a value that does not depend on "
            f"the incoming gradients ({_where(step)})",
        )
    if LINEAR in (a, b):
        return LINEAR, None
    return (ZERO, None) if a == b == ZERO else (CONST, None)


def _reduce(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    if step.attributes.get("kind") in ("sum", "mean"):
        return kinds[0], None
    return _nonlinear_in_any(step, kinds)


def _scatter_add(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    """A copy of x with values added: linear as x + values is, with constant positions."""
    if any(k in (LINEAR, NONLINEAR) for k in kinds[2:]):
        return _unchanged(step, [ZERO, *kinds[2:]])
    return _add(step, kinds[:2])


def _constant(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    return (ZERO if step.attributes.get("value") in (0, 0.0) else CONST), None


def _neg(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    return kinds[0], None


def _all_reduce(step: Step, kinds: list[Kind]) -> tuple[Kind, str | None]:
    return _reduce(step, kinds)


LINEARITY_RULES: dict[str, Rule] = {
    "neg": _neg,
    "add": _add,
    "sub": _add,
    "mul": _product,
    "contract": _product,
    "div": _div,
    "select": _select,
    "convert": _convert,
    "reduce": _reduce,
    "constant": _constant,
    "iota": lambda s, k: (CONST, None),
    "reshape": _unchanged,
    "transpose": _unchanged,
    "broadcast": _unchanged,
    "slice": _unchanged,
    "take": _unchanged,
    "gather": _unchanged,
    "scatter_add": _scatter_add,
    "all_gather": _unchanged,
    "all_reduce": _all_reduce,
    # A state write makes no value: whatever it stores, the gradients are what they are.
    "scatter": lambda s, k: (CONST, None),
    "rem": _nonlinear_in_any,
    # A gradient's bits read as another type: no linear function of it, as floor is not.
    "bitcast": _nonlinear_in_any,
} | {name: _nonlinear_in_any for name, row in SPELLINGS.items() if not row.linear}
"""Written here for the primitives that are linear in an operand (the rows of
:data:`linnet.lang.ir.elementwise.SPELLINGS` say ``linear``) and those outside that table;
the rest of elementwise math is nonlinear in every operand."""
EXPECTED_MISSING: frozenset[str] = frozenset()
assert set(LINEARITY_RULES) == set(PRIMITIVES)


def kinds_of(
    steps: Sequence[Step], incoming: Sequence[str]
) -> tuple[dict[str, Kind], dict[str, str]]:
    """Each value's :data:`Kind` after ``steps`` (values they do not make, other than the
    ``incoming`` gradients, are the op's arguments: ``const``), and for each nonlinear one
    the reason it is.

    >>> kinds_of([Step("mul", ["%dy", "%dy"], ["%s"])], ["%dy"])[0]["%s"]
    'nonlinear'
    """
    kinds: dict[str, Kind] = {ref: LINEAR for ref in incoming}
    why: dict[str, str] = {}
    for step in steps:
        operands = [kinds.get(o, CONST) for o in step.operands]
        bad = [why[o] for o in step.operands if o in why]
        if NONLINEAR in operands:
            kind, reason = NONLINEAR, bad[0] if bad else None
        else:
            kind, reason = LINEARITY_RULES[step.op](step, operands)
        for r in step.results:
            kinds[r] = kind
            if kind == NONLINEAR and reason:
                why[r] = reason
    return kinds, why


def nonlinear_gradients(
    steps: Sequence[Step],
    incoming: Sequence[str],
    returned: Sequence[str],
    checked: Sequence[bool] | None = None,
) -> list[tuple[int, str]]:
    """``(index, why)`` for each returned gradient (``checked[index]`` true: the gradients
    of floating-point parameters) that is not linear in the ``incoming`` gradients; empty
    when the clause is linear. A gradient that does not depend on them at all, other than
    zeros, is not linear either (a constant gradient is a sum with a constant term)."""
    kinds, why = kinds_of(steps, incoming)
    out = []
    for i, ref in enumerate(returned):
        if checked is not None and not checked[i]:
            continue
        kind = kinds.get(ref, CONST)
        if kind == NONLINEAR:
            out.append((i, why.get(ref, "is not linear in the incoming gradients")))
        elif kind == CONST:
            out.append((i, "does not depend on the incoming gradients (a constant gradient)"))
    return out


__all__ = [
    "CONST",
    "LINEAR",
    "LINEARITY_RULES",
    "NONLINEAR",
    "ZERO",
    "kinds_of",
    "nonlinear_gradients",
]
