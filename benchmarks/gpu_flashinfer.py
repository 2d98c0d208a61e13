"""On an H200: the FlashInfer backend (plugins/linnet-flashinfer) checked and timed.

(a) model.conform("decode", ..., FlashInfer()) on the toy Llama in bf16 (head dim 64, and 128
    at batch 2 with rows at different positions), after a prefill so the caches hold data.
(b) A plan with backends=[FlashInfer()], measure=False, under Captured, against the unplanned
    generated source (model.run with its own context) over 256 decode steps, batch 2, one row
    overwriting prefilled positions (they must be masked) and one continuing: teacher-forced
    argmax agreement and the largest logit difference, then free-running (each feeds its own
    tokens) identical-prefix length; for replan="pages" (default) and replan="always". Random
    weights give near-tied logits that any two bf16 attentions flip: the token-for-token check
    is gpu_steps.py part (t), on a model trained so that its logits are decisive.
(c) Per-layer decode attention at 8B shapes (32 q heads, 8 KV heads, head dim 128, bf16), at
    context 1k, 4k, 16k and 32k and batch 1 and 8: FlashInfer (pages of 16, and one page a
    row) against the generated source, timed inside CUDA graphs with events, rotating through
    8 layers' caches; each as a fraction of the KV-bytes / 4.18e12 B/s floor.
(d) Whole decode steps moved to benchmarks/gpu_steps.py.
(e) FlashInfer's split of the cache (auto, off; pages of 16 and 64) per layer at 8B shapes,
    context 1k-4k, batch 1 and 8 (not in the default parts). A fixed number of pages per split
    was measured once and dropped from the plugin (no faster at 1k x 1; FlashInfer refuses it
    under CUDA graphs at batch 8).
(f) Paged decode attention at 8B shapes as serving runs it (a page pool of 16 positions a page,
    each row's pages shuffled across it, `decode_paged`), context 1k, batch 8, 32 and 64:
    FlashInfer's tensor-core and CUDA-core kernels with its split on and off, against Linnet's
    own paged kernels (flash and split), per layer in CUDA graphs, as fractions of the KV floor at the copy
    bandwidth measured here (`--parts f`).

Each part runs on its own and prints its error if it fails. --dry-run runs the CPU-safe parts
(lowering, matching, probing, page tables). Run by `bash benchmarks/gpu.sh --flashinfer`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
BANDWIDTH = 4.18e12
SUMMARY: list[str] = []
CONTEXTS = (1024, 4096, 16384, 32768)  # (c)
BATCHES = (1, 8)  # (c)
MODELS: tuple[tuple[str, dict], ...] = (("llama-3.2-1b", {}), ("llama-3-8b", {}))  # (d)
STEPS = 256  # (b)


def config(name: str, **extra: Any) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


def i32(*values: int, device: Any = "cuda") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def first(outputs: Any) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, list | tuple) else outputs


def part(title: str):
    """Run a part; print its error and go on if it fails."""

    def wrap(fn):
        def run(*args: Any) -> None:
            print(f"\n== {title}", flush=True)
            t0 = time.perf_counter()
            try:
                fn(*args)
            except Exception as exc:  # each part on its own
                traceback.print_exc()
                SUMMARY.append(f"{title}: FAILED ({type(exc).__name__}: {str(exc)[:120]})")
            print(f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

        return run

    return wrap


# ---------------------------------------------------------------- dry run (CPU)
@part("dry run: lowering, matching, probing")
def dry_run() -> None:
    from linnet.backends import Target
    from linnet.lang import Program, lower
    from linnet.torch.flashinfer import FlashInfer, Planner, flashinfer_version

    program = Program.from_file(LLAMA)
    backend = FlashInfer()
    print(f"flashinfer-python {flashinfer_version()}; backend version {backend.version}")
    for target in (
        Target("cpu"),
        Target("cuda", "cuda:0", "A100", (8, 0)),
        Target("cuda", "cuda:0", "H200", (9, 0)),
    ):
        print(
            f"probe {target.kind} {target.capability}: "
            f"{backend.decline_reason(target) or 'accepted'}"
        )
    cases = [
        ("toy bf16 hd64", config("toy", T="bf16", HD=64), 1),
        ("toy f32 hd16", config("toy"), 1),
        ("1B", config("llama-3.2-1b"), 1),
        ("8B", config("llama-3-8b"), 8),
        ("8B attention, S=32k", config("llama-3-8b", NL=8, V=256, D=512, F=512, S=32768), 8),
    ]
    for label, cfg, batch in cases:
        graph = lower(program, "decode", {"token": [batch], "pos": [batch]}, cfg)
        regions = backend.match(graph, Target("cuda", capability=(9, 0)))
        declined = backend.declined(graph)
        line = f"{label} B={batch}: {len(regions)} regions"
        if regions:
            ((site, _),) = [(s, r) for _, s, r in backend.sites(graph)[:1]]
            assert site is not None
            planner = Planner(site.shape, backend.page_size, True, backend.workspace_bytes, "pages")
            line += (
                f", kind {regions[0].kind}, inputs {list(regions[0].inputs)}, "
                f"pages of {planner.page_size} x {planner.pages_per_row} a row, "
                f"wrapper holds {planner.shared_bytes / 2**20:.0f} MiB"
            )
        if declined:
            line += f"; declined: {declined[0][1]}"
        print(line)
        prefill = lower(program, "prefill", {"tokens": [1, 8]}, cfg)
        assert backend.match(prefill, Target("cuda", capability=(9, 0))) == []
    SUMMARY.append("dry run: ok")


# ---------------------------------------------------------------- (a) conformance
@part("(a) conform on the toy Llama, bf16, after a prefill")
def conform_toy(dev: torch.device) -> None:
    from linnet.torch import Context, load, random_weights
    from linnet.torch.flashinfer import FlashInfer

    for label, extra, positions in [
        ("toy bf16 hd64 B=1", {"HD": 64}, (40,)),
        ("toy bf16 hd128 B=2", {"HD": 128, "D": 128}, (40, 17)),
    ]:
        cfg = config("toy", T="bf16", **extra)
        # The default weight scale keeps attention outputs near 0.1, where conform's absolute
        # tolerance (0.01) is above bf16 rounding and below a wrong mask's error.
        model = load(
            LLAMA, weights=random_weights(LLAMA, cfg, seed=0, device=dev), config=cfg, device=dev
        )
        batch = len(positions)
        prompt = torch.randint(0, cfg["V"], (batch, 40), dtype=torch.int32, device=dev)
        filled = model.new_context("prefill", [prompt])
        model.prefill(prompt, context=filled)
        # conform makes a fresh (zeroed) context: give it copies of the prefilled caches.
        model.context_for_graph = lambda graph, c=filled: Context(  # type: ignore[method-assign]
            c.parameters, {k: v.clone() for k, v in c.states.items()}, c.device
        )
        findings = model.conform(
            "decode", [i32(*[3] * batch, device=dev), i32(*positions, device=dev)], FlashInfer()
        )
        del model.context_for_graph
        worst = max((f.difference or 0.0) for f in findings) if findings else float("nan")
        ok = bool(findings) and all(f.passed for f in findings)
        for f in findings:
            print(f"  {label}: {f}")
        SUMMARY.append(
            f"(a) {label}: {len(findings)} regions, max diff {worst:.2e}, "
            f"{'PASSED' if ok else 'FAILED'}"
        )


# ---------------------------------------------------------------- (b) Captured over 256 steps
@part("(b) Captured plan vs the generated source, 256 decode steps")
def captured_toy(dev: torch.device) -> None:
    from linnet.torch import load, random_weights
    from linnet.torch.flashinfer import FlashInfer
    from linnet.torch.planned import Captured

    cfg = config("toy", T="bf16", HD=64, S=512)
    # Weights at scale 0.2 (not 0.02): logits far from ties, so argmax compares the math.
    model = load(
        LLAMA,
        weights=random_weights(LLAMA, cfg, seed=1, scale=0.2, device=dev),
        config=cfg,
        device=dev,
    )
    prompt = torch.randint(0, cfg["V"], (2, 40), dtype=torch.int32, device=dev)
    steps = STEPS

    def positions(i: int) -> torch.Tensor:
        # Row 0 rewrites the cache from position 10 (prefilled 10..39 must stay masked);
        # row 1 continues after its prompt.
        return i32(10 + i, 40 + i, device=dev)

    for replan in ("pages", "always"):
        plan = model.plan_for(
            "decode",
            [i32(1, 1, device=dev), positions(0)],
            backends=[FlashInfer(replan=replan)],
            measure=False,
            progress=False,
        )
        assert len(plan.regions) == cfg["NL"], plan.explain()
        ctx = model.context_for(plan)
        ref = model.new_context("decode", [i32(1, 1, device=dev), positions(0)])
        model.prefill(prompt, context=ctx)
        model.prefill(prompt, context=ref)
        step = Captured(plan, ctx)
        tokens, same, worst = [5, 7], 0, 0.0
        t0 = time.perf_counter()
        for i in range(steps):
            got = first(step([i32(*tokens, device=dev), positions(i)]))
            want = first(model.run("decode", [i32(*tokens, device=dev), positions(i)], context=ref))
            worst = max(worst, (got.float() - want.float()).abs().max().item())
            same += int((got.argmax(-1) == want.argmax(-1)).sum())
            tokens = want.argmax(-1).tolist()
        took = time.perf_counter() - t0
        planner = plan.executables[0].planner
        plans, reads = planner.plans, planner.reads
        print(
            f"  replan={replan}: teacher-forced argmax {same}/{2 * steps}, max |logit diff| "
            f"{worst:.3e}; {plans} plan() calls, {reads} pos reads; "
            f"{took:.1f} s"
        )
        # Free-running: each side feeds its own tokens.
        ctx2 = model.context_for(plan)
        ref2 = model.new_context("decode", [i32(1, 1, device=dev), positions(0)])
        model.prefill(prompt, context=ctx2)
        model.prefill(prompt, context=ref2)
        step2 = Captured(plan, ctx2)
        mine, theirs, prefix = [5, 7], [5, 7], None
        for i in range(steps):
            a = first(step2([i32(*mine, device=dev), positions(i)])).argmax(-1).tolist()
            b = (
                first(model.run("decode", [i32(*theirs, device=dev), positions(i)], context=ref2))
                .argmax(-1)
                .tolist()
            )
            if a != b and prefix is None:
                prefix = i
            mine, theirs = a, b
        prefix = steps if prefix is None else prefix
        print(f"  replan={replan}: free-running tokens identical for {prefix}/{steps} steps")
        SUMMARY.append(
            f"(b) replan={replan}: teacher-forced argmax {same}/{2 * steps}, "
            f"max |logit diff| {worst:.2e}, free-running identical {prefix}/{steps}"
            f" steps; {plans} plan() calls / {reads} pos reads in {steps} steps"
        )


# ---------------------------------------------------------------- (c) per-layer attention
def attention_times(
    dev: torch.device,
    context: int,
    batch: int,
    variants: list[tuple[str, Any]],
    generated: bool = True,
    layers: int = 8,
) -> dict[str, float]:
    """Seconds per layer of decode attention at 8B shapes (32 q / 8 KV heads, head dim 128,
    bf16), cache length ``context``, every row at its last position: each FlashInfer variant
    and (``generated``) the generated source, inside CUDA graphs rotating over ``layers``
    layers' caches."""
    from linnet.backends import Options
    from linnet.torch import load, random_weights
    from linnet.torch.planned import PlanBuilder

    class Rotating(PlanBuilder):
        """Times each kind over every region given (the layers' caches), not one per
        distinct parameter list (attention regions have none: they read states)."""

        def rotation(self, group):
            return list(group)

    cfg = config("llama-3-8b", NL=layers, V=256, D=512, F=512, S=context)
    model = load(
        LLAMA, weights=random_weights(LLAMA, cfg, seed=2, device=dev), config=cfg, device=dev
    )
    inputs = [i32(*[1] * batch, device=dev), i32(*[context - 1] * batch, device=dev)]
    builder = Rotating(model, "decode", inputs, Options(warmup=3, repeat=30), progress=False)
    ctx = model.context_for_graph(builder.graph)
    gen = torch.Generator(dev).manual_seed(0)
    for state in ctx.states.values():
        state.normal_(generator=gen)
    times: dict[str, float] = {}
    env = None
    group: list = []
    for label, backend in variants:
        group = builder.candidates(builder.probe([backend]))
        assert len(group) == layers, builder.skipped
        if env is None:
            env = builder.record_values(group, ctx)
        times[label] = builder.time_backend(group, env, ctx)
    assert env is not None
    if generated:
        times["generated"] = builder.time_generated(group, env, ctx)
    return times


