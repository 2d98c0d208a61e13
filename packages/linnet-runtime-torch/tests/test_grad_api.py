"""`model.value_and_grad`, `model.grad` and `model.grad_graph` (issue 18).

The Llama prefill loss's gradient with respect to every parameter, from the reverse pass run
as generated source (and by the interpreter), matches torch.autograd through the
interpreter's forward in f32 to 1e-4 relative; the API's mistakes are coded errors.
"""

from __future__ import annotations

import pytest
import torch
from linnet.lang import LinnetError
from linnet.torch import load
from linnet.torch.interpreter import run_graph
from linnet.torch.model import random_weights
from support import LLAMA, toy_config

TINY = """
model M<N: Dim> {
    param w: Tensor[N; f32]
    param ids: Tensor[N; i32]
    entry loss(x: Tensor[N; f32]) -> f32 {
        let s = sum[i](x[i] * self.w[i] * self.w[i])
        return s
    }
    entry scores(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i] * self.w[i]
        return y
    }
}
"""


@pytest.fixture(scope="module")
def llama():
    config = toy_config(NL=2)
    weights = random_weights(LLAMA, config, seed=0, scale=0.05)
    return config, weights


def _cross_entropy_cotangent(logits: torch.Tensor, targets: torch.Tensor):
    """The loss and its gradient with respect to the logits (autograd on the logits alone)."""
    leaf = logits.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = torch.nn.functional.cross_entropy(
            leaf.reshape(-1, leaf.shape[-1]), targets.reshape(-1).long()
        )
        (d,) = torch.autograd.grad(loss, [leaf])
    return loss.detach(), d


@pytest.mark.parametrize("interpret", [False, True], ids=["generated", "interpreter"])
def test_llama_prefill_loss_gradient_matches_autograd_for_every_parameter(llama, interpret):
    config, weights = llama
    model = load(LLAMA, weights=weights, config=config, interpret=interpret)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config["V"], (1, 8), dtype=torch.int32, generator=gen)
    targets = torch.randint(0, config["V"], (1, 8), dtype=torch.int32, generator=gen)
    logits = model.prefill(tokens)
    _, d_logits = _cross_entropy_cotangent(logits, targets)
    value, grads = model.value_and_grad("prefill", [tokens], wrt="params", cotangents=[d_logits])
    torch.testing.assert_close(value, logits, rtol=1e-5, atol=1e-5)
    assert set(grads) == set(model.params)
    # torch.autograd through the interpreter's forward: the whole loss, every parameter.
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.params.items()}
    graph = model.graph("prefill", [tokens])
    with torch.enable_grad():
        states = {p: torch.zeros(vt.shape) for p, vt in graph.states.items()}
        (out,) = run_graph(graph, [tokens], params, states)
        loss = torch.nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), targets.reshape(-1).long()
        )
        names = sorted(params)
        ref = dict(zip(names, torch.autograd.grad(loss, [params[k] for k in names])))
    for path in names:
        scale = float(ref[path].abs().max())
        assert scale > 0, path
        torch.testing.assert_close(
            grads[path], ref[path], rtol=1e-4, atol=1e-4 * scale, msg=lambda m, p=path: f"{p}: {m}"
        )


def _tiny(tmp_path, **kw):
    path = tmp_path / "tiny.linnet"
    path.write_text(TINY)
    weights = {
        "w": torch.tensor([1.0, 2.0, 3.0]),
        "ids": torch.tensor([0, 1, 2], dtype=torch.int32),
    }
    return load(path, weights=weights, **kw)


def test_value_and_grad_of_a_loss(tmp_path):
    model = _tiny(tmp_path)
    x = torch.tensor([1.0, -1.0, 0.5])
    loss, grads = model.value_and_grad("loss", [x])
    assert float(loss) == pytest.approx(1.0 - 4.0 + 4.5)
    torch.testing.assert_close(grads["w"], 2 * x * model.params["w"])
    assert set(grads) == {"w"}  # "params": the float ones (ids is i32)
    by_name = model.grad("loss", {"x": x}, wrt=["x", "w"])
    torch.testing.assert_close(by_name["x"], model.params["w"] ** 2)
    torch.testing.assert_close(by_name["w"], grads["w"])
    graph = model.grad_graph("loss", [x], wrt="x")
    assert graph.outputs[-1] == "%d_x" and graph.values["%d_x"].shape == (3,)


def test_value_and_grad_with_cotangents(tmp_path):
    model = _tiny(tmp_path, interpret=True)
    x = torch.tensor([1.0, -1.0, 0.5])
    d = torch.tensor([1.0, 10.0, 100.0])
    y, grads = model.value_and_grad("scores", [x], wrt=["w"], cotangents=[d])
    torch.testing.assert_close(y, x * model.params["w"])
    torch.testing.assert_close(grads["w"], x * d)


@pytest.mark.parametrize(
    "call,code",
    [
        (lambda m, x: m.value_and_grad("scores", [x]), "E0952"),  # no loss, no cotangents
        (lambda m, x: m.value_and_grad("loss", [x], wrt="nope"), "E0950"),
        (lambda m, x: m.value_and_grad("loss", [x], wrt="ids"), "E0951"),
        (lambda m, x: m.value_and_grad("loss", [x], wrt=3), "E0805"),
        (lambda m, x: m.value_and_grad("scores", [x], cotangents=[x, x]), "E0806"),
        (lambda m, x: m.value_and_grad("scores", [x], cotangents=[x[:2]]), "E0807"),
        (lambda m, x: m.value_and_grad("scores", [x], cotangents=[x.double()]), "E0807"),
        (lambda m, x: m.value_and_grad("loss", [x.double()]), "E0722"),  # inputs are checked
    ],
)
def test_mistakes_are_coded_errors(tmp_path, call, code):
    model = _tiny(tmp_path)
    with pytest.raises(LinnetError) as err:
        call(model, torch.tensor([1.0, 2.0, 3.0]))
    assert err.value.diagnostics[0].code == code


def test_decode_reads_back_the_cache_it_wrote_so_it_has_no_gradient(llama):
    config, weights = llama
    model = load(LLAMA, weights=weights, config=config)
    token, pos = torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    with pytest.raises(LinnetError) as err:
        model.value_and_grad("decode", [token, pos], cotangents=[torch.ones(1, config["V"])])
    assert err.value.diagnostics[0].code == "E0953"


SLICED = """
model M {
    param w: Tensor[6, 4; f32]
    entry loss(x: Tensor[4; f32]) -> f32 {
        let a = self.w[1..3, ..]
        let b = self.w[.., 2..4]
        let s = sum[i, j](a[i, j] * x[j]) + sum[i, j](b[i, j] * b[i, j])
        return s
    }
}
"""


@pytest.mark.parametrize("interpret", [False, True], ids=["generated", "interpreter"])
def test_the_gradient_through_static_slices_of_a_parameter(tmp_path, interpret):
    """`slice`'s VJP (issue 19's `w[a..b, ..]`): each slice's gradient placed into zeros of
    the parameter's shape, the overlapping ones added, as torch.autograd says."""
    path = tmp_path / "sliced.linnet"
    path.write_text(SLICED)
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    x = torch.tensor([1.0, -2.0, 0.5, 3.0])
    model = load(path, weights={"w": w}, interpret=interpret)
    loss, grads = model.value_and_grad("loss", [x])
    leaf = w.clone().requires_grad_(True)
    with torch.enable_grad():
        ref = (leaf[1:3] * x).sum() + (leaf[:, 2:4] ** 2).sum()
        (want,) = torch.autograd.grad(ref, [leaf])
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(grads["w"], want)
