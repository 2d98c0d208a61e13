"""The kernel checker's holes (issue 14, item 1): each mistake in a tile kernel is a coded
diagnostic, and what the spec allows (its `row_softmax`, index notation naming a tile's own
axes, scalar and broadcast masks) still checks.

E0524 `load`'s other, E0525 mask shapes, E0526 slices and gathers of tiles, E0527 `prod`
over a tile, E0528 a result read outside `store`, E0529 a result never stored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError, check_text
from test_properties import SOFTMAX_SPEC as SPEC_SOFTMAX


def kernel(body: str, dtype: str = "f32") -> str:
    """A row kernel over ``x: Tensor[R, C; dtype]`` with ``row``, ``cols`` and ``mask`` in
    scope, bound to an op, around ``body`` (indented statements)."""
    return (
        f"kernel k<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; {dtype}]) -> "
        f"y: Tensor[R, C; {dtype}] grid(R)\nwhere B >= C {{\n"
        "    let row = program_id(0)\n    let cols = iota<i32>(B)\n    let mask = cols < C\n"
        + body
        + f"}}\n\npub op o<R: Dim, C: Dim>(x: Tensor[R, C; {dtype}]) -> Tensor[R, C; {dtype}] "
        "kernel k<R, C, 1024> {\n    let y[r, c] = x[r, c]\n    return y\n}\n"
    )


def codes(text: str) -> list[str]:
    """The codes checking ``text`` raises (fails the test if it checks)."""
    with pytest.raises(LinnetError) as info:
        check_text(text)
    diags = info.value.diagnostics
    assert diags and all(d.code and d.message for d in diags)
    str(info.value)  # rendering must not raise either
    return [d.code for d in diags]


STORE = "    store(y[row, cols], v, mask)\n"

BAD = {
    # (a) load's other: an expression of the right dtype and a shape that broadcasts
    "other undefined": ("    let v = load(x[row, cols], mask, nope)\n" + STORE, "E0201"),
    "other undefined in an expression": (
        "    let v = load(x[row, cols], mask, nope * 2.0)\n" + STORE,
        "E0201",
    ),
    "other bool into f32": ("    let v = load(x[row, cols], mask, true)\n" + STORE, "E0524"),
    "other tile of i32 into f32": ("    let v = load(x[row, cols], mask, cols)\n" + STORE, "E0524"),
    "other tile of another size": (
        "    let pad = fill(0.0, 512)\n    let v = load(x[row, cols], mask, pad)\n" + STORE,
        "E0524",
    ),
    "other a function": ("    let v = load(x[row, cols], mask, exp)\n" + STORE, "E0524"),
    "other a tensor parameter": ("    let v = load(x[row, cols], mask, x)\n" + STORE, "E0503"),
    # (b) masks: bool, broadcasting to the tile
    "load mask of another size": (
        "    let m = iota<i32>(512) < C\n    let v = load(x[row, cols], m)\n" + STORE,
        "E0525",
    ),
    "store mask of another size": (
        "    let m = iota<i32>(512) < C\n    let v = load(x[row, cols], mask)\n"
        "    store(y[row, cols], v, m)\n",
        "E0525",
    ),
    "mask of higher rank": (
        "    let m = fill<bool>(true, B, B)\n    let v = load(x[row, cols], m)\n" + STORE,
        "E0525",
    ),
    "mask an integer literal": ("    let v = load(x[row, cols], 1)\n" + STORE, "E0353"),
    # (c) tiles are not sliced, joined or gathered from
    "slice by a number": (
        "    let v = load(x[row, cols], mask)\n    store(y[row, cols], fill(v[0], B), mask)\n",
        "E0526",
    ),
    "slice by a scalar": (
        "    let v = load(x[row, cols], mask)\n    store(y[row, cols], fill(v[row], B), mask)\n",
        "E0526",
    ),
    "gather by a tile": (
        "    let v = load(x[row, cols], mask)\n    store(y[row, cols], v[cols], mask)\n",
        "E0526",
    ),
    "shift by a computed index": (
        "    let v = load(x[row, cols], mask)\n    store(y[row, cols], v[c + 1], mask)\n",
        "E0526",
    ),
    "gather inside a reduction": (
        "    let v = load(x[row, cols], mask)\n"
        "    store(y[row, cols], fill(sum[c] v[c] * v[(c + 1) / 2], B), mask)\n",
        "E0526",
    ),
    # (d) prod over a tile
    "prod over a tile": (
        "    let v = load(x[row, cols], mask, 1.0)\n"
        "    store(y[row, cols], fill(prod[c] v[c], B), mask)\n",
        "E0527",
    ),
    # (e) results appear only in store
    "result read indexed": (
        "    let v = load(x[row, cols], mask)\n"
        + STORE
        + "    store(y[row, cols], y[row, cols] + v, mask)\n",
        "E0528",
    ),
    "result read whole": ("    let v = load(x[row, cols], mask)\n    let w = y\n" + STORE, "E0528"),
    "result as a mask": (
        "    let v = load(x[row, cols], mask)\n    store(y[row, cols], v, y)\n",
        "E0528",
    ),
    "result as other": ("    let v = load(x[row, cols], mask, y)\n" + STORE, "E0528"),
    "result loaded": ("    let v = load(y[row, cols], mask)\n" + STORE, "E0507"),
    # (f) a bound kernel stores its results
    "never stores": ("    let v = load(x[row, cols], mask)\n", "E0529"),
    "empty body": ("", "E0529"),
    # (g) a tile's bits are read only as a type of their width, never bool
    "bitcast to another width": (
        "    let v = load(x[row, cols], mask)\n"
        "    store(y[row, cols], bitcast<f32>(bitcast<i16>(v) as i32), mask)\n",
        "E0691",
    ),
    "bitcast to bool": (
        "    let v = load(x[row, cols], mask)\n    let b = bitcast<bool>(v)\n" + STORE,
        "E0691",
    ),
    "bitcast of a literal of another width": (
        "    let v = load(x[row, cols], mask) * bitcast<f32>(15360 as i16)\n" + STORE,
        "E0691",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_kernel_mistake_is_coded(name: str) -> None:
    body, code = BAD[name]
    assert codes(kernel(body)) == [code]


GOOD = {
    "spec softmax body": "    let v = load(x[row, cols], mask, -1e30)\n"
    "    let e = exp(v - max[c] v[c])\n"
    "    store(y[row, cols], e / sum[c] e[c], mask)\n",
    "no other": "    let v = load(x[row, cols], mask)\n" + STORE,
    "int other into f32": "    let v = load(x[row, cols], mask, 0)\n" + STORE,
    "computed scalar other": "    let v = load(x[row, cols], mask, exp(1.0) * 2.0)\n" + STORE,
    "tile other of the loaded shape": "    let pad = fill(0.0, B)\n"
    "    let v = load(x[row, cols], mask, pad)\n" + STORE,
    "reduced scalar other": "    let a = load(x[row, cols], mask, 0.0)\n"
    "    let v = load(x[row, cols], mask, max[c] a[c])\n" + STORE,
    # (Each lane past the row reads and writes the row's last element: a scalar mask lets
    # every lane through, and a lane past the row would be out of bounds, E0548.)
    "scalar mask": "    let v = load(x[row, min(cols, C - 1)], row < R)\n"
    "    store(y[row, min(cols, C - 1)], v, row < R)\n",
    "size-one mask broadcasts": "    let m = iota<i32>(1) < C\n"
    "    let v = load(x[row, min(cols, C - 1)], m)\n" + STORE,
    "scalar load and fill": "    let first = load(x[row, 0])\n"
    "    store(y[row, cols], fill(first, B), mask)\n",
    "sum and max over a tile": "    let v = load(x[row, cols], mask, 0.0)\n"
    "    store(y[row, cols], v - fill(max[c] v[c] + min[c] v[c], B)"
    " / sum[c] v[c], mask)\n",
    "store a scalar": "    store(y[row, cols], 0.0, mask)\n",
    "a local named like nothing special": "    let v = load(x[row, cols], mask)\n"
    "    let w = v * 2.0\n"
    "    store(y[row, cols], w, mask)\n",
    # the next float up (its bits plus one), a tile's and a scalar's bits re-read
    "bitcast of a tile and back": "    let v = load(x[row, cols], mask)\n"
    "    let bits = bitcast<i32>(v) + 1\n"
    "    store(y[row, cols], bitcast<f32>(bits) + bitcast<f32>(1065353216), mask)\n",
    "bitcast in index notation": "    let v = load(x[row, cols], mask)\n"
    "    let w[c] = bitcast<f32>(bitcast<i32>(v[c]))\n"
    "    store(y[row, cols], w, mask)\n",
}


@pytest.mark.parametrize("name", list(GOOD))
def test_legitimate_kernel_still_checks(name: str) -> None:
    check_text(kernel(GOOD[name]))


def test_two_dimensional_tiles_broadcast_a_row_mask() -> None:
    """A [BM, BN] tile takes a [BN] mask (it broadcasts) and reduces along its own axes."""
    check_text("""
