"""torch.export of a loaded model (issue 46 item 6). Exporting `decode` failed on a
data-dependent guard: the input range check read the inputs' minimum and maximum with
`int()`, which a traced (fake) tensor does not have. Under export the check is now
assertions the exported program carries, and `model.as_module(entry, inputs)` gives the
entry as an nn.Module whose parameters and buffers (the KV caches) are the model's.

Case classes: crashes/tracebacks (export itself, FakeTensorMode), silent wrong results (the
exported program against the model, token 256 refused rather than read as 255, a fake
context kept by the model), one export per shape (E0733), the interpreter (E0734).
"""

from __future__ import annotations

import pytest
import torch
from linnet.lang import LinnetError, Program, lower
from linnet.lang.passes.bounds import bounds_for
from linnet.torch import load, random_weights
from linnet.torch.inputs import traced_range_checks
from support import LLAMA, toy_config

V, S = 256, 128  # the toy config's vocabulary and cache length


def i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


@pytest.fixture(scope="module")
def weights():
    return random_weights(LLAMA, toy_config(), seed=0)


@pytest.fixture(scope="module")
def exported(weights):
    """A model, a second one as the reference, and the first one's decode and prefill
    exported through `as_module` (exporting is the slow part: once for the module)."""
    model = load(LLAMA, weights=weights, config=toy_config())
    tokens = i32(3, 1, 4)[None]
    prefill = torch.export.export(model.as_module("prefill", [tokens]), (tokens,))
    decode = torch.export.export(model.as_module("decode", [i32(1), i32(0)]), (i32(1), i32(0)))
    return model, prefill, decode


def test_exported_prefill_and_decode_equal_the_model(weights, exported):
    _, prefill, decode = exported
    reference = load(LLAMA, weights=weights, config=toy_config())
    tokens = i32(3, 1, 4)[None]
    # The exported prefill writes the KV cache the exported decode then reads: a buffer
    # mutation, carried across calls as the model's context carries it.
    torch.testing.assert_close(prefill.module()(tokens), reference.prefill(tokens), rtol=0, atol=0)
    step = decode.module()
    # Decode equals to float rounding, not bit for bit: on the CPU the model's attention reads
    # the cache up to the position (cache_reach), the exported program (fixed shapes) all S
    # positions, the rest masked out, so its products sum in another order.
    for pos, token in [(3, 1), (4, 5), (5, 9)]:
        torch.testing.assert_close(
            step(i32(token), i32(pos)), reference.decode(i32(token), i32(pos)), rtol=1e-5, atol=1e-6
        )
    names = {s.target for s in decode.graph_signature.input_specs if s.target}
    assert "model.layers.0.self_attn.k_cache" in names and "lm_head.weight" in names


@pytest.mark.parametrize(
    "token,pos,bad,text",
    [
        (V, 3, "token", f"has a value of {V} or more"),
        (-1, 3, "token", "has a value below 0"),
        (5, S, "pos", f"has a value of {S} or more"),
        (5, -1, "pos", "has a value below 0"),
    ],
)
def test_exported_decode_refuses_out_of_range_inputs(exported, token, pos, bad, text):
    """Without the assertions, token 256 read the last embedding row (or past it): the
    exported program refuses it before anything runs, the KV cache unwritten."""
    _, _, decode = exported
    step = decode.module()
    before = {k: v.clone() for k, v in step.state_dict().items() if k.endswith("cache")}
    with pytest.raises(RuntimeError) as err:
        step(i32(token), i32(pos))
    message = str(err.value)
    assert "E0780" in message and f"input `{bad}` of `decode`" in message and text in message
    for k, v in step.state_dict().items():
        if k in before:
            torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)


def test_a_plain_wrapper_exports_once_the_context_exists(weights):
    """A module of one's own that calls `model.decode`: the model's states are its cache."""
    model = load(LLAMA, weights=weights, config=toy_config())

    class Decode(torch.nn.Module):
        def forward(self, token, pos):
            return model.decode(token, pos)

    # No context yet: made now it would be fake tensors the model then kept (E0732), and
    # the model still runs eagerly afterwards.
    with pytest.raises(LinnetError) as err:
        torch.export.export(Decode(), (i32(1), i32(0)))
    assert err.value.diagnostics[0].code == "E0732"
    out = model.decode(i32(1), i32(0))
    assert type(out) is torch.Tensor and out.shape == (1, V)
    program = torch.export.export(Decode(), (i32(2), i32(1)))
    want = load(LLAMA, weights=weights, config=toy_config())
    want.decode(i32(1), i32(0))
    torch.testing.assert_close(
        program.module()(i32(2), i32(1)), want.decode(i32(2), i32(1)), rtol=0, atol=0
    )
    with pytest.raises(RuntimeError, match="E0780"):
        program.module()(i32(V), i32(2))


