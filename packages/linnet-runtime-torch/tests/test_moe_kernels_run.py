"""std.nn.moe_kernels' span kernels (issue 45) under Triton's interpreter, against their op
body (`moe_experts`): at small tiles (tests/kernels/moe_tiles.linnet: decode 8 outputs and
16 columns a step, prefill 16 x 16 tiles and 16 columns a step), on sampled shapes and on
chosen edge shapes (ragged last chunks and programs, 1 to 17 rows, K 1 to 8, E 8 to 64, the
random indices 0..7 repeating an expert within a row), with outputs poisoned with NaN; and
the decode kernels with every expert a step does not choose filled with NaN: they read only
the chosen experts, so the result is finite and equals the body's.

Kernels run in a subprocess: Triton's interpreter must be chosen before Triton is first
imported, which this pytest process may already have done.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
from linnet.lang import Program
from linnet.lang.check.kernel_cases import bound_ops
from linnet.lang.syntax.program import STD_ROOT
from support import CI, CI_SEED, ci_sample, run_guarded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

TILES = Path(__file__).parent / "kernels" / "moe_tiles.linnet"
OPS = ["small_moe_gemv", "small_moe_grouped"]
# (N, D, F, E, K, T): D over several 16-column chunks with a ragged last one, F (decode) or
# D (prefill) over several 8- or 16-wide programs with a ragged last one.
CHOSEN = {
    "small_moe_gemv": [
        (1, 40, 17, 8, 2, "bf16"),  # batch 1, Mixtral's top-2 of 8
        (3, 33, 24, 9, 1, "f32"),  # top-1
        (16, 16, 8, 8, 3, "bf16"),  # 16 rows, one chunk
        (1, 17, 40, 64, 8, "f32"),  # top-8 of 64 (OLMoE's, Qwen3's 128)
    ],
    "small_moe_grouped": [
        (17, 40, 20, 8, 2, "bf16"),  # two row tiles, the last of one row
        (33, 16, 33, 9, 1, "f32"),  # three row tiles, D ragged over three programs
        (5, 33, 17, 8, 4, "bf16"),  # K = 4, the slot tile's width
        (40, 20, 16, 12, 3, "f32"),
    ],
}
# (N, D, F, E, T, chosen experts of each row): the decode kernels with every other expert NaN.
UNCHOSEN_NAN = [
    (1, 40, 17, 8, "bf16", [[3, 6]]),
    (2, 33, 24, 16, "f32", [[0, 15], [7, 8]]),
]
SAMPLED, SAMPLE_SEED = (1, CI_SEED) if CI else (2, 3)
RUN_CHOSEN = {op: ci_sample(shapes, 2, op) for op, shapes in CHOSEN.items()}
RUN_NAN = ci_sample(UNCHOSEN_NAN, 1, "unchosen")

DRIVER = """
import json, sys, tempfile
from pathlib import Path
import torch
from linnet.lang.check.kernel_cases import bound_ops, case_for, checked_program
from linnet.torch import load
from linnet.torch.kernels import kernel_module, op_case, stages
from linnet.torch.testing import check_case, check_kernels, compare, use_interpreter

path, chosen, unchosen, count, seed = (sys.argv[1], json.loads(sys.argv[2]),
                                       json.loads(sys.argv[3]), *map(int, sys.argv[4:6]))
checks = []
def seen(c):
    checks.append({"op": c.case.op, "generics": c.case.generics, "difference": c.difference,
                   "finding": str(c.finding) if c.finding else None})
check_kernels(path, count=count, seed=seed, max_size=40, ops=list(chosen), on_check=seen)
use_interpreter()
program = checked_program(path)
for op in bound_ops(program):
    for shape in chosen.get(op.name, []):
        names = [g.name for g in op.generics]
        case = case_for(program, op, dict(zip(names, shape)))
        seen(check_case(program, op, case, 0, torch.device("cpu")))
nan = []
for n, d, f, e, dtype, picked in unchosen:
    k = len(picked[0])
    generics = {"N": n, "D": d, "F": f, "E": e, "K": k, "T": dtype}
    case = op_case("std.nn.moe_kernels::moe_experts_gemv", generics)
    x, wg, wu, wd, w, idx = case.random_inputs("cpu", seed=7 + len(nan))
    idx = torch.tensor(picked, dtype=torch.int32)
    others = sorted(set(range(e)) - {i for row in picked for i in row})
    for t in (wg, wu, wd):
        t[others] = float("nan")
    ins = [x, wg, wu, wd, w, idx]
    (first, fgen), (second, sgen) = stages(program, "moe_tiles::small_moe_gemv", generics)[0]
    up, down = kernel_module(program, first, fgen), kernel_module(program, second, sgen)
    up.POISON = down.POISON = True
    got = down.LAUNCH(*ins, up.LAUNCH(*ins))
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "case.linnet"
        p.write_text(case.text)
        want = load(p, weights={}, numerics="exact").run("run", ins)
    found, diff = compare(got, want, dtype)
    nan.append({"generics": generics, "difference": diff, "finite": bool(got.isfinite().all()),
                "body_finite": bool(want.isfinite().all()),
                "finding": None if found is None else str(found)})
