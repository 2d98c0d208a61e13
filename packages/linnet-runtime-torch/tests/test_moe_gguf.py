"""Mixtures of experts from GGUF files (issue 45 item 4), written as llama.cpp's converter
writes them: Mixtral as a `llama` file with `llama.expert_count` (q/k rows permuted), Qwen2-MoE
as `qwen2moe`, Qwen3-MoE as `qwen3moe` (q/k head norms, a head width of its own); each layer's experts stacked ([E, F, D] `ffn_gate_exps`, `ffn_up_exps`,
`ffn_down_exps`, the router `ffn_gate_inp`), Qwen2-MoE's shared expert (`*_shexp`, its gate a
vector). Loaded by `load(weights=file)` (the model picked from the file) against transformers
on the same weights: f32 prefill logits within 1e-4. A dense model named for an MoE file, and
an MoE model for a dense file, are coded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
import numpy as np  # noqa: E402
from linnet.lang import LinnetError  # noqa: E402
from linnet.torch import load  # noqa: E402

SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (HF -> GGUF).
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def _write(path, model, arch: str, meta: dict) -> None:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    d = cfg.hidden_size
    values = {
        "block_count": cfg.num_hidden_layers,
        "context_length": cfg.max_position_embeddings,
        "embedding_length": d,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "rope.dimension_count": d // cfg.num_attention_heads,
        **meta,
    }
    for key, value in values.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps))
    w.add_float32(f"{arch}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    f_expert = cfg.intermediate_size if arch == "llama" else cfg.moe_intermediate_size
    for name, t in model.state_dict().items():
        v = t.detach().numpy().astype(np.float32)
        if name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
            w.add_tensor(f"{_TOP[name.rsplit('.', 1)[0]]}.weight", v)
            continue
        layer, rest = name.split(".", 3)[2], name.split(".", 3)[3]
        if rest == "mlp.experts.gate_up_proj":
            w.add_tensor(f"blk.{layer}.ffn_gate_exps.weight", np.ascontiguousarray(v[:, :f_expert]))
            w.add_tensor(f"blk.{layer}.ffn_up_exps.weight", np.ascontiguousarray(v[:, f_expert:]))
            continue
        if rest == "mlp.experts.down_proj":
            w.add_tensor(f"blk.{layer}.ffn_down_exps.weight", v)
            continue
        base, suffix = rest.rsplit(".", 1)
        gname = _BLOCK[base]
        if arch == "llama" and gname == "attn_q":
            v = _permute(v, cfg.num_attention_heads)
        if arch == "llama" and gname == "attn_k":
            v = _permute(v, cfg.num_key_value_heads)
        if gname == "ffn_gate_inp_shexp":
            v = v.reshape(-1)  # llama.cpp holds the shared expert's gate as a vector
        w.add_tensor(f"blk.{layer}.{gname}.{suffix}", np.ascontiguousarray(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "mixtral":
        cfg = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
        model = transformers.MixtralForCausalLM(cfg)
    elif kind == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(
            **SMALL,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,  # llama.cpp's qwen2moe: the file does not record it
        )
        model = transformers.Qwen2MoeForCausalLM(cfg)
    else:
        assert kind == "qwen3_moe", kind
        cfg = transformers.Qwen3MoeConfig(
            **SMALL,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            head_dim=32,  # not hidden / heads (16), as Qwen3-30B-A3B's
            norm_topk_prob=True,  # llama.cpp's qwen3moe always renormalises
        )
        model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    return model.eval()


CASES = [
    ("mixtral", "llama", {"expert_count": 4, "expert_used_count": 2}, "std.models.mixtral"),
    (
        "qwen2_moe",
        "qwen2moe",
        {
            "expert_count": 8,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_feed_forward_length": 48,
        },
        "std.models.qwen2_moe",
    ),
    (
        "qwen3_moe",
        "qwen3moe",
        {
            "expert_count": 8,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "attention.key_length": 32,
            "attention.value_length": 32,
            "rope.dimension_count": 32,
        },
        "std.models.qwen3_moe",
    ),
]


@pytest.mark.parametrize("kind,arch,meta,module", CASES, ids=[c[0] for c in CASES])
def test_an_moe_gguf_file_matches_transformers(tmp_path, kind, arch, meta, module):
    model = _model(kind)
    path = tmp_path / f"{kind}.gguf"
    _write(path, model, arch, meta)
    prompt = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(prompt).logits
    linnet = load(weights=path, config={"S": 32})  # the model picked from the file
    from linnet.lang.check.driver import find_model

    assert (
        find_model(linnet.program, None).name
        == {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe"}[kind]
    )
    got = linnet.prefill(prompt.to(torch.int32))
    assert (got - want).abs().max().item() < 1e-4
    named = load(module, weights=path, config={"S": 32})
    assert (named.prefill(prompt.to(torch.int32)) - want).abs().max().item() < 1e-4


def test_a_dense_model_for_an_moe_file_and_back_are_coded(tmp_path):
    path = tmp_path / "mixtral.gguf"
    _write(path, _model("mixtral"), "llama", {"expert_count": 4, "expert_used_count": 2})
    with pytest.raises(LinnetError) as info:
        load("std.models.llama", weights=path)
    assert info.value.diagnostics[0].code == "E0852"
    assert "mixture of 4 experts" in info.value.diagnostics[0].message
    dense = tmp_path / "dense.gguf"
    _write(dense, _model("mixtral"), "llama", {})
    with pytest.raises(LinnetError) as info:
        load("std.models.mixtral", weights=dense)
    d = info.value.diagnostics[0]
    assert d.code == "E0852" and "without experts" in d.message
