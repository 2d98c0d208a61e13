"""The backward pass of a kernel launch, lowered at lowering time (issue 39): what
``emit/kernel_grad.py`` writes as a launch's autograd, recorded in the graph
(``graph.backwards``, :class:`~linnet.lang.ir.kernels.BackwardBody`) by
:mod:`linnet.lang.check.kernel_instances`, so that the emitter reads no syntax tree.

Both backward functions are ordinary lowered graphs: the op's module with a small model
appended, whose one entry calls the op (the body) or a copy of the grad clause as an op of
its own (the grad clause), for the call's concrete shapes.

>>> _literal(2.0), _literal(True), _literal(3)
('2.0', 'true', '3')
"""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.driver import lower
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph
from linnet.lang.ir.kernels import BackwardBody, OpInfo
from linnet.lang.syntax.parser import parse_appended
from linnet.lang.syntax.program import Program

MODEL = "LinnetKernelGrad"


def op_info(op: A.FuncDecl) -> OpInfo:
    """What the emitters say about ``op`` (see :class:`~linnet.lang.ir.kernels.OpInfo`).

    >>> from linnet.lang.syntax.program import Program
    >>> prog = Program.from_text("pub op twice(x: Tensor[3; f32]) -> Tensor[3; f32] {"
    ...                          " return x * 2.0 }")
    >>> op_info(prog.module("main").find("twice")).tensor_params
    ['x']
    """
    return OpInfo(
        op.name,
        op.qualified_name,
        [p.name for p in op.params if isinstance(p.type, A.TensorType)],
        list(op.grad.names) if op.grad is not None else [],
        op.grad is not None,
    )


def no_backward_advice(op: OpInfo, cause: Diagnostic) -> tuple[str, str]:
    """E0545's message and help for ``op``, matched to why its backward did not lower
    (``cause``: the first diagnostic of that lowering).

    >>> op = OpInfo("f", "m::f", ["x"], [], False)
    >>> no_backward_advice(op, Diagnostic("E0603", "cannot determine `K`"))[1][:40]
    'the backward pass is lowered from the ty'
    """
    what = "its grad clause" if op.has_grad else "its body (run again)"
    message = (
        f"the kernel launch of `{op.qualified_name}` cannot be differentiated: "
        f"its backward pass, {what}, could not be lowered for these shapes "
        f"({cause.code}: {cause.message})"
    )
    exact = (
        "or load the model with numerics='exact', where the body runs and torch "
        "autograd differentiates it"
    )
    if cause.code == "E0603":
        # A generic of the op that no tensor parameter or result names on its own (it is
        # only given at the call, `op<N, 3>(x)`, or only in a product, `Tensor[H * HD]`).
        return message, (
            "the backward pass is lowered from the types of the op's tensor "
            "parameters and results: name every generic of "
            f"`{op.name}` on its own in one of them (`Tensor[K; f32]`), " + exact
        )
    if op.has_grad and cause.code.startswith(("E052", "E095")):
        return message, (f"fix `{op.name}`'s grad clause ({cause.help or cause.message}), " + exact)
    return message, (
        "this is a limitation of Linnet's kernel backward passes, not of your "
        "model: please report it with the op's signature, " + exact
    )


def backward_body(
    program: Program,
    op: A.FuncDecl,
    arg_types: list[tuple[tuple[int, ...], str]],
    result_types: list[tuple[tuple[int, ...], str]],
    scalars: dict[str, Any],
    entry: str,
) -> BackwardBody:
    """The :class:`~linnet.lang.ir.kernels.BackwardBody` of one bound call: its lowered
    graph (entry ``entry``), or why it has none (the forward pass must not fail for want of
    a backward one: only differentiating the launch is an error, E0545).

    >>> # backward_body(program, op, [((3,), "f32")], [((3,), "f32")], {}, "linnet_backward")
    """
    info = op_info(op)
    out = BackwardBody(info, list(arg_types), dict(scalars), list(result_types), entry=entry)
    try:
        out.graph, out.uses_grad_clause = backward_graph(
            program, op, arg_types, result_types, scalars, entry
        )
    except LinnetError as err:
        out.cause = err.diagnostics[0]
        out.advice = no_backward_advice(info, out.cause)
    return out


