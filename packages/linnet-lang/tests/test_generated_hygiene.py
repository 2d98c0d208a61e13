"""The generated PyTorch is meant to be read (issue 13, item 5): every function takes only
what its body reads, no line is over 100 characters, values the source never named are
named after their op, guards that cannot fire are left out, builtins are never shadowed,
and the emitter never returns (nor `linnet torch` writes) a module that does not compile."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from indexgen import index_programs, state_programs
from linnet.lang import LinnetError, Program, check_program, lower
from linnet.lang.cli import load_config, main
from linnet.lang.emit import torch as emit
from linnet.lang.emit.python import wrap
from linnet.lang.emit.python_rules import identifier
from linnet.lang.emit.torch import RULES, emit_torch
from test_properties import PROFILE, SCALE

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
TOY = load_config(str(ROOT / "examples" / "llama" / "configs" / "toy.json"), [])


def unused_arguments(text: str, convention: bool = False) -> dict[str, list[str]]:
    """Each function's arguments that its body never reads (by Python's own AST).
    ``convention``: an entry function's `params, states` are the runtime's calling
    convention (`module.run(x, params, states)`); a model without states does not read
    `states`, and that one is allowed, and so is an entry input the model never reads, which
    the entry declares (the runtime passes it) and the emitter names `_x`."""
    found = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef):
            read = {
                n.id
                for n in ast.walk(node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            args = [a.arg for a in node.args.args]
            if convention and args[-2:] == ["params", "states"]:
                args = args[:-2]
            dead = [
                a
                for a in args
                if a not in read
                and not (convention and a.startswith("_") and node.name in entries(text))
            ]
            if dead:
                found[node.name] = dead
    return found


def entries(text: str) -> set[str]:
    ns: dict = {}
    exec(compile(text, "entries", "exec"), ns)
    return {e.get("function", k) for k, e in ns["ENTRIES"].items()}


def long_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 100]


def llama(entry: str, inputs: dict[str, list[int]], fast: bool = True) -> str:
    prog = Program.from_file(str(LLAMA))
    graph = lower(prog, entry, inputs, TOY, check=True)
    sources = {m.source.name: m.source.text for m in prog.modules.values()}
    return emit_torch(graph, sources, origin=str(LLAMA), fast=fast)


SMALL = {
    # Values named after Python builtins and keywords: `float('-inf')` of a masked softmax,
    # and every later call of a builtin, must still find the builtin.
    "builtins": (
        """
model M<N: Dim> {
    param w: Tensor[N; f32]
    entry run(float: Tensor[N; f32], len: Tensor[N; f32]) -> Tensor[N; f32] {
        let list = float * self.w
        let id = list + len
        let type = exp(id - 1.0)
        let print = type / (type + 1.0)
        return print
    }
}""",
        "run",
        {"float": [4], "len": [4]},
    ),
    # A constant index into a zero-bounds read: the index is known, no guard, no `.clamp`.
    "constant_index": (
        """
model M<B: Dim, H: Dim, D: Dim> {
    entry run(parts: Tensor[B, 2, H, D; f32]) -> Tensor[B, H, D; f32] {
        let first[b, h, d] = parts[b, 0, h, d]
        return first
    }
}""",
        "run",
        {"parts": [1, 2, 3, 4]},
    ),
    # A shifted read (rope's rotate-half) and a constant shared by two uses.
    "shift": (
        """
