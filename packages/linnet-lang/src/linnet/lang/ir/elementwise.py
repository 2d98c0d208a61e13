"""Elementwise math spelled once per target: :data:`SPELLINGS`, one row per primitive, one
column per table that derives its rules from it.

Most rules of plain elementwise math (``exp``, ``add``, ``lt``) are one spelling per target:
``torch.exp({0})`` in generated PyTorch and the torch interpreter, ``jnp.exp({0})`` in
generated JAX, ``tl.exp({0})`` in a Triton kernel, ``Exp`` in ONNX. Each target's table reads
its column here (:func:`spelled`) and writes by hand only what a row leaves ``None``, so adding
such a primitive is its row in :mod:`linnet.lang.ir.primitives`, its row here, and its line in
docs/graph-format.md (docs/adding-a-primitive.md). The spellings are plain strings: data, so
this module sits in ``ir/`` and imports nothing above it; the emitters, the checker's folding,
the reverse pass, the torch interpreter and the test reference read them.

The columns (``{0}``, ``{1}``: the operands):

- ``torch``: a PyTorch expression (``emit/torch.py``, and linnet-runtime-torch's interpreter,
  which evaluates the same text on tensors);
- ``jax``, ``pallas``, ``triton``: expressions of generated JAX, of Pallas and of Triton
  kernels (``emit/jax.py``, ``emit/pallas.py``, ``emit/triton.py``);
- ``numpy``: a NumPy expression, the test reference (``tests/reference.py``);
- ``python``: a Python expression (``math`` imported) that folds compile-time scalars
  (``check/folding.py``); ``dims``: it also computes on symbolic dims (``N + 1``);
- ``onnx``: the ONNX operator applied to the operands (``Exp``), or a composition of
  operators (``Reciprocal(Sqrt({0}))``; numbers are constants of the result's dtype)
  (``emit/onnx_rules.py``);
- ``stablehlo``: likewise StableHLO operations (``stablehlo.exponential``,
  ``stablehlo.multiply({0}, {0})``), or a comparison's direction (``LT``)
  (``emit/stablehlo_rules.py``);
- ``derivative``: per operand, its partial derivative as an expression of ``x`` and ``y``
  (the operands) and ``out`` (the result), with ``+ - * /``, numbers, and calls of unary
  primitives (``cos(x)``): the reverse pass multiplies it by the incoming gradient
  (``grad/rules.py``); a primitive that is not differentiable gets the zero rule;
- ``linear``: the result is linear in a gradient operand (``neg``, ``add``): the grad
  clause check (``grad/linearity.py``) writes those rules; the others are nonlinear.

A column left ``None`` means that table's rule is written by hand in its module (an edge
value, a fused form) or the primitive is in that module's ``EXPECTED_MISSING``. The checker's
typing (``check/elementwise.py``) follows from the primitive's row: floats only unless
``ints``, a bool result for comparisons and logic.

>>> SPELLINGS["exp"].torch, SPELLINGS["exp"].onnx, SPELLINGS["exp"].derivative
('torch.exp({0})', 'Exp', ('out',))
>>> compiled("{0} * {1} + 1", 2, {})(2, 3)
7
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from linnet.lang.ir.primitives import PRIMITIVES, Category, Primitive, in_category

COLUMNS = ("torch", "jax", "numpy", "python", "triton", "pallas", "onnx", "stablehlo")


@dataclass(frozen=True)
class Spelling:
    """One row of :data:`SPELLINGS`: a primitive's spelling in each target (the module
    docstring says what each column holds; ``None``: written by hand there)."""

    name: str
    torch: str | None = None
    jax: str | None = None
    numpy: str | None = None
    python: str | None = None
    triton: str | None = None
    pallas: str | None = None
    onnx: str | None = None
    stablehlo: str | None = None
    derivative: tuple[str, ...] | None = None
    linear: bool = False
    dims: bool = False

    @property
    def primitive(self) -> Primitive:
        return PRIMITIVES[self.name]


def _fn(
    name: str,
    torch: str | None,
    jax: str | None,
    numpy: str | None,
    python: str | None,
    onnx: str | None,
    stablehlo: str | None,
    derivative: str | None = None,
    *,
    triton: str | None = "",
    pallas: str | None = "",
) -> Spelling:
    """A unary function; the tile kernels spell it ``tl.<name>`` and as JAX does unless
    told."""
    return Spelling(
        name,
        torch,
        jax,
        numpy,
        python,
        f"tl.{name}({{0}})" if triton == "" else triton,
        jax if pallas == "" else pallas,
        onnx,
        stablehlo,
        (derivative,) if derivative else None,
    )


def _op(
    name: str,
    operator: str,
    numpy: str,
    onnx: str | None,
    stablehlo: str,
    *,
    python: str | None = None,
    linear: bool = False,
    dims: bool = False,
    triton: str | None = "",
) -> Spelling:
    """A binary operator, written alike in every Python target (``{0} < {1}``)."""
    text = f"{{0}} {operator} {{1}}"
    return Spelling(
        name,
        text,
        text,
        f"np.{numpy}({{0}}, {{1}})",
        python or text,
        text if triton == "" else triton,
        text,
        onnx,
        stablehlo,
        linear=linear,
        dims=dims,
    )


_ROWS: list[Spelling] = [
    Spelling(
        "neg",
        "-{0}",
        "-{0}",
        None,
        "-{0}",
        "-{0}",
        "-{0}",
        "Neg",
        "stablehlo.negate",
        linear=True,
        dims=True,
    ),
    Spelling(
        "not",
        "~{0}",
        "~{0}",
        "np.logical_not({0})",
        "not {0}",
        "~{0}",
        "~{0}",
        "Not",
        "stablehlo.not",
    ),
    _fn(
        "exp",
        "torch.exp({0})",
        "jnp.exp({0})",
        "np.exp({0})",
        "math.exp({0})",
        "Exp",
        "stablehlo.exponential",
        "out",
    ),
    _fn(
        "log",
        "torch.log({0})",
        "jnp.log({0})",
        "np.log({0})",
        "math.log({0})",
        "Log",
        "stablehlo.log",
        "1.0 / x",
    ),
    # d sqrt(x) = 1 / (2 sqrt(x)), as torch: 0.5 / out
    _fn(
        "sqrt",
        "torch.sqrt({0})",
        "jnp.sqrt({0})",
        "np.sqrt({0})",
        "math.sqrt({0})",
        "Sqrt",
        "stablehlo.sqrt",
        "0.5 / out",
    ),
    # The derivative (-0.5 * out**3, its constant made last) is grad/rules.py's.
    _fn(
        "rsqrt",
        "torch.rsqrt({0})",
        "lax.rsqrt({0})",
        "1.0 / np.sqrt({0})",
        "1 / math.sqrt({0})",
        "Reciprocal(Sqrt({0}))",
        "stablehlo.rsqrt",
    ),
    _fn(
        "sin",
        "torch.sin({0})",
        "jnp.sin({0})",
        "np.sin({0})",
        "math.sin({0})",
        "Sin",
        "stablehlo.sine",
        "cos(x)",
    ),
    _fn(
        "cos",
        "torch.cos({0})",
        "jnp.cos({0})",
        "np.cos({0})",
        "math.cos({0})",
        "Cos",
        "stablehlo.cosine",
        "-sin(x)",
    ),
    # Triton: 2 sigmoid(2x) - 1 (no tl.tanh in every Triton we support).
    _fn(
        "tanh",
        "torch.tanh({0})",
        "jnp.tanh({0})",
        "np.tanh({0})",
        "math.tanh({0})",
        "Tanh",
        "stablehlo.tanh",
        "1.0 - out * out",
        triton="2 * tl.sigmoid(2 * {0}) - 1",
    ),
    _fn(
        "sigmoid",
        "torch.sigmoid({0})",
        "jax.nn.sigmoid({0})",
        "1.0 / (1.0 + np.exp(-{0}))",
        "1 / (1 + math.exp(-{0}))",
        "Sigmoid",
        "stablehlo.logistic",
        "out * (1.0 - out)",
    ),
    # NumPy has no erf (the reference sums math.erf), StableHLO has none (CHLO's or a
    # portable formula), Pallas cannot lower one: written by hand there, as its derivative.
    _fn(
        "erf",
        "torch.erf({0})",
        "jax.scipy.special.erf({0})",
        None,
        "math.erf({0})",
        "Erf",
        None,
        pallas=None,
    ),
    # The derivative (sign(x), 0 at 0, none for integers) is grad/rules.py's.
    _fn("abs", "torch.abs({0})", "jnp.abs({0})", "np.abs({0})", "abs({0})", "Abs", "stablehlo.abs"),
    # floor has edge values everywhere (an integer's floor, XLA's subnormals): by hand.
    _fn("floor", "torch.floor({0})", None, None, None, None, None, triton=None),
    _op("add", "+", "add", "Add", "stablehlo.add", linear=True, dims=True),
    _op("sub", "-", "subtract", "Sub", "stablehlo.subtract", linear=True, dims=True),
    _op("mul", "*", "multiply", "Mul", "stablehlo.multiply", linear=True, dims=True),
    # Triton: no pow in every Triton we support (emit/triton.py's EXPECTED_MISSING).
    Spelling(
        "pow",
        "torch.pow({0}, {1})",
        "jnp.power({0}, {1})",
        "np.power({0}, {1})",
        "{0} ** {1}",
        None,
        "jnp.power({0}, {1})",
        "Pow",
        "stablehlo.power",
    ),
    # NaN propagates: folding, torch (clamp against a literal), and kernels by hand.
    Spelling(
        "maximum",
        None,
        "jnp.maximum({0}, {1})",
        "np.maximum({0}, {1})",
        None,
        None,
        None,
        "Max",
        "stablehlo.maximum",
    ),
    Spelling(
        "minimum",
        None,
        "jnp.minimum({0}, {1})",
        "np.minimum({0}, {1})",
        None,
        None,
        None,
        "Min",
        "stablehlo.minimum",
    ),
    _op("lt", "<", "less", "Less", "LT"),
    _op("le", "<=", "less_equal", "LessOrEqual", "LE"),
    _op("gt", ">", "greater", "Greater", "GT"),
    _op("ge", ">=", "greater_equal", "GreaterOrEqual", "GE"),
    _op("eq", "==", "equal", "Equal", "EQ"),
    _op("ne", "!=", "not_equal", None, "NE"),  # ONNX: Not of Equal
    # Triton: a scalar bool operand is splat through int8 (emit/triton.py's _logical).
    _op("and", "&", "logical_and", "And", "stablehlo.and", python="bool({0} and {1})", triton=None),
    _op("or", "|", "logical_or", "Or", "stablehlo.or", python="bool({0} or {1})", triton=None),
]

SPELLINGS: dict[str, Spelling] = {row.name: row for row in _ROWS}
"""One row per elementwise math primitive (``tests/test_coverage.py`` checks that every
elementwise primitive has one, but those in :data:`EXPECTED_MISSING`)."""

# Elementwise primitives whose rules are written by hand in every table: `/` and `%` have
# integer edge values (a / 0 is 0, a % 0 is a: linnet.lang.ir.edges), `select` takes a bool
# condition beside its operands, `convert` and `bitcast` take their result's dtype as an
# attribute. Every other primitive is not elementwise math.
EXPECTED_MISSING: frozenset[str] = frozenset(
    {"div", "rem", "select", "convert", "bitcast"}
    | (set(PRIMITIVES) - in_category(Category.ELEMENTWISE))
)

R = TypeVar("R")


def spelled(
    column: str, make: Callable[[str, Primitive], R], by_hand: dict[str, R] | None = None
) -> dict[str, R]:
    """A target's rules: ``make(spelling, primitive)`` for each row that spells ``column``,
    and the rules ``by_hand`` for the rest. A rule by hand for a primitive the column spells
    is an error (two rules, one of them silently unused).

    >>> rules = spelled("onnx", lambda op, p: op, {"ne": "by hand"})
    >>> rules["exp"], rules["ne"], "floor" in rules
    ('Exp', 'by hand', False)
    """
    if column not in COLUMNS:
        raise ValueError(f"no column {column!r} in linnet.lang.ir.elementwise.SPELLINGS")
    rules = {
        row.name: make(text, row.primitive)
        for row in _ROWS
        if (text := getattr(row, column)) is not None
    }
    both = sorted(set(rules) & set(by_hand or {}))
    if both:
        raise ValueError(
            f"{column}: {', '.join(both)} spelled in linnet.lang.ir.elementwise "
            "and written by hand too: set the spelling to None, or drop the rule"
        )
    return rules | (by_hand or {})


def by_arity(
    unary: Callable[[str], R], binary: Callable[[str], R]
) -> Callable[[str, Primitive], R]:
    """A ``make`` for :func:`spelled` from a target's unary and binary rule makers.

    >>> spelled("jax", by_arity(lambda f: ("1", f), lambda f: ("2", f)))["add"]
    ('2', '{0} + {1}')
    """
    return lambda text, p: unary(text) if p.arity == 1 else binary(text)


_OPERANDS = ("x", "y", "z")


def compiled(spelling: str, arity: int, namespace: dict[str, Any]) -> Callable[..., Any]:
    """A Python function of ``arity`` operands that evaluates ``spelling`` with the names of
    ``namespace`` (``{"np": numpy}``): the interpreters run the text the emitters write (the
    module docstring shows one)."""
    names = _OPERANDS[:arity]
    # The text is this module's own spelling, never user input.
    return eval(f"lambda {', '.join(names)}: {spelling.format(*names)}", dict(namespace))


# ---------------------------------------------------------------- derivative formulas
Formula = tuple[Any, ...]
"""A parsed derivative: ``("ref", name)``, ``("const", value)``, ``("neg", f)``,
``("call", primitive, [f, ...])`` or ``("bin", primitive, f, g)``."""

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}


def formula(text: str, calls: str = "primitives") -> Formula:
    """A derivative of the ``derivative`` column (``calls="primitives"``: calls of
    primitives) or a composition of the ``onnx`` and ``stablehlo`` columns (``calls="ops"``:
    calls of any operator, ``Mul({0}, {0})``, ``{0}`` and ``{1}`` given as ``x`` and ``y``)
    as a tree a rule builds from, operands left to right. Anything else than operand names
    (``x``, ``y``, ``out``), numbers, ``+ - * /`` (derivatives only), negation of a number and
    calls is a ValueError.

    >>> formula("1.0 - out * out")
    ('bin', 'sub', ('const', 1.0), ('bin', 'mul', ('ref', 'out'), ('ref', 'out')))
    >>> formula("-sin(x)")
    ('neg', ('call', 'sin', [('ref', 'x')]))
    >>> formula("stablehlo.multiply(x, 2)", calls="ops")
    ('call', 'stablehlo.multiply', [('ref', 'x'), ('const', 2.0)])
    """
    ops = calls == "ops"

    def name(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute) and ops:
            base = name(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def walk(node: ast.AST) -> Formula:
        if isinstance(node, ast.Name) and node.id in (("x", "y") if ops else ("x", "y", "out")):
            return ("ref", node.id)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return ("const", float(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            if inner[0] == "const":
                return ("const", -inner[1])
            if not ops:
                return ("neg", inner)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS and not ops:
            return ("bin", _BINOPS[type(node.op)], walk(node.left), walk(node.right))
        if (
            isinstance(node, ast.Call)
            and not node.keywords
            and (f := name(node.func))
            and (ops or (f in PRIMITIVES and PRIMITIVES[f].arity == len(node.args)))
        ):
            return ("call", f, [walk(a) for a in node.args])
        raise ValueError(
            f"{text!r}: cannot build {ast.unparse(node)!r} ("
            + (
                "operands {0} and {1}, numbers and calls of operators"
                if ops
                else "operands x, y, out, numbers, + - * /, and calls of primitives"
            )
            + ")"
        )

    try:
        tree = ast.parse(text.format("x", "y") if ops else text, mode="eval")
    except (SyntaxError, IndexError) as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    out = walk(tree.body)
    if ops and out[0] != "call":
        raise ValueError(f"{text!r}: a composition is a call of an operator")
    return out


def composed(text: str) -> Formula | None:
    """The tree of an ``onnx`` or ``stablehlo`` spelling that is a composition
    (``Reciprocal(Sqrt({0}))``), or None for a bare operator applied to the operands.

    >>> composed("Exp"), composed("Reciprocal(Sqrt({0}))")
    (None, ('call', 'Reciprocal', [('call', 'Sqrt', [('ref', 'x')])]))
    """
    if "(" in text:
        return formula(text, calls="ops")
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*", text):
        raise ValueError(f"{text!r}: neither an operator's name nor a composition of operators")
    return None


def _check_rows() -> None:
    """Each row names an elementwise primitive, has one derivative per operand where it has
    one, each derivative and each ONNX and StableHLO spelling parses, and no composition
    computes a bool result (a typo is an import error, not a wrong rule or gradient)."""
    names = [row.name for row in _ROWS]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # the dict would keep the last row alone
        raise ValueError(f"linnet.lang.ir.elementwise: two rows for {', '.join(twice)}")
    for row in _ROWS:
        p = PRIMITIVES.get(row.name)
        if p is None or p.category is not Category.ELEMENTWISE:
            raise ValueError(
                f"linnet.lang.ir.elementwise: {row.name!r} is no elementwise primitive"
            )
        if row.derivative is not None:
            if not p.differentiable or len(row.derivative) != p.arity:
                raise ValueError(
                    f"linnet.lang.ir.elementwise: {row.name!r} needs one "
                    "derivative per operand, and only if it is differentiable"
                )
            for d in row.derivative:
                formula(d)
        for text in (row.onnx, row.stablehlo):
            # A composition computes in the result's dtype: arithmetic, not a comparison.
            if text is not None and composed(text) is not None and p.bool_result:
                raise ValueError(
                    f"linnet.lang.ir.elementwise: {row.name!r} gives bool: spell "
                    "it as one operator, or write its rule by hand"
                )


_check_rows()

__all__ = [
    "COLUMNS",
    "EXPECTED_MISSING",
    "SPELLINGS",
    "Spelling",
    "by_arity",
    "compiled",
    "composed",
    "formula",
    "spelled",
]
