"""On a GPU: the cuBLASLt backend (plugins/linnet-cublaslt) against the generated source.

(a) conform: every region CublasLt takes in the toy and the 1B-shaped Llama (bf16, random
    weights on the GPU) run by the backend and by the generated source; all must pass.
    Failures are analysed in bf16 ulps (a one-ulp rounding flip at |y| >= 2 exceeds 0.01).
(b) Captured: a plan with backends=[CublasLt()] (measure=False: it takes every region it
    matches) replays 64 greedy decode steps against the unplanned model.run on the toy config
    (f32 and bf16): the same tokens.
(c) Per region, 1B and 8B shapes, M = 1, 4, 16 (the decode entry for a batch of M): fused
    q/k/v, o, fused gate/up and down, by the backend, by the generated source (numerics
    "fast" and "exact") and by F.linear per sibling; timed inside CUDA graphs with CUDA events,
    rotating through every layer's weights (16 or 32 sets: more than the L2 holds), each
    against the floor weight bytes / 4.18e12 B/s.
(d) plan.explain() for the 8B decode entry (NL=32, random bf16 weights, numerics "fast").
(e) The whole decode step, 1B and 8B, context 1024, under Captured: the generated source
    alone and planned with CublasLt, ms/token.

Each part runs in its own try/except: an error is printed and the next part runs. The tables
print last. Run by `benchmarks/gpu.sh --cublaslt` on the device machine.

    python3 benchmarks/gpu_cublaslt.py [--parts abcde] [--dry-run]

--dry-run runs on any machine, the CPU included: the same code paths on the toy config (the
1B and 8B shapes only lowered and matched), with the backend's reference kernel standing in
for cuBLASLt, plan.run for Captured and wall-clock timing: a check that the script works.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
BANDWIDTH = 4.18e12  # bytes/s: the floor's bandwidth (shared/design/GPU.md)
TABLES: list[tuple[str, list[str], list[tuple]]] = []

from linnet.backends import Capabilities, Options, Target  # noqa: E402
from linnet.plan import TimingCache  # noqa: E402
from linnet.torch import load, random_weights  # noqa: E402
from linnet.torch.cublaslt import CublasLt, spec_for  # noqa: E402
from linnet.torch.planned import Captured, PlanBuilder, plan_for  # noqa: E402
from linnet.torch.timing import time_rotation  # noqa: E402


class ReferenceOnCpu(CublasLt):
    """--dry-run: the backend with its probe accepting the CPU, so that its executables run
    the reference kernel (torch.matmul into the same buffers)."""

    def probe(self, target: Target) -> Capabilities | None:
        if target.kind == "cpu":
            return Capabilities(dtypes=("f32", "f16", "bf16"), notes="reference kernel")
        return super().probe(target)


class Run:
    def __init__(self, dry: bool):
        self.dry = dry
        self.device = torch.device("cpu" if dry else "cuda")
        self.backend_type: type[CublasLt] = ReferenceOnCpu if dry else CublasLt

    def backend(self) -> CublasLt:
        return self.backend_type()

    def i32(self, *values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def config(name: str, **extra: Any) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


def table(title: str, header: list[str], rows: list[tuple]) -> None:
    TABLES.append((title, header, rows))


def model_for(
    run: Run, name: str, numerics: str = "exact", weights: Any = None, **extra: Any
) -> tuple[Any, Any, dict]:
    cfg = config(name, **extra)
    if weights is None:
        weights = random_weights(LLAMA, cfg, seed=0, device=run.device)
    model = load(LLAMA, weights=dict(weights), config=cfg, device=run.device, numerics=numerics)
    return model, weights, cfg


# ---------------------------------------------------------------- (a) conform
def part_a(run: Run) -> None:
    rows = []
    names = ["toy"] if run.dry else ["toy", "llama-3.2-1b"]
    for name in names:
        model, _, _ = model_for(run, name, T="bf16")
        inputs = [run.i32(1), run.i32(0)]
        findings = model.conform("decode", inputs, run.backend())
        failed = [f for f in findings if not f.passed]
        worst = max((f.difference or 0.0) for f in findings) if findings else 0.0
        ulps = (
            ulp_report(model, inputs, run.backend(), [f.region for f in failed]) if failed else "-"
        )
        for f in failed[:8]:
            print(f"  (a) {name}: not within 0.01: {f}")
        rows.append(
            (f"{name} bf16", len(findings), len(findings) - len(failed), f"{worst:.3g}", ulps)
        )
        del model
        run.free()
    table(
        "(a) conform (tolerance 0.01)",
        ["model", "regions", "passed", "largest difference", "failed ones, in bf16 ulps"],
        rows,
    )


def ulp_report(model: Any, inputs: list, backend: Any, regions: list) -> str:
    """For regions that failed at 0.01: the largest difference in units of the bf16 spacing
    at the reference value (1.0 = a rounding flip), as conform computes them."""
    from linnet.lang.passes.slices import slice_steps
    from linnet.torch.model import numerics_mode

    builder = PlanBuilder(model, "decode", inputs, Options(measure=False), progress=False)
    ready = builder.probe([backend])
    candidates = [
        c for c in builder.candidates(ready) if any(c.region.steps == r.steps for r in regions)
    ]
    context = model.context_for_graph(builder.graph)
    env = builder.record_values(candidates, context)
    worst = 0.0
    for c in candidates:
        r = c.region
        with numerics_mode(model.numerics), torch.inference_mode():
            scratch = context.scratch()
            c.executable.prepare(scratch)
            got = c.executable.execute([env[v] for v in r.inputs], [], scratch)
            sl = slice_steps(builder.graph, list(r.steps), "region")
            module = builder.emit([sl], "ulps")
            fn = getattr(module, module.ENTRIES[builder.graph.entry]["slices"][0]["function"])
            ref = context.scratch()
            want = fn(
                *[env[v] for v in sl.inputs],
                *[ref.parameters[p] for p in sl.parameters],
                *[ref.states[p] for p in sl.states],
            )
        for a, b in zip(got, want):
            b32 = b.float()
            spacing = torch.finfo(torch.bfloat16).eps * torch.exp2(
                torch.floor(torch.log2(b32.abs().clamp_min(1e-30)))
            )
            worst = max(worst, ((a.float() - b32).abs() / spacing).max().item())
    return f"at most {worst:.2f} ulp over {len(candidates)} regions"


# ---------------------------------------------------------------- (b) Captured
def stepper(run: Run, plan: Any, context: Any) -> Callable[[list], list]:
    """One decode step: the plan under Captured on a GPU, plan.run on the CPU."""
    if run.device.type == "cuda":
        return Captured(plan, context)
    return lambda inputs: plan.run(inputs, context)


def part_b(run: Run) -> None:
    rows = []
    steps = 8 if run.dry else 64
    for dtype in ("f32", "bf16"):
        model, _, cfg = model_for(run, "toy", T=dtype)
        plan = model.plan_for(
            "decode",
            [run.i32(0), run.i32(0)],
            backends=[run.backend()],
            measure=False,
            progress=False,
        )
        ctx = model.context_for(plan)
        ref_ctx = model.new_context("decode", [run.i32(0), run.i32(0)])
        gen = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, cfg["V"], (1, 8), dtype=torch.int32, generator=gen).to(run.device)
        model.prefill(prompt, context=ctx)
        model.prefill(prompt, context=ref_ctx)
        step = stepper(run, plan, ctx)
        mine, theirs, worst = [5], [5], 0.0
        for i in range(steps):
            (got,) = step([run.i32(mine[-1]), run.i32(8 + i)])
            want = model.run("decode", [run.i32(theirs[-1]), run.i32(8 + i)], context=ref_ctx)
            if mine[-1] == theirs[-1]:
                worst = max(worst, (got.float() - want.float()).abs().max().item())
            mine.append(int(got.argmax()))
            theirs.append(int(want.argmax()))
        same = next((i for i, (a, b) in enumerate(zip(mine[1:], theirs[1:])) if a != b), steps)
        rows.append(
            (
                f"toy {dtype}",
                len(plan.regions),
                steps,
                "yes" if same == steps else f"no: first differs at step {same}",
                f"{worst:.2e}",
            )
        )
        print(f"  (b) toy {dtype}: {plan}")
        del model, plan, ctx, ref_ctx
        run.free()
    table(
        "(b) Captured vs model.run, greedy decode (plan: measure=False)",
        ["model", "backend regions", "steps", "same tokens", "largest logit difference"],
        rows,
    )


# ---------------------------------------------------------------- (c) per region
def label_of(candidate: Any) -> str | None:
    spec = candidate.executable.spec
    if len(spec.weights) == 3:
        return "q/k/v"
    if len(spec.weights) == 2:
        return "gate/up"
    if spec.weights[0].endswith("o_proj.weight"):
        return "o"
    if spec.weights[0].endswith("down_proj.weight"):
        return "down"
    return None


def part_c(run: Run) -> None:
    rows = []
    shapes = ["toy"] if run.dry else ["llama-3.2-1b", "llama-3-8b"]
    for name in shapes:
        fast, weights, _ = model_for(run, name, numerics="fast")
        exact, _, _ = model_for(run, name, numerics="exact", weights=weights)
        backend = run.backend()  # one for every M: its cuBLASLt plans are per problem
        for m in (1, 4, 16):
            tokens = [run.i32(*([1] * m)), run.i32(*range(m))]
            options = Options(warmup=3, repeat=20)
            builder = PlanBuilder(fast, "decode", tokens, options, progress=False)
            candidates = builder.candidates(builder.probe([backend]))
            if builder.skipped:
                raise RuntimeError(f"{name}: {builder.skipped[-1]}")
            context = fast.context_for_graph(builder.graph)
            env = builder.record_values(candidates, context)
            exact_builder = PlanBuilder(exact, "decode", tokens, options, progress=False)
            exact_context = exact.context_for_graph(exact_builder.graph)
            kinds: dict[str, list] = {}
            for c in candidates:
                label = label_of(c)
                if label is not None:
                    kinds.setdefault(label, []).append(c)
            for label in ("q/k/v", "o", "gate/up", "down"):
                group = kinds[label]
                spec = group[0].executable.spec
                floor = spec.weight_bytes / BANDWIDTH
                ours = builder.time_backend(group, env, context.scratch())
                generated = builder.time_generated(group, env, context.scratch())
                exact_generated = exact_builder.time_generated(group, env, exact_context.scratch())
                linear = time_linear(builder.rotation(group), env, context, run, options)
                rows.append(
                    (
                        name,
                        m,
                        label,
                        f"{spec.n}x{spec.k}",
                        us(floor),
                        vs(ours, floor),
                        vs(generated, floor),
                        vs(exact_generated, floor),
                        vs(linear, floor),
                        f"{(linear - ours) / linear:+.1%}",
                    )
                )
            del builder, exact_builder, context, exact_context, env, candidates
            run.free()
        if not run.dry:
            for plan in backend.plans():
                print(f"  (c) {name}: {plan}")
        del fast, exact, weights
        run.free()
    table(
        "(c) per region, inside CUDA graphs, rotating through every layer's weights "
        "(us; % = floor / time)",
        [
            "shape",
            "M",
            "region",
            "N x K",
            "floor",
            "cublaslt",
            "generated fast",
            "generated exact",
            "F.linear per sibling",
            "saving vs F.linear",
        ],
        rows,
    )


def time_linear(chosen: list, env: dict, context: Any, run: Run, options: Options) -> float:
    calls = []
    for c in chosen:
        x = env[c.region.inputs[0]]
        ws = [context.parameters[p] for p in c.region.parameters]
        calls.append(lambda x=x, ws=ws: [F.linear(x, w) for w in ws])
    with torch.inference_mode():
        return time_rotation(calls, run.device, options)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def vs(seconds: float, floor: float) -> str:
    return f"{seconds * 1e6:.1f} ({floor / seconds:.0%})"


# ---------------------------------------------------------------- (d), (e) whole steps
def per_token(run: Run, fn: Callable[[int], Any], steps: int = 48) -> float:
    times = []
    for i in range(steps):
        run.sync()
        t0 = time.perf_counter()
        fn(i)
        run.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def part_de(run: Run, parts: str) -> None:
    rows = []
    context0 = 64 if run.dry else 1024
    shapes = ["toy"] if run.dry else ["llama-3.2-1b", "llama-3-8b"]
    for name in shapes:
        model, weights, cfg = model_for(run, name, numerics="fast")
        weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        kv = 2 * cfg["NL"] * (context0 + 48) * cfg["KV"] * cfg["HD"] * 2
        gen = torch.Generator().manual_seed(2)
        prompt = torch.randint(0, cfg["V"], (1, context0), dtype=torch.int32, generator=gen).to(
            run.device
        )
        cache = TimingCache(Path(tempfile.mkdtemp()) / "benchmarks.json")
        t0 = time.perf_counter()
        plan = plan_for(
            model,
            "decode",
            [run.i32(1), run.i32(context0)],
            backends=[run.backend()],
            progress=False,
            cache=cache,
        )
        took = time.perf_counter() - t0
        if "d" in parts and (name == shapes[-1]):
            print(f"\n(d) plan.explain() for {name} decode (planned in {took:.1f} s):")
            print(plan.explain())
        if "e" in parts:
            bare = plan_for(
                model, "decode", [run.i32(1), run.i32(context0)], backends=[], progress=False
            )
            for label, p in (
                ("generated source", bare),
                (f"with cublaslt ({len(plan.regions)} regions)", plan),
            ):
                ctx = model.context_for(p)
                model.prefill(prompt, context=ctx)
                step = stepper(run, p, ctx)

                def once(i: int, step: Callable[[list], list] = step) -> list:
                    return step([run.i32(1), run.i32(context0 + i)])

                seconds = per_token(run, once)
                rows.append((name, label, f"{seconds * 1e3:.3f}"))
                del ctx
                run.free()
            rows.append(
                (
                    name,
                    "floor (weights + KV / 4.18 TB/s)",
                    f"{(weight_bytes + kv) / BANDWIDTH * 1e3:.3f}",
                )
            )
        del model, weights, plan
        run.free()
    if "e" in parts:
        table(
            f"(e) decode step, context {context0}, numerics fast"
            + (", Captured" if run.device.type == "cuda" else ", plan.run"),
            ["shape", "plan", "ms/token"],
            rows,
        )


# ---------------------------------------------------------------- dry run extras
def dry_shapes() -> None:
    """Lower the 1B and 8B decode entries and match them: what (c) compares, and the
    estimated floors (no weights are made)."""
    from linnet.lang import Program, lower

    h200 = Target("cuda", "cuda:0", "NVIDIA H200", (9, 0))
    backend = CublasLt()
    rows = []
    for name in ("llama-3.2-1b", "llama-3-8b"):
        graph = lower(Program.from_file(LLAMA), "decode", {"token": [1], "pos": [1]}, config(name))
        regions = backend.match(graph, h200)
        seen = set()
        for r in regions:
            spec = spec_for(r)
            assert spec is not None
            key = (len(spec.weights), spec.n, spec.k)
            if key in seen:
                continue
            seen.add(key)
            cost = backend.estimate_cost(r, h200)
            assert cost is not None
            rows.append(
                (
                    name,
                    "+".join(p.rsplit(".", 2)[-2] for p in r.parameters),
                    f"{spec.n}x{spec.k}",
                    us(spec.weight_bytes / BANDWIDTH),
                    us(cost.seconds),
                )
            )
        groups = sum(1 for r in regions if len(r.parameters) > 1)
        print(f"  dry run: {name}: {len(regions)} regions, {groups} sibling groups")
    table(
        "dry run: regions of the 1B and 8B decode entries (us on an H200)",
        ["shape", "region", "N x K", "floor", "estimate_cost"],
        rows,
    )


# ---------------------------------------------------------------- main
def header(run: Run) -> None:
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    try:
        import nvmath

        print(f"nvmath-python {nvmath.__version__}")
    except Exception as exc:
        print(f"nvmath-python: {type(exc).__name__}: {exc}")
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name()}")
    from linnet.torch.timing import torch_target

    target = torch_target(run.device)
    backend = CublasLt()
    caps = backend.probe(target)
    print(
        f"CublasLt {backend.version}: "
        + (caps.notes if caps is not None else f"declines: {backend.last_reason}")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="abcde", help="which parts to run (default abcde)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="on any machine: the toy config, the reference kernel, plan.run",
    )
    args = parser.parse_args()
    run = Run(args.dry_run)
    if not run.dry and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run to check the script on the CPU")
        return 2
    header(run)
    failures = 0
    steps: list[tuple[str, Callable[[], None]]] = [
        ("a", lambda: part_a(run)),
        ("b", lambda: part_b(run)),
        ("c", lambda: part_c(run)),
    ]
    if "d" in args.parts or "e" in args.parts:
        steps.append(("de", lambda: part_de(run, args.parts)))
    if run.dry:
        steps.append(("dry", dry_shapes))
    for key, fn in steps:
        if key not in ("de", "dry") and key not in args.parts:
            continue
        t0 = time.perf_counter()
        print(f"\n== part {key}", flush=True)
        try:
            fn()
        except Exception:
            failures += 1
            print(f"part {key} failed:", file=sys.stderr)
            traceback.print_exc()
        print(f"== part {key}: {time.perf_counter() - t0:.1f} s", flush=True)
        run.free()
    for title, head, rows in TABLES:
        print(f"\n{title}\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
