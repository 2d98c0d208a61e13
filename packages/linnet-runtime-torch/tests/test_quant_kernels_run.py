"""std.nn.quant's decode kernels (issue 42) under Triton's interpreter, against their op bodies
(`linear_q8`, `linear_q4`): at the std bindings' tiles through `linnet kernels --std`
(test_kernel_checks_run.py), and here at small tiles (tests/kernels/quant_tiles.linnet: BR 4,
BO 8, 2 groups a step, 3 splits), so that cases of a few dozen columns run several programs,
several steps, a ragged last step and output block, and splits wholly past the row, with
outputs poisoned with NaN. Then a toy Qwen2's quantised decode planned: its `linear_q8` /
`linear_q4` calls are claimed by the span ops, listed by `plan.explain()`, and the plan's run
(kernels interpreted) equals the model's exact run.

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
import torch
from linnet.lang import Program
from linnet.lang.check.kernel_cases import (
    KernelCase,
    bound_ops,
    checked_program,
    integer_range,
    sample_cases,
)
from support import CI, CI_SEED, ci_sample, run_guarded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

TILES = Path(__file__).parent / "kernels" / "quant_tiles.linnet"
PLAIN = ["small_q8", "small_q8_split", "small_q4", "small_q4_split"]
# The fused prologues and epilogues (std.nn.quant's `rms_norm_qkv_q8`, ...).
FUSED = ["small_q8_gate_up", "small_q8_residual", "small_q4_gate_up", "small_q4_residual"]
QKV = ["small_q8_qkv", "small_q4_qkv"]
ROPE = [
    "small_q8_qkv_rope",
    "small_q4_qkv_rope",
    "small_q8_qkv_rope_heads",
    "small_q4_qkv_rope_heads",
]
OPS = PLAIN + FUSED + QKV + ROPE
# Chosen shapes (N, I, O, NG, T; the group GS = I / NG, a power of two: the kernels' tiles
# are whole groups): 3 groups of 16 (two steps of 2 groups, the last one ragged); GS 32 in
# one step; GS 128; 1, 3 and 4 rows; O over several BO = 8 programs with a ragged last one;
# bf16 and f32. For the splits (KS 3): 2 steps over 3 splits, 4 over 3 (the last split
# wholly past the row), 1 step (NG = 1: two splits wholly past it, which write zeros).
CHOSEN = [
    (1, 48, 17, 3, "f32"),
    (3, 64, 20, 2, "bf16"),
    (3, 256, 9, 2, "bf16"),
    (4, 256, 12, 8, "f32"),
    (2, 16, 9, 1, "bf16"),
]
SAMPLED, SAMPLE_SEED = (1, CI_SEED) if CI else (2, 3)
# The largest size a sampled case's dims are drawn up to: 40; under CI=1 16 for the rotating
# ops (ROPE), whose draws at up to 40 took 1-130 s in the interpreter (H=16, KV=32, HD=32:
# a program per 8 outputs of 80 heads, a rotation each), 1-10 s at 16, which still spans
# several programs and steps; their chosen cases (CHOSEN_ROPE) reach D=48 and 64. The full
# set draws every op at up to 40.
MAX_SIZE = {op: 16 if CI and op in ROPE else 40 for op in OPS}
# (N, D, Q, K, NG, T) of the qkv ops: Q and K not multiples of BO = 8 (a program's lanes
# span two products), 3 groups of 16 (a ragged last step), one row and several.
CHOSEN_QKV = [
    (1, 48, 12, 6, 3, "f32"),
    (3, 64, 20, 4, 2, "bf16"),
    (2, 256, 8, 5, 8, "bf16"),
]
# (N, D, H, KV, HD, NG, T) of the rotating qkv op: grouped heads (H 4 over KV 2, or 3 over
# 1), a ragged last step (3 groups of 16), GS 32 and 64, one row and several.
CHOSEN_ROPE = [
    (1, 48, 3, 1, 8, 3, "f32"),
    (3, 64, 4, 2, 8, 2, "bf16"),
    (2, 64, 2, 2, 4, 1, "bf16"),
]
# The heads kernel takes a KV head's query heads as one tile: G = H / KV a power of two.
CHOSEN_ROPE_HEADS = [
    (1, 48, 4, 1, 8, 3, "f32"),
    (3, 64, 4, 2, 8, 2, "bf16"),
    (2, 64, 2, 2, 4, 1, "bf16"),
]
# The planned toy Llama steps that take the rotating quantised spans (interpreted, about 20 s
# each): both without CI=1, one of the two under it (rotating daily).
LLAMAS = ci_sample([8, 4], 1, "quant-llama")
RUN_CHOSEN = {
    **{op: ci_sample(CHOSEN, 2, op) for op in PLAIN + FUSED},
    **{op: ci_sample(CHOSEN_QKV, 2, op) for op in QKV},
    # The rotating ops are the interpreter's slowest (four of them): one chosen case each
    # under CI=1 (a daily draw), all three without it.
    **{
        op: ci_sample(CHOSEN_ROPE_HEADS if op.endswith("_heads") else CHOSEN_ROPE, 1, op)
        for op in ROPE
    },
}

# A toy std model of `family` with one layer and random quantised weights, shared by the
# drivers below (each runs in a process of its own): its path, config and weights.
TOY_QUANT = """
def toy_quant(family, bits, group):
    import json
    import torch
    from linnet.lang.syntax.program import model_file
    from linnet.torch.model import parameter_types
    path = model_file(f"std.models.{family}")
    toy = json.loads((path.parent / "configs" / family / "toy.json").read_text())
    cfg = {k: v for k, v in toy.items() if not k.startswith("_")}
    cfg.update(NL=1, weight_bits=bits, weight_group=group)
    g = torch.Generator().manual_seed(bits)
    w = {}
    for p, vt, ones in parameter_types(path, cfg):
        if vt.dtype in ("i8", "u8"):
            lo, hi = (-128, 128) if vt.dtype == "i8" else (0, 256)
            w[p] = torch.randint(lo, hi, vt.shape, generator=g).to(torch.int8 if vt.dtype == "i8" else torch.uint8)
        elif vt.dtype == "f16":  # scales and offsets: a level times one is a weight of ~0.02
            w[p] = ((torch.rand(vt.shape, generator=g) - 0.3) * 0.004).half()
        else:
            w[p] = torch.ones(vt.shape) if ones else torch.randn(vt.shape, generator=g) * 0.02
    return path, cfg, w
