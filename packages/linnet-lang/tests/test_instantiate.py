"""Instantiating a repeated block (check/instantiate.py) lowers exactly what evaluating every
iteration lowers: the same graph, byte for byte, and the same diagnostics.

Each case lowers twice, with instantiation on and off (``instantiate.ENABLED``), and compares
``Graph.dumps()``. A spy on the replay counts the iterations that were instantiated, so that a
case meant to instantiate does, and a case meant to fall back does not.
"""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, Program, lower
from linnet.lang.check import instantiate as instantiation
from linnet.lang.check.instantiate import Renaming, clone_element, same_element
from linnet.lang.tensors.values import BlockArray, BlockInst

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"


def config(name: str, **extra) -> dict:
    data = json.loads((LLAMA.parent / "configs" / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    data.update(extra)
    return data


@pytest.fixture(scope="module")
def llama() -> Program:
    return Program.from_file(LLAMA)


class Replays:
    """Counts the iterations instantiated by replaying the template."""

    def __init__(self, monkeypatch):
        self.count = 0
        self.arrays: list[str] = []  # the array of each replay, by path
        real = instantiation._replay

        def spy(builder, records, renaming):
            self.count += 1
            self.arrays.append(renaming.new.rsplit(".", 1)[0])
            return real(builder, records, renaming)

        monkeypatch.setattr(instantiation, "_replay", spy)


def both(monkeypatch, program, entry, inputs, cfg, arrays=None) -> tuple[str, str, int]:
    """(graph with instantiation, graph evaluating every iteration, iterations replayed).

    ``arrays`` (a list) receives the array path of every replay.
    """
    replays = Replays(monkeypatch)
    monkeypatch.setattr(instantiation, "ENABLED", True)
    on = lower(program, entry, inputs, cfg, check=False).dumps()
    count = replays.count
    monkeypatch.setattr(instantiation, "ENABLED", False)
    off = lower(program, entry, inputs, cfg, check=False).dumps()
    assert replays.count == count  # nothing is replayed when it is off
    if arrays is not None:
        arrays.extend(replays.arrays)
    return on, off, count


# ================================================================ Llama: identical graphs


@pytest.mark.parametrize("name", ["toy", "llama-3.2-1b", "llama-3-8b"])
@pytest.mark.parametrize("layers", [1, 2, 3, 4, 6])
@pytest.mark.parametrize(
    "entry,inputs",
    [
        ("decode", {"token": [1], "pos": [1]}),
        ("decode", {"token": [3], "pos": [3]}),
        ("prefill", {"tokens": [2, 5]}),
    ],
)
def test_llama_graph_is_identical(monkeypatch, llama, name, layers, entry, inputs):
    on, off, replayed = both(monkeypatch, llama, entry, inputs, config(name, NL=layers))
    assert on == off
    # Template and witness are evaluated; every other layer is instantiated.
    assert replayed == max(0, layers - 2)


@pytest.mark.parametrize(
    "entry,inputs", [("decode", {"token": [1], "pos": [1]}), ("prefill", {"tokens": [1, 8]})]
)
def test_llama_8b_32_layers_is_identical(monkeypatch, llama, entry, inputs):
    on, off, replayed = both(monkeypatch, llama, entry, inputs, config("llama-3-8b"))
    assert on == off
    assert replayed == 30


def test_tied_embeddings_and_rope_variants_are_identical(monkeypatch, llama):
    for extra in (
        {"tie_word_embeddings": True},
        {"rope_llama3": True, "rope_factor": 8.0},
        {"rope_dynamic": True},
    ):
        on, off, replayed = both(
            monkeypatch, llama, "decode", {"token": [2], "pos": [2]}, config("toy", NL=4, **extra)
        )
        assert on == off, extra
        assert replayed == 2


@settings(max_examples=12, deadline=None)
@given(
    layers=st.integers(1, 7),
    batch=st.integers(1, 3),
    length=st.integers(1, 6),
    prefill=st.booleans(),
    name=st.sampled_from(["toy", "llama-3.2-1b"]),
)
def test_identical_for_any_shape(layers, batch, length, prefill, name):
    program = Program.from_file(LLAMA)
    entry, inputs = (
        ("prefill", {"tokens": [batch, length]})
        if prefill
        else ("decode", {"token": [batch], "pos": [batch]})
    )
    cfg = config(name, NL=layers)
    instantiation.ENABLED = True
    try:
        on = lower(program, entry, inputs, cfg, check=False).dumps()
        instantiation.ENABLED = False
        off = lower(program, entry, inputs, cfg, check=False).dumps()
    finally:
        instantiation.ENABLED = True
    assert on == off


def test_instantiated_calls_record_their_iteration(llama):
    g = lower(llama, "decode", {"token": [1], "pos": [1]}, config("llama-3-8b"), check=False)
    layers = [c for c in g.calls if c.repeated == "model.layers"]
    assert [c.iteration for c in layers] == list(range(32))
    assert [c.path for c in layers] == [f"model.layers.{i}" for i in range(32)]
    for c in g.calls:  # every call inside layer i is on layer i's parameters
        if c.path.startswith("model.layers."):
            i = int(c.path.split(".")[2])
            for s in g.steps[c.start : c.stop]:
                assert all(
                    p.startswith(f"model.layers.{i}.")
                    for p in s.parameters()
                    if p.startswith("model.layers.")
                ), (c.path, s)


# ================================================================ fallbacks and edge cases

SCALE = """
block Scale<N: Dim> {
    param w: Tensor[N; f32]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i] * self.w[i]
        return y
    }
}
block Stack<N: Dim> {
    block parts: [Scale<N>; 3]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let h = x * 1.5
        for part in self.parts {
            h = part(h)
        }
        return h
    }
}
"""


def model(
    body: str, pre: str = "let h = x * 2.0", post: str = "return h", element: str = "Scale<N>"
) -> Program:
    return Program.from_text(
        SCALE
        + f"""
model M<N: Dim, L: Dim> {{
    config flag: bool = true
    block layers: [{element}; L]
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {{
        {pre}
        {body}
        {post}
    }}
}}
""",
        "m",
    )


LOOP = "for layer in self.layers { h = layer(h) }"
CASES = {
    # name: (program, instantiated?)
    "plain": (lambda: model(LOOP), True),
    # `h` starts as the input itself; the body never reads `x`: still one meaning per name.
    "carried value is an input": (lambda: model(LOOP, pre="let h = x"), True),
    # ... but when it does, `%x` means two things in the template: the witness shows it.
    "carried value also read by name": (
        lambda: model("for layer in self.layers { h = layer(h) + x }", pre="let h = x"),
        False,
    ),
    # Element 0 read directly, not through the loop variable: not a path to rename.
    "body reads element 0 directly": (
        lambda: model("for layer in self.layers { h = layer(h) + self.layers[0](x) }"),
        False,
    ),
    # Another fixed element is fine: its paths are not the template's.
    "body reads element 1 directly": (
        lambda: model("for layer in self.layers { h = layer(h) + self.layers[1](x) }"),
        True,
    ),
    # The body depends on the index: ranges are always evaluated.
    "range loop": (lambda: model("for i in 0..L { h = self.layers[i](h) }"), False),
    "range loop using the index": (
        lambda: model("for i in 0..L { h = if i == 1 { self.layers[i](h) } else { h * 2.0 } }"),
        False,
    ),
    # A config flag is the same for every element.
    "config flag": (
        lambda: model("for layer in self.layers { h = if flag { layer(h) } else { h } }"),
        True,
    ),
    "two carried values swapped": (
        lambda: model(
            "for layer in self.layers { let t = g\n g = layer(h)\n h = t }",
            pre="let h = x * 2.0\n let g = x * 3.0",
            post="return h + g",
        ),
        True,
    ),
    # Iteration 0's `h * 3.0` is the value `z` computed before the loop: in later iterations
    # it is a new value, so the template's name for it would be wrong.
    "shared with a value before the loop": (
        lambda: model(
            "for layer in self.layers { h = layer(h * 3.0) }",
            pre="let h = x * 2.0\n let z = h * 3.0",
            post="return h + z",
        ),
        False,
    ),
    # `h * 5.0` at the end of one iteration is shared by the start of the next.
    # ... and when the body also reads `z`, the witness sees two meanings of one name.
    "shared with a value before the loop, also read": (
        lambda: model(
            "for layer in self.layers { h = layer(h * 3.0) + z }",
            pre="let h = x * 2.0\n let z = h * 3.0",
            post="return h + z",
        ),
        False,
    ),
    "shared with the previous iteration": (
        lambda: model(
            "for layer in self.layers { let a = h * 5.0\n h = layer(a)\n let b = h * 5.0\n"
            " h = b - a }"
        ),
        True,
    ),
    "nested repeated blocks": (lambda: model(LOOP, element="Stack<N>"), True),
    # The second loop recomputes the first's values: every step shared, from before it.
    "two loops over the same layers": (
        lambda: model(
            "for layer in self.layers { h = layer(h) }\n"
            "        let first = h\n        h = x * 2.0\n"
            "        for layer in self.layers { h = layer(h) }",
            post="return h + first",
        ),
        False,
    ),
    "two loops, different work": (
        lambda: model(
            "for layer in self.layers { h = layer(h) }\n"
            "        for layer in self.layers { h = layer(h) * 0.5 }"
        ),
        True,
    ),
    "loop without carried values": (
        lambda: model("for layer in self.layers { let y = layer(h) }"),
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layers", [2, 3, 5])
def test_fallbacks_and_edge_cases_are_identical(monkeypatch, case, layers):
    make, instantiated = CASES[case]
    program = make()
    arrays: list[str] = []
    on, off, replayed = both(monkeypatch, program, "run", {"x": [4]}, {"N": 4, "L": layers}, arrays)
    assert on == off
    outer = layers - 2 if instantiated else 0
    if case == "two loops over the same layers":
        outer = layers - 2  # the first loop instantiates; the second falls back
    elif case == "two loops, different work":
        outer = 2 * (layers - 2)
    assert arrays.count("layers") == max(0, outer)
    if case == "nested repeated blocks":
        # Each element has 3 parts: part 2 is instantiated in the template and the witness
        # (evaluated), and copied with every replayed element; evaluated elements replay
        # their own.
        evaluated = layers if outer == 0 else 2
        assert sorted(set(arrays) - {"layers"}) == [f"layers.{i}.parts" for i in range(evaluated)]
        assert replayed == outer + evaluated
    else:
        assert replayed == max(0, outer)


def test_an_error_in_a_layer_is_reported_once_as_before(monkeypatch):
    program = Program.from_text(
        """
block Wide<N: Dim> {
    param w: Tensor[N; f32]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32]
    where N >= 8
    {
        let y[i] = x[i] * self.w[i]
        return y
    }
}
model M<N: Dim, L: Dim> {
    block layers: [Wide<N>; L]
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let h = x * 2.0
        for layer in self.layers {
            h = layer(h)
        }
        return h
    }
}
""",
        "m",
    )
    rendered = []
    for enabled in (True, False):
        monkeypatch.setattr(instantiation, "ENABLED", enabled)
        with pytest.raises(LinnetError) as err:
            lower(program, "run", {"x": [4]}, {"N": 4, "L": 6})
        rendered.append((str(err.value), [d.to_json() for d in err.value.diagnostics]))
    assert rendered[0] == rendered[1]
    assert len(rendered[0][1]) == 1


def test_an_error_outside_the_template_is_reported_as_before(monkeypatch):
    # The body reads element 1 directly: out of range (E0332) with one layer, fine with four.
    program = model("for layer in self.layers { h = layer(h) + self.layers[1](x) }")
    for layers in (1, 4):
        rendered = []
        for enabled in (True, False):
            monkeypatch.setattr(instantiation, "ENABLED", enabled)
            try:
                rendered.append(lower(program, "run", {"x": [4]}, {"N": 4, "L": layers}).dumps())
            except LinnetError as err:
                rendered.append(str(err))
        assert rendered[0] == rendered[1]


# ================================================================ the pieces


def test_renaming_renames_values_and_the_template_element_only():
    r = Renaming("m.layers.0", "m.layers.4", 4, "m.layers", {"%h": "%h.7"})
    assert r.ref("%h") == "%h.7"
    assert r.ref("%other") == "%other"
    assert r.ref("@m.layers.0.w") == "@m.layers.4.w"
    assert r.ref("@m.layers.01.w") == "@m.layers.01.w"  # not element 0's path
    assert r.ref("@m.layers.10.w") == "@m.layers.10.w"
    assert r.path("m.layers.0") == "m.layers.4"
    assert r.attrs({"path": "m.layers.0.k", "args": ["%h", 3, None], "dtype": "f32"}) == {
        "path": "m.layers.4.k",
        "args": ["%h.7", 3, None],
        "dtype": "f32",
    }
    assert r.iteration(0, "m.layers") == 4
    assert r.iteration(0, "m.layers.0.parts") == 0  # a nested array keeps its own index
    assert r.iteration(None, "") is None


def test_cloned_elements_are_the_elements_instantiated(monkeypatch):
    """Copying element 0 (clone_element) gives what instantiating element i gives."""
    program = model(LOOP, element="Stack<N>")
    arrays = {}
    real = BlockArray.__init__

    def record(self, element, path, count, items):
        real(self, element, path, count, items)
        arrays.setdefault(path, []).append(self)

    monkeypatch.setattr(BlockArray, "__init__", record)
    for enabled in (True, False):
        monkeypatch.setattr(instantiation, "ENABLED", enabled)
        lower(program, "run", {"x": [4]}, {"N": 4, "L": 4}, check=False)
    cloned, built = arrays["layers"][-2:]
    assert cloned == built  # dataclass equality: decls, paths, envs, members, iterations
    for i, item in enumerate(built.items):
        assert isinstance(item, BlockInst)
        assert same_element(built.items[0], item, "layers.0", f"layers.{i}")
        clone = clone_element(built.items[0], "layers.0", f"layers.{i}")
        clone.iteration = i  # set by the array (check/blocks.py), as for the built elements
        assert clone == item
    assert not same_element(built.items[0], built.items[2], "layers.0", "layers.1")
