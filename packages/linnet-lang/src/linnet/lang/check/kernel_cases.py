"""Shapes to check a bound kernel on: concrete generics of an op that satisfy its `where`
clause and its kernel's (under the binding), drawn at random with a seed.

`linnet kernels` and ``linnet.torch.testing.check_kernels`` run each bound kernel on these
cases and compare it with the op's body. The sampler is a small solver over the clauses:
candidate sizes are small numbers plus the boundaries the clauses and the binding name (each
integer literal ``c`` there gives ``c - 1``, ``c`` and ``c + 1``: the edge of a tile, of a
`B >= C` limit), kept under ``max_size``; a draw is kept when every clause holds, as the
checker evaluates it.

>>> from linnet.lang import check_text
>>> prog = check_text(SOFTMAX_EXAMPLE)
>>> [op.name for op in bound_ops(prog)]
['softmax']
>>> cases = sample_cases(prog, bound_ops(prog)[0], count=2, seed=0, max_size=8)
>>> [sorted(c.generics) for c in cases], cases[0].kernel
([['C', 'R'], ['C', 'R']], 'main::row_softmax')
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.core import Fail, Frame
from linnet.lang.check.evaluate import Evaluator
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, SourceFile
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.graph import Graph
from linnet.lang.syntax.parser import parse, parse_appended
from linnet.lang.syntax.program import STD_ROOT, Program, parse_once, std_modules
from linnet.lang.syntax.walk import walk
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import FuncRef

SOFTMAX_EXAMPLE = """
kernel row_softmax<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
where B >= C {
    let row = program_id(0)
    let cols = iota<i32>(B)
    let mask = cols < C
    let v = load(x[row, cols], mask, -1e30)
    let e = exp(v - max[c] v[c])
    store(y[row, cols], e / sum[c] e[c], mask)
}

pub op softmax<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32]
kernel row_softmax<R, C, 1024> {
    let top[r] = max[c] x[r, c]
    let e[r, c] = exp(x[r, c] - top[r])
    let y[r, c] = e[r, c] / sum[j] e[r, j]
    return y
}
"""

# Float element types a generic `T: DType` is drawn from unless the caller names others.
DEFAULT_DTYPES = ("f32", "bf16")


# Integer tensors a case draws in 0..3 (small enough to index any case's axes) but for the
# 8-bit types, which no std op indexes with: they hold quantised weights (`linear_q8`'s i8,
# `linear_q4`'s packed u8 nibbles), so a case draws them over their whole range, or a kernel
# that drops the sign or a byte's high nibble would agree with its body on every case.
_DATA_RANGES = {"i8": (-128, 128), "u8": (0, 256)}


def integer_range(dtype: str) -> tuple[int, int]:
    """``(low, high)``, high excluded, of the random values a case draws for an integer
    tensor of ``dtype``: 0..3 (valid indices), the whole range for 8-bit data.

    >>> integer_range("i32"), integer_range("i8"), integer_range("u8")
    ((0, 4), (-128, 128), (0, 256))
    """
    return _DATA_RANGES.get(dtype, (0, 4))


def scalar_value(dtype: str, u: float) -> Any:
    """A scalar parameter's value from a uniform draw ``u`` in [0, 1): a small positive
    number (an epsilon, a scale), an int in 1..4 or a bool.

    >>> scalar_value("f32", 0.5), scalar_value("i32", 0.5), scalar_value("bool", 0.5)
    (0.501, 3, False)
    """
    if dtype == "bool":
        return u < 0.5
    if dtype.startswith(("i", "u")):
        return 1 + int(u * 4)
    return 1e-3 + u


# Draws tried per case wanted before the sampler gives up on a clause nothing small satisfies.
ATTEMPTS_PER_CASE = 200


@dataclass(frozen=True)
class KernelCase:
    """One set of concrete generics for a bound op: the op's generics (dims as ints, dtypes
    as names), the shape and dtype of each tensor parameter and result, the scalar
    parameters' types, and the kernel with its bound generics."""

    op: str
    kernel: str
    generics: dict[str, int | str]
    params: dict[str, tuple[tuple[int, ...], str]]
    scalars: dict[str, str]
    results: list[tuple[tuple[int, ...], str]]
    kernel_generics: dict[str, int | str] = field(default_factory=dict)

    def describe(self) -> str:
        """``x: [3, 40] bf16, w: [40] bf16`` and the generics, for messages.

        >>> KernelCase("m::f", "m::k", {"N": 3}, {"x": ((3,), "f32")}, {}, []).describe()
        'x: [3] f32 (N=3)'
        """
        shapes = ", ".join(f"{n}: {list(s)} {d}" for n, (s, d) in self.params.items())
        gens = ", ".join(f"{k}={v}" for k, v in self.generics.items())
        return f"{shapes} ({gens})" if gens else shapes


