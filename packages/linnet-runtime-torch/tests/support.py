"""Shared helpers for the runtime tests."""

import datetime
import json
import os
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"

# Under CI=1 the heaviest interpreted kernel checks run a seeded subset of their cases: every
# kind of case still runs, the full set runs without CI=1. The seed rotates with the UTC date
# (LINNET_CI_SEED pins it, to rerun a failing day's subset), so successive CI runs cover
# different cases; a failure's message names the seed.
CI = bool(os.environ.get("CI"))
CI_SEED = int(
    os.environ.get("LINNET_CI_SEED") or datetime.datetime.now(datetime.UTC).date().toordinal()
)


def ci_sample(items: list, keep: int, salt: str = "") -> list:
    """``items`` as they are without CI=1; under it ``keep`` of them (at least one), drawn
    with :data:`CI_SEED` and ``salt`` (one draw per list, stable within a run), in their
    original order.

    >>> len(ci_sample([1, 2, 3], 1)) == (1 if CI else 3)
    True
    """
    if not CI or keep >= len(items):
        return list(items)
    picked = sorted(random.Random(f"{CI_SEED}:{salt}").sample(range(len(items)), max(1, keep)))
    return [items[i] for i in picked]


def toy_config(**extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


def planning_config(**extra) -> dict:
    """The toy config for the tests that plan the toy Llama's decode under Triton's
    interpreter: one layer under CI=1 (planning is per layer kind, and a second identical
    layer doubles the interpreter's time, about 50 s), both layers without it."""
    return toy_config(**({"NL": 1} if CI else {}), **extra)


def cache_writing_ops(layers: int = 2) -> list[str]:
    """The toy Llama decode's kernel regions that write the cache, one set a layer: the
    attention input's, and the attention input's with the attention (the writes between
    them)."""
    return sorted(
        [
            "rms_norm_qkv_rope",
            "rms_norm_qkv_rope_split",
            "rms_norm_qkv_rope_split_wide",
            "rms_norm_qkv_rope_attention",
            "rms_norm_qkv_rope_attention_wide",
        ]
        * layers
    )


CACHE_WRITING_OPS = cache_writing_ops(2)


def _writing_paths(program):
    """KernelPaths of the kernel regions that write states, keeping the executables made."""
    from linnet.torch.kernel_paths import KernelPaths

    class Writing(KernelPaths):
        made: tuple = ()

        def match(self, graph, target):
            return [r for r in super().match(graph, target) if r.writes_state]

        def compile_regions(self, regions, target, options):
            self.made = super().compile_regions(regions, target, options)
            return self.made

    return Writing(program)


def cache_writing_findings(
    device: str = "cpu", dtype: str = "f32", layers: int = 2
) -> tuple[list, list]:
    """conform's findings for the toy Llama decode's kernel regions that write states (the
    attention input's kernels with the k/v cache writes), and their executables: two
    sequences at positions 5 and 9, on caches already holding random values elsewhere;
    the toy's two layers, or ``layers``."""
    import torch
    from linnet.torch import load, random_weights

    config = toy_config(B=2, T=dtype, NL=layers)
    model = load(
        LLAMA,
        weights=random_weights(LLAMA, config, seed=4),
        config=config,
        numerics="fast",
        device=device,
    )
    token = torch.tensor([3, 7], dtype=torch.int32, device=device)
    pos = torch.tensor([5, 9], dtype=torch.int32, device=device)
    return _conform_writing(model, "decode", [token, pos])


def _conform_writing(model, entry: str, inputs: list) -> tuple[list, list]:
    """conform's findings for ``entry``'s state-writing kernel regions, on states holding
    random values, and the executables made for them."""
    import torch

    ctx = model.context_for_graph(model.graph(entry, inputs))
    g = torch.Generator().manual_seed(1)
    for state in ctx.states.values():
        state.copy_(torch.randn(state.shape, generator=g))
    paths = _writing_paths(model.program)
    findings = model.conform(entry, inputs, paths, context=ctx)
    return findings, list(paths.made)


PAGED_CACHE_WRITING_OPS = [
    "rms_norm_qkv_rope",
    "rms_norm_qkv_rope_split",
    "rms_norm_qkv_rope_split_wide",
]


def paged_cache_writing_findings(
    device: str = "cpu", dtype: str = "f32", layers: int = 1
) -> tuple[list, list]:
    """:func:`cache_writing_findings` over a page pool: std.models.llama's toy decode over
    12 pages of 4 positions (``decode_paged``), three sequences at positions 5, 9 and 2
    (slots 1, 1 and 2 of pages 7, 3 and 10: out of order in the pool), the pool holding
    random values elsewhere. The attention input's kernels store k and v at ``[page[b],
    slot[b]]`` (a fused attention reads a dense cache: none here)."""
    import json

    import torch
    from linnet.lang.syntax.program import model_file
    from linnet.torch import load, random_weights

    llama = model_file("std.models.llama")
    config = json.loads((llama.parent / "configs" / "llama" / "toy.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    config.update(B=3, T=dtype, NL=layers)
    model = load(
        llama,
        weights=random_weights(llama, config, seed=4),
        config=config,
        numerics="fast",
        device=device,
        kv_pages=12,
        kv_page_size=4,
    )
    i32 = {"dtype": torch.int32, "device": device}
    token = torch.tensor([3, 7, 1], **i32)
    pos = torch.tensor([5, 9, 2], **i32)
    table = torch.zeros((3, -(-int(config["S"]) // 4)), **i32)
    table[0, :2] = torch.tensor([4, 7], **i32)
    table[1, :3] = torch.tensor([1, 2, 3], **i32)
    table[2, 0] = 10
    return _conform_writing(model, "decode_paged", [token, pos, table])


def one_launch_attention_errors(
    device: str = "cpu", dtype: str = "f32", graph: bool = False
) -> list[tuple[float, int]]:
    """`decode_attention_split_once` (flash-decoding whose last split per head combines)
    at 4 splits of 64 positions (S = 200), three sequences at positions in one split, across
    three and at the cache's end, then at other positions: per launch, the largest difference
    from softmax attention in f32 and the sum of the kernel's counters after it (0: they are
    left as found). With ``graph`` (CUDA), the launches are captured in one CUDA graph,
    replayed twice."""
    import torch
    from linnet.torch.kernels import _program, kernel_module, launch, stages

    OP = "std.nn.decode::decode_attention_split_once"
    B, S, KV, G, HD = 3, 200, 2, 4, 16
    generics = {"B": B, "S": S, "KV": KV, "G": G, "HD": HD, "T": dtype}
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(7)
    q, k, v = (
        torch.randn(*shape, generator=gen).to(device, tdtype)
        for shape in ((B, KV, G, HD), (B, S, KV, HD), (B, S, KV, HD))
    )
    scale = 0.25
    # The module `launch` writes the op's kernel into (its generics as the op binds them).
    ((kernel, kernel_generics),) = stages(_program(None), OP, generics)[0]
    module = kernel_module(None, kernel, kernel_generics, {"scale": scale})
    runs = [[3, 130, 199], [64, 0, 127]]
    poss = [torch.tensor(p, dtype=torch.int32, device=device) for p in runs]

    def attend(pos):
        return launch(OP, generics, q, k, v, pos, scalars={"scale": scale})[0]

    outs = [attend(p) for p in poss]  # eager: the first launch makes the scratch buffers
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            captured = [attend(p) for p in poss]
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        outs = captured
    out = []
    for o, positions in zip(outs, runs):
        want = torch.empty(o.shape)
        for b, p in enumerate(positions):
            qf, kf, vf = (
                q[b].float().cpu(),
                k[b, : p + 1].float().cpu(),
                v[b, : p + 1].float().cpu(),
            )
            scores = torch.einsum("hgd,jhd->hgj", qf, kf) * scale
            # The body rounds the probabilities to T before the product with v.
            probs = scores.softmax(-1).to(tdtype).float()
            want[b] = torch.einsum("hgj,jhd->hgd", probs, vf)
        kept = [t for (_, name, _), t in module._SCRATCH.items() if name == "arrived"]
        assert len(kept) == 1, module._SCRATCH.keys()  # the buffer the launches counted in
        counters = int(kept[0].abs().sum())
        out.append((float((o.float().cpu() - want).abs().max()), counters))
    return out


# ---------------------------------------------------------------- hang guards
def _cpu_seconds(pid: int) -> float | None:
    """CPU time used so far by process ``pid`` and its waited-for children (Linux), or None."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime, stime, cutime, cstime: fields 14-17 of stat(5), here 11-14 after the name.
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and every live descendant (a pytest child's own children too)."""
    import os

    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _cpu_seconds(p) or 0.0
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return total


def run_guarded(cmd: list[str], *, idle: float = 300, limit: float = 3600, **kwargs):
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` behind hang guards
    that a busy machine does not trip (issue 38 item 23: fixed 300-900 s timeouts errored 12
    tests on a loaded 2-core machine). The child is stopped, and the test fails naming the
    guard, only where it made no progress for ``idle`` seconds (no output and no CPU time used
    by it or its children: a deadlock, a wait on a peer that never comes) or ran ``limit``
    seconds in all (a loop that never ends)."""
    import subprocess
    import threading
    import time

    import pytest

    env = dict(kwargs.pop("env", None) or __import__("os").environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        **kwargs,
    )
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    last = [time.monotonic()]

    def read(stream, into):
        for line in iter(stream.readline, ""):
            into.append(line)
            last[0] = time.monotonic()

    readers = [
        threading.Thread(target=read, args=(proc.stdout, chunks["out"]), daemon=True),
        threading.Thread(target=read, args=(proc.stderr, chunks["err"]), daemon=True),
    ]
    for r in readers:
        r.start()
    start, cpu, why = time.monotonic(), -1.0, ""
    while proc.poll() is None:
        time.sleep(1.0)
        now, used = time.monotonic(), _tree_cpu_seconds(proc.pid)
        if used > cpu + 0.5:  # still computing: a slow machine, not a hang
            cpu, last[0] = used, max(last[0], now)
        if now - last[0] > idle:
            why = f"no output and no CPU time used for {idle:.0f} s (a hang)"
        elif now - start > limit:
            why = f"still running after {limit:.0f} s"
        if why:
            import os
            import signal

            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
    for r in readers:
        r.join(timeout=10)
    out, err = "".join(chunks["out"]), "".join(chunks["err"])
    if why:
        pytest.fail(
            f"{' '.join(map(str, cmd))[:200]}: stopped, {why}\n--- stdout\n"
            f"{out[-3000:]}\n--- stderr\n{err[-3000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# The linear weights of a transformers Llama layer (the ones quantised checkpoints pack).
HF_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def saved_hf_llama(folder: Path, **config) -> tuple[dict, dict]:
    """A random transformers Llama of ``config`` saved (float32 safetensors) into
    ``folder``: its tensors and its config.json, to be written again as another checkpoint
    by :func:`save_hf_checkpoint`."""
    import torch
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return load_file(folder / "model.safetensors"), json.loads((folder / "config.json").read_text())


def save_hf_checkpoint(folder: Path, tensors: dict, config: dict) -> Path:
    """``tensors`` and ``config`` as a Hugging Face checkpoint directory ``folder``."""
    from safetensors.torch import save_file

    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder
