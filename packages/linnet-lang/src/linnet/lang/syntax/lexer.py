"""Turns Linnet source into tokens. Comments are `// ...` and `/* ... */`."""

from __future__ import annotations

from dataclasses import dataclass

from linnet.lang.diagnostics.core import Diagnostic, SourceFile, Span

KEYWORDS = frozenset({
    "pub", "use", "op", "fn", "kernel", "block", "model", "entry", "param", "state",
    "config", "const", "let", "return", "for", "in", "if", "else", "where", "grid", "grad",
    "as", "true", "false", "self", "inf", "nan",
})

# Longest first, so that `..=` wins over `..` and `->` over `-`.
PUNCTUATION = (
    "..=", "->", "==", "!=", "<=", ">=", "&&", "||", "::", "..",
    "+", "-", "*", "/", "%", "<", ">", "=", "!", "(", ")", "[", "]", "{", "}",
    ",", ":", ";", ".", "@",
)


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "int", "float", "string", "kw", "punct", "eof"
    text: str
    span: Span
    newline_before: bool = False

    def is_(self, text: str) -> bool:
        return self.kind in ("kw", "punct") and self.text == text


def tokenize(source: SourceFile) -> tuple[list[Token], list[Diagnostic]]:
    """Split ``source`` into tokens; unknown characters become diagnostics, not exceptions.

    >>> toks, errs = tokenize(SourceFile("m.linnet", "let y = x + 1.5"))
    >>> [t.text for t in toks]
    ['let', 'y', '=', 'x', '+', '1.5', '']
    """
    text = source.text
    tokens: list[Token] = []
    errors: list[Diagnostic] = []
    i, n = 0, len(text)
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
                errors.append(Diagnostic(
                    "E0003", "unterminated block comment", Span(source, i, i + 2),
                    "this comment is never closed", help="close it with `*/`"))
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
            tokens.append(Token("float" if is_float else "int", text[start:i].replace("_", ""),
                                Span(source, start, i), newline))
        elif ch == '"':
            i += 1
            while i < n and text[i] not in '"\n':
                i += 1
            if i >= n or text[i] != '"':
                errors.append(Diagnostic("E0004", "unterminated string literal",
                                         Span(source, start, i), "this string is never closed",
                                         help='close it with `"` on the same line'))
            else:
                i += 1
            tokens.append(Token("string", text[start + 1:i - 1], Span(source, start, i), newline))
        else:
            for p in PUNCTUATION:
                if text.startswith(p, i):
                    i += len(p)
                    tokens.append(Token("punct", p, Span(source, start, i), newline))
                    break
            else:
                i += 1
                errors.append(Diagnostic(
                    "E0002", f"unexpected character `{ch}`", Span(source, start, i),
                    "not part of Linnet's syntax",
                    help="comments start with `//`" if ch == "#" else "remove it"))
                continue
        newline = False
    tokens.append(Token("eof", "", Span(source, n, n), newline))
    return tokens, errors
