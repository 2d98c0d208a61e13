"""Text in, text out: tokenizers, chat templates, incremental detokenising and stop strings,
shared by every runtime (``linnet.torch`` and ``linnet.jax`` generate text through here).

* :class:`Tokenizer` (:mod:`.tokenizer`): a ``tokenizers.Tokenizer`` with what a
  transformers checkpoint says around it (``tokenizer_config.json``'s special tokens and
  BOS/EOS flags, the chat template, ``generation_config.json``'s stop ids), read from a
  checkpoint directory, a GGUF file or parts; ``encode``/``decode``/``apply_chat_template``
  give what transformers' ``AutoTokenizer`` gives.
* :mod:`.chat`: chat templates rendered in the sandboxed Jinja environment transformers
  uses; a template that raises, or messages of the wrong shape, are coded errors naming the
  message.
* :mod:`.stream`: :class:`TextStream` (feed ids, get the new text; never half a character)
  and :class:`StopStrings` (stop strings across tokens, holding back no more than needed).
* :mod:`.generation`: ``Model.generate`` and ``Model.stream`` on text prompts, for every
  runtime.

Needs ``linnet-lang[text]`` (``tokenizers`` and ``jinja2``), imported only when used:
without them, ``linnet.lang`` imports as before and a text feature is E0840.

Codes: E0840 (text support not installed; a GGUF file needs the `gguf` extra: E0850), E0842 (a
tokenizer's files), E0843 (no chat template), E0844 (messages of the wrong shape), E0845 (a
chat template that fails), E0846 (a text prompt without a tokenizer), E0847 (text options),
E0848 (what is encoded or decoded), E0849 (``load(tokenizer=...)``).

>>> from linnet.lang.text.stream import StopStrings
>>> StopStrings(["</s>"]).feed("Hello</")
('Hello', False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from linnet.lang.text.stream import StopStrings, TextStream
    from linnet.lang.text.tokenizer import Tokenizer

__all__ = ["StopStrings", "TextStream", "Tokenizer"]


def __getattr__(name: str) -> Any:
    # Lazily: `import linnet.lang.text` costs nothing until a name is used.
    if name == "Tokenizer":
        from linnet.lang.text.tokenizer import Tokenizer

        return Tokenizer
    if name in ("TextStream", "StopStrings"):
        from linnet.lang.text import stream

        return getattr(stream, name)
    raise AttributeError(name)
