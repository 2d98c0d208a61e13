"""Adversarial: models of one source side by side in one process (issue 39 item 5).

Generated modules are imported by content (linnet.lang.home.import_source): two models whose
source text, device and numerics agree share one module object. What a model is loaded with
(its device, numerics, compile options, progress callback) must reach its own runs alone:
nothing patches the shared module, and each option that changes the text (device, numerics)
gives the model a module of its own.
"""

import torch
from linnet.torch import load, random_weights
from support import LLAMA, toy_config

# A parameter and a product of bf16 operands: numerics exact converts them to f32 before the
# product, fast multiplies in bf16 and converts the result, so the two differ in the last bits.
SOURCE = """
model M {
    param w: Tensor[8, 8; bf16]
    entry run(x: Tensor[4, 8; bf16]) -> Tensor[4, 8; f32] {
        let y[i, j] = (sum[k] x[i, k] * self.w[j, k]) as f32
        return y
    }
}
"""


def _model_file(tmp_path):
    path = tmp_path / "m.linnet"
    path.write_text(SOURCE)
    return path


def _weights() -> dict:
    return {"w": torch.randn(8, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)}


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)


def _patched(module, entry: str) -> list[str]:
    """The slice functions of ``module`` that are not its own (a wrapper put there)."""
    return [
        sl["function"]
        for sl in module.ENTRIES[entry]["slices"]
        if getattr(module, sl["function"]).__module__ != module.__name__
    ]


def test_a_compiled_model_leaves_another_models_slices_alone(tmp_path):
    """A model loaded with ``compile=`` replaced the slice functions of the shared module by
    its torch.compile wrappers: a model of the same source loaded without compile then ran
    compiled code, with the first model's compile options and reporting to its progress
    callback ("compiling slice_0..." on another model's run)."""
    path = _model_file(tmp_path)
    said: list[str] = []
    compiled = load(path, weights=_weights(), compile="aot_eager", progress=said.append)
    module = compiled.module("run", [_x()])
    assert _patched(module, "run") == []  # its wrappers are its own, not the module's
    plain = load(path, weights=_weights())
    assert plain.module("run", [_x()]) is module  # one text: one module, shared
    got = plain.run("run", [_x()])
    assert said == [], said  # the plain model's run compiled nothing for the other
    assert _patched(module, "run") == []
    want = compiled.run("run", [_x()])
    assert any(m.startswith("compiling") for m in said), said  # its own run compiles
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert _patched(module, "run") == []


def test_two_compile_options_each_run_their_own(tmp_path):
    """Two compiled models of one source with different compile options: each runs slices
    compiled with its own (the second never reuses the first's wrappers)."""
    path = _model_file(tmp_path)
    first: list[str] = []
    second: list[str] = []
    a = load(path, weights=_weights(), compile="aot_eager", progress=first.append)
    b = load(path, weights=_weights(), compile="eager", progress=second.append)
    ya, yb = a.run("run", [_x()]), b.run("run", [_x()])
    assert any(m.startswith("compiling") for m in first), first
    assert any(m.startswith("compiling") for m in second), second
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)


def test_two_numerics_in_one_process_keep_their_own(tmp_path):
    """numerics exact and fast of one source: two modules (the numerics are in the text),
    and running the fast model between two runs of the exact one changes neither."""
    path = _model_file(tmp_path)
    exact = load(path, weights=_weights(), numerics="exact")
    fast = load(path, weights=_weights(), numerics="fast")
    before = exact.run("run", [_x()])
    quick = fast.run("run", [_x()])
    after = exact.run("run", [_x()])
    m_exact, m_fast = exact.module("run", [_x()]), fast.module("run", [_x()])
    assert m_exact is not m_fast
    assert "Numerics: exact." in m_exact.__doc__ and "Numerics: fast." in m_fast.__doc__
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    # Each is its own numerics: exact's is the f32 product of the bf16 values.
    x, w = _x().float(), _weights()["w"].float()
    torch.testing.assert_close(before, x @ w.T, rtol=1e-6, atol=1e-6)
    assert quick.dtype == torch.float32 and not torch.equal(quick, before)


