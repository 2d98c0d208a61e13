"""One rank of tests/test_parallel.py's tensor-parallel run (started by torchrun), and the
ranks that would hang of tests/test_adversarial_ranks.py.

``python -m torch.distributed.run --nproc-per-node 2 parallel_ranks.py WEIGHTS OUT``: loads
the toy Llama with ``world=2`` from WEIGHTS, runs prefill (generated source and the
interpreter), 16 greedy tokens and a plan of decode; rank 0 writes what it saw to OUT.

``python parallel_ranks.py hangs OUT CASE...``: each CASE in turn (a wrong environment, a
missing peer, a rank of ``spawn`` that stops, leaves or sleeps), with a short
``LINNET_RANK_TIMEOUT``; what each said (its stderr, exit status, seconds) as JSON to OUT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
        Path(out).write_text(
            json.dumps(
                {
                    "rank": model.rank,
                    "world": model.world,
                    "prefill": logits.tolist(),
                    "prefill_interpreted": logits_i.tolist(),
                    "generated": generated,
                    "plan_decode": plan_logits.tolist(),
                    "decode": decode_logits.tolist(),
                    "explain": plan.explain(),
                    "explain_measured": measured.explain(),
                    "held": held,
                    "source": Path(model.source("prefill", [tokens])).read_text(),
                }
            )
        )
    # Leave together: a rank that exits while another still talks to it aborts that one.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- ranks that hang (issue 38)
def misbehave(how: str) -> int:
    """A rank of ``spawn(2, misbehave, how)`` (tests/test_parallel.py, issue 38 item 10):
    both ranks join; then rank 1 stops itself (``stop``: SIGSTOP, as `kill -STOP` does),
    exits (``exit``), sleeps (``sleep``), or stops after rank 0 finished without a
    collective (``stop-late``); rank 0 runs a collective (but not in ``stop-late``)."""
    import os
    import signal
    import time

    import torch.distributed as dist
    from linnet.torch.parallel import init

    cuda = how.endswith("-cuda")  # NCCL on two GPUs (the gpu-marked test)
    how = how.removesuffix("-cuda")
    rank, device = init(2, "cuda" if cuda else "cpu")
    if how == "stop-late":  # both past joining (rank 1 may otherwise lose rank 0 in it)
        dist.barrier()
        if rank == 0:
            time.sleep(1)
    if rank == 1:
        if how in ("stop", "stop-late"):
            os.kill(os.getpid(), signal.SIGSTOP)
        elif how == "exit":
            os._exit(3)
        elif how == "sleep":
            time.sleep(120)
    if how != "stop-late":
        dist.all_reduce(torch.ones(4, device=device))
        if cuda:
            torch.cuda.synchronize()  # NCCL's collectives are asynchronous
    return 0


def _captured(run: Any) -> tuple[Any, str, float]:
    """Run ``run()`` with file descriptor 2 (this process's and its children's stderr) in a
    file; (its result, what was written there, seconds)."""
    import os
    import tempfile
    import time

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 2)
        start = time.monotonic()
        try:
            result = run()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        seconds = time.monotonic() - start
        f.seek(0)
        return result, f.read().decode(errors="replace"), seconds


def _in_environment(env: dict[str, str], call: Any) -> Any:
    import os

    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    before = {k: os.environ.get(k) for k in (*keys, *env)}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        return call()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cli(argv: list[str]) -> int:
    from linnet.lang.cli import main as linnet

    return linnet(argv)


def _join() -> int:
    """Join a group of 2 from the environment (a library user's load(world=2) does this)."""
    from linnet.lang import LinnetError
    from linnet.lang.cli import report
    from linnet.torch.parallel import init

    try:
        init(2, "cpu")
    except LinnetError as err:
        return report(err, "text")
    return 0


def hangs(out: str, cases: list[str]) -> None:
    from linnet.torch.parallel import free_port, spawn

    port = str(free_port())
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    environments = {  # a rank of `linnet run --nproc 2` (torchrun's environment), wrong
        "rank-past-world": {**base, "RANK": "2", "WORLD_SIZE": "2"},
        "world-not-nproc": {**base, "RANK": "0", "WORLD_SIZE": "3"},
        "negative-rank": {**base, "RANK": "-1", "WORLD_SIZE": "2"},
        "rank-not-int": {**base, "RANK": "one", "WORLD_SIZE": "2"},
        "local-rank-past": {**base, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2"},
        "local-world-past": {**base, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"},
        "port-out-of-range": {**base, "RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"},
        "port-not-int": {**base, "RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"},
        "empty-address": {**base, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " "},
    }
    report = {}
    for case in cases:
        if case in environments:
            env = environments[case]
            rc, err, seconds = _captured(
                lambda env=env: _in_environment(
                    env, lambda: _cli(["run", str(LLAMA), "--config", "toy", "--nproc", "2"])
                )
            )
        elif case in ("missing-peer", "missing-rank-0"):  # nobody else ever joins
            rank = "0" if case == "missing-peer" else "1"
            env = {**base, "RANK": rank, "WORLD_SIZE": "2", "MASTER_PORT": str(free_port())}
            rc, err, seconds = _captured(lambda env=env: _in_environment(env, _join))
        else:  # a rank of `spawn` (`linnet run --nproc 2`'s launcher) misbehaves
            rc, err, seconds = _captured(lambda case=case: spawn(2, misbehave, case))
        report[case] = {"rc": rc, "stderr": err, "seconds": seconds}
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "hangs":
        hangs(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1], sys.argv[2])
