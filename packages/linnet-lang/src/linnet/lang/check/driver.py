"""The pipeline: parse → check → lower. Each stage is a function of the one before.

>>> from linnet.lang import check_text
>>> check_text("pub fn twice(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 }")
Traceback (most recent call last):
...
linnet.lang.diagnostics.core.LinnetError: error[E0201]: unknown name `N`...
"""

from __future__ import annotations

import contextlib
import difflib
import re
from pathlib import Path
from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.evaluate import (
    MAX_DEPTH,
    NEGATIVE_HELP,
    Evaluator,
    Fail,
    Frame,
    call_cycles,
    fail,
    shape_str,
    walk,
)
from linnet.lang.diagnostics.core import Diagnostic, Label, LinnetError, Span
import linnet.lang.check.instantiate as instantiation
from linnet.lang.check.instantiate import clone_element
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.ir.passes import run_passes
from linnet.lang.syntax.program import Program
from linnet.lang.tensors.dims import Dim, solve_for
from linnet.lang.tensors.values import BlockArray, BlockInst, Const, FuncRef, Poison, Tensor
from linnet.lang.weights.safetensors import shard_of

# ==================================================================== blocks


def instantiate(ev: Evaluator, decl: A.BlockDecl, env: dict[str, Any], path: str,
                config: dict[str, Any] | None = None) -> BlockInst:
    """Build a block's members (parameters and states by path, sub-blocks) under ``env``."""
    ev.block_stack.append(decl)
    try:
        return _instantiate(ev, decl, env, path, config)
    finally:
        ev.block_stack.pop()


def _instantiate(ev: Evaluator, decl: A.BlockDecl, env: dict[str, Any], path: str,
                 config: dict[str, Any] | None = None) -> BlockInst:
    inst = BlockInst(decl, path, env)
    assert decl.module is not None
    frame = Frame(decl.module, env, inst)
    for m in decl.members:
        if m.kind == "config":
            env[m.name] = config_value(ev, m, frame, config or {})
            inst.members[m.name] = env[m.name] if not isinstance(env[m.name], Dim) else Const(
                env[m.name], "int")
            continue
        if m.condition is not None:
            c = ev.value(m.condition, frame)
            if not (isinstance(c, Const) and c.dtype == "bool"):
                raise fail("E0610", "a member's condition must be a compile-time bool",
                           m.condition.span, "not a bool")
            if ev.lowering and c.value is False:
                continue
        child_path = f"{path}.{m.name}" if path else m.name
        if m.kind in ("param", "state"):
            if not isinstance(m.type, A.TensorType | A.ScalarType):
                raise fail("E0611", f"a {m.kind} must be a tensor", m.type.span, "not a tensor",
                           help=f"write `{m.kind} {m.name}: Tensor[...; f32]`; sub-blocks are "
                                "declared with `block`")
            shape, dtype = ev.tensor_type(m.type, frame)
            inst.members[m.name] = Tensor("@" + child_path, shape, dtype, kind=m.kind)
        elif m.kind == "block":
            inst.members[m.name] = instantiate_member_block(ev, m, frame, child_path)
    return inst


def config_value(ev: Evaluator, m: A.Member, frame: Frame, config: dict[str, Any]) -> Any:
    if m.name in config:
        raw = config[m.name]
    elif m.default is not None:
        return ev.value(m.default, frame)
    elif not ev.lowering:
        return Const(None, type_name(m.type))
    else:
        raise fail("E0612", f"config `{m.name}` has no value", m.span, "declared without a default",
                   help=f"pass it: `--set {m.name}=...`, or give a default: "
                        f"`config {m.name}: ... = ...`")
    t = type_name(m.type)
    try:
        if t == "bool":
            if not isinstance(raw, bool):
                raise ValueError
            return Const(raw, "bool")
        if t in DT.FLOATS:
            return Const(float(raw), t)
        if t in DT.INTS or t == "Dim":
            if isinstance(raw, bool) or float(raw) != int(raw):
                raise ValueError
            return Const(Dim.const(int(raw)), "int")
    except (TypeError, ValueError, OverflowError):
        pass
    raise fail("E0613", f"config `{m.name}` is {t}, but the value given is {raw!r}", m.span,
               "declared here", help="give `true` or `false`" if t == "bool" else
               f"give a {t} value")


def type_name(t: A.TypeExpr) -> str:
    return t.name if isinstance(t, A.ScalarType) else "tensor"


def instantiate_member_block(ev: Evaluator, m: A.Member, frame: Frame, path: str) -> Any:
    typ = m.type
    if isinstance(typ, A.ScalarType):
        typ = A.BlockType(typ.name, [], typ.span)
    if isinstance(typ, A.ArrayType):
        count = ev.eval_dim(typ.count, frame)
        if count.value is not None and count.value > MAX_REPEAT:
            raise fail("E0625", f"`{m.name}` repeats its block {count.value} times, more than "
                       f"{MAX_REPEAT}", typ.count.span, f"= {count.value}",
                       help=f"every block is lowered one by one; choose a count of at most "
                            f"{MAX_REPEAT} in the config")
        child, env = block_env(ev, typ.element, frame)
        n = 1 if count.value is None else count.value
        if instantiation.ENABLED:
            # The elements differ only in their paths: copy the first (check/instantiate.py).
            first = instantiate(ev, child, dict(env), f"{path}.0")
            items = [first] + [clone_element(first, f"{path}.0", f"{path}.{i}")
                               for i in range(1, n)]
        else:
            items = [instantiate(ev, child, dict(env), f"{path}.{i}") for i in range(n)]
        for i, item in enumerate(items):
            item.iteration, item.repeated = i, path
        return BlockArray(typ.element, path, count, items)
    if isinstance(typ, A.BlockType):
        child, env = block_env(ev, typ, frame)
        return instantiate(ev, child, env, path)
    raise fail("E0614", "a `block` member needs a block type", m.type.span, "not a block type",
               help="write `block attn: Attention<...>`, or `param` for tensors")


