"""The checker's layout (issue 13): calls record repeated-block iterations, typing and folding
are per-primitive tables, and lowering keeps no process-global caches."""

import gc
import json
import weakref
from pathlib import Path

import linnet.lang.check.elementwise as typing_rules
import linnet.lang.check.folding as folding_rules
import linnet.lang.syntax.tree as A
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import Graph, LinnetError, Program, check_file, check_text, lower
from linnet.lang.check.core import Fail
from linnet.lang.ir.graph import Call
from linnet.lang.ir.primitives import PRIMITIVES
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def config(name: str) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@pytest.fixture(scope="module")
def program() -> Program:
    return check_file(LLAMA)


# ---------------------------------------------------------------- Call.iteration / repeated


@pytest.mark.parametrize(
    "entry,inputs", [("decode", {"token": [1], "pos": [1]}), ("prefill", {"tokens": [1, 4]})]
)
def test_toy_llama_layer_calls_carry_their_iteration(program, entry, inputs):
    cfg = config("toy")
    g = lower(program, entry, inputs, cfg, check=False)
    layer_calls = [c for c in g.calls if c.iteration is not None]
    assert [c.iteration for c in layer_calls] == list(range(cfg["NL"]))
    assert all(c.repeated == "model.layers" for c in layer_calls)
    assert [c.path for c in layer_calls] == [f"model.layers.{i}" for i in range(cfg["NL"])]
    assert all(c.callee == f"llama::DecoderLayer.{entry}" for c in layer_calls)
    # Calls nested inside a layer, and calls outside the stack, are not iterations themselves.
    others = [c for c in g.calls if c.iteration is None]
    assert all(c.repeated == "" for c in others)
    assert any(c.path.startswith("model.layers.0.") for c in others)


def test_iteration_survives_the_json_round_trip(program):
    g = lower(program, "decode", {"token": [1], "pos": [1]}, config("toy"), check=False)
    data = g.to_json()
    layer = [c for c in data["calls"] if "iteration" in c]
    assert [c["iteration"] for c in layer] == [0, 1]
    assert all(c["repeated"] == "model.layers" for c in layer)
    # Only set fields are written: a call outside the stack has neither key.
    assert all("repeated" not in c for c in data["calls"] if "iteration" not in c)
    back = Graph.loads(g.dumps())
    assert [(c.iteration, c.repeated) for c in back.calls] == [
        (c.iteration, c.repeated) for c in g.calls
    ]
    assert back.to_json() == data


def test_a_graph_without_the_fields_still_reads():
    call = Call("m::f", "fn", 0, 1, 0, "p")
    assert "iteration" not in call.to_json() and "repeated" not in call.to_json()
    g = Graph("run", "M", calls=[call])
    back = Graph.loads(g.dumps())
    assert back.calls[0].iteration is None and back.calls[0].repeated == ""
    zero = Call("m::f", "fn", 0, 1, 0, "layers.0", iteration=0, repeated="layers")
    assert zero.to_json()["iteration"] == 0  # 0 is set, not omitted


def test_an_indexed_block_records_its_iteration():
    prog = Program.from_text("""
block Scale<N: Dim> {
    param w: Tensor[N; f32]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i] * self.w[i]
        return y
    }
}
model M<N: Dim> {
    block layers: [Scale<N>; 3]
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y = self.layers[2](x)
        return self.layers[0](y)
    }
}
""")
    g = lower(prog, "run", {"x": [4]}, {"N": 4})
    got = [(c.iteration, c.repeated, c.path) for c in g.calls if c.iteration is not None]
    assert got == [(2, "layers", "layers.2"), (0, "layers", "layers.0")]


# ---------------------------------------------------------------- typing and folding tables


def codes_of(text: str) -> list[str]:
    with pytest.raises(LinnetError) as info:
        check_text(text)
    return [d.code for d in info.value.diagnostics]


def returns(dtype: str, expr: str, result: str | None = None, n: str = "N") -> str:
    return (
        f"model M<N: Dim> {{\n    entry run(a: Tensor[N; {dtype}], b: Tensor[N; {dtype}]) "
        f"-> Tensor[{n}; {result or dtype}] {{\n        return {expr}\n    }}\n}}\n"
    )


