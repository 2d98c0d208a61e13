"""Every docstring example of linnet-lang runs and prints what it shows (the quality bar: each
public function has a docstring with an example; an example that drifted from the code is a
wrong document). Examples marked ``+SKIP`` are those that need a framework or a file."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import linnet.lang
import pytest

ROOT = Path(linnet.lang.__file__).parent


def module_names() -> list[str]:
    names = []
    for py in sorted(ROOT.rglob("*.py")):
        parts = list(py.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(["linnet.lang", *parts]))
    return names


@pytest.mark.parametrize("name", module_names())
def test_the_examples_of_each_module_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
        report=True,
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} fail"
