"""`linnet kernels` and linnet.torch.testing (issue 14, item 6): every bound kernel runs
under Triton's interpreter on sampled shapes, outputs poisoned with NaN, against its op's
body; the std library's and the examples' kernels pass, and deliberately broken kernels
(tests/kernels/broken.linnet) are each reported, naming the kernel, the shapes and the
largest difference.

Kernels run in subprocesses: Triton's interpreter must be chosen before Triton is first
imported, which this pytest process may already have done.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from linnet.lang import Program, check_program
from linnet.lang.check.kernel_cases import bound_ops, sample_cases
from linnet.torch.testing import TOLERANCES, compare, std_program
from support import CI, CI_SEED, ci_sample, run_guarded

# Found, not imported: Triton imported here without TRITON_INTERPRET=1 would stop later
# in-process tests from interpreting kernels.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

ROOT = Path(__file__).resolve().parents[3]
BROKEN = Path(__file__).parent / "kernels" / "broken.linnet"
EXAMPLES = sorted(str(p) for p in (ROOT / "examples").rglob("*.linnet"))
# `linnet kernels --std` and the examples: every kernel twice (seed 0); under CI=1 once, its
# case drawn with a seed that rotates by date (support.CI_SEED), half the time, and not every
# kernel (STD_OTHERS below).
STD_COUNT, STD_SEED = (1, CI_SEED) if CI else (2, 0)
# The kernels the std run checks in every run, each once per op that binds it.
NAMED = (
    "row_softmax",
    "tiled_matmul",
    "rms_norm_rows",
    "silu_mul_tiles",
    "gemv_rows",
    "gemv_row",
    "rms_norm_gemv",
    "rms_norm_qkv_gemv",
    "rms_norm_gate_up_gemv",
    "gate_up_gemv",
    "gemv_residual",
    "decode_attention_tiles",
    "gemv_dot",
    "residual_rms_norm_rows",
    "gemv_split_part then gemv_split_residual_sum",
    "q8_gemv_rows",
    "q4_gemv_rows",
    "q8_split_part then q8_split_sum",
    "q4_split_part then q4_split_sum",
    "window_decode_attention_tiles",
    "softcap_decode_attention_tiles",
    "moe_gate_up_rows then moe_down_rows",
    "moe_gate_up_tiles then moe_down_tiles then moe_combine_tiles",
)
# The chains whose ops the std run counts (two ops and three), in every run too.
CHAINS = (
    "gemv_split_part then gemv_split_sum",
    "decode_attention_split_tiles then decode_attention_combine_tiles",
)
# Under CI=1 the paged attention kernels are drawn in a run of their own at sizes up to 16: at
# up to 40 a draw took 77 s in the interpreter (B=33, KV=9, MP=31: every program loops over
# every page; the prefill kernel's 5 cases at 48 took 352 s); one of the three, drawn with
# CI_SEED (each every few days). Without CI=1 all are in the std run, at its sizes.
PAGED = [
    "std.nn.paged::paged_decode_attention_flash",
    "std.nn.paged::paged_decode_attention_split",
    "std.nn.paged::paged_prefill_attention_flash",
]
HEAVY = ci_sample(PAGED, 1, "kernel checks: paged") if CI else []
# Under CI=1 the std run checks every op binding a kernel of NAMED or CHAINS (and any op an
# example binds itself), and STD_OTHERS of the other std ops drawn with CI_SEED, about a
# third (their rope, fused-attention and quantised-norm kernels take most of the run's time:
# 5-20 s a case in the interpreter); every op without CI=1.
STD_OTHERS = 6


DRIVER = """
import contextlib, io, json, sys
from linnet.lang.cli import main
from linnet.torch.testing import assert_kernels, check_kernels

broken, std_examples, cli, extra = sys.argv[1], sys.argv[4:-2], {}, {}
std_count, std_seed, (names, heavy) = sys.argv[2], sys.argv[3], json.loads(sys.argv[-1])
std_ops = [a for n in names for a in ("--op", n)]  # none: every op
out = {"findings": {}}
for f in check_kernels(broken, count=3, seed=0):
    out["findings"].setdefault(f.op.split("::")[-1], []).append(
        {"kernel": f.kernel, "case": f.case, "problem": f.problem,
         "difference": f.difference, "where": f.where, "text": str(f)})
runs = [("std", ["kernels", "--std", *std_examples, "--count", std_count,
                 "--seed", std_seed, "--max-size", "40", *std_ops])]
if heavy:
    runs.append(("heavy", ["kernels", "--std", "--count", std_count, "--seed", std_seed,
                           "--max-size", "16", *[a for n in heavy for a in ("--op", n)]]))
