"""Adversarial suite (issue 45, item 2): per-layer attention types, config lists, and the
checkpoint values of Gemma 2, Gemma 3, Qwen3 and Qwen2's sliding windows.

Silent wrong results fixed here: a layer array whose elements differ in a config (a global
layer 0, windowed layers after it) had its later layers replayed from layer 0's lowering, and
generated source shared one function between a global and a windowed layer (their slices
hashed alike once the masks were hoisted). Pure Python: no runtime is needed.
"""

from __future__ import annotations

import copy

import pytest
from linnet.lang import LinnetError, Program, lower
from linnet.lang.passes.slices import cut
from linnet.lang.syntax.program import STD_ROOT
from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping, validate_mapping

DIMS = {"V": 32, "D": 32, "F": 64, "H": 4, "KV": 2, "HD": 8, "S": 32, "T": "f32"}

STACK = """
block Scale<D: Dim> {
    config factor: f32 = 1.0
    fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
        let y[d] = x[d] * factor
        return y
    }
}

pub model Stack<D: Dim, NL: Dim> {
    config factors: [f32; NL] = 2.0
    block layers: [Scale<D>(factor = factors); NL]

    entry run(x: Tensor[D; f32]) -> Tensor[D; f32] {
        let h = x
        for layer in self.layers {
            h = layer(h)
        }
        return h
    }
}
"""


def _program(text: str) -> Program:
    return Program.from_text(text, "stack")


def _code(fn, *args, **kwargs) -> str:
    with pytest.raises(LinnetError) as info:
        fn(*args, **kwargs)
    return info.value.diagnostics[0].code


def _model(name: str) -> Program:
    return Program.from_file(str(STD_ROOT / "models" / f"{name}.linnet"))


def _attention_calls(graph) -> list[tuple[str, str]]:
    return [
        (c.path.split(".")[2], c.callee.split("::")[1])
        for c in graph.calls
        if c.callee.startswith("std.nn.attention::")
    ]


# ---------------------------------------------------------------- silent wrong results


def test_layers_that_differ_after_the_second_are_not_replayed_from_the_first():
    """Layers 0 and 1 global, 2 and 3 windowed: lowering instantiates a loop from its first
    two iterations when they match; layers 2 and 3 used to be replayed as global."""
    graph = lower(
        _model("qwen2"),
        "prefill",
        {"tokens": [1, 12]},
        DIMS | {"NL": 4, "layer_windows": [0, 0, 4, 4]},
    )
    assert _attention_calls(graph) == [
        ("0", "causal_attention"),
        ("1", "causal_attention"),
        ("2", "window_attention"),
        ("3", "window_attention"),
    ]


def test_a_list_config_gives_each_element_its_item():
    graph = lower(_program(STACK), "run", {"x": [2]}, {"D": 2, "NL": 4, "factors": [1, 1, 3, 3]})
    consts = [s.attributes["value"] for s in graph.steps if s.op == "constant"]
    muls = [s for s in graph.steps if s.op == "mul"]
    assert sorted(set(consts)) == [1.0, 3.0] and len(muls) == 4
    # The third and fourth products scale by 3.
    value_of = {s.results[0]: s.attributes["value"] for s in graph.steps if s.op == "constant"}
    assert [value_of[m.operands[1]] for m in muls] == [1.0, 1.0, 3.0, 3.0]


def test_a_global_and_a_windowed_layer_are_different_slice_kinds():
    """Generated source writes one function per slice kind; a windowed layer ran as the
    global layer's function (SDPA with is_causal) before kinds counted their calls."""
    graph = lower(
        _model("qwen2"),
        "prefill",
        {"tokens": [1, 12]},
        DIMS | {"NL": 3, "layer_windows": [0, 4, 4]},
    )
    kinds = {s.prefix: s.kind for s in cut(graph) if s.prefix}
    assert kinds["model.layers.0."] != kinds["model.layers.1."]
    assert kinds["model.layers.1."] == kinds["model.layers.2."]


# ---------------------------------------------------------------- config lists: coded errors