print(json.dumps({"checks": checks, "nan": nan}))
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
            json.dumps(RUN_NAN),
            str(SAMPLED),
            str(SAMPLE_SEED),
        ],
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, f"(CI={CI}, LINNET_CI_SEED={CI_SEED}) {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_small_tile_moe_kernels_agree_with_the_body(run: dict) -> None:
    checks = run["checks"]
    assert [c["finding"] for c in checks if c["finding"]] == []
    ops = [c["op"].rsplit("::", 1)[-1] for c in checks]
    assert {o: ops.count(o) for o in OPS} == {o: SAMPLED + len(RUN_CHOSEN[o]) for o in OPS}
    assert all(math.isfinite(c["difference"]) for c in checks)


def test_decode_reads_only_the_chosen_experts(run: dict) -> None:
    """Every expert a step does not choose is NaN: a kernel that read one (even to multiply
    it by 0) would return NaN."""
    assert run["nan"] and all(c["finite"] and c["body_finite"] for c in run["nan"])
    assert [c["finding"] for c in run["nan"] if c["finding"]] == []


def test_the_chosen_cases_reach_several_chunks_and_programs() -> None:
    for op, shapes in CHOSEN.items():
        assert max(s[1] for s in shapes) > 16, op  # several D chunks
        assert max(s[2] for s in shapes) > 16, op  # several F chunks / programs
        assert {s[4] for s in shapes} >= {1, 2, 3}, op
    assert max(s[0] for s in CHOSEN["small_moe_grouped"]) > 32  # three row tiles


def test_the_small_bindings_are_the_std_kernels() -> None:
    """The small bindings name std.nn.moe_kernels' kernels, in the std span ops' order."""
    program = Program.from_file(TILES)
    std = Program.from_file(STD_ROOT / "nn" / "moe_kernels.linnet")

    def chain(op) -> list[str]:
        out, k = [], op.kernel
        while k is not None:
            out.append(k.name)
            k = k.then
        return out

    small = {op.name: chain(op) for op in bound_ops(program) if op.name in OPS}
    full = {op.name: chain(op) for op in bound_ops(std)}
    assert small["small_moe_gemv"] == full["moe_experts_gemv"]
    assert small["small_moe_grouped"] == full["moe_experts_grouped"]


@pytest.mark.gpu
def test_moe_kernels_agree_with_the_body_on_cuda():
    """Compiled for the GPU (not the interpreter): both span ops at the std tiles, and at
    the small tiles, on random shapes, against the body."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.torch.testing import check_kernels

    ops = ["moe_experts_gemv", "moe_experts_grouped"]
    std = check_kernels(
        STD_ROOT / "nn" / "moe_kernels.linnet", count=4, max_size=200, ops=ops, device="cuda"
    )
    small = check_kernels(TILES, count=4, max_size=100, ops=OPS, device="cuda")
    assert [str(f) for f in std + small] == []


@pytest.mark.gpu
def test_a_mixtral_step_with_the_moe_kernels_on_cuda():
    """A toy Mixtral of 8 experts (the kernels apply from 8) on CUDA: its prefill (the
    grouped chain's shapes) and decode steps (the gather-GEMV chain's) under numerics "fast"
    give the logits the exact numerics (the op's body) give, within a dot's rounding."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.lang.syntax.program import model_file
    from linnet.torch import load
    from linnet.torch.model import random_weights

    toy = json.loads((STD_ROOT / "models" / "configs" / "mixtral" / "toy.json").read_text())
    config = {k: v for k, v in toy.items() if not k.startswith("_")} | {"num_experts": 8}
    weights = random_weights(model_file("std.models.mixtral"), config, scale=0.2, device="cuda")
    fast = load(
        "std.models.mixtral", config=config, weights=weights, device="cuda", numerics="fast"
    )
    exact = load(
        "std.models.mixtral", config=config, weights=weights, device="cuda", numerics="exact"
    )
    tokens = torch.tensor([[1, 5, 9, 2, 7, 3] * 6], dtype=torch.int32, device="cuda")
    a, b = fast.prefill(tokens), exact.prefill(tokens)
    assert (a - b).abs().max().item() <= 2e-2 * b.abs().max().item()
    step = [
        torch.tensor([4], dtype=torch.int32, device="cuda"),
        torch.tensor([36], dtype=torch.int32, device="cuda"),
    ]
    a, b = fast.decode(*step), exact.decode(*step)
    assert (a - b).abs().max().item() <= 2e-2 * b.abs().max().item()
