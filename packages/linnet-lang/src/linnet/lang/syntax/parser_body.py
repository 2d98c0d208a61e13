"""The parser's types, statements and expressions (:class:`BodyParser`); the declarations
that hold them are :mod:`linnet.lang.syntax.parser`'s.

>>> from linnet.lang.diagnostics.core import SourceFile
>>> p = BodyParser(SourceFile("m.linnet", "a + b * 2"), "m")
>>> type(p.parse_expr()).__name__
'Binary'
"""

from __future__ import annotations

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import Span
from linnet.lang.syntax.lexer import Token
from linnet.lang.syntax.parser_base import (
    COMPARISONS,
    MAX_INT,
    REDUCTIONS,
    ParserBase,
    _Bail,
)


class BodyParser(ParserBase):
    """Types, blocks, statements and expressions."""

    # ------------------------------------------------------------ types
    # Whether `[i32; N]` (a config list) may be parsed: only as a `config` member's type.
    list_ok = False

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
            if isinstance(elem, A.ScalarType) and self.list_ok:
                # A config's list of scalars, one per repeated block: `[i32; NL]`.
                self.expect(";", help="a config list is written `[i32; NL]`")
                count = self.parse_expr()
                self.nesting -= 1
                self.expect("]")
                return A.ListType(elem, count, self.span_from(start))
            if not isinstance(elem, A.BlockType):
                self.error(
                    "only blocks can be repeated",
                    elem.span,
                    "not a block",
                    help="write `[Layer<...>; N]`; a stack of tensors is one tensor "
                    "with an extra axis: `Tensor[N, ...]`; a list of scalars, `[i32; N]`, "
                    "is only a `config`'s type",
                    code="E0107",
                )
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
                shown = (
                    self.source.text[dims[0].span.start : dims[-1].span.stop] if dims else "R, C"
                )
                raise self.error(
                    "a tensor type needs an element type after `;`",
                    self.tok.span,
                    "expected `; dtype`",
                    help=f"write `Tensor[{shown}; f32]`",
                    code="E0108",
                )
            self.advance()
            dt = self.ident("an element type")
            self.nesting -= 1
            self.expect("]")
            return A.TensorType(dims, A.Name(dt.text, dt.span), self.span_from(start))
        if self.at("<") and t.text[:1].isupper() and t.text not in ("Dim", "DType"):
            args = self.parse_generic_args()
            return A.BlockType(t.text, args or [], self.span_from(start), self.parse_config_args())
        if (
            t.text[:1].isupper()
            and t.text not in ("Dim", "DType")
            and len(t.text) > 2
            and not t.text.isupper()
        ):
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
                self.expect(
                    "=",
                    help="a block's config is given by name: "
                    "`Attention<...>(attention_bias = true)`",
                )
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
                    if not (
                        self.at("}")
                        or self.at(";")
                        or self.tok.newline_before
                        or self.tok.kind == "eof"
                    ):
                        raise self.error(
                            f"expected the end of the statement, found {self.describe(self.tok)}",
                            self.tok.span,
                            "unexpected here",
                            help="put each statement on its own line, or separate them with `;`",
                            code="E0109",
                        )
                except _Bail:
                    if self.pos == before:
                        self.advance()
                    self.skip_statement()
            if self.tok.kind == "eof":
                raise self.error(
                    "this block is never closed",
                    start,
                    "unclosed `{`",
                    help="add the matching `}`",
                    code="E0110",
                )
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
            raise self.error(
                "unpacking needs at least two names",
                name_span,
                "one name",
                help="bind one result with `let y = f(x)`",
                code="E0122",
            )
        if len(set(names)) != len(names):
            raise self.error(
                "a name is unpacked twice",
                name_span,
                "repeated name",
                help="give each result its own name",
                code="E0122",
            )
        self.expect("=", help="unpacking binds a call's results: `let (a, b) = f(x)`")
        value = self.parse_expr()
        return A.Let(
            "(" + ", ".join(names) + ")", None, value, self.span_from(start), name_span, names
        )

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
                raise self.error(
                    "`let` takes no type annotation",
                    self.tok.span,
                    "the type is inferred",
                    help=f"remove it: `let {n} = ...`; to give an index its range, "
                    f"write it in the brackets: `let {n}[r: R] = ...`",
                    code="E0111",
                )
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
                raise self.error(
                    "cannot assign to this expression",
                    expr.span,
                    "not a variable or a state",
                    help="assign to a variable (`h = ...`) or write into a state "
                    "(`self.cache[b, pos[b], d] = ...`)",
                    code="E0112",
                )
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
            return A.IndexBinder(
                "(" + ", ".join(p.name for p in parts) + ")", None, self.span_from(start), parts
            )
        t = self.tok
        if t.kind != "ident":
            raise self.error(
                f"expected an index variable, found {self.describe(t)}",
                t.span,
                "expected a name",
                help="index variables are plain names: `let y[r, c] = ...`; "
                "computed positions belong on the right-hand side",
                code="E0113",
            )
        self.advance()
        if self.tok.kind == "punct" and self.tok.text in ("+", "-", "*", "/", "%", "[", "("):
            raise self.error(
                "index variables are plain names, not expressions",
                t.span.to(self.tok.span),
                "a computed position",
                help="index variables are plain names: `let y[r, c] = ...`; "
                "computed positions belong on the right-hand side "
                "(`let y[n] = x[n - 1]`)",
                code="E0113",
            )
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
                self.error(
                    "comparisons cannot be chained",
                    left.span.to(right.span),
                    "two comparisons in a row",
                    help="join them with `&&`: `a < b && b < c`",
                    code="E0114",
                )
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
        if (
            self.tok.kind == "ident"
            and self.tok.text in REDUCTIONS
            and (self.peek().is_("[") or self.peek().is_("<"))
        ):
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
        if (
            self.at(")")
            or self.at("]")
            or self.at(",")
            or (self.tok.newline_before and self.nesting == 0)
        ):
            raise self.error(
                f"`{kind}[...]` needs an expression to reduce",
                self.span_from(start),
                "nothing to reduce",
                help=f"write `{kind}[c] x[r, c]`",
                code="E0115",
            )
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
            elif (
                self.at("<") and isinstance(expr, A.Name | A.Field) and not self.tok.newline_before
            ):
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
            raise self.error(
                "`..=` needs an end",
                self.tok.span,
                "expected the last index",
                help="write `a..=b`, or `a..` for the rest of the axis",
                code="E0121",
            )
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
                    tok.span,
                    "too large",
                    code="E0120",
                    help=f"integers are at most {MAX_INT}; write a float (`1e30`) for a large "
                    "constant",
                )
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
        if (
            tok.kind == "ident"
            or tok.is_("self")
            or (tok.kind == "kw" and tok.text in self.misused_keywords)
        ):
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
            raise self.error(
                "string literals are not values in Linnet",
                tok.span,
                "a string here",
                help="Linnet has no strings: call the function you mean by name "
                "(`silu(x)`), or choose with a `config` bool",
                code="E0116",
            )
        raise self.error(
            f"expected an expression, found {self.describe(tok)}",
            tok.span,
            "expected an expression",
            code="E0117",
            help="an expression is a name, a number, a call or an index",
        )
