"""`linnet run --runtime jax`: the `linnet run` demo and runner on JAX.

`linnet run` is one command whichever runtimes are installed: this module's registration
adds ``--runtime`` to linnet-runtime-torch's `run` when that registered first, or registers
`run` itself (with every option of the torch runtime's, so that ``--runtime torch`` still
works) when it is first or alone. The default runtime is torch where it is installed, else
jax. Importing this module imports neither jax nor torch.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import Diagnostic

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


def demo_checkpoint(model: Path, config: dict, seed: int) -> Path:
    """A deterministic random checkpoint for ``model`` and ``config`` under $LINNET_HOME
    (NumPy's generator: not the torch runtime's demo numbers)."""
    from .home import linnet_home
    from .model import random_weights
    from .weights import save_safetensors

    key = hashlib.sha256(f"jax{model.read_text()}{sorted(config.items())}{seed}".encode())
    path = linnet_home() / "demo" / f"{model.stem}-jax-{key.hexdigest()[:12]}.safetensors"
    if not path.is_file():
        weights = random_weights(model, config, seed=seed)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        save_safetensors(weights, str(tmp))
        tmp.replace(path)
    return path


def default_model() -> Path:
    here = Path.cwd() / "examples" / "llama" / "llama.linnet"
    if here.is_file():
        return here
    import linnet.lang

    shipped = Path(linnet.lang.__file__).parent / "examples" / "llama" / "llama.linnet"
    if shipped.is_file():
        return shipped
    raise LinnetError(Diagnostic(
        "E0740", "no model given and the Llama example was not found",
        help="run from the repository root, or pass a model: `linnet run model.linnet`"))


def run_command(args: argparse.Namespace) -> int:
    """`linnet run --runtime jax`: load, prefill the prompt, decode greedily, with timings."""
    from linnet.lang.cli import load_config
    from linnet.lang.weights.checkpoint import read_json_object
    from linnet.lang.weights.safetensors import resolve_checkpoint

    if args.compile or args.interpret or getattr(args, "nproc", 1) > 1:
        flag = "--compile" if args.compile else "--interpret" if args.interpret else "--nproc"
        raise LinnetError(Diagnostic(
            "E0790", f"`{flag}` is an option of the torch runtime; `--runtime jax` always runs "
            "generated JAX under jax.jit", help=f"drop {flag}, or use `--runtime torch`"))
    sampling = [flag for flag, given in (
        ("--temperature", args.temperature), ("--top-k", args.top_k is not None),
        ("--top-p", args.top_p is not None), ("--sampling-seed", args.sampling_seed is not None),
        ("--stop", args.stop)) if given]
    if sampling:  # the torch runtime's Model.generate samples; here decoding is greedy
        raise LinnetError(Diagnostic(
            "E0790", f"`{sampling[0]}` is an option of the torch runtime's generation; "
            "`--runtime jax` decodes greedily", help=f"drop {sampling[0]}, or use "
                                                     "`--runtime torch`"))
    from linnet.lang.syntax.program import model_file

    model_path = model_file(args.file) if args.file else default_model()
    ckpt_config = resolve_checkpoint(args.weights).config_path if args.weights else None
    own_config = False
    if ckpt_config is not None:
        data, _ = read_json_object(ckpt_config, "E0652", "checkpoint config")
        own_config = "model_type" in data or "architectures" in data
    config_name = args.config or ("toy" if not args.file and not own_config else None)
    config = load_config(config_name, [], str(model_path)) if config_name else {}
    weights = args.weights
    if weights is None:
        print(f"linnet: generating a deterministic checkpoint for {model_path.name} "
              f"({config_name} config, seed {args.seed})", file=sys.stderr)
        weights = demo_checkpoint(model_path, config, args.seed)
    try:
        prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
    except ValueError:
        print("linnet run: --prompt takes comma-separated integers", file=sys.stderr)
        return 2
    if not prompt:
        raise LinnetError(Diagnostic("E0786", "--prompt is empty: prefill needs at least one "
                                     "token", help="e.g. --prompt 1,2,3"))
    if args.tokens < 1:
        raise LinnetError(Diagnostic("E0787", f"--tokens {args.tokens}: decode at least one "
                                     "token", help="e.g. --tokens 16"))
    import numpy as np

    import jax.numpy as jnp

    from .model import load

    start = time.perf_counter()
    model = load(model_path, weights=weights, device=args.device, numerics=args.numerics,
                 config=config)
    print(f"loaded {model_path} on {model.device} (jax) in {time.perf_counter() - start:.2f} s "
          f"(entries: {', '.join(model.entries)})")
    check_length(model, len(prompt), args.tokens)
    start = time.perf_counter()
    logits = model.prefill(jnp.asarray([prompt], dtype=jnp.int32))
    token = int(np.asarray(logits[0, -1]).argmax())
    print(f"prefill {len(prompt)} tokens: {1000 * (time.perf_counter() - start):.1f} ms "
          "(includes lowering and compiling on the first call)")
    pos = len(prompt)
    out = [token]
    times = []
    for i in range(args.tokens - 1):
        start = time.perf_counter()
        step = model.decode(jnp.asarray([token], dtype=jnp.int32),
                            jnp.asarray([pos], dtype=jnp.int32))
        token = int(np.asarray(step[0]).argmax())  # waits for the device
        ms = 1000 * (time.perf_counter() - start)
        times.append(ms)
        out.append(token)
        pos += 1
        print(f"  token {i + 1:3d} at position {pos - 1:4d}: {token:6d}   {ms:8.2f} ms")
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else float("nan")
    print(f"decoded {len(out)} tokens: {out}")
    print(f"per-token decode: median {steady:.2f} ms after the first (first: "
          f"{times[0] if times else float('nan'):.1f} ms, includes lowering and compiling)")
    return 0


def check_length(model: Any, prompt: int, tokens: int) -> None:
    """E0788 before prefill when the decode steps would run past the KV cache (as the torch
    runtime's `linnet run` does)."""
    import numpy as np
    from linnet.lang.ir.bounds import bounds_for

    if "decode" not in model.entries:
        return
    one = np.zeros(1, dtype=np.int32)
    graph = model.graph("decode", [one, one])
    r = next((r for name, r in bounds_for(graph).inputs.items() if name == "%pos"), None)
    last = prompt + tokens - 2
    if r is None or tokens < 2 or last < r.hi:
        return
    raise LinnetError(Diagnostic(
        "E0788", f"a prompt of {prompt} tokens and --tokens {tokens} decode up to position "
        f"{last}, but `decode` takes positions below {r.hi} ({r.upper.describe(graph)})",
        help=f"decode at most --tokens {max(1, r.hi - prompt + 1)} after this prompt, or "
             "give a config with a longer cache (--config)"))
