"""Running the kernel checks: each bound op on its sampled cases, a case whose kernels access
out of bounds or race reported without a launch (``kernel_access``), the others run by the
runtime's own ``check_case``. Above both ``kernel_cases`` (the cases, findings) and
``kernel_access`` (the static access faults), so neither imports the other's caller."""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.kernel_access import case_faults
from linnet.lang.check.kernel_cases import (
    KernelCase,
    KernelCheck,
    KernelFinding,
    bound_ops,
    check_op_names,
    sample_cases,
)
from linnet.lang.syntax.program import Program


def run_checks(
    program: Program,
    check_case: Any,
    *,
    count: int,
    seed: int,
    max_size: int,
    dtypes: tuple[str, ...],
    ops: list[str] | None,
    on_check: Any,
    skip: set[str] | None,
) -> list[KernelFinding]:
    """What every runtime's ``check_kernels`` does around its own launch: each bound op of
    ``program`` (by name or qualified name in ``ops``, none of those in ``skip``; the ops run
    are added to it) on ``count`` sampled cases, each run by ``check_case(op, case, seed)``
    -> :class:`KernelCheck`; an op whose where clauses no small shape meets is a finding.

    >>> # run_checks(program, lambda op, case, s: KernelCheck(case, 0.0), count=2, seed=0,
    >>> #            max_size=48, dtypes=("f32",), ops=None, on_check=None, skip=None)
    """
    findings: list[KernelFinding] = []
    check_op_names([program], ops)
    done = skip if skip is not None else set()
    chosen = [
        op
        for op in bound_ops(program)
        if op.qualified_name not in done
        and (ops is None or op.name in ops or op.qualified_name in ops)
    ]
    for op in chosen:
        done.add(op.qualified_name)
        cases = sample_cases(program, op, count, seed, max_size, dtypes)
        if not cases:
            assert op.module is not None and op.kernel is not None
            stages: list[str] = []
            binding: A.KernelBinding | None = op.kernel
            while binding is not None:
                stages.append(binding.name)
                binding = binding.then
            findings.append(
                KernelFinding(
                    f"{op.module.name}::" + " then ".join(stages),
                    op.qualified_name,
                    "no case",
                    f"no shapes with every dim at most {max_size} satisfy the `where` clauses of "
                    "the op and its kernel, so the kernel was never run (raise max_size)",
                )
            )
            continue
        for i, case in enumerate(cases):
            check = access_check(program, op, case) or check_case(op, case, seed * 1000 + i)
            if check.finding is not None:
                findings.append(check.finding)
            if on_check is not None:
                on_check(check)
    return findings


def access_check(program: Program, op: A.FuncDecl, case: KernelCase) -> KernelCheck | None:
    """The case's finding where one of its kernels accesses out of bounds or races whatever
    the data (``ir/accesses.py``; E0548, E0549 in `linnet check`): then it is not launched,
    since a wild store would corrupt or crash this process. None where nothing is found.

    >>> from linnet.lang import check_text
    >>> from linnet.lang.check.kernel_cases import SOFTMAX_EXAMPLE, case_for
    >>> prog = check_text(SOFTMAX_EXAMPLE)
    >>> access_check(prog, bound_ops(prog)[0], case_for(prog, bound_ops(prog)[0], {"R": 2,
    ...                                                                          "C": 9}))
    """
    found = case_faults(program, op, case)
    if not found:
        return None
    kernel, fault = found[0]
    problem = f"{fault.describe()} [{fault.code}] (at {fault.loc}; not launched)"
    return KernelCheck(
        case,
        float("inf"),
        KernelFinding(kernel.name, case.op, case.describe(), problem, generics=dict(case.generics)),
    )
