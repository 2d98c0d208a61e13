"""Walkers over the syntax tree: every node of an expression, index binders' leaves, the
factors of a product, whether an expression mentions a name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import linnet.lang.syntax.tree as A


def walk(expr: Any) -> list[Any]:
    """Every node of an expression, parents first.

    Syntax trees do not change after parsing, so the list is computed once per node and kept
    on the node itself (lowering an 8B model walks the same few hundred expressions once per
    layer). Kept there, it lives exactly as long as the tree: no process-wide cache grows
    with every program or every node that lowering makes on the fly.

    >>> import linnet.lang.syntax.tree as A
    >>> [type(n).__name__ for n in walk(A.Unary("-", A.Name("x", None), None))]
    ['Unary', 'Name']
    """
    slots = getattr(expr, "__dict__", None)
    if slots is None:
        return list(_walk(expr))
    nodes = slots.get(_NODES)
    if nodes is None:
        nodes = slots[_NODES] = list(_walk(expr))
    return nodes


# The attribute walk() caches a node's walk under (not a dataclass field: equality, repr
# and the parser's child fields ignore it).
_NODES = "_walk_nodes"


def _walk(expr: Any) -> Iterator[Any]:
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, A.Binary):
            stack += [node.right, node.left]
        elif isinstance(node, A.Unary | A.Cast):
            stack.append(node.operand)
        elif isinstance(node, A.Call):
            stack += list(reversed(node.args))
        elif isinstance(node, A.Index):
            stack += [*list(reversed(node.indices)), node.base]
        elif isinstance(node, A.Field):
            stack.append(node.base)
        elif isinstance(node, A.Tuple):
            stack += list(reversed(node.items))
        elif isinstance(node, A.Reduce):
            stack.append(node.body)
        elif isinstance(node, A.IfExpr):
            stack.append(node.condition)
            for s in node.then.statements:
                if isinstance(s, A.ExprStmt):
                    stack.append(s.expr)
            if isinstance(node.otherwise, A.Block):
                for s in node.otherwise.statements:
                    if isinstance(s, A.ExprStmt):
                        stack.append(s.expr)
            elif node.otherwise is not None:
                stack.append(node.otherwise)
        elif isinstance(node, A.RangeExpr):
            stack += [node.stop, node.start]
        elif isinstance(node, A.Slice):
            stack += [e for e in (node.stop, node.start) if e is not None]


def leaves(b: A.IndexBinder) -> list[A.IndexBinder]:
    if b.parts is None:
        return [b]
    out = []
    for p in b.parts:
        out.extend(leaves(p))
    return out


def product_factors(expr: A.Expr) -> list[A.Expr]:
    if isinstance(expr, A.Binary) and expr.op == "*":
        return product_factors(expr.left) + product_factors(expr.right)
    return [expr]


def mentions(expr: A.Expr, names: set[str]) -> bool:
    return any(isinstance(n, A.Name) and n.name in names for n in walk(expr))


def walk_body(block: A.Block):
    for stmt in block.statements:
        if isinstance(stmt, A.Let | A.Assign):
            yield from walk(stmt.value)
            if isinstance(stmt, A.Assign):
                yield from walk(stmt.target)
        elif isinstance(stmt, A.Return):
            for v in stmt.values:
                yield from walk(v)
        elif isinstance(stmt, A.ExprStmt):
            yield from walk(stmt.expr)
        elif isinstance(stmt, A.For):
            yield from walk(stmt.iterable)
            yield from walk_body(stmt.body)
