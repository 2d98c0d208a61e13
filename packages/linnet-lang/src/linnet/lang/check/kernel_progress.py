"""`linnet kernels`' progress on stderr: the number of cases first, a line as each case
finishes (``[3/23] std.nn.norm::rms_norm  x: [5, 40] f32 ... ok 1.2 s``), and a summary
last. Kernels under an interpreter take seconds each, and a whole check of the std library
minutes: without it the command looked hung. Every runtime's check prints the same lines;
``--quiet`` silences them (the report on stdout is unchanged).

>>> p = Progress({"std.nn.norm::rms_norm": 2}, stream=None)
>>> p.total
2
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import IO, Any

from linnet.lang.syntax.program import Program


def planned_cases(
    programs: Iterable[Program],
    ops: list[str] | None,
    *,
    count: int,
    seed: int,
    max_size: int,
    dtypes: tuple[str, ...],
    skip: Iterable[str] = (),
) -> dict[str, int]:
    """The cases each op will be checked on (qualified op name -> number), in the order
    the checks run them: the ops of ``programs`` bound to a kernel, named by ``ops`` (None:
    all), each once, none of ``skip``; as :func:`~linnet.lang.check.kernel_runs.run_checks`
    chooses them, drawing the same cases (drawing them is quick: no kernel runs).

    >>> from linnet.lang.check.kernel_cases import std_program
    >>> plan = planned_cases([std_program()], ["rms_norm"], count=2, seed=0, max_size=48,
    ...                      dtypes=("f32",))
    >>> plan
    {'std.nn.norm::rms_norm': 2}
    """
    from linnet.lang.check.kernel_cases import bound_ops, sample_cases

    plan: dict[str, int] = {}
    done = set(skip)
    for program in programs:
        for op in bound_ops(program):
            name = op.qualified_name
            if name in done or (ops is not None and op.name not in ops and name not in ops):
                continue
            done.add(name)
            plan[name] = len(sample_cases(program, op, count, seed, max_size, dtypes))
    return plan


class Progress:
    """Prints `linnet kernels`' progress of the cases ``plan`` counts (op -> cases, as
    :func:`planned_cases` gives) on ``stream`` (stderr; None: nowhere): call :meth:`begin`,
    :meth:`check` with each finished :class:`KernelCheck`, :meth:`skipped` for an op a
    runtime does not run, then :meth:`end`.

    >>> import io
    >>> out = io.StringIO()
    >>> Progress({"m::f": 1}, stream=out).begin()
    >>> print(out.getvalue().strip())
    linnet kernels: 1 case(s) of 1 op(s) bound to a kernel to check
    """

    def __init__(
        self, plan: dict[str, int], stream: IO[str] | None = sys.stderr, via: str = ""
    ) -> None:
        self.plan = dict(plan)
        self.total = sum(plan.values())
        self.done = 0
        self.failed = 0
        self.stream = stream
        self.via = f" through {via}" if via else ""
        self.started = self.last = time.perf_counter()

    def _say(self, text: str) -> None:
        if self.stream is not None:
            print(text, file=self.stream, flush=True)

    def begin(self) -> None:
        """The first line: how many cases of how many ops will be checked."""
        self.started = self.last = time.perf_counter()
        self._say(
            f"linnet kernels: {self.total} case(s) of {len(self.plan)} op(s) bound to a "
            f"kernel to check{self.via}"
        )

    def check(self, check: Any) -> None:
        """A case has finished (a :class:`~linnet.lang.check.kernel_cases.KernelCheck`)."""
        now = time.perf_counter()
        self.done += 1
        self.failed += check.finding is not None
        verdict = "ok" if check.finding is None else "FAIL"
        case = check.case
        self._say(
            f"[{self.done}/{self.total}] {case.op}  {case.describe()} ... {verdict} "
            f"{now - self.last:.1f} s"
        )
        self.last = now

    def skipped(self, op: str, why: str) -> None:
        """A runtime does not run ``op`` (why): its cases leave the total."""
        self.total -= self.plan.pop(op, 0)
        self._say(f"[skip] {op}: {why}")

    def end(self, findings: int) -> None:
        """The last line: cases checked, the time, and the findings."""
        took = time.perf_counter() - self.started
        self._say(
            f"linnet kernels: {self.done} case(s) checked in {took:.1f} s: "
            + (f"{findings} finding(s)" if findings else "every kernel agrees with its op")
        )
