"""Span ops (check/spans.py): where a span op's body stands in a lowered graph, it is claimed as
one call of the span op, with the kernel binding of the graph's own shapes; where it does not
stand whole (a value used outside, other steps between, other wiring, a kernel whose `where`
fails) nothing is claimed."""

from pathlib import Path
from typing import Any

import pytest
from linnet.lang import Program
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.lowering import lower
from linnet.lang.check.spans import Spans, claim_spans, span_ops, spans_for, std_spans
from linnet.lang.ir.verify import verify

SPANS = (Path(__file__).parent / "spans" / "norm_linear.linnet").read_text()

TWO_NORMS = (Path(__file__).parent / "spans" / "two_norms.linnet.part").read_text()


def lowered(model: str, d: int = 40, o: int | None = 24, n: int = 3):
    program = Program.from_text(SPANS + model, "m")
    assert not program.errors
    config = {"D": d, "T": "f32", **({"O": o} if o is not None else {})}
    graph = lower(program, "run", {"x": [n, d]}, config, model="M")
    return program, graph


def spans_of(graph, before, module="m"):
    """The span calls ``claim_spans`` added, of span ops of ``module`` (std's own, such as
    std.nn.decode's, claim these graphs' spans too)."""
    return [
        c
        for c in graph.calls[len(before.calls) :]
        if module is None or c.callee.startswith(module + "::")
    ]


def test_span_ops_are_the_bound_ops_whose_body_calls_ops():
    program = Program.from_text(SPANS, "m")
    assert sorted(op.name for op in span_ops(program)) == ["norm_linear", "norm_linear2"]
    # rms_norm is bound to a kernel, but its body calls no op: not a span op.
    assert "rms_norm" not in {op.name for op in span_ops(std_spans().programs[0])}


def test_each_norm_then_linear_is_claimed_with_its_own_scalars_and_shapes():
    program, graph = lowered(TWO_NORMS)
    claimed = claim_spans(graph, program)
    found = spans_of(claimed, graph)
    assert [c.callee for c in found] == ["m::norm_linear", "m::norm_linear"]
    first, second = found
    assert first.attributes["args"] == ["%x", "@nw", 1e-05, "@w"]
    assert second.attributes["args"][1:3] == ["@nw2", 1e-06]
    assert first.attributes["kernel"] == "m::norm_linear_rows"
    assert first.attributes["kernel_generics"] == {
        "N": 3,
        "D": 40,
        "O": 24,
        "T": "f32",
        "BD": 64,
        "BO": 16,
    }
    assert second.attributes["kernel_generics"]["D"] == 24  # the second norm's own rows
    assert first.attributes["claims"] == ["std.nn.norm::rms_norm", "std.nn.linear::linear"]
    # Each claim covers exactly its two calls' steps, and the graph is left as it was.
    norm, lin = [c for c in graph.calls if c.kind == "op"][:2]
    assert (first.start, first.stop) == (norm.start, lin.stop)
    assert len(claimed.calls) - len(graph.calls) == len(spans_of(claimed, graph, None))
    verify(claimed, "claim_spans")


def test_a_value_used_outside_the_span_stops_the_claim():
    program, graph = lowered(
        """
pub model M<D: Dim, T: DType> {
    param nw: Tensor[D; T]
    param w: Tensor[D, D; T]
    entry run<N: Dim>(x: Tensor[N, D; T]) -> Tensor[N, D; T] {
        let n = rms_norm(x, self.nw, 1e-5)
        let y = linear(n, self.w)
        return y + n
    }
}
""",
        o=None,
    )
    assert spans_of(claim_spans(graph, program), graph) == []


def test_other_wiring_is_not_claimed():
    program, graph = lowered(
        """
pub model M<D: Dim, T: DType> {
    param nw: Tensor[D; T]
    param w: Tensor[D, D; T]
    entry run<N: Dim>(x: Tensor[N, D; T]) -> Tensor[N, D; T] {
        let n = rms_norm(x, self.nw, 1e-5)
        return linear(x, self.w) + n
    }
}
""",
        o=None,
    )
    assert spans_of(claim_spans(graph, program), graph) == []


def test_a_kernel_whose_where_fails_is_not_claimed():
    # norm_linear_rows holds rows of up to 64 features (BD = 64 >= D).
    program, graph = lowered(TWO_NORMS, d=80)
    found = spans_of(claim_spans(graph, program), graph)
    assert [c.attributes["kernel_generics"]["D"] for c in found] == [24]