def block_env(ev: Evaluator, typ: A.BlockType, frame: Frame) -> tuple[A.BlockDecl, dict]:
    decl = ev.resolve_global(frame.module, typ.name, typ.span)
    if not isinstance(decl, A.BlockDecl) or decl.kind != "block":
        raise fail("E0615", f"`{typ.name}` is not a block", typ.span, "expected a block type",
                   help="declare it with `block " + typ.name + "<...> { ... }`")
    if len(ev.block_stack) > MAX_DEPTH:
        ev.reported_blocks.update(id(b) for b in ev.block_stack)
        outer = ev.block_stack[0]
        raise fail("E0209", f"blocks nest more than {MAX_DEPTH} deep, from `{outer.name}` to "
                   f"`{decl.name}`", typ.span, "the limit is reached here",
                   help="nest fewer blocks inside one another",
                   secondary=[(outer.name_span, f"`{outer.name}` declared here")])
    for k, outer in enumerate(ev.block_stack):
        if outer is decl:
            # A block that contains itself would have infinitely many members.
            ev.reported_blocks.update(id(b) for b in ev.block_stack[k:])
            cycle = [b.name for b in ev.block_stack[k:]] + [decl.name]
            raise fail("E0207", f"block `{decl.name}` contains itself: "
                       + " -> ".join(f"`{n}`" for n in cycle), typ.span,
                       "a member of its own type", help="a block cannot contain itself; "
                       "repeat layers with an array member instead: `block layers: "
                       "[Layer<...>; N]`",
                       secondary=[(b.name_span, f"`{b.name}` declared here")
                                  for b in ev.block_stack[k:]][:4])
    if len(typ.args) > len(decl.generics):
        raise fail("E0616", f"block `{decl.name}` takes {len(decl.generics)} generic arguments, "
                   f"got {len(typ.args)}", typ.span, "too many arguments",
                   secondary=[(decl.name_span, "declared here")])
    env: dict[str, Any] = {}
    for g, a in zip(decl.generics, typ.args):
        env[g.name] = ev.generic_value(g, a, frame)
    for g in decl.generics[len(typ.args):]:
        if g.default is None:
            raise fail("E0617", f"block `{decl.name}` needs generic `{g.name}`", typ.span,
                       "missing generic argument", secondary=[(g.span, "declared here")])
        assert decl.module is not None
        env[g.name] = ev.generic_value(g, g.default, Frame(decl.module, env))
    return decl, env


def walk_instance(inst: BlockInst) -> list[Tensor]:
    out: list[Tensor] = []
    for v in inst.members.values():
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, BlockInst):
            out.extend(walk_instance(v))
        elif isinstance(v, BlockArray):
            for item in v.items:
                out.extend(walk_instance(item))
    return out


# ==================================================================== checking


def symbolic_env(ev: Evaluator, generics: list[A.Generic], where: list[A.Expr],
                 module: A.Module) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for g in generics:
        env[g.name] = Dim.symbol(g.name) if g.kind == "Dim" else g.name
    # `where D == H * HD` makes D an alias of H * HD in generic code.
    for clause in where:
        if isinstance(clause, A.Binary) and clause.op == "==" and isinstance(clause.left, A.Name) \
                and isinstance(env.get(clause.left.name), Dim):
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
    ev.run_body(decl.body, frame)
    if decl.kind == "kernel":
        if frame.returned is not None:
            names = [r.name for r in decl.results if r.name] or ["y"]
            ev.errors.append(Diagnostic(
                "E0512", "a kernel writes its results with `store`; it does not `return`",
                frame.return_exprs[0].span if frame.return_exprs else decl.name_span,
                "returned here", help=f"`store({names[0]}[...], value)` for each named result"
                ).with_secondary(decl.name_span, "in this kernel"))
    elif frame.returned is None:
        if results:
            ev.errors.append(Diagnostic(
                "E0441", f"`{decl.name}` declares a result but never returns", decl.name_span,
                "no `return`", help="end the body with `return value`"))
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
            raise fail("E0620", f"parameter `{p.name}` is declared twice", p.span, "again here",
                       secondary=[(seen[p.name], "first here")])
        seen[p.name] = p.span
        if isinstance(p.type, A.ScalarType) and p.type.name == "Dim":
            v: Any = Const(Dim.symbol(p.name), "int")
        elif isinstance(p.type, (A.TensorType, A.ScalarType)):
            shape, dtype = ev.tensor_type(p.type, frame)
            if isinstance(p.type, A.ScalarType):
                v = Const(None, dtype) if DT.is_float(dtype) else (
                    Const(Dim.symbol(p.name), "int") if DT.is_int(dtype) else Const(None, dtype))
            else:
                v = Tensor("%?", shape, dtype, kind="global" if decl.kind == "kernel" else "value")
                if decl.kind == "kernel":
                    frame.tensor_params.add(p.name)
        else:
            raise fail("E0621", "parameters are tensors or scalars", p.type.span, "block type",
                       help="pass the block's tensors instead")
        frame.bind(p.name, v)
        values.append(v)
    return values


