"""linnet.lang.host: the runtimes' shared, framework-free half (inputs, loading, `linnet run`,
kernel checks). Both runtimes' own suites check the errors end to end; these check the pure
functions alone, and that the module stays free of array libraries."""

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, lower
from linnet.lang.check.kernel_cases import scalar_value
from linnet.lang.host.inputs import (
    GATHER_EXAMPLE,
    bind_inputs,
    check_count,
    dtype_error,
    in_range,
    range_error,
)
from linnet.lang.host.loading import (
    check_numerics,
    check_weights_type,
    entry_method,
    load_program,
    programs_kept,
    read_config,
)
from linnet.lang.host.options import run_tokens
from linnet.lang.host.printing import summary_lines, token_line
from linnet.lang.passes.bounds import input_bounds
from linnet.lang.weights.demo import parameter_types

LLAMA = Path(__file__).resolve().parents[3] / "examples" / "llama" / "llama.linnet"

GRAPH = lower(Program.from_text(GATHER_EXAMPLE), "get", {"i": [1]}, {"V": 4})
RANGE = input_bounds(GRAPH).inputs["%i"]  # 0..3: `i` indexes the 4 rows of `t`


def code_of(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.diagnostics[0].code


def test_importing_it_imports_no_array_library():
    code = (
        "import sys, linnet.lang.host.loading, linnet.lang.host.options, "
        "linnet.lang.host.printing, linnet.lang.host.verdicts, linnet.lang.host.generate; "
        "bad = [m for m in ('torch', 'jax', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_check_count_names_the_noun_and_the_inputs():
    with pytest.raises(LinnetError) as e:
        check_count("decode", ["%token", "%pos"], "abc", "array")
    d = e.value.diagnostics[0]
    assert (d.code, d.message) == (
        "E0784",
        "the inputs of `decode` must be a list or tuple of arrays, got str",
    )
    assert d.help == "pass one array per input: [token, pos]"
    with pytest.raises(LinnetError) as e:
        check_count("decode", ["token", "pos"], {}, "tensor", example="model.run('decode', [])")
    assert e.value.diagnostics[0].help == "pass one tensor per input: model.run('decode', [])"
    with pytest.raises(LinnetError) as e:
        check_count("decode", ["%token", "%pos"], (1, 2, 3), "tensor")
    assert e.value.diagnostics[0].message == "entry `decode` takes 2 inputs (token, pos), got 3"
    check_count("decode", ["%token", "%pos"], (1, 2), "tensor")  # the right count passes


@pytest.mark.parametrize(
    "given_,named,code,message",
    [
        ([1, 2, 3], {"pos": 0}, "E0720", "entry `decode` takes 2 inputs (token, pos), got 4"),
        ([], {"tok": 1}, "E0783", "entry `decode` has no input `tok`"),
        (
            [1],
            {"token": 1},
            "E0783",
            "input `token` of `decode` is given twice (by position and by name)",
        ),
        ([], {"pos": 1}, "E0720", "entry `decode` takes 2 inputs (token, pos); missing: token"),
    ],
)
def test_bind_inputs_errors(given_, named, code, message):
    with pytest.raises(LinnetError) as e:
        bind_inputs("decode", ["token", "pos"], given_, named)
    assert (code_of(e), e.value.diagnostics[0].message) == (code, message)


@given(st.permutations(["a", "b", "c", "d"]), st.integers(0, 4))
def test_bind_inputs_orders_any_split_of_position_and_name(names, cut):
    # The first `cut` inputs by position, the rest by name in any order: the entry's order.
    values = {n: f"value of {n}" for n in names}
    named = {n: values[n] for n in reversed(names[cut:])}
    assert bind_inputs("e", names, [values[n] for n in names[:cut]], named) == [
        values[n] for n in names
    ]


def test_dtype_error_with_and_without_the_reason():
    d = dtype_error("get", "%i", "torch.float32", "i32", "i.to(torch.int32)").diagnostics[0]
    assert d.message == "input `i` of `get` is torch.float32, the entry declares i32"
    assert d.help.startswith("convert it: `i.to(torch.int32)` (nothing is converted silently")
    short = dtype_error("get", "i", "float32", "i32", "i.to(torch.int32)", why=False)
    assert short.diagnostics[0].help == "convert it: `i.to(torch.int32)`"


def test_in_range_is_the_half_open_range():
    assert (RANGE.lo, RANGE.hi) == (0, 4)
    assert in_range(RANGE, 0, 3)
    assert not in_range(RANGE, -1, 3)
    assert not in_range(RANGE, 0, 4)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=0, max_size=3).flatmap(
        lambda shape: st.tuples(
            st.just(shape),
            st.lists(st.integers(-3, 6), min_size=_numel(shape), max_size=_numel(shape)),
        )
    )
)
def test_range_error_names_the_first_bad_element(case):
    shape, values = case
    if all(0 <= v < 4 for v in values):
        values = [*values[:-1], 4]  # at least one out of range
    msg = range_error(GRAPH, "get", RANGE, values, shape).diagnostics[0]
    # The first bad element in row-major order, by enumerating every index.
    indices = list(itertools.product(*(range(n) for n in shape)))
    bad = [(idx, v) for idx, v in zip(indices, values) if not 0 <= v < 4]
    where, value = bad[0]
    more = f" ({len(bad)} values are out of range)" if len(bad) > 1 else ""
    assert msg.code == "E0780"
    assert msg.message.startswith(f"input `i` of `get` has {value} at index {list(where)}{more};")
    if value < 0:
        assert "negative values do not count from the end" in msg.help
    else:
        assert "the size comes from the weights or the config" in msg.help


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_loading_errors():
    with pytest.raises(LinnetError) as e:
        check_numerics("quick")
    assert code_of(e) == "E0713"
    with pytest.raises(LinnetError) as e:
        read_config(42, LLAMA)
    assert code_of(e) == "E0744"
    assert read_config({"H": 2, "_why": "a comment"}, LLAMA) == {"H": 2}
    with pytest.raises(LinnetError) as e:
        check_weights_type({"w": 1.0}, lambda v: False, "tensors", note="a path is never read")
    d = e.value.diagnostics[0]
    assert d.code == "E0741" and "a dict of tensors, not dict" in d.message
    assert d.help == "e.g. weights='Llama-3.2-1B/' (a path is never read)"
    program, path = load_program(LLAMA)
    assert path == LLAMA
    with pytest.raises(LinnetError) as e:
        entry_method(program, "decod")
    assert code_of(e) == "E0601" and "entries: " in e.value.diagnostics[0].help