def kv_floor(context: int, batch: int) -> float:
    return 2 * batch * context * 8 * 128 * 2 / BANDWIDTH


@part("(c) decode attention per layer, 8B shapes, inside CUDA graphs")
def attention_table(dev: torch.device) -> None:
    from linnet.torch.flashinfer import FlashInfer

    rows = []
    for context in CONTEXTS:
        for batch in BATCHES:
            times = attention_times(
                dev,
                context,
                batch,
                [
                    ("flashinfer", FlashInfer()),
                    ("flashinfer one page a row", FlashInfer(page_size=context)),
                ],
            )
            floor = kv_floor(context, batch)
            rows.append((context, batch, floor, times))
            print(
                f"  ctx {context} B {batch}: floor {floor * 1e6:.1f} us; "
                + "; ".join(f"{k} {v * 1e6:.1f} us ({floor / v:.0%})" for k, v in times.items()),
                flush=True,
            )
            torch.cuda.empty_cache()
    SUMMARY.append(
        "(c) per-layer decode attention, 8B shapes, bf16, in CUDA graphs over 8 "
        "layers (us, fraction of the KV floor at 4.18 TB/s)"
    )
    SUMMARY.append(
        "| context | B | floor | generated | flashinfer (pages of 16) | "
        "flashinfer (one page a row) | generated / flashinfer |"
    )
    SUMMARY.append("|---|---|---|---|---|---|---|")
    for context, batch, floor, t in rows:
        g, f, o = t["generated"], t["flashinfer"], t["flashinfer one page a row"]
        SUMMARY.append(
            f"| {context} | {batch} | {floor * 1e6:.1f} | {g * 1e6:.1f} "
            f"({floor / g:.0%}) | {f * 1e6:.1f} ({floor / f:.0%}) | {o * 1e6:.1f} "
            f"({floor / o:.0%}) | {g / f:.2f}x |"
        )


