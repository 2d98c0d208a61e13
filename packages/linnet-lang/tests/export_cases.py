"""Shared by test_emit_onnx.py and test_emit_stablehlo.py: one-step graphs covering every
primitive (each exporter is run on them and compared with tests/reference.py), and the toy
Llama's graphs, weights and a greedy decode loop (a test helper; not shipped)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from linnet.lang import Program, lower
from linnet.lang.ir.elementwise import SPELLINGS
from linnet.lang.ir.graph import Call, Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES
from reference import run_graph

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"

_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.bool_): "bool",
    np.dtype(np.float16): "f16",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint8): "u8",
}


def one_step(
    op: str,
    args: list[np.ndarray],
    attrs: dict | None = None,
    out: tuple[tuple[int, ...], str] | None = None,
) -> Graph:
    """A graph of one step whose inputs are ``args`` (named a0, a1, ...)."""
    g = Graph("run", "M")
    for i, a in enumerate(args):
        g.inputs.append(f"%a{i}")
        g.values[f"%a{i}"] = ValueType(a.shape, _NAMES[a.dtype])
    g.steps.append(
        Step(
            op, [f"%a{i}" for i in range(len(args))], ["%y"], dict(attrs or {}), loc="case.linnet:1"
        )
    )
    if out is None:
        out = (np.broadcast_shapes(*(a.shape for a in args)), _NAMES[args[0].dtype])
    g.values["%y"] = ValueType(tuple(out[0]), out[1])
    g.outputs.append("%y")
    return g


def scatter_graph() -> Graph:
    """state[i] = v, then the sum of the state: one write and one read of the new value."""
    g = Graph("run", "M", inputs=["%v", "%i"])
    g.values["%v"] = ValueType((2, 3), "f32")
    g.values["%i"] = ValueType((2,), "i32")
    g.states["s"] = ValueType((4, 3), "f32")
    g.steps.append(Step("scatter", ["@s", "%v", "%i"], [], {"indexed_axes": 1, "path": "s"}))
    g.steps.append(
        Step(
            "reduce",
            ["@s"],
            ["%y"],
            {"kind": "sum", "axes": [1], "accumulate": "f32", "identity": 0.0},
        )
    )
    g.values["%y"] = ValueType((4,), "f32")
    g.outputs.append("%y")
    return g


F = np.array([[-1.5, 0.25, 2.0], [3.0, -0.5, 0.75]], dtype=np.float32)
P = np.abs(F) + 0.5  # positive, for log and the roots
ROW = np.array([[2.0, -1.0, 0.5]], dtype=np.float32)
IX = np.array([7, -7, 7, -7, 6], dtype=np.int32)
IY = np.array([2, 2, -2, -2, 3], dtype=np.int32)
B = np.array([[True, False, True], [False, False, True]])
B2 = np.array([[True, True, False], [False, True, True]])
X34 = np.arange(12, dtype=np.float32).reshape(3, 4)
EDGE = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7, 300.0], np.float32)


def _red(kind: str) -> dict:
    ident = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[kind]
    return {"kind": kind, "axes": [1], "accumulate": "f32", "identity": ident}


# (case id, graph, inputs by name, states by path); every primitive appears at least once.
def cases(
    without: frozenset[str] = frozenset(),
) -> list[tuple[str, Graph, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Every case, but those with a step of a primitive in ``without`` (an exporter's
    ``EXPECTED_MISSING``: tested for its error instead)."""
    every = _cases()
    return [c for c in every if not any(s.op in without for s in c[1].steps)]


