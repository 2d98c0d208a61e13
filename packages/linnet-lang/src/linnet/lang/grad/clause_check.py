"""Grad clauses checked against the reverse pass of their op's body (issue 38, item 2).

A ``grad`` clause replaces the reverse pass of its op's body wherever the op is
differentiated (``--grad``, ``value_and_grad``, a kernel launch under torch autograd or
``jax.grad``), so a wrong clause is a silent wrong gradient. `linnet grads` checks each one
the way `linnet kernels` checks kernels: on random cases of the op (shapes its `where`
clauses allow, sampled by :func:`linnet.lang.check.kernel_cases.sample_cases`, sizes that are
not multiples of anything included), with random inputs and random cotangents, the
clause's gradients must equal those of the body within :data:`GRAD_TOLERANCES`.

What is shared by every runtime lives here; a runtime only runs graphs
(``linnet.torch.grad_checks``, ``linnet.jax.grad_checks``):

* :func:`clause_ops`: the ops of a program with a grad clause;
* :func:`grad_case`: one case lowered: the forward graph of a one-op entry, its gradient
  graph by the clause and by the body (every clause ignored), random inputs and cotangents;
* :func:`compare_case`: both gradients compared, with a coded :class:`GradFinding` where
  they differ: E0537 (the clause's gradient of an input differs: its largest difference and
  where), E0538 (an integer gradient for a float input), E0539 (a case that cannot be
  checked, said so rather than passed);
* :func:`run_grad_checks`: every clause op on ``count`` cases, through a runtime's
  ``check_case``.

>>> from linnet.lang import Program
>>> prog = Program.from_text(SCALE_EXAMPLE)
>>> [op.name for op in clause_ops(prog)]
['scale']
>>> case = grad_case(prog, clause_ops(prog)[0], clause_cases(prog, clause_ops(prog)[0])[0])
>>> case.wrt, case.clause.outputs[-2:]
(['x', 'w'], ['%d_x', '%d_w'])
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.kernel_cases import (
    ENTRY,
    MODEL,
    KernelCase,
    sample_cases,
    scalar_value,
    wrapper_program,
)
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.graph import Graph
from linnet.lang.syntax.program import Program

SCALE_EXAMPLE = """
pub op scale<N: Dim, T: DType>(x: Tensor[N; T], w: Tensor[N; T], s: f32) -> Tensor[N; T] {
    let y[n] = x[n] * w[n] * s
    return y
} grad(dy) {
    let dx[n] = dy[n] * w[n] * s
    let dw[n] = dy[n] * x[n] * s
    return dx, dw
}
"""

# The tolerance of a gradient comparison, by the input's element type: (rtol, atol). An
# element passes when |clause - body| <= atol * scale + rtol * |body|, with scale the largest
# |body| of that gradient (at least 1). Both sides compute the same mathematics in a
# different order: in f64 they agree to about 1e-15 times the condition of the sums, so
# 1e-7 leaves room for long reductions and still finds any wrong factor, sign or term.
GRAD_TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-7, 1e-7),
    "f32": (1e-3, 1e-4),
    "f16": (3e-2, 1e-2),
    "bf16": (6e-2, 2e-2),
}
# The element types a generic `T: DType` is drawn from: f64, where the runtime can (the
# torch runtime always; JAX with x64 enabled), so that rounding never hides a wrong clause.
DEFAULT_GRAD_DTYPES = ("f64",)
# Sizes stay small: two gradient graphs per case, run by an interpreter.
DEFAULT_MAX_SIZE = 24

# Why a block method's clause is not checked, and what to do.
METHOD = (
    "`{op.name}` is a method of a block (called through the block's instance); only "
    "top-level ops and functions are checked",
    "move the computation and its clause to a top-level op that the method calls",
)

DIFFERS = "E0537"
INTEGER = "E0538"
UNCHECKED = "E0539"
UNKNOWN_OP = "E0540"
OPTIONS = "E0542"


@dataclass(frozen=True)
class GradFinding:
    """A grad clause that disagrees with its op's body on one case, or could not be checked.

    ``code``: E0537 (differs), E0538 (an integer gradient of a float input) or E0539 (not
    checked, and why); ``input`` the parameter whose gradient differs, ``difference`` the
    largest ``|clause - body|`` of it, ``where`` the element (``x[2, 0]``), ``clause`` and
    ``body`` the two gradients there.
    """

    code: str
    op: str
    case: str
    problem: str
    input: str = ""
    difference: float = float("inf")
    tolerance: float = 0.0
    where: str = ""
    clause: float | None = None
    body: float | None = None
    generics: dict[str, int | str] = field(default_factory=dict)
    via: str = ""
    advice: str = ""  # the help, where not the code's usual one

    def __str__(self) -> str:
        at = ""
        if self.where:
            at = (
                f": largest difference {self.difference:.3g} at {self.where} (clause "
                f"{self.clause:.6g}, body {self.body:.6g}; tolerance {self.tolerance:.3g})"
            )
        via = f" ({self.via})" if self.via else ""
        on = f" on {self.case}" if self.case else ""
        return f"{self.code} grad clause of {self.op}{via}{on}: {self.problem}{at}"

    def diagnostic(self) -> Diagnostic:
        """The finding as a coded diagnostic (what ``load(..., check_grads=True)`` raises).

        >>> GradFinding("E0537", "m::f", "x: [3] f64", "differs").diagnostic().code
        'E0537'
        """
        return Diagnostic(
            self.code,
            str(self).removeprefix(f"{self.code} "),
            help=self.advice or _HELP[self.code](self),
        )


_HELP: dict[str, Callable[[GradFinding], str]] = {
    DIFFERS: lambda f: (
        f"the clause's gradient of `{f.input}` is not the reverse pass of `{f.op}`'s body: "
        "fix the clause (a missing factor, a sign, gradients returned in the wrong order?) or "
        "delete it to differentiate the body; a clause that differs on purpose (a "
        "straight-through estimator) is left out of the check with `--skip`"
    ),
    INTEGER: lambda f: (
        f"compute `{f.input}`'s gradient in its own floating-point type: an integer gradient "
        "is truncated when it is added to the parameter's"
    ),
    UNCHECKED: lambda f: (
        "nothing was compared, so the clause is not known to be right: fix what is named "
        "above, or leave the op out of the check with `--skip`"
    ),
    UNKNOWN_OP: lambda f: "name an op that has a grad clause (`linnet grads FILE` lists them)",
}


@dataclass(frozen=True)
class GradCheck:
    """One case of one clause compared: passed, or with its finding."""

    case: KernelCase
    difference: float
    finding: GradFinding | None = None

    @property
    def passed(self) -> bool:
        return self.finding is None


@dataclass
class GradCase:
    """One case of a clause op, lowered: ``forward`` (a one-op entry ``check`` of the
    wrapper program ``wrapper``), ``clause`` and ``body`` (its gradient graphs: inputs, then
    one cotangent per float result; outputs, then one gradient per ``wrt`` parameter), and
    the random ``inputs`` and ``cotangents`` (lists of float64 / int64 numbers, nested, by
    shape: each runtime makes its own arrays of the declared dtypes)."""

    op: str
    case: KernelCase
    wrapper: Program
    forward: Graph
    clause: Graph
    body: Graph
    wrt: list[str]
    inputs: list[Any]
    cotangents: list[Any]
    dtypes: list[str]  # the entry inputs' dtypes, then the cotangents'


def checked_source(source: str | Path | Program) -> Program:
    """``source`` (a ``.linnet`` file, a std file as its std module, or a Program) checked,
    as `linnet kernels` checks it; E0767 where the file is not there."""
    from linnet.lang.check.kernel_cases import checked_program

    if not isinstance(source, Program | str | Path) or (
        not isinstance(source, Program) and not Path(source).is_file()
    ):
        raise LinnetError(
            Diagnostic(
                "E0767",
                f"`{source}` is not a file",
                help="give a .linnet file: `linnet grads my_ops.linnet`",
            )
        )
    return checked_program(source)


def clause_ops(program: Program) -> list[A.FuncDecl]:
    """Every op and function of the program's modules with a ``grad`` clause, std modules
    included, the root module first (block methods too: :func:`grad_case` says why it
    cannot check those)."""
    out = []
    for module in program.modules.values():
        for item in module.items:
            funcs = item.methods if isinstance(item, A.BlockDecl) else [item]
            out += [f for f in funcs if isinstance(f, A.FuncDecl) and f.grad is not None]
    return out


def clause_cases(
    program: Program,
    op: A.FuncDecl,
    count: int = 3,
    seed: int = 0,
    max_size: int = DEFAULT_MAX_SIZE,
    dtypes: tuple[str, ...] = DEFAULT_GRAD_DTYPES,
) -> list[KernelCase]:
    """Up to ``count`` random cases of ``op`` (its `where` clauses hold; every dim at most
    ``max_size``; a generic element type one of ``dtypes``)."""
    return sample_cases(program, op, count, seed, max_size, dtypes, max_numel=1 << 14, kernel=False)


def unchecked(
    op: A.FuncDecl | str, case: KernelCase | None, why: str, advice: str = "", via: str = ""
) -> GradFinding:
    """The E0539 finding of a case (or an op, ``case=None``) that could not be checked:
    ``why``, and ``advice`` (the help) where there is better than the usual."""
    name = op if isinstance(op, str) else op.qualified_name
    return GradFinding(
        UNCHECKED,
        name,
        case.describe() if case else "",
        "not checked: " + why,
        generics=dict(case.generics) if case else {},
        via=via,
        advice=advice,
    )


def grad_case(
    program: Program,
    op: A.FuncDecl,
    case: KernelCase,
    seed: int = 0,
    scalar: Callable[[str, str], Any] | None = None,
) -> GradCase:
    """``case`` of ``op`` lowered both ways, with random inputs (normal floats, integers in
    0..3) and cotangents. Raises :class:`LinnetError`: the clause's own error (E0538, E0954)
    where lowering it fails, E0539 where the case cannot be checked."""
    from linnet.lang.check.lowering import lower
    from linnet.lang.grad.reverse import ClauseTemplate, differentiate
    from linnet.lang.grad.rules import is_float

    def cannot(why: str, advice: str = "") -> LinnetError:
        return LinnetError(unchecked(op, case, why, advice).diagnostic())

    if op.owner is not None:
        raise cannot(METHOD[0].format(op=op), METHOD[1])
    wrt = [n for n, (_, d) in case.params.items() if is_float(d)]
    if not wrt:
        raise cannot(
            f"`{op.name}` has no floating-point tensor parameter, so nothing has a gradient",
            "give the op a floating-point tensor parameter, or drop "
            "its grad clause (nothing uses it)",
        )
    scalar = scalar or (lambda dtype, name: _scalar(dtype, seed, name))
    wrapper = wrapper_program(program, op, case)
    config = {name: scalar(dtype, name) for name, dtype in case.scalars.items()}
    shapes = {name: list(shape) for name, (shape, _) in case.params.items()}
    templates: dict[int, ClauseTemplate] = {}
    forward = lower(
        wrapper, ENTRY, shapes, config, model=MODEL, check=False, grad_clauses=templates
    )
    if not any(c.callee == op.qualified_name and c.index in templates for c in forward.calls):
        raise cannot(
            f"the call of `{op.name}` recorded no grad clause",
            "this is Linnet's fault, not the clause's: please report it",
        )
    clause = differentiate(forward, wrt, "cotangents", templates)
    try:
        body = differentiate(forward, wrt, "cotangents")
    except LinnetError as err:
        first = err.diagnostics[0]
        raise cannot(
            f"the reverse pass of the body failed ({first.code}: {first.message})"
        ) from None
    rng = random.Random(f"{op.qualified_name}/{seed}")
    inputs = [_random(shape, dtype, rng) for shape, dtype in case.params.values()]
    cots = [forward.values[o] for o in forward.outputs if is_float(forward.values[o].dtype)]
    cotangents = [_random(vt.shape, vt.dtype, rng) for vt in cots]
    dtypes = [d for _, d in case.params.values()] + [vt.dtype for vt in cots]
    return GradCase(
        op.qualified_name, case, wrapper, forward, clause, body, wrt, inputs, cotangents, dtypes
    )


def _random(shape: Sequence[int], dtype: str, rng: random.Random) -> Any:
    """Nested lists of normal floats (integers in 0..3, bools) of ``shape``."""
    from linnet.lang.grad.rules import is_float

    def draw() -> Any:
        if is_float(dtype):
            return rng.gauss(0.0, 1.0)
        return rng.random() < 0.5 if dtype == "bool" else rng.randrange(4)

    def make(dims: Sequence[int]) -> Any:
        return draw() if not dims else [make(dims[1:]) for _ in range(dims[0])]

    return make(list(shape))


def _scalar(dtype: str, seed: int, name: str) -> Any:
    """A scalar parameter's value: a small positive number (an epsilon, a scale), an int
    in 1..4 or a bool (:func:`linnet.lang.check.kernel_cases.scalar_value`)."""
    return scalar_value(dtype, random.Random(zlib.crc32(f"{seed}/{name}".encode())).random())


def gradients(gcase: GradCase, outputs: Sequence[Any]) -> list[Any]:
    """The gradients among a gradient graph's ``outputs`` (one per ``wrt`` parameter)."""
    return list(outputs[len(outputs) - len(gcase.wrt) :])


