"""The lines `linnet run` prints, the same on every runtime: the demo checkpoint's notice
(stderr), what was loaded where, prefill's time, each decode step and the summary.

>>> prefill_line(3, 12.0)
'prefill 3 tokens: 12.0 ms (includes lowering and compiling on the first call)'
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from linnet.lang.syntax.program import STD_ROOT


def announce_demo(model: Path, config_name: str | None, seed: int) -> None:
    """The line `linnet run` prints on stderr before it makes the demo checkpoint.

    >>> announce_demo(Path("llama.linnet"), "small", 0)  # doctest: +SKIP
    linnet: generating a deterministic checkpoint for llama.linnet (small config, seed 0)
    """
    which = f"{config_name} config" if config_name else "no named config: --set and defaults"
    print(
        f"linnet: generating a deterministic checkpoint for {model.name} ({which}, seed {seed})",
        file=sys.stderr,
    )


def loaded_line(
    model_path: Path,
    device: Any,
    seconds: float,
    entries: Sequence[str],
    runtime: str = "",
    extra: str = "",
) -> str:
    """`linnet run`'s first line: what was loaded where, how fast, and its entries.

    >>> loaded_line(Path("llama.linnet"), "cpu", 0.5, ["prefill", "decode"], runtime="jax")
    'loaded llama.linnet on cpu (jax) in 0.50 s (entries: prefill, decode)'
    >>> from linnet.lang.syntax.program import model_file
    >>> loaded_line(model_file("std.models.qwen2"), "cpu", 0.5, ["prefill"])
    'loaded std.models.qwen2 on cpu in 0.50 s (entries: prefill)'
    """
    on = f" ({runtime})" if runtime else ""
    shown: Path | str = model_path
    if Path(model_path).resolve().is_relative_to(STD_ROOT.resolve()):  # a shipped model
        shown = "std." + ".".join(
            Path(model_path).resolve().relative_to(STD_ROOT.resolve()).with_suffix("").parts
        )
    return (
        f"loaded {shown} on {device}{on} in {seconds:.2f} s (entries: {', '.join(entries)}{extra})"
    )


def prefill_line(tokens: int, ms: float) -> str:
    """The line timing prefill.

    >>> prefill_line(3, 12.0)
    'prefill 3 tokens: 12.0 ms (includes lowering and compiling on the first call)'
    """
    return (
        f"prefill {tokens} tokens: {ms:.1f} ms (includes lowering and compiling on the first call)"
    )


def token_line(step: int, position: int, token: int, ms: float) -> str:
    """The line of one decode step.

    >>> token_line(1, 3, 42, 1.5)
    '  token   1 at position    3:     42       1.50 ms'
    """
    return f"  token {step:3d} at position {position:4d}: {token:6d}   {ms:8.2f} ms"


def summary_lines(out: Sequence[int], times: Sequence[float], first: str) -> list[str]:
    """`linnet run`'s last two lines: the tokens, and the median decode step after the
    first (``first`` says what the first one includes).

    >>> summary_lines([5, 6, 7], [9.0, 1.0, 3.0], "includes lowering")[1]
    'per-token decode: median 3.00 ms after the first (first: 9.0 ms, includes lowering)'
    """
    rest = sorted(times[1:])
    steady = rest[len(rest) // 2] if len(times) > 1 else float("nan")
    return [
        f"decoded {len(out)} tokens: {list(out)}",
        f"per-token decode: median {steady:.2f} ms after the first (first: "
        f"{times[0] if times else float('nan'):.1f} ms, {first})",
    ]
