"""std.nn.decode's span kernels (issue 15) under Triton's interpreter, against their op
bodies: at the std bindings' tiles through `linnet kernels --std` (test_kernel_checks_run.py),
and here at small tiles (tests/kernels/decode_tiles.linnet: BR 4, BO 8, BK 16), so that the
sampled cases of a few dozen columns run several programs, several chunks of the reduction
and ragged last tiles, with outputs poisoned with NaN.

Kernels run in a subprocess: Triton's interpreter must be chosen before Triton is first
imported, which this pytest process may already have done.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from linnet.lang import Program
from linnet.lang.check.kernel_cases import bound_ops
from support import CI, CI_SEED, ci_sample, run_guarded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

TILES = Path(__file__).parent / "kernels" / "decode_tiles.linnet"
OPS = [
    "small_gemv",
    "small_norm_gemv",
    "small_qkv",
    "small_norm_gate_up",
    "small_gate_up",
    "small_residual",
    "small_gemv_row",
    "small_gemv_dot",
    "small_split",
    "small_split_two",
    "small_residual_split",
    "small_flash",
    "small_qkv_split",
    "small_qkv_rope",
    "small_qkv_rope_split",
]
# Chosen shapes: reductions of several BK = 16 chunks with a ragged last one, outputs over
# several BO = 8 programs with a ragged last one, 1 to BR = 4 rows; for the qkv kernel a
# program whose outputs straddle q and k, and k and v (Q, K not multiples of BO).
CHOSEN = {
    "small_gemv": [(1, 40, 17, "f32"), (3, 33, 24, "bf16"), (4, 16, 8, "bf16")],
    "small_norm_gemv": [(1, 37, 20, "bf16"), (4, 48, 9, "f32")],
    "small_qkv": [(2, 35, 12, 5, "bf16"), (3, 20, 3, 11, "f32"), (1, 16, 8, 8, "f32")],
    "small_norm_gate_up": [(1, 40, 19, "bf16"), (4, 17, 8, "f32")],
    "small_gate_up": [(2, 33, 20, "bf16"), (1, 16, 9, "f32")],
    "small_residual": [(3, 40, 17, "bf16"), (1, 17, 8, "f32")],
    "small_gemv_row": [(1, 40, 17, "bf16"), (4, 33, 9, "f32")],
    # Rows in registers: 5..16 rows (a batch), one row (15 padding rows), 16 rows exactly.
    "small_gemv_dot": [
        (8, 40, 17, "bf16"),
        (5, 33, 40, "f32"),
        (16, 16, 16, "f32"),
        (1, 20, 3, "bf16"),
    ],
    # Split-K chains (KS 3, 2): 3 chunks of 16 over 3 splits (the last ragged); 1 chunk (two
    # splits past I); 5 chunks over 3 splits of 2 (the last split's second chunk past I);
    # 3 chunks over 2 splits of 2 (one past I).
    "small_split": [(1, 40, 17, "f32"), (4, 16, 8, "bf16"), (2, 70, 20, "bf16")],
    "small_split_two": [(3, 40, 17, "bf16"), (2, 16, 9, "f32")],
    "small_residual_split": [(3, 40, 17, "bf16"), (1, 17, 8, "f32")],
    # The split-K q/k/v chain (KS 3): 3 ragged chunks over 3 splits, 5 chunks over 3 splits
    # of 2 (the last split's second chunk past D), 1 chunk (two splits past D); Q and K
    # straddling both stages' programs.
    "small_qkv_split": [(2, 35, 12, 5, "bf16"), (4, 70, 9, 11, "f32"), (1, 16, 8, 8, "bf16")],
    # Norm, q/k/v and rotations (N, D, H, KV, HD, T): 3 ragged chunks, heads of 8 (one
    # program a head) and 16 (two), 1 to 4 rows.
    "small_qkv_rope": [(2, 35, 3, 1, 8, "bf16"), (4, 20, 2, 2, 16, "f32"), (1, 16, 1, 2, 8, "f32")],
    # The same by split-K (KS 3): 5 chunks over 3 splits of 2 (the last split's second chunk
    # past D), 3 ragged chunks, 1 chunk (two splits past D); the part's programs of 8
    # outputs straddle q, k and v (H * HD = 24, KV * HD = 8), the sum's take 4 pairs.
    "small_qkv_rope_split": [
        (2, 70, 3, 1, 8, "bf16"),
        (4, 35, 2, 2, 16, "f32"),
        (1, 16, 1, 1, 16, "bf16"),
    ],
    # Flash-decoding (B, S, KV, G, HD, T), the checker's positions (0..7): 3 splits of 32
    # positions, HD ragged against BH 32, G 3 and 5 in programs of 2 query heads.
    # (small_flash3 runs only in FLASH below: its 3 splits and the combine's 2 query heads a
    # program make a sampled case of 31 x 8 heads cost 30 s in the interpreter.)
    "small_flash": [(2, 75, 2, 3, 24, "bf16"), (1, 90, 3, 5, 17, "f32")],
}

# Decode attention (B, S, KV, G, HD, T, pos): caches of 40 and 33 positions (three blocks of
# 16, the last ragged), heads of 32 and 24 dims (two value blocks, one ragged), G 4 and 3 (of
# 16 lanes), positions at the end, the middle and the start of the cache.
ATTENTION = [
    (2, 40, 2, 4, 32, "f32", [39, 20]),
    (1, 33, 3, 3, 24, "bf16", [32]),
    (3, 40, 1, 1, 16, "f32", [0, 17, 31]),
]

# Split-K (kind, (N, I, O, T, KS)) at BR 4, BO 8, BK 16, stage by stage (gemv_split_part then
# gemv_split_sum, or gemv_split_residual_sum): 40 columns in 3 chunks over KS 2 (2 a split, the
# second split's last chunk past I), 33 in 3 ragged chunks over KS 3, 16 in 1 over KS 3 (two
# splits wholly past I: they write zeros), 70 in 5 over KS 2 (3 a split, one past I).
SPLIT = [
    ("sum", (1, 40, 17, "f32", 2)),
    ("sum", (3, 33, 24, "bf16", 3)),
    ("sum", (4, 16, 8, "bf16", 3)),
    ("sum", (2, 70, 20, "f32", 2)),
    ("residual", (3, 40, 17, "bf16", 2)),
    ("residual", (1, 17, 8, "f32", 3)),
]

# Flash-decoding at small tiles (decode_tiles.linnet: BS 16, BH 32; the combine's BG 2 query
# heads a program, and small_flash3's BN 2 splits a step of whole heads, small_flash's BN 4 of
# 8 value columns), the two stages launched in turn as the
# chain's launcher does, each stage's results poisoned with NaN, with chosen positions (op,
# B, S, KV, G, HD, T, pos). small_flash splits the cache every 32 positions (two blocks),
# small_flash3 into 3 runs of ceil(ceil(S / 16) / 3) blocks. Covered: several blocks a split
# and a ragged last block (S 75, 50); splits wholly past pos (pos 20 of 75, 0 of 40, 63 of
# 100: the end of a split); a split past the cache's end (S 20: 2 blocks in 3 splits);
# positions at the start, middle and end; G 4, 3, 2, 1; HD 24 and 20 ragged against BH 32;
# the combine in one step (small_flash: NS 2 to 4) and in two (small_flash3: NS 3), over
# column blocks of 8 (HD 24, 32, and 20 ragged) and whole heads.
FLASH = [
    ("small_flash3", 2, 75, 2, 4, 32, "f32", [74, 20]),
    ("small_flash", 1, 50, 3, 3, 24, "bf16", [49]),
    ("small_flash3", 3, 40, 1, 1, 16, "f32", [0, 17, 39]),
    ("small_flash3", 1, 20, 2, 4, 32, "bf16", [19]),
    ("small_flash", 1, 100, 2, 4, 32, "bf16", [63]),
    ("small_flash", 2, 75, 2, 2, 20, "f32", [40, 74]),
]

# The flash cases' splits (NS), as small_flash's and small_flash3's bindings make them.
FLASH_NS = [3, 2, 3, 3, 4, 3]

# What runs: every case without CI=1; under it (support.ci_sample, a seed that rotates by
# date) one sampled case a kernel and one chosen case per op, one decode attention case, one
# split-K case of each kind and one flash case of each op: every kind of case, about a third
# of the interpreter's time.
SAMPLED, SAMPLE_SEED = (1, CI_SEED) if CI else (2, 3)
RUN_CHOSEN = {op: ci_sample(shapes, 1, op) for op, shapes in CHOSEN.items()}
RUN_ATTENTION = ci_sample(ATTENTION, 1, "attention")
RUN_SPLIT = [
    c
    for kind in ("sum", "residual")
    for c in ci_sample([c for c in SPLIT if c[0] == kind], 1, kind)
]
RUN_SPLIT.sort(key=SPLIT.index)
RUN_FLASH = [
    c
    for op in ("small_flash3", "small_flash")
    for c in ci_sample([c for c in FLASH if c[0] == op], 1, op)
]
RUN_FLASH.sort(key=FLASH.index)

DRIVER = """
import json, sys
import torch
from linnet.lang import Program
from linnet.lang.check.kernel_cases import bound_ops, case_for, checked_program
from linnet.torch.testing import check_case, check_kernels, use_interpreter

