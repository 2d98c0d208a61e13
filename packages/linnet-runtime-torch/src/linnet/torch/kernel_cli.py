"""`linnet kernels FILE`: check every bound kernel of a file against its op's body.

Registered through the `linnet.commands` entry point; this module imports neither torch nor
Triton until the command runs (listing commands stays fast).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from linnet.lang.check.kernel_progress import Progress


def register_kernels(subparsers: Any) -> None:
    """Adds `linnet kernels` to the `linnet` CLI (the `linnet.commands` entry point)."""
    p = subparsers.add_parser(
        "kernels",
        help="check each bound kernel against its op's body on random shapes",
        description="Run every kernel an op binds on random shapes its where clauses allow "
        "(an odd size first; under Triton's interpreter on the CPU, with guarded "
        "memory: an access outside the launch's tensors or a race between "
        "programs is a finding, not a crash), with its outputs poisoned with NaN, "
        "and compare with the op's body; a case whose kernel indexes out of "
        "bounds or races whatever the data is a finding without a launch; exits "
        "1 on a finding.",
    )
    p.add_argument(
        "file",
        nargs="*",
        help=".linnet files (the std kernels they use are checked too; each kernel once)",
    )
    p.add_argument("--std", action="store_true", help="check the std library's kernels")
    p.add_argument("--count", type=int, default=3, help="cases per kernel (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the cases (default 0)")
    p.add_argument(
        "--max-size",
        type=int,
        default=48,
        help="largest size of any dim (default 48; the interpreter is slow)",
    )
    p.add_argument(
        "--dtype",
        action="append",
        default=[],
        metavar="DTYPE",
        help="element types a generic T is drawn from (repeatable; default f32, bf16)",
    )
    p.add_argument(
        "--op",
        action="append",
        default=[],
        metavar="NAME",
        help="check only this op (repeatable; a name or a qualified name; one "
        "bound to no kernel here is error E0793)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="cpu (Triton's interpreter) or cuda (default: cuda when available); "
        "a device this machine lacks is error E0710-E0712",
    )
    p.add_argument(
        "--runtime",
        choices=("torch", "jax"),
        default="torch",
        help="torch: kernels through Triton from generated PyTorch (default); "
        "jax: through Pallas from generated JAX (Pallas's interpreter on the "
        "CPU, `--device cpu`; for real on a GPU), linnet-runtime-jax's check",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (the number of cases, a line per case as it "
        "finishes, a summary); the report on stdout is unchanged",
    )
    p.set_defaults(run=kernels_command)


def _programs(args: argparse.Namespace, std_program: Any) -> list[Any]:
    """The checked programs of ``--std`` and the files, with ``--op`` names checked against
    all of them at once (E0793 before any kernel runs)."""
    from linnet.lang.check.kernel_cases import check_op_names, checked_program

    programs = ([std_program()] if args.std else []) + [checked_program(f) for f in args.file]
    check_op_names(programs, args.op)
    return programs


def _ops(program: Any, ops: list[str]) -> list[str] | None:
    """The ``--op`` names that name a bound op of ``program`` (None: every op); each program
    checks only its own, once :func:`_programs` has checked every name names one."""
    from linnet.lang.check.kernel_cases import bound_ops

    if not ops:
        return None
    names = {n for op in bound_ops(program) for n in (op.name, op.qualified_name)}
    return [n for n in ops if n in names]


def _progress(
    args: argparse.Namespace, sources: list[Any], dtypes: tuple[str, ...], via: str = ""
) -> Progress:
    """The progress printer of this run (nothing printed with ``--quiet``), its first line
    printed: the cases about to be checked, drawn as the checks will draw them."""
    from linnet.lang.check.kernel_progress import Progress, planned_cases

    plan = planned_cases(
        sources,
        args.op or None,
        count=args.count,
        seed=args.seed,
        max_size=args.max_size,
        dtypes=dtypes,
    )
    progress = Progress(plan, None if args.quiet else sys.stderr, via=via)
    progress.begin()
    return progress


def kernels_command(args: argparse.Namespace) -> int:
    from linnet.lang import LinnetError
    from linnet.lang.check.kernel_cases import DEFAULT_DTYPES
    from linnet.lang.diagnostics.core import Diagnostic

    if not args.file and not args.std:
        print(
            "linnet kernels: give a .linnet file, or --std for the std library's kernels",
            file=sys.stderr,
        )
        return 2
    if args.count < 1 or args.max_size < 1:
        print("linnet kernels: --count and --max-size are at least 1", file=sys.stderr)
        return 2
    if getattr(args, "runtime", "torch") == "jax":
        return _jax_kernels(args)
    device = None
    if args.device is not None:
        from .model import resolve_device  # imports torch, not Triton

        device = resolve_device(args.device)  # E0710-E0712: `tpu`, or cuda without a GPU
    from linnet.lang.check.kernel_cases import std_program

    sources = _programs(args, std_program)  # E0793 before Triton is imported
    if (device is None or device.type == "cpu") and "triton" not in sys.modules:
        # On the CPU, kernels run in Triton's interpreter, which must be chosen before Triton
        # is first imported (its own library functions are decorated then). Harmless on
        # CUDA: the interpreter only runs kernels whose tensors are on the CPU.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton  # noqa: F401
    except ImportError:
        raise LinnetError(
            Diagnostic(
                "E0768",
                "`linnet kernels` needs Triton, which is not installed here",
                help="install it: `pip install 'linnet-runtime-torch[triton]'` (on the CPU, "
                "kernels run in Triton's interpreter)",
            )
        ) from None
    from .testing import KernelCheck, check_kernels

    dtypes = tuple(args.dtype) or DEFAULT_DTYPES
    progress = _progress(args, sources, dtypes)
    checked = 0

    def show(check: KernelCheck) -> None:
        nonlocal checked
        checked += 1
        c = check.case
        if check.finding is None:
            print(
                f"ok    {c.kernel}  {c.describe()}  (largest difference {check.difference:.3g})",
                flush=True,
            )
        else:
            print(f"FAIL  {check.finding}", flush=True)
        progress.check(check)

    findings = []
    done: set[str] = set()  # ops already checked (a std op two files use, say)
    for source in sources:
        findings += check_kernels(
            source,
            count=args.count,
            seed=args.seed,
            max_size=args.max_size,
            dtypes=dtypes,
            ops=_ops(source, args.op),
            device=device,
            on_check=show,
            skip=done,
        )
    unrun = [f for f in findings if f.case == "no case"]
    for f in unrun:
        print(f"FAIL  {f}")
    progress.end(len(findings))
    if not checked and not findings:
        print("no op here is bound to a kernel: nothing to check")
        return 0
    kernels = len({f.kernel for f in findings})
    print(
        f"{checked} case(s) checked: "
        + (
            f"{len(findings)} finding(s) in {kernels} kernel(s)"
            if findings
            else "every kernel agrees with its op"
        )
    )
    return 1 if findings else 0


def _jax_kernels(args: argparse.Namespace) -> int:
    """`linnet kernels --runtime jax`: the same cases through Pallas (linnet.jax.testing)."""
    from linnet.lang import LinnetError
    from linnet.lang.check.kernel_cases import DEFAULT_DTYPES, std_program
    from linnet.lang.diagnostics.core import Diagnostic

    try:
        from linnet.jax.testing import KernelCheck, check_kernels
    except ImportError:
        raise LinnetError(
            Diagnostic(
                "E0792",
                "`linnet kernels --runtime jax` needs linnet-runtime-jax, which is not "
                "installed here",
                help="install it: `pip install linnet-runtime-jax`",
            )
        ) from None
    from linnet.jax.model import resolve_device

    # E0710-E0712 as for torch: `tpu`, or a GPU jax does not see here.
    interpret = None if args.device is None else resolve_device(args.device).platform == "cpu"
    sources = _programs(args, std_program)
    dtypes = tuple(args.dtype) or DEFAULT_DTYPES
    progress = _progress(args, sources, dtypes, via="Pallas")
    checked = 0

    def show(check: KernelCheck) -> None:
        nonlocal checked
        checked += 1
        c = check.case
        if check.finding is None:
            print(
                f"ok    {c.kernel}  {c.describe()}  (Pallas; largest difference "
                f"{check.difference:.3g})",
                flush=True,
            )
        else:
            print(f"FAIL  {check.finding}", flush=True)
        progress.check(check)

    def skipped(op: str, why: str) -> None:
        print(f"skip  {op}: {why}", flush=True)
        progress.skipped(op, why)

    findings = []
    done: set[str] = set()
    for source in sources:
        findings += check_kernels(
            source,
            count=args.count,
            seed=args.seed,
            max_size=args.max_size,
            dtypes=dtypes,
            ops=_ops(source, args.op),
            interpret=interpret,
            on_check=show,
            skip=done,
            on_skip=skipped,
        )
    for f in findings:
        if f.case == "no case":
            print(f"FAIL  {f}")
    progress.end(len(findings))
    if not checked and not findings:
        print("no op here is bound to a kernel: nothing to check")
        return 0
    kernels = len({f.kernel for f in findings})
    print(
        f"{checked} case(s) checked through Pallas: "
        + (
            f"{len(findings)} finding(s) in {kernels} kernel(s)"
            if findings
            else "every kernel agrees with its op"
        )
    )
    return 1 if findings else 0
