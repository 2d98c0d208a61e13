"""A Pygments lexer for Linnet source, registered as the ``pygments.lexers`` entry point
``linnet`` (alias ``linnet``, files ``*.linnet``).

Nothing in ``linnet.lang`` imports this module: Pygments loads it through the entry point
when a lexer for ``linnet`` is asked for (``pygmentize -l linnet``, a ```` ```linnet ````
fence under ``pymdownx.highlight``), so Pygments is needed only then (the ``highlight``
extra installs it). The operators come from the compiler's own lexer
(:mod:`linnet.lang.syntax.lexer`), and tests/test_highlight.py checks that every reserved
word has a role here and that an ``Error`` token marks exactly what the compiler's lexer
rejects (E0002, E0003, E0004).

>>> from pygments.lexers import get_lexer_by_name
>>> lexer = get_lexer_by_name("linnet")
>>> [v for t, v in lexer.get_tokens("let y[n] = x[n]") if t in Name.Variable]
['y', 'n']
"""

from __future__ import annotations

import re

from linnet.lang.syntax.lexer import PUNCTUATION
from pygments.lexer import RegexLexer, bygroups, include, words
from pygments.token import (
    Comment,
    Error,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    String,
    Whitespace,
)

# Reserved words by role. Every word of the compiler's KEYWORDS is in exactly one of these
# (tests/test_highlight.py checks it), so a new keyword cannot be left plain.
DECLARATIONS = (
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
)
CONSTANTS = ("true", "false", "inf", "nan")
CONTROL = ("pub", "return", "for", "in", "if", "else", "where", "grid", "grad", "as")
NAMESPACE = ("use",)
SELF = ("self",)

# Types the checker knows by name (E0352's element types, `Tensor`, the two generic kinds).
TYPES = (
    "Tensor",
    "Dim",
    "DType",
    "bf16",
    "f16",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "bool",
)
# Built-in functions (docs/language.md, "Built-in functions" and "Kernels"): highlighted
# where they are called, since `max`, `load` and the rest are ordinary names elsewhere.
BUILTINS = (
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "floor",
    "abs",
    "max",
    "min",
    "pow",
    "select",
    "iota",
    "fill",
    "bitcast",
    "program_id",
    "load",
    "store",
    "atomic_add",
)
REDUCTIONS = ("sum", "mean", "prod", "max", "min")

# The compiler's operators, longest first (as its lexer tries them); brackets, `,`, `:`, `;`
# and `.` are punctuation.
_BRACKETS = {"(", ")", "[", "]", "{", "}", ",", ":", ";", "."}
OPERATORS = tuple(p for p in PUNCTUATION if p not in _BRACKETS)

# A name: a letter or `_`, then letters, digits and `_` (`str.isalpha`, as the compiler's
# character loop reads non-ASCII source).
_NAME = r"[^\W\d]\w*"
# Dims, dtype generics and constants are upper case by convention (`N`, `HD`, `T`, `EPS`);
# block and model types are capitalised words with a lower-case letter (`Linear`, `LlamaModel`).
_UPPER = r"[A-Z][A-Z0-9_]*\b"
_CLASS = r"[A-Z]\w*[a-z]\w*"
# The compiler's whitespace, which is less than `\s` (a form feed is E0002 there).
_SPACE = r"[ \t\r\n\ufeff]"
_GAP = f"({_SPACE}+)"  # a group: at least one space
_PAD = f"({_SPACE}*)"  # a group: maybe spaces


