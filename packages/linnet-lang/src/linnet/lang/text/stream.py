"""Text as it is generated: :class:`TextStream` turns token ids, one at a time, into the new
text they make, and :class:`StopStrings` cuts the text at a stop string.

A token need not be text by itself: a byte-fallback token (``<0xF0>``) or a byte-level one
holds part of a UTF-8 character, and a SentencePiece-style decoder drops a leading space at
the start of what it decodes. So the stream decodes a short window of ids (the last text it
gave and the ids after it) and gives only what the window adds past its earlier text, and
nothing while that ends in U+FFFD, the replacement character of an unfinished byte sequence
a later token may complete (the approach of transformers' TextStreamer and vLLM's
detokenizer). A byte-fallback decoder decodes a run of byte tokens as one sequence and
replaces all of it where it is invalid (a valid ``\x03`` followed by a stray ``<0x87>``
becomes two U+FFFD), so there the text of a run of byte tokens waits for the token that
ends the run. Concatenated, the pieces are ``tokenizer.decode(ids)``; :meth:`finish` gives
what is still held (an unfinished character at the very end, as decode gives it).

>>> from linnet.lang.text.stream import StopStrings
>>> stops = StopStrings(["\\n\\nUser:"])
>>> stops.feed("Sure.\\n"), stops.feed("\\nUser: hi")
(('Sure.', False), ('', True))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang.diagnostics.core import coded_error

REPLACEMENT = "\ufffd"


class TextStream:
    """Feed token ids, get the new text (:meth:`add`); :meth:`finish` at the end.
    ``tokenizer`` is a :class:`~linnet.lang.text.tokenizer.Tokenizer`; special tokens are
    left out unless ``skip_special_tokens=False``.

    >>> stream = TextStream(tok)                                         # doctest: +SKIP
    >>> [stream.add(t) for t in tok.encode("héllo 👋")] + [stream.finish()]  # doctest: +SKIP
    ['h', 'é', 'llo', ' ', '', '', '', '👋', '']
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # the window starts here: ids whose text was already given
        self.read = 0  # ids from here on have not given their text yet
        self.text = ""  # everything given so far
        self.bytes_open = False  # a run of byte-fallback tokens not ended yet

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip))

    def add(self, token: int) -> str:
        """The new text ``token`` completes ("" while a character is unfinished)."""
        self.ids.append(int(token))
        if self._in_byte_run(int(token)):
            return ""
        before = self._decode(self.ids[self.prefix : self.read])
        now = self._decode(self.ids[self.prefix :])
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""
        if not now.startswith(before):
            # A decoder that rewrites earlier text (rare): fall back on the whole text.
            whole = self._decode(self.ids)
            if not whole.startswith(self.text) or whole.endswith(REPLACEMENT):
                return ""
            piece = whole[len(self.text) :]
        else:
            piece = now[len(before) :]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += piece
        return piece

    def _in_byte_run(self, token: int) -> bool:
        """Whether ``token`` leaves a run of byte-fallback tokens open: it is one, or has no
        text of its own (a skipped special token, an id past the vocabulary) inside one."""
        if token in getattr(self.tokenizer, "byte_tokens", ()):
            self.bytes_open = True
        elif self.bytes_open and (
            self.tokenizer.backend.id_to_token(token) is None
            or (self.skip and token in self.tokenizer.special_ids)
        ):
            pass
        else:
            self.bytes_open = False
        return self.bytes_open

    def finish(self) -> str:
        """What is held back at the end: the rest of ``decode(ids)``."""
        whole = self._decode(self.ids)
        if whole.startswith(self.text):
            piece = whole[len(self.text) :]
        else:  # never expected: give the tail the window decodes
            now = self._decode(self.ids[self.prefix :])
            before = self._decode(self.ids[self.prefix : self.read])
            piece = now[len(before) :] if now.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += piece
        return piece


def check_stop(stop: Any) -> tuple[str, ...]:
    """``stop=``: one string or a list of them, each non-empty; E0847 otherwise.

    >>> check_stop("###"), check_stop(["a", "b"]), check_stop(None)
    (('###',), ('a', 'b'), ())
    """
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list | tuple) or not all(isinstance(s, str) and s for s in items):
        raise coded_error(
            "E0847",
            f"stop must be a string or a list of non-empty strings, not {stop!r:.60}",
            help="e.g. stop=['\\n\\n', 'User:'] (stop_tokens= takes token ids)",
        )
    return tuple(items)


class StopStrings:
    """Cut generated text at the first of ``stops``: :meth:`feed` takes each new piece and
    gives ``(text to show, stopped)``. The text shown never includes a stop string (as
    vLLM and OpenAI cut it) and holds back only the end of the text that could still
    become one (``"</"`` while ``"</s>"`` is a stop string); :meth:`finish` gives what is
    held back once generation has ended without a stop.

    >>> s = StopStrings(["</s>"])
    >>> s.feed("a</"), s.feed("b"), s.feed("</s"), s.feed(">c")
    (('a', False), ('</b', False), ('', False), ('', True))
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.shown = 0
        self.stopped = False

    def feed(self, piece: str) -> tuple[str, bool]:
        """The new text to show after ``piece``, and whether a stop string was reached."""
        if self.stopped:
            return "", True
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        if not self.stops:
            out = self.text[self.shown :]
            self.shown = len(self.text)
            return out, False
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if found:
            cut = min(found)
            out = self.text[self.shown : cut]
            self.text, self.shown, self.stopped = self.text[:cut], cut, True
            return out, True
        end = len(self.text) - self._held()
        out = self.text[self.shown : max(end, self.shown)]
        self.shown = max(end, self.shown)
        return out, False

    def _held(self) -> int:
        """The length of the longest end of the text that begins a stop string."""
        for n in range(min(self.longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def finish(self) -> str:
        """The text still held back (generation ended without a stop string)."""
        out = self.text[self.shown :]
        self.shown = len(self.text)
        return out