"""

DRIVER = (
    TOY_QUANT
    + """
import json, sys
import torch
from linnet.lang.check.kernel_cases import bound_ops, case_for, checked_program
from linnet.torch.testing import check_case, check_kernels, use_interpreter

path, chosen, count, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llamas, max_size = json.loads(sys.argv[5]), json.loads(sys.argv[6])
checks = []
def seen(c):
    checks.append({"op": c.case.op, "generics": c.case.generics, "difference": c.difference,
                   "finding": str(c.finding) if c.finding else None})
for size in sorted(set(max_size.values()), reverse=True):
    ops = [op for op in chosen if max_size[op] == size]
    check_kernels(path, count=count, seed=seed, max_size=size, ops=ops, on_check=seen)
use_interpreter()
program = checked_program(path)
for op in bound_ops(program):
    for shape in chosen.get(op.name, []):
        names = [g.name for g in op.generics]
        case = case_for(program, op, dict(zip(names, shape)))
        seen(check_case(program, op, case, 0, torch.device("cpu")))

# The generated Triton of the int4 kernel: the byte tile is loaded once a chunk.
from linnet.torch.kernels import kernel_module
mod = kernel_module(None, "std.nn.quant::q4_gemv_rows", {"N": 1, "I": 64, "O": 16, "NG": 2,
                    "GS": 32, "T": "bf16", "BR": 16, "BO": 8, "BG": 2})
source = open(mod.__file__).read()
body = source[source.index("def q4_gemv_rows"):source.index("def run_q4_gemv_rows")]
body = body[body.index("if USE_PDL:"):]  # after the L2 prefetch block (PDL modes 4, 5)
q_loads = body.count("tl.load(\\n            q +") + body.count("tl.load(q +")

