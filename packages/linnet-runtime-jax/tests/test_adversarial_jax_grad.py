"""Adversarial grad clauses on JAX (issue 38, item 2): generated JAX uses an op's grad clause
as its Pallas kernel's backward under jax.grad (and `linnet jax --grad` lowers clauses into
the gradient graph), so a wrong clause is a wrong gradient here too. Each wrong clause class
is a coded finding of `linnet.jax.grad_checks` (the clause as generated JAX against jax.vjp
of the body), in f32 (JAX's default) and in f64 with x64 enabled; `load(...,
check_grads=True)` refuses a wrong clause."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest
from linnet.jax import load
from linnet.jax.grad_checks import check_grad_clauses
from linnet.lang import LinnetError, Program
from linnet.lang.cli import main

OP = """
pub op f<N: Dim, T: DType>(x: Tensor[N; T], w: Tensor[N; T]) -> Tensor[N; T] {
    let y[n] = x[n] * x[n] * w[n] * 1.5
    return y
} grad(dy) {
%s
}
"""
RIGHT = "    let dx[n] = dy[n] * x[n] * w[n] * 3.0\n    let dw[n] = dy[n] * x[n] * x[n] * 1.5\n"
WRONG = {
    "missing factor": (RIGHT.replace("* 3.0", ""), "is 0.333333 times the body's"),
    "swapped": (RIGHT, "is the body's gradient of `w` (swapped?)"),
    "sign": (
        RIGHT.replace("dy[n] * x[n] * w[n] * 3.0", "0.0 - dy[n] * x[n] * w[n] * 3.0"),
        "has the opposite sign of the body's",
    ),
    "zeros": (
        RIGHT.replace("dy[n] * x[n] * w[n] * 3.0", "dy[n] * 0.0"),
        "is all zeros, the body's is not",
    ),
}
# The kernel-bound op of test_jax_pallas.py whose clause (a constant 7) jax.grad uses.
PALLAS = """
pub kernel twice_k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid((N + B - 1) / B)
{
    let cols = program_id(0) * B + iota<i32>(B)
    store(y[cols], load(x[cols], cols < N) * 2.0, cols < N)
}

pub op twice<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel twice_k<N, 4> {
    let y[n] = x[n] * 2.0
    return y
} grad(dy) {
    let dx[n] = dy[n] * 0.0 + 7.0
    return dx
}

model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return twice(x) }
}
"""


def clause(kind: str) -> str:
    body, _ = WRONG.get(kind, (RIGHT, ""))
    return OP % (body + ("    return dw, dx" if kind == "swapped" else "    return dx, dw"))


@pytest.mark.parametrize("x64", [False, True])
def test_a_right_clause_passes(x64):
    checks = []
    with jax.enable_x64(x64):
        assert (
            check_grad_clauses(Program.from_text(clause("right")), count=3, on_check=checks.append)
            == []
        )
    assert {c.case.params["x"][1] for c in checks} == {"f64" if x64 else "f32"}
    assert max(c.difference for c in checks) < (1e-12 if x64 else 1e-4)


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("kind", sorted(WRONG))
def test_each_wrong_clause_class_is_found_on_jax(kind, x64):
    with jax.enable_x64(x64):
        findings = check_grad_clauses(Program.from_text(clause(kind)), count=2)
    assert len(findings) == 2
    f = findings[0]
    assert (f.code, f.op, f.input, f.via) == ("E0537", "main::f", "x", "JAX")
    assert WRONG[kind][1] in f.problem and f.where.startswith("x[")
    assert f.difference > f.tolerance


def test_an_integer_gradient_is_found_on_jax():
    src = OP % (
        "    let dx[n] = (dy[n] * x[n] * w[n] * 3.0) as i32\n"
        "    let dw[n] = dy[n] * x[n] * x[n] * 1.5\n    return dx, dw"
    )
    with pytest.raises(LinnetError) as info:
        check_grad_clauses(Program.from_text(src))
    assert info.value.diagnostics[0].code == "E0538"


def test_the_pallas_kernels_clause_is_found_and_load_refuses_it(tmp_path):
    path = tmp_path / "m.linnet"
    path.write_text(PALLAS)
    (f,) = check_grad_clauses(path, count=1)
    assert f.code == "E0537" and f.op == "m::twice" and "differs" in f.problem
    model = load(path)  # unchecked: loads, and jax.grad would use the clause
    assert model is not None
    with pytest.raises(LinnetError) as info:
        load(path, check_grads=True)
    assert info.value.diagnostics[0].code == "E0537"
    with pytest.raises(LinnetError) as info:
        load(path, check_grads="yes")
    assert info.value.diagnostics[0].code == "E0541"
    good = tmp_path / "good.linnet"
    good.write_text(PALLAS.replace("dy[n] * 0.0 + 7.0", "dy[n] * 2.0"))
    assert load(good, check_grads=True) is not None


def test_linnet_grads_runtime_jax(tmp_path, capsys):
    bad = tmp_path / "bad.linnet"
    bad.write_text(clause("sign"))
    assert main(["grads", "--runtime", "jax", str(bad), "--count", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  E0537 grad clause of bad::f (JAX)" in out and "opposite sign" in out
    good = tmp_path / "good.linnet"
    good.write_text(clause("right"))
    assert main(["grads", "--runtime", "jax", str(good), "--count", "1"]) == 0
    assert "ok    good::f" in capsys.readouterr().out


def test_a_case_in_f64_without_x64_is_unchecked_not_passed():
    src = """