def bound_ops(program: Program) -> list[A.FuncDecl]:
    """Every op of the program's modules bound to a kernel, std modules included, in module
    order (the root module first)."""
    out = []
    for module in program.modules.values():
        for item in module.items:
            if isinstance(item, A.FuncDecl) and item.kind == "op" and item.kernel is not None:
                out.append(item)
    return out


def check_op_names(programs: list[Program], ops: list[str] | None) -> None:
    """E0793 for a name in ``ops`` (`linnet kernels --op`) that is no bound op of any of
    ``programs``, by name or qualified name: checking nothing and passing would hide the
    typo. The help names the closest op.

    >>> from linnet.lang import check_text
    >>> check_op_names([check_text(SOFTMAX_EXAMPLE)], ["softmax", "main::softmax"])
    >>> check_op_names([check_text(SOFTMAX_EXAMPLE)], ["sofmax"])
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0793]: no op bound to a kernel is ...
    """
    from linnet.lang.check.hints import did_you_mean

    names = {n for p in programs for op in bound_ops(p) for n in (op.name, op.qualified_name)}
    for name in ops or []:
        if name not in names:
            shown = sorted(n for n in names if "::" not in n)
            raise LinnetError(
                Diagnostic(
                    "E0793",
                    f"no op bound to a kernel is named `{name}` here, so `--op {name}` "
                    "would check nothing",
                    help=did_you_mean(
                        name,
                        sorted(names),
                        "the ops bound to a kernel here: " + (", ".join(shown) or "none"),
                    ),
                )
            )


def boundary_sizes(op: A.FuncDecl, *kernels: A.FuncDecl | None) -> set[int]:
    """The integer literals of the op's and kernels' `where` clauses and of the binding's
    arguments (both kernels' of a chain), each with its neighbours: where a mask or a limit
    changes."""
    exprs: list[Any] = list(op.where)
    binding = op.kernel
    while binding is not None:
        exprs += [a for a in binding.args if isinstance(a, A.Expr)]
        binding = binding.then
    for kernel in kernels:
        if kernel is not None:
            exprs += list(kernel.where)
    found = set()
    for e in exprs:
        for n in walk(e):
            if isinstance(n, A.IntLit) and n.value > 0:
                found.update({n.value - 1, n.value, n.value + 1})
    return {v for v in found if v > 0}


def candidate_sizes(max_size: int, boundaries: set[int]) -> list[int]:
    """Small sizes (1 to 8, then a few odd and even ones) and the boundaries, up to
    ``max_size``.

    >>> candidate_sizes(20, {15, 16, 17})
    [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 20]
    """
    base = {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 20, 31, 33, 48, 63, 64, 65, 100, 127, 129}
    return sorted(v for v in base | boundaries if 1 <= v <= max_size)


