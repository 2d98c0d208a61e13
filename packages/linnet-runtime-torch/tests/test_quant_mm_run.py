"""std.nn.quant_mm's dequantising GEMM kernels (issue 42) under Triton's interpreter, against
their op bodies (`linear_q8`, `linear_q4`: dequantise to T, then `linear`): at the std
bindings' tiles (32 x 64 outputs a program, 128 inputs a step) and at small tiles
(tests/kernels/quant_mm_tiles.linnet: 16 x 16, 32 inputs a step), at chosen shapes with
edges (N 17 and 40, O not a multiple of the tile, I a whole number of groups that leaves the
last step ragged, groups 32 and 128, bf16 and f32), with outputs poisoned with NaN; and
`linnet kernels` reports kernels that are wrong only for negative int8 weights or a byte's
high nibble (tests/kernels/broken_quant.linnet), which it finds only because a case draws
8-bit tensors over their whole range.

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
from linnet.lang.check.kernel_cases import integer_range
from support import CI, CI_SEED, ci_sample, run_guarded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

KERNELS = Path(__file__).parent / "kernels"
TILES = KERNELS / "quant_mm_tiles.linnet"
BROKEN = KERNELS / "broken_quant.linnet"

# (op, N, I, O, NG, GS, T). The std ops (BM 32, BN 64, BK 128): 17 and 40 rows (one ragged
# row block; two), 70 and 100 outputs (two column blocks, the last ragged), I = 160 in groups
# of 32 (two steps, the second a quarter full) and 256 in groups of 128 (one group a step),
# I = 96 (one step, three groups of four). The small ops (BM 16, BN 16, BK 32): 40 rows in
# three blocks, 33 outputs in three, I = 56 in groups of 8 (two steps, the second 3/4 full),
# I = 64 in groups of 32 (a group a step). The split-K ops (std: BM 32, BN 32, BK 128, 4
# splits; small: 16 x 16, 32 inputs a step, 3 splits): I = 640 in groups of 128 (five steps,
# two a split: the last split past the row) and 160 in groups of 32 (two steps: two splits
# empty); I = 136 in groups of 8 (five steps, the last a quarter full) and 64 in 32s.
CHOSEN = [
    ("std.nn.quant_mm::linear_q8_mm", 17, 160, 70, 5, 32, "bf16"),
    ("std.nn.quant_mm::linear_q8_mm", 40, 256, 100, 2, 128, "f32"),
    ("std.nn.quant_mm::linear_q8_mm", 40, 96, 65, 3, 32, "bf16"),
    ("std.nn.quant_mm::linear_q4_mm", 40, 160, 70, 5, 32, "bf16"),
    ("std.nn.quant_mm::linear_q4_mm", 17, 256, 100, 2, 128, "f32"),
    ("std.nn.quant_mm::linear_q4_mm", 17, 256, 65, 2, 128, "bf16"),
    ("std.nn.quant_mm::linear_q4_mm_split", 40, 640, 70, 5, 128, "bf16"),
    ("std.nn.quant_mm::linear_q4_mm_split", 17, 160, 33, 5, 32, "f32"),
    ("quant_mm_tiles::small_q8_mm", 40, 56, 33, 7, 8, "bf16"),
    ("quant_mm_tiles::small_q8_mm", 17, 64, 20, 2, 32, "f32"),
    ("quant_mm_tiles::small_q4_mm", 40, 56, 33, 7, 8, "f32"),
    ("quant_mm_tiles::small_q4_mm", 17, 64, 20, 2, 32, "bf16"),
    ("quant_mm_tiles::small_q4_mm_split", 40, 136, 20, 17, 8, "bf16"),
    ("quant_mm_tiles::small_q4_mm_split", 17, 64, 33, 2, 32, "f32"),
]
# Without CI=1 every chosen case; under it one of each op (support.ci_sample).
RUN_CHOSEN = sorted(
    (
        c
        for op in dict.fromkeys(c[0] for c in CHOSEN)
        for c in ci_sample([c for c in CHOSEN if c[0] == op], 1, op)
    ),
    key=CHOSEN.index,
)
SAMPLED, SAMPLE_SEED = (1, CI_SEED) if CI else (2, 3)

DRIVER = """
import json, sys
import torch
from linnet.lang import Program
from linnet.lang.check.kernel_cases import bound_ops, case_for
from linnet.torch.testing import check_case, check_kernels, use_interpreter

