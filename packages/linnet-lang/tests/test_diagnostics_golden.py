"""Golden tests of rendered diagnostics: one user mistake per `diagnostics/cases/*.linnet`.

Each case is checked (or, with a first-line directive, lowered) and must fail with a
:class:`LinnetError` whose rendered text equals `NAME.expected` beside it. A case lowers
when its first lines are ``// lower:`` directives, holding ``key=value`` pairs::

    // lower: entry=decode inputs={"x": [2, 3]} config={"D": 4}
    // lower: weights={"w": [[4, 4], "f32"]}

``entry`` and ``model`` are bare words; ``inputs``, ``config``, ``weights`` and ``wrt`` are JSON
(a weight is ``[shape, dtype]``; ``wrt`` lowers for ``--grad``, with ``lower_grad``). Modules that cases ``use`` live in ``cases/lib/``.

Regenerate the goldens after an intended change with::

    LINNET_UPDATE_GOLDEN=1 uv run pytest packages/linnet-lang/tests/test_diagnostics_golden.py
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from linnet.lang import (
    LinnetError,
    Program,
    SourceFile,
    check_program,
    check_text,
    lower,
    parse,
    render_all,
)
from linnet.lang.cli import main as cli_main
from linnet.lang.diagnostics.codes import EXPLANATIONS, RETIRED
from linnet.lang.diagnostics.core import to_json
from linnet.lang.syntax.program import STD_ROOT

CASES = Path(__file__).parent / "diagnostics" / "cases"
CASE_FILES = sorted(CASES.glob("*.linnet"))
UPDATE = os.environ.get("LINNET_UPDATE_GOLDEN") == "1"
DIRECTIVE = "// lower:"
BARE_KEYS = ("entry", "model")


def parse_directive(text: str) -> dict[str, Any] | None:
    """The keyword arguments for `lower` from a case's leading `// lower:` lines, or None."""
    lines = []
    for line in text.splitlines():
        if not line.startswith(DIRECTIVE):
            break
        lines.append(line[len(DIRECTIVE) :])
    if not lines:
        return None
    spec = " ".join(lines)
    decoder = json.JSONDecoder()
    kwargs: dict[str, Any] = {}
    pos = 0
    while True:
        m = re.compile(r"\s*(\w+)=").match(spec, pos)
        if m is None:
            if spec[pos:].strip():
                raise ValueError(f"bad lower directive near {spec[pos:]!r}")
            break
        key, pos = m.group(1), m.end()
        if key in BARE_KEYS:
            word = re.compile(r"\S+").match(spec, pos)
            assert word is not None, f"`{key}=` needs a value"
            kwargs[key], pos = word.group(0), word.end()
        else:
            kwargs[key], pos = decoder.raw_decode(spec, pos)
    if "weights" in kwargs:
        kwargs["weights"] = {
            k: (tuple(shape), dtype) for k, (shape, dtype) in kwargs["weights"].items()
        }
    return kwargs


def run_case(path: Path) -> LinnetError:
    """Check or lower one case; returns the LinnetError it must raise."""
    text = path.read_text(encoding="utf-8")
    source = SourceFile(f"cases/{path.name}", text)
    try:
        program = Program(parse(source, path.stem), [CASES])
        kwargs = parse_directive(text)
        if kwargs is None:
            errors = check_program(program)
            if errors:
                raise LinnetError(errors)
        else:
            entry = kwargs.pop("entry")
            if "wrt" in kwargs:  # `wrt=[...]`: lowered for --grad (linnet.lang.grad)
                from linnet.lang.grad import lower_grad

                lower_grad(program, entry, **kwargs)
            else:
                lower(program, entry, **kwargs)
    except LinnetError as err:
        return err
    pytest.fail(f"{path.name}: expected a LinnetError, but it compiled cleanly")


def rendered(err: LinnetError) -> str:
    # Modules are read by absolute path; show them relative (`cases/lib/...`, `std/nn/...`)
    # so that goldens do not depend on where the checkout or the package lives.
    text = render_all(err.diagnostics).replace(str(CASES) + os.sep, "cases/")
    return text.replace(str(STD_ROOT.parent) + os.sep, "") + "\n"


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_golden(path: Path) -> None:
    text = rendered(run_case(path))
    golden = path.with_suffix(".expected")
    if UPDATE or not golden.exists():
        golden.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"wrote missing golden {golden.name}; review it and rerun")
    assert text == golden.read_text(encoding="utf-8")


def test_enough_distinct_cases() -> None:
    assert len(CASE_FILES) >= 35
    codes = {d.code for p in CASE_FILES for d in run_case(p).diagnostics}
    assert len(codes) >= 35


def test_every_golden_has_a_case() -> None:
    stale = [g.name for g in CASES.glob("*.expected") if not g.with_suffix(".linnet").exists()]
    assert not stale


