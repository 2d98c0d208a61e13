"""The NumPy reference interpreter (tests/reference.py): one rule per primitive, and the Llama
toy graphs run through it (the KV cache writes and the causal/decode masks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from linnet.lang import Graph, Program, Step, ValueType, check_file, lower
from linnet.lang.ir.primitives import PRIMITIVES
from reference import (
    RULES,
    STATE_RULES,
    GraphRunError,
    random_arrays,
    run_graph,
    zero_states,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


# ==================================================================== the primitive table
def test_every_primitive_has_a_reference_rule():
    missing = sorted(set(PRIMITIVES) - set(RULES) - STATE_RULES)
    assert not missing, f"tests/reference.py has no rule for: {', '.join(missing)}"
    extra = sorted((set(RULES) | STATE_RULES) - set(PRIMITIVES))
    assert not extra, f"tests/reference.py has rules for unknown primitives: {extra}"


def one_step(
    op: str,
    args: list[np.ndarray],
    attrs: dict | None = None,
    out: tuple[tuple[int, ...], str] | None = None,
) -> np.ndarray:
    """Run a single-step graph whose inputs are ``args`` (dtypes named as in the graph)."""
    names = {
        np.dtype(v): k
        for k, v in {
            "f32": np.float32,
            "f64": np.float64,
            "i32": np.int32,
            "i64": np.int64,
            "bool": np.bool_,
            "f16": np.float16,
            "i8": np.int8,
            "u8": np.uint8,
        }.items()
    }
    g = Graph("run", "M")
    for i, a in enumerate(args):
        g.inputs.append(f"%a{i}")
        g.values[f"%a{i}"] = ValueType(a.shape, names[a.dtype])
    g.steps.append(Step(op, [f"%a{i}" for i in range(len(args))], ["%y"], dict(attrs or {})))
    if out is None:
        out = (np.broadcast_shapes(*(a.shape for a in args)), names[args[0].dtype])
    g.values["%y"] = ValueType(tuple(out[0]), out[1])
    g.outputs.append("%y")
    (y,) = run_graph(g, {f"a{i}": a for i, a in enumerate(args)}, {}, {})
    return y


F = np.array([[-1.5, 0.25, 2.0]], dtype=np.float32)
IX = np.array([7, -7, 7, -7], dtype=np.int32)
IY = np.array([2, 2, -2, -2], dtype=np.int32)


@pytest.mark.parametrize(
    "op,fn",
    [
        ("neg", lambda x: -x),
        ("exp", np.exp),
        ("log", lambda x: np.log(np.abs(x))),
        ("sqrt", lambda x: np.sqrt(np.abs(x))),
        ("rsqrt", lambda x: 1 / np.sqrt(np.abs(x))),
        ("sin", np.sin),
        ("cos", np.cos),
        ("tanh", np.tanh),
        ("sigmoid", lambda x: 1 / (1 + np.exp(-x))),
        ("abs", np.abs),
        ("floor", np.floor),
        ("erf", lambda x: np.array([[-0.9661051, 0.27632639, 0.99532227]])),
    ],
)
def test_unary_rules(op, fn):
    x = np.abs(F) if op in ("log", "sqrt", "rsqrt") else F
    np.testing.assert_allclose(one_step(op, [x]), fn(F), rtol=1e-6)


def test_integer_division_floors_and_remainder_takes_the_sign_of_y():
    assert one_step("div", [IX, IY]).tolist() == [3, -4, -4, 3]
    assert one_step("rem", [IX, IY]).tolist() == [1, 1, -1, -1]
    x = np.array([7.0, -7.0], dtype=np.float32)
    y = np.array([2.0, 2.0], dtype=np.float32)
    assert one_step("div", [x, y]).tolist() == [3.5, -3.5]
    assert one_step("rem", [x, -y]).tolist() == [-1.0, -1.0]


@pytest.mark.parametrize(
    "op,fn",
    [
        ("add", np.add),
        ("sub", np.subtract),
        ("mul", np.multiply),
        ("maximum", np.maximum),
        ("minimum", np.minimum),
        ("pow", lambda x, y: np.abs(x) ** y),
    ],
)
def test_binary_rules_broadcast_size_one_axes(op, fn):
    x = np.abs(F) if op == "pow" else F
    y = np.array([[1.0], [2.0]], dtype=np.float32)
    np.testing.assert_allclose(one_step(op, [x, y]), fn(F, y), rtol=1e-6)


@pytest.mark.parametrize(
    "op,fn",
    [
        ("lt", np.less),
        ("le", np.less_equal),
        ("gt", np.greater),
        ("ge", np.greater_equal),
        ("eq", np.equal),
        ("ne", np.not_equal),
    ],
)
def test_comparisons_make_bool(op, fn):
    y = np.array(0.25, dtype=np.float32)
    assert one_step(op, [F, y], out=((1, 3), "bool")).tolist() == fn(F, y).tolist()


def test_logical_rules_and_select():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    assert one_step("and", [a, b]).tolist() == [True, False, False, False]
    assert one_step("or", [a, b]).tolist() == [True, True, True, False]
    assert one_step("not", [a]).tolist() == [False, False, True, True]
    x = np.arange(4, dtype=np.float32)
    out = one_step("select", [a, x, np.array(-1.0, dtype=np.float32)], out=((4,), "f32"))
    assert out.tolist() == [0.0, 1.0, -1.0, -1.0]


def test_elementwise_rejects_mixed_dtypes_and_ranks():
    with pytest.raises(GraphRunError, match="dtypes"):
        one_step("add", [F, F.astype(np.float64)])
    with pytest.raises(GraphRunError, match="ranks"):
        one_step("add", [F, F[0]])


def test_convert_constant_iota():
    x = np.array([-1.7, 2.7, 0.0], dtype=np.float32)
    assert one_step("convert", [x], {"dtype": "i32"}, ((3,), "i32")).tolist() == [-1, 2, 0]
    assert one_step("convert", [x], {"dtype": "bool"}, ((3,), "bool")).tolist() == [
        True,
        True,
        False,
    ]
    assert one_step("constant", [], {"value": 2.5, "dtype": "f32"}, ((), "f32")) == 2.5
    got = one_step("iota", [], {"shape": [2, 3], "axis": 1, "dtype": "i32"}, ((2, 3), "i32"))
    assert got.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_bitcast_keeps_the_bits():
    """Each same-width pair, in the model of bitcast_cases.py: a bf16, held as float32 here,
    is its bits in the upper half (and is rounded to bf16 where read as 16 bits)."""
    import bitcast_cases as bc

    g = lower(Program.from_text(bc.SOURCE), "run", {k: [bc.N] for k in bc.INPUTS}, {"N": bc.N})
    inputs = {name: bc.array(name) for name in bc.INPUTS}
    inputs["r"] = (np.array(bc.INPUTS["r"][1], np.uint32) << 16).view(np.float32)
    out = run_graph(g, inputs, {}, {})
    for k, (name, dtype) in enumerate(bc.RESULTS):
        got = out[k] if dtype != "bf16" else (out[k].view(np.uint32) >> 16).astype(np.uint16)
        assert bc.bits(got) == bc.INPUTS[name][1], (k, name, dtype)
    assert out[-1].tolist() == bc.nibbles()
    # An f32 read as 16 bits is rounded to bf16 first (to nearest, ties to even).
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, np.nan, -3.4e38], np.float32)
    got = one_step("bitcast", [x], {"dtype": "i16"}, ((4,), "i16"))
    assert (got.view(np.uint16)).tolist() == [0x3F80, 0x3F82, 0x7FC0, 0xFF80]


def test_shape_rules():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert (
        one_step("reshape", [x], {"shape": [3, 2]}, ((3, 2), "f32")).tolist()
        == x.reshape(3, 2).tolist()
    )
    assert one_step("transpose", [x], {"perm": [1, 0]}, ((3, 2), "f32")).tolist() == x.T.tolist()
    row = x[:1]
    assert (
        one_step("broadcast", [row], {"shape": [4, 3]}, ((4, 3), "f32")).tolist()
        == [x[0].tolist()] * 4
    )
    with pytest.raises(GraphRunError, match="broadcast"):
        one_step("broadcast", [x], {"shape": [4, 3]}, ((4, 3), "f32"))


@pytest.mark.parametrize(
    "kind,fn",
    [("sum", np.sum), ("max", np.max), ("min", np.min), ("prod", np.prod), ("mean", np.mean)],
)
def test_reduce(kind, fn):
    x = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4) / 7
    got = one_step(
        "reduce", [x], {"kind": kind, "axes": [0, 2], "accumulate": "f32"}, ((3,), "f32")
    )
    np.testing.assert_allclose(got, fn(x, axis=(0, 2)), rtol=1e-6)


def test_reduce_accumulates_in_the_accumulator():
    x = np.full((300,), 100, dtype=np.int8)
    got = one_step("reduce", [x], {"kind": "sum", "axes": [0], "accumulate": "i64"}, ((), "i64"))
    assert got == 30000


def test_contract_is_einsum():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = one_step("contract", [a, b], {"spec": "ac,bc->ab", "accumulate": "f64"}, ((2, 4), "f64"))
    np.testing.assert_allclose(got, a @ b.T)


def test_take_and_gather_bounds():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 5], [-1, 2]], dtype=np.int32)
    got = one_step("take", [x, idx], {"axis": 1, "bounds": "zero"}, ((3, 2, 2), "f32"))
    want = np.take(x, np.clip(idx, 0, 3), axis=1) * ((idx >= 0) & (idx < 4))
    assert got.tolist() == want.tolist()
    with pytest.raises(GraphRunError, match="unchecked"):
        one_step("take", [x, idx], {"axis": 1, "bounds": "unchecked"}, ((3, 2, 2), "f32"))
    rows = np.array([[0], [2], [3]], dtype=np.int32)
    cols = np.array([[1, 3]], dtype=np.int32)
    got = one_step(
        "gather", [x, rows, cols], {"indexed_axes": 2, "bounds": "zero"}, ((3, 2), "f32")
    )
    assert got.tolist() == [[1.0, 3.0], [9.0, 11.0], [0.0, 0.0]]
    got = one_step(
        "gather", [x, rows[:2]], {"indexed_axes": 1, "bounds": "unchecked"}, ((2, 1, 4), "f32")
    )
    assert got.tolist() == x[rows[:2]].tolist()


def test_scatter_writes_the_state():
    g = Graph("run", "M", inputs=["%v", "%i"])
    g.values["%v"] = ValueType((2, 3), "f32")
    g.values["%i"] = ValueType((2,), "i32")
    g.states["s"] = ValueType((4, 3), "f32")
    g.steps.append(Step("scatter", ["@s", "%v", "%i"], [], {"indexed_axes": 1, "path": "s"}))
    g.steps.append(
        Step("reduce", ["@s"], ["%y"], {"kind": "sum", "axes": [0, 1], "accumulate": "f32"})
    )
    g.values["%y"] = ValueType((), "f32")
    g.outputs.append("%y")
    states = {"s": np.zeros((4, 3), dtype=np.float32)}
    v = np.ones((2, 3), dtype=np.float32)
    (y,) = run_graph(g, {"v": v, "i": np.array([3, 1], dtype=np.int32)}, {}, states)
    assert y == 6.0
    assert states["s"][:, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    with pytest.raises(GraphRunError, match="scatter"):
        run_graph(g, {"v": v, "i": np.array([4, 1], dtype=np.int32)}, {}, states)


# ==================================================================== Llama toy
def toy_config() -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@pytest.fixture(scope="module")
def llama() -> Program:
    return check_file(LLAMA)


def llama_params(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    params = random_arrays(graph.parameters, rng, scale=0.2)
    for path in params:
        if path.endswith("layernorm.weight") or path.endswith("norm.weight"):
            params[path] = (1.0 + 0.1 * rng.standard_normal(params[path].shape)).astype(np.float32)
    return params


def prefill(program: Program, tokens: np.ndarray, params=None):
    g = lower(program, "prefill", {"tokens": list(tokens.shape)}, toy_config(), check=False)
    params = params if params is not None else llama_params(g)
    states = zero_states(g)
    (logits,) = run_graph(g, {"tokens": tokens.astype(np.int32)}, params, states)
    return logits, states, params


def decode(program: Program, token: np.ndarray, pos: np.ndarray, params, states):
    g = lower(
        program,
        "decode",
        {"token": list(token.shape), "pos": list(pos.shape)},
        toy_config(),
        check=False,
    )
    (logits,) = run_graph(
        g, {"token": token.astype(np.int32), "pos": pos.astype(np.int32)}, params, states
    )
    return logits


@pytest.mark.parametrize("batch,length", [(1, 5), (2, 3)])
def test_prefill_then_decode_matches_a_longer_prefill(llama, batch, length):
    rng = np.random.default_rng(batch * 10 + length)
    tokens = rng.integers(0, 256, size=(batch, length + 1)).astype(np.int32)
    full, _, params = prefill(llama, tokens)
    short, states, _ = prefill(llama, tokens[:, :length], params)
    assert full.shape == (batch, length + 1, 256)
    # The shorter prompt's logits are the longer one's first positions (causal mask).
    np.testing.assert_allclose(short, full[:, :length], atol=1e-4, rtol=1e-4)
    nxt = decode(llama, tokens[:, length], np.full((batch,), length), params, states)
    np.testing.assert_allclose(nxt, full[:, length], atol=1e-4, rtol=1e-4)
    # Cache rows past the prompt and the new token stay zero.
    for path, arr in states.items():
        assert not arr[:, length + 1 :].any(), path
        assert arr[:, length].any(), path


def test_token_by_token_decode_matches_prefill(llama):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 256, size=(2, 4)).astype(np.int32)
    full, _, params = prefill(llama, tokens)
    g = lower(llama, "decode", {"token": [2], "pos": [2]}, toy_config(), check=False)
    states = zero_states(g)
    for t in range(tokens.shape[1]):
        (logits,) = run_graph(g, {"token": tokens[:, t], "pos": np.array([t, t])}, params, states)
        np.testing.assert_allclose(logits, full[:, t], atol=1e-4, rtol=1e-4)


def test_decode_positions_are_per_sequence(llama):
    """Sequences at different positions: each attends to its own cache prefix only."""
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, size=(1, 3)).astype(np.int32)
    b = rng.integers(0, 256, size=(1, 5)).astype(np.int32)
    full_a, _, params = prefill(llama, a)
    full_b, _, _ = prefill(llama, b, params)
    g = lower(llama, "decode", {"token": [2], "pos": [2]}, toy_config(), check=False)
    states = zero_states(g)
    for t in range(5):
        # Sequence 0 stops after 3 tokens; later steps rewrite its position 2 with the same
        # token, which must leave its logits unchanged.
        ta = min(t, 2)
        (logits,) = run_graph(
            g, {"token": np.array([a[0, ta], b[0, t]]), "pos": np.array([ta, t])}, params, states
        )
        np.testing.assert_allclose(logits[0], full_a[0, ta], atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(logits[1], full_b[0, t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,tied", [("bf16", False), ("f16", True), ("f32", True)])
def test_llama_variants_decode_matches_prefill(llama, dtype, tied):
    """Other element types (bf16 runs at f32 precision here) and tied embeddings."""
    cfg = dict(toy_config(), T=dtype, tie_word_embeddings=tied)
    tokens = np.array([[5, 77, 200], [9, 1, 31]], dtype=np.int32)
    g = lower(llama, "prefill", {"tokens": [2, 3]}, cfg, check=False)
    params = llama_params(g)
    (full,) = run_graph(g, {"tokens": tokens}, params, zero_states(g))
    d = lower(llama, "decode", {"token": [2], "pos": [2]}, cfg, check=False)
    states = zero_states(d)
    tol = 2e-2 if dtype == "f16" else 1e-4
    for t in range(3):
        (logits,) = run_graph(d, {"token": tokens[:, t], "pos": np.array([t, t])}, params, states)
        np.testing.assert_allclose(logits, full[:, t], atol=tol, rtol=tol)


# ==================================================================== std ops vs NumPy
def call_op(use: str, call: str, args: dict[str, np.ndarray], result: str) -> np.ndarray:
    dtypes = {
        np.dtype(np.float32): "f32",
        np.dtype(np.int32): "i32",
        np.dtype(np.float16): "f16",
        np.dtype(np.int8): "i8",
        np.dtype(np.uint8): "u8",
    }
    params = ", ".join(
        f"{n}: Tensor[{', '.join(map(str, a.shape))}; {dtypes[a.dtype]}]" for n, a in args.items()
    )
    src = (
        f"use {use}\nmodel M {{\n    entry run({params}) -> {result} {{\n"
        f"        return {call}\n    }}\n}}\n"
    )
    g = lower(Program.from_text(src), "run", {n: list(a.shape) for n, a in args.items()})
    (out,) = run_graph(g, args, {}, {})
    return out


def _erf(x):
    import math

    return np.vectorize(math.erf)(x)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 5)).astype(np.float32)
W5 = RNG.standard_normal(5).astype(np.float32)
B5 = RNG.standard_normal(5).astype(np.float32)
W45 = RNG.standard_normal((4, 5)).astype(np.float32)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _rope(q, pos, theta):
    hd = q.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv[None]
    emb = np.concatenate([ang, ang], -1)[:, None]
    rot = np.concatenate([-q[..., hd // 2 :], q[..., : hd // 2]], -1)
    return q * np.cos(emb) + rot * np.sin(emb)


def _causal(q, k, v, scale):
    s = np.einsum("bthgd,bshd->bthgs", q, k) * scale
    n = q.shape[1]
    s = np.where(np.tril(np.ones((n, n), bool))[None, :, None, None, :], s, -np.inf)
    return np.einsum("bthgs,bshd->bthgd", _softmax(s), v)


def _decode(q, kc, vc, pos, scale):
    s = np.einsum("bhgd,bjhd->bhgj", q, kc) * scale
    j = np.arange(kc.shape[1])
    s = np.where(j[None, None, None, :] <= pos[:, None, None, None], s, -np.inf)
    return np.einsum("bhgj,bjhd->bhgd", _softmax(s), vc)


Q = RNG.standard_normal((3, 2, 8)).astype(np.float32)
POS = np.array([0, 5, 17], dtype=np.int32)
AQ = RNG.standard_normal((2, 4, 2, 3, 5)).astype(np.float32)
AK = RNG.standard_normal((2, 4, 2, 5)).astype(np.float32)
AV = RNG.standard_normal((2, 4, 2, 5)).astype(np.float32)
DQ = RNG.standard_normal((2, 2, 3, 5)).astype(np.float32)
DPOS = np.array([1, 3], dtype=np.int32)
# Quantised weights (linear_q8, linear_q4): 8 inputs in 2 groups of 4, int8 levels and packed
# int4 bytes over their whole range, f16 scales and offsets.
XQ = RNG.standard_normal((3, 8)).astype(np.float32)
Q8 = RNG.integers(-128, 128, (4, 8)).astype(np.int8)
Q4 = RNG.integers(0, 256, (4, 4)).astype(np.uint8)
QS = (RNG.standard_normal((4, 2)) * 0.05).astype(np.float16)
QM = (RNG.standard_normal((4, 2)) * 0.2).astype(np.float16)


def _dequant8(q, s):
    group = q.shape[1] // s.shape[1]
    return q.astype(np.float32) * np.repeat(s.astype(np.float32), group, axis=1)


def _dequant4(q, d, m):
    levels = np.empty((q.shape[0], 2 * q.shape[1]), np.float32)
    levels[:, 0::2] = q % 16  # input 2j: the low nibble of byte j
    levels[:, 1::2] = q // 16  # input 2j + 1: the high one
    group = levels.shape[1] // d.shape[1]
    wide = lambda a: np.repeat(a.astype(np.float32), group, axis=1)  # noqa: E731
    return wide(d) * levels + wide(m)


STD_CASES = {
    "softmax": (
        "std.nn.activation::{softmax}",
        "softmax(x)",
        {"x": X},
        "Tensor[3, 5; f32]",
        _softmax(X),
    ),
    "silu": (
        "std.nn.activation::{silu}",
        "silu(x)",
        {"x": X},
        "Tensor[3, 5; f32]",
        X / (1 + np.exp(-X)),
    ),
    "gelu": (
        "std.nn.activation::{gelu}",
        "gelu(x)",
        {"x": X},
        "Tensor[3, 5; f32]",
        0.5 * X * (1 + _erf(X / np.sqrt(2))),
    ),
    "rms_norm": (
        "std.nn.norm::{rms_norm}",
        "rms_norm(x, w, 1e-5)",
        {"x": X, "w": W5},
        "Tensor[3, 5; f32]",
        W5 * X / np.sqrt((X * X).mean(1, keepdims=True) + 1e-5),
    ),
    "layer_norm": (
        "std.nn.norm::{layer_norm}",
        "layer_norm(x, w, b, 1e-5)",
        {"x": X, "w": W5, "b": B5},
        "Tensor[3, 5; f32]",
        (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5) * W5 + B5,
    ),
    "linear": (
        "std.nn.linear::{linear}",
        "linear(x, w)",
        {"x": X, "w": W45},
        "Tensor[3, 4; f32]",
        X @ W45.T,
    ),
    "linear_bias": (
        "std.nn.linear::{linear_bias}",
        "linear_bias(x, w, b)",
        {"x": X, "w": W45, "b": B5[:4].copy()},
        "Tensor[3, 4; f32]",
        X @ W45.T + B5[:4],
    ),
    "linear_q8": (
        "std.nn.linear::{linear_q8}",
        "linear_q8<3, 8, 4, 2, 4, f32>(x, q, s)",
        {"x": XQ, "q": Q8, "s": QS},
        "Tensor[3, 4; f32]",
        XQ @ _dequant8(Q8, QS).T,
    ),
    "linear_q4": (
        "std.nn.linear::{linear_q4}",
        "linear_q4<3, 8, 4, 2, 4, f32>(x, q, d, m)",
        {"x": XQ, "q": Q4, "d": QS, "m": QM},
        "Tensor[3, 4; f32]",
        XQ @ _dequant4(Q4, QS, QM).T,
    ),
    "embedding": (
        "std.nn.embedding::{embedding}",
        "embedding(ids, t)",
        {"ids": np.array([2, 0, 2], dtype=np.int32), "t": X},
        "Tensor[3, 5; f32]",
        X[[2, 0, 2]],
    ),
    "rope": (
        "std.nn.rope::{rope}",
        "rope(q, pos, 10000.0)",
        {"q": Q, "pos": POS},
        "Tensor[3, 2, 8; f32]",
        _rope(Q, POS, 10000.0),
    ),
    "causal_attention": (
        "std.nn.attention::{causal_attention}",
        "causal_attention(q, k, v, 0.5)",
        {"q": AQ, "k": AK, "v": AV},
        "Tensor[2, 4, 2, 3, 5; f32]",
        _causal(AQ, AK, AV, 0.5),
    ),
    "decode_attention": (
        "std.nn.attention::{decode_attention}",
        "decode_attention(q, k, v, pos, 0.5)",
        {"q": DQ, "k": AK, "v": AV, "pos": DPOS},
        "Tensor[2, 2, 3, 5; f32]",
        _decode(DQ, AK, AV, DPOS, 0.5),
    ),
}


@pytest.mark.parametrize("name", sorted(STD_CASES))
def test_std_ops_match_numpy(name):
    use, call, args, result, want = STD_CASES[name]
    np.testing.assert_allclose(call_op(use, call, args, result), want, rtol=1e-5, atol=1e-5)
