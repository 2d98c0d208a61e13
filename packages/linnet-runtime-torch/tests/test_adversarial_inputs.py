"""Adversarial runtime inputs (issue 11, items 4, 6, 7, 12, 13): every bad input is a coded
error, the same one from the interpreter, the generated source and a plan, raised before
anything runs (no state is written); whole-state returns run; a planted .pyc never runs.
"""

from __future__ import annotations

import importlib.util
import inspect
import marshal
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, lower
from linnet.torch import load, random_weights, run_graph
from linnet.torch.home import import_source
from support import LLAMA, toy_config

CI = bool(os.environ.get("CI"))
SETTINGS = settings(
    max_examples=25 if CI else 60,
    deadline=None,
    derandomize=CI,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
V, S = 256, 128  # the toy config's vocabulary and cache length
I32 = torch.int32


def i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


@pytest.fixture(scope="module")
def weights():
    return random_weights(LLAMA, toy_config(), seed=0)


@pytest.fixture(scope="module")
def paths(weights):
    """The three ways to run decode: generated source, interpreter, a plan (no backends)."""
    generated = load(LLAMA, weights=weights, config=toy_config())
    interpreted = load(LLAMA, weights=weights, config=toy_config(), interpret=True)
    plan = generated.plan_for(
        "decode", [i32(1), i32(0)], backends=[], measure=False, progress=False
    )
    plan_ctx = generated.context_for(plan)
    return {
        "generated": (lambda ins: generated.run("decode", ins), generated),
        "interpreter": (lambda ins: interpreted.run("decode", ins), interpreted),
        "plan": (lambda ins: plan.run(ins, plan_ctx), plan_ctx),
    }


def states_of(owner) -> dict[str, torch.Tensor]:
    if hasattr(owner, "states"):
        return owner.states
    return {k: v for ctx in owner._contexts.values() for k, v in ctx.states.items()}


def rejections(paths, inputs) -> list[tuple[str, str]]:
    """Each path's (code, message) for ``inputs``; asserts no state changed anywhere."""
    out = []
    for name, (call, owner) in paths.items():
        before = {k: v.clone() for k, v in states_of(owner).items()}
        with pytest.raises(LinnetError) as err:
            call(inputs)
        after = states_of(owner)
        assert all(torch.equal(before[k], after[k]) for k in before), f"{name} wrote a state"
        out.append((code_of(err), str(err.value)))
    return out


# ---------------------------------------------------------------- items 4 and 6: values
bad_tokens = st.one_of(
    st.integers(-(2**31), -1), st.integers(V, 2**31 - 1), st.sampled_from([-1, V, V + 44, -V])
)
bad_positions = st.one_of(
    st.integers(-(2**31), -1), st.integers(S, 2**31 - 1), st.sampled_from([-1, -S, S, S + 1])
)


@SETTINGS
@given(token=bad_tokens, pos=st.integers(0, S - 1))
def test_out_of_range_token_is_the_same_coded_error_everywhere(paths, token, pos):
    got = rejections(paths, [i32(token), i32(pos)])
    assert {c for c, _ in got} == {"E0780"}
    assert len({m for _, m in got}) == 1, got  # word for word the same
    text = got[0][1]
    assert f"has {token} at index [0]" in text and "[0, 256)" in text
    assert "token" in text and "model.embed_tokens.weight" in text


@SETTINGS
@given(token=st.integers(0, V - 1), pos=bad_positions)
def test_out_of_range_position_is_the_same_coded_error_everywhere(paths, token, pos):
    got = rejections(paths, [i32(token), i32(pos)])
    assert {c for c, _ in got} == {"E0780"}
    assert len({m for _, m in got}) == 1, got
    text = got[0][1]
    assert f"has {pos} at index [0]" in text and "[0, 128)" in text and "k_cache" in text
    if pos < 0:
        assert "negative values do not count from the end" in text


def test_edges_of_the_ranges_run_and_agree(paths):
    results = [call([i32(V - 1), i32(S - 1)]) for call, _ in paths.values()]
    results += [call([i32(0), i32(0)]) for call, _ in paths.values()]
    for r in results:
        out = r[0] if isinstance(r, list) else r
        assert out.shape == (1, V) and torch.isfinite(out).all()


def test_negative_position_used_to_give_nan_logits(weights):
    # Before: pos -1 wrote slot S-1 of the cache and returned all-NaN logits.
    model = load(LLAMA, weights=weights, config=toy_config())
    with pytest.raises(LinnetError) as err:
        model.decode(i32(5), i32(-1))
    assert code_of(err) == "E0780"


def test_interpreter_no_longer_clamps_token_ids(weights):
    # Before: token 300 of 256 returned token 255's logits; now the graph's own reference
    # (run_graph, no runtime check in front of it) rejects it too.
    model = load(LLAMA, weights=weights, config=toy_config(), interpret=True)
    graph = model.graph("decode", [i32(1), i32(0)])
    states = {p: torch.zeros(vt.shape) for p, vt in graph.states.items()}
    with pytest.raises(LinnetError) as err:
        run_graph(graph, [i32(300), i32(0)], model.params, states)
    assert code_of(err) == "E0781"
    with pytest.raises(LinnetError) as err:
        run_graph(graph, [i32(3), i32(-2)], model.params, states)
    assert code_of(err) == "E0781"


@SETTINGS
@given(data=st.data())
def test_batched_inputs_name_the_first_bad_index(weights, data):
    model = _batched(weights)
    tokens = data.draw(st.lists(st.integers(0, V - 1), min_size=3, max_size=3))
    positions = data.draw(st.lists(st.integers(0, S - 1), min_size=3, max_size=3))
    which = data.draw(st.sampled_from(["token", "pos"]))
    k = data.draw(st.integers(0, 2))
    bad = data.draw(bad_tokens if which == "token" else bad_positions)
    (tokens if which == "token" else positions)[k] = bad
    with pytest.raises(LinnetError) as err:
        model.decode(i32(*tokens), i32(*positions))
    assert code_of(err) == "E0780"
    assert f"input `{which}` of `decode` has {bad} at index [{k}]" in str(err.value)


_BATCHED: dict = {}


def _batched(weights):
    if "m" not in _BATCHED:
        _BATCHED["m"] = load(LLAMA, weights=weights, config=toy_config(B=3))
    return _BATCHED["m"]


@pytest.mark.parametrize("interpret", [False, True])
def test_prefill_tokens_out_of_range(weights, interpret):
    model = load(LLAMA, weights=weights, config=toy_config(), interpret=interpret)
    tokens = torch.tensor([[1, 2, 3, 999, 4]], dtype=I32)
    with pytest.raises(LinnetError) as err:
        model.prefill(tokens)
    assert code_of(err) == "E0780" and "has 999 at index [0, 3]" in str(err.value)


@pytest.mark.parametrize("length", [S + 1, 2 * S])
@pytest.mark.parametrize("how", ["generated", "interpreter", "plan"])
def test_prompt_longer_than_the_cache(weights, length, how):
    model = load(LLAMA, weights=weights, config=toy_config(), interpret=how == "interpreter")
    tokens = torch.ones((1, length), dtype=I32)
    with pytest.raises(LinnetError) as err:
        if how == "plan":
            model.plan_for("prefill", [tokens], backends=[], measure=False, progress=False)
        else:
            model.prefill(tokens)
    assert code_of(err) == "E0782"
    text = str(err.value)
    assert f"[1, {length}]" in text and "k_cache" in text and "holds 128" in text


def test_prompt_as_long_as_the_cache_runs(weights):
    model = load(LLAMA, weights=weights, config=toy_config())
    assert model.prefill(torch.ones((1, S), dtype=I32)).shape == (1, S, V)


@pytest.mark.parametrize("inputs", [[i32(300), i32(0)], [i32(1), i32(-1)], [i32(1), i32(S)]])
def test_planning_and_conform_check_their_inputs(weights, tmp_path, inputs):
    # Both run the generated source on these inputs (to record and time regions).
    from linnet.plan import TimingCache
    from reference_backends import RefLinear

    model = paths_model(weights)
    with pytest.raises(LinnetError) as err:
        model.plan_for(
            "decode",
            inputs,
            backends=[RefLinear()],
            measure=True,
            progress=False,
            cache=TimingCache(tmp_path / "timings.json"),
        )
    assert code_of(err) == "E0780"
    with pytest.raises(LinnetError) as err:
        model.conform("decode", inputs, RefLinear())
    assert code_of(err) == "E0780"


def paths_model(weights):
    if "plain" not in _BATCHED:
        _BATCHED["plain"] = load(LLAMA, weights=weights, config=toy_config())
    return _BATCHED["plain"]


# ---------------------------------------------------------------- item 12: API misuse
MISUSE = [
    ((1, 0), "E0721"),
    (([1], [0]), "E0721"),
    ((np.array([1], dtype=np.int32), i32(0)), "E0721"),
    ((i32(1), 0), "E0721"),
    ((i32(1), None), "E0721"),
    ((i32(1), "0"), "E0721"),
    ((torch.tensor([1.0]), i32(0)), "E0722"),
    ((i32(1), torch.tensor([0])), "E0722"),
    ((torch.tensor([True]), i32(0)), "E0722"),
    ((i32(1),), "E0720"),
    ((i32(1), i32(0), i32(0)), "E0720"),
    ((), "E0720"),
]


@pytest.mark.parametrize(("args", "code"), MISUSE)
def test_api_misuse_is_coded(paths, weights, args, code):
    model = paths["generated"][1]
    with pytest.raises(LinnetError) as err:
        model.decode(*args)
    assert code_of(err) == code
    if code == "E0721":
        assert "torch.tensor(" in str(err.value)


@pytest.mark.parametrize(("args", "code"), MISUSE)
def test_plan_run_misuse_is_coded(paths, args, code):
    call, _ = paths["plan"]
    with pytest.raises(LinnetError) as err:
        call(list(args))
    want = {"E0722": "E0722", "E0721": "E0721", "E0720": "E0720"}[code]
    assert code_of(err) == want


DTYPES = [torch.int32, torch.int64, torch.int16, torch.uint8, torch.float32, torch.bool]
SHAPES = [(), (1,), (2,), (1, 1), (0,)]
anything = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(-5, 300), max_size=3),
    st.builds(lambda v: np.array(v, dtype=np.int32), st.lists(st.integers(0, 9), max_size=2)),
    st.builds(
        lambda d, s, v: torch.full(s, v).to(d),
        st.sampled_from(DTYPES),
        st.sampled_from(SHAPES),
        st.integers(-(2**31), 2**31 - 1),
    ),
    st.builds(
        lambda s, v: torch.full(s, v, dtype=I32), st.sampled_from(SHAPES[:3]), st.integers(-3, 300)
    ),
)


