"""``Model.generate`` and ``Model.stream`` on text, for every runtime: the prompts rendered
and encoded, the runtime's token generation run with a hook per token, each sequence's
ids detokenised as they come (:class:`~linnet.lang.text.stream.TextStream`) and cut at
stop strings (:class:`~linnet.lang.text.stream.StopStrings`). A runtime gives its token
``generate`` function (``generate(model, prompts, max_new_tokens, stop_when=..., **options)``);
everything else is here.

A prompt is a string (raw text, encoded with the special tokens the tokenizer adds, a BOS
say) or a list of chat messages (``[{"role": "user", "content": "..."}]``, rendered by the
tokenizer's chat template with the assistant's header after it, and encoded without adding
special tokens again, as transformers' ``apply_chat_template(tokenize=True)``); a list of
them is a batch. One prompt gives one string, a batch a list of strings. Generation stops at
the tokenizer's EOS ids and the model's stop tokens (unless ``stop_tokens=`` says otherwise),
and at the first of ``stop=`` strings, which the text returned ends before.

>>> is_text([{"role": "user", "content": "Hi"}]), is_text([[1, 2, 3]]), is_text("Hi")
(True, False, True)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.text.stream import StopStrings, TextStream, check_stop

#: The options ``generate`` takes only for text prompts (beside the token options).
TEXT_OPTIONS = ("stop", "callback", "skip_special_tokens")


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(m, Mapping) for m in value)
    )


def is_text(prompts: Any) -> bool:
    """Whether ``prompts`` are text (a string, chat messages, or a list of either) rather
    than token ids.

    >>> is_text(["a", "b"]), is_text([]), is_text([1, 2])
    (True, False, False)
    """
    if isinstance(prompts, str) or _is_messages(prompts):
        return True
    return (
        isinstance(prompts, list | tuple)
        and bool(prompts)
        and all(isinstance(p, str) or _is_messages(p) for p in prompts)
    )


def text_prompts(prompts: Any) -> tuple[list[str | list[dict[str, Any]]], bool]:
    """``(the prompts as a batch, whether one prompt was given)``.

    >>> text_prompts("Hi"), text_prompts(["a", "b"])
    ((['Hi'], True), (['a', 'b'], False))
    """
    if isinstance(prompts, str) or _is_messages(prompts):
        return [prompts], True
    return list(prompts), False


def model_tokenizer(model: Any) -> Any:
    """``model.tokenizer``; E0846 (saying how to give one) where the model has none.

    >>> from types import SimpleNamespace
    >>> model_tokenizer(SimpleNamespace(tokenizer=None))
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0846]: a text prompt needs a tokenizer, ...
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise coded_error(
            "E0846",
            "a text prompt needs a tokenizer, and this model has none "
            "(no tokenizer.json beside its weights)",
            help="load it with one: load(..., tokenizer='CHECKPOINT_DIR/') (or a "
            ".gguf file, or a linnet.lang.text.Tokenizer), or set "
            "model.tokenizer; `linnet run` takes --tokenizer DIR; token-id "
            "prompts need none",
        )
    return tokenizer


def encode_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """One prompt's ids: raw text encoded with the tokenizer's special tokens, chat
    messages through its chat template (no special tokens added again).

    >>> encode_prompt(tok, [{"role": "user", "content": "Hi"}])          # doctest: +SKIP
    [1, 4093, 198, 20830, 2, 198, 1, 520, 9531, 198]
    """
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    return list(tokenizer.encode_chat(prompt))


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(token options, text options)``.

    >>> split_options({"stop": ["x"], "temperature": 0.5})
    ({'temperature': 0.5}, {'stop': ['x']})
    """
    text = {k: v for k, v in options.items() if k in TEXT_OPTIONS}
    return {k: v for k, v in options.items() if k not in TEXT_OPTIONS}, text


def check_token_prompt_options(options: dict[str, Any]) -> None:
    """E0847 for a text option (``stop``, ``callback``...) with token-id prompts, which
    return ids (and are never decoded).

    >>> check_token_prompt_options({"temperature": 0.5})
    """
    given = [k for k in options if k in TEXT_OPTIONS]
    if given:
        raise coded_error(
            "E0847",
            f"`{given[0]}` is an option for text prompts; these prompts "
            "are token ids, and generate returns ids for them",
            help="pass the prompt as text (a string or chat messages) with a "
            "tokenizer, or use stop_tokens=[ids] and on_token= for ids",
        )


def default_stops(model: Any, tokenizer: Any) -> list[int]:
    """The ids a text generation stops at by default: the model's stop tokens (its
    checkpoint's), then the tokenizer's EOS ids.

    >>> from types import SimpleNamespace
    >>> default_stops(SimpleNamespace(stop_tokens=(2,)), SimpleNamespace(eos_token_ids=(2, 7)))
    [2, 7]
    """
    out = [int(t) for t in getattr(model, "stop_tokens", ())]
    return out + [t for t in tokenizer.eos_token_ids if t not in out]


class _Sequences:
    """Each sequence's text as its tokens come: detokenised, cut at stop strings, and
    given to ``callback``; ``cancel`` (an Event) ends every sequence at its next token."""

    def __init__(
        self,
        tokenizer: Any,
        count: int,
        stops: tuple[str, ...],
        callback: Callable[[int, str], None] | None,
        skip: bool,
        cancel: threading.Event | None = None,
    ):
        self.streams = [TextStream(tokenizer, skip) for _ in range(count)]
        self.cuts = [StopStrings(stops) for _ in range(count)]
        self.text = [""] * count
        self.callback = callback
        self.cancel = cancel

    def _give(self, b: int, piece: str) -> None:
        if piece:
            self.text[b] += piece
            if self.callback is not None:
                self.callback(b, piece)

    def take(self, b: int, token: int) -> bool:
        """Sequence ``b``'s next token; True once it has reached a stop string."""
        shown, stopped = self.cuts[b].feed(self.streams[b].add(token))
        self._give(b, shown)
        return stopped or (self.cancel is not None and self.cancel.is_set())

    def finish(self) -> list[str]:
        for b, (stream, cut) in enumerate(zip(self.streams, self.cuts)):
            if not cut.stopped:
                shown, _ = cut.feed(stream.finish())
                self._give(b, shown)
                self._give(b, cut.finish())
        return self.text


