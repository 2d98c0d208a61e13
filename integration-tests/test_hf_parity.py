"""The Llama example against Hugging Face transformers on the same random weights (CPU).

Prefill logits must match within 1e-4 (f32), and 32 greedy decode steps must produce the
same tokens, through the interpreter, the generated source and compile=True.
"""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from linnet.torch import load  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
STEPS = 32
TOLERANCE = 1e-4
THETA = 10000.0


def hf_config() -> "transformers.LlamaConfig":
    return transformers.LlamaConfig(
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


def linnet_config(cfg) -> dict:
    """The few values a checkpoint does not carry, from the Hugging Face config."""
    return {
        "H": cfg.num_attention_heads,
        "KV": cfg.num_key_value_heads,
        "S": 128,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": rope_theta(cfg),
        "tie_word_embeddings": cfg.tie_word_embeddings,
    }


def rope_theta(cfg) -> float:
    # transformers 5 keeps it in rope_parameters; 4.x has cfg.rope_theta.
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", THETA)))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    cfg = hf_config()
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("hf") / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    prompt = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(prompt).logits
        generated = model.generate(
            prompt, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS, pad_token_id=0
        )
    return path, cfg, prompt, logits, generated[0, prompt.shape[1] :].tolist()


def greedy(model, prompt: "torch.Tensor", steps: int) -> tuple:
    tokens = prompt.to(torch.int32)
    logits = model.prefill(tokens)
    out = [int(logits[0, -1].argmax())]
    pos = tokens.shape[1]
    for _ in range(steps - 1):
        step = model.decode(
            torch.tensor([out[-1]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32)
        )
        out.append(int(step[0].argmax()))
        pos += 1
    return logits, out


@pytest.mark.parametrize("mode", ["interpreter", "generated", "compile"])
def test_matches_transformers(checkpoint, mode):
    path, cfg, prompt, hf_logits, hf_tokens = checkpoint
    kwargs = {"interpret": mode == "interpreter", "compile": mode == "compile"}
    model = load(LLAMA, weights=path, config=linnet_config(cfg), **kwargs)
    logits, tokens = greedy(model, prompt, STEPS)
    assert logits.shape == hf_logits.shape
    assert (logits - hf_logits).abs().max().item() < TOLERANCE
    assert tokens == hf_tokens
