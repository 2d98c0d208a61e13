"""Adversarial inputs of the paged KV cache (issue 44 item 1): every bad table entry,
position, chunk or load argument is a coded error before anything runs, never a traceback
or a read of another sequence's page; padded rows write only their own or the sink page."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from linnet.lang import LinnetError  # noqa: E402
from linnet.torch import load  # noqa: E402
from test_paged import MP, NP, PS, S, checkpoints, i32  # noqa: E402, F401

ROW = [3] + [0] * (MP - 1)


@pytest.fixture(scope="module")
def paged(checkpoints):  # noqa: F811
    return load(weights=checkpoints["llama"], kv_pages=NP, kv_page_size=PS)


def _code(call) -> str:
    with pytest.raises(LinnetError) as e:
        call()
    return e.value.diagnostics[0].code


@pytest.mark.parametrize(
    "case,code",
    [
        ("decode table >= NP", "E0780"),
        ("decode table < 0", "E0780"),
        ("prefill table >= NP", "E0780"),
        ("prefill table < 0", "E0780"),
        ("decode pos >= S", "E0780"),
        ("decode pos < 0", "E0780"),
        ("prefill n > L", "E0780"),
        ("prefill n = 0", "E0780"),
        ("prefill start < 0", "E0780"),
        ("prefill start + n > S", "E0690"),
        ("table of the wrong width", "E0607"),
        ("dense decode on a paged model", "E0340"),
    ],
)
def test_bad_paged_inputs_are_coded_errors(paged, case, code):
    tokens = i32([[5, 6, 7, 0]])
    calls = {
        "decode table >= NP": lambda: paged.decode_paged(i32([1]), i32([2]), i32([[NP, *ROW[1:]]])),
        "decode table < 0": lambda: paged.decode_paged(i32([1]), i32([2]), i32([[-1, *ROW[1:]]])),
        "prefill table >= NP": lambda: paged.prefill_paged(
            tokens, i32([0]), i32([3]), i32([[NP + 5, *ROW[1:]]])
        ),
        # A padding column's page (past n) is the sink page: the table is still checked.
        "prefill table < 0": lambda: paged.prefill_paged(
            tokens, i32([0]), i32([3]), i32([[*ROW[:2], -1, *ROW[3:]]])
        ),
        "decode pos >= S": lambda: paged.decode_paged(i32([1]), i32([S]), i32([ROW])),
        "decode pos < 0": lambda: paged.decode_paged(i32([1]), i32([-1]), i32([ROW])),
        "prefill n > L": lambda: paged.prefill_paged(tokens, i32([0]), i32([5]), i32([ROW])),
        "prefill n = 0": lambda: paged.prefill_paged(tokens, i32([0]), i32([0]), i32([ROW])),
        "prefill start < 0": lambda: paged.prefill_paged(tokens, i32([-1]), i32([3]), i32([ROW])),
        "prefill start + n > S": lambda: paged.prefill_paged(
            tokens, i32([S - 2]), i32([3]), i32([ROW])
        ),
        "table of the wrong width": lambda: paged.decode_paged(i32([1]), i32([2]), i32([ROW[:3]])),
        "dense decode on a paged model": lambda: paged.decode(i32([1]), i32([2])),
    }
    assert _code(calls[case]) == code


@pytest.mark.parametrize(
    "kwargs,code",
    [
        (dict(kv_pages=1), "E0688"),
        (dict(kv_pages=0), "E0688"),
        (dict(kv_pages=True), "E0688"),
        (dict(kv_pages=8.0), "E0688"),
        (dict(kv_pages=8, kv_page_size=0), "E0688"),
        (dict(kv_page_size=16), "E0688"),
        (dict(kv_pages=8, config={"kv_pages": 16}), "E0688"),
    ],
)
def test_bad_load_arguments(checkpoints, kwargs, code):  # noqa: F811
    assert _code(lambda: load(weights=checkpoints["llama"], **kwargs)) == code


def test_model_without_pages_is_refused(tmp_path):
    src = tmp_path / "m.linnet"
    src.write_text(
        "pub model M<D: Dim> {\n    param w: Tensor[D; f32]\n"
        "    entry run(x: Tensor[D; f32]) -> Tensor[D; f32] {\n"
        "        let y[d] = x[d] * self.w[d]\n        return y\n    }\n}\n"
    )
    weights = {"w": torch.ones(4)}
    assert _code(lambda: load(src, weights=weights, kv_pages=8)) == "E0689"


def test_padding_writes_only_own_or_sink_pages(paged):
    """A chunk whose padding runs past S (start 26, n 2, L 8: padding positions 28..33)
    writes its real tokens to its own pages and its padding to the sink page: every other
    page, another sequence's, is unchanged."""
    ctx = paged.new_context("prefill_paged", [i32([[1] * 8]), i32([0]), i32([2]), i32([ROW])])
    for state in ctx.states.values():
        state.normal_()
    before = {k: v.clone() for k, v in ctx.states.items()}
    own = [0] * MP
    own[26 // PS] = 5  # positions 24..27: page 5
    own[27 // PS] = 5
    paged.run(
        "prefill_paged",
        [i32([[9, 8, 7, 6, 5, 4, 3, 2]]), i32([26]), i32([2]), i32([own])],
        context=ctx,
    )
    for path, state in ctx.states.items():
        changed = (state != before[path]).flatten(1).any(1).nonzero().flatten().tolist()
        assert set(changed) <= {0, 5}, (path, changed)
        # The real tokens' slots (26 % PS, 27 % PS of page 5) were written.
        assert (state[5, 26 % PS] != before[path][5, 26 % PS]).any()