def check_returns(ev: Evaluator, decl: A.FuncDecl, returned: list[Any],
                  results: list[tuple], exprs: list[A.Expr] | None = None) -> None:
    if len(returned) != len(results):
        ev.errors.append(Diagnostic("E0441", f"`{decl.name}` returns {len(returned)} value(s) but "
                                    f"declares {len(results)}", decl.name_span, "declared here"))
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
                    f.diag.help = (f"convert explicitly before returning: `return {shown} as "
                                   f"{dtype}` (Linnet never narrows silently)")
            ev.errors.append(f.diag)


def check_kernel_header(ev: Evaluator, decl: A.FuncDecl, frame: Frame) -> None:
    if not decl.grid or not 1 <= len(decl.grid) <= 3:
        raise fail("E0510", f"kernel `{decl.name}` needs `grid(...)` with one to three sizes",
                   decl.name_span, "no grid", help="write `-> y: T grid(R)` after the results")
    for g in decl.grid:
        ev.eval_dim(g, frame)
    for r in decl.results:
        if r.name is None:
            raise fail("E0511", "a kernel's results are named", r.span, "unnamed result",
                       help="write `-> y: Tensor[...]`")
        shape, dtype = ev.tensor_type(r.type, frame)
        t = Tensor("%?", shape, dtype, kind="global")
        frame.results[r.name] = t
        frame.bind(r.name, t)


def check_kernel_binding(ev: Evaluator, decl: A.FuncDecl, frame: Frame, params: list) -> None:
    binding = decl.kernel
    assert binding is not None and decl.module is not None
    try:
        ref = ev.resolve_global(decl.module, binding.name, binding.span)
        if not (isinstance(ref, FuncRef) and ref.decl.kind == "kernel"):
            raise fail("E0513", f"`{binding.name}` is not a kernel", binding.span, "expected a kernel",
                       help=f"declare `kernel {binding.name}<...>(...)` in this module or import it")
        k = ref.decl
        if decl.kind != "op":
            raise fail("E0514", "only an `op` can be bound to a kernel", binding.span,
                       help="change `fn` to `op`")
        if len(binding.args) != len(k.generics):
            raise fail("E0515", f"kernel `{k.name}` takes {len(k.generics)} generic arguments, "
                       f"the op gives {len(binding.args)}", binding.span,
                       f"{len(binding.args)} given",
                       secondary=[(k.name_span, f"`{k.name}` declared here")])
        kenv = {g.name: ev.generic_value(g, a, frame) for g, a in zip(k.generics, binding.args)}
        assert k.module is not None
        kframe = Frame(k.module, kenv)
        if len(k.params) != len(decl.params):
            raise fail("E0516", f"kernel `{k.name}` takes {len(k.params)} parameter"
                       f"{'s' if len(k.params) != 1 else ''} but op `{decl.name}` has "
                       f"{len(decl.params)}", binding.span,
                       "parameters differ", secondary=[(k.name_span, "kernel declared here")],
                       help="a kernel takes the op's parameters, in order")
        for kp, op_p in zip(k.params, decl.params):
            want = ev.tensor_type(kp.type, kframe)
            have = ev.tensor_type(op_p.type, frame)
            if want != have:
                raise fail("E0517", f"kernel parameter `{kp.name}` is "
                           f"{fmt_type(want)} but the op passes `{op_p.name}`: {fmt_type(have)}",
                           binding.span, "bound here", secondary=[(kp.span, "kernel parameter"),
                                                                 (op_p.span, "op parameter")],
                           help="the kernel must take the op's parameters with the same types")
        if len(k.results) != len(decl.results):
            raise fail("E0518", f"kernel `{k.name}` writes {len(k.results)} results but op "
                       f"`{decl.name}` returns {len(decl.results)}", binding.span)
        for kr, orr in zip(k.results, decl.results):
            want = ev.tensor_type(kr.type, kframe)
            have = ev.tensor_type(orr.type, frame)
            if want != have:
                raise fail("E0519", f"kernel result `{kr.name}` is {fmt_type(want)} but the op "
                           f"returns {fmt_type(have)}", binding.span, "bound here",
                           secondary=[(kr.span, "kernel result"), (orr.span, "op result")])
        tile_check_frame = Frame(k.module, {**kenv}, None, k)
        # Tile sizes the kernel uses must be powers of two once bound.
        for node in walk_body(k.body):
            if isinstance(node, A.Call) and isinstance(node.callee, A.Name) and \
                    node.callee.name in ("iota", "fill"):
                for a in node.args[(1 if node.callee.name == "fill" else 0):]:
                    try:
                        n = ev.eval_dim(a, tile_check_frame)
                    except Fail:
                        continue
                    if n.value is not None and not (n.value > 0 and n.value & (n.value - 1) == 0):
                        raise fail("E0505", f"tile size {n.value} is not a power of two",
                                   binding.span, "bound here",
                                   secondary=[(a.span, "used as a tile size")],
                                   help=f"tile sizes must be powers of two: bind "
                                        f"{1 << max(0, (n.value - 1).bit_length())} and mask "
                                        "the extra lanes")
    except Fail as f:
        ev.errors.append(f.diag)


def fmt_type(t: tuple) -> str:
    shape, dtype = t
    return f"Tensor[{', '.join(str(d) for d in shape)}; {dtype}]" if shape else dtype


