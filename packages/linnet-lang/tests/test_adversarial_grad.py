"""Adversarial grad clauses and kernel backward passes in linnet-lang (issue 38, item 2;
issue 46, item 2): an integer gradient is a coded error at check and lowering time (it was
silently truncated); a clause of several results gets one placeholder per incoming gradient
(lowering crashed); the backward of every std kernel op of several results lowers (the
torch runtime's `.backward()` raised E0545 "returns 1 values but declares 3", then "cannot
determine `H`"), and E0545's advice names the real cause; the clause check's comparison
finds each wrong class and says so where it cannot compare."""

from __future__ import annotations

import numpy as np
import pytest
from linnet.lang import LinnetError, Program, check_text, lower
from linnet.lang.check.kernel_backward import no_backward_advice, op_info
from linnet.lang.check.kernel_cases import KernelCase, bound_ops, case_for, std_program
from linnet.lang.check.kernel_instances import record_kernels
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.emit.kernel_grad import Backwards
from linnet.lang.grad import lower_grad
from linnet.lang.grad.clause_check import (
    GradCase,
    clause_cases,
    clause_ops,
    compare_case,
    grad_case,
)

INTEGER = """
pub op f<N: Dim, T: DType>(x: Tensor[N; T]) -> Tensor[N; T] {
    let y[n] = x[n] * 3.0
    return y
} grad(dy) {
    let dx[n] = (dy[n] * 3.0) as %s
    return dx
}
model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> f32 {
        let y = f(x)
        let s = sum[i](y[i])
        return s
    }
}
"""


@pytest.mark.parametrize("whole", ["i32", "i64", "u8", "bool"])
def test_an_integer_gradient_is_an_error_when_checked_and_when_lowered(whole):
    with pytest.raises(LinnetError) as info:
        check_text(INTEGER % whole)
    assert info.value.diagnostics[0].code == "E0538"
    assert f"type {whole} for `x`" in info.value.diagnostics[0].message
    prog = Program.from_text(INTEGER % whole)
    with pytest.raises(LinnetError) as info:  # value_and_grad lowers with check=False
        lower_grad(prog, "run", {"x": [3]}, {"N": 3}, wrt=["x"], check=False)
    assert info.value.diagnostics[0].code == "E0538"


def test_a_float_gradient_of_another_width_is_not_an_integer_one():
    check_text((INTEGER % "f64").replace("(dy[n] * 3.0) as f64", "(dy[n] * 3.0) as f64"))


PAIR = """
pub op pair<N: Dim, M: Dim>(x: Tensor[N; f32], w: Tensor[M; f32]) -> (Tensor[N; f32], Tensor[M; f32]) {
    let y[n] = x[n] * 2.0
    let z[m] = w[m] * 3.0
    return y, z
} grad(dy, dz) {
    let dx[n] = dy[n] * 2.0
    let dw[m] = dz[m] * 3.0
    return dx, dw
}
model P { entry run(x: Tensor[3; f32], w: Tensor[%d; f32]) -> f32 {
    let (y, z) = pair(x, w)
    let s = sum[i](y[i]) + sum[j](z[j])
    return s } }
"""


@pytest.mark.parametrize("m", [3, 5])
def test_each_incoming_gradient_of_a_clause_is_its_own_placeholder(m):
    """The second `input` placeholder was shared with the first (the builder's common
    subexpressions): IndexError for any clause of several results."""
    templates: dict = {}
    lower(Program.from_text(PAIR % m), "run", {"x": [3], "w": [m]}, grad_clauses=templates)
    (template,) = templates.values()
    assert len(set(template.incoming)) == 2
    assert [template.values[r].shape for r in template.incoming] == [(3,), (m,)]
    g = lower_grad(Program.from_text(PAIR % m), "run", {"x": [3], "w": [m]}, wrt=["x", "w"])
    assert g.outputs[-2:] == ["%d_x", "%d_w"]


# ---------------------------------------------------------------- kernel backward passes
def _several_result_kernel_ops():
    program = std_program()
    return program, [op for op in bound_ops(program) if len(op.results) > 1]


def test_the_backward_of_every_std_kernel_op_of_several_results_lowers():
    """The body's backward entry returned `op(...)` (one value, the tuple) where the op has
    several results (E0441), and the fused QKV ops' `H`, `KV`, `G`, which only their results
    name on their own, could not be bound (E0603): E0545 at `.backward()`."""
    from linnet.lang.check.kernel_cases import wrapper_program

    program, ops = _several_result_kernel_ops()
    assert len(ops) >= 5
    for op in ops:
        gens = {g.name: ("f32" if g.kind == "DType" else 4) for g in op.generics}
        # HD % 32: the split kernels; NG = 3 groups of 4 inputs: the quantised kernels' groups
        # are powers of two.
        gens.update({"HD": 32, "D": 12, "N": 2, "S": 5, "NG": 3})
        case = case_for(
            program, op, {k: v for k, v in gens.items() if k in {g.name for g in op.generics}}
        )
        assert case is not None, op.name
        wrapper = wrapper_program(program, op, case)
        graph = lower(
            wrapper,
            "check",
            {n: list(s) for n, (s, _) in case.params.items()},
            {n: 1e-5 for n in case.scalars},
            model="LinnetKernelCheck",
            check=False,
        )
        (call,) = [c for c in graph.calls if c.callee == op.qualified_name]
        backwards = Backwards()
        backwards.backward(record_kernels(graph, wrapper), call, "key")
        assert "no_backward" not in backwards.functions[0], (op.name, backwards.functions[0])
        (bg,) = backwards.graphs
        assert len(bg.outputs) == len(op.results)


