"""mkdocs hooks (mkdocs.yml `hooks:`): pages made at build time, never committed.

* `errors/index.md` and one `errors/EXXXX.md` per code, from
  `linnet.lang.diagnostics.codes.EXPLANATIONS` (the files `diagnostics/explanations/EXXXX.md`,
  the text `linnet explain` prints), so the pages cannot go stale; their indented examples
  are fenced as Linnet, a shell session or a Python session, to be highlighted (mkdocs.yml
  lists the error pages in `not_in_nav`: errors/index.md links them);
* benchmark plots: a table in docs/benchmarks/*.md right under
  `<!-- plot: TITLE | COLUMN; COLUMN | UNIT | LABEL COLUMN; ... -->` becomes a bar chart
  (matplotlib, PNG) of those columns' recorded figures, one bar group per row named by the
  label columns, placed where the comment is; "log" in UNIT gives a log scale;
* the recorded results, docs/benchmarks/results.csv (one row a measurement: area, shape, card,
  date, commit, unit, Linnet's figure, the baseline and its figure, the floor, and the notes
  page it comes from): `<!-- results: AREA -->` on a page becomes that area's table and a chart
  of it (`benchmarks/plots/results-AREA.png`); `<!-- results: headline -->` (the landing
  page) becomes the decode and prefill rows against transformers and the floor;
* links from a page to files outside docs/ (`../../benchmarks/gpu.sh`) must name an existing
  file of the repository; on the site they become the path in code, since the site holds only
  docs/;
* ```` ```python-fragment ```` blocks (not executed by integration-tests/test_docs.py) are
  highlighted as Python, and words after a fence's language (```` ```linnet-error E0301 ````,
  read by the tests) are dropped.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PLOT = re.compile(
    r"^<!-- plot: (?P<title>[^|]+)\|(?P<columns>[^|]+)\|(?P<unit>[^|]*)"
    r"\|(?P<labels>[^|]+)-->[ \t]*$",
    re.MULTILINE,
)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
NUMBER = re.compile(r"^\**\s*(-?[0-9][0-9.,]*(?:e-?[0-9]+)?)")
CODE = re.compile(r"^\| (E\d{4}) \|", re.MULTILINE)
RESULTS = DOCS / "benchmarks" / "results.csv"
RESULT = re.compile(r"^<!-- results: (?P<area>[\w-]+) -->[ \t]*$", re.MULTILINE)
# The chart and table of each area: its title, the rows it takes, and what its baseline is.
AREAS = {
    "headline": (
        "Linnet against transformers and the bandwidth floor",
        {"decode", "prefill"},
        "transformers",
    ),
    "decode": ("Decode steps, captured and planned", {"decode"}, "transformers"),
    "prefill": ("Prefill", {"prefill"}, "transformers"),
    "kernels": (
        "Linnet's kernels alone, in a CUDA graph (H200)",
        {"kernels"},
        "PyTorch (cuBLAS or the op's body)",
    ),
}


def example_language(lines: list[str]) -> str:
    """The fence language of an explanation's example: a shell session, a Python session, a
    remark in parentheses, or else Linnet source (a `Wrong:` one may not lex cleanly: E0002)."""
    first = lines[0].lstrip()
    if first.startswith("$ "):
        return "console"
    if first.startswith(">>> "):
        return "pycon"
    if len(lines) == 1 and first.startswith("(") and first.endswith(")"):
        return "text"
    return "linnet"


def fenced_examples(body: str) -> str:
    """``body`` with each indented code block (the form `linnet explain` prints) fenced with
    its language, so that the site highlights the examples."""
    lines = body.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("    ") and (not out or not out[-1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():  # trailing blank lines stay outside the fence
                j -= 1
            block = [line[4:] for line in lines[i:j]]
            out += [f"```{example_language(block)}", *block, "```"]
            i = j
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


def error_pages() -> dict[str, str]:
    """Markdown for errors/index.md and errors/EXXXX.md, from the explanations."""
    from linnet.lang.diagnostics.codes import EXPLANATIONS

    pages: dict[str, str] = {}
    rows = []
    for code in sorted(EXPLANATIONS):
        summary, _, body = EXPLANATIONS[code].strip().partition("\n")
        pages[f"errors/{code}.md"] = (
            f"# {code}: {summary.strip()}\n\n{fenced_examples(body.strip())}\n\n"
            f"`linnet explain {code}` prints this page. [All codes](index.md)\n"
        )
        rows.append(f"| [{code}]({code}.md) | {summary.strip().replace('|', '/')} |")
    pages["errors/index.md"] = (
        "# Error codes\n\nEvery code the Linnet compiler reports, with what it means and an "
        "example of the mistake and its fix. Generated from the explanations `linnet explain "
        "CODE` prints; [Diagnostics](../diagnostics.md) describes how errors look.\n\n"
        "| code | meaning |\n|---|---|\n" + "\n".join(rows) + "\n"
    )
    return pages


def table_after(text: str, start: int) -> list[list[str]]:
    """The Markdown table that starts on the first line after ``start``: rows of cells."""
    rows = []
    for line in text[start:].lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not all(re.fullmatch(r":?-+:?", c) for c in cells):
            rows.append(cells)
    return rows


def number(cell: str) -> float | None:
    match = NUMBER.match(cell.replace("`", ""))
    return None if match is None else float(match.group(1).replace(",", ""))


def figure(
    title: str,
    columns: list[str],
    unit: str,
    label_columns: list[str],
    rows: list[list[str]],
    where: str,
) -> Any:
    """A horizontal grouped bar chart of ``columns`` for each row of the table: a matplotlib
    Figure, its legend (several columns) under the axes, never over the bars."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    header, body = rows[0], rows[1:]
    missing = [c for c in columns + label_columns if c not in header]
    if missing or not body:
        raise PluginError(
            f"{where}: plot of {missing or columns}: the table under it has "
            f"columns {header} and {len(body)} rows"
        )
    index = [header.index(c) for c in columns]
    named = [header.index(c) for c in label_columns]
    labels = [" / ".join(re.sub(r"[*`]", "", row[i]) for i in named) for row in body]
    unplottable = [row[0] for row in body if all(number(row[i]) is None for i in index)]
    if len(unplottable) == len(body):
        raise PluginError(f"{where}: no number in columns {columns} of the table under it")
    # The legend takes rows of its own under the axes (a legend inside them covered the longest
    # bars: issue 46), as many entries a row as fit the figure's width, rows balanced.
    fit = max(1, min(len(columns), 110 // (max(len(c) for c in columns) + 8)))
    legend_rows = 0 if len(columns) == 1 else -(-len(columns) // fit)
    per_row = -(-len(columns) // max(legend_rows, 1))
    figure, axes = pyplot.subplots(
        figsize=(8, 0.3 * len(body) * len(columns) + 1.5 + 0.25 * legend_rows), layout="constrained"
    )
    height = 0.8 / len(columns)
    for k, (column, i) in enumerate(zip(columns, index)):
        values = [number(row[i]) if i < len(row) else None for row in body]
        positions = [n + k * height for n, v in enumerate(values) if v is not None]
        axes.barh(positions, [v for v in values if v is not None], height=height, label=column)
    axes.set_yticks(
        [n + height * (len(columns) - 1) / 2 for n in range(len(body))], labels, fontsize=8
    )
    axes.invert_yaxis()
    axes.set_xlabel(unit.strip())
    if "log" in unit:
        from matplotlib.ticker import FuncFormatter

        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.set_title(title.strip(), fontsize=10)
    if legend_rows:
        figure.legend(loc="outside lower center", ncols=per_row, fontsize=8, frameon=False)
    return figure


def png(chart: Any) -> bytes:
    """A matplotlib Figure as PNG bytes (closed after)."""
    from matplotlib import pyplot

    out = io.BytesIO()
    chart.savefig(out, format="png", dpi=100, metadata={"Software": None})
    pyplot.close(chart)
    return out.getvalue()


def figures(page: Path) -> list[tuple[str, Any]]:
    """(site path, matplotlib Figure) for each plot comment of a benchmark page, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for n, match in enumerate(PLOT.finditer(text)):
        columns = [c.strip() for c in match["columns"].split(";")]
        labels = [c.strip() for c in match["labels"].split(";")]
        rows = table_after(text, match.end())
        where = f"{page.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
        found.append(
            (
                f"benchmarks/plots/{page.stem}-{n}.png",
                figure(match["title"], columns, match["unit"], labels, rows, where),
            )
        )
    return found


def plots(page: Path) -> list[tuple[str, bytes]]:
    """(site path, PNG) for each plot comment of a benchmark page, in order."""
    return [(path, png(chart)) for path, chart in figures(page)]


def results(path: Path = RESULTS) -> list[dict[str, str]]:
    """The recorded results (docs/benchmarks/results.csv), a dict of its columns a row.

    >>> results()[0]["card"]
    'H200'
    """
    import csv

    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for n, row in enumerate(rows, start=2):
        if (
            not row["linnet"]
            or number(row["linnet"]) is None
            or row["area"] not in {a for _, areas, _ in AREAS.values() for a in areas}
        ):
            raise PluginError(
                f"{path.relative_to(ROOT)}:{n}: a row needs a known area and Linnet's figure: {row}"
            )
    return rows


def result_rows(area: str) -> list[dict[str, str]]:
    """The rows of results.csv that ``area``'s table and chart show, in the file's order."""
    if area not in AREAS:
        raise PluginError(f"<!-- results: {area} -->: no such area; known: {sorted(AREAS)}")
    return [row for row in results() if row["area"] in AREAS[area][1]]


def result_label(row: dict[str, str], rows: list[dict[str, str]]) -> str:
    """A row's name in a chart: its shape, with its area and card where the chart mixes them."""
    label = row["shape"]
    if len({r["area"] for r in rows}) > 1:
        label = f"{row['area']}: {label}"
    if len({r["card"] for r in rows}) > 1:
        label = f"{label} ({row['card']})"
    return label


def result_figure(area: str) -> Any:
    """The chart of an area's results: Linnet, its baseline and the floor, a bar group a row
    (log scale: the figures span two orders of magnitude)."""
    title, _, baseline = AREAS[area]
    chosen = result_rows(area)
    units = sorted({row["unit"] for row in chosen})
    table = [["row", "Linnet", baseline, "floor"]] + [
        [result_label(row, chosen), row["linnet"], row["baseline_value"], row["floor"]]
        for row in chosen
    ]
    return figure(
        title,
        ["Linnet", baseline, "floor"],
        f"{' or '.join(units)} (log scale)",
        ["row"],
        table,
        f"docs/benchmarks/results.csv ({area})",
    )


def result_table(area: str, prefix: str) -> str:
    """An area's results as a Markdown table: the figures with their card, date and commit,
    and a link to the notes they come from (``prefix``: the path from the page to
    docs/benchmarks/). A baseline common to every row is named once, above the table; the
    landing page's (``headline``) is transformers, described on the results pages.

    >>> result_table("kernels", "").splitlines()[0].split(" | ")[1:4]
    ['card', 'date', 'commit']
    """
    rows = result_rows(area)
    named = {row["baseline"] for row in rows}
    # One baseline for every row is said once, above the table, not in a wide column.
    compact = area == "headline" or len(named) == 1
    baseline = AREAS[area][2]
    above = f"Baseline in every row: {named.pop()}.\n\n" if area != "headline" and compact else ""
    header = ["measurement", "card", "date", "commit", "Linnet"]
    header += [baseline] if compact else ["baseline", "baseline's figure"]
    header += ["Linnet's speed-up", "floor", "from"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        unit = row["unit"]
        other = f"{row['baseline_value']} {unit}" if row["baseline_value"] else "-"
        ratio = "-"
        if row["baseline_value"]:
            ratio = f"{float(row['baseline_value']) / float(row['linnet']):.2f}x"
        cells = [
            f"{row['area']}: {row['shape']}" if area == "headline" else row["shape"],
            row["card"],
            row["date"],
            f"`{row['commit']}`",
            f"**{row['linnet']} {unit}**",
        ]
        cells += [other] if compact else [row["baseline"] or "-", other]
        cells += [
            ratio,
            f"{row['floor']} {unit}" if row["floor"] else "not recorded",
            f"[notes]({prefix}{row['source']})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return above + "\n".join(lines) + "\n"


def on_files(files: Files, config: Any) -> Files:
    for path, content in error_pages().items():
        files.append(File.generated(config, path, content=content))
    for area in AREAS:
        files.append(
            File.generated(
                config, f"benchmarks/plots/results-{area}.png", content=png(result_figure(area))
            )
        )
    for page in sorted((DOCS / "benchmarks").glob("*.md")):
        for path, picture in plots(page):
            files.append(File.generated(config, path, content=picture))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    source = Path(page.file.src_path)
    if source.parts[0] == "benchmarks" and source.suffix == ".md":
        counter = iter(range(1000))
        markdown = PLOT.sub(
            lambda m: f"![{m['title'].strip()}](plots/{source.stem}-{next(counter)}.png)\n\n",
            markdown,
        )
    depth = "../" * (len(source.parts) - 1)

    def expand(match: re.Match) -> str:
        area = match["area"]
        alt = AREAS[area][0] if area in AREAS else area
        table = result_table(area, depth + "benchmarks/")
        chart = f"![{alt}]({depth}benchmarks/plots/results-{area}.png)\n"
        # The landing page shows the chart first (its one result), a results page its table.
        return f"{chart}\n{table}" if area == "headline" else f"{table}\n{chart}"

    markdown = RESULT.sub(expand, markdown)
    if source.as_posix() == "diagnostics.md":
        markdown = CODE.sub(lambda m: f"| [{m[1]}](errors/{m[1]}.md) |", markdown)
    markdown = re.sub(r"^(\s*`{3,})python-fragment\b", r"\1python", markdown, flags=re.MULTILINE)
    # test_docs.py reads words after a fence's language (```linnet-error E0301); superfences
    # would not open a fence on them.
    markdown = re.sub(r"^(\s*`{3,}[\w-]+)[ \t]+[^`{\n]+$", r"\1", markdown, flags=re.MULTILINE)
    folder = (DOCS / source).parent

    def outside(match: re.Match) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            return match[0]
        resolved = (folder / target).resolve()
        if resolved.is_relative_to(DOCS) or not page.file.src_path or page.file.generated_by:
            return match[0]
        if not resolved.exists():
            raise PluginError(f"docs/{source}: link to {target}: no such file in the repository")
        return f"{match['text']} (`{resolved.relative_to(ROOT).as_posix()}`)"

    return LINK.sub(outside, markdown)
