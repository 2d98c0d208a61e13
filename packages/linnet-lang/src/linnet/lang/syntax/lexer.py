"""Turns Linnet source into tokens. Comments are `// ...` and `/* ... */`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from linnet.lang.diagnostics.core import Diagnostic, SourceFile, Span

KEYWORDS = frozenset(
    {
        "pub",
        "use",
        "op",
        "fn",
        "kernel",
        "block",
        "model",
        "entry",
        "param",
        "state",
        "config",
        "const",
        "let",
        "return",
        "for",
        "in",
        "if",
        "else",
        "where",
        "grid",
        "grad",
        "as",
        "true",
        "false",
        "self",
        "inf",
        "nan",
    }
)

# Longest first, so that `..=` wins over `..` and `->` over `-`.
PUNCTUATION = (
    "..=",
    "->",
    "==",
    "!=",
    "<=",
    ">=",
    "&&",
    "||",
    "::",
    "..",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    ">",
    "=",
    "!",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ";",
    ".",
    "@",
)


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "int", "float", "string", "kw", "punct", "eof"
    text: str
    span: Span
    newline_before: bool = False

    def is_(self, text: str) -> bool:
        return self.kind in ("kw", "punct") and self.text == text


def tokenize(source: SourceFile, start: int = 0) -> tuple[list[Token], list[Diagnostic]]:
    """Split ``source`` into tokens, from offset ``start`` on (the spans are still offsets in
    the whole text); unknown characters become diagnostics, not exceptions.

    >>> toks, errs = tokenize(SourceFile("m.linnet", "let y = x + 1.5"))
    >>> [t.text for t in toks]
    ['let', 'y', '=', 'x', '+', '1.5', '']
    >>> [t.span.start for t in tokenize(SourceFile("m.linnet", "let y = x"), 6)[0]]
    [6, 8, 9]
    """
    if source.text.isascii() if start == 0 else source.text[start:].isascii():
        return _tokenize_ascii(source, start)
    return _tokenize_chars(source, start)


# The same tokens as _tokenize_chars, one regular expression match each: lexing was a third of
# checking the Llama example (tests/test_lexer.py compares the two). ASCII only: `isalpha`,
# `isdigit` and `\w` differ on other characters, which the character loop handles.
_TOKEN = re.compile(
    r"""
    (?P<newline>\n)
  | (?P<space>[ \t\r]+)
  | (?P<comment>//[^\n]*)
  | (?P<block>/\*)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9][0-9_]*(?P<fraction>\.[0-9][0-9_]*)?(?P<exponent>[eE][+-]?[0-9]+)?)
  | (?P<string>"[^"\n]*"?)
  | (?P<punct>"""
    + "|".join(re.escape(p) for p in PUNCTUATION)
    + r""")
