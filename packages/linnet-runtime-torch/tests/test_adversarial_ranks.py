"""Adversarial suite (issue 38, item 10): ranks that would wait forever, and `--nproc`.

A stopped rank, one that leaves or sleeps, a rank past the world size, a ``WORLD_SIZE`` that
contradicts ``--nproc``, a missing peer: each must end, soon, in a coded error that names the
rank (E0825, E0826), never a wait without end or a traceback. A nonsensical ``--nproc`` is
E0824 before anything is imported or started, a bad timeout E0827.

What could hang runs in one subprocess (tests/parallel_ranks.py ``hangs``) under a hard
timeout, with ``LINNET_RANK_TIMEOUT=3``; the rest runs here, where nothing is started
(``spawn`` is replaced by a function that fails the test if it is ever called).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from linnet.lang import LinnetError
from linnet.lang.cli import main
from linnet.lang.host.options import RANKS_PER_CORE, usable_cores
from linnet.torch import parallel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
TIMEOUT = 3  # seconds a rank waits for the others here

ENVIRONMENTS = {  # case: (what the error names)
    "rank-past-world": "RANK=2",
    "world-not-nproc": "WORLD_SIZE=3",
    "negative-rank": "RANK=-1",
    "rank-not-int": "RANK='one'",
    "local-rank-past": "LOCAL_RANK=2",
    "local-world-past": "LOCAL_WORLD_SIZE=3",
    "port-out-of-range": "MASTER_PORT=70000",
    "port-not-int": "MASTER_PORT='http'",
    "empty-address": "MASTER_ADDR",
}
PEERS = ["missing-peer", "missing-rank-0"]
# The ranks of `spawn`: in CI the two of the issue (a stopped rank, one that leaves).
SPAWNED = ["stop", "exit"] if os.environ.get("CI") else ["stop", "exit", "sleep", "stop-late"]


@pytest.fixture(scope="module")
def hangs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("hangs") / "report.json"
    env = {
        **os.environ,
        "LINNET_RANK_TIMEOUT": str(TIMEOUT),
        "OMP_NUM_THREADS": "1",
        "LINNET_HOME": str(out.parent / "home"),
    }
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(key, None)
    # The hang guard: every case together must end well within this; if they do not, the
    # whole session (the script and the ranks it started) is killed, and the test fails.
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "parallel_ranks.py"),
            "hangs",
            str(out),
            *ENVIRONMENTS,
            *PEERS,
            *SPAWNED,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the ranks hung: killed after 400 s")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", sorted(ENVIRONMENTS))
def test_a_wrong_rank_environment_is_E0826_before_joining(hangs, case):
    said = hangs[case]
    assert said["rc"] == 1 and "Traceback" not in said["stderr"]
    assert "error[E0826]" in said["stderr"] and ENVIRONMENTS[case] in said["stderr"]
    assert said["seconds"] < TIMEOUT  # refused before joining: nothing was waited for


@pytest.mark.parametrize("case", PEERS)
def test_a_missing_peer_is_E0825_after_the_timeout(hangs, case):
    said = hangs[case]
    err = said["stderr"]
    assert said["rc"] == 1 and "Traceback" not in err and "error[E0825]" in err
    rank = "0" if case == "missing-peer" else "1"
    assert f"rank {rank} of 2 could not join" in err
    assert ("1 of 2 ranks joined within 3 s" if rank == "0" else "rank 0 did not answer") in err
    assert "LINNET_RANK_TIMEOUT" in err
    assert said["seconds"] < 60


@pytest.mark.parametrize("case", SPAWNED)
def test_a_rank_that_stops_or_leaves_ends_the_run_with_a_code_naming_it(hangs, case):
    said = hangs[case]
    err = said["stderr"]
    assert said["rc"] == 1 and "Traceback" not in err
    # Timeout (3 s) + grace (5 s) + starting two processes: never the 30 minutes of
    # torch's own default, nor forever.
    assert said["seconds"] < 120
    if case in ("stop", "sleep"):
        assert "error[E0825]: rank 0 of 2 waited 3 s in a collective" in err
        assert "error[E0824]: rank 0 of 2 stopped with exit code 1" in err
        assert "error[E0825]: rank 1 of 2 still ran 5 s after rank 0 failed" in err
    elif case == "exit":
        assert "error[E0824]: rank 1 of 2 stopped with exit code 3" in err
    else:
        assert "error[E0825]: rank 1 of 2 still ran 8 s after the other ranks finished" in err


# ---------------------------------------------------------------- here: nothing is started
@pytest.fixture
def no_spawn(monkeypatch):
    def spawned(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(parallel, "spawn", spawned)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LINNET_RANK_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)


def cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["run", str(LLAMA), "--config", "toy", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.err


@pytest.mark.parametrize(
    "nproc",
    [
        "0",
        "-1",
        "-99999999999999999999",
        "99999999999999999999",
        "10" * 40,
        str(RANKS_PER_CORE * usable_cores() + 1),
    ],
)
def test_a_nonsensical_nproc_is_E0824_before_anything_starts(capsys, monkeypatch, no_spawn, nproc):
    from linnet.lang.host import run as host_run

    def configured(*args):
        raise AssertionError("the model was read before --nproc was checked")

    monkeypatch.setattr(host_run, "run_setup", configured)
    rc, err = cli(capsys, "--nproc", nproc)
    assert rc == 1 and "error[E0824]" in err and len(err) < 600


def test_more_ranks_than_gpus_is_E0824(capsys, monkeypatch, no_spawn):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs for 2 ranks")
    if not torch.cuda.is_available():  # no GPU at all: the device is refused first
        rc, err = cli(capsys, "--nproc", "2", "--device", "cuda")
        assert rc == 1 and "error[E0711]" in err
        # ... and on a machine with one GPU, the second rank has none
        import linnet.torch.model

        monkeypatch.setattr(linnet.torch.model, "resolve_device", lambda d: d)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rc, err = cli(capsys, "--nproc", "2", "--device", "cuda")
    assert rc == 1 and "error[E0824]" in err and "one rank per GPU" in err


def test_nproc_under_the_jax_runtime_is_checked_too(capsys, no_spawn):
    pytest.importorskip("linnet.jax")
    rc, err = cli(capsys, "--runtime", "jax", "--nproc", "-3")
    assert rc == 1 and "error[E0824]" in err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon", "1e9"])
def test_a_bad_rank_timeout_is_E0827_before_anything_starts(capsys, monkeypatch, no_spawn, value):
    monkeypatch.setenv("LINNET_RANK_TIMEOUT", value)
    rc, err = cli(capsys, "--nproc", "2")
    assert rc == 1 and "error[E0827]" in err and "LINNET_RANK_TIMEOUT" in err
    monkeypatch.delenv("LINNET_RANK_TIMEOUT")
    if value != "soon":  # argparse takes floats only
        rc, err = cli(capsys, "--nproc", "2", "--rank-timeout", value)
        assert rc == 1 and "error[E0827]" in err and "--rank-timeout" in err


def test_the_rank_timeout_option_reaches_the_ranks(capsys, monkeypatch):
    seen = {}

    def spawned(world, fn, args):
        seen["world"], seen["timeout"] = world, os.environ.get("LINNET_RANK_TIMEOUT")
        return 0

    monkeypatch.setattr(parallel, "spawn", spawned)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LINNET_RANK_TIMEOUT", raising=False)
    rc, _ = cli(capsys, "--nproc", "2", "--rank-timeout", "7.5")
    assert rc == 0 and seen == {"world": 2, "timeout": "7.5"}
    assert parallel.rank_timeout() == 7.5


# ---------------------------------------------------------------- collectives that fail
@pytest.mark.parametrize(
    "message, said",
    [
        (
            "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
            "3000ms for recv operation to complete",
            "waited",
        ),
        (
            "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[127.0.0.1]:5432",
            "lost another rank",
        ),
        ("NCCL communicator was aborted on rank 1", "lost another rank"),
    ],
)
def test_a_collective_that_loses_the_other_ranks_is_E0825(message, said):
    err = parallel.collective_error(RuntimeError(message), 1, 4)
    assert err is not None
    d = err.diagnostics[0]
    assert d.code == "E0825" and "rank 1 of 4" in d.message and said in d.message
    assert "[/pytorch" not in d.message


def test_other_errors_are_not_collective_errors():
    assert parallel.collective_error(RuntimeError("shape mismatch"), 0, 2) is None
    assert parallel.collective_error(ValueError("gloo"), 0, 2) is None
    with pytest.raises(ValueError), parallel.rank_errors(0, 2):
        raise ValueError("not ours")


def test_a_models_entry_whose_collective_times_out_is_E0825(monkeypatch):
    from linnet.torch import load, random_weights
    from support import toy_config

    model = load(LLAMA, weights=random_weights(LLAMA, toy_config(), seed=1), config=toy_config())
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    model.decode(token, pos)  # lowered and imported once, for one process
    module = next(iter(model._lowered.values())).module

    def timed_out(*args, **kwargs):
        raise RuntimeError(
            "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:"
            "78] Timed out waiting 3000ms for recv operation to complete"
        )

    monkeypatch.setattr(module, module.ENTRIES["decode"].get("function", "decode"), timed_out)
    model.world, model.rank = 2, 1  # as a rank of two would run the same function
    with pytest.raises(LinnetError) as err:
        model.decode(token, pos)
    d = err.value.diagnostics[0]
    assert d.code == "E0825" and "rank 1 of 2" in d.message and "LINNET_RANK_TIMEOUT" in d.help


@pytest.mark.gpu
def test_a_stopped_rank_on_two_gpus_ends_the_run(tmp_path):
    """NCCL: its watchdog ends rank 0 after the rank timeout; `spawn` ends and names rank 1."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    out = tmp_path / "report.json"
    env = {**os.environ, "LINNET_RANK_TIMEOUT": str(TIMEOUT), "LINNET_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "parallel_ranks.py"), "hangs", str(out), "stop-cuda"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the ranks hung: killed after 300 s")
    said = json.loads(out.read_text())["stop-cuda"]
    assert said["rc"] == 1 and said["seconds"] < 120
    assert "rank 1 of 2 still ran" in said["stderr"]