def test_e0545_advice_matches_its_cause():
    prog = check_text("""
pub op f<N: Dim, K: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
    let y[n] = x[n] * (K as f32)
    return y
} grad(dy) {
    let dx[n] = dy[n] * (K as f32)
    return dx
}
""")
    (op,) = clause_ops(prog)
    message, help = no_backward_advice(op_info(op), Diagnostic("E0603", "cannot determine `K`"))
    assert "its grad clause" in message and "cannot determine `K`" in message
    assert "name every generic of `f` on its own" in help and "numerics='exact'" in help
    _, help = no_backward_advice(
        op_info(op), Diagnostic("E0522", "gradient for `x` has shape [2]", help="")
    )
    assert help.startswith("fix `f`'s grad clause (gradient for `x` has shape [2])")
    _, help = no_backward_advice(
        op_info(op), Diagnostic("E0441", "returns 1 values but declares 3")
    )
    assert "limitation of Linnet" in help and "report it" in help
    assert "generic" not in help  # the old advice named generics whatever the cause


# ---------------------------------------------------------------- the comparison
SQUARE = """
pub op sq<N: Dim, T: DType>(x: Tensor[N; T], w: Tensor[N; T]) -> Tensor[N; T] {
    let y[n] = x[n] * x[n] * w[n]
    return y
} grad(dy) {
    let dx[n] = dy[n] * x[n] * w[n] * 2.0
    let dw[n] = dy[n] * x[n] * x[n]
    return dx, dw
}
"""


@pytest.fixture(scope="module")
def square() -> GradCase:
    prog = check_text(SQUARE)
    (op,) = clause_ops(prog)
    cases = clause_cases(prog, op, count=1, seed=0)
    return grad_case(prog, op, cases[0], 0)


def _gradients(gcase: GradCase) -> tuple[np.ndarray, np.ndarray]:
    x, w = (np.asarray(v, dtype=np.float64) for v in gcase.inputs)
    (dy,) = (np.asarray(v, dtype=np.float64) for v in gcase.cotangents)
    return dy * x * w * 2.0, dy * x * x


def test_the_comparison_names_each_wrong_class(square):
    dx, dw = _gradients(square)
    assert compare_case(square, [dx, dw], [dx, dw]).passed
    assert compare_case(square, [dx * (1 + 1e-12), dw], [dx, dw]).passed  # rounding
    cases = {
        "is 0.5 times the body's": [dx * 0.5, dw],
        "the body's gradient of `w` (swapped?)": [dw, dx],
        "opposite sign": [-dx, dw],
        "is all zeros": [np.zeros_like(dx), dw],
    }
    for said, clause in cases.items():
        f = compare_case(square, clause, [dx, dw]).finding
        assert f is not None and f.code == "E0537" and said in f.problem, (said, f)
        assert f.input == "x" and f.where.startswith("x[")
        k = int(f.where[2:-1])
        assert f.clause == pytest.approx(clause[0][k]) and f.body == pytest.approx(dx[k])


def test_non_finite_gradients(square):
    dx, dw = _gradients(square)
    nan_body = dx.copy()
    nan_body[0] = np.nan
    both = dx.copy()
    both[0] = np.nan
    assert compare_case(square, [both, dw], [nan_body, dw]).passed  # NaN where the body is
    stray = dx.copy()
    stray[-1] = np.nan
    f = compare_case(square, [stray, dw], [dx, dw]).finding
    assert f is not None and f.code == "E0537" and f.difference == np.inf
    f = compare_case(square, [dx, dw], [np.full_like(dx, np.nan), dw]).finding
    assert f is not None and f.code == "E0539" and "not finite" in f.problem


def test_a_body_that_passes_no_gradient_is_unchecked_not_a_pass(square):
    dx, dw = _gradients(square)
    f = compare_case(square, [dx, dw], [np.zeros_like(dx), dw]).finding
    assert f is not None and f.code == "E0539" and "passes no gradient to `x`" in f.problem
    assert "--skip" in f.diagnostic().help


def test_a_case_describes_itself_in_findings(square):
    assert isinstance(square.case, KernelCase)
    f = compare_case(
        square, [-_gradients(square)[0], _gradients(square)[1]], list(_gradients(square))
    ).finding
    assert f is not None and str(f).startswith("E0537 grad clause of main::sq on x: [")
    assert f.diagnostic().message.startswith("grad clause of main::sq")


