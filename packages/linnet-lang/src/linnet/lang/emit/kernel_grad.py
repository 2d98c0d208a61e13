"""Kernel launches under autograd, in generated PyTorch.

A kernel's launch is opaque to torch autograd, so where gradients are wanted (grad mode on
and an input that requires grad) the generated code launches it through
``KernelGrad``, a ``torch.autograd.Function`` whose backward is

* the op's `grad` clause, lowered for the call's shapes and emitted as PyTorch (a function
  of the op's tensor parameters and the incoming gradients), or, for an op without one,
* torch autograd of the op's body, run again on the saved inputs (recomputation: nothing
  but the inputs is kept for the backward pass).

Both backward functions are ordinary lowered graphs: the op's module with a small model
appended, whose one entry calls the op (the body) or a copy of the grad clause as an op of
its own (the grad clause), for the call's concrete shapes. They are emitted into the same
module as extra entry functions, with kernels off (the body that is differentiated never
launches a kernel itself). Without grad mode nothing changes: the launch is the launcher
call as before.

>>> "class KernelGrad(torch.autograd.Function):" in GRAD_HELPERS
True
"""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import LinnetError, SourceFile
from linnet.lang.ir.graph import Graph

MODEL = "LinnetKernelGrad"
# Raised by generated code when autograd reaches a launch whose backward could not be lowered.
NO_BACKWARD = "E0545"

# Written once into a module that launches kernels.
GRAD_HELPERS = '''class KernelGrad(torch.autograd.Function):
    """A kernel launch that autograd differentiates with `backward(inputs, grads)`: the
    op's grad clause, or autograd of the op's body run again (emit/kernel_grad.py)."""

    @staticmethod
    def forward(ctx, launch, backward, *tensors):
        ctx.backward = backward
        ctx.save_for_backward(*tensors)
        return launch(*tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.backward(ctx.saved_tensors, grads))


def launch_with_grad(launch, backward, *tensors):
    """`launch(*tensors)`, through KernelGrad where autograd records this call."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return KernelGrad.apply(launch, backward, *tensors)
    return launch(*tensors)


def body_backward(body, inputs, grads):
    """Gradients of the op's body, run again on `inputs` (autograd of the recomputation);
    None for inputs that are not floating point."""
    with torch.enable_grad():
        xs = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        outs = body(*xs, {}, {})
        wrt = [x for x in xs if x.requires_grad]
        # Only results that depend on a float input carry a gradient back (an integer
        # result, or one computed from integers alone, has none).
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                       allow_unused=True) if pairs else [None] * len(wrt))
        return [next(got) if x.requires_grad else None for x in xs]


def no_backward(message, help):
    """E0545, as a LinnetError where linnet-lang is importable (a RuntimeError otherwise:
    generated source also runs on its own)."""
    try:
        from linnet.lang.diagnostics.core import Diagnostic, LinnetError
    except ImportError:
        return RuntimeError(f"E0545: {message} (help: {help})")
    return LinnetError(Diagnostic("E0545", message, help=help))'''


def backward_graph(program: Any, op: A.FuncDecl, arg_types: list[tuple[tuple[int, ...], str]],
                   result_types: list[tuple[tuple[int, ...], str]], scalars: dict[str, Any],
                   entry: str) -> tuple[Graph, bool]:
    """The backward graph of one bound call: ``(graph, uses_grad_clause)``.

    ``arg_types`` are the shapes and dtypes of the op's tensor arguments at the call,
    ``result_types`` its results', ``scalars`` the values of its scalar parameters.
    With a grad clause the entry takes the tensor arguments and then one incoming gradient
    per result, and returns one gradient per tensor parameter; without one it takes the
    tensor arguments and returns the op's results (its body, to run again under autograd).
    """
    from linnet.lang.check.driver import lower
    from linnet.lang.syntax.parser import parse
    from linnet.lang.syntax.program import Program

    module = op.module
    assert module is not None
    text = module.source.text

    def src(span: Any) -> str:
        return text[span.start:span.stop]

    tensors = [p for p in op.params if isinstance(p.type, A.TensorType)]
    configs = "".join(f"    config {p.name}: {src(p.type.span)} = {_literal(scalars[p.name])}\n"
                      for p in op.params if not isinstance(p.type, A.TensorType))
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
    wrapper = (text.rstrip("\n") + "\n\n// Added by linnet.lang.emit.kernel_grad.\n"
               f"pub model {MODEL}{f'<{generics}>' if generics else ''}{where} {{\n{configs}"
               f"    entry {entry}({', '.join(params)}) -> {result} {body}\n}}\n")
    prog = Program(parse(SourceFile(module.source.name, wrapper), module.name),
                   list(program.search))
    inputs = {n: (list(shape), dtype) for n, (shape, dtype) in zip(names, types)}
    config = _generics(op, tensors, arg_types, result_types)
    graph = lower(prog, entry, inputs, config, model=MODEL, check=False)
    for call_ in graph.calls:
        # The differentiated body never launches a kernel itself.
        call_.attributes.pop("kernel_applies", None)
        if "kernel" in call_.attributes:
            call_.attributes["kernel_applies"] = False
    return graph, op.grad is not None


