"""`linnet.lang.passes.bounds.input_bounds`: the valid range of every entry input used as an index.

The property tests write an index expression over an input (`t[a * ids[i] + c]`, with
clamps and index variables), derive the range, and compare it with brute force: every
value in a window is valid exactly when the derived range says so (sound: no value passes
that reads outside; precise: none is rejected that would not).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.lang import Program, lower
from linnet.lang.ir.graph import Graph, Step, ValueType
from linnet.lang.passes.bounds import input_bounds

CI = bool(os.environ.get("CI"))
SETTINGS = settings(
    max_examples=40 if CI else 120,
    deadline=None,
    derandomize=CI,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
WINDOW = range(-60, 61)


def lower_lookup(expr: str, size: int, n: int = 3) -> Graph:
    """A model that gathers rows ``expr`` (over input `ids` and index `i`) of `t`."""
    src = f"""
model M<V: Dim> {{
    param t: Tensor[V, 2; f32]
    entry look(ids: Tensor[{n}; i32]) -> Tensor[{n}, 2; f32] {{
        let out[i, d] = self.t[{expr}, d]
        return out
    }}
}}"""
    return lower(Program.from_text(src), "look", {"ids": [n]}, {"V": size})


def lower_write(expr: str, size: int) -> Graph:
    """A model that writes state `s` at ``expr`` (over input `pos`)."""
    src = f"""
model M<S: Dim> {{
    state s: Tensor[S; f32]
    entry put(x: Tensor[1; f32], pos: Tensor[1; i32]) -> Tensor[1; f32] {{
        self.s[{expr}] = x[0]
        return x
    }}
}}"""
    return lower(Program.from_text(src), "put", {"x": [1], "pos": [1]}, {"S": size})


def num(k: int) -> str:
    return f"({k})" if k < 0 else str(k)


@st.composite
def affine_uses(draw):
    """An index expression over `ids[i]` and the function it computes of (x, i)."""
    a = draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
    c = draw(st.integers(-8, 8))
    with_i = draw(st.booleans())
    text = f"ids[i] * {num(a)} + {num(c)}" + (" + i" if with_i else "")

    def f(x: int, i: int) -> int:
        return a * x + c + (i if with_i else 0)

    k = draw(st.sampled_from([1, 1, 2, 3, 5]))
    if k > 1:  # integer `/` rounds toward -inf
        text, g = f"({text}) / {k}", f
        f = lambda x, i, g=g: g(x, i) // k  # noqa: E731
    clamp = draw(st.sampled_from(["none", "min", "max", "both"]))
    lo_k, hi_k = draw(st.integers(-3, 6)), draw(st.integers(-3, 14))
    if clamp in ("max", "both"):
        text, g0 = f"max({text}, {num(lo_k)})", f
        f = lambda x, i, g0=g0: max(g0(x, i), lo_k)  # noqa: E731
    if clamp in ("min", "both"):
        text, g1 = f"min({text}, {num(hi_k)})", f
        f = lambda x, i, g1=g1: min(g1(x, i), hi_k)  # noqa: E731
    return text, f


def derived_valid(graph: Graph, name: str) -> set[int]:
    b = input_bounds(graph)
    r = b.inputs.get(name)
    if r is None:
        return set(WINDOW)
    return {x for x in WINDOW if r.lo <= x < r.hi}


@SETTINGS
@given(affine_uses(), st.integers(1, 12))
def test_gather_ranges_are_exact(use, size):
    text, f = use
    graph = lower_lookup(text, size)
    b = input_bounds(graph)
    assert not b.unanalysed and not b.static
    truth = {x for x in WINDOW if all(0 <= f(x, i) < size for i in range(3))}
    assert derived_valid(graph, "%ids") == truth, text


@SETTINGS
@given(st.sampled_from([-3, -2, -1, 1, 2, 3]), st.integers(-8, 8), st.integers(1, 12))
def test_scatter_ranges_are_exact(a, c, size):
    text = f"pos[0] * {num(a)} + {num(c)}"
    graph = lower_write(text, size)
    truth = {x for x in WINDOW if 0 <= a * x + c < size}
    assert derived_valid(graph, "%pos") == truth, text


def test_llama_decode_and_prefill():
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    program = Program.from_file(root / "examples" / "llama" / "llama.linnet")
    config = {"V": 256, "D": 64, "F": 96, "NL": 2, "H": 4, "KV": 2, "HD": 16, "S": 128, "T": "f32"}
    decode = lower(program, "decode", {"token": [2], "pos": [2]}, dict(config, B=2))
    b = input_bounds(decode)
    assert {k: (v.lo, v.hi) for k, v in b.inputs.items()} == {"%token": (0, 256), "%pos": (0, 128)}
    assert b.inputs["%pos"].upper.target == "@model.layers.0.self_attn.k_cache"
    assert "size 128 = S" in b.inputs["%pos"].upper.describe(decode)
    assert "llama.linnet:" in b.inputs["%pos"].upper.describe(decode)
    assert not b.static and not b.unanalysed
    ok = lower(program, "prefill", {"tokens": [1, 128]}, dict(config, B=1))
    assert not input_bounds(ok).static
    long = lower(program, "prefill", {"tokens": [1, 129]}, dict(config, B=1))
    static = input_bounds(long).static
    assert static and (static[0].lo, static[0].hi, static[0].use.size) == (0, 128, 128)
    assert static[0].use.op == "scatter"


def test_reads_outside_with_bounds_zero_are_not_constraints():
    # `t[i + 5]` reads zero outside the axis: no input and no static violation.
    src = """
