"""Kernel launches under autograd, in generated PyTorch.

A kernel's launch is opaque to torch autograd, so where gradients are wanted (grad mode on
and an input that requires grad) the generated code launches it through a custom op of its
own (``kernel_grad_op``: ``torch.library.custom_op`` with ``register_autograd``, so that
torch.compile, ``torch.library.opcheck`` and double backward see the op's autograd, not a
wrapper's) whose backward is

* the op's `grad` clause, lowered for the call's shapes and emitted as PyTorch (a function
  of the op's tensor parameters and the incoming gradients), or, for an op without one,
* torch autograd of the op's body, run again on the saved inputs (recomputation: nothing
  but the inputs is kept for the backward pass).

Both are differentiable torch code: under ``create_graph=True`` the gradient has a graph
(the body's backward is taken with ``create_graph``), so second derivatives differentiate
the clause, or the body twice; the kernel runs forward only.

Both backward functions are ordinary lowered graphs: the op's module with a small model
appended, whose one entry calls the op (the body) or a copy of the grad clause as an op of
its own (the grad clause), for the call's concrete shapes. They are emitted into the same
module as extra entry functions, with kernels off (the body that is differentiated never
launches a kernel itself). Without grad mode nothing changes: the launch is the launcher
call as before.

>>> "op.register_autograd(differentiate, setup_context=setup)" in GRAD_HELPERS
True
"""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import LinnetError, SourceFile
from linnet.lang.emit.triton import TORCH_DTYPES
from linnet.lang.ir.graph import Graph

MODEL = "LinnetKernelGrad"
# Raised by generated code when autograd reaches a launch whose backward could not be lowered.
NO_BACKWARD = "E0545"
# Raised by generated JAX when a launch whose op's grad clause is not linear is differentiated.
NOT_LINEAR = "E0561"

