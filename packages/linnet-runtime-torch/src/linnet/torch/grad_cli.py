"""`linnet grads FILE`: check every grad clause of a file against its op's body (issue 38).

The sibling of `linnet kernels`: where that command runs each kernel against its op's body,
this one differentiates each op with a ``grad`` clause both ways (the clause, and the
reverse pass of the body) on random cases and compares the gradients
(:mod:`linnet.lang.grad.clause_check`). Registered through the `linnet.commands` entry point;
this module imports neither torch nor jax until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register_grads(subparsers: Any) -> None:
    """Adds `linnet grads` to the `linnet` CLI (the `linnet.commands` entry point)."""
    from linnet.lang.grad.clause_check import DEFAULT_MAX_SIZE

    p = subparsers.add_parser(
        "grads",
        help="check each grad clause against the reverse pass of its op's body",
        description="Differentiate every op with a grad clause on random shapes its where "
        "clauses allow, by its clause and by the reverse pass of its body, in "
        "f64 on random inputs and cotangents, and compare the gradients; exits "
        "1 on a finding (a clause that differs, an integer gradient, or a case "
        "that could not be checked).",
    )
    p.add_argument(
        "file", nargs="*", help=".linnet files (the std ops they use are checked too; each op once)"
    )
    p.add_argument("--std", action="store_true", help="check the std library's grad clauses")
    p.add_argument("--count", type=int, default=3, help="cases per op (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the cases (default 0)")
    p.add_argument(
        "--max-size",
        type=int,
        default=DEFAULT_MAX_SIZE,
        help=f"largest size of any dim (default {DEFAULT_MAX_SIZE})",
    )
    p.add_argument(
        "--dtype",
        action="append",
        default=[],
        metavar="DTYPE",
        help="element types a generic T is drawn from (repeatable; default f64, "
        "or f32 on JAX without x64)",
    )
    p.add_argument(
        "--op",
        action="append",
        default=[],
        metavar="NAME",
        help="check only this op (repeatable; a name or a qualified name)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAME",
        help="leave this op out (repeatable; a clause that differs from its body "
        "on purpose, such as a straight-through estimator)",
    )
    p.add_argument(
        "--runtime",
        choices=("torch", "jax"),
        default="torch",
        help="torch: both gradients in the PyTorch interpreter (default); jax: the "
        "clause as generated JAX against jax.vjp of the body",
    )
    p.set_defaults(run=grads_command)


def grads_command(args: argparse.Namespace) -> int:
    from linnet.lang import LinnetError
    from linnet.lang.check.kernel_cases import std_program
    from linnet.lang.diagnostics.core import Diagnostic
    from linnet.lang.grad.clause_check import GradCheck, GradFinding, clause_ops

    if not args.file and not args.std:
        print(
            "linnet grads: give a .linnet file, or --std for the std library's grad clauses",
            file=sys.stderr,
        )
        return 2
    if args.count < 1 or args.max_size < 1:
        print("linnet grads: --count and --max-size are at least 1", file=sys.stderr)
        return 2
    if args.runtime == "jax":
        try:
            from linnet.jax.grad_checks import check_grad_clauses
        except ImportError:
            raise LinnetError(
                Diagnostic(
                    "E0792",
                    "`linnet grads --runtime jax` needs linnet-runtime-jax, which is not "
                    "installed here",
                    help="install it: `pip install linnet-runtime-jax`",
                )
            ) from None
    else:
        from .grad_checks import check_grad_clauses  # type: ignore[assignment]
    from linnet.lang.grad.clause_check import checked_source

    programs = ([std_program()] if args.std else []) + [checked_source(f) for f in args.file]
    names = {n for p in programs for op in clause_ops(p) for n in (op.name, op.qualified_name)}
    for name in [*args.op, *args.skip]:
        if name not in names:
            # Checked over every file at once: an op of the second file is not unknown to
            # the first (run_grad_checks checks one program).
            from linnet.lang.grad.clause_check import UNKNOWN_OP

            known = ", ".join(sorted(n for n in names if "::" in n)[:8]) or "none"
            raise LinnetError(
                Diagnostic(
                    UNKNOWN_OP,
                    f"`{name}` is not an op with a grad clause here (those are: {known})",
                    help="name an op that has a grad clause (`linnet grads FILE` checks them all)",
                )
            )
    dtypes = tuple(args.dtype) or None
    checked = 0

    def show(check: GradCheck) -> None:
        nonlocal checked
        checked += 1
        c = check.case
        if check.finding is None:
            print(f"ok    {c.op}  {c.describe()}  (largest difference {check.difference:.3g})")
        else:
            print(f"FAIL  {check.finding}")

    def unrun(f: GradFinding) -> None:
        print(f"FAIL  {f}")

    skip = {
        op.qualified_name
        for p in programs
        for op in clause_ops(p)
        if op.name in args.skip or op.qualified_name in args.skip
    }
    for name in sorted(skip):
        print(f"skip  {name} (--skip)")
    findings = []
    ops = [o for o in args.op] or None
    for program in programs:
        here = [
            o
            for o in ops or []
            if any(o in (op.name, op.qualified_name) for op in clause_ops(program))
        ]
        if ops and not here:
            continue
        options: dict[str, Any] = {
            "count": args.count,
            "seed": args.seed,
            "max_size": args.max_size,
            "ops": here or None,
            "skip": skip,
            "on_check": show,
            "on_unchecked": unrun,
        }
        if dtypes:
            options["dtypes"] = dtypes
        findings += check_grad_clauses(program, **options)
    if not checked and not findings:
        print(
            "no op here has a grad clause: nothing to check"
            if not skip
            else "every op with a grad clause was skipped: nothing checked"
        )
        return 0
    ops_found = len({f.op for f in findings})
    print(
        f"{checked} case(s) checked: "
        + (
            f"{len(findings)} finding(s) in {ops_found} op(s)"
            if findings
            else "every grad clause agrees with the reverse pass of its op's body"
        )
    )
    return 1 if findings else 0
