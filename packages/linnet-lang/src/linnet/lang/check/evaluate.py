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

import difflib
from collections.abc import Iterator, Sequence
from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.diagnostics.core import Diagnostic, Span
from linnet.lang.check.instantiate import run_loop
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.primitives import (
    BINARY_FUNCTIONS,
    BINARY_OPERATORS,
    COMPARISON_PRIMITIVES,
    REDUCTION_IDENTITIES,
    UNARY_FUNCTIONS,
)
from linnet.lang.syntax.program import Program
from linnet.lang.tensors.dims import Dim, solve_for
from linnet.lang.tensors.values import (
    POISON,
    BlockArray,
    BlockInst,
    Builtin,
    Const,
    DType,
    FuncRef,
    Poison,
    Tensor,
)

KERNEL_BUILTINS = {"program_id", "load", "store"}
# How users write a primitive, for messages: `+` rather than `add`.
OPERATOR_SYMBOLS = {prim: op for op, prim in BINARY_OPERATORS.items()} | {
    "not": "!", "neg": "-", "maximum": "max", "minimum": "min"}
BUILTINS = (UNARY_FUNCTIONS | set(BINARY_FUNCTIONS) | KERNEL_BUILTINS
            | {"select", "iota", "fill"})


class Fail(Exception):
    def __init__(self, diag: Diagnostic):
        super().__init__(diag.message)
        self.diag = diag


def fail(code: str, message: str, span: Span | None, label: str = "", help: str = "",
         secondary: Sequence[tuple[Span | None, str]] | None = None,
         notes: list[str] | None = None) -> Fail:
    diag = Diagnostic(code, message, span, label, help=help, notes=list(notes or []))
    for s, m in secondary or []:
        diag.with_secondary(s, m)
    return Fail(diag)


class IndexVar:
    def __init__(self, name: str):
        self.name = name


class Frame:
    """One function activation: its scopes, index variables, generics and `self`."""

    def __init__(self, module: A.Module, env: dict[str, Any], owner: BlockInst | None = None,
                 func: A.FuncDecl | None = None):
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
    return f"Tensor[{', '.join(str(d) for d in t.shape)}{'; ' if t.shape else ''}{t.dtype}]" \
        if t.shape else f"Tensor[; {t.dtype}]"


def index_count(name: str, rank: int, given: int) -> str:
    """`x` has 2 dimensions but 1 index"""
    return (f"{name} has {rank} dimension{'s' if rank != 1 else ''} but {given} "
            f"ind{'ices' if given != 1 else 'ex'}")


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


NEGATIVE_HELP = ("the sizes in the config or the inputs make a dimension expression (like "
                 "`D - K`) negative; add a `where` clause (`where D >= K`) to say what it needs")
# How many unknown-name errors get a did-you-mean hint (each costs a scan of the names).
MAX_SUGGESTIONS = 100
# How deeply calls (each inlined when lowering), blocks inside blocks and constants defined
# through constants may nest (E0209): deeper would exhaust Python's stack. Llama nests 6.
MAX_DEPTH = 64


