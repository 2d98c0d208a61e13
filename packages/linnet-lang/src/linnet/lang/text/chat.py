"""Chat templates rendered the way transformers renders them (its ``chat_template_utils``):
Jinja's ``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks`` and the
``loopcontrols`` extension; ``raise_exception(message)``, ``strftime_now(format)``, a
``tojson`` filter that keeps non-ASCII text and takes ``indent``/``separators``/``sort_keys``,
and namespaces that refuse underscore names. A checkpoint's template is untrusted code: the
sandbox keeps it from Python's internals.

Messages are checked before rendering: a list of ``{"role": str, "content": ...}`` dicts
(E0844 naming the first one that is not, and why). A template that raises (its own
``raise_exception``, say "roles must alternate user/assistant") or fails is E0845 naming the
first message at which it fails (found by rendering shorter conversations), never a Jinja
traceback.

>>> render("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
...        [{"role": "user", "content": "Hi"}])
'<user>Hi'
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.text.files import require


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter: Jinja's own escapes HTML characters, which no prompt wants.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=16)
def compile_template(template: str) -> Any:
    """``template`` compiled in transformers' sandboxed environment (cached by its text);
    E0845 for a template that does not parse.

    >>> compile_template("{{ bos_token }}").render(bos_token="<s>")
    '<s>'
    """
    jinja2 = require("jinja2")
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    class Namespace(jinja2.utils.Namespace):  # type: ignore[name-defined]
        # As transformers': no underscore attributes (a way to CPython's internals).
        def __init__(*args: Any, **kwargs: Any):
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore attributes ({name!r})"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = Namespace
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise coded_error(
            "E0845",
            f"the chat template does not parse: {e.message} (line {e.lineno} of the template)",
            help="restore the checkpoint's chat template (tokenizer_config.json "
            "or chat_template.jinja), or pass a working one",
        ) from None


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as plain dicts (None values dropped, as transformers does); E0844 for a
    conversation that is not a non-empty list of ``{"role": str, "content": ...}``.

    >>> check_messages([{"role": "user", "content": "Hi", "name": None}])
    [{'role': 'user', 'content': 'Hi'}]
    >>> check_messages([{"role": "user"}])
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0844]: message 0 has no `content` ...
    """
    example = '[{"role": "user", "content": "Hello"}]'
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, list | tuple):
        raise coded_error(
            "E0844",
            f"chat messages must be a list of dicts, not {type(messages).__name__}",
            help=f"e.g. {example}",
        )
    if not messages:
        raise coded_error(
            "E0844",
            "the conversation is empty: a chat prompt needs at least one message",
            help=f"e.g. {example}",
        )
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise coded_error(
                "E0844",
                f"message {i} is a {type(message).__name__}, not a dict with `role` and `content`",
                help=f"e.g. {example}",
            )
        plain = {k: v for k, v in message.items() if v is not None}
        for key in ("role", "content"):
            if key not in plain and not (key == "content" and "tool_calls" in plain):
                raise coded_error(
                    "E0844",
                    f"message {i} has no `{key}` (its keys: "
                    f"{', '.join(map(str, message)) or 'none'})",
                    help=f"each message is a dict like {example}",
                )
        if not isinstance(plain["role"], str):
            raise coded_error(
                "E0844",
                f"message {i}'s `role` is {plain['role']!r}, not a string",
                help="roles are 'system', 'user', 'assistant', 'tool'",
            )
        content = plain.get("content")
        if content is not None and not isinstance(content, str | list):
            raise coded_error(
                "E0844",
                f"message {i}'s `content` is a "
                f"{type(content).__name__}, not text (or a list of parts)",
                help=f"e.g. {example}",
            )
        out.append(_plain(plain))
    return out


def _plain(value: Any) -> Any:
    """What a template may see: JSON types only (transformers' ``_plain_template_data``):
    anything else becomes a placeholder naming its type, never an object with methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def render(
    template: str,
    messages: Any,
    add_generation_prompt: bool = True,
    tools: Any = None,
    variables: dict[str, Any] | None = None,
) -> str:
    """``messages`` rendered by ``template`` with ``add_generation_prompt``, ``tools`` and
    ``variables`` (the special tokens by name, and the caller's own); E0844 for messages of
    the wrong shape, E0845 naming the message where the template fails.

    >>> render("{{ raise_exception('no system role') }}", [{"role": "system", "content": ""}])
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0845]: the chat template fails at message 0 ...
    """
    jinja2 = require("jinja2")
    chat = check_messages(messages)
    compiled = compile_template(template)
    extra = _plain(dict(variables or {}))
    if tools is not None and (
        not isinstance(tools, list | tuple) or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise coded_error(
            "E0844",
            "tools must be a list of JSON schemas (dicts)",
            help='e.g. tools=[{"type": "function", "function": {"name": ...}}]',
        )
    tools = _plain(list(tools)) if tools is not None else None

    def run(conversation: list[dict[str, Any]], prompt: bool) -> str:
        return str(
            compiled.render(
                messages=conversation,
                tools=tools,
                documents=None,
                add_generation_prompt=prompt,
                **extra,
            )
        )

    try:
        return run(chat, add_generation_prompt)
    except (
        jinja2.exceptions.TemplateError,
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ZeroDivisionError,
        RecursionError,
    ) as e:
        failure = e
    # Which message: the shortest conversation the template fails on ends with it.
    at = len(chat) - 1
    for n in range(1, len(chat)):
        try:
            run(chat[:n], False)
        except Exception:
            at = n - 1
            break
    why = str(failure) or type(failure).__name__
    raise coded_error(
        "E0845",
        f"the chat template fails at message {at} (role {chat[at]['role']!r}): {why}",
        help="the checkpoint's template refuses this conversation: check the "
        "roles and their order (many templates take only alternating "
        "user/assistant turns after an optional system message)",
    ) from None
