"""A Linnet backend: decode attention by FlashInfer, on Hopper and later GPUs.

``FlashInfer`` takes the std library's ``std.nn.attention::decode_attention`` calls (one query
a row, attending to cache positions ``0..=pos[b]``; grouped-query heads included), and their
sliding-window and soft-capped forms (``window_decode_attention``, ``softcap_decode_attention``:
FlashInfer's ``window_left`` and ``logits_soft_cap``, see :mod:`.variants`), and runs them
with FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` over the model's own KV cache. Linnet
finds it through the ``linnet.backends`` entry point; it earns each region by measurement like
any backend.

How it runs (the README says more):

* Paged caches. std.nn.paged's ``paged_decode_attention`` (and its window and soft-cap
  forms: every std model's ``decode_paged``) is taken over the model's own pool of
  ``[NP, PS, KV, HD]`` pages, which is FlashInfer's NHD layout as it is; row ``b``'s pages
  are the first ``ceil(L_b / PS)`` entries of the entry's ``table`` input, read on the host
  like ``pos`` (:func:`~linnet.torch.flashinfer.planning.paged_layout`). New pages with the
  same page counts are copied in without a new ``plan()``.
* Layout. Each layer's dense cache is the std layout ``[B, S, KV, HD]``. Viewed (no copy) as
  ``[B * S / P, P, KV, HD]`` it is FlashInfer's paged NHD layout with pages of ``P`` positions:
  row ``b`` owns pages ``b * S / P ..``; its first ``ceil(L_b / P)`` pages hold its
  ``L_b = pos[b] + 1`` positions. ``P`` is 16 by default (the largest power of two up to it
  that divides ``S``): FlashInfer splits the cache into chunks of whole pages, so one page per
  row (``P = S``) would leave a long context on a handful of thread blocks.
* Planning. FlashInfer's ``plan()`` is host work that needs every row's length, so it runs in
  ``prepare(context)`` (which ``Captured`` calls before each replay), never in ``execute``. The
  lengths come from the entry's own ``pos`` input: the region declares it as an input (it is
  the call's ``pos`` argument; lowering hoisted the mask made from it out of the call).
  ``prepare`` reads it from ``context.host_inputs`` when the caller gave ``pos`` as a CPU
  tensor (``Captured`` and ``Plan.run`` put host inputs there): no device read, so the host
  never waits for the device. Given ``pos`` on the device, it reads the tensor the executable
  last saw, one device-to-host copy (a synchronisation) a step. Only an entry input is still
  current at that point of a replay, so calls whose ``pos`` is computed inside the entry are
  not taken. One wrapper serves all layers of one shape: it is planned once a step and runs
  once a layer.
* Graph safety. The wrapper is made with ``use_cuda_graph=True`` and buffers allocated once
  (indptr, indices, last-page lengths, a zeroed float workspace), so a captured step replays
  with whatever the last ``plan()`` wrote there. ``execute`` allocates nothing and never waits
  for the device (its output buffer is made once per executable).

>>> from linnet.backends import Target
>>> FlashInfer().decline_reason(Target("cpu")).split("; flashinfer-python")[0]
'FlashInfer runs on CUDA GPUs; this target is cpu'
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from linnet.backends import (
    Capabilities,
    Cost,
    ExecutableMeta,
    Options,
    Region,
    RegionError,
    Target,
    region_kind,
)
from linnet.lang.ir.graph import Call, Graph
from linnet.torch.flashinfer.planning import (
    DTYPES,
    INT_WORKSPACE_BYTES,
    Planner,
    Shape,
    _capturing,
    layout,
    page_size_for,
    paged_layout,
)
from linnet.torch.flashinfer.variants import (
    CALLEES,
    DECODE_ATTENTION,
    PAGED_CALLEES,
    PAGED_DECODE_ATTENTION,
    PAGED_SOFTCAP_DECODE_ATTENTION,
    PAGED_WINDOW_DECODE_ATTENTION,
    SOFTCAP_DECODE_ATTENTION,
    WINDOW_DECODE_ATTENTION,
    Variant,
    literal,
    variant_of,
)

__version__ = "0.1.0"

__all__ = [
    "CALLEES",
    "DECODE_ATTENTION",
    "DTYPES",
    "INT_WORKSPACE_BYTES",
    "PAGED_DECODE_ATTENTION",
    "PAGED_SOFTCAP_DECODE_ATTENTION",
    "PAGED_WINDOW_DECODE_ATTENTION",
    "SOFTCAP_DECODE_ATTENTION",
    "WINDOW_DECODE_ATTENTION",
    "DecodeAttentionCall",
    "FlashInfer",
    "Planner",
    "Shape",
    "Variant",
    "cache_dir",
    "flashinfer_version",
    "layout",
    "page_size_for",
    "paged_layout",
    "warm",
]

HEAD_DIMS = (64, 128, 256)
"""Head dims FlashInfer's FA2 kernels are built and tested for. Others are not taken: the FA2
prefill path (tensor-core decode) does not validate ``head_dim`` and fails on dims that are not
multiples of 64 (flashinfer-ai/flashinfer#4299)."""

GROUP_SIZES_CUDA_CORES = (1, 2, 3, 4, 8)
"""Query heads per KV head the CUDA-core decode kernel dispatches (any works with tensor
cores)."""

WORKSPACE_BYTES = 128 * 1024 * 1024
"""The float workspace per wrapper (FlashInfer's recommendation; zeroed once)."""
PAGE_SIZE = 16
INSTALL = "pip install 'linnet-flashinfer[cuda]' (see the linnet-flashinfer README)"
"""How to get flashinfer-python, which a plain install leaves out."""


def flashinfer_version() -> str | None:
    """The installed ``flashinfer-python`` version, read from its metadata (no import)."""
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _flashinfer_installed() -> bool:
    """Whether flashinfer-python is installed, asked without importing it."""
    try:
        return importlib.util.find_spec("flashinfer") is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec
        return False


@dataclass(frozen=True)
class Site:
    """A decode-attention call this backend can take, and how its region reads it."""

    region: Region
    shape: Shape
    k_cache: str
    v_cache: str
    q_index: int  # the query among region.inputs
    pos_index: int  # the entry's pos among region.inputs
    fresh_output: bool  # the output is an entry output: made anew each call
    table_index: int | None = None  # the entry's page table among region.inputs (paged)


def analyse(
    graph: Graph, call: Call, head_dims: Sequence[int] | None = HEAD_DIMS, tensor_cores: bool = True
) -> tuple[Site | None, str]:
    """Whether FlashInfer can run ``call`` (a decode-attention call of ``graph``, one of
    :data:`CALLEES`): the site, or None and the reason."""
    if call.stop <= call.start:
        return None, "the call has no steps"
    args, variant, why = variant_of(graph, call)
    if args is None:
        return None, why
    results = list(call.attributes.get("results", ()))
    paged = call.callee in PAGED_CALLEES
    table_ref: Any = None
    if paged:
        q_ref, k_ref, v_ref, table_ref, pos_ref, scale_ref = args
    else:
        q_ref, k_ref, v_ref, pos_ref, scale_ref = args
    if not (
        isinstance(k_ref, str)
        and isinstance(v_ref, str)
        and k_ref.startswith("@")
        and v_ref.startswith("@")
        and k_ref[1:] in graph.states
        and v_ref[1:] in graph.states
    ):
        return None, "k_cache and v_cache are not model states"
    k_path, v_path = k_ref[1:], v_ref[1:]
    scale = literal(graph, scale_ref)
    if scale is None:
        return None, f"the scale {scale_ref!r} is not a constant"
    if not (isinstance(q_ref, str) and q_ref in graph.values):
        return None, "the query is not a value"
    q_type, k_type, v_type = graph.values[q_ref], graph.states[k_path], graph.states[v_path]
    if len(q_type.shape) != 4 or len(k_type.shape) != 4 or k_type.shape != v_type.shape:
        layout = "[NP, PS, KV, HD] pages" if paged else "[B, S, KV, HD]"
        return None, f"q is not [B, KV, G, HD] or the caches are not {layout}"
    batch, kv_heads, group, head_dim = q_type.shape
    pool = page = width = 0
    if paged:
        pool, page, ckv, chd = k_type.shape
        if not (isinstance(table_ref, str) and table_ref in graph.inputs):
            return None, (
                f"the page table {table_ref!r} is computed inside the entry: FlashInfer "
                "plans on the host before a replay, when only the entry's inputs are current"
            )
        table_type = graph.values[table_ref]
        if len(table_type.shape) != 2 or table_type.shape[0] != batch or table_type.dtype != "i32":
            return None, (
                f"the page table is {list(table_type.shape)} {table_type.dtype}, "
                f"not [{batch}, MP] i32"
            )
        width = table_type.shape[1]
        cb, cache = batch, width * page
    else:
        cb, cache, ckv, chd = k_type.shape
    if (cb, ckv, chd) != (batch, kv_heads, head_dim):
        return None, f"q {list(q_type.shape)} does not fit the cache {list(k_type.shape)}"
    if not (q_type.dtype == k_type.dtype == v_type.dtype) or q_type.dtype not in DTYPES:
        return None, (
            f"dtype {q_type.dtype} (q) / {k_type.dtype} (cache): FlashInfer takes "
            f"{' or '.join(DTYPES)}"
        )
    if head_dims is not None and head_dim not in head_dims:
        return None, (
            f"head dim {head_dim}: FlashInfer's kernels here take {', '.join(map(str, head_dims))}"
        )
    if not tensor_cores and group not in GROUP_SIZES_CUDA_CORES:
        return None, (
            f"{group} query heads per KV head: the CUDA-core kernel takes "
            f"{GROUP_SIZES_CUDA_CORES}; use tensor cores"
        )
    if not (isinstance(pos_ref, str) and pos_ref in graph.inputs):
        return None, (
            f"pos {pos_ref!r} is computed inside the entry: FlashInfer plans on the "
            "host before a replay, when only the entry's inputs are current"
        )
    pos_type = graph.values[pos_ref]
    if pos_type.shape != (batch,) or pos_type.dtype != "i32":
        return None, f"pos is {list(pos_type.shape)} {pos_type.dtype}, not [{batch}] i32"
    try:
        region = Region.of(graph, call.start, call.stop, call.index)
    except RegionError as exc:
        return None, f"its steps are not a region: {exc}"
    if region.writes_state:
        return None, "the region writes state"
    if region.parameters or set(region.states) != {k_path, v_path}:
        return None, "the region reads more than the two caches"
    if region.outputs != (results[0],):
        return None, f"the region's outputs are {list(region.outputs)}, not the call's result"
    if q_ref not in region.inputs:
        return None, "the query is made inside the call"
    wanted = (pos_ref, table_ref) if paged else (pos_ref,)
    missing = tuple(ref for ref in wanted if ref not in region.inputs)
    if missing:
        # Lowering hoisted the mask made from pos out of the call: the region reads pos only
        # through it. Declare the call's pos argument (and table) as inputs, so that execute
        # sees them.
        region = with_inputs(region, (*region.inputs, *missing))
    site = Site(
        region,
        Shape(
            batch,
            cache,
            kv_heads,
            group,
            head_dim,
            q_type.dtype,
            scale,
            variant.window_left,
            variant.soft_cap,
            pool,
            page,
            width,
        ),
        k_path,
        v_path,
        region.inputs.index(q_ref),
        region.inputs.index(pos_ref),
        results[0] in graph.outputs,
        region.inputs.index(table_ref) if paged else None,
    )
    return site, ""


def with_inputs(region: Region, inputs: tuple[str, ...]) -> Region:
    """``region`` reading ``inputs`` (values made before it), its kind recomputed."""
    made_before = set(region.graph.inputs)
    for step in region.graph.steps[: region.start]:
        made_before.update(step.results)
    missing = [v for v in inputs if v not in made_before]
    if missing:
        raise RegionError(f"{missing} are not made before step {region.start}")
    out = dataclasses.replace(region, inputs=tuple(inputs))
    object.__setattr__(out, "kind", region_kind(out))
    return out


# ---------------------------------------------------------------- the backend
class FlashInfer:
    """Decode attention by FlashInfer (``BatchDecodeWithPagedKVCacheWrapper``), on Hopper and
    later.

    ``use_tensor_cores`` picks FlashInfer's tensor-core decode (its FA2 prefill kernels), which
    is faster under CUDA graphs on the H200 than the CUDA-core kernel; ``page_size`` the page
    the cache is viewed in (16; a divisor of S is used); ``workspace_bytes`` the float
    workspace per wrapper; ``head_dims`` the head dims taken (None: any);
    ``replan="pages"`` calls ``plan()`` only when a row's page count changes and otherwise
    writes the last-page lengths alone (FlashInfer's schedule depends on page counts only);
    ``"always"`` plans every step. ``split_kv`` is how a row's cache is split over thread
    blocks: ``"auto"`` (FlashInfer's schedule) or ``"off"`` (one block per row and KV head, no
    merge kernel; ``disable_split_kv``). A fixed number of pages per split (FlashInfer's
    ``fixed_split_size``) is not offered: FlashInfer refuses it under CUDA graphs once the
    splits outnumber the batch it was captured for, and on the H200 it was no faster than
    ``"auto"`` (docs/benchmarks/flashinfer.md).

    >>> FlashInfer(split_kv="off").version.endswith("+split-off")
    True
    """

    name = "flashinfer"
    contract = 1
    """The backend contract this was written for: a literal, not the host's ``CONTRACT``, so
    that a host implementing another contract skips this backend instead of calling it."""

    def __init__(
        self,
        use_tensor_cores: bool = True,
        page_size: int = PAGE_SIZE,
        workspace_bytes: int = WORKSPACE_BYTES,
        head_dims: Sequence[int] | None = HEAD_DIMS,
        replan: str = "pages",
        split_kv: str = "auto",
    ):
        if replan not in ("pages", "always"):
            raise ValueError(f"replan must be 'pages' or 'always', not {replan!r}")
        if split_kv not in ("auto", "off"):
            raise ValueError(
                f"split_kv must be 'auto' or 'off', not {split_kv!r}"
                + (
                    " (a fixed number of pages per split fails under CUDA graphs once the "
                    "splits outnumber the captured batch, FlashInfer's own check)"
                    if isinstance(split_kv, int)
                    else ""
                )
            )
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.use_tensor_cores = use_tensor_cores
        self.page_size = page_size
        self.workspace_bytes = workspace_bytes
        self.head_dims = tuple(head_dims) if head_dims is not None else None
        self.replan = replan
        self.split_kv = split_kv
        # Timings are cached by backend version: FlashInfer's version and the variant count.
        variant = (
            ""
            if (use_tensor_cores, page_size) == (True, PAGE_SIZE)
            else (f"+tc{int(use_tensor_cores)}p{page_size}")
        )
        if split_kv != "auto":
            variant += f"+split-{split_kv}"
        self.version = f"{__version__}/flashinfer-{flashinfer_version() or 'missing'}{variant}"

    def __repr__(self) -> str:
        return (
            f"FlashInfer(use_tensor_cores={self.use_tensor_cores}, "
            f"page_size={self.page_size}, split_kv={self.split_kv!r})"
        )

    # -- probe
    def decline_reason(self, target: Target) -> str | None:
        """Why this backend cannot run on ``target``, or None when it can: every reason that
        applies (not a CUDA GPU, or one before Hopper; flashinfer-python not installed), so
        that one look says all that is missing. Never imports FlashInfer."""
        reason = None
        where = target.name or target.device or "this GPU"
        if target.kind != "cuda":
            reason = f"FlashInfer runs on CUDA GPUs; this target is {target.kind}"
        elif target.capability is None:
            reason = f"{where} did not report its compute capability; FlashInfer here needs 9.0+"
        elif tuple(target.capability) < (9, 0):
            major, minor = target.capability
            reason = (
                f"{where} has compute capability {major}.{minor}; this backend needs "
                "Hopper or later (9.0+)"
            )
        if _flashinfer_installed():
            return reason
        missing = f"flashinfer-python is not installed{' either' if reason else ''}: {INSTALL}"
        return missing if reason is None else f"{reason}; {missing}"

    def probe(self, target: Target) -> Capabilities | None:
        """Capabilities on a CUDA GPU of compute capability 9.0 or later with FlashInfer
        installed; None otherwise (``decline_reason`` says why)."""
        if self.decline_reason(target) is not None:
            return None
        return Capabilities(
            dtypes=tuple(DTYPES),
            notes=(
                f"decode attention, {'tensor' if self.use_tensor_cores else 'CUDA'}-core kernel, "
                f"pages of {self.page_size}"
            ),
        )

    # -- match
    def sites(self, graph: Graph) -> list[tuple[Call, Site | None, str]]:
        """Every decode-attention call of ``graph`` (plain, windowed, soft-capped: in graph
        order): its site, or None and why it is not taken."""
        found = [c for callee in CALLEES for c in graph.semantic_calls(callee)]
        # A paged op's body is the dense op on the gathered pages: that inner call is the
        # outer one's, not a site of its own.
        calls = sorted(
            (
                c
                for c in found
                if not any(
                    o is not c and o.start <= c.start and c.stop <= o.stop and o.index < c.index
                    for o in found
                )
            ),
            key=lambda c: c.index,
        )
        out = []
        for call in calls:
            site, reason = analyse(graph, call, self.head_dims, self.use_tensor_cores)
            out.append((call, site, reason))
        return out

    def declined(self, graph: Graph) -> list[tuple[Call, str]]:
        """The decode-attention calls of ``graph`` this backend does not take, and why."""
        return [(call, reason) for call, site, reason in self.sites(graph) if site is None]

    def match(self, graph: Graph, target: Target) -> list[Region]:
        """One region per decode-attention call FlashInfer can run (see :meth:`declined`)."""
        return [site.region for _, site, _ in self.sites(graph) if site is not None]

    # -- compile
    def compile(self, region: Region, target: Target, options: Options) -> DecodeAttentionCall:
        (executable,) = self.compile_regions([region], target, options)
        return executable

    def compile_regions(
        self, regions: Sequence[Region], target: Target, options: Options
    ) -> list[DecodeAttentionCall]:
        """Executables for ``regions``; those of one shape share one wrapper (planned once a
        step) and its workspace, whose bytes they declare between them."""
        sites = []
        for region in regions:
            call = next((c for c in region.graph.calls if c.index == region.index), None)
            site, reason = (
                analyse(region.graph, call, self.head_dims, self.use_tensor_cores)
                if call is not None
                else (None, "no call at the region's index")
            )
            if site is None or site.region.steps != region.steps:
                raise RegionError(f"FlashInfer cannot run {region!r}: {reason or 'not a call'}")
            sites.append(site)
        planners: dict[Shape, Planner] = {}
        members: dict[Shape, int] = {}
        for site in sites:
            if site.shape not in planners:
                planners[site.shape] = Planner(
                    site.shape,
                    self.page_size,
                    self.use_tensor_cores,
                    self.workspace_bytes,
                    self.replan,
                    site.region.inputs[site.pos_index],
                    self.split_kv,
                    (
                        site.region.inputs[site.table_index]
                        if site.table_index is not None
                        else None
                    ),
                )
            members[site.shape] = members.get(site.shape, 0) + 1
        out = []
        seen: dict[Shape, int] = {}
        for site in sites:
            planner = planners[site.shape]
            n, i = members[site.shape], seen.get(site.shape, 0)
            seen[site.shape] = i + 1
            share = planner.shared_bytes // n + (planner.shared_bytes % n if i == 0 else 0)
            out.append(DecodeAttentionCall(site, planner, share))
        return out

    def estimate_cost(self, region: Region, target: Target) -> Cost | None:
        """None: a measured plan times each region kind instead."""
        return None


# ---------------------------------------------------------------- the executable
class DecodeAttentionCall:
    """One layer's decode attention: reads its caches by path, its query and the entry's
    ``pos`` from the region's inputs."""

    def __init__(self, site: Site, planner: Planner, shared_share: int):
        self.site = site
        self.planner = planner
        shape = site.shape
        self.out_shape = (shape.batch, shape.kv_heads, shape.group, shape.head_dim)
        out_bytes = math.prod(self.out_shape) * DTYPES[shape.dtype].itemsize
        self.meta = ExecutableMeta((), (), holds=shared_share + out_bytes)
        self.out: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"DecodeAttentionCall({self.site.k_cache.rsplit('.', 1)[0]})"

    def _output(self, device: torch.device) -> torch.Tensor:
        if self.site.fresh_output:
            return torch.empty(self.out_shape, dtype=DTYPES[self.site.shape.dtype], device=device)
        if self.out is None:
            if _capturing():
                raise RuntimeError("FlashInfer: capture before the first run")
            self.out = torch.empty(
                self.out_shape, dtype=DTYPES[self.site.shape.dtype], device=device
            )
        return self.out

    def prepare(self, context: Any) -> None:
        """Host work before a step or a replay: the buffers (once), then the shared wrapper
        planned for this step's lengths (once for all layers; one device-to-host read of
        ``pos``, or none where the caller gave it on the host)."""
        device = context.states[self.site.k_cache].device
        self.planner.setup(device)
        if self.out is None and not self.site.fresh_output:
            self.out = torch.empty(
                self.out_shape, dtype=DTYPES[self.site.shape.dtype], device=device
            )
        self.planner.prepare(self, context)

    def execute(self, inputs: list[Any], outputs: list[Any], context: Any) -> list[Any]:
        q = inputs[self.site.q_index]
        pos = inputs[self.site.pos_index]
        index = self.site.table_index
        # Planned by prepare; run outside a graph without prepare (plan.run), the first layer
        # of a step plans here instead.
        self.planner.ensure(self, pos, context, inputs[index] if index is not None else None)
        out = self._output(q.device)
        self.planner.run(
            q, context.states[self.site.k_cache], context.states[self.site.v_cache], out
        )
        return [out]


# ---------------------------------------------------------------- the JIT cache
def cache_dir() -> str | None:
    """Where FlashInfer keeps its JIT-compiled kernels (``$FLASHINFER_WORKSPACE_BASE/.cache/
    flashinfer/...``), or None when FlashInfer is not installed."""
    if not _flashinfer_installed():
        return None
    from flashinfer.jit import env

    for name in ("FLASHINFER_JIT_DIR", "FLASHINFER_WORKSPACE_DIR", "FLASHINFER_CACHE_DIR"):
        path = getattr(env, name, None)
        if path is not None:
            return str(path)
    return None


def warm(
    head_dims: Sequence[int] = (128,),
    dtypes: Sequence[str] = ("bf16",),
    use_tensor_cores: bool = True,
    device: str = "cuda",
    log: Any = print,
) -> list[tuple[str, float]]:
    """Compile (or load from FlashInfer's cache) the kernels this backend uses for each head
    dim and dtype, by planning and running one tiny decode; returns ``(variant, seconds)``.

    The first use of each variant JIT-compiles it with nvcc (about 11-22 s on an H200);
    warming ahead moves that out of the first plan. See the README.
    """
    import time

    done = []
    for dtype in dtypes:
        for head_dim in head_dims:
            shape = Shape(
                batch=1,
                cache=32,
                kv_heads=1,
                group=4,
                head_dim=head_dim,
                dtype=dtype,
                scale=1.0 / math.sqrt(head_dim),
            )
            planner = Planner(shape, PAGE_SIZE, use_tensor_cores, WORKSPACE_BYTES, "always")
            name = f"{dtype} head_dim {head_dim} {'tensor' if use_tensor_cores else 'CUDA'} cores"
            t0 = time.perf_counter()
            dev = torch.device(device)
            planner.setup(dev)
            planner.plan((shape.cache,))
            torch_dtype = DTYPES[dtype]
            q = torch.zeros(1, 1, 4, head_dim, dtype=torch_dtype, device=dev)
            k = torch.zeros(1, shape.cache, 1, head_dim, dtype=torch_dtype, device=dev)
            out = torch.empty_like(q)
            planner.run(q, k, k.clone(), out)
            torch.cuda.synchronize(dev)
            seconds = time.perf_counter() - t0
            log(f"{name}: {seconds:.1f} s")
            done.append((name, seconds))
    return done
