"""Checking grad clauses against their ops' bodies on JAX: `linnet grads --runtime jax FILE`,
``load(..., check_grads=True)``, and pytest (issue 38, item 2).

Generated JAX uses an op's ``grad`` clause as the backward of its Pallas kernel under
``jax.grad`` (and ``linnet jax --grad`` lowers clauses into the gradient graph), so a wrong
clause is a wrong gradient here too. Each op with a clause is lowered on random cases
(:mod:`linnet.lang.grad.clause_check`, the cases the torch runtime checks): the clause's
gradient graph runs as generated JAX, and the reference is ``jax.vjp`` of the op's body
(the one-op entry as generated JAX under numerics "exact", which launches nothing), on the
same random inputs and cotangents. In f64 where JAX runs with x64 enabled, else in f32
(its default) with f32's tolerance.

>>> from linnet.jax.grad_checks import check_grad_clauses
>>> findings = check_grad_clauses("my_ops.linnet", count=3)          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from linnet.lang import LinnetError, Program
from linnet.lang.check.kernel_cases import ENTRY, KernelCase
from linnet.lang.grad.clause_check import (
    DEFAULT_MAX_SIZE,
    GradCase,
    GradCheck,
    GradFinding,
    checked_source,
    compare_case,
    finding_of,
    grad_case,
    gradients,
    raise_grad_findings,
    run_grad_checks,
    unchecked,
)

VIA = "JAX"


def default_dtypes() -> tuple[str, ...]:
    """f64 where JAX runs with x64 enabled, else f32 (JAX's default)."""
    import jax

    return ("f64",) if jax.config.read("jax_enable_x64") else ("f32",)


def check_grad_clauses(
    source: str | Path | Program,
    *,
    count: int = 3,
    seed: int = 0,
    max_size: int = DEFAULT_MAX_SIZE,
    dtypes: tuple[str, ...] | None = None,
    ops: list[str] | None = None,
    skip: set[str] | None = None,
    on_check: Callable[[GradCheck], None] | None = None,
    on_unchecked: Callable[[GradFinding], None] | None = None,
) -> list[GradFinding]:
    """Check every grad clause of ``source`` against ``jax.vjp`` of its op's body on
    ``count`` random cases each; returns the findings (empty: every clause agrees). The
    options are ``linnet.torch.grad_checks.check_grad_clauses``'s; ``dtypes`` defaults to
    :func:`default_dtypes`.

    >>> for f in check_grad_clauses("ops.linnet", count=4):   # doctest: +SKIP
    ...     print(f)
    """
    program = checked_source(source)
    return run_grad_checks(
        program,
        lambda op, case, s: check_clause_case(program, op, case, s),
        count=count,
        seed=seed,
        max_size=max_size,
        dtypes=dtypes or default_dtypes(),
        ops=ops,
        skip=skip,
        on_check=on_check,
        on_unchecked=on_unchecked,
    )


def assert_grad_clauses(
    source: str | Path | Program, unchecked: str = "error", **options: Any
) -> None:
    """:func:`check_grad_clauses`, raising a :class:`LinnetError` with one coded diagnostic
    per finding (E0537-E0539); ``unchecked="warn"`` warns of the E0539 ones instead.

    >>> def test_my_clauses():                          # doctest: +SKIP
    ...     assert_grad_clauses("ops.linnet", count=4)
    """
    raise_grad_findings(check_grad_clauses(source, **options), unchecked)


def check_clause_case(program: Program, op: Any, case: KernelCase, seed: int) -> GradCheck:
    """Lower one case, run the clause's gradient graph as generated JAX and ``jax.vjp`` of
    the body, and compare."""
    import jax

    try:
        gcase = grad_case(program, op, case, seed)
    except LinnetError as err:
        return GradCheck(case, float("inf"), finding_of(op, case, err, VIA))
    if "f64" in gcase.dtypes and not jax.config.read("jax_enable_x64"):
        return GradCheck(
            case,
            float("inf"),
            unchecked(
                op,
                case,
                "the case computes in f64 and JAX runs in 32 bits here",
                "enable x64 (JAX_ENABLE_X64=1), or check in f32 (`--dtype f32`)",
                VIA,
            ),
        )
    try:
        clause, body = _run(gcase)
    except Exception as exc:  # a case JAX cannot run is unchecked, not passed
        return GradCheck(
            case,
            float("inf"),
            unchecked(
                op,
                case,
                f"running the case failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})",
                via=VIA,
            ),
        )
    return compare_case(gcase, clause, body, VIA)


def _run(gcase: GradCase) -> tuple[list[Any], list[Any]]:
    """The clause's gradients (its gradient graph as generated JAX) and the body's
    (``jax.vjp`` of the one-op entry as generated JAX, numerics "exact")."""
    from linnet.lang.emit.jax import emit_jax
    from linnet.lang.grad.rules import is_float

    import jax
    import jax.numpy as jnp

    from .home import import_source
    from .weights import numpy_dtype

    sources = {m.source.name: m.source.text for m in gcase.wrapper.modules.values()}
    arrays = [
        jnp.asarray(np.asarray(v), dtype=numpy_dtype(d))
        for v, d in zip([*gcase.inputs, *gcase.cotangents], gcase.dtypes)
    ]
    n = len(gcase.inputs)
    inputs, cotangents = arrays[:n], arrays[n:]

    clause_module = import_source(
        emit_jax(gcase.clause, sources, numerics="exact"), "linnet_grad_clause_check"
    )
    outs = _entry(clause_module)(*arrays, {}, {})[0]
    clause = [np.asarray(g).astype(np.float64) for g in gradients(gcase, list(outs))]

    body_module = import_source(
        emit_jax(gcase.forward, sources, numerics="exact"), "linnet_grad_body_check"
    )
    entry = _entry(body_module)
    floats = [i for i, d in enumerate(gcase.dtypes[:n]) if is_float(d)]

    def forward(*xs: Any) -> tuple[Any, ...]:
        args = list(inputs)
        for i, x in zip(floats, xs):
            args[i] = x
        return tuple(entry(*args, {}, {})[0])

    results, vjp = jax.vjp(forward, *[inputs[i] for i in floats])
    given = iter(cotangents)
    # One cotangent per result: the case's for a float result, float0 zeros for the others.
    seeds = tuple(
        next(given)
        if jnp.issubdtype(r.dtype, jnp.floating)
        else np.zeros(r.shape, dtype=jax.dtypes.float0)
        for r in results
    )
    body = [np.asarray(g).astype(np.float64) for g in vjp(seeds)]
    by_name = dict(zip([list(gcase.case.params)[i] for i in floats], body))
    return clause, [by_name[name] for name in gcase.wrt]


def _entry(module: Any) -> Any:
    return getattr(module, module.ENTRIES[ENTRY].get("function", ENTRY))


__all__ = ["assert_grad_clauses", "check_clause_case", "check_grad_clauses", "default_dtypes"]
