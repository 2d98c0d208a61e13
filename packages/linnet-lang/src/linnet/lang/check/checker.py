"""Checking generic code: every function, block and kernel of a program checked with
symbolic dims (`check_program`, `check_file`, `check_text`)."""

from __future__ import annotations

import contextlib
from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.blocks import instantiate
from linnet.lang.check.core import integer_gradient, integer_gradient_error
from linnet.lang.check.evaluate import Evaluator, Fail, Frame, call_cycles, fail, shape_str
from linnet.lang.diagnostics.core import Diagnostic, Label, Span
from linnet.lang.ir.builder import Builder
from linnet.lang.syntax.program import Program
from linnet.lang.syntax.walk import walk_body
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import BlockInst, Const, FuncRef, Poison, Tensor


def symbolic_env(
    ev: Evaluator, generics: list[A.Generic], where: list[A.Expr], module: A.Module
) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for g in generics:
        env[g.name] = Dim.symbol(g.name) if g.kind == "Dim" else g.name
    # `where D == H * HD` makes D an alias of H * HD in generic code.
    for clause in where:
        if (
            isinstance(clause, A.Binary)
            and clause.op == "=="
            and isinstance(clause.left, A.Name)
            and isinstance(env.get(clause.left.name), Dim)
        ):
            with contextlib.suppress(Fail):
                env[clause.left.name] = ev.eval_dim(clause.right, Frame(module, env))
    return env


def check_function(ev: Evaluator, decl: A.FuncDecl, owner: BlockInst | None) -> None:
    assert decl.module is not None
    env = dict(owner.env) if owner else {}
    env.update(symbolic_env(ev, decl.generics, decl.where, decl.module))
    frame = Frame(decl.module, env, owner, decl)
    try:
        params = bind_params(ev, decl, frame)
        for clause in decl.where:  # unknown names and non-dims in `where` are errors too
            ev.value(clause, frame)
        if decl.kind == "kernel":
            check_kernel_header(ev, decl, frame)
        results = [ev.tensor_type(r.type, frame) for r in decl.results]
    except Fail as f:
        ev.errors.append(f.diag)
        return
    before = len(ev.errors)
    ev.run_body(decl.body, frame)
    if decl.kind == "kernel" and len(ev.errors) == before and frame.returned is None:
        # Only a body that checked cleanly (a failed `store` would look like a missing one)
        # and did not `return` (E0512 below says what is wrong there).
        for r in decl.results:
            if r.name is not None and r.name not in frame.stored_results:
                ev.errors.append(
                    Diagnostic(
                        "E0529",
                        f"kernel `{decl.name}` never stores its result `{r.name}`",
                        r.span,
                        "never stored",
                        help=f"write it with `store({r.name}[...], value, "
                        "mask)`; an op bound to this kernel would return it unwritten",
                    ).with_secondary(decl.name_span, "in this kernel")
                )
    if decl.kind == "kernel":
        if frame.returned is not None:
            names = [r.name for r in decl.results if r.name] or ["y"]
            ev.errors.append(
                Diagnostic(
                    "E0512",
                    "a kernel writes its results with `store`; it does not `return`",
                    frame.return_exprs[0].span if frame.return_exprs else decl.name_span,
                    "returned here",
                    help=f"`store({names[0]}[...], value)` for each named result",
                ).with_secondary(decl.name_span, "in this kernel")
            )
    elif frame.returned is None:
        if results:
            ev.errors.append(
                Diagnostic(
                    "E0441",
                    f"`{decl.name}` declares a result but never returns",
                    decl.name_span,
                    "no `return`",
                    help="end the body with `return value`",
                )
            )
    else:
        check_returns(ev, decl, frame.returned, results, frame.return_exprs)
    if decl.kernel is not None:
        check_kernel_binding(ev, decl, frame, params)
    if decl.grad is not None:
        check_grad(ev, decl, env, params, results)


