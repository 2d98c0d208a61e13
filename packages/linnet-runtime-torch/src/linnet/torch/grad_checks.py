"""Checking grad clauses against their ops' bodies on the torch runtime: what `linnet grads
FILE` runs, for pytest and ``load(..., check_grads=True)`` too (issue 38, item 2).

Each op with a ``grad`` clause is lowered on random cases (linnet-lang's
:mod:`linnet.lang.grad.clause_check`): a one-op entry differentiated twice, once by the
clause and once by the reverse pass of the body (every clause ignored), both run by the
PyTorch interpreter (the semantic reference) in f64 on the same random inputs and
cotangents. The gradients must agree within ``GRAD_TOLERANCES``; anything else is a coded
finding (E0537 differs, E0538 an integer gradient, E0539 not checked, and why).

>>> from linnet.torch.grad_checks import assert_grad_clauses, check_grad_clauses
>>> findings = check_grad_clauses("my_ops.linnet", count=3, seed=0)   # doctest: +SKIP
>>> assert_grad_clauses("my_ops.linnet")                             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from linnet.lang import LinnetError, Program
from linnet.lang.check.kernel_cases import KernelCase
from linnet.lang.grad.clause_check import (
    DEFAULT_GRAD_DTYPES,
    DEFAULT_MAX_SIZE,
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

import torch

from .interpreter import DTYPES, run_graph


def check_grad_clauses(
    source: str | Path | Program,
    *,
    count: int = 3,
    seed: int = 0,
    max_size: int = DEFAULT_MAX_SIZE,
    dtypes: tuple[str, ...] = DEFAULT_GRAD_DTYPES,
    ops: list[str] | None = None,
    skip: set[str] | None = None,
    on_check: Callable[[GradCheck], None] | None = None,
    on_unchecked: Callable[[GradFinding], None] | None = None,
) -> list[GradFinding]:
    """Check every grad clause of ``source`` (a ``.linnet`` file or a checked
    :class:`~linnet.lang.Program`; the std ops it uses too) against the reverse pass of its
    op's body on ``count`` random cases each; returns the findings (empty: every clause
    agrees with its body).

    ``seed`` makes the cases reproducible; ``max_size`` bounds every dim; ``dtypes`` are
    the element types a generic ``T: DType`` is drawn from (f64 by default: rounding hides
    nothing); ``ops`` restricts the check to ops by name or qualified name (E0540 for a name
    that is no op with a clause); ``skip`` is a set of qualified names not to check (the ops
    checked are added to it). ``on_check`` hears of each case as it finishes,
    ``on_unchecked`` of each op that could not be checked at all.

    >>> for f in check_grad_clauses("ops.linnet", count=4, seed=1):   # doctest: +SKIP
    ...     print(f)
    E0537 grad clause of main::scale on x: [3] f64, ...: the clause's gradient of `x` ...
    """
    program = checked_source(source)
    return run_grad_checks(
        program,
        lambda op, case, s: check_clause_case(program, op, case, s),
        count=count,
        seed=seed,
        max_size=max_size,
        dtypes=dtypes,
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
    """Lower one case both ways, run both in the interpreter and compare."""
    try:
        gcase = grad_case(program, op, case, seed)
    except LinnetError as err:
        return GradCheck(case, float("inf"), finding_of(op, case, err))
    args = [
        torch.tensor(v, dtype=DTYPES[d])
        for v, d in zip([*gcase.inputs, *gcase.cotangents], gcase.dtypes)
    ]
    cpu = torch.device("cpu")
    try:
        with torch.inference_mode():
            clause = run_graph(gcase.clause, [a.clone() for a in args], {}, {}, cpu)
            body = run_graph(gcase.body, [a.clone() for a in args], {}, {}, cpu)
    except Exception as exc:  # a case the interpreter cannot run is unchecked, not passed
        return GradCheck(
            case,
            float("inf"),
            unchecked(
                op,
                case,
                f"running the case failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})",
            ),
        )
    return compare_case(
        gcase,
        [_array(t) for t in gradients(gcase, clause)],
        [_array(t) for t in gradients(gcase, body)],
    )


def _array(t: torch.Tensor) -> Any:
    return t.detach().to("cpu", torch.float64).numpy()


__all__ = ["assert_grad_clauses", "check_clause_case", "check_grad_clauses"]