def test_programs_kept_loads_each_file_once_within_the_block(tmp_path):
    assert load_program(LLAMA)[0] is not load_program(LLAMA)[0]  # outside: read afresh
    with programs_kept():
        program, path = load_program(LLAMA)
        assert path == LLAMA
        assert load_program(LLAMA)[0] is program
        assert load_program(LLAMA.parent / ".." / "llama" / LLAMA.name)[0] is program
        bad = tmp_path / "bad.linnet"
        bad.write_text("pub fn f() -> f32 { return nope }\n")
        for _ in range(2):  # an error is raised every time, never kept
            with pytest.raises(LinnetError):
                load_program(bad)
    assert load_program(LLAMA)[0] is not program


def test_parameter_types_mark_norm_weights():
    cfg = {"V": 16, "D": 8, "F": 16, "NL": 1, "H": 2, "KV": 1, "HD": 4, "S": 8, "T": "f32"}
    found = {path: (vt.shape, ones) for path, vt, ones in parameter_types(LLAMA, cfg)}
    assert found["model.norm.weight"] == ((8,), True)
    assert found["lm_head.weight"] == ((16, 8), False)
    assert list(found) == sorted(found)


def test_run_tokens(capsys):
    args = argparse.Namespace(prompt="1, 2,3", stop="7", tokens=4)
    assert run_tokens(args) == ([1, 2, 3], [7])
    assert run_tokens(args, stop=False) == ([1, 2, 3], [])
    assert run_tokens(argparse.Namespace(prompt="1,x", stop="", tokens=4), stop=False) is None
    assert "--prompt takes comma-separated integers" in capsys.readouterr().err
    with pytest.raises(LinnetError) as e:
        run_tokens(argparse.Namespace(prompt=" ", stop="", tokens=4))
    assert code_of(e) == "E0786"
    with pytest.raises(LinnetError) as e:
        run_tokens(argparse.Namespace(prompt="1", stop="", tokens=0))
    assert code_of(e) == "E0787"


