"""Kernel chains (`kernel first<...> then second<...>`, issue 15): an op bound to two kernels
in turn, the first writing scratch results that the second reads. The checker's rules for
the second kernel, what a call records, and the launchers generated PyTorch and JAX write.
Launching them is tested in linnet-runtime-torch (kernels_interpreted.py) and through
`linnet kernels --runtime jax` here."""

from __future__ import annotations

from pathlib import Path

import pytest
from linnet.lang import LinnetError, Program, check_text, lower
from linnet.lang.check.kernel_cases import binding_name, bound_ops, sample_cases
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.emit.jax import emit_jax
from linnet.lang.emit.torch import emit_torch

# Row sums in two kernels: KS partial sums a row (each of KS programs reduces its run of
# BC-wide chunks), then their sum. The second kernel takes the op's x, then the parts.
CHAIN = (Path(__file__).parent / "chains" / "row_total.linnet").read_text()
PARTS = CHAIN[CHAIN.index("kernel part_sums") : CHAIN.index("kernel add_parts")]
SUM = CHAIN[CHAIN.index("kernel add_parts") : CHAIN.index("pub op row_total")]
OP = CHAIN[CHAIN.index("pub op row_total") :]


def codes(text: str) -> list[str]:
    with pytest.raises(LinnetError) as info:
        check_text(text)
    str(info.value)  # rendering must not raise
    return [d.code for d in info.value.diagnostics]


def test_a_chain_checks_and_parses_both_kernels():
    prog = check_text(CHAIN)
    (op,) = [o for o in bound_ops(prog) if o.name == "row_total"]
    assert (op.kernel.name, op.kernel.then.name) == ("part_sums", "add_parts")
    assert op.kernel.then.then is None
    # `then` is a word only after a binding: a value may still be called so.
    check_text("fn f(then: Tensor[2; f32]) -> Tensor[2; f32] { return then * 2.0 }")


@pytest.mark.parametrize(
    "second,code,words",
    [
        # The second kernel takes the op's parameters, then the first's results: here neither.
        (
            "kernel add_parts<R: Dim, C: Dim, T: DType, KS: Dim>(x: Tensor[R, C; T]) -> "
            "y: Tensor[R; T] grid(R) { store(y[program_id(0)], load(x[program_id(0), 0])) }",
            "E0516",
            "then `part_sums`'s results",
        ),
        # ... with the scratch's type: parts are f32, not T.
        (
            "kernel add_parts<R: Dim, C: Dim, T: DType, KS: Dim>(x: Tensor[R, C; T], "
            "parts: Tensor[R, KS; T]) -> y: Tensor[R; T] grid(R) "
            "{ store(y[program_id(0)], load(parts[program_id(0), 0])) }",
            "E0517",
            "`part_sums` writes `parts`",
        ),
        # ... and writes the op's results.
        (
            "kernel add_parts<R: Dim, C: Dim, T: DType, KS: Dim>(x: Tensor[R, C; T], "
            "parts: Tensor[R, KS; f32]) -> y: Tensor[C; T] grid(R) "
            "{ store(y[program_id(0)], load(parts[program_id(0), 0]) as T) }",
            "E0519",
            "kernel result `y`",
        ),
    ],
)
def test_the_second_kernel_takes_the_ops_parameters_then_the_firsts_results(second, code, words):
    with pytest.raises(LinnetError) as info:
        check_text(PARTS + second + OP)
    (diag,) = info.value.diagnostics
    assert diag.code == code and words in (diag.message + (diag.help or "")), str(info.value)


