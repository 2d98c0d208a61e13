"""Train examples/tinylm/tinylm.linnet on the CPU with Linnet's generated gradients.

    python examples/tinylm/train.py                 # 300 steps of Adam, loss printed
    python examples/tinylm/train.py --autograd      # and the same run by torch.autograd

The task: each sequence counts with its own stride, ``x[t + 1] = (x[t] + k) % V`` with ``k``
in 1..3, so the model must read the stride from the context (attention) and apply it. The
loss starts at ln V (2.77 for V = 16) and falls well below 1 within a few hundred steps.

The gradients come from ``model.value_and_grad("loss", ...)``: linnet-lang's reverse pass
over the `loss` entry, emitted as PyTorch source and run under ``torch.inference_mode`` (no
autograd anywhere). ``--autograd`` repeats the run from the same initial weights and batches
with ``torch.autograd`` through the generated *forward* source, as a cross-check: the two
loss curves agree to float32 rounding.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
MODEL = HERE / "tinylm.linnet"
CONFIG = "tiny"


def batches(steps: int, batch: int, length: int, vocab: int, seed: int) -> list[tuple]:
    """(tokens, targets) per step: counting sequences with a random start and stride."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        stride = torch.randint(1, 4, (batch, 1), generator=gen)
        seq = (start + stride * torch.arange(length + 1)) % vocab
        out.append((seq[:, :-1].to(torch.int32), seq[:, 1:].to(torch.int32)))
    return out


class Adam:
    """Adam (Kingma and Ba) over a dict of tensors, updated in place."""

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-8,
    ):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: dict[str, torch.Tensor]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for k, g in grads.items():
            self.m[k].mul_(b1).add_(g, alpha=1 - b1)
            self.v[k].mul_(b2).addcmul_(g, g, value=1 - b2)
            m_hat = self.m[k] / (1 - b1**self.t)
            v_hat = self.v[k] / (1 - b2**self.t)
            self.params[k].sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


def load_model(seed: int = 0, interpret: bool = False) -> Any:
    from linnet.lang.cli import load_config
    from linnet.torch import load
    from linnet.torch.model import random_weights

    config = load_config(CONFIG, [], str(MODEL))
    # random_weights lowers an entry for inputs of size 1: B = 1 there (no parameter has B).
    weights = random_weights(MODEL, {**config, "B": 1}, seed=seed, scale=0.1)
    return load(MODEL, weights=weights, config=CONFIG, interpret=interpret)


def autograd_loss(
    model: Any, tokens: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss and its gradients by torch.autograd through the generated forward source
    (the cross-check; Linnet's entries otherwise run under torch.inference_mode)."""
    module = model._lower("loss", [tokens, targets]).module
    fn = getattr(module, module.ENTRIES["loss"].get("function", "loss"))
    params = {k: v.detach().requires_grad_(True) for k, v in model.params.items()}
    with torch.enable_grad():
        (loss,) = fn(tokens, targets, params, {})
        names = sorted(params)
        grads = torch.autograd.grad(loss, [params[k] for k in names])
    return loss.detach(), dict(zip(names, grads))


def train(
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
    length: int = 16,
    use_autograd: bool = False,
    log_every: int = 0,
    threads: int = 1,
) -> list[float]:
    """Train from seed ``seed``'s initial weights; returns the loss of every step.

    ``threads``: torch's intra-op threads. One by default: the model's matrices are so small
    that threads cost more than they save (20 times more on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(steps, lr, seed, length, use_autograd, log_every)
    finally:
        torch.set_num_threads(before)


def _train(
    steps: int, lr: float, seed: int, length: int, use_autograd: bool, log_every: int
) -> list[float]:
    model = load_model(seed)
    cfg = model.config
    data = batches(steps, cfg["B"], length, cfg["V"], seed + 1)
    opt = Adam(model.params, lr)
    losses = []
    for i, (tokens, targets) in enumerate(data):
        if use_autograd:
            loss, grads = autograd_loss(model, tokens, targets)
        else:
            loss, grads = model.value_and_grad("loss", [tokens, targets])
        opt.step(grads)
        losses.append(float(loss))
        if log_every and (i % log_every == 0 or i == steps - 1):
            print(f"step {i:4d}  loss {float(loss):.4f}")
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--autograd",
        action="store_true",
        help="also train with torch.autograd of the generated forward",
    )
    args = parser.parse_args(argv)
    losses = train(args.steps, args.lr, args.seed, log_every=max(1, args.steps // 10))
    print(
        f"linnet gradients: loss {losses[0]:.4f} -> {losses[-1]:.4f} "
        f"(ln V = {math.log(load_model().config['V']):.4f})"
    )
    if args.autograd:
        ref = train(args.steps, args.lr, args.seed, use_autograd=True)
        worst = max(abs(a - b) for a, b in zip(losses, ref))
        print(
            f"torch.autograd:   loss {ref[0]:.4f} -> {ref[-1]:.4f}; largest difference "
            f"between the two curves {worst:.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