def test_run_lines():
    assert token_line(12, 40, 7, 3.25) == "  token  12 at position   40:      7       3.25 ms"
    assert summary_lines([1, 2], [5.0], "includes lowering") == [
        "decoded 2 tokens: [1, 2]",
        "per-token decode: median nan ms after the first (first: 5.0 ms, includes lowering)",
    ]


def test_scalar_values():
    assert scalar_value("bool", 0.2) is True
    assert scalar_value("u8", 0.99) == 4
    assert scalar_value("bf16", 0.0) == pytest.approx(1e-3)


def test_a_16bit_result_is_held_to_the_exact_result_where_the_body_is_far_from_it():
    """`no_further_than_the_body`: a bf16 result that differs from the body's by more than
    the tolerance passes where it is within it of the exact result plus twice the body's
    largest distance from it; farther, it is still a finding; other types and problems are
    left to the runtime's own comparison."""
    np = pytest.importorskip("numpy")
    from linnet.lang.check.kernel_cases import KernelCase
    from linnet.lang.host.verdicts import exact_case, no_further_than_the_body

    def compare(got, want, dtype, name):
        diff = float(np.abs(got - want).max())
        return (("differs", diff, 0.1, name) if diff > 0.1 else None), diff

    exact = [np.array([0.0, 10.0, 20.0])]
    body = np.array([0.0, 11.0, 20.0])  # the body's own bf16 evaluation: 1.0 off at [1]
    want = [body]
    runs = []
    checked = no_further_than_the_body(compare, want, lambda: runs.append(1) or exact, np.asarray)
    assert checked(body, body, "bf16", "result")[0] is None and not runs  # agrees: not run
    # 2.5 from the body, 1.5 from the exact result: within 0.04 * 20 + 2 * 1.0
    assert checked(np.array([0.0, 8.5, 20.0]), body, "bf16", "result")[0] is None
    # 5 from the exact result: a finding, as the plain comparison found
    assert checked(np.array([0.0, 15.0, 20.0]), body, "bf16", "result")[0][0] == "differs"
    # f32 results and other problems keep the runtime's verdict
    assert checked(np.array([0.0, 8.5, 20.0]), body, "f32", "result")[0][0] == "differs"
    assert runs == [1]  # the exact result is made once
    none = no_further_than_the_body(compare, want, lambda: None, np.asarray)
    assert none(np.array([0.0, 8.5, 20.0]), body, "bf16", "result")[0][0] == "differs"
    case = KernelCase("m::f", "m::k", {"T": "f32"}, {"x": ((3,), "f32")}, {}, [((3,), "f32")])
    assert exact_case(case) is None
    wide = exact_case(
        KernelCase("m::f", "m::k", {"T": "bf16"}, {"x": ((3,), "bf16")}, {}, [((3,), "bf16")]),
        "f32",
    )
    assert wide is not None and wide.generics == {"T": "f32"} and wide.results == [((3,), "f32")]


@pytest.mark.parametrize("limit", [16, 17, 100, 1024, 1536, 4096, 8192])
def test_length_ladders_bound_the_padding_and_end_at_the_cache(limit):
    """Each ladder's buckets rise to the cache's length; a prompt runs at most 2x its length
    below the ladder's doubling point and 1 + 1/per_octave from it (issue 41: FINE keeps the
    CPU's prefill within 1.25x of the prompt)."""
    from linnet.lang.host.generate import COARSE, FINE, length_bucket, length_buckets

    for ladder in (COARSE, FINE):
        buckets = length_buckets(limit, ladder)
        assert buckets == sorted(set(buckets)) and buckets[-1] == limit
        for n in range(1, limit + 1):
            b = length_bucket(n, limit, ladder)
            assert n <= b <= limit and b in buckets
            if n > ladder.doubling_until and b != limit:
                assert b <= n * (1 + 1 / ladder.per_octave)
            elif b != limit:
                assert b <= max(2 * n, 16)
    assert length_buckets(1024, COARSE) == [16, 32, 64, 128, 256, 384, 512, 768, 1024]
    assert len(length_buckets(1024, FINE)) == 19
