"""The conformance suite's cases (:func:`cases`, :func:`edge_cases`): every std op, the
shipped models and the examples, each an entry and the inputs it runs on. Run and compared by
:mod:`linnet.torch.conformance`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from linnet.lang.syntax.program import model_file

STD_OPS = Path(str(resources.files("linnet.torch.conformance").joinpath("std_ops.linnet")))
EDGES = Path(str(resources.files("linnet.torch.conformance").joinpath("edges.linnet")))


# ---------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One row: an entry of a model (or a prefill + greedy decode loop) and its inputs.

    ``inputs``: each input's shape and what fills it (``"normal"``; an int ``n``: integers
    in ``0..n-1``; a tuple: those values, i32 if all are ints, else f32, in row-major order).
    ``decode``: for a loop, the decode steps after a prefill of ``inputs``.
    """

    name: str
    model: Path
    config: dict[str, Any]
    entry: str
    inputs: Mapping[str, tuple[tuple[int, ...], str | int | tuple[float, ...]]]
    decode: int = 0


def _llama() -> Path:
    from linnet.lang.bundled import example

    return example("llama") / "llama.linnet"


def _toy(**extra: Any) -> dict[str, Any]:
    import json

    data = json.loads((_llama().parent / "configs" / "toy.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")} | {"B": 1} | extra


_STD = {
    "N": 4,
    "D": 8,
    "O": 6,
    "V": 16,
    "H": 2,
    "HD": 4,
    "B": 2,
    "L": 3,
    "S": 5,
    "KV": 2,
    "G": 2,
    "E": 8,
    "K": 2,
}


def _std(entry: str, **inputs: tuple[tuple[int, ...], str | int]) -> Case:
    return Case(f"std {entry.removesuffix('_op')}", STD_OPS, _STD, entry, inputs)


_NAN, _INF = float("nan"), float("inf")
_F = (1.0, _NAN, -2.0, _NAN, _INF, -_INF, -0.0, 3.5)
_G = (_NAN, 3.0, _NAN, _NAN, 0.0, _NAN, 0.0, -1.0)
_PAST = (_NAN, _INF, -_INF, 3e9, -3e9, 2.7, -2.7, 300.0)
_ROWS = (
    1.0,
    _NAN,
    3.0,
    0.0,
    -1.0,
    2.0,
    4.0,
    5.0,
    -_INF,
    2.0,
    1.0,
    0.5,
    0.25,
    -1.0,
    7.0,
    6.0,
    _NAN,
    _NAN,
    _NAN,
    _NAN,
    _NAN,
    _NAN,
    _NAN,
    _NAN,
)
_A = (7, -7, 7, -7, 0, 5, -2147483648, -2147483648)
_B = (0, 0, 2, -2, 0, -1, -1, 0)


def _edge(entry: str, **inputs: tuple[tuple[int, ...], tuple[float, ...]]) -> Case:
    return Case(f"edges {entry}", EDGES, {"N": 8, "R": 3}, entry, inputs)


def edge_cases() -> list[Case]:
    """One case per edge-value rule (docs/language.md, "Edge values"), on values that hit
    it: every runtime must give the interpreter's integers and NaNs."""
    pair = {"a": ((8,), _F), "b": ((8,), _G)}
    past = {"x": ((8,), _PAST)}
    rows = {"a": ((3, 8), _ROWS)}
    return [
        _edge("max_nan", **pair),
        _edge("min_nan", **pair),
        _edge("reduce_max_nan", **rows),
        _edge("reduce_min_nan", **rows),
        _edge("to_i32", **past),
        _edge("to_i8", **past),
        _edge("to_u8", **past),
        _edge("floor_tiny", x=((8,), (-1e-45, -1e-30, -0.0, 0.0, 1e-45, -0.5, -1.5, 2.5))),
        _edge("int_div", a=((8,), _A), b=((8,), _B)),
        _edge("int_rem", a=((8,), _A), b=((8,), _B)),
        _edge(
            "float_rem",
            a=((8,), (1.0, -1.0, 5.5, -5.5, _INF, 7.5, -7.5, 0.0)),
            b=((8,), (0.0, 0.0, _INF, _INF, 2.0, -2.0, 2.0, 0.0)),
        ),
    ]


