"""Per-token decode time: Linnet's generated PyTorch (eager and compile=True) against
Hugging Face transformers eager on the same random weights, with the bandwidth floor.

    uv run python benchmarks/torch_decode.py --config small --device cpu
    python3 benchmarks/torch_decode.py --config llama-3.2-1b --device cuda --context 1024

Positions context..context+steps-1 are decoded after a prefill of `context` tokens; each
token is timed alone (synchronised), the median is reported. The floor is the bytes a decode
step must read (weights + the KV cache up to the position) over the copy bandwidth measured in
the same run. Also reports compile=True's compile time for 2 and for all layers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
sys.path.insert(0, str(ROOT / "packages" / "linnet-lang" / "src"))
sys.path.insert(0, str(ROOT / "packages" / "linnet-runtime-torch" / "src"))

from linnet.torch import load  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync(device)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n / min(times)


def triton_version() -> str:
    """The installed Triton's version, or "none" (recorded beside each benchmark's figures)."""
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "none"


def hf_config(cfg: dict):
    """The transformers LlamaConfig of a Linnet Llama config (default rope)."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=cfg["V"],
        hidden_size=cfg["D"],
        intermediate_size=cfg["F"],
        num_hidden_layers=cfg["NL"],
        num_attention_heads=cfg["H"],
        num_key_value_heads=cfg["KV"],
        head_dim=cfg["HD"],
        max_position_embeddings=cfg["S"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        tie_word_embeddings=cfg["tie_word_embeddings"],
    )


def hf_model(cfg: dict, device: torch.device, seed: int = 0):
    import transformers

    hf_cfg = hf_config(cfg)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(hf_cfg).to(DTYPES[cfg["T"]]).eval()
    weights = {k: v for k, v in model.state_dict().items()}
    if cfg["tie_word_embeddings"]:
        weights.pop("lm_head.weight", None)
    return model, weights


def time_linnet(model, prompt: torch.Tensor, steps: int, device: torch.device) -> list[float]:
    ctx = model.new_context("prefill", [prompt])
    model.prefill(prompt, context=ctx)
    pos = prompt.shape[1]
    token = torch.tensor([1], dtype=torch.int32, device=device)
    times = []
    for i in range(steps):
        p = torch.tensor([pos + i], dtype=torch.int32, device=device)
        sync(device)
        start = time.perf_counter()
        model.decode(token, p, context=ctx)
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def time_hf(model, prompt: torch.Tensor, steps: int, device: torch.device) -> list[float]:
    import transformers

    cache = transformers.DynamicCache()
    with torch.inference_mode():
        model(prompt.long(), past_key_values=cache, use_cache=True)
        token = torch.tensor([[1]], device=device)
        times = []
        for _ in range(steps):
            sync(device)
            start = time.perf_counter()
            model(token, past_key_values=cache, use_cache=True)
            sync(device)
            times.append(time.perf_counter() - start)
    return times


def compile_time(cfg: dict, layers: int, device: torch.device, config: str) -> float:
    """Seconds for the first decode with compile=True, for a model of `layers` layers, in a
    fresh process with empty inductor and Triton caches (a warm cache would hide the cost)."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor",
            TRITON_CACHE_DIR=f"{tmp}/triton",
            LINNET_HOME=f"{tmp}/linnet",
        )
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--config",
                config,
                "--device",
                str(device),
                "--compile-time-only",
                str(layers),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(out.stdout.strip().splitlines()[-1])


def compile_time_here(cfg: dict, layers: int, device: torch.device) -> float:
    from linnet.torch import random_weights

    c = dict(cfg, NL=layers)
    weights = random_weights(LLAMA, c, seed=0, dtype=DTYPES[c["T"]])
    model = load(LLAMA, weights=weights, config=c, device=device, compile=True)
    token = torch.tensor([1], dtype=torch.int32, device=device)
    start = time.perf_counter()
    model.decode(token, token)
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--modes", default="generated,compile,hf")
    ap.add_argument("--compile-layers", default="2,all", help="layer counts to time compiling")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--compile-time-only", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = json.loads((LLAMA.parent / "configs" / f"{args.config}.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    if args.compile_time_only:
        print(compile_time_here(cfg, args.compile_time_only, device))
        return
    cfg["S"] = max(cfg["S"], args.context + args.steps)
    hf, weights = hf_model(cfg, device)
    prompt = torch.randint(0, cfg["V"], (1, args.context), dtype=torch.int32, device=device)
    results: dict[str, float] = {}
    modes = args.modes.split(",")
    if "hf" in modes:
        results["HF transformers eager"] = statistics.median(
            time_hf(hf, prompt, args.steps, device)
        )
    del hf
    config = {
        k: cfg[k] for k in ("H", "KV", "S", "rms_norm_eps", "rope_theta", "tie_word_embeddings")
    }
    for mode in modes:
        if mode == "hf":
            continue
        model = load(
            LLAMA,
            weights=weights,
            config=config,
            device=device,
            compile=(mode == "compile"),
            numerics="fast",
        )
        label = {
            "generated": "Linnet generated (eager)",
            "compile": "Linnet compile=True",
            "interpret": "Linnet interpreter",
        }[mode]
        results[label] = statistics.median(time_linnet(model, prompt, args.steps, device))
        del model
    bw = copy_bandwidth(device)
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    pos = args.context + args.steps // 2
    kv_bytes = 2 * cfg["NL"] * pos * cfg["KV"] * cfg["HD"] * DTYPES[cfg["T"]].itemsize
    floor = (weight_bytes + kv_bytes) / bw
    compile_times = {}
    for n in args.compile_layers.split(","):
        layers = cfg["NL"] if n == "all" else int(n)
        compile_times[layers] = compile_time(cfg, layers, device, args.config)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\n## {args.config} decode, batch 1, positions {args.context}..{args.context + args.steps - 1}"
        f", {cfg['T']}, {name}, torch {torch.__version__}\n"
    )
    print(
        f"weights {weight_bytes / 1e9:.3f} GB, KV at position {pos} {kv_bytes / 1e6:.1f} MB, "
        f"copy bandwidth {bw / 1e12:.3f} TB/s, floor {floor * 1e3:.3f} ms\n"
    )
    base = results.get("HF transformers eager")
    print("| mode | ms/token | vs HF eager | floor / time |")
    print("|---|---|---|---|")
    for label, t in results.items():
        ratio = f"{base / t:.2f}x" if base else "-"
        print(f"| {label} | {t * 1e3:.3f} | {ratio} | {floor / t:.1%} |")
    print(f"| floor (bytes / bandwidth) | {floor * 1e3:.3f} | | 100% |")
    print("\n| compile=True, first decode (fresh caches) | seconds |\n|---|---|")
    for layers, t in compile_times.items():
        print(f"| {layers} layers | {t:.1f} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": args.config,
                    "device": name,
                    "context": args.context,
                    "ms_per_token": {k: v * 1e3 for k, v in results.items()},
                    "floor_ms": floor * 1e3,
                    "bandwidth_tb_s": bw / 1e12,
                    "compile_s": compile_times,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
