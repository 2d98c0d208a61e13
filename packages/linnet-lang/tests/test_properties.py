"""Property-based tests of the compiler (Hypothesis).

* Robustness: token soups over Linnet's vocabulary, and mutations of real sources (the std
  library, the Llama example, the spec's softmax kernel), go through parse → check (→ lower,
  for Llama) and may fail only with a :class:`LinnetError`: never a Python exception.
* Semantics: random index-notation programs (tests/indexgen.py) and state writes are lowered
  with concrete shapes and run by the NumPy reference interpreter (tests/reference.py); the
  result must equal the same computation written directly in NumPy.

Profiles: with ``CI`` set, examples are derandomized and few enough that the file runs in well
under a minute on two cores; otherwise Hypothesis explores five times as many, randomly
(``LINNET_FUZZ_SCALE`` overrides the factor).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from indexgen import index_programs, state_programs
from linnet.lang import LinnetError, Program, check_program, lower, render_all
from linnet.lang.diagnostics.core import SourceFile
from linnet.lang.syntax.lexer import KEYWORDS, PUNCTUATION, tokenize
from reference import run_graph, zero_states

ROOT = Path(__file__).resolve().parents[3]
STD = ROOT / "packages" / "linnet-lang" / "src" / "linnet" / "lang" / "std"
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
KERNELS_SPEC = Path("/work/shared/spec/kernels.txt")

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "linnet-ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=_HEALTH,
)
settings.register_profile(
    "linnet-dev", deadline=None, print_blob=True, suppress_health_check=_HEALTH
)
CI = bool(os.environ.get("CI"))
PROFILE = settings.get_profile("linnet-ci" if CI else "linnet-dev")
SCALE = int(os.environ.get("LINNET_FUZZ_SCALE", "1" if CI else "5"))


def budget(examples: int) -> settings:
    return settings(PROFILE, max_examples=examples * SCALE)


# ==================================================================== sources
SOFTMAX_SPEC = """\
pub kernel row_softmax<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
where B >= C {
    let row = program_id(0)
    let cols = iota<i32>(B)
    let mask = cols < C
    let v = load(x[row, cols], mask, -1e30)
    let e = exp(v - max[c] v[c])
    store(y[row, cols], e / sum[c] e[c], mask)
}

pub op softmax<R: Dim, C: Dim>(
    x: Tensor[R, C; f32],
) -> Tensor[R, C; f32] kernel row_softmax<R, C, 1024> {
    let top[r] = max[c] x[r, c]
    let e[r, c] = exp(x[r, c] - top[r])
    let total[r] = sum[c] e[r, c]
    let y[r, c] = e[r, c] / total[r]
    return y
}
"""


def softmax_kernel_source() -> str:
    """The spec's softmax kernel (kernels.txt) where the spec is at hand, else a copy."""
    if KERNELS_SPEC.is_file():
        text = KERNELS_SPEC.read_text()
        start, stop = text.find("pub kernel row_softmax"), text.find("The body runs once")
        if 0 <= start < stop:
            return text[start:stop].strip() + "\n"
    return SOFTMAX_SPEC


SOURCES: dict[str, str] = {p.stem: p.read_text() for p in sorted(STD.rglob("*.linnet"))}
SOURCES["softmax_spec"] = softmax_kernel_source()
LLAMA_SOURCE = LLAMA.read_text()


def toy_config() -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def compile_text(text: str, name: str = "main", lower_llama: bool = False) -> None:
    """Parse, check and (for Llama) lower; a LinnetError is an answer, anything else a bug."""
    try:
        program = Program.from_text(text, name)
        errors = check_program(program)
        if lower_llama and not errors:
            lower(program, "decode", {"token": [1], "pos": [1]}, toy_config())
    except LinnetError:
        pass


def test_sources_compile_unmutated():
    for name, text in SOURCES.items():
        assert not check_program(Program.from_text(text, name)), name
    lower(
        Program.from_text(LLAMA_SOURCE, "llama"), "decode", {"token": [1], "pos": [1]}, toy_config()
    )