model M<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[i: N] = x[i + 1] * 0.5
        let z[i] = y[i] + x[i] * 0.5
        return z
    }
}""",
        "run",
        {"x": [6]},
    ),
}


def small(name: str) -> str:
    text, entry, inputs = SMALL[name]
    return emit_torch(lower(Program.from_text(text), entry, inputs))


CASES = [
    ("llama decode", lambda: llama("decode", {"token": [1], "pos": [1]})),
    ("llama prefill", lambda: llama("prefill", {"tokens": [1, 8]})),
    (
        "llama decode, no fused calls",
        lambda: llama("decode", {"token": [2], "pos": [2]}, fast=False),
    ),
    ("llama prefill, no fused calls", lambda: llama("prefill", {"tokens": [2, 8]}, fast=False)),
] + [(name, (lambda n=name: small(n))) for name in SMALL]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_no_dead_argument_and_no_long_line(name: str, make) -> None:
    text = make()
    compile(text, name, "exec")
    assert unused_arguments(text, convention=not name.startswith("llama")) == {}
    assert long_lines(text) == []


def test_decode_layer_reads_every_input_and_glue_returns_no_constant() -> None:
    text = llama("decode", {"token": [1], "pos": [1]})
    tree = ast.parse(text)
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    glue = fns["glue_0"]
    ret = glue.body[-1]
    assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple)
    # Constants known when lowering (eps, the softmax scale, -inf) are literals where they
    # are used, never values returned by one slice and passed to the next.
    assert not any(
        isinstance(e, ast.Constant)
        or (isinstance(e, ast.Call) and getattr(e.func, "id", "") == "float")
        for e in ret.value.elts
    )
    layer = fns["decoder_layer_decode"]
    assert len(layer.args.args) == 6 + 9 + 2  # h, 3 rope tables, batch index, pos; 9 weights
    # No numbered names from the whole graph (`t_37`): anonymous values are named by op.
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not [n for n in names if re.fullmatch(r"t_\d+", n)]
    assert {"neg_1", "mul_1"} <= names
    # Rope's hoisted tables point at the layer line that reads them, not at the entry call.
    assert "# llama.linnet:72  let q_rot = rope_with(q_heads, pos, inv_freq)" in text
    assert "self.model.decode(token, pos" not in text
    # The frequency table's index is `iota % 8`: always within its 8 rows, no guard.
    assert ".clamp(0, 7)" not in text and "torch.where(((" not in text


def test_builtin_names_are_not_shadowed() -> None:
    import torch

    text = small("builtins")
    ns: dict = {}
    exec(compile(text, "builtins", "exec"), ns)
    x = torch.tensor([1.0, -2.0, 3.0, 0.5])
    n = torch.tensor([0.5, 0.5, -1.0, 2.0])
    w = torch.tensor([2.0, 1.0, 0.5, -1.0])
    (got,) = ns["run"](x, n, {"w": w}, {})
    e = torch.exp(x * w + n - 1.0)
    torch.testing.assert_close(got, e / (e + 1.0))
    for name in ("float", "len", "list", "id", "type", "print"):
        assert re.search(rf"\b{name} =", text) is None
    assert identifier("%match") == "v_match" and identifier("%class") == "v_class"


def test_constant_index_has_no_clamp_and_runs() -> None:
    import torch

    text = small("constant_index")
    assert ".clamp" not in text
    ns: dict = {}
    exec(compile(text, "ci", "exec"), ns)
    parts = torch.arange(24.0).reshape(1, 2, 3, 4)
    torch.testing.assert_close(ns["run"](parts, {}, {})[0], parts[:, 0])


def test_wrap_keeps_the_statement() -> None:
    line = "    a, b = some_function(" + ", ".join(f"argument_{i}" for i in range(20)) + ")"
    lines = wrap(line)
    assert all(len(x) <= 100 for x in lines)
    assert ast.dump(ast.parse("\n".join(x[4:] for x in lines))) == ast.dump(ast.parse(line.strip()))


def test_wrap_keeps_a_returned_call_one_value() -> None:
    """A long `return f(...)(a, b)` stays one value (its commas are inside brackets), and a
    returned tuple stays a tuple (seen: a Pallas launcher with a long kernel name returned a
    1-tuple)."""
    call = "    return kernel_jvp(run_" + "x" * 80 + ", body, backward)(x, nw, w)"
    for line in (
        call,
        "    return " + ", ".join(f"value_{i}" for i in range(30)),
        "    return " + "y" * 90 + ",",
    ):
        lines = wrap(line)
        assert all(len(x) <= 100 for x in lines)
        got = ast.parse("def f():\n" + "\n".join(lines))
        want = ast.parse("def f():\n" + line)
        assert ast.dump(got) == ast.dump(want), "\n".join(lines)


def test_broken_rule_is_an_internal_error_naming_the_step(monkeypatch) -> None:
    monkeypatch.setitem(RULES, "mul", lambda s, n, nu: [f"{n(s.results[0])} = 0.clamp(0, 1)"])
    with pytest.raises(LinnetError) as err:
        small("shift")
    d = err.value.diagnostics[0]
    assert d.code == "E0910"
    assert "step" in d.message and "`mul`" in d.message and "0.clamp" in d.message


def test_method_on_a_literal_is_an_internal_error(monkeypatch) -> None:
    # `(0).clamp(0, 1)` compiles and fails on every run: caught when emitting.
    monkeypatch.setitem(RULES, "mul", lambda s, n, nu: [f"{n(s.results[0])} = (0).clamp(0, 1)"])
    with pytest.raises(LinnetError) as err:
        small("shift")
    assert err.value.diagnostics[0].code == "E0910"


def test_module_that_does_not_compile_is_an_internal_error(monkeypatch) -> None:
    # Each line parses alone, the module does not (a `return` outside a function).
    real = emit.TorchEmitter.entry_metadata
    monkeypatch.setattr(
        emit.TorchEmitter,
        "entry_metadata",
        lambda self, *a, **k: real(self, *a, **k) + "\nreturn 1",
    )
    with pytest.raises(LinnetError) as err:
        small("shift")
    assert err.value.diagnostics[0].code == "E0911"


def test_linnet_torch_writes_no_file_when_a_rule_is_broken(monkeypatch, tmp_path, capsys) -> None:
    model = tmp_path / "m.linnet"
    model.write_text(SMALL["shift"][0])
    out = tmp_path / "m.py"
    argv = ["torch", str(model), "--input", "x=6", "-o", str(out)]
    assert main(argv) == 0 and out.exists()
    out.unlink()
    monkeypatch.setitem(RULES, "mul", lambda s, n, nu: [f"{n(s.results[0])} = 0.clamp(0, 1)"])
    assert main(argv) != 0
    assert not out.exists()
    assert "E0910" in capsys.readouterr().err


def test_entry_named_like_a_builtin_runs_through_the_runtime(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from linnet.torch import load

    model = tmp_path / "m.linnet"
    model.write_text("""