def bind_params(ev: Evaluator, decl: A.FuncDecl, frame: Frame) -> list[Any]:
    values = []
    seen: dict[str, Span] = {}
    for p in decl.params:
        if p.name in seen:
            raise fail(
                "E0620",
                f"parameter `{p.name}` is declared twice",
                p.span,
                "again here",
                secondary=[(seen[p.name], "first here")],
            )
        seen[p.name] = p.span
        if isinstance(p.type, A.ScalarType) and p.type.name == "Dim":
            v: Any = Const(Dim.symbol(p.name), "int")
        elif isinstance(p.type, (A.TensorType, A.ScalarType)):
            shape, dtype = ev.tensor_type(p.type, frame)
            if isinstance(p.type, A.ScalarType):
                v = (
                    Const(None, dtype)
                    if DT.is_float(dtype)
                    else (
                        Const(Dim.symbol(p.name), "int") if DT.is_int(dtype) else Const(None, dtype)
                    )
                )
            else:
                v = Tensor("%?", shape, dtype, kind="global" if decl.kind == "kernel" else "value")
                if decl.kind == "kernel":
                    frame.tensor_params.add(p.name)
        else:
            raise fail(
                "E0621",
                "parameters are tensors or scalars",
                p.type.span,
                "block type",
                help="pass the block's tensors instead",
            )
        frame.bind(p.name, v)
        values.append(v)
    return values


def check_returns(
    ev: Evaluator,
    decl: A.FuncDecl,
    returned: list[Any],
    results: list[tuple],
    exprs: list[A.Expr] | None = None,
) -> None:
    if len(returned) != len(results):
        ev.errors.append(
            Diagnostic(
                "E0441",
                f"`{decl.name}` returns {len(returned)} value(s) but declares {len(results)}",
                decl.name_span,
                "declared here",
            )
        )
        return
    for i, (value, (shape, dtype), res) in enumerate(zip(returned, results, decl.results)):
        if isinstance(value, Poison):
            continue
        try:
            ev.check_return(value, shape, dtype, res, decl)
        except Fail as f:
            if exprs and i < len(exprs) and isinstance(value, Tensor):
                # Point at what was returned, with the declaration as the reason; spell the
                # fix with the returned expression.
                expr = exprs[i]
                f.diag.secondary.insert(0, Label(res.span, "declared here"))
                f.diag.span = expr.span
                f.diag.label = f"this is {fmt_type((value.shape, value.dtype))}"
                if f.diag.code == "E0444":
                    shown = ev.src(expr)
                    if not isinstance(expr, A.Name | A.Index | A.Field | A.Call):
                        shown = f"({shown})"
                    f.diag.help = (
                        f"convert explicitly before returning: `return {shown} as "
                        f"{dtype}` (Linnet never narrows silently)"
                    )
            ev.errors.append(f.diag)


def check_kernel_header(ev: Evaluator, decl: A.FuncDecl, frame: Frame) -> None:
    if not decl.grid or not 1 <= len(decl.grid) <= 3:
        raise fail(
            "E0510",
            f"kernel `{decl.name}` needs `grid(...)` with one to three sizes",
            decl.name_span,
            "no grid",
            help="write `-> y: T grid(R)` after the results",
        )
    for g in decl.grid:
        ev.eval_dim(g, frame)
    for r in decl.results:
        if r.name is None:
            raise fail(
                "E0511",
                "a kernel's results are named",
                r.span,
                "unnamed result",
                help="write `-> y: Tensor[...]`",
            )
        shape, dtype = ev.tensor_type(r.type, frame)
        t = Tensor("%?", shape, dtype, kind="global")
        frame.results[r.name] = t
        frame.bind(r.name, t)
    taken = {p.name: p.span for p in decl.params} | {r.name: r.span for r in decl.results if r.name}
    for p in decl.scratch:
        if p.name in taken:
            raise fail(
                "E0546",
                f"scratch buffer `{p.name}` has the name of a parameter or result",
                p.span,
                "taken",
                secondary=[(taken[p.name], "first here")],
                help="give each scratch buffer a name of its own",
            )
        taken[p.name] = p.span
        if not isinstance(p.type, A.TensorType):
            raise fail(
                "E0546",
                f"scratch buffer `{p.name}` is a tensor",
                p.type.span,
                "not a tensor type",
                help=f"write `scratch({p.name}: Tensor[N; i32])`",
            )
        shape, dtype = ev.tensor_type(p.type, frame)
        frame.bind(p.name, Tensor("%?", shape, dtype, kind="global"))
        frame.tensor_params.add(p.name)
        frame.scratch.add(p.name)