# ==================================================================== mutations
VOCAB = (
    sorted(KEYWORDS)
    + list(PUNCTUATION)
    + [
        "Tensor",
        "Dim",
        "DType",
        "f32",
        "bf16",
        "f16",
        "i32",
        "i64",
        "bool",
        "sum",
        "max",
        "min",
        "mean",
        "prod",
        "x",
        "y",
        "i",
        "j",
        "N",
        "T",
        "0",
        "1",
        "2",
        "1.5",
        "1e30",
        "\n",
        "exp",
        "select",
        "iota",
        "fill",
        "load",
        "store",
        "program_id",
        "sqrt",
        "std",
        "nn",
        "linear",
    ]
)
FRAGMENTS = [
    "[(a, b)]",
    "sum[k]",
    " as i32",
    " as bf16",
    "0..3",
    "iota<i32>(3)",
    "x[i + 1]",
    "(h, d)",
    "[b: 0]",
    "[b: 3]",
    "select(true, 1, 2)",
    "-inf",
    "nan",
    "1 / 0",
    "0 % 0",
    "HD / 0",
    "self.k_cache",
    "pos[pos[b]]",
    "fill(0.0, 4)",
    "load(x[0])",
    "store(y[0], 1.0)",
    "program_id(0)",
    "if true { 1 } else { 2 }",
    "max[j: 0]",
    "sum<f64>[i]",
    "Tensor[; f32]",
    "Tensor[0; f32]",
    "Tensor[N, N; i32]",
    "<T: DType>",
    "<N: Dim = 3>",
    "[Linear<D, D, T>; 0]",
    "grad(dy) { return dy }",
    "where N == 2 * M",
    "kernel row_softmax<R, C, 4>",
    "x.y.z",
    "a[b][c]",
    "((()))",
    "{}",
    "for i in 0..2 { }",
    "self.s[n, n] = x[n]",
]
NUMBERS = [
    "0",
    "1",
    "2",
    "3",
    "7",
    "16",
    "1024",
    "-1",
    "0.0",
    "0.5",
    "1e30",
    "65536",
    "99999999999999999999",
]
OPERATORS = ["+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||"]
DTYPES = ["f32", "bf16", "f16", "f64", "i32", "i64", "i8", "u8", "bool", "T"]
REDUCTIONS = ["sum", "max", "min", "mean", "prod"]
RENAMES = [
    "x",
    "y",
    "N",
    "T",
    "D",
    "i",
    "self",
    "f32",
    "sum",
    "Dim",
    "HD",
    "B",
    "Tensor",
    "iota",
    "exp",
    "load",
    "model",
    "in",
]


def tokens_of(text: str) -> list:
    toks, _ = tokenize(SourceFile("m.linnet", text))
    return [t for t in toks if t.kind != "eof"]


