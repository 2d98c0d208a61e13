"""Planning FlashInfer's decode wrapper, shared by the layers of one shape: what a call
needs (:class:`Shape`), the page tables FlashInfer reads (:func:`layout` for the dense cache
viewed as pages, :func:`paged_layout` for a paged cache's own table) and :class:`Planner`,
which makes the wrapper and its buffers once and plans it once a step, on the host.

>>> layout([1, 17], 16, 2)
([0, 1, 3], [0, 2, 3], [1, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from linnet.torch.flashinfer.variants import Variant

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
INT_WORKSPACE_BYTES = 8 * 1024 * 1024
"""The int workspace each FlashInfer wrapper allocates for itself on the device."""


def _flashinfer() -> Any:
    """FlashInfer itself, imported on first use (never when this module is imported)."""
    import flashinfer

    return flashinfer


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _version_of(t: torch.Tensor) -> int | None:
    """The tensor's in-place write counter (``copy_`` bumps it), or None where it has none
    (inference tensors)."""
    if t.is_inference():  # asked first: the RuntimeError would cost 10 us a call
        return None
    return int(t._version)


@dataclass(frozen=True)
class Shape:
    """What one wrapper serves: every layer with the same shapes, dtype and scale."""

    batch: int
    cache: int  # S, positions per row (paged: MP * PS, the most a table reaches)
    kv_heads: int
    group: int  # query heads per KV head
    head_dim: int
    dtype: str
    scale: float
    # The call's variant (window_decode_attention, softcap_decode_attention): layers of
    # other windows or caps plan their own wrapper.
    window_left: int = -1
    soft_cap: float = 0.0
    # A paged cache (std.nn.paged): a pool of `pool` pages of `page` positions, a table of
    # `table_width` pages a row. 0: the dense [B, S, KV, HD] cache.
    pool: int = 0
    page: int = 0
    table_width: int = 0

    @property
    def paged(self) -> bool:
        return self.pool > 0

    @property
    def qo_heads(self) -> int:
        return self.kv_heads * self.group

    @property
    def variant(self) -> Variant:
        return Variant(self.window_left, self.soft_cap)


def page_size_for(cache: int, wanted: int) -> int:
    """The page size used for a cache of ``cache`` positions: the largest power of two up to
    ``wanted`` that divides it (``wanted`` itself when it divides it).

    >>> page_size_for(2048, 16), page_size_for(1152, 16), page_size_for(100, 16), page_size_for(7, 16)
    (16, 16, 4, 1)
    """
    if wanted >= 1 and cache % wanted == 0:
        return wanted
    size = 1
    while size * 2 <= wanted and cache % (size * 2) == 0:
        size *= 2
    return size


def layout(
    lengths: Sequence[int], page_size: int, pages_per_row: int
) -> tuple[list[int], list[int], list[int]]:
    """FlashInfer's page table for rows of ``lengths`` positions in a ``[B, S, KV, HD]`` cache
    viewed as pages: ``(indptr, indices, last_page_len)``.

    >>> layout([1, 17, 32], 16, 4)
    ([0, 1, 3, 5], [0, 4, 5, 8, 9], [1, 1, 16])
    """
    indptr: list[int] = [0]
    indices: list[int] = []
    last: list[int] = []
    for row, length in enumerate(lengths):
        pages = -(-length // page_size)
        indices.extend(range(row * pages_per_row, row * pages_per_row + pages))
        indptr.append(indptr[-1] + pages)
        last.append(length - (pages - 1) * page_size)
    return indptr, indices, last


def paged_layout(
    lengths: Sequence[int], page_size: int, tables: Sequence[Sequence[int]]
) -> tuple[list[int], list[int], list[int]]:
    """FlashInfer's page table for rows of ``lengths`` positions of a paged cache whose row
    ``b`` holds position ``j`` in page ``tables[b][j // page_size]`` (std.nn.paged):
    ``(indptr, indices, last_page_len)``.

    >>> paged_layout([1, 17], 16, [[5, 0], [3, 9]])
    ([0, 1, 3], [5, 3, 9], [1, 1])
    """
    indptr: list[int] = [0]
    indices: list[int] = []
    last: list[int] = []
    for length, table in zip(lengths, tables, strict=True):
        pages = -(-length // page_size)
        indices.extend(int(p) for p in table[:pages])
        indptr.append(indptr[-1] + pages)
        last.append(length - (pages - 1) * page_size)
    return indptr, indices, last


class Planner:
    """One FlashInfer wrapper and its buffers, shared by the executables of one shape.

    It plans once a step. A step starts when an executable prepares (or, run without
    ``prepare``, executes) a second time, or when the ``pos`` tensor it reads was written in
    place (its version counter moved) or replaced (``prepare`` follows ``context.inputs``,
    the tensors the coming step reads). Then it takes the step's positions from
    the context's ``host_inputs`` (entry input ``pos_name``) where the caller gave them on the
    host, or else reads ``pos`` from the device (one device-to-host copy, a synchronisation),
    and plans if the lengths changed. Under CUDA-graph capture it never reads: it remembers
    the tensor, and the ``prepare`` before the first replay plans for it.
    """

    def __init__(
        self,
        shape: Shape,
        page_size: int,
        tensor_cores: bool,
        workspace_bytes: int,
        replan: str,
        pos_name: str = "%pos",
        split_kv: str = "auto",
        table_name: str | None = None,
    ):
        self.shape = shape
        self.pos_name = pos_name
        self.table_name = table_name  # the entry's page table (a paged cache)
        # plan()'s split options, passed only when not FlashInfer's default.
        self.split_options: dict[str, Any] = {"disable_split_kv": True} if split_kv == "off" else {}
        if shape.paged:
            # The model's own pages, as its table names them.
            self.page_size, self.pages_per_row = shape.page, shape.table_width
        else:
            self.page_size = page_size_for(shape.cache, page_size)
            self.pages_per_row = shape.cache // self.page_size
        self.tensor_cores = tensor_cores
        self.workspace_bytes = workspace_bytes
        self.replan = replan
        self.wrapper: Any = None
        self.buffers: dict[str, torch.Tensor] = {}
        self.source: torch.Tensor | None = None  # the pos tensor lengths are read from
        self.table: torch.Tensor | None = None  # the page table pages are read from (paged)
        self.read_version: int | None = None
        self.replaced = False  # prepare was handed a new pos tensor: a new step
        self.lengths: tuple[int, ...] | None = None  # what the wrapper is planned for
        self.indices: tuple[int, ...] | None = None  # the pages it reads (paged)
        self.pages: tuple[int, ...] | None = None
        self.prepared: set[int] = set()
        self.executed: set[int] = set()
        self.plans = 0  # plan() calls
        self.reads = 0  # device-to-host reads of pos
        self.host_reads = 0  # steps whose positions came from context.host_inputs
        self.planned: Any = None  # a CUDA event after the last plan()'s copies

    @property
    def shared_bytes(self) -> int:
        """Device memory the wrapper keeps: the float workspace, FlashInfer's own int
        workspace and the page-table buffers."""
        b = self.shape.batch
        table = 4 * ((b + 1) + b * self.pages_per_row + b)
        return self.workspace_bytes + INT_WORKSPACE_BYTES + table

    # -- steps
    def _moved(self) -> bool:
        assert self.source is not None
        version = _version_of(self.source)
        return version is not None and version != self.read_version

    def _follow(self, pos: torch.Tensor, table: torch.Tensor | None = None) -> None:
        """Read lengths from ``pos`` (and pages from ``table``) from now on; a new tensor
        starts a new step."""
        if table is not None:
            self.table = table
        if pos is not self.source:
            self.source, self.read_version, self.replaced = pos, None, True

    def prepare(self, member: object, context: Any = None) -> None:
        key = id(member)
        given = getattr(context, "inputs", {})
        current = given.get(self.pos_name)
        if current is not None and tuple(current.shape) != (self.shape.batch,):
            # Another plan's step (a context shared by plans of several batch sizes): not
            # this wrapper's rows, whose batch is fixed in CUDA-graph mode.
            current = None
        if current is not None:
            # The runner says which tensor this step reads (Captured: its input buffer);
            # the last execute may have seen another (the same plan run eagerly).
            self._follow(current, given.get(self.table_name) if self.table_name else None)
        if self.source is None:  # nothing ran yet: the first execute plans
            self.prepared.add(key)
            return
        new_step = key in self.prepared or self.lengths is None or self._moved() or self.replaced
        if new_step:
            self.prepared = set()
        self.prepared.add(key)
        if new_step:
            self._refresh(context)

    def ensure(
        self,
        member: object,
        pos: torch.Tensor,
        context: Any = None,
        table: torch.Tensor | None = None,
    ) -> None:
        """Before a run: planned for ``pos`` (and ``table``). Reads them only outside capture."""
        key = id(member)
        self._follow(pos, table)
        if _capturing():
            if self.wrapper is None or self.lengths is None:
                raise RuntimeError(
                    "FlashInfer: capture before plan(): run the step once outside the graph "
                    "first (Captured does), or call prepare(context)"
                )
            return  # the prepare before the first replay plans for this tensor
        new_step = self.replaced or key in self.executed or self.lengths is None or self._moved()
        if new_step:
            self.executed = set()
        self.executed.add(key)
        if new_step:
            self._refresh(context)

    def _refresh(self, context: Any = None) -> None:
        assert self.source is not None
        self.replaced = False
        self.setup(self.source.device)
        self.read_version = _version_of(self.source)
        given = getattr(context, "host_inputs", {})
        host = given.get(self.pos_name)
        host_table = given.get(self.table_name) if self.table_name else None
        on_host = host is not None and tuple(host.shape) == tuple(self.source.shape)
        if self.table_name is not None:
            assert self.table is not None
            on_host = (
                on_host
                and host_table is not None
                and tuple(host_table.shape) == tuple(self.table.shape)
            )
        if on_host and host is not None:
            values = host.tolist()  # given on the host: no device read
            tables = None if host_table is None else host_table.tolist()
            self.host_reads += 1
        else:
            values = self.source.tolist()  # the one device-to-host copy a step
            tables = self.table.tolist() if self.table is not None else None
            self.reads += 1
        cache = self.shape.cache
        lengths = tuple(min(max(int(p) + 1, 1), cache) for p in values)
        if tables is None:
            if lengths != self.lengths:
                self.plan(lengths)
            return
        laid = paged_layout(lengths, self.page_size, tables)
        indices = laid[1]
        bad = [page for page in indices if not 0 <= page < self.shape.pool]
        if bad:
            # A ValueError: the runtime reports it as a coded error naming this backend.
            raise ValueError(
                f"the page table names page {bad[0]}, outside the KV cache's pool of "
                f"{self.shape.pool} pages (0..{self.shape.pool - 1}); give table entries "
                "below kv_pages (0, the sink page, for pages a row does not hold)"
            )
        if lengths != self.lengths or tuple(indices) != self.indices:
            self.plan(lengths, tables, laid)

    # -- FlashInfer
    def setup(self, device: torch.device) -> None:
        """Allocate the buffers and make the wrapper, once."""
        if self.wrapper is not None:
            return
        fi = _flashinfer()
        b = self.shape.batch
        self.buffers = {
            # FlashInfer asks for a zeroed float workspace on first use.
            "workspace": torch.zeros(self.workspace_bytes, dtype=torch.uint8, device=device),
            "indptr": torch.zeros(b + 1, dtype=torch.int32, device=device),
            "indices": torch.zeros(b * self.pages_per_row, dtype=torch.int32, device=device),
            "last_page_len": torch.ones(b, dtype=torch.int32, device=device),
        }
        self.wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
            self.buffers["workspace"],
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.tensor_cores,
            paged_kv_indptr_buffer=self.buffers["indptr"],
            paged_kv_indices_buffer=self.buffers["indices"],
            paged_kv_last_page_len_buffer=self.buffers["last_page_len"],
        )

    def plan(
        self,
        lengths: tuple[int, ...],
        tables: Sequence[Sequence[int]] | None = None,
        laid: tuple[list[int], list[int], list[int]] | None = None,
    ) -> None:
        """Plan for rows of ``lengths`` positions (host work; copies the page table in): of
        the dense cache viewed as pages, or (``tables``) of a paged cache's rows; ``laid``
        is their ``paged_layout`` where the caller made it already."""
        if tables is not None:
            laid = laid or paged_layout(lengths, self.page_size, tables)
            indptr, indices, last = laid
        else:
            indptr, indices, last = layout(lengths, self.page_size, self.pages_per_row)
        pages = tuple(indptr[i + 1] - indptr[i] for i in range(len(lengths)))
        if self.replan == "pages" and pages == self.pages:
            # Same pages a row: FlashInfer's split schedule is unchanged (it is made from page
            # counts); only the last pages' lengths (and, paged, which pages), read by the
            # kernels, move. The copies are ordered on the stream after the replays already
            # queued; the host does not wait.
            self.buffers["last_page_len"].copy_(
                torch.tensor(last, dtype=torch.int32), non_blocking=True
            )
            if tables is not None and tuple(indices) != self.indices:
                self.buffers["indices"][: len(indices)].copy_(
                    torch.tensor(indices, dtype=torch.int32), non_blocking=True
                )
        else:
            shape = self.shape
            dtype = DTYPES[shape.dtype]
            if self.planned is not None:
                # plan() refills FlashInfer's pinned host buffer and copies it to the device
                # without waiting: the previous plan's copy out of it must be done (it is, in
                # practice: that was at least a step ago).
                self.planned.synchronize()
            self.wrapper.plan(
                torch.tensor(indptr, dtype=torch.int32),
                torch.tensor(indices, dtype=torch.int32),
                torch.tensor(last, dtype=torch.int32),
                shape.qo_heads,
                shape.kv_heads,
                shape.head_dim,
                self.page_size,
                pos_encoding_mode="NONE",
                q_data_type=dtype,
                kv_data_type=dtype,
                sm_scale=shape.scale,
                **shape.variant.plan_options(),
                **self.split_options,
            )
            if self.source is not None and self.source.is_cuda:
                self.planned = torch.cuda.Event()
                self.planned.record()
            self.plans += 1
            self.pages = pages
        self.lengths = lengths
        self.indices = tuple(indices) if tables is not None else None

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
        shape = self.shape
        if shape.paged:  # the pool is FlashInfer's NHD layout as it is
            paged = (k, v)
        else:
            rows = shape.batch * self.pages_per_row
            paged = (
                k.view(rows, self.page_size, shape.kv_heads, shape.head_dim),
                v.view(rows, self.page_size, shape.kv_heads, shape.head_dim),
            )
        self.wrapper.run(
            q.reshape(shape.batch, shape.qo_heads, shape.head_dim),
            paged,
            out=out.view(shape.batch, shape.qo_heads, shape.head_dim),
        )
