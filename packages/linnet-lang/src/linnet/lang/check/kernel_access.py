"""Out-of-bounds accesses and races of bound kernels, as coded errors: E0548 and E0549.

``ir/accesses.py`` finds, for a kernel lowered for concrete generics, the accesses that are
wrong whatever the data. This module runs it where generics become concrete and says so:

* ``linnet check`` (:func:`kernel_access_errors`, from ``check_program``): each op of the
  program's own modules bound to a kernel, on the shapes `linnet kernels` samples first
  (:func:`~linnet.lang.check.kernel_cases.sample_cases`: small sizes and the clauses'
  boundaries, an odd one first, where a last partial tile is). The std library's kernels are
  checked by its CI instead, not at every check of a model that uses them.
* emitting a kernel instance (``emit/torch.py``: generated PyTorch and JAX) and
  ``linnet.torch.kernels.launch``, at the call's own generics (:func:`raise_access_faults`):
  a kernel that would write outside a tensor for these shapes is never launched.
* `linnet kernels`, on each case it checks (:func:`case_faults`): a finding.

>>> from linnet.lang import check_text
>>> check_text('''
... kernel double_k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32]
...     grid((N + B - 1) / B) {
...     let cols = program_id(0) * B + iota<i32>(B)
...     store(y[cols], load(x[cols], cols < N, 0.0) * 2.0)
... }
... pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_k<N, 4> {
...     let y[i] = x[i] * 2.0
...     return y
... }''')
Traceback (most recent call last):
...
linnet.lang.diagnostics.core.LinnetError: error[E0548]: kernel `double_k`: `store` writes y[33], ...
"""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import Fail, Frame
from linnet.lang.check.evaluate import Evaluator
from linnet.lang.check.kernel_cases import KernelCase, bound_ops, sample_cases
from linnet.lang.check.tile_lowering import find_kernel, lower_kernel
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, Span
from linnet.lang.ir.accesses import AccessFault, access_faults
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.graph import Graph, kernel_stages
from linnet.lang.ir.tiles import TileKernel
from linnet.lang.syntax.program import Program
from linnet.lang.syntax.walk import walk_body
from linnet.lang.tensors.dims import Dim

# The cases `linnet check` looks at per bound op: `linnet kernels`'s first ones (its
# defaults: seed 0, sizes up to 48).
CHECK_CASES = 3
CHECK_SIZE = 48


def kernel_access_errors(program: Program) -> list[Diagnostic]:
    """E0548 or E0549 for each op of ``program``'s own modules (not the std library's)
    bound to a kernel that accesses out of bounds, or races, on one of its first cases:
    the first fault of each op. A kernel with integer or bool scalar parameters is left to
    emission, which knows their values.

    >>> kernel_access_errors(Program.from_text(""))
    []
    """
    out: list[Diagnostic] = []
    for op in bound_ops(program):
        assert op.module is not None
        if op.module.name == "std" or op.module.name.startswith("std."):
            continue
        try:
            for case in sample_cases(program, op, CHECK_CASES, 0, CHECK_SIZE):
                found = case_faults(program, op, case)
                if found:
                    kernel, fault = found[0]
                    out.append(fault_diagnostic(program, kernel, fault, op, case.generics))
                    break
        except (Fail, LinnetError, RecursionError):
            continue  # what cannot be sampled or lowered here is `linnet kernels`' to say
    return out


def case_faults(
    program: Program, op: A.FuncDecl, case: KernelCase
) -> list[tuple[TileKernel, AccessFault]]:
    """The access faults of each kernel that ``op`` launches for ``case`` (both of a
    chain's, in order), with the kernel; none where a kernel cannot be lowered here (its
    integer scalar parameters have no value before a call gives one).

    >>> from linnet.lang.check.kernel_cases import SOFTMAX_EXAMPLE, case_for
    >>> from linnet.lang import check_text
    >>> prog = check_text(SOFTMAX_EXAMPLE)
    >>> op = bound_ops(prog)[0]
    >>> case_faults(prog, op, case_for(prog, op, {"R": 2, "C": 40}))
    []
    """
    assert op.module is not None
    ev = Evaluator(program, Builder(Graph(entry="", model="")), {})
    frame = Frame(
        op.module, {k: Dim.const(v) if isinstance(v, int) else v for k, v in case.generics.items()}
    )
    try:
        stages = kernel_stages(ev.kernel_binding_attrs(op, frame))
    except Fail:
        return []
    out = []
    for name, generics in stages:
        decl = find_kernel(program, name)
        scalars: dict[str, Any] = {}
        for p in decl.params:
            if isinstance(p.type, A.TensorType):
                continue
            if not (isinstance(p.type, A.ScalarType) and p.type.name.startswith(("f", "bf"))):
                return []  # an int's value could reach an index: only a call knows it
            scalars[p.name] = 0.5
        try:
            kernel = lower_kernel(program, name, generics, scalars)
        except LinnetError:
            return []
        out += [(kernel, f) for f in access_faults(kernel)]
    return out


