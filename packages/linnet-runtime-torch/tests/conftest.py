import getpass
import os
import tempfile

import pytest
from linnet.lang.ir import verify

# torch.compile's caches: one for the whole session, shared by every test, as torch's own
# default in /tmp was before Linnet placed them under $LINNET_HOME (which is per test here):
# tests that compile the same graphs reuse them. Set like a user's own, so Linnet keeps it;
# test_compile_cache.py removes it where it tests Linnet's placement.
try:
    _USER = getpass.getuser()
except Exception:  # no user entry (a container)
    _USER = str(os.getuid()) if hasattr(os, "getuid") else "user"
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"linnet-tests-torchinductor-{_USER}"),
)


@pytest.fixture(autouse=True)
def linnet_home(tmp_path, monkeypatch):
    """Each test writes generated source into its own $LINNET_HOME."""
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "linnet-home"))
    return tmp_path / "linnet-home"


@pytest.fixture(autouse=True)
def verify_graphs(monkeypatch):
    """Every graph lowered is verified after lowering and each pass (as under LINNET_DEBUG=1,
    without its other effects)."""
    monkeypatch.setattr(verify, "ALWAYS", True)


def _import_triton_for_the_interpreter() -> None:
    """On a machine without CUDA, import Triton once with TRITON_INTERPRET=1 (then restore
    the variable). Triton decorates its own library (`tl.sum`...) when first imported, in the
    mode the variable says then: an import without it (a generated module of a test that
    runs numerics "fast" on the CPU) would leave every later interpreter test unable to run
    kernels. Generated modules still read the variable when they are imported, so tests
    without it run the op's body as before. With CUDA, Triton is imported as it is."""
    import importlib.util
    import os

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


_import_triton_for_the_interpreter()
