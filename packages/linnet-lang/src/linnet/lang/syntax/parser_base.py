"""The parser's state and its token helpers: the cursor over the lexer's tokens, errors with
recovery (:class:`_Bail` unwinds to the nearest recovery point), the nesting limit, and the
keywords and limits every part of the parser reads. :mod:`linnet.lang.syntax.parser_body`
(types, statements, expressions) and :mod:`linnet.lang.syntax.parser` (items, declarations,
:func:`~linnet.lang.syntax.parser.parse`) build on :class:`ParserBase`.

>>> from linnet.lang.diagnostics.core import SourceFile
>>> p = ParserBase(SourceFile("m.linnet", "let x = 1"), "m")
>>> p.tok.text, p.advance().text, p.tok.text
('let', 'let', 'x')
"""

from __future__ import annotations

from linnet.lang.diagnostics.core import Diagnostic, SourceFile, Span
from linnet.lang.syntax.lexer import Token, tokenize

REDUCTIONS = frozenset({"sum", "max", "min", "mean", "prod"})
ITEM_STARTS = frozenset({"pub", "use", "op", "fn", "kernel", "block", "model", "const"})
MEMBER_STARTS = frozenset({"param", "state", "block", "config", "fn", "entry", "pub"})
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
# How deeply brackets, unary operators, types and blocks may nest, and how deep a syntax tree
# may grow (`1 + 1 + ... + 1` is flat text but a deep tree). The parser, the checker and
# lowering recurse over both; past these limits a program gets a diagnostic (E0118, E0119)
# instead of a Python RecursionError. Real models nest a dozen levels at most.
MAX_NESTING = 64
MAX_TREE_DEPTH = 128
# Integer literals must fit in 64 bits; longer digit strings are refused before `int()`,
# which also raises past 4,300 digits.
MAX_INT = 2**63 - 1
# Keywords that may still name members and fields (`block model: ...`, `self.model`).
SOFT_KEYWORDS = frozenset(
    {"model", "block", "param", "state", "config", "entry", "kernel", "op", "grad", "grid", "use"}
)


# Keywords people pick as variable names (`let state = ...`): after E0101 they parse as names.
NOUN_KEYWORDS = frozenset(
    {
        "model",
        "block",
        "param",
        "state",
        "config",
        "entry",
        "kernel",
        "op",
        "grad",
        "grid",
        "use",
        "const",
    }
)


class _Bail(Exception):
    """Unwinds to the nearest recovery point after a syntax error was recorded."""


class ParserBase:
    """A cursor over one source file's tokens, with the errors found so far."""

    def __init__(self, source: SourceFile, module_name: str, start: int = 0):
        self.source = source
        self.module_name = module_name
        self.tokens, self.errors = tokenize(source, start)
        # A line the lexer already complained about gets no follow-on syntax errors.
        self.lexer_error_lines = {e.span.line for e in self.errors if e.span is not None}
        self.misused_keywords: set[str] = set()  # reported once (E0101), then read as names
        self.pos = 0
        self.nesting = 0  # inside () or [] newlines do not end statements
        self.depth = 0  # recursion depth of the descent (E0118 past MAX_NESTING)
        self.too_deep_reported = False

    # ------------------------------------------------------------ token helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def at(self, text: str) -> bool:
        tok = self.tokens[self.pos]  # Token.is_, inlined: the parser's most frequent call
        return tok.text == text and tok.kind in ("kw", "punct")

    def advance(self) -> Token:
        tok = self.tok
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def accept(self, text: str) -> Token | None:
        if self.at(text):
            return self.advance()
        return None

    def error(
        self, message: str, span: Span, label: str = "", help: str = "", code: str = "E0100"
    ) -> _Bail:
        if span.line not in self.lexer_error_lines:
            self.errors.append(Diagnostic(code, message, span, label, help=help))
        return _Bail()

    def enter(self) -> None:
        """One level deeper into the descent; refuses to go past MAX_NESTING (E0118)."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            self.depth -= 1
            if self.too_deep_reported:  # once per item: recovery may go that deep again
                raise _Bail()
            self.too_deep_reported = True
            raise self.error(
                f"this is nested more than {MAX_NESTING} levels deep",
                self.tok.span,
                "nesting limit reached here",
                code="E0118",
                help="name the inner parts with `let` statements, or remove redundant "
                "brackets and signs",
            )

    def describe(self, tok: Token) -> str:
        if tok.kind == "eof":
            return "end of file"
        return f"`{tok.text}`"

    def expect(self, text: str, help: str = "") -> Token:
        if self.at(text):
            return self.advance()
        raise self.error(
            f"expected `{text}`, found {self.describe(self.tok)}",
            self.tok.span,
            f"expected `{text}` here",
            help=help,
        )

    def ident(self, what: str = "a name", soft: bool = False) -> Token:
        if self.tok.kind == "ident" or (soft and self.tok.text in SOFT_KEYWORDS):
            return self.advance()
        if self.tok.kind == "kw" and self.tok.text in NOUN_KEYWORDS:
            # Report the keyword once and read it as a name, so its later uses do not cascade.
            self.error(
                f"`{self.tok.text}` is a keyword and cannot be used as {what}",
                self.tok.span,
                "reserved word",
                help=f"pick another name, e.g. `{self.tok.text}_`",
                code="E0101",
            )
            self.misused_keywords.add(self.tok.text)
            return self.advance()
        if self.tok.kind == "kw":
            raise self.error(
                f"`{self.tok.text}` is a keyword and cannot be used as {what}",
                self.tok.span,
                "reserved word",
                help=f"pick another name, e.g. `{self.tok.text}_`",
                code="E0101",
            )
        raise self.error(
            f"expected {what}, found {self.describe(self.tok)}", self.tok.span, f"expected {what}"
        )

    def span_from(self, start: Span) -> Span:
        prev = self.tokens[self.pos - 1] if self.pos > 0 else self.tok
        return Span(self.source, start.start, max(prev.span.stop, start.start))

    # ------------------------------------------------------------ recovery
    def skip_item(self) -> None:
        """Skip to the next top-level item keyword, jumping over balanced braces."""
        depth = 0
        while self.tok.kind != "eof":
            if self.at("{"):
                depth += 1
            elif self.at("}"):
                depth -= 1
                if depth <= 0:
                    self.advance()
                    if depth == 0:
                        return
                    depth = 0
                    continue
            elif (
                depth == 0
                and self.tok.kind == "kw"
                and self.tok.text in ITEM_STARTS
                and self.tok.newline_before
            ):
                return
            self.advance()

    def skip_statement(self) -> None:
        depth = 0
        start = self.pos
        while self.tok.kind != "eof":
            if self.pos > start and self.tok.newline_before and depth <= 0:
                return
            if self.at("{") or self.at("(") or self.at("["):
                depth += 1
            elif self.at("}") or self.at(")") or self.at("]"):
                if depth <= 0:
                    if self.at("}"):
                        return
                    # The statement bailed inside brackets: its closer is part of it.
                    self.advance()
                    continue
                depth -= 1
            elif self.at(";") and depth <= 0:
                self.advance()
                return
            self.advance()
