"""Adversarial cases of the elementwise math table (linnet.lang.ir.elementwise, issue 39 item
4): a new elementwise primitive is its row in ir/primitives.py, its row of spellings and its
line in docs/graph-format.md; every per-primitive table derives the rest, and a mistake in a
row (a rule both spelled and written by hand, a derivative that does not parse, a composition
that would compute a comparison in the wrong dtype) is an error when the table is built,
never a silently unused rule or a wrong gradient."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from linnet.lang.emit import jax as emit_jax
from linnet.lang.emit import torch as emit_torch
from linnet.lang.emit.torch import TorchScope
from linnet.lang.ir import elementwise as EL
from linnet.lang.ir.elementwise import SPELLINGS, Spelling, composed, formula, spelled
from linnet.lang.ir.graph import Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "linnet"
PAGE = TESTS.parents[2] / "docs" / "adding-a-primitive.md"

# The toy of docs/adding-a-primitive.md: `square`, edited into a copy of the sources. Each
# edit is (anchor, text inserted before it) in one file; nothing else changes.
EDITS = {
    "lang/ir/primitives.py": (
        '    _math("abs", "absolute value", ints=True),',
        '    _math("square", "x * x"),\n',
    ),
    "lang/ir/elementwise.py": (
        '    _fn("abs", "torch.abs({0})"',
        '    _fn("square", "torch.square({0})", "jnp.square({0})", "np.square({0})",\n'
        '        "{0} * {0}", "Mul({0}, {0})", "stablehlo.multiply({0}, {0})", "2.0 * x",\n'
        '        triton="{0} * {0}"),\n',
    ),
}

_TOY = r"""
import importlib, json, sys
import numpy as np
import torch
import test_coverage as C
import reference
from linnet.lang.ir import elementwise
from linnet.lang.ir.graph import Graph, Step, ValueType
from linnet.lang.ir.tiles import TILE_PRIMITIVES
from linnet.lang.check.folding import FOLDING_RULES
from linnet.lang.emit.torch import RULES, TorchScope
from linnet.lang.grad.rules import VJP_RULES, Tape
from linnet.lang.tensors.values import Const
from linnet.torch.interpreter import RULES as INTERPRETER

out = {"from": elementwise.__file__, "problems": []}
for module, table in C.TABLES:
    out["problems"] += C.problems(importlib.import_module(module), table)
for module, table in C.TILE_TABLES:
    out["problems"] += C.problems(importlib.import_module(module), table, TILE_PRIMITIVES)
step = Step("square", ["%a"], ["%r"])
g = Graph("run", "M", values={"%a": ValueType((2,), "f32"), "%r": ValueType((2,), "f32"),
                              "%g": ValueType((2,), "f32")})
out["fold"] = FOLDING_RULES["square"]([Const(1.5, "float")], None, {}).value
out["reference"] = reference.REFERENCE_RULES["square"](
    [np.array([3.0, -2.0], np.float32)], {}, step).tolist()
