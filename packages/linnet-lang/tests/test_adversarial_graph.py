"""Adversarial cases for issue 39 items 1-2: the graph holds everything after lowering.

Kernel instances (``graph.kernels``) and launches' backward passes (``graph.backwards``) are
recorded once at lowering time (check/kernel_instances.py); the emitters read the graph and
never the program, so a graph carries its launches wherever it goes (a copy, a deep copy, a
module of several graphs), an error of a kernel is raised only where its launch is written,
and a module that needs backward passes the graph lacks is a coded error, not a KeyError.
"""

from __future__ import annotations

import copy

import pytest
from linnet.lang import Graph, LinnetError, Program, check_text, lower
from linnet.lang.check.kernel_instances import record_kernels, with_kernels
from linnet.lang.emit.jax import emit_jax
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.kernels import BackwardBody, KernelInstance, backward_key, instance_key
from test_adversarial_kernels import LATE
from test_kernel_scratch import TOTAL

DOUBLE = """
kernel double_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {
    let i = iota<i32>(N)
    store(y[i], load(x[i]) * 2.0)
}
pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_k<N> {
    let y[i] = x[i] * 2.0
    return y
}
model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return double(double(x)) }
}
"""


def _graph(text: str = DOUBLE, n: int = 4) -> tuple[Program, Graph]:
    program = check_text(text)
    return program, lower(program, "run", {"x": [n]})


def test_the_graph_alone_launches_its_kernels() -> None:
    """The emitter takes no program: a copy of the recorded graph, with the program gone,
    launches the kernel (before, emit_torch launched only with ``program=``)."""
    program, graph = _graph()
    record_kernels(graph, program)
    ((key, found),) = graph.kernels.items()
    assert isinstance(found, KernelInstance) and found.key == key
    assert [k.name for k in found.kernels] == ["main::double_k"] and found.error is None
    del program
    text = emit_torch(copy.deepcopy(graph), numerics="fast")
    assert text.count("@triton.jit\ndef double_k") == 1  # two calls, one instance
    assert "launch_double_k_4(x)" in text
    assert "run_double_k_4(" in emit_jax(copy.copy(graph), numerics="fast")  # Pallas


def test_not_recorded_or_exact_runs_the_body() -> None:
    program, graph = _graph()
    assert "triton" not in emit_torch(graph, numerics="fast")
    assert with_kernels(graph, program, "exact").kernels == {}  # exact: nothing lowered
    assert "triton" not in emit_torch(with_kernels(graph, program, "exact"), numerics="exact")


def test_with_kernels_checks_numerics() -> None:
    program, graph = _graph()
    with pytest.raises(LinnetError) as info:
        with_kernels(graph, program, "fastest")
    assert info.value.diagnostics[0].code == "E0713"


def test_backward_bodies_are_recorded_once_and_named_by_the_module() -> None:
    program, graph = _graph()
    record_kernels(graph, program)
    (call, _) = [c for c in graph.calls if c.attributes.get("kernel")]
    body = graph.backwards[backward_key(graph, call.attributes, call.callee)]
    assert isinstance(body, BackwardBody) and body.graph is not None and body.cause is None
    assert body.arg_types == [((4,), "f32")] and body.result_types == [((4,), "f32")]
    before = body.graph.entry
    text = emit_torch(graph, numerics="fast")
    # One backward for both calls (one instance, the same types), named by the module.
    assert text.count("def linnet_backward_1_double(") == 1
    assert "linnet_backward_2" not in text
    assert body.graph.entry == before  # the recorded body is left as it is
    # Recording again lowers nothing new.
    kernels, backwards = dict(graph.kernels), dict(graph.backwards)
    record_kernels(graph, program)
    assert all(graph.kernels[k] is v for k, v in kernels.items())
    assert all(graph.backwards[k] is v for k, v in backwards.items())


def test_a_module_without_recorded_backwards_is_a_coded_error() -> None:
    program, graph = _graph()
    graph = with_kernels(graph, program, backwards=False)
    with pytest.raises(LinnetError) as info:
        emit_torch(graph, numerics="fast")
    (diag,) = info.value.diagnostics
    assert diag.code == "E0680" and "main::double" in diag.message
    assert "with_kernels" in diag.help


