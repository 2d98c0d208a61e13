"""Calls: checking a call against its callee, inlining it while lowering, the
records calls leave in the graph, and recursion."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.core import (
    MAX_DEPTH,
    EvaluatorBase,
    Fail,
    Frame,
    fail,
    integer_gradient,
    integer_gradient_error,
    shape_str,
)
from linnet.lang.diagnostics.core import Diagnostic, Span
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import POISON, BlockInst, Builtin, Const, FuncRef, Poison, Tensor


class Calls(EvaluatorBase):
    """The Evaluator's calls (a mixin; see :mod:`linnet.lang.check.evaluate`)."""

    def call(self, expr: A.Call, frame: Frame, statement: bool = False) -> Any:
        callee = (
            self.value(expr.callee, frame)
            if not isinstance(expr.callee, A.Name)
            else self.lookup(frame, expr.callee.name, expr.callee.span)
        )
        if isinstance(callee, Poison):
            return callee
        if isinstance(callee, Builtin):
            return self.builtin_call(callee.name, expr, frame)
        if isinstance(callee, BlockInst):
            method = callee.decl.method("forward")
            if method is None:
                methods = [m.name for m in callee.decl.methods]
                raise fail(
                    "E0430",
                    f"block `{callee.decl.name}` has no `forward` method to call",
                    expr.span,
                    "called like a function",
                    help=(
                        "call one of its methods: "
                        + ", ".join(f"`{self.src(expr.callee)}.{m}(...)`" for m in methods)
                    )
                    if methods
                    else f"give `{callee.decl.name}` a `fn forward(...)`",
                    secondary=[(callee.decl.name_span, "declared here")],
                )
            callee = FuncRef(method, callee)
        if isinstance(callee, A.BlockDecl):
            raise fail(
                "E0431",
                f"`{callee.name}` is a block type, not a function",
                expr.span,
                "not callable",
                help=f"declare it as a member (`block x: {callee.name}<...>`) and call the member",
            )
        if not isinstance(callee, FuncRef):
            raise fail(
                "E0432", f"cannot call {self.describe(callee)}", expr.callee.span, "not a function"
            )
        decl = callee.decl
        if decl.kind == "kernel":
            raise fail(
                "E0502",
                f"kernel `{decl.name}` cannot be called directly",
                expr.span,
                "a kernel call",
                help="bind it to an op: `op f<...>(...) -> T kernel "
                f"{decl.name}<...> {{ body }}`, and call the op",
            )
        if decl.kind == "entry":
            raise fail(
                "E0433",
                f"entry `{decl.name}` cannot be called from Linnet code",
                expr.span,
                help="entries are called by the runtime; move the shared code into a `fn`",
            )
        args = [self.value(a, frame) for a in expr.args]
        if any(isinstance(a, Poison) for a in args):
            return POISON
        return self.invoke(callee, args, expr, frame)

    def invoke(self, ref: FuncRef, args: list[Any], expr: A.Call, frame: Frame) -> Any:
        decl = ref.decl
        if len(args) != len(decl.params):
            raise fail(
                "E0440",
                f"`{decl.name}` takes {len(decl.params)} argument"
                f"{'s' if len(decl.params) != 1 else ''} but {len(args)} "
                f"{'were' if len(args) != 1 else 'was'} given",
                expr.span,
                f"{len(args)} argument{'s' if len(args) != 1 else ''}",
                secondary=[(decl.name_span, f"`{decl.name}` defined here")],
                help="parameters: " + ", ".join(p.name for p in decl.params),
            )
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
            return (
                Tensor("%?", shape, dtype)
                if shape
                else (Tensor("%?", (), dtype) if not DT.is_concrete(dtype) or True else None)
            )
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
            raise fail(
                "E0209",
                f"calls nest more than {MAX_DEPTH} deep, from `{first.name}` to `{decl.name}`",
                expr.span,
                "the limit is reached at this call",
                help="every call is inlined; call fewer functions inside one another",
                secondary=[(first.name_span, f"`{first.name}` defined here")],
            )
        self.call_stack.append((decl, expr.span))
        # A method called on an element of a repeated block array records which element.
        iteration = ref.owner.iteration if ref.owner else None
        repeated = ref.owner.repeated if ref.owner else ""
        call = self.builder.open_call(
            decl.qualified_name,
            decl.kind,
            path,
            expr.span,
            attrs,
            iteration=iteration,
            repeated=repeated,
        )
        try:
            for p, a in zip(decl.params, args):
                callee_frame.bind(p.name, a)
            self.run_body(decl.body, callee_frame)
            returned = callee_frame.returned or []
            if len(returned) != len(result_types):
                raise fail(
                    "E0441",
                    f"`{decl.name}` returns {len(returned)} values but declares "
                    f"{len(result_types)}",
                    decl.name_span,
                    "declared here",
                    help="return one value per declared result",
                )
            out = []
            for value, (shape, dtype), res in zip(returned, result_types, decl.results):
                out.append(self.check_return(value, shape, dtype, res, decl))
            if call is not None:
                call.attributes["results"] = [self.argument_record(v) for v in out]
            self.builder.close_call(call)
            if call is not None and decl.grad is not None and self.grad_templates is not None:
                self.grad_templates[call.index] = self.lower_grad_clause(
                    decl, ref, env, args, out, call
                )
        finally:
            self.call_stack.pop()
        return out[0] if len(out) == 1 else (tuple(out) if out else None)

    def lower_grad_clause(
        self,
        decl: A.FuncDecl,
        ref: FuncRef,
        env: dict[str, Any],
        args: list[Any],
        out: list[Any],
        call: Any,
    ) -> Any:
        """Lower ``decl``'s grad clause for this call into a template of its own (not into
        the forward graph): the parameters bound to the call's arguments, each incoming
        gradient to a placeholder of its result's type. The reverse pass appends it with
        the real cotangents (linnet.lang.grad.reverse)."""
        from linnet.lang.grad.reverse import ClauseTemplate
        from linnet.lang.ir.builder import Builder, _concrete
        from linnet.lang.ir.graph import Graph, ValueType

        grad = decl.grad
        assert grad is not None and decl.module is not None
        forward = self.builder
        assert forward.graph is not None
        scratch = Graph(
            forward.graph.entry,
            forward.graph.model,
            parameters=forward.graph.parameters,
            states=forward.graph.states,
        )
        builder = Builder(scratch)
        # Names go on from the forward graph's, so a template's values never shadow them.
        builder._used = dict(forward._used)
        frame = Frame(decl.module, dict(env), ref.owner, decl)
        for p, a in zip(decl.params, args):
            frame.bind(p.name, a)
        template = ClauseTemplate(decl.qualified_name, call.loc)
        self.builder, templates, self.grad_templates = builder, self.grad_templates, None
        try:
            for name, value in zip(grad.names, out):
                # A placeholder of its own for each incoming gradient, never shared: `emit`
                # would make the second `input` step of an op of several results the first's
                # (the same op, operands and attributes), binding both gradients to one.
                placeholder = builder.emit_step(
                    "input",
                    [],
                    ValueType(tuple(_concrete(d) for d in value.shape), value.dtype),
                    {},
                    name,
                    "",
                    None,
                )
                scratch.steps.pop()
                t = Tensor(placeholder, value.shape, value.dtype)
                template.incoming.append(t.ref)
                frame.bind(name, t)
            self.run_body(grad.body, frame)
        finally:
            self.builder, self.grad_templates = forward, templates
        returned = frame.returned or []
        tensors = [a for a in args if isinstance(a, Tensor)]
        names = [p.name for p, a in zip(decl.params, args) if isinstance(a, Tensor)]
        # The checker matched the count (E0521); a number where a tensor belongs is left.
        for name, r in zip(names, returned):
            if not isinstance(r, Tensor):
                raise fail(
                    "E0954",
                    f"the grad clause of `{decl.name}` returns "
                    f"{self.describe(r)} as the gradient of `{name}`, a tensor",
                    grad.span,
                    "grad clause",
                    help=f"return a tensor of `{name}`'s shape (a gradient computed "
                    "from the incoming one: `return dy * 2.0`)",
                )
        for name, r, a in zip(names, returned, tensors):
            if integer_gradient(r.dtype, a.dtype):
                # The reverse pass converts a gradient to its parameter's type: an integer
                # one would silently drop every fraction (issue 38).
                raise Fail(integer_gradient_error(decl.name, name, r.dtype, a.dtype, grad.span))
        if len(returned) != len(tensors):
            raise fail(
                "E0954",
                f"the grad clause of `{decl.name}` returns {len(returned)} "
                f"gradient(s) for {len(tensors)} tensor parameter(s)",
                grad.span,
                "grad clause",
                help="return one tensor per tensor parameter, in order",
            )
        template.steps = scratch.steps
        template.values = scratch.values
        template.returned = [r.ref for r in returned]
        template.targets = [a.ref for a in tensors]
        return template

    def argument_record(self, value: Any) -> Any:
        """How a call's argument or result appears in the graph: a `%`/`@` ref or a literal."""
        if isinstance(value, Tensor):
            return value.ref
        if isinstance(value, Const):
            v = value.value
            return v.value if isinstance(v, Dim) else v
        return None

    def check_return(
        self, value: Any, shape: tuple[Dim, ...], dtype: str, res: A.Result, decl: A.FuncDecl
    ) -> Any:
        if isinstance(value, Const) and not shape:
            return value
        if not isinstance(value, Tensor):
            raise fail(
                "E0442",
                f"`{decl.name}` returns {self.describe(value)} but declares a tensor",
                res.span,
                "declared result",
            )
        if value.shape != shape:
            raise fail(
                "E0443",
                f"`{decl.name}` returns {shape_str(value.shape)} but declares {shape_str(shape)}",
                res.span,
                "declared result type",
                help="make the body's result match the declared type",
            )
        if value.dtype != dtype:
            raise fail(
                "E0444",
                f"`{decl.name}` returns {value.dtype} but declares {dtype}",
                res.span,
                "declared element type",
                help=f"convert explicitly before returning: `return y as {dtype}` "
                "(Linnet never narrows silently)",
            )
        return value


def recursion_error(cycle: list[A.FuncDecl], span: Span) -> Fail:
    """E0208 for a call cycle ``f -> g -> f``: every call is inlined, so none can recur."""
    names = " -> ".join(f"`{d.name}`" for d in cycle)
    first = cycle[0]
    return fail(
        "E0208",
        f"`{first.name}` calls itself: {names}",
        span,
        "this call recurses",
        help="Linnet inlines every call, so functions cannot be recursive; repeat work "
        "with a `for` loop over a block array, or write the steps out",
        secondary=[(d.name_span, f"`{d.name}` defined here") for d in cycle[:-1]][:4],
    )


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
