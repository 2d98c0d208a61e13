"""Guarded memory for kernels run in Triton's interpreter: what a kernel check launches under.

Triton's interpreter runs a kernel's programs one after another, on the CPU, with NumPy, and
performs each load and store at the raw address the kernel computed. A store past a tensor
writes into whatever the process keeps there (the allocator's bookkeeping: the process dies
of SIGABRT or SIGSEGV, or another tensor changes); and programs running in order hide a race
between them. Within :func:`guarded_launches`, every interpreted launch:

* checks each lane its mask lets through, of every load, store and atomic, lies inside one
  of the launch's tensors, and raises :class:`WildAccess` (a
  :class:`~linnet.lang.host.verdicts.KernelFault`) *before* the access where one does not: a
  finding, not a crash. (An index past a row that stays inside the tensor is caught by the
  check of ``ir/accesses.py`` where it does not come from data; this guard sees addresses.)
* records which program stored and which loaded each element of each tensor, and raises
  :class:`Race` after the launch where two programs touched one element, one storing (a
  store of another value, for two stores), with no ``atomic_add`` before either in its
  program: on a GPU they run in any order, at once. After its first atomic a program's
  accesses are not compared (its count orders them: the "last program" pattern).
* with ``reverse``, runs the programs in reverse order, so that a kernel right only when
  program i runs after program i - 1 also shows as a wrong result.

>>> with guarded_launches(reverse=True) as guard:      # doctest: +SKIP
...     y = launch_double(x)
>>> guard.launches                                     # doctest: +SKIP
1
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from linnet.lang.host.verdicts import KernelFault

import torch


class WildAccess(KernelFault):
    """A load, store or atomic of a lane outside every tensor of its launch."""


class Race(KernelFault):
    """Two programs of one launch that touch one element, one storing, unordered."""


@dataclass
class _Region:
    """One tensor of a launch: where its bytes are, and who stored and loaded each element."""

    name: str
    tensor: torch.Tensor
    start: int
    stop: int
    size: int  # bytes an element
    writer: np.ndarray | None = None  # program (linear index) that stored each element, -1
    reader: np.ndarray | None = None  # program that loaded it, -1 none, -2 two or more

    def describe(self) -> str:
        dtype = str(self.tensor.dtype).removeprefix("torch.")
        return f"`{self.name}` ({dtype}{list(self.tensor.shape)})"

    def element(self, flat: int) -> str:
        shape = tuple(self.tensor.shape)
        at = np.unravel_index(flat, shape) if shape else ()
        return f"{self.name}[{', '.join(str(int(i)) for i in at)}]"

    def shadows(self) -> tuple[np.ndarray, np.ndarray]:
        if self.writer is None or self.reader is None:
            n = (self.stop - self.start) // self.size
            self.writer, self.reader = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        return self.writer, self.reader


@dataclass
class Guard:
    """The state of :func:`guarded_launches`: the launch running now and what it found."""

    reverse: bool = False
    launches: int = 0
    regions: list[_Region] = field(default_factory=list)
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    stops: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    program: tuple[int, ...] = (0,)  # as the kernel's grid has axes
    rank: int = 3
    linear: int = 0
    synced: bool = False  # the program ran an atomic
    race: str = ""  # the first race of the launch

    def begin(self, names: list[str], tensors: list[Any], rank: int) -> None:
        """A launch starts: its tensors (the kernel's arguments), by argument name, and how
        many axes its grid has."""
        self.rank = rank
        regions = []
        for name, t in zip(names, tensors):
            if isinstance(t, torch.Tensor) and t.numel():
                start = t.data_ptr()
                regions.append(
                    _Region(name, t, start, start + t.numel() * t.element_size(), t.element_size())
                )
        regions.sort(key=lambda r: r.start)
        self.regions = regions
        self.starts = np.array([r.start for r in regions], np.uint64)
        self.stops = np.array([r.stop for r in regions], np.uint64)
        self.race = ""
        self.launches += 1

    def at(self, x: int, y: int, z: int, grid: tuple[int, int, int]) -> tuple[int, int, int]:
        """The program to run as the interpreter's (x, y, z)th: itself, or counted from the
        end (``reverse``)."""
        if self.reverse:
            n = grid[0] * grid[1] * grid[2]
            linear = n - 1 - ((x * grid[1] + y) * grid[2] + z)
            x, rest = divmod(linear, grid[1] * grid[2])
            y, z = divmod(rest, grid[2])
        self.program, self.synced = (x, y, z)[: self.rank], False
        self.linear = (x * grid[1] + y) * grid[2] + z
        return x, y, z

    def check(self, what: str, pointers: Any, mask: Any, size: int, values: Any = None) -> None:
        """Raise WildAccess for a lane outside every tensor; record stores and loads for
        races. ``pointers`` and ``mask`` are the interpreter's arrays, ``size`` the bytes of
        an element, ``values`` what a store writes."""
        ptrs = np.asarray(pointers)
        active = (
            np.broadcast_to(np.asarray(mask, bool), ptrs.shape)
            if mask is not None
            else np.ones(ptrs.shape, bool)
        )
        addresses = ptrs[active].astype(np.uint64)
        if not addresses.size:
            return
        which = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        if self.regions:
            inside = (which >= 0) & (
                addresses + np.uint64(size) <= self.stops[np.clip(which, 0, None)]
            )
        else:
            inside = np.zeros(addresses.shape, bool)
        if not np.all(inside):
            raise WildAccess(self.wild(what, addresses, which, inside, size))
        if self.synced or what == "atomic_add":
            return
        stored = None
        if values is not None:
            stored = np.broadcast_to(np.asarray(values), ptrs.shape)[active]
        for k in np.unique(which):
            region = self.regions[int(k)]
            here = which == k
            elements = (
                (addresses[here] - np.uint64(region.start)) // np.uint64(region.size)
            ).astype(np.int64)
            self.track(region, what, elements, None if stored is None else stored[here])

    def track(
        self, region: _Region, what: str, elements: np.ndarray, values: np.ndarray | None
    ) -> None:
        writer, reader = region.shadows()
        me = self.linear
        if what == "load":
            w = writer[elements]
            other = (w >= 0) & (w != me)
            if other.any() and not self.race:
                j = int(np.argmax(other))
                self.race = (
                    f"programs race on {region.describe()}: program {self.program} "
                    f"loads {region.element(int(elements[j]))}, which program "
                    f"{self._program(int(w[j]))} stored"
                )
            r = reader[elements]
            reader[elements] = np.where((r == -1) | (r == me), me, -2)
            return
        r = reader[elements]
        other = (r != -1) & (r != me)
        if other.any() and not self.race:
            j = int(np.argmax(other))
            by = (
                "two or more other programs"
                if r[j] == -2
                else f"program {self._program(int(r[j]))}"
            )
            self.race = (
                f"programs race on {region.describe()}: program {self.program} "
                f"stores {region.element(int(elements[j]))}, which {by} loaded"
            )
        w = writer[elements]
        other = (w >= 0) & (w != me)
        if other.any() and not self.race and values is not None:
            before = _bits(region.tensor)[elements]
            differs = other & (before != _as_bits(values, region.size))
            if differs.any():
                j = int(np.argmax(differs))
                self.race = (
                    f"programs race on {region.describe()}: programs "
                    f"{self._program(int(w[j]))} and {self.program} store different "
                    f"values into {region.element(int(elements[j]))}"
                )
        writer[elements] = me

    def _program(self, linear: int) -> tuple[int, ...]:
        from triton.runtime.interpreter import interpreter_builder

        _, gy, gz = interpreter_builder.grid_dim
        x, rest = divmod(linear, gy * gz)
        return (x, *divmod(rest, gz))[: self.rank]

    def wild(
        self, what: str, addresses: np.ndarray, which: np.ndarray, inside: np.ndarray, size: int
    ) -> str:
        """WildAccess's message: the access, how many lanes, and where the first one is
        against the nearest tensor."""
        bad = ~inside
        first = int(addresses[bad][0])
        verb = {"load": "reads", "store": "writes", "atomic_add": "adds to"}[what]
        k = int(which[bad][0])
        if k >= 0:
            r = self.regions[k]
            n = (r.stop - r.start) // r.size
            where = (
                f"element {(first - r.start) // r.size} of {r.describe()}, which has {n}"
                if first < r.stop
                else f"{first - r.stop} bytes past the end of "
                f"{r.describe()}, the nearest tensor below it"
            )
        elif self.regions:
            where = f"{self.regions[0].start - first} bytes before {self.regions[0].describe()}"
        else:
            where = "memory of no tensor"
        count = int(bad.sum())
        return (
            f"`{what}` in program {self.program} {verb} outside every tensor of the launch "
            f"({count} lane{'s' if count != 1 else ''}; the first at {where}); "
            "stopped before it ran"
        )


def _bits(t: torch.Tensor) -> np.ndarray:
    """``t``'s elements as unsigned integers of their width (to compare stored values)."""
    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().reshape(-1).view(kind).numpy().view(f"u{t.element_size()}")


def _as_bits(values: np.ndarray, size: int) -> np.ndarray:
    return (
        np.ascontiguousarray(values).view(f"u{size}")
        if values.dtype.itemsize == size
        else values.astype(f"u{size}")
    )


def _element_size(dtype: Any) -> int:
    """Bytes of one element a pointer of Triton type ``dtype`` points at."""
    while hasattr(dtype, "element_ty"):
        dtype = dtype.element_ty
    return max(1, math.ceil(dtype.primitive_bitwidth / 8))


@contextmanager
def guarded_launches(reverse: bool = False) -> Iterator[Guard]:
    """Within the block, kernels run in Triton's interpreter under guarded memory (see the
    module docstring); yields the :class:`Guard`. Triton's interpreter must be on
    (``TRITON_INTERPRET=1`` before Triton was imported); compiled launches are not guarded.

    >>> with guarded_launches() as guard:      # doctest: +SKIP
    ...     out = module.run(x, {}, {})
    """
    from triton.runtime import interpreter as interp

    guard = Guard(reverse)
    builder = interp.interpreter_builder
    executor = interp.GridExecutor
    call = executor.__call__
    set_grid_idx = builder.set_grid_idx
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        names = list(self.arg_names[: len(args)]) + list(kwargs)
        grid = self.grid if isinstance(self.grid, tuple | list) else (0, 0, 0)
        guard.begin(names, [*args, *kwargs.values()], max(1, len(grid)))
        try:
            out = call(self, *args, **kwargs)
        except Exception as exc:
            cause = exc.__cause__
            if isinstance(cause, KernelFault):  # the interpreter wraps what a program raises
                raise cause from None
            raise
        if guard.race:
            raise Race(
                guard.race + ", and no `atomic_add` orders them: on a GPU they run "
                "in any order, at once"
            )
        return out

    def at(x: int, y: int, z: int) -> Any:
        return set_grid_idx(*guard.at(x, y, z, builder.grid_dim))

    def masked_load(ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        guard.check("load", ptrs.data, mask.data, _element_size(ptrs.dtype))
        return load(ptrs, mask, other, *rest)

    def masked_store(ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        guard.check("store", ptrs.data, mask.data, _element_size(ptrs.dtype), value.data)
        return store(ptrs, value, mask, *rest)

    def atomic_rmw(op: Any, ptr: Any, val: Any, mask: Any, *rest: Any) -> Any:
        guard.check("atomic_add", ptr.data, mask.data, _element_size(ptr.dtype))
        guard.synced = True
        return rmw(op, ptr, val, mask, *rest)

    def atomic_cas(ptr: Any, cmp: Any, val: Any, *rest: Any) -> Any:
        guard.check("atomic_add", ptr.data, None, _element_size(ptr.dtype))
        guard.synced = True
        return cas(ptr, cmp, val, *rest)

    patched = (
        "set_grid_idx",
        "create_masked_load",
        "create_masked_store",
        "create_atomic_rmw",
        "create_atomic_cas",
    )
    before = {name: builder.__dict__[name] for name in patched if name in builder.__dict__}
    executor.__call__ = launch  # type: ignore[method-assign]
    builder.set_grid_idx = at  # type: ignore[method-assign]
    builder.create_masked_load = masked_load  # type: ignore[method-assign]
    builder.create_masked_store = masked_store  # type: ignore[method-assign]
    builder.create_atomic_rmw = atomic_rmw  # type: ignore[method-assign]
    builder.create_atomic_cas = atomic_cas  # type: ignore[method-assign]
    try:
        yield guard
    finally:
        executor.__call__ = call  # type: ignore[method-assign]
        for name in patched:  # the builder's own methods again (or an outer guard's)
            builder.__dict__.pop(name, None)
            if name in before:
                builder.__dict__[name] = before[name]


__all__ = ["Guard", "Race", "WildAccess", "guarded_launches"]