def test_a_kernel_error_is_kept_and_raised_where_its_launch_is_written() -> None:
    """Recording never raises (the emitter may run the body there); emitting the launch
    raises the kernel's own coded error, in PyTorch and JAX alike."""
    program = check_text(LATE)  # checks: no sampled case reaches C >= 64
    graph = record_kernels(lower(program, "run", {"x": [3, 100]}, {"R": 3, "C": 100}), program)
    (found,) = graph.kernels.values()
    assert found.error is not None and found.kernels == []
    assert "triton" not in emit_torch(graph, numerics="exact")
    for emit in (emit_torch, emit_jax):
        with pytest.raises(LinnetError) as info:
            emit(graph, numerics="fast")
        assert info.value.diagnostics[0].code == "E0548"


def test_json_round_trip_keeps_the_format() -> None:
    """Kernels and backwards live in memory: the JSON format is as before, and a graph
    read back launches nothing until they are recorded again."""
    program, graph = _graph()
    text = graph.dumps()
    record_kernels(graph, program)
    assert graph.dumps() == text
    back = Graph.loads(text)
    assert back.kernels == {} and back.backwards == {}
    assert "triton" not in emit_torch(back, numerics="fast")
    assert "launch_double_k_4" in emit_torch(record_kernels(back, program), numerics="fast")


def test_instance_keys_tell_scalars_and_writes_apart() -> None:
    base = {"kernel": "m::k", "kernel_generics": {"N": 4}, "args": ["%x", 0.5]}
    assert instance_key(base) != instance_key({**base, "args": ["%x", 0.25]})
    assert instance_key(base) != instance_key({**base, "writes": [{"result": 0, "positions": 8}]})
    assert instance_key(base) != instance_key({**base, "kernel_generics": {"N": 5}})


def test_scratch_is_read_from_the_instance() -> None:
    program = Program.from_text(TOTAL)
    graph = record_kernels(lower(program, "run", {"x": [20]}), program)
    assert [i.scratch for i in graph.kernels.values()] == [True]
    assert "launch_block_total_20_8(x)" in emit_torch(graph, numerics="fast")
    assert "block_total" not in emit_jax(graph, numerics="fast")  # Pallas keeps no scratch


def test_recording_a_copy_leaves_the_original_without_kernels() -> None:
    """A runtime keeps its lowered graph and emits a plan's slices from it (or a claimed
    copy of it) with no kernel launched: recording the module's graph must not reach it."""
    program, graph = _graph()
    recorded = with_kernels(graph, program)
    assert recorded is not graph and recorded.kernels and graph.kernels == {}
    assert graph.backwards == {} and "triton" not in emit_torch(graph, numerics="fast")
    shallow = copy.copy(recorded)
    record_kernels(copy.copy(graph), program)
    assert graph.kernels == {}
    assert shallow.kernels is recorded.kernels  # nothing of the copy's was replaced
    (listed,) = with_kernels([graph], program)
    assert listed.kernels.keys() == recorded.kernels.keys() and graph.kernels == {}


# An op whose body ends in another op's call and a conversion (`return g(y) as T`): the
# inner call ends one step before the outer, which ends where `let h = ...` names the value.
NESTED_RESULT = """
op inner<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
    let y[i] = x[i] * 2.0
    return y
}
op outer<N: Dim>(x: Tensor[N; bf16]) -> Tensor[N; bf16] {
    let xf[i] = x[i] as f32
    return inner(xf) as bf16
}
model M<N: Dim> {
    entry run(x: Tensor[N; bf16]) -> Tensor[N; bf16] {
        let h = outer(x)
        let z[i] = h[i] + h[i]
        return z
    }
}
"""


def test_a_renamed_result_reaches_every_call_that_ends_with_it() -> None:
    """`let h = outer(x)` names the last step's value `%h`; `outer` recorded that value as
    its result before the rename, and must record `%h` (it recorded the old name, a value
    no step makes, when an inner call ended before it: span ops then never claimed such a
    call, e.g. `linear_q8`, whose body ends `return linear(xf, w) as T`)."""
    g = lower(Program.from_text(NESTED_RESULT), "run", {"x": [4]}, model="M")
    made = set(g.inputs) | {r for s in g.steps for r in s.results}
    outer = next(c for c in g.calls if c.callee.endswith("outer"))
    assert outer.attributes["results"] == ["%h"]
    for call in g.calls:
        for r in call.attributes.get("results", []):
            assert not isinstance(r, str) or r in made or r[1:] in g.parameters, (call, r)


