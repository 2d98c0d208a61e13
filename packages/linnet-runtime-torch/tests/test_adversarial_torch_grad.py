"""Adversarial gradients (issue 38, item 2; issue 46, item 2).

* Grad clauses are no longer trusted: each wrong clause class (a missing factor, swapped
  gradients, a sign error, zeros, an integer gradient) is a coded finding of `linnet grads`,
  of ``check_grad_clauses`` and of ``load(..., check_grads=True)``, naming the op, the input,
  the largest difference and where; a clause that cannot be checked says so (E0539); every
  std op's clause agrees with its body.
* Backward through kernel ops of several results (``load(grad=True, numerics="fast")``) runs,
  equal to the body's gradient, where it raised E0545 "returns 1 values but declares 3"; a
  grad clause of several results is lowered with one placeholder per incoming gradient.

Kernel launches run in a subprocess under TRITON_INTERPRET=1 (Triton's interpreter must be
chosen before Triton is first imported), as test_autograd.py's do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from linnet.lang import LinnetError, Program
from linnet.lang.check.kernel_cases import std_program
from linnet.lang.cli import main
from linnet.lang.grad import lower_grad
from linnet.lang.grad.clause_check import GRAD_TOLERANCES, clause_ops
from linnet.torch import load, run_graph
from linnet.torch.grad_checks import assert_grad_clauses, check_grad_clauses

ROOT = Path(__file__).resolve().parents[3]
CI = bool(os.environ.get("CI"))
KERNELS = Path(__file__).parent / "kernels"

# `f(x, w) = 1.5 * x * x * w`: its gradients are 3 * x * w and 1.5 * x * x.
OP = """
pub op f<N: Dim, T: DType>(x: Tensor[N; T], w: Tensor[N; T]) -> Tensor[N; T] {
    let y[n] = x[n] * x[n] * w[n] * 1.5
    return y
} grad(dy) {
%s
}
"""
RIGHT = "    let dx[n] = dy[n] * x[n] * w[n] * 3.0\n    let dw[n] = dy[n] * x[n] * x[n] * 1.5\n"
# The five wrong clause classes of issue 38 item 2, and what each finding says.
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
MODEL = """
model M<N: Dim> {
    param w: Tensor[N; f32]
    entry loss(x: Tensor[N; f32]) -> f32 {
        let y = f(x, self.w)
        let s = sum[i](y[i])
        return s
    }
}
"""


def clause(kind: str) -> str:
    body, _ = WRONG.get(kind, (RIGHT, ""))
    ret = "    return dw, dx" if kind == "swapped" else "    return dx, dw"
    return OP % (body + ret)


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


def test_a_right_clause_passes_on_cases_of_sizes_that_are_not_nice():
    checks = []
    assert (
        check_grad_clauses(Program.from_text(clause("right")), count=4, on_check=checks.append)
        == []
    )
    assert len(checks) == 4 and all(c.passed for c in checks)
    # f64 by default, and sizes that are no power of two among them
    assert {c.case.params["x"][1] for c in checks} == {"f64"}
    assert any(c.case.params["x"][0][0] not in (1, 2, 4, 8, 16) for c in checks)
    assert max(c.difference for c in checks) < 1e-12


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_each_wrong_clause_class_is_a_coded_finding(kind):
    findings = check_grad_clauses(Program.from_text(clause(kind)), count=3)
    assert len(findings) == 3, findings  # every case finds it
    f = findings[0]
    assert f.code == "E0537" and f.op == "main::f" and f.input == "x"
    assert WRONG[kind][1] in f.problem, f.problem
    assert f.where.startswith("x[") and f.difference > f.tolerance > 0
    assert abs(f.clause - f.body) == pytest.approx(f.difference)
    text = str(f)
    assert "largest difference" in text and f.where in text and "(clause " in text
    diag = f.diagnostic()
    assert diag.code == "E0537" and "`x`" in diag.help


def test_an_integer_gradient_is_a_coded_error_not_a_truncated_gradient():
    """`as i32` on a gradient used to be converted back to f32 by the reverse pass,
    silently dropping every fraction."""
    src = OP % (
        "    let dx[n] = (dy[n] * x[n] * w[n] * 3.0) as i32\n"
        "    let dw[n] = dy[n] * x[n] * x[n] * 1.5\n    return dx, dw"
    )
    with pytest.raises(LinnetError) as info:
        check_grad_clauses(Program.from_text(src))
    assert code_of(info) == "E0538" and "`x`" in str(info.value)
    # ...and lowering for --grad / value_and_grad refuses it too (no checker involved)
    prog = Program.from_text(src + MODEL)
    with pytest.raises(LinnetError) as info:
        lower_grad(prog, "loss", {"x": [3]}, {"N": 3}, wrt=["x"], check=False)
    assert code_of(info) == "E0538"


def test_the_issues_case_one_two_for_three_six(tmp_path):
    """The issue's case: the clause gives [1, 2] where the true gradient is [3, 6];
    value_and_grad used it silently; load(check_grads=True) refuses it."""
    path = tmp_path / "m.linnet"
    path.write_text(clause("missing factor") + MODEL)
    w = {"w": torch.ones(2)}
    model = load(path, weights=w)
    _, grads = model.value_and_grad("loss", [torch.tensor([1.0, 2.0])], wrt=["x"])
    assert grads["x"].tolist() == [1.0, 2.0]  # the clause's, as documented (unchecked load)
    with pytest.raises(LinnetError) as info:
        load(path, weights=w, check_grads=True)
    assert code_of(info) == "E0537"
    assert "0.333333 times the body's" in str(info.value)
    good = tmp_path / "good.linnet"
    good.write_text(clause("right") + MODEL)
    _, grads = load(good, weights=w, check_grads=True).value_and_grad(
        "loss", [torch.tensor([1.0, 2.0])], wrt=["x"]
    )
    assert grads["x"].tolist() == [3.0, 6.0]


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_check_grads_must_be_a_bool(tmp_path, bad):
    path = tmp_path / "m.linnet"
    path.write_text(clause("right") + MODEL)
    with pytest.raises(LinnetError) as info:
        load(path, weights={"w": torch.ones(2)}, check_grads=bad)
    assert code_of(info) == "E0541"


def test_the_kernel_tests_deliberately_skewed_clause_is_found():
    """tests/kernels/grads.linnet's `skewed` says 3 where its body says 2; `scaled` agrees."""
    findings = check_grad_clauses(KERNELS / "grads.linnet", count=2)
    assert {f.op for f in findings} == {"grads::skewed"}
    assert all("is 1.5 times the body's" in f.problem for f in findings)
    with pytest.raises(LinnetError) as info:  # the pytest form: one diagnostic a finding
        assert_grad_clauses(KERNELS / "grads.linnet", count=2)
    assert [d.code for d in info.value.diagnostics] == ["E0537", "E0537"]
    assert_grad_clauses(KERNELS / "grads.linnet", count=2, skip={"grads::skewed"})