# A toy Qwen2's quantised decode, planned unmeasured: which span ops claim what.
from linnet.torch import load
plans = {}
runs = [("qwen2", "8", 8, 32), ("qwen2", "4", 4, 16)]
runs += [("llama", f"llama{bits}", bits, 32 if bits == 8 else 16) for bits in llamas]
for family, key, bits, group in runs:
    qwen, cfg, w = toy_quant(family, bits, group)
    model = load(qwen, weights=dict(w), config=cfg, numerics="fast")
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    plan = model.plan_for("decode", [token, pos], backends=[], measure=False, progress=False)
    rows = [(c.region.callee, c.region.start, c.status, c.region.stop) for c in plan.candidates
            if c.backend_name == "linnet-kernels"]
    (got,) = plan.run([token, pos], model.context_for(plan))
    want = load(qwen, weights=dict(w), config=cfg, numerics="exact").run("decode", [token, pos])
    plans[key] = {"explain": plan.explain(), "rows": rows,
                   "difference": float((got - want).abs().max()),
                   "scale": float(want.abs().max())}
print(json.dumps({"checks": checks, "q_loads": q_loads, "plans": plans}))
"""
)


@pytest.fixture(scope="module")
def run() -> dict:
    done = run_guarded(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(TILES),
            json.dumps(RUN_CHOSEN),
            str(SAMPLED),
            str(SAMPLE_SEED),
            json.dumps(LLAMAS),
            json.dumps(MAX_SIZE),
        ],
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, f"(CI={CI}, LINNET_CI_SEED={CI_SEED}) {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_small_tile_quant_kernels_agree_with_their_bodies(run: dict) -> None:
    checks = run["checks"]
    assert [c["finding"] for c in checks if c["finding"]] == []
    ops = [c["op"].rsplit("::", 1)[-1] for c in checks]
    # The sampled cases (as many as the sampler finds: the int4 rotating op's five
    # divisibility clauses leave it fewer small shapes) and every chosen one of each op ran.
    program = checked_program(TILES)
    drawn = {
        op.name: len(
            sample_cases(program, op, SAMPLED, seed=SAMPLE_SEED, max_size=MAX_SIZE[op.name])
        )
        for op in bound_ops(program)
        if op.name in OPS
    }
    assert all(drawn[o] >= 1 for o in OPS) and all(drawn[o] == SAMPLED for o in PLAIN + FUSED + QKV)
    assert {o: ops.count(o) for o in OPS} == {o: drawn[o] + len(RUN_CHOSEN[o]) for o in OPS}
    assert all(c["difference"] < float("inf") for c in checks)


def test_the_chosen_cases_reach_edges() -> None:
    """Groups of 16, 32 and 128; a ragged last step (an odd number of groups, 2 a step); O
    not a multiple of BO = 8; one row and several; bf16 and f32; and splits wholly past the
    row (one step of groups for three splits)."""
    groups = {i // ng for _, i, _, ng, _ in CHOSEN}
    assert {16, 32, 128} <= groups and all(g & (g - 1) == 0 for g in groups)
    assert any(ng % 2 for *_, ng, _ in CHOSEN)
    assert any(o % 8 for _, _, o, _, _ in CHOSEN)
    assert {n for n, *_ in CHOSEN} >= {1, 3}
    assert {t for *_, t in CHOSEN} == {"bf16", "f32"}
    assert any(-(-ng // 2) < 3 for *_, ng, _ in CHOSEN)


def test_the_small_bindings_are_the_std_kernels() -> None:
    program = Program.from_file(TILES)
    kernels = {
        op.name: op.kernel.name + (f" then {op.kernel.then.name}" if op.kernel.then else "")
        for op in bound_ops(program)
        if op.name in OPS
    }
    assert kernels == {
        "small_q8": "q8_gemv_rows",
        "small_q8_split": "q8_split_part then q8_split_sum",
        "small_q4": "q4_gemv_rows",
        "small_q4_split": "q4_split_part then q4_split_sum",
        "small_q8_qkv": "rms_norm_q8_qkv_rows",
        "small_q8_qkv_rope": "rms_norm_q8_qkv_rope_rows",
        "small_q8_qkv_rope_heads": "rms_norm_q8_qkv_rope_heads",
        "small_q8_gate_up": "rms_norm_q8_gate_up_rows",
        "small_q8_residual": "q8_residual_rows",
        "small_q4_qkv": "rms_norm_q4_qkv_rows",
        "small_q4_qkv_rope": "rms_norm_q4_qkv_rope_rows",
        "small_q4_qkv_rope_heads": "rms_norm_q4_qkv_rope_heads",
        "small_q4_gate_up": "rms_norm_q4_gate_up_rows",
        "small_q4_residual": "q4_residual_rows",
    }


def test_the_int4_kernel_loads_each_byte_once(run: dict) -> None:
    """One `tl.load` of the packed weight a step; both nibbles come from it in registers."""
    assert run["q_loads"] == 1


def test_a_quantised_decode_plan_claims_the_quant_span_ops(run: dict) -> None:
    """Every quantised product of a toy Qwen2 decode step (q, k, v, o, gate, up, down and
    the LM head: 8) is claimed by both span ops of its width, the one-pass kernel and the
    split-K chain, as candidates of one region; `plan.explain()` lists them; the plan's
    run, kernels interpreted, equals the exact model's."""
    for bits in ("8", "4"):
        found = run["plans"][bits]
        rows = found["rows"]
        for op in (f"linear_q{bits}_gemv", f"linear_q{bits}_split"):
            starts = [s for callee, s, *_ in rows if callee == f"std.nn.quant::{op}"]
            assert len(starts) == 8, (op, rows)
            assert f"{op} [lm_head]" in found["explain"]
        # Unmeasured, each product is in exactly one taken region: its own span op's, or a
        # fused one's (the gate/up pair with its norm, o and down with their residuals).
        products = {s for callee, s, *_ in rows if callee == f"std.nn.quant::linear_q{bits}_gemv"}
        taken = [
            (s, e)
            for callee, s, st, e in rows
            if callee.startswith("std.nn.quant::") and st == "taken"
        ]
        assert all(sum(s <= p < e for s, e in taken) == 1 for p in products), (products, taken)
        fused = {c for c, *_, st, _ in rows if st == "taken"}
        assert {
            f"std.nn.quant::rms_norm_gate_up_q{bits}",
            f"std.nn.quant::linear_q{bits}_residual",
        } <= fused
        assert found["difference"] <= 1e-4 * max(1.0, found["scale"]), found


