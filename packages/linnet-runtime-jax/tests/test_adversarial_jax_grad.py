"""Adversarial grad clauses on JAX (issue 38, item 2): generated JAX uses an op's grad clause
as its Pallas kernel's backward under jax.grad (and `linnet jax --grad` lowers clauses into
the gradient graph), so a wrong clause is a wrong gradient here too. Each wrong clause class
is a coded finding of `linnet.jax.grad_checks` (the clause as generated JAX against jax.vjp
of the body), in f32 (JAX's default) and in f64 with x64 enabled; `load(...,
check_grads=True)` refuses a wrong clause."""

from __future__ import annotations

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
    "sign": (RIGHT.replace("dy[n] * x[n] * w[n] * 3.0", "0.0 - dy[n] * x[n] * w[n] * 3.0"),
             "has the opposite sign of the body's"),
    "zeros": (RIGHT.replace("dy[n] * x[n] * w[n] * 3.0", "dy[n] * 0.0"),
              "is all zeros, the body's is not"),
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
        assert check_grad_clauses(Program.from_text(clause("right")), count=3,
                                  on_check=checks.append) == []
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
    src = OP % ("    let dx[n] = (dy[n] * x[n] * w[n] * 3.0) as i32\n"
                "    let dw[n] = dy[n] * x[n] * x[n] * 1.5\n    return dx, dw")
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


MULTI = (Path(__file__).resolve().parents[2] / "linnet-runtime-torch" / "tests" / "kernels"
         / "multi_grads.linnet")


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
        m = load_source(MULTI, entry, {"x": [13]}, weights={"v": np.zeros(13, np.float32)},
                        numerics=numerics)
        fn = getattr(m, entry)

        def loss(x, v, fn=fn):
            y, z = fn(x, {"v": v}, {})[0]
            return jnp.sum(y * jnp.linspace(-1, 1, 13)) + jnp.sum(z * 3.0)

        grads.append(jax.grad(loss, argnums=(0, 1))(x, v))
        runs = runs or getattr(m, "RUNS", {})
    assert list(runs.values()) == [[1, 0]]  # the fast pass launched the kernel
    for got, want in zip(*grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