def compare_case(
    gcase: GradCase, clause: Sequence[Any], body: Sequence[Any], via: str = ""
) -> GradCheck:
    """Compare the clause's gradients with the body's (one array per ``wrt`` parameter, as
    numpy arrays or anything ``numpy.asarray`` takes): the first input whose gradient
    differs beyond :data:`GRAD_TOLERANCES` is an E0537 finding; a body that passes no
    gradient (or none finite) to an input the clause gives one is E0539, not a pass."""
    import numpy as np

    case = gcase.case
    c = [np.asarray(g, dtype=np.float64) for g in clause]
    b = [np.asarray(g, dtype=np.float64) for g in body]
    worst = 0.0
    for i, name in enumerate(gcase.wrt):
        dtype = case.params[name][1]
        rtol, atol = GRAD_TOLERANCES.get(dtype, GRAD_TOLERANCES["f32"])
        ci, bi = c[i], b[i]
        if ci.shape != bi.shape:
            return GradCheck(
                case,
                float("inf"),
                _finding(
                    gcase,
                    DIFFERS,
                    name,
                    f"the clause's gradient of `{name}` has shape "
                    f"{list(ci.shape)}, the body's {list(bi.shape)}",
                    via=via,
                ),
            )
        finite = np.isfinite(bi)
        if not finite.any() and bi.size:
            return GradCheck(
                case,
                float("inf"),
                unchecked(
                    gcase.op,
                    case,
                    f"the body's gradient of `{name}` is not finite on these random inputs",
                    "try other shapes or seeds (`--seed`)",
                    via,
                ),
            )
        if (
            not bi[finite].any()
            and np.abs(np.nan_to_num(ci)).max(initial=0.0) > 0
            and _depends(gcase.forward, "%" + name)
        ):
            # The results depend on it, yet the body's reverse pass gives nothing: its
            # steps pass no gradient (where they do not depend on it at all, a clause that
            # gives one is wrong, and is compared below).
            return GradCheck(
                case,
                float("inf"),
                unchecked(
                    gcase.op,
                    case,
                    f"the body passes no gradient to `{name}` (floor, comparisons "
                    "or integer steps are not differentiable) but the clause gives one",
                    "a surrogate gradient (a straight-through estimator) cannot be checked "
                    "against the body: leave the op out with `--skip`",
                    via,
                ),
            )
        scale = max(1.0, float(np.abs(bi[finite]).max(initial=0.0)))
        limit = atol * scale + rtol * np.abs(np.where(finite, bi, 0.0))
        # Where both are finite they must be close; where the body is not, the clause must
        # not be either (the same infinity; NaN where the body has NaN is not compared).
        both = finite & np.isfinite(ci)
        diff = np.where(both, np.abs(np.where(both, ci - bi, 0.0)), np.inf)
        diff = np.where(~finite & (np.isnan(bi) | (bi == ci)), 0.0, diff)
        over = diff > limit
        largest = float(diff.max(initial=0.0))
        if over.any():
            flat = int(np.argmax(np.where(over, diff, -1.0)))
            idx = [int(k) for k in np.unravel_index(flat, ci.shape)] if ci.shape else []
            where = f"{name}[{', '.join(map(str, idx))}]" if idx else name
            problem = _what(name, i, gcase.wrt, c, b)
            return GradCheck(
                case,
                largest,
                _finding(
                    gcase,
                    DIFFERS,
                    name,
                    problem,
                    float(diff.reshape(-1)[flat]),
                    float(limit.reshape(-1)[flat]),
                    where,
                    float(ci.reshape(-1)[flat]),
                    float(bi.reshape(-1)[flat]),
                    via,
                ),
            )
        worst = max(worst, largest)
    return GradCheck(case, worst)