def test_a_quantised_llama_takes_its_attention_input_as_one_span(run: dict) -> None:
    """A toy Llama's int8 and int4 decode steps (one of them under CI=1; no q/k/v biases,
    unlike Qwen2): the norm, the q/k/v products and both rotations are
    `rms_norm_qkv_rope_q8` (`_q4`) candidates (with the cache writes and without), and the
    plan's run, kernels interpreted, equals the exact model's."""
    assert {k for k in run["plans"] if k.startswith("llama")} == {f"llama{b}" for b in LLAMAS}
    for bits in map(str, LLAMAS):
        found = run["plans"][f"llama{bits}"]
        op = f"std.nn.quant::rms_norm_qkv_rope_q{bits}"
        rope = [r for r in found["rows"] if r[0] == op]
        assert len(rope) == 2, found["rows"]
        assert any(st == "taken" for _, _, st, _ in rope), found["explain"]
        assert found["difference"] <= 1e-4 * max(1.0, found["scale"]), found


def test_checks_draw_8_bit_integers_over_their_whole_range() -> None:
    """`linnet kernels` feeds int8 weights negative values and packed int4 bytes high
    nibbles (integers in 0..3, as before for every integer type, would leave every high
    nibble 0 and every int8 level positive, and a kernel that mixed the nibbles up or read
    int8 as unsigned would pass); token ids and positions stay in 0..3."""
    from linnet.torch.testing import _inputs

    case = KernelCase(
        "m::op",
        "m::k",
        {},
        {"q": ((64, 64), "i8"), "p": ((64, 64), "u8"), "ids": ((64,), "i32")},
        {},
        [],
    )
    q, p, ids = _inputs(case, 0, torch.device("cpu"))
    assert int(q.min()) < -100 and int(q.max()) > 100
    assert int((p // 16).max()) == 15 and int((p % 16).max()) == 15
    assert int(ids.min()) >= 0 and int(ids.max()) <= 3
    assert integer_range("i8") == (-128, 128) and integer_range("u8") == (0, 256)


WIDEN = """
pub kernel widen<N: Dim>(a: Tensor[N; i8], b: Tensor[N; u8]) -> (ya: Tensor[N; f32], yb: Tensor[N; f32]) grid(1) {
    let i = iota<i32>(N)
    store(ya[i], load(a[i], i < N, 0) as f32, i < N)
    store(yb[i], load(b[i], i < N, 0) as f32, i < N)
}
"""


def test_bytes_widen_to_f32_exactly_without_the_conversion_instruction(tmp_path: Path) -> None:
    """Triton widens an i8 or u8 tile to f32 through the magic number 2^23 (integer ops and
    one subtraction: the I2F instruction runs at a sixteenth of the FMA rate and bounds a
    dequantising GEMV); every one of the 256 values of each type comes back exactly."""
    import subprocess

    src = tmp_path / "widen.linnet"
    src.write_text(WIDEN)
    code = (
        "import torch\n"
        "from linnet.torch.kernels import kernel_module\n"
        f"m = kernel_module({str(src)!r}, 'widen::widen', {{'N': 256}})\n"
        "text = open(m.__file__).read()\n"
        "assert '0x4B000080' in text and '0x4B000000' in text, 'not the magic-number form'\n"
        "a = torch.arange(-128, 128, dtype=torch.int8)\n"
        "b = torch.arange(0, 256).to(torch.uint8)\n"
        "ya, yb = m.LAUNCH(a, b)\n"
        "assert torch.equal(ya, a.float()) and torch.equal(yb, b.float())\n"
        "print('exact')\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "exact" in out.stdout, out.stderr[-2000:]


HEADS_DRIVER = (
    TOY_QUANT
    + """
import json, sys
import torch
from linnet.lang.check.spans import Spans
from linnet.torch import load

# Only the heads kernels claim the attention input: the plan takes them (with the cache
# writes), where an unmeasured plan otherwise takes the rope_rows kernels listed first.
ROWS = ("std.nn.quant::rms_norm_qkv_rope_q8", "std.nn.quant::rms_norm_qkv_rope_q4")
_init = Spans.__init__
def _only_heads(self, *a, **k):
    _init(self, *a, **k)
    self.ops = [(p, op) for p, op in self.ops if op.qualified_name not in ROWS]
Spans.__init__ = _only_heads

out = {}
for bits in json.loads(sys.argv[1]):
    path, cfg, w = toy_quant("llama", bits, 32 if bits == 8 else 16)
    model = load(path, weights=dict(w), config=cfg, numerics="fast")
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    plan = model.plan_for("decode", [token, pos], backends=[], measure=False, progress=False)
    taken = [(c.region.callee, c.region.stop - c.region.start) for c in plan.candidates
             if c.backend_name == "linnet-kernels" and c.status == "taken" and "rope" in c.region.callee]
    ctx = model.context_for(plan)
    exact = load(path, weights=dict(w), config=cfg, numerics="exact")
    # Two steps: the second reads the K and V the first wrote through the heads kernel.
    diffs, scale = [], 0.0
    for t, at in ((3, 2), (5, 3)):
        token, pos = torch.tensor([t], dtype=torch.int32), torch.tensor([at], dtype=torch.int32)
        (got,) = plan.run([token, pos], ctx)
        (want,) = exact.run("decode", [token, pos])
        diffs.append(float((got - want).abs().max()))
        scale = max(scale, float(want.abs().max()))
    out[str(bits)] = {"taken": taken, "differences": diffs, "scale": scale}
print(json.dumps(out))
"""
)


def test_the_heads_kernels_write_the_cache_a_planned_step_reads() -> None:
    """A toy Llama's int8 and int4 decode steps (one of them under CI=1) planned with the
    `_heads` kernels as the only claims of the attention input: the plan takes the heads
    kernel claimed with the cache writes (its k and v stores redirected into the cache), and
    two steps' logits equal the exact model's (the second reads the K and V the first wrote)."""
    bits = ci_sample([8, 4], 1, "heads-llama")
    done = run_guarded(
        [sys.executable, "-c", HEADS_DRIVER, json.dumps(bits)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for b in map(str, bits):
        found = out[b]
        ((callee, _),) = found["taken"]
        assert callee == f"std.nn.quant::rms_norm_qkv_rope_q{b}_heads", found
        assert all(d <= 1e-4 * max(1.0, found["scale"]) for d in found["differences"]), found
