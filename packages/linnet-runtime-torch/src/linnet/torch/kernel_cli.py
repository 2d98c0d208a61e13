"""`linnet kernels FILE`: check every bound kernel of a file against its op's body.

Registered through the `linnet.commands` entry point; this module imports neither torch nor
Triton until the command runs (listing commands stays fast).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register_kernels(subparsers: Any) -> None:
    """Adds `linnet kernels` to the `linnet` CLI (the `linnet.commands` entry point)."""
    p = subparsers.add_parser(
        "kernels", help="check each bound kernel against its op's body on random shapes",
        description="Run every kernel an op binds on random shapes its where clauses allow "
                    "(an odd size first; under Triton's interpreter on the CPU, with guarded "
                    "memory: an access outside the launch's tensors or a race between "
                    "programs is a finding, not a crash), with its outputs poisoned with NaN, "
                    "and compare with the op's body; a case whose kernel indexes out of "
                    "bounds or races whatever the data is a finding without a launch; exits "
                    "1 on a finding.")
    p.add_argument("file", nargs="*", help=".linnet files (the std kernels they use are "
                                           "checked too; each kernel once)")
    p.add_argument("--std", action="store_true", help="check the std library's kernels")
    p.add_argument("--count", type=int, default=3, help="cases per kernel (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the cases (default 0)")
    p.add_argument("--max-size", type=int, default=48,
                   help="largest size of any dim (default 48; the interpreter is slow)")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="element types a generic T is drawn from (repeatable; default f32, "
                        "bf16)")
    p.add_argument("--op", action="append", default=[], metavar="NAME",
                   help="check only this op (repeatable; a name or a qualified name)")
    p.add_argument("--device", default=None,
                   help="cpu (Triton's interpreter) or cuda (default: cuda when available)")
    p.add_argument("--runtime", choices=("torch", "jax"), default="torch",
                   help="torch: kernels through Triton from generated PyTorch (default); "
                        "jax: through Pallas from generated JAX (Pallas's interpreter on the "
                        "CPU, `--device cpu`; for real on a GPU), linnet-runtime-jax's check")
    p.set_defaults(run=kernels_command)


def kernels_command(args: argparse.Namespace) -> int:
    from linnet.lang import LinnetError
    from linnet.lang.check.kernel_cases import DEFAULT_DTYPES
    from linnet.lang.diagnostics.core import Diagnostic

    if not args.file and not args.std:
        print("linnet kernels: give a .linnet file, or --std for the std library's kernels",
              file=sys.stderr)
        return 2
    if args.count < 1 or args.max_size < 1:
        print("linnet kernels: --count and --max-size are at least 1", file=sys.stderr)
        return 2
    if getattr(args, "runtime", "torch") == "jax":
        return _jax_kernels(args)
    if args.device in (None, "cpu") and "triton" not in sys.modules:
        # On the CPU, kernels run in Triton's interpreter, which must be chosen before Triton
        # is first imported (its own library functions are decorated then). Harmless on
        # CUDA: the interpreter only runs kernels whose tensors are on the CPU.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton  # noqa: F401
    except ImportError:
        raise LinnetError(Diagnostic(
            "E0768", "`linnet kernels` needs Triton, which is not installed here",
            help="install it: `pip install 'linnet-runtime-torch[triton]'` (on the CPU, "
                 "kernels run in Triton's interpreter)")) from None
    from .testing import KernelCheck, check_kernels, std_program

    sources: list[Any] = []
    if args.std:
        sources.append(std_program())
    sources += args.file
    dtypes = tuple(args.dtype) or DEFAULT_DTYPES
    checked = 0

    def show(check: KernelCheck) -> None:
        nonlocal checked
        checked += 1
        c = check.case
        if check.finding is None:
            print(f"ok    {c.kernel}  {c.describe()}  (largest difference "
                  f"{check.difference:.3g})")
        else:
            print(f"FAIL  {check.finding}")

    findings = []
    done: set[str] = set()  # ops already checked (a std op two files use, say)
    for source in sources:
        findings += check_kernels(source, count=args.count, seed=args.seed,
                                  max_size=args.max_size, dtypes=dtypes, ops=args.op or None,
                                  device=args.device, on_check=show, skip=done)
    unrun = [f for f in findings if f.case == "no case"]
    for f in unrun:
        print(f"FAIL  {f}")
    if not checked and not findings:
        print("no op here is bound to a kernel: nothing to check")
        return 0
    kernels = len({f.kernel for f in findings})
    print(f"{checked} case(s) checked: " + (f"{len(findings)} finding(s) in {kernels} "
                                             "kernel(s)" if findings else "every kernel agrees "
                                             "with its op"))
    return 1 if findings else 0


def _jax_kernels(args: argparse.Namespace) -> int:
    """`linnet kernels --runtime jax`: the same cases through Pallas (linnet.jax.testing)."""
    from linnet.lang import LinnetError
    from linnet.lang.check.kernel_cases import DEFAULT_DTYPES, std_program
    from linnet.lang.diagnostics.core import Diagnostic

    try:
        from linnet.jax.testing import KernelCheck, check_kernels
    except ImportError:
        raise LinnetError(Diagnostic(
            "E0792", "`linnet kernels --runtime jax` needs linnet-runtime-jax, which is not "
            "installed here", help="install it: `pip install linnet-runtime-jax`")) from None
    if args.device not in (None, "cpu", "gpu", "cuda"):
        print("linnet kernels: --device is cpu or gpu with --runtime jax", file=sys.stderr)
        return 2
    interpret = None if args.device is None else args.device == "cpu"
    sources: list[Any] = [std_program()] if args.std else []
    sources += args.file
    checked = 0

    def show(check: KernelCheck) -> None:
        nonlocal checked
        checked += 1
        c = check.case
        if check.finding is None:
            print(f"ok    {c.kernel}  {c.describe()}  (Pallas; largest difference "
                  f"{check.difference:.3g})")
        else:
            print(f"FAIL  {check.finding}")

    def skipped(op: str, why: str) -> None:
        print(f"skip  {op}: {why}")

    findings = []
    done: set[str] = set()
    for source in sources:
        findings += check_kernels(source, count=args.count, seed=args.seed,
                                  max_size=args.max_size, dtypes=tuple(args.dtype) or
                                  DEFAULT_DTYPES, ops=args.op or None, interpret=interpret,
                                  on_check=show, skip=done, on_skip=skipped)
    for f in findings:
        if f.case == "no case":
            print(f"FAIL  {f}")
    if not checked and not findings:
        print("no op here is bound to a kernel: nothing to check")
        return 0
    kernels = len({f.kernel for f in findings})
    print(f"{checked} case(s) checked through Pallas: " + (
        f"{len(findings)} finding(s) in {kernels} kernel(s)" if findings
        else "every kernel agrees with its op"))
    return 1 if findings else 0