@part("(e) FlashInfer's split of the cache at short contexts, 8B shapes")
def split_sweep(dev: torch.device) -> None:
    """At batch 1 and 1k, FlashInfer's 11 us is 10x the KV floor: launch-bound, with a merge
    kernel after the split attention. Which split (and page size) is fastest where?"""
    from linnet.torch.flashinfer import FlashInfer

    variants = [
        ("auto", FlashInfer()),
        ("off", FlashInfer(split_kv="off")),
        ("pages of 64, auto", FlashInfer(page_size=64)),
        ("pages of 64, off", FlashInfer(page_size=64, split_kv="off")),
    ]
    SUMMARY.append("(e) FlashInfer variants, per-layer decode attention, 8B shapes (us)")
    SUMMARY.append("| context | B | floor | " + " | ".join(v for v, _ in variants) + " |")
    SUMMARY.append("|---|---|---|" + "---|" * len(variants))
    for context in (1024, 2048, 4096):
        for batch in (1, 8):
            times = attention_times(dev, context, batch, variants, generated=False)
            floor = kv_floor(context, batch)
            SUMMARY.append(
                f"| {context} | {batch} | {floor * 1e6:.1f} | "
                + " | ".join(f"{times[v] * 1e6:.1f}" for v, _ in variants)
                + " |"
            )
            print("  " + SUMMARY[-1], flush=True)
            torch.cuda.empty_cache()


