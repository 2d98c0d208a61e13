"""On an H200: whole decode steps with both plugins, and FlashInfer token for token.

(t) Token for token over 256 decode steps, FlashInfer under Captured against the generated
    source. Random weights make near-tied logits that any two correct bf16 attentions flip
    (see docs/benchmarks/flashinfer.md), so this uses a model with decisive logits that
    depend on attention: a small Llama (2 layers, head dim 64, vocab 64) trained here in
    seconds to continue periodic sequences (an induction task: the next token is the one
    that followed the current token a period ago, so every prediction reads the cache). Batch
    2: row 0 continues after its 40-token prompt; row 1 restarts at position 24 over cached
    positions 24..39 that hold random tokens (which must stay masked). Free-running greedy,
    each side feeding its own tokens; pos given on the host (and, a second run, on the
    device). Reports identical steps, the smallest top-2 margin, the largest logit difference
    and whether the tokens are the true continuation.
(s) Whole decode steps, batch 1, positions 1024..1087, random bf16 weights, for the
    Llama-3.2-1B and Llama-3-8B shapes (S = 1152 cache positions): the generated source under
    Captured; with a measured plan over CublasLt and FlashInfer; torch.compile of the same
    generated source (max-autotune-no-cudagraphs under Captured, alone and with both
    plugins; compile="reduce-overhead" on Linnet's entries segfaulted in torch 2.11's
    inductor launcher on the H200, so that mode is measured on transformers); Hugging Face transformers with a StaticCache under torch.compile
    (reduce-overhead; max-autotune-no-cudagraphs + a CUDA graph); the floor (weights + KV
    bytes over the copy bandwidth measured in this run). Each step feeds the last step's
    argmax (on the device) and a host position; ms/token over 64 steps queued back to back,
    and the median of steps timed one by one (synchronised, so host time shows).

(f) Prefill, batch 1, 1024 tokens, for the same shapes: Linnet's compiled plan (both plugins,
    max-autotune-no-cudagraphs), Linnet's kernels as candidates or not, planned for plan.run
    (captured=False) and run by it, then the same plan under Captured; against transformers
    under torch.compile max-autotune-no-cudagraphs, called and replayed as a CUDA graph;
    median ms of 10 synchronised runs and the share of the 781 TFLOP/s bf16 rate. Not in the
    default parts.
(p) Where a step goes: every kernel the best configuration launches, from torch.profiler
    over 8 replays (launches and microseconds a step, and the kernels' busy share of the wall
    time). Not in the default parts.
(v) Inductor's options for the best configuration (FlashInfer on every attention, the rest
    compiled): the mode max-autotune-no-cudagraphs against option sets passed as
    compile={...} (without coordinate-descent tuning, which is what turns M=1 products into
    reductions that inductor then fuses with the norms; with benchmark_fusion, which keeps a
    fusion only when it measures faster); ms/token queued under Captured and each variant's
    heaviest kernels. Not in the default parts.

    python3 benchmarks/gpu_steps.py --parts t,s --models llama-3.2-1b,llama-3-8b

Each part prints its error and the run goes on. Run by `bash benchmarks/gpu.sh --steps`.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_flashinfer import LLAMA, config
from kernels import graphed_us
from torch_decode import copy_bandwidth, hf_config

SUMMARY: list[str] = []
HF_BEST_ONLY = False  # --hf-best: only transformers' best configuration (max-autotune + graph)
INDUCTOR_PDL = False  # --inductor-pdl: Linnet's compiled rows with inductor's triton.enable_pdl
ONLY: list[str] = []  # --only: a regular expression a Linnet row's label must match
PROFILE = False  # --profile: (s) also profiles the first row with Linnet's kernels (p's table);
# (f) the kernel table of every prefill row
CONTEXT = 1024  # (s): --context and --batch change these three
BATCH = 1
STEPS = 64
CACHE = 1152


def cpu_i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def first(outputs: Any) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, list | tuple) else outputs


PDL_OTHER = (2, 1, 3, 0, 4, 5)  # each kernel row is timed again under the others, same plan
PDL_NAMES = {
    0: "without PDL",
    1: "PDL early",
    2: "PDL late",
    3: "PDL by grid",
    4: "PDL late, prefetching",
    5: "PDL early, prefetching",
}


def pdl_modules() -> list[Any]:
    """The generated modules loaded so far that launch kernels with programmatic dependent
    launch (their PDL mode is not 0: CUDA, a Triton with gdc_wait, LINNET_PDL not 0)."""
    return [
        m
        for n, m in list(sys.modules.items())
        if n.startswith("linnet_") and getattr(m, "PDL", 0) and hasattr(m, "PDL_LAUNCH")
    ]


def own_pdl(plan: Any) -> int | None:
    """The mode ``plan`` launches Linnet's kernels under (its choice, else the modules'), or
    None where none launches with PDL."""
    mods = pdl_modules()
    if not mods:
        return None
    return plan.pdl if getattr(plan, "pdl", None) is not None else mods[0].PDL


def pdl_said(plan: Any) -> str:
    """ ", Linnet's kernels PDL late" (the plan's mode), or nothing where none launches with it."""
    own = own_pdl(plan)
    return "" if own is None else f", Linnet's kernels {PDL_NAMES[own]}"


def other_pdl(label: str, plan: Any, time_step: Callable[[int], tuple[float, float]]) -> list[str]:
    """``time_step(mode)`` (capture the plan again under the mode, time it) for each of
    PDL_OTHER but the plan's own: one line a mode, "label, Linnet's kernels PDL early|q|o"."""
    own = own_pdl(plan)
    if own is None:
        return []
    out = []
    for mode in PDL_OTHER:
        if mode == own:
            continue
        q, o = time_step(mode)
        out.append(f"{label}, Linnet's kernels {PDL_NAMES[mode]}|{q:.3f}|{o:.3f}")
        print(f"  {out[-1]}", flush=True)
    return out


def wanted(label: str) -> bool:
    """Whether a Linnet row's label passes --only."""
    return not ONLY or re.search(ONLY[0], label) is not None


def guarded(label: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; print its error and return None if it fails (each row on its own)."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:
        traceback.print_exc()
        SUMMARY.append(f"{label}: FAILED ({type(exc).__name__}: {str(exc)[:160]})")
        out = None
    print(f"  [{label}: {time.perf_counter() - t0:.0f} s]", flush=True)
    gc.collect()
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- (t) token for token
def periodic(
    batch: int, length: int, vocab: int, gen: torch.Generator, periods: tuple[int, int] = (4, 24)
) -> torch.Tensor:
    """Rows of distinct-token patterns of random period, repeated to ``length``."""
    rows = []
    for _ in range(batch):
        p = int(torch.randint(periods[0], periods[1] + 1, (1,), generator=gen))
        pattern = torch.randperm(vocab, generator=gen)[:p]
        rows.append(pattern.repeat(length // p + 1)[:length])
    return torch.stack(rows)


def train_copy_model(dev: torch.device, cfg: dict, steps: int = 2000) -> tuple[dict, float]:
    """A Llama of ``cfg``'s shape trained to continue periodic sequences; its bf16 weights
    (HF names, which are Linnet's paths) and its accuracy on predictable positions."""
    import transformers

    torch.manual_seed(0)
    model = (
        transformers.LlamaForCausalLM(hf_config(dict(cfg, tie_word_embeddings=False)))
        .to(dev)
        .train()
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    length = 320
    for i in range(steps):
        x = periodic(64, length, cfg["V"], gen).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits[:, :-1].float()
        # Only positions a period in are predictable; 24 is the longest period.
        loss = torch.nn.functional.cross_entropy(
            logits[:, 24:].reshape(-1, cfg["V"]), x[:, 25:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 250 == 0 or i == steps - 1:
            print(f"  train step {i}: loss {loss.item():.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        x = periodic(64, length, cfg["V"], torch.Generator().manual_seed(99)).to(dev)
        pred = model.to(torch.bfloat16)(input_ids=x).logits[:, :-1].argmax(-1)
        accuracy = (pred[:, 24:] == x[:, 25:]).float().mean().item()
    weights = {
        k: v.detach().to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if "rotary" not in k
    }
    return weights, accuracy


# The kernel kinds the H200's measured 8B and 1B decode plans took (session 13, 854930c):
# the attention input with the cache writes in its kernel, among them.
STEP_KINDS = (
    "decode_attention_split_short",
    "rms_norm_gate_up",
    "linear_residual_split",
    "rms_norm_qkv_rope_split + writes",
)


def forced_plan(model: Any, inputs: list[torch.Tensor], kinds: tuple[str, ...]) -> Any:
    """A plan of ``model``'s decode whose kernel regions are those of ``kinds`` wherever they
    apply: planned with a cost model in place of the clock (a kernel of those kinds costs
    nothing, any other more than its steps; a region's steps 1 us each), so the planner's own
    choice among overlapping regions picks them. The regions are checked against the
    generated source as in any plan."""
    from unittest import mock

    from linnet.torch.planned import PlanBuilder

    def backend(self: Any, group: list, env: Any, context: Any) -> float:
        return 1e-9 if op_name(group[0].region) in kinds else 1.0

    def generated(self: Any, group: list, env: Any, context: Any) -> float:
        return 1e-6 * len(group[0].region.steps)

    with (
        mock.patch.object(PlanBuilder, "time_backend", backend),
        mock.patch.object(PlanBuilder, "time_generated", generated),
    ):
        return model.plan_for(
            "decode", inputs, backends=[], progress=False, kernels=True, cache=_scratch_cache()
        )


def op_name(region: Any) -> str:
    """The std op a kernel region binds (its callee's last name), with " + writes" where the
    region's kernel also stores into states (the KV cache), as plan.explain() names it."""
    return region.callee.rsplit("::", 1)[-1] + (" + writes" if region.writes_state else "")


def _scratch_cache() -> Any:
    from linnet.plan import TimingCache

    return TimingCache(Path(tempfile.mkdtemp()) / "t.json")


def token_for_token(dev: torch.device) -> None:
    from linnet.torch import load
    from linnet.torch.flashinfer import FlashInfer
    from linnet.torch.planned import Captured

    print(
        "\n== (t) FlashInfer, and Linnet's kernels, under Captured vs the generated source, "
        "256 steps, trained model"
    )
    cfg = config("toy", V=64, D=256, F=512, NL=2, H=4, KV=2, HD=64, S=512, T="bf16")
    weights, accuracy = train_copy_model(dev, cfg)
    print(f"  trained: accuracy {accuracy:.4f} on predictable positions (bf16)")
    model = load(LLAMA, weights=weights, config=cfg, device=dev)
    # Every kernel region taken (measure=False: the largest first), against the generated
    # source without kernels (numerics exact) as the reference.
    fast = load(LLAMA, weights=weights, config=cfg, device=dev, numerics="fast")
    gen = torch.Generator().manual_seed(7)
    seqs = periodic(2, 40 + 256 + 1, cfg["V"], gen, periods=(7, 13))
    prompt = seqs[:, :40].clone()
    prompt[1, 24:] = torch.randint(0, cfg["V"], (16,), generator=gen)  # must stay masked
    start = (40, 24)
    steps = 256
    for where in ("host", "device", "kernels", "step kernels"):
        if where == "step kernels":
            plan = forced_plan(fast, [cpu_i32(1, 1), cpu_i32(*start)], STEP_KINDS)
            kinds = sorted({op_name(c.region) for c in plan.regions})
            print(f"  the step's kernel kinds taken: {len(plan.regions)} ({', '.join(kinds)})")
            assert set(STEP_KINDS) <= set(kinds), plan.explain()
            ctx = fast.context_for(plan)
        elif where == "kernels":
            plan = fast.plan_for(
                "decode",
                [cpu_i32(1, 1), cpu_i32(*start)],
                backends=[],
                measure=False,
                progress=False,
                kernels=True,
            )
            kinds = sorted({op_name(c.region) for c in plan.regions})
            print(f"  kernel regions taken: {len(plan.regions)} ({', '.join(kinds)})")
            assert plan.regions, plan.explain()
            ctx = fast.context_for(plan)
        else:
            plan = model.plan_for(
                "decode",
                [cpu_i32(1, 1), cpu_i32(*start)],
                backends=[FlashInfer()],
                measure=False,
                progress=False,
            )
            assert len(plan.regions) == cfg["NL"], plan.explain()
            ctx = model.context_for(plan)
        ref = model.new_context("decode", [cpu_i32(1, 1), cpu_i32(*start)])
        prompt_dev = prompt.to(dev, torch.int32)
        model.prefill(prompt_dev, context=ctx)
        model.prefill(prompt_dev, context=ref)
        step = Captured(plan, ctx)
        mine = [int(seqs[0, 40]), int(seqs[1, 24])]
        theirs = list(mine)
        same, worst, margin, true = 0, 0.0, float("inf"), 0
        diverged = None
        for i in range(steps):
            pos = cpu_i32(start[0] + i, start[1] + i)
            if where != "host":
                pos = pos.to(dev)
            got = first(step([cpu_i32(*mine).to(dev), pos])).float()
            want = first(
                model.run("decode", [cpu_i32(*theirs).to(dev), pos.to(dev)], context=ref)
            ).float()
            a, b = got.argmax(-1).tolist(), want.argmax(-1).tolist()
            if a == b and mine == theirs:
                same += 1
                worst = max(worst, (got - want).abs().max().item())
            elif diverged is None:
                diverged = i
            top2 = want.topk(2, dim=-1).values
            margin = min(margin, (top2[:, 0] - top2[:, 1]).min().item())
            truth = [int(seqs[0, 41 + i]), int(seqs[1, 25 + i])]
            true += int(b == truth)
            mine, theirs = a, b
        planner = getattr(plan.executables[0], "planner", None)
        label = {"kernels": "Linnet kernels", "step kernels": "the step's kernels"}.get(
            where, "pos on the " + where
        )
        line = (
            f"(t) {label}: "
            f"tokens identical {same}/{steps} steps "
            f"(first difference: {diverged}); max |logit diff| {worst:.3f}; smallest "
            f"top-2 margin {margin:.2f}; generated = true continuation {true}/{steps}"
        )
        if planner is not None:
            line += (
                f"; {planner.plans} plan() calls, {planner.host_reads} host / "
                f"{planner.reads} device reads of pos"
            )
        print("  " + line, flush=True)
        SUMMARY.append(line)
    SUMMARY.append(f"(t) trained copy model: accuracy {accuracy:.4f}")


# ---------------------------------------------------------------- (s) whole steps
def timed(
    step: Callable[[torch.Tensor, int], torch.Tensor], token: torch.Tensor
) -> tuple[float, float]:
    """(ms/token queued back to back, median ms of steps timed one by one). ``step(token,
    i)`` runs position CONTEXT + i and returns the next token, on the device."""
    for i in range(4):  # warm: compiles, captures
        token = step(token, i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(STEPS):
        token = step(token, i)
    torch.cuda.synchronize()
    queued = (time.perf_counter() - t0) / STEPS
    one = []
    for i in range(16):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        token = step(token, i)
        torch.cuda.synchronize()
        one.append(time.perf_counter() - t0)
    return queued * 1e3, statistics.median(one) * 1e3


def linnet_rows(name: str, dev: torch.device, rows: list[tuple[str, str, Any]]) -> int:
    from linnet.plan import TimingCache
    from linnet.torch import load, random_weights
    from linnet.torch.cublaslt import CublasLt
    from linnet.torch.flashinfer import FlashInfer
    from linnet.torch.planned import Captured, plan_for

    cfg = config(name, S=CACHE, B=BATCH)
    weights = random_weights(LLAMA, cfg, seed=0, device=dev)
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    prompt = torch.randint(0, cfg["V"], (BATCH, CONTEXT), dtype=torch.int32, device=dev)
    first_token = torch.ones(BATCH, dtype=torch.int32, device=dev)

    def captured(label: str, backends: list, compile: Any, kernels: bool = False) -> None:
        if not wanted(label):
            return
        model = load(LLAMA, weights=dict(weights), config=cfg, device=dev, numerics="fast")
        t0 = time.perf_counter()
        plan = plan_for(
            model,
            "decode",
            [cpu_i32(*[1] * BATCH), cpu_i32(*[CONTEXT] * BATCH)],
            backends=backends,
            compile=compile,
            progress=False,
            kernels=kernels,
            cache=TimingCache(Path(tempfile.mkdtemp()) / "t.json"),
        )
        planned = time.perf_counter() - t0
        taken: dict[str, int] = {}
        for c in plan.regions:
            taken[c.backend.name] = taken.get(c.backend.name, 0) + 1
        ctx = model.context_for(plan)
        if CONTEXT <= 4096:
            model.prefill(prompt, context=ctx)
        # Longer: the prefill's causal attention holds L x L scores per head (32k: too big),
        # and a step's time does not depend on the cache's values: it stays zeros.
        step = Captured(plan, ctx)

        def run(token: torch.Tensor, i: int) -> torch.Tensor:
            logits = first(step([token, cpu_i32(*[CONTEXT + i] * BATCH)]))
            return logits.argmax(-1).to(torch.int32)

        queued, one = timed(run, first_token)
        if kernels:  # the same plan, captured again, the kernels under other PDL modes

            def again(mode: int) -> tuple[float, float]:
                plain = Captured(plan, ctx, pdl=mode)
                return timed(
                    lambda t, i: (
                        first(plain([t, cpu_i32(*[CONTEXT + i] * BATCH)]))
                        .argmax(-1)
                        .to(torch.int32)
                    ),
                    first_token,
                )

            for line in other_pdl(label, plan, again):
                what_, q2, o2 = line.split("|")
                rows.append((name, what_, (float(q2), float(o2), "same plan")))
            launch = plan.explain().splitlines()[-1]
            if launch.startswith("launch mode"):
                print(f"    {launch}", flush=True)
        if PROFILE and kernels and BATCH == 1:
            events, wall = profiled(step, first_token)
            table = [
                f"\n(s) {name} {label}: kernels of one step (profiled, so slower than queued)",
                *kernel_table(events, 8, wall * 1e3),
            ]
            print("\n".join(table), flush=True)  # now: a call that runs out of time keeps it
            SUMMARY.extend(table)
        what = ", ".join(f"{k} {v}" for k, v in sorted(taken.items())) or "no regions"
        rows.append(
            (
                name,
                label + (pdl_said(plan) if kernels else ""),
                (queued, one, f"{what}; plan {planned:.0f} s"),
            )
        )
        print(
            f"  {name} {label}: {queued:.3f} ms/token queued, {one:.3f} one by one; {what}",
            flush=True,
        )
        if backends or kernels:
            print(
                "\n".join(
                    ln for ln in plan.explain().splitlines() if "taken" in ln or "declined" in ln
                )[:3000]
            )
        if kernels:  # every kernel region's fate, one line per kind
            seen: set[tuple[str, str]] = set()
            for c in plan.candidates:
                key = (c.region.kind, c.region.callee)
                if c.backend_name == "linnet-kernels" and key not in seen:
                    seen.add(key)
                    said = c.status == "failed" or "context" in (c.reason or "")
                    why = f" ({(c.reason or '')[:240]})" if said else ""
                    print(
                        f"    kernel {c.region!r}: {c.status}{why}; kernel "
                        f"{(c.backend_seconds or 0) * 1e6:.1f} us, bodies "
                        f"{(c.generated_seconds or 0) * 1e6:.1f} us",
                        flush=True,
                    )

    both = [CublasLt(), FlashInfer()]
    mat: Any = "max-autotune-no-cudagraphs"
    if INDUCTOR_PDL:  # the mode's options and inductor's PDL; the labels say the mode + PDL
        mat = {**MAT_OPTIONS, "triton.enable_pdl": True}
    guarded(f"{name} generated", lambda: captured("Linnet generated, Captured", [], None))
    guarded(
        f"{name} generated + plugins",
        lambda: captured("Linnet generated + CublasLt + FlashInfer, Captured", both, None),
    )
    ml = MAT + (" (inductor PDL)" if INDUCTOR_PDL else "")
    guarded(f"{name} {ml}", lambda: captured(f"Linnet compile {ml}, Captured", [], mat))
    # The best configuration first: a call that runs out of time still has it.
    guarded(
        f"{name} {ml} + plugins + kernels",
        lambda: captured(
            f"Linnet compile {ml} + CublasLt + FlashInfer + linnet-kernels, Captured",
            both,
            mat,
            True,
        ),
    )
    guarded(
        f"{name} {ml} + plugins",
        lambda: captured(f"Linnet compile {ml} + CublasLt + FlashInfer, Captured", both, mat),
    )
    # Linnet's own kernels (bound ops and span ops, issue 15) as planner candidates.
    guarded(
        f"{name} generated + kernels",
        lambda: captured("Linnet generated + linnet-kernels, Captured", [], None, True),
    )
    guarded(
        f"{name} generated + plugins + kernels",
        lambda: captured(
            "Linnet generated + CublasLt + FlashInfer + linnet-kernels, Captured", both, None, True
        ),
    )
    return weight_bytes


def hf_model(hf_cfg: Any, dev: torch.device, batch: int) -> tuple[Any, str, dict[str, int]]:
    """A bf16 `LlamaForCausalLM` of ``hf_cfg`` on ``dev`` (random weights), the name its
    forward gives the cache argument, and StaticCache's batch keyword (both changed across
    transformers versions)."""
    import transformers

    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    params = inspect.signature(hf.model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    cache_args = inspect.signature(transformers.StaticCache).parameters
    batch_kw = {"max_batch_size": batch} if "max_batch_size" in cache_args else {}
    return hf, cache_kw, batch_kw


def hf_rows(name: str, dev: torch.device, rows: list[tuple[str, str, Any]]) -> None:
    """Hugging Face transformers, StaticCache, torch.compile: GPU.md's baselines, here."""
    import transformers

    cfg = config(name, S=CACHE)
    hf_cfg = hf_config(cfg)
    hf, cache_kw, batch_kw = hf_model(hf_cfg, dev, BATCH)
    prompt = torch.randint(0, cfg["V"], (BATCH, CONTEXT), device=dev)
    positions = [torch.tensor([[CONTEXT + i]] * BATCH, device=dev) for i in range(STEPS + 8)]

    def fresh_cache() -> Any:
        cache = transformers.StaticCache(config=hf_cfg, max_cache_len=CACHE, **batch_kw)
        with torch.no_grad():
            hf(input_ids=prompt, use_cache=True, **{cache_kw: cache})
        return cache

    def rewind(cache: Any) -> None:
        # StaticCache layers count the positions written (a device tensor bumped in place,
        # also by warm-up and captured steps): put it back at the prompt's end.
        for layer in cache.layers:
            layer.cumulative_length.fill_(CONTEXT)

    def forward(cache: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def fn(ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            out = hf(input_ids=ids, position_ids=position_ids, use_cache=True, **{cache_kw: cache})
            return out.logits

        return fn

    def reduce_overhead() -> None:
        cache = fresh_cache()
        fn = torch.compile(forward(cache), mode="reduce-overhead")

        def run(token: torch.Tensor, i: int) -> torch.Tensor:
            if i == 0:
                rewind(cache)
            with torch.no_grad():
                return fn(token, positions[i]).argmax(-1).clone()

        queued, one = timed(run, torch.ones(BATCH, 1, dtype=torch.long, device=dev))
        rows.append((name, "HF StaticCache, torch.compile reduce-overhead", (queued, one, "")))
        print(f"  {name} HF reduce-overhead: {queued:.3f} ms/token", flush=True)

    def autotune_graph() -> None:
        cache = fresh_cache()
        fn = torch.compile(forward(cache), mode="max-autotune-no-cudagraphs")
        ids = torch.ones(BATCH, 1, dtype=torch.long, device=dev)
        pos = positions[0].clone()
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn(ids, pos)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = fn(ids, pos)

        def run(token: torch.Tensor, i: int) -> torch.Tensor:
            if i == 0:
                rewind(cache)
            ids.copy_(token)
            pos.copy_(positions[i])
            graph.replay()
            return logits.argmax(-1)

        queued, one = timed(run, torch.ones(BATCH, 1, dtype=torch.long, device=dev))
        rows.append(
            (
                name,
                "HF StaticCache, compile max-autotune-no-cudagraphs + CUDA graph",
                (queued, one, ""),
            )
        )
        print(f"  {name} HF max-autotune + graph: {queued:.3f} ms/token", flush=True)

    if not HF_BEST_ONLY:
        guarded(f"{name} HF reduce-overhead", reduce_overhead)
    guarded(f"{name} HF max-autotune + graph", autotune_graph)


def whole_steps(dev: torch.device, models: list[str], which: list[str]) -> None:
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"\n== (s) whole decode steps; copy bandwidth {bandwidth / 1e12:.3f} TB/s")
    for name in models:
        rows: list[tuple[str, str, Any]] = []
        weight_bytes = None
        # transformers first: a failed capture elsewhere would leave the CUDA generator
        # capturing, and its random init would fail.
        if "hf" in which:
            guarded(f"{name} HF rows", lambda n=name, r=rows: hf_rows(n, dev, r))
        if "linnet" in which:
            weight_bytes = guarded(
                f"{name} Linnet rows", lambda n=name, r=rows: linnet_rows(n, dev, r)
            )
        if weight_bytes is None:  # the same count the Linnet rows make
            from linnet.lang import Program, lower

            graph = lower(
                Program.from_file(LLAMA),
                "decode",
                {"token": [1], "pos": [1]},
                config(name, S=CACHE),
            )
            weight_bytes = sum(2 * math.prod(v.shape) for v in graph.parameters.values())
        cfg = config(name)
        kv = 2 * cfg["NL"] * (CONTEXT + STEPS // 2) * cfg["KV"] * cfg["HD"] * 2 * BATCH
        floor = ((weight_bytes or 0) + kv) / bandwidth * 1e3
        # The floor counts every weight, as the goals do; a step reads an untied
        # embedding table one row a sequence (a tied one is the LM head's, read whole).
        unread = 0 if cfg.get("tie_word_embeddings") else 2 * cfg["D"] * (cfg["V"] - BATCH)
        reads = ((weight_bytes or 0) - unread + kv) / bandwidth * 1e3
        SUMMARY.append(
            f"\n(s) {name}, batch {BATCH}, positions {CONTEXT}..{CONTEXT + STEPS - 1}, "
            f"cache {CACHE}; floor {floor:.3f} ms (weights + KV over "
            f"{bandwidth / 1e12:.3f} TB/s); the bytes a step reads {reads:.3f} ms"
        )
        SUMMARY.append(
            "| configuration | ms/token (queued) | floor / time | reads / time | "
            "ms, one by one | regions |"
        )
        SUMMARY.append("|---|---|---|---|---|---|")
        for _, label, (queued, one, what) in rows:
            SUMMARY.append(
                f"| {label} | {queued:.3f} | {floor / queued:.0%} | "
                f"{reads / queued:.0%} | {one:.3f} | {what} |"
            )


# ---------------------------------------------------------------- (f) prefill
PREFILL = 1024  # (f): prompt length, batch 1
PREFILL_COMPILE = "max-autotune-no-cudagraphs"  # (f): --prefill-compile, both sides' mode
BF16_RATE = 781e12  # the H200's dense bf16 tensor-core rate (GPU.md), FLOP/s


def prefill_flops(cfg: dict, length: int) -> float:
    """Matrix-product FLOPs of one causal prefill: 2 per weight (the LM head included, the
    embedding not) per token, plus the attention's two products over the causal half."""
    d, f, h, kv, hd, nl, v = (cfg[k] for k in ("D", "F", "H", "KV", "HD", "NL", "V"))
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    weights = nl * per_layer + d * v
    attention = nl * 2 * 2 * h * hd * length * (length + 1) / 2
    return 2.0 * weights * length + attention


def prefill_rows(name: str, dev: torch.device, kinds: list[str]) -> None:
    """Batch 1, PREFILL tokens: Linnet's compiled plan (both plugins, max-autotune, its
    kernels as candidates) against transformers compiled the same way; ms (median of 10,
    synchronised) and the share of the bf16 rate. Linnet's plan is made as a prefill runs,
    by plan.run (``captured=False``: timed with the host's launches, session 17), and also
    run under Captured (the same plan replayed as one CUDA graph, as a server that pads
    prompts to one length could), beside transformers' compiled call also replayed as a CUDA
    graph. `kinds` (--rows) and --only pick the rows: each compile of a 1024-token prefill
    takes 220-230 s on the H200 (session 10), so one device call covers about two."""
    import transformers
    from linnet.plan import TimingCache
    from linnet.torch import load, random_weights
    from linnet.torch.cublaslt import CublasLt
    from linnet.torch.flashinfer import FlashInfer
    from linnet.torch.planned import Captured, plan_for

    cfg = config(name, S=PREFILL + 128, B=1)
    flops = prefill_flops(cfg, PREFILL)
    prompt = torch.randint(0, cfg["V"], (1, PREFILL), dtype=torch.int32)
    mat = PREFILL_COMPILE
    mode = "default" if mat is True else mat  # for the labels
    rows: list[tuple[str, float, str]] = []

    def median_ms(fn: Callable[[], Any]) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    def kernels_of(label: str, fn: Callable[[], Any], calls: int = 3) -> None:
        """--profile: the kernel table of `calls` synchronised calls of `fn` (after the
        timing and after its row is kept, so compiled and warm, and a failure here loses no
        figure), printed at once and kept for the summary."""
        if not PROFILE:
            return
        activity = (
            torch.profiler.ProfilerActivity.CUDA
            if dev.type == "cuda"
            else torch.profiler.ProfilerActivity.CPU
        )  # a dry run on the CPU
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[activity]) as prof:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / calls
        table = [f"\n(f) {name} prefill, {label}: kernels of one call (profiled)"]
        table += kernel_table(prof.key_averages(), calls, wall * 1e3, top=12)
        print("\n".join(table), flush=True)
        SUMMARY.extend(table)

    def keep(label: str, ms: float, what: str = "") -> None:
        rows.append((label, ms, what))
        print(f"  {name} prefill {label}: {ms:.2f} ms" + (f"; {what}" if what else ""), flush=True)

    weights = random_weights(LLAMA, cfg, seed=0, device=dev)

    def linnet(kernels: bool, label: str) -> None:
        model = load(LLAMA, weights=dict(weights), config=cfg, device=dev, numerics="fast")
        t0 = time.perf_counter()
        plan = plan_for(
            model,
            "prefill",
            [prompt],
            backends=[CublasLt(), FlashInfer()],
            compile=mat,
            progress=print,
            kernels=kernels,
            captured=False,
            cache=TimingCache(Path(tempfile.mkdtemp()) / "t.json"),
        )
        planned = time.perf_counter() - t0
        ctx = model.context_for(plan)
        with torch.inference_mode():  # as Captured's own buffers: no compiled slice recompiles
            ins = [prompt.to(dev)]
        taken: dict[str, int] = {}
        for c in plan.regions:
            taken[c.backend.name] = taken.get(c.backend.name, 0) + 1
        what = ", ".join(f"{k} {v}" for k, v in sorted(taken.items())) or "no regions"
        slices = sum(1 for i in plan.items if i.kind == "slice")
        keep(
            f"{label}, plan.run",
            median_ms(lambda: plan.run(ins, ctx)),
            f"{what}, {slices} slices; plan {planned:.0f} s",
        )
        declined = {}
        for c in plan.candidates:
            if c.status != "taken":
                declined[c.status] = declined.get(c.status, 0) + 1
        print(f"  declined: {declined}", flush=True)
        out = Path(os.environ.get("OUT", "gpu-results"))
        out.mkdir(parents=True, exist_ok=True)
        (out / f"explain-{name}-prefill.txt").write_text(plan.explain())
        guarded(
            f"(f) {name} {label}: profile", lambda: kernels_of(label, lambda: plan.run(ins, ctx))
        )
        guarded(
            f"(f) {name} {label}: host profile",
            lambda: host_profile(out / f"host-{name}-prefill.txt", lambda: plan.run(ins, ctx)),
        )
        step = Captured(plan, ctx)
        keep(f"{label}, the same plan under Captured", median_ms(lambda: step(ins)), what)

    def hf() -> None:
        hf_cfg = hf_config(cfg)
        model, cache_kw, batch_kw = hf_model(hf_cfg, dev, 1)
        cache = transformers.StaticCache(config=hf_cfg, max_cache_len=PREFILL + 128, **batch_kw)
        ids = prompt.to(dev, torch.long)
        fn = torch.compile(
            lambda: model(input_ids=ids, use_cache=True, **{cache_kw: cache}).logits,
            mode=None if mat is True else mat,
        )

        def run() -> Any:
            for layer in getattr(cache, "layers", []):
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length.fill_(0)
            with torch.no_grad():
                return fn()

        keep(f"HF StaticCache, torch.compile {mode}", median_ms(run))
        guarded(f"(f) {name} HF: profile", lambda: kernels_of("HF compiled", run))

        def graphed() -> None:  # the same compiled call replayed as one CUDA graph
            # kernels.py's capture (warm-up on a side stream, one call a graph); its time is
            # in median_ms's unit, ms.
            keep(
                f"HF StaticCache, torch.compile {mode}, replayed as a CUDA graph",
                graphed_us(run, median_ms, "cuda", reps=1),
            )

        guarded(f"(f) {name} HF graph", graphed)

    for kernels in (True, False):  # Linnet first: the call's time runs out on transformers
        label = f"Linnet compile {mode} + CublasLt + FlashInfer" + (
            " + linnet-kernels" if kernels else ""
        )
        if "linnet" in kinds and wanted(label):
            guarded(f"(f) {name} {label}", lambda k=kernels, lb=label: linnet(k, lb))
    if "hf" in kinds:
        guarded(f"(f) {name} HF", hf)
    SUMMARY.append(
        f"\n(f) {name} prefill, batch 1, {PREFILL} tokens; {flops / 1e12:.2f} TFLOP "
        f"(at {BF16_RATE / 1e12:.0f} TFLOP/s: {flops / BF16_RATE * 1e3:.2f} ms)"
    )
    SUMMARY.append("| configuration | ms | of the bf16 rate | regions |")
    SUMMARY.append("|---|---|---|---|")
    for label, ms, what in rows:
        SUMMARY.append(f"| {label} | {ms:.2f} | {flops / BF16_RATE * 1e3 / ms:.0%} | {what} |")


def host_profile(path: Path, fn: Callable[[], Any], calls: int = 3) -> None:
    """--profile: where the host's time goes in `calls` calls of `fn` (torch.profiler's CPU
    activity, by own CPU time), written to `path`."""
    if not PROFILE:
        return
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    path.write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


# ---------------------------------------------------------------- (p) where a step goes
def device_us(event: Any) -> float:
    """An averaged profiler event's own device time, in us (the attribute's name changed)."""
    us = getattr(event, "self_device_time_total", None)
    return float(us if us is not None else getattr(event, "self_cuda_time_total", 0.0))


def kernel_table(events: Any, steps: int, wall_ms: float, top: int = 30) -> list[str]:
    """Rows of a profile's device kernels, grouped by name: launches and microseconds a step;
    then the kernels' total against the step's wall time (the rest is gaps between kernels).
    ``events`` is ``profiler.key_averages()``."""
    rows = []
    for e in events:
        us = device_us(e)
        if us and e.count:
            rows.append((us / steps, e.count / steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    launches = sum(r[1] for r in rows)
    out = ["| kernel | launches a step | us a step | share |", "|---|---|---|---|"]
    for us, count, name in rows[:top]:
        out.append(f"| {name[:90]} | {count:.0f} | {us:.1f} | {us / max(total, 1e-9):.1%} |")
    out.append(f"| all kernels ({len(rows)} names) | {launches:.0f} | {total:.1f} | |")
    out.append(
        f"| wall time a step | | {wall_ms * 1e3:.1f} | kernels busy "
        f"{total / max(wall_ms * 1e3, 1e-9):.0%} |"
    )
    return out


def replays_profiled(step: Callable, token: torch.Tensor, steps: int = 8) -> tuple[Any, float]:
    """(the profiler's key averages, wall seconds a step) over ``steps`` calls of
    ``step(token, i) -> next token``, each fed the previous one's."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            token = step(token, i)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
    return prof.key_averages(), wall


def profiled(step: Callable, token: torch.Tensor, steps: int = 8) -> tuple[Any, float]:
    """(the profiler's key averages, wall seconds a step) over ``steps`` replays of a
    Captured step fed its own argmax."""

    def one(token: torch.Tensor, i: int) -> torch.Tensor:
        return first(step([token, cpu_i32(CONTEXT + 4 + i)])).argmax(-1).to(torch.int32)

    return replays_profiled(one, token, steps)


def profile_step(name: str, dev: torch.device) -> None:
    """The best configuration (compile max-autotune-no-cudagraphs + both plugins, Captured):
    every kernel a step launches, from torch.profiler over 8 replays."""
    from linnet.plan import TimingCache
    from linnet.torch import load, random_weights
    from linnet.torch.cublaslt import CublasLt
    from linnet.torch.flashinfer import FlashInfer
    from linnet.torch.planned import Captured, plan_for

    cfg = config(name, S=CACHE)
    model = load(
        LLAMA,
        weights=random_weights(LLAMA, cfg, seed=0, device=dev),
        config=cfg,
        device=dev,
        numerics="fast",
    )
    plan = plan_for(
        model,
        "decode",
        [cpu_i32(1), cpu_i32(CONTEXT)],
        backends=[CublasLt(), FlashInfer()],
        compile="max-autotune-no-cudagraphs",
        progress=False,
        cache=TimingCache(Path(tempfile.mkdtemp()) / "t.json"),
    )
    ctx = model.context_for(plan)
    prompt = torch.randint(0, cfg["V"], (1, CONTEXT), dtype=torch.int32, device=dev)
    model.prefill(prompt, context=ctx)
    step = Captured(plan, ctx)
    token = torch.ones(1, dtype=torch.int32, device=dev)
    for i in range(4):
        token = first(step([token, cpu_i32(CONTEXT + i)])).argmax(-1).to(torch.int32)
    steps = 8
    events, wall = profiled(step, token, steps)
    how = "Captured"
    if not any(device_us(e) for e in events):
        # No kernels seen inside graph replays (a profiler without CUDA-graph node tracing):
        # profile the same plan run eagerly instead; the kernels are the same.
        how = "plan.run, eager: no kernels were traced inside the graph replays"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for i in range(steps):
                logits = first(plan.run([token, cpu_i32(CONTEXT + 12 + i)], ctx))
                token = logits.argmax(-1).to(torch.int32)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / steps
        events = prof.key_averages()
    SUMMARY.append(
        f"\n(p) {name}: kernels of one decode step (compile max-autotune + both "
        f"plugins; {how}; profiled, so slower than in (s))"
    )
    SUMMARY.extend(kernel_table(events, steps, wall * 1e3))


# ---------------------------------------------------------------- (v) inductor's options
MAT = "max-autotune-no-cudagraphs"
# Measured 2026-11-29 (8B, at 7ccd1ce): the mode 4.654 ms, without coordinate descent 6.349,
# with benchmark_fusion 4.697; see docs/benchmarks/flashinfer.md.
# The mode spelled out (the same options), so that a variant can add one to it.
MAT_OPTIONS = {"max_autotune": True, "coordinate_descent_tuning": True}
VARIANTS: list[tuple[str, Any]] = [
    (MAT, MAT),
    ("max_autotune, no coordinate descent", {"max_autotune": True}),
    (
        "max_autotune + coordinate descent + benchmark_fusion",
        {**MAT_OPTIONS, "benchmark_fusion": True},
    ),
    # Programmatic dependent launch (Hopper and later): each inductor kernel may start while
    # the one before it drains, waiting in `gdc_wait` for the data it reads.
    (f"{MAT} + PDL", {**MAT_OPTIONS, "triton.enable_pdl": True}),
]


def compile_variants(name: str, dev: torch.device) -> None:
    from linnet.torch import load, random_weights
    from linnet.torch.flashinfer import FlashInfer
    from linnet.torch.planned import Captured, plan_for

    cfg = config(name, S=CACHE, B=BATCH)
    weights = random_weights(LLAMA, cfg, seed=0, device=dev)
    prompt = torch.randint(0, cfg["V"], (1, CONTEXT), dtype=torch.int32, device=dev)
    SUMMARY.append(
        f"\n(v) {name}: inductor options, FlashInfer on every attention (measure="
        "False), Captured, batch 1, context 1024"
    )
    SUMMARY.append(
        "| compile= | ms/token queued | one by one | plan + compile s | kernels a "
        "step | heaviest kernels (us a step, profiled) |"
    )
    SUMMARY.append("|---|---|---|---|---|---|")

    def one(label: str, compile: Any) -> None:
        model = load(LLAMA, weights=dict(weights), config=cfg, device=dev, numerics="fast")
        t0 = time.perf_counter()
        plan = plan_for(
            model,
            "decode",
            [cpu_i32(1), cpu_i32(CONTEXT)],
            backends=[FlashInfer()],
            compile=compile,
            measure=False,
            progress=False,
        )
        ctx = model.context_for(plan)
        model.prefill(prompt, context=ctx)
        step = Captured(plan, ctx)

        def run(token: torch.Tensor, i: int) -> torch.Tensor:
            return first(step([token, cpu_i32(CONTEXT + i)])).argmax(-1).to(torch.int32)

        token = torch.ones(1, dtype=torch.int32, device=dev)
        run(token, 0)
        built = time.perf_counter() - t0
        queued, single = timed(run, token)

        def again(mode: int) -> tuple[float, float]:
            plain = Captured(plan, ctx, pdl=mode)
            return timed(
                lambda t, i: first(plain([t, cpu_i32(CONTEXT + i)])).argmax(-1).to(torch.int32),
                token,
            )

        for line in other_pdl(label, plan, again):
            what_, q2, o2 = line.split("|")
            SUMMARY.append(f"| {what_} | {q2} | {o2} | same plan | | |")
        events, _ = profiled(step, token)
        kernels = sorted(
            ((device_us(e) / 8, e.count / 8, e.key) for e in events if device_us(e) and e.count),
            reverse=True,
        )
        launches = sum(k[1] for k in kernels)
        top = "; ".join(f"{k[2][:40]} x{k[1]:.0f} {k[0]:.0f}" for k in kernels[:5])
        SUMMARY.append(
            f"| {label}{pdl_said(plan)} | {queued:.3f} | {single:.3f} | {built:.0f} | "
            f"{launches:.0f} | {top} |"
        )
        print("  " + SUMMARY[-1], flush=True)

    for label, compile in VARIANTS:
        if not wanted(label):
            continue
        guarded(f"(v) {name} {label}", lambda la=label, c=compile: one(la, c))


def main() -> int:
    global CONTEXT, CACHE, BATCH, HF_BEST_ONLY, PROFILE, INDUCTOR_PDL, PREFILL_COMPILE, PREFILL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--parts",
        default="t,s",
        help="t (token for token), s (whole steps), f (prefill), p (kernels "
        "of a step), v (inductor's options)",
    )
    parser.add_argument("--models", default="llama-3.2-1b,llama-3-8b")
    parser.add_argument(
        "--prefill-compile",
        default=PREFILL_COMPILE,
        metavar="MODE",
        help="(f): the torch.compile mode of both sides (default: "
        "max-autotune-no-cudagraphs; 'default' is inductor's default, "
        "which compiles in a fraction of the time)",
    )
    parser.add_argument(
        "--rows",
        default="linnet,hf",
        help="(s, f): linnet (Linnet's configurations), hf (transformers baselines)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="(s, f, v): keep only the Linnet rows (v: the variants) whose label "
        "this regular expression finds (e.g. 'compile.*FlashInfer')",
    )
    parser.add_argument(
        "--hf-best",
        action="store_true",
        help="(s): only transformers' best configuration (max-autotune-no-"
        "cudagraphs + a CUDA graph), not reduce-overhead too",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=CONTEXT,
        help="(s): prompt length; decode runs positions context.. (cache: context + 128)",
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="(s): sequences a step")
    parser.add_argument(
        "--prefill-length",
        type=int,
        default=PREFILL,
        help="(f): prompt tokens (issue 43 asks for 8192 too)",
    )
    parser.add_argument(
        "--inductor-pdl",
        action="store_true",
        help="(s): Linnet's compiled rows with inductor's programmatic "
        "dependent launch (triton.enable_pdl) on",
    )
    parser.add_argument(
        "--pdl",
        choices=("0", "1", "2", "3"),
        default=None,
        help="LINNET_PDL for the whole run (plans are made under it; each "
        "kernel row is timed again under the other modes): 0 off, 1 "
        "early, 2 late (the default), 3 early for grids of one program "
        "an SM",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="(s): also the kernel table (as p makes) of each row with Linnet's "
        "kernels, from the very plan that row timed; (f): of every row",
    )
    args = parser.parse_args()
    if args.pdl is not None:  # read when each generated module is imported: before any is
        os.environ["LINNET_PDL"] = args.pdl
    ONLY[:] = [args.only] if args.only else []
    PREFILL_COMPILE = True if args.prefill_compile == "default" else args.prefill_compile
    PREFILL = args.prefill_length
    HF_BEST_ONLY = args.hf_best
    PROFILE = args.profile
    INDUCTOR_PDL = args.inductor_pdl
    CONTEXT, CACHE, BATCH = args.context, args.context + 128, args.batch
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"{props.name}, torch {torch.__version__}")
    parts = args.parts.split(",")
    if "t" in parts:
        guarded("(t)", lambda: token_for_token(dev))
    if "s" in parts:
        whole_steps(dev, args.models.split(","), args.rows.split(","))
    if "f" in parts:
        for name in args.models.split(","):
            prefill_rows(name, dev, args.rows.split(","))
    if "p" in parts:
        for name in args.models.split(","):
            guarded(f"(p) {name}", lambda n=name: profile_step(n, dev))
    if "v" in parts:
        for name in args.models.split(","):
            compile_variants(name, dev)
    print("\n== summary")
    print("\n".join(SUMMARY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
