"""Recursive-descent parser with error recovery: one run reports every syntax error it can.

A statement ends at the end of its line unless the line ends inside brackets (`(`, `[`);
`;` also ends one. To continue an expression on the next line, wrap it in parentheses. Reductions (`sum[k] a * b`) take the
multiplicative expression that follows them.
"""

from __future__ import annotations

import dataclasses

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, SourceFile, Span
from linnet.lang.syntax.parser_base import (  # noqa: F401  (tests import MAX_NESTING here)
    ITEM_STARTS,
    MAX_NESTING,
    MAX_TREE_DEPTH,
    MEMBER_STARTS,
    _Bail,
)
from linnet.lang.syntax.parser_body import BodyParser


class Parser(BodyParser):
    """Items and declarations (``use``, ``const``, functions, ops, kernels, blocks, models)
    over :class:`~linnet.lang.syntax.parser_body.BodyParser`'s types and expressions."""

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
        raise self.error(
            f"expected an item, found {self.describe(self.tok)}",
            self.tok.span,
            "not an item",
            help=help,
            code="E0102",
        )

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
                raise self.error(
                    f"unknown generic kind `{kind}`",
                    kind_tok.span,
                    "expected `Dim` or `DType`",
                    help="a generic is a dimension (`Dim`) or an element type (`DType`)",
                    code="E0103",
                )
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
        if (
            kind == "kernel"
            and self.tok.kind == "ident"
            and self.tok.text == "scratch"
            and self.peek().is_("(")
        ):
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
            raise self.error(
                f"expected `{{` to start the body of `{name_tok.text}`, found "
                f"{self.describe(self.tok)}",
                self.tok.span,
                "expected `{`",
                help=(
                    "add `{` at the end of the signature"
                    if self.tok.newline_before
                    else "results are written `-> Tensor[R, C; f32]`"
                ),
                code="E0104",
            )
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
        return A.FuncDecl(
            kind,
            public,
            name_tok.text,
            generics,
            params,
            results,
            where,
            body,
            self.span_from(start),
            name_tok.span,
            kernel,
            grid,
            grad,
            scratch=scratch,
        )

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
                        raise self.error(
                            "`entry` is only allowed in a `model`",
                            mstart,
                            "entry in a block",
                            help="declare it as `fn` here, or move it to the model",
                            code="E0105",
                        )
                    methods.append(self.parse_func(mkind, mpublic, mstart))
                elif self.tok.kind == "kw" and self.tok.text in (
                    "param",
                    "state",
                    "block",
                    "config",
                ):
                    members.append(self.parse_member())
                else:
                    raise self.error(
                        f"expected a member, found {self.describe(self.tok)}",
                        self.tok.span,
                        "not a member",
                        help=f"a {kind} holds `param`, `state`, `block`, `config`, `fn`"
                        + (" and `entry`" if kind == "model" else "")
                        + " declarations",
                        code="E0106",
                    )
            except _Bail:
                if self.pos == before:
                    self.advance()
                self.skip_statement()
                if self.at("{"):
                    self.skip_item()
        self.expect("}")
        return A.BlockDecl(
            kind,
            public,
            name_tok.text,
            generics,
            where,
            members,
            methods,
            self.span_from(start),
            name_tok.span,
        )

    def parse_member(self) -> A.Member:
        start = self.tok.span
        kind = self.advance().text
        name = self.ident(f"the {kind}'s name", soft=True).text
        self.expect(":", help=f"a {kind} has a type: `{kind} {name}: ...`")
        self.list_ok = kind == "config"
        try:
            typ = self.parse_type()
        finally:
            self.list_ok = False
        default = condition = None
        if self.accept("="):
            default = self.parse_expr()
        if self.accept("if"):
            condition = self.parse_expr()
        return A.Member(kind, name, typ, self.span_from(start), default, condition)


def parse(source: SourceFile, module_name: str | None = None) -> A.Module:
    """Parse a source file into a module, raising :class:`LinnetError` with every syntax error.

    >>> m = parse(SourceFile("m.linnet", "pub fn f(x: f32) -> f32 { return x }"))
    >>> m.items[0].name
    'f'
    """
    name = module_name or source.name.rsplit("/", 1)[-1].removesuffix(".linnet")
    return _parsed(Parser(source, name))


def parse_appended(module: A.Module, text: str) -> A.Module:
    """``module`` with ``text`` (more items) appended to its source, on a line of its own:
    the module :func:`parse` gives for the whole text, with only ``text`` parsed. The items
    ``module`` had are copies bound to the new module (their bodies are shared: a parsed
    tree is never changed); the new items' spans are offsets in the whole text. What
    `linnet kernels` and span claims do for each case: a call appended to an op's module,
    which the std library's decode module made a quarter of a second to parse each time.

    >>> m = parse(SourceFile("m.linnet", "pub fn f(x: f32) -> f32 { return x }"))
    >>> both = parse_appended(m, "pub fn g(x: f32) -> f32 { return f(x) }")
    >>> [i.name for i in both.items], both.items[1].span.line, both.items[0].module is both
    (['f', 'g'], 2, True)
    """
    head = module.source.text
    # A line break first: nothing appended continues the module's last line (a comment).
    source = SourceFile(module.source.name, f"{head}\n{text}")
    parsed = _parsed(Parser(source, module.name, len(head)))
    items: list[A.Item] = []
    for item in module.items:
        if isinstance(item, A.FuncDecl):
            item = dataclasses.replace(item, module=parsed)
        elif isinstance(item, A.BlockDecl):
            item = dataclasses.replace(item, module=parsed)
            item.methods = [dataclasses.replace(m, module=parsed, owner=item) for m in item.methods]
        items.append(item)
    parsed.items[:0] = items
    return parsed


def _parsed(parser: Parser) -> A.Module:
    """The module ``parser`` reads, raising :class:`LinnetError` with every syntax error."""
    try:
        module = parser.parse_module()
    except RecursionError:
        # MAX_NESTING keeps the descent far from Python's limit; this is the last line, for a
        # caller that is itself deep in its stack.
        raise LinnetError(
            [
                *parser.errors,
                Diagnostic(
                    "E0118",
                    "this is nested too deeply to parse",
                    parser.tok.span,
                    "the parser ran out of stack here",
                    help="name the inner parts with `let` statements",
                ),
            ]
        ) from None
    for item in module.items:
        too_deep = deepest_node(item)
        if too_deep is not None and too_deep.line not in parser.lexer_error_lines:
            parser.errors.append(
                Diagnostic(
                    "E0119",
                    f"this expression is more than {MAX_TREE_DEPTH} operations deep",
                    too_deep,
                    "the nesting limit is reached here",
                    help="split it into several `let` statements (a long chain like "
                    "`a + b + c + ...` is as deep as it is long)",
                )
            )
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
                f.name
                for f in dataclasses.fields(node)
                if f.name not in ("module", "owner", "span", "name_span")
            ]
        if depth > MAX_TREE_DEPTH:
            return getattr(node, "span", None)
        for name in names:
            child = getattr(node, name)
            if child is not None and not isinstance(child, str | int | float | bool):
                stack.append((child, depth + 1))
    return None


_CHILD_FIELDS: dict[type, list[str]] = {}