# Written once into a module that launches kernels.
GRAD_HELPERS = '''def kernel_grad_op(name, launch, arity, backward, results):
    """`launch` (a kernel launch: the op's `arity` tensors -> its results) as a custom op of
    this module's library whose autograd is `backward(inputs, grads)`: the op's grad clause, or
    autograd of the op's body run again (emit/kernel_grad.py). Registered on the op itself
    (torch.library.register_autograd), so torch.compile and torch.library.opcheck see it;
    `backward` is made of differentiable torch ops, so second derivatives work. `results`
    are the results' shapes and dtypes (what the op returns without running it)."""
    if not TRITON:  # no kernel is launched: the op's body runs, under torch autograd
        return None
    many = len(results) > 1
    args = ', '.join(f'Tensor t{i}' for i in range(arity))
    made = '(' + ', '.join(['Tensor'] * len(results)) + ')' if many else 'Tensor'
    op = torch.library.custom_op(f'{LIBRARY}::{name}', launch, mutates_args=(),
                                 schema=f'({args}) -> {made}')

    @op.register_fake
    def fake(*tensors):
        device = tensors[0].device if tensors else DEVICE
        out = tuple(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in results)
        return out if many else out[0]

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def differentiate(ctx, *grads):
        inputs = ctx.saved_tensors
        got = list(backward(inputs, grads))
        return tuple(g if t.is_floating_point() else None for g, t in zip(got, inputs))

    op.register_autograd(differentiate, setup_context=setup)
    return op


def launch_with_grad(launch, op, *tensors):
    """`launch(*tensors)`, or the same launch through `op` (kernel_grad_op: a custom op
    with its autograd) where autograd records this call."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return op(*tensors)
    return launch(*tensors)


def body_backward(body, inputs, grads):
    """Gradients of the op's body, run again on `inputs` (autograd of the recomputation);
    None for inputs that are not floating point. Where the backward pass is itself
    differentiated (grad mode on in it: `create_graph=True`), the gradients are computed
    from the inputs as they are, with a graph: second derivatives differentiate the body
    twice (a gradient computed from detached copies would have no grad_fn)."""
    higher = torch.is_grad_enabled()
    with torch.enable_grad():
        xs = [t if higher and t.requires_grad else
              t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        outs = body(*xs, {}, {})
        wrt = [x for x in xs if x.requires_grad]
        # Only results that depend on a float input carry a gradient back (an integer
        # result, or one computed from integers alone, has none).
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                       allow_unused=True, create_graph=higher)
                   if pairs else [None] * len(wrt))
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


def math_under_autograd(tensors: list[str], fused: list[str]
                        ) -> tuple[str, frozenset[str], frozenset[str]]:
    """The statement of a fused attention call on the CPU, whose default SDPA kernel
    (``_scaled_dot_product_flash_attention_for_cpu``) has a backward that cannot be
    differentiated again: where autograd records the call (grad mode on and one of
    ``tensors`` requiring grad: ``create_graph=True`` may follow) the ``fused`` lines run
    under SDPA's math backend, made of differentiable ops; elsewhere as they are. Returns
    the text (lines after the first indented one level), the names it defines and those it
    reads.

    >>> print(math_under_autograd(["q"], ["o = F.scaled_dot_product_attention(q, q, q)"])[0])
    if torch.is_grad_enabled() and (q.requires_grad):
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                o = F.scaled_dot_product_attention(q, q, q)
        else:
            o = F.scaled_dot_product_attention(q, q, q)
    """
    from linnet.lang.emit.tiles import indented, stored_and_loaded

    recorded = " or ".join(f"{t}.requires_grad" for t in tensors) or "False"
    lines = [f"if torch.is_grad_enabled() and ({recorded}):",
             "    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):",
             *["        " + f for f in fused], "else:",
             *["    " + f for f in fused]]
    stored, loaded = stored_and_loaded(lines)
    return indented(lines), stored, loaded - stored


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

    def backward(self, graph: Graph, call: Any, key: str, launcher: str | None = None) -> str:
        """The name of the custom op (``kernel_grad_op``) a launch of kernel instance ``key``
        at ``call`` (an op's call in ``graph``) goes through under autograd: the launcher
        (``launch_<key>`` unless ``launcher`` says) with the op's backward function."""
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
        grad_op = f"grad_op_{n}_{op.name}"
        self.names[ident] = grad_op
        try:
            g, clause = backward_graph(self.program, op, arg_types, result_types, scalars,
                                       entry)
        except LinnetError as err:
            # The forward pass must not fail for want of a backward one: the launch runs,
            # and only differentiating it is an error (E0545), naming why.
            self.functions.append(_no_backward(name, op, err.diagnostics[0]))
        else:
            self.graphs.append(g)
            self.functions.append(backward_function(name, entry, clause, len(result_types)))
        # The launcher is defined further down the module: the lambda reads it when called.
        results = ", ".join(f"({shape!r}, {TORCH_DTYPES[dtype]})"
                            for shape, dtype in result_types)
        self.functions.append(
            f"{grad_op} = kernel_grad_op({f'grad_{n}_{op.name}'!r}, "
            f"lambda *tensors: {launcher or f'launch_{key}'}(*tensors), {len(arg_types)}, "
            f"{name}, ({results},))")
        return grad_op


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


def clause_not_linear(program: Any, call: Any, template: Any, graph: Graph
                      ) -> tuple[str, str] | None:
    """E0561's message and help where the grad clause ``template`` (lowered for ``call``, a
    bound op's call in ``graph``) is not linear in its incoming gradients; None where it is.

    Generated JAX differentiates a kernel launch through the clause's transpose
    (emit/pallas.py's ``kernel_jvp``), which only a linear clause has
    (linnet.lang.grad.linearity says why one is not).

    >>> # clause_not_linear(program, call, template, graph)  -> None, or (message, help)
    """
    from linnet.lang.grad.linearity import nonlinear_gradients

    def dtype(ref: str) -> str:
        return str(_value_type(graph, ref).dtype)

    floats = [dtype(t).startswith(("f", "bf")) for t in template.targets]
    found = nonlinear_gradients(template.steps, template.incoming, template.returned, floats)
    if not found:
        return None
    op = _find_op(program, call.callee)
    names = [p.name for p in op.params if isinstance(p.type, A.TensorType)]
    index, why = found[0]
    incoming = ", ".join(f"`{n}`" for n in (op.grad.names if op.grad else []))
    message = (f"the grad clause of `{op.qualified_name}` ({template.loc}) is not linear in "
               f"its incoming gradient(s) {incoming}: the gradient of `{names[index]}` {why}; "
               "JAX differentiates the op's kernel launch through the transpose of its clause "
               "(forward and reverse mode alike), which only a linear clause has")
    help = ("a gradient is a linear function of the incoming one: scale it by values of the "
            "op's arguments (`let dx[n] = dy[n] * 2.0 * x[n]`), never add a constant to it "
            "or multiply it by itself; or load the model with numerics='exact', where the "
            "op's body runs and JAX differentiates it")
    return message, help


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


__all__ = ["GRAD_HELPERS", "Backwards", "backward_function", "backward_graph",
           "clause_not_linear"]
