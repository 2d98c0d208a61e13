"""Checking kernels against their ops: what `linnet kernels FILE` runs, for pytest too.

Every op bound to a kernel is run both ways on random cases that its `where` clauses allow
(see :mod:`linnet.lang.check.kernel_cases`): the kernel, launched by the generated PyTorch
under Triton (its interpreter on the CPU, ``TRITON_INTERPRET=1``; for real on CUDA) with its
outputs filled with NaN before the launch, and the op's body, run by the PyTorch interpreter
(the semantic reference). They must agree within the tolerance of the result's element type
(:data:`TOLERANCES`, the one table), or, for a 16-bit result, the kernel's must be within it
of the exact result (the body in f64) plus twice the body's largest distance from it
(:func:`linnet.lang.host.verdicts.no_further_than_the_body`). Anything else is a finding, naming
the kernel, the case and the largest difference.

>>> from linnet.torch.testing import assert_kernels, check_kernels
>>> findings = check_kernels("my_kernels.linnet", count=3, seed=0)   # doctest: +SKIP
>>> assert_kernels("my_kernels.linnet")                              # doctest: +SKIP
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

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
    integer_range,
    position,
    raise_findings,
    scalar_value,
    std_program,
    wrapper_program,
)
from linnet.lang.check.kernel_cases import checked_program as _program
from linnet.lang.check.kernel_runs import run_checks
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.host.verdicts import (
    Found,
    case_graph,
    check_launch,
    exact_case,
    nan_found,
    no_further_than_the_body,
    shape_found,
)

import torch

from .guarded import guarded_launches
from .interpreter import DTYPES, run_graph


def check_kernels(
    source: str | Path | Program,
    *,
    count: int = 3,
    seed: int = 0,
    max_size: int = 48,
    dtypes: tuple[str, ...] = DEFAULT_DTYPES,
    ops: list[str] | None = None,
    device: str | torch.device | None = None,
    on_check: Callable[[KernelCheck], None] | None = None,
    skip: set[str] | None = None,
) -> list[KernelFinding]:
    """Check every bound kernel of ``source`` (a ``.linnet`` file or a checked
    :class:`~linnet.lang.Program`; std kernels are checked when the file uses their
    modules) against its op's body on ``count`` random cases each; returns the findings
    (empty: every kernel agrees).

    ``seed`` makes the cases reproducible; ``max_size`` bounds every dim (the Triton
    interpreter is slow: keep it small); ``dtypes`` are the element types a generic
    ``T: DType`` is drawn from; ``ops`` restricts the check to ops by name (``rms_norm``)
    or qualified name (``std.nn.norm::rms_norm``). ``device`` is where kernels run:
    ``"cpu"`` runs them in Triton's interpreter, ``"cuda"`` for real (default: CUDA when
    available). ``on_check`` is called with each :class:`KernelCheck` as it finishes.
    ``skip`` is a set of qualified op names not to check; the ops checked are added to it
    (so that several files sharing std ops check each once). A device this machine lacks is
    E0710-E0712; a name in ``ops`` that is no bound op is E0793.

    >>> for f in check_kernels("kernels.linnet", count=5, seed=1):   # doctest: +SKIP
    ...     print(f)
    kernel main::row_sum (op main::total) on x: [3, 40] f32 (R=3, C=40): differs: ...
    """
    from .model import resolve_device

    program = _program(source)
    # E0710-E0712 for a device this machine lacks (`tpu`, cuda without a GPU), not a
    # RuntimeError from the first tensor made there.
    dev = resolve_device(
        device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if dev.type != "cuda":
        use_interpreter()
    return run_checks(
        program,
        lambda op, case, s: check_case(program, op, case, s, dev),
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
    program: Program, op: Any, case: KernelCase, seed: int, device: torch.device
) -> KernelCheck:
    """Run one case both ways and compare (see :func:`check_kernels`)."""
    wrapper, graph = case_graph(program, op, case, lambda d, name: _scalar_value(d, seed, name))
    inputs = _inputs(case, seed, device)
    want = run_graph(graph, [t.clone() for t in inputs], {}, {}, device)
    checked = no_further_than_the_body(
        compare, want, lambda: _exact(program, op, case, seed, inputs), _as_f64
    )
    # Every other case runs the grid's programs last to first (Triton's interpreter runs
    # them in order, which hides a kernel that needs one program to run before another).
    reverse = seed % 2 == 1
    return check_launch(
        case, want, lambda: _launch(wrapper, graph, inputs, device, reverse), checked
    )


def _exact(
    program: Program, op: Any, case: KernelCase, seed: int, inputs: list[torch.Tensor]
) -> list[torch.Tensor] | None:
    """The body's results in f64 on the same inputs (its 16-bit tensors widened exactly):
    what its 16-bit evaluation approximates; None for a case with no 16-bit tensor, or a
    body that cannot be lowered in f64."""
    wide = exact_case(case)
    if wide is None:
        return None
    try:
        _, graph = case_graph(program, op, wide, lambda d, name: _scalar_value(d, seed, name))
    except LinnetError:
        return None
    short = (torch.bfloat16, torch.float16)
    return run_graph(
        graph,
        [t.detach().cpu().double() if t.dtype in short else t.cpu() for t in inputs],
        {},
        {},
        torch.device("cpu"),
    )


def _as_f64(t: Any) -> Any:
    return t.detach().cpu().double().numpy()


def compare(
    got: torch.Tensor, want: torch.Tensor, dtype: str, name: str = "result"
) -> tuple[Found, float]:
    """Whether ``got`` (the kernel's) equals ``want`` (the body's) within ``dtype``'s
    tolerance (``"tf32"``: an f32 result of TF32 products): ``(None, largest difference)``
    or ``((problem, difference, tolerance, where), difference)``.

    >>> compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), "f32")[0][:2]
    ('differs', 0.5)
    """
    if tuple(got.shape) != tuple(want.shape):
        return shape_found(name, got.shape, want.shape)
    rtol, atol = TF32 if dtype == "tf32" else TOLERANCES.get(dtype, EXACT)
    g = got.detach().to("cpu", torch.float64)
    w = want.detach().to("cpu", torch.float64)
    stray = torch.isnan(g) & ~torch.isnan(w)
    if bool(stray.any()):
        return nan_found(name, int(stray.sum()), stray.nonzero()[0].tolist())
    both = torch.isnan(g) & torch.isnan(w)
    diff = torch.where(both, torch.zeros_like(g), (g - w).abs())
    diff = torch.where(torch.isinf(g) & (g == w), torch.zeros_like(diff), diff)
    scale = max(
        1.0, float(w[torch.isfinite(w)].abs().max()) if bool(torch.isfinite(w).any()) else 1.0
    )
    limit = atol * scale + rtol * w.abs().nan_to_num(0.0, 0.0, 0.0)
    largest = float(diff.max()) if diff.numel() else 0.0
    over = diff > limit
    if bool(over.any()):
        ratio = torch.where(over, diff, torch.zeros_like(diff))
        flat = int(ratio.argmax())
        idx = list(torch.unravel_index(torch.tensor(flat), tuple(g.shape)))
        pos = position(name, [int(i) for i in idx])
        return (
            ("differs", float(diff.reshape(-1)[flat]), float(limit.reshape(-1)[flat]), pos),
            largest,
        )
    return None, largest


def _scalar_value(dtype: str, seed: int, name: str) -> Any:
    """A scalar parameter's value: a small positive number (an epsilon, a scale)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return scalar_value(dtype, float(torch.rand((), generator=gen)))


