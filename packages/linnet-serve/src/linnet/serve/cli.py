"""`linnet serve MODEL_OR_DIR`: the OpenAI-compatible server (the ``linnet.commands`` entry
point). Registering imports nothing heavy: torch, starlette and uvicorn are imported when
the command runs.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> register_serve(sub); sub.choices["serve"].parse_args(["m.gguf", "--port", "9000"]).port
9000
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .errors import option_error
from .runner import checked_buckets


def register_serve(subparsers: Any) -> None:
    """Adds `linnet serve` to the `linnet` CLI."""
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (paged KV cache, "
        "continuous batching)",
    )
    p.add_argument(
        "file",
        nargs="?",
        metavar="MODEL_OR_DIR",
        help="a GGUF file, a checkpoint directory, a .linnet file or a shipped model "
        "(default: the demo, SmolLM2-135M-Instruct)",
    )
    p.add_argument("--weights", help="the weights of a .linnet model or shipped model")
    p.add_argument("--config", help="a config of the model (a name or a JSON file)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config value, e.g. --set S=2048 (the longest sequence served)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--name", help="the model's name in the API (default: the file's name)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--max-batch", type=int, default=32, help="most requests decoding at once (32)")
    p.add_argument(
        "--batch-buckets",
        type=_sizes,
        help="batch sizes decode steps are padded to, each planned once, e.g. 8,16,32 "
        "(default: powers of two up to --max-batch)",
    )
    p.add_argument("--kv-pages", type=int, default=512, help="KV pages in the pool (512)")
    p.add_argument("--page-size", type=int, default=16, help="positions a KV page holds (16)")
    p.add_argument(
        "--token-budget", type=int, default=512, help="prefill tokens a step (chunked prefill; 512)"
    )
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting at most (256)")
    p.add_argument("--tokenizer", help="the tokenizer (default: the one beside the weights)")
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="start listening before every batch size's decode step is planned (on a GPU "
        "the first step of each size then plans while its requests wait)",
    )
    p.set_defaults(run=serve_command)


def _sizes(text: str) -> list[int]:
    """``--batch-buckets``' value: comma-separated ints (checked by the runner, E0862).

    >>> _sizes("8,16, 32")
    [8, 16, 32]
    """
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not comma-separated ints, e.g. 8,16,32"
        ) from None


def check_args(args: argparse.Namespace) -> None:
    """E0862 for a server option out of range, before anything is loaded.

    >>> check_args(argparse.Namespace(port=0, max_batch=1, kv_pages=2, page_size=1,
    ...                               token_budget=1, max_queue=1))
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0862]: --port must be a port in 1..65535, not 0
      = help: e.g. --port 8000
    """
    if not 0 < args.port < 65536:
        raise option_error("--port", args.port, "a port in 1..65535", "--port 8000")
    for flag, value, least in (
        ("--max-batch", args.max_batch, 1),
        ("--kv-pages", args.kv_pages, 2),
        ("--page-size", args.page_size, 1),
        ("--token-budget", args.token_budget, 1),
        ("--max-queue", args.max_queue, 1),
    ):
        if value < least:
            raise option_error(flag, value, f"at least {least}", f"{flag} {max(least, 16)}")
    if getattr(args, "batch_buckets", None) is not None:  # before the model is loaded
        checked_buckets(args.batch_buckets, args.max_batch)


def serve_command(args: argparse.Namespace) -> int:
    from linnet.lang.diagnostics.core import LinnetError
    from linnet.lang.host import run as host_run
    from linnet.lang.text.cli import DEMO_CONTEXT
    from linnet.lang.text.tokenizer import load_tokenizer

    try:
        check_args(args)
        if args.file is None and args.weights is None:
            from linnet.lang.host.demo_model import smollm2_gguf

            args.file = str(smollm2_gguf())
            args.set = [f"S={DEMO_CONTEXT}", *args.set]
        setup = host_run.run_setup(args)
        for note in setup.notes:
            print(note, file=sys.stderr)
        from .engine import Engine
        from .server import serve

        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
        weights = setup.weights
        if weights is None:  # a model without weights: the demo's random checkpoint
            weights = str(host_run.demo_checkpoint(setup.model, setup.config, 0))
        engine = Engine.load(
            setup.model,
            weights=weights,
            config=setup.config,
            kv_pages=args.kv_pages,
            page_size=args.page_size,
            max_batch=args.max_batch,
            batch_buckets=getattr(args, "batch_buckets", None),
            token_budget=args.token_budget,
            max_queue=args.max_queue,
            device=args.device,
            tokenizer=tokenizer,
            name=args.name or _name(args),
        )
        if getattr(args, "warm", True):
            engine.warm(lambda line: print(f"linnet: {line}", file=sys.stderr, flush=True))
    except LinnetError as e:
        print(e, file=sys.stderr)
        return 1
    stats = engine.stats()
    print(
        f"linnet: serving {engine.name} on http://{args.host}:{args.port}/v1 "
        f"({stats['pages_total']} KV pages of {stats['page_size']} positions, "
        f"up to {args.max_batch} requests a step)",
        file=sys.stderr,
    )
    serve(engine, host=args.host, port=args.port)
    return 0


def _name(args: argparse.Namespace) -> str:
    from pathlib import Path

    return Path(str(args.file or args.weights)).name
