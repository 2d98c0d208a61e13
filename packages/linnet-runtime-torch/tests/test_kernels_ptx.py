"""What the CPU's interpreter cannot show, from PTX compiled for sm_90 on this machine
(kernels_ptx.py, in a fresh process without TRITON_INTERPRET): under PREFETCH (PDL modes 4
and 5) the L2 prefetches are issued before `griddepcontrol.wait` and no load is, without it
there is no prefetch, and flash-decoding's products of bf16 tiles are tensor-core MMAs (dot16)."""

import json
import os
import sys
from pathlib import Path

import pytest
from support import run_guarded

pytest.importorskip("triton")
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = run_guarded([sys.executable, str(HERE / "kernels_ptx.py")], env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in found:  # Triton's own copy kernel does not compile for sm_90 here
        pytest.skip(f"this Triton cannot compile for sm_90 here: {found['skip']}")
    return found


@pytest.mark.parametrize(
    "kernel",
    [
        "rms_norm_qkv_split_part",
        "decode_attention_split_tiles",
        "qkv_rope_attention_split_tiles",
        "qkv_attention_combine_tiles",
    ],
)
def test_the_prefetch_is_l2_prefetches_before_the_wait(compiled, kernel):
    pre, plain = compiled[kernel]["prefetch"], compiled[kernel]["plain"]
    wait = pre["wait"]
    assert len(wait) == 1 and pre["prefetch"] and max(pre["prefetch"]) < wait[0]
    assert pre["loads"] and min(pre["loads"]) > wait[0]  # no register loaded before the wait
    assert len(plain["wait"]) == 1 and not plain["prefetch"]
    assert plain["loads"] and min(plain["loads"]) > plain["wait"][0]


def test_flash_decoding_multiplies_bf16_tiles_on_the_tensor_cores(compiled):
    assert compiled["decode_attention_split_tiles"]["plain"]["mma"]


def test_the_attention_splits_that_finish_q_k_v_multiply_bf16_tiles_on_the_tensor_cores(compiled):
    """`rms_norm_qkv_rope_attention`'s splits select the new k and v rows into the cache
    block in bf16 and widen it after, so both products stay 16-bit MMAs (dot16)."""
    assert compiled["qkv_rope_attention_split_tiles"]["plain"]["mma"]


def test_the_edge_kernel_s_max_and_min_let_a_nan_win_in_ptx(compiled):
    """tests/kernels/edges.linnet compiled for sm_90: every float max and min, elementwise
    and in reductions, is `max.NaN.f32`/`min.NaN.f32` (before: Triton's default `max.f32`,
    which returns the other operand; issue 46, the edge-value rules in kernels)."""
    found = compiled["edges"]
    extremes = [i for i in found if i.startswith(("max.", "min.")) and i.endswith("f32")]
    assert extremes and all(".NaN." in i for i in extremes), found