def test_one_norm_feeding_two_products_is_one_span_with_two_results():
    program, graph = lowered("""
pub model M<D: Dim, O: Dim, T: DType> {
    param nw: Tensor[D; T]
    param wq: Tensor[O, D; T]
    param wk: Tensor[O, D; T]
    entry run<N: Dim>(x: Tensor[N, D; T]) -> Tensor[N, O; T] {
        let h = rms_norm(x, self.nw, 1e-5)
        let q = linear(h, self.wq)
        let k = linear(h, self.wk)
        return q * k
    }
}
""")
    found = spans_of(claim_spans(graph, program), graph)
    assert [c.callee for c in found] == ["m::norm_linear2"]
    (span,) = found
    assert span.attributes["args"] == ["%x", "@nw", 1e-05, "@wq", "@wk"]
    assert len(span.attributes["results"]) == 2


def test_the_patterns_are_made_once_per_program():
    program, graph = lowered(TWO_NORMS)
    spans = spans_for(program)
    assert spans is spans_for(program)
    assert isinstance(spans, Spans)
    claim_spans(graph, program)
    assert {"m::norm_linear", "m::norm_linear2"} <= set(spans._patterns)


def llama_decode(model: str, head_dim: int, **extra: Any) -> tuple[Any, Any]:
    """A Llama source's decode graph at a small config, and it with std's spans claimed
    (checked by the verifier)."""
    from linnet.lang.syntax.program import model_file

    root = Path(__file__).parents[3]
    path = model_file(model) if model.startswith("std.") else root / model
    program = Program.from_file(path)
    config = {
        "V": 64,
        "D": 32,
        "F": 48,
        "NL": 2,
        "KV": 2,
        "G": 2,
        "HD": head_dim,
        "B": 1,
        "S": 16,
        "T": "f32",
        **extra,
    }
    b = config["B"]
    graph = lower(program, "decode", {"token": [b], "pos": [b]}, config)
    claimed = claim_spans(graph, program)
    verify(claimed, "claim_spans")
    return graph, claimed


@pytest.mark.parametrize("model", ["std.models.llama", "examples/llama/llama.linnet"])
def test_std_models_lower_and_claim_what_std_has(model):
    graph, claimed = llama_decode(model, 8)
    for c in spans_of(claimed, graph, None):  # whatever std's span ops claim is one span
        assert c.attributes["kernel_applies"] and c.stop > c.start


@pytest.mark.parametrize("model", ["std.models.llama", "examples/llama/llama.linnet"])
def test_the_attention_input_is_one_span_up_to_the_rotations(model):
    """`rms_norm_qkv_rope` (and its split-K chain, the same span) claims each layer's norm,
    q/k/v products, head split and both rotations (inv_freq and the angles are hoisted out
    of the layers; the span's rope_with nodes are calls), and returns what the cache writes
    and the attention read."""
    _, claimed = llama_decode(model, 16)
    for op in ("rms_norm_qkv_rope", "rms_norm_qkv_rope_split"):
        spans = [
            c
            for c in claimed.calls
            if c.callee == f"std.nn.decode::{op}" and not c.attributes.get("writes")
        ]
        assert len(spans) == 2 and all(c.attributes["kernel_applies"] for c in spans), op
        # Each is claimed a second time with the cache writes after it: its kernel stores k
        # and v into the layer's cache and returns q alone.
        writing = [
            c
            for c in claimed.calls
            if c.callee == f"std.nn.decode::{op}" and c.attributes.get("writes")
        ]
        assert [(c.start, c.stop - 2) for c in writing] == [(c.start, c.stop) for c in spans]
        for span, w in zip(spans, writing):
            assert w.attributes["results"] == span.attributes["results"][:1]
            steps = [claimed.steps[i] for i in range(span.stop, w.stop)]
            assert [s.op for s in steps] == ["scatter", "scatter"]
            assert [
                (x["result"], x["state"], x["at"], x["positions"]) for x in w.attributes["writes"]
            ] == [(j, s.operands[0], "%pos", 16) for j, s in zip((1, 2), steps)]
            assert [s.operands[1] for s in steps] == span.attributes["results"][1:]
        for span in spans:
            inside = [
                c.callee
                for c in claimed.calls
                if span.start <= c.start < span.stop
                and c.kind == "op"
                and c is not span
                and not c.attributes.get("kernel")
            ]
            assert inside.count("std.nn.linear::linear") == 3
            assert inside.count("std.nn.rope::rope_with") == 2
            shapes = [claimed.values[r].shape for r in span.attributes["results"]]
            assert shapes == [(1, 4, 16), (1, 2, 16), (1, 2, 16)]


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantised_attention_input_is_one_span_up_to_the_rotations(bits):
    """Quantised (int8 or int4, groups of 16), the same span is `rms_norm_qkv_rope_q8`'s
    (`_q4`'s): each layer's norm, three quantised products, head split and rotations, claimed
    as itself and again with the cache writes after it (its kernel then stores k and v);
    `rms_norm_qkv_rope_q8_heads` (`_q4_heads`) claims the same spans."""
    _, claimed = llama_decode("std.models.llama", 16, weight_bits=bits, weight_group=16)
    op = f"std.nn.quant::rms_norm_qkv_rope_q{bits}"
    spans = [c for c in claimed.calls if c.callee == op]
    assert len(spans) == 4 and all(c.attributes["kernel_applies"] for c in spans)
    assert sum(bool(c.attributes.get("writes")) for c in spans) == 2
    for span in (c for c in spans if not c.attributes.get("writes")):
        inside = [
            c.callee
            for c in claimed.calls
            if span.start <= c.start < span.stop and c.kind == "op" and c is not span
        ]
        assert inside.count(f"std.nn.linear::linear_q{bits}") == 3
        assert inside.count("std.nn.rope::rope_with") == 2
    # The same spans by the kernel of a KV head's lanes in q, k and v.
    heads = [c for c in claimed.calls if c.callee == op + "_heads"]
    assert [(c.start, c.stop) for c in heads] == [(c.start, c.stop) for c in spans]
    assert all(c.attributes["kernel_applies"] for c in heads)


