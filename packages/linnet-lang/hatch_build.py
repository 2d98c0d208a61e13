"""Build hook: put the repository's examples/llama into linnet-lang's wheel and sdist.

The example lives once in git, at the repository root (`examples/llama`). Building from the
repository, this hook force-includes it as `linnet/lang/examples/llama/` in the wheel and as
`src/linnet/lang/examples/llama/` in the sdist; a wheel built from that sdist then finds it
under `src/` like any package file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

EXAMPLES = ("llama",)


class ExamplesHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":  # an editable install reads the checkout's examples/
            return
        root = Path(self.root)
        for name in EXAMPLES:
            source = root.parent.parent / "examples" / name
            if not source.is_dir():  # building from an sdist: the copy is already in src/
                continue
            if self.target_name == "wheel":
                target = f"linnet/lang/examples/{name}"
            else:
                target = f"src/linnet/lang/examples/{name}"
            build_data["force_include"][str(source)] = target
