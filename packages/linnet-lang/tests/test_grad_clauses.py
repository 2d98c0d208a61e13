"""Grad clauses win (issue 18): an op with a `grad` clause is differentiated by its clause,
lowered once per call, and an op bound to a kernel runs its body forward with its clause as
the backward. Each test gives a deliberately different clause (a gradient scaled by 10, or
made up) and sees it in the result."""

from __future__ import annotations

import numpy as np
import pytest
from linnet.lang import LinnetError, Program
from linnet.lang.grad import lower_grad
from test_properties import SOFTMAX_SPEC

torch = pytest.importorskip("torch")

SCALE = """
pub op scale<N: Dim>(x: Tensor[N; f32], w: Tensor[N; f32], s: f32) -> Tensor[N; f32] {
    let y[n] = x[n] * w[n] * s
    return y
} grad(dy) {
    let dx[n] = dy[n] * w[n] * s * 10.0
    let dw[n] = dy[n] * x[n] * s
    return dx, dw
}
"""


def run(graph, *inputs, params=None):
    from linnet.torch.interpreter import run_graph

    return run_graph(
        graph, [torch.tensor(np.asarray(x), dtype=torch.float32) for x in inputs], params or {}, {}
    )


def test_a_clause_is_used_instead_of_the_body():
    prog = Program.from_text(
        SCALE
        + """
model M { entry run(x: Tensor[3; f32], w: Tensor[3; f32]) -> f32 {
    let y = scale(x, w, 2.0)
    let s = sum[i](y[i])
    return s } }"""
    )
    x, w = [1.0, 2.0, 3.0], [0.5, -1.0, 4.0]
    shapes = {"x": [3], "w": [3]}
    clause = lower_grad(prog, "run", shapes, wrt=["x", "w"])
    body = lower_grad(prog, "run", shapes, wrt=["x", "w"], clauses=False)
    s, dx, dw = run(clause, x, w)
    s2, dx2, dw2 = run(body, x, w)
    assert float(s) == float(s2) == 2.0 * sum(a * b for a, b in zip(x, w))
    torch.testing.assert_close(dx2, 2.0 * torch.tensor(w))  # the body's: d/dx = w * s
    torch.testing.assert_close(dx, 10.0 * dx2)  # the clause's, deliberately 10 times that
    torch.testing.assert_close(dw, dw2)
    calls = [c for c in clause.calls if c.attributes.get("grad")]
    assert [c.callee for c in calls] == ["main::scale.grad"]
    assert calls[0].attributes["args"] == ["%x", "%w", 2.0]


def test_the_clause_is_lowered_once_per_call_in_every_layer():
    prog = Program.from_text(
        SCALE
        + """
block L<N: Dim> {
    param w: Tensor[N; f32]
    fn forward(x: Tensor[N; f32]) -> Tensor[N; f32] { return scale(x, self.w, 1.0) }
}
model M<N: Dim> {
    block layers: [L<N>; 4]
    entry run(x: Tensor[N; f32]) -> f32 {
        let h = x
        for layer in self.layers { h = layer(h) }
        let s = sum[i](h[i])
        return s
    }
}"""
    )
    g = lower_grad(prog, "run", {"x": [2]}, {"N": 2}, wrt=["x"])
    assert len([c for c in g.calls if c.callee == "main::scale.grad"]) == 4
    # and each layer's backward is a call of its own, as its forward is (one slice each)
    layers = [c for c in g.calls if c.callee == "main::L.forward.grad"]
    assert sorted(c.iteration for c in layers) == [0, 1, 2, 3]
    params = {f"layers.{i}.w": torch.ones(2) for i in range(4)}
    _, dx = run(g, [1.0, 1.0], params=params)
    torch.testing.assert_close(dx, torch.full((2,), 10.0**4))  # 10x per layer


def test_a_kernel_op_runs_its_body_forward_and_its_clause_backward():
    spec = SOFTMAX_SPEC.replace(
        "    return y\n}\n",
        "    return y\n} grad(dy) {\n    let dx[r, c] = dy[r, c] * 0.0 + 7.0\n    return dx\n}\n",
    )
    assert "grad(dy)" in spec
    prog = Program.from_text(
        spec
        + """
model M { entry run(x: Tensor[2, 3; f32]) -> f32 {
    let p = softmax(x)
    let s = sum[r, c](p[r, c] * p[r, c])
    return s } }"""
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    g = lower_grad(prog, "run", {"x": [2, 3]}, wrt=["x"])
    assert not any("kernel" in c.attributes for c in g.calls)  # the body runs, no launch
    s, dx = run(g, x)
    p = torch.softmax(torch.tensor(x), dim=1)
    torch.testing.assert_close(s, (p * p).sum())  # the body's value
    torch.testing.assert_close(dx, torch.full((2, 3), 7.0))  # the clause's gradient


def test_a_clause_returning_a_number_for_a_tensor_is_an_error():
    prog = Program.from_text("""
pub op f(x: Tensor[; f32]) -> Tensor[; f32] {
    return x * 2.0
} grad(dy) {
    return 1.0
}
model M { entry run(x: Tensor[; f32]) -> f32 { return f(x) } }""")
    with pytest.raises(LinnetError) as err:
        lower_grad(prog, "run", {"x": []}, wrt=["x"])
    assert err.value.diagnostics[0].code == "E0954"