def walk_body(block: A.Block):
    for stmt in block.statements:
        if isinstance(stmt, A.Let | A.Assign):
            yield from walk(stmt.value)
            if isinstance(stmt, A.Assign):
                yield from walk(stmt.target)
        elif isinstance(stmt, A.Return):
            for v in stmt.values:
                yield from walk(v)
        elif isinstance(stmt, A.ExprStmt):
            yield from walk(stmt.expr)
        elif isinstance(stmt, A.For):
            yield from walk(stmt.iterable)
            yield from walk_body(stmt.body)


def check_grad(ev: Evaluator, decl: A.FuncDecl, env: dict, params: list,
               results: list[tuple]) -> None:
    grad = decl.grad
    assert grad is not None and decl.module is not None
    frame = Frame(decl.module, dict(env), None, decl)
    for p, v in zip(decl.params, params):
        frame.bind(p.name, v)
    if len(grad.names) != len(results):
        ev.errors.append(Diagnostic("E0520", f"`grad` names {len(grad.names)} incoming "
                                    f"gradient(s) but `{decl.name}` has {len(results)} result(s)",
                                    grad.span, "grad clause",
                                    help="name one gradient per result: `grad(dy) { ... }`"))
        return
    for name, (shape, dtype) in zip(grad.names, results):
        frame.bind(name, Tensor("%?", shape, dtype))
    ev.run_body(grad.body, frame)
    tensor_params = [(p, v) for p, v in zip(decl.params, params) if isinstance(v, Tensor)]
    if frame.returned is None or len(frame.returned) != len(tensor_params):
        ev.errors.append(Diagnostic(
            "E0521", f"`grad` must return one gradient per tensor parameter "
            f"({len(tensor_params)})", grad.span, "grad clause",
            help="return them in parameter order: `return dx, dw`"))
        return
    for (p, v), g in zip(tensor_params, frame.returned):
        if isinstance(g, Tensor) and g.shape != v.shape:
            ev.errors.append(Diagnostic("E0522", f"gradient for `{p.name}` has shape "
                                        f"{shape_str(g.shape)}, expected {shape_str(v.shape)}",
                                        grad.span, "grad clause"))


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
            ev.errors.append(Diagnostic("E0622", f"`{m.name}` is declared twice in "
                                        f"`{decl.name}`", m.span, "again here").with_secondary(
                seen[m.name], "first here"))
        seen[m.name] = m.span
    for method in decl.methods:
        check_function(ev, method, inst)
    if decl.kind == "model" and not any(m.kind == "entry" for m in decl.methods):
        ev.errors.append(Diagnostic("E0623", f"model `{decl.name}` has no entries",
                                    decl.name_span, "no `entry`",
                                    help="add one: `entry decode(token: Tensor[B; i32]) -> ...`"))


def check_program(program: Program) -> list[Diagnostic]:
    """Check every module of ``program``; returns all diagnostics (empty when clean)."""
    ev = Evaluator(program, Builder(None))
    ev.errors.extend(program.errors)
    for module in program.modules.values():
        names: dict[str, Span] = {}
        for item in module.items:
            if isinstance(item, A.FuncDecl | A.BlockDecl | A.Const):
                span = item.name_span if not isinstance(item, A.Const) else item.span
                if item.name in names:
                    ev.errors.append(Diagnostic("E0205", f"`{item.name}` is defined twice",
                                                span, "defined again here",
                                                help="rename one of them").with_secondary(
                        names[item.name], "first defined here"))
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
    return Diagnostic("E0209", f"`{name}` nests too deeply to compile" if name else
                      "the program nests too deeply to compile", span,
                      "calls, blocks or expressions nest too deeply under here",
                      help="flatten it: name intermediate values with `let`, and call fewer "
                           "functions inside one another")


def dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen = set()
    out = []
    for d in diags:
        key = (d.code, d.message, d.span.start if d.span else None,
               d.span.source.name if d.span else None)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def check_file(path: str | Path) -> Program:
    """Parse and check a file and what it uses; raises :class:`LinnetError` on any mistake.

    >>> prog = check_file("examples/llama/llama.linnet")   # doctest: +SKIP
    """
    program = Program.from_file(path)
    errors = check_program(program)
    if errors:
        raise LinnetError(errors)
    return program


def check_text(text: str, name: str = "main") -> Program:
    """Like :func:`check_file`, for source held in a string."""
    program = Program.from_text(text, name)
    errors = check_program(program)
    if errors:
        raise LinnetError(errors)
    return program


# ==================================================================== lowering


def find_model(program: Program, model: str | None) -> A.BlockDecl:
    models = [i for i in program.root.items if isinstance(i, A.BlockDecl) and i.kind == "model"]
    if model is not None:
        for m in models:
            if m.name == model:
                return m
        raise LinnetError(Diagnostic("E0600", f"no model `{model}` in {program.root.source.name}",
                                     help="models here: " + (", ".join(m.name for m in models)
                                                             or "none")))
    if len(models) != 1:
        raise LinnetError(Diagnostic(
            "E0600", f"{program.root.source.name} declares {len(models)} models; name one",
            help=(f"pick one with `--model {models[0].name}` (`model=` in Python); models here: "
                  + ", ".join(m.name for m in models)) if models else
                 "declare one: `model Name<...> { ... entry decode(...) ... }`"))
    return models[0]