def test_fake_tensor_mode_runs_for_shapes(weights):
    """A FakeTensorMode run (shapes without values) skips the range check, as for meta
    tensors, instead of failing on `int()` of a fake minimum."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = load(LLAMA, weights=weights, config=toy_config())
    model.decode(i32(1), i32(0))  # the context, made of real tensors
    with FakeTensorMode(allow_non_fake_inputs=True):
        # Made in the mode: no values at all (from_tensor would keep small ones' values).
        token, pos = torch.empty(1, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
        out = model.decode(token, pos)
    assert tuple(out.shape) == (1, V)
    # ... and a fresh model's context is not made of fake tensors under it (E0732).
    fresh = load(LLAMA, weights=weights, config=toy_config())
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, pytest.raises(LinnetError) as err:
        fresh.decode(mode.from_tensor(i32(7)), mode.from_tensor(i32(1)))
    assert err.value.diagnostics[0].code == "E0732"
    assert type(fresh.decode(i32(1), i32(0))) is torch.Tensor


def test_dynamic_shapes_are_E0733(weights):
    model = load(LLAMA, weights=weights, config=toy_config())
    tokens = i32(1, 2, 3)[None]
    with pytest.raises(LinnetError) as err:
        torch.export.export(
            model.as_module("prefill", [tokens]),
            (tokens,),
            dynamic_shapes=(({1: torch.export.Dim("L", max=64)},),),
        )
    assert err.value.diagnostics[0].code == "E0733"


def test_an_interpreted_model_is_E0734(weights):
    model = load(LLAMA, weights=weights, config=toy_config(), interpret=True)
    with pytest.raises(LinnetError) as err:
        model.as_module("decode", [i32(1), i32(0)])
    assert err.value.diagnostics[0].code == "E0734"


GATHER = """
model M<V: Dim> {
    param t: Tensor[V; f32]
    entry get(i: Tensor[2; i32]) -> Tensor[2; f32] {
        let out[k] = self.t[i[k]]
        return out
    }
}"""


@pytest.mark.parametrize("read", [False, True])
def test_both_forms_of_the_traced_check_refuse_at_run_time(read):
    """The CPU form (`torch._assert_async`, coded message) and the form for GPUs, where that
    assert would poison the CUDA context (`.item()` and `torch._check`), both exported and
    run on the CPU here."""
    graph = lower(Program.from_text(GATHER), "get", {"i": [2]}, {"V": 4})
    r = bounds_for(graph).inputs["%i"]

    class Get(torch.nn.Module):
        def forward(self, i):
            traced_range_checks(graph, "get", i, r, read=read)
            return i * 2

    program = torch.export.export(Get(), (i32(0, 3),)).module()
    torch.testing.assert_close(program(i32(1, 2)), i32(2, 4))
    for bad in (i32(0, 4), i32(-1, 0)):
        with pytest.raises(RuntimeError) as err:
            program(bad)
        if not read:
            assert "E0780" in str(err.value) and "input `i` of `get`" in str(err.value)


@pytest.mark.gpu
def test_exported_decode_on_cuda_refuses_and_the_device_stays_usable(weights):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = load(LLAMA, weights=weights, config=toy_config(), device="cuda")
    token, pos = i32(1).cuda(), i32(0).cuda()
    step = torch.export.export(model.as_module("decode", [token, pos]), (token, pos)).module()
    want = load(LLAMA, weights=weights, config=toy_config(), device="cuda")
    torch.testing.assert_close(step(token, pos), want.decode(token, pos))
    with pytest.raises(RuntimeError):
        step(i32(V).cuda(), i32(1).cuda())
    # A RuntimeError, not a device-side assert: the next call runs.
    torch.testing.assert_close(
        step(i32(2).cuda(), i32(1).cuda()), want.decode(i32(2).cuda(), i32(1).cuda())
    )


def test_parameters_named_like_module_attributes(tmp_path):
    """`forward`, `training`, `eval`: names nn.Module has. Each is registered beside it
    (`forward_`) instead of failing, or of replacing the module's forward."""
    path = tmp_path / "named.linnet"
    path.write_text("""
model M {
    param forward: Tensor[4; f32]
    param training: Tensor[4; f32]
    param eval: Tensor[4; f32]
    entry run(x: Tensor[4; f32]) -> Tensor[4; f32] {
        let y[i] = x[i] * self.forward[i] + self.training[i] + self.eval[i]
        return y
    }
}
""")
    weights = {
        "forward": torch.full((4,), 2.0),
        "training": torch.ones(4),
        "eval": torch.full((4,), 10.0),
    }
    model = load(path, weights=weights)
    x = torch.arange(4.0)
    module = model.as_module("run", [x])
    assert sorted(module.state_dict()) == ["eval_", "forward_", "training_"]
    program = torch.export.export(module, (x,))
    torch.testing.assert_close(program.module()(x), model.run("run", [x]), rtol=0, atol=0)
