"""A stand-in for FlashInfer's paged decode wrapper, for CPU tests of the plugin (helpers).

``FakeWrapper`` keeps to the documented contract of ``flashinfer.BatchDecodeWithPagedKVCacheWrapper``
in CUDA-graph mode: ``plan()`` copies the page table into the buffers given to the constructor;
``run()`` reads the page table from those buffers, as the kernels do (so a graph replays with
whatever the last ``plan()`` wrote), and computes decode attention over the paged NHD cache in
float32. Row ``b`` owns pages ``indices[indptr[b]:indptr[b + 1]]``; its length is
``(pages - 1) * page_size + last_page_len[b]``; query head ``h`` reads KV head ``h // group``.
``window_left`` and ``logits_soft_cap`` are computed as FlashInfer's kernels compute them
(``include/flashinfer/attention/variants.cuh``): keys ``j >= length - 1 - window_left`` (one
query, at the row's last position) where ``window_left >= 0``; each score ``cap * tanh(q . k
* sm_scale / cap)`` where the cap is positive.
"""

from __future__ import annotations

import os
import types
from typing import ClassVar

import pytest
import torch
from linnet.torch.flashinfer import FlashInfer


class FakeWrapper:
    made: ClassVar[list[FakeWrapper]] = []

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        **kwargs,
    ):
        assert kv_layout == "NHD"
        assert use_cuda_graph, "the plugin must use CUDA-graph mode (fixed buffers)"
        assert float_workspace_buffer.dtype == torch.uint8
        assert not bool(float_workspace_buffer.any()), "FlashInfer wants a zeroed workspace"
        self.indptr = paged_kv_indptr_buffer
        self.indices = paged_kv_indices_buffer
        self.last = paged_kv_last_page_len_buffer
        assert len(self.indptr) == len(self.last) + 1
        self.use_tensor_cores = use_tensor_cores
        self.planned: dict | None = None
        self.plan_calls = 0
        self.run_calls = 0
        FakeWrapper.made.append(self)

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *positional,
        **kwargs,
    ):
        assert not positional, "optional plan() arguments go by keyword"
        assert set(kwargs) <= {
            "pos_encoding_mode",
            "q_data_type",
            "kv_data_type",
            "sm_scale",
            "fixed_split_size",
            "disable_split_kv",
            "window_left",
            "logits_soft_cap",
        }
        assert kwargs.get("pos_encoding_mode", "NONE") == "NONE"
        assert len(last_page_len) == len(self.last), "batch size is fixed in graph mode"
        assert len(indices) <= len(self.indices)
        last = last_page_len.tolist()
        assert all(1 <= n <= page_size for n in last), last
        pointers = indptr.tolist()
        assert pointers[0] == 0 and pointers[-1] == len(indices)
        assert num_qo_heads % num_kv_heads == 0
        self.indptr.copy_(indptr)
        self.last.copy_(last_page_len)
        self.indices[: len(indices)].copy_(indices)
        self.planned = {
            "qo_heads": num_qo_heads,
            "kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "page_size": page_size,
            **kwargs,
        }
        self.plan_calls += 1

    def run(self, q, paged_kv_cache, *, out=None, **kwargs):
        assert self.planned is not None, "run() before plan()"
        k, v = paged_kv_cache
        pages_total, page_size, kv_heads, head_dim = k.shape
        p = self.planned
        assert (page_size, kv_heads, head_dim) == (p["page_size"], p["kv_heads"], p["head_dim"])
        assert q.shape[1:] == (p["qo_heads"], head_dim)
        assert q.dtype == k.dtype == p["q_data_type"] == p["kv_data_type"]
        assert out is not None and out.shape == q.shape and out.dtype == q.dtype
        group = p["qo_heads"] // kv_heads
        scale = p.get("sm_scale") or head_dim**-0.5
        window_left = p.get("window_left", -1)
        cap = p.get("logits_soft_cap") or 0.0
        indptr, indices, last = self.indptr.tolist(), self.indices.tolist(), self.last.tolist()
        result = torch.empty(q.shape, dtype=torch.float32)
        for b in range(q.shape[0]):
            pages = indices[indptr[b] : indptr[b + 1]]
            assert all(0 <= page < pages_total for page in pages)
            length = (len(pages) - 1) * page_size + last[b]
            keys = k[pages].reshape(-1, kv_heads, head_dim)[:length].float()
            values = v[pages].reshape(-1, kv_heads, head_dim)[:length].float()
            for h in range(q.shape[1]):
                scores = (keys[:, h // group] @ q[b, h].float()) * scale
                if cap > 0:
                    scores = cap * torch.tanh(scores / cap)
                if window_left >= 0:
                    scores[: max(0, length - 1 - window_left)] = float("-inf")
                result[b, h] = torch.softmax(scores, 0) @ values[:, h // group]
        out.copy_(result.to(out.dtype))
        self.run_calls += 1
        return out


def fake_flashinfer() -> types.SimpleNamespace:
    """What ``linnet.torch.flashinfer._flashinfer()`` returns in CPU tests."""
    return types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=FakeWrapper)


class CpuFlashInfer(FlashInfer):
    """The backend with its probe opened to the CPU, to run its logic against FakeWrapper."""

    def decline_reason(self, target):
        return None


GPU = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("LINNET_GPU_TESTS") != "1",
    reason="needs a Hopper GPU with flashinfer-python, and LINNET_GPU_TESTS=1",
)
"""The gpu-marked tests' skip: FlashInfer itself, on a GPU, where LINNET_GPU_TESTS=1."""