def lower(program: Program, entry: str, inputs: dict[str, Any] | None = None,
          config: dict[str, Any] | None = None, weights: dict[str, tuple] | None = None,
          model: str | None = None, check: bool = True) -> Graph:
    """Lower a model's entry for concrete shapes into a :class:`Graph`.

    ``inputs`` maps each entry parameter to a shape (list of ints) or to ``(shape, dtype)``.
    ``config`` maps config members and model generics to values. ``weights`` maps parameter
    paths to ``(shape, dtype)``; dims that weights determine are bound from them, and a
    missing, unexpected or mis-shaped weight is an error.

    >>> prog = Program.from_file("examples/llama/llama.linnet")          # doctest: +SKIP
    >>> g = lower(prog, "decode", {"token": [1], "pos": [1]}, config)     # doctest: +SKIP
    """
    if check:
        errors = check_program(program)
        if errors:
            raise LinnetError(errors)
    decl = find_model(program, model)
    method = decl.method(entry)
    if method is None or method.kind != "entry":
        entries = [m.name for m in decl.methods if m.kind == "entry"]
        close = [e for e in entries if e.startswith(entry[:2])]
        raise LinnetError(Diagnostic(
            "E0601", f"model `{decl.name}` has no entry `{entry}`", decl.name_span,
            "model declared here",
            help=("entries: " + ", ".join(entries)) + (f"; did you mean `{close[0]}`?"
                                                       if close else "")))
    graph = Graph(entry=entry, model=decl.name)
    ev = Evaluator(program, Builder(graph), config)
    try:
        env = bind_model_generics(ev, decl, method, inputs or {}, config or {}, weights)
        inst = instantiate(ev, decl, dict(env), "", config)
        ev.check_where(decl, Frame(decl.module, inst.env, inst), decl.name_span,  # type: ignore[arg-type, arg-type]
                       label="model declared here",
                       help="choose config values that satisfy the clause")
        if weights is not None:
            check_weights(decl, inst, weights)
        graph.dims = {k: int(v.value) for k, v in env.items()
                      if isinstance(v, Dim) and v.value is not None}
        graph.dtypes = {k: v for k, v in env.items() if isinstance(v, str)}
        graph.config = {k: (v.value.value if isinstance(v.value, Dim) else v.value)
                        for k, v in inst.env.items() if isinstance(v, Const)}
        for t in walk_instance(inst):
            vt = ValueType(tuple(d.value for d in t.shape), t.dtype)  # type: ignore[misc]
            (graph.states if t.kind == "state" else graph.parameters)[t.ref[1:]] = vt
        frame = Frame(decl.module, inst.env, inst, method)  # type: ignore[arg-type]
        for p in method.params:
            shape, dtype = ev.tensor_type(p.type, frame)
            t = ev.builder.emit("input", [], shape, dtype, {"name": p.name}, hint=p.name)
            graph.steps.pop()  # inputs are not steps; they are listed in graph.inputs
            graph.inputs.append(t.ref)
            frame.bind(p.name, t)
        call = ev.builder.open_call(method.qualified_name, "entry", "", method.span)
        ev.run_body(method.body, frame)
        ev.builder.close_call(call)
        returned = frame.returned or []
        results = [ev.tensor_type(r.type, frame) for r in method.results]
        if len(returned) != len(results):
            raise fail("E0441", f"entry `{entry}` returns {len(returned)} values but declares "
                       f"{len(results)}", method.name_span)
        for value, (shape, dtype), res in zip(returned, results, method.results):
            value = ev.check_return(value, shape, dtype, res, method)
            graph.outputs.append(value.ref)
    except Fail as f:
        raise LinnetError(dedupe([*ev.errors, f.diag])) from None
    except RecursionError:
        # The depth limits (E0118, E0119, E0209) keep lowering shallow; this is the last line.
        raise LinnetError(dedupe([*ev.errors, too_deep(method)])) from None
    if ev.errors:
        raise LinnetError(dedupe(ev.errors))
    graph.sources = {m.source.name: m.name for m in program.modules.values()}
    check_numel(graph, {f"%{p.name}": p.span for p in method.params} | param_spans(inst))
    return run_passes(graph)