def test_a_clause_that_cannot_be_checked_says_so():
    src = """
pub op round_ste<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
    let y[n] = floor(x[n] + 0.5)
    return y
} grad(dy) {
    return dy
}
pub op big<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] where N > 1000 {
    let y[n] = x[n] * 2.0
    return y
} grad(dy) {
    let dx[n] = dy[n] * 2.0
    return dx
}
block B<N: Dim> {
    param w: Tensor[N; f32]
    fn scaled(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * self.w[n]
        return y
    } grad(dy) {
        let dx[n] = dy[n] * 2.0
        return dx
    }
}
"""
    findings = check_grad_clauses(Program.from_text(src), count=1)
    by_op = {f.op: f for f in findings}
    assert set(by_op) == {"main::round_ste", "main::big", "main::B.scaled"}
    assert all(f.code == "E0539" for f in findings)
    assert "passes no gradient to `x`" in by_op["main::round_ste"].problem
    assert "--skip" in by_op["main::round_ste"].diagnostic().help
    assert "no shapes" in by_op["main::big"].problem
    assert "method of a block" in by_op["main::B.scaled"].problem
    # --skip leaves it out, and then nothing is found
    assert (
        check_grad_clauses(
            Program.from_text(src), count=1, skip={"main::round_ste", "main::big", "main::B.scaled"}
        )
        == []
    )