@SETTINGS
@given(args=st.lists(anything, max_size=3))
def test_any_inputs_are_a_result_or_a_coded_error(paths, args):
    # Whatever is passed, a run returns logits or raises a LinnetError: never another error.
    for how in ("generated", "interpreter", "plan"):
        call, _ = paths[how]
        try:
            out = call(list(args))
        except LinnetError:
            continue
        out = out[0] if isinstance(out, list) else out
        assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()


def test_plan_run_float_tokens_are_not_cast(paths):
    call, _ = paths["plan"]
    with pytest.raises(LinnetError) as err:
        call([torch.tensor([1.7]), i32(0)])
    assert code_of(err) == "E0722" and "torch.float32" in str(err.value)


def test_inputs_by_name(paths):
    model = paths["generated"][1]
    ctx = model.new_context("decode", [i32(1), i32(0)])
    a = model.decode(i32(7), i32(0), context=ctx)
    ctx2 = model.new_context("decode", [i32(1), i32(0)])
    b = model.decode(pos=i32(0), token=i32(7), context=ctx2)
    ctx3 = model.new_context("decode", [i32(1), i32(0)])
    c = model.decode(i32(7), pos=i32(0), context=ctx3)
    ctx4 = model.new_context("decode", [i32(1), i32(0)])
    d = model.run("decode", {"pos": i32(0), "token": i32(7)}, context=ctx4)
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