tiles, broken, chosen = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
count, seed = int(sys.argv[4]), int(sys.argv[5])
checks = []
def seen(c):
    checks.append({"op": c.case.op, "generics": c.case.generics, "difference": c.difference,
                   "finding": str(c.finding) if c.finding else None})
# Sampled cases of the small and the std bindings, then the chosen ones.
ops = ["small_q8_mm", "small_q4_mm", "small_q4_mm_split", "linear_q8_mm", "linear_q4_mm",
       "linear_q4_mm_split"]
check_kernels(tiles, count=count, seed=seed, max_size=40, ops=ops, on_check=seen)
use_interpreter()
program = Program.from_file(tiles)
found = {op.qualified_name: op for op in bound_ops(program)}
for name, *shape in chosen:
    op = found[name]
    generics = dict(zip(["N", "I", "O", "NG", "T"], shape[:4] + shape[5:]))
    case = case_for(program, op, generics)
    assert case is not None, (name, generics)
    seen(check_case(program, op, case, 0, torch.device("cpu")))
findings = {}
for f in check_kernels(broken, count=2, seed=0, max_size=40):
    findings.setdefault(f.op.split("::")[-1], []).append(f.problem)
print(json.dumps({"checks": checks, "broken": findings}))
"""


@pytest.fixture(scope="module")
def run() -> dict:
    done = run_guarded(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(TILES),
            str(BROKEN),
            json.dumps(RUN_CHOSEN),
            str(SAMPLED),
            str(SAMPLE_SEED),
        ],
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, f"(CI={CI}, LINNET_CI_SEED={CI_SEED}) {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_quant_mm_kernels_agree_with_their_bodies(run: dict) -> None:
    checks = run["checks"]
    assert [c["finding"] for c in checks if c["finding"]] == []
    assert all(c["difference"] < float("inf") for c in checks)
    # Sampled cases of each op ran (the sampler may find fewer than asked where the kernel's
    # where clause rules most shapes out), then every chosen one.
    ops = [c["op"] for c in checks]
    for op in (
        "small_q8_mm",
        "small_q4_mm",
        "small_q4_mm_split",
        "linear_q8_mm",
        "linear_q4_mm",
        "linear_q4_mm_split",
    ):
        chosen = sum(1 for c in RUN_CHOSEN if c[0].endswith("::" + op))
        assert 1 + chosen <= sum(1 for o in ops if o.endswith("::" + op)) <= SAMPLED + chosen, op
    tail = checks[-len(RUN_CHOSEN) :]
    assert [(c["op"], c["generics"]["N"], c["generics"]["NG"]) for c in tail] == [
        (c[0], c[1], c[4]) for c in RUN_CHOSEN
    ]


def test_the_checker_finds_a_dropped_sign_and_a_dropped_high_nibble(run: dict) -> None:
    """Each broken kernel differs from its body on some drawn case: with 8-bit weights drawn
    in 0..3 (as index tensors are) neither would (no negative int8, no high nibble)."""
    broken = run["broken"]
    assert set(broken) == {"q8_sign_dropped", "q4_high_nibble_dropped"}, broken
    assert all(any("differs" in p for p in problems) for problems in broken.values()), broken


def test_eight_bit_cases_span_their_range() -> None:
    assert integer_range("i8") == (-128, 128)
    assert integer_range("u8") == (0, 256)
    assert integer_range("i32") == (0, 4)  # index tensors stay valid indices


def test_the_chosen_cases_reach_the_edges() -> None:
    """Some chosen case of each std op has a ragged row block and a ragged column block;
    groups of 32 and of 128; an I that leaves the last 128-wide step part full; both T."""
    for op in ("linear_q8_mm", "linear_q4_mm", "linear_q4_mm_split"):
        std = [c for c in CHOSEN if c[0].endswith("::" + op)]
        assert {c[1] for c in std} >= {17, 40}, op
        assert any(c[3] % 64 for c in std), op
        assert {c[5] for c in std} >= {32, 128}, op
        assert any(c[2] % 128 for c in std), op
        assert {c[6] for c in std} == {"bf16", "f32"}, op


def test_the_bindings_hold_for_groups_dividing_128_only() -> None:
    """The kernels launch for groups that divide 128 (a step is whole groups; int4's even);
    for a group of 256, 48 or 96 the where clause is false and the body runs (a tile of 96
    would not be a power of two)."""
    from linnet.torch.kernels import stages

    for op in ("linear_q8_mm", "linear_q4_mm"):
        name = "std.nn.quant_mm::" + op
        for gs, holds in (
            (32, True),
            (128, True),
            (64, True),
            (256, False),
            (48, False),
            (96, False),
            (1, op == "linear_q8_mm"),
        ):
            gen = {"N": 40, "I": gs * 4, "O": 64, "NG": 4, "T": "bf16"}
            assert stages(None, name, gen)[1] is holds, (op, gs)
        ((kernel, kgen),) = stages(None, name, {"N": 40, "I": 256, "O": 64, "NG": 8, "T": "bf16"})[
            0
        ]
        assert kernel == "std.nn.quant_mm::" + op[len("linear_") :] + "_tiles"
        assert (kgen["BM"], kgen["BN"], kgen["BK"], kgen["BG"]) == (32, 64, 128, 4)
    # Split-K: the same steps on 32 x 32 tiles, four splits, then the sum.
    name = "std.nn.quant_mm::linear_q4_mm_split"
    for gs, holds in ((32, True), (128, True), (256, False), (48, False)):
        gen = {"N": 40, "I": gs * 4, "O": 64, "NG": 4, "T": "bf16"}
        assert stages(None, name, gen)[1] is holds, gs
    (part, pgen), (total, sgen) = stages(
        None, name, {"N": 8, "I": 256, "O": 64, "NG": 2, "T": "bf16"}
    )[0]
    assert (part, total) == (
        "std.nn.quant_mm::q4_mm_split_part",
        "std.nn.quant_mm::q4_mm_split_sum",
    )
    assert (pgen["BM"], pgen["BN"], pgen["BK"], pgen["BG"], pgen["KS"]) == (32, 32, 128, 1, 4)
    assert sgen["KS"] == 4


def test_the_products_are_dots_of_16_bit_tiles() -> None:
    """The generated Triton multiplies the dequantised weight tile in T with the x tile in T
    (`dot16`, a tl.dot of 16-bit tiles into f32), not widened f32 tiles: the tensor cores'
    16-bit rate."""
    from linnet.lang.check.tile_lowering import lower_kernel
    from linnet.lang.emit.triton import kernel_text

    program = Program.from_file(TILES)
    sources = {m.source.name: m.source.text.splitlines() for m in program.modules.values()}
    base = {"N": 40, "I": 256, "O": 100, "NG": 2, "GS": 128, "BM": 32, "BN": 64, "BK": 128}
    base["BG"] = 1
    q8 = lower_kernel(program, "std.nn.quant_mm::q8_mm_tiles", base | {"T": "bf16"}, None)
    text = kernel_text(q8, sources, "ieee", set()).source
    assert "w = mul_5.to(tl.bfloat16)" in text or ".to(tl.bfloat16)\n" in text
    assert "dot16(a, tl.trans(w))" in text
    assert "tl.dot(" not in text.split("def run_")[0].split("@triton.jit", 1)[1]
    q4 = lower_kernel(program, "std.nn.quant_mm::q4_mm_tiles", base | {"T": "bf16"}, None)
    text = kernel_text(q4, sources, "ieee", set()).source
    assert "dot16(even, tl.trans(lo))" in text and "dot16(odd, tl.trans(hi))" in text
    # The packed bytes are loaded once a step: one load of q.
    assert text.count("tl.load(q + ") == 1


# A batch-32 decode-like step: an int8 product then an int4 one, in groups of 32, called as
# std.nn.linear's Linear calls them (explicit generics).
QUANT_MODEL = """
use std.nn.linear::{linear_q8, linear_q4}

model QuantStep<N: Dim, D: Dim, O: Dim> {
    param wq8: Tensor[O, D; i8]
    param s8: Tensor[O, D / 32; f16]
    param wq4: Tensor[D, O / 2; u8]
    param d4: Tensor[D, O / 32; f16]
    param m4: Tensor[D, O / 32; f16]

    entry step(x: Tensor[N, D; bf16]) -> Tensor[N, D; bf16] {
        let h = linear_q8<N, D, O, D / 32, 32, bf16>(x, self.wq8, self.s8)
        return linear_q4<N, O, D, O / 32, 32, bf16>(h, self.wq4, self.d4, self.m4)
    }
}
"""

PLANNER = """
import json, sys
import torch
from linnet.torch import load
g = torch.Generator().manual_seed(0)
D, O = 64, 96
weights = {
    "wq8": torch.randint(-128, 128, (O, D), generator=g).to(torch.int8),
    "s8": (torch.rand(O, D // 32, generator=g) / 100).half(),
    "wq4": torch.randint(0, 256, (D, O // 2), generator=g).to(torch.uint8),
    "d4": (torch.rand(D, O // 32, generator=g) / 100).half(),
    "m4": (-torch.rand(D, O // 32, generator=g) / 10).half(),
}
model = load(sys.argv[1], weights=weights, numerics="fast", config={"D": D, "O": O})
x = torch.randn(32, D).bfloat16()
plan = model.plan_for("step", [x], backends=[], measure=False, progress=False)
rows = [(c.backend_name, c.region.callee, c.status) for c in plan.candidates]
(got,) = plan.run([x], model.context_for(plan))
want = load(sys.argv[1], weights=weights, numerics="exact", config={"D": D, "O": O}).run(
    "step", [x])
print(json.dumps({"rows": rows, "explain": plan.explain(),
                  "difference": float((got.float() - want.float()).abs().max()),
                  "scale": float(want.float().abs().max())}))
"""


def test_the_planner_offers_the_quant_mm_kernels_at_batch_32(tmp_path: Path) -> None:
    """A batch-32 step's `linear_q8` and `linear_q4` calls are claimed by the span ops and
    offered as linnet-kernels candidates (unmeasured: the first of a span's taken, the int4
    split-K one set aside as overlapping it; a measured plan times both), `plan.explain()` names them,
    and the plan's run (the kernels, interpreted) equals the exact bodies."""
    path = tmp_path / "quant_step.linnet"
    path.write_text(QUANT_MODEL)
    done = run_guarded(
        [sys.executable, "-c", PLANNER, str(path)], env={**os.environ, "TRITON_INTERPRET": "1"}
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r for r in out["rows"] if r[0] == "linnet-kernels"] == [
        ["linnet-kernels", "std.nn.quant_mm::linear_q8_mm", "taken"],
        ["linnet-kernels", "std.nn.quant_mm::linear_q4_mm", "taken"],
        ["linnet-kernels", "std.nn.quant_mm::linear_q4_mm_split", "overlap"],
    ]
    assert "linear_q8_mm" in out["explain"] and "linear_q4_mm" in out["explain"]
    assert out["difference"] <= 2e-2 * max(1.0, out["scale"]), out
