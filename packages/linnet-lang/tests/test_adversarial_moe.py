"""Adversarial suite (issue 45): mixture-of-experts checkpoints as users bring them, and the
routing op at its edges. A checkpoint's per-expert tensors stack into the model's
`[E, ...]` parameters by name (linnet.lang.weights.stacked): an incomplete set of experts
would shift every later expert into the wrong row (a silent wrong result), so a gap, a
mismatch or an ambiguous name is a coded error naming the tensors. Pure Python where it can
be; the routing checks run the torch interpreter.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from linnet.lang import LinnetError
from linnet.lang.weights.safetensors import TensorInfo, checkpoint_shapes, resolve_checkpoint
from linnet.lang.weights.stacked import expert_groups, stack_shapes, stack_tensors

HEAD = "model.layers.0.block_sparse_moe.experts"


def _shapes(indices, shape=(4, 2), dtype="f32", tail="w1.weight"):
    return {f"{HEAD}.{i}.{tail}": TensorInfo(shape, dtype, "") for i in indices}


def _write(path: Path, tensors: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """A safetensors file of zeros (header only matters to the shape checks)."""
    header, offset = {}, 0
    for name, (shape, dtype) in tensors.items():
        n = 4
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_experts_stack_in_index_order_not_name_order():
    # "10" sorts before "2" as text: the stack must follow the number.
    names = [f"{HEAD}.{i}.w1.weight" for i in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)]
    groups = expert_groups(names)
    assert groups[f"{HEAD}.w1.weight"] == [f"{HEAD}.{i}.w1.weight" for i in range(11)]
    got = stack_tensors(
        {n: [int(n.split(".")[-3])] for n in names}, lambda p: [v for part in p for v in part]
    )
    assert got == {f"{HEAD}.w1.weight": list(range(11))}


def test_a_missing_expert_is_E0886_not_a_shifted_stack():
    with pytest.raises(LinnetError) as info:
        stack_shapes(_shapes([0, 1, 3]))
    d = info.value.diagnostics[0]
    assert d.code == "E0886" and "0-1, 3" in d.message and "expert 2" in d.message


def test_experts_of_another_shape_or_dtype_are_E0887():
    shapes = {**_shapes([0, 1]), **_shapes([2], shape=(4, 3))}
    with pytest.raises(LinnetError) as info:
        stack_shapes(shapes)
    assert info.value.diagnostics[0].code == "E0887"
    shapes = {**_shapes([0, 1]), **_shapes([2], dtype="bf16")}
    with pytest.raises(LinnetError) as info:
        stack_shapes(shapes)
    assert info.value.diagnostics[0].code == "E0887" and "bf16" in info.value.diagnostics[0].message


def test_a_stacked_name_beside_its_experts_is_E0888():
    shapes = {**_shapes([0, 1]), f"{HEAD}.w1.weight": TensorInfo((2, 4, 2), "f32", "")}
    with pytest.raises(LinnetError) as info:
        stack_shapes(shapes)
    assert info.value.diagnostics[0].code == "E0888"


def test_every_problem_of_every_group_in_one_error():
    shapes = {
        **_shapes([1]),
        **_shapes([0, 2], tail="w2.weight"),
        **_shapes([1], tail="w2.weight", shape=(9,)),
    }
    with pytest.raises(LinnetError) as info:
        stack_shapes(shapes)
    assert sorted(d.code for d in info.value.diagnostics) == ["E0886", "E0887"]


def test_names_that_only_look_like_experts_are_left_alone():
    shapes = {
        "model.experts_norm.0.weight": TensorInfo((2,), "f32", ""),  # not `experts.<m>.`
        "model.experts.01.w.weight": TensorInfo((2,), "f32", ""),  # a leading zero: not an index
        "experts.0": TensorInfo((2,), "f32", ""),  # no tail
    }
    assert stack_shapes(dict(shapes)) == shapes


def test_a_checkpoint_with_a_gap_is_refused_at_load(tmp_path):
    """Through the loader every runtime uses (headers, before any tensor is read)."""
    from linnet.lang.host.loading import load_program, read_headers

    ckpt = tmp_path / "moe"
    ckpt.mkdir()
    _write(ckpt / "model.safetensors", {f"{HEAD}.{i}.w1.weight": ((4, 2), "F32") for i in (0, 2)})
    program, path = load_program("std.models.mixtral")
    with pytest.raises(LinnetError) as info:
        read_headers(ckpt, program, path, {}, None)
    assert info.value.diagnostics[0].code == "E0886"
    # The headers themselves are valid: only the stacking refuses them.
    assert len(checkpoint_shapes(resolve_checkpoint(ckpt))) == 2


MOE_HF = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
}


@pytest.mark.parametrize(
    "change,code",
    [
        # Dense layers among the sparse ones: the model computes every layer sparse, so a
        # config with them must not load as if they were (a silent wrong result).
        ({"mlp_only_layers": [1]}, "E0656"),
        ({"decoder_sparse_step": 2}, "E0656"),
        ({"num_experts_per_tok": 5}, "E0665"),  # more experts a token than there are
        ({"num_experts": 0}, "E0665"),
        ({"norm_topk_prob": "yes"}, "E0671"),
    ],
)
def test_moe_configs_the_model_does_not_compute_are_coded(change, code):
    from linnet.lang.syntax.program import STD_ROOT
    from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping

    mapping = read_mapping(STD_ROOT / "models" / "qwen2_moe.linnet")
    checkpoint_config(MOE_HF, mapping, "Qwen2Moe")  # as saved: fine
    with pytest.raises(LinnetError) as info:
        checkpoint_config({**MOE_HF, **change}, mapping, "Qwen2Moe")
    assert code in {d.code for d in info.value.diagnostics}


def test_mixtral_top_k_past_its_experts_is_E0665():
    from linnet.lang.syntax.program import STD_ROOT
    from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping

    mapping = read_mapping(STD_ROOT / "models" / "mixtral.linnet")
    hf = {
        k: v
        for k, v in MOE_HF.items()
        if not k.startswith(("num_experts", "moe_", "shared_", "decoder_", "mlp_"))
    }
    hf |= {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8}
    checkpoint_config({**hf, "num_experts_per_tok": 2}, mapping, "Mixtral")
    with pytest.raises(LinnetError) as info:
        checkpoint_config({**hf, "num_experts_per_tok": 9}, mapping, "Mixtral")
    assert {d.code for d in info.value.diagnostics} == {"E0665"}


QWEN3_MOE_HF = {k: v for k, v in MOE_HF.items() if not k.startswith("shared_")} | {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "head_dim": 16,
    "norm_topk_prob": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
}


@pytest.mark.parametrize(
    "change,code,key",
    [
        # Dense layers or a sliding window: Qwen3-MoE's model computes neither, so a config
        # with them must not load as if it had none (a silent wrong result).
        ({"mlp_only_layers": [1]}, "E0656", "mlp_only_layers"),
        ({"decoder_sparse_step": 2}, "E0656", "decoder_sparse_step"),
        ({"use_sliding_window": True, "sliding_window": 8}, "E0656", "use_sliding_window"),
        ({"num_experts_per_tok": 5}, "E0665", "num_experts_per_tok"),
        ({"shared_expert_intermediate_size": 40}, "E0655", "shared_expert_intermediate_size"),
        ({"head_dim": 0}, "E0671", "head_dim"),
    ],
)
def test_qwen3_moe_configs_the_model_does_not_compute_are_coded(change, code, key):
    from linnet.lang.syntax.program import STD_ROOT
    from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping

    mapping = read_mapping(STD_ROOT / "models" / "qwen3_moe.linnet")
    checkpoint_config(QWEN3_MOE_HF, mapping, "Qwen3Moe")  # as saved: fine
    with pytest.raises(LinnetError) as info:
        checkpoint_config({**QWEN3_MOE_HF, **change}, mapping, "Qwen3Moe")
    d = next(d for d in info.value.diagnostics if d.code == code)
    assert f"`{key}`" in d.message


def test_qwen3_moe_reads_num_experts_under_either_name():
    """transformers 5 writes Qwen3-MoE's `num_experts` as `num_local_experts` (hub configs
    have `num_experts`): both set the model's experts."""
    from linnet.lang.syntax.program import STD_ROOT
    from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping

    mapping = read_mapping(STD_ROOT / "models" / "qwen3_moe.linnet")
    hub = checkpoint_config(QWEN3_MOE_HF, mapping, "Qwen3Moe").values
    saved = {k: v for k, v in QWEN3_MOE_HF.items() if k != "num_experts"}
    v5 = checkpoint_config({**saved, "num_local_experts": 4}, mapping, "Qwen3Moe").values
    assert hub["num_experts"] == v5["num_experts"] == 4
    assert hub["norm_topk_prob"] is True
