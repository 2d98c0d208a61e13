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
an anchor into a Markdown file must name one of its headings.
"""

from __future__ import annotations

import ast
import json
import re
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
    graph = lower(Program.from_file(llama / "llama.linnet"), "decode",
                  {"token": [1], "pos": [1]}, config)
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

        done = subprocess.run([sys.executable, "-c", block.text], cwd=workdir,
                              capture_output=True, text=True, timeout=600)
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
    expected = [ast.literal_eval(m.group(1)) for m in re.finditer(
        r"^\s*print\(.*\)\s*#\s*(\[.*\]|\d+|'.*'|True|False)\s*$", block.text,
        re.MULTILINE)]
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
    made = [path for page in sorted((DOCS / "benchmarks").glob("*.md"))
            for path, png in module.plots(page) if png.startswith(b"\x89PNG")]
    assert len(made) == sum(page.read_text().count("<!-- plot:")
                            for page in (DOCS / "benchmarks").glob("*.md")) >= 6
