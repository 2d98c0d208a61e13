"""The primitives a graph's steps call: the single table every emitter and interpreter keys on.

Each row is a :class:`Primitive`: its name, its :class:`Category`, its operand count, and
what it is as data (the source operator or builtin function that lowers to it, whether it
compares, is logical, accepts integers, passes a gradient). The sets the checker used to
keep by hand beside the table (:data:`COMPARISON_PRIMITIVES`, :data:`UNARY_FUNCTIONS`, ...)
are derived from the rows, so adding a primitive is adding one row here and one rule to each
per-primitive table (typing, folding, emitters, the interpreter, the test reference);
``tests/test_coverage.py`` walks every table against :data:`PRIMITIVES` and fails when a rule
is missing, names no primitive, or a table's ``EXPECTED_MISSING`` is stale.
docs/graph-format.md describes each primitive's semantics.

>>> PRIMITIVES["lt"].category, PRIMITIVES["lt"].comparison, PRIMITIVES["lt"].operator
(<Category.ELEMENTWISE: 'elementwise'>, True, '<')
>>> sorted(LOGICAL_PRIMITIVES)
['and', 'not', 'or']
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Category(StrEnum):
    """What kind of step a primitive makes (a string enum: ``Category.SHAPE == "shape"``)."""

    ELEMENTWISE = "elementwise"  # numpy broadcasting between operands of equal rank
    CONSTANT = "constant"  # no operands: a value known when lowering
    SHAPE = "shape"  # the same elements, rearranged
    REDUCE = "reduce"  # reductions and contractions
    GATHER = "gather"  # reads at computed positions
    STATE = "state"  # writes a state in place (no result)
    COLLECTIVE = "collective"  # communicates between the ranks of tensor parallelism


@dataclass(frozen=True)
class Primitive:
    """One row of :data:`PRIMITIVES`.

    ``arity``: the operand count (None: variable, at least ``min_arity``). ``operator``: the
    binary source operator that lowers to it (``"+"``); ``function``: the builtin function a
    model calls for it (``"max"`` for ``maximum``). ``comparison`` and ``logical`` results are
    bool; ``ints``: integer operands are allowed (elementwise math on floats only otherwise);
    ``differentiable``: a gradient flows through it to its value operands.

    >>> PRIMITIVES["maximum"].function, PRIMITIVES["scatter"].results
    ('max', 0)
    """

    name: str
    category: Category
    arity: int | None
    doc: str
    operator: str = ""
    function: str = ""
    comparison: bool = False
    logical: bool = False
    ints: bool = True
    differentiable: bool = False
    min_arity: int = 0
    tiles: bool | None = None

    @property
    def on_tiles(self) -> bool:
        """Whether a kernel's tile graph may hold it (``linnet.lang.ir.tiles.TILE_PRIMITIVES``):
        ``tiles`` where the row says, else by category. A tile is never gathered from or
        into (E0526), never a state written in place (kernels ``store``), never communicated
        between ranks (a tile program runs on one device).

        >>> PRIMITIVES["exp"].on_tiles, PRIMITIVES["take"].on_tiles, PRIMITIVES["slice"].on_tiles
        (True, False, False)
        """
        if self.tiles is not None:
            return self.tiles
        return self.category not in (Category.GATHER, Category.STATE, Category.COLLECTIVE)

    @property
    def results(self) -> int:
        """How many results a step of this primitive makes (a state write makes none)."""
        return 0 if self.category is Category.STATE else 1

    @property
    def bool_result(self) -> bool:
        """Whether the result is bool whatever the operands' dtype."""
        return self.comparison or self.logical


E, C, S, R, G = (
    Category.ELEMENTWISE,
    Category.CONSTANT,
    Category.SHAPE,
    Category.REDUCE,
    Category.GATHER,
)
_P = Primitive


def _math(name: str, doc: str, ints: bool = False, differentiable: bool = True) -> Primitive:
    """A unary builtin function of the language (``exp(x)``), elementwise."""
    return _P(
        name, Category.ELEMENTWISE, 1, doc, function=name, ints=ints, differentiable=differentiable
    )


def _compare(name: str, operator: str, doc: str) -> Primitive:
    return _P(name, Category.ELEMENTWISE, 2, doc, operator=operator, comparison=True)


