"""What a kernel's main loop costs in instructions, read from its SASS, on a machine without a
GPU: each kernel compiled by Triton for sm_90 (`linnet.torch.kernels.compiled`, tensors
16-byte aligned as PyTorch allocates them), disassembled with Triton's own `nvdisasm`, its
loops found (backward branches) and the longest one's instructions counted by opcode.

A decode GEMV is bound by bandwidth only while it spends fewer instructions a weight than
the SMs can issue in the time the weight takes to arrive: on an H100 (132 SMs at 1.755 GHz,
128 lane instructions a clock each, 3.35 TB/s) that is 17.7 instructions a bf16 weight, 8.8
an int8 one and 4.4 an int4 one. A kernel above its budget cannot reach the copy bandwidth
whatever its tiles; the ratio is an upper bound on the fraction of it (latency, occupancy
and the memory system take more). The figures are this machine's Triton's; the device's
Triton may schedule differently (docs/benchmarks/quantized.md has both where measured).

    python3 benchmarks/sass_loops.py                    # the presets below
    python3 benchmarks/sass_loops.py --kernel std.nn.quant::q4_gemv_rows \\
        --generics '{"N": 1, "I": 4096, "O": 4096, "NG": 32, "GS": 128, "T": "bf16",
                     "BR": 16, "BO": 8, "BG": 8}' --weights 8192 --bits 4
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = str(HERE / "kernels" / "quant_variants.linnet")
# An H100 SXM: SMs, clock (Hz), lane instructions a clock per SM, copy bandwidth (bytes/s).
H100 = (132, 1.755e9, 128, 3.35e12)
Q8 = {"N": 1, "I": 4096, "O": 4096, "NG": 32, "GS": 128, "T": "bf16"}
# name: (kernel, generics, program, weights a program step, bits a weight)
PRESETS: dict[str, tuple[str, dict, str | None, int, int]] = {
    "gemv_rows bf16": (
        "std.nn.decode::gemv_rows",
        {"N": 1, "I": 4096, "O": 4096, "T": "bf16", "BR": 16, "BO": 8, "BK": 512},
        None,
        8 * 512,
        16,
    ),
    "q8_gemv_rows": (
        "std.nn.quant::q8_gemv_rows",
        Q8 | {"BR": 16, "BO": 4, "BG": 8},
        None,
        4096,
        8,
    ),
    "q4_gemv_rows": (
        "std.nn.quant::q4_gemv_rows",
        Q8 | {"BR": 16, "BO": 8, "BG": 8},
        None,
        8192,
        4,
    ),
    "q4v_dot (tensor cores)": (
        "quant_variants::q4v_dot",
        {k: v for k, v in Q8.items() if k != "GS"} | {"HG": 64, "BR": 16, "BO": 64},
        VARIANTS,
        64 * 128,
        4,
    ),
}


def budget(bits: int, machine: tuple[float, float, float, float] = H100) -> float:
    """Lane instructions a weight of ``bits`` bits can take at the copy bandwidth."""
    sms, clock, lanes, bandwidth = machine
    return sms * clock * lanes / (bandwidth * 8 / bits)


def sass(cubin: bytes) -> str:
    """``nvdisasm``'s text of ``cubin`` (Triton's bundled copy)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [str(tool), "-c", f.name], capture_output=True, text=True, check=True
        ).stdout


def loops(text: str) -> list[collections.Counter]:
    """Each loop of SASS ``text`` (a branch back to a label at or before it) as a count of its
    opcodes, longest first."""
    code = [
        (int(a, 16), op.strip()) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)
    ]
    labels = {
        name: int(at, 16)
        for name, at in re.findall(
            r"^(\.L_x_\d+):\s*\n(?:\s*//.*\n)*\s*/\*([0-9a-f]+)\*/", text, re.M
        )
    }
    found = []
    for addr, op in code:
        branch = re.search(r"\bBRA\b.*?(\.L_x_\d+)", op)
        if branch and labels.get(branch.group(1), addr + 1) <= addr:
            start = labels[branch.group(1)]
            found.append(
                collections.Counter(
                    re.sub(r"^@!?U?P[T0-9]+\s+", "", o).split(" ")[0].split(".")[0]
                    for a, o in code
                    if start <= a <= addr
                )
            )
    return sorted(found, key=lambda c: -sum(c.values()))


def measure(
    kernel: str,
    generics: dict,
    program: str | None,
    weights: int,
    bits: int,
    scalars: dict | None = None,
) -> dict:
    """The longest loop's instructions a thread, a weight, and against the H100 budget
    (``scalars``: the kernel's scalar parameters, e.g. a norm's ``eps``)."""
    from linnet.torch.kernels import compiled

    k = compiled(kernel, generics, program=program, scalars=scalars)
    found = loops(sass(k.asm["cubin"]))
    if not found:
        return {"kernel": kernel, "error": "no loop in the SASS"}
    body = found[0]
    threads = k.metadata.num_warps * 32
    per_weight = sum(body.values()) / (weights / threads)
    return {
        "kernel": kernel,
        "warps": k.metadata.num_warps,
        "loop": sum(body.values()),
        "per_weight": per_weight,
        "budget": budget(bits),
        "bound": min(1.0, budget(bits) / per_weight),
        "top": dict(body.most_common(8)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", help="a kernel or an op bound to one (default: the presets)")
    p.add_argument("--generics", type=json.loads, default={})
    p.add_argument("--program", default=None, help="the .linnet file (default: the std library)")
    p.add_argument("--weights", type=int, default=0, help="weights a program's loop step takes")
    p.add_argument("--bits", type=int, default=16)
    p.add_argument("--scalars", type=json.loads, default=None, help="e.g. '{\"eps\": 1e-5}'")
    args = p.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    cases = (
        {args.kernel: (args.kernel, args.generics, args.program, args.weights, args.bits)}
        if args.kernel
        else PRESETS
    )
    rows = []
    for label, (kernel, generics, program, weights, bits) in cases.items():
        r = measure(kernel, generics, program, weights, bits, args.scalars)
        print(json.dumps(r), flush=True)
        if "error" in r:
            rows.append(f"| {label} | {r['error']} | | | |")
            continue
        top = ", ".join(f"{op} {n}" for op, n in r["top"].items())
        rows.append(
            f"| {label} | {r['loop']} | {r['per_weight']:.2f} | {r['budget']:.1f} "
            f"| {r['bound']:.0%} | {top} |"
        )
    print("\n| kernel | loop instructions a thread | a weight | H100 budget | bound | most |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