@pytest.mark.parametrize(
    ("args", "named", "code", "words"),
    [
        ((), {"token": i32(1)}, "E0720", "missing: pos"),
        ((), {"token": i32(1), "pos": i32(0), "extra": i32(0)}, "E0783", "no input `extra`"),
        ((i32(1),), {"token": i32(1)}, "E0783", "given twice"),
        ((i32(1), i32(0), i32(0)), {"pos": i32(0)}, "E0720", "takes 2 inputs"),
        ((), {"token": 1, "pos": i32(0)}, "E0721", "torch.Tensor"),
    ],
)
def test_bad_inputs_by_name(paths, args, named, code, words):
    model = paths["generated"][1]
    with pytest.raises(LinnetError) as err:
        model.decode(*args, **named)
    assert code_of(err) == code and words in str(err.value)


@pytest.mark.parametrize(
    ("inputs", "code"),
    [
        (i32(1, 0), "E0784"),
        ("token", "E0784"),
        (7, "E0784"),
        ({"token": i32(1)}, "E0720"),
        ({"tok": i32(1), "pos": i32(0)}, "E0783"),
    ],
)
def test_run_takes_a_list_or_a_dict(paths, inputs, code):
    model = paths["generated"][1]
    with pytest.raises(LinnetError) as err:
        model.run("decode", inputs)
    assert code_of(err) == code