def _depends(graph: Graph, ref: str) -> bool:
    """Whether any output of ``graph`` is computed from ``ref`` (through any step)."""
    reached = {ref}
    for step in graph.steps:
        if any(o in reached for o in step.operands):
            reached.update(step.results)
    return any(o in reached for o in graph.outputs)


def _what(name: str, i: int, wrt: list[str], c: list[Any], b: list[Any]) -> str:
    """What the clause's gradient of ``name`` looks like next to the body's: zeros, the
    opposite sign, another input's gradient (swapped), a multiple (a missing factor)."""
    import numpy as np

    ci, bi = c[i], b[i]

    def close(x: Any, y: Any) -> bool:
        return bool(
            np.allclose(
                x, y, rtol=1e-5, atol=1e-8 * max(1.0, np.abs(y).max(initial=0.0)), equal_nan=True
            )
        )

    if not ci.any():
        return f"the clause's gradient of `{name}` is all zeros, the body's is not"
    if close(ci, -bi):
        return f"the clause's gradient of `{name}` has the opposite sign of the body's"
    for j, other in enumerate(wrt):
        if j != i and b[j].shape == ci.shape and close(ci, b[j]):
            return (
                f"the clause's gradient of `{name}` is the body's gradient of `{other}` (swapped?)"
            )
    finite = np.isfinite(ci) & np.isfinite(bi)
    denom = float((bi[finite] * bi[finite]).sum())
    if denom > 0:
        k = float((ci[finite] * bi[finite]).sum()) / denom
        if k != 0 and close(ci, k * bi):
            return (
                f"the clause's gradient of `{name}` is {k:.6g} times the body's (a missing "
                "or extra factor?)"
            )
    return f"the clause's gradient of `{name}` differs from the body's"


