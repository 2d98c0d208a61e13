"""Static slices in the PyTorch runtime: the interpreter and generated source agree with
NumPy-style slicing, and a slice of a state is a copy (a later write to the state does not
change it), in both."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from linnet.torch import load  # noqa: E402

SRC = """
pub model M<N: Dim, K: Dim> {
    param w: Tensor[3 * K, N; f32]
    state c: Tensor[2 * K, N; f32]

    entry run(x: Tensor[K, N; f32]) -> (Tensor[K, N; f32], Tensor[K, N; f32], Tensor[K, N; f32]) {
        let before = self.c[K.., ..]
        self.c[k, n] = x[k, n]
        self.c[k + K, n] = x[k, n] * 2.0
        let after = self.c[K.., :]
        let mid = self.w[K..2 * K, ..]
        return before, after, mid
    }
}
"""


@pytest.mark.parametrize("interpret", [True, False])
def test_slices_of_parameters_and_states(tmp_path, interpret):
    path = tmp_path / "m.linnet"
    path.write_text(SRC)
    w = torch.randn(9, 2)
    model = load(path, weights={"w": w}, config={"N": 2, "K": 3}, interpret=interpret)
    x = torch.randn(3, 2)
    before, after, mid = model.run("run", [x])
    assert torch.equal(before, torch.zeros(3, 2))  # read before the write: a copy, not a view
    torch.testing.assert_close(after, 2 * x)
    torch.testing.assert_close(mid, w[3:6])
    again, _, _ = model.run("run", [x])
    torch.testing.assert_close(again, 2 * x)  # the state kept the first call's write
