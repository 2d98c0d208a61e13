"""What the CPU's interpreter cannot show, from PTX compiled for sm_90 on this machine
(kernels_ptx.py, in a fresh process without TRITON_INTERPRET): under PREFETCH (PDL modes 4
and 5) every prefetch is a volatile load issued before `griddepcontrol.wait`, without it
there is none, and flash-decoding's products of bf16 tiles are tensor-core MMAs (dot16)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(HERE / "kernels_ptx.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in found:  # Triton's own copy kernel does not compile for sm_90 here
        pytest.skip(f"this Triton cannot compile for sm_90 here: {found['skip']}")
    return found


@pytest.mark.parametrize("kernel", ["rms_norm_qkv_split_part", "decode_attention_split_tiles"])
def test_the_prefetch_is_volatile_loads_before_the_wait(compiled, kernel):
    pre, plain = compiled[kernel]["prefetch"], compiled[kernel]["plain"]
    assert len(pre["wait"]) == 1 and pre["volatile"] and max(pre["volatile"]) < pre["wait"][0]
    assert len(plain["wait"]) == 1 and not plain["volatile"]


def test_flash_decoding_multiplies_bf16_tiles_on_the_tensor_cores(compiled):
    assert compiled["decode_attention_split_tiles"]["plain"]["mma"]