@st.composite
def mutated(draw: Any, source: str) -> str:
    """``source`` after one to three edits of tokens or characters."""
    text = source
    for _ in range(draw(st.integers(1, 3))):
        toks = tokens_of(text)
        kind = draw(
            st.sampled_from(
                [
                    "delete",
                    "duplicate",
                    "swap",
                    "replace",
                    "fragment",
                    "transplant",
                    "number",
                    "rename_all",
                    "rename_one",
                    "operator",
                    "dtype",
                    "reduction",
                    "char_delete",
                    "char_duplicate",
                    "char_replace",
                ]
            )
        )
        if not toks or not text:
            break
        t = toks[draw(st.integers(0, len(toks) - 1))]
        s, e = t.span.start, t.span.stop
        if kind == "delete":
            text = text[:s] + text[e:]
        elif kind == "duplicate":
            text = text[:e] + " " + text[s:]
        elif kind == "swap":
            u = toks[draw(st.integers(0, len(toks) - 1))]
            a, b = sorted([t, u], key=lambda x: x.span.start)
            if a.span.stop <= b.span.start:
                text = (
                    text[: a.span.start]
                    + text[b.span.start : b.span.stop]
                    + text[a.span.stop : b.span.start]
                    + text[a.span.start : a.span.stop]
                    + text[b.span.stop :]
                )
        elif kind == "replace":
            text = text[:s] + draw(st.sampled_from(VOCAB)) + text[e:]
        elif kind == "fragment":
            text = text[:s] + draw(st.sampled_from(FRAGMENTS)) + text[e:]
        elif kind == "transplant":
            u = toks[draw(st.integers(0, len(toks) - 1))]
            text = text[:s] + text[u.span.start : u.span.stop] + " " + text[s:]
        elif kind in ("number", "operator", "dtype", "reduction", "rename_one", "rename_all"):
            pool = {
                "number": lambda x: x.kind in ("int", "float"),
                "operator": lambda x: x.text in OPERATORS,
                "dtype": lambda x: x.text in DTYPES,
                "reduction": lambda x: x.text in REDUCTIONS,
            }.get(kind, lambda x: x.kind == "ident")
            cands = [x for x in toks if pool(x)]
            if not cands:
                continue
            t = cands[draw(st.integers(0, len(cands) - 1))]
            s, e = t.span.start, t.span.stop
            new = draw(
                st.sampled_from(
                    {
                        "number": NUMBERS,
                        "operator": OPERATORS,
                        "dtype": DTYPES,
                        "reduction": REDUCTIONS,
                    }.get(kind, RENAMES + [t.text + "2"] + [x.text for x in cands[:20]])
                )
            )
            if kind == "rename_all":
                text = re.sub(rf"\b{re.escape(t.text)}\b", new, text)
            else:
                text = text[:s] + new + text[e:]
        else:
            i = draw(st.integers(0, len(text) - 1))
            if kind == "char_delete":
                text = text[:i] + text[i + 1 :]
            elif kind == "char_duplicate":
                text = text[:i] + text[i] + text[i:]
            else:
                text = (
                    text[:i]
                    + draw(st.sampled_from("()[]{}<>,;:.=+-*/%!&|\n 0aZ_\"'#"))
                    + text[i + 1 :]
                )
    return text


@budget(200)
@given(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=60))
def test_token_soup_is_a_linnet_error_or_clean(words):
    compile_text(" ".join(words))


@budget(150)
@given(st.data())
def test_mutated_sources_are_linnet_errors_or_clean(data):
    name = data.draw(st.sampled_from(sorted(SOURCES)))
    compile_text(data.draw(mutated(SOURCES[name])), name="main")


@budget(50)
@given(mutated(LLAMA_SOURCE))
def test_mutated_llama_is_a_linnet_error_or_lowers(text):
    compile_text(text, name="llama", lower_llama=True)


# ==================================================================== semantics
def run_entry(
    source: str, inputs: dict, data: dict, config: dict, states: dict | None = None
) -> tuple[list[np.ndarray], dict]:
    program = Program.from_text(source)
    errors = check_program(program)
    assert not errors, render_all(errors) + "\n" + source
    graph = lower(program, "run", inputs, config, check=False)
    states = states if states is not None else zero_states(graph)
    return run_graph(graph, data, {}, states), states


@budget(300)
@given(index_programs())
def test_index_notation_matches_numpy(case):
    program = Program.from_text(case.source)
    errors = check_program(program)
    if errors and all(d.code == "E0383" for d in errors):
        return  # a documented limitation: `x[i + 1, i]` (see language.md, computed positions)
    assert not errors, render_all(errors) + "\n" + case.source
    graph = lower(program, "run", case.inputs, case.config, check=False)
    (out,) = run_graph(graph, case.data, {}, {})
    expected = case.expected
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(
        out,
        expected,
        rtol=0 if case.exact else 1e-4,
        atol=0 if case.exact else 1e-4 * scale,
        err_msg="\n" + case.source,
    )


