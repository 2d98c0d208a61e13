"""llama.cpp's names for the shipped model families: GGUF metadata keys to the config.json keys
a Hugging Face checkpoint of the family would have, and GGUF tensor names to the model's
parameter paths (which are the Hugging Face tensor names, so the family's ``.hf.json`` mapping
reads both kinds of checkpoint).

Each :class:`Family` is what llama.cpp's ``convert_hf_to_gguf.py`` does to a Hugging Face
checkpoint of one architecture, written backwards: which metadata keys it writes from which
config.json keys, how it renames each tensor, and what it changes in the values (Llama's q/k
rows permuted for its interleaved rotary embedding, Gemma's norm weights stored as ``1 + w``,
GPT-2's Conv1D weights transposed). Mistral is a Llama in GGUF (``general.architecture`` is
``llama``): loading the file with ``std.models.mistral`` reads it as a Mistral without a
sliding window, which is what llama.cpp computes for it.

Pure Python, shared by every runtime.

>>> family_for("llama", ["LlamaForCausalLM"]).model
'std.models.llama'
>>> hf_tensor_name(family_for("qwen2"), "blk.3.attn_q.bias")
'model.layers.3.self_attn.q_proj.bias'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The decoder layers of the Llama-like families: llama.cpp's block tensor name -> the Hugging
# Face name inside `model.layers.N.`.
_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# A llama block's tensors without its dense MLP: the mixture-of-experts families' layers.
_ATTENTION_BLOCK = {
    k: v for k, v in _LLAMA_BLOCK.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))
}
_LLAMA_TOP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Gemma 2 and 3's layers: a norm after the attention and one on each side of the MLP
# (llama.cpp's `ffn_norm` is the pre-feedforward norm there), Gemma 3's q/k head norms.
_GEMMA2_BLOCK = {
    **{k: v for k, v in _LLAMA_BLOCK.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# A mixture of experts' counts: GGUF metadata key -> config.json key.
_EXPERT_CONFIG = {"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok"}
# GGUF metadata key (after `{arch}.`) -> config.json key, for the Llama-like families.
_LLAMA_CONFIG = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "context_length": "max_position_embeddings",
}


@dataclass(frozen=True)
class Family:
    """How one llama.cpp architecture maps onto one shipped model.

    ``arch`` is the GGUF ``general.architecture``; ``model`` the shipped model
    (``std.models.llama``), ``architecture`` and ``model_type`` what its config.json would say;
    ``config`` maps metadata keys (after ``{arch}.``) to config.json keys; ``block`` and
    ``top`` map tensor names (without ``.weight``/``.bias``) to parameter paths (``block``'s
    inside ``layers_prefix.N.``). ``permute_qk``: llama.cpp permuted the q/k rows;
    ``norm_offset``: added to the stored norm weights (Gemma stores ``1 + w``);
    ``transposed``: block tensors stored transposed (GPT-2's Conv1D); ``head_dim``: the
    config.json key of the head width, when the family's config has one; ``extra``:
    config.json values the file implies (Mistral in GGUF has no sliding window);
    ``experts``: a mixture of experts (a file of its arch with `{arch}.expert_count` is
    this family's); ``rows``: block tensors llama.cpp stores as a vector that the model
    holds as one row, [1, n] (Qwen2-MoE's shared expert gate).
    """

    arch: str
    model: str
    architecture: str
    model_type: str
    config: dict[str, str]
    block: dict[str, str]
    top: dict[str, str]
    layers_prefix: str = "model.layers"
    permute_qk: bool = False
    norm_offset: float = 0.0
    transposed: frozenset[str] = frozenset()
    head_dim: str | None = None
    vocab_key: str = "vocab_size"
    layers_key: str = "num_hidden_layers"
    heads_key: str = "num_attention_heads"
    kv_heads_key: str | None = "num_key_value_heads"
    rope_scaling: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    # Gemma 2 and 3: llama.cpp scales scores by 1 / sqrt(hidden / heads) for its 27B type
    # (this many layers), else by 1 / sqrt(head_dim): config.json's query_pre_attn_scalar.
    query_scale_layers: int | None = None
    experts: bool = False
    rows: frozenset[str] = frozenset()


FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        "std.models.llama",
        "LlamaForCausalLM",
        "llama",
        _LLAMA_CONFIG,
        _LLAMA_BLOCK,
        _LLAMA_TOP,
        permute_qk=True,
        head_dim="head_dim",
        rope_scaling=True,
    ),
    # A Mistral converted by llama.cpp is a Llama file; llama.cpp runs it without a window.
    Family(
        "llama",
        "std.models.mistral",
        "MistralForCausalLM",
        "mistral",
        _LLAMA_CONFIG,
        _LLAMA_BLOCK,
        _LLAMA_TOP,
        permute_qk=True,
        head_dim="head_dim",
        extra={"sliding_window": None},
    ),
    Family(
        "qwen2",
        "std.models.qwen2",
        "Qwen2ForCausalLM",
        "qwen2",
        _LLAMA_CONFIG,
        _LLAMA_BLOCK,
        _LLAMA_TOP,
    ),
    Family(
        "gemma",
        "std.models.gemma",
        "GemmaForCausalLM",
        "gemma",
        _LLAMA_CONFIG,
        _LLAMA_BLOCK,
        _LLAMA_TOP,
        norm_offset=-1.0,
        head_dim="head_dim",
    ),
    Family(
        "gemma2",
        "std.models.gemma2",
        "Gemma2ForCausalLM",
        "gemma2",
        {
            **_LLAMA_CONFIG,
            "attention.sliding_window": "sliding_window",
            "attn_logit_softcapping": "attn_logit_softcapping",
            "final_logit_softcapping": "final_logit_softcapping",
        },
        _GEMMA2_BLOCK,
        _LLAMA_TOP,
        norm_offset=-1.0,
        head_dim="head_dim",
        query_scale_layers=46,
    ),
    Family(
        "gemma3",
        "std.models.gemma3",
        "Gemma3ForCausalLM",
        "gemma3_text",
        {
            **_LLAMA_CONFIG,
            "attention.sliding_window": "sliding_window",
            "attention.sliding_window_pattern": "sliding_window_pattern",
            "final_logit_softcapping": "final_logit_softcapping",
        },
        {**_GEMMA2_BLOCK, **_QK_NORM},
        _LLAMA_TOP,
        norm_offset=-1.0,
        head_dim="head_dim",
        query_scale_layers=62,
    ),
    Family(
        "qwen3",
        "std.models.qwen3",
        "Qwen3ForCausalLM",
        "qwen3",
        _LLAMA_CONFIG,
        {**_LLAMA_BLOCK, **_QK_NORM},
        _LLAMA_TOP,
        head_dim="head_dim",
    ),
    Family(
        "phi3",
        "std.models.phi3",
        "Phi3ForCausalLM",
        "phi3",
        {**_LLAMA_CONFIG, "attention.sliding_window": "sliding_window"},
        {
            **{
                k: v
                for k, v in _LLAMA_BLOCK.items()
                if k not in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
            },
            "attn_qkv": "self_attn.qkv_proj",
            "ffn_up": "mlp.gate_up_proj",
        },
        _LLAMA_TOP,
    ),
    # Mixtures of experts: llama.cpp stores a layer's experts stacked ([E, F, D] as
    # `ffn_gate_exps`), as std.nn.moe's parameters are; the router is `ffn_gate_inp`.
    # A Mixtral is a `llama` file with `llama.expert_count` (the family is chosen by it).
    Family(
        "llama",
        "std.models.mixtral",
        "MixtralForCausalLM",
        "mixtral",
        {**_LLAMA_CONFIG, **_EXPERT_CONFIG, "expert_count": "num_local_experts"},
        {
            **_ATTENTION_BLOCK,
            "ffn_gate_inp": "block_sparse_moe.gate",
            "ffn_gate_exps": "block_sparse_moe.experts.w1",
            "ffn_up_exps": "block_sparse_moe.experts.w3",
            "ffn_down_exps": "block_sparse_moe.experts.w2",
        },
        _LLAMA_TOP,
        permute_qk=True,
        head_dim="head_dim",
        extra={"sliding_window": None},
        experts=True,
    ),
    Family(
        "qwen2moe",
        "std.models.qwen2_moe",
        "Qwen2MoeForCausalLM",
        "qwen2_moe",
        {
            **_LLAMA_CONFIG,
            **_EXPERT_CONFIG,
            "expert_feed_forward_length": "moe_intermediate_size",
            "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
        },
        {
            **_ATTENTION_BLOCK,
            "ffn_gate_inp": "mlp.gate",
            "ffn_gate_exps": "mlp.experts.gate_proj",
            "ffn_up_exps": "mlp.experts.up_proj",
            "ffn_down_exps": "mlp.experts.down_proj",
            "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
            "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
            "ffn_up_shexp": "mlp.shared_expert.up_proj",
            "ffn_down_shexp": "mlp.shared_expert.down_proj",
        },
        _LLAMA_TOP,
        experts=True,
        rows=frozenset({"ffn_gate_inp_shexp"}),
    ),
    # Qwen3-MoE: Qwen3's attention (q/k head norms, `attention.key_length` the head width)
    # and routed experts only; llama.cpp always renormalises the top-k weights for it.
    Family(
        "qwen3moe",
        "std.models.qwen3_moe",
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        {
            **_LLAMA_CONFIG,
            **_EXPERT_CONFIG,
            "expert_feed_forward_length": "moe_intermediate_size",
        },
        {
            **_ATTENTION_BLOCK,
            **_QK_NORM,
            "ffn_gate_inp": "mlp.gate",
            "ffn_gate_exps": "mlp.experts.gate_proj",
            "ffn_up_exps": "mlp.experts.up_proj",
            "ffn_down_exps": "mlp.experts.down_proj",
        },
        _LLAMA_TOP,
        head_dim="head_dim",
        extra={"norm_topk_prob": True},
        experts=True,
    ),
    Family(
        "gpt2",
        "std.models.gpt2",
        "GPT2LMHeadModel",
        "gpt2",
        {
            "block_count": "n_layer",
            "embedding_length": "n_embd",
            "feed_forward_length": "n_inner",
            "attention.head_count": "n_head",
            "attention.layer_norm_epsilon": "layer_norm_epsilon",
            "context_length": "n_positions",
        },
        {
            "attn_norm": "ln_1",
            "attn_qkv": "attn.c_attn",
            "attn_output": "attn.c_proj",
            "ffn_norm": "ln_2",
            "ffn_up": "mlp.c_fc",
            "ffn_down": "mlp.c_proj",
        },
        {
            "token_embd": "transformer.wte",
            "position_embd": "transformer.wpe",
            "output_norm": "transformer.ln_f",
            "output": "lm_head",
        },
        layers_prefix="transformer.h",
        transposed=frozenset({"attn_qkv", "attn_output", "ffn_up", "ffn_down"}),
        layers_key="n_layer",
        heads_key="n_head",
        kv_heads_key=None,
    ),
)

#: The GGUF architectures Linnet loads, each with the shipped models that run it.
ARCHITECTURES: dict[str, list[str]] = {}
for _f in FAMILIES:
    ARCHITECTURES.setdefault(_f.arch, []).append(_f.model)


def family_for(
    arch: str, architectures: list[str] | None = None, experts: bool | None = None
) -> Family | None:
    """The family that reads a GGUF file of ``arch`` for a model whose mapping runs
    ``architectures`` (its ``.hf.json``'s; None: the first family of ``arch``, the model
    `linnet run x.gguf` picks), of experts or not where ``experts`` says (a file's
    ``{arch}.expert_count``). None where none does.

    >>> family_for("llama", None, experts=True).model
    'std.models.mixtral'

    >>> family_for("llama", ["MistralForCausalLM"]).model_type
    'mistral'
    >>> family_for("llama", ["Qwen2ForCausalLM"]) is None
    True
    """
    for fam in FAMILIES:
        if (
            fam.arch == arch
            and (architectures is None or fam.architecture in architectures)
            and (experts is None or fam.experts == experts)
        ):
            return fam
    return None


_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(.+)\.(weight|bias)")
_TOP_NAME = re.compile(r"(.+)\.(weight|bias)")


def hf_tensor_name(fam: Family, name: str) -> str | None:
    """The parameter path of GGUF tensor ``name`` in ``fam``'s model, or None for a tensor
    the family does not have.

    >>> hf_tensor_name(family_for("gpt2"), "blk.0.attn_qkv.weight")
    'transformer.h.0.attn.c_attn.weight'
    >>> hf_tensor_name(family_for("llama"), "blk.0.ffn_gate_exps.weight") is None
    True
    """
    m = _BLOCK_NAME.fullmatch(name)
    if m is not None:
        inner = fam.block.get(m[2])
        if inner is None or (m[1] != "0" and m[1].startswith("0")):
            return None
        return f"{fam.layers_prefix}.{int(m[1])}.{inner}.{m[3]}"
    m = _TOP_NAME.fullmatch(name)
    if m is not None and m[1] in fam.top:
        return f"{fam.top[m[1]]}.{m[2]}"
    return None


def block_kind(name: str) -> str | None:
    """The llama.cpp tensor kind of a block tensor (``attn_q`` for ``blk.0.attn_q.weight``),
    None for a top-level one.

    >>> block_kind("blk.12.ffn_down.weight"), block_kind("output_norm.weight")
    ('ffn_down', None)
    """
    m = _BLOCK_NAME.fullmatch(name)
    return m[2] if m is not None else None