def test_load_warns_of_a_clause_it_cannot_check_and_loads(tmp_path):
    """A straight-through estimator's body passes no gradient: `load(check_grads=True)` says
    it could not check the clause (E0539, a warning) rather than refusing the model."""
    path = tmp_path / "ste.linnet"
    path.write_text("""
pub op round_ste<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
    let y[n] = floor(x[n] + 0.5)
    return y
} grad(dy) {
    return dy
}
model M<N: Dim> {
    param w: Tensor[N; f32]
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return round_ste(x) * self.w }
}
""")
    with pytest.warns(UserWarning, match="not checked: E0539.*round_ste"):
        model = load(path, weights={"w": torch.ones(3)}, check_grads=True)
    assert model.run("run", [torch.tensor([0.4, 0.6, 1.5])]).tolist() == [0.0, 1.0, 2.0]


def test_op_names_that_match_no_clause_are_an_error():
    with pytest.raises(LinnetError) as info:
        check_grad_clauses(Program.from_text(clause("right")), ops=["g"])
    assert code_of(info) == "E0540" and "main::f" in str(info.value)


def test_every_std_grad_clause_agrees_with_its_body():
    """Every op of the std library with a grad clause, on random cases in f64 (the CI
    check `linnet grads --std` runs): no finding, and no clause op left unchecked."""
    program = std_program()
    ops = {op.qualified_name for op in clause_ops(program)}
    checks = []
    findings = check_grad_clauses(program, count=2, on_check=checks.append)
    assert findings == []
    assert {c.case.op for c in checks} == ops


