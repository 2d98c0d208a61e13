"""Adversarial suite (issue 45, item 3): YaRN and LongRoPE rope parameters as checkpoints bring
them, and the tensor configs that carry LongRoPE's factor lists.

Each bad value here used to be refused as an unknown rope type (E0657) or would otherwise give
silent wrong results (a zero factor, a list one short: frequencies scaled by the wrong
factors); now each is a coded error naming the key. Pure Python: no runtime is needed (the
end-to-end checks against transformers are the runtimes' model zoo tests).
"""

from __future__ import annotations

import math

import pytest
from linnet.lang import LinnetError, Program
from linnet.lang.check.lowering import lower
from linnet.lang.check.spans import claim_spans
from linnet.lang.syntax.program import STD_ROOT, model_file
from linnet.lang.weights.checkpoint import checkpoint_config, read_mapping, validate_mapping

MAPPINGS = {n: read_mapping(STD_ROOT / "models" / f"{n}.linnet") for n in ("llama", "phi3")}
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SMALL, "head_dim": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **SMALL}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}


def config(hf: dict, family: str = "llama") -> dict:
    mapping = MAPPINGS[family]
    assert mapping is not None
    return checkpoint_config(hf, mapping, family.capitalize()).values


def codes(hf: dict, family: str = "llama") -> list[tuple[str, str]]:
    """(code, the first words of the message) of each diagnostic; [] when it loads."""
    try:
        config(hf, family)
    except LinnetError as err:
        return [(d.code, d.message) for d in err.diagnostics]
    return []


