"""docs/adding-a-primitive.md stays true: its list of the modules that hold a per-primitive
table is exactly the tables tests/test_coverage.py walks (plus the registry itself), so a
table added or moved without the page (or the page without the table) fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "adding-a-primitive.md"
_ITEM = re.compile(r"^- `([\w.]+)`: (.*)$")
_TABLE = re.compile(r"`([A-Z][A-Z_]+)`")


def listed(text: str) -> set[tuple[str, str]]:
    """(module, table) pairs of the page's list between its two markers: each item names a
    module, then its tables (upper-case names in backticks) before the first comma.

    >>> sorted(listed("<!-- tables: x -->\\n- `a.b`: `T` and `U`, what\\n<!-- end of tables -->"))
    [('a.b', 'T'), ('a.b', 'U')]
    """
    body = text.split("<!-- tables:", 1)[1].split("<!-- end of tables -->", 1)[0]
    out = set()
    for line in body.splitlines():
        m = _ITEM.match(line)
        if m:
            head = m.group(2).split(",", 1)[0]
            out |= {(m.group(1), t) for t in _TABLE.findall(head)}
    return out


def test_the_page_lists_every_per_primitive_table() -> None:
    coverage = importlib.import_module("test_coverage")
    want = {("linnet.lang.ir.primitives", "PRIMITIVES"), *coverage.TABLES, *coverage.TILE_TABLES}
    have = listed(PAGE.read_text())
    assert not want - have, f"docs/adding-a-primitive.md does not list {sorted(want - have)}"
    assert not have - want, (
        f"docs/adding-a-primitive.md lists {sorted(have - want)}, which "
        "tests/test_coverage.py does not check"
    )


def test_every_listed_table_is_keyed_by_primitive() -> None:
    from linnet.lang.ir.primitives import PRIMITIVES
    from linnet.lang.ir.tiles import TILE_PRIMITIVES

    for module, table in listed(PAGE.read_text()):
        rules = getattr(importlib.import_module(module), table)
        assert isinstance(rules, dict) and set(rules) <= set(PRIMITIVES) | TILE_PRIMITIVES, (
            f"{module}.{table}"
        )


def test_the_page_is_in_the_site_nav() -> None:
    nav = (PAGE.parents[1] / "mkdocs.yml").read_text()
    assert "adding-a-primitive.md" in nav.split("graph-format.md", 1)[1].split("\n", 2)[1]