for name, argv in [*runs,
                   ("broken", ["kernels", broken, "--count", "1", "--op", "off_by_one",
                               "--op", "good_double"]),
                   ("quiet", ["kernels", broken, "--count", "1", "--op", "good_double",
                              "--quiet"]),
                   ("floor_grid", ["kernels", broken, "--count", "2", "--op", "floor_grid"])]:
    text, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(err):
        rc = main(argv)
    out[name] = {"rc": rc, "stdout": text.getvalue(), "stderr": err.getvalue()}
try:
    assert_kernels(broken, count=1, ops=["off_by_one", "good_double"])
    out["assert_raised"] = ""
except AssertionError as e:
    out["assert_raised"] = str(e)
assert_kernels(broken, count=1, ops=["good_double"])  # passes: no exception
print(json.dumps(out))
"""


def bound_chain(op) -> str:
    """The kernels an op binds, as `linnet kernels` prints them (`a then b`)."""
    names, binding = [], op.kernel
    while binding is not None:
        names.append(binding.name)
        binding = binding.then
    return " then ".join(names)


def std_ops() -> list[str]:
    """The ops the std run checks by name: none without CI=1 (every op); under it every op
    that binds a kernel of NAMED or CHAINS or that an example binds itself, and STD_OTHERS
    of the other std ops (neither in HEAVY nor the other paged op), drawn with CI_SEED."""
    if not CI:
        return []
    from linnet.lang.check.kernel_cases import checked_program

    programs = [std_program(), *(checked_program(f) for f in EXAMPLES)]
    ops = {op.qualified_name: op for p in programs for op in bound_ops(p)}
    assert len(ops) > 40, sorted(ops)
    kept = [
        name
        for name, op in ops.items()
        if bound_chain(op) in NAMED + CHAINS or not name.startswith("std.")
    ]
    others = sorted(set(ops) - set(kept) - set(PAGED))
    return sorted(kept + ci_sample(others, STD_OTHERS, "kernel checks: std"))


@pytest.fixture(scope="module")
def run() -> dict:
    """Everything that launches kernels, in one fresh process (TRITON_INTERPRET=1 before
    Triton is imported): check_kernels over broken.linnet, `linnet kernels` over the std
    library and the examples and over broken.linnet, and assert_kernels."""
    done = run_guarded(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(BROKEN),
            str(STD_COUNT),
            str(STD_SEED),
            *EXAMPLES,
            "end",
            json.dumps([std_ops(), HEAVY]),
        ],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, f"(CI={CI}, LINNET_CI_SEED={CI_SEED}) {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def broken_findings(run: dict) -> dict[str, list[dict]]:
    """Findings by op name."""
    return run["findings"]


def test_std_and_example_kernels_agree_with_their_ops(run: dict) -> None:
    """CI: `linnet kernels --std` plus every example: each kernel STD_COUNT times (under
    CI=1 those of NAMED and CHAINS, and a draw of the others: std_ops), all agree, exit 0."""
    done = run["std"]
    assert done["rc"] == 0, done["stdout"]
    lines = done["stdout"].splitlines()
    assert "every kernel agrees with its op" in lines[-1], f"LINNET_CI_SEED={CI_SEED}"
    for kernel in NAMED:
        # Checked once per op that binds it (`gemv_dot`: three ops, 1-16, 17-32, 33-64 rows).
        ops = sum(bound_chain(op) == kernel for op in bound_ops(std_program()))
        assert sum(line.startswith("ok") and f"::{kernel} " in line for line in lines) == (
            ops * STD_COUNT
        ), done["stdout"]
    # The heavy ops (CI=1): each STD_COUNT times in their own run, and not in the std run.
    if HEAVY:
        heavy = run["heavy"]
        assert heavy["rc"] == 0 and "every kernel agrees with its op" in heavy["stdout"], heavy
        for op in HEAVY:
            name = op.split("::")[-1]
            assert f"(op {op})" not in done["stdout"] and f"{name}  " not in done["stderr"]
        assert sum(line.startswith("ok") for line in heavy["stdout"].splitlines()) == len(
            HEAVY
        ) * int(STD_COUNT)
    # One chain bound by two ops (linear_split, linear_split_wide): two cases each.
    chain = "::gemv_split_part then gemv_split_sum "
    assert sum(line.startswith("ok") and chain in line for line in lines) == 2 * STD_COUNT, done[
        "stdout"
    ]
    # The flash-decoding chains (decode_attention_split, _short, _long): two cases each.
    chain = "::decode_attention_split_tiles then decode_attention_combine_tiles "
    assert sum(line.startswith("ok") and chain in line for line in lines) == 3 * STD_COUNT, done[
        "stdout"
    ]


def test_cli_reports_broken_kernels_and_exits_nonzero(run: dict) -> None:
    done = run["broken"]
    assert done["rc"] == 1, done["stdout"]
    assert "FAIL  kernel broken::off_by_one_k (op broken::off_by_one) on x: [" in done["stdout"]
    assert "ok    broken::good_double_k" in done["stdout"]
    assert done["stdout"].splitlines()[-1].endswith("1 finding(s) in 1 kernel(s)")


def test_cli_shows_its_progress_on_stderr(run: dict) -> None:
    """Issue 46 item 12: before, 23 checks ran 600 s in silence. The total first, a line per
    case as it finishes, a summary last; `--quiet` silences it, the report stays."""
    lines = run["broken"]["stderr"].splitlines()
    assert lines[0] == "linnet kernels: 2 case(s) of 2 op(s) bound to a kernel to check"
    assert re.fullmatch(
        r"\[1/2\] broken::(off_by_one|good_double)  x: \[\d+, \d+\] f32 "
        r"\(R=\d+, C=\d+\) \.\.\. (ok|FAIL) \d+\.\d s",
        lines[1],
    ), lines
    assert lines[2].startswith("[2/2] broken::") and sorted(
        line.split(" ... ")[1].split()[0] for line in lines[1:3]
    ) == ["FAIL", "ok"]
    assert (
        re.fullmatch(r"linnet kernels: 2 case\(s\) checked in \d+\.\d s: 1 finding\(s\)", lines[3])
        and len(lines) == 4
    )
    quiet = run["quiet"]
    assert quiet["rc"] == 0 and quiet["stderr"] == "", quiet
    assert "ok    broken::good_double_k" in quiet["stdout"]
    # the std run's progress counts exactly the cases its report lists
    std = run["std"]
    checked = sum(line.startswith(("ok", "FAIL")) for line in std["stdout"].splitlines())
    assert std["stderr"].splitlines()[0].startswith(f"linnet kernels: {checked} case(s) of ")


def test_assert_form_raises_with_every_finding(run: dict) -> None:
    text = run["assert_raised"]
    assert text.startswith("1 kernel finding(s):") and "broken::off_by_one_k" in text


def test_the_right_kernel_passes(broken_findings: dict) -> None:
    assert "good_double" not in broken_findings


def test_off_by_one_mask_is_reported(broken_findings: dict) -> None:
    found = broken_findings["off_by_one"]
    assert len(found) == 3  # every case: the last column is never stored
    for f in found:
        assert f["kernel"] == "broken::off_by_one_k"
        assert "NaN where the body's are not" in f["problem"]
        # The first unstored lane is the last column of row 0, named with the shapes.
        cols = int(f["case"].split("[")[1].split("]")[0].split(", ")[1])
        assert f["where"] == f"result[0, {cols - 1}]", f
        assert f["case"] in f["text"] and "(R=" in f["case"]


def test_missing_store_region_is_reported(broken_findings: dict) -> None:
    found = broken_findings["half_grid"]
    assert found and all("NaN" in f["problem"] for f in found)
    for f in found:
        rows = int(f["case"].split("[")[1].split(",")[0])
        assert f["where"].startswith(f"result[{rows // 2}, 0]"), f


def test_wrong_value_is_reported_with_its_difference(broken_findings: dict) -> None:
    found = broken_findings["wrong_value"]
    assert len(found) == 3
    for f in found:
        assert f["problem"] == "differs"
        # Each padded lane read -1 instead of 0: the sum is off by the padding's width.
        assert f["difference"] >= 64 - 48 - 1e-3, f
        assert "largest difference" in f["text"] and "tolerance" in f["text"]


def test_a_kernel_no_shape_reaches_is_reported(broken_findings: dict) -> None:
    [f] = broken_findings["huge"]
    assert f["case"] == "no case" and "never run" in f["problem"]


# ---------------------------------------------------------------- issue 38, items 3 and 11
# Each of these passed (or, the wild store, killed the process) before.


def sizes(f: dict) -> dict[str, int]:
    """The generics of a finding's case: ``{"N": 13}``."""
    inside = f["case"].rsplit("(", 1)[1].rstrip(")")
    return {k: int(v) for k, v in (part.split("=") for part in inside.split(", "))}