def check_kernel_binding(ev: Evaluator, decl: A.FuncDecl, frame: Frame, params: list) -> None:
    """An op's `kernel` binding: one kernel taking the op's parameters and writing its
    results, or a chain `kernel first<...> then second<...>` (or longer: `then third<...>`)
    whose first kernel takes the op's leading parameters and writes scratch results, each
    next kernel the op's parameters then the results of the one before it, and whose last
    writes the op's results."""
    binding = decl.kernel
    assert binding is not None and decl.module is not None
    try:
        if decl.kind != "op":
            raise fail(
                "E0514",
                "only an `op` can be bound to a kernel",
                binding.span,
                help="change `fn` to `op`",
            )
        given = [
            (p.name, ev.tensor_type(p.type, frame), p.span, "op parameter") for p in decl.params
        ]
        wanted = [
            (r.name or f"result {i}", ev.tensor_type(r.type, frame), r.span)
            for i, r in enumerate(decl.results)
        ]
        if binding.then is None:
            check_kernel_stage(ev, decl, binding, frame, given, wanted)
            return
        stage, kframe = check_kernel_stage(ev, decl, binding, frame, given, None, prefix=True)
        step: A.KernelBinding | None = binding.then
        while step is not None:
            scratch = [
                (
                    r.name or f"result {i}",
                    ev.tensor_type(r.type, kframe),
                    r.span,
                    f"`{stage.name}` result",
                )
                for i, r in enumerate(stage.results)
            ]
            stage, kframe = check_kernel_stage(
                ev,
                decl,
                step,
                frame,
                given + scratch,
                wanted if step.then is None else None,
                chained=stage.name,
            )
            step = step.then
    except Fail as f:
        ev.errors.append(f.diag)


