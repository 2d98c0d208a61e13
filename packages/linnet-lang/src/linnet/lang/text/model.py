"""What a runtime's ``Model`` gains for text: ``model.tokenizer`` (found beside the weights,
or given with ``load(..., tokenizer=...)``), ``model.generate`` on text prompts and
``model.stream``. ``linnet.torch`` and ``linnet.jax`` mix :class:`TextModel` into their
``Model`` and name their token ``generate`` function; the rest is
:mod:`linnet.lang.text.generation`'s.

>>> find_tokenizer({"w": 1}) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from linnet.lang.text.tokenizer import TOKENIZER_FILE


def find_tokenizer(weights: Any) -> Path | None:
    """Where the tokenizer of a model loaded from ``weights`` is: the checkpoint directory
    (holding tokenizer.json) of a directory, a file or a list of files, or a GGUF file
    itself; None for none (a dict of tensors, a directory without tokenizer.json).

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> find_tokenizer(d) is None, (d / "tokenizer.json").write_text("{}") > 0
    (True, True)
    >>> find_tokenizer(d / "model.safetensors") == d
    True
    """
    if isinstance(weights, list | tuple) and weights:
        weights = weights[0]
    if not isinstance(weights, str | Path):
        return None
    path = Path(weights)
    if path.suffix.lower() == ".gguf":
        return path
    folder = path if path.is_dir() else path.parent
    return folder if (folder / TOKENIZER_FILE).is_file() else None


def given_tokenizer(tokenizer: Any) -> Any:
    """``load(tokenizer=...)`` checked and read before anything else is loaded (E0842,
    E0849 before the weights are read): a Tokenizer, or None/False as given.

    >>> given_tokenizer(None), given_tokenizer(False)
    (None, False)
    """
    if tokenizer is None or tokenizer is False:
        return tokenizer
    from linnet.lang.text.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer)


class TextModel:
    """The text side of a loaded model (mixed into each runtime's ``Model``). A runtime
    implements :meth:`_token_generate` (its ``generate`` function of token ids)."""

    _tokenizer: Any = None
    _tokenizer_source: Path | None = None

    def _token_generate(self) -> Callable[..., list[list[int]]]:
        raise NotImplementedError

    @property
    def tokenizer(self) -> Any:
        """The model's :class:`~linnet.lang.text.tokenizer.Tokenizer` (None: none): given
        to ``load(tokenizer=...)``, or read on first use from beside the weights."""
        if self._tokenizer is None and self._tokenizer_source is not None:
            from linnet.lang.text.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_file(self._tokenizer_source)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        from linnet.lang.text.tokenizer import load_tokenizer

        self._tokenizer = None if value is None else load_tokenizer(value)
        self._tokenizer_source = None

    def attach_tokenizer(self, tokenizer: Any, weights: Any) -> None:
        """``load``'s ``tokenizer=``: a tokenizer or where one is (loaded now: E0842/E0849
        at load), else None to find one beside ``weights`` (read when first used); False
        for none."""
        if tokenizer is False:
            self._tokenizer, self._tokenizer_source = None, None
        elif tokenizer is not None:
            self.tokenizer = tokenizer
        else:
            self._tokenizer_source = find_tokenizer(weights)

    def _generate(self, prompts: Any, max_new_tokens: int, options: dict[str, Any]) -> Any:
        """``generate`` for either kind of prompt: text through the tokenizer, ids as they
        are (E0847 for a text option with ids)."""
        from linnet.lang.text.generation import (
            check_token_prompt_options,
            generate_text,
            is_text,
        )

        run = self._token_generate()
        if is_text(prompts):
            return generate_text(self, prompts, max_new_tokens, options, run)
        check_token_prompt_options(options)
        return run(self, prompts, max_new_tokens, **options)

    def warm_up(
        self,
        batch_sizes: Sequence[int] = (1,),
        longest: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> list[tuple[int, int]]:
        """Run every shape ``generate`` runs at for ``batch_sizes`` prompts of up to
        ``longest`` tokens (default: as many as the KV cache holds), so that no later call
        lowers or compiles anything: each prompt-length bucket's prefill (the entry generate
        runs: ``prefill_last`` where the model has one, else ``prefill``; it runs generate
        itself) and each batch bucket's ``decode`` (:func:`linnet.lang.host.generate.padded`),
        once, or twice where a second call still captures (torch on CUDA: the prefill and
        the greedy step). ``progress`` gets a line per shape (default: stderr). Returns the
        (batch, length) shapes run.

        >>> model.warm_up(batch_sizes=[1, 4], longest=1000)                   # doctest: +SKIP
        [(1, 16), (1, 32), ..., (4, 1024)]
        """
        import sys

        from linnet.lang.diagnostics.core import coded_error
        from linnet.lang.host.generate import (
            batch_bucket,
            cache_length,
            check_positive_sizes,
            ladder_of,
            length_bucket,
            length_buckets,
        )

        say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        check_positive_sizes(batch_sizes, longest)
        limit = cache_length(self, self._int32_zeros(1))
        if limit is None:
            raise coded_error(
                "E0866",
                "warm_up needs the positions `decode` takes (its KV cache's length), and "
                "this model's decode does not bound `pos`",
                help="generate then runs each prompt at its own length: there is nothing "
                "to warm up ahead of time",
            )
        ladder = ladder_of(self)
        top = limit if longest is None else length_bucket(longest, limit, ladder)
        lengths = [n for n in length_buckets(limit, ladder) if n <= top]
        shapes = [(b, n) for b in sorted({batch_bucket(b) for b in batch_sizes}) for n in lengths]
        run = self._token_generate()
        for i, (b, n) in enumerate(shapes, 1):
            say(f"warm-up {i}/{len(shapes)}: {b} prompt(s) of {n} tokens")
            # A prompt that fills its bucket; one token short where the bucket is the whole
            # cache and a decode step would pass it (then decode ran at a smaller bucket).
            short = n - 1 if n >= limit else n
            size = short if short > 0 and length_bucket(short, limit, ladder) == n else n
            steps = 2 if size < limit else 1
            for _ in range(self._warm_up_runs):
                run(self, [[0] * size] * b, steps, stop_tokens=[])
        return shapes

    def _int32_zeros(self, n: int) -> Any:
        """A length-``n`` int32 array of the runtime's (each runtime overrides it)."""
        raise NotImplementedError

    #: How many times ``warm_up`` runs each shape: a runtime whose second call at a shape
    #: still does work once (a CUDA graph capture) says 2.
    _warm_up_runs = 1

    def stream(self, prompt: Any, max_new_tokens: int = 16, **options: Any) -> Iterator[str]:
        """The text generated after one prompt (a string or chat messages), piece by piece
        as it comes: ``generate``'s options but ``callback``. Leaving the loop early stops
        the generation.

        >>> for piece in model.stream([{"role": "user", "content": "Hi"}], 64):  # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        """
        from linnet.lang.host.generate import check_options
        from linnet.lang.text.generation import stream_text

        check_options(options)
        return stream_text(self, prompt, max_new_tokens, options, self._token_generate())