def _inputs(case: KernelCase, seed: int, device: torch.device) -> list[torch.Tensor]:
    """Random tensor inputs: normal floats; integers in 0..3 (small enough to index any
    case's axes, which are at least that long only when drawn so: they are checked), but
    8-bit integers over their whole range (quantised weights: :func:`integer_range`)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype in case.params.values():
        dt = DTYPES[dtype]
        if dt.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
        elif dt == torch.bool:
            t = torch.rand(shape, generator=gen) < 0.5
        else:
            lo, hi = integer_range(dtype)
            t = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dt)
        out.append(t.to(device))
    return out


def use_interpreter() -> None:
    """Make sure kernels can run on the CPU, in Triton's interpreter: set
    ``TRITON_INTERPRET=1`` for this process if Triton is not imported yet (it must be set
    before: Triton decorates its own library functions, ``tl.sum`` and the rest, when it is
    imported), or raise E0770 if Triton was imported without it.

    >>> use_interpreter()   # doctest: +SKIP
    """
    import sys

    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language.standard as standard
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        raise LinnetError(
            Diagnostic(
                "E0768",
                "checking kernels needs Triton, which is not installed here",
                help="install it: `pip install 'linnet-runtime-torch[triton]'` (on the CPU, "
                "kernels run in Triton's interpreter)",
            )
        ) from None
    if not isinstance(getattr(standard, "sum", None), InterpretedFunction):
        raise LinnetError(
            Diagnostic(
                "E0770",
                "Triton was imported before TRITON_INTERPRET=1 was set, so kernels "
                "cannot run on the CPU in this process",
                help="set TRITON_INTERPRET=1 in the environment before Python starts "
                "(`TRITON_INTERPRET=1 pytest ...`), or check on CUDA (device='cuda')",
            )
        )


@contextmanager
def triton_interpreter(on: bool) -> Iterator[None]:
    """``TRITON_INTERPRET=1`` while generated source is imported and run (``@triton.jit``
    reads it when it decorates a kernel, and Triton again when it runs one), restored
    afterwards."""
    before = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def _launch(
    wrapper: Program,
    graph: Any,
    inputs: list[torch.Tensor],
    device: torch.device,
    reverse: bool = False,
) -> tuple[list[torch.Tensor], int, bool]:
    """The generated PyTorch of the wrapper's entry under numerics "fast", with kernel
    outputs poisoned with NaN: its results, how many kernels it launched, and whether an
    f32 `tl.dot` ran in TF32 (on CUDA; the interpreter computes in f32). Interpreted, the
    launches run under guarded memory (:mod:`linnet.torch.guarded`: an access outside the
    launch's tensors or a race between programs is a KernelFault), programs in reverse
    order with ``reverse``."""
    from linnet.lang.check.kernel_instances import with_kernels
    from linnet.lang.emit.torch import emit_torch

    from .home import import_source

    sources = {m.source.name: m.source.text for m in wrapper.modules.values()}
    text = emit_torch(
        with_kernels(graph, wrapper),
        sources,
        numerics="fast",
        origin=wrapper.root.source.name,
        device=str(device),
    )
    # Triton reads TRITON_INTERPRET when it decorates a kernel and again when it runs one.
    with triton_interpreter(device.type != "cuda"):
        module = import_source(text, "linnet_kernel_check")
        fn = getattr(module, module.ENTRIES[ENTRY].get("function", ENTRY))
        before = _launch_count(module)
        guard = guarded_launches(reverse) if device.type != "cuda" else nullcontext()
        try:
            with _poisoned(module), torch.inference_mode(), guard:
                outs = fn(*inputs, {}, {})
        except BaseException:
            # A launch stopped part way leaves its counters where they were: the next launch
            # of this module (the same case again) starts from fresh scratch buffers.
            getattr(module, "_SCRATCH", {}).clear()
            raise
    _check_counters(module)
    tf32 = device.type == "cuda" and "input_precision='tf32'" in text
    return list(outs), _launch_count(module) - before, tf32


class CountersLeftSet(RuntimeError):
    """A kernel left an integer scratch buffer (its counters) other than all zeros."""


def _check_counters(module: Any) -> None:
    """The module's kernels kept integer scratch buffers (`atomic_add`'s counters) at 0, as
    the next launch needs them: a kernel that does not set its count back would start the
    next launch from it (no program would see the last count) and return stale results."""
    for (key, name, _), buffer in getattr(module, "_SCRATCH", {}).items():
        if buffer.dtype.is_floating_point or not bool(buffer.any()):
            continue
        left = int(buffer.count_nonzero())
        raise CountersLeftSet(
            f"kernel instance `{key}` left its scratch buffer `{name}` non-zero ({left} of "
            f"{buffer.numel()} elements, largest {int(buffer.abs().max())}): the program "
            f"that sees the last count must set it back (`store({name}[...], 0, last)`), "
            "or the next launch counts on from it"
        )


def _launch_count(module: Any) -> int:
    """Launches so far: ``RUNS`` counts [launched, ran the body] per kernel instance."""
    return sum(int(n[0]) for n in getattr(module, "RUNS", {}).values())


@contextmanager
def _poisoned(module: Any) -> Iterator[None]:
    """Kernel results start as NaN (integers: their smallest value), not torch.empty's
    leftovers, so a lane the kernel never stores cannot pass for a right answer."""
    before = getattr(module, "POISON", False)
    module.POISON = True
    try:
        yield
    finally:
        module.POISON = before


__all__ = [
    "TF32",
    "TOLERANCES",
    "KernelCheck",
    "KernelFinding",
    "assert_kernels",
    "check_case",
    "check_kernels",
    "compare",
    "std_program",
    "triton_interpreter",
    "wrapper_program",
]
