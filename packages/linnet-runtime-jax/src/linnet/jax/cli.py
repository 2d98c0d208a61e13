"""`linnet run --runtime jax`: the `linnet run` demo and runner on JAX.

`linnet run` is one command whichever runtimes are installed: this module's registration
adds ``--runtime`` to linnet-runtime-torch's `run` when that registered first, or registers
`run` itself when it is first (with every option of the torch runtime's, so that ``--runtime
torch`` still works) or alone (with only the options JAX takes). The default runtime is
torch where it is installed, else jax. Importing this module imports neither jax nor torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.util import find_spec
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.cli import quantize_argument
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.host import options, printing
from linnet.lang.host import run as host_run
from linnet.lang.host.run import default_model  # noqa: F401  (re-exported, as before)

RUNTIMES = ("torch", "jax")


def _torch_installed() -> bool:
    return find_spec("linnet.torch") is not None and find_spec("torch") is not None


def register_run(subparsers: Any) -> None:
    """Adds `linnet run` (or its ``--runtime jax``) to the `linnet` CLI."""
    existing = subparsers.choices.get("run")
    if existing is not None:  # linnet-runtime-torch's, registered first
        if not any("--runtime" in a.option_strings for a in existing._actions):
            existing.add_argument(
                "--runtime",
                choices=RUNTIMES,
                default="torch",
                help="the runtime that runs the model (default: torch)",
            )
        torch_run = existing.get_default("run")
        existing.set_defaults(run=lambda args: dispatch(args, torch_run))
        return
    from linnet.lang.cli import add_run_arguments

    torch = _torch_installed()
    default = "torch" if torch else "jax"
    p = subparsers.add_parser("run", help="run a model's prefill and decode (default: demo)")
    # Without linnet-runtime-torch, only the options JAX takes (`--help` lists those);
    # `--runtime torch` stays, to say how to install it (E0790).
    add_run_arguments(p, torch=torch)
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=default,
        help=f"the runtime that runs the model (default here: {default})",
    )
    p.set_defaults(run=lambda args: dispatch(args, None))


def dispatch(args: argparse.Namespace, torch_run: Any) -> int:
    """Run ``args`` on the runtime it names."""
    if args.runtime == "jax":
        return run_command(args)
    if torch_run is None:
        if not _torch_installed():
            raise LinnetError(
                Diagnostic(
                    "E0790",
                    "`--runtime torch` was asked for, but linnet-runtime-torch is not "
                    "installed here",
                    help="install it (`pip install linnet-runtime-torch`), or "
                    "run on JAX: `linnet run --runtime jax`",
                )
            )
        from linnet.torch.cli import run_command as torch_run
    return int(torch_run(args))


def run_command(args: argparse.Namespace) -> int:
    """`linnet run --runtime jax`: load, then generate with ``Model.generate`` (greedy, or
    sampling with ``--temperature``, ``--top-k``, ``--top-p``, ``--sampling-seed``; ``--stop``)
    and time prefill and each decode step, as the torch runtime's `linnet run` does."""
    from linnet.lang.text.cli import (
        apply_demo,
        check_id_run,
        is_text_run,
        resolve_tokens,
        run_text,
    )

    apply_demo(args)  # no model: SmolLM2-135M-Instruct where its wheel is installed
    if is_text_run(args):  # text in, text out: linnet.lang.text.cli, shared by both runtimes
        return run_text(args)
    resolve_tokens(args, text=False)
    check_id_run(args)
    options.check_nproc(getattr(args, "nproc", 1))  # 0, -1, 10**20: E0824 here too
    given = [
        flag
        for flag, value in (
            ("--compile", getattr(args, "compile", False)),
            ("--interpret", getattr(args, "interpret", False)),
            ("--threads", getattr(args, "threads", None) is not None),
            ("--nproc", getattr(args, "nproc", 1) != 1),
            ("--rank-timeout", getattr(args, "rank_timeout", None) is not None),
        )
        if value
    ]
    if given:
        flag = given[0]
        raise LinnetError(
            Diagnostic(
                "E0790",
                f"`{flag}` is an option of the torch runtime; `--runtime jax` always runs "
                "generated JAX under jax.jit, on one device",
                help=f"drop {flag}, or use `--runtime torch`",
            )
        )
    options.check_seed(args.seed, "--seed", optional=False)  # before a checkpoint is made
    # The options first, before a checkpoint is read or made or jax is imported.
    parsed = options.run_tokens(args)
    if parsed is None:
        return 2
    prompt, stop = parsed
    options.check_run_options(args, stop)
    from .model import load, resolve_device

    resolve_device(args.device)  # E0710-E0712 before a demo checkpoint is made for nothing
    # The model, its config and weights: paths, names and --set keys (E0602, E0795-E0797).
    setup = host_run.run_setup(args)
    for note in setup.notes:
        print(note, file=sys.stderr)
    model_path = setup.model
    weights = setup.weights
    if weights is None:
        printing.announce_demo(model_path, setup.config_name, args.seed)
        weights = str(host_run.demo_checkpoint(model_path, setup.config, args.seed))
    start = time.perf_counter()
    model = load(
        model_path,
        weights=weights,
        device=args.device,
        numerics=args.numerics,
        config=setup.config,
        quantize=quantize_argument(getattr(args, "quantize", None)),
    )
    print(
        printing.loaded_line(
            model_path, model.device, time.perf_counter() - start, model.entries, runtime="jax"
        )
    )
    check_length(model, len(prompt), args.tokens)
    if stop is None and model.stop_tokens:
        print(
            f"linnet: stopping at {model.stop_tokens_source} {list(model.stop_tokens)} "
            "(--stop none decodes every --tokens)",
            file=sys.stderr,
        )
    # Model.generate runs prefill, then one decode step per token; each step is timed when
    # its tokens reach the host (on_token), which waits for the device.
    times: list[float] = []
    clock = [time.perf_counter()]

    def on_token(step: int, tokens: list[int]) -> None:
        now = time.perf_counter()
        ms = 1000 * (now - clock[0])
        clock[0] = now
        if step == 0:
            print(printing.prefill_line(len(prompt), ms))
        else:
            times.append(ms)
            print(printing.token_line(step, len(prompt) + step - 1, tokens[0], ms))

    out = model.generate(
        [prompt],
        args.tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.sampling_seed,
        stop_tokens=stop,
        on_token=on_token,
    )[0]
    print("\n".join(printing.summary_lines(out, times, "includes lowering and compiling")))
    return 0


def check_length(model: Any, prompt: int, tokens: int) -> None:
    """E0788 before prefill when the decode steps would run past the KV cache (as the torch
    runtime's `linnet run` does)."""
    import numpy as np

    options.check_length(model, prompt, tokens, np.zeros(1, dtype=np.int32))
