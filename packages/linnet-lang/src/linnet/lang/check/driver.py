"""The pipeline: parse → check → lower. Each stage is a function of the one before.

>>> from linnet.lang import check_text
>>> check_text("pub fn twice(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 }")
Traceback (most recent call last):
...
linnet.lang.diagnostics.core.LinnetError: error[E0201]: unknown name `N`...
"""

from __future__ import annotations

from pathlib import Path

# The pipeline's stages live in their own modules; this one keeps the names that
# linnet.lang, the CLI, the runtimes and the benchmarks import from it.
from linnet.lang.check.blocks import (
    MAX_REPEAT,
    block_env,
    config_value,
    instantiate,
    instantiate_member_block,
    type_name,
    walk_instance,
)
from linnet.lang.check.checker import (
    bind_params,
    check_block,
    check_function,
    check_grad,
    check_kernel_binding,
    check_kernel_header,
    check_modules,
    check_returns,
    dedupe,
    fmt_type,
    symbolic_env,
    too_deep,
)
from linnet.lang.check.lowering import (
    MAX_SIZE,
    bind_model_generics,
    check_numel,
    check_sizes,
    count_arrays,
    find_model,
    lower,
    probe_inputs,
    solve_where,
    unify_dims,
)
from linnet.lang.check.weight_checks import (
    check_weights,
    dense_count,
    param_spans,
)
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.syntax.program import Program
from linnet.lang.syntax.walk import (
    walk_body,
)


def check_program(program: Program, kernel_accesses: bool = True) -> list[Diagnostic]:
    """Check every module of ``program``; returns all diagnostics (empty when clean).
    ``kernel_accesses``: then, where it checks, lower the bound kernels of its own modules on
    their first sampled shapes and look for accesses out of bounds or racing (E0548, E0549;
    `linnet kernels` turns them into findings instead).

    >>> check_program(Program.from_text("pub fn f(x: Tensor[3; f32]) -> Tensor[3; f32] { return x }"))
    []
    """
    from linnet.lang.check.kernel_access import kernel_access_errors

    errors = check_modules(program)
    if kernel_accesses and not errors:
        errors = kernel_access_errors(program)
    return errors


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


__all__ = [
    "MAX_REPEAT",
    "MAX_SIZE",
    "bind_model_generics",
    "bind_params",
    "block_env",
    "check_block",
    "check_file",
    "check_function",
    "check_grad",
    "check_kernel_binding",
    "check_kernel_header",
    "check_modules",
    "check_numel",
    "check_program",
    "check_returns",
    "check_sizes",
    "check_text",
    "check_weights",
    "config_value",
    "count_arrays",
    "dedupe",
    "dense_count",
    "find_model",
    "fmt_type",
    "instantiate",
    "instantiate_member_block",
    "lower",
    "param_spans",
    "probe_inputs",
    "solve_where",
    "symbolic_env",
    "too_deep",
    "type_name",
    "unify_dims",
    "walk_body",
    "walk_instance",
]