def test_json_format() -> None:
    err = run_case(CASES / "index_swapped_dims.linnet")
    data = json.loads(to_json(err.diagnostics))
    assert isinstance(data, list) and data
    first = data[0]
    assert first["code"] == "E0301"
    assert "ranges over" in first["message"]
    span = first["span"]
    assert span["file"] == "cases/index_swapped_dims.linnet"
    assert span["line"] >= 1 and span["column"] >= 1 and span["stop"] > span["start"]


def test_cli_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["check", str(CASES / "name_unknown_did_you_mean.linnet"), "--format", "json"])
    assert rc == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["code"] for d in data] == ["E0201"]
    assert data[0]["span"]["line"] > 0 and data[0]["message"]


REPO = Path(__file__).resolve().parents[3]


def source_codes() -> set[str]:
    """Every code raised in any distribution's sources: linnet-lang, linnet-plan, the torch
    runtime and the plugins (packages/*/src, plugins/*/src)."""
    found = set()
    roots = [*REPO.glob("packages/*/src"), *REPO.glob("plugins/*/src")]
    assert len(roots) >= 4, roots
    for root in roots:
        for py in root.rglob("*.py"):
            if py.name == "codes.py" and py.parent.name == "diagnostics":
                continue
            found.update(re.findall(r'"(E\d{4})"', py.read_text(encoding="utf-8")))
    return found - {"E0000"}


def test_every_code_is_explained() -> None:
    codes = source_codes()
    assert len(codes) > 100
    assert {"E0710", "E0720", "E0757", "E0788"} <= codes  # the runtime's codes are scanned
    missing = sorted(codes - set(EXPLANATIONS))
    assert not missing, f"codes without an explanation: {missing}"
    stale = sorted(set(EXPLANATIONS) - codes - RETIRED)
    assert not stale, f"explanations for codes no longer used (mark them `Retired:`): {stale}"
    raised = sorted(RETIRED & codes)
    assert not raised, f"codes marked retired but still raised: {raised}"
    for code, text in EXPLANATIONS.items():
        summary = text.strip().splitlines()[0]
        assert summary and len(summary) < 100, code


def test_explanations_are_one_markdown_file_per_code() -> None:
    from importlib import resources

    folder = resources.files("linnet.lang.diagnostics").joinpath("explanations")
    files = {e.name[:-3] for e in folder.iterdir() if e.name.endswith(".md")}
    assert files == set(EXPLANATIONS)  # no .md file the loader skips (a misnamed code)
    for code in files:
        text = folder.joinpath(f"{code}.md").read_text(encoding="utf-8")
        assert text == EXPLANATIONS[code] and text.endswith("\n") and "\t" not in text


def test_explain_runtime_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for code in ("E0720", "E0757", "E0910"):
        assert cli_main(["explain", code]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{code}: ") and "Wrong:" in out and "Fixed:" in out


def test_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["explain", "E0301"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("E0301: ")
    assert "x[c, r]" in out
    assert cli_main(["explain", "301"]) == 0
    assert capsys.readouterr().out == out
    assert cli_main(["explain", "E9999"]) == 1
    assert "no explanation" in capsys.readouterr().err


# ---------------------------------------------------------------- the examples of `explain`

# Explanations whose examples span two files.
NOT_STANDALONE = {"E0203"}
# Mistakes found when lowering: entry, then the wrong and the fixed (inputs, config).
LOWERING = {
    "E0320": ("forward", ({"x": [4], "n": []}, {"D": 4}), ({"x": [4]}, {"D": 4, "K": 3})),
    "E0340": ("forward", ({"x": [4]}, {"D": 4}), ({"x": [4]}, {"D": 4})),
}


def examples(text: str) -> dict[str, str]:
    """The indented blocks after `Wrong:` and `Fixed:` in an explanation."""
    out = {}
    for label in ("Wrong", "Fixed"):
        m = re.search(rf"^{label}:\n\n((?:    .*\n|\n)+)", text, re.MULTILINE)
        if m:
            out[label] = textwrap.dedent(m.group(1)).strip() + "\n"
    return out


def is_source(example: str) -> bool:
    return not example.startswith(("$", ">>>", "("))


@pytest.mark.parametrize("code", sorted(EXPLANATIONS))
def test_explanation_examples(code: str) -> None:
    """Each explanation has both examples; Linnet ones fail with the code, and the fix checks."""
    ex = examples(EXPLANATIONS[code])
    assert set(ex) == {"Wrong", "Fixed"}, f"{code}: needs `Wrong:` and `Fixed:` examples"
    if code in NOT_STANDALONE or not is_source(ex["Wrong"]):
        return
    fixed = check_text(ex["Fixed"], "example")
    if code in LOWERING:
        entry, (inputs, config), (fixed_inputs, fixed_config) = LOWERING[code]
        lower(fixed, entry, fixed_inputs, fixed_config)
        with pytest.raises(LinnetError) as info:
            lower(check_text(ex["Wrong"], "example"), entry, inputs, config)
    else:
        with pytest.raises(LinnetError) as info:
            check_text(ex["Wrong"], "example")
    found = [d.code for d in info.value.diagnostics]
    assert code in found, f"{code}: the wrong example raised {found}"
