"""passes/shard.py, tensor parallelism (issue 21): each rank's graph, run in lockstep.

The W rank graphs of an entry run here side by side on the NumPy reference
(tests/reference.py), one step of every rank at a time; a collective step combines the
ranks' operands as torch.distributed would (a sum, a concatenation in rank order). Their
outputs must equal the unsharded graph's on the same weights, for prefill and 16 greedy
decode steps carrying each rank's block of the KV cache. Also: the layout found from the
std calls, the errors, and what other targets say of a rank's graph.
"""

from __future__ import annotations

import numpy as np
import pytest
from export_cases import greedy, llama_graphs, llama_params, reference_step
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError
from linnet.lang.ir.graph import Graph
from linnet.lang.ir.verify import verify
from linnet.lang.passes.shard import COLLECTIVES, Sharding, shard
from reference import REFERENCE_RULES, STATE_RULES, _scatter, np_dtype, zero_states


def rank_params(s: Sharding, whole: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rank ``s.rank``'s blocks of the whole weights (what `load(world=...)` reads)."""
    out = {}
    for path, arr in whole.items():
        where = s.block(path, arr.shape)
        if where is None:
            out[path] = arr
        else:
            axis, a, b = where
            out[path] = np.take(arr, np.arange(a, b), axis=axis)
    return out


def run_ranks(
    ranks: list[Sharding], inputs: dict, params: list[dict], states: list[dict]
) -> list[np.ndarray]:
    """Run the ranks' graphs in lockstep; ``states`` (one dict per rank) are updated."""
    graphs = [s.graph for s in ranks]
    assert len({len(g.steps) for g in graphs}) == 1
    envs: list[dict[str, np.ndarray]] = []
    for g in graphs:
        envs.append(
            {
                ref: np.asarray(inputs[ref[1:]]).astype(np_dtype(g.values[ref].dtype))
                for ref in g.inputs
            }
        )

    def read(r: int, ref: str) -> np.ndarray:
        if ref.startswith("@"):
            return states[r][ref[1:]] if ref[1:] in states[r] else params[r][ref[1:]]
        return envs[r][ref]

    for k in range(len(graphs[0].steps)):
        steps = [g.steps[k] for g in graphs]
        op = steps[0].op
        assert {s.op for s in steps} == {op}, f"step {k}: the ranks disagree"
        xs = [[read(r, o) for o in s.operands] for r, s in enumerate(steps)]
        if op in COLLECTIVES:
            assert steps[0].attributes["world"] == len(ranks)
            parts = [x[0] for x in xs]
            if op == "all_gather":
                out = np.concatenate(parts, axis=steps[0].attributes["axis"])
            else:
                combine = {"sum": np.add, "max": np.maximum, "min": np.minimum}[
                    steps[0].attributes["kind"]
                ]
                out = parts[0]
                for p in parts[1:]:
                    out = combine(out, p)
            for r, s in enumerate(steps):
                vt = graphs[r].values[s.results[0]]
                assert out.shape == vt.shape, (k, op, out.shape, vt.shape)
                envs[r][s.results[0]] = out.astype(np_dtype(vt.dtype))
            continue
        for r, s in enumerate(steps):
            if op in STATE_RULES:
                _scatter(s, xs[r], states[r])
                continue
            with np.errstate(all="ignore"):
                out = np.asarray(REFERENCE_RULES[op](xs[r], s.attributes, s))
            vt = graphs[r].values[s.results[0]]
            assert out.shape == vt.shape, (k, op, out.shape, vt.shape)
            envs[r][s.results[0]] = out.astype(np_dtype(vt.dtype))
    outs = [[np.array(read(r, o)) for o in g.outputs] for r, g in enumerate(graphs)]
    for other in outs[1:]:  # every rank returns the whole result
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a, b)
    return outs[0]