out["interpreter"] = INTERPRETER["square"](step, [torch.tensor([3.0, -2.0])], "cpu").tolist()
out["torch"] = RULES["square"](step, TorchScope(g), "exact")
t = Tape(g)
VJP_RULES["square"](step, "%g", t, [True])
out["vjp"] = [(s.op, s.operands, s.attributes) for s in g.steps]
print(json.dumps(out))
"""


def test_a_toy_elementwise_primitive_is_two_rows_in_two_files(tmp_path: Path) -> None:
    """docs/adding-a-primitive.md's measure, kept true: `square` added to a copy of the
    sources by its two rows (the third file, docs/graph-format.md, is prose) passes every
    table of test_coverage.py, and folds, runs and differentiates as x * x."""
    copy = tmp_path / "src" / "linnet"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path, (anchor, text) in EDITS.items():
        f = copy / path
        source = f.read_text()
        assert source.count(anchor) == 1, f"{path}: the toy's anchor {anchor!r} moved"
        f.write_text(source.replace(anchor, text + anchor))
    assert f"touched {len(EDITS) + 1} files" in " ".join(PAGE.read_text().split()), (
        "docs/adding-a-primitive.md states another count"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy.parent), str(TESTS)]))
    run = subprocess.run(
        [sys.executable, "-c", _TOY],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["from"].startswith(str(copy)), got["from"]
    assert got["problems"] == []
    assert got["fold"] == 2.25
    assert got["reference"] == got["interpreter"] == [9.0, 4.0]
    assert got["torch"] == ["r = torch.square(a)"]
    # d(x * x) = 2 x: a constant 2.0 of the result's dtype, times x, times the gradient.
    assert got["vjp"] == [
        ["constant", [], {"value": 2.0, "dtype": "f32"}],
        ["mul", ["%t.1", "%a"], {}],
        ["mul", ["%g", "%t.2"], {}],
    ]


# ---------------------------------------------------------------- silently unused rules
def test_a_rule_both_spelled_and_written_by_hand_is_an_error() -> None:
    with pytest.raises(
        ValueError,
        match=r"exp spelled in linnet\.lang\.ir\.elementwise and "
        "written by hand too",
    ):
        spelled("torch", lambda text, p: text, {"exp": "by hand"})


def test_an_unknown_column_is_an_error_not_an_empty_table() -> None:
    with pytest.raises(ValueError, match="no column 'tourch'"):
        spelled("tourch", lambda text, p: text)


@pytest.mark.parametrize("column,table", [("torch", emit_torch.RULES), ("jax", emit_jax.RULES)])
def test_each_spelling_is_the_rule_its_emitter_writes(column: str, table: dict) -> None:
    """The generated text of each spelled primitive is its row's spelling (a hand rule never
    shadows it)."""
    for name, row in SPELLINGS.items():
        text = getattr(row, column)
        if text is None:
            continue
        arity = PRIMITIVES[name].arity or 0
        operands = ["%a", "%b"][:arity]
        values = {o: ValueType((3,), "f32") for o in [*operands, "%r"]}
        scope = (TorchScope if column == "torch" else emit_jax.JaxScope)(
            Graph("run", "M", values=values)
        )
        lines = table[name](Step(name, operands, ["%r"]), scope, "exact")
        assert lines == [f"r = {text.format('a', 'b')}"], name


# ---------------------------------------------------------------- wrong gradients, crashes
@pytest.mark.parametrize(
    "text",
    [
        "x.real",
        "foo(x)",
        "exp(x, y)",
        "exp(x=1)",
        "x ** 2",
        "out[0]",
        "z * x",
        "",
        "lambda: x",
        "True * x",
    ],
)
def test_a_derivative_that_is_not_a_formula_is_an_error(text: str) -> None:
    with pytest.raises(
        ValueError,
        match="cannot build|invalid syntax|unexpected EOF|"
        r"\(<unknown>",
    ):
        formula(text)


@pytest.mark.parametrize("text", ["{2}", "Exp({0}) + 1", "{0}", "Mul({0}, out)", "Exp({0}"])
def test_a_composition_that_is_not_calls_of_operators_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        composed(text)


@pytest.mark.parametrize(
    "row,why",
    [
        (Spelling("take", torch="{0}"), "no elementwise primitive"),
        (Spelling("nope", torch="{0}"), "no elementwise primitive"),
        (Spelling("add", derivative=("1.0",)), "one derivative per operand"),
        (Spelling("lt", derivative=("0.0", "0.0")), "only if it is differentiable"),
        (Spelling("exp", derivative=("ln(x)",)), "cannot build"),
        (Spelling("lt", onnx="Not(GreaterOrEqual({0}, {1}))"), "gives bool"),
        (Spelling("exp", onnx="{0}"), "neither an operator's name"),
        (Spelling("exp", stablehlo="stablehlo.exponential({0}, k=1)"), "cannot build"),
    ],
)
def test_a_malformed_row_fails_when_the_table_is_built(
    monkeypatch: pytest.MonkeyPatch, row: Spelling, why: str
) -> None:
    monkeypatch.setattr(EL, "_ROWS", [row])
    with pytest.raises(ValueError, match=why):
        EL._check_rows()


def test_two_rows_for_one_primitive_are_an_error_not_the_last_one_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(EL, "_ROWS", [*EL._ROWS, Spelling("exp", torch="torch.expm1({0})")])
    with pytest.raises(ValueError, match="two rows for exp"):
        EL._check_rows()


def test_every_row_s_derivative_and_compositions_parse() -> None:
    for name, row in SPELLINGS.items():
        for d in row.derivative or ():
            assert formula(d)[0] in ("ref", "const", "neg", "call", "bin"), name
        for text in (row.onnx, row.stablehlo):
            if text is not None and "(" in text:
                assert composed(text) is not None, name
