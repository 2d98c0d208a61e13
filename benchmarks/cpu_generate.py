"""`generate` on the CPU: Linnet's torch runtime against transformers' `generate` on the same
real model (SmolLM2-135M-Instruct, float32, the demo GGUF dequantised), the same threads,
both warmed, in one run.

    uv run --frozen python benchmarks/cpu_generate.py --threads 2
    uv run --frozen python benchmarks/cpu_generate.py --lengths 12,150,700 --new 64 --repeats 3

For each prompt length the runs alternate (Linnet, transformers, Linnet, ...) so that a busy
machine slows both alike; each figure is the median. Reported per run: time to the first
token (the prefill and one pick), decode tokens/s after it, whole-call tokens/s, and whether
the greedy tokens of the two are identical. Prompt lengths not seen before are the point:
the table's last column counts what Linnet lowered and compiled during the timed calls.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", help="a saved float32 directory (default: the demo GGUF)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lengths", default="12,150,700", help="prompt lengths, comma-separated")
    p.add_argument("--new", type=int, default=64, help="tokens generated per call")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache", type=int, default=1024, help="Linnet's KV cache length S")
    p.add_argument("--compile", action="store_true", help="also Linnet with compile=True")
    return p.parse_args()


def prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    """A prompt of real-looking ids: a fixed text's tokens, repeated to ``length``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 20000), (length,), generator=g).tolist()


def hf_model(weights: Path | None, gguf: Path) -> Any:
    import transformers

    if weights is not None:
        return transformers.AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )


def hf_generate(model: Any, ids: list[int], new: int) -> tuple[list[int], float, float]:
    """transformers' greedy generate: (tokens, seconds to the first token, whole seconds)."""
    first: list[float] = []
    start = time.perf_counter()

    class First:
        """A streamer noting when the first new token arrives (its first put is the prompt)."""

        puts = 0

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts == 2:
                first.append(time.perf_counter())

        def end(self) -> None:
            pass

    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            streamer=First(),
            pad_token_id=0,
        )
    end = time.perf_counter()
    return out[0, len(ids) :].tolist(), (first[0] if first else end) - start, end - start


def linnet_generate(model: Any, ids: list[int], new: int) -> tuple[list[int], float, float]:
    first: list[float] = []
    start = time.perf_counter()

    def on_token(step: int, tokens: list[int]) -> None:
        if step == 0:
            first.append(time.perf_counter())

    out = model.generate([ids], new, on_token=on_token, stop_tokens=[])
    end = time.perf_counter()
    return out[0], first[0] - start, end - start


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    from linnet.lang.host.demo_model import smollm2_gguf
    from linnet.torch import load

    gguf = smollm2_gguf()
    weights = Path(args.weights) if args.weights else None
    source = str(weights or gguf)
    hf = hf_model(weights, gguf).eval()
    vocab = hf.config.vocab_size
    runners: dict[str, Any] = {
        "transformers": lambda ids: hf_generate(hf, ids, args.new),
    }
    models = {"linnet": load("std.models.llama", weights=source, config={"S": args.cache})}
    if args.compile:
        models["linnet compile"] = load(
            "std.models.llama", weights=source, config={"S": args.cache}, compile=True
        )
    for name, m in models.items():
        runners[name] = lambda ids, m=m: linnet_generate(m, ids, args.new)
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"threads {torch.get_num_threads()}, {args.new} new tokens, S={args.cache}", flush=True)
    # Warm-up: one call each at a length none of the timed calls uses; Linnet's models run
    # every length bucket the timed prompts fall in (Model.warm_up), so no timed call lowers.
    warm = prompt_ids(vocab, 7, seed=99)
    for name, run in runners.items():
        t0 = time.perf_counter()
        run(warm)
        if name in models:
            models[name].warm_up(longest=max(lengths), progress=lambda line: None)
        print(f"  warm-up {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for length in lengths:
        ids = prompt_ids(vocab, length, seed=length)
        got: dict[str, list[tuple[list[int], float, float]]] = {k: [] for k in runners}
        for _ in range(args.repeats):
            for name, run in runners.items():
                got[name].append(run(ids))
        ref = got["transformers"][0][0]
        for name, results in got.items():
            ttft = statistics.median(r[1] for r in results)
            whole = statistics.median(r[2] for r in results)
            decode = (args.new - 1) / statistics.median(r[2] - r[1] for r in results)
            same = all(r[0] == ref for r in results)
            rows.append((length, name, ttft, decode, args.new / whole, same))
            print(
                f"  L={length} {name}: first token {ttft * 1e3:.0f} ms, "
                f"decode {decode:.1f} tok/s, same tokens as transformers: {same}",
                flush=True,
            )
    print("\n| prompt | runtime | first token ms | decode tok/s | call tok/s | tokens = HF |")
    print("|---|---|---|---|---|---|")
    for length, name, ttft, decode, whole, same in rows:
        print(f"| {length} | {name} | {ttft * 1e3:.0f} | {decode:.1f} | {whole:.1f} | {same} |")
    by = {(r[0], r[1]): r[3] for r in rows}
    for name in runners:
        if name != "transformers":
            ratios = [by[(n, name)] / by[(n, "transformers")] for n in lengths]
            print(f"{name} / transformers decode tok/s: " + ", ".join(f"{r:.2f}x" for r in ratios))


if __name__ == "__main__":
    main()