# ---------------------------------------------------------------- what the mappings read
def test_yarn_parameters_and_their_defaults():
    values = config({**LLAMA, "rope_parameters": YARN})
    assert values["rope_yarn"] is True and values["rope_factor"] == 4.0
    assert values["rope_original_max_positions"] == 32
    # transformers' defaults where config.json leaves them out: betas 32 and 1, truncated,
    # the attention factor derived (0) from the factor and mscales (0: none).
    assert (values["rope_beta_fast"], values["rope_beta_slow"], values["rope_truncate"]) == (
        32.0,
        1.0,
        True,
    )
    assert values["rope_attention_factor"] == values["rope_mscale"] == 0.0
    given = {**YARN, "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 0.707, "truncate": False}
    values = config({**LLAMA, "rope_scaling": given})
    assert (values["rope_beta_fast"], values["rope_mscale"], values["rope_truncate"]) == (
        16,
        0.707,
        False,
    )
    # transformers reads a null `truncate` as false (`rope_parameters.get("truncate", True)`).
    assert config({**LLAMA, "rope_scaling": {**YARN, "truncate": None}})["rope_truncate"] is False
    # Without original_max_position_embeddings, max_position_embeddings (transformers too).
    values = config({**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    assert values["rope_original_max_positions"] == 128


def test_longrope_reads_the_top_level_original_length_as_transformers_does():
    values = config(
        {**PHI3, "original_max_position_embeddings": 32, "rope_scaling": LONGROPE}, "phi3"
    )
    assert values["rope_longrope"] is True and values["rope_short_factor"] == [1.0] * 8
    assert values["rope_original_max_positions"] == 32 and values["rope_max_positions"] == 128
    assert values["rope_factor"] == 0.0  # absent: max / original, as transformers derives it
    # Phi3Config puts its own original_max_position_embeddings (4096 where config.json has
    # none) over the rope parameters'.
    inner = {**LONGROPE, "original_max_position_embeddings": 64}
    assert config({**PHI3, "rope_scaling": inner}, "phi3")["rope_original_max_positions"] == 4096
    # `su` and `yarn` are Phi-3's older names for longrope (Phi3Config renames them).
    for old in ("su", "yarn"):
        values = config({**PHI3, "rope_scaling": {**LONGROPE, "type": old}}, "phi3")
        assert values["rope_longrope"] is True


# ---------------------------------------------------------------- bad values: coded
BAD = [
    # (family, rope parameters, code, key the message names)
    ("llama", {**YARN, "factor": 0.0}, "E0665", "factor"),
    ("llama", {**YARN, "factor": -4.0}, "E0665", "factor"),
    ("llama", {**YARN, "beta_fast": 0}, "E0665", "beta_fast"),  # log of infinity: NaN
    ("llama", {**YARN, "beta_slow": -1.0}, "E0665", "beta_slow"),
    ("llama", {**YARN, "attention_factor": -1.0}, "E0665", "attention_factor"),
    ("llama", {**YARN, "mscale": -0.5}, "E0665", "mscale"),
    ("llama", {**YARN, "truncate": "yes"}, "E0671", "truncate"),
    ("llama", {**YARN, "beta_fast": "32"}, "E0671", "beta_fast"),
    ("llama", {**YARN, "original_max_position_embeddings": 0}, "E0665", "original_max"),
    ("llama", {"rope_type": "yarn"}, "E0671", "factor"),  # YaRN needs its factor
    ("llama", {**YARN, "short_factor": [1.0]}, "E0655", "short_factor"),  # not YaRN's
    ("llama", {**LONGROPE}, "E0657", "longrope"),  # Llama does not run LongRoPE
    ("phi3", {"rope_type": "longrope", "long_factor": [2.0] * 8}, "E0671", "short_factor"),
    ("phi3", {**LONGROPE, "short_factor": "1.0"}, "E0671", "short_factor"),
    ("phi3", {**LONGROPE, "short_factor": []}, "E0671", "short_factor"),
    ("phi3", {**LONGROPE, "long_factor": [2.0, "x"]}, "E0671", "long_factor"),
    ("phi3", {**LONGROPE, "long_factor": [2.0, True]}, "E0671", "long_factor"),
    ("phi3", {**LONGROPE, "short_factor": [1.0] * 7 + [0.0]}, "E0665", "short_factor"),
    ("phi3", {**LONGROPE, "long_factor": [-2.0] * 8}, "E0665", "long_factor"),
    ("phi3", {**LONGROPE, "factor": 0.5}, "E0665", "factor"),
    ("phi3", {**LONGROPE, "attention_factor": 0.0}, "E0665", "attention_factor"),
    ("phi3", {**LONGROPE, "beta_fast": 32}, "E0655", "beta_fast"),  # not LongRoPE's
]


@pytest.mark.parametrize("family,rope,code,key", BAD, ids=[f"{f}-{k}-{c}" for f, _, c, k in BAD])
def test_bad_rope_parameters_are_coded(family, rope, code, key):
    hf = {**(LLAMA if family == "llama" else PHI3), "rope_scaling": rope}
    found = codes(hf, family)
    assert found, "loaded"
    assert {c for c, _ in found} == {code}, found
    assert any(key in message for _, message in found), found


def test_a_bad_rope_spec_in_a_mapping_is_E0653():
    for spec in ({"param": 3}, {"list": "x", "default": []}, {"config": "x", "null": 0}, {}):
        with pytest.raises(LinnetError) as err:
            validate_mapping({"rope": {"types": {"yarn": {"rope_factor": spec}}}})
        assert [d.code for d in err.value.diagnostics] == ["E0653"]


# ---------------------------------------------------------------- tensor configs
MODEL = """
block Scale<N: Dim> {
    config factors: Tensor[N; f32] = 1.0

    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i] * factors[i]
        return y
    }
}

pub model M<N: Dim> {
    config factors: Tensor[N; f32] = 2.0
    block scale: Scale<N>

    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return self.scale(x)
    }
}
"""


def factors_of(text: str, config: dict):
    """The constant factors `run` multiplies by, read back from the lowered graph."""
    import numpy as np

    graph = lower(Program.from_text(text), "run", {"x": [config["N"]]}, config)
    values: dict[str, object] = {}
    for step in graph.steps:
        a = step.attributes
        if step.op == "constant":
            values[step.results[0]] = np.array(a["value"])
        elif step.op == "broadcast":
            values[step.results[0]] = np.broadcast_to(values[step.operands[0]], a["shape"])
        elif step.op == "iota":
            values[step.results[0]] = np.arange(a["shape"][0])
        elif step.op == "lt":
            values[step.results[0]] = values[step.operands[0]] < values[step.operands[1]]
        elif step.op == "select":
            c, x, y = (values[o] for o in step.operands)
            values[step.results[0]] = np.where(c, x, y)
        elif step.op == "mul":
            return [float(v) for v in values[step.operands[1]]]
    raise AssertionError("no product")


def test_a_tensor_config_reaches_the_block_below_and_its_default_fills_it():
    assert factors_of(MODEL, {"N": 5, "factors": [1, 2, 2, 3.5, 1]}) == [1, 2, 2, 3.5, 1]
    assert factors_of(MODEL, {"N": 3}) == [2.0, 2.0, 2.0]  # the model's default, passed down


@pytest.mark.parametrize(
    "value,code",
    [
        ([1.0, 2.0], "E0881"),  # a list one short: silently wrong factors otherwise
        ([1.0, 2.0, 3.0, 4.0], "E0881"),
        (2.0, "E0613"),  # a number where a list is wanted
        (["a", 1, 2], "E0613"),
        ([True, 1.0, 2.0], "E0613"),
        ([float("nan"), 1.0, 2.0], "E0613"),
    ],
)
def test_a_tensor_config_of_the_wrong_length_or_kind_is_coded(value, code):
    with pytest.raises(LinnetError) as err:
        lower(Program.from_text(MODEL), "run", {"x": [3]}, {"N": 3, "factors": value})
    assert [d.code for d in err.value.diagnostics] == [code]
    assert "`factors`" in err.value.diagnostics[0].message


@pytest.mark.parametrize(
    "declared",
    [
        "config factors: Tensor[N, N; f32] = 1.0",  # two axes
        "config factors: Tensor[N; T] = 1.0",  # a generic element type
        "config factors: Tensor[N; f32] = self",  # a default that is not a number
    ],
)
def test_a_tensor_config_type_it_cannot_have_is_E0880(declared):
    text = f"""
pub model M<N: Dim, T: DType> {{
    {declared}

    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {{
        return x
    }}
}}
"""
    program = Program.from_text(text)
    errors = [d.code for d in program.errors]
    if not errors:
        with pytest.raises(LinnetError) as err:
            lower(program, "run", {"x": [2]}, {"N": 2, "T": "f32"})
        errors = [d.code for d in err.value.diagnostics]
    assert errors == ["E0880"]


# ---------------------------------------------------------------- decode span claims
def decode_claims(name: str, config: dict) -> tuple[list[str], object]:
    """The std.nn.decode span ops claimed in a std model's decode graph at a tiny size."""
    program = Program.from_file(model_file(name))
    base = {"V": 64, "D": 32, "F": 48, "NL": 2, "KV": 2, "B": 1, "S": 16, "T": "f32"}
    graph = lower(program, "decode", {"token": [1], "pos": [1]}, {**base, **config})
    claimed = claim_spans(graph, program)
    spans = sorted(c.callee for c in claimed.calls if c.callee.startswith("std.nn.decode::"))
    return spans, claimed


YARN_CONFIG = {"rope_yarn": True, "rope_factor": 4.0, "rope_original_max_positions": 32.0}


def test_decode_span_ops_still_claim_yarn_and_longrope():
    """The rotations stay `rope_with` for every rope type (the attention factor is in the
    softmax scale), so the fused decode ops that take inv_freq and the scale as inputs claim
    YaRN's and LongRoPE's steps as they claim the default's, with the scale YaRN makes."""
    default, _ = decode_claims("std.models.llama", {"G": 2, "HD": 16})
    yarn, claimed = decode_claims("std.models.llama", {"G": 2, "HD": 16, **YARN_CONFIG})
    assert yarn == default and "std.nn.decode::rms_norm_qkv_rope" in yarn
    # The attention's scale argument is YaRN's: (0.1 ln 4 + 1)^2 / sqrt(16).
    fused = [c for c in claimed.calls if c.callee.endswith("::rms_norm_qkv_rope_attention")]
    assert fused
    expected = (0.1 * math.log(4.0) + 1.0) ** 2 / 16**0.5
    assert abs(fused[0].attributes["args"][-1] - expected) < 1e-6
    phi_default, _ = decode_claims("std.models.phi3", {"H": 4, "D": 32})
    longrope = {
        "H": 4,
        "D": 32,
        "rope_longrope": True,
        "rope_short_factor": [1.0, 1.5, 2.0, 2.0],
        "rope_long_factor": [4.0, 4.0, 5.0, 6.0],
        "rope_original_max_positions": 8.0,
        "rope_max_positions": 16.0,
    }
    phi_longrope, _ = decode_claims("std.models.phi3", longrope)
    assert phi_longrope == phi_default
