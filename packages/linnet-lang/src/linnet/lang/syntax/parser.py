"""Recursive-descent parser with error recovery: one run reports every syntax error it can.

A statement ends at the end of its line unless the line ends inside brackets (`(`, `[`);
`;` also ends one. To continue an expression on the next line, wrap it in parentheses. Reductions (`sum[k] a * b`) take the
multiplicative expression that follows them.
"""

from __future__ import annotations

import dataclasses

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, SourceFile, Span
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
SOFT_KEYWORDS = frozenset({"model", "block", "param", "state", "config", "entry", "kernel", "op",
                           "grad", "grid", "use"})


# Keywords people pick as variable names (`let state = ...`): after E0101 they parse as names.
NOUN_KEYWORDS = frozenset({"model", "block", "param", "state", "config", "entry", "kernel", "op",
                           "grad", "grid", "use", "const"})


class _Bail(Exception):
    """Unwinds to the nearest recovery point after a syntax error was recorded."""


class Parser:
    def __init__(self, source: SourceFile, module_name: str):
        self.source = source
        self.module_name = module_name
        self.tokens, self.errors = tokenize(source)
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

    def error(self, message: str, span: Span, label: str = "", help: str = "",
              code: str = "E0100") -> _Bail:
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
                f"this is nested more than {MAX_NESTING} levels deep", self.tok.span,
                "nesting limit reached here", code="E0118",
                help="name the inner parts with `let` statements, or remove redundant "
                     "brackets and signs")

    def describe(self, tok: Token) -> str:
        if tok.kind == "eof":
            return "end of file"
        return f"`{tok.text}`"

    def expect(self, text: str, help: str = "") -> Token:
        if self.at(text):
            return self.advance()
        raise self.error(f"expected `{text}`, found {self.describe(self.tok)}", self.tok.span,
                         f"expected `{text}` here", help=help)

    def ident(self, what: str = "a name", soft: bool = False) -> Token:
        if self.tok.kind == "ident" or (soft and self.tok.text in SOFT_KEYWORDS):
            return self.advance()
        if self.tok.kind == "kw" and self.tok.text in NOUN_KEYWORDS:
            # Report the keyword once and read it as a name, so its later uses do not cascade.
            self.error(f"`{self.tok.text}` is a keyword and cannot be used as {what}",
                       self.tok.span, "reserved word",
                       help=f"pick another name, e.g. `{self.tok.text}_`", code="E0101")
            self.misused_keywords.add(self.tok.text)
            return self.advance()
        if self.tok.kind == "kw":
            raise self.error(f"`{self.tok.text}` is a keyword and cannot be used as {what}",
                             self.tok.span, "reserved word",
                             help=f"pick another name, e.g. `{self.tok.text}_`", code="E0101")
        raise self.error(f"expected {what}, found {self.describe(self.tok)}", self.tok.span,
                         f"expected {what}")

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
            elif depth == 0 and self.tok.kind == "kw" and self.tok.text in ITEM_STARTS \
                    and self.tok.newline_before:
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

    # ------------------------------------------------------------ module
    def parse_module(self) -> A.Module:
        module = A.Module(self.module_name, self.source)
        while self.tok.kind != "eof":
            start = self.pos
            self.too_deep_reported = False
            try:
                item = self.parse_item()
                if item is not None:
                    module.items.append(item)
            except _Bail:
                if self.pos == start:
                    self.advance()
                self.skip_item()
        for item in module.items:
            if isinstance(item, A.FuncDecl | A.BlockDecl):
                item.module = module
            if isinstance(item, A.BlockDecl):
                for method in item.methods:
                    method.module = module
                    method.owner = item
        return module

    def parse_item(self) -> A.Item | None:
        if self.accept(";"):
            return None
        start = self.tok.span
        public = bool(self.accept("pub"))
        if self.at("use"):
            return self.parse_use(start)
        if self.at("op") or self.at("fn") or self.at("kernel"):
            return self.parse_func(self.advance().text, public, start)
        if self.at("block") or self.at("model"):
            return self.parse_block_decl(self.advance().text, public, start)
        if self.at("const"):
            return self.parse_const(public, start)
        help = "a module holds `use`, `op`, `fn`, `kernel`, `block`, `model` and `const` items"
        if self.tok.kind == "ident" and self.tok.text in ("def", "func", "function"):
            help = "functions are declared with `fn` (or `op` for index-notation ops)"
        raise self.error(f"expected an item, found {self.describe(self.tok)}", self.tok.span,
                         "not an item", help=help, code="E0102")

    def parse_use(self, start: Span) -> A.Use:
        self.expect("use")
        path = [self.ident("a module name").text]
        while self.accept("."):
            path.append(self.ident("a module name").text)
        names: list[tuple[str, Span]] = []
        if self.accept("::"):
            if self.accept("{"):
                while not self.at("}"):
                    t = self.ident("an imported name")
                    names.append((t.text, t.span))
                    if not self.accept(","):
                        break
                self.expect("}")
            else:
                t = self.ident("an imported name")
                names.append((t.text, t.span))
        return A.Use(path, names, self.span_from(start))

    def parse_const(self, public: bool, start: Span) -> A.Const:
        self.expect("const")
        name = self.ident("a constant name").text
        typ = self.parse_type() if self.accept(":") else None
        self.expect("=")
        value = self.parse_expr()
        return A.Const(public, name, typ, value, self.span_from(start))

    def parse_generics(self) -> list[A.Generic]:
        generics: list[A.Generic] = []
        if not self.accept("<"):
            return generics
        while not self.at(">"):
            t = self.ident("a generic parameter")
            self.expect(":", help="generics say their kind: `<R: Dim, T: DType>`")
            kind_tok = self.tok
            kind = self.ident("`Dim` or `DType`").text
            if kind not in ("Dim", "DType"):
                raise self.error(f"unknown generic kind `{kind}`", kind_tok.span,
                                 "expected `Dim` or `DType`",
                                 help="a generic is a dimension (`Dim`) or an element type "
                                      "(`DType`)", code="E0103")
            default = None
            if self.accept("="):
                default = self.parse_type_or_dim_noangle()
            generics.append(A.Generic(t.text, kind, self.span_from(t.span), default))
            if not self.accept(","):
                break
        self.expect(">")
        return generics

    def parse_where(self) -> list[A.Expr]:
        clauses: list[A.Expr] = []
        if self.accept("where"):
            while True:
                clauses.append(self.parse_expr(no_brace=True))
                if not self.accept(","):
                    break
                if self.at("{"):
                    break
        return clauses

    def parse_params(self) -> list[A.Param]:
        self.expect("(")
        self.nesting += 1
        params: list[A.Param] = []
        try:
            while not self.at(")"):
                if self.at("self"):
                    self.advance()  # methods may spell out `self`; it is implicit anyway
                else:
                    t = self.ident("a parameter name")
                    self.expect(":", help="parameters have types: `x: Tensor[N, D; f32]`")
                    typ = self.parse_type()
                    params.append(A.Param(t.text, typ, self.span_from(t.span)))
                if not self.accept(","):
                    break
            self.expect(")")
        finally:
            self.nesting -= 1
        return params

    def parse_results(self) -> list[A.Result]:
        results: list[A.Result] = []
        if not self.accept("->"):
            return results
        paren = bool(self.accept("("))
        if paren:
            self.nesting += 1
        try:
            while True:
                start = self.tok.span
                name = None
                if self.tok.kind == "ident" and self.peek().is_(":"):
                    name = self.advance().text
                    self.advance()
                typ = self.parse_type()
                results.append(A.Result(name, typ, self.span_from(start)))
                if not (paren and self.accept(",")):
                    break
                if self.at(")"):
                    break
            if paren:
                self.expect(")")
        finally:
            if paren:
                self.nesting -= 1
        return results

    def parse_func(self, kind: str, public: bool, start: Span, owner_kind: str = "") -> A.FuncDecl:
        name_tok = self.ident(f"the {kind}'s name")
        generics = self.parse_generics()
        params = self.parse_params()
        results = self.parse_results()
        kernel = grid = None
        if kind == "kernel" and self.accept("grid"):
            self.expect("(")
            self.nesting += 1
            grid = []
            while not self.at(")"):
                grid.append(self.parse_expr())
                if not self.accept(","):
                    break
            self.nesting -= 1
            self.expect(")")
        # `scratch(name: Tensor[...], ...)`: a word only here (after a kernel's grid), not a
        # keyword, as `then` is in a chain.
        scratch: list[A.Param] = []
        if kind == "kernel" and self.tok.kind == "ident" and self.tok.text == "scratch" \
                and self.peek().is_("("):
            self.advance()
            scratch = self.parse_params()
        if self.at("kernel"):
            kstart = self.advance().span
            kernel = self.parse_kernel_ref(kstart)
            # `then` is a word only here (a chain's next kernel), not a keyword.
            stage = kernel
            while self.tok.kind == "ident" and self.tok.text == "then":
                tstart = self.advance().span
                stage.then = self.parse_kernel_ref(tstart)
                stage = stage.then
        where = self.parse_where()
        if not self.at("{"):
            raise self.error(f"expected `{{` to start the body of `{name_tok.text}`, found "
                             f"{self.describe(self.tok)}", self.tok.span, "expected `{`",
                             help=("add `{` at the end of the signature"
                                   if self.tok.newline_before else
                                   "results are written `-> Tensor[R, C; f32]`"), code="E0104")
        body = self.parse_block()
        grad = None
        if self.at("grad"):
            gstart = self.advance().span
            self.expect("(")
            names = []
            while not self.at(")"):
                names.append(self.ident("a gradient name").text)
                if not self.accept(","):
                    break
            self.expect(")")
            grad = A.GradClause(names, self.parse_block(), self.span_from(gstart))
        return A.FuncDecl(kind, public, name_tok.text, generics, params, results, where, body,
                          self.span_from(start), name_tok.span, kernel, grid, grad,
                          scratch=scratch)

    def parse_kernel_ref(self, start: Span) -> A.KernelBinding:
        """`name<args>` of a kernel binding (after `kernel` or `then`)."""
        kname = self.ident("a kernel name").text
        args: list = []
        if self.accept("<"):
            while not self.at(">"):
                args.append(self.parse_type_or_dim_noangle())
                if not self.accept(","):
                    break
            self.expect(">")
        return A.KernelBinding(kname, args, self.span_from(start))

    def parse_block_decl(self, kind: str, public: bool, start: Span) -> A.BlockDecl:
        name_tok = self.ident(f"the {kind}'s name")
        generics = self.parse_generics()
        where = self.parse_where()
        self.expect("{")
        members: list[A.Member] = []
        methods: list[A.FuncDecl] = []
        while not self.at("}") and self.tok.kind != "eof":
            mstart = self.tok.span
            before = self.pos
            try:
                if self.accept(";"):
                    continue
                mpublic = bool(self.accept("pub"))
                if self.at("fn") or self.at("entry"):
                    mkind = self.advance().text
                    if mkind == "entry" and kind != "model":
                        raise self.error("`entry` is only allowed in a `model`", mstart,
                                         "entry in a block",
                                         help="declare it as `fn` here, or move it to the model",
                                         code="E0105")
                    methods.append(self.parse_func(mkind, mpublic, mstart))
                elif self.tok.kind == "kw" and self.tok.text in ("param", "state", "block",
                                                                  "config"):
                    members.append(self.parse_member())
                else:
                    raise self.error(
                        f"expected a member, found {self.describe(self.tok)}", self.tok.span,
                        "not a member",
                        help=f"a {kind} holds `param`, `state`, `block`, `config`, `fn`"
                             + (" and `entry`" if kind == "model" else "") + " declarations",
                        code="E0106")
            except _Bail:
                if self.pos == before:
                    self.advance()
                self.skip_statement()
                if self.at("{"):
                    self.skip_item()
        self.expect("}")
        return A.BlockDecl(kind, public, name_tok.text, generics, where, members, methods,
                           self.span_from(start), name_tok.span)

    def parse_member(self) -> A.Member:
        start = self.tok.span
        kind = self.advance().text
        name = self.ident(f"the {kind}'s name", soft=True).text
        self.expect(":", help=f"a {kind} has a type: `{kind} {name}: ...`")
        typ = self.parse_type()
        default = condition = None
        if self.accept("="):
            default = self.parse_expr()
        if self.accept("if"):
            condition = self.parse_expr()
        return A.Member(kind, name, typ, self.span_from(start), default, condition)

    # ------------------------------------------------------------ types
    def parse_type(self) -> A.TypeExpr:
        self.enter()
        try:
            return self._parse_type()
        finally:
            self.depth -= 1

    def _parse_type(self) -> A.TypeExpr:
        start = self.tok.span
        if self.accept("["):
            self.nesting += 1
            elem = self.parse_type()
            if not isinstance(elem, A.BlockType):
                self.error("only blocks can be repeated", elem.span, "not a block",
                           help="write `[Layer<...>; N]`; a stack of tensors is one tensor "
                                "with an extra axis: `Tensor[N, ...]`", code="E0107")
            self.expect(";", help="a repeated block is written `[Layer<...>; N]`")
            count = self.parse_expr()
            self.nesting -= 1
            self.expect("]")
            if not isinstance(elem, A.BlockType):  # reported above; keep parsing
                elem = A.BlockType("?", [], elem.span)
            return A.ArrayType(elem, count, self.span_from(start))
        t = self.ident("a type")
        if t.text == "Tensor":
            self.expect("[", help="tensor types are written `Tensor[R, C; f32]`")
            self.nesting += 1
            dims: list[A.Expr] = []
            while not self.at(";") and not self.at("]"):
                dims.append(self.parse_expr())
                if not self.accept(","):
                    break
            if not self.at(";"):
                self.nesting -= 1
                shown = (self.source.text[dims[0].span.start:dims[-1].span.stop] if dims
                         else "R, C")
                raise self.error("a tensor type needs an element type after `;`", self.tok.span,
                                 "expected `; dtype`",
                                 help=f"write `Tensor[{shown}; f32]`", code="E0108")
            self.advance()
            dt = self.ident("an element type")
            self.nesting -= 1
            self.expect("]")
            return A.TensorType(dims, A.Name(dt.text, dt.span), self.span_from(start))
        if self.at("<") and t.text[:1].isupper() and t.text not in ("Dim", "DType"):
            args = self.parse_generic_args()
            return A.BlockType(t.text, args or [], self.span_from(start),
                               self.parse_config_args())
        if t.text[:1].isupper() and t.text not in ("Dim", "DType") and len(t.text) > 2 \
                and not t.text.isupper():
            return A.BlockType(t.text, [], self.span_from(start), self.parse_config_args())
        return A.ScalarType(t.text, t.span)

    def parse_config_args(self) -> list[A.ConfigArg]:
        """`(name = value, ...)` after a block type: its `config` members' values."""
        if not self.at("(") or self.tok.newline_before:
            return []
        self.advance()
        out: list[A.ConfigArg] = []
        self.nesting += 1
        try:
            while not self.at(")"):
                name = self.ident("a config name")
                self.expect("=", help="a block's config is given by name: "
                                      "`Attention<...>(attention_bias = true)`")
                value = self.parse_expr()
                out.append(A.ConfigArg(name.text, value, name.span.to(value.span)))
                if not self.accept(","):
                    break
            self.expect(")", help="config values are separated by `,`")
        finally:
            self.nesting -= 1
        return out

    def parse_type_or_dim(self) -> A.Expr | A.TypeExpr:
        if (self.tok.kind == "ident" and self.tok.text == "Tensor") or self.at("["):
            return self.parse_type()
        return self.parse_expr()

    def parse_generic_args(self) -> list | None:
        """Parse `<a, b>`; returns None (and rewinds) if this is not a generic list."""
        save, errors = self.pos, len(self.errors)
        self.expect("<")
        args: list = []
        self.enter()  # `A<B<C<...>>>` recurses through here
        try:
            while not self.at(">"):
                args.append(self.parse_type_or_dim_noangle())
                if not self.accept(","):
                    break
            self.expect(">")
        except _Bail:
            if self.too_deep_reported:
                raise  # too deep is final: rewinding would try the same depth again
            self.pos = save
            del self.errors[errors:]
            return None
        finally:
            self.depth -= 1
        return args

    def parse_type_or_dim_noangle(self) -> A.Expr | A.TypeExpr:
        if self.tok.kind == "ident" and self.tok.text == "Tensor":
            return self.parse_type()
        return self.parse_binary(self.parse_unary(), 4)  # additive and tighter: no `>`

    # ------------------------------------------------------------ statements
    def parse_block(self) -> A.Block:
        self.enter()
        try:
            return self._parse_block()
        finally:
            self.depth -= 1

    def _parse_block(self) -> A.Block:
        start = self.expect("{").span
        saved, self.nesting = self.nesting, 0
        statements: list[A.Stmt] = []
        try:
            while not self.at("}") and self.tok.kind != "eof":
                if self.accept(";"):
                    continue
                before = self.pos
                try:
                    statements.append(self.parse_statement())
                    if not (self.at("}") or self.at(";") or self.tok.newline_before
                            or self.tok.kind == "eof"):
                        raise self.error(
                            f"expected the end of the statement, found {self.describe(self.tok)}",
                            self.tok.span, "unexpected here",
                            help="put each statement on its own line, or separate them with `;`",
                            code="E0109")
                except _Bail:
                    if self.pos == before:
                        self.advance()
                    self.skip_statement()
            if self.tok.kind == "eof":
                raise self.error("this block is never closed", start, "unclosed `{`",
                                 help="add the matching `}`", code="E0110")
            self.expect("}")
        finally:
            self.nesting = saved
        return A.Block(statements, self.span_from(start))

    def parse_unpacking_let(self, start: Span) -> A.Let:
        """`let (q, k, v) = f(x)`: one plain name per result of the call."""
        open_tok = self.expect("(")
        names: list[str] = []
        self.nesting += 1
        try:
            while not self.at(")"):
                names.append(self.ident("a variable name").text)
                if not self.accept(","):
                    break
            self.expect(")", help="names are separated by `,`: `let (q, k, v) = f(x)`")
        finally:
            self.nesting -= 1
        name_span = self.span_from(open_tok.span)
        if len(names) < 2:
            raise self.error("unpacking needs at least two names", name_span,
                             "one name", help="bind one result with `let y = f(x)`",
                             code="E0122")
        if len(set(names)) != len(names):
            raise self.error("a name is unpacked twice", name_span, "repeated name",
                             help="give each result its own name", code="E0122")
        self.expect("=", help="unpacking binds a call's results: `let (a, b) = f(x)`")
        value = self.parse_expr()
        return A.Let("(" + ", ".join(names) + ")", None, value, self.span_from(start),
                     name_span, names)

    def parse_statement(self) -> A.Stmt:
        start = self.tok.span
        if self.accept("let"):
            if self.at("("):
                return self.parse_unpacking_let(start)
            name_tok = self.ident("a variable name")
            binders = None
            if self.at("["):
                binders = self.parse_binders()
            if self.at(":"):
                n = name_tok.text
                raise self.error("`let` takes no type annotation", self.tok.span,
                                 "the type is inferred",
                                 help=f"remove it: `let {n} = ...`; to give an index its range, "
                                      f"write it in the brackets: `let {n}[r: R] = ...`",
                                 code="E0111")
            self.expect("=", help="a `let` binds a value: `let y = ...`")
            value = self.parse_expr()
            return A.Let(name_tok.text, binders, value, self.span_from(start), name_tok.span)
        if self.accept("return"):
            values = []
            if not (self.at("}") or self.tok.newline_before):
                values.append(self.parse_expr())
                while self.accept(","):
                    values.append(self.parse_expr())
            return A.Return(values, self.span_from(start))
        if self.accept("for"):
            var = self.ident("a loop variable")
            self.expect("in")
            iterable = self.parse_expr(no_brace=True)
            body = self.parse_block()
            return A.For(var.text, iterable, body, self.span_from(start), var.span)
        expr = self.parse_expr()
        if self.at("="):
            self.advance()
            value = self.parse_expr()
            if not isinstance(expr, A.Name | A.Index | A.Field):
                raise self.error("cannot assign to this expression", expr.span,
                                 "not a variable or a state",
                                 help="assign to a variable (`h = ...`) or write into a state "
                                      "(`self.cache[b, pos[b], d] = ...`)", code="E0112")
            return A.Assign(expr, value, self.span_from(start))
        return A.ExprStmt(expr, self.span_from(start))

    def parse_binders(self) -> list[A.IndexBinder]:
        self.expect("[")
        self.nesting += 1
        binders: list[A.IndexBinder] = []
        try:
            while not self.at("]"):
                binders.append(self.parse_binder())
                if not self.accept(","):
                    break
            self.expect("]", help="index variables are listed as `[r, c]`")
        finally:
            self.nesting -= 1
        return binders

    def parse_binder(self) -> A.IndexBinder:
        start = self.tok.span
        if self.accept("("):
            parts = []
            self.enter()
            try:
                while not self.at(")"):
                    parts.append(self.parse_binder())
                    if not self.accept(","):
                        break
                self.expect(")")
            finally:
                self.depth -= 1
            return A.IndexBinder("(" + ", ".join(p.name for p in parts) + ")", None,
                                 self.span_from(start), parts)
        t = self.tok
        if t.kind != "ident":
            raise self.error(f"expected an index variable, found {self.describe(t)}", t.span,
                             "expected a name",
                             help="index variables are plain names: `let y[r, c] = ...`; "
                                  "computed positions belong on the right-hand side",
                             code="E0113")
        self.advance()
        if self.tok.kind == "punct" and self.tok.text in ("+", "-", "*", "/", "%", "[", "("):
            raise self.error("index variables are plain names, not expressions",
                             t.span.to(self.tok.span), "a computed position",
                             help="index variables are plain names: `let y[r, c] = ...`; "
                                  "computed positions belong on the right-hand side "
                                  "(`let y[n] = x[n - 1]`)", code="E0113")
        dim = self.parse_expr() if self.accept(":") else None
        return A.IndexBinder(t.text, dim, self.span_from(start))

    # ------------------------------------------------------------ expressions
    def parse_expr(self, no_brace: bool = False) -> A.Expr:
        self.enter()
        try:
            return self._parse_expr(no_brace)
        finally:
            self.depth -= 1

    def _parse_expr(self, no_brace: bool = False) -> A.Expr:
        if self.at("if"):
            return self.parse_if()
        left = self.parse_binary(self.parse_unary(), 0)
        if self.at("..") or self.at("..="):
            inclusive = self.advance().text == "..="
            stop = self.parse_binary(self.parse_unary(), 0)
            return A.RangeExpr(left, stop, inclusive, None, left.span.to(stop.span))
        return left

    def parse_if(self) -> A.IfExpr:
        start = self.expect("if").span
        cond = self.parse_expr(no_brace=True)
        then = self.parse_block()
        otherwise: A.Block | A.IfExpr | None = None
        if self.accept("else"):
            if self.at("if"):
                self.enter()  # `else if` chains recurse too
                try:
                    otherwise = self.parse_if()
                finally:
                    self.depth -= 1
            else:
                otherwise = self.parse_block()
        return A.IfExpr(cond, then, otherwise, self.span_from(start))

    LEVELS = (("||",), ("&&",), COMPARISONS, (), ("+", "-"), ("*", "/", "%"))

    def binary_level(self, tok: Token) -> int:
        if tok.kind != "punct":
            return -1
        for level, ops in enumerate(self.LEVELS):
            if tok.text in ops:
                return level
        return -1

    def parse_binary(self, left: A.Expr, min_level: int) -> A.Expr:
        while True:
            tok = self.tok
            level = self.binary_level(tok)
            if level < min_level or (tok.newline_before and self.nesting == 0):
                return left
            self.advance()
            right = self.parse_unary()
            while True:
                nxt = self.binary_level(self.tok)
                if nxt > level and not (self.tok.newline_before and self.nesting == 0):
                    right = self.parse_binary(right, nxt)
                else:
                    break
            if level == 2 and isinstance(left, A.Binary) and left.op in COMPARISONS:
                self.error("comparisons cannot be chained", left.span.to(right.span),
                           "two comparisons in a row",
                           help="join them with `&&`: `a < b && b < c`", code="E0114")
            left = A.Binary(tok.text, left, right, left.span.to(right.span))

    def parse_unary(self) -> A.Expr:
        start = self.tok.span
        if self.at("-") or self.at("!"):
            op = self.advance().text
            self.enter()
            try:
                operand = self.parse_unary()
            finally:
                self.depth -= 1
            return A.Unary(op, operand, start.to(operand.span))
        if self.tok.kind == "ident" and self.tok.text in REDUCTIONS and (
                self.peek().is_("[") or self.peek().is_("<")):
            reduced = self.try_reduction()
            if reduced is not None:
                return reduced
        expr = self.parse_postfix()
        while self.at("as"):
            self.advance()
            dt = self.ident("an element type after `as`")
            expr = A.Cast(expr, A.Name(dt.text, dt.span), expr.span.to(dt.span))
        return expr

    def try_reduction(self) -> A.Reduce | None:
        start = self.tok.span
        save, errors = self.pos, len(self.errors)
        kind = self.advance().text
        acc = None
        if self.at("<"):
            self.advance()
            t = self.tok
            if t.kind != "ident" or not self.peek().is_(">") or not self.peek(2).is_("["):
                self.pos = save
                del self.errors[errors:]
                return None
            self.advance()
            self.advance()
            acc = A.Name(t.text, t.span)
        binders = self.parse_binders()
        if self.at(")") or self.at("]") or self.at(",") or (self.tok.newline_before \
                and self.nesting == 0):
            raise self.error(f"`{kind}[...]` needs an expression to reduce",
                             self.span_from(start), "nothing to reduce",
                             help=f"write `{kind}[c] x[r, c]`", code="E0115")
        self.enter()
        try:
            body = self.parse_binary(self.parse_unary(), 5)
        finally:
            self.depth -= 1
        return A.Reduce(kind, binders, acc, body, start.to(body.span))

    def parse_postfix(self) -> A.Expr:
        expr = self.parse_primary()
        while True:
            if self.at("(") and not (self.tok.newline_before and self.nesting == 0):
                expr = self.finish_call(expr, [])
            elif self.at("<") and isinstance(expr, A.Name | A.Field) \
                    and not self.tok.newline_before:
                save = self.pos
                args = self.parse_generic_args()
                if args is not None and self.at("("):
                    expr = self.finish_call(expr, args)
                else:
                    self.pos = save
                    return expr
            elif self.at("[") and not (self.tok.newline_before and self.nesting == 0):
                self.advance()
                self.nesting += 1
                indices: list[A.Expr] = []
                try:
                    while not self.at("]"):
                        indices.append(self.parse_index())
                        if not self.accept(","):
                            break
                    self.expect("]", help="indices are separated by `,`")
                finally:
                    self.nesting -= 1
                expr = A.Index(expr, indices, self.span_from(expr.span))
            elif self.at(".") and not (self.tok.newline_before and self.nesting == 0):
                self.advance()
                if self.tok.kind == "int":
                    t = self.advance()
                else:
                    t = self.ident("a field name", soft=True)
                expr = A.Field(expr, t.text, expr.span.to(t.span))
            else:
                return expr

    def parse_index(self) -> A.Expr:
        """One index of `x[...]`: an expression, or a static range of the axis (`a..b`,
        `a..=b`, `a..`, `..b`, and `..` or `:` for the whole axis)."""
        start = self.tok.span
        if self.at(":"):
            self.advance()
            return A.Slice(None, None, False, start)
        if self.at("if"):
            return self.parse_expr()
        left: A.Expr | None = None
        if not self.at("..") and not self.at("..="):
            self.enter()
            try:
                left = self.parse_binary(self.parse_unary(), 0)
            finally:
                self.depth -= 1
            if not self.at("..") and not self.at("..="):
                return left
        inclusive = self.advance().text == "..="
        stop: A.Expr | None = None
        if not self.at(",") and not self.at("]"):
            self.enter()
            try:
                stop = self.parse_binary(self.parse_unary(), 0)
            finally:
                self.depth -= 1
        elif inclusive:
            raise self.error("`..=` needs an end", self.tok.span, "expected the last index",
                             help="write `a..=b`, or `a..` for the rest of the axis",
                             code="E0121")
        return A.Slice(left, stop, inclusive, self.span_from(start))

    def finish_call(self, callee: A.Expr, generic_args: list) -> A.Call:
        self.expect("(")
        self.nesting += 1
        args: list[A.Expr] = []
        try:
            while not self.at(")"):
                args.append(self.parse_expr())
                if not self.accept(","):
                    break
            self.expect(")", help="arguments are separated by `,`")
        finally:
            self.nesting -= 1
        return A.Call(callee, generic_args, args, self.span_from(callee.span))

    def parse_primary(self) -> A.Expr:
        tok = self.tok
        if tok.kind == "int":
            self.advance()
            digits = tok.text.lstrip("0") or "0"
            if len(digits) > 19 or int(digits) > MAX_INT:
                shown = digits if len(digits) <= 24 else f"{digits[:8]}...{digits[-8:]}"
                raise self.error(
                    f"integer literal {shown} ({len(digits)} digits) does not fit in 64 bits",
                    tok.span, "too large", code="E0120",
                    help=f"integers are at most {MAX_INT}; write a float (`1e30`) for a large "
                         "constant")
            return A.IntLit(int(digits), tok.span)
        if tok.kind == "float":
            self.advance()
            return A.FloatLit(float(tok.text), tok.span)
        if tok.is_("inf") or tok.is_("nan"):
            self.advance()
            return A.FloatLit(float(tok.text), tok.span)
        if tok.is_("true") or tok.is_("false"):
            self.advance()
            return A.BoolLit(tok.text == "true", tok.span)
        if tok.kind == "ident" or tok.is_("self") or (
                tok.kind == "kw" and tok.text in self.misused_keywords):
            self.advance()
            return A.Name(tok.text, tok.span)
        if tok.is_("("):
            self.advance()
            self.nesting += 1
            try:
                first = self.parse_expr()
                if self.at(","):
                    items = [first]
                    while self.accept(","):
                        if self.at(")"):
                            break
                        items.append(self.parse_expr())
                    self.expect(")")
                    return A.Tuple(items, self.span_from(tok.span))
                self.expect(")", help="close the parenthesis")
            finally:
                self.nesting -= 1
            return first
        if tok.is_("if"):
            return self.parse_if()
        if tok.kind == "string":
            raise self.error("string literals are not values in Linnet", tok.span,
                             "a string here",
                             help="Linnet has no strings: call the function you mean by name "
                                  "(`silu(x)`), or choose with a `config` bool",
                             code="E0116")
        raise self.error(f"expected an expression, found {self.describe(tok)}", tok.span,
                         "expected an expression", code="E0117",
                         help="an expression is a name, a number, a call or an index")


