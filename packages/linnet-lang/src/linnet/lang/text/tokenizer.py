"""A checkpoint's tokenizer: a ``tokenizers.Tokenizer`` with what the files around it say,
read the way transformers' ``AutoTokenizer`` reads them, so that ``encode``, ``decode`` and
``apply_chat_template`` give the ids and text transformers gives.

From a checkpoint directory: ``tokenizer.json`` (the tokenizers library's own file);
``tokenizer_config.json``'s special tokens (``bos_token``, ``eos_token``...: a string or an
``{"content": ...}`` object), ``add_bos_token``/``add_eos_token`` (where tokenizer.json has
no post-processor of its own; where it has one, that decides, as in transformers 5) and ``chat_template`` (a string, or a list of named
templates); ``special_tokens_map.json`` (the legacy file, where the config has no
``added_tokens_decoder``); ``chat_template.jinja`` (and ``additional_chat_templates/``) or
``chat_template.json``, which take precedence over the config's template; and
``generation_config.json``'s ``eos_token_id`` (an id or a list), the ids generation stops
at, with the EOS token's own id.

>>> tok = Tokenizer.from_directory("SmolLM2-135M-Instruct/")           # doctest: +SKIP
>>> tok.decode(tok.encode("Hello"))                                    # doctest: +SKIP
'Hello'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import LinnetError, coded_error
from linnet.lang.text.chat import render
from linnet.lang.text.files import (
    generation_eos,
    read_json,
    require,
    template_files,
    templates,
    token_text,
)
from linnet.lang.weights.gguf_tokenizer import tokenizer_parts

#: The special tokens transformers passes to a chat template by name (its
#: ``SPECIAL_TOKENS_ATTRIBUTES``), when the checkpoint names them.
SPECIAL_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"


class Tokenizer:
    """Text to token ids and back, and chat messages to a prompt, for one checkpoint.

    Build one with :meth:`from_directory`, :meth:`from_file` (a directory, a
    ``tokenizer.json`` or a ``.gguf`` file) or :meth:`from_parts`. ``eos_token_ids`` are the
    ids generation stops at by default; ``chat_template`` is None, a template, or named
    templates (``{"default": ..., "tool_use": ...}``).

    >>> import tokenizers
    >>> from tokenizers.models import WordLevel
    >>> backend = tokenizers.Tokenizer(WordLevel({"<s>": 0, "hi": 1, "[UNK]": 2}, "[UNK]"))
    >>> tok = Tokenizer.from_parts(backend, bos_token_id=0, eos_token_ids=[0],
    ...                            chat_template=None, add_bos_token=True)
    >>> tok.encode("hi"), tok.eos_token_ids
    ([0, 1], (0,))
    """

    def __init__(
        self,
        backend: Any,
        *,
        special: dict[str, str],
        eos_token_ids: Sequence[int],
        chat_template: str | dict[str, str] | None,
        flags: tuple[bool, bool] | None,
        clean_up: bool = False,
        name: str = "",
    ):
        tokenizers = require("tokenizers")
        if not isinstance(backend, tokenizers.Tokenizer):
            raise coded_error(
                "E0842",
                f"a tokenizer's backend must be a tokenizers.Tokenizer, "
                f"not {type(backend).__name__}",
                help="e.g. tokenizers.Tokenizer.from_file('tokenizer.json')",
            )
        self.backend = backend
        self.name = name
        self.special = dict(special)
        self.chat_template = chat_template
        self.clean_up = clean_up
        self._byte_tokens: frozenset[int] | None = None
        self._special_ids: frozenset[int] | None = None
        self.bos_token_id = self.token_id(special.get("bos_token"))
        ids = list(eos_token_ids)
        eos = self.token_id(special.get("eos_token"))
        if eos is not None and eos not in ids:
            ids.append(eos)
        self.eos_token_ids: tuple[int, ...] = tuple(ids)
        if flags is not None:
            self._post_processor(*flags)

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.name or 'unnamed'}: {self.vocab_size} tokens, "
            f"chat template: {'yes' if self.chat_template else 'no'})"
        )

    def token_id(self, token: str | None) -> int | None:
        """The id of ``token`` (None: no such token)."""
        return None if token is None else self.backend.token_to_id(token)

    @property
    def byte_tokens(self) -> frozenset[int]:
        """The ids of byte-fallback tokens (``<0xE2>``) where the decoder groups them
        (tokenizers' ByteFallback: a run of them is one UTF-8 sequence, all replaced by
        U+FFFD where it is invalid, so a later byte can change earlier text); empty for
        other tokenizers."""
        if self._byte_tokens is None:
            found: frozenset[int] = frozenset()
            decoder = self.backend.decoder
            if decoder is not None and b"ByteFallback" in decoder.__getstate__():
                found = frozenset(
                    i
                    for t, i in self.backend.get_vocab().items()
                    if len(t) == 6 and t.startswith("<0x") and t.endswith(">")
                )
            self._byte_tokens = found
        return self._byte_tokens

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of special tokens (left out by ``decode(skip_special_tokens=True)``)."""
        if self._special_ids is None:
            self._special_ids = frozenset(
                i for i, t in self.backend.get_added_tokens_decoder().items() if t.special
            )
        return self._special_ids

    @property
    def vocab_size(self) -> int:
        """The number of ids, added tokens included (transformers' ``len(tokenizer)``)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def _post_processor(self, add_bos: bool, add_eos: bool) -> None:
        # transformers' update_post_processor: BOS/EOS as the config says, nothing else.
        from tokenizers import processors

        bos, eos = self.special.get("bos_token") or "", self.special.get("eos_token") or ""
        add_bos = add_bos and bool(bos) and self.bos_token_id is not None
        eos_id = self.token_id(eos) if eos else None
        add_eos = add_eos and bool(eos) and eos_id is not None
        single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
        pair = (
            f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1"
            f"{' ' + eos + ':1' if add_eos else ''}"
        )
        special = ([(bos, self.bos_token_id)] if add_bos else []) + (
            [(eos, eos_id)] if add_eos else []
        )
        self.backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special
        )

    # ------------------------------------------------------------ building one
    @classmethod
    def from_parts(
        cls,
        backend: Any,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        chat_template: Any = None,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        name: str = "",
    ) -> Tokenizer:
        """A tokenizer from its parts (what a GGUF file's metadata holds): ``backend`` a
        ``tokenizers.Tokenizer`` (or its JSON text), the BOS id, the EOS ids, the chat
        template, whether ``encode`` adds BOS/EOS.

        >>> Tokenizer.from_parts(backend, bos_token_id=1, eos_token_ids=[2])  # doctest: +SKIP
        """
        tokenizers = require("tokenizers")
        if isinstance(backend, str):
            try:
                backend = tokenizers.Tokenizer.from_str(backend)
            except Exception as e:
                raise coded_error(
                    "E0842",
                    f"the tokenizer of {name or 'these parts'} is not "
                    f"a tokenizers JSON description: {e}",
                    help="pass a tokenizers.Tokenizer or its JSON text",
                ) from None
        if not isinstance(backend, tokenizers.Tokenizer):
            raise coded_error(
                "E0842",
                f"a tokenizer's backend must be a tokenizers.Tokenizer "
                f"(or its JSON text), not {type(backend).__name__}",
                help="e.g. tokenizers.Tokenizer.from_file('tokenizer.json')",
            )
        size = backend.get_vocab_size(with_added_tokens=True)
        ids: list[Any] = (
            list(eos_token_ids) if isinstance(eos_token_ids, list | tuple) else [eos_token_ids]
        )
        for what, t in [("bos_token_id", bos_token_id)] + [("eos_token_ids", t) for t in ids]:
            if t is not None and (
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < size
            ):
                raise coded_error(
                    "E0842",
                    f"the {what} of {name or 'these parts'} is {t!r}, "
                    f"not a token id of its tokenizer ([0, {size}))",
                    help="the metadata that gives the tokenizer is damaged: restore the file",
                )
        eos_token_ids = ids
        # A copy: __init__ sets its post-processor, which the caller's must keep.
        backend = tokenizers.Tokenizer.from_str(backend.to_str())
        special: dict[str, str] = {}
        for key, token_id in (
            ("bos_token", bos_token_id),
            ("eos_token", eos_token_ids[0] if eos_token_ids else None),
        ):
            token = None if token_id is None else backend.id_to_token(token_id)
            if token is not None:
                special[key] = token
        return cls(
            backend,
            special=special,
            eos_token_ids=list(eos_token_ids),
            chat_template=templates(chat_template, name),
            flags=(add_bos_token, add_eos_token),
            name=name,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of a checkpoint directory, of the directory a ``tokenizer.json``
        is in, or of a GGUF file (read by
        :func:`linnet.lang.weights.gguf_tokenizer.tokenizer_parts`; E0850 where the `gguf`
        package is not installed).

        >>> tok = Tokenizer.from_file("model.gguf")                        # doctest: +SKIP
        """
        p = Path(path)
        if p.suffix.lower() == ".gguf":
            return cls.from_parts(**tokenizer_parts(p))
        if p.is_file() and p.name in (TOKENIZER_FILE, CONFIG_FILE):
            p = p.parent
        return cls.from_directory(p)

    @classmethod
    def from_directory(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of a transformers checkpoint directory (``save_pretrained``'s
        files); E0842 where ``tokenizer.json`` is missing or a file is malformed.

        >>> tok = Tokenizer.from_directory("SmolLM2-135M-Instruct/")      # doctest: +SKIP
        """
        tokenizers = require("tokenizers")
        folder = Path(path)
        file = folder / TOKENIZER_FILE
        if not file.is_file():
            where = "is no directory" if not folder.is_dir() else f"has no {TOKENIZER_FILE}"
            raise coded_error(
                "E0842",
                f"no tokenizer at `{folder}`: it {where}",
                help="give a checkpoint directory saved by transformers (its "
                "tokenizer.json); a checkpoint with only tokenizer.model "
                "gets one from `AutoTokenizer.from_pretrained(dir)"
                ".save_pretrained(dir)`",
            )
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:
            raise coded_error(
                "E0842",
                f"`{file}` is not a tokenizer the tokenizers library "
                f"reads: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                help="restore the file from the checkpoint (download or save it again)",
            ) from None
        config = (
            read_json(folder / CONFIG_FILE, "tokenizer config")
            if (folder / CONFIG_FILE).is_file()
            else {}
        )
        values = dict(config)
        legacy = folder / "special_tokens_map.json"
        if "added_tokens_decoder" not in config and legacy.is_file():
            values.update(read_json(legacy, "special tokens map"))
        special = {k: t for k in SPECIAL_NAMES if (t := token_text(values.get(k))) is not None}
        template = templates(values.get("chat_template"), str(folder / CONFIG_FILE))
        template = template_files(folder, template)
        # tokenizer.json's post-processor decides what encode adds (transformers 5 drops the
        # config's flags when the file is there); a file without one takes the config's
        # add_bos_token/add_eos_token, as transformers 4 and Llama's tokenizer class do.
        flags = None
        if backend.post_processor is None:
            flags = (config.get("add_bos_token") is True, config.get("add_eos_token") is True)
        clean_up = (
            config.get("clean_up_tokenization_spaces") is True
            and type(backend.model).__name__ != "BPE"
        )  # transformers skips it for BPE
        return cls(
            backend,
            special=special,
            eos_token_ids=generation_eos(folder),
            chat_template=template,
            flags=flags,
            clean_up=clean_up,
            name=folder.name or str(folder),
        )

    # ------------------------------------------------------------ text and ids
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s token ids, with the BOS/EOS the checkpoint adds (transformers'
        ``tokenizer.encode``); E0848 for anything but a string.

        >>> tok.encode("Hello")                                            # doctest: +SKIP
        [19556]
        """
        if not isinstance(text, str):
            raise coded_error(
                "E0848",
                f"encode takes a string, not {type(text).__name__}",
                help="e.g. tokenizer.encode('Hello')",
            )
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (transformers' ``tokenizer.decode``): an id past the
        tokenizer's vocabulary (a model's padded one) has no text, as in transformers;
        E0848 for a negative id or one that is no int.

        >>> tok.decode([19556])                                            # doctest: +SKIP
        'Hello'
        """
        ids = check_ids(ids)
        text = str(self.backend.decode(ids, skip_special_tokens=skip_special_tokens))
        return clean_up_spaces(text) if self.clean_up else text

    def apply_chat_template(
        self,
        messages: Any,
        add_generation_prompt: bool = True,
        tools: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """``messages`` (``[{"role": "user", "content": "..."}]``) as the prompt the
        checkpoint's chat template renders, exactly as transformers'
        ``apply_chat_template(tokenize=False)`` renders it: the special tokens by name, then
        ``kwargs``, passed to the template. ``chat_template`` names one of several templates,
        or is a template itself. E0843 without a template, E0844 for messages of the wrong
        shape, E0845 where the template fails (naming the message).

        >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}])   # doctest: +SKIP
        '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
        """

        template = self._template(chat_template, tools)
        return render(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            variables={**self.special, **kwargs},
        )

    def encode_chat(
        self, messages: Any, add_generation_prompt: bool = True, **kwargs: Any
    ) -> list[int]:
        """The ids of :meth:`apply_chat_template`'s prompt: encoded without special tokens
        added again (the template writes its own BOS), as transformers'
        ``apply_chat_template(tokenize=True)``.

        >>> tok.encode_chat([{"role": "user", "content": "Hi"}])           # doctest: +SKIP
        [1, 4093, 198, 20830, 2, 198, 1, 520, 9531, 198]
        """
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt, **kwargs),
            add_special_tokens=False,
        )

    def _template(self, chat_template: str | None, tools: Any) -> str:
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template is not None and chat_template in templates:
                return templates[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise coded_error(
                    "E0843",
                    f"the tokenizer of {self.name or 'this model'} has "
                    f"several chat templates ({', '.join(sorted(templates))}) "
                    "and none named `default`",
                    help="name one: apply_chat_template(messages, "
                    f"chat_template={sorted(templates)[0]!r})",
                )
        if chat_template is not None:
            return chat_template
        if not isinstance(templates, str):
            raise coded_error(
                "E0843",
                f"the tokenizer of {self.name or 'this model'} has no "
                "chat template, so chat messages cannot be made into a prompt",
                help="pass the prompt as a string (raw text, `--raw` for "
                "`linnet run`), or give a template: "
                "apply_chat_template(messages, chat_template='...')",
            )
        return templates


def check_ids(ids: Any) -> list[int]:
    """``ids`` as a list of ints in ``[0, 2**32)`` (what the tokenizers library takes); E0848
    otherwise, where it would raise a bare TypeError or OverflowError.

    >>> check_ids([1, 2])
    [1, 2]
    >>> check_ids([1, -3])
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0848]: token id -3 (at 1) is not ...
    """
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise coded_error(
            "E0848",
            f"decode takes a list of token ids, not {type(ids).__name__}",
            help="e.g. tokenizer.decode([1, 2, 3])",
        )
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**32:
            raise coded_error(
                "E0848",
                f"token id {t!r} (at {i}) is not a token id: ids are ints from 0",
                help="decode the ids the model generated (a "
                "list of ints), e.g. tokenizer.decode([1, 2])",
            )
        out.append(int(t))
    return out


def clean_up_spaces(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (WordPiece-era spaces before punctuation),
    where a checkpoint asks for it.

    >>> clean_up_spaces("it 's done .")
    "it's done."
    """
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


def load_tokenizer(value: Any) -> Tokenizer:
    """``load(..., tokenizer=VALUE)``'s tokenizer: a :class:`Tokenizer`, a checkpoint
    directory, a ``tokenizer.json``, or a GGUF file; E0849 for anything else.

    >>> load_tokenizer(42)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0849]: tokenizer= must be ...
    """
    if isinstance(value, Tokenizer):
        return value
    if isinstance(value, str | Path):
        if not Path(value).exists():
            raise coded_error(
                "E0849",
                f"tokenizer={str(value)!r}: there is no such file or directory",
                help="give the checkpoint directory that holds tokenizer.json, or a .gguf file",
            )
        return Tokenizer.from_file(value)
    raise coded_error(
        "E0849",
        f"tokenizer= must be a Tokenizer, a checkpoint directory or a "
        f"GGUF file, not {type(value).__name__}",
        help="e.g. load(..., tokenizer='SmolLM2-135M-Instruct/')",
    )


__all__ = ["LinnetError", "Tokenizer", "check_ids", "load_tokenizer", "require"]