def sharded_step(graph: Graph, world: int, params: dict):
    ranks = [shard(graph, world, r) for r in range(world)]
    blocks = [rank_params(s, params) for s in ranks]

    def run(inputs: dict, states: list[dict]) -> tuple[np.ndarray, list[dict]]:
        after = [{k: v.copy() for k, v in st.items()} for st in states]
        (out,) = run_ranks(ranks, inputs, blocks, after)
        return out, after

    return run, ranks


CONFIGS = {2: {}, 4: {"KV": 4, "H": 8, "HD": 8}}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def llama(request):
    world = request.param
    _, prefill, decode = llama_graphs(length=6, **CONFIGS[world])
    return world, prefill, decode, llama_params(prefill)


def test_prefill_and_16_greedy_tokens_match_the_unsharded_graph(llama):
    world, prefill, decode, params = llama
    p_step, p_ranks = sharded_step(prefill, world, params)
    d_step, _ = sharded_step(decode, world, params)
    states = [zero_states(s.graph) for s in p_ranks]
    prompt = np.array([[3, 17, 100, 255, 9, 0]], np.int32)
    tokens, logits = greedy(p_step, d_step, prompt, states, 16)
    want_tokens, want = greedy(
        reference_step(prefill, params),
        reference_step(decode, params),
        prompt,
        zero_states(prefill),
        16,
    )
    assert tokens == want_tokens
    for got, ref in zip(logits, want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_the_layout_comes_from_the_std_calls(llama):
    world, prefill, decode, _ = llama
    for graph in (prefill, decode):
        s = shard(graph, world, 1)
        split = s.parameters
        for layer in range(2):
            at = f"model.layers.{layer}"
            for proj in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
            ):
                assert split[f"{at}.{proj}.weight"] == 0, proj  # column-parallel
            for proj in ("self_attn.o_proj", "mlp.down_proj"):
                assert split[f"{at}.{proj}.weight"] == 1, proj  # row-parallel
            assert f"{at}.input_layernorm.weight" not in split  # replicated
            for cache in ("k_cache", "v_cache"):  # [B, S, KV, HD]: by KV head
                assert s.states[f"{at}.self_attn.{cache}"] == 2
                whole = graph.states[f"{at}.self_attn.{cache}"].shape
                assert s.graph.states[f"{at}.self_attn.{cache}"].shape[2] == whole[2] // world
        assert split["model.embed_tokens.weight"] == 0 and split["lm_head.weight"] == 0
        # One all-reduce after each row-parallel linear and the embedding; the vocab-parallel
        # logits gathered once, at the end.
        ops = [s.graph.steps[i] for i in s.collectives()]
        assert [o.op for o in ops].count("all_reduce") == 2 * 2 + 1
        assert [o.op for o in ops][-1] == "all_gather" and s.graph.steps[-1].op == "all_gather"
        assert s.graph.values[s.graph.outputs[0]].shape == graph.values[graph.outputs[0]].shape
        verify(s.graph)
        # The linears stay std.nn.linear calls (backends and fast paths find them); the
        # embedding, whose body reads shifted ids now, is no longer one.
        assert len(s.graph.semantic_calls("std.nn.linear::linear")) == len(
            graph.semantic_calls("std.nn.linear::linear")
        )
        assert not s.graph.semantic_calls("std.nn.embedding::embedding")
        for c in s.graph.semantic_calls("std.nn.linear::linear"):
            assert all(st.op not in COLLECTIVES for st in s.graph.steps[c.start : c.stop])


def test_a_graph_round_trips_with_its_collectives():
    _, _, decode = llama_graphs()
    g = shard(decode, 2, 0).graph
    again = Graph.loads(g.dumps())
    assert [s.op for s in again.steps] == [s.op for s in g.steps]
    assert again.config["tensor_parallel"] == {"world": 2, "rank": 0}


def test_world_1_is_the_graph_itself():
    _, _, decode = llama_graphs()
    s = shard(decode, 1, 0)
    assert s.graph is decode and s.parameters == {} and s.collectives() == []


