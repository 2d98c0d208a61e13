"""How long linnet-lang takes to parse + check the Llama example and to lower its decode entry.

Not a test: a script that prints a table. The goals and the results are in
docs/benchmarks/lang.md (the 32-layer, 8B-shaped decode entry, check and lower together).

    uv run python benchmarks/lang_lower.py            # 5 repeats
    uv run python benchmarks/lang_lower.py --repeats 9
    uv run python benchmarks/lang_lower.py --profile  # cProfile of one 8B check + lower
    uv run python benchmarks/lang_lower.py --evaluate-all  # every layer evaluated, none
                                                           # instantiated (check/instantiate.py)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

from linnet.lang import LinnetError, Program, lower
from linnet.lang.check.driver import check_program

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
CASES = [
    # (label, config file, entry, inputs)
    ("toy decode, 2 layers", "toy", "decode", {"token": [1], "pos": [1]}),
    ("8B decode, 32 layers", "llama-3-8b", "decode", {"token": [1], "pos": [1]}),
]


def load_config(name: str) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def parse_and_check() -> Program:
    program = Program.from_file(LLAMA)
    errors = check_program(program)
    if errors:
        raise LinnetError(errors)
    return program


def measure(config: dict, entry: str, inputs: dict, repeats: int) -> dict:
    """Wall-clock and CPU seconds of each phase, one list entry per repeat."""
    times: dict[str, list[float]] = {
        f"{part} {clock}": [] for part in ("check", "lower", "total") for clock in ("wall", "cpu")
    }
    steps = calls = 0
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        program = parse_and_check()
        w1, c1 = time.perf_counter(), time.process_time()
        graph = lower(program, entry, inputs, config, check=False)
        w2, c2 = time.perf_counter(), time.process_time()
        for part, (wa, wb, ca, cb) in {
            "check": (w0, w1, c0, c1),
            "lower": (w1, w2, c1, c2),
            "total": (w0, w2, c0, c2),
        }.items():
            times[f"{part} wall"].append(wb - wa)
            times[f"{part} cpu"].append(cb - ca)
        steps, calls = len(graph.steps), len(graph.calls)
    return {"times": times, "steps": steps, "calls": calls}


def ms(values: list[float], how) -> str:
    return f"{how(values) * 1000:9.1f}"


def profile(config: dict, entry: str, inputs: dict, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    program = parse_and_check()
    lower(program, entry, inputs, config, check=False)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile one check + lower of the 8B decode entry instead",
    )
    parser.add_argument("--top", type=int, default=25, help="rows of the profile to print")
    parser.add_argument(
        "--evaluate-all",
        action="store_true",
        help="evaluate every iteration of repeated blocks instead of "
        "instantiating the first (the same graph, slower)",
    )
    args = parser.parse_args()
    if args.evaluate_all:
        from linnet.lang.check import instantiate

        instantiate.ENABLED = False
    if args.profile:
        _, name, entry, inputs = CASES[-1]
        profile(load_config(name), entry, inputs, args.top)
        return
    parse_and_check()  # warm up: imports and the first parse are not what we measure
    print(
        f"linnet-lang: parse + check, then lower, {LLAMA.relative_to(ROOT)}; "
        f"{args.repeats} repeats; milliseconds"
    )
    print(
        f"{'case':22} {'phase':6} {'wall med':>9} {'wall min':>9} {'cpu med':>9} "
        f"{'cpu min':>9}  {'steps':>5}  {'calls':>5}"
    )
    for label, name, entry, inputs in CASES:
        r = measure(load_config(name), entry, inputs, args.repeats)
        for i, part in enumerate(("check", "lower", "total")):
            wall, cpu = r["times"][f"{part} wall"], r["times"][f"{part} cpu"]
            counts = f"  {r['steps']:5d}  {r['calls']:5d}" if i == 0 else ""
            print(
                f"{label if i == 0 else '':22} {part:6} {ms(wall, statistics.median)} "
                f"{ms(wall, min)} {ms(cpu, statistics.median)} {ms(cpu, min)}{counts}"
            )


if __name__ == "__main__":
    main()
