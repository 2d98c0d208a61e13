"""The Pygments lexer for Linnet (linnet.lang.syntax.highlight, issue 46 item 16): found by
its alias through the entry point, its token classes, and agreement with the compiler's lexer
on what is not Linnet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pygments")

from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang.diagnostics.core import SourceFile
from linnet.lang.syntax import highlight
from linnet.lang.syntax.lexer import KEYWORDS, tokenize
from pygments.token import (
    Comment,
    Error,
    Keyword,
    Name,
    Number,
    Operator,
    String,
)
from test_lexer import PIECES

ROOT = Path(__file__).resolve().parents[3]
STD = ROOT / "packages" / "linnet-lang" / "src" / "linnet" / "lang" / "std"
SOURCES = sorted(STD.rglob("*.linnet")) + sorted((ROOT / "examples").rglob("*.linnet"))


def tokens(text: str) -> list[tuple[object, str]]:
    """(token type, text) of every token but whitespace."""
    return [(t, v) for t, v in highlight.LinnetLexer().get_tokens(text) if v.strip()]


def kind_of(text: str, word: str) -> object:
    """The token type of ``word``'s first occurrence in ``text``."""
    return next(t for t, v in tokens(text) if v == word)


def test_pygments_finds_the_lexer_by_alias_and_file_name():
    """The `pygments.lexers` entry point: how pymdownx.highlight and pygmentize find it."""
    from pygments.lexers import get_lexer_by_name, get_lexer_for_filename

    assert type(get_lexer_by_name("linnet")).__name__ == "LinnetLexer"
    assert type(get_lexer_for_filename("llama.linnet")).__name__ == "LinnetLexer"


