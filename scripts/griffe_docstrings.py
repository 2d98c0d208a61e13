"""A griffe extension (mkdocs.yml, mkdocstrings `extensions:`): Linnet's docstrings are
reStructuredText-flavoured plain text with doctests; render them as Markdown.

* a run of doctest lines (`>>>`, `...` and their output) becomes a ```` ```pycon ```` block,
  so that `['q_proj']` is not read as a Markdown link;
* ``double backquotes`` become `single` ones, and `:class:`X``-style roles their name in code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|obj|exc):`~?([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")


def markdown(text: str) -> str:
    """The docstring ``text`` with doctests fenced and reST literals as Markdown code.

    >>> markdown("A ``b``, :class:`Graph`.")
    'A `b`, `Graph`.'
    """
    out: list[str] = []
    in_doctest = False
    indent = ""
    in_fence = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and not in_doctest and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            in_doctest = True
        elif in_doctest and not stripped:
            out.append(f"{indent}```")
            in_doctest = False
        if in_doctest or in_fence:
            out.append(line)
        else:
            out.append(LITERAL.sub(r"`\1`", ROLE.sub(r"`\1`", line)))
    if in_doctest:
        out.append(f"{indent}```")
    return "\n".join(out)


class DocstringsAsMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