pub op g<N: Dim>(x: Tensor[N; f64]) -> Tensor[N; f64] {
    let y[n] = x[n] * 2.0
    return y
} grad(dy) {
    let dx[n] = dy[n] * 2.0
    return dx
}
"""
    with jax.enable_x64(False):
        (f,) = check_grad_clauses(Program.from_text(src), count=1)
    assert f.code == "E0539" and "32 bits" in f.problem
    with jax.enable_x64(True):
        assert check_grad_clauses(Program.from_text(src), count=1) == []


MULTI = (
    Path(__file__).resolve().parents[2]
    / "linnet-runtime-torch"
    / "tests"
    / "kernels"
    / "multi_grads.linnet"
)


@pytest.mark.parametrize("entry", ["clause", "body"])
def test_jax_grad_through_a_pallas_kernel_of_several_results(monkeypatch, entry):
    """(issue 46, item 2, on JAX) The clause of an op of several results takes one incoming
    gradient per result: the custom_vjp passed their tuple as one argument (TypeError:
    `pair_grad() missing 1 required positional argument: 'dz'`)."""
    import jax.numpy as jnp
    from linnet.jax import load_source

    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")
    rng = np.random.default_rng(0)
    x, v = (jnp.asarray(rng.standard_normal(13), jnp.float32) for _ in range(2))
    grads, runs = [], {}
    for numerics in ("fast", "exact"):
        m = load_source(
            MULTI, entry, {"x": [13]}, weights={"v": np.zeros(13, np.float32)}, numerics=numerics
        )
        fn = getattr(m, entry)

        def loss(x, v, fn=fn):
            y, z = fn(x, {"v": v}, {})[0]
            return jnp.sum(y * jnp.linspace(-1, 1, 13)) + jnp.sum(z * 3.0)

        grads.append(jax.grad(loss, argnums=(0, 1))(x, v))
        runs = runs or getattr(m, "RUNS", {})
    assert list(runs.values()) == [[1, 0]]  # the fast pass launched the kernel
    for got, want in zip(*grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- autodiff through Pallas kernels
# (issue 46, item 4) A kernel launch is a jax.custom_jvp (emit/pallas.py's kernel_jvp): the
# kernel runs forward, the JVP of the op's body (or the transpose of its grad clause) is its
# tangent, and JAX transposes that for reverse mode. Forward mode used to fail ("can't apply
# forward-mode autodiff (jvp) to a custom_vjp function"), and grad(grad(...)) with a bare
# AssertionError inside Pallas. The ops: a kernel of one f32 result, one generic in T (run
# at f64), and one of two results; their kernels compute in f32, so the finite differences
# take eps 1e-3 and a tolerance of 1e-3 (the derivatives themselves are the bodies').
KERNEL_OPS = {
    "softmax": (
        "use std.nn.activation::{softmax}",
        "softmax(x)",
        {"x": ((3, 5), "f32")},
        ["Tensor[3, 5; f32]"],
    ),
    "rms_norm": (
        "use std.nn.norm::{rms_norm}",
        "rms_norm(x, w, 1e-5)",
        {"x": ((2, 6), "f64"), "w": ((6,), "f64")},
        ["Tensor[2, 6; f64]"],
    ),
    "residual_rms_norm": (
        "use std.nn.decode::{residual_rms_norm}",
        "residual_rms_norm(x, y, w, 1e-5)",
        {"x": ((2, 6), "f64"), "y": ((2, 6), "f64"), "w": ((6,), "f64")},
        ["Tensor[2, 6; f64]", "Tensor[2, 6; f64]"],
    ),
}


def kernel_op_module(tmp_path, name: str, numerics: str = "fast"):
    """The generated JAX module of a one-entry model calling std op ``name``, and its
    inputs (normal random, fixed seed)."""
    from linnet.jax import load_source

    use, call, ins, results = KERNEL_OPS[name]
    params = ", ".join(f"{n}: Tensor[{', '.join(map(str, s))}; {d}]" for n, (s, d) in ins.items())
    result = results[0] if len(results) == 1 else f"({', '.join(results)})"
    body = f"return {call}" if len(results) == 1 else f"let (a, b) = {call}\n        return a, b"
    path = tmp_path / f"{name}.linnet"
    path.write_text(
        f"{use}\nmodel M {{\n    entry run({params}) -> {result} {{\n        {body}\n    }}\n}}\n"
    )
    m = load_source(path, "run", {n: list(s) for n, (s, _) in ins.items()}, numerics=numerics)
    rng = np.random.default_rng(7)
    xs = [
        jax.numpy.asarray(rng.standard_normal(s), d.replace("f", "float")) for s, d in ins.values()
    ]
    return m, xs


CI = bool(os.environ.get("CI"))


# In CI a kernel of each form (one result; two results, generic in T at f64); rms_norm's
# derivatives are checked against its body's below.
@pytest.mark.parametrize("name", ["residual_rms_norm", "softmax"] if CI else sorted(KERNEL_OPS))
def test_check_grads_forward_and_reverse_to_order_two_through_a_pallas_kernel(
    tmp_path, monkeypatch, name
):
    from jax.test_util import check_grads

    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")
    with jax.enable_x64(True):
        m, xs = kernel_op_module(tmp_path, name)
        f = jax.jit(lambda *xs: m.run(*xs, {}, {})[0])
        check_grads(f, xs, order=2, modes=["fwd", "rev"], eps=1e-3, atol=1e-3, rtol=1e-3)
    ((launched, body),) = m.RUNS.values()
    assert launched >= 1 and body == 0  # every trace launched the kernel


def test_hessian_and_grad_of_grad_through_a_kernel_equal_the_bodys(tmp_path, monkeypatch):
    """jax.hessian (forward over reverse), grad(grad(...)) and jacfwd through the launch
    equal them through the op's body (numerics "exact": no kernel)."""
    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")
    with jax.enable_x64(True):

        def derivatives(m, x, w):
            c = jax.numpy.linspace(-1.0, 2.0, x.size).reshape(x.shape)

            def loss(x, w):
                return jax.numpy.sum(m.run(x, w, {}, {})[0][0] * c)

            return [
                jax.hessian(loss)(x, w),
                jax.grad(lambda x: jax.numpy.sum(jax.grad(loss)(x, w) ** 2))(x),
                jax.jacfwd(lambda w: m.run(x, w, {}, {})[0][0])(w),
            ]

        got, modules = [], []
        for numerics in ("fast", "exact"):
            m, (x, w) = kernel_op_module(tmp_path, "rms_norm", numerics)
            got.append(derivatives(m, x, w))
            modules.append(m)
    fast, exact = modules
    assert all(n >= 3 and body == 0 for n, body in fast.RUNS.values())  # launched each time
    assert not hasattr(exact, "RUNS")  # numerics exact: the body alone
    for a, b in zip(*got):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)


