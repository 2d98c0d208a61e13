"""The compile pipeline (issue 39 item 3): one ``numerics`` option checked once, with one
coded error at every entry point, and the stages of lowering listed once, verified after
each and shown by ``linnet graph --stages`` and ``LINNET_DEBUG=stages``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from linnet.lang import Graph, LinnetError, Program, lower
from linnet.lang.cli import main
from linnet.lang.emit.jax import emit_jax
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.verify import verify
from linnet.lang.pipeline import (
    NUMERICS,
    STAGES,
    CompileOptions,
    Numerics,
    Stage,
    run_stages,
    watch,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
TINYLM = ROOT / "examples" / "tinylm" / "tinylm.linnet"
SOURCE = "model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }\n"
PREFILL = [str(LLAMA), "--config", "toy", "--entry", "prefill", "--input", "tokens=1,4"]


def graph() -> Graph:
    return lower(Program.from_text(SOURCE), "run", {"x": [3]})


def code_of(exc: pytest.ExceptionInfo[LinnetError]) -> str:
    return exc.value.diagnostics[0].code


# ------------------------------------------------------------------ numerics, one check
def test_numerics_is_one_str_enum_and_the_old_names_are_its_values():
    # The runtimes re-export this one tuple (linnet.lang.hosting re-exported it before issue 39).
    assert NUMERICS == tuple(m.value for m in Numerics) == ("exact", "fast")
    assert Numerics.FAST == "fast" and f"{Numerics.EXACT}" == "exact"
    assert Numerics.parse(Numerics.FAST) is Numerics.FAST


@pytest.mark.parametrize("value", ["fastest", "FAST", "", None, 1, ["fast"]])
def test_a_wrong_numerics_is_E0713_not_a_traceback(value: Any):
    with pytest.raises(LinnetError) as exc:
        Numerics.parse(value)
    assert code_of(exc) == "E0713" and "'exact' or 'fast'" in str(exc.value)


# Every entry point that takes `numerics`: the same code for one wrong value. The emitters
# raised a bare ValueError and the CLI argparse's usage error (exit 2) before.
def _emit_torch(value: str) -> object:
    return emit_torch(graph(), numerics=value)


def _emit_jax(value: str) -> object:
    return emit_jax(graph(), numerics=value)


def _load_torch(value: str) -> object:
    load = pytest.importorskip("linnet.torch").load
    return load(LLAMA, config="toy", numerics=value)


def _load_jax(value: str) -> object:
    load = pytest.importorskip("linnet.jax").load
    return load(LLAMA, config="toy", numerics=value)


@pytest.mark.parametrize(
    "entry", [_emit_torch, _emit_jax, _load_torch, _load_jax], ids=lambda f: f.__name__.strip("_")
)
def test_every_entry_point_gives_E0713_for_fastest(entry):
    with pytest.raises(LinnetError) as exc:
        entry("fastest")
    assert code_of(exc) == "E0713"


@pytest.mark.parametrize("command", ["torch", "jax", "run"])
def test_the_cli_numerics_is_E0713_too(command, capsys):
    if command == "run":
        pytest.importorskip("linnet.torch")
    args = (
        [command, str(LLAMA), "--config", "toy", "--input", "token=1", "--input", "pos=1"]
        if command != "run"
        else [command, str(LLAMA), "--tokens", "1"]
    )
    assert main([*args, "--numerics", "fastest"]) == 1
    err = capsys.readouterr().err
    assert "error[E0713]" in err and "fastest" in err and "Traceback" not in err


def test_the_cli_numerics_still_takes_fast(capsys):
    args = [
        "torch",
        str(LLAMA),
        "--config",
        "toy",
        "--entry",
        "decode",
        "--input",
        "token=1",
        "--input",
        "pos=1",
        "--numerics",
        "fast",
    ]
    assert main(args) == 0
    assert "Numerics: fast." in capsys.readouterr().out


# ------------------------------------------------------------------ device and dtype, one check
# CompileOptions (issue 39 item 3): the device's name and the weights' dtype checked once, for
# both runtimes, with the runtimes' codes; garbage is a coded error, never a traceback.
GARBAGE_DEVICES = ["", "CUDA", "cuda:-1", "cuda:1:2", " cpu", "cuda:x", "cpu\n", 3.5, b"cpu"]
GARBAGE_DTYPES = ["F32", "float8", "i32", "", [], {}, 3, b"bf16"]


@pytest.mark.parametrize("device", GARBAGE_DEVICES, ids=repr)
def test_a_garbage_device_name_is_E0710(device: Any):
    with pytest.raises(LinnetError) as exc:
        CompileOptions.parse(device=device)
    assert code_of(exc) == "E0710" and "'cpu', 'cuda', 'cuda:1', 'meta'" in str(exc.value)


@pytest.mark.parametrize("dtype", GARBAGE_DTYPES, ids=repr)
def test_a_garbage_dtype_is_E0742(dtype: Any):
    with pytest.raises(LinnetError) as exc:
        CompileOptions.parse(dtype=dtype)
    assert code_of(exc) == "E0742" and "one of f64, f32, f16, bf16" in str(exc.value)


@pytest.mark.parametrize("runtime", ["torch", "jax"])
def test_both_runtimes_load_give_the_same_codes_for_garbage_options(runtime: str):
    load = pytest.importorskip(f"linnet.{runtime}").load
    # Not bytes: torch takes b"cpu" for a device (torch.device's own rule, as before).
    for device in [d for d in GARBAGE_DEVICES if not isinstance(d, bytes)]:
        with pytest.raises(LinnetError) as exc:
            load(LLAMA, config="toy", device=device)
        assert code_of(exc) == "E0710", device
    for dtype in GARBAGE_DTYPES:
        with pytest.raises(LinnetError) as exc:
            load(LLAMA, config="toy", dtype=dtype)
        assert code_of(exc) == "E0742", dtype
    model = load(LLAMA, config="toy", numerics="fast", dtype="f32")
    assert model.options == CompileOptions(
        Numerics.FAST, "cpu" if runtime == "torch" else None, "f32"
    )


# ------------------------------------------------------------------ stages, listed once
def test_the_stages_are_listed_once_in_order_and_lowering_runs_them(monkeypatch):
    seen: list[str] = []

    def mark(name: str):
        def run(g: Graph) -> Graph:
            seen.append(name)
            return g

        return run

    assert [s.name for s in STAGES] == ["hoist"]
    monkeypatch.setattr(
        "linnet.lang.pipeline.STAGES", (Stage("a", mark("a")), *STAGES, Stage("b", mark("b")))
    )
    graph()
    assert seen == ["a", "b"]


def test_a_stage_that_breaks_the_graph_is_named_by_the_verifier():
    def drop_steps(g: Graph) -> Graph:
        g.steps = []
        return g

    with pytest.raises(LinnetError) as exc:
        run_stages(graph(), (Stage("breaks", drop_steps),))
    assert code_of(exc).startswith("E092") and "after stage breaks" in str(exc.value)


def test_watch_keeps_each_stage_as_it_was(monkeypatch):
    def empty(g: Graph) -> Graph:
        g.steps = []  # in place: the watcher's copy of the stage before must not change
        return g

    with watch() as seen:
        g = lower(Program.from_text(SOURCE), "run", {"x": [3]})
    assert [name for name, _ in seen] == ["lower", "hoist"]
    assert seen[0][1].steps and seen[0][1] is not g
    monkeypatch.setattr("linnet.lang.ir.verify.ALWAYS", False)  # the stage is unverifiable
    monkeypatch.delenv("LINNET_DEBUG", raising=False)
    with watch() as seen:
        run_stages(g, (Stage("empty", empty),))
    assert seen[0][1].steps and not seen[1][1].steps


def test_graph_stages_prints_every_stage_in_order(capsys):
    assert main(["graph", *PREFILL, "--stages"]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("# stage ")]
    assert headers == ["# stage lower: Llama.prefill", "# stage hoist: Llama.prefill"]
    assert main(["graph", *PREFILL]) == 0
    final = capsys.readouterr().out.rstrip("\n")
    assert out.rstrip("\n").endswith(final)  # the last stage is what `linnet graph` prints


def test_graph_stages_json_and_grad(capsys):
    args = [
        str(TINYLM),
        "--config",
        "tiny",
        "--entry",
        "loss",
        "--input",
        "tokens=8,4",
        "--input",
        "targets=8,4",
        "--grad",
        "--stages",
        "--format",
        "json",
    ]
    assert main(["graph", *args]) == 0
    stages = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in stages] == ["lower", "hoist", "grad"]
    for s in stages:
        verify(Graph.from_json(s["graph"]))


def test_linnet_debug_stages_dumps_to_stderr(monkeypatch, capsys):
    monkeypatch.setenv("LINNET_DEBUG", "stages")
    graph()
    err = capsys.readouterr().err
    assert "# stage lower: M.run" in err and "# stage hoist: M.run" in err
    monkeypatch.setenv("LINNET_DEBUG", "1")
    graph()
    assert "# stage" not in capsys.readouterr().err  # only `stages` asks for the dump