# ---------------------------------------------------------------- linear grad clauses (issue 46)
# Generated JAX differentiates a kernel launch through the transpose of its op's clause, which
# only a clause linear in its incoming gradients has: jax.linear_transpose dropped the 7 of
# `dy * 0.0 + 7.0` without a word. linnet.lang.grad.linearity says which clauses are.
LINEAR = """
pub op f<N: Dim>(x: Tensor[N; f32], w: Tensor[N; f32], i: Tensor[N; i32]) -> Tensor[N; f32] {
    let y[n] = x[n] * w[n]
    return y
} grad(dy) {
    let dx[n] = %s
    let dw[n] = dy[n] * x[n]
    let di[n] = i[n] * 0
    return dx, dw, di
}
model M<N: Dim> {
    entry run(x: Tensor[N; f32], w: Tensor[N; f32], i: Tensor[N; i32]) -> Tensor[N; f32] {
        return f(x, w, i)
    }
}
"""


@pytest.mark.parametrize(
    "dx,why",
    [
        ("dy[n] * w[n]", None),
        ("dy[n]", None),  # a straight-through estimator
        ("select(x[n] > 0.0, dy[n] * w[n], 0.0)", None),  # a mask: zeros where it is off
        ("(sum[m] dy[m] * w[m]) * x[n] - dy[n] / (w[n] * w[n] + 1.0)", None),
        ("-(dy[n] as f32) * exp(w[n])", None),
        ("dy[n] * 0.0 + 7.0", "does not depend on the incoming gradients"),
        ("x[n] * 2.0", "does not depend on the incoming gradients"),
        ("dy[n] + x[n]", "adds a term that does not depend on the incoming gradients (`add` at"),
        ("dy[n] * dy[n]", "multiplies two values computed from the incoming gradients"),
        ("(sum[m] dy[m]) * dy[n]", "multiplies two values computed from the incoming gradients"),
        ("exp(dy[n])", "applies `exp` to a gradient"),
        ("max(dy[n], 0.0)", "applies `maximum` to a gradient"),
        ("w[n] / dy[n]", "divides by a value computed from the incoming gradients"),
        ("select(dy[n] > 0.0, dy[n], 0.0)", "applies `gt` to a gradient"),
        ("select(x[n] > 0.0, dy[n], 1.0)", "selects between a gradient and a value that does not"),
        ("bitcast<f32>(bitcast<i32>(dy[n]))", "applies `bitcast` to a gradient"),
        ("dy[n] * bitcast<f32>(bitcast<i32>(w[n]) + 1)", None),  # bits of no gradient: const
    ],
)
def test_a_clause_is_linear_in_its_incoming_gradients_or_says_why_not(dx, why):
    from linnet.lang.grad.linearity import nonlinear_gradients

    prog = check_text(LINEAR % dx)
    clauses: dict = {}
    lower(prog, "run", {"x": [4], "w": [4], "i": [4]}, grad_clauses=clauses)
    (t,) = clauses.values()
    # the integer parameter's gradient is not asked about (JAX passes it no tangent)
    found = nonlinear_gradients(t.steps, t.incoming, t.returned, [True, True, False])
    if why is None:
        assert found == []
    else:
        assert [i for i, _ in found] == [0] and why in found[0][1], found


# E0953 names one state in every run (issue 39): `_check_states` took the first state of a
# set of value names, so which of several states the message named followed the process's
# string hash seed. Three states written z, m, a (neither sorted nor reversed), all read back.
STATES_SCRIPT = """
from linnet.lang import LinnetError
from linnet.lang.grad.reverse import differentiate
from linnet.lang.ir.graph import Graph, Step, ValueType

F = "f64"
g = Graph("run", "M", inputs=["%x", "%i"], outputs=["%r"])
g.values = {"%x": ValueType((2, 3), F), "%i": ValueType((2,), "i64")}
sums = []
for k, name in enumerate(["z", "m", "a"]):
    g.steps.append(Step("scatter", ["@" + name, "%x", "%i"], [], {"indexed_axes": 1,
        "path": name}, f"m.linnet:{k + 1}:1"))
    g.states[name] = ValueType((4, 3), F)
for name in ["z", "m", "a"]:
    g.steps.append(Step("reduce", ["@" + name], ["%r_" + name], {"kind": "sum", "axes": [0],
        "accumulate": F, "identity": 0.0}))
    g.values["%r_" + name] = ValueType((3,), F)
g.steps.append(Step("add", ["%r_z", "%r_m"], ["%r_zm"]))
g.steps.append(Step("add", ["%r_zm", "%r_a"], ["%r"]))
g.values["%r_zm"] = g.values["%r"] = ValueType((3,), F)
try:
    differentiate(g, ["x"], "cotangents")
except LinnetError as err:
    print(err.diagnostics[0].code, err.diagnostics[0].message)
"""


def test_E0953_names_the_first_state_written_whatever_the_hash_seed():
    import os
    import subprocess
    import sys

    seen = set()
    for seed in ("0", "1", "2", "3", "4", "5"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", STATES_SCRIPT], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        seen.add(run.stdout.strip())
    (message,) = seen  # one message in every process
    assert message.startswith("E0953") and "the state `z` (at m.linnet:1:1)" in message, message
