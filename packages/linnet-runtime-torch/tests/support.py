"""Shared helpers for the runtime tests."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def toy_config(**extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


def cache_writing_findings(device: str = "cpu", dtype: str = "f32") -> tuple[list, list]:
    """conform's findings for the toy Llama decode's kernel regions that write states (the
    attention input's kernels with the k/v cache writes), and their executables: two
    sequences at positions 5 and 9, on caches already holding random values elsewhere."""
    import torch
    from linnet.torch import load, random_weights
    from linnet.torch.kernel_paths import KernelPaths

    class Writing(KernelPaths):
        """The kernel regions that write states, and the executables made for them."""

        made: tuple = ()

        def match(self, graph, target):
            return [r for r in super().match(graph, target) if r.writes_state]

        def compile_regions(self, regions, target, options):
            self.made = super().compile_regions(regions, target, options)
            return self.made

    config = toy_config(B=2, T=dtype)
    model = load(LLAMA, weights=random_weights(LLAMA, config, seed=4), config=config,
                 numerics="fast", device=device)
    token = torch.tensor([3, 7], dtype=torch.int32, device=device)
    pos = torch.tensor([5, 9], dtype=torch.int32, device=device)
    ctx = model.context_for_graph(model.graph("decode", [token, pos]))
    g = torch.Generator().manual_seed(1)
    for state in ctx.states.values():
        state.copy_(torch.randn(state.shape, generator=g))
    paths = Writing(model.program)
    findings = model.conform("decode", [token, pos], paths, context=ctx)
    return findings, list(paths.made)