def test_a_list_of_the_wrong_length_is_e0872():
    assert (
        _code(lower, _program(STACK), "run", {"x": [2]}, {"D": 2, "NL": 4, "factors": [1.0, 2.0]})
        == "E0872"
    )


def test_a_list_item_of_the_wrong_type_is_e0613():
    bad = {"D": 2, "NL": 2, "factors": [1.0, "x"]}
    assert _code(lower, _program(STACK), "run", {"x": [2]}, bad) == "E0613"


def test_a_list_read_as_a_value_is_e0873():
    text = STACK.replace("let h = x\n", "let h = x * factors\n")
    assert _code(lower, _program(text), "run", {"x": [2]}, {"D": 2, "NL": 2}) == "E0873"


def test_a_list_reaching_a_scalar_config_of_its_name_is_e0873():
    text = STACK.replace("config factors: [f32; NL]", "config factor: [f32; NL]").replace(
        "(factor = factors)", ""
    )
    assert _code(lower, _program(text), "run", {"x": [2]}, {"D": 2, "NL": 2}) == "E0873"


def test_a_list_passed_to_one_block_is_e0874():
    text = STACK.replace(
        "block layers: [Scale<D>(factor = factors); NL]",
        "block layers: [Scale<D>; NL]\n    block one: Scale<D>(factor = factors)",
    )
    assert _code(lower, _program(text), "run", {"x": [2]}, {"D": 2, "NL": 2}) == "E0874"


def test_a_list_of_another_count_than_the_array_is_e0874():
    text = STACK.replace("config factors: [f32; NL]", "config factors: [f32; 3]")
    assert _code(lower, _program(text), "run", {"x": [2]}, {"D": 2, "NL": 2}) == "E0874"


def test_a_list_type_outside_a_config_is_e0107():
    text = STACK.replace("fn forward(x: Tensor[D; f32])", "fn forward(x: [f32; D])")
    assert _code(_program, text) == "E0107"


# ---------------------------------------------------------------- checkpoints


def _gemma2() -> dict:
    return {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "vocab_size": 256,
        "head_dim": 16,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": None,
    }


def _config(hf: dict, name: str):
    return checkpoint_config(hf, read_mapping(STD_ROOT / "models" / f"{name}.linnet"), name)


def _ckpt_code(hf: dict, name: str) -> str:
    return _code(_config, hf, name)


def test_the_new_mappings_are_valid():
    for name in ("gemma2", "gemma3", "qwen3", "qwen2"):
        validate_mapping(read_mapping(STD_ROOT / "models" / f"{name}.linnet"), name)


def test_layer_types_default_as_transformers_computes_them():
    out = _config(_gemma2(), "gemma2").values
    assert out["layer_windows"] == [8, 0, 8]  # every second layer global
    assert out["final_logit_softcapping"] == 0.0  # null: none
    g3 = _gemma2() | {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}
    g3 |= {"num_hidden_layers": 7, "attn_logit_softcapping": None, "rope_local_base_freq": 50.0}
    out = _config(g3, "gemma3").values
    assert out["layer_windows"] == [8, 8, 8, 8, 8, 0, 8]  # five local to one global
    assert out["layer_rope_theta"] == [50.0] * 5 + [1e6, 50.0]
    qwen = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 1,
    }
    assert _config(qwen, "qwen2").values["layer_windows"] == [0, 8, 8]
    assert _config(qwen | {"use_sliding_window": False}, "qwen2").values["layer_windows"] == [
        0,
        0,
        0,
    ]


def test_an_unknown_layer_type_is_e0656():
    hf = _gemma2() | {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}
    assert _ckpt_code(hf, "gemma2") == "E0656"


def test_layer_types_of_another_length_is_e0875():
    hf = _gemma2() | {"layer_types": ["sliding_attention", "full_attention"]}
    assert _ckpt_code(hf, "gemma2") == "E0875"


def test_layer_types_not_a_list_is_e0671():
    assert _ckpt_code(_gemma2() | {"layer_types": "sliding_attention"}, "gemma2") == "E0671"
    assert _ckpt_code(_gemma2() | {"layer_types": [1, 2, 3]}, "gemma2") == "E0671"