def cases() -> list[Case]:
    """Every case, in the table's order: the std ops, the edge values, then each model of
    the repository."""
    x = ((4, 8), "normal")
    qkv = {
        "q": ((2, 3, 2, 2, 4), "normal"),
        "k": ((2, 3, 2, 4), "normal"),
        "v": ((2, 3, 2, 4), "normal"),
    }
    out = [
        _std("linear_op", x=x),
        _std("linear_bias_op", x=x),
        _std("rms_norm_op", x=x),
        _std("layer_norm_op", x=x),
        _std("silu_op", x=x),
        _std("gelu_op", x=x),
        _std("softmax_op", x=x),
        _std("rope_op", x=((4, 2, 4), "normal"), pos=((4,), 64)),
        _std("rope_with_op", x=((4, 2, 4), "normal"), pos=((4,), 64), inv_freq=((2,), "normal")),
        _std("embedding_op", ids=((4,), 16)),
        _std("causal_attention_op", **qkv),
        _std(
            "decode_attention_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        _std("linear_in_out_bias_op", x=x),
        _std("linear_tiled_op", x=x),
        _std("rms_norm_offset_op", x=x),
        _std("gelu_tanh_op", x=x),
        _std("silu_mul_op", x=x, up=x),
        _std("window_attention_op", **qkv),
        _std(
            "window_decode_attention_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        # Issue 15's span ops (std.nn.decode): their bodies compose std calls.
        _std("linear_gemv_op", x=x),
        _std("rms_norm_linear_op", x=x),
        _std("rms_norm_qkv_op", x=x),
        _std("rms_norm_gate_up_op", x=x),
        _std("gate_up_silu_op", x=x),
        _std("residual_add_op", x=x, up=x),
        _std("linear_residual_op", x=x, r=((4, 6), "normal")),
        _std(
            "decode_attention_flash_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        _std("linear_gemv_row_op", x=x),
        # Kernel chains (split-K, flash-decoding) and the rows-in-registers GEMV.
        _std("linear_split_op", x=x),
        _std("linear_split_wide_op", x=x),
        _std("linear_residual_split_op", x=x, r=((4, 6), "normal")),
        _std("linear_gemv_dot_op", x=x),
        _std("linear_gemv_dot32_op", x=((20, 8), "normal")),
        _std("linear_gemv_dot64_op", x=((36, 8), "normal")),
        # Issue 42's quantised products (int8, packed int4; f16 group scales) and their
        # decode span ops (std.nn.quant).
        _std("linear_q8_op", x=x),
        _std("linear_q4_op", x=x),
        _std("linear_q8_gemv_op", x=x),
        _std("linear_q8_split_op", x=x),
        _std("linear_q4_gemv_op", x=x),
        _std("linear_q4_split_op", x=x),
        # Their fused prologues and epilogues: the norm before q, k and v (gate and up),
        # the residual after o and down.
        _std("rms_norm_qkv_q8_op", x=x),
        _std("rms_norm_gate_up_q8_op", x=x),
        _std("linear_q8_residual_op", x=x, r=((4, 6), "normal")),
        _std("rms_norm_qkv_q4_op", x=x),
        _std("rms_norm_gate_up_q4_op", x=x),
        _std("linear_q4_residual_op", x=x, r=((4, 6), "normal")),
        _std("rms_norm_qkv_rope_q8_op", x=x, pos=((4,), 64), inv_freq=((2,), "normal")),
        _std("rms_norm_qkv_rope_q8_heads_op", x=x, pos=((4,), 64), inv_freq=((2,), "normal")),
        _std("rms_norm_qkv_rope_q4_op", x=x, pos=((4,), 64), inv_freq=((2,), "normal")),
        _std("rms_norm_qkv_rope_q4_heads_op", x=x, pos=((4,), 64), inv_freq=((2,), "normal")),
        _std("linear_q8_mm_op", x=x),
        _std("linear_q4_mm_op", x=x),
        _std("linear_q4_mm_split_op", x=x),
        # Issue 45's mixture of experts (std.nn.moe, std.nn.moe_kernels): routing, and the
        # experts' combination through the gathering body (4 rows x 2 of 8 experts), the
        # dense body (16 rows), and its decode and grouped span ops.
        _std("top_k_route_op", logits=((4, 8), "normal")),
        _std("moe_experts_op", x=x, rw=((4, 2), "normal"), idx=((4, 2), 8)),
        _std(
            "moe_experts_dense_op", x=((16, 8), "normal"), rw=((16, 2), "normal"), idx=((16, 2), 8)
        ),
        _std("moe_experts_gemv_op", x=x, rw=((4, 2), "normal"), idx=((4, 2), 8)),
        _std(
            "moe_experts_grouped_op",
            x=((16, 8), "normal"),
            rw=((16, 2), "normal"),
            idx=((16, 2), 8),
        ),
        _std("residual_rms_norm_op", x=x, up=x),
        _std("rms_norm_qkv_split_op", x=x),
        _std(
            "rms_norm_qkv_rope_op",
            x=x,
            wq=((8, 8), "normal"),
            wk=((8, 8), "normal"),
            wv=((8, 8), "normal"),
            pos=((4,), 64),
            inv_freq=((2,), "normal"),
        ),
        _std(
            "rms_norm_qkv_rope_split_op",
            x=x,
            wq=((8, 8), "normal"),
            wk=((8, 8), "normal"),
            wv=((8, 8), "normal"),
            pos=((4,), 64),
            inv_freq=((2,), "normal"),
        ),
        _std(
            "rms_norm_qkv_rope_split_wide_op",
            x=x,
            wq=((8, 8), "normal"),
            wk=((8, 8), "normal"),
            wv=((8, 8), "normal"),
            pos=((4,), 64),
            inv_freq=((2,), "normal"),
        ),
        *(
            _std(
                f"rms_norm_qkv_rope_attention{wide}_op",
                x=x,
                wq=((16, 8), "normal"),
                wk=((8, 8), "normal"),
                wv=((8, 8), "normal"),
                pos=((4,), 5),
                inv_freq=((2,), "normal"),
                k=((4, 5, 2, 4), "normal"),
                v=((4, 5, 2, 4), "normal"),
            )
            for wide in ("", "_wide")
        ),
        _std("with_rows_op", k=((2, 5, 2, 4), "normal"), pos=((2,), 5), rows=((2, 2, 4), "normal")),
        _std(
            "decode_attention_split_once_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        _std(
            "decode_attention_split_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        _std(
            "decode_attention_split_short_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        _std(
            "decode_attention_split_long_op",
            q=((2, 2, 2, 4), "normal"),
            k=((2, 5, 2, 4), "normal"),
            v=((2, 5, 2, 4), "normal"),
            pos=((2,), 5),
        ),
        # Issue 45: soft-capped attention (Gemma 2) and the windowed decode kernels' ops.
        _std("softcap_attention_op", **qkv),
        *(
            _std(
                f"{name}_op",
                q=((2, 2, 2, 4), "normal"),
                k=((2, 5, 2, 4), "normal"),
                v=((2, 5, 2, 4), "normal"),
                pos=((2,), 5),
            )
            for name in (
                "softcap_decode_attention",
                "window_decode_attention_flash",
                "softcap_decode_attention_flash",
            )
        ),
        # Issue 44: the paged cache's ops (std.nn.paged), 8 pages of 2 positions.
        _std("paged_gather_op", pages=((8, 2, 2, 4), "normal"), page_table=((2, 3), 8)),
        *(
            _std(
                f"{name}_op",
                q=((2, 2, 2, 4), "normal"),
                k=((8, 2, 2, 4), "normal"),
                v=((8, 2, 2, 4), "normal"),
                page_table=((2, 3), 8),
                pos=((2,), 6),
            )
            for name in (
                "paged_decode_attention",
                "paged_decode_attention_flash",
                "paged_decode_attention_split",
                "paged_window_decode_attention",
                "paged_softcap_decode_attention",
            )
        ),
        *(
            _std(
                f"{name}_op",
                q=((2, 3, 2, 2, 4), "normal"),
                k=((8, 2, 2, 4), "normal"),
                v=((8, 2, 2, 4), "normal"),
                page_table=((2, 3), 8),
                start=((2,), 4),
            )
            for name in (
                "paged_prefill_attention",
                "paged_prefill_attention_flash",
                "paged_window_prefill_attention",
                "paged_softcap_prefill_attention",
            )
        ),
    ]
    out += edge_cases()
    llama = _llama()
    prompt = {"tokens": ((1, 6), 256)}
    out += [
        Case("llama prefill", llama, _toy(), "prefill", prompt),
        Case("llama decode (16 greedy steps)", llama, _toy(), "prefill", prompt, decode=16),
        Case(
            "llama tied embeddings, prefill",
            llama,
            _toy(tie_word_embeddings=True),
            "prefill",
            prompt,
        ),
        Case(
            "llama rope llama3, prefill",
            llama,
            _toy(rope_llama3=True, rope_factor=8.0, rope_original_max_positions=64.0),
            "prefill",
            prompt,
        ),
    ]
    out += [
        Case(
            f"std.models.{name} prefill",
            model_file(f"std.models.{name}"),
            config,
            "prefill",
            prompt,
        )
        for name, config in SHIPPED_MODELS.items()
    ]
    tinylm = _tinylm()
    if tinylm is not None:  # a checkout (a wheel ships the llama example alone)
        model, config = tinylm
        batch = {"tokens": ((config["B"], 8), config["V"])}
        out += [
            Case("tinylm forward", model, config, "forward", batch),
            Case(
                "tinylm loss",
                model,
                config,
                "loss",
                {**batch, "targets": ((config["B"], 8), config["V"])},
            ),
        ]
    return out


_SMALL = {
    "V": 256,
    "D": 64,
    "F": 128,
    "NL": 2,
    "H": 4,
    "KV": 2,
    "HD": 16,
    "S": 128,
    "B": 1,
    "T": "f32",
}
#: The models linnet-lang ships (std.models.*, issue 19), each at a small config; Mistral's and
#: Phi-3's sliding window (4) is shorter than the 6-token prompt, so the window matters.
SHIPPED_MODELS: dict[str, dict[str, Any]] = {
    "llama": _SMALL,
    "qwen2": _SMALL,
    "mistral": _SMALL | {"sliding_window": 4},
    "gemma": _SMALL,
    "phi3": _SMALL | {"sliding_window": 4},
    "gpt2": {"V": 256, "P": 128, "F": 128, "NL": 2, "H": 4, "HD": 16, "S": 128, "B": 1, "T": "f32"},
    # Issue 45: a windowed layer then a global one (config lists), soft-capping, qk-norm.
    "gemma2": _SMALL
    | {"sliding_window": 4, "layer_windows": [4, 0], "query_pre_attn_scalar": 16.0},
    "gemma3": _SMALL
    | {"sliding_window": 4, "layer_windows": [4, 0], "layer_rope_theta": [10000.0, 1e6]},
    "qwen3": _SMALL | {"layer_windows": [0, 4]},
    # Mixtures of experts (issue 45): 8 experts, top-2 (Mixtral, with its window shorter
    # than the prompt) and top-4 with the shared expert (Qwen2-MoE).
    # (One layer each: the suite's time is the compiled runtimes'.)
    "mixtral": _SMALL | {"NL": 1, "sliding_window": 4, "num_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": _SMALL
    | {
        "NL": 1,
        "num_experts": 8,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
    # Qwen3-MoE: qk-norm, top-2 of 8 renormalised, no shared expert.
    "qwen3_moe": _SMALL
    | {
        "NL": 1,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}


def _tinylm() -> tuple[Path, dict[str, Any]] | None:
    """examples/tinylm (issue 18's training example) and its config, where there is one."""
    import json

    from linnet.lang.bundled import example

    try:
        folder = example("tinylm")
    except LookupError:
        return None
    data = json.loads((folder / "configs" / "tiny.json").read_text())
    return folder / "tinylm.linnet", {k: v for k, v in data.items() if not k.startswith("_")}


MODELS_COVERED = ("examples/llama/llama.linnet", "examples/tinylm/tinylm.linnet")
"""The repository's models the cases run (a test fails when examples/ has one more)."""