@pytest.mark.parametrize("module", [typing_rules, folding_rules])
def test_tables_cover_the_registry_exactly(module):
    table = module.TYPING_RULES if module is typing_rules else module.FOLDING_RULES
    missing = module.EXPECTED_MISSING
    assert set(table) <= set(PRIMITIVES)
    assert not set(table) & missing
    assert set(table) | missing == set(PRIMITIVES)
    # Every elementwise primitive but convert and bitcast (typed by the cast and by
    # Typing.bitcast: their result types are the target's) has a typing rule.
    elementwise = {p.name for p in PRIMITIVES.values() if p.category == "elementwise"}
    assert elementwise <= set(folding_rules.FOLDING_RULES)
    assert elementwise - {"convert", "bitcast"} <= set(typing_rules.TYPING_RULES)


def test_a_typing_row_is_what_the_checker_uses(monkeypatch):
    text = returns("i32", "a - b")
    check_text(text)
    # `sub` typed as a transcendental function rejects integer operands: the checker reads the
    # row, no if-chain beside it.
    monkeypatch.setitem(typing_rules.TYPING_RULES, "sub", typing_rules.TYPING_RULES["exp"])
    assert codes_of(text) == ["E0356"]


def test_a_typing_rows_result_is_the_steps_dtype(monkeypatch):
    prog = check_text(returns("f32", "a + b"))
    assert [s.op for s in lower(prog, "run", {"a": [3], "b": [3]}, {"N": 3}).steps] == ["add"]
    rule = typing_rules.TYPING_RULES["add"]
    monkeypatch.setitem(
        typing_rules.TYPING_RULES, "add", typing_rules.TypingRule(rule.check, lambda d: "bool")
    )
    # A bool result no longer matches the declared f32 (E0444: the return's dtype differs).
    assert codes_of(returns("f32", "a + b")) == ["E0444"]
    check_text(returns("f32", "a + b", result="bool"))


def test_logic_rows_keep_their_operands():
    prog = check_text(returns("bool", "a && b"))
    g = lower(prog, "run", {"a": [2], "b": [2]}, {"N": 2})
    assert [s.op for s in g.steps] == ["and"]


def test_a_folding_row_is_what_the_checker_uses(monkeypatch):
    text = returns("f32", "a", n="2 + 3").replace("Tensor[N; f32], b", "Tensor[5; f32], b")
    check_text(text)

    def times(args, span, attrs):
        x, y = (a.value for a in args)
        return Const(x * y, "int")

    monkeypatch.setitem(folding_rules.FOLDING_RULES, "add", times)
    # 2 "+" 3 folds to 6 now: the returned [5] no longer fits the declared [6] (E0443).
    assert codes_of(text) == ["E0443"]


def test_casts_of_constants_fold_by_the_convert_row(monkeypatch):
    text = returns("f32", "a", n="(5.0 as i32)").replace("Tensor[N; f32], b", "Tensor[5; f32], b")
    check_text(text)
    monkeypatch.setitem(
        folding_rules.FOLDING_RULES,
        "convert",
        lambda args, span, attrs: Const(Dim.const(6), attrs["dtype"]),
    )
    assert codes_of(text) == ["E0443"]


# ---------------------------------------------------------------- bitcast
WIDTHS = {"f64": 64, "i64": 64, "f32": 32, "i32": 32, "f16": 16, "bf16": 16, "i16": 16}
WIDTHS |= {"i8": 8, "u8": 8}


def bitcast(src: str, dst: str, form: str) -> str:
    """An entry reading a `src` tensor's bits as `dst`, in index notation or whole."""
    expr = f"bitcast<{dst}>(a[n])" if form == "index" else f"bitcast<{dst}>(a)"
    body = f"let y[n] = {expr}" if form == "index" else f"let y = {expr}"
    return (
        f"model M<N: Dim> {{\n    entry run(a: Tensor[N; {src}]) -> Tensor[N; {dst}] {{\n"
        f"        {body}\n        return y\n    }}\n}}\n"
    )


