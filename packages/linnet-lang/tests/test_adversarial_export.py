"""The adversarial suite, export (issue 38 item 4, issue 46 item 1): what an exported ONNX or
StableHLO model does with the inputs the runtimes refuse, and names that collide with the
exporters' own.

Before the fix: ONNX decode with token -1 returned token 255's logits and position -1 wrote
cache slot 127 (silent wrong results: onnxruntime counts -1 from the end); `linnet stablehlo`
and `linnet onnx` exported a 129-token prefill into a 128-slot cache, and the StableHLO
module returned finite logits; a prefill exported with a symbolic L ran 129 tokens without a
word. Now exports stop with the runtimes' E0782 where the shapes alone are wrong, and every
exported model returns ``linnet.valid`` after its states, which
:func:`linnet.lang.export_checks.check_outputs` turns into the runtimes' E0780 / E0782.
Names: a function argument named `a` or `b` with a reduction made invalid StableHLO (every
reduce region was `^bb0(%a, %b)`); an entry input named like a state was renamed silently in
ONNX while the metadata listed the state's path.
Shapes (issue 46 item 8): onnxruntime's `symbolic_shape_infer` (auto_merge=False) stopped on
the dynamic prefill ("Incomplete symbolic shape inference": rms_norm's body reshaped its mean
to a computed [B*L, 1], which shape inference inside a function cannot follow), and on the
decode it gave the logits a made-up dim instead of B.
Portable StableHLO (issue 46 item 7): no way to ask for one; the text's chlo.erf is refused by
StableHLO's serializer at every version. Now `--portable [VERSION]` writes the artifact, and
a version jaxlib does not write (E0946) or no `-o` (E0947) is refused before anything is
written.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("jax")

from export_cases import LLAMA, llama_graphs, llama_params, toy_config  # noqa: E402
from linnet.lang import LinnetError, Program, lower  # noqa: E402
from linnet.lang.cli import main  # noqa: E402
from linnet.lang.emit import onnx as onnx_emit  # noqa: E402
from linnet.lang.emit import stablehlo  # noqa: E402
from linnet.lang.export import export_onnx, export_stablehlo  # noqa: E402
from linnet.lang.export_checks import check_outputs, description_of  # noqa: E402
from reference import run_graph  # noqa: E402

TOY = ["--config", "toy", "--set", "B=1"]


def code(fn, *args) -> str:
    with pytest.raises(LinnetError) as err:
        fn(*args)
    return err.value.diagnostics[0].code


@pytest.fixture(scope="module")
def toy():
    _, prefill, decode = llama_graphs()
    return prefill, decode, llama_params(prefill)


@pytest.fixture(scope="module")
def decode_onnx(toy):
    _, decode, params = toy
    model = onnx_emit.emit_onnx(decode, params)
    onnx_emit.check(model)
    sess = ort.InferenceSession(
        onnx_emit.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return decode, sess


def _feeds(graph, token: int, pos: int) -> dict:
    return {
        "token": np.array([token], np.int32),
        "pos": np.array([pos], np.int32),
        **{p: np.zeros(v.shape, np.float32) for p, v in graph.states.items()},
    }


# ---------------------------------------------------------------- shapes: refused at export
@pytest.mark.parametrize("command", ["stablehlo", "onnx"])
def test_the_cli_refuses_a_prompt_longer_than_the_cache_E0782(command, tmp_path, capsys):
    out = tmp_path / f"prefill.{command}"
    rc = main(
        [command, str(LLAMA), "--entry", "prefill", *TOY, "--input", "tokens=1,129", "-o", str(out)]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "E0782" in err and "[1, 129]" in err and "holds 128" in err
    assert not out.exists()


def test_the_python_exporters_refuse_it_too_E0782(tmp_path):
    long = lower(
        Program.from_file(LLAMA), "prefill", {"tokens": [1, 129]}, toy_config(), check=False
    )
    assert code(export_stablehlo, long, tmp_path / "p.mlir") == "E0782"
    assert code(export_onnx, long, None, tmp_path / "p.onnx") == "E0782"
    assert not (tmp_path / "p.mlir").exists() and not (tmp_path / "p.onnx").exists()


# ---------------------------------------------------------------- values: the flag
@pytest.mark.parametrize(
    "token,pos,valid",
    [
        (5, 0, True),
        (255, 127, True),
        (-1, 0, False),
        (256, 0, False),
        (5, -1, False),
        (5, 128, False),
        (-(2**31), 0, False),
    ],
)
def test_onnx_decode_flags_what_the_runtimes_refuse(decode_onnx, token, pos, valid):
    graph, sess = decode_onnx
    feeds = _feeds(graph, token, pos)
    outs = sess.run(None, feeds)
    assert [o.name for o in sess.get_outputs()][-1] == "linnet.valid"
    assert bool(outs[-1]) is valid
    if valid:
        check_outputs(sess, feeds, outs)
        return
    with pytest.raises(LinnetError) as err:
        check_outputs(sess, feeds, outs)
    d = err.value.diagnostics[0]
    name = "token" if token != 5 else "pos"
    assert (
        d.code == "E0780"
        and f"input `{name}` of `decode` has {token if name == 'token' else pos}" in d.message
    )


def test_a_negative_token_no_longer_reads_the_last_row(decode_onnx, toy):
    """-1 gave token 255's logits: now the flag is false whatever the logits are."""
    graph, sess = decode_onnx
    last = sess.run(None, _feeds(graph, 255, 0))
    wrapped = sess.run(None, _feeds(graph, -1, 0))
    assert last[-1] and not wrapped[-1]
    assert not np.allclose(last[0], wrapped[0])