@pytest.mark.parametrize(
    "world,extra,dim",
    [
        (4, {}, "KV = G = 2"),  # the toy's 2 KV heads do not split over 4 ranks
        (3, {}, "V = 256"),  # the vocabulary (the embedding is found first) over 3
        (2, {"F": 127}, "F = 127"),  # the MLP's features
    ],
)
def test_a_dim_that_does_not_divide_is_E0960_naming_it(world, extra, dim):
    _, prefill, _ = llama_graphs(**extra)
    with pytest.raises(LinnetError) as err:
        shard(prefill, world, 0)
    d = err.value.diagnostics[0]
    assert d.code == "E0960" and dim in d.message and f"world size {world}" in d.message, d.message


@pytest.mark.parametrize("world,rank", [(0, 0), (2, 2), (2, -1), (True, 0), (2.0, 0)])
def test_a_bad_world_or_rank_is_E0962(world, rank):
    _, _, decode = llama_graphs()
    with pytest.raises(LinnetError) as err:
        shard(decode, world, rank)
    assert err.value.diagnostics[0].code == "E0962"


def test_other_targets_refuse_a_rank_graph_with_a_code():
    from linnet.lang.emit.jax import emit_jax
    from linnet.lang.grad import differentiate

    _, prefill, _ = llama_graphs()
    g = shard(prefill, 2, 0).graph
    with pytest.raises(LinnetError) as err:
        emit_jax(g)
    assert err.value.diagnostics[0].code == "E0963"
    with pytest.raises(LinnetError) as err:
        differentiate(g, "params", seed="cotangents")
    assert err.value.diagnostics[0].code == "E0963"


