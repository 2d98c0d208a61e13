"""The graph verifier (ir/verify.py): each invariant broken by hand is caught with its code,
and every Llama entry verifies (the conftest also verifies every graph lowered in tests)."""

import copy
import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, check_file, lower
from linnet.lang.diagnostics.codes import EXPLANATIONS
from linnet.lang.ir import verify as verify_module
from linnet.lang.ir.graph import Call, Graph, Step, ValueType
from linnet.lang.ir.verify import verify
from linnet.lang.pipeline import STAGES, Stage, run_stages

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
ENTRIES = [("decode", {"token": [1], "pos": [1]}), ("prefill", {"tokens": [1, 8]})]


def config(name: str) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@pytest.fixture(scope="module")
def program() -> Program:
    return check_file(LLAMA)


@pytest.fixture(scope="module")
def toy(program) -> Graph:
    return lower(program, "decode", {"token": [1], "pos": [1]}, config("toy"))


@pytest.mark.parametrize("name", ["toy", "llama-3.2-1b", "llama-3-8b"])
@pytest.mark.parametrize("entry,inputs", ENTRIES)
def test_llama_entries_verify(program, name, entry, inputs):
    g = lower(program, entry, inputs, config(name), check=False)
    verify(g)
    verify(Graph.loads(g.dumps()))  # and the graph read back from its JSON


def _first(graph: Graph, op: str) -> int:
    return next(i for i, s in enumerate(graph.steps) if s.op == op)


def _later_value(g: Graph) -> None:
    # The first exp reads a value that a later step makes.
    i = _first(g, "exp")
    g.steps[i].operands[0] = (
        g.steps[-1].results[0]
        if g.steps[-1].results
        else next(s.results[0] for s in reversed(g.steps) if s.results)
    )


def _undefined_output(g: Graph) -> None:
    g.outputs[0] = "%nowhere"
    g.values["%nowhere"] = ValueType((1,), "f32")


def _made_twice(g: Graph) -> None:
    i = _first(g, "exp")
    g.steps[i + 1].results = list(g.steps[i].results)


def _input_made(g: Graph) -> None:
    i = _first(g, "exp")
    g.steps[i].results = [g.inputs[0]]


def _span_outside(g: Graph) -> None:
    g.calls[1].stop = len(g.steps) + 3


def _span_overlaps(g: Graph) -> None:
    layer = next(c for c in g.calls if c.iteration == 0)
    g.calls.append(Call("m::straddle", "fn", layer.stop - 1, layer.stop + 1, 10_000, depth=1))


def _value_scatter(g: Graph) -> None:
    i = _first(g, "scatter")
    g.steps[i].operands[0] = g.steps[i].operands[1]


def _parameter_scatter(g: Graph) -> None:
    i = _first(g, "scatter")
    g.steps[i].operands[0] = "@" + next(iter(g.parameters))


def _state_result(g: Graph) -> None:
    i = _first(g, "exp")
    g.steps[i].results = ["@" + next(iter(g.states))]


def _unknown_op(g: Graph) -> None:
    g.steps[_first(g, "exp")].op = "expm1"


def _arity(g: Graph) -> None:
    i = _first(g, "add")
    g.steps[i].operands.append(g.steps[i].operands[0])


def _scatter_too_few(g: Graph) -> None:
    i = _first(g, "scatter")
    g.steps[i].operands = g.steps[i].operands[:1]


def _scatter_result(g: Graph) -> None:
    i = _first(g, "scatter")
    g.steps[i].results = ["%extra"]
    g.values["%extra"] = ValueType((1,), "f32")


def _no_result(g: Graph) -> None:
    g.steps[_first(g, "mul")].results = []


def _untyped_value(g: Graph) -> None:
    del g.values[g.steps[_first(g, "exp")].results[0]]


def _bad_dtype(g: Graph) -> None:
    name = next(iter(g.parameters))
    g.parameters[name] = ValueType(g.parameters[name].shape, "f8")


def _negative_size(g: Graph) -> None:
    name = next(iter(g.states))
    g.states[name] = ValueType((-1, *g.states[name].shape[1:]), g.states[name].dtype)


def _unknown_path(g: Graph) -> None:
    i = next(i for i, s in enumerate(g.steps) if any(o.startswith("@") for o in s.operands))
    k = next(k for k, o in enumerate(g.steps[i].operands) if o.startswith("@"))
    g.steps[i].operands[k] = "@model.nowhere.weight"


def _both(g: Graph) -> None:
    name = next(iter(g.states))
    g.parameters[name] = g.states[name]


BREAKS: list[tuple[Callable[[Graph], None], str, str]] = [
    (_later_value, "E0920", "which is not defined before it (step"),
    (_undefined_output, "E0920", "entry output %nowhere"),
    (_made_twice, "E0921", "already made by step"),
    (_input_made, "E0921", "already an entry input"),
    (_span_outside, "E0922", "outside the graph's"),
    (_span_overlaps, "E0922", "without nesting"),
    (_value_scatter, "E0923", "a value: a scatter writes a @state"),
    (_parameter_scatter, "E0923", "a parameter: only states are written"),
    (_state_result, "E0923", "only a scatter writes"),
    (_unknown_op, "E0924", "(expm1) is not a primitive"),
    (_arity, "E0925", "has 3 operands; add takes 2"),
    (_scatter_too_few, "E0925", "takes at least 2"),
    (_scatter_result, "E0925", "makes 1 results; scatter makes 0"),
    (_no_result, "E0925", "makes 0 results; mul makes 1"),
    (_untyped_value, "E0926", "has no type in graph.values"),
    (_bad_dtype, "E0926", "dtype 'f8'"),
    (_negative_size, "E0926", "not a tuple of sizes >= 0"),
    (_unknown_path, "E0926", "neither a parameter nor a state"),
    (_both, "E0926", "both a parameter and a state"),
]