def _finding(
    gcase: GradCase,
    code: str,
    name: str,
    problem: str,
    diff: float = float("inf"),
    tol: float = 0.0,
    where: str = "",
    clause: float | None = None,
    body: float | None = None,
    via: str = "",
) -> GradFinding:
    return GradFinding(
        code,
        gcase.op,
        gcase.case.describe(),
        problem,
        name,
        diff,
        tol,
        where,
        clause,
        body,
        dict(gcase.case.generics),
        via,
    )


def finding_of(
    op: A.FuncDecl, case: KernelCase | None, err: LinnetError, via: str = ""
) -> GradFinding:
    """The finding of a case whose lowering raised ``err``: the clause's own error (E0538,
    E0954, E052x) is a finding with that code; any other, E0539 naming it."""
    first = err.diagnostics[0]
    described = case.describe() if case else ""
    generics = dict(case.generics) if case else {}
    if first.code == UNCHECKED:
        return GradFinding(
            UNCHECKED, op.qualified_name, described, first.message, generics=generics, via=via
        )
    if first.code == INTEGER or first.code == "E0954" or first.code.startswith("E052"):
        param = next((p.name for p in op.params if f"`{p.name}`" in first.message), "")
        return GradFinding(
            first.code,
            op.qualified_name,
            described,
            first.message,
            param,
            generics=generics,
            via=via,
        )
    return unchecked(
        op, case, f"lowering the case failed ({first.code}: {first.message})", first.help, via
    )