PLUS = """
kernel add_parts_plus<R: Dim, C: Dim, T: DType, KS: Dim>(x: Tensor[R, C; T], b: Tensor[R; T],
                                                          parts: Tensor[R, KS; f32])
    -> y: Tensor[R; T] grid(R) {
    let r = program_id(0)
    let p = load(parts[r, iota<i32>(KS)])
    store(y[r], ((sum[k] p[k]) + (load(b[r]) as f32)) as T)
}

pub op row_total_plus<R: Dim, C: Dim, T: DType>(x: Tensor[R, C; T], b: Tensor[R; T])
    -> Tensor[R; T] kernel part_sums<R, C, T, 4, 2> then add_parts_plus<R, C, T, 2> {
    let y[r] = (sum[c] x[r, c] as f32) + (b[r] as f32)
    return y as T
}

model P<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32], b: Tensor[R; f32]) -> Tensor[R; f32] {
        return row_total_plus(x, b)
    }
}
"""


def test_the_first_kernel_may_take_the_ops_leading_parameters_only():
    prog = check_text(PARTS + PLUS)
    text = emit_torch(
        with_kernels(lower(prog, "run", {"x": [3, 40], "b": [3]}, model="P"), prog), numerics="fast"
    )
    assert (
        "    parts = launch_part_sums_3_40_f32_4_2(x)\n"
        "    return launch_add_parts_plus_3_40_f32_2(x, b, parts)\n" in text
    )
    # Not the trailing ones, nor more than the op has.
    swapped = PLUS.replace(
        "x: Tensor[R, C; T], b: Tensor[R; T])\n    -> Tensor[R; T]",
        "b: Tensor[R; T], x: Tensor[R, C; T])\n    -> Tensor[R; T]",
    )
    assert "E0517" in codes(PARTS + swapped)


def test_the_second_name_must_be_a_kernel():
    text = CHAIN.replace("then add_parts<R, C, T, 4>", "then row_total<R, C, T>")
    assert codes(text) == ["E0513"]


def test_a_call_records_both_kernels():
    prog = check_text(CHAIN)
    (call,) = [c for c in lower(prog, "run", {"x": [3, 40]}).calls if c.attributes.get("kernel")]
    a = call.attributes
    assert a["kernel"] == "main::part_sums" and a["kernel_generics"] == {
        "R": 3,
        "C": 40,
        "T": "f32",
        "BC": 4,
        "KS": 4,
    }
    assert a["kernel_then"] == {
        "kernel": "main::add_parts",
        "kernel_generics": {"R": 3, "C": 40, "T": "f32", "KS": 4},
    }
    assert a["kernel_applies"] is True
    assert binding_name(a) == "main::part_sums then add_parts"


def test_either_where_clause_false_runs_the_body():
    prog = check_text(
        PARTS
        + SUM
        + OP.replace("4, 4> then add_parts<R, C, T, 4>", "4, 16> then add_parts<R, C, T, 16>")
    )
    # add_parts wants KS <= 8
    (call,) = [c for c in lower(prog, "run", {"x": [3, 40]}).calls if c.attributes.get("kernel")]
    assert call.attributes["kernel_applies"] is False
    graph = with_kernels(lower(prog, "run", {"x": [3, 40]}), prog)
    assert "launch_" not in emit_torch(graph, numerics="fast")
    assert not sample_cases(prog, bound_ops(prog)[0], count=1)


def test_generated_pytorch_launches_the_first_then_the_second():
    prog = check_text(CHAIN)
    text = emit_torch(with_kernels(lower(prog, "run", {"x": [3, 40]}), prog), numerics="fast")
    chain = "launch_part_sums_3_40_f32_4_4_then_add_parts"
    assert f"def {chain}(x):" in text
    assert (
        "    parts = launch_part_sums_3_40_f32_4_4(x)\n"
        "    return launch_add_parts_3_40_f32_4(x, parts)\n" in text
    )
    assert "if kernels_ready('part_sums_3_40_f32_4_4_then_add_parts', x):" in text
    assert text.count("@triton.jit\ndef part_sums") == text.count("@triton.jit\ndef add_parts") == 1
    compile(text, "<chain>", "exec")