def bind_model_generics(ev: Evaluator, decl: A.BlockDecl, entry: A.FuncDecl,
                        inputs: dict[str, Any], config: dict[str, Any],
                        weights: dict[str, tuple] | None) -> dict[str, Any]:
    assert decl.module is not None
    generics = {g.name: g for g in decl.generics + entry.generics}
    config_names = {m.name for m in decl.members if m.kind == "config"}
    for key in config:
        if key not in generics and key not in config_names:
            raise fail("E0602", f"`{key}` is not a generic or config of model `{decl.name}`",
                       decl.name_span, "model declared here",
                       help="known names: " + ", ".join(list(generics) + sorted(config_names)))
    env: dict[str, Any] = {}
    for name, value in config.items():
        if name in generics:
            g = generics[name]
            if g.kind == "DType":
                if value not in DT.DTYPES:
                    raise fail("E0613", f"`{name}` must be an element type, got {value!r}",
                               g.span, "declared here", help="one of " + ", ".join(DT.DTYPES))
                env[name] = value
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise fail("E0613", f"`{name}` must be a positive integer, got {value!r}",
                               g.span, "declared here")
                if value > MAX_SIZE:
                    raise fail("E0609", f"`{name}` = {value} is larger than a tensor dimension "
                               f"can be (at most {MAX_SIZE})", g.span, "declared here",
                               help=f"check the config's `{name}`")
                env[name] = Dim.const(value)
    # Entry inputs.
    params = {p.name: p for p in entry.params}
    for name in inputs:
        if name not in params:
            raise fail("E0604", f"entry `{entry.name}` has no input `{name}`", entry.name_span,
                       "entry declared here",
                       help="inputs: " + ", ".join(p.name for p in entry.params))
    for p in entry.params:
        if p.name not in inputs:
            raise fail("E0605", f"input `{p.name}` of entry `{entry.name}` was not given",
                       p.span, "needs a shape",
                       help=f"give its shape, e.g. `--input {p.name}="
                            + ",".join(ev.src(d) for d in p.type.dims) + "` with numbers"
                       if isinstance(p.type, A.TensorType) else
                       f"give it, e.g. `--input {p.name}=`")
        if not isinstance(p.type, A.TensorType):
            continue
        given = inputs[p.name]
        shape = given[0] if isinstance(given, tuple) else given
        check_sizes(shape, f"input `{p.name}`", p.span, p.name)
        if len(shape) != len(p.type.dims):
            raise fail("E0606", f"input `{p.name}` has {len(shape)} "
                       f"dimension{'s' if len(shape) != 1 else ''}, entry `{entry.name}` expects "
                       f"{len(p.type.dims)}", p.span, f"declared {len(p.type.dims)}-dimensional",
                       help="give one size per dimension: `--input " + p.name + "="
                            + ",".join(ev.src(d) for d in p.type.dims) + "` with numbers")
        pending = list(zip(p.type.dims, shape))
        unify_dims(ev, pending, env, generics, decl, f"input `{p.name}`", p.span)
    # Weights.
    if weights is not None:
        for _ in range(4):
            progress = False
            sym_env = {n: env.get(n, Dim.symbol(n) if g.kind == "Dim" else n)
                       for n, g in generics.items()}
            count_arrays(decl, sym_env, env, generics, weights)
            saved = ev.lowering
            ev.lowering = False
            try:
                inst = instantiate(ev, decl, dict(sym_env), "", config)
            finally:
                ev.lowering = saved
            for t in walk_instance(inst):
                if t.kind != "param" or t.ref[1:] not in weights:
                    continue
                wshape, wdtype = weights[t.ref[1:]]
                check_sizes(wshape, f"weight `{t.ref[1:]}`", None, "")
                if isinstance(t.dtype, str) and t.dtype in generics and t.dtype not in env:
                    env[t.dtype] = wdtype
                    progress = True
                if len(wshape) != len(t.shape):
                    continue
                for d, n in zip(t.shape, wshape):
                    unknown = {s for s in d.symbols() if s in generics and s not in env}
                    if not unknown:
                        continue
                    solved = solve_for(d, Dim.const(n), unknown)
                    if solved and solved[1].value is not None:
                        env[solved[0]] = solved[1]
                        progress = True
            if not progress:
                break
    solve_where(ev, decl, env, generics)
    missing = [g for g in decl.generics + entry.generics if g.name not in env and g.default is None]
    if missing:
        names = ", ".join(f"`{g.name}`" for g in missing)
        # A `where` clause that should have bound it, with every other name known, has no
        # whole-number solution (`where H == KV * G` with H = 3, KV = 2): show it.
        unsolvable = []
        for clause in decl.where:
            used = {n.name for n in walk(clause) if isinstance(n, A.Name) and n.name in generics}
            unknown = used - set(env)
            if len(unknown) == 1 and unknown <= {g.name for g in missing}:
                known = ", ".join(f"{n} = {env[n]}" for n in sorted(used - unknown))
                unsolvable.append((clause.span, f"no whole `{next(iter(unknown))}` satisfies "
                                                f"this with {known}"))
        raise fail("E0603", f"model `{decl.name}`: cannot determine {names}", decl.name_span,
                   "model declared here",
                   help="give " + ("them" if len(missing) > 1 else "it") + " in the config (`--set "
                   f"{missing[0].name}=...`)" + ("" if weights is not None else " or pass weights")
                   + (", or change the sizes in the `where` clause" if unsolvable else ""),
                   secondary=[(g.span, "unbound") for g in missing[:3]] + list(unsolvable))
    for g in decl.generics + entry.generics:
        if g.name not in env and g.default is not None:
            env[g.name] = ev.generic_value(g, g.default, Frame(decl.module, env))
    return env


# Sizes and element counts are int64 in every runtime (torch, safetensors).
MAX_SIZE = 2**63 - 1


def check_sizes(shape: Any, what: str, span: Span | None, name: str) -> None:
    """A shape is a list of positive sizes that fit in int64 (E0608, E0609).

    ``name`` is the input's name, or "" for a weight.

    >>> check_sizes([2, 3], "input `x`", None, "x")
    """
    example = f"`--input {name}=1,8`" if name else "`[2048, 64]`"
    if not isinstance(shape, list | tuple):
        raise fail("E0608", f"{what}: a shape is a list of sizes, got {shape!r}", span,
                   "declared here", help=f"give one positive size per dimension, e.g. {example}")
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, int):
            raise fail("E0608", f"{what} has size {n!r}; sizes are whole numbers", span,
                       "declared here", help=f"give one positive size per dimension, e.g. "
                       f"{example}")
        if n <= 0:
            raise fail("E0608", f"{what} has size {n}; sizes are at least 1", span,
                       "declared here", help=f"give one positive size per dimension, e.g. "
                       f"{example}")
        if n > MAX_SIZE:
            raise fail("E0609", f"{what} has size {n}, larger than a tensor dimension can be "
                       f"(at most {MAX_SIZE})", span, "declared here",
                       help="give a smaller size")


