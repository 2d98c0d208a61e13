"""How many CPU threads `linnet run` gives torch, chosen rather than left to chance.

torch starts one intra-op thread per logical CPU. On a machine shared with other work,
a decode step split over threads waits for the slowest of them, and one descheduled
thread stalls the step: the demo's per-token time swung from 0.7 ms to 150 ms between runs
with 2 threads on a loaded 2-CPU machine, and stayed within 0.7-1.3 ms on one (the toy
Llama, batch 1; the 4-layer `small` config: 17-22 ms on one thread, 140-350 ms on two).
A small model's step is too little work to split, so it runs on one thread; a large one
on its physical cores, at most :data:`MOST_THREADS`. ``--threads N`` sets the count, and
``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) set in the environment is respected. Only
`linnet run` sets it: ``linnet.torch.load`` never changes the process's thread count
(``torch.set_num_threads`` is the caller's).

>>> choose_threads(None, 200_000, environ={})
(1, 'a small model: its decode steps are too little work to split')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from linnet.lang.host.run import threads_from_environment

#: Parameters (elements) below which a model runs on one thread: its decode step is a few
#: dozen small products, less work than waking and joining threads costs.
SMALL_MODEL = 1 << 24
#: The most threads `linnet run` chooses by itself (memory bandwidth, not cores, bounds a
#: batch-1 decode step beyond it).
MOST_THREADS = 4


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (hyperthreads of one core
    counted once, where Linux says which are which; else the CPUs).

    >>> physical_cores() >= 1
    True
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(
                (
                    (topology / "physical_package_id").read_text().strip(),
                    (topology / "core_id").read_text().strip(),
                )
            )
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def choose_threads(
    requested: int | None, parameters: int, ranks: int = 1, environ: Any = None
) -> tuple[int | None, str]:
    """The thread count for a model of ``parameters`` elements and why: ``requested``
    (``--threads``), else None where the environment sets it (the variable's name is the
    why), else 1 for a small model, else the physical cores (shared by ``ranks`` processes)
    up to :data:`MOST_THREADS`.

    >>> choose_threads(3, 10**9)
    (3, '--threads')
    >>> choose_threads(None, 10**9, environ={"OMP_NUM_THREADS": "2"})
    (None, 'OMP_NUM_THREADS')
    """
    if requested is not None:
        return requested, "--threads"
    variable = threads_from_environment(environ)
    if variable is not None:
        return None, variable
    if parameters < SMALL_MODEL:
        return 1, "a small model: its decode steps are too little work to split"
    return (
        max(1, min(physical_cores() // max(1, ranks), MOST_THREADS)),
        f"the physical cores, at most {MOST_THREADS}",
    )


def set_threads(requested: int | None, parameters: int, ranks: int = 1) -> tuple[int, str]:
    """Choose (:func:`choose_threads`) and set torch's CPU thread count; returns the count
    torch now runs on and why, for `linnet run`'s output.

    >>> set_threads(1, 10**9)                          # doctest: +SKIP
    (1, '--threads')
    """
    import torch

    threads, why = choose_threads(requested, parameters, ranks)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads(), why


def threads_text(threads: int) -> str:
    """``"1 thread"``, ``"4 threads"``.

    >>> threads_text(1), threads_text(4)
    ('1 thread', '4 threads')
    """
    return f"{threads} thread{'s' if threads != 1 else ''}"
