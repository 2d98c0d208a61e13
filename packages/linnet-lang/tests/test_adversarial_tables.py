"""Per-primitive tables (issue 39 item 4): a result type that does not follow from a step's
operands is caught by the verifier (SHAPE_RULES, E0685) instead of reaching an emitter or a
run; the one integer range analysis (BOUNDS_RULES) is what the emitters read, is never stale
for a graph whose steps were replaced, and a rank's graph keeps its own ranges."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
from linnet.lang import Graph, LinnetError, Program, lower
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.graph import Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES
from linnet.lang.ir.tiles import TILE_PRIMITIVES
from linnet.lang.ir.verify import verify
from linnet.lang.passes.bounds import bounds_for, share_bounds, value_ranges
from linnet.lang.passes.shard import shard

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def _vt(shape: tuple[int, ...], dtype: str = "f32") -> ValueType:
    return ValueType(shape, dtype)


def _one(
    op: str,
    operands: dict[str, ValueType],
    result: ValueType | None,
    attrs: dict,
    params: dict[str, ValueType] | None = None,
    states: dict[str, ValueType] | None = None,
) -> Graph:
    """A graph of one ``op`` step over entry inputs ``operands`` (``@`` names: parameters or
    states) making ``%r`` of type ``result``."""
    values = {k: v for k, v in operands.items() if k.startswith("%")}
    outputs = ["%r"] if result is not None else [k for k in operands if k.startswith("%")][:1]
    if result is not None:
        values["%r"] = result
    g = Graph(
        "run",
        "M",
        inputs=[k for k in operands if k.startswith("%")],
        outputs=outputs,
        values=values,
        parameters=dict(params or {}),
        states=dict(states or {}),
    )
    g.steps = [Step(op, list(operands), ["%r"] if result is not None else [], attrs)]
    return g


def _code(g: Graph) -> tuple[str, str]:
    with pytest.raises(LinnetError) as info:
        verify(g, "sharding")
    d = info.value.diagnostics[0]
    return d.code, d.message


# ------------------------------------------------------------------ silent wrong results
# Each graph is what a wrong pass would make (a result type that its operands do not give):
# before SHAPE_RULES the verifier passed every one of them, and the emitter wrote code whose
# tensors do not have the declared shapes.
WRONG: list[tuple[str, Graph, str]] = [
    (
        "contract result of the whole weight after a split",
        _one(
            "contract",
            {"%x": _vt((1, 4)), "@w": _vt((4, 4))},
            _vt((1, 8)),
            {"spec": "ac,bc->ab", "accumulate": "f32"},
            params={"w": _vt((4, 4))},
        ),
        "makes f32[1, 8], but its operands and attributes make f32[1, 4]",
    ),
    (
        "comparison declared float",
        _one("lt", {"%x": _vt((3,)), "%y": _vt((3,))}, _vt((3,)), {}),
        "makes f32[3], but its operands and attributes make bool[3]",
    ),
    (
        "sum declared in the operand's dtype, not its accumulator's",
        _one(
            "reduce",
            {"%x": _vt((2, 3), "bf16")},
            _vt((2,), "bf16"),
            {"kind": "sum", "axes": [1], "accumulate": "f32", "identity": 0.0},
        ),
        "make f32[2]",
    ),
    (
        "all_gather that does not grow its axis",
        _one("all_gather", {"%x": _vt((2, 3))}, _vt((2, 3)), {"axis": 1, "world": 2}),
        "make f32[2, 6]",
    ),
    (
        "take whose result drops the index's axes",
        _one(
            "take",
            {"%x": _vt((8, 4)), "%i": _vt((2, 3), "i32")},
            _vt((2, 4)),
            {"axis": 0, "bounds": "unchecked"},
        ),
        "make f32[2, 3, 4]",
    ),
    (
        "gather of two axes declared with one",
        _one(
            "gather",
            {"%x": _vt((8, 5, 4)), "%i": _vt((3,), "i32"), "%j": _vt((3,), "i32")},
            _vt((3, 5, 4)),
            {"bounds": "zero", "indexed_axes": 2},
        ),
        "make f32[3, 4]",
    ),
    (
        "convert declared in its operand's dtype",
        _one("convert", {"%x": _vt((3,))}, _vt((3,)), {"dtype": "bf16"}),
        "make bf16[3]",
    ),
    (
        "bitcast to a type of another width",
        _one("bitcast", {"%x": _vt((3,))}, _vt((3,), "f16"), {"dtype": "f16"}),
        "reads f32 bits as 'f16': f32 is 32 bits wide and f16 16",
    ),
    (
        "bitcast declared in its operand's dtype",
        _one("bitcast", {"%x": _vt((3,), "i32")}, _vt((3,), "i32"), {"dtype": "f32"}),
        "make f32[3]",
    ),
    (
        "bitcast of a bool",
        _one("bitcast", {"%x": _vt((3,), "bool")}, _vt((3,), "u8"), {"dtype": "u8"}),
        "bool has no bits to reinterpret",
    ),
    (
        "elementwise add of shapes that do not broadcast",
        _one("add", {"%x": _vt((3, 4)), "%y": _vt((3, 5))}, _vt((3, 5)), {}),
        "do not broadcast",
    ),
    (
        "reshape to another element count",
        _one("reshape", {"%x": _vt((3, 4))}, _vt((2, 5)), {"shape": [2, 5]}),
        "element counts differ",
    ),
    (
        "transpose by a perm of another rank",
        _one("transpose", {"%x": _vt((3, 4))}, _vt((4, 3, 1)), {"perm": [1, 0, 2]}),
        "permutes by [1, 0, 2]",
    ),
    (
        "broadcast of a size-3 axis to 4",
        _one("broadcast", {"%x": _vt((3, 1))}, _vt((4, 2)), {"shape": [4, 2]}),
        "broadcasts [3, 1] to [4, 2]",
    ),
    (
        "scatter of a value of the wrong shape into a cache",
        _one(
            "scatter",
            {"@cache": _vt((8, 4)), "%v": _vt((1, 3)), "%p": _vt((1,), "i32")},
            None,
            {},
            states={"cache": _vt((8, 4))},
        ),
        "places a value of shape [1, 3] at positions of shape [1, 4]",
    ),
    (
        "select on a float condition",
        _one("select", {"%c": _vt((3,)), "%x": _vt((3,)), "%y": _vt((3,))}, _vt((3,)), {}),
        "condition of dtype f32, not bool",
    ),
]


@pytest.mark.parametrize("name,graph,message", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_result_type_is_caught_where_the_pass_made_it(
    name: str, graph: Graph, message: str
) -> None:
    code, text = _code(copy.deepcopy(graph))
    assert code == "E0685", text
    assert message in text and "after sharding" in text and text.startswith("internal")


def test_a_hand_edited_json_graph_is_caught_before_an_emitter_reads_it() -> None:
    g = lower(
        Program.from_text(
            "model M { entry run(x: Tensor[3, 4; f32]) -> Tensor[4, 3; f32] {\n"
            "  let y[j, i] = x[i, j] * 2.0\n  return y } }"
        ),
        "run",
        {"x": [3, 4]},
    )
    data = g.to_json()
    # The transpose's result edited to the operand's shape: it reads back, and before
    # SHAPE_RULES it verified and was emitted with the wrong shape.
    step = next(s for s in data["steps"] if s["op"] == "transpose")
    data["values"][step["results"][0]]["shape"] = [3, 4]
    with pytest.raises(LinnetError) as info:
        verify(Graph.from_json(json.loads(json.dumps(data))))
    assert info.value.diagnostics[0].code == "E0685"


# ------------------------------------------------------------------ tracebacks
def test_a_step_missing_its_attributes_is_a_coded_error_not_a_key_error() -> None:
    # Before: verify passed, and the emitters raised KeyError('perm') (a traceback).
    for op, attrs in (
        ("transpose", {}),
        ("reshape", {"shape": "2x5"}),
        ("iota", {"axis": 0}),
        ("slice", {"starts": [0]}),
    ):
        g = _one(op, {} if op == "iota" else {"%x": _vt((3,))}, _vt((3,)), attrs)
        if op == "iota":
            g.outputs = ["%r"]
        code, text = _code(g)
        assert code == "E0685" and "has no `" in text, (op, text)


# ------------------------------------------------------------------ sound and unchanged
@functools.cache
def _toy_decode() -> Graph:
    cfg = {
        k: v
        for k, v in json.loads((LLAMA.parent / "configs" / "toy.json").read_text()).items()
        if not k.startswith("_")
    }
    return lower(Program.from_file(LLAMA), "decode", {"token": [1], "pos": [1]}, cfg)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_step_of_a_ranks_graph_has_the_type_its_rule_gives(rank: int) -> None:
    s = shard(_toy_decode(), 2, rank)
    verify(s.graph)  # shard verifies too; here the types are checked explicitly
    assert s.graph.values != s.global_graph.values  # split shapes, each checked by its rule


def test_every_row_says_whether_tiles_hold_it() -> None:
    assert {n for n, p in PRIMITIVES.items() if p.on_tiles} == TILE_PRIMITIVES & set(PRIMITIVES)
    assert "slice" not in TILE_PRIMITIVES and "take" not in TILE_PRIMITIVES


# ------------------------------------------------------------------ one range analysis
def _indexed(
    index_steps: list[Step], values: dict[str, ValueType], size: int = 8, bounds: str = "zero"
) -> Graph:
    g = Graph(
        "run",
        "M",
        inputs=["%x", "%pos"],
        outputs=["%y"],
        values={"%x": _vt((size,)), "%pos": _vt((4,), "i32"), **values, "%y": _vt((4,))},
    )
    g.steps = [*index_steps, Step("take", ["%x", "%i"], ["%y"], {"axis": 0, "bounds": bounds})]
    verify(g)
    return g


def _iota(name: str = "%n") -> Step:
    return Step("iota", [], [name], {"shape": [4], "axis": 0, "dtype": "i32"})


def _const(name: str, v: int) -> Step:
    return Step("constant", [], [name], {"value": v, "dtype": "i32"})


I32 = {k: _vt((4,) if k in ("%n", "%m", "%i") else (), "i32") for k in ("%n", "%m", "%i", "%c")}


def test_the_emitter_reads_the_one_range_analysis() -> None:
    # iota * 2 lies in 0..6: the bounds analysis follows `*`, the emitter's own copy did
    # not and wrote a clamp and a mask that could never fire.
    g = _indexed([_iota(), _const("%c", 2), Step("mul", ["%n", "%c"], ["%i"])], I32)
    assert value_ranges(g)["%i"] == (0, 6)
    text = emit_torch(g)
    assert "clamp" not in text and "torch.where" not in text


def test_a_guard_that_can_fire_is_kept() -> None:
    g = _indexed([_iota(), _const("%c", 5), Step("add", ["%n", "%c"], ["%i"])], I32)
    assert value_ranges(g)["%i"] == (5, 8)
    assert "clamp(0, 7)" in emit_torch(g)


def test_a_remainder_of_an_input_has_a_range_but_no_input_bound() -> None:
    # pos % 4 + 1 lies in 1..4 whatever pos is: inside an axis of 8 no guard, of 4 a guard;
    # the input itself stays unanalysed (no range is asked of pos), as before.
    steps = [
        _const("%c", 4),
        Step("rem", ["%pos", "%c"], ["%m"]),
        _const("%k", 1),
        Step("add", ["%m", "%k"], ["%i"]),
    ]
    values = {**I32, "%k": _vt((), "i32")}
    g = _indexed(steps, values)
    assert value_ranges(g)["%i"] == (1, 4) and "clamp" not in emit_torch(g)
    assert "clamp(0, 3)" in emit_torch(_indexed(steps, values, size=4))
    unchecked = bounds_for(_indexed(steps, values, bounds="unchecked"))
    assert "%pos" not in unchecked.inputs and "%pos" in unchecked.unanalysed


def test_a_graph_whose_steps_were_replaced_is_analysed_again() -> None:
    # Before: bounds_for kept the first analysis of the graph object: after a pass replaced
    # its steps, inputs were checked against the old graph's ranges.
    g = _indexed(
        [Step("convert", ["%pos"], ["%i"], {"dtype": "i32"})],
        {"%i": _vt((4,), "i32")},
        bounds="unchecked",
    )
    assert (bounds_for(g).inputs["%pos"].lo, bounds_for(g).inputs["%pos"].hi) == (0, 8)
    g.steps = [_const("%c", 1), Step("add", ["%pos", "%c"], ["%i"]), g.steps[-1]]
    g.values["%c"] = _vt((), "i32")
    assert (bounds_for(g).inputs["%pos"].lo, bounds_for(g).inputs["%pos"].hi) == (-1, 7)


def test_a_ranks_graph_checks_inputs_as_the_whole_but_keeps_its_own_ranges() -> None:
    whole = _indexed([_iota(), _const("%c", 2), Step("mul", ["%n", "%c"], ["%i"])], I32)
    rank = _indexed([_iota(), _const("%c", 5), Step("add", ["%n", "%c"], ["%i"])], I32)
    share_bounds(rank, whole)
    assert bounds_for(rank) is bounds_for(whole)
    assert value_ranges(rank)["%i"] == (5, 8) != value_ranges(whole)["%i"]
    assert "clamp(0, 7)" in emit_torch(rank)


def test_a_bitcast_to_an_integer_lies_in_its_type_s_range() -> None:
    # f32 bits read as i32 may be any i32: as an index of an axis of 8 it is guarded (zero
    # bounds), and an input it is computed from is unanalysed, never given a wrong range.
    steps = [
        Step("convert", ["%pos"], ["%f"], {"dtype": "f32"}),
        Step("bitcast", ["%f"], ["%i"], {"dtype": "i32"}),
    ]
    g = _indexed(steps, {"%f": _vt((4,)), "%i": _vt((4,), "i32")})
    assert value_ranges(g)["%i"] == (-(2**31), 2**31 - 1)
    assert "clamp(0, 7)" in emit_torch(g)
    values = {"%f": _vt((4,)), "%i": _vt((4,), "i32")}
    unchecked = bounds_for(_indexed(steps, values, bounds="unchecked"))
    assert "%pos" not in unchecked.inputs and "%pos" in unchecked.unanalysed
    # i8 bits read as u8 lie in 0..255: inside an axis of 256 no guard is needed.
    g = _indexed(
        [
            Step("convert", ["%pos"], ["%b"], {"dtype": "i8"}),
            Step("bitcast", ["%b"], ["%u"], {"dtype": "u8"}),
            Step("convert", ["%u"], ["%i"], {"dtype": "i32"}),
        ],
        {"%b": _vt((4,), "i8"), "%u": _vt((4,), "u8"), "%i": _vt((4,), "i32")},
        size=256,
    )
    assert value_ranges(g)["%i"] == (0, 255) and "clamp" not in emit_torch(g)