def paged_attention_times(
    dev: torch.device, context: int, batch: int, variants: list[tuple[str, Any]], layers: int = 8
) -> dict[str, float]:
    """Seconds per layer of paged decode attention at 8B shapes (32 q / 8 KV heads, head dim
    128, bf16), every row at position ``context - 1`` of its own shuffled pages: each FlashInfer
    variant and Linnet's kernel (``linnet-kernels``), in CUDA graphs over ``layers`` layers."""
    from linnet.backends import Options
    from linnet.torch import load, random_weights
    from linnet.torch.planned import PlanBuilder

    class Rotating(PlanBuilder):
        def rotation(self, group):
            return list(group)

    from linnet.lang.syntax.program import model_file

    page = 16
    llama = model_file("std.models.llama")
    cfg = {
        "V": 256, "D": 512, "F": 512, "NL": layers, "KV": 8, "G": 4, "H": 32, "HD": 128,
        "T": "bf16", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    }  # fmt: skip
    per_row = context // page
    cfg.update(B=batch, S=context)
    model = load(
        llama,
        weights=random_weights(llama, cfg, seed=2, device=dev),
        config=cfg,
        device=dev,
        numerics="fast",
        kv_pages=batch * per_row + 1,
        kv_page_size=page,
    )
    gen = torch.Generator().manual_seed(batch)
    table = (torch.randperm(batch * per_row, generator=gen) + 1).reshape(batch, per_row)
    inputs = [
        i32(*[1] * batch, device=dev),
        i32(*[context - 1] * batch, device=dev),
        table.to(torch.int32),
    ]
    builder = Rotating(model, "decode_paged", inputs, Options(warmup=3, repeat=30), progress=False)
    ctx = model.context_for_graph(builder.graph)
    gen = torch.Generator(dev).manual_seed(0)
    for state in ctx.states.values():
        if state.is_floating_point():
            state.normal_(generator=gen)
    times: dict[str, float] = {}
    env = None
    kinds: list[tuple[str, list]] = []
    for label, backend in variants:
        group = builder.candidates(builder.probe([backend]))
        assert len(group) == layers, builder.skipped
        kinds.append((label, group))
    own: dict[str, list] = {}
    for c in builder.candidates(builder.kernel_paths()):
        kind = repr(c.region).removeprefix("Region(").split()[0]
        if "attention" in kind and c.status != "failed":
            own.setdefault(kind, []).append(c)
    kinds.extend((kind, group) for kind, group in sorted(own.items()) if len(group) == layers)
    for label, group in kinds:
        if env is None:
            env = builder.record_values(group, ctx)
        times[label] = builder.time_backend(group, env, ctx)
    return times