kernel k<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R / 16) {
    let rows = program_id(0) * 16 + iota<i32>(16)
    let cols = iota<i32>(64)
    let cmask = cols < C
    let t = load(x[rows, cols], cmask, 0.0)
    store(y[rows, cols], t * 2.0, cmask)
}
""")


def test_two_dimensional_tile_indexed_by_a_number_is_a_slice() -> None:
    text = """
kernel k<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R / 16) {
    let rows = program_id(0) * 16 + iota<i32>(16)
    let cols = iota<i32>(64)
    let t = load(x[rows, cols])
    store(y[rows, cols], fill(sum[c] t[0, c], 16, 64))
}
"""
    assert codes(text) == ["E0526"]


def test_one_of_two_results_never_stored() -> None:
    text = """
kernel k<N: Dim>(x: Tensor[N; f32]) -> (a: Tensor[N; f32], b: Tensor[N; f32]) grid(N / 64) {
    let i = program_id(0) * 64 + iota<i32>(64)
    let v = load(x[i], i < N)
    store(a[i], v, i < N)
}
"""
    with pytest.raises(LinnetError) as info:
        check_text(text)
    [d] = info.value.diagnostics
    assert d.code == "E0529" and "`b`" in d.message


def test_a_failed_store_is_not_also_reported_as_missing() -> None:
    """A mistake inside the only `store` is the one diagnostic (no E0529 cascade)."""
    assert codes(
        kernel("    let v = load(x[row, cols], mask)\n    store(y[row, cols], v, nope)\n")
    ) == ["E0201"]


def test_a_broken_other_is_reported_once() -> None:
    """An `other` bound from a failed `let` is the first error's (no E0524 cascade)."""
    assert codes(
        kernel(
            "    let pad = nope\n    let v = load(x[row, cols], mask, pad)\n"
            "    let m = nope2\n    let w = load(x[row, cols], m)\n"
            "    store(y[row, cols], v + w, mask)\n"
        )
    ) == ["E0201", "E0201"]


