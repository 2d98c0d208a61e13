"""Entries under autograd (issue 14, item 5): `load(..., grad=True)` and
`Model.requires_grad_()` run entries with gradients, and a kernel launch differentiates
through the op's grad clause, or autograd of its body run again.

Kernel launches run in a subprocess under TRITON_INTERPRET=1 (Triton's interpreter must be
chosen before Triton is first imported, which this pytest process may have done).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from linnet.lang import LinnetError
from linnet.lang.check.kernel_instances import with_kernels
from linnet.torch import load, random_weights
from support import run_guarded

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
GRADS = Path(__file__).parent / "kernels" / "grads.linnet"
TOY = {
    "V": 64,
    "D": 32,
    "F": 48,
    "NL": 2,
    "H": 4,
    "KV": 2,
    "HD": 8,
    "S": 8,
    "B": 1,
    "T": "f32",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def _loss(logits: torch.Tensor) -> torch.Tensor:
    # Cross-entropy-like: every logit and every position contributes.
    return logits.logsumexp(-1).mean() - logits[..., 3].mean()


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return random_weights(LLAMA, TOY, seed=0, scale=0.2)


def test_default_entries_run_in_inference_mode(weights: dict) -> None:
    model = load(LLAMA, weights=weights, config=TOY)
    out = model.prefill(torch.tensor([[1, 2, 3]], dtype=torch.int32))
    assert not out.requires_grad and out.is_inference()
    assert not any(p.requires_grad for p in model.params.values())


def test_grad_true_gives_every_parameter_a_gradient_equal_to_the_interpreters(
    weights: dict,
) -> None:
    """Generated source under autograd against the PyTorch interpreter (the semantic
    reference) under autograd: the same loss, and the same gradient for every parameter."""
    tokens = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
    grads = []
    for interpret in (False, True):
        model = load(LLAMA, weights=weights, config=TOY, grad=True, interpret=interpret)
        loss = _loss(model.prefill(tokens))
        loss.backward()
        grads.append((float(loss.detach()), {k: p.grad for k, p in model.params.items()}))
    (loss_gen, gen), (loss_ref, ref) = grads
    assert loss_gen == pytest.approx(loss_ref, rel=1e-6)
    assert set(gen) == set(weights)
    for name in gen:
        assert gen[name] is not None, name
        torch.testing.assert_close(gen[name], ref[name], rtol=1e-4, atol=1e-6, msg=name)
    # The caller's tensors are left alone: the model holds leaves of its own over them.
    assert not any(w.requires_grad for w in weights.values())


def test_caller_grad_mode_applies_and_requires_grad_toggles(weights: dict) -> None:
    model = load(LLAMA, weights=weights, config=TOY, grad=True)
    tokens = torch.tensor([[5, 6]], dtype=torch.int32)
    assert model.prefill(tokens).requires_grad
    with torch.no_grad():
        assert not model.prefill(tokens).requires_grad
    assert model.requires_grad_(False) is model
    out = model.prefill(tokens)
    assert not out.requires_grad and out.is_inference()
    model.requires_grad_()
    assert model.prefill(tokens).requires_grad


def test_grad_must_be_a_bool(weights: dict) -> None:
    with pytest.raises(LinnetError) as info:
        load(LLAMA, weights=weights, config=TOY, grad="yes")  # type: ignore[arg-type]
    assert info.value.diagnostics[0].code == "E0769"
    model = load(LLAMA, weights=weights, config=TOY)
    with pytest.raises(LinnetError) as info:
        model.requires_grad_(1)  # type: ignore[arg-type]
    assert info.value.diagnostics[0].code == "E0769"


DRIVER = r"""
import json, sys
import torch
from linnet.torch import load, random_weights

grads_file, llama, toy = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(0)
W = {"g": 1 + 0.1 * torch.randn(24), "w": 0.3 * torch.randn(20, 24), "v": torch.randn(24)}
out = {}

def grads(numerics, entry, x):
    m = load(grads_file, weights=W, config={"R": 3, "C": 24, "O": 20}, numerics=numerics,
             grad=True)
    x = x.clone().requires_grad_()
    y = getattr(m, entry)(x)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    runs = getattr(m.module(entry, [x]), "RUNS", {})
    return {"x": x.grad, **{k: p.grad for k, p in m.params.items() if p.grad is not None}}, runs

def diff(a, b):
    return {k: float((a[k] - b[k]).abs().max()) for k in a}

for entry, x in [("bodies", torch.randn(3, 24)), ("clause", torch.randn(24)),
                 ("skew", torch.randn(24))]:
    fast, runs = grads("fast", entry, x)
    exact, none = grads("exact", entry, x)
    out[entry] = {"diff": diff(fast, exact), "runs": runs, "exact_runs": none,
                  "ratio": {k: float((fast[k] / exact[k]).median()) for k in fast}}