def backward_function(name: str, entry_function: str, uses_grad_clause: bool,
                      outputs: int) -> str:
    """The ``backward(inputs, grads)`` a launch passes to ``launch_with_grad``."""
    if uses_grad_clause:
        return (f"def {name}(inputs, grads):\n"
                f'    """The op\'s grad clause ({entry_function})."""\n'
                f"    return list({entry_function}(*inputs, *grads, {{}}, {{}}))")
    return (f"def {name}(inputs, grads):\n"
            f'    """Autograd of the op\'s body ({entry_function}), run again."""\n'
            f"    return body_backward({entry_function}, inputs, grads)")


def _generics(op: A.FuncDecl, tensors: list[A.Param],
              arg_types: list[tuple[tuple[int, ...], str]],
              result_types: list[tuple[tuple[int, ...], str]]) -> dict[str, Any]:
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


def _tensor(t: tuple[tuple[int, ...], str]) -> str:
    shape, dtype = t
    return f"Tensor[{', '.join(str(s) for s in shape)}; {dtype}]"


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if "e" in repr(v) or "." in repr(v) else f"{v}.0"
    return str(v)




class Backwards:
    """The backward functions one generated module needs: one per bound call's op, kernel
    instance and argument types, each with its lowered graph (written as an extra entry
    function of the module, kernels off)."""

    def __init__(self, program: Any):
        self.program = program
        self.names: dict[tuple, str] = {}
        self.graphs: list[Graph] = []
        self.functions: list[str] = []

    def backward(self, graph: Graph, call: Any, key: str) -> str:
        """The name of the ``backward(inputs, grads)`` function for this launch of kernel
        instance ``key`` at ``call`` (an op's call in ``graph``)."""
        op = _find_op(self.program, call.callee)
        args = call.attributes.get("args", [])
        arg_types = []
        scalars = {}
        for p, a in zip(op.params, args):
            if isinstance(p.type, A.TensorType):
                vt = _value_type(graph, a)
                arg_types.append((tuple(vt.shape), vt.dtype))
            else:
                scalars[p.name] = a
        result_types = [(tuple(_value_type(graph, r).shape), _value_type(graph, r).dtype)
                        for r in call.attributes.get("results", [])]
        ident = (call.callee, key, repr(arg_types), repr(sorted(scalars.items())))
        if ident in self.names:
            return self.names[ident]
        n = len(self.names) + 1
        entry = f"linnet_backward_{n}_{op.name}"
        name = f"backward_{n}_{op.name}"
        self.names[ident] = name
        try:
            g, clause = backward_graph(self.program, op, arg_types, result_types, scalars,
                                       entry)
        except LinnetError as err:
            # The forward pass must not fail for want of a backward one: the launch runs,
            # and only differentiating it is an error (E0545), naming why.
            self.functions.append(_no_backward(name, op, err.diagnostics[0]))
            return name
        self.graphs.append(g)
        self.functions.append(backward_function(name, entry, clause, len(result_types)))
        return name


def no_backward_advice(op: A.FuncDecl, cause: Any) -> tuple[str, str]:
    """E0545's message and help for ``op``, matched to why its backward did not lower
    (``cause``: the first diagnostic of that lowering).

    >>> # no_backward_advice(op, Diagnostic("E0603", "cannot determine `K`"))
    """
    what = "its grad clause" if op.grad is not None else "its body (run again)"
    message = (f"the kernel launch of `{op.qualified_name}` cannot be differentiated: "
               f"its backward pass, {what}, could not be lowered for these shapes "
               f"({cause.code}: {cause.message})")
    exact = "or load the model with numerics='exact', where the body runs and torch " \
            "autograd differentiates it"
    if cause.code == "E0603":
        # A generic of the op that no tensor parameter or result names on its own (it is
        # only given at the call, `op<N, 3>(x)`, or only in a product, `Tensor[H * HD]`).
        return message, ("the backward pass is lowered from the types of the op's tensor "
                         "parameters and results: name every generic of "
                         f"`{op.name}` on its own in one of them (`Tensor[K; f32]`), " + exact)
    if op.grad is not None and cause.code.startswith(("E052", "E095")):
        return message, (f"fix `{op.name}`'s grad clause ({cause.help or cause.message}), "
                         + exact)
    return message, ("this is a limitation of Linnet's kernel backward passes, not of your "
                     "model: please report it with the op's signature, " + exact)


def _no_backward(name: str, op: A.FuncDecl, cause: Any) -> str:
    message, help = no_backward_advice(op, cause)
    return (f"def {name}(inputs, grads):\n"
            f'    """No backward pass could be written for `{op.name}` ({NO_BACKWARD})."""\n'
            f"    raise no_backward({message!r}, {help!r})")


def _value_type(graph: Graph, ref: str) -> Any:
    """A value's type: a step's result or input (``%x``), a parameter or state (``@w``)."""
    if ref.startswith("@"):
        path = ref[1:]
        return graph.parameters[path] if path in graph.parameters else graph.states[path]
    return graph.values[ref]


def _find_op(program: Any, qualified: str) -> A.FuncDecl:
    module, _, short = qualified.rpartition("::")
    mod = program.module(module)
    item = mod.find(short) if mod is not None else None
    assert isinstance(item, A.FuncDecl), qualified  # the graph's callee is the program's
    return item


__all__ = ["GRAD_HELPERS", "Backwards", "backward_function", "backward_graph"]
