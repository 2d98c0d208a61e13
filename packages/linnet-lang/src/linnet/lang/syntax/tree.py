"""The syntax tree of a Linnet module. Every node has a span."""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.lang.diagnostics.core import SourceFile, Span

# ---------------------------------------------------------------- types


@dataclass
class TensorType:
    dims: list[Expr]
    dtype: Name
    span: Span


@dataclass
class ScalarType:
    name: str  # f32, i32, bool, Dim, DType, or a generic name
    span: Span


@dataclass
class BlockType:
    name: str
    args: list[Expr | TypeExpr]
    span: Span
    # `Attention<...>(attention_bias = true)`: values for the block's `config` members.
    config: list[ConfigArg] = field(default_factory=list)


@dataclass
class ConfigArg:
    """One `name = value` of a block type's configuration, `Attention<...>(window = 4096)`."""

    name: str
    value: Expr
    span: Span


@dataclass
class ArrayType:
    element: BlockType
    count: Expr
    span: Span


@dataclass
class ListType:
    """A config's list of scalars, one per element of a repeated block: `[i32; NL]`
    (`config layer_windows: [i32; NL] = 0`). Passed to the elements of a repeated block,
    `[Layer<...>(window = layer_windows); NL]`, element i gets item i."""

    element: ScalarType
    count: Expr
    span: Span


TypeExpr = TensorType | ScalarType | BlockType | ArrayType | ListType

# ---------------------------------------------------------------- expressions


@dataclass
class Name:
    name: str
    span: Span


@dataclass
class IntLit:
    value: int
    span: Span


@dataclass
class FloatLit:
    value: float
    span: Span


@dataclass
class BoolLit:
    value: bool
    span: Span


@dataclass
class Binary:
    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass
class Unary:
    op: str
    operand: Expr
    span: Span


@dataclass
class Call:
    callee: Expr
    generic_args: list[Expr | TypeExpr]
    args: list[Expr]
    span: Span


@dataclass
class Index:
    base: Expr
    indices: list[Expr]
    span: Span


@dataclass
class Field:
    base: Expr
    name: str
    span: Span


@dataclass
class Tuple:
    """A composite index `(h, d)`: one axis of size H*D read as two."""

    items: list[Expr]
    span: Span


@dataclass
class IndexBinder:
    """An index variable bound by a `let y[...]` or a reduction, with an optional dim."""

    name: str
    dim: Expr | None
    span: Span
    parts: list[IndexBinder] | None = None  # a composite binder `(h, d)`


@dataclass
class Reduce:
    kind: str  # sum, max, min, mean, prod
    binders: list[IndexBinder]
    accumulate: Name | None
    body: Expr
    span: Span


@dataclass
class Cast:
    operand: Expr
    dtype: Name
    span: Span


@dataclass
class IfExpr:
    condition: Expr
    then: Block
    otherwise: Block | IfExpr | None
    span: Span


@dataclass
class RangeExpr:
    start: Expr
    stop: Expr
    inclusive: bool
    step: Expr | None
    span: Span


@dataclass
class Slice:
    """A static range of one axis in an index, `x[a..b, ..]` (only there): `start` None is
    the axis' start, `stop` None its end; `..` and `:` alone are the whole axis."""

    start: Expr | None
    stop: Expr | None
    inclusive: bool
    span: Span


Expr = (
    Name
    | IntLit
    | FloatLit
    | BoolLit
    | Binary
    | Unary
    | Call
    | Index
    | Field
    | Tuple
    | Reduce
    | Cast
    | IfExpr
    | RangeExpr
    | Slice
)

# ---------------------------------------------------------------- statements


@dataclass
class Let:
    name: str
    binders: list[IndexBinder] | None
    value: Expr
    span: Span
    name_span: Span
    # `let (q, k, v) = f(x)`: one name per result of a call (`name` is then "(q, k, v)").
    names: list[str] | None = None


@dataclass
class Assign:
    target: Expr  # a Name (rebinding) or an Index into a state (a write in place)
    value: Expr
    span: Span


@dataclass
class Return:
    values: list[Expr]
    span: Span


@dataclass
class ExprStmt:
    expr: Expr
    span: Span