def check_kernel_stage(
    ev: Evaluator,
    decl: A.FuncDecl,
    binding: A.KernelBinding,
    frame: Frame,
    given: list[tuple],
    wanted: list[tuple] | None,
    chained: str = "",
    prefix: bool = False,
) -> tuple[A.FuncDecl, Frame]:
    """One kernel of a binding: it takes ``given`` (name, type, span, what) in order (with
    ``prefix``, a chain's first kernel, the first of them: the op's leading parameters) and,
    if ``wanted`` is given, writes those results; returns the kernel and its bound frame."""
    assert decl.module is not None
    ref = ev.resolve_global(decl.module, binding.name, binding.span)
    if not (isinstance(ref, FuncRef) and ref.decl.kind == "kernel"):
        raise fail(
            "E0513",
            f"`{binding.name}` is not a kernel",
            binding.span,
            "expected a kernel",
            help=f"declare `kernel {binding.name}<...>(...)` in this module or import it",
        )
    k = ref.decl
    if len(binding.args) != len(k.generics):
        raise fail(
            "E0515",
            f"kernel `{k.name}` takes {len(k.generics)} generic arguments, "
            f"the op gives {len(binding.args)}",
            binding.span,
            f"{len(binding.args)} given",
            secondary=[(k.name_span, f"`{k.name}` declared here")],
        )
    kenv = {g.name: ev.generic_value(g, a, frame) for g, a in zip(k.generics, binding.args)}
    assert k.module is not None
    kframe = Frame(k.module, kenv)
    what = (
        f"the op's parameters, then `{chained}`'s results, in order"
        if chained
        else "the op's leading parameters, in order"
        if prefix
        else "the op's parameters, in order"
    )
    if len(k.params) > len(given) or (not prefix and len(k.params) != len(given)):
        raise fail(
            "E0516",
            f"kernel `{k.name}` takes {len(k.params)} parameter"
            f"{'s' if len(k.params) != 1 else ''} but op `{decl.name}` "
            + (f"and `{chained}` give {len(given)}" if chained else f"has {len(given)}"),
            binding.span,
            "parameters differ",
            secondary=[(k.name_span, "kernel declared here")],
            help=f"a kernel takes {what}",
        )
    for kp, (name, have, span, role) in zip(k.params, given):
        want = ev.tensor_type(kp.type, kframe)
        if want != have:
            passes = (
                f"the op passes `{name}`"
                if role == "op parameter"
                else f"`{chained}` writes `{name}`"
            )
            raise fail(
                "E0517",
                f"kernel parameter `{kp.name}` is {fmt_type(want)} but {passes}: {fmt_type(have)}",
                binding.span,
                "bound here",
                secondary=[(kp.span, "kernel parameter"), (span, role)],
                help="the kernel must take the op's parameters"
                + (f", then `{chained}`'s results," if chained else "")
                + " with the same types",
            )
    if wanted is not None:
        if len(k.results) != len(wanted):
            raise fail(
                "E0518",
                f"kernel `{k.name}` writes {len(k.results)} results but op "
                f"`{decl.name}` returns {len(wanted)}",
                binding.span,
            )
        for kr, (_, have, span) in zip(k.results, wanted):
            want = ev.tensor_type(kr.type, kframe)
            if want != have:
                raise fail(
                    "E0519",
                    f"kernel result `{kr.name}` is {fmt_type(want)} but the op "
                    f"returns {fmt_type(have)}",
                    binding.span,
                    "bound here",
                    secondary=[(kr.span, "kernel result"), (span, "op result")],
                )
    tile_check_frame = Frame(k.module, {**kenv}, None, k)
    # Tile sizes the kernel uses must be powers of two once bound.
    for node in walk_body(k.body):
        if (
            isinstance(node, A.Call)
            and isinstance(node.callee, A.Name)
            and node.callee.name in ("iota", "fill")
        ):
            for a in node.args[(1 if node.callee.name == "fill" else 0) :]:
                try:
                    n = ev.eval_dim(a, tile_check_frame)
                except Fail:
                    continue
                if n.value is not None and not (n.value > 0 and n.value & (n.value - 1) == 0):
                    raise fail(
                        "E0505",
                        f"tile size {n.value} is not a power of two",
                        binding.span,
                        "bound here",
                        secondary=[(a.span, "used as a tile size")],
                        help=f"tile sizes must be powers of two: bind "
                        f"{1 << max(0, (n.value - 1).bit_length())} and mask "
                        "the extra lanes",
                    )
    return k, kframe


def fmt_type(t: tuple) -> str:
    shape, dtype = t
    return f"Tensor[{', '.join(str(d) for d in shape)}; {dtype}]" if shape else dtype


def check_grad(
    ev: Evaluator, decl: A.FuncDecl, env: dict, params: list, results: list[tuple]
) -> None:
    grad = decl.grad
    assert grad is not None and decl.module is not None
    frame = Frame(decl.module, dict(env), None, decl)
    for p, v in zip(decl.params, params):
        frame.bind(p.name, v)
    if len(grad.names) != len(results):
        ev.errors.append(
            Diagnostic(
                "E0520",
                f"`grad` names {len(grad.names)} incoming "
                f"gradient(s) but `{decl.name}` has {len(results)} result(s)",
                grad.span,
                "grad clause",
                help="name one gradient per result: `grad(dy) { ... }`",
            )
        )
        return
    for name, (shape, dtype) in zip(grad.names, results):
        frame.bind(name, Tensor("%?", shape, dtype))
    ev.run_body(grad.body, frame)
    tensor_params = [(p, v) for p, v in zip(decl.params, params) if isinstance(v, Tensor)]
    if frame.returned is None or len(frame.returned) != len(tensor_params):
        ev.errors.append(
            Diagnostic(
                "E0521",
                f"`grad` must return one gradient per tensor parameter ({len(tensor_params)})",
                grad.span,
                "grad clause",
                help="return them in parameter order: `return dx, dw`",
            )
        )
        return
    for (p, v), g in zip(tensor_params, frame.returned):
        if isinstance(g, Tensor) and g.shape != v.shape:
            ev.errors.append(
                Diagnostic(
                    "E0522",
                    f"gradient for `{p.name}` has shape "
                    f"{shape_str(g.shape)}, expected {shape_str(v.shape)}",
                    grad.span,
                    "grad clause",
                )
            )
        elif isinstance(g, Tensor) and integer_gradient(g.dtype, v.dtype):
            ev.errors.append(integer_gradient_error(decl.name, p.name, g.dtype, v.dtype, grad.span))


