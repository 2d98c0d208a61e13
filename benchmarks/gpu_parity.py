"""On a GPU: the Llama example against transformers on the same random weights.

Prints, per dtype and mode, the largest prefill-logit difference and how many of 32 greedy
decode tokens agree. Run by benchmarks/gpu.sh on the device machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration-tests"))

from linnet.torch import load  # noqa: E402
from test_hf_parity import LLAMA, greedy, hf_config, linnet_config  # noqa: E402


def main() -> None:
    import transformers

    device = torch.device("cuda")
    cfg = hf_config()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        hf = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
        weights = dict(hf.state_dict())
        prompt = torch.randint(
            0,
            cfg.vocab_size,
            (1, 7),
            device=device,
            generator=torch.Generator(device).manual_seed(1),
        )
        with torch.no_grad():
            hf_logits = hf(prompt).logits.float()
            gen = hf.generate(
                prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0
            )[0, 7:].tolist()
        for mode in ("interpreter", "generated", "compile"):
            model = load(
                LLAMA,
                weights=weights,
                config=linnet_config(cfg),
                device=device,
                interpret=mode == "interpreter",
                compile=mode == "compile",
            )
            logits, tokens = greedy(model, prompt, 32)
            diff = (logits.float() - hf_logits).abs().max().item()
            same = sum(a == b for a, b in zip(tokens, gen))
            rows.append((str(dtype).split(".")[1], mode, diff, same))
    print("\n| dtype | mode | max prefill logit diff vs HF | greedy tokens equal (of 32) |")
    print("|---|---|---|---|")
    for dt, mode, diff, same in rows:
        print(f"| {dt} | {mode} | {diff:.2e} | {same} |")


if __name__ == "__main__":
    main()