def test_cpu_and_meta_models_of_one_source_run_side_by_side_both_ways():
    """Issue 39 item 5: two models of one source on cpu and meta run side by side (meta:
    shapes only) and neither changes the other, in either order: a meta run after a cpu one
    stays on meta, a cpu run after a meta one stays on cpu and is unchanged."""
    cfg = toy_config()
    w = random_weights(LLAMA, cfg, seed=0)
    i32 = lambda v: torch.tensor([v], dtype=torch.int32)  # noqa: E731
    meta = load(LLAMA, weights={k: v.to("meta") for k, v in w.items()}, config=cfg, device="meta")
    cpu = load(LLAMA, weights=w, config=cfg)
    reference = load(LLAMA, weights=w, config=cfg)
    want = [reference.run("decode", [i32(1), i32(p)]) for p in (0, 1)]
    first_meta = meta.run("decode", [i32(1).to("meta"), i32(0).to("meta")])
    got = [cpu.run("decode", [i32(1), i32(0)])]
    second_meta = meta.run("decode", [i32(1).to("meta"), i32(1).to("meta")])
    got.append(cpu.run("decode", [i32(1), i32(1)]))
    for out in (first_meta, second_meta):
        assert out.device.type == "meta" and out.shape == want[0].shape
    assert all(t.device.type == "cpu" for t in got)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    m_cpu = cpu.module("decode", [i32(1), i32(0)])
    m_meta = meta.module("decode", [i32(1), i32(0)])
    assert m_cpu is not m_meta
    assert (m_cpu.DEVICE.type, m_meta.DEVICE.type) == ("cpu", "meta")


def _tf32_flags() -> tuple[bool, bool, bool, bool]:
    """The process-wide settings numerics "fast" turns on (linnet.torch.options.numerics_mode)."""
    cuda = torch.backends.cuda.matmul
    return (
        cuda.allow_tf32,
        cuda.allow_bf16_reduced_precision_reduction,
        cuda.allow_fp16_reduced_precision_reduction,
        torch.backends.cudnn.allow_tf32,
    )


def test_tf32_is_each_calls_own_and_never_leaks_to_the_next_model(tmp_path, monkeypatch):
    """Issue 39 item 3: numerics "fast" enters a process-wide TF32 context. It is scoped to
    each call (saved and restored around it), so an exact model run after a fast one, or
    interleaved with it, runs with TF32 off, and the caller's own settings come back after
    every call. The flags are read inside each call (the interpreter's run_graph) and after it;
    the generated entries run under the same context (Model._execute)."""
    saved = _tf32_flags()
    outside = (True, False, True, False)  # a caller's own mix, neither model's
    _set_tf32_flags(outside)
    try:
        _each_call_keeps_its_own(tmp_path, monkeypatch, outside)
    finally:
        _set_tf32_flags(saved)  # (monkeypatch cannot undo torch's cuBLAS flags)


def _set_tf32_flags(flags: tuple[bool, bool, bool, bool]) -> None:
    cuda = torch.backends.cuda.matmul
    cuda.allow_tf32 = flags[0]
    cuda.allow_bf16_reduced_precision_reduction = flags[1]
    cuda.allow_fp16_reduced_precision_reduction = flags[2]
    torch.backends.cudnn.allow_tf32 = flags[3]


def _each_call_keeps_its_own(tmp_path, monkeypatch, outside: tuple[bool, ...]) -> None:
    import linnet.torch.model as model_module

    inside: list[tuple[bool, ...]] = []
    real = model_module.run_graph

    def spy(*args, **kwargs):
        inside.append(_tf32_flags())
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "run_graph", spy)
    path = _model_file(tmp_path)
    exact = load(path, weights=_weights(), numerics="exact", interpret=True)
    fast = load(path, weights=_weights(), numerics="fast", interpret=True)
    generated = load(path, weights=_weights(), numerics="fast")
    for model, want in [(fast, True), (exact, False), (fast, True), (exact, False)]:
        model.run("run", [_x()])
        assert inside[-1] == (want,) * 4, (model.numerics, inside[-1])
        assert _tf32_flags() == outside
    generated.run("run", [_x()])
    assert _tf32_flags() == outside
    exact.run("run", [_x()])
    assert inside[-1] == (False,) * 4 and _tf32_flags() == outside


def test_the_model_compiles_through_the_pipeline(tmp_path):
    """Issue 39 item 3: Model lowers through linnet.lang.compiler.compile_entry, not its own
    lower -> with_kernels: each stage is verified and shown, ``kernels`` under "fast" only and
    never for the interpreter, and the options load checked are the model's."""
    from linnet.lang.pipeline import CompileOptions, watch

    path = _model_file(tmp_path)
    stages = {}
    for numerics, interpret in [("exact", False), ("fast", False), ("fast", True)]:
        model = load(path, weights=_weights(), numerics=numerics, interpret=interpret)
        assert model.options == CompileOptions(numerics, "cpu", None)
        with watch() as seen:
            model.run("run", [_x()])
        stages[numerics, interpret] = [name for name, g in seen if g.entry == "run"]
    assert stages == {
        ("exact", False): ["lower", "hoist"],
        ("fast", False): ["lower", "hoist", "kernels"],
        ("fast", True): ["lower", "hoist"],
    }