""",
    re.VERBOSE,
)


def _tokenize_ascii(source: SourceFile, start: int = 0) -> tuple[list[Token], list[Diagnostic]]:
    text = source.text
    tokens: list[Token] = []
    errors: list[Diagnostic] = []
    append = tokens.append
    match = _TOKEN.match
    i, n = start, len(text)
    newline = False
    while i < n:
        m = match(text, i)
        if m is None:
            ch = text[i]
            errors.append(
                Diagnostic(
                    "E0002",
                    f"unexpected character `{ch}`",
                    Span(source, i, i + 1),
                    "not part of Linnet's syntax",
                    help="comments start with `//`" if ch == "#" else "remove it",
                )
            )
            i += 1
            continue
        kind = m.lastgroup
        j = m.end()
        if kind == "newline":
            newline = True
        elif kind == "space" or kind == "comment":
            pass
        elif kind == "block":
            k = text.find("*/", i + 2)
            if k < 0:
                errors.append(
                    Diagnostic(
                        "E0003",
                        "unterminated block comment",
                        Span(source, i, i + 2),
                        "this comment is never closed",
                        help="close it with `*/`",
                    )
                )
                j = n
            else:
                newline = newline or "\n" in text[i:k]
                j = k + 2
        else:
            word = m.group()
            if kind == "word":
                append(
                    Token("kw" if word in KEYWORDS else "ident", word, Span(source, i, j), newline)
                )
            elif kind == "punct":
                append(Token("punct", word, Span(source, i, j), newline))
            elif kind == "number":
                is_float = m.group("fraction") is not None or m.group("exponent") is not None
                append(
                    Token(
                        "float" if is_float else "int",
                        word.replace("_", ""),
                        Span(source, i, j),
                        newline,
                    )
                )
            else:  # a string: unterminated when the line or the text ends first
                if j - i < 2 or word[-1] != '"':
                    errors.append(
                        Diagnostic(
                            "E0004",
                            "unterminated string literal",
                            Span(source, i, j),
                            "this string is never closed",
                            help='close it with `"` on the same line',
                        )
                    )
                append(Token("string", text[i + 1 : j - 1], Span(source, i, j), newline))
            newline = False
        i = j
    append(Token("eof", "", Span(source, n, n), newline))
    return tokens, errors


def _tokenize_chars(source: SourceFile, start: int = 0) -> tuple[list[Token], list[Diagnostic]]:
    """The lexer one character at a time: the reference, and the path for non-ASCII text."""
    text = source.text
    tokens: list[Token] = []
    errors: list[Diagnostic] = []
    i, n = start, len(text)
    newline = False
    while i < n:
        ch = text[i]
        if ch == "\n":
            newline = True
            i += 1
            continue
        if ch in " \t\r\ufeff":
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                errors.append(
                    Diagnostic(
                        "E0003",
                        "unterminated block comment",
                        Span(source, i, i + 2),
                        "this comment is never closed",
                        help="close it with `*/`",
                    )
                )
                i = n
            else:
                newline = newline or "\n" in text[i:j]
                i = j + 2
            continue
        start = i
        if ch.isalpha() or ch == "_":
            while i < n and (text[i].isalnum() or text[i] == "_"):
                i += 1
            word = text[start:i]
            kind = "kw" if word in KEYWORDS else "ident"
            tokens.append(Token(kind, word, Span(source, start, i), newline))
        elif ch.isdigit():
            while i < n and (text[i].isdigit() or text[i] == "_"):
                i += 1
            is_float = False
            # `0..N` is a range, not a float: a dot counts only when a digit follows it.
            if i + 1 < n and text[i] == "." and text[i + 1].isdigit():
                is_float = True
                i += 1
                while i < n and (text[i].isdigit() or text[i] == "_"):
                    i += 1
            if i < n and text[i] in "eE":
                j = i + 1
                if j < n and text[j] in "+-":
                    j += 1
                if j < n and text[j].isdigit():
                    is_float = True
                    i = j
                    while i < n and text[i].isdigit():
                        i += 1
            tokens.append(
                Token(
                    "float" if is_float else "int",
                    text[start:i].replace("_", ""),
                    Span(source, start, i),
                    newline,
                )
            )
        elif ch == '"':
            i += 1
            while i < n and text[i] not in '"\n':
                i += 1
            if i >= n or text[i] != '"':
                errors.append(
                    Diagnostic(
                        "E0004",
                        "unterminated string literal",
                        Span(source, start, i),
                        "this string is never closed",
                        help='close it with `"` on the same line',
                    )
                )
            else:
                i += 1
            tokens.append(Token("string", text[start + 1 : i - 1], Span(source, start, i), newline))
        else:
            for p in PUNCTUATION:
                if text.startswith(p, i):
                    i += len(p)
                    tokens.append(Token("punct", p, Span(source, start, i), newline))
                    break
            else:
                i += 1
                errors.append(
                    Diagnostic(
                        "E0002",
                        f"unexpected character `{ch}`",
                        Span(source, start, i),
                        "not part of Linnet's syntax",
                        help="comments start with `//`" if ch == "#" else "remove it",
                    )
                )
                continue
        newline = False
    tokens.append(Token("eof", "", Span(source, n, n), newline))
    return tokens, errors
