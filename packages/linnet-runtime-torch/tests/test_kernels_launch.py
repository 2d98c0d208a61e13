"""Bound ops launch their kernels from generated PyTorch, and fall back to the body, one
case at a time; each case says which path ran (the module's RUNS counters) and compares
with the op's body.

Triton's interpreter must be chosen before Triton is first imported in a process (its own
library functions, `tl.max`'s combine function say, are decorated then), and other tests of
this session import it (inductor does). So the cases that run kernels in the interpreter live
in `kernels_interpreted.py`, run here in a fresh process with TRITON_INTERPRET=1
(test_the_interpreted_cases); the cases below run without the interpreter, as CI's CPU
and the H200 do.
"""

import ast
import builtins
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from linnet.torch import load
from linnet.torch.kernels import launch
from support import run_guarded

HERE = Path(__file__).parent
INTERPRETED = HERE / "kernels_interpreted.py"


def test_the_interpreted_cases():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = run_guarded(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:logging",
            str(INTERPRETED),
        ],
        env=env,
        cwd=HERE.parent,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    # Every case ran and passed: none skipped, none lost.
    tree = ast.parse(INTERPRETED.read_text())
    cases = sum(
        len(d.decorator_list[0].args[1].elts)
        if d.decorator_list and getattr(d.decorator_list[0], "args", None)
        else 1
        for d in tree.body
        if isinstance(d, ast.FunctionDef) and d.name.startswith("test_")
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert re.match(rf"^{cases} passed in ", summary), summary


SOFTMAX = """
use std.nn.activation::{softmax}
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] { return softmax(x) }
}
"""


@pytest.fixture
def softmax_model(tmp_path):
    path = tmp_path / "m.linnet"
    path.write_text(SOFTMAX)
    return path


def runs(model, x):
    return model.module("run", [x]).RUNS


def test_cpu_without_interpreter_runs_the_body(softmax_model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(3, 8)
    y = model.run("run", [x])
    assert runs(model, x) == {"row_softmax_3_8_1024": [0, 1]}
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_no_triton_runs_the_body(softmax_model, monkeypatch):
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("no triton here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_triton)
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(4, 16)
    y = model.run("run", [x])
    module = model.module("run", [x])
    assert module.TRITON is False and module.RUNS == {"row_softmax_4_16_1024": [0, 1]}
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_triton_op_registered_without_interpreter(softmax_model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = load(softmax_model, weights={}, numerics="fast")
    x = torch.randn(6, 8)
    module = model.module("run", [x])
    op = getattr(torch.ops, module.LIBRARY).row_softmax_6_8_1024
    assert op.default is not None  # the triton_op torch.compile calls on CUDA
    assert module.wrap_triton is torch.library.wrap_triton


# ---------------------------------------------------------------- on CUDA (the H200)
def _bindings():
    from linnet.torch.kernels import std_bindings

    return std_bindings()


@pytest.mark.gpu
@pytest.mark.parametrize("op,kernel", _bindings())
@pytest.mark.parametrize("rows", [1, 100])
def test_std_kernels_launch_on_cuda_and_equal_the_body(op, kernel, rows, tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.torch.kernels import example_generics, op_case
    from linnet.torch.planned import compare

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    # At `rows`, or at the most rows below it (powers of two) that the kernel takes (the
    # decode kernels take at most 16), or else the fewest above it (a serving batch's
    # `linear_gemv_dot32` takes 17 to 32).
    tries = [rows] + [2**k for k in range(6, -1, -1) if 2**k < rows]
    tries += [2**k + 1 for k in range(7) if 2**k >= rows]
    generics = next((g for r in tries if (g := example_generics(op, r, 1024)) is not None), None)
    assert generics is not None, f"no generics let {kernel} run"
    case = op_case(op, generics)
    path = tmp_path / "case.linnet"
    path.write_text(case.text)
    inputs = case.random_inputs("cuda", seed=rows)
    want = load(path, weights={}, device="cuda", numerics="exact").run("run", inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = launch(op, generics, *inputs, scalars=case.scalars)
    # Within tol x max(1, max|want|), as a plan's conformance check (`compare`) takes it: a
    # bf16 kernel that rounds an intermediate differently (the norm's output, a product
    # before its rotation) is a unit of the intermediate's rounding off where the result
    # cancels to near zero, which no elementwise relative bound admits.
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}.get(want[0].dtype, 1e-3)
    for g, w in zip(got, want):
        _, why = compare(g, w, tol)
        assert why is None, f"{kernel}: {why}"
    fast = load(path, weights={}, device="cuda", numerics="fast")
    out = fast.run("run", inputs)
    out = out if isinstance(out, tuple) else (out,)
    assert list(fast.module("run", inputs).RUNS.values()) == [[1, 0]]
    for o, w in zip(out, want):  # numerics fast: tl.dot may use tf32
        _, why = compare(o, w, 10 * tol)
        assert why is None, f"{kernel}, numerics fast: {why}"


@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["dense", "paged"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_cache_writing_kernels_conform_on_cuda(dtype, cache, monkeypatch):
    """kernels_interpreted.py's cache-writing cases launched for real: the attention input's
    kernels store k and v into the cache (sequences at different positions; a paged cache's
    rows at each row's page and slot of the pool) and leave q and the caches as the generated
    source does."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import support

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if cache == "dense":
        findings, made = support.cache_writing_findings("cuda", dtype)
        ops = support.CACHE_WRITING_OPS
    else:
        findings, made = support.paged_cache_writing_findings("cuda", dtype)
        ops = support.PAGED_CACHE_WRITING_OPS
    assert sorted(f.region.callee.rsplit("::", 1)[-1] for f in findings) == ops
    assert all(f.passed for f in findings), findings
    assert all(
        any("_into_k_v" in k and n[0] for k, n in ex.fn.__globals__["RUNS"].items()) for ex in made
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_one_launch_flash_decoding_is_right_launch_after_launch_on_cuda(dtype, monkeypatch):
    """kernels_interpreted.py's one-launch flash-decoding case on CUDA, where the splits
    really run at once: eager launches, then the same launches captured in a CUDA graph and
    replayed twice (the counters must be 0 again at each launch's end)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from support import one_launch_attention_errors

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    tol = {"f32": 1e-4, "bf16": 2e-2}[dtype]
    for graph in (False, True):
        results = one_launch_attention_errors("cuda", dtype, graph=graph)
        assert all(e < tol and c == 0 for e, c in results), (graph, results)


def test_direct_gives_the_kernel_itself(softmax_model, monkeypatch):
    """Outside torch.compile a launcher runs under the module's `direct()`: wrap_triton then
    returns the kernel itself (no higher-order op dispatched a launch), and only there."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = load(softmax_model, weights={}, numerics="fast")
    module = model.module("run", [torch.randn(6, 8)])
    kernel = next(v for k, v in vars(module).items() if k.startswith("row_softmax_"))
    assert module.wrap_triton(kernel) is not kernel  # traceable by torch.compile
    with module.direct():
        assert module.wrap_triton(kernel) is kernel
    assert module.wrap_triton(kernel) is not kernel


@pytest.mark.gpu
def test_eager_launches_leave_nothing_in_torchs_kernel_side_table(softmax_model):
    """Run eagerly, a launch does not go through wrap_triton's higher-order op, which keeps
    an entry in torch's kernel side table for every launch (a leak over a long run)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    model = load(softmax_model, weights={}, numerics="fast", device="cuda")
    x = torch.randn(6, 8, device="cuda")
    model.run("run", [x])
    before = len(kernel_side_table.constant_args)
    for _ in range(3):
        y = model.run("run", [x])
    assert len(kernel_side_table.constant_args) == before
    torch.testing.assert_close(y, torch.softmax(x, -1))
