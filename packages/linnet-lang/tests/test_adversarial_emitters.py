"""Adversarial: the Python emitters' shared base (emit/python_emitter.py, emit/python_rules.py;
issue 39 item 6). A fault of one emitter is reported as that emitter's: its name and the help
that says what runs the model meanwhile, never the other emitter's."""

from __future__ import annotations

import pytest
from linnet.lang import LinnetError, Program, lower
from linnet.lang.emit import jax as jax_emit
from linnet.lang.emit import torch as torch_emit

SOURCE = "model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }\n"
EMITTERS = {
    "torch": (torch_emit, "PyTorch", "`linnet run`"),
    "jax": (jax_emit, "JAX", "`linnet jax --no-fast`"),
}


@pytest.mark.parametrize("bad", ["{} = = 1", "{} = 1; z = 2", "{} = (0).clamp(0, 1)"])
@pytest.mark.parametrize("name", sorted(EMITTERS))
def test_a_broken_rule_is_E0910_of_its_own_emitter(monkeypatch, name, bad):
    """A rule that writes invalid Python (a syntax error, two statements, a method of a
    literal) is E0910 naming the step; the JAX emitter's said "the PyTorch emitter" and gave
    the PyTorch emitter's help (`linnet run`, which does not run a JAX model)."""
    module, framework, meanwhile = EMITTERS[name]
    monkeypatch.setitem(module.RULES, "mul", lambda s, n, nu: [bad.format(n(s.results[0]))])
    graph = lower(Program.from_text(SOURCE), "run", {"x": [3]})
    emit = torch_emit.emit_torch if name == "torch" else jax_emit.emit_jax
    with pytest.raises(LinnetError) as err:
        emit(graph)
    d = err.value.diagnostics[0]
    assert d.code == "E0910" and "`mul`" in d.message, d
    assert f"the {framework} emitter" in d.message, d.message
    assert meanwhile in d.help, d.help