def _cases() -> list[tuple[str, Graph, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    out: list[tuple[str, Graph, dict, dict]] = []

    def add(
        name: str,
        op: str,
        args: list[np.ndarray],
        attrs: dict | None = None,
        shape: tuple[tuple[int, ...], str] | None = None,
    ) -> None:
        out.append(
            (name, one_step(op, args, attrs, shape), {f"a{i}": a for i, a in enumerate(args)}, {})
        )

    for op in ("neg", "exp", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "floor"):
        add(op, op, [F])
    for op in ("log", "sqrt", "rsqrt"):
        add(op, op, [P])
    add("neg-int", "neg", [IX])
    add("abs-int", "abs", [IX])
    add("not", "not", [B])
    for op in ("add", "sub", "mul", "div", "rem", "maximum", "minimum"):
        add(op, op, [F, ROW])
    add("pow", "pow", [P, ROW])
    add("div-int", "div", [IX, IY])
    add("rem-int", "rem", [IX, IY])
    add(
        "rem-signs",
        "rem",
        [
            np.array([7.5, -7.5, 7.5, -7.5], np.float32),
            np.array([2.0, 2.0, -2.0, -2.0], np.float32),
        ],
    )
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        add(op, op, [F, np.array([[0.25, 0.25, 3.0]], np.float32)], shape=((2, 3), "bool"))
    add("and", "and", [B, B2])
    add("or", "or", [B, B2])
    add("select", "select", [B, F, F * 10], shape=((2, 3), "f32"))
    add("convert-f32-i32", "convert", [F * 3], {"dtype": "i32"}, ((2, 3), "i32"))
    add("convert-i32-f32", "convert", [IX], {"dtype": "f32"}, ((5,), "f32"))
    add("convert-f32-bool", "convert", [F * (F > 0)], {"dtype": "bool"}, ((2, 3), "bool"))
    # The bits read as another type of their width: a NaN's payload, -0.0 and a subnormal
    # keep theirs (ONNX has no bitcast: E0930).
    words = np.array([0x3F800000, -1, 1, 0x7FC00001, -(2**31)], np.int32)
    add("bitcast-i32-f32", "bitcast", [words], {"dtype": "f32"}, ((5,), "f32"))
    add("bitcast-f32-i32", "bitcast", [F], {"dtype": "i32"}, ((2, 3), "i32"))
    half = np.array([1.0, -2.5, 65504.0, -np.inf, 6e-8], np.float16)
    add("bitcast-f16-i16", "bitcast", [half], {"dtype": "i16"}, ((5,), "i16"))
    add("bitcast-i16-f16", "bitcast", [half.view(np.int16)], {"dtype": "f16"}, ((5,), "f16"))
    add(
        "bitcast-u8-i8",
        "bitcast",
        [np.array([0, 127, 128, 255], np.uint8)],
        {"dtype": "i8"},
        ((4,), "i8"),
    )
    # Edge values (linnet.lang.ir.edges, issue 38): every exporter gives the runtimes' value.
    add("div-int-by-zero", "div", [IX, np.array([0, 0, 2, -1, 0], np.int32)])
    add("rem-int-by-zero", "rem", [IX, np.array([0, 0, 2, -1, 0], np.int32)])
    add(
        "div-int-min-by-minus-one",
        "div",
        [np.array([-(2**31), 7], np.int32), np.array([-1, -1], np.int32)],
    )
    add(
        "rem-float-by-zero-and-inf",
        "rem",
        [
            np.array([1.0, -1.0, 5.5, -5.5], np.float32),
            np.array([0.0, 0.0, np.inf, np.inf], np.float32),
        ],
    )
    for dt in ("i32", "i8", "u8"):
        add(f"convert-f32-{dt}-saturates", "convert", [EDGE], {"dtype": dt}, ((8,), dt))
    add("floor-tiny-negatives", "floor", [np.array([-1e-45, -1e-30, -0.0, 1e-45], np.float32)])
    for kind in ("max", "min"):
        add(
            f"reduce-{kind}-nan",
            "reduce",
            [F * np.array([[1, np.nan, 1], [1, 1, 1]], np.float32)],
            _red(kind),
            ((2,), "f32"),
        )
        add(f"{kind}imum-nan", f"{kind}imum", [F, np.full((1, 3), np.nan, np.float32)])
    add("constant", "constant", [], {"value": -np.inf, "dtype": "f32"}, ((), "f32"))
    add("constant-int", "constant", [], {"value": 7, "dtype": "i32"}, ((), "i32"))
    add("iota", "iota", [], {"shape": [2, 3], "axis": 1, "dtype": "i32"}, ((2, 3), "i32"))
    add("reshape", "reshape", [F], {"shape": [3, 2]}, ((3, 2), "f32"))
    add("transpose", "transpose", [F], {"perm": [1, 0]}, ((3, 2), "f32"))
    add("broadcast", "broadcast", [ROW], {"shape": [4, 3]}, ((4, 3), "f32"))
    add("slice", "slice", [X34], {"starts": [1, 0], "limits": [3, 4]}, ((2, 4), "f32"))
    add(
        "slice-inner",
        "slice",
        [np.arange(24, dtype=np.float32).reshape(2, 3, 4)],
        {"starts": [0, 1, 2], "limits": [2, 3, 4]},
        ((2, 2, 2), "f32"),
    )
    add("slice-empty", "slice", [X34], {"starts": [2, 0], "limits": [2, 4]}, ((0, 4), "f32"))
    for kind in ("sum", "mean", "max", "min", "prod"):
        add(f"reduce-{kind}", "reduce", [F], _red(kind), ((2,), "f32"))
    add(
        "contract-matmul",
        "contract",
        [F, X34[:, :3].T.copy()[:3]],
        {"spec": "ab,bc->ac", "accumulate": "f32"},
        ((2, 3), "f32"),
    )
    batched = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10
    add(
        "contract-batched",
        "contract",
        [batched, batched],
        {"spec": "abc,abd->acd", "accumulate": "f32"},
        ((2, 4, 4), "f32"),
    )
    add(
        "contract-summed",
        "contract",
        [batched, X34],
        {"spec": "abc,dc->da", "accumulate": "f32"},
        ((3, 2), "f32"),
    )
    idx = np.array([[0, 5], [-1, 2]], dtype=np.int32)
    add("take-zero", "take", [X34, idx], {"axis": 1, "bounds": "zero"}, ((3, 2, 2), "f32"))
    add(
        "take-unchecked",
        "take",
        [X34, np.array([2, 0], np.int32)],
        {"axis": 0, "bounds": "unchecked"},
        ((2, 4), "f32"),
    )
    add(
        "take-scalar",
        "take",
        [X34, np.array(3, np.int32)],
        {"axis": 1, "bounds": "zero"},
        ((3,), "f32"),
    )
    rows = np.array([[0], [2], [3]], dtype=np.int32)
    cols = np.array([[1, 3]], dtype=np.int32)
    add(
        "gather-zero",
        "gather",
        [X34, rows, cols],
        {"indexed_axes": 2, "bounds": "zero"},
        ((3, 2), "f32"),
    )
    add(
        "gather-unchecked",
        "gather",
        [X34, rows[:2]],
        {"indexed_axes": 1, "bounds": "unchecked"},
        ((2, 1, 4), "f32"),
    )
    # scatter_add: coinciding positions add up; under bounds zero a position outside either
    # axis (-1, 3 on axis 0; -1 on axis 1) adds nothing.
    add(
        "scatter_add-zero",
        "scatter_add",
        [
            X34,
            np.arange(1, 21, dtype=np.float32).reshape(5, 4),
            np.array([1, 2, -1, 1, 3], np.int32),
        ],
        {"indexed_axes": 1, "bounds": "zero"},
        ((3, 4), "f32"),
    )
    add(
        "scatter_add-zero-2d",
        "scatter_add",
        [
            X34,
            np.arange(1, 13, dtype=np.float32).reshape(4, 3),
            np.array([[0], [2], [0], [3]], np.int32),
            np.array([[1, -1, 1]], np.int32),
        ],
        {"indexed_axes": 2, "bounds": "zero"},
        ((3, 4), "f32"),
    )
    add(
        "scatter_add-unchecked",
        "scatter_add",
        [X34, np.arange(1, 13, dtype=np.float32).reshape(3, 4), np.array([2, 0, 2], np.int32)],
        {"indexed_axes": 1, "bounds": "unchecked"},
        ((3, 4), "f32"),
    )
    add(
        "scatter_add-whole",
        "scatter_add",
        [X34, X34 * 2],
        {"indexed_axes": 0, "bounds": "zero"},
        ((3, 4), "f32"),
    )
    scatter_inputs = {
        "v": np.arange(6, dtype=np.float32).reshape(2, 3) + 1,
        "i": np.array([3, 1], np.int32),
    }
    out.append(
        ("scatter", scatter_graph(), scatter_inputs, {"s": np.full((4, 3), 0.5, np.float32)})
    )
    # A std call that writes a state and makes the value read after it: the state leaves
    # the function (an ONNX function output, a composite result) with the value.
    g = scatter_graph()
    g.calls.append(Call("std.test::write_and_sum", "op", 0, 2, 0, "layer"))
    out.append(("call-writing-a-state", g, scatter_inputs, {"s": np.full((4, 3), 0.5, np.float32)}))
    # A std call with two results read after it, and one nested inside another.
    g = Graph("run", "M", inputs=["%x"], outputs=["%e", "%n", "%m"])
    for name in ("%x", "%e", "%n", "%m"):
        g.values[name] = ValueType((2, 3), "f32")
    g.steps += [
        Step("exp", ["%x"], ["%e"], loc="case.linnet:2"),
        Step("neg", ["%e"], ["%n"], loc="case.linnet:3"),
        Step("mul", ["%n", "%x"], ["%m"], loc="case.linnet:4"),
    ]
    g.calls += [
        Call("std.test::pair", "op", 0, 2, 0, "a", depth=0),
        Call("std.test::inner", "op", 1, 2, 1, "a", depth=1),
    ]
    out.append(("call-two-results-nested", g, {"x": F}, {}))
    # Elementwise math of linnet.lang.ir.elementwise with no case above (a new row): on
    # positive operands (the safe side of any domain), so each exporter is checked on it.
    covered = {s.op for _, g, _, _ in out for s in g.steps}
    for op in SPELLINGS.keys() - covered:
        p = PRIMITIVES[op]
        args = [B, B2][: p.arity] if p.logical else [P, np.abs(ROW) + 0.5][: p.arity]
        add(op, op, args, shape=((2, 3), "bool") if p.comparison else None)
    return out


def scatter_adds() -> Any:
    """A hypothesis strategy: one-step scatter_add graphs (rank 1-3, 0 to rank indexed axes,
    broadcast positions, repeats likely) and their inputs; under bounds zero positions fall
    up to 2 outside each axis, under unchecked they are inside."""
    from hypothesis import strategies as st

    @st.composite
    def draw_case(draw: Any) -> tuple[Graph, dict[str, np.ndarray]]:
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        k = draw(st.integers(0, len(shape)))
        bounds = draw(st.sampled_from(["zero", "unchecked"]))
        common = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2))) if k else ()
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        args = [
            rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(common + shape[k:]).astype(np.float32),
        ]
        for a in range(k):
            # each index broadcasts along the common shape's other axes (some of size 1)
            ishape = tuple(d if draw(st.booleans()) else 1 for d in common)
            lo, hi = (-2, shape[a] + 2) if bounds == "zero" else (0, shape[a])
            args.append(rng.integers(lo, hi, ishape).astype(np.int32))
        if k and all(a.shape != common for a in args[2:]):
            args[2] = np.broadcast_to(args[2], common).copy()
        g = one_step("scatter_add", args, {"indexed_axes": k, "bounds": bounds}, (shape, "f32"))
        return g, {f"a{i}": a for i, a in enumerate(args)}

    return draw_case()