def sample_cases(
    program: Program,
    op: A.FuncDecl,
    count: int = 3,
    seed: int = 0,
    max_size: int = 48,
    dtypes: tuple[str, ...] = DEFAULT_DTYPES,
    max_numel: int = 1 << 16,
    kernel: bool = True,
) -> list[KernelCase]:
    """Up to ``count`` distinct cases for ``op`` (a bound op of ``program``) on which its
    kernel applies: the op's `where` holds and so does the kernel's under the binding.
    Each dim is at most ``max_size`` and each tensor at most ``max_numel`` elements; a
    generic element type is one of ``dtypes``. ``kernel=False``: cases of any op (its own
    `where` holds; a grad clause's check, linnet.lang.grad.clause_check), not only where a
    kernel applies. The first case has every dim odd where the clauses allow (no dim a
    multiple of a tile: each tiled axis ends in a partial tile). Where none of the small
    sizes and the clauses' boundaries gives a case, powers of two are tried (divisibility
    clauses). Fewer come back when fewer exist (none: no small shapes satisfy the clauses).

    >>> from linnet.lang import check_text
    >>> prog = check_text(SOFTMAX_EXAMPLE)
    >>> [c.params["x"] for c in sample_cases(prog, bound_ops(prog)[0], 2, seed=1)]
    [((5, 1), 'f32'), ((7, 31), 'f32')]
    """
    assert op.module is not None and (op.kernel is not None or not kernel)
    rng = random.Random(f"{op.qualified_name}/{seed}")
    ev = Evaluator(program, Builder(Graph(entry="", model="")), {})
    kernels = _kernel_decls(ev, op) if op.kernel is not None else []
    sizes = candidate_sizes(max_size, boundary_sizes(op, *kernels))
    out: list[KernelCase] = []
    seen: set[tuple] = set()
    # Where no small size satisfies the clauses, powers of two do the divisibility ones
    # (`HD % (2 * BO) == 0` with BO 16 needs 32, which no boundary names).
    powers = [1 << k for k in range(max_size.bit_length()) if 1 << k <= max_size]
    # The first case has every dim odd where the clauses allow it: a multiple of no tile
    # size (tiles are powers of two), so that every tiled axis ends in a partial tile, which
    # a grid that rounds down, or a mask that assumes whole tiles, leaves wrong.
    odd = [v for v in sizes if v % 2]
    for pool, want in ((odd, 1), (sizes, count), (powers, count)):
        if pool is powers and out:
            break
        for _ in range(ATTEMPTS_PER_CASE * max(want, 1)):
            if len(out) >= min(want, count):
                break
            env: dict[str, Any] = {}
            for g in op.generics:
                env[g.name] = rng.choice(dtypes) if g.kind == "DType" else rng.choice(pool)
            key = tuple(sorted(env.items()))
            if key in seen:
                continue
            seen.add(key)
            case = _case(ev, op, env, max_numel, kernel)
            if case is not None:
                out.append(case)
    return out


def case_for(
    program: Program, op: A.FuncDecl, generics: dict[str, Any], max_numel: int = 1 << 22
) -> KernelCase | None:
    """The case of ``op`` for the op's ``generics`` (ints for dims, dtype names), chosen
    rather than sampled (a test's edge shapes); None where a clause does not hold or a
    tensor has more than ``max_numel`` elements.

    >>> from linnet.lang import check_text
    >>> prog = check_text(SOFTMAX_EXAMPLE)
    >>> case_for(prog, bound_ops(prog)[0], {"R": 2, "C": 40}).params["x"]
    ((2, 40), 'f32')
    """
    ev = Evaluator(program, Builder(Graph(entry="", model="")), {})
    return _case(ev, op, dict(generics), max_numel)


def _kernel_decls(ev: Evaluator, op: A.FuncDecl) -> list[A.FuncDecl | None]:
    """The kernel (or a chain's two) ``op`` binds; None for a name that does not resolve."""
    assert op.kernel is not None and op.module is not None
    out: list[A.FuncDecl | None] = []
    binding: A.KernelBinding | None = op.kernel
    while binding is not None:
        try:
            ref = ev.resolve_global(op.module, binding.name, binding.span)
        except Fail:
            ref = None
        out.append(ref.decl if isinstance(ref, FuncRef) else None)
        binding = binding.then
    return out


def binding_name(attrs: dict[str, Any]) -> str:
    """The kernel a call's binding attributes name, as messages show it: a chain's
    ``m::split then combine``.

    >>> binding_name({"kernel": "m::split", "kernel_then": {"kernel": "m::combine"}})
    'm::split then combine'
    """
    name = attrs.get("kernel", "")
    then = attrs.get("kernel_then")
    while then:
        name += f" then {then['kernel'].rpartition('::')[2]}"
        then = then.get("kernel_then")
    return name


def _case(
    ev: Evaluator, op: A.FuncDecl, env: dict[str, Any], max_numel: int, kernel: bool = True
) -> KernelCase | None:
    """The case for these generics, or None where a clause fails or a size is too big
    (or, with ``kernel``, the op's kernel does not apply)."""
    assert op.module is not None
    frame = Frame(op.module, {k: Dim.const(v) if isinstance(v, int) else v for k, v in env.items()})
    try:
        ev.check_where(op, frame, op.name_span)
        attrs = ev.kernel_binding_attrs(op, frame) if op.kernel is not None else {}
        if kernel and not attrs.get("kernel_applies"):
            return None
        params: dict[str, tuple[tuple[int, ...], str]] = {}
        scalars: dict[str, str] = {}
        for p in op.params:
            if isinstance(p.type, A.TensorType):
                params[p.name] = _concrete(ev.tensor_type(p.type, frame))
            else:
                scalars[p.name] = p.type.name if isinstance(p.type, A.ScalarType) else "f32"
        results = [_concrete(ev.tensor_type(r.type, frame)) for r in op.results]
    except Fail:
        return None
    for shape, _ in [*params.values(), *results]:
        if any(s <= 0 for s in shape) or _numel(shape) > max_numel:
            return None
    kgen = {k: v for k, v in attrs.get("kernel_generics", {}).items()}
    return KernelCase(
        op.qualified_name, binding_name(attrs), dict(env), params, scalars, results, kgen
    )


