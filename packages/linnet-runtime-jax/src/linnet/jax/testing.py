"""Checking kernels against their ops through Pallas: `linnet kernels --runtime jax FILE`,
for pytest too.

Every op bound to a kernel is run both ways on random cases that its `where` clauses allow
(linnet-lang's :mod:`linnet.lang.check.kernel_cases`, the sampler `linnet kernels` uses for
Triton too): the kernel, launched by generated JAX through ``pl.pallas_call`` (Pallas's
interpreter on the CPU, for real on a GPU) with its results starting as NaN (the
``pallas_call`` aliases NaN-filled buffers to them), and the op's body (generated JAX under
numerics "exact", which launches nothing). They must agree within the tolerance of the
result's element type (``kernel_cases.TOLERANCES``, the table the Triton check uses).

>>> from linnet.jax.testing import assert_kernels, check_kernels
>>> findings = check_kernels("my_kernels.linnet", count=3, seed=0)   # doctest: +SKIP
>>> assert_kernels("my_kernels.linnet")                              # doctest: +SKIP
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from linnet.lang import LinnetError, Program
from linnet.lang.check.kernel_cases import (
    DEFAULT_DTYPES,
    ENTRY,
    EXACT,
    TF32,
    TOLERANCES,
    KernelCase,
    KernelCheck,
    KernelFinding,
    bound_ops,
    checked_program,
    integer_range,
    position,
    raise_findings,
    scalar_value,
    std_program,
)
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.kernel_runs import run_checks
from linnet.lang.host.verdicts import (
    Found,
    case_graph,
    check_launch,
    exact_case,
    nan_found,
    no_further_than_the_body,
    shape_found,
)


def unlaunchable(program: Program) -> dict[str, str]:
    """The bound ops of ``program`` whose kernels generated JAX never launches, with why: a
    kernel that declares scratch buffers (Pallas cannot keep one between launches; the op's
    body runs instead).

    >>> from linnet.lang.check.kernel_cases import std_program
    >>> sorted(unlaunchable(std_program()))
    ['std.nn.decode::decode_attention_split_once']
    """
    out = {}
    for op in bound_ops(program):
        assert op.module is not None
        binding = op.kernel
        while binding is not None:
            kernel = op.module.find(binding.name)
            if getattr(kernel, "scratch", None):
                out[op.qualified_name] = (
                    f"its kernel `{binding.name}` keeps scratch buffers, "
                    "which Pallas cannot: generated JAX runs the op's body"
                )
            binding = binding.then
    return out


def check_kernels(
    source: str | Path | Program,
    *,
    count: int = 3,
    seed: int = 0,
    max_size: int = 48,
    dtypes: tuple[str, ...] = DEFAULT_DTYPES,
    ops: list[str] | None = None,
    interpret: bool | None = None,
    on_check: Callable[[KernelCheck], None] | None = None,
    skip: set[str] | None = None,
    on_skip: Callable[[str, str], None] | None = None,
) -> list[KernelFinding]:
    """Check every bound kernel of ``source`` (a ``.linnet`` file or a checked Program; the
    std kernels it uses too) through Pallas against its op's body on ``count`` random cases
    each; returns the findings (empty: every kernel agrees). ``interpret``: run kernels in
    Pallas's interpreter (default: unless jax's default backend is a GPU). Ops whose kernels
    generated JAX never launches (:func:`unlaunchable`) are not run: ``on_skip(op, why)``
    hears of each. The other options are ``linnet.torch.testing.check_kernels``'s.

    >>> for f in check_kernels("kernels.linnet", count=5, seed=1):   # doctest: +SKIP
    ...     print(f)
    """
    import jax

    program = checked_program(source)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    skip = skip if skip is not None else set()
    for name, why in unlaunchable(program).items():
        if name not in skip and (ops is None or name in ops or name.rsplit("::", 1)[-1] in ops):
            skip.add(name)
            if on_skip is not None:
                on_skip(name, why)
    return run_checks(
        program,
        lambda op, case, s: check_case(program, op, case, s, interpret),
        count=count,
        seed=seed,
        max_size=max_size,
        dtypes=dtypes,
        ops=ops,
        on_check=on_check,
        skip=skip,
    )


def assert_kernels(source: str | Path | Program, **options: Any) -> None:
    """:func:`check_kernels`, raising ``AssertionError`` that lists every finding.

    >>> def test_my_kernels():                       # doctest: +SKIP
    ...     assert_kernels("kernels.linnet", count=4)
    """
    raise_findings(check_kernels(source, **options))


def check_case(
    program: Program, op: Any, case: KernelCase, seed: int, interpret: bool
) -> KernelCheck:
    """Run one case both ways and compare (see :func:`check_kernels`)."""
    from linnet.lang.emit.jax import emit_jax

    from .home import import_source

    wrapper, graph = case_graph(program, op, case, lambda d, name: _scalar_value(d, seed, name))
    sources = {m.source.name: m.source.text for m in wrapper.modules.values()}
    inputs = _inputs(case, seed)
    body = import_source(emit_jax(graph, sources, numerics="exact"), "linnet_kernel_body")
    want = _entry(body)(*inputs, {}, {})[0]
    text = emit_jax(with_kernels(graph, wrapper), sources, numerics="fast")

    def launch() -> tuple[Any, int, bool]:
        fast = import_source(text, "linnet_kernel_check")
        runs = getattr(fast, "RUNS", {})
        before = sum(n for n, _ in runs.values())
        # Read when a launch runs; the module may be one imported before, under another setting.
        fast.INTERPRET = interpret  # type: ignore[attr-defined]
        with _poisoned(fast):
            got = _entry(fast)(*inputs, {}, {})[0]
        launches = sum(n for n, _ in runs.values()) - before
        return got, launches, not interpret and "jnp.dot(" in text

    checked = no_further_than_the_body(
        compare,
        want,
        lambda: _exact(program, op, case, seed, inputs),
        lambda a: np.asarray(a).astype(np.float64),
    )
    return check_launch(case, want, launch, checked, via="Pallas")


def _exact(
    program: Program, op: Any, case: KernelCase, seed: int, inputs: list[Any]
) -> list[Any] | None:
    """The body's results in f32 (JAX runs without x64) on the same inputs, its 16-bit
    tensors widened exactly: what its 16-bit evaluation approximates; None for a case with no
    16-bit tensor, or a body that cannot be lowered so."""
    from linnet.lang.emit.jax import emit_jax

    import jax.numpy as jnp

    from .home import import_source

    wide = exact_case(case, "f32")
    if wide is None:
        return None
    try:
        wrapper, graph = case_graph(program, op, wide, lambda d, name: _scalar_value(d, seed, name))
    except LinnetError:
        return None
    sources = {m.source.name: m.source.text for m in wrapper.modules.values()}
    body = import_source(emit_jax(graph, sources, numerics="exact"), "linnet_kernel_exact")
    short = (jnp.bfloat16, jnp.float16)
    return _entry(body)(
        *[x.astype(jnp.float32) if x.dtype in short else x for x in inputs], {}, {}
    )[0]


def compare(got: Any, want: Any, dtype: str, name: str = "result") -> tuple[Found, float]:
    """Whether ``got`` (the kernel's) equals ``want`` (the body's) within ``dtype``'s
    tolerance: ``(None, largest difference)`` or ``((problem, difference, tolerance,
    where), difference)`` (``linnet.torch.testing.compare`` on arrays).

    >>> compare(np.array([1.0, 2.0]), np.array([1.0, 2.5]), "f32")[0][:2]
    ('differs', 0.5)
    """
    g = np.asarray(got).astype(np.float64)
    w = np.asarray(want).astype(np.float64)
    if g.shape != w.shape:
        return shape_found(name, g.shape, w.shape)
    rtol, atol = TF32 if dtype == "tf32" else TOLERANCES.get(dtype, EXACT)
    stray = np.isnan(g) & ~np.isnan(w)
    if stray.any():
        return nan_found(name, int(stray.sum()), [int(i) for i in np.argwhere(stray)[0]])
    diff = np.where(np.isnan(g) & np.isnan(w), 0.0, np.abs(g - w))
    diff = np.where(np.isinf(g) & (g == w), 0.0, diff)
    finite = w[np.isfinite(w)]
    scale = max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    limit = atol * scale + rtol * np.nan_to_num(np.abs(w), nan=0.0, posinf=0.0, neginf=0.0)
    largest = float(diff.max()) if diff.size else 0.0
    over = diff > limit
    if over.any():
        flat = int(np.argmax(np.where(over, diff, 0.0)))
        idx = [int(i) for i in np.unravel_index(flat, g.shape)]
        return (
            (
                "differs",
                float(diff.reshape(-1)[flat]),
                float(limit.reshape(-1)[flat]),
                position(name, idx),
            ),
            largest,
        )
    return None, largest


def _entry(module: Any) -> Any:
    return getattr(module, module.ENTRIES[ENTRY].get("function", ENTRY))


def _scalar_value(dtype: str, seed: int, name: str) -> Any:
    """A scalar parameter's value: a small positive number (an epsilon, a scale)."""
    return scalar_value(
        dtype, float(np.random.default_rng(zlib.crc32(f"{seed}/{name}".encode())).random())
    )