def generate_text(
    model: Any,
    prompts: Any,
    max_new_tokens: int,
    options: dict[str, Any],
    generate: Callable[..., list[list[int]]],
    cancel: threading.Event | None = None,
) -> str | list[str]:
    """``model.generate`` on text prompts, running the runtime's token ``generate``:
    a string for one prompt, a list for a batch. ``options`` are generate's: the token
    options (``stop_tokens`` defaults to :func:`default_stops`) and ``stop`` (strings),
    ``callback`` (``callback(piece)`` for one prompt, ``callback(index, piece)`` for a
    batch, as the text comes) and ``skip_special_tokens`` (default True).

    >>> model.generate("The capital of France is", 8)                   # doctest: +SKIP
    ' Paris, and the capital of Germany is'
    """
    tokenizer = model_tokenizer(model)
    batch, single = text_prompts(prompts)
    tokens, text = split_options(options)
    stops = check_stop(text.get("stop"))
    callback = text.get("callback")
    if callback is not None and not callable(callback):
        raise coded_error(
            "E0847",
            f"callback must be a function of the new text, not {type(callback).__name__}",
            help="e.g. callback=lambda piece: print(piece, end='', flush=True)",
        )
    skip = text.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise coded_error(
            "E0847",
            f"skip_special_tokens must be True or False, not {skip!r}",
            help="True (the default) leaves special tokens out of the text",
        )
    ids = []
    for i, prompt in enumerate(batch):
        try:
            ids.append(encode_prompt(tokenizer, prompt))
        except Exception as e:
            if len(batch) > 1 and hasattr(e, "diagnostics"):
                e.diagnostics[0].message = f"prompt {i}: {e.diagnostics[0].message}"
            raise
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise coded_error(
            "E0810",
            f"prompt {empty[0]} encodes to no tokens (an empty string, "
            "and this tokenizer adds no BOS): prefill needs at least one",
            help="give a non-empty prompt",
        )
    if tokens.get("stop_tokens") is None:
        tokens["stop_tokens"] = default_stops(model, tokenizer)
    each = None
    if callback is not None:
        each = (lambda b, piece: callback(piece)) if single else callback
    sequences = _Sequences(tokenizer, len(ids), stops, each, skip, cancel)
    generate(model, ids, max_new_tokens, stop_when=sequences.take, **tokens)
    out = sequences.finish()
    return out[0] if single else out


def stream_text(
    model: Any,
    prompt: Any,
    max_new_tokens: int,
    options: dict[str, Any],
    generate: Callable[..., list[list[int]]],
) -> Iterator[str]:
    """``model.stream``: the text of one prompt, piece by piece as it is generated (a
    worker thread generates; leaving the loop early ends the generation at its next token).
    The prompt and options are checked before this returns.

    >>> for piece in model.stream("Once upon a time", 32):              # doctest: +SKIP
    ...     print(piece, end="", flush=True)
    """
    batch, single = text_prompts(prompt) if is_text(prompt) else ([], False)
    if not single:
        raise coded_error(
            "E0847",
            "stream takes one text prompt (a string or a list of chat "
            f"messages), not {'a batch' if batch else type(prompt).__name__}",
            help="for a batch, use generate(prompts, callback=lambda index, piece: ...)",
        )
    if "callback" in options:
        raise coded_error(
            "E0847",
            "stream gives the text itself: it takes no callback",
            help="iterate: for piece in model.stream(prompt): ...",
        )
    model_tokenizer(model)
    check_stop(options.get("stop"))
    pieces: queue.Queue[tuple[str, Any]] = queue.Queue()
    cancel = threading.Event()

    def work() -> None:
        try:
            generate_text(
                model,
                prompt,
                max_new_tokens,
                {**options, "callback": lambda piece: pieces.put(("piece", piece))},
                generate,
                cancel,
            )
            pieces.put(("done", None))
        except BaseException as e:  # handed to the reader, raised there
            pieces.put(("error", e))

    def read() -> Iterator[str]:
        worker = threading.Thread(target=work, name="linnet-stream", daemon=True)
        worker.start()
        try:
            while True:
                kind, value = pieces.get()
                if kind == "piece":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            cancel.set()
            worker.join()

    return read()