def _concrete(typ: tuple) -> tuple[tuple[int, ...], str]:
    dims, dtype = typ
    values = tuple(d.value for d in dims)
    if any(v is None for v in values):
        # A symbolic size is not a case (it never happens with every generic concrete).
        raise Fail(Diagnostic("E0000", "a size is not concrete"))
    return values, dtype


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------- checking programs
# What every runtime's kernel check shares (linnet.torch.testing, linnet.jax.testing).

# The tolerance of a comparison, by the result's element type: (rtol, atol). An element
# passes when |kernel - body| <= atol * scale + rtol * |body|, with scale the largest |body|
# of the result (at least 1), so that sums over long axes are not held to the scale of one
# element. 16-bit types: the body rounds every step to 8 (bf16) or 11 (f16) bits of mantissa,
# a kernel rounds once (and Triton's interpreter has no bf16 arithmetic: it computes in f32),
# so they differ by a few units in the last place. Integers and bools are exact.
TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-9, 1e-12),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 2e-3),
    "bf16": (4e-2, 1.6e-2),
}
# f32 results of a kernel whose f32 products are `tl.dot`s in TF32 (numerics "fast" launches
# them so on CUDA: 10 bits of mantissa in, f32 accumulation); the interpreter computes in f32.
TF32 = (5e-3, 2e-3)
EXACT = (0.0, 0.0)
MODEL = "LinnetKernelCheck"
ENTRY = "check"


def checked_program(source: str | Path | Program) -> Program:
    """``source`` (a ``.linnet`` file, a std file as its std module, or a Program) checked:
    what `linnet kernels` checks; E0767 where the file is not there. The bound kernels'
    accesses are left to :func:`~linnet.lang.check.kernel_runs.run_checks`, which reports each fault as a finding."""
    from linnet.lang.check.checker import check_modules

    if isinstance(source, Program):
        program = source
    else:
        path = Path(source)
        if not path.is_file():
            raise LinnetError(
                Diagnostic(
                    "E0767",
                    f"`{source}` is not a file",
                    help="give a .linnet file: `linnet kernels my_kernels.linnet`",
                )
            )
        program = _std_program(path) or Program.from_file(path)
    # Accesses out of bounds or racing are each case's finding here (run_checks), not an
    # error that stops every other kernel's check.
    errors = [*program.errors, *check_modules(program)]
    if errors:
        raise LinnetError(errors)
    return program


def _std_program(path: Path) -> Program | None:
    """A file of the std library as the module it is (`std.nn.norm`, not `norm`), so that
    its names read as everywhere else."""
    try:
        rel = path.resolve().relative_to(STD_ROOT.resolve())
    except ValueError:
        return None
    dotted = ".".join(("std", *rel.with_suffix("").parts))
    source = SourceFile("std/" + rel.as_posix(), path.read_text())
    return Program(parse(source, dotted), [path.resolve().parent])


def std_program() -> Program:
    """Every module of the std library, as one program (what `linnet kernels --std`
    checks)."""
    lines = []
    for dotted in sorted(std_modules()):
        path = STD_ROOT.joinpath(*dotted.split(".")[1:]).with_suffix(".linnet")
        name = "std/" + path.relative_to(STD_ROOT).as_posix()  # as a program's `use` names it
        module = parse_once(name, path.read_text(), dotted)
        names = [
            i.name for i in module.items if not isinstance(i, A.Use) and getattr(i, "public", False)
        ]
        if names:
            lines.append(f"use {dotted}::{{{', '.join(names)}}}\n")
    return Program.from_text("".join(lines), "linnet_std_kernels")