def run_grad_checks(
    program: Program,
    check_case: Callable[[A.FuncDecl, KernelCase, int], GradCheck],
    *,
    count: int = 3,
    seed: int = 0,
    max_size: int = DEFAULT_MAX_SIZE,
    dtypes: tuple[str, ...] = DEFAULT_GRAD_DTYPES,
    ops: Sequence[str] | str | None = None,
    skip: Iterable[str] | None = None,
    on_check: Callable[[GradCheck], None] | None = None,
    on_unchecked: Callable[[GradFinding], None] | None = None,
) -> list[GradFinding]:
    """What every runtime's ``check_grad_clauses`` does around running graphs: each clause
    op of ``program`` (``ops``: by name or qualified name; E0540 for a name that is no
    clause op; none of ``skip``, to which the ops checked are added) on ``count`` cases,
    each compared by ``check_case(op, case, seed)``. An op with no case, or whose case
    cannot be lowered, is a finding, as is every case's own (``on_unchecked`` hears of the
    op-level ones as they come).

    >>> # run_grad_checks(program, lambda op, case, s: GradCheck(case, 0.0), count=2)
    """
    ops = [ops] if isinstance(ops, str) else ops
    dtypes = (dtypes,) if isinstance(dtypes, str) else dtypes
    check_options(count, max_size, dtypes, ops)
    done = skip if isinstance(skip, set) else set([skip] if isinstance(skip, str) else skip or [])
    candidates = clause_ops(program)
    for name in ops or []:
        if not any(name in (op.name, op.qualified_name) for op in candidates):
            known = ", ".join(sorted(op.qualified_name for op in candidates)[:8]) or "none"
            raise LinnetError(
                Diagnostic(
                    UNKNOWN_OP,
                    f"`{name}` is not an op with a grad clause here (those are: {known})",
                    help=_HELP[UNKNOWN_OP](GradFinding(UNKNOWN_OP, name, "", "")),
                )
            )
    chosen = [
        op
        for op in candidates
        if op.qualified_name not in done and (not ops or op.name in ops or op.qualified_name in ops)
    ]
    findings: list[GradFinding] = []

    def note(f: GradFinding) -> None:
        findings.append(f)
        if on_unchecked is not None:
            on_unchecked(f)

    for op in chosen:
        done.add(op.qualified_name)
        if op.owner is not None:
            why, advice = METHOD
            note(unchecked(op, None, why.format(op=op), advice))
            continue
        cases = clause_cases(program, op, count, seed, max_size, dtypes)
        if not cases:
            note(
                unchecked(
                    op,
                    None,
                    f"no shapes with every dim at most {max_size} satisfy "
                    f"the `where` clauses of `{op.name}`",
                    "raise --max-size (max_size=)",
                )
            )
            continue
        for i, case in enumerate(cases):
            check = check_case(op, case, seed * 1000 + i)
            if check.finding is not None:
                findings.append(check.finding)
            if on_check is not None:
                on_check(check)
    return findings