class LinnetLexer(RegexLexer):
    """Pygments lexer for the Linnet language (``.linnet`` files).

    Token classes: keywords by role (``Keyword.Declaration`` for ``op fn kernel block model
    entry param state config const let``, ``Keyword.Namespace`` for ``use``,
    ``Keyword.Constant`` for ``true false inf nan``), ``Keyword.Type`` for ``Tensor``,
    ``Dim``, ``DType`` and element types, ``Name.Constant`` for upper-case dims and generics,
    ``Name.Class`` for block types, ``Name.Function`` for declared items and kernel
    bindings, ``Name.Builtin`` for built-in functions and reductions, ``Name.Variable`` for
    the names a ``let`` binds and the index variables of index notation and reductions,
    ``Name.Attribute`` for members (``self.weight``, ``param weight: ...``).

    >>> [str(t) for t, v in LinnetLexer().get_tokens("sum[k] a[k]") if v.strip()][:4]
    ['Token.Name.Builtin', 'Token.Punctuation', 'Token.Name.Variable', 'Token.Punctuation']
    """

    name = "Linnet"
    aliases = ["linnet"]  # noqa: RUF012 (Pygments reads these class attributes)
    filenames = ["*.linnet"]  # noqa: RUF012
    mimetypes = ["text/x-linnet"]  # noqa: RUF012
    flags = re.MULTILINE | re.UNICODE

    tokens = {  # noqa: RUF012
        "root": [
            include("space"),
            # `pub op name`, `kernel name`, `entry name`, and `kernel name<...>` in a binding.
            (
                rf"\b(op|fn|kernel|entry){_GAP}({_NAME})",
                bygroups(Keyword.Declaration, Whitespace, Name.Function),
            ),
            # A chain's `then next<...>` (a word only there, as in the compiler's parser).
            (
                rf"\b(then){_GAP}({_NAME})(?={_SPACE}*<)",
                bygroups(Keyword, Whitespace, Name.Function),
            ),
            # `scratch(...)` after a kernel's grid: a word only there.
            (rf"\b(scratch)(?={_SPACE}*\()", Keyword),
            # Members: `param w: ...`, `block proj: Linear<...>` (a member may be named
            # `model` or `block`: the name is whatever word comes before the `:`).
            (
                rf"\b(param|state|config|block){_GAP}({_NAME})(?={_SPACE}*:)",
                bygroups(Keyword.Declaration, Whitespace, Name.Attribute),
            ),
            # Items: `block Layer<...>`, `model Llama<...>`.
            (
                rf"\b(block|model){_GAP}({_NAME})",
                bygroups(Keyword.Declaration, Whitespace, Name.Class),
            ),
            (
                rf"\b(const){_GAP}({_NAME})",
                bygroups(Keyword.Declaration, Whitespace, Name.Constant),
            ),
            # Index notation: `let y[r, c] = ...` binds `y` and the index variables r, c.
            (
                rf"\b(let){_GAP}({_NAME}){_PAD}(\[)",
                bygroups(Keyword.Declaration, Whitespace, Name.Variable, Whitespace, Punctuation),
                "indices",
            ),
            (rf"\b(let){_GAP}({_NAME})", bygroups(Keyword.Declaration, Whitespace, Name.Variable)),
            (rf"\b(use){_GAP}([\w.]+)", bygroups(Keyword.Namespace, Whitespace, Name.Namespace)),
            (rf"\b(for){_GAP}({_NAME})", bygroups(Keyword, Whitespace, Name.Variable)),
            # Reductions: `sum[k] ...`, `sum<f64>[k] ...` bind their index variables.
            (
                words(REDUCTIONS, prefix=r"\b", suffix=rf"{_PAD}(\[)"),
                bygroups(Name.Builtin, Whitespace, Punctuation),
                "indices",
            ),
            (
                words(
                    REDUCTIONS, prefix=r"\b", suffix=rf"{_PAD}(<){_PAD}({_NAME}){_PAD}(>){_PAD}(\[)"
                ),
                bygroups(
                    Name.Builtin,
                    Whitespace,
                    Operator,
                    Whitespace,
                    Keyword.Type,
                    Whitespace,
                    Operator,
                    Whitespace,
                    Punctuation,
                ),
                "indices",
            ),
            include("expression"),
        ],
        "space": [
            (r"[ \t\r\n\ufeff]+", Whitespace),
            (r"///[^\n]*", String.Doc),
            (r"//[^\n]*", Comment.Single),
            (r"/\*[\s\S]*?\*/", Comment.Multiline),
            # Never closed (E0003): the compiler reports the `/*`, and the rest of the file is
            # the comment.
            (r"(/\*)([\s\S]*)", bygroups(Error, Comment.Multiline)),
        ],
        "expression": [
            include("space"),
            # `self.weight`, `self.layers[0].attn`: a member after a dot (any word, keywords
            # included). `..` and `..=` are ranges, tried first.
            (r"\.\.=?", Operator),
            (rf"(\.){_PAD}({_NAME})", bygroups(Punctuation, Whitespace, Name.Attribute)),
            (words(DECLARATIONS, prefix=r"\b", suffix=r"\b"), Keyword.Declaration),
            (words(NAMESPACE, prefix=r"\b", suffix=r"\b"), Keyword.Namespace),
            (words(CONSTANTS, prefix=r"\b", suffix=r"\b"), Keyword.Constant),
            (words(CONTROL, prefix=r"\b", suffix=r"\b"), Keyword),
            (words(SELF, prefix=r"\b", suffix=r"\b"), Name.Builtin.Pseudo),
            (words(TYPES, prefix=r"\b", suffix=r"\b"), Keyword.Type),
            (words(BUILTINS, prefix=r"\b", suffix=rf"(?={_SPACE}*[(<])"), Name.Builtin),
            # A dot counts as part of a number only when a digit follows it (`0..N` is a range).
            (r"[0-9][0-9_]*(\.[0-9][0-9_]*([eE][+-]?[0-9]+)?|[eE][+-]?[0-9]+)", Number.Float),
            (r"[0-9][0-9_]*", Number.Integer),
            (r'"[^"\n]*"', String.Double),
            # Never closed on its line (E0004).
            (r'"[^"\n]*', Error),
            (_UPPER, Name.Constant),
            (_CLASS, Name.Class),
            (_NAME, Name),
            (words(OPERATORS), Operator),
            (r"[()\[\]{},:;.]", Punctuation),
            # Anything else is not Linnet (E0002: `#` is not a comment, `?`, `$`, ...).
            (r".", Error),
        ],
        # The brackets of a `let` binder or a reduction: index variables, ranges (`d: N`,
        # `i: HD / 2`) and composite binders (`(b, t)`), up to the matching `]`.
        "indices": [
            include("space"),
            (r"\[", Punctuation, "#push"),
            (r"\]", Punctuation, "#pop"),
            (r"(:)", Punctuation, "range"),
            (_UPPER, Name.Constant),
            (_NAME, Name.Variable),
            include("expression"),
        ],
        # After `:` in a binder, a range over dims (`HD / 2`, `(N + 1) / 2`): up to the next
        # `,`, `)` or `]` outside its own parentheses, which the binder's state then reads.
        "range": [
            include("space"),
            (r"\(", Punctuation, "range-parens"),
            (r"(?=[,)\]])", bygroups(), "#pop"),
            include("expression"),
        ],
        "range-parens": [
            include("space"),
            (r"\(", Punctuation, "#push"),
            (r"\)", Punctuation, "#pop"),
            include("expression"),
        ],
    }
