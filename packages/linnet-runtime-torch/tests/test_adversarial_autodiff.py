"""Autodiff through kernel launches as PyTorch's own checks see it (issue 46, item 5).

A kernel launch under autograd goes through a custom op of the generated module whose
autograd is registered on the op itself (``torch.library.register_autograd``), with a
backward made of differentiable torch ops (the op's grad clause, or torch autograd of its
body taken with ``create_graph``). Before, autograd lived in a ``torch.autograd.Function``
wrapper around the launch and differentiated a detached copy of the body:

* ``torch.autograd.gradgradcheck`` failed on every kernel op (the first derivative had no
  ``grad_fn``: "Numerical gradient for function expected to be zero");
* ``torch.library.opcheck`` with inputs that require grad failed ("no autograd formula was
  registered");
* ``torch.compile(fullgraph=True)`` of a backward through a launch failed (dynamo cannot
  trace the wrapper's ``torch.autograd.grad``);
* second derivatives through generated causal and window attention raised in torch's SDPA
  CPU backward ("derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward
  is not implemented"): a CPU module now runs the op's body where autograd records the call.

Kernel launches run in a subprocess under TRITON_INTERPRET=1 (Triton's interpreter must be
chosen before Triton is first imported), as test_autograd.py's do. Checks are in f64; the
std kernels compute in f32 inside, so the finite differences take eps 1e-3 and a tolerance
of 1e-3 (the analytical derivatives are the bodies', in f64).
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
from linnet.torch import load

ROOT = Path(__file__).resolve().parents[3]
CI = bool(os.environ.get("CI"))

# A kernel op with a grad clause, generic in T (the std library has no clause today): its
# second derivatives are the clause's, differentiated by torch autograd.
CLAUSE = """
kernel cube_k<N: Dim, B: Dim, T: DType>(x: Tensor[N; T], w: Tensor[N; T]) -> y: Tensor[N; T]
grid((N + B - 1) / B) {
    let i = program_id(0) * B + iota<i32>(B)
    let m = i < N
    let a = load(x[i], m)
    store(y[i], a * a * load(w[i], m), m)
}

pub op cube<N: Dim, T: DType>(x: Tensor[N; T], w: Tensor[N; T]) -> Tensor[N; T]
kernel cube_k<N, 16, T> {
    let y[n] = x[n] * x[n] * w[n]
    return y
} grad(dy) {
    let dx[n] = dy[n] * x[n] * w[n] * 2.0
    let dw[n] = dy[n] * x[n] * x[n]
    return dx, dw
}

