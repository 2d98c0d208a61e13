"""Source files, spans and the one error family every user mistake goes through.

A :class:`Diagnostic` has a code (``E0102``), a primary span, secondary labels, a
message and a help line. :func:`render` prints it the way rustc does::

    error[E0201]: unknown name `x2`
      --> model.linnet:12:9
       |
    12 |     let y = x2 + 1.0
       |             ^^ not defined here
       |
       = help: did you mean `x`?

:class:`LinnetError` carries one or more diagnostics; the CLI and the runtimes catch it
and print the diagnostics, never a Python traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    """A named piece of Linnet source text.

    >>> SourceFile("m.linnet", "fn f() {}").line_col(3)
    (1, 4)
    """

    name: str
    text: str

    def __post_init__(self) -> None:
        # str.find, not a loop over every character: every parse builds this table.
        starts = [0]
        find = self.text.find
        i = find("\n")
        while i >= 0:
            starts.append(i + 1)
            i = find("\n", i + 1)
        object.__setattr__(self, "_line_starts", starts)

    @classmethod
    def read(cls, path: str | Path) -> SourceFile:
        """Read a file as UTF-8; errors become a Linnet diagnostic, not an OSError."""
        p = Path(path)
        try:
            return cls(str(path), p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LinnetError(
                Diagnostic(
                    "E0001",
                    f"cannot read `{path}`: no such file",
                    help="check the path; Linnet source files end in `.linnet`",
                )
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise LinnetError(
                Diagnostic(
                    "E0001",
                    f"cannot read `{path}`: {exc}",
                    help="Linnet source must be a readable UTF-8 text file",
                )
            ) from None

    def line_col(self, offset: int) -> tuple[int, int]:
        starts: list[int] = self._line_starts  # type: ignore[attr-defined]
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - starts[lo] + 1

    def line_text(self, line: int) -> str:
        starts: list[int] = self._line_starts  # type: ignore[attr-defined]
        start = starts[line - 1]
        end = starts[line] - 1 if line < len(starts) else len(self.text)
        return self.text[start:end]


@dataclass(frozen=True)
class Span:
    """A byte range ``start..stop`` in a source file."""

    source: SourceFile
    start: int
    stop: int

    def to(self, other: Span) -> Span:
        return Span(self.source, min(self.start, other.start), max(self.stop, other.stop))

    @property
    def line(self) -> int:
        return self.source.line_col(self.start)[0]

    @property
    def column(self) -> int:
        return self.source.line_col(self.start)[1]

    def location(self) -> str:
        line, col = self.source.line_col(self.start)
        return f"{self.source.name}:{line}:{col}"

    def __repr__(self) -> str:
        return f"Span({self.location()})"


@dataclass(frozen=True)
class Label:
    span: Span
    message: str = ""


@dataclass
class Diagnostic:
    """One user-facing error (or warning) with a code, where, why and how to fix it."""

    code: str
    message: str
    span: Span | None = None
    label: str = ""
    secondary: list[Label] = field(default_factory=list)
    help: str = ""
    notes: list[str] = field(default_factory=list)
    severity: str = "error"

    def with_secondary(self, span: Span | None, message: str) -> Diagnostic:
        if span is not None:
            self.secondary.append(Label(span, message))
        return self

    def to_json(self) -> dict:
        def loc(span: Span | None) -> dict | None:
            if span is None:
                return None
            line, col = span.source.line_col(span.start)
            end_line, end_col = span.source.line_col(max(span.stop, span.start))
            return {
                "file": span.source.name,
                "line": line,
                "column": col,
                "end_line": end_line,
                "end_column": end_col,
                "start": span.start,
                "stop": span.stop,
            }

        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "span": loc(self.span),
            "label": self.label,
            "secondary": [{"span": loc(s.span), "message": s.message} for s in self.secondary],
            "help": self.help,
            "notes": list(self.notes),
        }


class LinnetError(Exception):
    """A mistake in a user's model, weights, inputs or plugin, with its diagnostics.

    >>> try:
    ...     raise LinnetError(Diagnostic("E0001", "cannot read `x.linnet`"))
    ... except LinnetError as err:
    ...     print(err.diagnostics[0].code)
    E0001
    """

    def __init__(self, diagnostics: Diagnostic | list[Diagnostic]):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(render_all(self.diagnostics))

    def __str__(self) -> str:
        return render_all(self.diagnostics)


def coded_error(code: str, message: str, help: str = "") -> LinnetError:
    """A :class:`LinnetError` of one diagnostic: a user mistake with its code, what is wrong
    and how to fix it, where no source span applies (inputs, options, files, plans). The one
    helper every package raises such errors with.

    >>> print(coded_error("E0787", "--tokens 0: decode at least one token", help="e.g. --tokens 16"))
    error[E0787]: --tokens 0: decode at least one token
      = help: e.g. --tokens 16
    """
    return LinnetError(Diagnostic(code, message, help=help))


def _label_columns(span: Span) -> tuple[int, int, int]:
    """(line, first column, underline width) of a label; multi-line spans run to line end."""
    src = span.source
    line, col = src.line_col(span.start)
    end_line, end_col = src.line_col(
        max(span.start, span.stop - 1) if span.stop > span.start else span.start
    )
    line_text = src.line_text(line).replace("\t", " ")
    width = (end_col - col + 1) if end_line == line else max(1, len(line_text) - col + 1)
    if span.stop <= span.start:
        width = 1
    return line, col, max(1, width)


def _render_line(
    out: list[str], span: Span, labels: list[tuple[int, int, str, str]], gutter: int
) -> None:
    """One source line and its labels ``(col, width, mark, text)``, rustc style: every
    underline on one row, the rightmost label's text beside it, the others hung below::

        2 |     let y[r: R, c: C] = x[c, r]
          |                 ----      ^ axis of size R
          |                 |
          |                 `c` ranges over C here
    """
    pad = " " * gutter
    out.append(
        f"{str(span.line).rjust(gutter)} | {span.source.line_text(span.line).replace(chr(9), ' ')}"
    )
    labels = sorted(labels, key=lambda lab: lab[0])
    row = [" "] * max(col - 1 + width for col, width, _, _ in labels)
    for col, width, mark, _ in labels:
        for k in range(col - 1, col - 1 + width):
            row[k] = mark
    last_text = labels[-1][3]
    out.append(f"{pad} | {''.join(row)}{(' ' + last_text) if last_text else ''}")
    hung = [lab for lab in labels[:-1] if lab[3]]

    def bars(items: list[tuple[int, int, str, str]]) -> str:
        cells = [" "] * max((lab[0] for lab in items), default=0)
        for lab in items:
            cells[lab[0] - 1] = "|"
        return "".join(cells)

    if hung:
        out.append(f"{pad} | {bars(hung)}")
    for i in range(len(hung) - 1, -1, -1):
        prefix = bars(hung[:i])
        out.append(f"{pad} | {prefix.ljust(hung[i][0] - 1)}{hung[i][3]}")


def render(diag: Diagnostic) -> str:
    """Render one diagnostic as text, rustc style (see the module docstring).

    Labels on one line share it; lines of the primary label's file are shown in order.
    """
    out = [f"{diag.severity}[{diag.code}]: {diag.message}"]
    labels = ([(diag.span, diag.label, "^")] if diag.span else []) + [
        (s.span, s.message, "-") for s in diag.secondary
    ]
    if labels:
        gutter = max(len(str(span.line)) for span, _, _ in labels)
        pad = " " * gutter
        # Group labels by (file, line); a file's lines in order, the primary's file first.
        groups: dict[tuple[str, int], tuple[Span, list]] = {}
        for span, text, mark in labels:
            line, col, width = _label_columns(span)
            key = (span.source.name, line)
            groups.setdefault(key, (span, []))[1].append((col, width, mark, text))
        files = list(dict.fromkeys(name for name, _ in groups))
        ordered = sorted(groups, key=lambda k: (files.index(k[0]), k[1]))
        if diag.span is not None:
            out.append(f"{pad}--> {diag.span.location()}")
            out.append(f"{pad} |")
        prev: tuple[str, int] | None = None
        for key in ordered:
            span, line_labels = groups[key]
            if prev is None and diag.span is None:
                out.append(f"{pad}--> {span.location()}")
                out.append(f"{pad} |")
            elif prev is not None and prev[0] != key[0]:
                # Another file: rustc's `:::` marker, then the usual empty gutter line.
                out.append(f"{pad}::: {span.location()}")
                out.append(f"{pad} |")
            elif prev is not None and key[1] != prev[1] + 1:
                out.append(f"{pad} :")
            _render_line(out, span, line_labels, gutter)
            prev = key
        out.append(f"{pad} |")
        for note in diag.notes:
            out.append(f"{pad} = note: {note}")
        if diag.help:
            out.append(f"{pad} = help: {diag.help}")
    else:
        for note in diag.notes:
            out.append(f"  = note: {note}")
        if diag.help:
            out.append(f"  = help: {diag.help}")
    return "\n".join(out)


def render_all(diags: list[Diagnostic]) -> str:
    errors = sum(1 for d in diags if d.severity == "error")
    text = "\n\n".join(render(d) for d in diags)
    if errors > 1:
        text += f"\n\nerror: aborting due to {errors} previous errors"
    return text


def to_json(diags: list[Diagnostic]) -> str:
    """Diagnostics as JSON lines-free array, for editors (`linnet check --format json`)."""
    return json.dumps([d.to_json() for d in diags], indent=2)