path, chosen, count, seed = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[6:8])
checks = []
def seen(c):
    checks.append({"op": c.case.op, "generics": c.case.generics, "difference": c.difference,
                   "finding": str(c.finding) if c.finding else None})
# Sampled cases, then the chosen ones.
check_kernels(path, count=count, seed=seed, max_size=40, ops=list(chosen), on_check=seen)
use_interpreter()
program = checked_program(path)
for op in bound_ops(program):
    for shape in chosen.get(op.name, []):
        names = [g.name for g in op.generics]
        case = case_for(program, op, dict(zip(names, shape)))
        seen(check_case(program, op, case, 0, torch.device("cpu")))
# Decode attention at small tiles (16 positions a block, whole heads of up to 32 dims, 16
# value columns a program) with positions chosen across the cache (the checker's random ones
# are 0..3: one block): the online softmax's rescaling across blocks runs.
import tempfile
from pathlib import Path
from linnet.torch import load
from linnet.torch.kernels import kernel_module, op_case
attention = []
for b, s, kv, g, hd, dtype, last in json.loads(sys.argv[3]):
    generics = {"B": b, "S": s, "KV": kv, "G": g, "HD": hd, "T": dtype}
    case = op_case("std.nn.decode::decode_attention_flash", generics, {"scale": 0.3})
    q, k, v, pos = case.random_inputs("cpu", seed=len(attention))
    pos = torch.tensor(last, dtype=torch.int32)
    mod = kernel_module(None, "std.nn.decode::decode_attention_tiles",
                        generics | {"BG": 16, "BS": 16, "BH": 32, "BD": 16}, {"scale": 0.3})
    mod.POISON = True
    got = mod.LAUNCH(q, k, v, pos)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(case.text)
        want = load(path, weights={}, numerics="exact").run("run", [q, k, v, pos])
    from linnet.torch.testing import compare
    found, diff = compare(got, want, dtype)
    attention.append({"generics": generics, "pos": last, "difference": diff,
                      "finding": None if found is None else str(found)})
