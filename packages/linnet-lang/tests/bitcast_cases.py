"""Shared by the runtimes' tests of `bitcast<T>(x)` (a test helper; not shipped): one model
that reads bits every way the language allows (each pair of element types of one width, in
index notation and on whole tensors, and the nibble-in-the-mantissa of int4 dequantisation),
inputs given as bit patterns (signs, zeros of both signs, a subnormal, infinities, NaNs with a
payload), and what each result must be. A bitcast keeps the bits: each result's bits are its
operand's, whatever the runtime (PyTorch interpreter, generated PyTorch, generated JAX,
StableHLO, the NumPy reference)."""

from __future__ import annotations

from typing import Any

import numpy as np

SOURCE = """
model Bits<N: Dim> {
    entry run(w: Tensor[N; i32], f: Tensor[N; f32], q: Tensor[N; i64], d: Tensor[N; f64],
              s: Tensor[N; i16], h: Tensor[N; f16], r: Tensor[N; bf16], b: Tensor[N; u8],
              c: Tensor[N; i8])
        -> (Tensor[N; f32], Tensor[N; i32], Tensor[N; f64], Tensor[N; i64], Tensor[N; f16],
            Tensor[N; bf16], Tensor[N; i16], Tensor[N; bf16], Tensor[N; i16], Tensor[N; f16],
            Tensor[N; i8], Tensor[N; u8], Tensor[N; f32]) {
        let wf[n] = bitcast<f32>(w[n])
        let fw = bitcast<i32>(f)
        let qd[n] = bitcast<f64>(q[n])
        let dq = bitcast<i64>(d)
        let sh[n] = bitcast<f16>(s[n])
        let sr = bitcast<bf16>(s)
        let hs[n] = bitcast<i16>(h[n])
        let hr[n] = bitcast<bf16>(h[n])
        let rs = bitcast<i16>(r)
        let rh[n] = bitcast<f16>(r[n])
        let bc = bitcast<i8>(b)
        let cb[n] = bitcast<u8>(c[n])
        let nib[n] = bitcast<f32>((b[n] as i32 % 16) * 65536 + 1065353216)
        return wf, fw, qd, dq, sh, sr, hs, hr, rs, rh, bc, cb, nib
    }
}
"""

# Each input's element type and bit patterns (unsigned).
INPUTS: dict[str, tuple[str, list[int]]] = {
    # 1.0, -1.0, the smallest subnormal, a NaN with a payload, -inf, -0.0
    "w": ("i32", [0x3F800000, 0xBF800000, 0x00000001, 0x7FC00001, 0xFF800000, 0x80000000]),
    "f": ("f32", [0x3F800000, 0xBF800000, 0x00000001, 0x7FC00001, 0xFF800000, 0x80000000]),
    "q": ("i64", [0x3FF0000000000000, 0xBFF8000000000000, 1, 0x7FF8000000000001] + [0] * 2),
    "d": ("f64", [0x3FF0000000000000, 0xBFF8000000000000, 1, 0x7FF8000000000001, 1 << 63, 7]),
    "s": ("i16", [0x3C00, 0xBF80, 0x0001, 0x7FC1, 0xFC00, 0x8000]),
    # f16: 1.0, -1.0, a subnormal, a NaN with a payload, -inf, -0.0
    "h": ("f16", [0x3C00, 0xBC00, 0x0001, 0x7E01, 0xFC00, 0x8000]),
    # bf16: 1.0, -1.5, a subnormal, a NaN with a payload, -inf, -0.0
    "r": ("bf16", [0x3F80, 0xBFC0, 0x0001, 0x7FC1, 0xFF80, 0x8000]),
    "b": ("u8", [0, 15, 16, 255, 37, 128]),
    "c": ("i8", [0xFF, 0, 0x7F, 0x80, 5, 0xC8]),
}
N = 6

# Each result: the input whose bits it holds, and its element type.
RESULTS: list[tuple[str, str]] = [
    ("w", "f32"),
    ("f", "i32"),
    ("q", "f64"),
    ("d", "i64"),
    ("s", "f16"),
    ("s", "bf16"),
    ("h", "i16"),
    ("h", "bf16"),
    ("r", "i16"),
    ("r", "f16"),
    ("b", "i8"),
    ("c", "u8"),
]

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_NUMPY = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "u8": np.uint8,
}


def nibbles() -> list[float]:
    """The last result: 1 + (b % 16) / 128, each byte's low nibble in an f32's mantissa."""
    return [1.0 + (v % 16) / 128 for v in INPUTS["b"][1]]


def array(name: str) -> np.ndarray:
    """Input ``name`` as a NumPy array of its type (bf16 as ml_dtypes.bfloat16, as JAX takes
    it), holding exactly its bit patterns."""
    dtype, words = INPUTS[name]
    if dtype == "bf16":
        import ml_dtypes

        return np.array(words, np.uint16).view(ml_dtypes.bfloat16)
    width = np.dtype(_NUMPY[dtype]).itemsize
    return np.array(words, _UNSIGNED[width]).view(_NUMPY[dtype])


def arrays() -> list[np.ndarray]:
    """Every input, in the entry's order."""
    return [array(name) for name in INPUTS]


def tensors() -> list[Any]:
    """Every input as a torch tensor holding its bit patterns (bf16 through an int16 view)."""
    import torch

    out = []
    for name, (dtype, words) in INPUTS.items():
        if dtype == "bf16":
            out.append(
                torch.from_numpy(np.array(words, np.uint16).view(np.int16)).view(torch.bfloat16)
            )
        else:
            out.append(torch.from_numpy(array(name).copy()))
    return out


def bits(x: Any) -> list[int]:
    """The bit patterns of a result (NumPy, JAX or torch), unsigned, in row-major order."""
    if hasattr(x, "element_size"):  # a torch tensor
        import torch

        signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        x = x.detach().cpu().contiguous().view(signed[x.element_size()]).numpy()
    a = np.ascontiguousarray(np.asarray(x))
    return a.reshape(-1).view(_UNSIGNED[a.dtype.itemsize]).tolist()


def check(outputs: list[Any], where: str) -> None:
    """Every result holds its operand's bits (the last one the nibbles' floats)."""
    assert len(outputs) == len(RESULTS) + 1, where
    for k, ((name, dtype), out) in enumerate(zip(RESULTS, outputs)):
        assert bits(out) == INPUTS[name][1], f"{where}: result {k} ({name} as {dtype})"
    assert np.asarray(outputs[-1]).astype(np.float64).tolist() == nibbles(), where