def test_generated_jax_runs_both_pallas_calls_in_one_custom_jvp():
    prog = check_text(CHAIN)
    text = emit_jax(with_kernels(lower(prog, "run", {"x": [3, 40]}), prog), numerics="fast")
    assert (
        "    parts = run_part_sums_3_40_f32_4_4(x)\n"
        "    return run_add_parts_3_40_f32_4(x, parts)\n" in text
    )
    assert "return kernel_jvp(run_part_sums_3_40_f32_4_4_then_add_parts, body, backward)(x)" in text
    assert text.count("pl.pallas_call(") == 2
    compile(text, "<chain>", "exec")


def test_linnet_kernels_checks_a_chain_through_pallas(tmp_path, capsys, monkeypatch):
    from linnet.lang.cli import main

    monkeypatch.setenv("LINNET_PALLAS_INTERPRET", "1")
    path = tmp_path / "chain.linnet"
    path.write_text(CHAIN)
    assert main(["kernels", str(path), "--runtime", "jax", "--device", "cpu", "--count", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok    chain::part_sums then add_parts  ") == 2, out


def test_a_program_with_a_chain_round_trips_through_program_from_text():
    prog = Program.from_text(CHAIN)
    assert prog.module("main") is not None


# A chain of three (row_total.linnet's kernels with a middle one): KS partial sums, their
# pairs added, then the halves added.
THREE = (Path(__file__).parent / "chains" / "row_total_three.linnet").read_text()


def test_a_chain_of_three_checks_records_and_launches_each_on_the_one_before():
    prog = check_text(PARTS + SUM + THREE)
    (op,) = [o for o in bound_ops(prog) if o.name == "row_total3"]
    assert (op.kernel.name, op.kernel.then.name, op.kernel.then.then.name) == (
        "part_sums",
        "pair_sums",
        "add_parts",
    )
    graph = lower(prog, "run3", {"x": [3, 40]}, model="Three")
    (call,) = [c for c in graph.calls if c.attributes.get("kernel")]
    assert binding_name(call.attributes) == "main::part_sums then pair_sums then add_parts"
    assert call.attributes["kernel_then"]["kernel_then"] == {
        "kernel": "main::add_parts",
        "kernel_generics": {"R": 3, "C": 40, "T": "f32", "KS": 2},
    }
    text = emit_torch(with_kernels(graph, prog), numerics="fast")
    assert "def launch_part_sums_3_40_f32_4_4_then_pair_sums_then_add_parts(x):\n" in text
    assert (
        "    parts = launch_part_sums_3_40_f32_4_4(x)\n"
        "    halves = launch_pair_sums_3_40_f32_4(x, parts)\n"
        "    return launch_add_parts_3_40_f32_2(x, halves)\n"
    ) in text
    compile(text, "<chain>", "exec")
    jax_text = emit_jax(with_kernels(graph, prog), numerics="fast")
    assert "    halves = run_pair_sums_3_40_f32_4(x, parts)\n" in jax_text
    assert jax_text.count("pl.pallas_call(") == 3


def test_a_middle_kernel_takes_the_ops_parameters_then_the_results_before_it():
    # pair_sums without the op's x: E0516, naming the kernel before it.
    bad = THREE.replace(
        "(x: Tensor[R, C; T],\n                                                     parts", "(parts"
    )
    assert bad != THREE
    with pytest.raises(LinnetError) as info:
        check_text(PARTS + SUM + bad)
    (diag,) = info.value.diagnostics
    assert diag.code == "E0516" and "then `part_sums`'s results" in diag.help, str(info.value)
    # add_parts reads pair_sums' halves ([R, 2]) where a 4-way binding wants [R, 4]: E0517.
    wrong = THREE.replace("then add_parts<R, C, T, 2>", "then add_parts<R, C, T, 4>")
    with pytest.raises(LinnetError) as info:
        check_text(PARTS + SUM + wrong)
    (diag,) = info.value.diagnostics
    assert diag.code == "E0517" and "`pair_sums` writes `halves`" in diag.message, str(info.value)