def parse(source: SourceFile, module_name: str | None = None) -> A.Module:
    """Parse a source file into a module, raising :class:`LinnetError` with every syntax error.

    >>> m = parse(SourceFile("m.linnet", "pub fn f(x: f32) -> f32 { return x }"))
    >>> m.items[0].name
    'f'
    """
    name = module_name or source.name.rsplit("/", 1)[-1].removesuffix(".linnet")
    parser = Parser(source, name)
    try:
        module = parser.parse_module()
    except RecursionError:
        # MAX_NESTING keeps the descent far from Python's limit; this is the last line, for a
        # caller that is itself deep in its stack.
        raise LinnetError([*parser.errors, Diagnostic(
            "E0118", "this is nested too deeply to parse", parser.tok.span,
            "the parser ran out of stack here",
            help="name the inner parts with `let` statements")]) from None
    for item in module.items:
        too_deep = deepest_node(item)
        if too_deep is not None and too_deep.line not in parser.lexer_error_lines:
            parser.errors.append(Diagnostic(
                "E0119", f"this expression is more than {MAX_TREE_DEPTH} operations deep",
                too_deep, "the nesting limit is reached here",
                help="split it into several `let` statements (a long chain like "
                     "`a + b + c + ...` is as deep as it is long)"))
    if parser.errors:
        raise LinnetError(parser.errors)
    return module


def deepest_node(root: object) -> Span | None:
    """The span of the first syntax node deeper than MAX_TREE_DEPTH under ``root``, or None.

    Iterative, so that the check itself cannot overflow the stack.

    >>> m = parse(SourceFile("m.linnet", "const C: i32 = 1 + 2"))
    >>> deepest_node(m.items[0]) is None
    True
    """
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, list | tuple):
            stack.extend((x, depth) for x in node)
            continue
        names = _CHILD_FIELDS.get(type(node))
        if names is None:
            if not dataclasses.is_dataclass(node) or isinstance(node, Span):
                continue
            names = _CHILD_FIELDS[type(node)] = [  # type: ignore[index]
                f.name for f in dataclasses.fields(node)
                if f.name not in ("module", "owner", "span", "name_span")]
        if depth > MAX_TREE_DEPTH:
            return getattr(node, "span", None)
        for name in names:
            child = getattr(node, name)
            if child is not None and not isinstance(child, str | int | float | bool):
                stack.append((child, depth + 1))
    return None


_CHILD_FIELDS: dict[type, list[str]] = {}