def test_plan_run_inputs_not_a_list(paths):
    call, _ = paths["plan"]
    with pytest.raises(LinnetError) as err:
        call(i32(1, 0))
    assert code_of(err) == "E0784"


def test_context_of_the_wrong_type(paths):
    model = paths["generated"][1]
    with pytest.raises(LinnetError) as err:
        model.decode(i32(1), i32(0), context={"states": {}})
    assert code_of(err) == "E0785"


# ---------------------------------------------------------------- `linnet run`
@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--prompt=300,1"], "E0780"),
        (["--prompt=-1,2"], "E0780"),
        (["--prompt=" + ",".join(["1"] * (S + 1)), "--tokens", "1"], "E0782"),
        (["--prompt=1,2", "--tokens", "200"], "E0788"),
        (["--prompt="], "E0786"),
        (["--prompt=1", "--tokens", "0"], "E0787"),
    ],
)
def test_cli_run_bad_inputs(capsys, argv, code):
    from linnet.lang.cli import main

    rc = main(["run", str(LLAMA), "--config", "toy", *argv])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"error[{code}]" in err and "Traceback" not in err


def test_cli_run_to_the_end_of_the_cache(capsys):
    from linnet.lang.cli import main

    assert main(["run", str(LLAMA), "--config", "toy", "--prompt=1,2", "--tokens", str(S - 1)]) == 0
    assert f"at position  {S - 1}" in capsys.readouterr().out


# ---------------------------------------------------------------- item 7: whole states
STATE_MODEL = """
model M<S: Dim> {
    state cache: Tensor[S, 4; f32]
    entry write(x: Tensor[4; f32], pos: Tensor[1; i32]) -> Tensor[S, 4; f32] {
        self.cache[pos[0], d] = x[d]
        let c[s, d] = self.cache[s, d]
        return c
    }
    entry whole(x: Tensor[4; f32]) -> Tensor[S, 4; f32] {
        return self.cache
    }
    entry both(x: Tensor[4; f32]) -> (Tensor[S, 4; f32], Tensor[4; f32]) {
        return self.cache, x * 2.0
    }
}
"""


