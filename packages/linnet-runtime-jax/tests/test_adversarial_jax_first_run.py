"""`linnet run --runtime jax` in a newcomer's first minutes (issue 46, items 9-11, 15):
a shipped model runs on its toy config; a Hugging Face checkpoint directory runs the model
its config.json names; the checkpoint's end-of-sequence tokens are the loaded JAX model's
``stop_tokens`` and stop `linnet run`; `--threads` is the torch runtime's (E0790)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

pytest.importorskip("jax")
from linnet.jax import load
from linnet.lang.cli import main

# The toy Qwen2 (std/models/configs/qwen2/toy.json) as transformers' config.json says it.
QWEN2_TOY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def decoded(out: str) -> list[int]:
    return json.loads(re.search(r"decoded \d+ tokens: (\[.*\])", out).group(1))


def test_a_checkpoint_directory_stops_at_its_eos_on_jax(capsys, linnet_home, tmp_path):
    """Before: `linnet run std.models.qwen2 --runtime jax` ended in E0603, a checkpoint
    directory in unrelated errors, and its eos was never read."""
    argv = ["run", "--runtime", "jax", "--prompt", "5,17,200", "--tokens", "10"]
    assert main([*argv[:1], "std.models.qwen2", *argv[1:], "--stop", "none"]) == 0
    full = decoded(capsys.readouterr().out)
    assert len(full) == 10
    step = next(i for i in range(2, 8) if full[i] not in full[:i])
    # The same weights (the demo's toy Qwen2) as a Hugging Face checkpoint directory.
    ckpt = tmp_path / "Qwen2-toy"
    ckpt.mkdir()
    shutil.copy(
        next((linnet_home / "demo").glob("qwen2-*.safetensors")), ckpt / "model.safetensors"
    )
    (ckpt / "config.json").write_text(json.dumps(QWEN2_TOY))
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": full[step]}))
    assert load("std.models.qwen2", weights=ckpt, config={"S": 32}).stop_tokens == (full[step],)
    assert main([*argv[:1], str(ckpt), *argv[1:]]) == 0
    out = capsys.readouterr()
    assert "running std.models.qwen2" in out.err and "stopping at generation_config.json" in out.err
    assert decoded(out.out) == full[: step + 1]


def test_threads_are_the_torch_runtimes(capsys):
    assert main(["run", "--runtime", "jax", "--threads", "1"]) == 1
    assert "error[E0790]: `--threads` is an option of the torch runtime" in capsys.readouterr().err