def expected(graph: Graph, inputs: dict, states: dict) -> tuple[list[np.ndarray], dict]:
    """The NumPy reference's outputs and the states it leaves."""
    after = {k: v.copy() for k, v in states.items()}
    return run_graph(graph, inputs, {}, after), after


def assert_close(got: np.ndarray, want: np.ndarray, what: str, tol: float = 1e-5) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
    else:
        assert got.tolist() == want.tolist(), what


# ---------------------------------------------------------------- the toy Llama
def toy_config(**extra: Any) -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")} | {"B": 1} | extra


def llama_graphs(length: int = 6, **extra: Any) -> tuple[Program, Graph, Graph]:
    program = Program.from_file(LLAMA)
    cfg = toy_config(**extra)
    prefill = lower(program, "prefill", {"tokens": [1, length]}, cfg, check=False)
    decode = lower(program, "decode", {"token": [1], "pos": [1]}, cfg, check=False)
    return program, prefill, decode


def llama_params(graph: Graph, seed: int = 1234) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for path, vt in sorted(graph.parameters.items()):
        if path.endswith("norm.weight"):
            out[path] = (1.0 + 0.1 * rng.standard_normal(vt.shape)).astype(np.float32)
        else:
            out[path] = (0.2 * rng.standard_normal(vt.shape)).astype(np.float32)
    return out


Step_ = Callable[
    [dict[str, np.ndarray], dict[str, np.ndarray]], tuple[np.ndarray, dict[str, np.ndarray]]
]


def greedy(
    prefill: Step_, decode: Step_, prompt: np.ndarray, states: dict, steps: int
) -> tuple[list[int], list[np.ndarray]]:
    """Prefill ``prompt``, then ``steps`` greedy decode calls carrying the states returned by
    each call into the next; returns the ``steps + 1`` tokens chosen and every call's logits."""
    logits, states = prefill({"tokens": prompt}, states)
    token = int(np.argmax(logits[0, -1]))
    tokens, seen = [token], [logits]
    for i in range(steps):
        pos = np.array([prompt.shape[1] + i], np.int32)
        logits, states = decode({"token": np.array([token], np.int32), "pos": pos}, states)
        token = int(np.argmax(logits[0]))
        tokens.append(token)
        seen.append(logits)
    return tokens, seen


def reference_step(graph: Graph, params: dict) -> Step_:
    def run(inputs: dict, states: dict) -> tuple[np.ndarray, dict]:
        after = {k: v.copy() for k, v in states.items()}
        (out,) = run_graph(graph, inputs, params, after)
        return out, after

    return run