_TABLE: list[Primitive] = [
    _P("neg", E, 1, "-x", differentiable=True),
    _P("not", E, 1, "logical not of a bool tensor", logical=True),
    _math("exp", "e**x"),
    _math("log", "natural logarithm"),
    _math("sqrt", "square root"),
    _math("rsqrt", "1 / sqrt(x)"),
    _math("sin", "sine"),
    _math("cos", "cosine"),
    _math("tanh", "hyperbolic tangent"),
    _math("sigmoid", "1 / (1 + exp(-x))"),
    _math("erf", "error function"),
    _math("abs", "absolute value", ints=True),
    # The gradient of floor is zero wherever it exists: nothing flows through it.
    _math("floor", "round toward -inf (floats)", ints=True, differentiable=False),
    _P("add", E, 2, "x + y", operator="+", differentiable=True),
    _P("sub", E, 2, "x - y", operator="-", differentiable=True),
    _P("mul", E, 2, "x * y", operator="*", differentiable=True),
    _P(
        "div",
        E,
        2,
        "x / y; for integers, division rounding toward -inf",
        operator="/",
        differentiable=True,
    ),
    _P(
        "rem",
        E,
        2,
        "x % y, with the sign of y (Python's and torch's remainder)",
        operator="%",
        differentiable=True,
    ),
    _P("pow", E, 2, "x ** y", function="pow", differentiable=True),
    _P("maximum", E, 2, "larger of x and y", function="max", differentiable=True),
    _P("minimum", E, 2, "smaller of x and y", function="min", differentiable=True),
    _compare("lt", "<", "x < y (bool)"),
    _compare("le", "<=", "x <= y (bool)"),
    _compare("gt", ">", "x > y (bool)"),
    _compare("ge", ">=", "x >= y (bool)"),
    _compare("eq", "==", "x == y (bool)"),
    _compare("ne", "!=", "x != y (bool)"),
    _P("and", E, 2, "logical and", operator="&&", logical=True),
    _P("or", E, 2, "logical or", operator="||", logical=True),
    _P("select", E, 3, "where(cond, x, y)", differentiable=True),
    _P("convert", E, 1, "change element type to attributes.dtype", differentiable=True),
    # The same bits read as another element type of the same width: no gradient flows
    # through a reinterpretation (the derivative of a float's bits as an integer is no number).
    _P("bitcast", E, 1, "the same bits read as element type attributes.dtype (same width)"),
    # constants
    _P("constant", C, 0, "a rank-0 tensor: attributes.value, attributes.dtype"),
    _P("iota", C, 0, "0..shape[axis]-1 along attributes.axis, shape attributes.shape"),
    # shapes
    _P("reshape", S, 1, "same elements, row-major, new attributes.shape", differentiable=True),
    _P(
        "transpose",
        S,
        1,
        "axes permuted: result axis i is operand axis perm[i]",
        differentiable=True,
    ),
    _P("broadcast", S, 1, "size-1 axes repeated up to attributes.shape", differentiable=True),
    # A static range of every axis (issue 19: fused weights split by `w[0..Q, ..]`): elements
    # kept, not moved, so it is a shape step; no position is computed, so nothing is gathered.
    _P(
        "slice",
        S,
        1,
        "operand[starts[0]:limits[0], ...]: along each axis i the elements "
        "attributes.starts[i] <= k < attributes.limits[i] (0 <= start <= limit "
        "<= size)",
        differentiable=True,
        # A tile cannot be sliced (E0526): a kernel loads the part it needs.
        tiles=False,
    ),
    # reductions and contractions
    _P(
        "reduce",
        R,
        1,
        "attributes.kind (sum|max|min|prod|mean) over attributes.axes, "
        "accumulated in attributes.accumulate from attributes.identity",
        differentiable=True,
    ),
    _P(
        "contract",
        R,
        2,
        "einsum(attributes.spec) accumulated in attributes.accumulate",
        differentiable=True,
    ),
    # gathers and state writes
    _P(
        "take",
        G,
        2,
        "numpy.take(operand, index, axis=attributes.axis): the axis is replaced "
        "by the index tensor's axes; attributes.bounds as for gather",
        differentiable=True,
    ),
    _P(
        "gather",
        G,
        None,
        "operand[i0, ..., ik-1, :, ...]: advanced indexing of the first k "
        "axes by broadcast integer tensors; attributes.bounds says what "
        "an index outside the axis reads (zero | unchecked)",
        differentiable=True,
        min_arity=1,
    ),
    # Issue 18: the transpose of take, gather and broadcast in reverse mode (linnet.lang.grad).
    _P(
        "scatter_add",
        G,
        None,
        "a copy of operand with value added at [i0, ..., ik-1, :, ...]: "
        "operands (x, value, i0, ..., ik-1), positions broadcast as for "
        "gather; coinciding positions add up; attributes.bounds zero "
        "drops positions outside the axes",
        differentiable=True,
        min_arity=2,
    ),
    _P(
        "scatter",
        Category.STATE,
        None,
        "state[i0, ..., ik-1, :, ...] = value, in place; operands (@state, value, i0, ..., ik-1)",
        min_arity=2,
    ),
    # Issue 21: tensor parallelism (linnet.lang.passes.shard) over torch.distributed. Each rank
    # holds its own value; attributes.world is the number of ranks.
    _P(
        "all_reduce",
        Category.COLLECTIVE,
        1,
        "every rank's operand combined by "
        "attributes.kind (sum|max|min), the same result "
        "on every rank",
    ),
    _P(
        "all_gather",
        Category.COLLECTIVE,
        1,
        "the ranks' operands concatenated in rank order "
        "along attributes.axis, the same result on every "
        "rank",
    ),
]


PRIMITIVES: dict[str, Primitive] = {p.name: p for p in _TABLE}

# Derived from the rows (kept importable under the names the checker has always used).
UNARY_FUNCTIONS = {p.name for p in _TABLE if p.function and p.arity == 1}
BINARY_FUNCTIONS = {p.function: p.name for p in _TABLE if p.function and p.arity == 2}
BINARY_OPERATORS = {p.operator: p.name for p in _TABLE if p.operator and p.arity == 2}
COMPARISON_PRIMITIVES = {p.name for p in _TABLE if p.comparison}
LOGICAL_PRIMITIVES = {p.name for p in _TABLE if p.logical}
DIFFERENTIABLE_PRIMITIVES = frozenset(p.name for p in _TABLE if p.differentiable)


def in_category(category: Category | str) -> frozenset[str]:
    """The names of the primitives of one category.

    >>> sorted(in_category("shape"))
    ['broadcast', 'reshape', 'slice', 'transpose']
    """
    return frozenset(p.name for p in _TABLE if p.category == category)


REDUCTION_IDENTITIES = {
    "sum": 0.0,
    "mean": 0.0,
    "prod": 1.0,
    "max": float("-inf"),
    "min": float("inf"),
}
