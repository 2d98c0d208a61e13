"""The Llama example through `load_function` against Hugging Face transformers on the same
random weights (CPU): prefill logits within 1e-4 (f32), 32 greedy tokens equal through the
decode entry and its KV cache, and the PyTorch interpreter agreeing on the same tokens.

torch and transformers build the reference here only; the runtime itself never imports
torch (tests/test_jax_install.py proves it in a fresh environment).
"""

import numpy as np
import pytest
from jax_support import LLAMA
from linnet.jax import load_function

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STEPS = 32
TOLERANCE = 1e-4
THETA = 10000.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=THETA,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("hf") / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    prompt = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(prompt).logits
        generated = model.generate(
            prompt, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS, pad_token_id=0
        )
    config = {
        "H": 4,
        "KV": 2,
        "S": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": THETA,
        "tie_word_embeddings": False,
    }
    return (
        path,
        config,
        prompt.numpy().astype(np.int32),
        logits.numpy(),
        generated[0, prompt.shape[1] :].tolist(),
    )


def greedy(path, config, prompt: np.ndarray, steps: int) -> tuple[np.ndarray, list[int]]:
    """Prefill, then decode greedily through the decode entry, the KV cache passed along
    (and donated) from call to call."""
    prefill = load_function(LLAMA, "prefill", weights=path, config=config)
    decode = load_function(LLAMA, "decode", weights=path, config=config)
    states = prefill.new_states([prompt])
    (logits,), states = prefill(prefill.params, states, [prompt])
    out = [int(np.asarray(logits)[0, -1].argmax())]
    pos = prompt.shape[1]
    for _ in range(steps - 1):
        ins = [np.array([out[-1]], np.int32), np.array([pos], np.int32)]
        (step,), states = decode(decode.params, states, ins)
        out.append(int(np.asarray(step)[0].argmax()))
        pos += 1
    return np.asarray(logits), out


def test_load_function_matches_transformers(checkpoint):
    path, config, prompt, hf_logits, hf_tokens = checkpoint
    logits, tokens = greedy(path, config, prompt, STEPS)
    assert logits.shape == hf_logits.shape
    assert np.abs(logits - hf_logits).max() < TOLERANCE
    assert tokens == hf_tokens


def test_load_function_matches_the_pytorch_interpreter(checkpoint):
    from linnet.torch import load

    path, config, prompt, _, _ = checkpoint
    model = load(LLAMA, weights=path, config=config, interpret=True)
    want = model.prefill(torch.from_numpy(prompt)).numpy()
    logits, tokens = greedy(path, config, prompt, 8)
    assert np.abs(logits - want).max() < TOLERANCE
    out = [int(want[0, -1].argmax())]
    pos = prompt.shape[1]
    for _ in range(7):
        step = model.decode(
            torch.tensor([out[-1]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32)
        )
        out.append(int(step[0].argmax()))
        pos += 1
    assert tokens == out
