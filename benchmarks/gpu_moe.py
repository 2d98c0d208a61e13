"""On a GPU (issue 45): a Mixtral-shaped layer stack against transformers, in one run.

    bash benchmarks/gpu.sh --moe [--layers 8] [--prompt 128] [--tokens 32]

transformers' `MixtralForCausalLM` at Mixtral-8x7B's widths (hidden 4096, 8 experts of 14336,
top-2, 32 query heads over 8 KV heads, vocabulary 32000) with as many layers as `--layers`
(8 by default: 23 GiB of bf16 weights, held twice, once by each side), random bf16 weights;
std.models.mixtral loaded on the same tensors (transformers 5 holds the experts fused,
`experts.gate_up_proj`: split into the checkpoint's w1/w3 views, no copy), numerics "fast" as
`generate` plans it. Prints the prefill logits' agreement (argmax at each position; the
largest difference), how many greedy tokens agree, and ms per decode token for each (median
of `--repeats` runs of `--tokens` tokens after a `--prompt`-token prompt), then the bytes a
decode step reads for the experts (benchmarks/moe_bytes.py) over the measured time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--dtype",
        default="bf16",
        choices=("bf16", "f32"),
        help="f32: the accuracy check (TF32 off on both sides, numerics 'exact')",
    )
    return p.parse_args()


def linnet_weights(hf: torch.nn.Module, f: int) -> dict[str, torch.Tensor]:
    """transformers 5's in-memory Mixtral tensors under the checkpoint's (stacked) names."""
    out = {}
    for name, t in hf.state_dict().items():
        if ".mlp.experts.gate_up_proj" in name:
            head = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts")
            out[f"{head}.w1.weight"] = t[:, :f]
            out[f"{head}.w3.weight"] = t[:, f:]
        elif ".mlp.experts.down_proj" in name:
            out[name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.w2.weight")] = t
        elif ".mlp.gate.weight" in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t
        else:
            out[name] = t
    return out


def main() -> None:
    import transformers
    from linnet.torch import load

    args = parse()
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    if args.dtype == "f32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    d, f, e, k, v = 4096, 14336, 8, 2, 32000
    cfg = transformers.MixtralConfig(
        vocab_size=v,
        hidden_size=d,
        intermediate_size=f,
        num_hidden_layers=args.layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=e,
        num_experts_per_tok=k,
        max_position_embeddings=4096,
        rope_theta=1e6,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = transformers.MixtralForCausalLM(cfg)
        # `.to(dtype)` would round the rotary inverse frequencies too (a float buffer),
        # which from_pretrained keeps in f32 and Linnet computes in f32: keep them exact.
        exact = hf.model.rotary_emb.inv_freq.clone()
        hf = hf.to(dtype).eval()
        hf.model.rotary_emb.inv_freq = exact
        hf.model.rotary_emb.original_inv_freq = exact
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.02 if p.dim() > 1 else 0.1)
    model = load(
        "std.models.mixtral",
        weights=linnet_weights(hf, f),
        config={
            "V": v,
            "D": d,
            "F": f,
            "NL": args.layers,
            "H": 32,
            "KV": 8,
            "HD": 128,
            "S": args.prompt + args.tokens + 8,
            "B": 1,
            "T": args.dtype,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1e6,
            "sliding_window": 0,
            "num_experts": e,
            "num_experts_per_tok": k,
        },
        device="cuda",
        numerics="exact" if args.dtype == "f32" else "fast",
    )
    prompt = torch.randint(
        0, v, (1, args.prompt), device="cuda", generator=torch.Generator("cuda").manual_seed(1)
    )
    with torch.no_grad():
        ref = hf(prompt).logits.float()
    got = model.prefill(prompt.to(torch.int32)).float()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(
        f"prefill: argmax agrees at {agree:.2%} of {args.prompt} positions, "
        f"largest |logit difference| {(got - ref).abs().max().item():.3g}"
    )

    def hf_run() -> list[int]:
        with torch.no_grad():
            out = hf.generate(
                prompt,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, args.prompt :].tolist()

    def linnet_run() -> list[int]:
        return model.generate(
            prompt.to(torch.int32).tolist(), max_new_tokens=args.tokens, stop_tokens=[]
        )[0]

    rows = []
    tokens = {}
    for label, run in (("transformers", hf_run), ("linnet", linnet_run)):
        tokens[label] = run()  # warm: compiles, plans, captures
        times = []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rows.append((label, statistics.median(times) / args.tokens * 1e3))
    pre = {}
    for label, run in (
        ("transformers", lambda: hf(prompt)),
        ("linnet", lambda: model.prefill(prompt.to(torch.int32))),
    ):
        times = []
        for _ in range(args.repeats + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                run()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        pre[label] = statistics.median(times[1:]) * 1e3
    same = sum(a == b for a, b in zip(tokens["transformers"], tokens["linnet"]))
    print(f"greedy tokens equal: {same} of {args.tokens}")
    experts = args.layers * k * 3 * f * d * (4 if args.dtype == "f32" else 2)
    print(
        f"\n| {args.layers} Mixtral layers, {args.dtype} | ms/token (prompt {args.prompt}, "
        f"incl. prefill) | prefill ms | experts' GB/s |"
    )
    print("|---|---|---|---|")
    for label, ms in rows:
        print(f"| {label} | {ms:.2f} | {pre[label]:.2f} | {experts / ms / 1e6:.0f} |")


if __name__ == "__main__":
    main()
