"""std.nn.decode_window's kernels (issue 45) under Triton's interpreter, against their op
bodies (`window_decode_attention`, `softcap_decode_attention`) at small tiles (16 positions
a block, whole heads of up to 32 dims, 16 value columns a program): windows shorter than
the cache, the window's first block other than the cache's first, ragged last blocks,
positions at the start, the middle and the end; outputs poisoned with NaN. The kernels walk
the cache from the window's first block: a window's loads are its positions only.

Kernels run in a subprocess: Triton's interpreter must be chosen before Triton is first
imported, which this pytest process may already have done.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
from support import CI, ci_sample, run_guarded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

# (kernel, B, S, KV, G, HD, T, pos, window, cap): cap 0 is the window kernel (no cap).
CASES = [
    ("window", 2, 40, 2, 4, 32, "f32", [39, 20], 5, 0.0),
    ("window", 1, 33, 3, 3, 24, "bf16", [32], 20, 0.0),
    ("window", 3, 40, 1, 1, 16, "f32", [0, 17, 31], 1, 0.0),
    ("softcap", 2, 40, 2, 4, 32, "f32", [39, 3], 7, 2.0),
    ("softcap", 1, 33, 3, 3, 24, "bf16", [32], 0, 5.0),  # no window: every position
    ("softcap", 3, 40, 1, 1, 16, "f32", [0, 17, 31], 40, 1.5),
]
RUN = [
    c
    for kind in ("window", "softcap")
    for c in ci_sample([c for c in CASES if c[0] == kind], 2 if CI else 3, kind)
]

DRIVER = """
import json, sys, tempfile
from pathlib import Path
import torch
from linnet.torch import load
from linnet.torch.kernels import kernel_module, op_case
from linnet.torch.testing import compare, use_interpreter
use_interpreter()
out = []
for kind, b, s, kv, g, hd, dtype, last, window, cap in json.loads(sys.argv[1]):
    generics = {"B": b, "S": s, "KV": kv, "G": g, "HD": hd, "T": dtype}
    scalars = {"scale": 0.3, "window": window} | ({"cap": cap} if kind == "softcap" else {})
    case = op_case(f"std.nn.decode_window::{kind}_decode_attention_flash", generics, scalars)
    q, k, v, pos = case.random_inputs("cpu", seed=len(out))
    q = q * 4  # scores of a few units: the cap bends them
    pos = torch.tensor(last, dtype=torch.int32)
    mod = kernel_module(None, f"std.nn.decode_window::{kind}_decode_attention_tiles",
                        generics | {"BG": 16, "BS": 16, "BH": 32, "BD": 16}, scalars)
    mod.POISON = True
    got = mod.LAUNCH(q, k, v, pos)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.linnet"
        path.write_text(case.text)
        want = load(path, weights={}, numerics="exact").run("run", [q, k, v, pos])
    # Positions outside the window must not matter: NaN there leaves the result as it is.
    k2, v2 = k.clone(), v.clone()
    for row, p in enumerate(last):
        lo = max(p - window + 1, 0) if window > 0 else 0
        k2[row, :lo] = float("nan")
        v2[row, :lo] = float("nan")
        k2[row, p + 1:] = float("nan")
        v2[row, p + 1:] = float("nan")
    masked = mod.LAUNCH(q, k2, v2, pos)
    found, diff = compare(got, want, dtype)
    out.append({"case": [kind, b, s, window], "difference": diff,
                "finding": None if found is None else str(found),
                "outside_read": bool(masked.isnan().any()),
                "same_without_outside": bool(torch.equal(masked, got))})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def run() -> list[dict]:
    done = run_guarded(
        [sys.executable, "-c", DRIVER, json.dumps(RUN)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_window_and_softcap_kernels_equal_their_bodies(run: list[dict]) -> None:
    assert len(run) == len(RUN)
    assert [r["finding"] for r in run if r["finding"]] == []
    assert all(r["difference"] < float("inf") for r in run)


def test_positions_outside_the_window_are_not_read(run: list[dict]) -> None:
    """NaN keys and values before the window and after pos[b] change nothing: the kernels
    never load them (a masked load touches no memory)."""
    assert [r["case"] for r in run if r["outside_read"] or not r["same_without_outside"]] == []