def test_spec_row_softmax_checks() -> None:
    check_text(SPEC_SOFTMAX)


def test_std_row_softmax_checks() -> None:
    path = (
        Path(__file__).parents[1] / "src" / "linnet" / "lang" / "std" / "nn" / "activation.linnet"
    )
    text = path.read_text()
    assert "pub kernel row_softmax" in text
    check_text(text)


@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from([1, 2, 16, 32, 64, 128, 256]), store=st.booleans())
def test_mask_size_must_broadcast(n: int, store: bool) -> None:
    """With a concrete 64-lane tile, a mask of `n` lanes is fine iff n is 64 or 1."""
    mask_use = (
        "    let v = load(x[row, cols])\n    store(y[row, cols], v, m)\n"
        if store
        else "    let v = load(x[row, cols], m)\n    store(y[row, cols], v)\n"
    )
    text = (
        "kernel k<R: Dim>(x: Tensor[R, 64; f32]) -> y: Tensor[R, 64; f32] grid(R) {\n"
        "    let row = program_id(0)\n    let cols = iota<i32>(64)\n"
        f"    let m = iota<i32>({n}) < 64\n" + mask_use + "}\n"
    )
    if n in (1, 64):
        check_text(text)
    else:
        assert codes(text) == ["E0525"]


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(["f32", "f16", "i32", "bool"]),
    other=st.sampled_from(["0", "-3", "1.5", "-1e30", "true", "false"]),
)
def test_other_literal_fits_the_tensor_dtype(dtype: str, other: str) -> None:
    """A number fills a float tensor, an integer an integer tensor, true/false a bool one."""
    body = f"    let v = load(x[row, cols], mask, {other})\n" + STORE
    is_bool = other in ("true", "false")
    is_float = other in ("1.5", "-1e30")
    fits = (dtype == "bool") == is_bool and not (is_float and dtype in ("i32", "bool"))
    if fits:
        check_text(kernel(body, dtype))
    else:
        assert codes(kernel(body, dtype)) == ["E0524"]
