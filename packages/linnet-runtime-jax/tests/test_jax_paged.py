"""The paged KV cache on the JAX runtime (issue 44 item 1): `linnet.jax.load(...,
kv_pages=, kv_page_size=)` and the entries `prefill_paged` / `decode_paged` against the dense
`prefill` / `decode` of the same checkpoint, f32 within 1e-5 and the same greedy tokens, in
the PyTorch runtime's scenario (linnet-runtime-torch/tests/test_paged.py, imported from there
so that both runtimes are held to the same checkpoints, page tables and batches): a shuffled
page table, a shared prefix page, a chunked prefill and an empty decode slot; then the
adversarial inputs (a table entry out of range, a position or chunk past S, n > L).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from linnet.jax import load
from linnet.lang import LinnetError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jnp = pytest.importorskip("jax.numpy")


def _paged():
    """linnet-runtime-torch's paged test module, under a name of its own (not collected)."""
    path = Path(__file__).resolve().parents[2] / "linnet-runtime-torch" / "tests" / "test_paged.py"
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location("linnet_torch_paged", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAGED = _paged()
checkpoints = PAGED.checkpoints  # the module-scoped fixture, shared


def i32(x):
    return jnp.asarray(np.asarray(x, dtype=np.int32))


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2"])
def test_jax_paged_entries_equal_dense(checkpoints, name):
    dense = load(weights=checkpoints[name])
    paged = load(weights=checkpoints[name], kv_pages=PAGED.NP, kv_page_size=PAGED.PS)
    PAGED.assert_paged_equals_dense(dense, paged, i32)


def test_jax_paged_inputs_are_checked(checkpoints):
    paged = load(weights=checkpoints["llama"], kv_pages=PAGED.NP, kv_page_size=PAGED.PS)
    mp, s, np_ = PAGED.MP, PAGED.S, PAGED.NP
    tokens = i32([[5, 6, 7, 0]])
    row = [3] + [0] * (mp - 1)
    cases = [
        (lambda: paged.decode_paged(i32([1]), i32([2]), i32([[np_] + [0] * (mp - 1)])), "E0780"),
        (lambda: paged.prefill_paged(tokens, i32([0]), i32([3]), i32([[-1] * mp])), "E0780"),
        (lambda: paged.decode_paged(i32([1]), i32([s]), i32([row])), "E0780"),
        (lambda: paged.prefill_paged(tokens, i32([0]), i32([5]), i32([row])), "E0780"),
        (lambda: paged.prefill_paged(tokens, i32([s - 2]), i32([3]), i32([row])), "E0690"),
    ]
    for call, code in cases:
        with pytest.raises(LinnetError) as e:
            call()
        assert e.value.diagnostics[0].code == code
