"""Readable Python source, for every emitter that writes Python (torch, jax): the
statements of a function body with what each defines and reads, function drafts whose dead
statements and arguments a liveness pass drops, and line wrapping at :data:`WIDTH`.

>>> print("\\n".join(wrap("y = f(a, b)", 8)))
y = f(
    a, b
)
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from linnet.lang.passes.slices import Slice

WIDTH = 100  # the longest line written (ruff's limit in this repository)


@dataclass
class Statement:
    """One generated line of a function body, what it defines and reads, and where from."""

    text: str
    targets: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    effect: bool = False  # writes a state (`index_put_`, `copy_`): always kept
    comment: bool = False


@dataclass
class Draft:
    """A slice function before its signature is fixed: every input, parameter and output,
    and its body; :meth:`finish` keeps what the outputs asked for need."""

    name: str
    inputs: list[str]  # Python names, one per slice input
    params: list[str]  # one per slice parameter, then state
    outputs: list[str]  # one expression per slice output
    body: list[Statement]
    doc: str

    def finish(self, keep: set[int] | None) -> tuple[list[Statement], set[str]]:
        """The body needed for outputs ``keep`` (all if None) and the names it reads."""
        outs = range(len(self.outputs)) if keep is None else sorted(keep)
        live = set()
        for j in outs:
            live |= names_in(self.outputs[j])
        kept: list[Statement] = []
        for st in reversed(self.body):
            if st.comment:
                # A comment heads the statements after it: kept if one of them is.
                if kept and not kept[-1].comment:
                    kept.append(st)
                continue
            if st.effect or st.targets & live:
                live = (live - st.targets) | st.reads
                kept.append(st)
        kept.reverse()
        return kept, live


def kept_outputs(
    slices: list[Slice], drafts: dict[str, Draft], needed: Iterable[str]
) -> dict[str, set[int]]:
    """Per slice kind, the positions of the outputs its function must return: those a later
    slice reads, or the entry (``needed``: its outputs, and the states it stores), the union
    over the kind's slices. A fixed point: what a kind keeps grows what its body reads, which
    may ask an earlier slice of the same kind for more.

    >>> from linnet.lang.passes.slices import Slice
    >>> sl = Slice(0, 1, "s", "", inputs=["%x"], outputs=["%y", "%z"], kind="k")
    >>> d = Draft("s", ["x"], [], ["y", "z"], [Statement("y = x + 1", frozenset({"y"}),
    ...                                                   frozenset({"x"}))], "")
    >>> kept_outputs([sl], {"k": d}, ["%y"])
    {'k': {0}}
    """
    needed = set(needed)
    keep: dict[str, set[int]] = {k: set() for k in drafts}
    reads: dict[str, set[str]] = {}
    while True:
        grew = False
        wanted = set(needed)
        for sl in reversed(slices):
            want = {j for j, o in enumerate(sl.outputs) if o in wanted}
            if not want <= keep[sl.kind]:
                keep[sl.kind] |= want
                grew = True
            if sl.kind not in reads or grew:
                reads[sl.kind] = drafts[sl.kind].finish(keep[sl.kind])[1]
            d = drafts[sl.kind]
            wanted |= {sl.inputs[j] for j, v in enumerate(d.inputs) if v in reads[sl.kind]}
        if not grew:
            return keep


def fresh(base: str, used: set[str]) -> str:
    """``base``, or the first of ``base_2``, ``base_3``, ... not in ``used`` (not added to it).

    >>> fresh("rms_norm_body", {"rms_norm_body"})
    'rms_norm_body_2'
    """
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}_{n}"
    return name


def names_in(expr: str) -> set[str]:
    return {s.id for s in ast.walk(ast.parse(expr, mode="eval")) if isinstance(s, ast.Name)}


def scan(text: str) -> Iterator[tuple[int, str, int]]:
    """``(index, character, depth)`` for each character of ``text`` outside string literals;
    ``depth`` counts the brackets open before it."""
    depth, quote = 0, ""
    for k, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
            continue
        yield k, ch, depth
        if ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1


def split_last(text: str) -> tuple[int, int] | None:
    """The last bracket pair at depth 0 of ``text`` (outside string literals), or None."""
    opened, best = -1, None
    for k, ch, depth in scan(text):
        if ch in "([{" and depth == 0:
            opened = k
        elif ch in ")]}" and depth == 1 and k > opened + 1:
            best = (opened, k)
    return best


def commas(text: str) -> list[str]:
    """``text`` split at its commas at depth 0 (outside brackets and strings)."""
    parts, start = [], 0
    for k, ch, depth in scan(text):
        if ch == "," and depth == 0:
            parts.append(text[start:k].strip())
            start = k + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """``line`` as lines of at most ``width`` characters where brackets allow: the last
    bracket pair is opened, and its contents go on one line, or one item a line.

    >>> print("\\n".join(wrap("x = f(" + ", ".join(f"arg_{i}" for i in range(3)) + ")", 12)))
    x = f(
        arg_0,
        arg_1,
        arg_2,
    )
    """
    if len(line) <= width or line.lstrip().startswith("#"):
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    text = line.strip()
    if text.startswith("return ") and split_last(text[7:]) != (0, len(text) - 8):
        # A tuple (commas at depth 0) gets its brackets; `return f(a, b)` is one value.
        tuple_ = len(commas(text[7:])) > 1 or text.endswith(",")
        text = f"return ({text[7:].rstrip(',')},)" if tuple_ else text
    pair = split_last(text)
    if pair is None:
        return [line]
    a, b = pair
    head, inner, tail = text[: a + 1], text[a + 1 : b], text[b:]
    heads = wrap(indent + head, width)
    pad = indent + "    "
    if len(pad + inner) <= width and not inner.rstrip().endswith(","):
        body = [pad + inner]
    else:
        parts = commas(inner)
        if len(parts) <= 1 and not inner.rstrip().endswith(","):
            body = wrap(pad + inner, width)
        else:
            body = [w for p in parts for w in wrap(pad + p + ",", width)]
    return heads + body + [indent + tail]


def docstring(text: str) -> str:
    """A function's docstring, indented, wrapped at :data:`WIDTH`."""
    one = f'    """{text}"""'
    if len(one) <= WIDTH:
        return one
    lines = textwrap.wrap(text, WIDTH - 4, initial_indent='"""', break_on_hyphens=False)
    return "    " + "\n    ".join(lines) + '\n    """'