@pytest.mark.parametrize("form", ["index", "whole"])
@pytest.mark.parametrize(
    "src,dst", [(a, b) for a in WIDTHS for b in WIDTHS if a != b and WIDTHS[a] == WIDTHS[b]]
)
def test_bitcast_takes_every_type_of_the_same_width(src, dst, form):
    prog = check_text(bitcast(src, dst, form))
    g = lower(prog, "run", {"a": [3]}, {"N": 3})
    (step,) = g.steps
    assert (step.op, step.attributes, g.values[step.results[0]].dtype) == (
        "bitcast",
        {"dtype": dst},
        dst,
    )
    assert g.values[step.results[0]].shape == (3,)


@pytest.mark.parametrize(
    "src,dst",
    [
        *[(a, b) for a in WIDTHS for b in WIDTHS if WIDTHS[a] != WIDTHS[b]][::5],
        ("f32", "bool"),
        ("bool", "u8"),
        ("bool", "bool"),
    ],
)
def test_bitcast_to_another_width_or_bool_is_E0691(src, dst):
    assert codes_of(bitcast(src, dst, "index")) == ["E0691"]
    assert codes_of(bitcast(src, dst, "whole")) == ["E0691"]


def test_bitcast_needs_one_target_and_one_operand():
    text = bitcast("i32", "f32", "whole")
    assert codes_of(text.replace("bitcast<f32>(a)", "bitcast(a)")) == ["E0691"]
    assert codes_of(text.replace("bitcast<f32>(a)", "bitcast<f32, i32>(a)")) == ["E0691"]
    assert codes_of(text.replace("bitcast<f32>(a)", "bitcast<f32>(a, a)")) == ["E0371"]
    # Of a generic dtype, checked where it is bound: i32 for T is fine, f16 is E0691.
    generic = """
fn reread<N: Dim, T: DType>(a: Tensor[N; T]) -> Tensor[N; f32] {
    let y[n] = bitcast<f32>(a[n])
    return y
}
model M<N: Dim> {
    entry run(a: Tensor[N; i32], h: Tensor[N; f16]) -> Tensor[N; f32] {
        return reread<N, DTYPE>(a)
    }
}
"""
    prog = check_text(generic.replace("DTYPE", "i32"))
    assert [s.op for s in lower(prog, "run", {"a": [2], "h": [2]}, {"N": 2}).steps] == ["bitcast"]
    bad = check_text(generic.replace("DTYPE", "f16").replace("(a)", "(h)"))
    with pytest.raises(LinnetError) as info:
        lower(bad, "run", {"a": [2], "h": [2]}, {"N": 2})
    assert [d.code for d in info.value.diagnostics] == ["E0691"]


@pytest.mark.parametrize(
    "expr,dtype,value",
    [
        ("bitcast<f32>(1065353216)", "f32", 1.0),  # a literal is read as i32
        ("bitcast<i32>(1.0)", "i32", 1065353216),  # a float one as f32
        ("bitcast<f32>(-1082130432)", "f32", -1.0),
        ("bitcast<i8>(255 as u8)", "i8", -1),
        ("bitcast<u8>((-1) as i8)", "u8", 255),
        ("bitcast<f16>(15360 as i16)", "f16", 1.0),
        ("bitcast<i16>(1.0 as bf16)", "i16", 16256),
        ("bitcast<bf16>(1.0 as f16)", "bf16", 2**-7),
        ("bitcast<i64>(1.0 as f64)", "i64", 0x3FF0000000000000),
        ("bitcast<i32>(bitcast<f32>(2143289345))", "i32", 2143289345),  # a NaN's payload
    ],
)
def test_bitcasts_of_constants_fold_by_the_bitcast_row(expr, dtype, value):
    text = (
        f"model M<N: Dim> {{\n    entry run(a: Tensor[N; {dtype}]) -> Tensor[N; {dtype}] {{\n"
        f"        let y[n] = a[n] * 0 + {expr}\n        return y\n    }}\n}}\n"
    )
    g = lower(check_text(text), "run", {"a": [2]}, {"N": 2})
    assert "bitcast" not in [s.op for s in g.steps]
    (c,) = [s.attributes["value"] for s in g.steps if s.op == "constant" and s.attributes["value"]]
    assert c == value


