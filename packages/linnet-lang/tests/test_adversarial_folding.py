"""The adversarial suite, edge values (issue 38 item 5): what the compiler makes of NaN,
infinities, values past an integer type and zero divisors in constants, and that an integer
division by a constant zero is a coded error (docs/language.md, "Edge values";
linnet.lang.ir.edges).

Before the fix: ``nan as i32`` and ``inf as i32`` in a constant were a Python traceback
(ValueError, OverflowError), ``3e9 as i32`` folded to 3000000000 (an i32 that no runtime can
hold) and ``300 as i8`` to 300, ``max(1.0, nan)`` folded to 1.0 while ``max(nan, 1.0)`` gave
NaN, ``floor(nan)`` was E0350, and ``ids[i] / 0`` compiled (then raised ZeroDivisionError in
two runtimes and gave numbers in the others). The runtimes' side is
linnet-runtime-torch's tests/test_adversarial_edges.py and the conformance table.
"""

from __future__ import annotations

import math

import pytest
from linnet.lang import LinnetError, Program, check_program, lower
from linnet.lang.ir import edges as E


def _constants(body: str, out: str = "f32") -> list:
    """The constants of an entry whose body is ``body`` (ids: Tensor[N; i32])."""
    src = f"model M<N: Dim> {{ entry run(ids: Tensor[N; i32]) -> Tensor[N; {out}] {{\n{body}\n}} }}"
    prog = Program.from_text(src)
    errors = check_program(prog)
    if errors:
        raise LinnetError(errors)
    g = lower(prog, "run", {"ids": [3]}, {"N": 3})
    return [s.attributes["value"] for s in g.steps if s.op == "constant"]


@pytest.mark.parametrize(
    "literal,want",
    [
        ("nan", 0),
        ("inf", 2147483647),
        ("(-inf)", -2147483648),
        ("3e9", 2147483647),
        ("(-2.7)", -2),
        ("2.7", 2),
    ],
)
def test_a_float_constant_converts_to_an_integer_by_the_runtimes_rule(literal, want):
    # nan and inf were a Python traceback; 3e9 an i32 of 3000000000.
    got = _constants(f"let k = {literal} as i32\nlet y[i] = ids[i] + k\nreturn y", "i32")
    assert want in got


@pytest.mark.parametrize(
    "literal,dtype,want", [("300", "i8", 44), ("-1", "u8", 255), ("2.0e9 * 2.0", "u8", 255)]
)
def test_an_integer_constant_wraps_into_a_narrower_type(literal, dtype, want):
    got = _constants(
        f"let k = ({literal}) as {dtype}\nlet y[i] = ids[i] + (k as i32)\nreturn y", "i32"
    )
    assert want in got


@pytest.mark.parametrize(
    "expr", ["max(nan, 1.0)", "max(1.0, nan)", "min(nan, 1.0)", "min(1.0, nan)", "floor(nan)"]
)
def test_nan_propagates_through_folded_max_min_and_floor(expr):
    # max(1.0, nan) folded to 1.0 (Python's max keeps its first argument); floor(nan) was E0350
    got = _constants(f"let k = {expr}\nlet y[i] = (ids[i] as f32) + k\nreturn y")
    assert any(isinstance(v, float) and math.isnan(v) for v in got), got


def test_floor_of_tiny_negatives_folds_to_minus_one():
    got = _constants(
        "let k = floor(-1e-45) + floor(-0.0)\nlet y[i] = (ids[i] as f32) + k\nreturn y"
    )
    assert -1.0 in got


@pytest.mark.parametrize("op", ["/", "%"])
@pytest.mark.parametrize("divisor", ["0", "(2 - 2)"])
def test_an_integer_division_by_a_constant_zero_is_E0350(op, divisor):
    with pytest.raises(LinnetError) as err:
        _constants(f"let y[i] = ids[i] {op} {divisor}\nreturn y", "i32")
    d = err.value.diagnostics[0]
    assert d.code == "E0350" and "constant zero" in d.message and d.span is not None
    assert "edge values" in d.help


def test_a_float_division_by_zero_is_ieee_not_an_error():
    # Only integer division by a constant zero is refused: x / 0.0 is inf, as everywhere.
    _constants("let y[i] = (ids[i] as f32) / 0.0\nreturn y")


def test_the_rules_keep_the_division_identity():
    for a in (7, -7, 0, 5, -(2**31)):
        for b in (0, 2, -2, -1, 3):
            assert E.int_div(a, b) * b + E.int_rem(a, b) == a, (a, b)
    assert E.int_div(-(2**31), -1, "i32") == -(2**31)
    assert E.float_to_int(float("nan"), "u8") == 0 and E.float_to_int(256.0, "u8") == 255