def test_a_grid_that_drops_the_last_partial_tile_is_reported(
    run: dict, broken_findings: dict
) -> None:
    """(a): the first case has an odd size, so the tile of 4 the grid rounds away shows as
    NaN lanes. Before, `--count 2` drew sizes 4 and 12, multiples of the tile, and passed."""
    done = run["floor_grid"]
    assert done["rc"] == 1, done["stdout"]
    assert "FAIL  kernel broken::floor_grid_k (op broken::floor_grid) on x: [" in done["stdout"]
    found = broken_findings["floor_grid"]
    assert found and all("NaN where the body's are not" in f["problem"] for f in found)
    assert any(sizes(f)["N"] % 2 == 1 for f in found)
    for f in found:
        n = sizes(f)["N"]
        assert n % 4 and f["where"] == f"result[{n - n % 4}]", f


def test_a_race_between_programs_is_reported(broken_findings: dict) -> None:
    """(b): program i reads the scratch element program i - 1 stored. Triton's interpreter
    runs programs in order, so its results were right: now every case is a finding, found
    from the indices, and not launched."""
    found = broken_findings["neighbour"]
    assert len(found) == 3
    for f in found:
        assert (
            "`load` of t[0] in program (1,) races with the `store` of program (0,)" in f["problem"]
            and "[E0549]" in f["problem"]
            and "not launched" in f["problem"]
        )


