"""One step-set analysis (issue 13 item 3): linnet-plan's regions and linnet-lang's slices
describe the same steps the same way, with one fingerprint for "same computation", and
read repeated-block iterations from ``Call.iteration``, not from digits in paths."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.backends import Region, RegionError, region_kind
from linnet.lang import Graph, check_file, lower
from linnet.lang.ir import stepsets
from linnet.lang.ir.graph import Call, Step, ValueType
from linnet.lang.ir.stepsets import StepSetError, block_prefix, fingerprint, step_set
from linnet.lang.passes import slices
from linnet.lang.passes.slices import cut, slice_range, slice_steps

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
ENTRIES = {"decode": {"token": [1], "pos": [1]}, "prefill": {"tokens": [1, 8]}}


@cache
def graph(entry: str) -> Graph:
    config = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    return lower(check_file(LLAMA), entry, ENTRIES[entry], config, check=False)


def same(region: Region, sl: slices.Slice) -> None:
    assert region.kind == sl.kind
    assert list(region.inputs) == sl.inputs and list(region.outputs) == sl.outputs
    assert list(region.parameters) == sl.parameters and list(region.states) == sl.states
    assert list(region.steps) == sl.steps


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_call_is_described_alike_as_a_region_and_as_a_slice(entry):
    g = graph(entry)
    calls = [c for c in g.calls if c.start < c.stop]
    assert len(calls) > 50
    for c in calls:
        region = Region.of(g, c.start, c.stop, c.index)
        same(region, slice_range(g, c.start, c.stop, "s"))
        assert region_kind(region) == region.kind


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_steps_apart_are_described_alike(entry):
    # Each layer's q, k and v projections: steps apart that a backend runs together.
    g = graph(entry)
    for layer in (c for c in g.calls if c.iteration is not None):
        qkv = [
            c
            for c in g.semantic_calls("std.nn.linear::linear")
            if c.path.startswith(layer.path + ".self_attn.")
        ][:3]
        steps = sorted(i for c in qkv for i in range(c.start, c.stop))
        same(Region.of_steps(g, steps, qkv[0].index), slice_steps(g, steps, "qkv"))


def test_every_layer_has_one_fingerprint_as_region_and_as_slice():
    g = graph("decode")
    layers = [sl for sl in cut(g) if sl.prefix]
    assert len(layers) == sum(1 for c in g.calls if c.iteration is not None) >= 2
    assert len({sl.kind for sl in layers}) == 1
    regions = [Region.of(g, sl.start, sl.stop) for sl in layers]
    assert {r.kind for r in regions} == {layers[0].kind}
    # The prefix comes from the layer's Call.iteration: model.layers.N.
    assert [sl.prefix for sl in layers] == [f"model.layers.{i}." for i in range(len(layers))]
    assert [slice_steps(g, sl.steps, "x").prefix for sl in layers] == [sl.prefix for sl in layers]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_range_is_described_alike(data):
    g = graph(data.draw(st.sampled_from(sorted(ENTRIES))))
    start = data.draw(st.integers(0, len(g.steps) - 1))
    stop = data.draw(st.integers(start + 1, min(len(g.steps), start + 80)))
    same(Region.of(g, start, stop), slice_range(g, start, stop, "s"))


def test_the_fingerprint_abstracts_names_and_sees_the_computation():
    def tiny(op: str = "mul", shape: tuple[int, ...] = (2,), names: str = "xyz") -> Graph:
        x, y, z = (f"%{n}" for n in names)
        g = Graph(
            "e",
            "m",
            inputs=[x],
            outputs=[z],
            values={
                x: ValueType(shape, "f32"),
                y: ValueType(shape, "f32"),
                z: ValueType(shape, "f32"),
            },
            parameters={f"blocks.{names}.w": ValueType(shape, "f32")},
        )
        g.steps = [Step(op, [x, f"@blocks.{names}.w"], [y]), Step("exp", [y], [z])]
        return g

    def fp(g: Graph) -> str:
        return fingerprint(g, step_set(g, range(len(g.steps))))

    assert fp(tiny()) == fp(tiny(names="abc"))  # other value names and parameter paths
    assert fp(tiny()) != fp(tiny(op="add"))
    assert fp(tiny()) != fp(tiny(shape=(3,)))
    g = tiny()
    g.steps[1].attributes = {"note": 1}
    assert fp(g) != fp(tiny())


def test_a_prefix_comes_from_iterations_not_from_digits():
    g = Graph(
        "e",
        "m",
        parameters={
            "model.layers.3.w": ValueType((1,), "f32"),
            "model.layers.3.b": ValueType((1,), "f32"),
        },
    )
    paths = list(g.parameters)
    assert block_prefix(g, paths) == ""  # digits in a path alone mean nothing
    g.calls.append(
        Call(
            "m::Layer.forward",
            "fn",
            0,
            0,
            1,
            "model.layers.3",
            iteration=3,
            repeated="model.layers",
        )
    )
    assert block_prefix(g, paths) == "model.layers.3."
    assert block_prefix(g, [*paths, "lm_head.weight"]) == ""
    assert slices.default_cuts(Graph("e", "m")) == [(0, 0, "glue_0", "")]


def test_a_region_error_is_a_step_set_error():
    g = graph("decode")
    made = g.producers()
    j = next(
        j for j, s in enumerate(g.steps) if any(made.get(o, -1) == j - 1 > 0 for o in s.operands)
    )
    with pytest.raises(StepSetError, match=f"step {j} reads .* made by step {j - 1}"):
        stepsets.check_runs_at_first(g, [0, j])
    with pytest.raises(RegionError, match=f"step {j} reads"):
        Region.of_steps(g, [0, j])
    assert issubclass(RegionError, StepSetError) and issubclass(RegionError, ValueError)