@pytest.mark.parametrize(
    "batch,op",
    [(1, "linear_gemv_dot"), (32, "linear_gemv_dot32"), (48, "linear_gemv_dot64")],
)
def test_a_serving_batch_past_16_rows_gets_a_tensor_core_gemv(batch, op):
    """Every product of a decode step is claimed by the `gemv_dot` op of its batch: up to
    16 rows, 17 to 32, 33 to 64 (the last needs a pattern sampled past 24 rows)."""
    graph, claimed = llama_decode("std.models.llama", 8, B=batch)
    dots = {c.callee for c in claimed.calls if "gemv_dot" in c.callee}
    assert dots == {f"std.nn.decode::{op}"}
    linears = [c for c in graph.calls if c.callee == "std.nn.linear::linear"]
    assert len([c for c in claimed.calls if c.callee == f"std.nn.decode::{op}"]) == len(linears)


WRITER = """
/// y = 2x and z = x + 1, as one kernel.
op pair<N: Dim, D: Dim>(x: Tensor[N, D; f32]) -> (Tensor[N, D; f32], Tensor[N, D; f32])
    kernel pair_rows<N, D> {
    return x * 2.0, x + 1.0
}
kernel pair_rows<N: Dim, D: Dim>(x: Tensor[N, D; f32]) -> (y: Tensor[N, D; f32], z: Tensor[N, D; f32]) grid(1) {
    let rows = iota<i32>(N)
    let cols = iota<i32>(D)
    let v = load(x[rows, cols])
    store(y[rows, cols], v * 2.0)
    store(z[rows, cols], v + 1.0)
}
model M<N: Dim, S: Dim, D: Dim> {
    state cache: Tensor[N, S, D; f32]
    entry put(x: Tensor[N, D; f32], pos: Tensor[N; i32]) -> Tensor[N, D; f32] {
        let (y, z) = pair(x)
        self.cache[b, pos[b], d] = y[b, d]
        return z
    }
}
"""