def check_options(count: Any, max_size: Any, dtypes: Any, ops: Any) -> None:
    """E0542 for options a check cannot run with: a ``count`` or ``max_size`` that is not a
    positive integer (no case would be drawn, and that would read as "no shapes satisfy the
    `where` clauses"), element types that are not floating point (a case with no float
    input has no gradient to compare), ``ops`` that are not names.

    >>> check_options(3, 24, ("f64",), None)
    """
    from linnet.lang.tensors.dtypes import FLOATS

    for name, value in (("count", count), ("max_size", max_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LinnetError(
                Diagnostic(
                    OPTIONS,
                    f"{name} must be a positive integer, not {value!r}",
                    help=f"e.g. {name}=3 (`--{name.replace('_', '-')} 3`)",
                )
            )
    bad = [d for d in dtypes if d not in FLOATS] if isinstance(dtypes, tuple | list) else [dtypes]
    if bad or not dtypes:
        raise LinnetError(
            Diagnostic(
                OPTIONS,
                f"the element types a generic `T` is drawn from must be floating point "
                f"({', '.join(FLOATS)}), not {', '.join(map(repr, bad)) or 'none'}",
                help="e.g. dtypes=('f64',) (`--dtype f64`): gradients are of floating-point values",
            )
        )
    if ops is not None and not (
        isinstance(ops, list | tuple) and all(isinstance(o, str) for o in ops)
    ):
        raise LinnetError(
            Diagnostic(
                OPTIONS,
                f"ops must be a list of op names, not {ops!r}",
                help="e.g. ops=['scale', 'main::scale']",
            )
        )


def raise_grad_findings(findings: Sequence[GradFinding], unchecked: str = "error") -> None:
    """A :class:`LinnetError` with one diagnostic per finding; none: nothing.

    ``unchecked="warn"`` (how ``load(..., check_grads=True)`` takes them) turns the E0539
    findings, cases the check could not see into (a straight-through estimator's body passes
    no gradient), into warnings that say so; the clauses found wrong still raise.

    >>> raise_grad_findings([])
    """
    if unchecked == "warn":
        import warnings

        for f in findings:
            if f.code == UNCHECKED:
                warnings.warn(f"not checked: {f}", stacklevel=3)
        findings = [f for f in findings if f.code != UNCHECKED]
    if findings:
        raise LinnetError([f.diagnostic() for f in findings])


__all__ = [
    "DEFAULT_GRAD_DTYPES",
    "DEFAULT_MAX_SIZE",
    "GRAD_TOLERANCES",
    "GradCase",
    "GradCheck",
    "GradFinding",
    "check_options",
    "checked_source",
    "clause_cases",
    "clause_ops",
    "compare_case",
    "finding_of",
    "grad_case",
    "gradients",
    "raise_grad_findings",
    "run_grad_checks",
    "unchecked",
]
