"""linnet.lang.host (issue 39, items 6-7): what every runtime shares, one module an idea, with no
command line in it, and the one export driver both runtimes' ``model.export_*`` call.

* Hosting a model (`linnet run`'s setup, ``load``'s config, the checked program) never
  imports :mod:`linnet.lang.cli`: the config files are :mod:`linnet.lang.host.config`'s.
* The export driver refuses a path it cannot write (E0800) before it asks the runtime for
  anything (no lowering, no input check), and a write that fails is E0800, not a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from linnet.lang import LinnetError, Program, lower
from linnet.lang.export import EntryExport, export_entry_onnx, export_entry_stablehlo
from linnet.lang.host.inputs import GATHER_EXAMPLE

PROGRAM = Program.from_text(GATHER_EXAMPLE)
GRAPH = lower(PROGRAM, "get", {"i": [1]}, {"V": 4})


def code_of(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.diagnostics[0].code


@pytest.mark.parametrize(
    "call",
    [
        "run_setup(argparse.Namespace(file='std.models.qwen2', weights=None, config=None, "
        "set=['S=64']))",
        "run_setup(argparse.Namespace(file=None, weights=None, config='toy', set=[]))",
        "read_config('toy', model_file('std.models.gpt2'))",
        "has_config(model_file('std.models.phi3'), 'toy')",
    ],
)
def test_hosting_a_model_imports_no_command_line(call):
    """Before issue 39, `linnet run`'s setup and ``load(config="toy")`` imported the CLI
    (linnet.lang.cli) for its config reader: the host depended on the command line."""
    code = (
        "import argparse, sys\n"
        "from linnet.lang.host.run import run_setup, has_config\n"
        "from linnet.lang.host.loading import read_config\n"
        "from linnet.lang.syntax.program import model_file\n"
        f"{call}\n"
        "assert 'linnet.lang.cli' not in sys.modules, 'the host imported the CLI'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_cli_names_the_hosts_config_reader():
    """`from linnet.lang.cli import load_config` (docs/jax.md, docs/grad.md) is still the one
    reader, not a copy."""
    from linnet.lang import cli
    from linnet.lang.host import config

    assert cli.load_config is config.load_config
    assert cli.config_path is config.config_path


def _untouchable() -> EntryExport:
    def never(*args: object) -> object:
        raise AssertionError("the driver asked the runtime before checking the path")

    return EntryExport(PROGRAM, {"V": 4}, {}, never, never, never)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["folder", "missing"])
@pytest.mark.parametrize("to", ["onnx", "stablehlo"])
def test_an_unwritable_target_is_E0800_before_the_runtime_is_asked(tmp_path, where, to):
    path = tmp_path if where == "folder" else tmp_path / "nope" / f"m.{to}"
    export = export_entry_onnx if to == "onnx" else export_entry_stablehlo
    with pytest.raises(LinnetError) as info:
        export(_untouchable(), path)
    assert code_of(info) == "E0800" and str(path) in info.value.diagnostics[0].message
    assert not (tmp_path / "nope").exists()


def test_a_write_that_fails_is_E0800_not_a_traceback(tmp_path, monkeypatch):
    import linnet.lang.export as export

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(export, "export_stablehlo", refused)
    asked: list[str] = []
    entry = EntryExport(
        PROGRAM,
        {"V": 4},
        {},
        lambda: asked.append("checked") or GRAPH,
        lambda: {"i": [1]},
        lambda i, c: GRAPH,
    )
    with pytest.raises(LinnetError) as info:
        export_entry_stablehlo(entry, tmp_path / "m.mlir")
    assert code_of(info) == "E0800" and "Permission denied" in info.value.diagnostics[0].message
    assert asked == ["checked"]  # the graph as the model runs it, once
    assert not Path(tmp_path / "m.mlir").exists()


def test_the_stablehlo_driver_returns_the_argument_order(tmp_path):
    """What the runtimes returned before the driver: the entry's inputs, then its weights."""
    from linnet.lang.emit.stablehlo import argument_order

    entry = EntryExport(
        PROGRAM, {"V": 4}, {}, lambda: GRAPH, lambda: {"i": [1]}, lambda i, c: GRAPH
    )
    order = export_entry_stablehlo(entry, tmp_path / "m.mlir")
    assert order == argument_order(GRAPH) and (tmp_path / "m.mlir").read_text().strip()