def test_the_generated_pytorch_calls_torch_distributed_under_source_lines():
    from linnet.lang.emit.torch import emit_torch

    program, _, decode = llama_graphs()
    sources = {m.source.name: m.source.text for m in program.modules.values()}
    text = emit_torch(shard(decode, 2, 1).graph, sources, origin="llama.linnet")
    assert "import torch.distributed\n" in text
    assert text.count("torch.distributed.all_reduce(") == 2 + 1  # a layer's function, embedding
    assert "torch.distributed.all_gather(" in text and "torch.cat(" in text
    # rank 1 reads vocabulary rows 128..255: its ids are shifted by 128
    assert " - 128" in text
    before = text[: text.index("torch.distributed.all_reduce(")].splitlines()
    assert any(line.strip().startswith("# llama.linnet:") for line in before[-8:])
    assert "torch.distributed" not in emit_torch(decode, sources, origin="llama.linnet")


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), world=st.sampled_from([2, 4]))
def test_decode_matches_for_any_weights(seed, world):
    _, _, decode = llama_graphs(**CONFIGS[world])
    params = llama_params(decode, seed)
    step, ranks = sharded_step(decode, world, params)
    rng = np.random.default_rng(seed)
    inputs = {
        "token": np.array([rng.integers(0, 256)], np.int32),
        "pos": np.array([rng.integers(0, 128)], np.int32),
    }
    whole = zero_states(decode)
    for path in whole:
        whole[path] = rng.standard_normal(whole[path].shape).astype(np.float32)
    states = [rank_params_states(s, whole) for s in ranks]
    got, _ = step(inputs, states)
    want, _ = reference_step(decode, params)(inputs, whole)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def rank_params_states(s: Sharding, whole: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A rank's blocks of whole states (a KV cache already holding values)."""
    out = {}
    for path, arr in whole.items():
        where = s.block(path, arr.shape)
        out[path] = arr if where is None else np.take(arr, np.arange(*where[1:]), axis=where[0])
    return out


def test_a_16_bit_model_reduces_after_the_linear_in_its_type():
    _, prefill, _ = llama_graphs(T="f16")
    s = shard(prefill, 2, 0)
    # Every linear stays a std.nn.linear::linear call: the all-reduce of o and down follows
    # the call's `as T`, in f16 (half the bytes of the f32 accumulator).
    assert len(s.graph.semantic_calls("std.nn.linear::linear")) == len(
        prefill.semantic_calls("std.nn.linear::linear")
    )
    reduced = [s.graph.steps[i] for i in s.collectives() if s.graph.steps[i].op == "all_reduce"]
    assert {s.graph.values[st.operands[0]].dtype for st in reduced} == {"f16"}
    params = {k: v.astype(np.float16) for k, v in llama_params(prefill).items()}
    step, ranks = sharded_step(prefill, 2, params)
    prompt = {"tokens": np.array([[3, 17, 100, 255, 9, 0]], np.int32)}
    got, _ = step(prompt, [zero_states(r.graph) for r in ranks])
    want, _ = reference_step(prefill, params)(prompt, zero_states(prefill))
    np.testing.assert_allclose(got, want, rtol=0.01, atol=0.02)  # f16 rounding of sums


_SMALL = {
    "V": 256,
    "D": 64,
    "F": 128,
    "NL": 2,
    "H": 4,
    "KV": 2,
    "HD": 16,
    "S": 128,
    "B": 1,
    "T": "f32",
}
SHIPPED = {
    "llama": _SMALL,
    "qwen2": _SMALL,
    "mistral": _SMALL | {"sliding_window": 4},
    "gemma": _SMALL,
    "phi3": _SMALL | {"sliding_window": 4},
    "gpt2": {"V": 256, "P": 128, "F": 128, "NL": 2, "H": 4, "HD": 16, "S": 128, "B": 1, "T": "f32"},
    # Mixtures of experts: the router's E outputs and the stacked experts stay whole where a
    # split would have to be gathered on the way (the routing reads every expert's logit).
    "mixtral": _SMALL | {"num_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": _SMALL
    | {
        "num_experts": 8,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_model_matches_over_2_ranks(name):
    from linnet.lang import Program, lower
    from linnet.lang.syntax.program import model_file

    graph = lower(
        Program.from_file(model_file(f"std.models.{name}")),
        "prefill",
        {"tokens": [1, 6]},
        SHIPPED[name],
        check=False,
    )
    params = llama_params(graph)
    step, ranks = sharded_step(graph, 2, params)
    prompt = {"tokens": np.array([[3, 17, 100, 255, 9, 0]], np.int32)}
    got, _ = step(prompt, [zero_states(r.graph) for r in ranks])
    want, _ = reference_step(graph, params)(prompt, zero_states(graph))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Only the result is gathered: a linear whose split output would have to be gathered
    # on the way (Phi-3's fused qkv and gate_up, sliced apart) is kept replicated instead.
    s = ranks[0]
    assert [s.graph.steps[i].op for i in s.collectives()].count("all_gather") == 1
    assert s.parameters, "something is split"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_models_prefill_last_matches_over_2_ranks(name):
    """prefill_last (issue 41) shards as prefill does: the gather of each row's hidden state
    at ``at`` is replicated, the LM head split by the vocabulary, only the logits gathered."""
    from linnet.lang import Program, lower
    from linnet.lang.syntax.program import model_file

    graph = lower(
        Program.from_file(model_file(f"std.models.{name}")),
        "prefill_last",
        {"tokens": [1, 6], "at": [1]},
        SHIPPED[name],
        check=False,
    )
    params = llama_params(graph)
    step, ranks = sharded_step(graph, 2, params)
    prompt = {
        "tokens": np.array([[3, 17, 100, 255, 9, 0]], np.int32),
        "at": np.array([4], np.int32),
    }
    got, _ = step(prompt, [zero_states(r.graph) for r in ranks])
    want, _ = reference_step(graph, params)(prompt, zero_states(graph))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    s = ranks[0]
    assert [s.graph.steps[i].op for i in s.collectives()].count("all_gather") == 1