def wrapper_program(program: Program, op: Any, case: KernelCase) -> Program:
    """The op's module with a model appended whose one entry calls the op with the case's
    generics: ``check(x: Tensor[3, 40; f32], ...)`` returning ``op<3, 40, f32>(x, ...)``.
    Appended to the op's own module, so that private ops and kernels are reachable and
    every name means what it means there."""
    module = op.module
    params = []
    args = []
    for p in op.params:
        if p.name in case.params:
            shape, dtype = case.params[p.name]
            params.append(f"{p.name}: Tensor[{', '.join(map(str, shape))}; {dtype}]")
        args.append(p.name)
    configs = "".join(f"    config {n}: {t} = {_default(t)}\n" for n, t in case.scalars.items())
    results = [f"Tensor[{', '.join(map(str, s))}; {d}]" for s, d in case.results]
    result = results[0] if len(results) == 1 else f"({', '.join(results)})"
    # No generics in the case: the call infers them from the arguments' types (a span op
    # confirmed at a graph's own shapes, check/spans.py).
    generics = ", ".join(str(case.generics[g.name]) for g in op.generics) if case.generics else ""
    call = (
        f"{op.name}<{generics}>({', '.join(args)})" if generics else f"{op.name}({', '.join(args)})"
    )
    if len(results) > 1:  # an op of several results: `return f(...)` would be one value
        names = ", ".join(f"result_{i}" for i in range(len(results)))
        body = f"        let ({names}) = {call}\n        return {names}\n"
    else:
        body = f"        return {call}\n"
    text = (
        "\n// Added by linnet kernels.\n"
        f"pub model {MODEL} {{\n{configs}"
        f"    entry {ENTRY}({', '.join(params)}) -> {result} {{\n{body}    }}\n}}\n"
    )
    # Only the model is parsed: the module's own items are reused (parse_appended).
    return Program(parse_appended(module, text), list(program.search))


def _default(dtype: str) -> str:
    return "false" if dtype == "bool" else "0" if dtype.startswith(("i", "u")) else "0.0"


__all__ = [
    "DEFAULT_DTYPES",
    "ENTRY",
    "EXACT",
    "MODEL",
    "TF32",
    "TOLERANCES",
    "KernelCase",
    "binding_name",
    "bound_ops",
    "boundary_sizes",
    "candidate_sizes",
    "check_op_names",
    "checked_program",
    "integer_range",
    "sample_cases",
    "std_program",
    "wrapper_program",
]


# ---------------------------------------------------------------- findings (every runtime)
@dataclass(frozen=True)
class KernelFinding:
    """A kernel that disagrees with its op's body on one case (or could not be checked).

    ``difference`` is the largest ``|kernel - body|`` (``inf`` where the kernel left a NaN
    the body does not have, or nothing could be compared), ``where`` the element it is at;
    ``via`` names the launcher where it is not Triton (``"Pallas"``).
    """

    kernel: str
    op: str
    case: str
    problem: str
    difference: float = float("inf")
    tolerance: float = 0.0
    where: str = ""
    generics: dict[str, int | str] = field(default_factory=dict)
    via: str = ""

    def __str__(self) -> str:
        at = f" at {self.where}" if self.where else ""
        diff = (
            f": largest difference {self.difference:.3g}{at} (tolerance {self.tolerance:.3g})"
            if self.difference != float("inf") and self.problem == "differs"
            else at
        )
        via = f", {self.via}" if self.via else ""
        return f"kernel {self.kernel} (op {self.op}{via}) on {self.case}: {self.problem}{diff}"


@dataclass(frozen=True)
class KernelCheck:
    """One case run both ways: passed, or with its finding."""

    case: KernelCase
    difference: float
    finding: KernelFinding | None = None

    @property
    def passed(self) -> bool:
        return self.finding is None


def finding(
    case: KernelCase,
    problem: str,
    diff: float = float("inf"),
    tol: float = 0.0,
    where: str = "",
    via: str = "",
) -> KernelFinding:
    """The finding of ``case``: its kernel, op, shapes and generics with the ``problem``."""
    return KernelFinding(
        case.kernel, case.op, case.describe(), problem, diff, tol, where, dict(case.generics), via
    )


def position(name: str, idx: list[int]) -> str:
    """``name[i, j]``: where in a result a finding is."""
    return f"{name}[{', '.join(str(i) for i in idx)}]"


def raise_findings(findings: list[KernelFinding]) -> None:
    """``AssertionError`` listing every finding (the ``assert_kernels`` form); none: nothing.

    >>> raise_findings([])
    """
    if findings:
        raise AssertionError(
            f"{len(findings)} kernel finding(s):\n" + "\n".join(f"  {f}" for f in findings)
        )