@pytest.mark.parametrize("interpret", [False, True])
def test_whole_state_returns(tmp_path, interpret):
    path = tmp_path / "m.linnet"
    path.write_text(STATE_MODEL)
    model = load(path, config={"S": 3}, interpret=interpret)
    x = torch.arange(4, dtype=torch.float32)
    first = model.write(x, i32(1))
    assert first.tolist() == [[0.0] * 4, x.tolist(), [0.0] * 4]
    again = model.write(x + 10, i32(2))  # writes the same state in place
    assert first.tolist() == [[0.0] * 4, x.tolist(), [0.0] * 4]  # a copy: unchanged
    assert again[2].tolist() == (x + 10).tolist()
    whole = model.whole(x)
    assert torch.equal(whole, again)
    cache, doubled = model.both(x)
    assert torch.equal(cache, again) and torch.equal(doubled, x * 2)
    with pytest.raises(LinnetError) as err:
        model.write(x, i32(3))
    assert code_of(err) == "E0780" and "[0, 3)" in str(err.value)


def test_whole_state_returns_agree(tmp_path):
    path = tmp_path / "m.linnet"
    path.write_text(STATE_MODEL)
    runs = []
    for interpret in (False, True):
        model = load(path, config={"S": 5}, interpret=interpret)
        outs = [model.write(torch.full((4,), float(k)), i32(k % 5)) for k in range(7)]
        runs.append(torch.stack(outs))
    assert torch.equal(runs[0], runs[1])


def test_whole_state_returns_through_a_plan(tmp_path):
    path = tmp_path / "m.linnet"
    path.write_text(STATE_MODEL)
    model = load(path, config={"S": 3})
    x = torch.arange(4, dtype=torch.float32)
    plan = model.plan_for("write", [x, i32(1)], backends=[], measure=False, progress=False)
    context = model.context_for(plan)
    (first,) = plan.run([x, i32(1)], context)
    assert first.tolist() == [[0.0] * 4, x.tolist(), [0.0] * 4]
    whole_plan = model.plan_for("whole", [x], backends=[], measure=False, progress=False)
    (whole,) = whole_plan.run([x], context)
    assert torch.equal(whole, first) and whole.data_ptr() != context.states["cache"].data_ptr()


def test_graph_with_a_state_output_emits(tmp_path):
    from linnet.lang.emit.torch import emit_torch

    graph = lower(Program.from_text(STATE_MODEL), "whole", {"x": [4]}, {"S": 2})
    assert graph.outputs == ["@cache"]
    text = emit_torch(graph)
    assert "states['cache'].clone()" in text
    module = import_source(text, "linnet_test_whole")
    state = torch.ones(2, 4)
    (out,) = module.whole(torch.zeros(4), {}, {"cache": state})
    assert torch.equal(out, state) and out.data_ptr() != state.data_ptr()


