"""`linnet run --runtime jax`: the `linnet run` demo and runner on JAX.

`linnet run` is one command whichever runtimes are installed: this module's registration
adds ``--runtime`` to linnet-runtime-torch's `run` when that registered first, or registers
`run` itself (with every option of the torch runtime's, so that ``--runtime torch`` still
works) when it is first or alone. The default runtime is torch where it is installed, else
jax. Importing this module imports neither jax nor torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.util import find_spec
from typing import Any

from linnet.lang import LinnetError, hosting
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.hosting import default_model  # noqa: F401  (re-exported, as before)

RUNTIMES = ("torch", "jax")


def _torch_installed() -> bool:
    return find_spec("linnet.torch") is not None and find_spec("torch") is not None


def register_run(subparsers: Any) -> None:
    """Adds `linnet run` (or its ``--runtime jax``) to the `linnet` CLI."""
    existing = subparsers.choices.get("run")
    if existing is not None:  # linnet-runtime-torch's, registered first
        if not any("--runtime" in a.option_strings for a in existing._actions):
            existing.add_argument("--runtime", choices=RUNTIMES, default="torch",
                                  help="the runtime that runs the model (default: torch)")
        torch_run = existing.get_default("run")
        existing.set_defaults(run=lambda args: dispatch(args, torch_run))
        return
    from linnet.lang.cli import add_run_arguments

    default = "torch" if _torch_installed() else "jax"
    p = subparsers.add_parser("run", help="run a model's prefill and decode (default: demo)")
    add_run_arguments(p)
    p.add_argument("--runtime", choices=RUNTIMES, default=default,
                   help=f"the runtime that runs the model (default here: {default})")
    p.set_defaults(run=lambda args: dispatch(args, None))


def dispatch(args: argparse.Namespace, torch_run: Any) -> int:
    """Run ``args`` on the runtime it names."""
    if args.runtime == "jax":
        return run_command(args)
    if torch_run is None:
        if not _torch_installed():
            raise LinnetError(Diagnostic(
                "E0790", "`--runtime torch` was asked for, but linnet-runtime-torch is not "
                "installed here", help="install it (`pip install linnet-runtime-torch`), or "
                                       "run on JAX: `linnet run --runtime jax`"))
        from linnet.torch.cli import run_command as torch_run
    return int(torch_run(args))


def run_command(args: argparse.Namespace) -> int:
    """`linnet run --runtime jax`: load, prefill the prompt, decode greedily, with timings."""
    hosting.check_nproc(getattr(args, "nproc", 1))  # 0, -1, 10**20: E0824 here too
    threads = getattr(args, "threads", None) is not None
    if args.compile or args.interpret or getattr(args, "nproc", 1) > 1 or threads:
        flag = "--compile" if args.compile else "--interpret" if args.interpret else \
            "--threads" if threads else "--nproc"
        raise LinnetError(Diagnostic(
            "E0790", f"`{flag}` is an option of the torch runtime; `--runtime jax` always runs "
            "generated JAX under jax.jit", help=f"drop {flag}, or use `--runtime torch`"))
    sampling = [flag for flag, given in (
        ("--temperature", args.temperature), ("--top-k", args.top_k is not None),
        ("--top-p", args.top_p is not None), ("--sampling-seed", args.sampling_seed is not None)
    ) if given]
    if sampling:  # the torch runtime's Model.generate samples; here decoding is greedy
        raise LinnetError(Diagnostic(
            "E0790", f"`{sampling[0]}` is an option of the torch runtime's generation; "
            "`--runtime jax` decodes greedily", help=f"drop {sampling[0]}, or use "
                                                     "`--runtime torch`"))
    hosting.check_seed(args.seed, "--seed", optional=False)  # before a checkpoint is made
    parsed = hosting.run_tokens(args)
    if parsed is None:
        return 2
    prompt, stop = parsed
    hosting.check_run_options(args, stop)
    # The model, its config and weights: paths, names and --set keys (E0602, E0795-E0797).
    setup = hosting.run_config(args)
    for note in setup.notes:
        print(note, file=sys.stderr)
    model_path = setup.model
    weights = setup.weights
    if weights is None:
        hosting.announce_demo(model_path, setup.config_name, args.seed)
        weights = str(hosting.demo_checkpoint(model_path, setup.config, args.seed))
    import numpy as np

    import jax.numpy as jnp

    from .model import load

    start = time.perf_counter()
    model = load(model_path, weights=weights, device=args.device, numerics=args.numerics,
                 config=setup.config)
    print(hosting.loaded_line(model_path, model.device, time.perf_counter() - start,
                              model.entries, runtime="jax"))
    check_length(model, len(prompt), args.tokens)
    check_stops(model, stop)
    start = time.perf_counter()
    logits = model.prefill(jnp.asarray([prompt], dtype=jnp.int32))
    token = int(np.asarray(logits[0, -1]).argmax())
    print(hosting.prefill_line(len(prompt), 1000 * (time.perf_counter() - start)))
    pos = len(prompt)
    out = [token]
    times = []
    # --stop, else the checkpoint's end-of-sequence tokens (as the torch runtime's generate)
    stops = set(model.stop_tokens if stop is None else stop)
    if stop is None and stops:
        print(f"linnet: stopping at {model.stop_tokens_source} {list(model.stop_tokens)} "
              "(--stop none decodes every --tokens)", file=sys.stderr)
    for i in range(args.tokens - 1):
        if token in stops:
            break
        start = time.perf_counter()
        step = model.decode(jnp.asarray([token], dtype=jnp.int32),
                            jnp.asarray([pos], dtype=jnp.int32))
        token = int(np.asarray(step[0]).argmax())  # waits for the device
        ms = 1000 * (time.perf_counter() - start)
        times.append(ms)
        out.append(token)
        pos += 1
        print(hosting.token_line(i + 1, pos - 1, token, ms))
    print("\n".join(hosting.summary_lines(out, times, "includes lowering and compiling")))
    return 0


def check_length(model: Any, prompt: int, tokens: int) -> None:
    """E0788 before prefill when the decode steps would run past the KV cache (as the torch
    runtime's `linnet run` does)."""
    import numpy as np

    hosting.check_length(model, prompt, tokens, np.zeros(1, dtype=np.int32))


def check_stops(model: Any, stops: list[int] | None) -> None:
    """E0819 before prefill for a ``--stop`` id past the model's vocabulary (the last axis of
    its decode logits), as the torch runtime's generate refuses it."""
    import numpy as np

    if not stops or "decode" not in model.entries:
        return
    one = np.zeros(1, dtype=np.int32)
    graph = model.graph("decode", [one, one])
    shape = graph.values[graph.outputs[0]].shape
    vocabulary = shape[-1] if shape and isinstance(shape[-1], int) else None
    for token in stops:
        if vocabulary is not None and token >= vocabulary:
            raise hosting.stop_token_error(token, vocabulary, "--stop")
