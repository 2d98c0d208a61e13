"""Small random GGUF files for the tests, written the way llama.cpp's converter writes a
Hugging Face checkpoint: tensor names from gguf's own table (``gguf.get_tensor_name_map``),
Llama's q/k rows permuted, Gemma's norms stored as ``1 + w``, GPT-2's Conv1D weights
transposed and its embedding written twice, 2-D weights quantised with
``gguf.quants.quantize`` (or, for the K-quants gguf cannot quantise, random blocks with finite
scales), and a byte-level BPE tokenizer.

Shared by linnet-lang's, the PyTorch runtime's and the JAX runtime's tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# Tiny Hugging Face configs, one per family (transformers' config class by model_type).
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    ),
    "mistral": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=128,
        sliding_window=None,
        tie_word_embeddings=False,
        head_dim=16,
    ),
    "qwen2": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    ),
    "gemma": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=128,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
    ),
    "phi3": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "gpt2": dict(
        vocab_size=96,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=128,
        layer_norm_epsilon=1e-5,
        activation_function="gelu_new",
    ),
}
_GEMMA2 = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=16,  # = head_dim: what llama.cpp computes below 27B
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    sliding_window=4,  # under the tests' 10 tokens
    tie_word_embeddings=True,
)
# Issue 45's families: Gemma 2 (soft-capping at its defaults), Gemma 3 text (a global layer
# every second), Qwen3.
HF_CONFIGS["gemma2"] = _GEMMA2 | dict(rope_theta=10000.0)
HF_CONFIGS["gemma3"] = _GEMMA2 | dict(sliding_window_pattern=2, final_logit_softcapping=20.0)
HF_CONFIGS["qwen3"] = dict(HF_CONFIGS["qwen2"], head_dim=16, tie_word_embeddings=False)
# transformers' model_type where it is not the family's name.
MODEL_TYPE = {"gemma3": "gemma3_text"}
ARCH = {
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "qwen3": "qwen3",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "gemma": "gemma",
    "phi3": "phi3",
    "gpt2": "gpt2",
}
_GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# Where each K-quant block keeps its fp16 scale(s): byte offsets into the block.
_K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def hf_model(family: str, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised transformers model of ``family``'s tiny config (f32, eval)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        MODEL_TYPE.get(family, family), **{**HF_CONFIGS[family], **overrides}
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms away from 1 (and biases away from 0) so mistakes show
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (HF -> GGUF).
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def k_blocks(rows: int, cols: int, quant: str, seed: int = 0) -> np.ndarray:
    """Random K-quant blocks (gguf cannot quantise to K-quants) with finite fp16 scales."""
    import gguf

    qtype = gguf.GGMLQuantizationType[quant]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in _K_SCALES[quant]:
        scale = rng.uniform(0.001, 0.02, (rows, cols // block)).astype(np.float16)
        data[:, :, at : at + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, cols // block * size)


def write_gguf(
    path: Path,
    family: str,
    model: Any,
    quant: str | dict[str, str] = "F32",
    tokenizer: bool = True,
    meta: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    extra: dict[str, np.ndarray] | None = None,
    arch: str | None = None,
) -> Path:
    """Write ``model`` (a transformers model of ``family``) as llama.cpp would. ``quant``:
    the type of every 2-D weight, or a dict from GGUF tensor name to type (others F32);
    ``meta`` adds or overrides metadata (a value None drops the key); ``drop`` leaves GGUF
    tensors out; ``extra`` adds tensors as they are."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    arch = arch or ARCH[family]
    writer = gguf.GGUFWriter(str(path), arch)
    n_layers = cfg.num_hidden_layers
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None)
    kv_heads = kv or heads
    values: dict[str, Any] = {
        f"{arch}.block_count": n_layers,
        f"{arch}.context_length": cfg.max_position_embeddings,
        f"{arch}.embedding_length": cfg.hidden_size,
        f"{arch}.feed_forward_length": getattr(cfg, "intermediate_size", None)
        or 4 * cfg.hidden_size,
        f"{arch}.attention.head_count": heads,
    }
    if family == "gpt2":
        values[f"{arch}.attention.layer_norm_epsilon"] = float(cfg.layer_norm_epsilon)
    else:
        values[f"{arch}.attention.head_count_kv"] = kv_heads
        values[f"{arch}.attention.layer_norm_rms_epsilon"] = float(cfg.rms_norm_eps)
        rope = cfg.rope_parameters
        values[f"{arch}.rope.freq_base"] = float(
            getattr(cfg, "rope_theta", None)
            or rope.get("rope_theta")
            or rope["full_attention"]["rope_theta"]  # Gemma 3: the global layers'
        )
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        values[f"{arch}.rope.dimension_count"] = head_dim
        if family in ("gemma", "gemma2", "gemma3", "qwen3"):
            values[f"{arch}.attention.key_length"] = head_dim
            values[f"{arch}.attention.value_length"] = head_dim
        if family in ("gemma2", "gemma3"):
            values[f"{arch}.attention.sliding_window"] = cfg.sliding_window
            if cfg.final_logit_softcapping is not None:
                values[f"{arch}.final_logit_softcapping"] = float(cfg.final_logit_softcapping)
        if family == "gemma2":
            values[f"{arch}.attn_logit_softcapping"] = float(cfg.attn_logit_softcapping)
        if family == "gemma3":
            values[f"{arch}.attention.sliding_window_pattern"] = 2
    if tokenizer:
        vocab = cfg.vocab_size
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [
            chr(0x100 + i) if i < 64 else f"t{i}" for i in range(vocab - 3)
        ]
        values.update(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "gpt2",
                "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (vocab - 3),
                "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 2,
            }
        )
    values.update(meta or {})
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCH[family].upper()], n_layers)
    tensors: dict[str, np.ndarray] = {}
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight" and getattr(cfg, "tie_word_embeddings", False):
            continue
        if family == "gpt2" and hf_name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # GPT-2's causal mask buffer, no weight
        w = p.detach().cpu().numpy().astype(np.float32)
        base, _, suffix = hf_name.rpartition(".")
        name = names.get_name(base)
        assert name is not None, hf_name
        name = f"{name}.{suffix}"
        if family in ("llama", "mistral") and name.endswith(("attn_q.weight", "attn_q.bias")):
            w = _permute(w, heads)
        if family in ("llama", "mistral") and name.endswith(("attn_k.weight", "attn_k.bias")):
            w = _permute(w, kv_heads)
        if family in ("gemma", "gemma2", "gemma3") and name.endswith("norm.weight"):
            w = w + 1
        if family == "gpt2" and hf_name.endswith(_GPT2_CONV1D):
            w = w.T.copy()
        tensors[name] = w
    if family == "gpt2":
        tensors["output.weight"] = tensors["token_embd.weight"].copy()
    tensors.update(extra or {})
    for name, w in tensors.items():
        if name in drop:
            continue
        q = quant.get(name, "F32") if isinstance(quant, dict) else (quant if w.ndim == 2 else "F32")
        qtype = gguf.GGMLQuantizationType[q]
        if q == "F32":
            writer.add_tensor(name, np.ascontiguousarray(w))
        elif q == "F16":
            writer.add_tensor(name, w.astype(np.float16))
        elif q in _K_QUANTS:
            writer.add_tensor(
                name, k_blocks(*w.shape, q, seed=len(name)), raw_shape=None, raw_dtype=qtype
            )
        else:
            try:
                blocks = quantize(w, qtype)
            except NotImplementedError:  # IQ types: zero blocks of the right size
                blocks = np.zeros(gguf.quant_shape_to_byte_shape(w.shape, qtype), np.uint8)
            writer.add_tensor(name, blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_reference(path: Path) -> Any:
    """The transformers model of a GGUF file, its tensors dequantised and renamed by
    transformers' own GGUF reader (``load_gguf_checkpoint``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = dict(load_gguf_checkpoint(str(path))["config"])
    kind = cfg.pop("model_type")
    cfg.setdefault("pad_token_id", 0)  # Phi-3's default (32000) is past a tiny vocabulary
    if kind == "gpt2":  # transformers reads `gpt2.context_length` as n_ctx only
        cfg["n_positions"] = cfg["n_ctx"]
    config = AutoConfig.for_model(kind, **{k: v for k, v in cfg.items() if not k.startswith("_")})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    return model.eval(), tensors