def test_a_claim_with_state_writes_launches_from_generated_pytorch_only():
    """A bound op's call followed by the write of one of its results into a state is
    claimed again with the write (the iota of its rows between them claimed too): a plan's
    generated PyTorch launches its kernel storing that result into the state (written in
    place: the launcher checks the state is contiguous and names it mutated under
    torch.compile) and takes the other result; generated JAX, whose arrays are immutable,
    launches the kernel without the write and writes the state with its own steps."""
    from linnet.lang.emit.jax import emit_jax
    from linnet.lang.emit.torch import emit_torch
    from linnet.lang.passes.slices import slice_steps

    program = Program.from_text(WRITER)
    graph = lower(program, "put", {"x": [2, 4], "pos": [2]}, {"N": 2, "S": 8, "D": 4})
    claimed = claim_spans(graph, program)
    (call,) = [c for c in claimed.calls if c.attributes.get("writes")]
    assert call.callee == "main::pair" and call.attributes["writes"] == [
        {
            "result": 0,
            "state": "@cache",
            "at": "%pos",
            "page": None,
            "pages": 2,
            "step": call.stop - 1,
            "positions": 8,
        }
    ]
    assert claimed.steps[call.stop - 1].op == "scatter" and len(call.attributes["results"]) == 1
    # As a plan's slice (the whole entry here); a whole model's source launches kernels with
    # their backward (autograd), and a kernel that writes a state has none: the steps write.
    sl = slice_steps(claimed, list(range(len(claimed.steps))), "all")
    torch_src = emit_torch(with_kernels(claimed, program), numerics="fast", slices=[[sl]])
    assert "def launch_pair_rows_into_y_2_4(x, y, y_at):" in torch_src
    assert "launch_pair_rows_into_y" not in emit_torch(
        with_kernels(claimed, program), numerics="fast"
    )
    assert "mutates=('y',)" in torch_src and "check_inplace(y, 'y', 'pair_rows')" in torch_src
    jax_src = emit_jax(with_kernels(claimed, program), numerics="fast")
    assert "_into_" not in jax_src and "pair_rows_2_4" in jax_src


PAGED_WRITER = (
    WRITER.split("model M")[0]
    + """
model M<N: Dim, P: Dim, S: Dim, D: Dim> {
    state cache: Tensor[P, S, D; f32]
    entry put(x: Tensor[N, D; f32], pos: Tensor[N; i32], table: Tensor[N, 4; i32]) -> Tensor[N, D; f32] {
        let page[b] = table[b, pos[b] / S]
        let slot[b] = pos[b] % S
        let (y, z) = pair(x)
        self.cache[page[b], slot[b], d] = y[b, d]
        return z
    }
}
"""
)


def test_a_claim_with_a_paged_cache_write_stores_at_each_rows_page():
    """The write of a result into a paged cache (`cache[page[b], slot[b], d]`, the page
    made before the call) is claimed too: the kernel's launch takes the pool, the slots and
    the pages (`pair_rows_into_y(x, y, y_at, y_page)`), and stores row b at page[b]'s slot
    (the interpreted and CUDA checks: kernels_interpreted.py, test_kernels_launch.py)."""
    from linnet.lang.emit.torch import emit_torch
    from linnet.lang.passes.slices import slice_steps

    program = Program.from_text(PAGED_WRITER)
    graph = lower(
        program, "put", {"x": [2, 4], "pos": [2], "table": [2, 4]}, {"N": 2, "P": 6, "S": 8, "D": 4}
    )
    claimed = claim_spans(graph, program)
    (call,) = [c for c in claimed.calls if c.attributes.get("writes")]
    ((write,),) = [call.attributes["writes"]]
    assert {k: write[k] for k in ("result", "state", "at", "pages", "positions")} == {
        "result": 0,
        "state": "@cache",
        "at": "%slot",
        "pages": 6,
        "positions": 8,
    }
    assert write["page"] == "%page" and claimed.steps[write["step"]].op == "scatter"
    sl = slice_steps(claimed, list(range(len(claimed.steps))), "all")
    torch_src = emit_torch(with_kernels(claimed, program), numerics="fast", slices=[[sl]])
    assert "def launch_pair_rows_into_y_2_4(x, y, y_at, y_page):" in torch_src
    # A page made after the call (before the write) would not be there at its launch.
    late = PAGED_WRITER.replace("        let (y, z) = pair(x)\n", "").replace(
        "        let page[b]", "        let (y, z) = pair(x)\n        let page[b]"
    )
    graph = lower(
        Program.from_text(late),
        "put",
        {"x": [2, 4], "pos": [2], "table": [2, 4]},
        {"N": 2, "P": 6, "S": 8, "D": 4},
    )
    claimed = claim_spans(graph, Program.from_text(late))
    assert not [c for c in claimed.calls if c.attributes.get("writes")]


