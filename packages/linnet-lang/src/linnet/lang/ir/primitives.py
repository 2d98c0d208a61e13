"""The primitives a graph's steps call: the single table every emitter and interpreter keys on.

Adding a primitive means adding a row here and one rule to each table (emitters, the
interpreter, grad); the coverage test (``tests/test_coverage.py``) checks every table
against this one and fails when a rule is missing. docs/graph-format.md describes each primitive's semantics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Primitive:
    name: str
    category: str  # elementwise, reduce, shape, gather, state, constant
    arity: int | None  # operand count (None: variable)
    doc: str


_ROWS = [
    # elementwise, numpy broadcasting between operands of equal rank (size-1 axes broadcast)
    ("neg", "elementwise", 1, "-x"),
    ("not", "elementwise", 1, "logical not of a bool tensor"),
    ("exp", "elementwise", 1, "e**x"),
    ("log", "elementwise", 1, "natural logarithm"),
    ("sqrt", "elementwise", 1, "square root"),
    ("rsqrt", "elementwise", 1, "1 / sqrt(x)"),
    ("sin", "elementwise", 1, "sine"),
    ("cos", "elementwise", 1, "cosine"),
    ("tanh", "elementwise", 1, "hyperbolic tangent"),
    ("sigmoid", "elementwise", 1, "1 / (1 + exp(-x))"),
    ("erf", "elementwise", 1, "error function"),
    ("abs", "elementwise", 1, "absolute value"),
    ("floor", "elementwise", 1, "round toward -inf (floats)"),
    ("add", "elementwise", 2, "x + y"),
    ("sub", "elementwise", 2, "x - y"),
    ("mul", "elementwise", 2, "x * y"),
    ("div", "elementwise", 2, "x / y; for integers, division rounding toward -inf"),
    ("rem", "elementwise", 2, "x % y, with the sign of y (Python's and torch's remainder)"),
    ("pow", "elementwise", 2, "x ** y"),
    ("maximum", "elementwise", 2, "larger of x and y"),
    ("minimum", "elementwise", 2, "smaller of x and y"),
    ("lt", "elementwise", 2, "x < y (bool)"),
    ("le", "elementwise", 2, "x <= y (bool)"),
    ("gt", "elementwise", 2, "x > y (bool)"),
    ("ge", "elementwise", 2, "x >= y (bool)"),
    ("eq", "elementwise", 2, "x == y (bool)"),
    ("ne", "elementwise", 2, "x != y (bool)"),
    ("and", "elementwise", 2, "logical and"),
    ("or", "elementwise", 2, "logical or"),
    ("select", "elementwise", 3, "where(cond, x, y)"),
    ("convert", "elementwise", 1, "change element type to attributes.dtype"),
    # constants
    ("constant", "constant", 0, "a rank-0 tensor: attributes.value, attributes.dtype"),
    ("iota", "constant", 0, "0..shape[axis]-1 along attributes.axis, shape attributes.shape"),
    # shapes
    ("reshape", "shape", 1, "same elements, row-major, new attributes.shape"),
    ("transpose", "shape", 1, "axes permuted: result axis i is operand axis perm[i]"),
    ("broadcast", "shape", 1, "size-1 axes repeated up to attributes.shape"),
    # reductions and contractions
    ("reduce", "reduce", 1, "attributes.kind (sum|max|min|prod|mean) over attributes.axes, "
                            "accumulated in attributes.accumulate from attributes.identity"),
    ("contract", "reduce", 2, "einsum(attributes.spec) accumulated in attributes.accumulate"),
    # gathers and state writes
    ("take", "gather", 2, "numpy.take(operand, index, axis=attributes.axis): the axis is replaced "
                          "by the index tensor's axes; attributes.bounds as for gather"),
    ("gather", "gather", None, "operand[i0, ..., ik-1, :, ...]: advanced indexing of the first k "
                               "axes by broadcast integer tensors; attributes.bounds says what "
                               "an index outside the axis reads (zero | unchecked)"),
    ("scatter", "state", None, "state[i0, ..., ik-1, :, ...] = value, in place; operands "
                               "(@state, value, i0, ..., ik-1)"),
]

PRIMITIVES: dict[str, Primitive] = {r[0]: Primitive(*r) for r in _ROWS}

UNARY_FUNCTIONS = {"exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs",
                   "floor"}
BINARY_FUNCTIONS = {"max": "maximum", "min": "minimum", "pow": "pow"}
BINARY_OPERATORS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "rem", "<": "lt",
                    "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne", "&&": "and",
                    "||": "or"}
COMPARISON_PRIMITIVES = {"lt", "le", "gt", "ge", "eq", "ne"}
LOGICAL_PRIMITIVES = {"and", "or", "not"}

REDUCTION_IDENTITIES = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"),
                        "min": float("inf")}