class Evaluator:
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

    # ================================================================ names
    def resolve_global(self, module: A.Module, name: str, span: Span) -> Any:
        item = module.find(name)
        if item is None:
            for use in module.uses:
                for imported, name_span in use.names:
                    if imported != name:
                        continue
                    target = self.program.module(".".join(use.module))
                    if target is None:
                        return POISON
                    item = target.find(name)
                    if (item is None or not getattr(item, "public", True)) and span != name_span:
                        return POISON  # reported at the `use` itself
                    if item is None:
                        public = [str(getattr(i, "name", "")) for i in target.items
                                  if getattr(i, "public", False)]
                        close = difflib.get_close_matches(name, public, n=1, cutoff=0.8)
                        raise fail("E0202", f"`{name}` is not in module `{'.'.join(use.module)}`",
                                   span, "not found there",
                                   help=(f"did you mean `{close[0]}`?" if close else
                                         f"`{'.'.join(use.module)}` exports: "
                                         + (", ".join(sorted(public)) or "nothing")))
                    if not getattr(item, "public", True):
                        raise fail("E0203", f"`{name}` is private to `{'.'.join(use.module)}`",
                                   span, "private item",
                                   help=f"mark it `pub` in `{'.'.join(use.module)}`",
                                   secondary=[(getattr(item, "name_span", item.span),
                                               "declared without `pub`")])
        if item is None:
            return None
        if isinstance(item, A.FuncDecl):
            return FuncRef(item)
        if isinstance(item, A.BlockDecl):
            return item
        if isinstance(item, A.Const):
            return self.const_value(item, module, span)
        return None

    def const_value(self, item: A.Const, module: A.Module, span: Span) -> Any:
        """A constant's value; a constant defined through itself is E0206, not a recursion."""
        for k, (c, _) in enumerate(self.const_stack):
            if c is item:
                cycle = [c.name for c, _ in self.const_stack[k:]] + [item.name]
                raise fail("E0206", f"constant `{item.name}` is defined in terms of itself: "
                           + " -> ".join(f"`{n}`" for n in cycle), span, "used here",
                           help="give one of them a value that does not refer back",
                           secondary=[(c.span, f"`{c.name}` defined here")
                                      for c, _ in self.const_stack[k:]][:4])
        cached = self.const_cache.get(id(item))
        if cached is not None and cached[0] is item:
            return cached[1]
        if len(self.const_stack) >= MAX_DEPTH:
            chain = [c for c, _ in self.const_stack]
            for c in chain:  # reported once, here, not again for every constant of the chain
                self.const_cache[id(c)] = (c, POISON)
            raise fail("E0209", f"constant `{chain[0].name}` is defined through more than "
                       f"{MAX_DEPTH} other constants", span, "the limit is reached here",
                       help="define some of them directly, with fewer steps between",
                       secondary=[(chain[0].span, f"`{chain[0].name}` defined here")])
        self.const_stack.append((item, span))
        try:
            value = self.value(item.value, Frame(module, {}))
        except Fail:
            # A cycle or a chain too long is reported once, for the first constant in it.
            for c, _ in self.const_stack:
                self.const_cache[id(c)] = (c, POISON)
            raise
        finally:
            self.const_stack.pop()
        if isinstance(value, Const):  # scalars only: their value never depends on the caller
            self.const_cache[id(item)] = (item, value)
        return value

    def lookup(self, frame: Frame, name: str, span: Span) -> Any:
        local = frame.lookup_local(name)
        if local is not None:
            return local
        if name in frame.ivars:
            return IndexVar(name)
        if name in frame.env:
            v = frame.env[name]
            if isinstance(v, Dim):
                return Const(v, "int")
            if isinstance(v, str):
                return DType(v)
            return v
        if name == "self":
            if frame.owner is None:
                raise fail("E0204", "`self` is only defined in a block's methods", span,
                           "no block here", help="read parameters inside a block's `fn`")
            return frame.owner
        g = self.resolve_global(frame.module, name, span)
        if g is not None:
            return g
        if name in BUILTINS:
            return Builtin(name)
        if name in DT.DTYPES:
            return DType(name)
        close = []
        if self.suggestions_left > 0:
            # A did-you-mean costs time linear in the names in scope: give it to the first
            # errors only, so that thousands of unknown names stay linear.
            self.suggestions_left -= 1
            candidates = list(frame.local_names()) + list(frame.ivars) + list(frame.env) + \
                frame.module.item_names + [n for u in frame.module.uses for n, _ in u.names] + \
                sorted(BUILTINS)
            close = difflib.get_close_matches(name, candidates, n=1)
        help = f"did you mean `{close[0]}`?" if close else (
            "declare it with `let`, or import it with `use`")
        if name in ("sum", "max", "min", "mean", "prod"):
            raise fail("E0201", f"`{name}` is a reduction, not a function", span,
                       "called like a function",
                       help=f"name the reduced index: `{name}[i] x[i]`")
        raise fail("E0201", f"unknown name `{name}`", span, "not defined here", help=help)

    # ================================================================ types
    def eval_dim(self, expr: A.Expr, frame: Frame) -> Dim:
        v = self.value(expr, frame)
        if isinstance(v, Const) and isinstance(v.value, Dim):
            return v.value
        if isinstance(v, Poison):
            raise Fail(Diagnostic("E0000", "poisoned"))
        raise fail("E0401", "a dimension must be a compile-time integer", expr.span,
                   "not an integer dimension",
                   help="dimensions are written with `Dim` generics, integers, `+ - * /`")

    def eval_dtype(self, name: A.Name, frame: Frame) -> str:
        if name.name in DT.DTYPES:
            return name.name
        v = frame.env.get(name.name)
        if isinstance(v, str):
            return v
        if name.name in frame.env:
            raise fail("E0402", f"`{name.name}` is a dimension, not an element type", name.span,
                       "expected a dtype", help="element types are f32, bf16, f16, i32, bool, "
                       "... or a `DType` generic")
        close = difflib.get_close_matches(name.name, list(DT.DTYPES), n=1)
        raise fail("E0403", f"unknown element type `{name.name}`", name.span,
                   "not a dtype", help=(f"did you mean `{close[0]}`?" if close else
                                        "element types are " + ", ".join(DT.DTYPES)))

    def tensor_type(self, typ: A.TypeExpr, frame: Frame) -> tuple[tuple[Dim, ...], str]:
        if isinstance(typ, A.TensorType):
            dims = tuple(self.eval_dim(d, frame) for d in typ.dims)
            for d, expr in zip(dims, typ.dims):
                if d.value is not None and d.value < 0:
                    raise fail("E0619", f"`{self.src(expr)}` = {d.value} is a negative size",
                               expr.span, f"= {d.value}", help=NEGATIVE_HELP)
            return dims, self.eval_dtype(typ.dtype, frame)
        if isinstance(typ, A.ScalarType):
            return (), self.eval_dtype(A.Name(typ.name, typ.span), frame)
        raise fail("E0404", "expected a tensor or scalar type", typ.span, "this is a block type")

    # ================================================================ statements
    def run_body(self, block: A.Block, frame: Frame) -> None:
        for stmt in block.statements:
            if frame.returned is not None:
                raise fail("E0310", "unreachable statement after `return`", stmt.span,
                           "never runs", help="`return` must be the last statement")
            try:
                self.statement(stmt, frame)
            except Fail as f:
                if f.diag.code != "E0000":
                    self.errors.append(f.diag)
                if isinstance(stmt, A.Let):
                    frame.bind(stmt.name, POISON)
                elif isinstance(stmt, A.Assign) and isinstance(stmt.target, A.Name) and \
                        frame.lookup_local(stmt.target.name) is None:
                    frame.bind(stmt.target.name, POISON)  # E0312: later uses stay quiet
                elif isinstance(stmt, A.Return) and frame.returned is None:
                    frame.returned = [POISON] * len(stmt.values)
                if self.lowering:
                    raise
            finally:
                frame.reset_statement()

    def statement(self, stmt: A.Stmt, frame: Frame) -> None:
        if self.poisoned(stmt, frame):
            if isinstance(stmt, A.Return):
                frame.returned = [POISON]
            raise Fail(Diagnostic("E0000", "depends on an earlier error"))
        if isinstance(stmt, A.Let):
            if stmt.binders is None:
                v = self.value(stmt.value, frame)
                if isinstance(v, Tensor) and v.kind == "value":
                    v = self.builder.rename_last(v, stmt.name,
                                                 force=isinstance(stmt.value, A.Call | A.IfExpr))
                frame.bind(stmt.name, v)
            else:
                frame.bind(stmt.name, self.index_let(stmt, frame))
        elif isinstance(stmt, A.Return):
            frame.return_exprs = list(stmt.values)
            frame.returned = [self.value(v, frame) for v in stmt.values]
        elif isinstance(stmt, A.ExprStmt):
            v = self.value(stmt.expr, frame, statement=True)
            if isinstance(v, Tensor) and not frame.in_kernel:
                raise fail("E0311", "this value is computed and then dropped", stmt.span,
                           "result unused", help="bind it with `let name = ...`")
        elif isinstance(stmt, A.Assign):
            self.assign(stmt, frame)
        elif isinstance(stmt, A.For):
            self.for_loop(stmt, frame)

    def poisoned(self, stmt: A.Stmt, frame: Frame) -> bool:
        """Whether the statement reads a variable whose definition already failed."""
        if self.lowering:
            return False  # lowering stops at its first error: nothing is ever poisoned
        exprs: list[Any] = []
        if isinstance(stmt, A.Let | A.Assign):
            exprs.append(stmt.value)
        elif isinstance(stmt, A.Return):
            exprs.extend(stmt.values)
        elif isinstance(stmt, A.ExprStmt):
            exprs.append(stmt.expr)
        return any(isinstance(n, A.Name) and isinstance(frame.lookup_local(n.name), Poison)
                   for e in exprs for n in walk(e))

    def assign(self, stmt: A.Assign, frame: Frame) -> None:
        target = stmt.target
        if isinstance(target, A.Name):
            old = frame.lookup_local(target.name)
            if old is None:
                raise fail("E0312", f"cannot assign to `{target.name}`: it is not a variable",
                           target.span, "not declared",
                           help=f"declare it first: `let {target.name} = ...`")
            new = self.value(stmt.value, frame)
            if isinstance(old, Tensor) and isinstance(new, Tensor) and (
                    old.shape != new.shape or old.dtype != new.dtype) and not frame.in_kernel:
                raise fail("E0313", f"`{target.name}` changes type: {type_str(old)} before, "
                           f"{type_str(new)} now", stmt.value.span, "new value",
                           help="a variable keeps one type; use a new name")
            for scope in reversed(frame.scopes):
                if target.name in scope:
                    scope[target.name] = new
                    break
            return
        if isinstance(target, A.Index):
            self.state_write(target, stmt.value, stmt.span, frame)
            return
        raise fail("E0112", "cannot assign to this expression", target.span, "not assignable",
                   help="assign to a variable, or write into a state with indices")

    def for_loop(self, stmt: A.For, frame: Frame) -> None:
        it = stmt.iterable
        if isinstance(it, A.RangeExpr):
            lo = self.value(it.start, frame)
            hi = self.value(it.stop, frame)
            if frame.in_kernel or not self.lowering:
                var: Any = (Tensor("%?", (), "i32") if frame.in_kernel
                            else Const(Dim.symbol(stmt.var), "int"))
                frame.scopes.append({stmt.var: var})
                try:
                    self.run_body(stmt.body, frame)
                finally:
                    frame.scopes.pop()
                return
            if not (isinstance(lo, Const) and isinstance(hi, Const) and lo.known and hi.known):
                raise fail("E0320", "loop bounds must be known when lowering", it.span,
                           "not a compile-time range",
                           help="outside kernels, loops are unrolled: use integers and dims")
            stop = hi.value.value + (1 if it.inclusive else 0)
            values = [Const(Dim.const(i), "int") for i in range(lo.value.value, stop)]
        else:
            arr = self.value(it, frame)
            if isinstance(arr, Poison):
                return
            if not isinstance(arr, BlockArray):
                raise fail("E0321", "a `for` loop runs over a range (`0..N`) or repeated blocks",
                           it.span, "not iterable",
                           help="tensors are not iterated: use index notation (`let y[i] = ...`) "
                                "or a reduction (`sum[i] x[i]`)" if isinstance(arr, Tensor) else
                                "declare repeated blocks as `block layers: [Layer<...>; N]`")
            values = list(arr.items)  # type: ignore[arg-type]

        def run_one(v: Any) -> None:
            frame.scopes.append({stmt.var: v})
            try:
                self.run_body(stmt.body, frame)
            finally:
                frame.scopes.pop()

        if isinstance(it, A.RangeExpr):
            for v in values:
                run_one(v)
            return
        # Repeated blocks: lower one element, instantiate it for the others (check/instantiate).
        run_loop(self, stmt, frame, arr, run_one)

    # ================================================================ positional values
    def value(self, expr: A.Expr, frame: Frame, statement: bool = False) -> Any:
        if isinstance(expr, A.IntLit):
            return Const(Dim.const(expr.value), "int")
        if isinstance(expr, A.FloatLit):
            return Const(expr.value, "float")
        if isinstance(expr, A.BoolLit):
            return Const(expr.value, "bool")
        if isinstance(expr, A.Name):
            v = self.lookup(frame, expr.name, expr.span)
            if isinstance(v, IndexVar):
                raise fail("E0330", f"index variable `{expr.name}` used outside index notation",
                           expr.span, "an index variable",
                           help="use it inside `let y[...] = ...` or a reduction")
            if (frame.in_kernel and expr.name in frame.tensor_params
                    and not frame.memory_access):
                raise fail("E0503", f"tensor parameter `{expr.name}` is used outside "
                           "`load`/`store`", expr.span, "read directly",
                           help=f"read it with `load({expr.name}[...])`")
            return v
        if isinstance(expr, A.Unary):
            x = self.value(expr.operand, frame)
            return self.elementwise("neg" if expr.op == "-" else "not", [x], expr.span, frame)
        if isinstance(expr, A.Binary):
            a = self.value(expr.left, frame)
            b = self.value(expr.right, frame)
            return self.elementwise(BINARY_OPERATORS[expr.op], [a, b], expr.span, frame)
        if isinstance(expr, A.Cast):
            return self.cast(self.value(expr.operand, frame), expr, frame)
        if isinstance(expr, A.Call):
            return self.call(expr, frame, statement)
        if isinstance(expr, A.Field):
            return self.field(expr, frame)
        if isinstance(expr, A.Index):
            base = self.value(expr.base, frame) if not isinstance(expr.base, A.Name) or \
                expr.base.name not in frame.tensor_params else frame.lookup_local(expr.base.name)
            if isinstance(base, BlockArray):
                if len(expr.indices) != 1:
                    raise fail("E0331", "repeated blocks take one index", expr.span)
                i = self.eval_dim(expr.indices[0], frame)
                if i.value is None:
                    return base.items[0]
                if not 0 <= i.value < len(base.items):
                    raise fail("E0332", f"block index {i.value} is out of range 0..{len(base.items)}",
                               expr.indices[0].span, "out of range")
                return base.items[i.value]
            return self.whole(expr, frame)
        if isinstance(expr, A.Reduce):
            return self.whole(expr, frame)
        if isinstance(expr, A.IfExpr):
            return self.if_expr(expr, frame)
        if isinstance(expr, A.Tuple):
            raise fail("E0333", "a parenthesised list is only allowed as a composite index",
                       expr.span, "not a value", help="composite indices look like `x[(h, d)]`")
        if isinstance(expr, A.RangeExpr):
            raise fail("E0334", "a range is only allowed in a `for` loop", expr.span)
        raise fail("E0335", "unsupported expression", getattr(expr, "span", None))

    def whole(self, expr: A.Expr, frame: Frame) -> Any:
        """An index-notation expression used as a whole value: it may not leave free indices."""
        if not frame.order and not frame.ivars:
            frame.order = []
        self.infer_ranges(expr, frame)
        v = self.lab(expr, frame)
        if isinstance(v, Tensor) and v.labels:
            free = ", ".join(f"`{x}`" for x in v.labels)
            raise fail("E0305", f"index variable{'s' if len(v.labels) > 1 else ''} {free} "
                       "not bound", expr.span, "free index here",
                       help=f"name the result's indices: `let y[{', '.join(v.labels)}] = ...`, "
                            "or reduce them with `sum[...]`")
        if isinstance(v, Tensor):
            return v.relabel(None)
        return v

    def if_expr(self, expr: A.IfExpr, frame: Frame) -> Any:
        per_element = [n for n in walk(expr.condition) if isinstance(n, A.Name)
                       and n.name in frame.ivars and frame.lookup_local(n.name) is None]
        if per_element:
            raise fail("E0336", "an `if` condition must be a compile-time bool", expr.condition.span,
                       f"depends on index `{per_element[0].name}`",
                       help="`if` picks one branch for the whole tensor; choose per element with "
                            f"`select`: {self.select_hint(expr)}")
        cond = self.value(expr.condition, frame)
        if not isinstance(cond, Const) or cond.dtype != "bool":
            raise fail("E0336", "an `if` condition must be a compile-time bool", expr.condition.span,
                       "not known before running", help="use `select(cond, a, b)` for values "
                       "that depend on tensors")
        if cond.value is None and not self.lowering:
            then = self.block_value(expr.then, frame)
            if expr.otherwise is not None:
                self.block_value(expr.otherwise, frame) if isinstance(
                    expr.otherwise, A.Block) else self.if_expr(expr.otherwise, frame)
            return then
        if cond.value:
            return self.block_value(expr.then, frame)
        if expr.otherwise is None:
            return None
        if isinstance(expr.otherwise, A.IfExpr):
            return self.if_expr(expr.otherwise, frame)
        return self.block_value(expr.otherwise, frame)

    def select_hint(self, expr: A.IfExpr) -> str:
        """`if c { a } else { b }` spelled as `select(c, a, b)` when both arms are one value."""
        arms = [expr.then, expr.otherwise]
        if all(isinstance(b, A.Block) and len(b.statements) == 1
               and isinstance(b.statements[0], A.ExprStmt) for b in arms):
            a, b = (self.src(arm.statements[0].expr) for arm in arms)  # type: ignore[union-attr]
            return f"`select({self.src(expr.condition)}, {a}, {b})`"
        return "`select(cond, a, b)`"

    def block_value(self, block: A.Block, frame: Frame) -> Any:
        frame.scopes.append({})
        try:
            stmts = block.statements
            for stmt in stmts[:-1]:
                self.statement(stmt, frame)
            if stmts and isinstance(stmts[-1], A.ExprStmt):
                return self.value(stmts[-1].expr, frame)
            if stmts:
                self.statement(stmts[-1], frame)
            return None
        finally:
            frame.scopes.pop()

    def field(self, expr: A.Field, frame: Frame) -> Any:
        base = self.value(expr.base, frame)
        if isinstance(base, Poison):
            return base
        if isinstance(base, BlockInst):
            if expr.name in base.members:
                return base.members[expr.name]
            method = base.decl.method(expr.name)
            if method is not None:
                return FuncRef(method, base)
            for m in base.decl.members:
                if m.name == expr.name:
                    raise fail("E0340", f"`{expr.name}` is not present in this configuration",
                               expr.span, "absent member", help=f"`{expr.name}` is declared "
                               "with an `if` condition that is false here",
                               secondary=[(m.span, "declared here")])
            names = list(base.members) + [m.name for m in base.decl.methods]
            close = difflib.get_close_matches(expr.name, names, n=1)
            raise fail("E0341", f"block `{base.decl.name}` has no member `{expr.name}`",
                       expr.span, "unknown member",
                       help=(f"did you mean `{close[0]}`?" if close else
                             f"members are: {', '.join(names) or 'none'}"),
                       secondary=[(base.decl.name_span, f"`{base.decl.name}` declared here")])
        raise fail("E0342", f"only blocks have members; this is {self.describe(base)}",
                   expr.span, "not a block")

    def describe(self, v: Any) -> str:
        if isinstance(v, Tensor):
            return f"a tensor {type_str(v)}"
        if isinstance(v, Const):
            return f"a constant ({v.dtype})"
        if isinstance(v, FuncRef):
            return f"the {v.decl.kind} `{v.decl.name}`"
        if isinstance(v, BlockArray):
            return "a list of blocks"
        if isinstance(v, BlockInst):
            return f"a `{v.decl.name}` block"
        if isinstance(v, A.BlockDecl):
            return f"the block type `{v.name}`"
        if isinstance(v, DType):
            return f"the element type `{v.name}`"
        if isinstance(v, Builtin):
            return f"the function `{v.name}`"
        return type(v).__name__.lower()

    # ================================================================ elementwise
    def const_fold(self, prim: str, args: list[Const], span: Span) -> Const:
        if all(isinstance(a.value, Dim) for a in args) and prim in ("add", "sub", "mul", "div",
                                                                      "neg") and \
                any(not a.known for a in args):
            x = args[0].value
            y = args[1].value if len(args) > 1 else None
            try:
                out = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                       "div": lambda: x / y, "neg": lambda: -x}[prim]()
            except ZeroDivisionError:
                raise fail("E0350", "constant arithmetic divides by zero", span,
                           "the divisor is 0 here") from None
            return Const(out, "int")
        if any(not a.known for a in args):
            kind = "bool" if prim in COMPARISON_PRIMITIVES | {"and", "or", "not"} else (
                "int" if all(a.dtype == "int" for a in args) else "float")
            return Const(Dim.symbol(f"?{id(span)}") if kind == "int" else None, kind)
        vals = [a.value.exact if isinstance(a.value, Dim) else a.value for a in args]
        ints = all(a.dtype in ("int", *DT.INTS) for a in args)
        try:
            import math
            table = {
                "neg": lambda x: -x, "not": lambda x: not x, "add": lambda x, y: x + y,
                "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
                "div": (lambda x, y: x // y) if ints else (lambda x, y: float(x) / float(y)),
                "rem": lambda x, y: x % y, "pow": lambda x, y: x ** y,
                "maximum": max, "minimum": min, "lt": lambda x, y: x < y,
                "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
                "eq": lambda x, y: x == y, "ne": lambda x, y: x != y,
                "and": lambda x, y: bool(x and y), "or": lambda x, y: bool(x or y),
                "exp": math.exp, "log": math.log, "sqrt": math.sqrt,
                "rsqrt": lambda x: 1 / math.sqrt(x), "sin": math.sin, "cos": math.cos,
                "tanh": math.tanh, "abs": abs, "erf": math.erf, "floor": math.floor,
                "sigmoid": lambda x: 1 / (1 + math.exp(-x)),
            }
            fn: Any = table[prim]
            out = fn(*vals)
        except ZeroDivisionError:
            raise fail("E0350", "constant arithmetic divides by zero", span,
                       "the divisor is 0 here") from None
        except (ValueError, OverflowError) as exc:
            raise fail("E0350", f"constant arithmetic fails: {exc}", span, "here") from None
        if isinstance(out, bool):
            return Const(out, "bool")
        if ints and prim not in UNARY_FUNCTIONS - {"abs", "floor"}:
            return Const(Dim.const(int(out)), "int")
        return Const(float(out), "float")

    def elementwise(self, prim: str, args: list[Any], span: Span, frame: Frame,
                    labelled: bool = False) -> Any:
        if any(isinstance(a, Poison) for a in args):
            return POISON
        for a in args:
            if not isinstance(a, Tensor | Const):
                raise fail("E0351", f"cannot compute with {self.describe(a)}", span,
                           "not a number or tensor")
        if all(isinstance(a, Const) for a in args):
            if prim == "select":
                c, x, y = args
                if c.known:
                    return x if c.value else y
                return x
            return self.const_fold(prim, args, span)
        tensors = [a for a in args if isinstance(a, Tensor)]
        # Types: tensors promote, literals are weak.
        operand_args = args[1:] if prim == "select" else args
        dtype = None
        for a in operand_args:
            if isinstance(a, Tensor):
                if dtype is None:
                    dtype = a.dtype
                else:
                    p = DT.promote(dtype, a.dtype)
                    if p is None:
                        raise fail("E0352", f"cannot mix element types `{dtype}` and `{a.dtype}`",
                                   span, "mixed here",
                                   help=f"convert one explicitly: `(...) as {dtype}`")
                    dtype = p
        if dtype is None:  # select(tensor_cond, const, const)
            dtype = "f32" if any(isinstance(a, Const) and a.dtype == "float" for a in args) \
                else "i32"
        if any(isinstance(a, Const) and a.dtype == "float" for a in operand_args) and (
                DT.is_int(dtype) or dtype == "bool"):
            dtype = "f32"
        if prim == "select":
            c = args[0]
            if isinstance(c, Tensor) and c.dtype != "bool":
                raise fail("E0353", "the condition of `select` must be bool", span,
                           f"this is {c.dtype}", help="compare something: `select(j <= p, a, b)`")
        elif prim in ("and", "or", "not"):
            if dtype != "bool":
                raise fail("E0354", f"`{OPERATOR_SYMBOLS.get(prim, prim)}` needs bool operands, "
                           f"found {dtype}", span,
                           "not bool", help="compare values first (`a < b`)")
        elif dtype == "bool" and prim not in ("eq", "ne"):
            raise fail("E0355", f"cannot apply `{OPERATOR_SYMBOLS.get(prim, prim)}` to bool "
                       "tensors", span, "bool operand",
                       help="convert first: `(x as f32)`")
        elif prim in UNARY_FUNCTIONS | {"pow"} and not DT.is_float(dtype) and DT.is_concrete(
                dtype) and prim not in ("abs",):
            raise fail("E0356", f"`{prim}` needs a floating-point operand, found {dtype}", span,
                       f"{dtype} here", help="convert first: `(x as f32)`")
        result_dtype = "bool" if prim in COMPARISON_PRIMITIVES | {"and", "or", "not"} else dtype
        # Convert tensors whose dtype differs from the common one.
        operands: list[Tensor] = []
        for i, a in enumerate(args):
            want = "bool" if (prim == "select" and i == 0) else dtype
            if isinstance(a, Tensor):
                if a.dtype != want and prim not in ("and", "or", "not"):
                    a = self.builder.emit("convert", [a.ref], a.shape, want, {"dtype": want},
                                          span=span, labels=a.labels)
                operands.append(a)
            else:
                operands.append(self.constant(a, want, span))
        if labelled or any(t.labels for t in tensors):
            union = self.union_labels([t for t in operands if t.labels is not None], frame)
            aligned = [self.align(t, union, span) for t in operands]
            shape = tuple(self.label_dim(frame, lab) for lab in union)
            return self.builder.emit(prim, [t.ref for t in aligned], shape, result_dtype,
                                     span=span, labels=union)
        shape = self.broadcast_shapes([t.shape for t in operands], span)
        return self.builder.emit(prim, [t.ref for t in operands], shape, result_dtype, span=span)

    def constant(self, c: Const, dtype: str, span: Span, labels: tuple = ()) -> Tensor:
        if not DT.is_concrete(dtype):  # a generic dtype in the checker: any literal fits
            return Tensor("%?", (), dtype, labels=labels)
        value = c.value
        if isinstance(value, Dim):
            if value.value is None and self.lowering:
                raise fail("E0357", "this constant is not known when lowering", span)
            value = value.value if value.value is not None else 0
        if value is None:
            value = 0.0
        if DT.is_float(dtype):
            value = float(value)
        elif dtype == "bool":
            value = bool(value)
        else:
            if isinstance(value, float) and not value.is_integer():
                raise fail("E0358", f"{value} is not an integer", span, "fractional constant",
                           help="use an integer here, or convert the tensor to a float type")
            value = int(value)
        return self.builder.emit("constant", [], (), dtype, {"value": value, "dtype": dtype},
                                 span=span, labels=labels)

    def broadcast_shapes(self, shapes: list[tuple[Dim, ...]], span: Span) -> tuple[Dim, ...]:
        rank = max(len(s) for s in shapes)
        nonscalar = [s for s in shapes if len(s) > 0]
        if any(len(s) != rank for s in nonscalar):
            raise fail("E0360", "shapes of different rank: " + " and ".join(
                shape_str(s) for s in nonscalar), span, "ranks differ",
                help="use index notation to say how axes line up: `let y[r, c] = a[r, c] + "
                     "b[c]`")
        out = []
        for axis in range(rank):
            dims = {s[axis] for s in nonscalar} - {Dim.const(1)}
            if len(dims) > 1:
                raise fail("E0361", "shape mismatch: " + " and ".join(
                    shape_str(s) for s in nonscalar) + f" differ at axis {axis}", span,
                    "shapes differ", help="operands of an elementwise operation must have the "
                    "same shape; use index notation to broadcast or transpose")
            out.append(dims.pop() if dims else Dim.const(1))
        return tuple(out)

    def cast(self, v: Any, expr: A.Cast, frame: Frame) -> Any:
        dtype = self.eval_dtype(expr.dtype, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            if not v.known:
                return Const(v.value, dtype)
            if dtype == "bool":
                return Const(bool(v.value if not isinstance(v.value, Dim) else v.value.value),
                             "bool")
            if DT.is_float(dtype):
                fx: Any = v.value.exact if isinstance(v.value, Dim) else v.value
                return Const(float(fx), dtype)
            ix: Any = v.value.value if isinstance(v.value, Dim) else int(v.value)
            return Const(Dim.const(int(ix)), dtype)
        if not isinstance(v, Tensor):
            raise fail("E0362", f"cannot convert {self.describe(v)}", expr.span)
        if v.dtype == dtype:
            return v
        return self.builder.emit("convert", [v.ref], v.shape, dtype, {"dtype": dtype},
                                 span=expr.span, labels=v.labels)

    # ================================================================ labelled (index notation)
    def label_key(self, frame: Frame, label: str) -> int:
        try:
            return frame.order.index(label)
        except ValueError:
            frame.order.append(label)
            return len(frame.order) - 1

    def union_labels(self, tensors: list[Tensor], frame: Frame) -> tuple[str, ...]:
        seen: set[str] = set()
        for t in tensors:
            seen.update(t.labels or ())
        return tuple(sorted(seen, key=lambda lab: self.label_key(frame, lab)))

    def label_dim(self, frame: Frame, label: str) -> Dim:
        d = frame.ivars.get(label)
        if d is None:
            raise Fail(Diagnostic("E0000", "unknown range"))
        return d

    def canonical(self, t: Tensor, frame: Frame, span: Span) -> Tensor:
        labels = t.labels or ()
        order = sorted(range(len(labels)), key=lambda i: self.label_key(frame, labels[i]))
        if order == list(range(len(labels))):
            return t
        return self.builder.emit("transpose", [t.ref], tuple(t.shape[i] for i in order), t.dtype,
                                 {"perm": order}, span=span,
                                 labels=tuple(labels[i] for i in order))

    def align(self, t: Tensor, union: tuple[str, ...], span: Span) -> Tensor:
        """Reshape a canonical labelled tensor to the rank of ``union`` (size-1 where absent)."""
        labels = t.labels or ()
        if labels == union:
            return t
        if not labels and t.rank == 0:
            return t
        pos = {lab: i for i, lab in enumerate(labels)}
        shape = tuple(t.shape[pos[lab]] if lab in pos else Dim.const(1) for lab in union)
        return self.builder.emit("reshape", [t.ref], shape, t.dtype,
                                 {"shape": [self.concrete(d) for d in shape]}, span=span,
                                 labels=union)

    def concrete(self, d: Dim) -> int | str:
        return d.value if d.value is not None else str(d)

    def lab(self, expr: A.Expr, frame: Frame) -> Any:
        """Evaluate inside index notation; tensors come back labelled."""
        if isinstance(expr, A.Name):
            v = self.lookup(frame, expr.name, expr.span)
            if isinstance(v, IndexVar):
                d = self.label_dim(frame, v.name)
                t = self.builder.emit("iota", [], (d,), "i32",
                                      {"shape": [self.concrete(d)], "axis": 0, "dtype": "i32"},
                                      span=expr.span, labels=(v.name,))
                return t
            if isinstance(v, Tensor):
                if v.rank == 0:
                    return v.relabel(())
                if frame.in_kernel and v.labels is None and frame.lookup_local(expr.name) is v:
                    return v.relabel(None)
                raise fail("E0304", f"tensor `{expr.name}` needs indices here", expr.span,
                           f"{type_str(v)} without indices",
                           help=f"index it: `{expr.name}[{self.suggest_indices(v, frame)}]`")
            if isinstance(v, Const | Poison):
                return v
            raise fail("E0351", f"cannot compute with {self.describe(v)}", expr.span)
        if isinstance(expr, A.IntLit | A.FloatLit | A.BoolLit):
            return self.value(expr, frame)
        if isinstance(expr, A.Unary):
            x = self.lab(expr.operand, frame)
            return self.elementwise("neg" if expr.op == "-" else "not", [x], expr.span, frame,
                                    labelled=True)
        if isinstance(expr, A.Binary):
            a = self.lab(expr.left, frame)
            b = self.lab(expr.right, frame)
            return self.elementwise(BINARY_OPERATORS[expr.op], [a, b], expr.span, frame,
                                    labelled=True)
        if isinstance(expr, A.Cast):
            return self.cast(self.lab(expr.operand, frame), expr, frame)
        if isinstance(expr, A.Call):
            name = expr.callee.name if isinstance(expr.callee, A.Name) else ""
            callee = self.lookup(frame, name, expr.callee.span) if name else None
            if isinstance(callee, Builtin) and (name in UNARY_FUNCTIONS or name in BINARY_FUNCTIONS
                                                or name == "select"):
                args = [self.lab(a, frame) for a in expr.args]
                return self.builtin_elementwise(name, args, expr, frame, labelled=True)
            if frame.in_kernel:
                return self.value(expr, frame)
            raise fail("E0370", "only elementwise functions can be called inside index notation",
                       expr.span, "a call on whole tensors",
                       help="compute it in its own statement: `let t = f(x)`, then index `t`")
        if isinstance(expr, A.Index):
            return self.read(expr, frame)
        if isinstance(expr, A.Reduce):
            return self.reduce(expr, frame)
        if isinstance(expr, A.IfExpr):
            return self.if_expr(expr, frame)
        if isinstance(expr, A.Field):
            v = self.field(expr, frame)
            if isinstance(v, Tensor) and v.rank > 0:
                raise fail("E0304", "this tensor needs indices here", expr.span,
                           f"{type_str(v)} without indices", help="index it: `x[i, j]`")
            return v.relabel(()) if isinstance(v, Tensor) else v
        if isinstance(expr, A.Tuple):
            raise fail("E0333", "a composite index `(a, b)` is only allowed inside `[...]`",
                       expr.span)
        return self.value(expr, frame)

    def suggest_indices(self, v: Tensor, frame: Frame) -> str:
        """Index variables of this statement that fit ``v``'s axes (`i0`, ... where none do)."""
        used: list[str] = []
        for k, d in enumerate(v.shape):
            fits = [n for n in list(frame.order) + list(frame.ivars)
                    if frame.ivars.get(n) == d and n not in used]
            used.append(fits[0] if fits else f"i{k}")
        return ", ".join(used)

    def builtin_elementwise(self, name: str, args: list[Any], expr: A.Call, frame: Frame,
                            labelled: bool) -> Any:
        want = 1 if name in UNARY_FUNCTIONS else (3 if name == "select" else 2)
        if len(args) != want:
            raise fail("E0371", f"`{name}` takes {want} argument{'s' if want > 1 else ''}, "
                       f"got {len(args)}", expr.span, "wrong number of arguments")
        prim = BINARY_FUNCTIONS.get(name, name)
        return self.elementwise(prim, args, expr.span, frame, labelled=labelled)

    # ---------------------------------------------------------------- reads
    def positions(self, expr: A.Index, base: Tensor, frame: Frame) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        used: set[str] = set()
        for idx in expr.indices:
            if isinstance(idx, A.Name) and idx.name in frame.ivars and idx.name not in used \
                    and frame.lookup_local(idx.name) is None:
                out.append(("var", idx.name))
                used.add(idx.name)
            elif isinstance(idx, A.Tuple) and all(
                    isinstance(i, A.Name) and i.name in frame.ivars and i.name not in used
                    for i in idx.items):
                names = [i.name for i in idx.items]  # type: ignore[union-attr]
                out.append(("composite", names))
                used.update(names)
            else:
                out.append(("expr", idx))
        return out

    def read(self, expr: A.Index, frame: Frame, canonical: bool = True) -> Any:
        base_expr = expr.base
        if frame.in_kernel and isinstance(base_expr, A.Name) and base_expr.name in frame.tensor_params \
                and not frame.memory_access:
            raise fail("E0503", f"tensor parameter `{base_expr.name}` is read outside `load`",
                       expr.span, "direct read",
                       help=f"read a tile with `load({self.src(expr)})`, with a mask where the "
                            "tile runs past the tensor")
        base = self.value(base_expr, frame) if not (
            isinstance(base_expr, A.Name) and base_expr.name in frame.tensor_params) \
            else frame.lookup_local(base_expr.name)
        if isinstance(base, Poison):
            return base
        if not isinstance(base, Tensor):
            raise fail("E0380", f"cannot index {self.describe(base)}", expr.span,
                       "not a tensor")
        if len(expr.indices) != base.rank:
            raise fail("E0303", f"{self.name_of(base_expr)} has {base.rank} "
                       f"dimension{'s' if base.rank != 1 else ''} but {len(expr.indices)} "
                       f"ind{'ices' if len(expr.indices) != 1 else 'ex'}", expr.span,
                       f"{type_str(base)}",
                       help="give one index per dimension")
        positions = self.positions(expr, base, frame)
        # Composite indices split one axis into several.
        shape: list[Dim] = []
        flat: list[tuple[str, Any]] = []
        split = False
        for axis, (kind, what) in enumerate(positions):
            if kind == "composite":
                dims = [self.label_dim(frame, n) for n in what]
                prod = Dim.const(1)
                for d in dims:
                    prod = prod * d
                if prod != base.shape[axis]:
                    parts = " * ".join(str(d) for d in dims)
                    covers = parts if parts == str(prod) else f"{parts} = {prod}"
                    raise fail("E0381", f"composite index ({', '.join(what)}) covers "
                               f"{covers} elements, but the axis has {base.shape[axis]}",
                               expr.indices[axis].span, f"axis of size {base.shape[axis]}",
                               help="the parts' ranges must multiply to the axis size",
                               secondary=[(self.var_origin(frame, n), f"`{n}` ranges over "
                                           f"{frame.ivars[n]} here") for n in what])
                shape.extend(dims)
                flat.extend(("var", n) for n in what)
                split = True
            else:
                shape.append(base.shape[axis])
                flat.append((kind, what))
        for axis, (kind, what) in enumerate(flat):
            if kind == "var":
                d = self.label_dim(frame, what)
                if d != shape[axis]:
                    raise fail("E0301", f"index `{what}` ranges over {d} but is used for an axis "
                               f"of size {shape[axis]}", self.index_span(expr, axis, positions),
                               f"axis of size {shape[axis]}",
                               help=self.swap_hint(expr, flat, shape, axis, frame) or (
                                   f"an index variable ranges over one dimension: check the "
                                   f"order of the indices here and where `{what}` got its range"),
                               secondary=[(self.var_origin(frame, what), f"`{what}` ranges over "
                                           f"{d} here")])
        t = base
        if split:
            t = self.builder.emit("reshape", [base.ref], tuple(shape), base.dtype,
                                  {"shape": [self.concrete(d) for d in shape]}, span=expr.span)
        if all(kind == "var" for kind, _ in flat):
            labelled = Tensor(t.ref, tuple(shape), t.dtype, t.kind,
                              tuple(what for _, what in flat))
            return self.canonical(labelled, frame, expr.span) if canonical else labelled
        computed = [i for i, (kind, _) in enumerate(flat) if kind == "expr"]
        if len(computed) == 1:
            taken = self.take(t, tuple(shape), flat, computed[0], expr, frame)
            if taken is not None:
                return taken
        return self.gather(t, tuple(shape), flat, expr, frame)

    def swap_hint(self, expr: A.Index, flat: list, shape: list, axis: int,
                  frame: Frame) -> str:
        """`x[c, r]` where `x[r, c]` fits: suggest the swap (plain indices only)."""
        if len(flat) != len(expr.indices):
            return ""
        d = frame.ivars[flat[axis][1]]
        for j, (kind, other) in enumerate(flat):
            if j != axis and kind == "var" and frame.ivars[other] == shape[axis] and \
                    d == shape[j]:
                texts = [self.src(i) for i in expr.indices]
                texts[axis], texts[j] = texts[j], texts[axis]
                return (f"the indices look swapped: `{other}` ranges over {shape[axis]}; write "
                        f"`{self.src(expr.base)}[{', '.join(texts)}]`")
        return ""

    def index_tensor(self, what: A.Expr, frame: Frame) -> Any:
        v = self.lab(what, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            if v.dtype not in ("int", *DT.INTS):
                raise fail("E0382", "an index must be an integer", what.span, f"{v.dtype} here")
            return self.constant(v, "i32", what.span, labels=())
        if not DT.is_int(v.dtype):
            raise fail("E0382", f"an index must be an integer, found {v.dtype}", what.span,
                       "not an integer", help="convert it: `(x as i32)`")
        return v

    def take(self, t: Tensor, shape: tuple[Dim, ...], flat: list[tuple[str, Any]], axis: int,
             expr: A.Index, frame: Frame) -> Tensor | None:
        """`x[i, f(j), k]`: one computed position whose indices are new is numpy's `take`."""
        what = flat[axis][1]
        others = {w for k, w in flat if k == "var"}
        if any(isinstance(n, A.Name) and n.name in others for n in walk(what)):
            return None
        idx = self.index_tensor(what, frame)
        if isinstance(idx, Poison):
            return idx  # type: ignore[return-value]
        labels = tuple(w for _, w in flat[:axis]) + tuple(idx.labels or ()) + tuple(
            w for _, w in flat[axis + 1:])
        out_shape = shape[:axis] + idx.shape + shape[axis + 1:]
        bounds = "unchecked" if self.reads_tensor(what, frame) else "zero"
        result = self.builder.emit("take", [t.ref, idx.ref], out_shape, t.dtype,
                                   {"axis": axis, "bounds": bounds}, span=expr.span,
                                   labels=labels)
        return self.canonical(result, frame, expr.span)

    def gather(self, t: Tensor, shape: tuple[Dim, ...], flat: list[tuple[str, Any]],
               expr: A.Index, frame: Frame) -> Tensor:
        last_expr = max(i for i, (k, _) in enumerate(flat) if k == "expr")
        lead, trail = flat[:last_expr + 1], flat[last_expr + 1:]
        indices: list[Any] = []
        # One position computed without reading a tensor reads 0 outside its axis, so the
        # whole gather is bounds "zero" (in-range data-dependent positions read the same).
        affine = False
        for _axis, (kind, what) in enumerate(lead):
            if kind == "var":
                d = self.label_dim(frame, what)
                indices.append(self.builder.emit(
                    "iota", [], (d,), "i32", {"shape": [self.concrete(d)], "axis": 0,
                                              "dtype": "i32"}, span=expr.span, labels=(what,)))
            else:
                if not self.reads_tensor(what, frame):
                    affine = True
                v = self.index_tensor(what, frame)
                if isinstance(v, Poison):
                    return v  # type: ignore[return-value]
                indices.append(v)
        trail_vars = {what for _, what in trail}
        index_labels = self.union_labels(indices, frame)
        if trail_vars & set(index_labels):
            raise fail("E0383", "an index variable appears both in a computed index and as a "
                       "plain index after it", expr.span, "ambiguous gather",
                       help="reorder the computation, or compute the positions in a `let` first")
        aligned = [self.align(ix, index_labels, expr.span) for ix in indices]
        # The graph's gather takes index tensors of one rank: constant positions too.
        aligned = [self.builder.emit("reshape", [ix.ref], (Dim.const(1),) * len(index_labels),
                                     ix.dtype, {"shape": [1] * len(index_labels)},
                                     span=expr.span, labels=index_labels)
                   if ix.rank != len(index_labels) else ix for ix in aligned]
        out_shape = tuple(self.label_dim(frame, lab) for lab in index_labels) + tuple(
            shape[len(lead):])
        labels = index_labels + tuple(what for _, what in trail)
        result = self.builder.emit(
            "gather", [t.ref] + [ix.ref for ix in aligned], out_shape, t.dtype,
            {"indexed_axes": len(lead), "bounds": "zero" if affine else "unchecked"},
            span=expr.span, labels=labels)
        return self.canonical(result, frame, expr.span)

    def reads_tensor(self, expr: A.Expr, frame: Frame) -> bool:
        for node in walk(expr):
            if isinstance(node, A.Index):
                return True
            if isinstance(node, A.Name) and isinstance(frame.lookup_local(node.name), Tensor):
                return True
        return False

    def name_of(self, expr: A.Expr) -> str:
        if isinstance(expr, A.Name):
            return f"`{expr.name}`"
        if isinstance(expr, A.Field):
            return f"`{self.name_of(expr.base).strip('`')}.{expr.name}`"
        return "this tensor"

    def index_span(self, expr: A.Index, flat_axis: int, positions: list) -> Span:
        axis = 0
        for i, (kind, what) in enumerate(positions):
            width = len(what) if kind == "composite" else 1
            if flat_axis < axis + width:
                return expr.indices[i].span
            axis += width
        return expr.span

    def var_origin(self, frame: Frame, name: str) -> Span | None:
        return frame.var_spans.get(name)

    # ---------------------------------------------------------------- reductions
    def reduce(self, expr: A.Reduce, frame: Frame) -> Any:
        names = []
        for b in expr.binders:
            for leaf in leaves(b):
                if leaf.name in frame.ivars and leaf.name not in frame.reduce_vars:
                    raise fail("E0306", f"reduction variable `{leaf.name}` shadows an index "
                               "variable", leaf.span, "already bound",
                               help="use a different name for the reduced index")
                names.append(leaf.name)
                if frame.ivars.get(leaf.name) is None:
                    raise fail("E0307", f"cannot tell what `{leaf.name}` ranges over",
                               leaf.span, "range unknown",
                               help=f"use `{leaf.name}` as a plain index of a tensor, or give "
                                    f"its range: `{expr.kind}[{leaf.name}: N]`")
                self.label_key(frame, leaf.name)
        acc_name = expr.accumulate
        factors = product_factors(expr.body)
        dependent = [f for f in factors if mentions(f, set(names))]
        if expr.kind == "sum" and len(dependent) == 2 and all(
                self.is_plain_read(f, frame) for f in dependent):
            return self.contract(expr, names, factors, dependent, frame)
        body = self.lab(expr.body, frame)
        if isinstance(body, Poison):
            return body
        if isinstance(body, Const):
            body = self.constant(body, "f32" if body.dtype in ("float", "int") else body.dtype,
                                 expr.span, labels=())
        return self.reduce_tensor(expr, body, names, acc_name, frame)

    def reduce_tensor(self, expr: A.Reduce, body: Tensor, names: list[str],
                      acc_name: A.Name | None, frame: Frame) -> Tensor:
        labels = body.labels or ()
        missing = [n for n in names if n not in labels]
        if missing:
            full = self.union_labels([body.relabel(labels + tuple(missing))], frame)
            aligned = self.align(body, full, expr.span)
            shape = tuple(self.label_dim(frame, lab) for lab in full)
            body = self.builder.emit("broadcast", [aligned.ref], shape, body.dtype,
                                     {"shape": [self.concrete(d) for d in shape]}, span=expr.span,
                                     labels=full)
            labels = full
        axes = [i for i, lab in enumerate(labels) if lab in names]
        acc = self.eval_dtype(acc_name, frame) if acc_name else DT.accumulator(expr.kind,
                                                                                 body.dtype)
        if body.dtype == "bool" and expr.kind in ("max", "min"):
            raise fail("E0390", f"`{expr.kind}` over bool values", expr.span, "bool",
                       help="convert to a number first")
        out_dtype = body.dtype if expr.kind in ("max", "min") else acc
        keep = tuple(lab for lab in labels if lab not in names)
        shape = tuple(self.label_dim(frame, lab) for lab in keep)
        return self.builder.emit(
            "reduce", [body.ref], shape, out_dtype,
            {"kind": expr.kind, "axes": axes, "accumulate": acc,
             "identity": REDUCTION_IDENTITIES[expr.kind]}, span=expr.span, labels=keep)

    def is_plain_read(self, expr: A.Expr, frame: Frame) -> bool:
        if isinstance(expr, A.Cast):
            return self.is_plain_read(expr.operand, frame)
        if not isinstance(expr, A.Index):
            return False
        seen: set[str] = set()
        for idx in expr.indices:
            names = [idx] if isinstance(idx, A.Name) else (
                idx.items if isinstance(idx, A.Tuple) else None)
            if names is None:
                return False
            for n in names:
                if not isinstance(n, A.Name) or n.name not in frame.ivars or n.name in seen:
                    return False
                seen.add(n.name)
        return True

    def raw_read(self, expr: A.Expr, frame: Frame) -> Any:
        """A plain read without transposing to canonical order: einsum takes any order."""
        if isinstance(expr, A.Cast):
            return self.cast(self.raw_read(expr.operand, frame), expr, frame)
        assert isinstance(expr, A.Index)
        return self.read(expr, frame, canonical=False)

    def contract(self, expr: A.Reduce, names: list[str], factors: list[A.Expr],
                 dependent: list[A.Expr], frame: Frame) -> Any:
        a = self.raw_read(dependent[0], frame)
        b = self.raw_read(dependent[1], frame)
        if isinstance(a, Poison) or isinstance(b, Poison):
            return POISON
        dtype = DT.promote(a.dtype, b.dtype)
        if dtype is None:
            raise fail("E0352", f"cannot mix element types `{a.dtype}` and `{b.dtype}`",
                       expr.body.span, "mixed here", help=f"convert one: `(...) as {a.dtype}`")
        if a.dtype != dtype:
            a = self.builder.emit("convert", [a.ref], a.shape, dtype, {"dtype": dtype},
                                  span=expr.span, labels=a.labels)
        if b.dtype != dtype:
            b = self.builder.emit("convert", [b.ref], b.shape, dtype, {"dtype": dtype},
                                  span=expr.span, labels=b.labels)
        union = self.union_labels([a, b], frame)
        keep = tuple(lab for lab in union if lab not in names)
        letters = {lab: chr(ord("a") + i) for i, lab in enumerate(union)}
        spec = (''.join(letters[x] for x in a.labels) + "," + ''.join(letters[x] for x in b.labels)
                + "->" + ''.join(letters[x] for x in keep))
        acc = self.eval_dtype(expr.accumulate, frame) if expr.accumulate else DT.accumulator(
            "sum", dtype)
        shape = tuple(self.label_dim(frame, lab) for lab in keep)
        result: Any = self.builder.emit("contract", [a.ref, b.ref], shape, acc,
                                        {"spec": spec, "accumulate": acc}, span=expr.span,
                                        labels=keep)
        for f in factors:
            if f is dependent[0] or f is dependent[1]:
                continue
            result = self.elementwise("mul", [result, self.lab(f, frame)], expr.span, frame,
                                      labelled=True)
        return result

    # ---------------------------------------------------------------- range inference
    def infer_ranges(self, expr: A.Expr, frame: Frame, lhs_positions: A.Index | None = None) -> None:
        """Give every index variable the dim it ranges over, from plain uses in reads."""
        spans = frame.var_spans
        for node in walk(expr):
            if isinstance(node, A.Reduce):
                for b in node.binders:
                    for leaf in leaves(b):
                        if leaf.name in frame.ivars and leaf.name not in frame.reduce_vars:
                            raise fail("E0306", f"reduction variable `{leaf.name}` shadows an "
                                       "index variable", leaf.span, "already bound",
                                       help="use a different name for the reduced index")
                        frame.ivars[leaf.name] = (self.eval_dim(leaf.dim, frame)
                                                  if leaf.dim is not None else None)
                        frame.reduce_vars.add(leaf.name)
                        if leaf.dim is not None:
                            spans[leaf.name] = leaf.span
        for _ in range(3):
            changed = False
            targets = [n for n in walk(expr) if isinstance(n, A.Index)]
            if lhs_positions is not None:
                targets.append(lhs_positions)
            for node in targets:
                base = self.peek_tensor(node.base, frame)
                if base is not None and len(node.indices) != base.rank and \
                        node is not lhs_positions:
                    raise fail("E0303", index_count(self.name_of(node.base), base.rank,
                                                    len(node.indices)),
                               node.span, type_str(base), help="give one index per dimension")
                if base is None or len(node.indices) != base.rank:
                    continue
                seen: set[str] = set()
                for axis, idx in enumerate(node.indices):
                    # A variable repeated in one read (`x[i, i]`) is a computed position the
                    # second time (see `positions`): only its first use gives its range.
                    if isinstance(idx, A.Name) and idx.name in seen:
                        continue
                    names = [idx] if isinstance(idx, A.Name) else (
                        idx.items if isinstance(idx, A.Tuple) else [])
                    seen.update(n.name for n in names if isinstance(n, A.Name))
                    changed |= self.infer_position(idx, base.shape[axis], frame, spans,
                                                   weak=node is lhs_positions)
            if not changed:
                break

    def infer_position(self, idx: A.Expr, size: Dim, frame: Frame, spans: dict,
                       weak: bool = False) -> bool:
        if isinstance(idx, A.Name) and idx.name in frame.ivars and frame.lookup_local(
                idx.name) is None:
            if frame.ivars[idx.name] is None:
                frame.ivars[idx.name] = size
                spans.setdefault(idx.name, idx.span)
                return True
            return False
        if isinstance(idx, A.Tuple) and all(isinstance(i, A.Name) and i.name in frame.ivars
                                            for i in idx.items):
            unknown = [i for i in idx.items if frame.ivars[i.name] is None]  # type: ignore[union-attr]
            if len(unknown) == 1:
                known = Dim.const(1)
                for i in idx.items:
                    if i is not unknown[0]:
                        known = known * frame.ivars[i.name]  # type: ignore[union-attr,operator]
                frame.ivars[unknown[0].name] = size / known  # type: ignore[union-attr]
                spans.setdefault(unknown[0].name, unknown[0].span)  # type: ignore[union-attr]
                return True
        return False

    def peek_tensor(self, expr: A.Expr, frame: Frame) -> Tensor | None:
        """The tensor a read's base names, without emitting anything (None if not simple)."""
        if isinstance(expr, A.Name):
            v = frame.lookup_local(expr.name)
            return v if isinstance(v, Tensor) else None
        if isinstance(expr, A.Field):
            try:
                v = self.field(expr, frame)
            except Fail as f:
                if f.diag.code in ("E0340", "E0341", "E0342"):
                    raise  # the member itself is wrong: say so, not "range unknown"
                return None
            return v if isinstance(v, Tensor) else None
        return None

    # ---------------------------------------------------------------- let y[...] = ...
    def bind_binders(self, binders: list[A.IndexBinder], frame: Frame) -> list[str]:
        names: list[str] = []
        spans = frame.var_spans
        for b in binders:
            for leaf in leaves(b):
                if leaf.name in names:
                    raise fail("E0308", f"index `{leaf.name}` appears twice on the left",
                               leaf.span, "repeated", help="each result axis needs its own index")
                if frame.lookup_local(leaf.name) is not None:
                    raise fail("E0309", f"index `{leaf.name}` shadows a variable", leaf.span,
                               "already a variable", help="pick another index name")
                names.append(leaf.name)
                frame.ivars[leaf.name] = (self.eval_dim(leaf.dim, frame) if leaf.dim is not None
                                          else None)
                if leaf.dim is not None:
                    spans[leaf.name] = leaf.span
        frame.order = list(names)
        return names

    def check_free_indices(self, stmt: A.Let, names: list[str], frame: Frame) -> None:
        """`let y[r] = x[r, c]`: a plain index that names nothing is a free index (E0305)."""
        reduced = {leaf.name for n in walk(stmt.value) if isinstance(n, A.Reduce)
                   for b in n.binders for leaf in leaves(b)}
        for node in walk(stmt.value):
            if not isinstance(node, A.Index):
                continue
            for idx in node.indices:
                for n in (idx.items if isinstance(idx, A.Tuple) else [idx]):
                    if not isinstance(n, A.Name) or n.name in names or n.name in reduced \
                            or n.name in frame.ivars or n.name in frame.env \
                            or n.name == "self" or n.name in DT.DTYPES \
                            or frame.lookup_local(n.name) is not None \
                            or self.resolve_quiet(frame, n.name) is not None:
                        continue
                    raise fail("E0305", f"index `{n.name}` is not on the left-hand side",
                               n.span, "free index",
                               help=f"add it to the result (`let {stmt.name}"
                                    f"[{', '.join([*names, n.name])}] = ...`) or reduce over it "
                                    f"(`sum[{n.name}] ...`)")

    def index_let(self, stmt: A.Let, frame: Frame) -> Any:
        assert stmt.binders is not None
        names = self.bind_binders(stmt.binders, frame)
        self.check_free_indices(stmt, names, frame)
        self.infer_ranges(stmt.value, frame)
        for b in stmt.binders:
            for leaf in leaves(b):
                if frame.ivars.get(leaf.name) is None:
                    help = (f"use `{leaf.name}` as a plain index of a tensor on the right, or "
                            f"give its range: `let {stmt.name}[{leaf.name}: N]`")
                    called = [n.base for n in walk(stmt.value) if isinstance(n, A.Index)
                              and isinstance(n.base, A.Call) and mentions(n, {leaf.name})]
                    if called:
                        help = (f"`{self.src(called[0])}` is indexed before its shape is known: "
                                f"bind it first (`let t = {self.src(called[0])}`), then index `t`")
                    raise fail("E0307", f"cannot tell what `{leaf.name}` ranges over", leaf.span,
                               "range unknown", help=help)
        v = self.lab(stmt.value, frame)
        if isinstance(v, Poison):
            return v
        if isinstance(v, Const):
            dtype = {"float": "f32", "int": "i32", "bool": "bool"}.get(v.dtype, v.dtype)
            v = self.constant(v, dtype, stmt.value.span, labels=())
        free = [lab for lab in (v.labels or ()) if lab not in names]
        if free:
            raise fail("E0305", f"index `{free[0]}` is not on the left-hand side", stmt.value.span,
                       "free index here",
                       help=f"add it to the result (`let {stmt.name}[{', '.join(names + free)}]`) "
                            f"or reduce it (`sum[{free[0]}] ...`)")
        full = tuple(names)
        shape = tuple(self.label_dim(frame, n) for n in names)
        if v.labels != full:
            aligned = self.align(v, full, stmt.span)
            if aligned.shape != shape:
                aligned = self.builder.emit("broadcast", [aligned.ref], shape, v.dtype,
                                            {"shape": [self.concrete(d) for d in shape]},
                                            span=stmt.span, labels=full)
            v = aligned
        if any(b.parts for b in stmt.binders):
            merged: list[Dim] = []
            for b in stmt.binders:
                prod = Dim.const(1)
                for leaf in leaves(b):
                    prod = prod * frame.ivars[leaf.name]  # type: ignore[operator]
                merged.append(prod)
            v = self.builder.emit("reshape", [v.ref], tuple(merged), v.dtype,
                                  {"shape": [self.concrete(d) for d in merged]}, span=stmt.span)
        v = v.relabel(None)
        return self.builder.rename_last(v, stmt.name)

    # ---------------------------------------------------------------- state writes
    def state_write(self, target: A.Index, value: A.Expr, span: Span, frame: Frame) -> None:
        state = self.value(target.base, frame)
        if isinstance(state, Poison):
            return
        if not (isinstance(state, Tensor) and state.kind == "state"):
            raise fail("E0420", f"only states can be written in place; {self.name_of(target.base)} "
                       f"is {'a parameter' if isinstance(state, Tensor) and state.kind == 'param' else self.describe(state)}",
                       target.span, "not a state",
                       help="declare it in the block with `state name: Tensor[...]`, or bind a new "
                            "value with `let`")
        if len(target.indices) != state.rank:
            raise fail("E0303", index_count(self.name_of(target.base), state.rank,
                                            len(target.indices)), target.span, type_str(state),
                       help="give one index per dimension")
        lhs_vars: list[str] = []
        for idx in target.indices:
            for node in walk(idx):
                if isinstance(node, A.Name) and node.name not in lhs_vars and \
                        frame.lookup_local(node.name) is None and node.name not in frame.env \
                        and self.resolve_quiet(frame, node.name) is None:
                    lhs_vars.append(node.name)
                    frame.ivars[node.name] = None
        frame.order = list(lhs_vars)
        self.infer_ranges(value, frame)
        # Ranges also come from plain indices of reads inside positions (`self.s[p[l]] = ...`).
        self.infer_ranges(A.Tuple(list(target.indices), span), frame, lhs_positions=target)
        for n in lhs_vars:
            if frame.ivars[n] is None:
                raise fail("E0307", f"cannot tell what `{n}` ranges over", target.span,
                           "range unknown", help="use it as a plain index on the right-hand side")
        v = self.lab(value, frame)
        if isinstance(v, Poison):
            return
        if isinstance(v, Const):
            v = self.constant(v, state.dtype, value.span, labels=())
        if v.dtype != state.dtype:
            raise fail("E0421", f"writing {v.dtype} values into a {state.dtype} state", value.span,
                       f"{v.dtype} here", help=f"convert explicitly: `(...) as {state.dtype}`")
        free = [lab for lab in (v.labels or ()) if lab not in lhs_vars]
        if free:
            raise fail("E0305", f"index `{free[0]}` of the value is not used on the left",
                       value.span, "free index", help="every index of the value must say where "
                       "it is written")
        # Trailing plain full-range axes stay slices; the rest are indexed.
        k = state.rank
        trailing: list[str] = []
        while k > 0:
            idx = target.indices[k - 1]
            if (isinstance(idx, A.Name) and idx.name in lhs_vars and idx.name not in trailing
                    and frame.ivars[idx.name] == state.shape[k - 1]
                    and lhs_vars[-1 - len(trailing)] == idx.name
                    # `s[n, n]`, `s[n + 1, n]`: n also positions an earlier axis
                    and not any(mentions(target.indices[j], {idx.name})
                                for j in range(k - 1))):
                trailing.insert(0, idx.name)
                k -= 1
            else:
                break
        indices = []
        for axis in range(k):
            idx = target.indices[axis]
            iv = self.lab(idx, frame)
            if isinstance(iv, Const):
                iv = self.constant(iv, "i32", idx.span, labels=())
            if not isinstance(iv, Tensor) or not DT.is_int(iv.dtype):
                raise fail("E0382", "a state position must be an integer", idx.span)
            indices.append(iv)
        lead = tuple(lab for lab in lhs_vars if lab not in trailing)
        aligned_idx = [self.align(ix, lead, span) for ix in indices]
        # The graph's scatter takes positions of one rank: constant positions too.
        aligned_idx = [self.builder.emit("reshape", [ix.ref], (Dim.const(1),) * len(lead),
                                         ix.dtype, {"shape": [1] * len(lead)}, span=span,
                                         labels=lead)
                       if ix.rank != len(lead) else ix for ix in aligned_idx]
        full = lead + tuple(trailing)
        shape = tuple(self.label_dim(frame, lab) for lab in full)
        vv = self.align(v, full, span)
        if vv.shape != shape:
            vv = self.builder.emit("broadcast", [vv.ref], shape, vv.dtype,
                                   {"shape": [self.concrete(d) for d in shape]}, span=span,
                                   labels=full)
        self.builder.effect("scatter", [state.ref, vv.ref] + [ix.ref for ix in aligned_idx],
                            {"indexed_axes": k, "path": state.ref[1:]}, span)

    def resolve_quiet(self, frame: Frame, name: str) -> Any:
        try:
            return self.resolve_global(frame.module, name, Span(frame.module.source, 0, 0)) or (
                Builtin(name) if name in BUILTINS else None)
        except Fail:
            return None

    # ================================================================ calls
    def call(self, expr: A.Call, frame: Frame, statement: bool = False) -> Any:
        callee = self.value(expr.callee, frame) if not isinstance(expr.callee, A.Name) else \
            self.lookup(frame, expr.callee.name, expr.callee.span)
        if isinstance(callee, Poison):
            return callee
        if isinstance(callee, Builtin):
            return self.builtin_call(callee.name, expr, frame)
        if isinstance(callee, BlockInst):
            method = callee.decl.method("forward")
            if method is None:
                methods = [m.name for m in callee.decl.methods]
                raise fail("E0430", f"block `{callee.decl.name}` has no `forward` method to call",
                           expr.span, "called like a function",
                           help=("call one of its methods: " + ", ".join(
                               f"`{self.src(expr.callee)}.{m}(...)`" for m in methods))
                           if methods else f"give `{callee.decl.name}` a `fn forward(...)`",
                           secondary=[(callee.decl.name_span, "declared here")])
            callee = FuncRef(method, callee)
        if isinstance(callee, A.BlockDecl):
            raise fail("E0431", f"`{callee.name}` is a block type, not a function", expr.span,
                       "not callable", help="declare it as a member (`block x: "
                       f"{callee.name}<...>`) and call the member")
        if not isinstance(callee, FuncRef):
            raise fail("E0432", f"cannot call {self.describe(callee)}", expr.callee.span,
                       "not a function")
        decl = callee.decl
        if decl.kind == "kernel":
            raise fail("E0502", f"kernel `{decl.name}` cannot be called directly", expr.span,
                       "a kernel call", help="bind it to an op: `op f<...>(...) -> T kernel "
                       f"{decl.name}<...> {{ body }}`, and call the op")
        if decl.kind == "entry":
            raise fail("E0433", f"entry `{decl.name}` cannot be called from Linnet code",
                       expr.span, help="entries are called by the runtime; move the shared code "
                       "into a `fn`")
        args = [self.value(a, frame) for a in expr.args]
        if any(isinstance(a, Poison) for a in args):
            return POISON
        return self.invoke(callee, args, expr, frame)

    def invoke(self, ref: FuncRef, args: list[Any], expr: A.Call, frame: Frame) -> Any:
        decl = ref.decl
        if len(args) != len(decl.params):
            raise fail("E0440", f"`{decl.name}` takes {len(decl.params)} argument"
                       f"{'s' if len(decl.params) != 1 else ''} but {len(args)} "
                       f"{'were' if len(args) != 1 else 'was'} given", expr.span,
                       f"{len(args)} argument{'s' if len(args) != 1 else ''}",
                       secondary=[(decl.name_span, f"`{decl.name}` defined here")],
                       help="parameters: " + ", ".join(p.name for p in decl.params))
        base_env = dict(ref.owner.env) if ref.owner else {}
        env = self.bind_generics(decl, args, expr, frame, base_env)
        assert decl.module is not None
        callee_frame = Frame(decl.module, env, ref.owner, decl)
        result_types = [self.tensor_type(r.type, callee_frame) for r in decl.results]
        if self.lowering:
            self.check_where(decl, callee_frame, expr.span)
        if not self.lowering:
            if frame.func is not None:
                self.call_edges.append((frame.func, decl, expr.span))
            if not result_types:
                return None
            shape, dtype = result_types[0]
            if len(result_types) > 1:
                return tuple(Tensor("%?", s, d) for s, d in result_types)
            return Tensor("%?", shape, dtype) if shape else (
                Tensor("%?", (), dtype) if not DT.is_concrete(dtype) or True else None)
        path = ref.owner.path if ref.owner else (frame.owner.path if frame.owner else "")
        attrs: dict[str, Any] = {}
        if decl.kernel is not None:
            attrs = self.kernel_binding_attrs(decl, callee_frame)
        # The call's arguments and results, so that emitters and backends can replace the
        # whole span with one library call (F.linear, SDPA...) without re-deriving them.
        attrs["args"] = [self.argument_record(a) for a in args]
        for k, (outer, _) in enumerate(self.call_stack):
            if outer is decl:  # lowering with check=False: the checker did not see it
                raise recursion_error([d for d, _ in self.call_stack[k:]] + [decl], expr.span)
        if len(self.call_stack) >= MAX_DEPTH:
            first = self.call_stack[0][0]
            raise fail("E0209", f"calls nest more than {MAX_DEPTH} deep, from `{first.name}` "
                       f"to `{decl.name}`", expr.span, "the limit is reached at this call",
                       help="every call is inlined; call fewer functions inside one another",
                       secondary=[(first.name_span, f"`{first.name}` defined here")])
        self.call_stack.append((decl, expr.span))
        # A method called on an element of a repeated block array records which element.
        iteration = ref.owner.iteration if ref.owner else None
        repeated = ref.owner.repeated if ref.owner else ""
        call = self.builder.open_call(decl.qualified_name, decl.kind, path, expr.span, attrs,
                                      iteration=iteration, repeated=repeated)
        try:
            for p, a in zip(decl.params, args):
                callee_frame.bind(p.name, a)
            self.run_body(decl.body, callee_frame)
            returned = callee_frame.returned or []
            if len(returned) != len(result_types):
                raise fail("E0441", f"`{decl.name}` returns {len(returned)} values but declares "
                           f"{len(result_types)}", decl.name_span, "declared here",
                           help="return one value per declared result")
            out = []
            for value, (shape, dtype), res in zip(returned, result_types, decl.results):
                out.append(self.check_return(value, shape, dtype, res, decl))
            if call is not None:
                call.attributes["results"] = [self.argument_record(v) for v in out]
            self.builder.close_call(call)
        finally:
            self.call_stack.pop()
        return out[0] if len(out) == 1 else (tuple(out) if out else None)

    def argument_record(self, value: Any) -> Any:
        """How a call's argument or result appears in the graph: a `%`/`@` ref or a literal."""
        if isinstance(value, Tensor):
            return value.ref
        if isinstance(value, Const):
            v = value.value
            return v.value if isinstance(v, Dim) else v
        return None

    def check_return(self, value: Any, shape: tuple[Dim, ...], dtype: str, res: A.Result,
                     decl: A.FuncDecl) -> Any:
        if isinstance(value, Const) and not shape:
            return value
        if not isinstance(value, Tensor):
            raise fail("E0442", f"`{decl.name}` returns {self.describe(value)} but declares a "
                       "tensor", res.span, "declared result")
        if value.shape != shape:
            raise fail("E0443", f"`{decl.name}` returns {shape_str(value.shape)} but declares "
                       f"{shape_str(shape)}", res.span, "declared result type",
                       help="make the body's result match the declared type")
        if value.dtype != dtype:
            raise fail("E0444", f"`{decl.name}` returns {value.dtype} but declares {dtype}",
                       res.span, "declared element type",
                       help=f"convert explicitly before returning: `return y as {dtype}` "
                            "(Linnet never narrows silently)")
        return value

    def bind_generics(self, decl: A.FuncDecl, args: list[Any], expr: A.Call, frame: Frame,
                      env: dict[str, Any]) -> dict[str, Any]:
        generic_names = {g.name: g for g in decl.generics}
        if expr.generic_args:
            if len(expr.generic_args) > len(decl.generics):
                raise fail("E0445", f"`{decl.name}` takes {len(decl.generics)} generic "
                           f"arguments, got {len(expr.generic_args)}", expr.span)
            for g, a in zip(decl.generics, expr.generic_args):
                env[g.name] = self.generic_value(g, a, frame)
        pending: list[tuple[A.Expr, Dim, A.Param, int]] = []
        for p, a in zip(decl.params, args):
            if isinstance(p.type, A.TensorType):
                if not isinstance(a, Tensor):
                    raise fail("E0446", f"argument `{p.name}` of `{decl.name}` must be a tensor, "
                               f"got {self.describe(a)}", self.arg_span(expr, p, decl),
                               "not a tensor", secondary=[(p.span, "parameter declared here")])
                if len(p.type.dims) != a.rank:
                    raise fail("E0447", f"argument `{p.name}` of `{decl.name}` has "
                               f"{a.rank} dimension{'s' if a.rank != 1 else ''}, expected "
                               f"{len(p.type.dims)}",
                               self.arg_span(expr, p, decl), type_str(a),
                               secondary=[(p.span, "parameter declared here")])
                self.bind_dtype(p.type.dtype, a.dtype, env, generic_names, p, expr, decl)
                for axis, (dexpr, size) in enumerate(zip(p.type.dims, a.shape)):
                    pending.append((dexpr, size, p, axis))
            elif isinstance(p.type, A.ScalarType):
                if isinstance(a, Tensor) and a.rank == 0:
                    self.bind_dtype(A.Name(p.type.name, p.type.span), a.dtype, env,
                                    generic_names, p, expr, decl)
                elif not isinstance(a, Const):
                    raise fail("E0448", f"argument `{p.name}` of `{decl.name}` must be a scalar "
                               f"{p.type.name}, got {self.describe(a)}",
                               self.arg_span(expr, p, decl), "not a scalar",
                               secondary=[(p.span, "parameter declared here")])
        for _ in range(len(pending) + 1):
            progress = False
            for item in list(pending):
                dexpr, size, p, axis = item
                if isinstance(dexpr, A.Name) and dexpr.name in generic_names and \
                        dexpr.name not in env:
                    env[dexpr.name] = size
                    pending.remove(item)
                    progress = True
                    continue
                unknown = {n.name for n in walk(dexpr) if isinstance(n, A.Name)
                           and n.name in generic_names and n.name not in env}
                if len(unknown) == 1:
                    (u,) = unknown
                    trial = Frame(decl.module or frame.module, {**env, u: Dim.symbol("?" + u)})
                    solved = solve_for(self.eval_dim(dexpr, trial), size, {"?" + u})
                    if solved is None:
                        continue
                    env[u] = solved[1]
                    pending.remove(item)
                    progress = True
                    continue
                if unknown:
                    continue
                want = self.eval_dim(dexpr, Frame(decl.module or frame.module, env))
                if want != size:
                    raise fail("E0449", f"argument `{p.name}` of `{decl.name}`: axis {axis} has "
                               f"size {size}, expected {want}", self.arg_span(expr, p, decl),
                               f"size {size}",
                               secondary=[(dexpr.span, f"expected {want} here"), *self.binding_notes(dexpr, env, generic_names)],
                               help="the argument's shape must match the parameter's type")
                pending.remove(item)
                progress = True
            if not progress:
                break
        if pending:
            dexpr, size, p, axis = pending[0]
            raise fail("E0450", f"cannot infer the dims in `{self.src(dexpr)}` for `{decl.name}`",
                       dexpr.span, "not inferable",
                       help="name a generic on its own in some parameter's type, or pass it: "
                            f"`{decl.name}<...>(...)`")
        for g in decl.generics:
            if g.name not in env:
                if g.default is not None:
                    env[g.name] = self.generic_value(g, g.default, Frame(decl.module or frame.module, env))
                    continue
                raise fail("E0451", f"cannot infer generic `{g.name}` of `{decl.name}`",
                           expr.span, "in this call", secondary=[(g.span, "declared here")],
                           help=f"no argument's shape mentions `{g.name}`: pass the generics "
                                f"explicitly, `{decl.name}<"
                                f"{', '.join(gg.name for gg in decl.generics)}>(...)`, with the "
                                "sizes you mean")
        return env

    def binding_notes(self, dexpr: A.Expr, env: dict, generic_names: dict) -> list:
        return []

    def src(self, expr: A.Expr) -> str:
        s = expr.span
        return s.source.text[s.start:s.stop]

    def arg_span(self, expr: A.Call, p: A.Param, decl: A.FuncDecl) -> Span:
        i = decl.params.index(p)
        return expr.args[i].span if i < len(expr.args) else expr.span

    def bind_dtype(self, want: A.Name, have: str, env: dict, generic_names: dict, p: A.Param,
                   expr: A.Call, decl: A.FuncDecl) -> None:
        name = want.name
        if name in generic_names:
            if name not in env:
                env[name] = have
                return
            bound = env[name]
        else:
            bound = env.get(name, name)
        if bound != have:
            raise fail("E0452", f"argument `{p.name}` of `{decl.name}` is {have}, expected {bound}",
                       self.arg_span(expr, p, decl), f"{have} here",
                       secondary=[(want.span, f"expects {bound}")],
                       help=f"convert it explicitly: `(...) as {bound}`")

    def generic_value(self, g: A.Generic, arg: Any, frame: Frame) -> Any:
        if g.kind == "DType":
            if isinstance(arg, A.Name | A.ScalarType):
                return self.eval_dtype(A.Name(arg.name, arg.span), frame)
            raise fail("E0453", f"generic `{g.name}` is an element type", arg.span,
                       "expected a dtype")
        if isinstance(arg, A.ScalarType):
            arg = A.Name(arg.name, arg.span)
        return self.eval_dim(arg, frame)

    def check_where(self, decl: A.FuncDecl | A.BlockDecl, frame: Frame, span: Span,
                    label: str = "called here",
                    help: str = "call it with shapes that satisfy the clause") -> None:
        for clause in decl.where:
            v = self.value(clause, frame)
            if isinstance(v, Const) and v.dtype == "bool" and v.value is False:
                raise fail("E0460", f"`where {self.src(clause)}` does not hold for "
                           f"`{decl.name}` here", span, label,
                           secondary=[(clause.span, "required here")],
                           notes=[self.where_values(clause, frame)], help=help)

    def where_values(self, clause: A.Expr, frame: Frame) -> str:
        names = sorted({n.name for n in walk(clause) if isinstance(n, A.Name)
                        and n.name in frame.env})
        return "with " + ", ".join(f"{n} = {frame.env[n]}" for n in names)

    def kernel_binding_attrs(self, decl: A.FuncDecl, frame: Frame) -> dict[str, Any]:
        assert decl.kernel is not None
        kdecl = self.resolve_global(decl.module, decl.kernel.name, decl.kernel.span)  # type: ignore[arg-type]
        if not isinstance(kdecl, FuncRef):
            return {}
        kenv = {}
        for g, a in zip(kdecl.decl.generics, decl.kernel.args):
            v = self.generic_value(g, a, frame)
            kenv[g.name] = v.value if isinstance(v, Dim) else v
        kframe = Frame(kdecl.decl.module, {k: (Dim.const(v) if isinstance(v, int) else v)  # type: ignore[arg-type]
                                           for k, v in kenv.items()})
        holds = True
        for clause in kdecl.decl.where:
            c = self.value(clause, kframe)
            holds = holds and bool(isinstance(c, Const) and c.value)
        return {"kernel": kdecl.decl.qualified_name, "kernel_generics": kenv,
                "kernel_applies": holds}

    # ---------------------------------------------------------------- builtins
    def builtin_call(self, name: str, expr: A.Call, frame: Frame) -> Any:
        if name in KERNEL_BUILTINS and not frame.in_kernel:
            raise fail("E0501", f"`{name}` is only available inside a `kernel`", expr.span,
                       "outside a kernel",
                       help=("ops work on whole tensors; index variables take the place of "
                             "program ids: `let y[r, c] = x[r, c] * 2.0`"
                             if name == "program_id" else
                             "ops read and write tensors with index notation: "
                             "`let y[i] = x[i]`"))
        if name in UNARY_FUNCTIONS or name in BINARY_FUNCTIONS or name == "select":
            args = [self.value(a, frame) for a in expr.args]
            return self.builtin_elementwise(name, args, expr, frame, labelled=False)
        if name == "iota":
            dtype = self.generic_dtype(expr, frame, "i32")
            if len(expr.args) != 1:
                raise fail("E0371", "`iota` takes one argument (its length)", expr.span)
            n = self.eval_dim(expr.args[0], frame)
            frame.tile_sizes.append((n, expr.args[0].span))
            self.check_tile(n, expr.args[0].span, frame)
            return self.builder.emit("iota", [], (n,), dtype,
                                     {"shape": [self.concrete(n)], "axis": 0, "dtype": dtype},
                                     span=expr.span)
        if name == "fill":
            dtype = self.generic_dtype(expr, frame, "f32")
            if not expr.args:
                raise fail("E0371", "`fill` takes a value and then the tile's dims", expr.span)
            value = self.value(expr.args[0], frame)
            dims = tuple(self.eval_dim(a, frame) for a in expr.args[1:])
            for d, a in zip(dims, expr.args[1:]):
                frame.tile_sizes.append((d, a.span))
                self.check_tile(d, a.span, frame)
            c = self.constant(value, dtype, expr.args[0].span)
            return self.builder.emit("broadcast", [c.ref], dims, dtype,
                                     {"shape": [self.concrete(d) for d in dims]}, span=expr.span)
        if name == "program_id":
            if len(expr.args) != 1:
                raise fail("E0371", "`program_id` takes one argument (the grid axis)", expr.span)
            axis = self.value(expr.args[0], frame)
            grid = len(frame.func.grid or []) if frame.func else 0
            if not (isinstance(axis, Const) and axis.known and isinstance(axis.value, Dim)
                    and 0 <= (axis.value.value or 0) < max(grid, 1)):
                grid_exprs = (frame.func.grid or []) if frame.func else []
                raise fail("E0504", f"`program_id` axis must be an integer below the grid's "
                           f"{grid} ax{'is' if grid == 1 else 'es'}", expr.args[0].span,
                           "bad axis", help="a one-axis grid has only `program_id(0)`"
                           if grid <= 1 else f"grid axes are numbered from 0 to {grid - 1}",
                           secondary=[(grid_exprs[0].span.to(grid_exprs[-1].span), "the grid")]
                           if grid_exprs else [])
            return Tensor("%?", (), "i32", kind="tile")
        if name == "load":
            return self.kernel_load(expr, frame)
        if name == "store":
            return self.kernel_store(expr, frame)
        raise fail("E0432", f"cannot call `{name}`", expr.span)

    def generic_dtype(self, expr: A.Call, frame: Frame, default: str) -> str:
        if not expr.generic_args:
            return default
        g = expr.generic_args[0]
        name = g.name if isinstance(g, A.Name | A.ScalarType) else ""
        return self.eval_dtype(A.Name(name, g.span), frame)

    def check_tile(self, n: Dim, span: Span, frame: Frame) -> None:
        if frame.in_kernel and n.value is not None and not is_pow2(n.value):
            raise fail("E0505", f"tile size {n.value} is not a power of two", span,
                       "tile size", help=f"use {1 << max(0, (n.value - 1).bit_length())} and "
                       "mask the extra lanes")

    def memory_index(self, target: A.Expr, frame: Frame, what: str) -> tuple[Tensor, tuple]:
        if not isinstance(target, A.Index) or not isinstance(target.base, A.Name):
            raise fail("E0506", f"the first argument of `{what}` is a tensor parameter with "
                       "indices", target.span, "expected `x[i, j]`",
                       help=f"write `{what}(x[row, cols], ...)`")
        base = frame.lookup_local(target.base.name)
        allowed = frame.tensor_params if what == "load" else set(frame.results)
        if target.base.name not in allowed or not isinstance(base, Tensor):
            which = "tensor parameters" if what == "load" else "the kernel's named results"
            raise fail("E0507", f"`{what}` works on {which}; `{target.base.name}` is not one",
                       target.base.span, "not allowed here",
                       help=("tensor parameters are read-only: store into a named result "
                             f"(`-> {', '.join(frame.results) or 'y'}: Tensor[...]`)"
                             if what == "store" and target.base.name in frame.tensor_params else
                             "tiles live in registers; compute with them directly"))
        if len(target.indices) != base.rank:
            raise fail("E0303", index_count(f"`{target.base.name}`", base.rank,
                                            len(target.indices)), target.span, type_str(base),
                       help="give one index per dimension")
        shape: tuple[Dim, ...] = ()
        for idx in target.indices:
            v = self.value(idx, frame)
            if isinstance(v, Const):
                continue
            if not isinstance(v, Tensor) or not (DT.is_int(v.dtype)):
                raise fail("E0382", "a kernel index is an integer or an integer tile", idx.span,
                           "not an integer")
            shape = shape + v.shape
        return base, shape

    def kernel_load(self, expr: A.Call, frame: Frame) -> Tensor:
        if not 1 <= len(expr.args) <= 3:
            raise fail("E0371", "`load` takes x[...], then an optional mask and other value",
                       expr.span)
        base, shape = self.memory_index(expr.args[0], frame, "load")
        self.kernel_mask(expr.args[1:2], shape, frame)
        return Tensor("%?", shape, base.dtype, kind="tile")

    def kernel_store(self, expr: A.Call, frame: Frame) -> None:
        if not 2 <= len(expr.args) <= 3:
            raise fail("E0371", "`store` takes y[...], a value and an optional mask", expr.span)
        base, shape = self.memory_index(expr.args[0], frame, "store")
        value = self.value(expr.args[1], frame)
        if isinstance(value, Tensor):
            if value.dtype != base.dtype:
                raise fail("E0508", f"storing {value.dtype} into a {base.dtype} result",
                           expr.args[1].span, f"{value.dtype} here",
                           help=f"convert explicitly: `(...) as {base.dtype}`")
            if value.shape and value.shape != shape:
                raise fail("E0509", f"storing a tile of shape {shape_str(value.shape)} at "
                           f"positions of shape {shape_str(shape)}", expr.args[1].span,
                           "shape differs")
        self.kernel_mask(expr.args[2:3], shape, frame)
        frame.stored = True  # type: ignore[attr-defined]
        return None

    def kernel_mask(self, args: list[A.Expr], shape: tuple, frame: Frame) -> None:
        if not args:
            return
        m = self.value(args[0], frame)
        if isinstance(m, Tensor) and m.dtype != "bool":
            raise fail("E0353", "a mask must be bool", args[0].span, f"{m.dtype} here",
                       help="compare: `cols < C`")


# ==================================================================== tree helpers
_WALKS: dict[int, tuple[Any, list[Any]]] = {}


def recursion_error(cycle: list[A.FuncDecl], span: Span) -> Fail:
    """E0208 for a call cycle ``f -> g -> f``: every call is inlined, so none can recur."""
    names = " -> ".join(f"`{d.name}`" for d in cycle)
    first = cycle[0]
    return fail("E0208", f"`{first.name}` calls itself: {names}", span, "this call recurses",
                help="Linnet inlines every call, so functions cannot be recursive; repeat work "
                     "with a `for` loop over a block array, or write the steps out",
                secondary=[(d.name_span, f"`{d.name}` defined here") for d in cycle[:-1]][:4])


def call_cycles(edges: list[tuple[A.FuncDecl, A.FuncDecl, Span]]) -> list[Diagnostic]:
    """One E0208 per call cycle among the calls the checker saw (caller, callee, span).

    >>> call_cycles([])
    []
    """
    callees: dict[int, list[tuple[A.FuncDecl, Span]]] = {}
    for a, b, span in edges:
        callees.setdefault(id(a), []).append((b, span))
    reported: set[frozenset[int]] = set()
    diags: list[Diagnostic] = []
    for a, b, span in edges:
        # Breadth-first from the callee back to the caller: the shortest cycle through a -> b.
        parent: dict[int, A.FuncDecl | None] = {id(b): None}
        queue = [b]
        found = a is b
        while queue and not found:
            node = queue.pop(0)
            for nxt, _ in callees.get(id(node), []):
                if id(nxt) not in parent:
                    parent[id(nxt)] = node
                    if nxt is a:
                        found = True
                        break
                    queue.append(nxt)
        if not found:
            continue
        path = [a]
        cur: A.FuncDecl | None = a if a is not b else None
        while cur is not None and cur is not b:
            cur = parent[id(cur)]
            if cur is not None:
                path.append(cur)
        cycle = [a, *reversed(path[1:]), a] if a is not b else [a, a]
        key = frozenset(id(d) for d in cycle)
        if key in reported:
            continue
        reported.add(key)
        diags.append(recursion_error(cycle, span).diag)
    return diags


def walk(expr: Any) -> list[Any]:
    """Every node of an expression, parents first. Syntax trees do not change after parsing,
    so the list is computed once per node (lowering an 8B model walks the same few hundred
    expressions once per layer)."""
    hit = _WALKS.get(id(expr))
    if hit is not None and hit[0] is expr:
        return hit[1]
    nodes = list(_walk(expr))
    _WALKS[id(expr)] = (expr, nodes)
    return nodes


def _walk(expr: Any) -> Iterator[Any]:
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, A.Binary):
            stack += [node.right, node.left]
        elif isinstance(node, A.Unary | A.Cast):
            stack.append(node.operand)
        elif isinstance(node, A.Call):
            stack += list(reversed(node.args))
        elif isinstance(node, A.Index):
            stack += [*list(reversed(node.indices)), node.base]
        elif isinstance(node, A.Field):
            stack.append(node.base)
        elif isinstance(node, A.Tuple):
            stack += list(reversed(node.items))
        elif isinstance(node, A.Reduce):
            stack.append(node.body)
        elif isinstance(node, A.IfExpr):
            stack.append(node.condition)
            for s in node.then.statements:
                if isinstance(s, A.ExprStmt):
                    stack.append(s.expr)
            if isinstance(node.otherwise, A.Block):
                for s in node.otherwise.statements:
                    if isinstance(s, A.ExprStmt):
                        stack.append(s.expr)
            elif node.otherwise is not None:
                stack.append(node.otherwise)
        elif isinstance(node, A.RangeExpr):
            stack += [node.stop, node.start]


def leaves(b: A.IndexBinder) -> list[A.IndexBinder]:
    if b.parts is None:
        return [b]
    out = []
    for p in b.parts:
        out.extend(leaves(p))
    return out


def product_factors(expr: A.Expr) -> list[A.Expr]:
    if isinstance(expr, A.Binary) and expr.op == "*":
        return product_factors(expr.left) + product_factors(expr.right)
    return [expr]


def mentions(expr: A.Expr, names: set[str]) -> bool:
    return any(isinstance(n, A.Name) and n.name in names for n in walk(expr))