def test_linnet_lang_does_not_import_pygments():
    """Pygments is an optional extra: the compiler and its CLI never import it."""
    code = (
        "import sys, linnet.lang, linnet.lang.cli\n"
        "assert 'pygments' not in sys.modules, 'pygments imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_every_keyword_has_one_role():
    roles = [
        highlight.DECLARATIONS,
        highlight.CONSTANTS,
        highlight.CONTROL,
        highlight.NAMESPACE,
        highlight.SELF,
    ]
    words = [w for role in roles for w in role]
    assert sorted(words) == sorted(KEYWORDS), "each reserved word in exactly one role"


SAMPLE = """\
use std.nn.linear::{Linear, linear}

/// A documented model.
pub model Stack<D: Dim, L: Dim, T: DType = f32> where D >= 2 {
    config eps: f32 = 1e-5
    param scale: Tensor[D; T]
    block model: Linear<D, D, T>(bias = true) if !tie

    entry run<N: Dim>(x: Tensor[N, D; T]) -> Tensor[N, D; T] {
        let y[n, (h: 2, d), i: D / 2] = x[n, (h, d)] * self.scale[d] // a comment
        let total = sum<f64>[k: N] x[k, 0] as f64 + max[c] y[c]
        for i in 0..=L { y = exp(y) }
        return self.model(y) + 1_000 + -inf /* block */
    }
}

kernel rows<R: Dim, B: Dim>(x: Tensor[R; f32]) -> y: Tensor[R; f32] grid(R)
    scratch(seen: Tensor[1; i32]) {
    store(y[iota<i32>(B)], load(x[0]), atomic_add(seen[0], 1) == 0)
}

pub op double<R: Dim>(x: Tensor[R; f32]) -> Tensor[R; f32] kernel rows<R, 8> then rows<R, 16> {
    return bitcast<f32>(bitcast<i32>(x * 2.0))
} grad(dy) {
    return dy * 2.0
}
"""


@pytest.mark.parametrize(
    ("word", "kind"),
    [
        ("use", Keyword.Namespace),
        ("std.nn.linear", Name.Namespace),
        ("Linear", Name.Class),
        ("/// A documented model.", String.Doc),
        ("pub", Keyword),
        ("model", Keyword.Declaration),
        ("Stack", Name.Class),
        ("D", Name.Constant),  # a dim
        ("T", Name.Constant),  # a dtype generic
        ("Dim", Keyword.Type),
        ("DType", Keyword.Type),
        ("f32", Keyword.Type),
        ("where", Keyword),
        ("1e-5", Number.Float),
        ("eps", Name.Attribute),  # a member
        ("scale", Name.Attribute),
        ("Tensor", Keyword.Type),
        ("true", Keyword.Constant),
        ("run", Name.Function),
        ("->", Operator),
        ("y", Name.Variable),  # bound by `let`
        ("n", Name.Variable),  # an index variable of the binder
        ("h", Name.Variable),  # inside a composite binder
        ("self", Name.Builtin.Pseudo),
        ("// a comment", Comment.Single),
        ("sum", Name.Builtin),
        ("k", Name.Variable),  # a reduction's variable
        ("max", Name.Builtin),
        ("..=", Operator),
        ("exp", Name.Builtin),
        ("1_000", Number.Integer),
        ("inf", Keyword.Constant),
        ("/* block */", Comment.Multiline),
        ("grid", Keyword),
        ("scratch", Keyword),
        ("iota", Name.Builtin),
        ("atomic_add", Name.Builtin),
        ("bitcast", Name.Builtin),
        ("double", Name.Function),
        ("then", Keyword),
        ("grad", Keyword),
    ],
)
def test_token_classes(word, kind):
    assert kind_of(SAMPLE, word) is kind


def test_a_member_named_like_a_keyword_is_a_member():
    """`block model: ...` and `self.model` (docs/language.md: such words may name members)."""
    assert [v for t, v in tokens(SAMPLE) if t is Name.Attribute].count("model") == 2


def test_ranges_are_not_numbers():
    assert [(t, v) for t, v in tokens("0..N")] == [
        (Number.Integer, "0"),
        (Operator, ".."),
        (Name.Constant, "N"),
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_std_and_example_sources_lex_without_errors(path: Path):
    text = path.read_text(encoding="utf-8")
    lexed = list(highlight.LinnetLexer().get_tokens_unprocessed(text))
    assert "".join(v for _, _, v in lexed) == text
    bad = [(text[:i].count("\n") + 1, v) for i, t, v in lexed if t in Error]
    assert not bad, f"{path.name}: Error tokens at (line, text) {bad}"


def test_sources_are_found():
    assert len(SOURCES) >= 15  # the standard library and the Llama example


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("let x = 1 # not a comment", "#"),
        ('let s = "never closed', '"never closed'),
        ("/* never closed\nlet x = 1", "/*"),
        ("let a = b & c", "&"),
    ],
)
def test_what_the_compiler_rejects_is_an_error_token(text, bad):
    assert (Error, bad) in tokens(text)


def error_starts(text: str) -> list[int]:
    return [i for i, t, _ in highlight.LinnetLexer().get_tokens_unprocessed(text) if t in Error]


def diagnostic_starts(text: str) -> list[int]:
    _, errors = tokenize(SourceFile("m.linnet", text))
    return sorted(d.span.start for d in errors if d.span is not None)


# test_lexer's pieces, and the openings of this lexer's own states (binders, reductions,
# members, chains).
STATEFUL = [*PIECES, "let y[", "sum[", "max<f64>[", "i: (", "self.", "then k<", "block m:", "\x0b"]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(st.sampled_from(STATEFUL), max_size=40).map("".join),
        st.text(st.characters(max_codepoint=127), max_size=60),
    )
)
def test_error_tokens_are_where_the_compiler_reports_lexical_errors(text):
    """On any ASCII text, the lexer never raises, keeps every character, and marks an Error
    exactly where the compiler's lexer reports E0002, E0003 or E0004."""
    lexed = list(highlight.LinnetLexer().get_tokens_unprocessed(text))
    assert "".join(v for _, _, v in lexed) == text
    assert error_starts(text) == diagnostic_starts(text)