def check_block(ev: Evaluator, decl: A.BlockDecl) -> None:
    assert decl.module is not None
    if id(decl) in ev.reported_blocks:
        return  # part of a cycle or chain already reported (E0207, E0209)
    env = symbolic_env(ev, decl.generics, decl.where, decl.module)
    try:
        inst = instantiate(ev, decl, env, "" if decl.kind == "model" else "self")
    except Fail as f:
        ev.errors.append(f.diag)
        return
    seen: dict[str, Span] = {}
    for m in decl.members:
        if m.name in seen:
            ev.errors.append(
                Diagnostic(
                    "E0622", f"`{m.name}` is declared twice in `{decl.name}`", m.span, "again here"
                ).with_secondary(seen[m.name], "first here")
            )
        seen[m.name] = m.span
    for method in decl.methods:
        check_function(ev, method, inst)
    if decl.kind == "model" and not any(m.kind == "entry" for m in decl.methods):
        ev.errors.append(
            Diagnostic(
                "E0623",
                f"model `{decl.name}` has no entries",
                decl.name_span,
                "no `entry`",
                help="add one: `entry decode(token: Tensor[B; i32]) -> ...`",
            )
        )


def check_modules(program: Program) -> list[Diagnostic]:
    """Check every module of ``program``; returns all diagnostics (empty when clean). The
    kernels' accesses are checked after this by :func:`linnet.lang.check.driver.check_program`
    (which lowers them: a later stage)."""
    ev = Evaluator(program, Builder(None))
    ev.errors.extend(program.errors)
    for module in program.modules.values():
        names: dict[str, Span] = {}
        for item in module.items:
            if isinstance(item, A.FuncDecl | A.BlockDecl | A.Const):
                span = item.name_span if not isinstance(item, A.Const) else item.span
                if item.name in names:
                    ev.errors.append(
                        Diagnostic(
                            "E0205",
                            f"`{item.name}` is defined twice",
                            span,
                            "defined again here",
                            help="rename one of them",
                        ).with_secondary(names[item.name], "first defined here")
                    )
                names[item.name] = span
            try:
                if isinstance(item, A.FuncDecl):
                    check_function(ev, item, None)
                elif isinstance(item, A.BlockDecl):
                    check_block(ev, item)
                elif isinstance(item, A.Use):
                    for name, span in item.names:
                        ev.resolve_global(module, name, span)
                elif isinstance(item, A.Const):  # constants are checked even when unused
                    ev.const_value(item, module, item.span)
            except Fail as f:
                ev.errors.append(f.diag)
            except RecursionError:
                # The nesting limits of the parser (E0118, E0119) and the cycle checks
                # (E0206-E0208) keep the checker's recursion shallow; this is the last line.
                ev.errors.append(too_deep(item))
    ev.errors.extend(call_cycles(ev.call_edges))
    return dedupe(ev.errors)


def too_deep(item: Any) -> Diagnostic:
    """E0209: checking or lowering ``item`` ran out of Python stack."""
    name = getattr(item, "name", "")
    span = getattr(item, "name_span", None) or getattr(item, "span", None)
    return Diagnostic(
        "E0209",
        f"`{name}` nests too deeply to compile"
        if name
        else "the program nests too deeply to compile",
        span,
        "calls, blocks or expressions nest too deeply under here",
        help="flatten it: name intermediate values with `let`, and call fewer "
        "functions inside one another",
    )


def dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen = set()
    out = []
    for d in diags:
        key = (
            d.code,
            d.message,
            d.span.start if d.span else None,
            d.span.source.name if d.span else None,
        )
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out