def test_a_literal_of_another_width_is_E0691_with_its_fix():
    text = bitcast("f16", "f16", "whole").replace("bitcast<f16>(a)", "a * bitcast<f16>(15360)")
    with pytest.raises(LinnetError) as info:
        check_text(text)
    (d,) = info.value.diagnostics
    assert d.code == "E0691" and "`bitcast<f16>(15360 as i16)`" in d.help
    with pytest.raises(LinnetError) as info:
        check_text(text.replace("15360", "-1"))
    assert "`bitcast<f16>((-1) as i16)`" in info.value.diagnostics[0].help


@settings(max_examples=60, deadline=None)
@given(
    st.integers(-50, 50),
    st.integers(-50, 50),
    st.sampled_from(["add", "sub", "mul", "div", "rem", "maximum", "minimum", "lt", "eq"]),
)
def test_integer_folding_matches_python(x, y, prim):
    import operator

    expect = {
        "add": operator.add,
        "sub": operator.sub,
        "mul": operator.mul,
        "div": operator.floordiv,
        "rem": operator.mod,
        "maximum": max,
        "minimum": min,
        "lt": operator.lt,
        "eq": operator.eq,
    }[prim]
    args = [Const(Dim.const(x), "int"), Const(Dim.const(y), "int")]
    if y == 0 and prim in ("div", "rem"):
        with pytest.raises(Fail) as info:
            folding_rules.FOLDING_RULES[prim](args, None, {})
        assert info.value.diag.code == "E0350"
        return
    out = folding_rules.FOLDING_RULES[prim](args, None, {})
    want = expect(x, y)
    if isinstance(want, bool):
        assert out == Const(want, "bool")
    else:
        assert out.dtype == "int" and out.value == Dim.const(want)


# ---------------------------------------------------------------- no process-global caches


def _live_tree_nodes() -> int:
    gc.collect()
    kinds = tuple(v for v in vars(A).values() if isinstance(v, type) and v.__module__ == A.__name__)
    return sum(1 for o in gc.get_objects() if isinstance(o, kinds))


def test_lowering_new_shapes_keeps_nothing_behind(program):
    cfg = config("toy")
    lower(program, "prefill", {"tokens": [1, 1]}, cfg, check=False)
    before = _live_tree_nodes()
    for length in range(2, 12):
        lower(program, "prefill", {"tokens": [1, length]}, cfg, check=False)
    # Nodes that lowering makes on the fly (one per shape, say) die with the run: no cache
    # keeps them, so a long-lived process does not grow with every new input shape.
    assert _live_tree_nodes() == before


SCALE_SOURCE = """
block Scale<N: Dim> {
    param w: Tensor[N; f32]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i] * self.w[i] + 1.0
        return y
    }
}
model M<N: Dim> {
    block layers: [Scale<N>; 3]
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y = self.layers[2](x)
        return self.layers[0](y)
    }
}
"""


def test_a_dropped_program_is_freed():
    # Distinct text each time, as a long-lived process that loads models would see.
    for k in range(3):
        prog = Program.from_text(SCALE_SOURCE + f"// {k}\n", "scaled")
        lower(prog, "run", {"x": [4]}, {"N": 4})
        source, module = weakref.ref(prog.root.source), weakref.ref(prog.root)
        del prog
        gc.collect()
        # Nothing global (a cache of walks or of source locations) keeps the program alive.
        assert source() is None and module() is None


# ---------------------------------------------------------------- the Evaluator's mixins


def test_each_evaluator_method_lives_in_one_mixin():
    from linnet.lang.check.core import EvaluatorBase
    from linnet.lang.check.evaluate import Evaluator

    seen: dict[str, str] = {}
    for mixin in Evaluator.__mro__[1:]:
        if mixin in (EvaluatorBase, object):
            continue
        assert mixin.__module__.startswith("linnet.lang.check.")
        for name, value in vars(mixin).items():
            if callable(value) and not name.startswith("__"):
                # Two mixins defining one name would shadow each other silently (the MRO
                # picks one): every method has exactly one home.
                assert name not in seen, f"{name} in {seen.get(name)} and {mixin.__name__}"
                seen[name] = mixin.__name__
    assert {"elementwise", "const_fold", "lookup", "invoke", "read", "index_let"} <= set(seen)
