"""The repository's pytest hooks (every package's tests run from here in CI).

The heaviest test files run first: with ``-n auto --dist loadfile`` each file goes to one
worker as a whole, so a long file handed out last leaves the other workers idle until it
ends. Started first, the long files overlap with the many short ones (longest first), which
keeps CI on two cores under its budget. The order inside a file is unchanged.
"""

from __future__ import annotations

import os

import pytest

# `linnet run` with no model runs the real demo model (SmolLM2-135M-Instruct) where its wheel
# is installed, as it is in this workspace; the tests' runs with no model mean the random toy
# Llama (token ids, fast). integration-tests/test_demo.py runs the real demo on purpose.
os.environ.setdefault("LINNET_DEMO", "toy")

# Under `-n auto` each xdist worker is one process of several on the machine's cores, and
# torch's OpenMP pool would take every core in each (2 workers x 2 threads on CI's 2 cores,
# spinning against each other), as would each Python process a test starts. Each worker and
# what it starts gets its share of the cores instead, unless the environment sets a count.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
# Likewise inductor's compile workers: by default each process that compiles (every worker,
# and every child process a test starts) first starts a pool of subprocesses, each importing
# torch, to compile C++ kernels in parallel: seconds of CPU a process that the other workers
# needed. With a core or less a worker, one process compiles its kernels itself (measured on
# three conformance cases, fresh caches: 36.6 s of CPU against 45.5).
if _WORKERS > 1 and (os.cpu_count() or 1) <= _WORKERS:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# XLA's compiled programs, kept for the whole run as torch's are (runtime-torch's conftest):
# the tests load the same toy models again and again, and each load's jit compiled the same
# programs anew (JAX keeps a compiled program only for the function object that made it).
# With the cache every worker and child process reuses them (three JAX test files: 123 ->
# 105 s). Only tests' runs use it; a user's is JAX's own default.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile

    try:
        _user = getpass.getuser()
    except Exception:  # no user entry (a container)
        _user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"linnet-tests-xla-{_user}"
    )
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# The files that take longest under CI=1, longest first: seconds each alone (`pytest -n 0` on
# an idle 2-core machine).
HEAVY_FIRST = (
    "test_conformance.py",  # 120-140 s: torch.compile (fresh caches) and XLA compile each case
    "test_smollm2.py",  # 66 s, plus about 30 s the first time to make its cached directories
    "test_kernels_launch.py",  # 90 s
    "test_compile_cache.py",  # 80 s
    "test_kernel_checks_run.py",  # 30-65 s under CI=1 (a daily sample of the other std ops)
    "test_jax_pallas.py",  # 50 s under CI=1 (a daily sample of the Pallas check)
    "test_decode_kernels_run.py",  # 40 s
    "test_adversarial_ranks.py",  # 33 s
    "test_adversarial_lang.py",  # 30 s
    "test_adversarial_autodiff.py",  # 27 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep order