def raise_access_faults(program: Program, kernels: list[TileKernel], what: str = "") -> None:
    """E0548 or E0549 for the first access fault of ``kernels`` (a call's instances, at its
    generics), before anything is launched; ``what`` names the call for the message. A
    kernel instance found clean once is not looked at again in this process.

    >>> raise_access_faults(Program.from_text(""), [])
    """
    for kernel in kernels:
        key = hash(
            (kernel.summary(), tuple(kernel.params), tuple(kernel.results), tuple(kernel.scratch))
        )
        if key in _CLEAN:
            continue
        faults = access_faults(kernel)
        if faults:
            raise LinnetError(
                fault_diagnostic(program, kernel, faults[0], None, kernel.generics, what)
            )
        if len(_CLEAN) > 4096:
            _CLEAN.clear()
        _CLEAN.add(key)


# Kernel instances (by the hash of their steps and tensors) found clean: emitting a model
# again, or another of the same shapes, does not run the pass again.
_CLEAN: set[int] = set()


def fault_diagnostic(
    program: Program,
    kernel: TileKernel,
    fault: AccessFault,
    op: A.FuncDecl | None,
    generics: dict[str, Any],
    what: str = "",
) -> Diagnostic:
    """The coded error of ``fault`` in ``kernel``: at the access, naming the generics (of
    ``op``, the op that binds it, or of the kernel) for which it happens."""
    shown = ", ".join(f"{k} = {v}" for k, v in generics.items())
    of = f"op `{op.name}`" if op is not None else f"kernel `{kernel.short_name}`"
    when = f"for {of}'s {shown}" if shown else f"in {of}"
    if what:
        when += f" ({what})"
    span = access_span(program, fault.loc, fault.op)
    label = "out of bounds " + when if fault.kind == "out of bounds" else "races " + when
    message = f"kernel `{kernel.short_name}`: {fault.describe()}"
    if fault.kind == "out of bounds":
        index = f"{fault.tensor}[...]"
        if fault.op == "store":
            help = (
                f"mask the store to the tensor's bounds (`store({index}, v, mask)` with "
                "mask true only where every index is in range): on a GPU this lane "
                f"writes memory that is not `{fault.tensor}`'s, which crashes the "
                "process or corrupts another tensor"
            )
        elif fault.op == "load":
            help = (
                f"mask the load and give the value of the lanes left out (`load({index}, "
                "mask, 0.0)`): unmasked, it reads memory that is not "
                f"`{fault.tensor}`'s (the next row's, or past the end)"
            )
        else:
            help = "index the counter inside its scratch buffer"
        code = "E0548"
    else:
        help = (
            "a program may load what it stored itself; to read another program's "
            "stores, count with `atomic_add` and read them in the program that sees the "
            "last count (`linnet explain E0547`)"
        )
        code = "E0549"
    diag = Diagnostic(code, message, span, label, help=help)
    if fault.kind == "race":
        diag.with_secondary(
            access_span(program, fault.other_loc, "store"), f"program {fault.other} stores it here"
        )
    if op is not None and op.kernel is not None:
        diag.with_secondary(op.kernel.span, f"op `{op.name}` launches it here")
    if span is None:
        decl = find_kernel(program, kernel.name)
        diag.span = decl.name_span
        diag.notes.append(f"at {fault.loc}")
    return diag


def access_span(program: Program, loc: str, op: str) -> Span | None:
    """The span of the `load`, `store` or `atomic_add` call at ``loc`` (``file:line``), or
    None where no module of ``program`` has one there."""
    file, _, line = loc.rpartition(":")
    if not line.isdigit():
        return None
    for module in program.modules.values():
        if module.source.name != file:
            continue
        for item in module.items:
            if not isinstance(item, A.FuncDecl) or item.body is None:
                continue
            for node in walk_body(item.body):
                if (
                    isinstance(node, A.Call)
                    and isinstance(node.callee, A.Name)
                    and node.callee.name == op
                    and node.span.line == int(line)
                ):
                    return node.span
    return None


__all__ = [
    "access_span",
    "case_faults",
    "fault_diagnostic",
    "kernel_access_errors",
    "raise_access_faults",
]