model M<N: Dim> {
    entry input(float: Tensor[N; f32]) -> Tensor[N; f32] {
        let m = max[i] float[i]
        return exp(float - m)
    }
}""")
    prog = Program.from_file(str(model))
    text = emit_torch(lower(prog, "input", {"float": [3]}))
    assert "def v_input(v_float, params, states):" in text
    ns: dict = {}
    exec(compile(text, "m", "exec"), ns)
    assert ns["ENTRIES"]["input"]["function"] == "v_input"
    x = torch.tensor([1.0, 3.0, 2.0])
    got = load(str(model), weights={}, device="cpu").run("input", [x])
    torch.testing.assert_close(got, torch.exp(x - 3.0))


# Random index-notation programs (computed positions, shifts, reductions, casts): the
# generated module compiles, has no dead argument and no long line, and computes what NumPy
# says, so a guard left out as unable to fire really could not.
@settings(PROFILE, max_examples=60 * SCALE, deadline=None)
@given(index_programs())
def test_generated_index_programs_are_clean_and_right(case) -> None:
    import numpy as np
    import torch

    program = Program.from_text(case.source)
    if check_program(program):
        return  # checker limitations are test_properties' business, not the emitter's
    graph = lower(program, "run", case.inputs, case.config, check=False)
    text = emit_torch(graph)
    assert unused_arguments(text, convention=True) == {}, text
    assert long_lines(text) == [], text
    ns: dict = {}
    exec(compile(text, "case", "exec"), ns)
    args = [torch.from_numpy(np.asarray(case.data[v[1:]])) for v in graph.inputs]
    (out,) = ns["run"](*args, {}, {})
    expected = case.expected
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    # NumPy computes in f32 where torch rounds to a 16-bit float (`exp(x as bf16)`): the
    # tolerance of that type, for the emitter's output and the old one's alike.
    tol = 1e-2 if "f16" in case.source else 1e-4
    np.testing.assert_allclose(
        out.numpy(),
        expected,
        rtol=0 if case.exact else tol,
        atol=0 if case.exact else tol * scale,
        err_msg=text,
    )


# Entries that write a state once or twice and return it: the writes are effects, kept by
# the dead-step elimination though no value reads them.
@settings(PROFILE, max_examples=30 * SCALE, deadline=None)
@given(state_programs())
def test_generated_state_writes_are_clean_and_right(case) -> None:
    import numpy as np
    import torch

    program = Program.from_text(case.source)
    if check_program(program):
        return
    graph = lower(program, "run", case.inputs, case.config, check=False)
    text = emit_torch(graph)
    assert unused_arguments(text, convention=True) == {}, text
    assert long_lines(text) == [], text
    ns: dict = {}
    exec(compile(text, "case", "exec"), ns)
    args = [torch.from_numpy(np.asarray(case.data[v[1:]])) for v in graph.inputs]
    states = {"s": torch.from_numpy(case.state.copy())}
    (out,) = ns["run"](*args, {}, states)
    np.testing.assert_array_equal(out.numpy(), case.expected, err_msg=text)
    np.testing.assert_array_equal(states["s"].numpy(), case.expected, err_msg=text)