@budget(150)
@given(state_programs())
def test_state_writes_match_numpy(case):
    states = {"s": case.state.copy()}
    (out,), states = run_entry(case.source, case.inputs, case.data, case.config, states)
    np.testing.assert_array_equal(out, case.expected, err_msg="\n" + case.source)
    np.testing.assert_array_equal(states["s"], case.expected, err_msg="\n" + case.source)


# ==================================================================== regressions
# Each was found by the properties above; the fix is in the compiler.
def test_symbolic_division_by_zero_is_a_diagnostic():
    text = SOURCES["rope"].replace("d + HD / 2]", "d + HD / 0]")
    errors = check_program(Program.from_text(text))
    assert [d.code for d in errors] == ["E0350"]


def test_gather_with_a_constant_position_has_index_operands_of_one_rank():
    src = """
model M {
    entry run(t: Tensor[3, 4, 3; f32]) -> Tensor[3; f32] {
        let y[j] = t[j, 3, 0]
        return y
    }
}
"""
    t = np.arange(36, dtype=np.float32).reshape(3, 4, 3)
    (out,), _ = run_entry(src, {"t": [3, 4, 3]}, {"t": t}, {})
    assert out.tolist() == t[:, 3, 0].tolist()


def test_gather_mixing_data_and_computed_positions_reads_zero_outside():
    # `t[ids[m], 3]` on a 1-column tensor: the constant 3 is outside, so it reads 0 even though
    # the other position reads a tensor (before: the whole gather was `unchecked`).
    src = """
model M<M: Dim, V: Dim, C: Dim> {
    entry run(ids: Tensor[M; i32], t: Tensor[V, C; f32]) -> Tensor[M; f32] {
        let y[m] = t[ids[m], 3] + t[ids[m], 0]
        return y
    }
}
"""
    t = np.arange(1, 9, dtype=np.float32).reshape(2, 4)[:, :1].copy()
    ids = np.array([1], dtype=np.int32)
    (out,), _ = run_entry(src, {"ids": [1], "t": [2, 1]}, {"ids": ids, "t": t}, {})
    assert out.tolist() == [t[1, 0]]


def test_state_write_on_a_diagonal():
    src = """
model M<N: Dim> {
    state s: Tensor[N, N; f32]
    entry run(x: Tensor[N; f32]) -> Tensor[N, N; f32] {
        self.s[n, n] = x[n]
        self.s[n, (n + 1) % N] = x[n] * 10.0
        let y[a, b] = self.s[a, b]
        return y
    }
}
"""
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    (out,), _ = run_entry(src, {"x": [3]}, {"x": x}, {})
    want = np.diag(x)
    want[np.arange(3), (np.arange(3) + 1) % 3] = x * 10
    assert out.tolist() == want.tolist()


def test_state_write_with_a_constant_position_before_a_variable():
    src = """
model M<N: Dim> {
    state s: Tensor[N, 4; f32]
    entry run(x: Tensor[N; f32]) -> Tensor[N, 4; f32] {
        self.s[n, 1] = x[n]
        let y[a, b] = self.s[a, b]
        return y
    }
}
"""
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    (out,), _ = run_entry(src, {"x": [3]}, {"x": x}, {})
    assert out[:, 1].tolist() == x.tolist() and not out[:, [0, 2, 3]].any()


def test_state_write_ranges_come_from_reads_inside_positions():
    src = """
model M<L: Dim, S: Dim> {
    state s: Tensor[S; f32]
    entry run(p: Tensor[L; i32]) -> Tensor[S; f32] {
        self.s[p[l]] = 1.0
        return self.s
    }
}
"""
    p = np.array([3, 0], dtype=np.int32)
    (out,), _ = run_entry(src, {"p": [2]}, {"p": p}, {"S": 5})
    assert out.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