@pytest.mark.parametrize("bits", [8, 4])
def test_every_quantised_product_of_a_bf16_step_is_claimed(bits: int) -> None:
    """In a bf16 model each `linear_q8` / `linear_q4` body converts its x to f32; q, k and v
    (and gate and up) convert the same x. Shared across the calls, that value tied each
    group's first call to the others, so the first (q_proj, gate_proj) stood claimed by no
    span op and ran its f32 body in every layer (found on an H200: 21.7 ms a step instead
    of the kernels' time). A value made inside one op call is not shared after it closes."""
    import json

    from linnet.lang.check.spans import spans_for
    from linnet.lang.syntax.program import model_file

    path = model_file("std.models.llama")
    cfg = json.loads((path.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    # Three layers: the later ones are replayed from the first (check/instantiate.py).
    cfg.update(NL=3, weight_bits=bits, weight_group=32, T="bf16")
    program = Program.from_file(path)
    g = lower(program, "decode", {"token": [1], "pos": [1]}, cfg, model="Llama", check=False)
    products = {c.start: c.path for c in g.calls if c.callee.endswith(f"linear_q{bits}")}
    claimed = {
        products[m.start]
        for m in spans_for(program).matches(g)
        if m.op.qualified_name == f"std.nn.quant::linear_q{bits}_gemv"
    }
    assert len(products) == 3 * 7 + 1 and claimed == set(products.values())
    # The fused prologues and epilogues claim every layer too: the norm before q, k and v
    # and before gate and up, the residual after o and down.
    fused = [m.op.qualified_name for m in spans_for(program).matches(g)]
    for op, count in (
        (f"rms_norm_qkv_q{bits}", 3),
        (f"rms_norm_gate_up_q{bits}", 3),
        (f"linear_q{bits}_residual", 6),
    ):
        assert fused.count(f"std.nn.quant::{op}") == count, (op, fused)


def _paged_claims(entry: str, inputs: dict[str, list[int]]) -> list[str]:
    """The span ops that claim calls of the toy std Llama's ``entry`` (three layers, a paged
    KV cache of 8 pages of 16 positions, bf16); ``inputs`` without the table, whose columns
    (``MP``) come from the config."""
    import json

    from linnet.lang.check.spans import spans_for
    from linnet.lang.syntax.program import model_file

    path = model_file("std.models.llama")
    cfg = json.loads((path.parent / "configs" / "llama" / "toy.json").read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    cfg.update(NL=3, kv_pages=8, kv_page_size=16, T="bf16")
    program = Program.from_file(path)
    mp = -(-int(cfg["S"]) // 16)
    batch = next(iter(inputs.values()))[0]
    g = lower(program, entry, {**inputs, "table": [batch, mp]}, cfg, model="Llama", check=False)
    return [m.op.qualified_name for m in spans_for(program).matches(g)]


def test_paged_decode_attention_is_claimed_in_every_layer() -> None:
    """A std model loaded with a paged KV cache decodes through `paged_decode_attention`;
    its kernel (`paged_decode_attention_flash`, pages read in place) claims every layer's."""
    found = _paged_claims("decode_paged", {"token": [2], "pos": [2]})
    assert found.count("std.nn.paged::paged_decode_attention_flash") == 3, found
    assert found.count("std.nn.paged::paged_decode_attention_split") == 3, found


def test_paged_prefill_attention_is_claimed_in_every_layer() -> None:
    """A std model's chunked prefill over its pages goes through `paged_prefill_attention`;
    its kernel (`paged_prefill_attention_flash`, pages read in place, no [L, S] scores made)
    claims every layer's."""
    found = _paged_claims("prefill_paged", {"tokens": [2, 16], "start": [2], "n": [2]})
    assert found.count("std.nn.paged::paged_prefill_attention_flash") == 3, found
