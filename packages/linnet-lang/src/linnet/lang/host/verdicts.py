"""Kernel checks' verdicts, shared by every runtime's `linnet kernels check` (pure Python but
for NumPy, which only :func:`no_further_than_the_body`'s check imports): a case's one-op
wrapper program and graph (:func:`case_graph`), the findings a comparison makes
(:func:`shape_found`, :func:`nan_found`), 16-bit results held to the exact result
(:func:`exact_case`, :func:`no_further_than_the_body`) and one launch checked
(:func:`check_launch`; a guard's :class:`KernelFault`). Each runtime launches and compares.

>>> shape_found("result", [2], [3])[0][0]
"result has shape [2], the body's [3]"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from linnet.lang.check.driver import lower
from linnet.lang.check.kernel_cases import (
    ENTRY,
    MODEL,
    TOLERANCES,
    KernelCase,
    KernelCheck,
    finding,
    position,
    wrapper_program,
)
from linnet.lang.ir.graph import Graph
from linnet.lang.syntax.program import Program

# A comparison's finding: (problem, difference, tolerance, where), or None.
Found = tuple[str, float, float, str] | None


def case_graph(
    program: Program, op: Any, case: KernelCase, scalar: Callable[[str, str], Any]
) -> tuple[Program, Graph]:
    """The one-op wrapper program of a kernel check's ``case`` and its entry's graph;
    ``scalar(dtype, name)`` gives each scalar parameter's value.

    >>> wrapper, graph = case_graph(program, op, case, scalar)   # doctest: +SKIP
    """
    wrapper = wrapper_program(program, op, case)
    config = {name: scalar(dtype, name) for name, dtype in case.scalars.items()}
    shapes = {name: list(shape) for name, (shape, _) in case.params.items()}
    return wrapper, lower(wrapper, ENTRY, shapes, config, model=MODEL, check=False)


def shape_found(name: str, got: Sequence[int], want: Sequence[int]) -> tuple[Found, float]:
    """A comparison's finding for results of different shapes.

    >>> shape_found("result", [2], [3])[0][0]
    "result has shape [2], the body's [3]"
    """
    return (
        (f"{name} has shape {list(got)}, the body's {list(want)}", float("inf"), 0.0, ""),
        float("inf"),
    )


def nan_found(name: str, count: int, first: Sequence[int]) -> tuple[Found, float]:
    """A comparison's finding for ``count`` NaN elements where the body has numbers.

    >>> nan_found("result", 2, [0, 1])[0][3]
    'result[0, 1]'
    """
    return (
        (
            f"{count} element(s) of the {name} are NaN where the body's are not (lanes the "
            "kernel never stored?), the first",
            float("inf"),
            0.0,
            position(name, list(first)),
        ),
        float("inf"),
    )


# Float types whose body rounds every step to few bits: their results are also held to the
# exact result (the body in f64) where the body's own rounding leaves it far from it.
SHORT_FLOATS = ("bf16", "f16")


def exact_case(case: KernelCase, wide: str = "f64") -> KernelCase | None:
    """``case`` with its 16-bit float tensors and results (and a dtype generic bound to
    such a type) in ``wide`` (f64; JAX without x64: f32, 2^16 times finer than bf16): the
    case whose body gives the (all but) exact result that the body's own 16-bit evaluation
    approximates. None for a case with no 16-bit tensor.

    >>> from linnet.lang.check.kernel_cases import KernelCase
    >>> exact_case(KernelCase("m::f", "m::k", {"T": "bf16"}, {"x": ((3,), "bf16"),
    ...                       "i": ((3,), "i32")}, {}, [((3,), "bf16")])).params
    {'x': ((3,), 'f64'), 'i': ((3,), 'i32')}
    """

    def widen(dtype: Any) -> Any:
        return wide if dtype in SHORT_FLOATS else dtype

    if not any(d in SHORT_FLOATS for _, d in [*case.params.values(), *case.results]):
        return None
    return replace(
        case,
        generics={k: widen(v) for k, v in case.generics.items()},
        params={n: (s, widen(d)) for n, (s, d) in case.params.items()},
        results=[(s, widen(d)) for s, d in case.results],
    )


def no_further_than_the_body(
    compare: Callable[[Any, Any, str, str], tuple[Found, float]],
    want: Sequence[Any],
    exact: Callable[[], Sequence[Any] | None],
    as_f64: Callable[[Any], Any],
) -> Callable[[Any, Any, str, str], tuple[Found, float]]:
    """``compare``, except that a 16-bit result found to differ from the body's (``want``)
    passes where every element is within the tolerance of the exact result (``exact()``: the
    body of :func:`exact_case`, widened, run only the first time a result needs it; None
    where there is none) plus twice the body's largest distance from it. An
    op whose body rounds an intermediate (a product) and then amplifies it (a softmax of
    scores tens of units apart, as random inputs give) has a 16-bit body far from the exact
    result, and a kernel that rounds elsewhere is as far, by other amounts at other elements;
    a kernel that is wrong is farther. ``as_f64`` makes a runtime's tensor a numpy float64
    array.

    >>> checked = no_further_than_the_body(compare, want, run_exact, np.asarray)  # doctest: +SKIP
    """
    made: list[Sequence[Any] | None] = []

    def checked(got: Any, body: Any, dtype: str, name: str) -> tuple[Found, float]:
        # Deferred: linnet-lang is pure Python; only a runtime's check (NumPy there) runs it.
        import numpy as np

        found, diff = compare(got, body, dtype, name)
        k = next((i for i, w in enumerate(want) if w is body), None)
        if found is None or found[0] != "differs" or dtype not in SHORT_FLOATS or k is None:
            return found, diff
        if not made:
            made.append(exact())
        if made[0] is None:
            return found, diff
        g, w, x = as_f64(got), as_f64(body), as_f64(made[0][k])
        rtol, atol = TOLERANCES[dtype]
        finite = np.isfinite(x)
        scale = max(1.0, float(np.abs(x[finite]).max()) if finite.any() else 1.0)
        off = np.abs(w - x)
        worst = float(off[finite].max()) if finite.any() else 0.0
        limit = atol * scale + rtol * np.abs(x) + 2 * worst
        with np.errstate(invalid="ignore"):
            ok = ~finite | (np.abs(g - x) <= limit)
        return (None, diff) if bool(ok.all()) else (found, diff)

    return checked


class KernelFault(Exception):
    """What a guarded kernel launch found wrong while it ran (an access outside every
    tensor of the launch, two programs racing on an element): its message is the finding's
    problem. A runtime's guard raises it before the access it stops.

    >>> str(KernelFault("`store` writes 4 bytes past the end of `y`"))
    '`store` writes 4 bytes past the end of `y`'
    """


def check_launch(
    case: KernelCase,
    want: Sequence[Any],
    launch: Callable[[], tuple[Sequence[Any], int, bool]],
    compare: Callable[[Any, Any, str, str], tuple[Found, float]],
    via: str = "",
) -> KernelCheck:
    """One kernel check: ``launch()`` runs the kernel, returning its results, how many
    launches ran and whether f32 products ran in TF32; each result is compared with the
    body's (``want``) by the runtime's ``compare(got, want, dtype, name)``. A launch that
    raises, or that launches nothing, is a finding (a :class:`KernelFault` says what its
    guard found); ``via`` names the launcher in findings.

    >>> check_launch(case, want, lambda: (outs, 1, False), compare)   # doctest: +SKIP
    KernelCheck(case=..., difference=0.0, finding=None)
    """
    try:
        got, launches, tf32 = launch()
    except KernelFault as exc:
        return KernelCheck(case, float("inf"), finding(case, str(exc), via=via))
    except Exception as exc:  # a kernel that fails to compile or run is a finding
        return KernelCheck(
            case,
            float("inf"),
            finding(
                case,
                f"the launch failed: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                via=via,
            ),
        )
    if launches == 0:
        return KernelCheck(
            case,
            float("inf"),
            finding(case, "the kernel did not launch (the generated code ran the body)", via=via),
        )
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want)):
        name = "result" if len(want) == 1 else f"result {k}"
        dtype = case.results[k][1]
        found, diff = compare(g, w, "tf32" if tf32 and dtype == "f32" else dtype, name)
        worst = max(worst, diff)
        if found is not None:
            problem, diff, tol, where = found
            return KernelCheck(case, diff, finding(case, problem, diff, tol, where, via=via))
    return KernelCheck(case, worst)
