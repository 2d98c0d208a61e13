"""What every part of the Evaluator shares: failures, frames, formatting helpers, limits,
and :class:`EvaluatorBase`, the state the mixins of :mod:`linnet.lang.check.evaluate` work on."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import Diagnostic, Span
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.primitives import BINARY_FUNCTIONS, BINARY_OPERATORS, UNARY_FUNCTIONS
from linnet.lang.syntax.program import Program
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.dtypes import is_int as _is_int
from linnet.lang.tensors.values import BlockInst, Tensor

KERNEL_BUILTINS = {"program_id", "load", "store", "atomic_add"}
# How users write a primitive, for messages: `+` rather than `add`.
OPERATOR_SYMBOLS = {prim: op for op, prim in BINARY_OPERATORS.items()} | {
    "not": "!",
    "neg": "-",
    "maximum": "max",
    "minimum": "min",
}
BUILTINS = (
    UNARY_FUNCTIONS
    | set(BINARY_FUNCTIONS)
    | KERNEL_BUILTINS
    | {"select", "iota", "fill", "bitcast"}
)


class Fail(Exception):
    def __init__(self, diag: Diagnostic):
        super().__init__(diag.message)
        self.diag = diag


def fail(
    code: str,
    message: str,
    span: Span | None,
    label: str = "",
    help: str = "",
    secondary: Sequence[tuple[Span | None, str]] | None = None,
    notes: list[str] | None = None,
) -> Fail:
    diag = Diagnostic(code, message, span, label, help=help, notes=list(notes or []))
    for s, m in secondary or []:
        diag.with_secondary(s, m)
    return Fail(diag)


class IndexVar:
    def __init__(self, name: str):
        self.name = name


class Frame:
    """One function activation: its scopes, index variables, generics and `self`."""

    def __init__(
        self,
        module: A.Module,
        env: dict[str, Any],
        owner: BlockInst | None = None,
        func: A.FuncDecl | None = None,
    ):
        self.module = module
        self.env = env
        self.owner = owner
        self.func = func
        self.scopes: list[dict[str, Any]] = [{}]
        self.ivars: dict[str, Dim | None] = {}
        self.order: list[str] = []  # canonical label order of the current statement
        self.in_kernel = func is not None and func.kind == "kernel"
        self.tensor_params: set[str] = set()
        self.results: dict[str, Tensor] = {}
        self.stored_results: set[str] = set()  # results a `store` in the body writes
        self.scratch: set[str] = set()  # a kernel's scratch buffers (also in tensor_params)
        self.memory_access = False  # evaluating the first argument of load/store
        self.tile_sizes: list[tuple[Dim, Span]] = []
        self.returned: list[Any] | None = None
        self.return_exprs: list[A.Expr] = []  # the last `return`'s values, for diagnostics
        self.var_spans: dict[str, Span] = {}
        self.reduce_vars: set[str] = set()

    def reset_statement(self) -> None:
        self.ivars.clear()
        self.order = []
        self.var_spans = {}
        self.reduce_vars = set()

    def lookup_local(self, name: str) -> Any:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def bind(self, name: str, value: Any) -> None:
        self.scopes[-1][name] = value

    def local_names(self) -> Iterator[str]:
        for scope in self.scopes:
            yield from scope


def dim_str(d: Dim) -> str:
    return str(d)


def shape_str(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def type_str(t: Tensor) -> str:
    return (
        f"Tensor[{', '.join(str(d) for d in t.shape)}{'; ' if t.shape else ''}{t.dtype}]"
        if t.shape
        else f"Tensor[; {t.dtype}]"
    )


def index_count(name: str, rank: int, given: int) -> str:
    """`x` has 2 dimensions but 1 index"""
    return (
        f"{name} has {rank} dimension{'s' if rank != 1 else ''} but {given} "
        f"ind{'ices' if given != 1 else 'ex'}"
    )


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


NEGATIVE_HELP = (
    "the sizes in the config or the inputs make a dimension expression (like "
    "`D - K`) negative; add a `where` clause (`where D >= K`) to say what it needs"
)
# How many unknown-name errors get a did-you-mean hint (each costs a scan of the names).
MAX_SUGGESTIONS = 100
# How deeply calls (each inlined when lowering), blocks inside blocks and constants defined
# through constants may nest (E0209): deeper would exhaust Python's stack. Llama nests 6.
MAX_DEPTH = 64


class EvaluatorBase:
    """The Evaluator's state; its behaviour lives in one mixin per idea (names, statements,
    typing, folding, indexing, calls, kernels, hints), composed in
    :class:`linnet.lang.check.evaluate.Evaluator`."""

    def __init__(self, program: Program, builder: Builder, config: dict[str, Any] | None = None):
        self.program = program
        self.builder = builder
        self.lowering = builder.recording
        self.config = dict(config or {})
        self.errors: list[Diagnostic] = []
        # What is being evaluated right now, outermost first, to name a cycle (E0206-E0208)
        # instead of recursing until Python's stack runs out.
        self.const_stack: list[tuple[A.Const, Span]] = []
        self.call_stack: list[tuple[A.FuncDecl, Span]] = []
        self.block_stack: list[A.BlockDecl] = []
        self.reported_blocks: set[int] = set()  # in a cycle or chain already reported
        self.suggestions_left = MAX_SUGGESTIONS
        self.const_cache: dict[int, tuple[A.Const, Any]] = {}
        # Calls seen while checking (caller, callee, call span): recursion is found from them.
        self.call_edges: list[tuple[A.FuncDecl, A.FuncDecl, Span]] = []
        # While lowering for `--grad`: each call's grad clause, lowered, by call index
        # (linnet.lang.grad.reverse.ClauseTemplate); None otherwise.
        self.grad_templates: dict[int, Any] | None = None

    if TYPE_CHECKING:
        # The mixins call one another through `self`; for mypy those calls go through here
        # (typed Any), while each method is checked against its own signature.
        def __getattr__(self, name: str) -> Any: ...


def integer_gradient(grad: str, param: str) -> bool:
    """Whether a grad clause's gradient of element type ``grad`` for a parameter of type
    ``param`` is an integer (or bool) one for a parameter that is not: the reverse pass
    would convert it to the parameter's type, silently dropping every fraction.

    >>> integer_gradient("i32", "f32"), integer_gradient("i32", "T"), integer_gradient("f32", "T")
    (True, True, False)
    """
    whole = _is_int(grad) or grad == "bool"
    return whole and not (_is_int(param) or param == "bool")


def integer_gradient_error(
    op: str, param: str, grad: str, declared: str, span: Span | None
) -> Diagnostic:
    """E0538: a grad clause returns an integer gradient for a floating-point parameter."""
    return Diagnostic(
        "E0538",
        f"the grad clause of `{op}` returns a gradient of type {grad} "
        f"for `{param}` ({declared}): a gradient of a floating-point parameter is "
        "floating point, and an integer one would be silently truncated",
        span,
        "grad clause",
        help=f"compute `{param}`'s gradient in its own type, {declared} "
        f"(not `as {grad}`): a gradient is a rate, not a count",
    )
