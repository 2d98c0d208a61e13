"""The arguments of ``plan_for``, checked before anything is lowered, matched or timed.

Every runtime's ``plan_for`` takes the same planning arguments; a value it cannot use is a
coded error that names the argument and shows a value it takes, never a Python traceback
deep in the planner (``memory="lots"`` compared with a byte count) nor a plan that silently
means something else (``backends="cublaslt"`` taken for eight backends named by its
characters, ``margin=2`` meaning 200%, so that no region is ever taken).

>>> plan_options(margin=0.05).margin
0.05
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from linnet.backends.contract import Options
from linnet.lang.diagnostics.core import coded_error

from .cache import TimingCache

__all__ = ["check_backends", "check_cache", "check_progress", "plan_options"]


def _number(value: Any) -> bool:
    """A real number: an int or a float, not a bool (True is not 1 byte nor a 100% margin)."""
    return not isinstance(value, bool) and isinstance(value, int | float)


def plan_options(
    margin: Any = 0.02,
    measure: Any = True,
    memory: Any = None,
    compile: Any = None,
    captured: Any = True,
    kernels: Any = True,
) -> Options:
    """The :class:`~linnet.backends.Options` of a plan, each argument checked: ``margin`` a
    fraction in [0, 1) (E0772), ``memory`` None or a byte count >= 0 (E0771), ``measure``
    and ``kernels`` True or False (E0774), ``captured`` True or False (E0765). ``compile``
    is the framework's to check (torch: ``linnet.torch.options.compile_options``).

    >>> plan_options(margin=0.05, memory=2**30).memory
    1073741824
    """
    if not _number(margin) or not math.isfinite(margin) or not 0 <= margin < 1:
        if isinstance(margin, str):
            why = "is not a fraction of the generated source's time (a string)"
        elif not _number(margin):
            why = f"is a {type(margin).__name__}, not a fraction of the generated source's time"
        elif not math.isfinite(margin):
            why = "is not a finite number"
        elif margin < 0:
            why = "is negative: backends would take regions slower than the generated source"
        else:
            why = (
                f"is {margin:.0%} of the generated source's time: no region can save that "
                "much, so none would ever be taken"
            )
        raise coded_error(
            "E0772",
            f"margin={margin!r} {why}",
            "margin is the fraction of the generated source's time a backend must "
            "save to take a region, at least 0 and below 1: margin=0.02 for 2% "
            "(the default), margin=0 to take every region that is not slower",
        )
    if memory is not None:
        if not _number(memory) or not math.isfinite(memory) or memory < 0:
            what = (
                f"is a {type(memory).__name__}"
                if not _number(memory)
                else "is not a finite number"
                if not math.isfinite(memory)
                else "is negative"
            )
            raise coded_error(
                "E0771",
                f"memory={memory!r} {what}, not a number of bytes",
                "memory caps the bytes backends' executables hold beyond the model's "
                "weights: memory=8 * 2**30 for 8 GiB, or memory=None (the default) "
                "for no cap",
            )
        memory = int(memory)
    for name, value in (("measure", measure), ("kernels", kernels)):
        if not isinstance(value, bool):
            raise coded_error("E0774", f"{name}={value!r} is not True or False", _FLAG_HELP[name])
    if not isinstance(captured, bool):
        raise coded_error(
            "E0765",
            f"captured={captured!r} is not True or False",
            "captured=True (the default) plans for Captured, a CUDA graph "
            "replayed; captured=False for plan.run, item by item from the host",
        )
    return Options(
        margin=float(margin), measure=measure, memory=memory, compile=compile, captured=captured
    )


_FLAG_HELP = {
    "measure": "measure=True (the default) times each region on its backend and on the "
    "generated source; measure=False takes what backends match without timing",
    "kernels": "kernels=True (the default) makes Linnet's own kernels candidates under "
    "numerics 'fast'; kernels=False leaves them out",
}


def check_backends(backends: Any) -> list[Any] | None:
    """``backends`` as a list (None stays None: every available backend), or error E0773:
    a string or a single object where a list belongs (``backends="cublaslt"``), an entry
    that is no backend object at all (None, a string, a number, a class not called, a
    container), or two entries of one name (timings are kept by backend name and version,
    so two backends of one name would read each other's). An object that is meant as a
    backend but breaks the contract is the planner's to record as skipped, with why.

    >>> check_backends(None) is None
    True
    """
    if backends is None:
        return None
    help_list = (
        "backends is a list of backend objects: backends=[CublasLt()], or "
        "[b for b in linnet.backends.available() if b.name == 'cublaslt'] to pick "
        "installed ones by name; backends=None (the default) takes every available "
        "one, backends=[] none"
    )
    if isinstance(backends, str | bytes):
        raise coded_error(
            "E0773",
            f"backends={backends!r} is a string, not a list of backends "
            "(each of its characters would be taken for a backend)",
            help_list,
        )
    if isinstance(backends, Mapping) or not isinstance(backends, Iterable):
        raise coded_error(
            "E0773",
            f"backends={_short(backends)} is a {type(backends).__name__}, not a list of backends",
            help_list,
        )
    out = list(backends)
    names: dict[str, int] = {}
    for i, b in enumerate(out):
        problem = _not_a_backend(b)
        if problem is not None:
            raise coded_error("E0773", f"backends[{i}] {problem}", help_list)
        for j in range(i):
            if out[j] is b:
                raise coded_error(
                    "E0773", f"backends[{i}] is backends[{j}] again", "give each backend once"
                )
        name = getattr(b, "name", None)
        if isinstance(name, str):
            if name in names:
                raise coded_error(
                    "E0773",
                    f"backends[{names[name]}] and backends[{i}] are both "
                    f"named `{name}`: timings are cached by backend name and version, "
                    "so the second would be given the first one's",
                    "give each backend object a name of its own (its `name` "
                    "attribute), or pass one of them",
                )
            names[name] = i
    return out


# Values no backend is: what a list of names, numbers or nested lists holds.
_NOT_BACKENDS = (str, bytes, bool, int, float, complex, Mapping, list, tuple, set, frozenset)


def _not_a_backend(b: Any) -> str | None:
    """Why ``b`` cannot be meant as a backend object, or None."""
    if isinstance(b, type):
        return f"is the class {b.__name__}, not a backend object: call it ({b.__name__}())"
    if b is None or isinstance(b, _NOT_BACKENDS):
        return f"is {_short(b)} (a {type(b).__name__}), not a backend object"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_progress(progress: Any) -> None:
    """``progress`` is True, False, None or a callable taking a line, else error E0775.

    >>> check_progress(print)
    """
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise coded_error(
        "E0775",
        f"progress={_short(progress)} is not True, False or a callable",
        "progress=True (the default) shows a bar on stderr, progress=False nothing; "
        "progress=lines.append (any callable taking a str) receives each line",
    )


def check_cache(cache: Any) -> None:
    """``cache`` is None or a :class:`~linnet.plan.TimingCache` (or an object with its
    ``get``, ``put`` and ``flush``), else error E0776.

    >>> check_cache(None)
    """
    if (
        cache is None
        or isinstance(cache, TimingCache)
        or all(callable(getattr(cache, m, None)) for m in ("get", "put", "flush"))
    ):
        return
    raise coded_error(
        "E0776",
        f"cache={_short(cache)} is not a linnet.plan.TimingCache",
        "cache=None (the default) uses $LINNET_HOME/benchmarks.json; "
        "cache=TimingCache(Path('benchmarks.json')) names another file",
    )
