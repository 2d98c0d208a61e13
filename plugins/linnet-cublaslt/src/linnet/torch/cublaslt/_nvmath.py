"""cuBLASLt through nvmath-python: one plan per problem, launched with one binding call.

This module is imported only once a CUDA target is in play (never when the plugin is imported
or discovered), and it imports nvmath-python only inside its functions, so that a CPU-only
install without nvmath works.

Planning (host work, in an executable's first ``prepare``, never inside a CUDA graph):
``nvmath.linalg.advanced.Matmul`` plans the product with cuBLASLt's heuristics and autotunes
the candidate algorithms on the device. What a plan keeps is its own cuBLASLt descriptors,
made with ``nvmath.bindings.cublasLt`` and laid out as ``Matmul`` lays out ``x @ w.T``
(``x`` row-major [M, K], the weight [N, K] read as a column-major [K, N], the result row-major
[M, N]), and the fastest algorithm, checked against those descriptors with
``cublasLtMatmulAlgoCheck`` (cuBLASLt's own heuristics on the same descriptors stand in when
autotuning is off or its algorithm does not pass). The ``Matmul`` object is freed as soon as
it has autotuned: its ``execute`` never runs, inside a graph or outside, so the pitfall of
freeing a ``Matmul`` whose execute was captured (CUDA_ERROR_INVALID_VALUE) cannot arise.

Launching (:meth:`GemmPlan.launch`): one ``cublasLtMatmul`` through the binding, with
pointers, the cached descriptors and algorithm, a workspace allocated up front and PyTorch's
current stream. It allocates nothing and does not synchronise, so a captured CUDA graph
records it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from ._common import A_ALIGNMENT, INSTALL, TORCH_TYPES

log = logging.getLogger("linnet.torch.cublaslt")

CANDIDATES = 8
"""How many of cuBLASLt's heuristic algorithms are autotuned."""

_status: tuple[bool, str] | None = None


def status() -> tuple[bool, str]:
    """Whether nvmath-python imports and loads cuBLASLt here, and a sentence saying so."""
    global _status
    if _status is None:
        _status = _load()
    return _status


def _load() -> tuple[bool, str]:
    try:
        import nvmath
        from nvmath.bindings import cublasLt
    except ImportError as exc:
        return False, f"nvmath-python is not installed ({exc}); {INSTALL}"
    except Exception as exc:  # a broken install must decline, not crash the planner
        return False, f"nvmath-python failed to import ({type(exc).__name__}: {exc})"
    try:
        version = cublasLt.get_version()
    except Exception as exc:
        return False, f"cuBLASLt did not load through nvmath-python ({type(exc).__name__}: {exc})"
    return True, f"nvmath-python {nvmath.__version__}, cuBLASLt {version}"


def alignment(pointer: int) -> int:
    """The largest power of two (at most 256) that divides ``pointer``."""
    if pointer % 256 == 0:
        return 256
    return pointer & -pointer


class Handle:
    """A cuBLASLt handle for one device, destroyed when it is garbage-collected (or by
    :meth:`close`)."""

    def __init__(self, device: torch.device):
        from nvmath.bindings import cublasLt

        with torch.cuda.device(device):
            self.ptr = int(cublasLt.create())
        self._finalizer = weakref.finalize(self, _destroy_handle, cublasLt, self.ptr)
        self._finalizer.atexit = False  # the process is ending: leave it to the driver

    def close(self) -> None:
        self._finalizer()


def _destroy_handle(lt: Any, ptr: int) -> None:
    try:
        lt.destroy(ptr)
    except Exception as exc:  # pragma: no cover - GPU only
        log.debug("cublasLtDestroy failed: %s", exc)


def _set(setter: Any, dtype_of: Any, obj: int, attribute: Any, value: int) -> None:
    import numpy as np

    buf = np.array([value], dtype=dtype_of(attribute))
    setter(obj, attribute, buf.ctypes.data, buf.itemsize)


def _rows(results: Any) -> Any:
    import numpy as np
    from nvmath.bindings import cublasLt

    return np.frombuffer(bytes(memoryview(results)), dtype=cublasLt.matmul_heuristic_result_dtype)