@pytest.mark.parametrize("model", ["std.models.llama", "examples/llama/llama.linnet"])
def test_the_attention_input_and_the_attention_are_one_call_across_the_cache_writes(model):
    """`rms_norm_qkv_rope_attention` (and `_wide`) is claimed over each layer's attention
    input with its cache writes, the heads' reshape and the attention (`Spans.fuse`): its
    arguments are the two claims' (the caches the attention reads, its scale), its result
    the attention's, and the writes the first claim's, now of the fused op's results 1 and
    2 (the rows it returns after the attention's output)."""
    _, claimed = llama_decode(model, 16)
    for op, first in (
        ("rms_norm_qkv_rope_attention", "rms_norm_qkv_rope_split"),
        ("rms_norm_qkv_rope_attention_wide", "rms_norm_qkv_rope_split_wide"),
    ):
        fused = [c for c in claimed.calls if c.callee == f"std.nn.decode::{op}"]
        writing = [
            c
            for c in claimed.calls
            if c.callee == f"std.nn.decode::{first}" and c.attributes.get("writes")
        ]
        attention = [
            c for c in claimed.calls if c.callee == "std.nn.decode::decode_attention_split_short"
        ]
        assert len(fused) == len(writing) == len(attention) == 2, op
        for f, w, a in zip(fused, writing, attention):
            assert (f.start, f.stop) == (w.start, a.stop)
            assert all(claimed.steps[i].op == "reshape" for i in range(w.stop, a.start))
            assert f.attributes["kernel_applies"] and f.attributes["span"]
            assert f.attributes["results"] == a.attributes["results"]
            assert f.attributes["args"] == (
                w.attributes["args"] + a.attributes["args"][1:3] + a.attributes["args"][4:]
            )
            assert [(x["result"], x["state"]) for x in f.attributes["writes"]] == [
                (1, a.attributes["args"][1]),
                (2, a.attributes["args"][2]),
            ]
            assert f.attributes["claims"] == w.attributes["claims"] + a.attributes["claims"]
            assert f.attributes["claims"][-1] == "std.nn.attention::decode_attention"


def test_the_attention_is_not_fused_where_the_writes_go_elsewhere():
    """With k written into the v cache and v into the k cache, the attention no longer reads
    what `with_rows` says it reads: each claim stands, the fused op is not claimed."""
    root = Path(__file__).parents[3]
    text = (root / "examples" / "llama" / "llama.linnet").read_text()
    swapped = text.replace(
        "self.k_cache[b, pos[b], h, d] = k_rot[b, h, d]\n"
        "        self.v_cache[b, pos[b], h, d] = v_heads[b, h, d]",
        "self.k_cache[b, pos[b], h, d] = v_heads[b, h, d]\n"
        "        self.v_cache[b, pos[b], h, d] = k_rot[b, h, d]",
    )
    assert swapped != text
    program = Program.from_text(swapped, "llama")
    config = {
        "V": 64,
        "D": 32,
        "F": 48,
        "NL": 2,
        "KV": 2,
        "G": 2,
        "HD": 16,
        "B": 1,
        "S": 16,
        "T": "f32",
    }
    claimed = claim_spans(lower(program, "decode", {"token": [1], "pos": [1]}, config), program)
    callees = {c.callee.rsplit("::", 1)[-1] for c in claimed.calls}
    assert {"rms_norm_qkv_rope_split", "decode_attention_split_short"} <= callees
    assert any(c.attributes.get("writes") for c in claimed.calls)
    assert not {"rms_norm_qkv_rope_attention", "rms_norm_qkv_rope_attention_wide"} & callees


@pytest.mark.parametrize("bits", [16, 8])
def test_further_results_are_found_among_the_readers_of_a_bound_input(bits, monkeypatch):
    """A span op of several results (q, k and v) finds each further result among the readers
    of a value its producer must read (the norm's output), not among every node of its kind
    in the graph: the claims are the same as with the whole graph searched."""
    import linnet.lang.passes.spans as passes_spans

    extra = {} if bits == 16 else {"weight_bits": bits, "weight_group": 16}
    _, narrowed = llama_decode("std.models.llama", 16, **extra)
    monkeypatch.setattr(passes_spans, "_bound_input", lambda pat, u, pn: None)
    _, searched = llama_decode("std.models.llama", 16, **extra)

    def calls(g):
        return [(c.callee, c.start, c.stop, c.attributes.get("results")) for c in g.calls]

    assert calls(narrowed) == calls(searched)
    assert sum(c.callee.endswith("_qkv_rope" if bits == 16 else "_rope_q8") for c in narrowed.calls)