# ---------------------------------------------------------------- item 13: bytecode
def plant_pyc(py_path, evil_source: str) -> str:
    """A .pyc for ``py_path`` that Python's own loader accepts (its header matches the
    file's mtime and size) but that holds other code."""
    st_ = py_path.stat()
    code = compile(evil_source, str(py_path), "exec")
    data = bytearray(importlib.util.MAGIC_NUMBER)
    data += (0).to_bytes(4, "little")
    data += (int(st_.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    data += (st_.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    data += marshal.dumps(code)
    pyc = importlib.util.cache_from_source(str(py_path))
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    with open(pyc, "wb") as f:
        f.write(data)
    return pyc


def test_a_planted_pyc_never_runs(linnet_home):
    text = "VALUE = 'verified source'\n\ndef f():\n    return VALUE\n"
    first = import_source(text, "linnet_pyc")
    name = first.__name__
    wrote_bytecode = (linnet_home / "generated" / "__pycache__").exists()
    pyc = plant_pyc(Path(first.__file__), "VALUE = 'tampered'\n\ndef f():\n    return VALUE\n")
    del sys.modules[name]  # a new process: imports the file again
    again = import_source(text, "linnet_pyc")
    assert again.f() == "verified source"  # before: 'tampered'
    assert os.path.exists(pyc)  # it was there to be read, and was not
    assert not wrote_bytecode
    # Tracebacks and @triton.jit read the functions' source from the file.
    assert inspect.getsource(again.f).startswith("def f():")
    assert again.__file__.endswith(".py")


def test_a_tampered_source_file_is_rewritten(linnet_home):
    text = "def f():\n    return 'verified'\n"
    module = import_source(text, "linnet_tampered")
    path = module.__file__
    del sys.modules[module.__name__]
    with open(path, "wb") as f:
        f.write(b"def f():\n    return '\xff tampered'\n")
    again = import_source(text, "linnet_tampered")
    assert again.f() == "verified"
    with open(path, encoding="utf-8") as f:
        assert f.read() == text


# ---------------------------------------------------------------- Captured (CUDA)
@pytest.mark.gpu
def test_captured_checks_host_inputs_without_waiting(weights):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.torch.planned import Captured

    model = load(LLAMA, weights=weights, config=toy_config(), device="cuda")
    plan = model.plan_for("decode", [i32(1), i32(0)], backends=[], measure=False, progress=False)
    step = Captured(plan, model.context_for(plan))
    for k in range(3):  # eager, capture, replay
        step([i32(k + 1).cuda(), i32(k)])
    for bad in ([i32(1), i32(-1)], [i32(300), i32(3)], [i32(1), i32(S)]):
        with pytest.raises(LinnetError) as err:
            step(bad)
        assert code_of(err) == "E0780"
    with pytest.raises(LinnetError) as err:
        step([torch.tensor([1.0]).cuda(), i32(3)])
    assert code_of(err) == "E0722"
    (out,) = step([i32(5).cuda(), i32(3)])  # still replays after the rejections
    assert out.shape == (1, V)
    with pytest.raises(LinnetError) as err:  # model.run checks device inputs (one sync)
        model.decode(i32(300).cuda(), i32(0).cuda())
    assert code_of(err) == "E0780"


# ---------------------------------------------------------------- indices not followed
UNFOLLOWED = """
model M<V: Dim, S: Dim> {
    param t: Tensor[V, 2; f32]
    state s: Tensor[S; f32]
    entry look(ids: Tensor[3; i32]) -> Tensor[3, 2; f32] {
        let out[i, d] = self.t[ids[i] * ids[i], d]
        return out
    }
    entry halve(x: Tensor[1; f32], pos: Tensor[1; i32]) -> Tensor[S; f32] {
        self.s[pos[0] / 2] = x[0]
        return self.s
    }
}
"""


@pytest.mark.parametrize("interpret", [False, True])
def test_an_index_the_analysis_does_not_follow_is_still_coded(tmp_path, interpret):
    path = tmp_path / "u.linnet"
    path.write_text(UNFOLLOWED)
    model = load(path, weights={"t": torch.randn(8, 2)}, config={"S": 4}, interpret=interpret)
    assert model.look(i32(0, 1, 2)).shape == (3, 2)
    with pytest.raises(LinnetError) as err:
        model.look(i32(0, 1, 3))  # 9 in an axis of 8
    assert code_of(err) == "E0781"


@pytest.mark.parametrize("interpret", [False, True])
@pytest.mark.parametrize("pos", [-1, -2, -3, 8, 9, 2**31 - 1])
def test_a_divided_position_is_checked(tmp_path, interpret, pos):
    # Before: -1 / 2 = -1 was written Python-style into the last entry by generated source.
    path = tmp_path / "u.linnet"
    path.write_text(UNFOLLOWED)
    model = load(path, weights={"t": torch.randn(8, 2)}, config={"S": 4}, interpret=interpret)
    assert model.halve(torch.ones(1), i32(7)).tolist() == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(LinnetError) as err:
        model.halve(torch.ones(1), i32(pos))
    assert code_of(err) == "E0780" and "[0, 8)" in str(err.value)


@pytest.mark.parametrize("interpret", [False, True])
def test_a_parameter_returned_whole_is_a_copy(tmp_path, interpret):
    path = tmp_path / "p.linnet"
    path.write_text("""
model M<N: Dim> {
    param w: Tensor[N; f32]
    entry get(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return self.w
    }
}
""")
    w = torch.arange(3, dtype=torch.float32)
    model = load(path, weights={"w": w}, interpret=interpret)
    out = model.get(torch.zeros(3))
    assert torch.equal(out, w)
    assert out.data_ptr() != model.params["w"].data_ptr()  # the caller's own tensor


@pytest.mark.parametrize("interpret", [False, True])
def test_a_constant_index_past_the_end_fails_at_lowering(tmp_path, interpret):
    # Before: a raw IndexError from the generated source and from the interpreter.
    path = tmp_path / "c.linnet"
    path.write_text("""
model M<S: Dim> {
    state s: Tensor[S; f32]
    entry put(x: Tensor[1; f32]) -> Tensor[S; f32] {
        self.s[5] = x[0]
        return self.s
    }
}
""")
    with pytest.raises(LinnetError) as err:
        load(path, config={"S": 4}, interpret=interpret).put(torch.ones(1))
    assert code_of(err) == "E0782" and "positions 5..5" in str(err.value)
    out = load(path, config={"S": 6}, interpret=interpret).put(torch.ones(1))
    assert out.tolist() == [0.0] * 5 + [1.0]


# ---------------------------------------------------------------- exported models (issue 38)
@pytest.fixture(scope="module")
def exported_decode(weights, tmp_path_factory):
    """The toy Llama and its decode exported to ONNX, in an onnxruntime session."""
    ort = pytest.importorskip("onnxruntime")
    model = load(LLAMA, weights=weights, config=toy_config())
    (path,) = model.export_onnx(
        "decode", [i32(1), i32(0)], tmp_path_factory.mktemp("export") / "decode.onnx"
    )
    return model, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("token,pos", [(-1, 0), (V, 0), (5, -1), (5, S)])
def test_an_exported_model_flags_what_model_run_refuses_with_the_same_error(
    exported_decode, token, pos
):
    """ONNX decode with token -1 returned token 255's logits and position -1 wrote cache
    slot 127: the export's `linnet.valid` output is false there, and check_outputs raises
    the very error model.run raises."""
    from linnet.lang.export_checks import check_outputs

    model, sess = exported_decode
    with pytest.raises(LinnetError) as want:
        model.run("decode", [i32(token), i32(pos)])
    ctx = model.new_context("decode", [i32(1), i32(0)])
    feeds = {
        "token": np.array([token], np.int32),
        "pos": np.array([pos], np.int32),
        **{p: v.numpy().copy() for p, v in ctx.states.items()},
    }
    outs = sess.run(None, feeds)
    assert not outs[-1]
    with pytest.raises(LinnetError) as got:
        check_outputs(sess, feeds, outs)
    assert str(got.value) == str(want.value)


def test_a_literal_written_into_a_state_runs_in_generated_source():
    """`self.s[i[0]] = 1.5` gave generated PyTorch `index_put_(..., 1.5)`: a TypeError
    traceback (found checking the emitters' names for issue 46 item 1)."""
    from linnet.lang.emit.torch import emit_torch

    prog = Program.from_text("""
model M<N: Dim> {
    state s: Tensor[N; f32]
    entry run(i: Tensor[1; i32]) -> Tensor[N; f32] {
        self.s[i[0]] = 1.5
        let y[k] = self.s[k] * 2.0
        return y
    }
}""")
    g = lower(prog, "run", {"i": [1]}, {"N": 3})
    ns: dict = {}
    exec(compile(emit_torch(g), "generated", "exec"), ns)
    mine, ref = {"s": torch.zeros(3)}, {"s": torch.zeros(3)}
    (got,) = ns["run"](i32(1), {}, mine)
    (want,) = run_graph(g, [i32(1)], {}, ref)
    assert got.tolist() == want.tolist() == [0.0, 3.0, 0.0]
    assert mine["s"].tolist() == ref["s"].tolist() == [0.0, 1.5, 0.0]