model Case {
    entry run(x: Tensor[5; f64], w: Tensor[5; f64]) -> Tensor[5; f64] { return cube(x, w) }
}
"""

# Small cases of each form: one kernel of one result, one of two results, a two-kernel
# chain, decode attention (an integer input), the grad clause above. Elsewhere more.
CASES = {
    "std.nn.norm::rms_norm": {"N": 2, "D": 3, "T": "f64"},
    "std.nn.decode::residual_rms_norm": {"N": 2, "D": 3, "T": "f64"},
    "std.nn.decode::linear_split": {"N": 2, "I": 2, "O": 3, "T": "f64"},
    "std.nn.decode::decode_attention_flash": {"B": 1, "S": 3, "KV": 1, "G": 2, "HD": 2, "T": "f64"},
    "clause": {},
    "std.nn.activation::silu_mul": {"N": 2, "F": 3, "T": "f64"},
    "std.nn.linear::linear_tiled": {"N": 3, "I": 2, "O": 2, "T": "f64"},
    "std.nn.decode::rms_norm_qkv": {"N": 1, "D": 2, "Q": 2, "K": 2, "T": "f64"},
    "std.nn.decode::linear_residual_split": {"N": 2, "I": 2, "O": 3, "T": "f64"},
    "std.nn.decode::decode_attention_split": {"B": 1, "S": 3, "KV": 1, "G": 2, "HD": 2, "T": "f64"},
}
CHECKED = (
    ["std.nn.decode::residual_rms_norm", "std.nn.decode::linear_split", "clause"]
    if CI
    else sorted(CASES)
)
# opcheck and a fullgraph compile: one kernel op (all of CHECKED elsewhere).
COMPILED = ["std.nn.norm::rms_norm"] if CI else sorted(CASES)

DRIVER = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from torch._library.custom_ops import CustomOpDef
from linnet.torch import load
from linnet.torch.kernels import op_case

checked, compiled, where, clause = (json.loads(sys.argv[1]), json.loads(sys.argv[2]),
                                    sys.argv[3], sys.argv[4])
names = sorted(set(checked) | set(compiled))
out = {}


def case(name, generics):
    if name == "clause":
        text, xs = clause, [torch.randn(5, dtype=torch.float64, generator=g) + 1.5
                            for g in (torch.Generator().manual_seed(1),
                                      torch.Generator().manual_seed(2))]
    else:
        c = op_case(name, generics)
        text, xs = c.text, c.random_inputs(seed=1)
    path = f"{where}/{name.replace('::', '_').replace('.', '_')}.linnet"
    open(path, "w").write(text)
    return load(path, weights={}, numerics="fast", grad=True), xs


def error(e):
    return f"{type(e).__name__}: {str(e)[:400]}"


for name in names:
    m, xs0 = case(name, json.loads(sys.argv[5])[name])
    fl = [i for i, x in enumerate(xs0) if x.dtype == torch.float64]

    def f(*fx, m=m, xs0=xs0, fl=fl):
        xs = list(xs0)
        for i, v in zip(fl, fx):
            xs[i] = v
        got = m.run("run", xs)
        return tuple(got) if isinstance(got, (list, tuple)) else got

    fx = [xs0[i].clone().requires_grad_() for i in fl]
    r = {}
    module = m.module("run", list(xs0))
    if name in checked:
        for check in ("gradcheck", "gradgradcheck"):
            try:
                r[check] = bool(getattr(torch.autograd, check)(f, fx, eps=1e-3, atol=1e-3,
                                                               rtol=1e-3))
            except Exception as e:
                r[check] = error(e)
        # create_graph=True: the first derivative has a graph of its own
        y = f(*fx)
        ys = y if isinstance(y, tuple) else (y,)
        gs = torch.autograd.grad(sum(o.sum() for o in ys if o.is_floating_point()), fx,
                                 create_graph=True, allow_unused=True)
        # ... or is a constant (a residual's gradient is ones whatever the inputs)
        moved = [(x * 1.5 + 0.25).detach().requires_grad_() for x in fx]
        y2 = f(*moved)
        ys2 = y2 if isinstance(y2, tuple) else (y2,)
        gs2 = torch.autograd.grad(sum(o.sum() for o in ys2 if o.is_floating_point()), moved,
                                  allow_unused=True)
        r["grad_fn"] = all(g is None or g.grad_fn is not None or torch.equal(g, g2)
                           for g, g2 in zip(gs, gs2))
    if name in compiled:
        ops = [v for v in vars(module).values() if isinstance(v, CustomOpDef)
               and v._name.startswith("grad_")]
        try:
            xs = [x.clone().requires_grad_(x.is_floating_point()) for x in xs0]
            report = torch.library.opcheck(ops[0], xs) if ops else {"op": "none found"}
            r["opcheck"] = all(v == "SUCCESS" for v in report.values()) or report
        except Exception as e:
            r["opcheck"] = error(e)
        try:
            torch._dynamo.reset()
            entry = getattr(module, module.ENTRIES["run"].get("function", "run"))

            def whole(*fx, entry=entry, xs0=xs0, fl=fl):
                xs = list(xs0)
                for i, v in zip(fl, fx):
                    xs[i] = v
                return entry(*xs, {}, {})

            def loss(outs):
                outs = outs[0] if isinstance(outs[0], (list, tuple)) else outs
                return sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype)
                            .reshape(o.shape)).sum() for o in outs if o.is_floating_point())

            compiled_fn = torch.compile(whole, backend="aot_eager", fullgraph=True)
            got = torch.autograd.grad(loss(compiled_fn(*fx)), fx)
            want = torch.autograd.grad(loss(whole(*fx)), fx)
            r["compile"] = all(torch.allclose(a, b, rtol=1e-9, atol=1e-12)
                               for a, b in zip(got, want))
        except Exception as e:
            r["compile"] = error(e)
    r["runs"] = {k: list(v) for k, v in getattr(module, "RUNS", {}).items()}
    out[name] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def peer_checks(tmp_path_factory) -> dict:
    if importlib.util.find_spec("triton") is None:  # found, not imported (see above)
        pytest.skip("needs Triton")
    where = tmp_path_factory.mktemp("autodiff")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            json.dumps(CHECKED),
            json.dumps(COMPILED),
            str(where),
            CLAUSE,
            json.dumps(CASES),
        ],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CHECKED)
def test_gradcheck_and_gradgradcheck_through_a_kernel_launch(peer_checks, name):
    r = peer_checks[name]
    assert all(launched >= 1 and body == 0 for launched, body in r["runs"].values()), r
    assert r["gradcheck"] is True, r["gradcheck"]
    assert r["gradgradcheck"] is True, r["gradgradcheck"]
    assert r["grad_fn"], (
        "a first derivative taken with create_graph=True has no grad_fn "
        "though it changes with the inputs"
    )


@pytest.mark.parametrize("name", COMPILED)
def test_opcheck_and_a_fullgraph_compile_of_a_backward_through_a_kernel_launch(peer_checks, name):
    r = peer_checks[name]
    assert r["opcheck"] is True, r["opcheck"]
    assert r["compile"] is True, r["compile"]


# ---------------------------------------------------------------- SDPA's CPU backward
ATTENTION = """
use std.nn.attention::{causal_attention, window_attention}
model M {
    entry causal(q: Tensor[1, 4, 1, 2, 4; f64], k: Tensor[1, 4, 1, 4; f64],
                 v: Tensor[1, 4, 1, 4; f64]) -> Tensor[1, 4, 1, 2, 4; f64] {
        return causal_attention(q, k, v, 0.5)
    }
    entry window(q: Tensor[1, 4, 1, 2, 4; f64], k: Tensor[1, 4, 1, 4; f64],
                 v: Tensor[1, 4, 1, 4; f64]) -> Tensor[1, 4, 1, 2, 4; f64] {
        return window_attention(q, k, v, 0.5, 2)
    }
}
"""


@pytest.mark.parametrize("entry", ["causal", "window"])
def test_second_derivatives_through_generated_attention_on_the_cpu(tmp_path, entry):
    """Generated causal and window attention call F.scaled_dot_product_attention, whose CPU
    flash kernel's backward cannot be differentiated again: where autograd records the call
    the module runs SDPA's math backend; elsewhere (inference) the default one, with the same
    values, and no einsum of the op's body either way."""
    path = tmp_path / "attention.linnet"
    path.write_text(ATTENTION)
    model = load(path, weights={}, grad=True)
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
        for s in ((1, 4, 1, 2, 4), (1, 4, 1, 4), (1, 4, 1, 4))
    )

    def f(q, k, v):
        return model.run(entry, [q, k, v])

    assert torch.autograd.gradcheck(f, (q, k, v))
    assert torch.autograd.gradgradcheck(f, (q, k, v))
    with torch.no_grad():
        fused = f(q, k, v)
    torch.testing.assert_close(f(q, k, v).detach(), fused, rtol=1e-12, atol=1e-12)
    text = Path(model.source(entry, [q, k, v])).read_text()
    assert (
        "if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):"
        in text
        and "F.scaled_dot_product_attention(" in text
    )
    assert "SDPBackend.MATH" in text and "torch.einsum" not in text


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["std.nn.norm::rms_norm", "std.nn.decode::residual_rms_norm"])
def test_peer_checks_through_a_kernel_launched_on_cuda(tmp_path, monkeypatch, name):
    """For real (Triton compiled, the launch's custom op wrapping the kernel's triton_op):
    gradgradcheck, opcheck with inputs that require grad, and a fullgraph compile (inductor)
    of a backward through the launch."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.torch.kernels import op_case
    from torch._library.custom_ops import CustomOpDef

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = op_case(name, CASES[name])
    path = tmp_path / "case.linnet"
    path.write_text(case.text)
    model = load(path, weights={}, device="cuda", numerics="fast", grad=True)
    xs = [x.requires_grad_() for x in case.random_inputs("cuda", seed=1)]

    def f(*xs):
        got = model.run("run", list(xs))
        return tuple(got) if isinstance(got, (list, tuple)) else got

    assert torch.autograd.gradcheck(f, xs, eps=1e-3, atol=1e-3, rtol=1e-3)
    assert torch.autograd.gradgradcheck(f, xs, eps=1e-3, atol=1e-3, rtol=1e-3)
    module = model.module("run", xs)
    assert all(n >= 1 and body == 0 for n, body in module.RUNS.values())
    (op,) = [
        v
        for v in vars(module).values()
        if isinstance(v, CustomOpDef) and v._name.startswith("grad_")
    ]
    torch.library.opcheck(op, [x.detach().requires_grad_() for x in xs])
    entry = module.run

    def loss(*xs):
        return sum(o.square().sum() for o in entry(*xs, {}, {}))  # a tuple of the outputs

    compiled = torch.compile(loss, fullgraph=True)
    # The norms compute in f32 whatever T (their bodies' `f32` accumulation; an f64 input
    # narrows), so inductor's fused backward and eager autograd agree to f32 rounding.
    for a, b in zip(torch.autograd.grad(compiled(*xs), xs), torch.autograd.grad(loss(*xs), xs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
