"""What `compile=` and `numerics=` mean for the torch runtime, shared by the model
(model.py) and its plans (planned.py), so that neither imports the other to get them.

>>> compile_options("max-autotune-no-cudagraphs")
{'mode': 'max-autotune-no-cudagraphs'}
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from linnet.lang.diagnostics.core import coded_error

import torch

from .home import caching_off, compile_cache_counts, shown, use_compile_caches

# `compile=` strings that are torch.compile modes (of inductor); any other string is a backend.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_options(compile: Any) -> dict[str, Any] | None:
    """The ``torch.compile`` keywords that ``compile=`` stands for, or None for no compile.

    ``True`` is inductor's default; a string is a torch.compile mode (one of
    ``COMPILE_MODES``) or else a backend name; a dict is inductor's options, as
    ``torch.compile(options=...)`` takes them (a mode and options cannot be combined, so
    spell the mode's settings out: ``{"max_autotune": True, "benchmark_fusion": True}``).
    Each value is checked the first time it is seen, as torch.compile would check it at the
    first call: a backend torch._dynamo does not know (``"no-such-backend"``; custom ones
    registered with ``torch._dynamo.register_backend`` are known) or an inductor option it
    does not have is error E0714 here, before anything is loaded, lowered or timed.
    Asking to compile also points torch.compile's caches under ``$LINNET_HOME/cache``
    (see :func:`linnet.torch.home.use_compile_caches`), before torch.compile first runs.

    >>> compile_options("max-autotune-no-cudagraphs")
    {'mode': 'max-autotune-no-cudagraphs'}
    >>> compile_options({"max_autotune": True})
    {'options': {'max_autotune': True}}
    >>> compile_options(False) is None
    True
    """
    if compile is None or compile is False:
        return None
    if compile is True:
        use_compile_caches()
        return {"backend": "inductor"}
    if isinstance(compile, str) and compile:
        options: dict[str, Any] = (
            {"mode": compile} if compile in COMPILE_MODES else {"backend": compile}
        )
    elif isinstance(compile, dict) and all(isinstance(k, str) for k in compile):
        options = {"options": dict(compile)}
    else:
        raise coded_error(
            "E0714",
            f"compile must be True, a torch.compile mode or backend name, or "
            f"a dict of inductor options, not {compile!r}",
            help="e.g. compile='max-autotune-no-cudagraphs', or compile="
            "{'max_autotune': True, 'benchmark_fusion': True}",
        )
    use_compile_caches()
    _check_compile(options)
    return options


_COMPILE_CHECKED: set[str] = set()


def _check_compile(options: dict[str, Any]) -> None:
    """Let torch.compile judge ``options`` now (it builds its backend, which looks the name
    up and applies inductor's options, without compiling anything), once per value."""
    key = json.dumps(options, sort_keys=True, default=repr)
    if key in _COMPILE_CHECKED:
        return
    try:
        torch.compile(_nothing, dynamic=False, **options)
    except Exception as exc:  # InvalidBackend, or RuntimeError for an unknown option
        # torch's own sentence, without the hundreds of option names it lists after it.
        message = str(exc).split("\n")[0].split(", known options are")[0]
        if "backend" in options:
            try:
                from torch import _dynamo

                known = ", ".join(
                    sorted({*_dynamo.list_backends(), "inductor", "aot_eager", "eager"})
                )
            except Exception:
                known = "inductor, aot_eager, eager"
            raise coded_error(
                "E0714",
                f"compile={options['backend']!r} is not a torch.compile mode "
                f"or a backend torch knows: {message}",
                help=f"modes: {', '.join(COMPILE_MODES)}; backends: {known}",
            ) from None
        if "mode" in options:
            raise coded_error(
                "E0714",
                f"compile={options['mode']!r}: {message}",
                help=f"modes: {', '.join(COMPILE_MODES)}",
            ) from None
        raise coded_error(
            "E0714",
            f"compile={options['options']!r}: inductor does not take these options: {message}",
            help="the keys are torch._inductor.config's names, e.g. {'max_autotune': True}",
        ) from None
    _COMPILE_CHECKED.add(key)


def _nothing() -> None:
    return None


def compile_label(compile: Any) -> str:
    """A stable text for ``compile=`` (timing-cache keys): 'eager' when not compiling.

    >>> compile_label({"max_autotune": True, "benchmark_fusion": True})
    'options{"benchmark_fusion": true, "max_autotune": true}'
    """
    options = compile_options(compile)
    if options is None:
        return "eager"
    if "options" in options:
        return "options" + json.dumps(options["options"], sort_keys=True, default=repr)
    return str(compile)


@contextlib.contextmanager
def numerics_mode(numerics: str) -> Iterator[None]:
    """exact: f32 accumulation, no TF32, no reduced-precision reductions; fast: allow them."""
    fast = numerics == "fast"
    cuda = torch.backends.cuda.matmul
    saved = (
        cuda.allow_tf32,
        cuda.allow_bf16_reduced_precision_reduction,
        cuda.allow_fp16_reduced_precision_reduction,
        torch.backends.cudnn.allow_tf32,
    )
    cuda.allow_tf32 = fast
    cuda.allow_bf16_reduced_precision_reduction = fast
    cuda.allow_fp16_reduced_precision_reduction = fast
    torch.backends.cudnn.allow_tf32 = fast
    try:
        yield
    finally:
        (
            cuda.allow_tf32,
            cuda.allow_bf16_reduced_precision_reduction,
            cuda.allow_fp16_reduced_precision_reduction,
            torch.backends.cudnn.allow_tf32,
        ) = saved


def announce_compile(
    compiled: Callable, name: str, kind: str, say: Callable[[str], None]
) -> Callable:
    """``compiled`` (a torch.compile'd slice), reporting through ``say`` when its first call
    starts compiling and how long that took (max-autotune takes minutes: say so), or that
    torch.compile reused what an earlier process compiled and tuned (its FX graph and
    AOTAutograd caches, under ``$LINNET_HOME/cache/inductor``).

    >>> f = announce_compile(lambda x: x + 1, "slice_0", "ab12cd34ef", print)
    >>> f(1)
    compiling slice_0 (kind ab12cd34)...
    compiled slice_0 in 0.0 s
    2
    """
    state = {"first": True}

    def call(*args: Any) -> Any:
        if not state["first"]:
            return compiled(*args)
        state["first"] = False
        say(f"compiling {name} (kind {kind[:8]})...")
        here = kind in _COMPILED_HERE
        hits, misses = compile_cache_counts()
        start = time.perf_counter()
        out = compiled(*args)
        seconds = time.perf_counter() - start
        hits, misses = (a - b for a, b in zip(compile_cache_counts(), (hits, misses)))
        _COMPILED_HERE.add(kind)
        say(reuse_line(name, seconds, hits, misses, here))
        return out

    return call


#: The kinds of slice this process has compiled: a plan compiles a slice its timing in
#: context compiled already, which torch.compile's cache then answers from this process.
_COMPILED_HERE: set[str] = set()


def reuse_line(name: str, seconds: float, hits: int, misses: int, here: bool = False) -> str:
    """The line a slice's first call ends with: reused from the cache (every graph of it
    loaded, none compiled) or compiled (with how many graphs were reused, if some were).
    ``here``: a slice of this kind was compiled earlier in this process (timed in context
    while planning), so a cache hit is this process's own work, not an earlier process's.

    >>> reuse_line("slice_0", 0.4, 2, 0)  # doctest: +ELLIPSIS
    'reused slice_0 from ... in 0.4 s (compiled and tuned by an earlier process)'
    >>> reuse_line("slice_0", 12.0, 0, 1)
    'compiled slice_0 in 12.0 s'
    """
    where = shown(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "torch.compile's cache")
    if hits and not misses and here:
        return f"compiled {name} in {seconds:.1f} s (as earlier in this process, from {where})"
    if hits and not misses:
        return (
            f"reused {name} from {where} in {seconds:.1f} s (compiled and tuned by an "
            "earlier process)"
        )
    line = f"compiled {name} in {seconds:.1f} s"
    if hits:
        line += f" ({hits} graph(s) reused from {where})"
    if misses:
        off = caching_off()
        if off:
            line += f"; not saved for the next process: {off}"
    return line