@pytest.mark.parametrize("breaks,code,words", BREAKS, ids=[b[0].__name__ for b in BREAKS])
def test_a_broken_graph_is_caught_with_its_code(toy, breaks, code, words):
    g = copy.deepcopy(toy)
    breaks(g)
    with pytest.raises(LinnetError) as info:
        verify(g, "pass hoist_invariants")
    (d,) = info.value.diagnostics
    assert d.code == code and words in d.message, d.message
    assert d.message.startswith("internal error: ")
    assert "after pass hoist_invariants" in d.message and "`Llama.decode`" in d.message
    assert "bug in linnet-lang" in (d.help or "")


def test_the_verifier_codes_are_explained():
    for code in [f"E092{i}" for i in range(7)]:
        assert code in EXPLANATIONS


def test_a_pass_that_breaks_the_graph_is_caught_after_it(toy, monkeypatch):
    def drop_first_step(graph: Graph) -> Graph:
        graph.steps = graph.steps[1:]
        return graph

    monkeypatch.setattr(
        "linnet.lang.pipeline.STAGES", (*STAGES, Stage("drop_first_step", drop_first_step))
    )
    with pytest.raises(LinnetError) as info:
        run_stages(copy.deepcopy(toy))
    assert "after stage drop_first_step" in info.value.diagnostics[0].message


def test_lowering_verifies_under_linnet_debug(program, monkeypatch):
    calls: list[str] = []
    real = verify_module.verify
    monkeypatch.setattr(verify_module, "ALWAYS", False)
    monkeypatch.setattr(
        verify_module, "verify", lambda g, stage="": (calls.append(stage), real(g, stage))
    )
    monkeypatch.delenv("LINNET_DEBUG", raising=False)
    lower(program, "decode", {"token": [1], "pos": [1]}, config("toy"))
    assert calls == []  # off by default: lowering stays as fast as it was
    monkeypatch.setenv("LINNET_DEBUG", "1")
    lower(program, "decode", {"token": [1], "pos": [1]}, config("toy"))
    assert calls == ["lowering"] + [f"stage {s.name}" for s in STAGES]


def test_an_empty_graph_and_empty_calls_verify():
    g = Graph("e", "m", inputs=["%x"], outputs=["%x"], values={"%x": ValueType((), "f32")})
    g.calls = [Call("m::e", "entry", 0, 0, 0), Call("m::f", "fn", 0, 0, 1, depth=1)]
    verify(g)
    g.steps = [Step("neg", ["%x"], ["%y"])]
    g.values["%y"] = ValueType((), "f32")
    g.calls = [
        Call("m::e", "entry", 0, 1, 0),
        Call("m::f", "fn", 0, 1, 1, depth=1),
        Call("m::g", "fn", 1, 1, 2, depth=1),
    ]
    verify(g)


def _garbage_operand(g: Graph) -> None:
    g.steps[_first(g, "exp")].operands[0] = "x"


def _garbage_result(g: Graph) -> None:
    g.steps[_first(g, "exp")].results = [3]  # type: ignore[list-item]


@pytest.mark.parametrize("breaks", [_garbage_operand, _garbage_result])
def test_names_that_are_neither_values_nor_paths_are_caught(toy, breaks):
    g = copy.deepcopy(toy)
    breaks(g)
    with pytest.raises(LinnetError) as info:
        verify(g)
    assert info.value.diagnostics[0].code == "E0926"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_rewirings_are_caught_or_sound(data):
    """Point one operand of one step at any value of the graph, or rename one result: the
    verifier raises one of its codes, or the graph still reads every value after it is
    made once (checked here independently)."""
    g = copy.deepcopy(_toy_graph())
    i = data.draw(st.integers(0, len(g.steps) - 1))
    step = g.steps[i]
    names = sorted(g.values)
    if step.operands and data.draw(st.booleans()):
        k = data.draw(st.integers(0, len(step.operands) - 1))
        step.operands[k] = data.draw(st.sampled_from(names))
    elif step.results:
        step.results[0] = data.draw(st.sampled_from(names))
    try:
        verify(g)
    except LinnetError as err:
        (d,) = err.diagnostics
        # E0685: a result type its operands do not give (the rewired operand's shape).
        assert d.code in {f"E092{n}" for n in range(7)} | {"E0685"} and d.message.startswith(
            "internal"
        )
        return
    made = set(g.inputs)
    for s in g.steps:
        assert all(o.startswith("@") or o in made for o in s.operands)
        assert not made & set(s.results)
        made.update(s.results)


@functools.cache
def _toy_graph() -> Graph:
    return lower(check_file(LLAMA), "decode", {"token": [1], "pos": [1]}, config("toy"))