def _inputs(case: KernelCase, seed: int) -> list[Any]:
    """Random inputs: normal floats; integers in 0..3, 8-bit ones over their whole range
    (quantised weights: :func:`~linnet.lang.check.kernel_cases.integer_range`); bools."""
    import jax.numpy as jnp

    from .weights import numpy_dtype

    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in case.params.values():
        x: np.ndarray
        if dtype.startswith(("f", "bf")):
            x = rng.standard_normal(shape).astype(np.float32)
        elif dtype == "bool":
            x = rng.random(shape) < 0.5
        else:
            x = rng.integers(*integer_range(dtype), shape)
        out.append(jnp.asarray(x, dtype=numpy_dtype(dtype)))
    return out


class _PoisonedPallas:
    """``jax.experimental.pallas`` whose ``pallas_call`` starts each result as NaN (integers:
    their smallest value), aliased to the results, so a lane the kernel never stores shows;
    everything else is Pallas's own."""

    def __init__(self, pl: Any) -> None:
        self._pl = pl

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pl, name)

    def pallas_call(self, kernel: Any, out_shape: Any, **options: Any) -> Any:
        import jax.numpy as jnp

        many = isinstance(out_shape, tuple | list)
        outs = list(out_shape) if many else [out_shape]

        def call(*args: Any) -> Any:
            n = len(args)
            fills = [
                jnp.full(
                    o.shape,
                    jnp.nan
                    if jnp.issubdtype(o.dtype, jnp.floating)
                    else jnp.iinfo(o.dtype).min
                    if jnp.issubdtype(o.dtype, jnp.integer)
                    else False,
                    o.dtype,
                )
                for o in outs
            ]

            def poisoned(*refs: Any) -> None:  # the NaN buffers' own refs are read by no one
                kernel(*refs[:n], *refs[n + len(outs) :])

            return self._pl.pallas_call(
                poisoned,
                out_shape=out_shape,
                input_output_aliases={n + i: i for i in range(len(outs))},
                **options,
            )(*args, *fills)

        return call


@contextmanager
def _poisoned(module: Any) -> Iterator[None]:
    before = module.pl
    module.pl = _PoisonedPallas(before)
    try:
        yield
    finally:
        module.pl = before


__all__ = [
    "KernelCheck",
    "KernelFinding",
    "assert_kernels",
    "check_case",
    "check_kernels",
    "compare",
    "std_program",
]