def backward_graph(
    program: Program,
    op: A.FuncDecl,
    arg_types: list[tuple[tuple[int, ...], str]],
    result_types: list[tuple[tuple[int, ...], str]],
    scalars: dict[str, Any],
    entry: str,
) -> tuple[Graph, bool]:
    """The backward graph of one bound call: ``(graph, uses_grad_clause)``.

    ``arg_types`` are the shapes and dtypes of the op's tensor arguments at the call,
    ``result_types`` its results', ``scalars`` the values of its scalar parameters.
    With a grad clause the entry takes the tensor arguments and then one incoming gradient
    per result, and returns one gradient per tensor parameter; without one it takes the
    tensor arguments and returns the op's results (its body, to run again under autograd).
    """
    module = op.module
    assert module is not None
    text = module.source.text

    def src(span: Any) -> str:
        return text[span.start : span.stop]

    tensors = [p for p in op.params if isinstance(p.type, A.TensorType)]
    configs = "".join(
        f"    config {p.name}: {src(p.type.span)} = {_literal(scalars[p.name])}\n"
        for p in op.params
        if not isinstance(p.type, A.TensorType)
    )
    # The model takes the op's generics, bound from the inputs' shapes and dtypes; the entry
    # takes the op's tensor parameters, with the op's own types.
    params = [src(p.span) for p in tensors]
    names = [p.name for p in tensors]
    types = list(arg_types)
    if op.grad is not None:
        params += [f"{n}: {src(r.type.span)}" for n, r in zip(op.grad.names, op.results)]
        names += list(op.grad.names)
        types += list(result_types)
        results = [src(p.type.span) for p in tensors]
        body = src(op.grad.body.span)
    else:
        results = [src(r.type.span) for r in op.results]
        body = _call_body(op)
    generics = ", ".join(src(g.span) for g in op.generics)
    where = (" where " + ", ".join(src(w.span) for w in op.where)) if op.where else ""
    result = results[0] if len(results) == 1 else f"({', '.join(results)})"
    added = (
        "\n// Added by linnet.lang.emit.kernel_grad.\n"
        f"pub model {MODEL}{f'<{generics}>' if generics else ''}{where} {{\n{configs}"
        f"    entry {entry}({', '.join(params)}) -> {result} {body}\n}}\n"
    )
    # Only the model is parsed: the module's own items are reused (parse_appended).
    prog = Program(parse_appended(module, added), list(program.search))
    inputs = {n: (list(shape), dtype) for n, (shape, dtype) in zip(names, types)}
    config = _generics(op, tensors, arg_types, result_types)
    graph = lower(prog, entry, inputs, config, model=MODEL, check=False)
    for call_ in graph.calls:
        # The differentiated body never launches a kernel itself.
        call_.attributes.pop("kernel_applies", None)
        if "kernel" in call_.attributes:
            call_.attributes["kernel_applies"] = False
    return graph, op.grad is not None


def _generics(
    op: A.FuncDecl,
    tensors: list[A.Param],
    arg_types: list[tuple[tuple[int, ...], str]],
    result_types: list[tuple[tuple[int, ...], str]],
) -> dict[str, Any]:
    """The op's generics that the call's types give directly, as the wrapper model's config.

    Element types are not bound from inputs, and a dim is bound from an input only where it
    can be solved (`Tensor[H * HD, D; T]` does not give `H` alone): every generic that a
    parameter's or a result's type names on its own (`Tensor[N, H, HD; T]`) is given here,
    so an op whose results name a generic its parameters only multiply (the fused QKV ops'
    `H`, `KV`, `G`) has a backward pass too.
    """
    kinds = {g.name: g.kind for g in op.generics}
    config: dict[str, Any] = {}
    typed = list(zip(tensors, arg_types)) + list(zip(op.results, result_types))
    for p, (shape, dtype) in typed:
        if not isinstance(p.type, A.TensorType):
            continue
        name = p.type.dtype.name
        if kinds.get(name) == "DType":
            config.setdefault(name, dtype)
        if len(p.type.dims) != len(shape):
            continue
        for dim, size in zip(p.type.dims, shape):
            if isinstance(dim, A.Name) and kinds.get(dim.name) == "Dim":
                config.setdefault(dim.name, size)
    return config


def _call_body(op: A.FuncDecl) -> str:
    """The body of an entry that calls ``op`` and returns each of its results.

    `return op(...)` of an op with several results returns one value (the tuple), not each
    result, so the results are bound by name first (issue 46: E0441 "returns 1 values but
    declares 3" was the backward of every several-result kernel op)."""
    call = f"{op.name}({', '.join(p.name for p in op.params)})"
    if len(op.results) == 1:
        return f"{{\n        return {call}\n    }}"
    taken = {p.name for p in op.params}
    names = []
    for i in range(len(op.results)):
        name = f"linnet_result_{i}"
        while name in taken:
            name += "_"
        names.append(name)
    joined = ", ".join(names)
    return f"{{\n        let ({joined}) = {call}\n        return {joined}\n    }}"


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if "e" in repr(v) or "." in repr(v) else f"{v}.0"
    return str(v)


__all__ = ["MODEL", "backward_body", "backward_graph", "no_backward_advice", "op_info"]
