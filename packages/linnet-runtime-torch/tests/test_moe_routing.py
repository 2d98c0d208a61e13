"""std.nn.moe's ops at their edges (issue 45), in the torch interpreter and generated source:
top-k routing against `torch.topk` (the same experts, the same weights), its rule for ties
(the lower expert index: `torch.topk`'s order among equal values is unspecified, and on the
CPU it is not the lower index), a NaN router row (NaN weights, indices still in range: no
read outside the experts), and `moe_experts`' two bodies (gathering, for few rows; every
expert, for many) agreeing, a row that repeats an expert included."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from linnet.torch import load  # noqa: E402

SOURCE = """
use std.nn.moe::{top_k_route, moe_experts}

pub model Route<N: Dim, E: Dim, K: Dim, D: Dim, F: Dim> {
    config renormalize: bool = true
    param wg: Tensor[E, F, D; f32]
    param wu: Tensor[E, F, D; f32]
    param wd: Tensor[E, D, F; f32]

    entry weights(logits: Tensor[N, E; f32]) -> Tensor[N, K; f32] {
        let (w, idx) = top_k_route<N, E, K, f32>(logits, renormalize)
        return w
    }

    entry experts(logits: Tensor[N, E; f32]) -> Tensor[N, K; i32] {
        let (w, idx) = top_k_route<N, E, K, f32>(logits, renormalize)
        return idx
    }

    entry combine(x: Tensor[N, D; f32], w: Tensor[N, K; f32], idx: Tensor[N, K; i32]) -> Tensor[N, D; f32] {
        return moe_experts(x, self.wg, self.wu, self.wd, w, idx)
    }
}
"""


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("route") / "route.linnet"
    p.write_text(SOURCE)
    return p


def _model(path, interpret=True, **config):
    n, e, k, d, f = config.pop("dims")
    g = torch.Generator().manual_seed(0)
    weights = {
        "wg": torch.randn(e, f, d, generator=g),
        "wu": torch.randn(e, f, d, generator=g),
        "wd": torch.randn(e, d, f, generator=g),
    }
    cfg = {"N": n, "E": e, "K": k, "D": d, "F": f, **config}
    return load(path, weights=weights, config=cfg, interpret=interpret), weights


@pytest.mark.parametrize("interpret", [True, False])
@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_is_torch_topk_of_the_softmax(path, interpret, renormalize):
    model, _ = _model(path, interpret, dims=(6, 8, 3, 4, 4), renormalize=renormalize)
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    w, idx = model.run("weights", [logits]), model.run("experts", [logits])
    p = logits.softmax(-1)
    top, chosen = torch.topk(p, 3)
    if renormalize:
        top = top / top.sum(-1, keepdim=True)
    # Linnet lists the chosen experts in index order (Hugging Face adds them in that order).
    order = chosen.sort(-1)
    assert idx.tolist() == order.values.tolist()
    assert torch.allclose(w, top.gather(-1, order.indices), atol=1e-7)


def test_ties_keep_the_lower_expert_index(path):
    model, _ = _model(path, dims=(3, 8, 2, 4, 4))
    logits = torch.tensor([[0.0] * 8, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 7 + [2.0]])
    idx = model.run("experts", [logits])
    assert idx.tolist() == [[0, 1], [0, 2], [0, 7]]
    w = model.run("weights", [logits])
    assert torch.allclose(w[0], torch.tensor([0.5, 0.5]))


def test_a_nan_router_row_is_nan_and_stays_in_range(path):
    model, _ = _model(path, dims=(2, 8, 2, 4, 4))
    logits = torch.randn(2, 8)
    logits[1, 3] = float("nan")
    idx = model.run("experts", [logits])
    w = model.run("weights", [logits])
    assert ((idx >= 0) & (idx < 8)).all()
    assert w[1].isnan().all() and w[0].isfinite().all()


def _reference(x, weights, w, idx):
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[n, k])
            g = weights["wg"][e] @ x[n]
            u = weights["wu"][e] @ x[n]
            out[n] += (weights["wd"][e] @ (torch.nn.functional.silu(g) * u)) * w[n, k]
    return out


@pytest.mark.parametrize("rows", [2, 9])  # N * K <= E gathers; above, every expert runs
def test_both_bodies_compute_the_routed_sum_even_with_a_repeated_expert(path, rows):
    model, weights = _model(path, dims=(rows, 8, 3, 5, 6))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 5, generator=g)
    w = torch.rand(rows, 3, generator=g)
    idx = torch.randint(0, 8, (rows, 3), generator=g, dtype=torch.int32)
    idx[0] = torch.tensor([4, 4, 1])  # a repeated expert adds twice, as its two slots say
    got = model.run("combine", [x, w, idx])
    assert torch.allclose(got, _reference(x, weights, w, idx), atol=1e-5)