# The toy Llama: every norm a kernel launch, differentiated by its body.
w = random_weights(llama, toy, seed=1, scale=0.2)
tokens = torch.tensor([[1, 2, 3]], dtype=torch.int32)
res = {}
for numerics in ("fast", "exact"):
    m = load(llama, weights=w, config=toy, numerics=numerics, grad=True)
    logits = m.prefill(tokens)
    (logits.logsumexp(-1).mean() - logits[..., 3].mean()).backward()
    res[numerics] = ({k: p.grad for k, p in m.params.items()},
                     getattr(m.module("prefill", [tokens]), "RUNS", {}))
out["llama"] = {"diff": {k: float((res["fast"][0][k] - res["exact"][0][k]).abs().max()
                                  / (res["exact"][0][k].abs().max() + 1e-12))
                         for k in res["exact"][0]},
                "launches": sum(r[0] for r in res["fast"][1].values()),
                "bodies": sum(r[1] for r in res["fast"][1].values())}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def kernel_grads() -> dict:
    if importlib.util.find_spec("triton") is None:  # found, not imported (see above)
        pytest.skip("needs Triton")
    done = run_guarded(
        [sys.executable, "-c", DRIVER, str(GRADS), str(LLAMA), json.dumps(TOY)],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_without_grad_clause_differentiate_their_body(kernel_grads: dict) -> None:
    """rms_norm, linear_tiled (tl.dot in a loop), silu_mul and softmax launched under autograd:
    the gradients of the input and of every parameter equal autograd of the bodies."""
    r = kernel_grads["bodies"]
    assert {k.split("_")[0] for k, (launched, _) in r["runs"].items() if launched} == {
        "rms",
        "tiled",
        "silu",
        "row",
    }
    assert r["exact_runs"] == {}  # numerics exact: the body, no kernel
    assert set(r["diff"]) == {"x", "g", "w"}
    assert max(r["diff"].values()) < 1e-5, r["diff"]


def test_a_grad_clause_is_the_backward_of_a_launch(kernel_grads: dict) -> None:
    r = kernel_grads["clause"]
    assert r["runs"] == {"mul2_k_24_16": [1, 0]}
    assert max(r["diff"].values()) < 1e-6, r["diff"]


def test_a_deliberately_different_grad_clause_is_seen_used(kernel_grads: dict) -> None:
    """`skewed`'s clause says 3 where its body says 2: the launch's gradients are 3/2 of
    autograd of the body (with numerics exact the body runs, and autograd differentiates it
    step by step)."""
    r = kernel_grads["skew"]
    assert r["runs"] == {"mul2_k_24_16": [1, 0]}
    assert r["ratio"] == {"x": pytest.approx(1.5), "v": pytest.approx(1.5)}


def test_llama_gradients_through_kernels_match_the_body(kernel_grads: dict) -> None:
    r = kernel_grads["llama"]
    assert r["launches"] > 0 and r["bodies"] == 0
    assert len(r["diff"]) == 21
    assert max(r["diff"].values()) < 1e-4, r["diff"]


def test_a_backward_that_cannot_be_lowered_fails_only_when_differentiated() -> None:
    """`scaled_by<N, K>` has a generic no tensor parameter determines: its backward pass
    cannot be lowered from the parameters, so the launch's backward raises E0545; the module
    (and the forward launch) is written as usual."""
    from linnet.lang import Program
    from linnet.lang import lower as lower_graph
    from linnet.lang.emit.torch import emit_torch

    prog = Program.from_text("""
kernel scale_k<N: Dim, K: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32]
grid((N + B - 1) / B) {
    let i = program_id(0) * B + iota<i32>(B)
    store(y[i], load(x[i], i < N) * (K as f32), i < N)
}

pub op scaled_by<N: Dim, K: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel scale_k<N, K, 16> {
    let y[n] = x[n] * (K as f32)
    return y
}

model M<N: Dim> {
    entry go(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return scaled_by<N, 3>(x)
    }
}
""")
    text = emit_torch(with_kernels(lower_graph(prog, "go", {"x": [5]}), prog), numerics="fast")
    compile(text, "generated", "exec")
    assert "launch_with_grad(launch_scale_k_5_3_16, grad_op_1_scaled_by, x)" in text
    assert "def backward_1_scaled_by(inputs, grads):" in text
    assert (
        "the kernel launch of `main::scaled_by` cannot be differentiated" in text
        and "cannot determine `K`" in text
    )
    assert "linnet_backward_1" not in text  # no backward entry was written
    # Autograd reaching the launch gets a coded LinnetError (not a RuntimeError) whose advice
    # names the cause: a generic that no tensor type names on its own. (Run directly: the
    # module itself imports Triton, which this process must not do; see DRIVER.)
    import ast

    from linnet.lang.emit.kernel_grad import GRAD_HELPERS

    ns: dict = {"torch": torch}
    exec(GRAD_HELPERS, ns)
    (fn,) = [
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef) and n.name == "backward_1_scaled_by"
    ]
    exec(ast.get_source_segment(text, fn), ns)
    with pytest.raises(LinnetError) as info:
        ns["backward_1_scaled_by"]([torch.ones(5)], [torch.ones(5)])
    diag = info.value.diagnostics[0]
    assert diag.code == "E0545" and "cannot determine `K`" in diag.message
    assert "name every generic of `scaled_by` on its own" in diag.help
    assert "numerics='exact'" in diag.help
