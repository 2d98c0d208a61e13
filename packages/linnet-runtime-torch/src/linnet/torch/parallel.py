"""Tensor parallelism on torch.distributed: ranks, layouts, weights read per rank (issue 21).

``load(..., world=N)`` runs one rank of a model split over N processes (docs/parallel.md).
The process group is torch.distributed's default one: initialised already by the caller,
or here from the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), with NCCL on CUDA and gloo on the CPU. Linnet has no transport of its own.

What each rank holds comes from :func:`linnet.lang.ir.shard.shard`: every entry is lowered
once at load and sharded, and the parameters' split axes (which must agree between entries)
say which block of each safetensors tensor the rank reads (``safe_open(...).get_slice``,
straight to its device: no rank ever reads a whole split tensor).

``linnet run --nproc N`` starts the N ranks itself (:func:`spawn`): one process each, on
127.0.0.1 and a free port; rank 0 prints.

>>> layout_of({"w": 0}, 2, 1, {"w": (8, 4)})
{'w': (0, 4, 8)}
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from linnet.lang import LinnetError, Program, lower
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.ir.shard import shard

import torch


def _error(code: str, message: str, help: str = "") -> LinnetError:
    return LinnetError(Diagnostic(code, message, help=help))


def check_world(world: Any) -> int:
    """``world=`` as an int >= 1 (None is 1).

    >>> check_world(None), check_world(2)
    (1, 2)
    """
    if world is None:
        return 1
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise _error("E0821", f"world must be a positive int (the number of ranks), not "
                              f"{world!r}", help="e.g. load(..., world=2) under torchrun "
                                                 "--nproc-per-node 2")
    return world


def init(world: int, device: str | torch.device) -> tuple[int, str | torch.device]:
    """Join (or start, from torchrun's environment) the default process group of ``world``
    ranks; returns this process's rank and its device (``cuda`` becomes ``cuda:LOCAL_RANK``).

    >>> init(2, "cpu")                                       # doctest: +SKIP
    (1, 'cpu')
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise _error("E0821", "world > 1 needs torch.distributed, which this torch build lacks",
                     help="install a torch build with distributed support")
    cuda = torch.device(device).type == "cuda"
    if not dist.is_initialized():
        needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        missing = [k for k in needed if k not in os.environ]
        if missing:
            raise _error(
                "E0821", f"world={world} needs a torch.distributed process group, and none is "
                         f"initialised here (no {', '.join(missing)} in the environment)",
                help=f"start the ranks with `torchrun --nproc-per-node {world} script.py`, or "
                     f"`linnet run --nproc {world}`, or call "
                     f"torch.distributed.init_process_group first")
        if cuda and "LOCAL_RANK" in os.environ:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cuda else "gloo")
    have = dist.get_world_size()
    if have != world:
        raise _error("E0821", f"world={world}, but the process group has {have} ranks",
                     help=f"load with world={have}, or start {world} ranks")
    rank = dist.get_rank()
    if cuda and torch.device(device).index is None:
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        device = f"cuda:{local}"
    return rank, device


def entry_inputs(program: Program) -> dict[str, dict[str, list[int]]]:
    """Each entry's inputs with every dim 1: the shapes the layout is found for (the
    layout does not depend on the inputs' sizes).

    >>> entry_inputs(Program.from_file("examples/llama/llama.linnet"))["decode"]
    {'token': [1], 'pos': [1]}
    """
    from linnet.lang.check.driver import find_model

    decl = find_model(program, None)
    return {m.name: {p.name: [1] * len(p.type.dims) for p in m.params}  # type: ignore[union-attr]
            for m in decl.methods if m.kind == "entry"}


def parameter_axes(program: Program, config: dict[str, Any], shapes: Any, world: int,
                   rank: int) -> dict[str, int]:
    """The split axis of each parameter split over ``world`` ranks, from every entry's
    sharded graph; entries that split one parameter differently are E0822.

    >>> parameter_axes(program, toy_config, None, 2, 0)["lm_head.weight"]   # doctest: +SKIP
    0
    """
    axes: dict[str, int | None] = {}
    seen: dict[str, str] = {}
    for entry, inputs in entry_inputs(program).items():
        graph = lower(program, entry, inputs, config, shapes, check=False)
        s = shard(graph, world, rank)
        for path in graph.parameters:
            axis = s.parameters.get(path)
            if path in axes and axes[path] != axis:
                raise _error(
                    "E0822", f"entries `{seen[path]}` and `{entry}` split parameter `{path}` "
                             f"differently over {world} ranks (axis {axes[path]} and {axis})",
                    help="each rank holds one block of each parameter; give the entries the "
                         "same use of it, or leave tensor parallelism off")
            axes[path], seen[path] = axis, entry
    return {p: a for p, a in axes.items() if a is not None}


def layout_of(axes: dict[str, int], world: int, rank: int,
              shapes: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
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
            raise _error(
                "E0822", f"`{entry}` for these inputs splits parameter `{path}` along axis "
                         f"{axis}; it was loaded split along {loaded.get(path)}",
                help="each rank holds one block of each parameter, found when the model was "
                     "loaded; this entry uses it differently for these shapes")


def time_collectives(graph: Any, device: torch.device, runs: int = 10) -> dict[int, float]:
    """Seconds of each collective step of a rank's graph run alone (the median of ``runs``
    after a barrier; steps of one kind, op, shape and dtype, timed once). Every rank must
    call it at the same point: ``plan_for`` does, when it measures, on every rank.

    >>> time_collectives(model.graph("decode", [token, pos]), model.device)  # doctest: +SKIP
    {14: 2.1e-05, 84: 1.9e-05, ...}
    """
    import statistics
    import time

    from linnet.lang.ir.shard import COLLECTIVES

    import torch.distributed as dist

    from .interpreter import DTYPES, RULES

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

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
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    if "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: the ranks share the machine's cores, not each take all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if rank != 0:  # rank 0 prints; the others' output would repeat it
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    from linnet.lang.cli import report

    try:
        code = int(fn(args) or 0)
    except LinnetError as err:
        if rank:
            print(f"rank {rank} of {world}:", file=sys.stderr)
        code = report(err, "text")
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if code:
        sys.exit(code)


def spawn(world: int, fn: Callable[..., int], args: Any) -> int:
    """Run ``fn(args)`` in ``world`` new processes, ranks 0..world-1 of one process group
    (torch.multiprocessing, spawned); returns 0, or 1 when a rank failed (E0824 says which).

    >>> spawn(2, run_command, args)                          # doctest: +SKIP
    0
    """
    import torch.multiprocessing as mp

    try:
        mp.spawn(_rank_main, args=(world, free_port(), fn, args), nprocs=world, join=True)
    except mp.ProcessExitedException as exc:
        print(f"error[E0824]: rank {exc.error_index} of {world} stopped with exit code "
              f"{exc.exit_code}", file=sys.stderr)
        return 1
    except mp.ProcessRaisedException as exc:
        last = str(exc).strip().splitlines()
        print(f"error[E0824]: rank {exc.error_index} of {world} failed: "
              f"{last[-1] if last else exc}", file=sys.stderr)
        return 1
    return 0
