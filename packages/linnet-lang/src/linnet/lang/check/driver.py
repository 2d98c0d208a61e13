"""The pipeline: parse → check → lower. Each stage is a function of the one before.

>>> from linnet.lang import check_text
>>> check_text("pub fn twice(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 }")
Traceback (most recent call last):
...
linnet.lang.diagnostics.core.LinnetError: error[E0201]: unknown name `N`...
"""

from __future__ import annotations

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
    check_file,
    check_function,
    check_grad,
    check_kernel_binding,
    check_kernel_header,
    check_program,
    check_returns,
    check_text,
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
    solve_where,
    unify_dims,
)
from linnet.lang.check.weight_checks import (
    check_weights,
    dense_count,
    param_spans,
)
from linnet.lang.syntax.walk import (
    walk_body,
)

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
    "solve_where",
    "symbolic_env",
    "too_deep",
    "type_name",
    "unify_dims",
    "walk_body",
    "walk_instance",
]
