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

import copy
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.emit.triton import TORCH_DTYPES
from linnet.lang.ir.graph import Graph
from linnet.lang.ir.kernels import BackwardBody, OpInfo, backward_key, instance_key, value_type

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


def backward_function(name: str, entry_function: str, uses_grad_clause: bool, outputs: int) -> str:
    """The ``backward(inputs, grads)`` a launch passes to ``launch_with_grad``."""
    if uses_grad_clause:
        return (
            f"def {name}(inputs, grads):\n"
            f'    """The op\'s grad clause ({entry_function})."""\n'
            f"    return list({entry_function}(*inputs, *grads, {{}}, {{}}))"
        )
    return (
        f"def {name}(inputs, grads):\n"
        f'    """Autograd of the op\'s body ({entry_function}), run again."""\n'
        f"    return body_backward({entry_function}, inputs, grads)"
    )


def math_under_autograd(
    tensors: list[str], fused: list[str]
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
    lines = [
        f"if torch.is_grad_enabled() and ({recorded}):",
        "    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):",
        *["        " + f for f in fused],
        "else:",
        *["    " + f for f in fused],
    ]
    stored, loaded = stored_and_loaded(lines)
    return indented(lines), stored, loaded - stored


class Backwards:
    """The backward functions one generated module needs: one per bound call's op, kernel
    instance and argument types, each with its graph (lowered at lowering time:
    ``graph.backwards``, check/kernel_instances.py; written as an extra entry function of
    the module, kernels off).

    >>> Backwards().functions
    []
    """

    def __init__(self) -> None:
        self.names: dict[tuple, str] = {}
        self.graphs: list[Graph] = []
        self.functions: list[str] = []

    def backward(self, graph: Graph, call: Any, key: str, launcher: str | None = None) -> str:
        """The name of the custom op (``kernel_grad_op``) a launch of kernel instance ``key``
        at ``call`` (an op's call in ``graph``) goes through under autograd: the launcher
        (``launch_<key>`` unless ``launcher`` says) with the op's backward function."""
        body: BackwardBody | None = graph.backwards.get(
            backward_key(graph, call.attributes, call.callee)
        )
        if body is None:
            raise LinnetError(
                Diagnostic(
                    "E0680",
                    f"the kernel launch of `{call.callee}` at {call.loc} has no backward "
                    "pass recorded in its graph, and a module with entry functions "
                    "launches kernels under autograd",
                    help="record the graph's kernels with their backward passes before emitting "
                    "it: `with_kernels(graph, program, numerics)` "
                    "(linnet.lang.check.kernel_instances; backwards=False is for plans' "
                    "slice functions alone)",
                )
            )
        op = body.op
        ident = (call.callee, key, repr(body.arg_types), repr(sorted(body.scalars.items())))
        if ident in self.names:
            return self.names[ident]
        n = len(self.names) + 1
        entry = f"linnet_backward_{n}_{op.name}"
        name = f"backward_{n}_{op.name}"
        grad_op = f"grad_op_{n}_{op.name}"
        self.names[ident] = grad_op
        if body.graph is None:
            # The forward pass must not fail for want of a backward one: the launch runs,
            # and only differentiating it is an error (E0545), naming why.
            self.functions.append(_no_backward(name, op, body.advice))
        else:
            self.graphs.append(_named(body.graph, body.entry, entry))
            self.functions.append(
                backward_function(name, entry, body.uses_grad_clause, len(body.result_types))
            )
        # The launcher is defined further down the module: the lambda reads it when called.
        results = ", ".join(
            f"({shape!r}, {TORCH_DTYPES[dtype]})" for shape, dtype in body.result_types
        )
        self.functions.append(
            f"{grad_op} = kernel_grad_op({f'grad_{n}_{op.name}'!r}, "
            f"lambda *tensors: {launcher or f'launch_{key}'}(*tensors), "
            f"{len(body.arg_types)}, {name}, ({results},))"
        )
        return grad_op


def _named(graph: Graph, old: str, new: str) -> Graph:
    """A copy of a backward ``graph`` lowered with entry name ``old``, named ``new`` (the
    name this module gives it), as if lowered so."""
    out = copy.deepcopy(graph)
    out.entry = new
    for c in out.calls:
        if c.kind == "entry" and c.callee.endswith(f".{old}"):
            c.callee = c.callee[: -len(old)] + new
    return out


def clause_not_linear(call: Any, template: Any, graph: Graph) -> tuple[str, str] | None:
    """E0561's message and help where the grad clause ``template`` (lowered for ``call``, a
    bound op's call in ``graph``) is not linear in its incoming gradients; None where it is.

    Generated JAX differentiates a kernel launch through the clause's transpose
    (emit/pallas.py's ``kernel_jvp``), which only a linear clause has
    (linnet.lang.grad.linearity says why one is not).

    >>> # clause_not_linear(call, template, graph)  -> None, or (message, help)
    """
    from linnet.lang.grad.linearity import nonlinear_gradients

    def dtype(ref: str) -> str:
        return str(value_type(graph, ref).dtype)

    floats = [dtype(t).startswith(("f", "bf")) for t in template.targets]
    found = nonlinear_gradients(template.steps, template.incoming, template.returned, floats)
    if not found:
        return None
    op = graph.kernels[instance_key(call.attributes)].op
    assert op is not None  # a launched call's op is the program's (check/kernel_instances.py)
    index, why = found[0]
    incoming = ", ".join(f"`{n}`" for n in op.grad_names)
    message = (
        f"the grad clause of `{op.qualified_name}` ({template.loc}) is not linear in "
        f"its incoming gradient(s) {incoming}: the gradient of "
        f"`{op.tensor_params[index]}` {why}; JAX differentiates the op's kernel launch "
        "through the transpose of its clause (forward and reverse mode alike), which "
        "only a linear clause has"
    )
    help = (
        "a gradient is a linear function of the incoming one: scale it by values of the "
        "op's arguments (`let dx[n] = dy[n] * 2.0 * x[n]`), never add a constant to it "
        "or multiply it by itself; or load the model with numerics='exact', where the "
        "op's body runs and JAX differentiates it"
    )
    return message, help


def _no_backward(name: str, op: OpInfo, advice: tuple[str, str]) -> str:
    message, help = advice
    return (
        f"def {name}(inputs, grads):\n"
        f'    """No backward pass could be written for `{op.name}` ({NO_BACKWARD})."""\n'
        f"    raise no_backward({message!r}, {help!r})"
    )


__all__ = ["GRAD_HELPERS", "Backwards", "backward_function", "clause_not_linear"]