# A grad clause is the launch's derivative in both modes: its transpose is the tangent, and
# reverse mode transposes it back to the clause. `dy * 7.0` (the body says 2) shows it used.
SEVEN = PALLAS.replace("dy[n] * 0.0 + 7.0", "dy[n] * 7.0")


def test_a_linear_clause_is_the_launchs_derivative_forward_and_reverse(tmp_path, monkeypatch):
    from linnet.jax import load_source

    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")
    path = tmp_path / "m.linnet"
    path.write_text(SEVEN)
    m = load_source(path, "run", {"x": [10]}, numerics="fast")
    x, t = (jax.numpy.linspace(-1.0, 1.0, 10) + s for s in (0.0, 0.5))

    def f(x):
        return m.run(x, {}, {})[0][0]

    y, tangent = jax.jvp(f, (x,), (t,))
    np.testing.assert_allclose(np.asarray(y), 2 * np.asarray(x), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(tangent), 7 * np.asarray(t), rtol=1e-6)
    g = jax.grad(lambda x: jax.numpy.sum(f(x) * t))(x)
    np.testing.assert_allclose(np.asarray(g), 7 * np.asarray(t), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(f)(x)), 7 * np.eye(10))
    # The clause does not depend on x: its second derivative is zero.
    np.testing.assert_array_equal(
        np.asarray(jax.hessian(lambda x: jax.numpy.sum(f(x)))(x)), np.zeros((10, 10))
    )
    assert m.RUNS["twice_k_10_4"][0] >= 4 and m.RUNS["twice_k_10_4"][1] == 0