def check_numel(graph: Graph, spans: dict[str, Span]) -> None:
    """Every value of a lowered graph has fewer than 2^63 elements (E0618).

    Sizes that fit one by one can still multiply past int64 (`[2^32, 2^32]`), which no
    runtime can allocate or even index.
    """
    inputs = {name: graph.values[name] for name in graph.inputs if name in graph.values}
    groups: list[tuple[str, dict[str, ValueType]]] = [
        ("input", inputs), ("parameter", graph.parameters), ("state", graph.states),
        ("value", graph.values)]
    for kind, table in groups:
        for name, vt in table.items():
            numel = 1
            for d in vt.shape:
                numel *= d if isinstance(d, int) else 1
                if isinstance(d, int) and d < 0:
                    raise LinnetError(Diagnostic(
                        "E0619", f"{kind} `{name.lstrip('%@')}` has shape {list(vt.shape)}, "
                        "with a negative size", spans.get(name), "", help=NEGATIVE_HELP))
            if numel > MAX_SIZE:
                raise LinnetError(Diagnostic(
                    "E0618", f"{kind} `{name.lstrip('%@')}` of shape {list(vt.shape)} has {numel} elements, "
                    f"more than a tensor can hold (at most {MAX_SIZE})", spans.get(name),
                    f"{list(vt.shape)}" if spans.get(name) else "",
                    help="choose smaller sizes in the config or the inputs"))


def solve_where(ev: Evaluator, decl: A.BlockDecl, env: dict, generics: dict) -> None:
    """Use `where A == expr` clauses to bind the one generic they leave unknown."""
    assert decl.module is not None
    for _ in range(len(decl.where)):
        for clause in decl.where:
            if not (isinstance(clause, A.Binary) and clause.op == "=="):
                continue
            sym = {n: env.get(n, Dim.symbol(n)) for n, g in generics.items() if g.kind == "Dim"}
            try:
                left = ev.eval_dim(clause.left, Frame(decl.module, sym))
                right = ev.eval_dim(clause.right, Frame(decl.module, sym))
            except Fail:
                continue
            diff = left - right
            unknown = {s for s in diff.symbols() if s in generics and s not in env}
            if len(unknown) == 1:
                solved = solve_for(diff, Dim.const(0), unknown)
                if solved and solved[1].value is not None and solved[1].value > 0:
                    env[solved[0]] = solved[1]


def unify_dims(ev: Evaluator, pending: list, env: dict, generics: dict, decl: A.BlockDecl,
               what: str, span: Span) -> None:
    for _ in range(len(pending) + 1):
        rest = []
        for dexpr, n in pending:
            if isinstance(dexpr, A.Name) and dexpr.name in generics and dexpr.name not in env:
                env[dexpr.name] = Dim.const(n)
                continue
            sym = {nm: env.get(nm, Dim.symbol(nm)) for nm in generics if generics[nm].kind == "Dim"}
            try:
                d = ev.eval_dim(dexpr, Frame(decl.module, sym))  # type: ignore[arg-type]
            except Fail:
                rest.append((dexpr, n))
                continue
            unknown = {s for s in d.symbols() if s in generics and s not in env}
            if unknown:
                solved = solve_for(d, Dim.const(n), unknown)
                if solved and solved[1].value is not None:
                    env[solved[0]] = solved[1]
                else:
                    rest.append((dexpr, n))
                continue
            if d.value != n:
                settable = isinstance(dexpr, A.Name) and dexpr.name in generics
                raise fail("E0607", f"{what} has size {n} where `{ev.src(dexpr)}` = {d}",
                           dexpr.span, f"expects {d}",
                           help="pass an input of the declared shape" + (
                               f", or set `--set {dexpr.name}={n}`" if settable else ""))
        if len(rest) == len(pending):
            break
        pending = rest


def count_arrays(decl: A.BlockDecl, sym_env: dict, env: dict, generics: dict,
                 weights: dict[str, tuple]) -> None:
    """Bind a repeated block's count (`[Layer<...>; L]`) from the layer indices in weights."""
    for m in decl.members:
        if m.kind == "block" and isinstance(m.type, A.ArrayType) and isinstance(
                m.type.count, A.Name) and m.type.count.name in generics and \
                m.type.count.name not in env:
            pattern = re.compile(rf"^{re.escape(m.name)}\.(\d+)\.")
            found = {int(mt.group(1)) for k in weights if (mt := pattern.match(k))}
            if found:
                env[m.type.count.name] = Dim.const(
                    dense_count(found, m.name, pattern, weights, m.span))
                sym_env[m.type.count.name] = env[m.type.count.name]
        elif m.kind == "block" and isinstance(m.type, A.BlockType):
            child = decl.module.find(m.type.name) if decl.module else None
            if isinstance(child, A.BlockDecl):
                # Nested counts (model.layers) are bound through the child's generic args.
                sub = {k[len(m.name) + 1:]: v for k, v in weights.items()
                       if k.startswith(m.name + ".")}
                for cm in child.members:
                    if cm.kind == "block" and isinstance(cm.type, A.ArrayType):
                        pattern = re.compile(rf"^{re.escape(cm.name)}\.(\d+)\.")
                        found = {int(mt.group(1)) for k in sub if (mt := pattern.match(k))}
                        idx = [g.name for g in child.generics]
                        if found and isinstance(cm.type.count, A.Name) and \
                                cm.type.count.name in idx:
                            pos = idx.index(cm.type.count.name)
                            if pos < len(m.type.args):
                                arg = m.type.args[pos]
                                if isinstance(arg, A.Name) and arg.name in generics and \
                                        arg.name not in env:
                                    env[arg.name] = Dim.const(dense_count(
                                        found, f"{m.name}.{cm.name}", pattern, sub, cm.span,
                                        prefix=m.name + "."))
                                    sym_env[arg.name] = env[arg.name]