def test_stablehlo_decode_flags_what_the_runtimes_refuse(toy):
    _, decode, params = toy
    text = stablehlo.emit_stablehlo(decode)
    stablehlo.verify(text)
    run = stablehlo.compile_cpu(text)
    for token, pos, valid in [(5, 3, True), (-1, 0, False), (5, 128, False), (5, -1, False)]:
        feeds = _feeds(decode, token, pos)
        named = {**feeds, **params}
        outs = run(*(named[a] for a in stablehlo.argument_order(decode)))
        assert len(outs) == 2 + len(decode.states) and bool(outs[-1]) is valid
        if not valid:
            assert code(check_outputs, text, feeds, outs) == "E0780"


def test_a_symbolic_prefill_flags_a_prompt_longer_than_the_cache(tmp_path):
    out = tmp_path / "prefill.onnx"
    assert (
        main(
            [
                "onnx",
                str(LLAMA),
                "--entry",
                "prefill",
                *TOY,
                "--input",
                "tokens=1,8",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    rest = {
        i.name: (0.1 * rng.standard_normal([1 if d == "B" else d for d in i.shape])).astype(
            np.float32
        )
        for i in sess.get_inputs()[1:]
    }
    for length, valid in [(8, True), (128, True), (129, False)]:
        feeds = {"tokens": np.full((1, length), 3, np.int32), **rest}
        outs = sess.run(None, feeds)
        assert bool(outs[-1]) is valid, length
        if not valid:
            assert code(check_outputs, str(out), feeds, outs) == "E0782"
    # A token id out of range is named as the runtimes name it, whatever the length.
    feeds = {"tokens": np.array([[1, 2, 300]], np.int32), **rest}
    with pytest.raises(LinnetError) as err:
        check_outputs(str(out), feeds, sess.run(None, feeds))
    assert "has 300 at index [0, 2]" in err.value.diagnostics[0].message


def test_a_graph_without_indices_is_always_valid():
    prog = Program.from_text("""
model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }""")
    g = lower(prog, "run", {"x": [3]}, {"N": 3})
    text = stablehlo.emit_stablehlo(g)
    got, valid = stablehlo.compile_cpu(text)(np.ones(3, np.float32))
    assert valid and description_of(text)["inputs"] == [] and got.tolist() == [2.0] * 3


def test_check_outputs_needs_the_flag_and_the_description_E0945(decode_onnx):
    graph, sess = decode_onnx
    feeds = _feeds(graph, -1, 0)
    outs = sess.run(None, feeds)
    assert code(check_outputs, sess, feeds, outs[:-1]) == "E0945"  # the flag left out
    assert code(check_outputs, sess, feeds, []) == "E0945"
    assert code(check_outputs, "module @m {\n}\n", feeds, outs) == "E0945"  # no description


# ---------------------------------------------------------------- names the exporters use
NAMES = ["a", "b", "lhs", "rhs", "old", "new", "r", "c", "v", "main", "new_2", "iota"]


def test_arguments_named_like_the_exporters_own_names_export_and_run():
    """Issue 46 item 1's class: reduce and scatter regions, and every other name an exporter
    makes itself, never collide with a function's or an entry's argument."""
    decl = ", ".join(f"{n}: Tensor[N; f32]" for n in NAMES)
    total = " + ".join(f"{n}[i]" for n in NAMES)
    prog = Program.from_text(f"""
use std.nn.norm::{{layer_norm}}
model M<N: Dim> {{
    state s: Tensor[N; f32]
    entry run({decl}, pos: Tensor[1; i32], x: Tensor[2, N; f32]) -> Tensor[2, N; f32] {{
        self.s[pos[0]] = a[0]
        let m = max[i] ({total})
        let y[k, i] = x[k, i] + {total} + m + self.s[i]
        let z = layer_norm(y, a, b, 1e-5)
        return z
    }}
}}""")
    g = lower(
        prog, "run", {**{n: [4] for n in NAMES}, "pos": [1], "x": [2, 4]}, {"N": 4}, check=False
    )
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal(4).astype(np.float32) for n in NAMES}
    inputs["x"] = rng.standard_normal((2, 4)).astype(np.float32)
    inputs["pos"] = np.array([2], np.int32)
    states = {"s": np.zeros(4, np.float32)}
    after = {"s": states["s"].copy()}
    (want,) = run_graph(g, inputs, {}, after)
    text = stablehlo.emit_stablehlo(g)
    stablehlo.verify(text)
    got = stablehlo.compile_cpu(text)(
        *(inputs.get(a, states.get(a)) for a in stablehlo.argument_order(g))
    )
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], after["s"])  # the state after the write
    assert len(got) == 3 and got[2]
    model = onnx_emit.emit_onnx(g)
    onnx_emit.check(model)
    sess = ort.InferenceSession(
        onnx_emit.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = sess.run(None, {**inputs, **states})
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    assert got[-1]


def test_an_onnx_input_named_like_a_state_is_E0944():
    prog = Program.from_text("""
model M<N: Dim> {
    state s: Tensor[N; f32]
    entry run(s: Tensor[N; f32]) -> Tensor[N; f32] {
        self.s[0] = s[0]
        let z[i] = s[i] + self.s[i]
        return z
    }
}""")
    g = lower(prog, "run", {"s": [3]}, {"N": 3})
    with pytest.raises(LinnetError) as err:
        onnx_emit.emit_onnx(g)
    d = err.value.diagnostics[0]
    assert d.code == "E0944" and "state `s`" in d.message and "rename" in d.help
    stablehlo.verify(stablehlo.emit_stablehlo(g))  # StableHLO's arguments are positional


# ---------------------------------------------------------------- symbolic shape inference
WINDOW = """
use std.nn.attention::{window_attention}
model M<B: Dim, L: Dim> {
    entry prefill(q: Tensor[B, L, 2, 2, 8; f32], k: Tensor[B, L, 2, 8; f32],
                  v: Tensor[B, L, 2, 8; f32]) -> Tensor[B, L, 2, 2, 8; f32] {
        return window_attention(q, k, v, 0.5, 3)
    }
}
"""


def _symbolic_model(program, entry: str, inputs: dict, config: dict, dynamic):
    from linnet.lang.export import symbolic_graph

    def lower_at(i, c):
        return lower(program, entry, i, c, check=False)

    sym = symbolic_graph(lower_at(inputs, config), program, inputs, config, lower_at, dynamic)
    return sym, onnx_emit.to_proto(onnx_emit.emit_onnx(sym))


@pytest.mark.parametrize("case", ["prefill", "decode", "window"])
def test_onnxruntime_symbolic_shape_inference_completes_without_merging(
    case, tmp_path, monkeypatch
):
    """Every output's and every intermediate's dims come out in terms of the input dims
    (`B`, `L`, `B*L`), with auto_merge=False: no dim made up for a function's result."""
    import re

    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    monkeypatch.chdir(tmp_path)  # it saves sym_shape_infer_temp.onnx where it stops
    if case == "window":  # an iota of length L inside the function's body
        sym, proto = _symbolic_model(
            Program.from_text(WINDOW, "window"),
            "prefill",
            {"q": [1, 6, 2, 2, 8], "k": [1, 6, 2, 8], "v": [1, 6, 2, 8]},
            {},
            "B,L",
        )
        want = [["B", "L", 2, 2, 8], []]
    else:
        inputs = {"tokens": [1, 6]} if case == "prefill" else {"token": [1], "pos": [1]}
        sym, proto = _symbolic_model(Program.from_file(LLAMA), case, inputs, toy_config(), None)
        cache = ["B", 128, 2, 16]
        want = [["B", "L", 256] if case == "prefill" else ["B", 256], *[cache] * 4, []]
    out = SymbolicShapeInference.infer_shapes(proto, auto_merge=False)
    got = [
        [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in out.graph.output
    ]
    assert got == want
    names = set(sym.symbolic)
    made_up = {
        (vi.name, d.dim_param)
        for vi in out.graph.value_info
        for d in vi.type.tensor_type.shape.dim
        if d.dim_param and set(re.findall(r"[A-Za-z_][\w.]*", d.dim_param)) - names
    }
    assert not made_up


# ---------------------------------------------------------------- portable StableHLO
GELU_SOURCE = """
use std.nn.activation::{gelu}
model M<N: Dim, D: Dim> {
    entry run(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] { return gelu(x) }
}
"""


@pytest.mark.parametrize(
    "version,what",
    [
        ("0.8.0", "writes versions"),
        ("99.0.0", "writes versions"),
        ("1.x", "is no StableHLO version"),
        ("", "is no StableHLO version"),
    ],
)
def test_a_portable_version_jaxlib_does_not_write_is_E0946(version, what, tmp_path):
    from linnet.lang.export import portable_stablehlo

    graph = lower(Program.from_text(GELU_SOURCE), "run", {"x": [2, 3]}, {})
    out = tmp_path / "m.mlirbc"
    with pytest.raises(LinnetError) as err:
        export_stablehlo(graph, out, portable=version)
    d = err.value.diagnostics[0]
    assert d.code == "E0946" and what in d.message and not out.exists()
    if version != "":
        assert code(portable_stablehlo, graph, version) == "E0946"


def test_the_cli_writes_a_portable_artifact_only_to_a_file(tmp_path, capsys):
    from linnet.lang.emit import stablehlo_portable

    src = tmp_path / "gelu.linnet"
    src.write_text(GELU_SOURCE)
    out = tmp_path / "gelu.mlirbc"
    base = [
        "stablehlo",
        str(src),
        "--entry",
        "run",
        "--set",
        "N=2",
        "--set",
        "D=3",
        "--input",
        "x=2,3",
    ]
    assert main([*base, "--portable"]) == 1  # binary: never to the terminal
    err = capsys.readouterr()
    assert "E0947" in err.err and "-o" in err.err and not err.out
    assert main([*base, "--portable", "--verify", "-o", str(out)]) == 0
    oldest = stablehlo_portable.version_text(stablehlo_portable.supported()[0])
    assert f"version {oldest}" in capsys.readouterr().err  # 0.9.0 with jax 0.10.2
    text = stablehlo_portable.deserialize(out.read_bytes())
    assert "stablehlo.composite" not in text and "chlo" not in text
    assert main([*base, "--portable", "1.0.0", "-o", str(out)]) == 0
    assert "version 1.0.0" in capsys.readouterr().err
    before = out.read_bytes()
    assert "stablehlo.composite" in stablehlo_portable.deserialize(before)
    assert main([*base, "--portable", "0.1.0", "-o", str(out)]) == 1
    assert "E0946" in capsys.readouterr().err
    assert out.read_bytes() == before  # the refused export left the old file as it was