def test_linnet_grads_cli(tmp_path, capsys):
    good, bad = tmp_path / "good.linnet", tmp_path / "bad.linnet"
    good.write_text(clause("right"))
    bad.write_text(clause("sign"))
    assert main(["grads", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.count("ok    good::f") == 3 and "every grad clause agrees" in out
    assert main(["grads", str(good), str(bad), "--count", "2", "--seed", "3"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL  E0537 grad clause of bad::f") == 2 and "opposite sign" in out
    assert "2 finding(s) in 1 op(s)" in out
    assert main(["grads", str(bad), "--skip", "f"]) == 0
    assert "skip  bad::f (--skip)" in capsys.readouterr().out
    assert main(["grads", str(good), "--op", "nope"]) == 1
    assert "E0540" in capsys.readouterr().err
    assert main(["grads", str(tmp_path / "missing.linnet")]) == 1
    assert "E0767" in capsys.readouterr().err
    assert main(["grads", "--std"]) == 0
    assert main(["grads"]) == 2
    assert main(["grads", str(good), "--count", "0"]) == 2


def test_the_tolerance_table_is_documented():
    doc = (ROOT / "docs" / "grad.md").read_text()
    for dtype, (rtol, atol) in GRAD_TOLERANCES.items():
        assert f"| {dtype} | {rtol:g} | {atol:g} |" in doc


# ---------------------------------------------------------------- grad clauses of several results
PAIR = """
pub op pair<N: Dim>(x: Tensor[N; f32], w: Tensor[N; f32]) -> (Tensor[N; f32], Tensor[N; f32]) {
    let y[n] = x[n] * w[n] * 2.0
    let z[n] = x[n] - w[n]
    return y, z
} grad(dy, dz) {
    let dx[n] = dy[n] * w[n] * 2.0 + dz[n]
    let dw[n] = dy[n] * x[n] * 2.0 - dz[n]
    return dx, dw
}
model M { entry run(x: Tensor[3; f32], w: Tensor[3; f32]) -> f32 {
    let (y, z) = pair(x, w)
    let s = sum[i](y[i] + 10.0 * z[i])
    return s } }
"""


def test_a_clause_of_several_results_gets_each_incoming_gradient():
    """Its two incoming gradients were one placeholder (the second `input` step was shared
    with the first): lowering crashed with IndexError."""
    g = lower_grad(Program.from_text(PAIR), "run", {"x": [3], "w": [3]}, wrt=["x", "w"])
    x, w = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -1.0, 4.0])
    _, dx, dw = run_graph(g, [x, w], {}, {})
    torch.testing.assert_close(dx, 2 * w + 10)
    torch.testing.assert_close(dw, 2 * x - 10)
    assert check_grad_clauses(Program.from_text(PAIR), count=3) == []


# ---------------------------------------------------------------- kernels of several results
# (issue 46, item 2) Each std op bound to a kernel of several results, at small shapes its
# kernel takes (not multiples of the tiles); the kernel ops of tests/kernels/multi_grads.linnet.
STD_MULTI = {
    "residual_rms_norm": {"N": 3, "D": 12, "T": "f32"},
    "rms_norm_qkv": {"N": 2, "D": 12, "Q": 10, "K": 6, "T": "f32"},
    "rms_norm_qkv_split": {"N": 2, "D": 12, "Q": 10, "K": 6, "T": "f32"},
    # Quantised weights (std.nn.quant): groups of 4 (NG = 3), int8 levels and int4 bytes.
    "rms_norm_qkv_q8": {"N": 2, "D": 12, "Q": 10, "K": 6, "NG": 3, "T": "f32"},
    "rms_norm_qkv_q4": {"N": 2, "D": 12, "Q": 10, "K": 6, "NG": 3, "T": "f32"},
    "rms_norm_qkv_rope_q8": {"N": 2, "D": 12, "H": 3, "KV": 1, "HD": 8, "NG": 3, "T": "f32"},
    "rms_norm_qkv_rope_q8_heads": {"N": 2, "D": 12, "H": 4, "KV": 2, "HD": 8, "NG": 3, "T": "f32"},
    "rms_norm_qkv_rope_q4_heads": {"N": 2, "D": 12, "H": 4, "KV": 2, "HD": 8, "NG": 3, "T": "f32"},
    "rms_norm_qkv_rope_q4": {"N": 2, "D": 12, "H": 3, "KV": 1, "HD": 8, "NG": 3, "T": "f32"},
    "rms_norm_qkv_rope": {"N": 2, "D": 12, "H": 3, "KV": 1, "HD": 8, "T": "f32"},
    "rms_norm_qkv_rope_split": {"N": 2, "D": 12, "H": 3, "KV": 1, "HD": 32, "T": "f32"},
    "rms_norm_qkv_rope_split_wide": {"N": 2, "D": 12, "H": 3, "KV": 1, "HD": 16, "T": "f32"},
    "rms_norm_qkv_rope_attention": {"N": 2, "D": 12, "KV": 1, "G": 3, "HD": 6, "S": 5, "T": "f32"},
    "rms_norm_qkv_rope_attention_wide": {
        "N": 2,
        "D": 12,
        "KV": 1,
        "G": 3,
        "HD": 6,
        "S": 5,
        "T": "f32",
    },
}

# The module of each op of STD_MULTI outside std.nn.decode.
MODULE = {
    "rms_norm_qkv_q8": "std.nn.quant",
    "rms_norm_qkv_q4": "std.nn.quant",
    "rms_norm_qkv_rope_q8": "std.nn.quant",
    "rms_norm_qkv_rope_q8_heads": "std.nn.quant",
    "rms_norm_qkv_rope_q4_heads": "std.nn.quant",
    "rms_norm_qkv_rope_q4": "std.nn.quant",
}

DRIVER = r"""
import json, sys
import torch
from linnet.torch import load
from linnet.torch.kernels import op_case

cases, multi = json.loads(sys.argv[1]), sys.argv[2]
out = {}

def both(path, entry, xs0, weights=None):
    res = {}
    for numerics in ("fast", "exact"):
        m = load(path, weights=weights or {}, numerics=numerics, grad=True)
        xs = [x.clone().requires_grad_(x.is_floating_point()) for x in xs0]
        outs = m.run(entry, xs)
        loss = sum((o * torch.linspace(-1, 1, o.numel()).reshape(o.shape)).sum() for o in outs)
        loss.backward()
        grads = [x.grad for x in xs] + [p.grad for p in m.params.values()]
        runs = getattr(m.module(entry, xs), "RUNS", {})
        res[numerics] = ([o.detach() for o in outs], grads, runs)
    (fo, fg, runs), (eo, eg, _) = res["fast"], res["exact"]
    scale = max(float(g.abs().max()) for g in eg if g is not None)
    return {"launched": sum(r[0] for r in runs.values()),
            # relative to the outputs' scale where it passes 1 (int8 weights times f16 scales)
            "outputs": max(float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
                           for a, b in zip(fo, eo)),
            "grads": [None if b is None else float((a - b).abs().max()) / scale
                      for a, b in zip(fg, eg)],
            "nonzero": all(g is None or bool(g.abs().sum() > 0) for g in eg)}

for name, (qualified, generics) in cases.items():
    c = op_case(qualified, generics)
    path = f"{sys.argv[3]}/{name}.linnet"
    open(path, "w").write(c.text)
    out[name] = both(path, "run", c.random_inputs(seed=1))
w = {"v": torch.randn(13, generator=torch.Generator().manual_seed(3))}
x = torch.randn(13, generator=torch.Generator().manual_seed(4))
for entry in ("clause", "body"):
    out["pairs." + entry] = both(multi, entry, [x], w)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def multi_result_grads(tmp_path_factory) -> dict:
    if importlib.util.find_spec("triton") is None:  # found, not imported (see above)
        pytest.skip("needs Triton")
    where = tmp_path_factory.mktemp("multi")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            json.dumps(
                {k: [f"{MODULE.get(k, 'std.nn.decode')}::{k}", STD_MULTI[k]] for k in CHECKED}
            ),
            str(KERNELS / "multi_grads.linnet"),
            str(where),
        ],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_std_kernel_op_of_several_results_is_in_the_table():
    from linnet.lang.check.kernel_cases import bound_ops, case_for

    program = std_program()
    several = {op.name: op for op in bound_ops(program) if len(op.results) > 1}
    assert set(several) == set(STD_MULTI)
    for name, generics in STD_MULTI.items():
        assert case_for(program, several[name], generics) is not None, name  # it launches


# In CI one of each form (and the kernel ops of multi_grads.linnet): one kernel of two
# results, a two-kernel chain of three, a three-kernel chain with integer inputs and caches;
# every one elsewhere. (test_adversarial_grad.py of linnet-lang lowers every one's backward.)
CHECKED = (
    ["residual_rms_norm", "rms_norm_qkv_split", "rms_norm_qkv_rope_attention"]
    if CI
    else sorted(STD_MULTI)
)


@pytest.mark.parametrize("name", [*CHECKED, "pairs.clause", "pairs.body"])
def test_backward_through_a_kernel_of_several_results_equals_the_bodys(multi_result_grads, name):
    r = multi_result_grads[name]
    assert r["launched"] == 1  # the kernel ran forward (not the body)
    assert r["outputs"] < 1e-4
    assert r["nonzero"]
    assert all(d is None or d < 1e-5 for d in r["grads"]), r["grads"]


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"count": 0}, "E0542"),
        ({"count": "3"}, "E0542"),
        ({"count": True}, "E0542"),
        ({"max_size": -1}, "E0542"),
        ({"dtypes": ("i32",)}, "E0542"),
        ({"dtypes": ()}, "E0542"),
        ({"ops": [3]}, "E0542"),
        ({"ops": "nope"}, "E0540"),
    ],
)
def test_bad_options_are_coded(options, code):
    """A count of 0 used to read as "no shapes satisfy the where clauses", a string of ops
    as one op a character, integer dtypes as "no floating-point parameter"."""
    with pytest.raises(LinnetError) as info:
        check_grad_clauses(Program.from_text(clause("right")), **options)
    assert code_of(info) == code


@pytest.mark.parametrize("source", [3, None, ["a.linnet"]])
def test_a_source_that_is_no_file_is_coded(source):
    with pytest.raises(LinnetError) as info:
        check_grad_clauses(source)
    assert code_of(info) == "E0767"


def test_ops_and_skip_as_one_name_or_a_list():
    prog = Program.from_text(clause("sign"))
    assert len(check_grad_clauses(prog, ops="f", count=1)) == 1
    assert check_grad_clauses(prog, skip=["main::f"], count=1) == []
    assert main(["grads", "--std", "--dtype", "i32"]) == 1