@part("(f) paged decode attention per layer, 8B shapes, as serving runs it")
def paged_table(dev: torch.device) -> None:
    from linnet.torch.flashinfer import FlashInfer
    from torch_decode import copy_bandwidth

    bw = copy_bandwidth(dev)
    variants = [
        ("tensor cores, split auto", FlashInfer()),
        ("tensor cores, split off", FlashInfer(split_kv="off")),
        ("CUDA cores, split auto", FlashInfer(use_tensor_cores=False)),
        ("CUDA cores, split off", FlashInfer(use_tensor_cores=False, split_kv="off")),
    ]
    own = ["paged_decode_attention_flash", "paged_decode_attention_split"]
    labels = [v for v, _ in variants] + own
    SUMMARY.append(
        f"(f) paged decode attention per layer, 8B shapes, pages of 16, context 1024, in CUDA "
        f"graphs (us, fraction of the KV floor at {bw / 1e12:.2f} TB/s)"
    )
    SUMMARY.append("| B | floor | " + " | ".join(labels) + " |")
    SUMMARY.append("|---|---|" + "---|" * len(labels))
    for batch in (8, 32, 64):
        times = paged_attention_times(dev, 1024, batch, variants)
        floor = 2 * batch * 1024 * 8 * 128 * 2 / bw
        cells = [
            f"{times[k] * 1e6:.1f} ({floor / times[k]:.0%})" if k in times else "-" for k in labels
        ]
        SUMMARY.append(f"| {batch} | {floor * 1e6:.1f} | " + " | ".join(cells) + " |")
        print("  " + SUMMARY[-1], flush=True)
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="only the CPU-safe parts")
    parser.add_argument(
        "--parts", default="abc", help="which GPU parts to run (default abc; e: the split sweep)"
    )
    args = parser.parse_args()
    dry_run()
    if not args.dry_run:
        if not torch.cuda.is_available():
            print("no CUDA device: only the dry run ran", file=sys.stderr)
            return 1
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        print(
            f"{props.name}, compute capability {props.major}.{props.minor}, torch "
            f"{torch.__version__}"
        )
        for key, fn in (
            ("a", conform_toy),
            ("b", captured_toy),
            ("c", attention_table),
            ("e", split_sweep),
            ("f", paged_table),
        ):
            if key in args.parts:
                fn(dev)
    print("\n== summary")
    print("\n".join(SUMMARY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
