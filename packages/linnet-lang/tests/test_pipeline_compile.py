"""Compiling an entry in one place (issue 39 item 3): the typed options a runtime compiles
with, checked once (:class:`linnet.lang.pipeline.CompileOptions`), and
:func:`linnet.lang.compiler.compile_entry`, which runs the stages of
:data:`linnet.lang.pipeline.ORDER` in order for the runtimes and the CLI (they assembled
``lower`` -> ``with_kernels`` themselves before)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from linnet.lang import LinnetError, Program
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.cli import main
from linnet.lang.compiler import Compiled, Grad, claim, compile_entry
from linnet.lang.host.config import load_config
from linnet.lang.pipeline import (
    GRAD,
    KERNELS,
    ORDER,
    SHARD,
    SPANS,
    STAGES,
    CompileOptions,
    Numerics,
    Stage,
    watch,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
TINYLM = ROOT / "examples" / "tinylm" / "tinylm.linnet"
DECODE = {"token": [1], "pos": [1]}


def llama() -> tuple[Program, dict]:
    return Program.from_file(LLAMA), load_config("toy", [], str(LLAMA))


def names(seen: list, entry: str = "decode") -> list[str]:
    """The stages ``entry``'s graph went through (recording kernels lowers their backward
    bodies, whose stages are shown too, under their own entry)."""
    return [name for name, g in seen if g.entry == entry]


# ------------------------------------------------------------------ the stages, in order
def test_order_lists_every_stage_once_lowering_first():
    assert ORDER[0] == "lower" and ORDER[1 : 1 + len(STAGES)] == tuple(s.name for s in STAGES)
    assert len(set(ORDER)) == len(ORDER) and {GRAD, SHARD, SPANS, KERNELS} <= set(ORDER)
    assert ORDER.index(GRAD) < ORDER.index(SHARD) < ORDER.index(KERNELS)


def test_compile_entry_runs_the_stages_in_order_and_kernels_last_under_fast():
    prog, cfg = llama()
    mark = Stage(SHARD, lambda g: g)  # a caller's own stage: after lowering's, before kernels
    with watch() as seen:
        out = compile_entry(
            prog, "decode", DECODE, cfg, options=CompileOptions("fast"), stages=(mark,)
        )
    assert names(seen) == ["lower", "hoist", SHARD, KERNELS]
    assert [n for n in ORDER if n in names(seen)] == names(seen)
    # The graph a runtime caches launches nothing; what the emitters take holds the kernels.
    assert out.graph.kernels == {} and out.emitted.kernels and out.emitted is not out.graph
    assert out.emitted.steps == out.graph.steps


def test_compile_entry_is_what_the_callers_assembled():
    """What the runtimes did by hand (lower, then with_kernels): the same graphs."""
    prog, cfg = llama()
    from linnet.lang import lower

    for numerics in ("exact", "fast"):
        out = compile_entry(prog, "decode", DECODE, cfg, options=CompileOptions(numerics))
        by_hand = lower(prog, "decode", DECODE, cfg)
        assert out.graph.dumps() == by_hand.dumps()
        assert out.emitted.dumps() == with_kernels(by_hand, prog, numerics).dumps()


def test_exact_numerics_or_kernels_off_record_no_kernel():
    prog, cfg = llama()
    with watch() as seen:
        exact = compile_entry(prog, "decode", DECODE, cfg)
        off = compile_entry(
            prog, "decode", DECODE, cfg, options=CompileOptions("fast"), kernels=False
        )
    assert KERNELS not in names(seen)
    assert exact.emitted is exact.graph and off.emitted is off.graph and not off.graph.kernels


def test_grad_is_a_stage_of_compile_entry():
    prog = Program.from_file(TINYLM)
    cfg = load_config("tiny", [], str(TINYLM))
    inputs = {"tokens": [8, 4], "targets": [8, 4]}
    with watch() as seen:
        out = compile_entry(prog, "loss", inputs, cfg, grad=Grad())
    assert names(seen, "loss") == ["lower", "hoist", GRAD]
    assert any(o.startswith("%d_") for o in out.graph.outputs)


def test_check_bounds_is_E0782_for_a_prompt_past_the_cache():
    prog, cfg = llama()
    long = {"tokens": [1, int(cfg["S"]) + 1]}
    compile_entry(prog, "prefill", long, cfg)  # not asked: lowering alone allows it
    with pytest.raises(LinnetError) as exc:
        compile_entry(prog, "prefill", long, cfg, check_bounds=True)
    assert exc.value.diagnostics[0].code == "E0782"


CLAUSE = """
pub op f<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
    let y[n] = x[n] * 3.0
    return y
} grad(dy) {
    let dx[n] = dy[n] * 3.0
    return dx
}
model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return f(x) }
}
"""


def test_clauses_are_recorded_only_where_the_program_has_one():
    prog, cfg = llama()
    assert compile_entry(prog, "decode", DECODE, cfg, clauses=True).clauses is None
    out = compile_entry(Program.from_text(CLAUSE), "run", {"x": [4]}, {"N": 4}, clauses=True)
    assert isinstance(out, Compiled) and out.clauses is not None and len(out.clauses) == 1
    assert compile_entry(Program.from_text(CLAUSE), "run", {"x": [4]}, {"N": 4}).clauses is None


def test_claim_is_the_spans_stage_verified_and_shown(monkeypatch):
    """The plans' stage: claim_spans (23 s the first time in a process, for std's span ops:
    stood in for here; tests/test_spans.py runs the real one) as the stage ``spans``."""
    prog, cfg = llama()
    graph = compile_entry(prog, "decode", DECODE, cfg).graph
    asked: list = []

    def claim_spans(g, program):
        asked.append(program)
        return copy.copy(g)

    monkeypatch.setattr("linnet.lang.compiler.claim_spans", claim_spans)
    with watch() as seen:
        claimed = claim(graph, prog)
    assert names(seen) == [SPANS] and asked == [prog] and claimed is not graph

    def overlapping(g):  # a claim that breaks the graph is named by the verifier
        out = copy.copy(g)
        out.calls = [*g.calls, dataclasses.replace(g.calls[0], start=-1)]
        return out

    monkeypatch.setattr("linnet.lang.compiler.claim_spans", lambda g, p: overlapping(g))
    with pytest.raises(LinnetError) as exc:
        claim(graph, prog)
    assert exc.value.diagnostics[0].code.startswith("E092") and "stage spans" in str(exc.value)


def test_linnet_torch_fast_shows_the_kernels_stage(monkeypatch, capsys):
    """Before issue 39 item 3 the CLI recorded the kernels itself, outside the pipeline:
    ``LINNET_DEBUG=stages`` showed no stage ``kernels`` and no verifier saw it."""
    monkeypatch.setenv("LINNET_DEBUG", "stages")
    args = ["torch", str(LLAMA), "--config", "toy", "--entry", "decode", "--numerics", "fast"]
    assert main([*args, "--input", "token=1", "--input", "pos=1"]) == 0
    err = capsys.readouterr().err
    headers = [line for line in err.splitlines() if line.endswith(": Llama.decode")]
    assert headers == [f"# stage {n}: Llama.decode" for n in ("lower", "hoist", KERNELS)]


def test_linnet_graph_stages_with_grad_follow_the_order(capsys):
    args = [str(TINYLM), "--config", "tiny", "--entry", "loss", "--input", "tokens=8,4"]
    args += ["--input", "targets=8,4", "--grad", "--stages", "--format", "json"]
    assert main(["graph", *args]) == 0
    shown = [s["stage"] for s in json.loads(capsys.readouterr().out)]
    assert shown == [n for n in ORDER if n in shown] == ["lower", "hoist", GRAD]


# ------------------------------------------------------------------ the options, checked once
def test_compile_options_are_typed_and_frozen():
    o = CompileOptions.parse("fast", "cuda:1", "bf16")
    assert (o.numerics, o.device, o.dtype) == (Numerics.FAST, "cuda:1", "bf16")
    assert CompileOptions() == CompileOptions("exact", None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.numerics = Numerics.EXACT  # type: ignore[misc]
    assert o.on("cpu") == CompileOptions("fast", "cpu", "bf16")


def test_every_way_of_making_options_checks_them():
    o = CompileOptions()
    for make, code in [
        (lambda: CompileOptions("quick"), "E0713"),
        (lambda: CompileOptions(device="cuda:x"), "E0710"),
        (lambda: CompileOptions(dtype="i32"), "E0742"),
        (lambda: dataclasses.replace(o, device="CUDA"), "E0710"),
        (lambda: o.on("cuda 1"), "E0710"),
    ]:
        with pytest.raises(LinnetError) as exc:
            make()
        assert exc.value.diagnostics[0].code == code


def test_a_runtimes_dtype_objects_go_through_its_namer():
    class Bf16:  # a framework's dtype object: the namer knows it, the options do not
        pass

    def namer(v: object) -> str | None:
        return "bf16" if isinstance(v, Bf16) else None

    assert CompileOptions.parse(dtype=Bf16(), dtype_name=namer).dtype == "bf16"
    with pytest.raises(LinnetError) as exc:
        CompileOptions.parse(dtype=Bf16())
    assert exc.value.diagnostics[0].code == "E0742"
    with pytest.raises(LinnetError) as exc:
        CompileOptions.parse(dtype=object(), dtype_name=namer, dtype_example="x.bfloat16")
    assert "e.g. dtype=x.bfloat16 or dtype='bf16' (one of f64, f32, f16, bf16)" in str(exc.value)