def test_a_race_through_data_is_found_by_the_guard(broken_findings: dict) -> None:
    """(b), the element read coming from data: the launch records each program's stores and
    loads, and two programs on one element of `t` are a finding."""
    found = broken_findings["gather_race"]
    assert found and all(
        "programs race on `t`" in f["problem"] and "no `atomic_add` orders them" in f["problem"]
        for f in found
    ), found


def test_an_unmasked_load_past_each_row_is_reported(broken_findings: dict) -> None:
    """(c): each row read a whole tile (64) wide: the lane past the row, in every case."""
    found = broken_findings["past_row"]
    assert len(found) == 3
    for f in found:
        c = sizes(f)["C"]
        assert f"`load` reads x[0, {c}], outside `x`" in f["problem"], f
        assert "[E0548]" in f["problem"] and f["kernel"] == "broken::past_row_k"


def test_a_wild_store_is_a_finding_not_a_crash(broken_findings: dict) -> None:
    """Item 11: the unmasked store past `y` killed this process (SIGABRT) in Triton's
    interpreter; found from the indices, it is never launched. One whose index comes from
    data is stopped by guarded memory before it writes."""
    found = broken_findings["wild_store"]
    assert len(found) == 3
    for f in found:
        n = sizes(f)["N"]
        assert (
            f"`store` writes y[{n}], outside `y`" in f["problem"] and "not launched" in f["problem"]
        ), f
    found = broken_findings["wild_scatter"]
    assert len(found) == 3
    for f in found:
        assert (
            "`store` in program (" in f["problem"]
            and "writes outside every tensor of the launch" in f["problem"]
            and "stopped before it ran" in f["problem"]
        ), f


# ---------------------------------------------------------------- in this process


def test_tolerance_table_covers_every_float_dtype() -> None:
    from linnet.torch.interpreter import DTYPES

    floats = {n for n, d in DTYPES.items() if d.is_floating_point}
    assert set(TOLERANCES) == floats
    # Tighter types get tighter tolerances.
    assert TOLERANCES["f64"] < TOLERANCES["f32"] < TOLERANCES["f16"] < TOLERANCES["bf16"]


def test_compare_finds_nan_differences_and_passes_equal_results() -> None:
    want = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert compare(want.clone(), want, "f32") == (None, 0.0)
    got = want.clone()
    got[1, 0] = float("nan")
    (problem, diff, _, where), _ = compare(got, want, "f32")
    assert "NaN" in problem and where == "result[1, 0]" and diff == float("inf")
    got = want.clone()
    got[0, 1] += 0.5
    (problem, diff, tol, where), largest = compare(got, want, "f32")
    assert (problem, diff, where, largest) == ("differs", 0.5, "result[0, 1]", 0.5)
    assert tol < 0.01
    # Within bf16's tolerance, not within f32's.
    got = want * (1 + 2e-3)
    assert compare(got, want, "bf16")[0] is None and compare(got, want, "f32")[0] is not None
    # NaN in both (a body that makes NaN) is agreement; integers are exact.
    both = torch.tensor([float("nan"), 1.0])
    assert compare(both.clone(), both, "f32")[0] is None
    ints = torch.tensor([1, 2], dtype=torch.int32)
    assert compare(ints + 1, ints, "i32")[0] is not None


def test_std_program_has_every_std_kernel() -> None:
    program = std_program()
    assert not check_program(program)
    names = {op.kernel.name for op in bound_ops(program) if op.kernel is not None}
    assert {"row_softmax", "tiled_matmul", "rms_norm_rows", "silu_mul_tiles"} <= names


def test_cases_are_reproducible_and_seeded() -> None:
    program = Program.from_file(BROKEN)
    op = next(o for o in bound_ops(program) if o.name == "good_double")
    a = sample_cases(program, op, 4, seed=3)
    assert a == sample_cases(program, op, 4, seed=3)
    assert a != sample_cases(program, op, 4, seed=4)
