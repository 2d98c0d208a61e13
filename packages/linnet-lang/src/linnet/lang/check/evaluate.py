"""One abstract interpreter over the syntax tree, used twice.

* The checker runs it on generic code: dims are symbols (`R`, `H * HD`), calls are checked
  against the callee's signature, and nothing is recorded.
* Lowering runs it on concrete shapes: calls are inlined, and every primitive it meets is
  appended to a :class:`~linnet.lang.ir.graph.Graph`.

Index notation (`let y[r, c] = ...`) is evaluated over *labelled* tensors: each axis carries the
index variable it ranges over, in the statement's canonical order (the left-hand side's
variables, then reduction variables). Elementwise operations align labels and broadcast;
`sum[k] a[..k..] * b[..k..]` over two plain reads becomes one `contract` (an einsum).
"""

from __future__ import annotations

# Re-exported: the driver and tests import these from here.
import difflib  # noqa: F401  (tests count its did-you-means)

from linnet.lang.check.binders import Binders
from linnet.lang.check.calls import Calls, call_cycles, recursion_error
from linnet.lang.check.core import (
    BUILTINS,
    KERNEL_BUILTINS,
    MAX_DEPTH,
    MAX_SUGGESTIONS,
    NEGATIVE_HELP,
    OPERATOR_SYMBOLS,
    EvaluatorBase,
    Fail,
    Frame,
    IndexVar,
    dim_str,
    fail,
    index_count,
    is_pow2,
    shape_str,
    type_str,
)
from linnet.lang.check.elementwise import Typing
from linnet.lang.check.expressions import Expressions
from linnet.lang.check.folding import Folding
from linnet.lang.check.generics import Generics
from linnet.lang.check.hints import Hints
from linnet.lang.check.indexing import Indexing
from linnet.lang.check.kernels import Kernels
from linnet.lang.check.names import Names
from linnet.lang.check.reductions import Reductions
from linnet.lang.check.statements import Statements
from linnet.lang.syntax.walk import leaves, mentions, product_factors, walk

__all__ = [
    "BUILTINS",
    "KERNEL_BUILTINS",
    "MAX_DEPTH",
    "MAX_SUGGESTIONS",
    "NEGATIVE_HELP",
    "OPERATOR_SYMBOLS",
    "Evaluator",
    "EvaluatorBase",
    "Fail",
    "Frame",
    "IndexVar",
    "call_cycles",
    "dim_str",
    "fail",
    "index_count",
    "is_pow2",
    "leaves",
    "mentions",
    "product_factors",
    "recursion_error",
    "shape_str",
    "type_str",
    "walk",
]


class Evaluator(
    Names,
    Statements,
    Expressions,
    Typing,
    Folding,
    Indexing,
    Reductions,
    Binders,
    Calls,
    Generics,
    Kernels,
    Hints,
):
    """The abstract interpreter: one mixin per idea, over the state of
    :class:`~linnet.lang.check.core.EvaluatorBase`.

    >>> from linnet.lang.ir.builder import Builder
    >>> from linnet.lang.syntax.program import Program
    >>> ev = Evaluator(Program.from_text("model M {}"), Builder(None))
    >>> ev.lowering
    False
    """