# At most this many repeated blocks: each is lowered (unrolled) one by one, so a count of
# millions would run for hours. The largest published transformers have a few hundred layers.
MAX_REPEAT = 4096


def dense_count(found: set[int], path: str, pattern: re.Pattern, weights: dict[str, tuple],
                span: Span, prefix: str = "") -> int:
    r"""How many blocks of the array ``path`` the weights hold: indices 0..N-1, all present.

    A stray tensor (`model.layers.99999999.x` beside layers 0 and 1) must not make lowering
    unroll a hundred million layers, so a gap in the indices is an error (E0624) naming the
    tensor past it, and so is a count over MAX_REPEAT (E0625).

    >>> dense_count({0, 1, 2}, "layers", re.compile(r"^layers\.(\d+)\."), {}, None)
    3
    """
    count = max(found) + 1
    if len(found) != count:
        # The first gap is at most len(found): never build range(count), which may be huge.
        missing = next(i for i in range(len(found) + 1) if i not in found)
        stray = sorted((int(mt.group(1)), k) for k in weights
                       if (mt := pattern.match(k)) and int(mt.group(1)) > missing)[0][1]
        raise fail("E0624", f"the weights hold `{prefix}{stray}` but no `{path}.{missing}`: "
                   f"the layers of `{path}` must be numbered 0, 1, 2, ... without gaps",
                   span, "its count is read from the weights' names",
                   help=f"remove the stray tensor `{prefix}{stray}`, or give the count in the "
                        "config")
    if count > MAX_REPEAT:
        raise fail("E0625", f"the weights hold {count} blocks of `{path}`, more than "
                   f"{MAX_REPEAT}", span, "its count is read from the weights' names",
                   help="check the checkpoint: no model has that many layers")
    return count


def param_spans(inst: BlockInst) -> dict[str, Span]:
    """Where each parameter of an instance is declared, by path."""
    out: dict[str, Span] = {}
    for m in inst.decl.members:
        v = inst.members.get(m.name)
        if isinstance(v, Tensor):
            out[v.ref[1:]] = m.span
        elif isinstance(v, BlockInst):
            out.update(param_spans(v))
        elif isinstance(v, BlockArray):
            for item in v.items:
                out.update(param_spans(item))
    return out


def check_weights(decl: A.BlockDecl, inst: BlockInst, weights: dict[str, tuple]) -> None:
    """Every parameter has a weight of its shape and dtype, and every weight is a parameter."""
    params = {t.ref[1:]: t for t in walk_instance(inst) if t.kind == "param"}
    spans = param_spans(inst)
    members = {m.name: m.span for m in decl.members}
    diags: list[Diagnostic] = []

    def at_param(d: Diagnostic, path: str) -> Diagnostic:
        # A parameter declared in a sub-block: show the model's member it comes through too.
        top = path.split(".")[0]
        if "." in path and top in members:
            d.with_secondary(members[top], f"`{path}` comes from `{top}`")
        return d

    missing = [p for p in params if p not in weights]
    for p in missing[:20]:
        t = params[p]
        diags.append(at_param(Diagnostic(
            "E0630", f"weight `{p}` is missing", spans.get(p), f"`{p}` is declared here",
            help=f"the model expects {fmt_type((t.shape, t.dtype))}; check that the weights "
                 "belong to this model and config"), p))
    if len(missing) > 20:
        diags.append(Diagnostic("E0630", f"... and {len(missing) - 20} more missing weights"))
    unexpected = [w for w in weights if w not in params]
    for w in unexpected[:20]:
        close = difflib.get_close_matches(w, list(params), n=1, cutoff=0.8)
        diags.append(Diagnostic("E0631", f"weight `{w}`{shard_of(weights[w])} is not a "
                                f"parameter of `{decl.name}`",
                                None, help=(f"did you mean `{close[0]}`? " if close else "")
                                + "remove it, or declare it as a `param` in the model"))
    for p, t in params.items():
        if p in weights:
            shape, dtype = weights[p]
            want = tuple(d.value for d in t.shape)
            if tuple(shape) != want:
                diags.append(at_param(Diagnostic(
                    "E0632", f"weight `{p}`{shard_of(weights[p])} has shape {list(shape)}, "
                    f"the model expects "
                    f"{list(want)}", spans.get(p), f"{list(want)} with this config",
                    help="the weights were made for another config"), p))
            elif dtype != t.dtype:
                diags.append(at_param(Diagnostic(
                    "E0633", f"weight `{p}`{shard_of(weights[p])} is {dtype}, the model "
                    f"expects {t.dtype}",
                    spans.get(p), f"{t.dtype} with this config",
                    help=f"convert it on load (`load(..., dtype={t.dtype!r})`), or make the model's "
                         f"element type {dtype} (its config's `T`, say)"), p))
    if diags:
        raise LinnetError(diags)
