"""`greedy_next`, generate's captured greedy pick (issue 41): the Triton kernel (under its
interpreter here, the conftest sets TRITON_INTERPRET=1) equals the PyTorch reference, which
equals `pick`'s greedy choice; and `Captured`'s `then`/`again` on CUDA."""

from __future__ import annotations

import pytest
import torch
from linnet.torch.generate import pick
from linnet.torch.greedy import BLOCK, greedy_next, greedy_next_reference


def cases():
    g = torch.Generator().manual_seed(0)
    for vocabulary in (1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.randn(6, vocabulary, generator=g).to(dtype)
            if vocabulary > 1:
                # Row 1: the largest logit twice, in different lanes and blocks: the lowest wins.
                x[1] = x[1].clamp_max(1.0)
                x[1, vocabulary - 1] = x[1, vocabulary // 2] = 4.0
                # Row 2: every logit equal: id 0, as torch.argmax.
                x[2] = 0.5
            x[3, vocabulary // 3] = float("nan")
            x[4, vocabulary - 1] = float("inf")
            x[5, 0] = float("-inf")
            yield vocabulary, dtype, x


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    """Triton's interpreter on the CPU (the conftest imported Triton in its mode)."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("vocabulary,dtype,x", list(cases()), ids=lambda v: str(v)[:20])
def test_the_kernel_equals_the_reference_and_pick(vocabulary, dtype, x):
    from linnet.torch import greedy

    assert greedy._triton_runs(x)  # the kernel runs here, not the reference again
    feed = torch.full((x.shape[0],), 99, dtype=torch.int32)
    pos = torch.arange(x.shape[0], dtype=torch.int32) * 7
    want_feed, want_pos = feed.clone(), pos.clone()
    want = greedy_next_reference(x, want_feed, want_pos)
    got = greedy_next(x, feed, pos)
    assert got.dtype == torch.int64
    assert got.tolist() == want.tolist() == pick(x).tolist()
    assert feed.tolist() == want_feed.tolist() == want.clamp_min(0).tolist()
    assert pos.tolist() == want_pos.tolist() == [7 * b + 1 for b in range(x.shape[0])]
    assert got[3:].tolist() == [-1, -1, -1]  # NaN, +inf, -inf: not finite


def test_rows_with_a_stride_and_an_out_buffer():
    from linnet.torch import greedy

    """A view of every other row (row stride 2V) and int64 feed/pos, written into ``out``."""
    base = torch.randn(8, 300, generator=torch.Generator().manual_seed(1))
    x = base[::2]
    assert greedy._triton_runs(x)
    out = torch.full((4,), 5, dtype=torch.int64)
    feed, pos = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    assert greedy_next(x, feed, pos, out=out) is out
    assert out.tolist() == x.argmax(-1).tolist() == feed.tolist()
    assert pos.tolist() == [1, 1, 1, 1]


@pytest.mark.gpu
def test_captured_then_and_again_on_cuda():
    """A decode plan captured with greedy_next after it: `again` replays on the token and
    position the graph wrote, giving the eager argmax chain; E0766 before a first call."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from linnet.lang import LinnetError
    from linnet.torch import load, random_weights
    from linnet.torch.plans import Captured
    from support import LLAMA, toy_config

    weights = random_weights(LLAMA, toy_config(), seed=4)
    model = load(LLAMA, weights=weights, config=toy_config(), device="cuda")
    one = torch.ones(1, dtype=torch.int32)
    plan = model.plan_for("decode", [one, one], backends=[], measure=False, progress=False)
    context = model.context_for(plan)

    def then(inputs, outputs):
        return [greedy_next(outputs[0], inputs[0], inputs[1])]

    step = Captured(plan, context, then=then)
    with pytest.raises(LinnetError) as err:
        step.again()
    assert err.value.diagnostics[0].code == "E0766"
    eager = model.new_context("decode", [one, one])
    token, got, want = 3, [], []
    for pos in range(6):
        want.append(
            int(
                model.decode(
                    torch.tensor([token], dtype=torch.int32),
                    torch.tensor([pos], dtype=torch.int32),
                    context=eager,
                ).argmax(-1)
            )
        )
        token = want[-1]
    got.append(
        int(step([torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)])[0])
    )
    for pos in range(1, 6):
        got.append(int(step.again([None, torch.tensor([pos], dtype=torch.int32)])[0]))
    assert got == want
    assert int(step.static_inputs[1]) == 6
    with pytest.raises(LinnetError) as err:  # known names the inputs in order: [None, pos]
        step.again([torch.tensor([6], dtype=torch.int32)])
    assert err.value.diagnostics[0].code == "E0720"


@pytest.mark.parametrize("failure", ["plan", "capture"])
def test_a_prefill_that_cannot_be_captured_runs_call_by_call(failure, monkeypatch):
    """fast_generate.prefill_logits (here on a model with `prefill` only: the logits are
    kept to each row's last prompt position): where a bucket's prefill cannot be planned or captured
    (a coded error; E0753 for the capture), it runs the entry call by call, gives the same
    logits, and does not try that bucket again; another error reaches the caller."""
    from linnet.lang import LinnetError
    from linnet.lang.diagnostics.core import coded_error
    from linnet.torch import fast_generate, load, random_weights
    from linnet.torch.prefill import first_logits
    from support import LLAMA, toy_config

    model = load(LLAMA, weights=random_weights(LLAMA, toy_config(), seed=4), config=toy_config())
    tokens = torch.tensor([[5, 6, 7, 7]], dtype=torch.int32)
    calls = []

    class Refused:
        def __init__(self, plan, context):
            calls.append("captured")

        def __call__(self, inputs):
            calls.append("replay")
            raise coded_error("E0753", "the plan could not be captured as a CUDA graph: x")

    def plan_for(*args, **kwargs):
        calls.append("plan")
        if failure == "plan":
            raise coded_error("E0754", "cannot run here")
        return object()

    monkeypatch.setattr(fast_generate, "Captured", Refused)
    monkeypatch.setattr(model, "plan_for", plan_for)
    fast = fast_generate.FastStep(None, model.new_context("prefill", [tokens]), None)
    want = first_logits(
        model,
        "prefill",
        tokens,
        [3],
        model.new_context("prefill", [tokens]),
    )
    for _ in range(2):
        got = fast_generate.prefill_logits(model, fast, "prefill", tokens, [3])
        assert torch.equal(got, want)
    assert fast.prefills == {("prefill", 4): None}
    assert calls == (["plan"] if failure == "plan" else ["plan", "captured", "replay"])

    class Broken(Refused):
        def __call__(self, inputs):
            raise coded_error("E0757", "a backend failed")

    monkeypatch.setattr(fast_generate, "Captured", Broken)
    fast.prefills.clear()
    if failure == "capture":
        with pytest.raises(LinnetError) as err:
            fast_generate.prefill_logits(model, fast, "prefill", tokens, [3])
        assert err.value.diagnostics[0].code == "E0757"