class GemmPlan:
    """``out[M, N] = x[M, K] @ w[N, K].T`` for one problem and dtype on one device:
    cuBLASLt descriptors, the chosen algorithm, and the launch.

    ``source`` says how the algorithm was chosen; ``workspace_needed`` is what it uses of the
    shared workspace.
    """

    def __init__(
        self,
        handle: Handle,
        device: torch.device,
        dtype: str,
        m: int,
        n: int,
        k: int,
        weight: torch.Tensor,
        workspace: torch.Tensor,
        autotune: int,
    ):
        import numpy as np
        import nvmath
        from nvmath.bindings import cublas
        from nvmath.bindings import cublasLt as lt

        self.problem = (m, n, k, dtype)
        self.device = device
        self.handle = handle  # keeps the handle alive as long as the plan
        self.weight_alignment = alignment(weight.data_ptr())
        cuda_type = {
            "f32": nvmath.CudaDataType.CUDA_R_32F,
            "f16": nvmath.CudaDataType.CUDA_R_16F,
            "bf16": nvmath.CudaDataType.CUDA_R_16BF,
        }[dtype]
        self.compute_type = cublas.ComputeType.COMPUTE_32F
        # 16-bit results: partial sums of split-K algorithms are reduced in f32, never in the
        # output type, so that the result is the f32 sum rounded once (the op's definition).
        self.reduction = (
            lt.ReductionScheme.MASK if dtype == "f32" else lt.ReductionScheme.COMPUTE_TYPE
        )
        self.desc = lt.matmul_desc_create(self.compute_type, nvmath.CudaDataType.CUDA_R_32F)
        layouts = []
        try:
            for rows, cols, ld, order in (
                (m, k, k, lt.Order.ROW),
                (k, n, k, lt.Order.COL),
                (m, n, n, lt.Order.ROW),
            ):
                layout = lt.matrix_layout_create(cuda_type, rows, cols, ld)
                layouts.append(layout)
                _set(
                    lt.matrix_layout_set_attribute,
                    lt.get_matrix_layout_attribute_dtype,
                    layout,
                    lt.MatrixLayoutAttribute.ORDER,
                    int(order),
                )
        finally:
            self._finalizer = weakref.finalize(self, _destroy_plan, lt, self.desc, tuple(layouts))
            self._finalizer.atexit = False
        self.a, self.b, self.d = layouts
        self.alpha = np.ones(1, dtype=np.float32)
        self.beta = np.zeros(1, dtype=np.float32)
        self.algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
        self.workspace = workspace
        self._matmul = lt.matmul
        self._args = (
            handle.ptr,
            self.desc,
            self.alpha.ctypes.data,
            self.a,
            self.b,
            self.beta.ctypes.data,
            self.d,
            self.algo.ctypes.data,
            workspace.data_ptr(),
            workspace.numel() * workspace.element_size(),
        )
        self.workspace_needed = 0
        self.source = ""

        torch_type = TORCH_TYPES[dtype]
        pad = A_ALIGNMENT // torch.tensor([], dtype=torch_type).element_size()
        scratch = torch.empty(m * k + pad, dtype=torch_type, device=device).normal_()
        x = scratch[pad:].view(m, k)  # aligned to A_ALIGNMENT bytes and no more
        stream = torch.cuda.current_stream(device)
        chosen = None
        if autotune > 0:
            try:
                chosen = self._first_valid(self._autotuned(x, weight, autotune, stream))
                self.source = f"nvmath Matmul.autotune ({autotune} iterations)"
            except Exception as exc:  # pragma: no cover - GPU only
                log.warning(
                    "cuBLASLt autotuning failed for %s, using its heuristics: %s", self.problem, exc
                )
        if chosen is None:
            chosen = self._first_valid(self._heuristic())
            self.source = "cuBLASLt heuristics"
        if chosen is None:
            raise RuntimeError(
                f"cuBLASLt has no algorithm for M={m} N={n} K={k} {dtype} "
                f"within a {self._args[-1]}-byte workspace"
            )
        self.algo[0] = chosen["algo"]
        self.workspace_needed = self._check(self.algo) or 0
        # One launch outside any graph: loads the kernel before a capture, and any error
        # surfaces here rather than while capturing.
        out = torch.empty((m, n), dtype=torch_type, device=device)
        self.launch(x.data_ptr(), weight.data_ptr(), out.data_ptr(), stream.cuda_stream)
        stream.synchronize()

    def launch(self, x: int, w: int, out: int, stream: int) -> None:
        """``out = x @ w.T`` on ``stream``: pointers in, nothing allocated, no wait."""
        handle, desc, alpha, a, b, beta, d, algo, ws, ws_size = self._args
        self._matmul(
            handle, desc, alpha, x, a, w, b, beta, out, d, out, d, algo, ws, ws_size, stream
        )

    def close(self) -> None:
        """Destroy the descriptors now (the plan must not launch again)."""
        self._finalizer()

    # -- choosing the algorithm
    def _autotuned(
        self, x: torch.Tensor, weight: torch.Tensor, iterations: int, stream: Any
    ) -> list[Any]:
        from cuda.core import Device
        from nvmath.linalg.advanced import Matmul

        # nvmath asks cuda.core for the current device, which cuda.core knows only on a
        # thread that set it: a plan made on a serving engine's thread otherwise fails here
        # ("Device 0 is not yet initialized", seen on an H100) and falls back to heuristics.
        index = x.device.index
        Device(index if index is not None else torch.cuda.current_device()).set_current()
        options = {
            "compute_type": self.compute_type,
            "memory_limit": self._args[-1],
            "handle": self.handle.ptr,
        }
        preferences = {"limit": CANDIDATES, "reduction_scheme_mask": self.reduction}
        with Matmul(x, weight.t(), options=options, stream=stream) as mm:
            mm.plan(preferences=preferences, stream=stream)
            mm.autotune(iterations=iterations, release_workspace=True, stream=stream)
            rows = [algorithm.as_numpy()[0] for algorithm in mm.algorithms]
        stream.synchronize()
        return rows

    def _heuristic(self) -> list[Any]:
        import numpy as np
        from nvmath.bindings import cublasLt as lt

        pref = lt.matmul_preference_create()
        try:
            for attribute, value in (
                (lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, self._args[-1]),
                (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_A_BYTES, A_ALIGNMENT),
                (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_B_BYTES, self.weight_alignment),
                (lt.MatmulPreferenceAttribute.REDUCTION_SCHEME_MASK, int(self.reduction)),
            ):
                _set(
                    lt.matmul_preference_set_attribute,
                    lt.get_matmul_preference_attribute_dtype,
                    pref,
                    attribute,
                    value,
                )
            results = lt.MatmulHeuristicResult(CANDIDATES)
            count = np.zeros(1, dtype=np.int32)
            lt.matmul_algo_get_heuristic(
                self.handle.ptr,
                self.desc,
                self.a,
                self.b,
                self.d,
                self.d,
                pref,
                CANDIDATES,
                results.ptr,
                count.ctypes.data,
            )
            return list(_rows(results)[: int(count[0])])
        finally:
            lt.matmul_preference_destroy(pref)

    def _first_valid(self, rows: list[Any]) -> Any:
        import numpy as np
        from nvmath.bindings import cublasLt as lt

        for row in rows:
            algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
            algo[0] = row["algo"]
            needed = self._check(algo)
            if needed is not None and needed <= self._args[-1]:
                return row
        return None

    def _check(self, algo: Any) -> int | None:
        """The workspace ``algo`` needs on this plan's descriptors, or None if it cannot
        run them."""
        from nvmath.bindings import cublasLt as lt

        result = lt.MatmulHeuristicResult()
        try:
            lt.matmul_algo_check(
                self.handle.ptr,
                self.desc,
                self.a,
                self.b,
                self.d,
                self.d,
                algo.ctypes.data,
                result.ptr,
            )
        except Exception:
            return None
        return int(_rows(result)[0]["workspace_size"])

    def __repr__(self) -> str:
        m, n, k, dtype = self.problem
        return (
            f"GemmPlan(M={m} N={n} K={k} {dtype}, weight aligned {self.weight_alignment}, "
            f"{self.source}, workspace {self.workspace_needed} bytes)"
        )


def _destroy_plan(lt: Any, desc: int, layouts: tuple[int, ...]) -> None:
    try:
        for layout in layouts:
            lt.matrix_layout_destroy(layout)
        lt.matmul_desc_destroy(desc)
    except Exception as exc:  # pragma: no cover - GPU only
        log.debug("destroying cuBLASLt descriptors failed: %s", exc)
