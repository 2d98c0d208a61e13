"""The lexer's fast path (one regular expression match a token, for ASCII text) gives exactly
the tokens and diagnostics of the character-by-character lexer it replaced (lowering speed,
issue 13 item 7)."""

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang.diagnostics.core import SourceFile
from linnet.lang.syntax.lexer import _tokenize_ascii, _tokenize_chars, tokenize

ROOT = Path(__file__).resolve().parents[3]


def lexed(tokenizer, text: str) -> tuple[list, list]:
    tokens, errors = tokenizer(SourceFile("m.linnet", text))
    return (
        [(t.kind, t.text, t.span.start, t.span.stop, t.newline_before) for t in tokens],
        [d.to_json() for d in errors],
    )


def test_every_linnet_file_in_the_repository_lexes_the_same():
    files = [p for p in ROOT.rglob("*.linnet") if ".venv" not in p.parts]
    assert len(files) > 100  # the examples, the standard library, the diagnostics cases
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert lexed(_tokenize_chars, text) == lexed(tokenize, text), path


# Linnet's characters, weighted towards the ones that start or end tokens, and some that
# are not Linnet at all (`#`, `$`, a form feed, a NUL).
PIECES = [
    "let",
    "x",
    "_a1",
    "0",
    "12",
    "1_0",
    ".",
    "..",
    "..=",
    "5e",
    "e",
    "E",
    "+",
    "-",
    "2.5",
    "1e-3",
    "3.",
    "/",
    "*",
    "//",
    "/*",
    "*/",
    '"',
    '"s"',
    "\n",
    " ",
    "\t",
    "\r",
    "->",
    "==",
    "!",
    "=",
    "<",
    ">",
    "&",
    "&&",
    "|",
    "||",
    ":",
    "::",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ";",
    "@",
    "%",
    "#",
    "$",
    "\f",
    "\x00",
    "~",
    "'",
    "fn",
    "inf",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
def test_any_ascii_text_lexes_the_same(text):
    assert lexed(_tokenize_chars, text) == lexed(_tokenize_ascii, text)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=60))
def test_any_characters_lex_the_same(text):
    assert lexed(_tokenize_chars, text) == lexed(tokenize, text)


def test_non_ascii_text_takes_the_character_loop():
    text = "let \u00e9t\u00e9 = x\ufeff + \u00bd"
    assert lexed(tokenize, text) == lexed(_tokenize_chars, text)
    assert [t[1] for t in lexed(tokenize, text)[0]][:2] == ["let", "\u00e9t\u00e9"]
