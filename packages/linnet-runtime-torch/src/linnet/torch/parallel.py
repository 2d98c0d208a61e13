"""Tensor parallelism on torch.distributed: ranks, layouts, weights read per rank (issue 21).

``load(..., world=N)`` runs one rank of a model split over N processes (docs/parallel.md).
The process group is torch.distributed's default one: initialised already by the caller,
or here from the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), with NCCL on CUDA and gloo on the CPU. Linnet has no transport of its own.

What each rank holds comes from :func:`linnet.lang.passes.shard.shard`: every entry is lowered
once at load and sharded, and the parameters' split axes (which must agree between entries)
say which block of each safetensors tensor the rank reads (``safe_open(...).get_slice``,
straight to its device: no rank ever reads a whole split tensor).

``linnet run --nproc N`` starts the N ranks itself (:func:`spawn`): one process each, on
127.0.0.1 and a free port; rank 0 prints.

>>> layout_of({"w": 0}, 2, 1, {"w": (8, 4)})
{'w': (0, 4, 8)}
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from linnet.lang import LinnetError, Program, lower
from linnet.lang.diagnostics.core import coded_error

# The time a rank waits (E0827) is checked by `linnet run` before torch is imported: it
# lives in linnet.lang.host.options, re-exported here where the ranks use it.
from linnet.lang.host.options import DEFAULT_TIMEOUT, TIMEOUT_ENV, rank_timeout
from linnet.lang.passes.shard import shard

import torch


def check_world(world: Any) -> int:
    """``world=`` as an int >= 1 (None is 1).

    >>> check_world(None), check_world(2)
    (1, 2)
    """
    if world is None:
        return 1
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise coded_error(
            "E0821",
            f"world must be a positive int (the number of ranks), not {world!r}",
            help="e.g. load(..., world=2) under torchrun --nproc-per-node 2",
        )
    return world


def check_ranks(nproc: int, device: Any) -> None:
    """`linnet run --nproc` on CUDA starts one rank per GPU: at most as many as are visible
    (E0824). (:func:`linnet.lang.host.options.check_nproc` checked the number itself.)

    >>> check_ranks(2, "cpu")
    """
    if str(device).startswith("cuda"):
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise coded_error(
                "E0824",
                f"--nproc {nproc} --device cuda: one rank per GPU, and "
                f"{gpus} GPU(s) are visible here",
                help=f"start at most {gpus} rank(s) (check CUDA_VISIBLE_DEVICES), "
                "or run the ranks on the CPU (--device cpu)",
            )


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise coded_error(
            "E0826",
            f"{name}={raw!r} in the environment is not an integer",
            help=f"set {name} to a whole number (torchrun sets it for each rank), or "
            f"unset it and let `linnet run --nproc N` start the ranks",
        ) from None


def check_environment(world: int, device: str | torch.device = "cpu") -> tuple[int, int]:
    """The environment a rank joins by (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) agrees with ``world`` and with
    itself, checked before joining (a wrong one would wait forever); ``(rank, local
    rank)``. E0821 when one is missing, E0826 naming the one that is wrong.

    >>> check_environment(2)                        # under torchrun --nproc-per-node 2  # doctest: +SKIP
    (1, 1)
    """
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [k for k in needed if k not in os.environ]
    if missing:
        raise coded_error(
            "E0821",
            f"world={world} needs a torch.distributed process group, and none is "
            f"initialised here (no {', '.join(missing)} in the environment)",
            help=f"start the ranks with `torchrun --nproc-per-node {world} script.py`, or "
            f"`linnet run --nproc {world}`, or call "
            f"torch.distributed.init_process_group first",
        )
    fix = (
        f"start {world} ranks with `torchrun --nproc-per-node {world}` or `linnet run "
        f"--nproc {world}`, which set these for each rank"
    )
    size = _int_env("WORLD_SIZE")
    rank = _int_env("RANK")
    assert size is not None and rank is not None
    if size != world:
        raise coded_error(
            "E0826",
            f"WORLD_SIZE={size} in the environment, but this process is "
            f"one of world={world} ranks (`--nproc {world}`, `world=`)",
            help=f"make them agree: {fix}, or load with world={size}",
        )
    if not 0 <= rank < size:
        raise coded_error(
            "E0826",
            f"RANK={rank} is not a rank of WORLD_SIZE={size} (ranks are 0 to "
            f"{size - 1}): it would wait for ranks that never come",
            help=f"give each process its own RANK from 0 to {size - 1}: {fix}",
        )
    local_size = _int_env("LOCAL_WORLD_SIZE")
    if local_size is not None and not 1 <= local_size <= size:
        raise coded_error(
            "E0826",
            f"LOCAL_WORLD_SIZE={local_size} is not between 1 and WORLD_SIZE={size}",
            help=fix,
        )
    local = _int_env("LOCAL_RANK")
    top = local_size if local_size is not None else size
    if local is not None and not 0 <= local < top:
        raise coded_error(
            "E0826",
            f"LOCAL_RANK={local} is not a rank on this machine (0 to "
            f"{top - 1}, from {'LOCAL_WORLD_SIZE' if local_size else 'WORLD_SIZE'}"
            f"={top})",
            help=fix,
        )
    if not os.environ["MASTER_ADDR"].strip():
        raise coded_error(
            "E0826",
            "MASTER_ADDR is empty: the ranks meet at rank 0's address",
            help="set MASTER_ADDR to rank 0's host (127.0.0.1 on one machine)",
        )
    port = _int_env("MASTER_PORT")
    if port is None or not 1 <= port <= 65535:
        raise coded_error(
            "E0826",
            f"MASTER_PORT={port} is not a TCP port (1 to 65535)",
            help="set MASTER_PORT to a free port on rank 0's host, such as 29500",
        )
    if torch.device(device).type == "cuda":
        gpus = torch.cuda.device_count()
        use = local if local is not None else rank % max(gpus, 1)
        if use >= gpus:
            raise coded_error(
                "E0826",
                f"rank {rank} of {size} would use GPU {use}, and this machine "
                f"has {gpus} GPU(s) visible",
                help="start at most one rank per GPU (check CUDA_VISIBLE_DEVICES)",
            )
    return rank, (local if local is not None else rank)


def init(world: int, device: str | torch.device) -> tuple[int, str | torch.device]:
    """Join (or start, from torchrun's environment) the default process group of ``world``
    ranks; returns this process's rank and its device (``cuda`` becomes ``cuda:LOCAL_RANK``).
    The environment is checked first (E0821, E0826); joining and every collective wait at
    most :func:`rank_timeout` seconds for the other ranks (E0825 after that).

    >>> init(2, "cpu")                                       # doctest: +SKIP
    (1, 'cpu')
    """
    import datetime

    import torch.distributed as dist

    if not dist.is_available():
        raise coded_error(
            "E0821",
            "world > 1 needs torch.distributed, which this torch build lacks",
            help="install a torch build with distributed support",
        )
    cuda = torch.device(device).type == "cuda"
    if not dist.is_initialized():
        rank, local = check_environment(world, device)
        timeout = rank_timeout()
        if cuda and "LOCAL_RANK" in os.environ:
            torch.cuda.set_device(local)
        if rank != 0:
            _reach_rank_0(rank, world, timeout)
        try:
            dist.init_process_group(
                "nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout)
            )
        except Exception as exc:
            raise _join_error(exc, rank, world, timeout) from None
    have = dist.get_world_size()
    if have != world:
        raise coded_error(
            "E0821",
            f"world={world}, but the process group has {have} ranks",
            help=f"load with world={have}, or start {world} ranks",
        )
    rank = dist.get_rank()
    if cuda and torch.device(device).index is None:
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        device = f"cuda:{local}"
    return rank, device


def _reach_rank_0(rank: int, world: int, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until rank 0's rendezvous answers at MASTER_ADDR:PORT;
    E0825 if it never does. (torch's own client would retry with a C++ stack trace a try.)"""
    host, port = os.environ["MASTER_ADDR"].strip(), int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + timeout
    why = ""
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((host, port), timeout=max(0.05, min(1.0, left))).close()
            return
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
        if left <= 0:
            break
        time.sleep(min(0.2, max(0.0, left)))
    raise coded_error(
        "E0825",
        f"rank {rank} of {world} could not join the other ranks: rank 0 did "
        f"not answer at {host}:{port} within {timeout:g} s ({why})",
        help=f"start rank 0 too (all {world} ranks, each with its own RANK) and check "
        f"that MASTER_ADDR/MASTER_PORT reach it; {_LONGER}",
    )


_LONGER = (
    f"if a rank is only slow (loading, compiling), give them longer: "
    f"{TIMEOUT_ENV}=<seconds> (default {DEFAULT_TIMEOUT:.0f}) or `linnet run "
    f"--rank-timeout <seconds>`"
)


def _join_error(exc: Exception, rank: int, world: int, timeout: float) -> LinnetError:
    """E0825 (the others did not come in time) or E0826 (the port is taken) for a failed
    ``init_process_group``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    if "EADDRINUSE" in text or "address already in use" in text:
        return coded_error(
            "E0826",
            f"rank {rank} of {world} cannot listen at {where}: the port "
            "MASTER_PORT is in use on this machine",
            help="set MASTER_PORT to a free port (`linnet run --nproc` picks one)",
        )
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    if joined:
        why = f"{joined[1]} of {joined[2]} ranks joined within {timeout:g} s"
    elif "connect" in text:
        why = f"rank 0 did not answer at {where} within {timeout:g} s"
    else:
        why = text
    return coded_error(
        "E0825",
        f"rank {rank} of {world} could not join the other ranks: {why}",
        help=f"start all {world} ranks (each with its own RANK) and check that "
        f"MASTER_ADDR/MASTER_PORT reach rank 0; {_LONGER}",
    )


def collective_error(exc: BaseException, rank: int, world: int) -> LinnetError | None:
    """E0825 for a collective that failed for want of the other ranks (gloo's or NCCL's
    timeout, a peer that closed its connection), naming this rank; None for anything else.

    >>> collective_error(RuntimeError("[gloo/tcp/pair.cc:534] Connection closed by peer"),
    ...                  0, 2).diagnostics[0].code
    'E0825'
    """
    import torch.distributed as dist

    text = str(exc).strip()
    lowered = text.lower()
    ours = isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and ("gloo" in lowered or "nccl" in lowered)
    )
    if not ours:
        return None
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # gloo's "[/path/file.cc:78] "
    if "timed out" in lowered or "timeout" in lowered:
        seconds = rank_timeout_or_none()
        waited = f" {seconds:g} s" if seconds is not None else ""
        return coded_error(
            "E0825",
            f"rank {rank} of {world} waited{waited} in a collective for the "
            f"other ranks, and they did not come ({first}): a rank stopped, "
            "is stuck, or runs other calls",
            help=f"every rank must make the same calls with the same inputs; {_LONGER}",
        )
    return coded_error(
        "E0825",
        f"rank {rank} of {world} lost another rank in a collective "
        f"({first}): that rank stopped or failed (its own error says why)",
        help="every rank must make the same calls; fix the rank that failed",
    )


def rank_timeout_or_none() -> float | None:
    try:
        return rank_timeout()
    except LinnetError:
        return None


class _NoErrors(contextlib.AbstractContextManager[None]):
    def __exit__(self, *exc: object) -> None:
        return None


_NO_ERRORS = _NoErrors()


def rank_errors(rank: int, world: int) -> contextlib.AbstractContextManager[None]:
    """A context in which a collective that fails for want of the other ranks is E0825
    naming rank ``rank`` of ``world`` (nothing changes for one process).

    >>> with rank_errors(0, 1):
    ...     pass
    """
    return _NO_ERRORS if world <= 1 else _rank_errors(rank, world)


@contextlib.contextmanager
def _rank_errors(rank: int, world: int) -> Iterator[None]:
    try:
        yield
    except LinnetError:
        raise
    except Exception as exc:
        err = collective_error(exc, rank, world)
        if err is None:
            raise
        raise err from None


def entry_inputs(
    program: Program, config: dict[str, Any] | None = None
) -> dict[str, dict[str, list[int]]]:
    """Each entry's inputs with every dim 1 but those ``config`` fixes (a batch ``B``): the
    shapes the layout is found for (the layout does not depend on the inputs' sizes).

    >>> entry_inputs(Program.from_file("examples/llama/llama.linnet"), {"B": 2})["decode"]
    {'token': [2], 'pos': [2]}
    """
    from linnet.lang.check.driver import find_model, probe_inputs

    decl = find_model(program, None)
    return {m.name: probe_inputs(m, config) for m in decl.methods if m.kind == "entry"}


def parameter_axes(
    program: Program, config: dict[str, Any], shapes: Any, world: int, rank: int
) -> dict[str, int]:
    """The split axis of each parameter split over ``world`` ranks, from every entry's
    sharded graph; entries that split one parameter differently are E0822.

    >>> parameter_axes(program, toy_config, None, 2, 0)["lm_head.weight"]   # doctest: +SKIP
    0
    """
    axes: dict[str, int | None] = {}
    seen: dict[str, str] = {}
    for entry, inputs in entry_inputs(program, config).items():
        graph = lower(program, entry, inputs, config, shapes, check=False)
        s = shard(graph, world, rank)
        for path in graph.parameters:
            axis = s.parameters.get(path)
            if path in axes and axes[path] != axis:
                raise coded_error(
                    "E0822",
                    f"entries `{seen[path]}` and `{entry}` split parameter `{path}` "
                    f"differently over {world} ranks (axis {axes[path]} and {axis})",
                    help="each rank holds one block of each parameter; give the entries the "
                    "same use of it, or leave tensor parallelism off",
                )
            axes[path], seen[path] = axis, entry
    return {p: a for p, a in axes.items() if a is not None}


def layout_of(
    axes: dict[str, int], world: int, rank: int, shapes: dict[str, Any]
) -> dict[str, tuple[int, int, int]]:
    """``(axis, start, stop)`` of this rank's block of each split parameter (``shapes``:
    the whole tensors' shapes, or TensorInfo-like pairs whose first item is the shape).

    >>> layout_of({"w": 1}, 4, 3, {"w": ((8, 16), "f32")})
    {'w': (1, 12, 16)}
    """
    out = {}
    for path, axis in axes.items():
        shape = shapes[path]
        shape = shape[0] if shape and isinstance(shape[0], tuple | list) else shape
        size = shape[axis] // world
        out[path] = (axis, rank * size, (rank + 1) * size)
    return out


def block(t: torch.Tensor, where: tuple[int, int, int] | None) -> torch.Tensor:
    """This rank's block of a whole tensor (a copy of its own), or ``t`` where replicated.

    >>> block(torch.arange(6).reshape(2, 3), (0, 1, 2)).tolist()
    [[3, 4, 5]]
    """
    if where is None:
        return t
    axis, start, stop = where
    return t.narrow(axis, start, stop - start).contiguous().clone()


def check_layout(graph_axes: dict[str, int], loaded: dict[str, int], entry: str) -> None:
    """A lowered entry splits the parameters as they were loaded (E0822 otherwise).

    >>> check_layout({"w": 0}, {"w": 0, "v": 1}, "decode")
    """
    for path, axis in graph_axes.items():
        if loaded.get(path) != axis:
            raise coded_error(
                "E0822",
                f"`{entry}` for these inputs splits parameter `{path}` along axis "
                f"{axis}; it was loaded split along {loaded.get(path)}",
                help="each rank holds one block of each parameter, found when the model was "
                "loaded; this entry uses it differently for these shapes",
            )


def time_collectives(graph: Any, device: torch.device, runs: int = 10) -> dict[int, float]:
    """Seconds of each collective step of a rank's graph run alone (the median of ``runs``
    after a barrier; steps of one kind, op, shape and dtype, timed once). Every rank must
    call it at the same point: ``plan_for`` does, when it measures, on every rank.

    >>> time_collectives(model.graph("decode", [token, pos]), model.device)  # doctest: +SKIP
    {14: 2.1e-05, 84: 1.9e-05, ...}
    """
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with rank_errors(dist.get_rank(), dist.get_world_size()):
        return _time_collectives(graph, device, runs, sync)


def _time_collectives(
    graph: Any, device: torch.device, runs: int, sync: Callable[[], None]
) -> dict[int, float]:
    import statistics

    from linnet.lang.passes.shard import COLLECTIVES

    import torch.distributed as dist

    from .interpreter import DTYPES, RULES

    out: dict[int, float] = {}
    seen: dict[tuple, float] = {}
    for i, step in enumerate(graph.steps):
        if step.op not in COLLECTIVES:
            continue
        vt = graph.values[step.operands[0]]
        key = (step.op, vt.shape, vt.dtype, tuple(sorted(step.attributes.items())))
        if key not in seen:
            x = torch.zeros(vt.shape, dtype=DTYPES[vt.dtype], device=device)
            dist.barrier()
            times = []
            for _ in range(runs + 2):
                sync()
                start = time.perf_counter()
                RULES[step.op](step, [x], device)
                sync()
                times.append(time.perf_counter() - start)
            seen[key] = statistics.median(times[2:])
        out[i] = seen[key]
    return out


# ---------------------------------------------------------------- linnet run --nproc
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the ranks' rendezvous).

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, fn: Callable[..., int], args: Any) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    if "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: the ranks share the machine's cores, not each take all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if rank != 0:  # rank 0 prints; the others' output would repeat it
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    from linnet.lang.cli import report

    try:
        with rank_errors(rank, world):
            code = int(fn(args) or 0)
    except LinnetError as err:
        print(f"rank {rank} of {world}:", file=sys.stderr)
        code = report(err, "text")
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if code:
        sys.exit(code)


#: Seconds the other ranks get to stop by themselves after one failed, before they are ended.
GRACE = 5.0


def spawn(world: int, fn: Callable[..., int], args: Any, grace: float = GRACE) -> int:
    """Run ``fn(args)`` in ``world`` new processes, ranks 0..world-1 of one process group
    (torch.multiprocessing, spawned); returns 0, or 1 when a rank failed (E0824 says which).
    No rank is waited for forever: one that is still running ``grace`` seconds after another
    failed, or :func:`rank_timeout` seconds after the others finished, is stopped or stuck;
    it is ended, and E0825 names it.

    >>> spawn(2, run_command, args)                          # doctest: +SKIP
    0
    """
    import torch.multiprocessing as mp

    timeout = rank_timeout()  # E0827 here, before any rank starts
    context = mp.start_processes(
        _rank_main,
        args=(world, free_port(), fn, args),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    try:
        return _watch(context, world, timeout, grace)
    except BaseException:  # Ctrl-C, or a fault here: no rank outlives the command
        _end([p for p in context.processes if p.is_alive()])
        raise


def _end(processes: list[Any]) -> None:
    for p in processes:
        p.kill()  # SIGKILL: a stopped (SIGSTOP) process does not take SIGTERM
    for p in processes:
        p.join()


def _watch(context: Any, world: int, timeout: float, grace: float) -> int:
    """Wait for the ranks; say which failed (each), and which did not stop (ended); 0 when
    all succeeded."""
    from multiprocessing.connection import wait

    procs = context.processes
    pending = {p.sentinel: i for i, p in enumerate(procs)}
    failed: int | None = None
    first_done: float | None = None
    while pending and failed is None:
        left = None if first_done is None else first_done + timeout + grace - time.monotonic()
        ready = wait(list(pending), timeout=None if left is None else max(0.0, left))
        if not ready:  # the others finished long ago: these are stopped or stuck
            break
        for sentinel in ready:
            i = pending.pop(sentinel)
            procs[i].join()
            if procs[i].exitcode != 0:
                failed = i if failed is None else failed
            else:
                first_done = first_done or time.monotonic()
    alive = [i for i, p in enumerate(procs) if p.is_alive()]
    if failed is not None and alive:
        # The others usually fail too (their collectives lose the failed rank) and say so.
        deadline = time.monotonic() + grace
        for i in alive:
            procs[i].join(max(0.0, deadline - time.monotonic()))
        alive = [i for i in alive if procs[i].is_alive()]
    _end([procs[i] for i in alive])
    for i, p in enumerate(procs):
        if i not in alive and p.exitcode != 0:
            print(f"error[E0824]: rank {i} of {world} {_how(context, i)}", file=sys.stderr)
    if alive:
        ranks = ", ".join(str(i) for i in alive)
        after = (
            f"{grace:g} s after rank {failed} failed"
            if failed is not None
            else f"{timeout + grace:g} s after the other ranks finished"
        )
        print(
            f"error[E0825]: rank {ranks} of {world} still ran {after}: stopped, or stuck "
            f"waiting; ended it\n  = help: every rank must make the same calls; {_LONGER}",
            file=sys.stderr,
        )
    return 1 if failed is not None or alive else 0


def _how(context: Any, i: int) -> str:
    """How rank ``i`` stopped: its exit code or signal, or the last line of its exception."""
    import pickle
    import signal

    path = context.error_files[i]
    try:
        with open(path, "rb") as f:
            trace = pickle.load(f)
        last = str(trace).strip().splitlines()
        return f"failed: {last[-1] if last else trace}"
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    code = context.processes[i].exitcode
    if code is not None and code < 0:
        try:
            return f"was ended by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"stopped with exit code {code}"
