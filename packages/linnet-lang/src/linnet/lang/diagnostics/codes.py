"""Long explanations of Linnet's error codes, printed by ``linnet explain E0301``.

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

A new code is explained by adding its file.
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

_FILE = re.compile(r"E\d{4}\.md")


def load() -> dict[str, str]:
    """Every explanation, by code, read from ``explanations/EXXXX.md``."""
    found: dict[str, str] = {}
    folder = resources.files("linnet.lang.diagnostics").joinpath("explanations")
    for entry in folder.iterdir():
        if _FILE.fullmatch(entry.name):
            found[entry.name[:-3]] = entry.read_text(encoding="utf-8")
    return dict(sorted(found.items()))


EXPLANATIONS: dict[str, str] = load()

RETIRED: frozenset[str] = frozenset(c for c, t in EXPLANATIONS.items() if t.startswith("Retired:"))
"""Codes no longer raised, whose page stays (old logs and links still name them)."""
