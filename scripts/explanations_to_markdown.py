"""Move the explanations written inline in diagnostics/codes.py into one Markdown file each.

`linnet explain` reads `packages/linnet-lang/src/linnet/lang/diagnostics/explanations/EXXXX.md`
(rustc's error_codes/ layout); `codes.py` loads them into `EXPLANATIONS` and still accepts
entries written inline (its `_INLINE` dict, or the older `EXPLANATIONS = {...}` literal). This
script writes every inline entry to its file (an entry inline replaces an older file) and
rewrites codes.py as the loader with an empty `_INLINE`. Run it again after merging a branch
that added codes the old way:

    $ python scripts/explanations_to_markdown.py
    wrote 3 explanations (E0920, E0921, E0922); codes.py is the loader again
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "packages" / "linnet-lang" / "src" / "linnet" \
    / "lang" / "diagnostics"
CODES = HERE / "codes.py"
FOLDER = HERE / "explanations"

LOADER = '''"""Long explanations of Linnet's error codes, printed by ``linnet explain E0301``.

Every code any Linnet distribution raises (the compiler, the CLI, the readers, and the
runtimes' ``E07xx``) has an explanation: one Markdown file per code in ``explanations/``
(``explanations/E0301.md``, as rustc keeps its error_codes/), loaded here into
:data:`EXPLANATIONS` with importlib.resources and rendered into the docs site's error pages.
Each holds a one-line summary, a short paragraph on why it happens, and a small wrong example
with its fix (``Wrong:`` / ``Fixed:``, indented). Codes about configs, inputs, weights and
files show the ``linnet`` or Python call instead of source. A retired code keeps its page,
whose summary starts with ``Retired:``.

Codes are grouped by their hundreds:

* ``E00xx`` reading and lexing source files
* ``E01xx`` syntax (the parser)
* ``E02xx`` names, modules and imports
* ``E03xx`` statements, index notation and element types
* ``E04xx`` types, calls and returns
* ``E05xx`` kernels and gradients
* ``E06xx`` blocks and models, lowering, configs, inputs and weights
* ``E07xx`` the torch runtime: devices, inputs, contexts, weights, plans and backends
* ``E09xx`` serialised graphs and internal errors

A new code may be explained in ``_INLINE`` below (same shape: code -> text);
``scripts/explanations_to_markdown.py`` moves such entries into files.
``tests/test_diagnostics_golden.py`` checks that every code raised in any distribution has an
explanation, and that the Linnet examples fail (and pass) as they say.

>>> EXPLANATIONS["E0301"].splitlines()[0]
'An index variable is used for an axis of a different size.'
>>> EXPLANATIONS["E0720"].splitlines()[0]
'An entry called with the wrong number of inputs.'
"""

from __future__ import annotations

import re
from importlib import resources

# Explanations not yet moved to a file (scripts/explanations_to_markdown.py moves them).
_INLINE: dict[str, str] = {
}

_FILE = re.compile(r"E\\d{4}\\.md")


def load() -> dict[str, str]:
    """Every explanation, by code: the files, then ``_INLINE`` (which wins)."""
    found: dict[str, str] = {}
    folder = resources.files("linnet.lang.diagnostics").joinpath("explanations")
    for entry in folder.iterdir():
        if _FILE.fullmatch(entry.name):
            found[entry.name[:-3]] = entry.read_text(encoding="utf-8")
    found.update(_INLINE)
    return dict(sorted(found.items()))


EXPLANATIONS: dict[str, str] = load()

RETIRED: frozenset[str] = frozenset(c for c, t in EXPLANATIONS.items() if t.startswith("Retired:"))
"""Codes no longer raised, whose page stays (old logs and links still name them)."""
'''


def inline_entries(text: str) -> dict[str, str]:
    """The dict literal assigned to ``EXPLANATIONS`` or ``_INLINE`` in codes.py's text."""
    for node in ast.parse(text).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id in ("EXPLANATIONS", "_INLINE") \
                and isinstance(node.value, ast.Dict):
            return ast.literal_eval(node.value)
    return {}


def main() -> int:
    entries = inline_entries(CODES.read_text(encoding="utf-8"))
    FOLDER.mkdir(exist_ok=True)
    for code, text in entries.items():
        (FOLDER / f"{code}.md").write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    CODES.write_text(LOADER, encoding="utf-8")
    names = ", ".join(sorted(entries)) if len(entries) <= 5 else f"{min(entries)}..{max(entries)}"
    print(f"wrote {len(entries)} explanations ({names}); codes.py is the loader again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