# Split-K GEMV, its two kernels composed as a chain launches them (the second takes the op's
# inputs, then the first's results), both with NaN-poisoned results, against the body of the
# op whose span it computes (linear_gemv's `linear`, linear_residual's).
split = []
for kind, (n, i, o, dtype, ks) in json.loads(sys.argv[4]):
    generics = {"N": n, "I": i, "O": o, "T": dtype}
    op = "linear_gemv" if kind == "sum" else "linear_residual"
    case = op_case("std.nn.decode::" + op, generics)
    ins = case.random_inputs("cpu", seed=len(split))
    tiles = generics | {"BR": 4, "BO": 8, "KS": ks}
    first = kernel_module(None, "std.nn.decode::gemv_split_part", tiles | {"BK": 16})
    second = kernel_module(None, "std.nn.decode::gemv_split_" + (
        "sum" if kind == "sum" else "residual_sum"), tiles)
    first.POISON = second.POISON = True
    parts = first.LAUNCH(*ins[:2])  # x and w: the first kernel takes the op's leading ones
    got = second.LAUNCH(*ins, parts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(case.text)
        want = load(path, weights={}, numerics="exact").run("run", ins)
    found, diff = compare(got, want, dtype)
    # The partial sums add up to the f32 product; splits that start past I are all zero.
    exact = ins[0].double() @ ins[1].double().T
    per = (-(-i // 16) + ks - 1) // ks
    split.append({"kind": kind, "shape": [n, i, o, dtype, ks], "difference": diff,
                  "finding": None if found is None else str(found),
                  "parts_shape": list(parts.shape),
                  "parts_error": float((parts.double().sum(0) - exact).abs().max()),
                  "past": [s for s in range(ks) if s * per * 16 >= i],
                  "past_zero": [bool((parts[s] == 0).all()) for s in range(ks)
                                if s * per * 16 >= i]})
# Flash-decoding: each small op's two stages (their generics from the binding), composed.
from linnet.torch.kernels import stages
flash = []
for name, b, s, kv, g, hd, dtype, last in json.loads(sys.argv[5]):
    generics = {"B": b, "S": s, "KV": kv, "G": g, "HD": hd, "T": dtype}
    case = op_case("std.nn.decode::decode_attention_flash", generics, {"scale": 0.3})
    q, k, v, pos = case.random_inputs("cpu", seed=10 + len(flash))
    pos = torch.tensor(last, dtype=torch.int32)
    (first, fgen), (second, sgen) = stages(program, "decode_tiles::" + name, generics)[0]
    split_mod = kernel_module(program, first, fgen, {"scale": 0.3})
    combine_mod = kernel_module(program, second, sgen, {"scale": 0.3})
    split_mod.POISON = combine_mod.POISON = True
    parts = split_mod.LAUNCH(q, k, v, pos)
    got = combine_mod.LAUNCH(q, k, v, pos, *parts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(case.text)
        want = load(path, weights={}, numerics="exact").run("run", [q, k, v, pos])
    found, diff = compare(got, want, dtype)
    acc, top, total = parts
    empty = top <= -1e29  # a split that saw no live position
    flash.append({"op": name, "kernels": [first, second], "ns": fgen["NS"], "difference": diff,
                  "finding": None if found is None else str(found),
                  "nan_parts": [bool(t.isnan().any()) for t in parts],
                  "live_splits": (~empty[:, 0, :, 0]).tolist(),
                  "empty_parts": max(float(total[empty].abs().max()) if empty.any() else 0.0,
                                     float(acc[empty].abs().max()) if empty.any() else 0.0)})
print(json.dumps({"checks": checks, "attention": attention, "split": split,
                  "flash": flash}))
"""


@pytest.fixture(scope="module")
def run() -> dict:
    done = run_guarded(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(TILES),
            json.dumps(RUN_CHOSEN),
            json.dumps(RUN_ATTENTION),
            json.dumps(RUN_SPLIT),
            json.dumps(RUN_FLASH),
            str(SAMPLED),
            str(SAMPLE_SEED),
        ],
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, f"(CI={CI}, LINNET_CI_SEED={CI_SEED}) {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checks(run: dict) -> list[dict]:
    return run["checks"]


def test_small_tile_kernels_agree_with_their_bodies(checks: list[dict]) -> None:
    assert [c["finding"] for c in checks if c["finding"]] == []
    ops = [c["op"].rsplit("::", 1)[-1] for c in checks]
    # The sampled cases and every chosen one of each op ran.
    assert {o: ops.count(o) for o in OPS} == {o: SAMPLED + len(RUN_CHOSEN[o]) for o in OPS}
    assert all(c["difference"] < float("inf") for c in checks)


def test_the_chosen_cases_reach_several_chunks_and_programs() -> None:
    """Each op has a chosen case whose reduction spans more than one BK = 16 chunk, whose
    outputs span more than one BO = 8 program, and one with more than one row."""
    for op, shapes in CHOSEN.items():
        assert max(s[1] for s in shapes) > 16, op
        assert max(max(v for v in s[2:] if isinstance(v, int)) for s in shapes) > 8, op
        assert max(s[0] for s in shapes) > 1, op


def test_the_small_bindings_are_the_std_kernels() -> None:
    """Each small binding names a std.nn.decode kernel, so the small cases check the std
    kernels' own code."""
    program = Program.from_file(TILES)
    kernels = {
        op.name: op.kernel.name + (f" then {op.kernel.then.name}" if op.kernel.then else "")
        for op in bound_ops(program)
        if op.name in OPS
    }
    assert kernels == {
        "small_gemv": "gemv_rows",
        "small_norm_gemv": "rms_norm_gemv",
        "small_qkv": "rms_norm_qkv_gemv",
        "small_norm_gate_up": "rms_norm_gate_up_gemv",
        "small_gate_up": "gate_up_gemv",
        "small_residual": "gemv_residual",
        "small_gemv_row": "gemv_row",
        "small_gemv_dot": "gemv_dot",
        "small_split": "gemv_split_part then gemv_split_sum",
        "small_split_two": "gemv_split_part then gemv_split_sum",
        "small_residual_split": "gemv_split_part then gemv_split_residual_sum",
        "small_flash": "decode_attention_split_tiles then decode_attention_combine_tiles",
        "small_qkv_split": "rms_norm_qkv_split_part then rms_norm_qkv_split_sum",
        "small_qkv_rope": "rms_norm_qkv_rope_gemv",
        "small_qkv_rope_split": "rms_norm_qkv_split_part then rms_norm_qkv_rope_split_sum",
    }


def test_decode_attention_agrees_across_cache_blocks(run: dict) -> None:
    found = run["attention"]
    assert [(c["generics"]["S"], c["pos"]) for c in found] == [(a[1], a[6]) for a in RUN_ATTENTION]
    assert [c["finding"] for c in found] == [None] * len(RUN_ATTENTION)
    assert all(c["difference"] < 1e-2 for c in found)


def test_op_case_of_a_several_result_op_returns_each(tmp_path: Path) -> None:
    """`op_case` (what benchmarks/decode_kernels.py builds its bodies from) unpacks a span
    op's three results; its body equals the three products of one norm."""
    import torch
    import torch.nn.functional as F
    from linnet.torch import load
    from linnet.torch.kernels import op_case

    case = op_case("std.nn.decode::rms_norm_qkv", {"N": 2, "D": 8, "Q": 6, "K": 4, "T": "f32"})
    assert "let (r0, r1, r2) = rms_norm_qkv(x, nw, wq, wk, wv, 1e-05)" in case.text
    path = tmp_path / "case.linnet"
    path.write_text(case.text)
    x, nw, wq, wk, wv = case.random_inputs(seed=2)
    q, k, v = load(path, weights={}, numerics="exact").run("run", [x, nw, wq, wk, wv])
    h = F.rms_norm(x, (8,), nw, 1e-5)
    for got, w in zip((q, k, v), (wq, wk, wv)):
        torch.testing.assert_close(got, F.linear(h, w), rtol=1e-5, atol=1e-5)


def test_split_k_stages_compose_to_the_bodies(run: dict) -> None:
    """gemv_split_part then gemv_split_sum equal `linear`, and gemv_split_part then
    gemv_split_residual_sum `residual_add(r, linear(x, w))`, at every chosen case, with every
    partial sum written."""
    found = run["split"]
    assert [(c["kind"], tuple(c["shape"])) for c in found] == RUN_SPLIT
    assert {c["kind"] for c in found} == {"sum", "residual"}
    assert [c["finding"] for c in found] == [None] * len(RUN_SPLIT)
    for c in found:
        n, _, o, _, ks = c["shape"]
        assert c["parts_shape"] == [ks, n, o]
        assert c["parts_error"] < 1e-4, c
        assert c["past_zero"] == [True] * len(c["past"]), c


def test_the_split_cases_reach_ragged_chunks_and_splits_past_i() -> None:
    """Some chosen split has a ragged last chunk, one split lies wholly past I, one split
    takes several chunks, and each second kernel runs with more than one row."""
    shapes = [s for _, s in SPLIT]
    assert any(i % 16 for _, i, _, _, _ in shapes)
    assert any(ks * ((-(-i // 16) + ks - 1) // ks) > -(-i // 16) for _, i, _, _, ks in shapes)
    assert any((-(-i // 16) + ks - 1) // ks > 1 for _, i, _, _, ks in shapes)
    assert {k for k, (n, *_) in SPLIT if n > 1} == {"sum", "residual"}


def test_flash_decoding_stages_agree_with_the_body(run: dict) -> None:
    """The small flash-decoding ops' split then combine kernels equal decode_attention's
    body, leave no partial result unwritten (none NaN), and a split is live exactly where
    its first position is at most pos: one wholly past pos or past the cache's end writes
    max -1e30, sum 0 and accumulator 0."""
    found = run["flash"]
    assert [c["op"] for c in found] == [f[0] for f in RUN_FLASH]
    assert {c["op"] for c in found} == {"small_flash", "small_flash3"}
    assert [c["finding"] for c in found] == [None] * len(RUN_FLASH)
    assert all(c["difference"] < 1e-2 for c in found)
    assert all(c["nan_parts"] == [False, False, False] for c in found)
    assert {tuple(c["kernels"]) for c in found} == {
        (
            "std.nn.decode::decode_attention_split_tiles",
            "std.nn.decode::decode_attention_combine_tiles",
        )
    }
    for c, (_, _, s, _, _, _, _, last) in zip(found, RUN_FLASH):
        ns = c["ns"]
        blocks = (s + 15) // 16
        per = (blocks + ns - 1) // ns * 16  # positions a split: ceil(ceil(S / 16) / NS) blocks
        assert c["live_splits"] == [[i * per <= p for i in range(ns)] for p in last]
        assert c["empty_parts"] == 0.0
    assert [c["ns"] for c in found] == [FLASH_NS[FLASH.index(f)] for f in RUN_FLASH]


def test_the_flash_cases_reach_empty_splits() -> None:
    """Some split of the chosen flash cases is empty: past pos (a live cache) or past the
    cache's end (the live splits each case must show are checked above)."""
    empty = 0
    for (_, _, s, _, _, _, _, last), ns in zip(FLASH, FLASH_NS, strict=True):
        per = ((s + 15) // 16 + ns - 1) // ns * 16
        empty += sum(not all(i * per <= p for i in range(ns)) for p in last)
    assert empty >= 4
