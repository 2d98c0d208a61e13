"""GGUF files loaded by the JAX runtime (issue 40, item 2): the same small random files the
PyTorch runtime's tests load (gguf_files.py), quantised, picked from the file's architecture
and dequantised on the host; weights equal transformers' dequantised weights and the prefill
logits agree (f32, 1e-4). torch and transformers build the reference only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gguf_files import hf_model, transformers_reference, write_gguf  # noqa: E402
from linnet.jax import load  # noqa: E402
from linnet.jax.quantize import dequantized  # noqa: E402

TOKENS = [[1, 5, 9, 20, 33, 50, 70, 3, 88, 41]]


@pytest.mark.parametrize(("family", "quant"), [("llama", "Q4_1"), ("qwen2", "Q8_0")])
def test_a_quantised_file_equals_transformers(tmp_path: Path, family: str, quant: str) -> None:
    path = write_gguf(tmp_path / f"{family}.gguf", family, hf_model(family), quant=quant)
    model = load(weights=str(path))  # the model is picked from the file
    reference, _ = transformers_reference(path)
    expected = reference.state_dict()
    # On the CPU the file is dequantised by default (test_jax_quantize keeps it quantised).
    assert not any(k.endswith(("_q8", "_q4")) for k in model.params)
    for name, value in dequantized(model.params, np.float32).items():
        np.testing.assert_array_equal(np.asarray(value), expected[name].numpy(), err_msg=name)
    with torch.no_grad():
        want = reference(torch.tensor(TOKENS)).logits.numpy()
    got = np.asarray(model.prefill(np.asarray(TOKENS, np.int32)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert model.stop_tokens == (2,)
