"""What expressions evaluate to, in the checker (symbolic dims) and in lowering (concrete)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.tensors.dims import Dim


@dataclass
class Tensor:
    """A tensor value: an SSA name (``%x``), a parameter or state path (``@a.b``), or, in the
    checker, an anonymous value. ``labels`` names the axes of an index-notation intermediate."""

    ref: str
    shape: tuple[Dim, ...]
    dtype: str
    kind: str = "value"  # value | param | state | tile
    labels: tuple[str, ...] | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def relabel(self, labels: tuple[str, ...] | None) -> Tensor:
        return Tensor(self.ref, self.shape, self.dtype, self.kind, labels)


@dataclass
class Const:
    """A compile-time scalar. Integers are :class:`Dim` so that they can stay symbolic.
    ``dtype`` is a concrete dtype, or ``int``/``float``/``bool`` for weak literals."""

    value: Any
    dtype: str

    @property
    def known(self) -> bool:
        if isinstance(self.value, Dim):
            return self.value.is_const
        return self.value is not None


@dataclass(frozen=True)
class ConstTensor:
    """A compile-time rank-1 tensor: a tensor config's values (``config short_factor:
    Tensor[HD / 2; f32]``, a JSON list in the config). ``values`` is None while checking
    before lowering (the length is not known yet); a body that reads the config gets a
    tensor made of them (check/const_tensors.py)."""

    values: tuple[Any, ...] | None
    shape: tuple[Dim, ...]
    dtype: str


@dataclass
class ConstList:
    """A config list (`config layer_windows: [i32; NL]`): one :class:`Const` per element of
    the repeated block it is passed to; ``items`` is None while checking (values unknown)."""

    items: tuple[Const, ...] | None
    dtype: str
    count: Any  # a Dim


@dataclass
class DType:
    name: str


@dataclass
class BlockInst:
    decl: A.BlockDecl
    path: str
    env: dict[str, Any]
    members: dict[str, Any] = field(default_factory=dict)
    # Set on the elements of a repeated block array (`block layers: [Layer<...>; N]`): the
    # element's index and the array's path, recorded on the calls of its methods.
    iteration: int | None = None
    repeated: str = ""


@dataclass
class BlockArray:
    element: A.BlockType
    path: str
    count: Dim
    items: list[BlockInst]


@dataclass
class FuncRef:
    decl: A.FuncDecl
    owner: BlockInst | None = None


@dataclass
class Builtin:
    name: str


@dataclass
class Poison:
    """The value of an expression that already failed; using it reports nothing more."""


POISON = Poison()