model M<V: Dim> {
    param t: Tensor[V; f32]
    entry look(ids: Tensor[3; i32]) -> Tensor[3; f32] {
        let out[i] = self.t[i + 5] + self.t[ids[i]]
        return out
    }
}"""
    b = input_bounds(lower(Program.from_text(src), "look", {"ids": [3]}, {"V": 4}))
    assert not b.static
    assert (b.inputs["%ids"].lo, b.inputs["%ids"].hi) == (0, 4)


def test_several_uses_intersect_and_name_the_tighter_one():
    src = """
model M<V: Dim, W: Dim> {
    param a: Tensor[V; f32]
    param b: Tensor[W; f32]
    entry look(ids: Tensor[2; i32]) -> Tensor[2; f32] {
        let out[i] = self.a[ids[i]] + self.b[ids[i] + 2]
        return out
    }
}"""
    g = lower(Program.from_text(src), "look", {"ids": [2]}, {"V": 10, "W": 6})
    r = input_bounds(g).inputs["%ids"]
    assert (r.lo, r.hi) == (0, 4)
    assert r.upper.target == "@b" and r.lower.target in ("@a", "@b")


def test_division_is_followed():
    # `pos / 2` into 8 entries: 0..15 (before, an unfollowed division let -1 / 2 = -1 wrap
    # around to the last entry in generated source).
    r = input_bounds(lower_write("pos[0] / 2", 8)).inputs["%pos"]
    assert (r.lo, r.hi) == (0, 16)


def test_unfollowed_arithmetic_is_listed_not_guessed():
    for expr in ("ids[i] % 4", "ids[i] * ids[i]"):
        b = input_bounds(lower_lookup(expr, 8))
        assert "%ids" not in b.inputs and [u.target for u in b.unanalysed["%ids"]] == ["@t"]


def test_a_clamped_index_needs_no_range():
    b = input_bounds(lower_lookup("min(max(ids[i], 0), 7)", 8))
    assert not b.inputs and not b.unanalysed and not b.static


def test_no_valid_value_is_an_empty_range():
    b = input_bounds(lower_lookup("ids[i] * 0 + 9", 8))  # always 9 in an axis of 8
    assert b.static and (b.static[0].lo, b.static[0].hi) == (9, 9)
    r = input_bounds(lower_lookup("min(ids[i], 0) - 1", 8)).inputs["%ids"]
    assert r.empty


def test_handwritten_graph_with_affine_scatter():
    # The analysis reads graphs, not sources: a backend's or another front end's graph too.
    g = Graph(
        "e",
        "m",
        inputs=["%p"],
        outputs=[],
        values={
            "%p": ValueType((1,), "i64"),
            "%k": ValueType((), "i64"),
            "%q": ValueType((1,), "i64"),
            "%x": ValueType((1,), "f32"),
        },
        states={"s": ValueType((16,), "f32")},
        steps=[
            Step("constant", [], ["%k"], {"value": 4, "dtype": "i64"}),
            Step("sub", ["%p", "%k"], ["%q"]),
            Step("scatter", ["@s", "%x", "%q"], [], {"indexed_axes": 1}),
        ],
    )
    r = input_bounds(g).inputs["%p"]
    assert (r.lo, r.hi) == (4, 20) and r.upper.describe(g).startswith("axis 0 (size 16")


def test_a_very_long_chain_of_integer_steps_is_not_followed_into_a_recursion():
    # 5,000 `+ 1` in a row: the ends are not composed that deep (no RecursionError).
    steps = [Step("constant", [], ["%one"], {"value": 1, "dtype": "i32"})]
    values = {
        "%p": ValueType((1,), "i32"),
        "%one": ValueType((), "i32"),
        "%x": ValueType((1,), "f32"),
    }
    prev = "%p"
    for i in range(5000):
        steps.append(Step("add", [prev, "%one"], [f"%v{i}"]))
        values[f"%v{i}"] = ValueType((1,), "i32")
        prev = f"%v{i}"
    steps.append(Step("scatter", ["@s", "%x", prev], []))
    g = Graph(
        "e",
        "m",
        inputs=["%p", "%x"],
        values=values,
        steps=steps,
        states={"s": ValueType((16,), "f32")},
    )
    b = input_bounds(g)
    assert not b.inputs and list(b.unanalysed) == ["%p"]