@pytest.mark.parametrize(
    "clause,why",
    [
        ("dy[n] * 0.0 + 7.0", "does not depend on the incoming gradients"),
        ("dy[n] * dy[n] * x[n]", "multiplies two values computed from the incoming gradients"),
        ("exp(dy[n])", "applies `exp` to a gradient"),
        ("dy[n] + x[n]", "adds a term that does not depend on the incoming gradients"),
    ],
)
def test_a_clause_that_is_not_linear_is_a_coded_error_when_differentiated(
    tmp_path, monkeypatch, clause, why
):
    """JAX's linear_transpose drops a constant term without a word (`dy * 0 + 7` gave zeros,
    not the clause's 7) and fails with a bare AssertionError on `dy * dy`: such a clause is
    E0561 where the launch is differentiated, in either mode; the forward pass runs."""
    from linnet.jax import load_source

    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")
    path = tmp_path / "m.linnet"
    path.write_text(PALLAS.replace("dy[n] * 0.0 + 7.0", clause))
    m = load_source(path, "run", {"x": [10]}, numerics="fast")
    x = jax.numpy.linspace(-1.0, 1.0, 10)

    def f(x):
        return m.run(x, {}, {})[0][0]

    np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), 2 * np.asarray(x), rtol=1e-6)
    for differentiate in (
        lambda: jax.grad(lambda x: jax.numpy.sum(f(x)))(x),
        lambda: jax.jvp(f, (x,), (x,)),
    ):
        with pytest.raises(LinnetError) as info:
            differentiate()
        d = info.value.diagnostics[0]
        assert d.code == "E0561" and "m::twice" in d.message and why in d.message
        assert "the gradient of `x`" in d.message and "numerics='exact'" in d.help
    # numerics exact: the body, which JAX differentiates
    exact = load_source(path, "run", {"x": [10]}, numerics="exact")
    g = jax.grad(lambda x: jax.numpy.sum(exact.run(x, {}, {})[0][0]))(x)
    np.testing.assert_allclose(np.asarray(g), np.full(10, 2.0))