@pytest.mark.parametrize("window", [0, -4, 2.5, True])
def test_a_window_below_one_is_refused(window):
    assert _ckpt_code(_gemma2() | {"sliding_window": window}, "gemma2") in ("E0665", "E0671")


def test_a_sliding_layer_without_a_window_is_e0671():
    qwen = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "sliding_window": None,
        "layer_types": ["full_attention", "sliding_attention"],
    }
    assert _ckpt_code(qwen, "qwen3") == "E0671"


@pytest.mark.parametrize("cap", [0.0, -30.0])
def test_a_soft_cap_not_above_zero_is_e0665(cap):
    assert _ckpt_code(_gemma2() | {"attn_logit_softcapping": cap}, "gemma2") == "E0665"


def test_what_transformers_gemma3_ignores_or_scales_is_refused():
    g3 = _gemma2() | {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}
    g3["final_logit_softcapping"] = None
    # transformers 5 never soft-caps Gemma 3's attention: refused, not silently applied.
    assert _ckpt_code(g3, "gemma3") == "E0656"
    g3["attn_logit_softcapping"] = None
    linear = copy.deepcopy(g3) | {
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }
    }
    assert _ckpt_code(linear, "gemma3") == "E0656"
    flat = g3 | {"rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}
    assert _ckpt_code(flat, "gemma3") == "E0656"
    assert _ckpt_code(g3 | {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "gemma3") == (
        "E0656"
    )


def test_a_bad_layers_section_is_e0653():
    mapping = read_mapping(STD_ROOT / "models" / "gemma2.linnet")
    broken = mapping | {"layers": {"key": "layer_types", "types": []}}
    assert _code(validate_mapping, broken) == "E0653"


def test_set_gives_a_config_list():
    """`--set layer_windows=[8, 0]` is a list (it was the string "[8, 0]": a list of one
    value that is not a number, reported as the wrong length)."""
    from linnet.lang.host.config import parse_value

    assert parse_value("[8, 0]") == [8, 0] and parse_value("[ ]") == []
    graph = lower(
        _model("gemma2"),
        "prefill",
        {"tokens": [1, 12]},
        DIMS | {"NL": 2, "layer_windows": parse_value("[4, 0]")},
    )
    assert [c[1] for c in _attention_calls(graph)] == ["softcap_attention", "softcap_attention"]
    assert (
        _code(
            lower,
            _model("gemma2"),
            "prefill",
            {"tokens": [1, 12]},
            DIMS | {"NL": 2, "layer_windows": parse_value("[4, 0, 4]")},
        )
        == "E0872"
    )


# ------------------------------------------- merged with the rope variants (tensor configs)
SCALE_PROBE = """
use std.nn.decoder::{CachedAttention}

pub model M<KV: Dim, G: Dim, HD: Dim, B: Dim, S: Dim, T: DType> {
    config query_pre_attn_scalar: f32 = 0.0
    config attn_logit_softcapping: f32 = 0.0
    config rope_yarn: bool = false
    config rope_factor: f32 = 1.0
    config rope_original_max_positions: f32 = 8192.0
    block cache: CachedAttention<KV, G, HD, B, S, T>

    entry decode(q: Tensor[B, KV * G * HD; T], k: Tensor[B, KV * HD; T], v: Tensor[B, KV * HD; T], pos: Tensor[B; i32]) -> Tensor[B, KV * G * HD; T] {
        return self.cache.decode(q, k, v, pos)
    }
}
"""


@pytest.mark.parametrize("scalar", [0.0, 64.0])
@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("cap", [0.0, 30.0])
def test_the_softmax_scale_combines_query_pre_attn_scalar_and_the_rope_factor(scalar, yarn, cap):
    """transformers scales scores by query_pre_attn_scalar ** -0.5 (else head_dim ** -0.5)
    and YaRN's attention factor multiplies cos and sin, so q.k by its square: the scale is
    factor^2 / sqrt(query_pre_attn_scalar or HD), also before a soft-cap. Each branch alone
    dropped the other's part (HD's root with a query_pre_attn_scalar, or a factor of 1)."""
    import math

    config = {"KV": 1, "G": 2, "HD": 16, "B": 1, "S": 8, "T": "f32"}
    config |= {"query_pre_attn_scalar": scalar, "attn_logit_softcapping": cap}
    if yarn:
        config |= {"rope_yarn": True, "rope_factor": 4.0, "rope_original_max_positions": 32.0}
    shapes = {"q": [1, 32], "k": [1, 16], "v": [1, 16], "pos": [1]}
    graph = lower(Program.from_text(SCALE_PROBE, "probe"), "decode", shapes, config)
    constants = [s.attributes["value"] for s in graph.steps if s.op == "constant"]
    factor = 0.1 * math.log(4.0) + 1.0 if yarn else 1.0
    expected = factor**2 / math.sqrt(scalar or 16.0)
    assert any(isinstance(c, float) and abs(c - expected) < 1e-9 for c in constants)
    if scalar and yarn:  # neither part alone
        assert not any(
            isinstance(c, float) and abs(c - w) < 1e-9
            for c in constants
            for w in (factor**2 / 4.0, 1 / 8.0)
        )


KINDS = """
block Scale<D: Dim> {
    config w: Tensor[D; f32] = 1.0
    config factor: f32 = 1.0
    fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
        let y[d] = x[d] * w[d] * factor
        return y
    }
}

pub model Stack<D: Dim, NL: Dim> {
    MEMBERS
    entry run(x: Tensor[D; f32]) -> Tensor[D; f32] {
        let h = x
        for layer in self.layers {
            h = layer(h)
        }
        return h
    }
}
"""


def _constants(members: str, config: dict) -> list:
    program = _program(KINDS.replace("MEMBERS", members))
    graph = lower(program, "run", {"x": [config["D"]]}, config)
    return [s.attributes["value"] for s in graph.steps if s.op == "constant"]


def test_a_config_list_and_a_tensor_config_in_one_repeated_block():
    """Each layer its list item (factor) and the model's tensor config (w) reaching it."""
    members = """config factors: [f32; NL] = 2.0
    config w: Tensor[D; f32] = 3.0
    block layers: [Scale<D>(factor = factors); NL]"""
    values = _constants(members, {"D": 2, "NL": 2, "factors": [5.0, 7.0], "w": [0.5, 0.25]})
    floats = {v for v in values if isinstance(v, float)}  # (the ints: the select's bounds)
    assert floats == {5.0, 7.0, 0.5, 0.25}


@pytest.mark.parametrize(
    "members",
    [
        # The model's list reaches the layers' tensor config by name: it took its default.
        "config w: [f32; NL] = 3.0\n    block layers: [Scale<D>; NL]",
        # Passed explicitly: it was split per layer and called a scalar.
        "config ws: [f32; NL] = 3.0\n    block layers: [Scale<D>(w = ws); NL]",
    ],
)
def test_a_config_list_reaching_a_tensor_config_is_e0613(members):
    with pytest.raises(LinnetError) as info:
        _constants(members, {"D": 2, "NL": 2})
    [d] = info.value.diagnostics
    assert d.code == "E0613" and "config list" in d.message and "tensor config" in d.message


def test_a_tensor_config_reaching_a_config_list_or_a_scalar_is_e0613():
    """A tensor config named like a layer's list (it was E0872, 'the value given has 1') or
    like a scalar config (it took the scalar's default)."""
    inner = """
block Layer<D: Dim, NL: Dim> {
    config factor: KIND = 1.0
    fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
        return x
    }
}

pub model Stack<D: Dim, NL: Dim> {
    config factor: Tensor[NL; f32] = 2.0
    block layer: Layer<D, NL>
    entry run(x: Tensor[D; f32]) -> Tensor[D; f32] {
        return self.layer(x)
    }
}
"""
    for kind in ("[f32; NL]", "f32"):
        program = _program(inner.replace("KIND", kind))
        with pytest.raises(LinnetError) as info:
            lower(program, "run", {"x": [2]}, {"D": 2, "NL": 2})
        [d] = info.value.diagnostics
        assert d.code == "E0613" and "tensor config" in d.message, (kind, d.message)