@dataclass
class For:
    var: str
    iterable: Expr
    body: Block
    span: Span
    var_span: Span


Stmt = Let | Assign | Return | ExprStmt | For


@dataclass
class Block:
    statements: list[Stmt]
    span: Span


# ---------------------------------------------------------------- items


@dataclass
class Generic:
    name: str
    kind: str  # "Dim" or "DType"
    span: Span
    default: Expr | TypeExpr | None = None


@dataclass
class Param:
    name: str
    type: TypeExpr
    span: Span


@dataclass
class Result:
    name: str | None
    type: TypeExpr
    span: Span


@dataclass
class KernelBinding:
    """`kernel name<args>` after an op's signature; ``then`` is the next kernel of a
    chain (`kernel split<...> then combine<...>`, or longer): it takes the op's parameters,
    then this kernel's results; the last kernel writes the op's results."""

    name: str
    args: list[Expr | TypeExpr]
    span: Span
    then: KernelBinding | None = None


@dataclass
class GradClause:
    names: list[str]
    body: Block
    span: Span


@dataclass
class FuncDecl:
    """An `op`, `fn`, `kernel` or `entry` (and block methods, which are `fn`s)."""

    kind: str
    public: bool
    name: str
    generics: list[Generic]
    params: list[Param]
    results: list[Result]
    where: list[Expr]
    body: Block
    span: Span
    name_span: Span
    kernel: KernelBinding | None = None
    grid: list[Expr] | None = None
    grad: GradClause | None = None
    # A kernel's `scratch(...)` buffers: kept by its launcher between launches, zeroed when
    # first made; the kernel loads, stores and counts (`atomic_add`) in them.
    scratch: list[Param] = field(default_factory=list)
    owner: BlockDecl | None = None
    module: Module | None = None

    @property
    def qualified_name(self) -> str:
        module = self.module.name if self.module else "?"
        if self.owner is not None:
            return f"{module}::{self.owner.name}.{self.name}"
        return f"{module}::{self.name}"


@dataclass
class Member:
    kind: str  # param, state, block, config
    name: str
    type: TypeExpr
    span: Span
    default: Expr | None = None
    condition: Expr | None = None


@dataclass
class BlockDecl:
    kind: str  # "block" or "model"
    public: bool
    name: str
    generics: list[Generic]
    where: list[Expr]
    members: list[Member]
    methods: list[FuncDecl]
    span: Span
    name_span: Span
    module: Module | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.module.name if self.module else '?'}::{self.name}"

    def method(self, name: str) -> FuncDecl | None:
        for m in self.methods:
            if m.name == name:
                return m
        return None


@dataclass
class Use:
    module: list[str]
    names: list[tuple[str, Span]]
    span: Span


@dataclass
class Const:
    public: bool
    name: str
    type: TypeExpr | None
    value: Expr
    span: Span


Item = FuncDecl | BlockDecl | Use | Const


@dataclass
class Module:
    name: str
    source: SourceFile
    items: list[Item] = field(default_factory=list)
    # Name index and `use` items, rebuilt when `items` grows: every name lookup goes through
    # them, and scanning the items each time made checking quadratic in the module's size.
    _index: tuple[int, dict[str, Item], list[Use]] | None = field(
        default=None, repr=False, compare=False
    )

    def _indexed(self) -> tuple[int, dict[str, Item], list[Use]]:
        if self._index is None or self._index[0] != len(self.items):
            names: dict[str, Item] = {}
            for item in self.items:
                if isinstance(item, FuncDecl | BlockDecl | Const):
                    names.setdefault(item.name, item)  # the first definition wins, as before
            self._index = (len(self.items), names, [i for i in self.items if isinstance(i, Use)])
        return self._index

    def find(self, name: str) -> Item | None:
        """The first function, block or constant called ``name`` in this module."""
        return self._indexed()[1].get(name)

    @property
    def uses(self) -> list[Use]:
        """The module's `use` items, in order."""
        return self._indexed()[2]

    @property
    def item_names(self) -> list[str]:
        """Names of the module's functions, blocks and constants (for did-you-mean hints)."""
        return list(self._indexed()[1])
