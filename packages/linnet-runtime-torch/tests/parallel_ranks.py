"""One rank of tests/test_parallel.py's tensor-parallel run (started by torchrun).

``python -m torch.distributed.run --nproc-per-node 2 parallel_ranks.py WEIGHTS OUT``: loads
the toy Llama with ``world=2`` from WEIGHTS, runs prefill (generated source and the
interpreter), 16 greedy tokens and a plan of decode; rank 0 writes what it saw to OUT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from linnet.torch import load

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
PROMPT = [[3, 17, 100, 255, 9]]


def main(weights: str, out: str) -> None:
    model = load(LLAMA, weights=weights, config="toy", world=2)
    tokens = torch.tensor(PROMPT, dtype=torch.int32)
    logits = model.prefill(tokens)
    interp = load(LLAMA, weights=weights, config="toy", world=2, interpret=True)
    logits_i = interp.prefill(tokens, context=interp.new_context("prefill", [tokens]))
    generated = model.generate(PROMPT, max_new_tokens=16)
    one = torch.tensor([5], dtype=torch.int32)
    plan = model.plan_for("decode", [one, one], backends=[], measure=False, progress=False)
    measured = model.plan_for("decode", [one, one], backends=[], progress=False)
    ctx = model.context_for(plan)
    (plan_logits,) = plan.run([one, one], ctx)
    decode_logits = model.decode(one, one, context=model.new_context("decode", [one, one]))
    held = {p: list(t.shape) for p, t in model.params.items()}
    if model.rank == 0:
        Path(out).write_text(json.dumps({
            "rank": model.rank, "world": model.world, "prefill": logits.tolist(),
            "prefill_interpreted": logits_i.tolist(), "generated": generated,
            "plan_decode": plan_logits.tolist(), "decode": decode_logits.tolist(),
            "explain": plan.explain(), "explain_measured": measured.explain(), "held": held,
            "source": Path(model.source("prefill", [tokens])).read_text()}))
    # Leave together: a rank that exits while another still talks to it aborts that one.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
