"""Random index-notation programs and what NumPy says they compute (a test helper).

:func:`index_programs` is a Hypothesis strategy for :class:`Case`: the Linnet source of a
one-entry model (or of an op that a tiny model's entry calls), the entry's input shapes and
data, the config binding its generics, and the expected result computed directly in NumPy.

The NumPy side never looks at the compiler's output. Every intermediate is an array with one
axis per index variable in :data:`VARS` (size 1 where the value does not depend on it), so
that elementwise operations broadcast, a reduction over ``k`` reduces axis ``k``, and any read
``x[e0, e1, ...]`` is advanced indexing by the index expressions evaluated as integer arrays
(out-of-range positions read 0, as the language says for computed positions).

Input data are multiples of 1/4 in [-2, 2], so that sums, products, truncating casts and
comparisons of exact sub-expressions give the same answer in any summation order; only
nodes marked inexact (exp, division, mean, ...) need the comparison's tolerance, and neither
comparisons nor integer casts are applied to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

VARS = ("i", "j", "k", "l", "m", "n", "p", "q")
AXIS = {v: a for a, v in enumerate(VARS)}
NV = len(VARS)

FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("i32", "i64")
RANK = {"bool": 0, "i32": 3, "i64": 4, "f16": 5, "bf16": 5, "f32": 6, "f64": 7}
NP = {
    "bool": np.bool_,
    "i32": np.int32,
    "i64": np.int64,
    "f16": np.float16,
    "bf16": np.float32,
    "f32": np.float32,
    "f64": np.float64,
}


def promote(a: str, b: str) -> str:
    """The documented promotion rule (dtypes.py): the wider type; bf16 with f16 is f32."""
    if a == b:
        return a
    if {a, b} == {"bf16", "f16"}:
        return "f32"
    return a if RANK[a] >= RANK[b] else b


def accumulator(kind: str, dtype: str) -> str:
    if kind in ("max", "min"):
        return dtype
    if dtype in ("bf16", "f16"):
        return "f32"
    if dtype == "bool" or dtype in INTS:
        return "i64" if kind != "mean" else "f32"
    return dtype


def is_float(d: str) -> bool:
    return d in FLOATS


def full_iota(v: str, size: int) -> np.ndarray:
    shape = [1] * NV
    shape[AXIS[v]] = size
    return np.arange(size, dtype=np.int64).reshape(shape)


def as_full(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape((1,) * NV) if a.ndim == 0 else a


Env = dict[str, np.ndarray]


@dataclass
class Node:
    src: str
    fn: Callable[[Env], Any]  # full-rank array of dtype NP[dtype], or a Python scalar (literal)
    dtype: str  # a dtype, or "float" / "int" for a weak literal
    exact: bool = True
    free: frozenset = frozenset()
    plain: frozenset = frozenset()  # index variables read as a plain index somewhere
    literal: bool = False
    plain_read: bool = False  # a read whose every index is a variable or a composite


@dataclass
class Input:
    name: str
    dims: list[str]
    shape: list[int]
    dtype: str
    data: np.ndarray


@dataclass
class Local:
    name: str
    vars: list[str]  # the variable each axis was bound to
    dtype: str
    data: np.ndarray
    exact: bool


@dataclass
class Case:
    source: str
    inputs: dict[str, list[int]]
    data: dict[str, np.ndarray]
    config: dict[str, int]
    expected: np.ndarray
    exact: bool


@dataclass
class Gen:
    draw: Any
    rng: np.random.Generator
    sizes: dict[str, int]
    generic: bool
    inputs: list[Input] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)  # extra generics S0.. -> size
    used: set[str] = field(default_factory=set)  # generics used in types and ranges
    reads: int = 0
    locals: list[Local] = field(default_factory=list)  # earlier `let u0[...] = ...` results

    # ------------------------------------------------------------ dims
    def dim(self, v: str) -> str:
        if not self.generic:
            return str(self.sizes[v])
        self.used.add(v.upper())
        return v.upper()

    def new_axis(self, size: int) -> str:
        if not self.generic:
            return str(size)
        name = f"S{len(self.extra)}"
        self.extra[name] = size
        self.used.add(name)
        return name

    def add_input(self, prefix: str, dims: list[str], shape: list[int], dtype: str) -> str:
        name = f"{prefix}{len(self.inputs)}"
        if dtype == "f32":
            data = (self.rng.integers(-8, 9, size=shape) / 4).astype(np.float32)
        else:
            data = np.zeros(shape, dtype=NP[dtype])
        self.inputs.append(Input(name, dims, shape, dtype, data))
        return name

    def data_of(self, name: str) -> Input:
        return next(i for i in self.inputs if i.name == name)

    # ------------------------------------------------------------ reads
    def index_var(self, avail: list[str]) -> str:
        return self.draw(st.sampled_from(sorted(avail)))

    def read(
        self, avail: list[str], plain_only: bool = False, must: list[str] | None = None
    ) -> Node:
        """`t[e0, e1, ...]` of a fresh input whose axes fit the index expressions, or a read
        of an earlier statement's result."""
        draw = self.draw
        if self.locals and draw(st.integers(0, 2)) == 0:
            node = self.read_local(avail, draw(st.sampled_from(self.locals)), plain_only, must)
            if node is not None:
                return node
        self.reads += 1
        rank = draw(st.integers(1, 3))
        atoms: list[tuple[str, str, int, Callable[[Env], np.ndarray], str | None]] = []
        in_read: list[str] = []
        plain: set[str] = set()
        free: set[str] = set()
        pending = list(must or [])
        kinds = (
            ["var"] * 5
            + ([] if plain_only else ["affine", "affine", "data", "const", "repeat"])
            + ["composite"]
        )
        for _ in range(max(rank, len(pending))):
            fresh = [v for v in avail if v not in in_read]
            kind = "var" if pending else draw(st.sampled_from(kinds))
            if kind == "composite" and len(fresh) < 2:
                kind = "var"
            if kind == "var" and not fresh:
                kind = "const" if not plain_only else "stop"
            if kind == "repeat" and not in_read:
                kind = "const"
            if kind == "stop":
                break
            if kind == "var":
                v = pending.pop(0) if pending else self.index_var(fresh)
                if v in in_read:
                    continue
                in_read.append(v)
                plain.add(v)
                free.add(v)
                size = self.sizes[v]
                atoms.append((v, self.dim(v), size, lambda env, v=v, s=size: full_iota(v, s), None))
            elif kind == "composite":
                v = self.index_var(fresh)
                w = self.index_var([x for x in fresh if x != v])
                in_read += [v, w]
                free |= {v, w}
                sv, sw = self.sizes[v], self.sizes[w]
                dim = f"{self.dim(v)} * {self.dim(w)}" if self.generic else str(sv * sw)
                atoms.append(
                    (
                        f"({v}, {w})",
                        dim,
                        sv * sw,
                        lambda env, v=v, w=w, sv=sv, sw=sw: (
                            full_iota(v, sv) * sw + full_iota(w, sw)
                        ),
                        None,
                    )
                )
            elif kind == "affine":
                v = self.index_var(avail)
                free.add(v)
                sv = self.sizes[v]
                form = draw(st.integers(0, 6))
                c = draw(st.integers(1, 2))
                w = self.index_var(avail)
                sw = self.sizes[w]
                forms: list[tuple[str, Callable[[Env], np.ndarray]]] = [
                    (f"{v} + {c}", lambda env, v=v, sv=sv, c=c: full_iota(v, sv) + c),
                    (f"{v} - {c}", lambda env, v=v, sv=sv, c=c: full_iota(v, sv) - c),
                    (f"{c + 1} * {v}", lambda env, v=v, sv=sv, c=c: (c + 1) * full_iota(v, sv)),
                    (f"{v} / {c + 1}", lambda env, v=v, sv=sv, c=c: full_iota(v, sv) // (c + 1)),
                    (
                        f"({v} + 1) % {c + 1}",
                        lambda env, v=v, sv=sv, c=c: (full_iota(v, sv) + 1) % (c + 1),
                    ),
                    (f"{self.dim(v)} - 1 - {v}", lambda env, v=v, sv=sv: sv - 1 - full_iota(v, sv)),
                    (
                        f"{v} + {w}",
                        lambda env, v=v, sv=sv, w=w, sw=sw: full_iota(v, sv) + full_iota(w, sw),
                    ),
                ]
                text, fn = forms[form]
                if form == 6:
                    free.add(w)
                size = draw(st.integers(1, 5))
                atoms.append((text, self.new_axis(size), size, fn, None))
            elif kind == "data":
                v = self.index_var(avail)
                free.add(v)
                plain.add(v)
                size = draw(st.integers(1, 5))
                ix = self.add_input("x", [self.dim(v)], [self.sizes[v]], "i32")
                self.data_of(ix).data = self.rng.integers(0, size, size=self.sizes[v]).astype(
                    np.int32
                )
                atoms.append(
                    (
                        f"{ix}[{v}]",
                        self.new_axis(size),
                        size,
                        lambda env, ix=ix, v=v, sv=self.sizes[v]: env[ix].astype(np.int64)[
                            full_iota(v, sv)
                        ],
                        None,
                    )
                )
            elif kind == "const":
                c = draw(st.integers(0, 3))
                size = draw(st.integers(1, 4))
                atoms.append(
                    (
                        str(c),
                        self.new_axis(size),
                        size,
                        lambda env, c=c: np.array(c, dtype=np.int64),
                        None,
                    )
                )
            else:  # repeat: a variable already used in this read, again
                v = self.index_var(in_read)
                size = draw(st.sampled_from([self.sizes[v], max(1, self.sizes[v] - 1)]))
                dim = self.dim(v) if size == self.sizes[v] else self.new_axis(size)
                atoms.append(
                    (v, dim, size, lambda env, v=v, sv=self.sizes[v]: full_iota(v, sv), None)
                )
        if not atoms:
            atoms.append(("0", self.new_axis(1), 1, lambda env: np.array(0, dtype=np.int64), None))
        name = self.add_input("t", [a[1] for a in atoms], [a[2] for a in atoms], "f32")
        sizes = [a[2] for a in atoms]
        fns = [a[3] for a in atoms]

        def fn(env: Env, name=name, sizes=sizes, fns=fns) -> np.ndarray:
            x = env[name]
            idx = [np.asarray(f(env)) for f in fns]
            shape = np.broadcast_shapes(*(i.shape for i in idx))
            idx = [np.broadcast_to(i, shape) for i in idx]
            ok = np.ones(shape, dtype=bool)
            for i, s in zip(idx, sizes):
                ok &= (i >= 0) & (i < s)
            safe = tuple(np.where(ok, i, 0) for i in idx)
            return as_full(np.where(ok, x[safe], np.float32(0)).astype(np.float32))

        src = f"{name}[{', '.join(a[0] for a in atoms)}]"
        is_plain = all(
            (
                "+" not in a[0]
                and "-" not in a[0]
                and "*" not in a[0]
                and "/" not in a[0]
                and "%" not in a[0]
                and "[" not in a[0]
                and not a[0].isdigit()
            )
            for a in atoms
        ) and len({a[0] for a in atoms}) == len(atoms)
        return Node(src, fn, "f32", True, frozenset(free), frozenset(plain), plain_read=is_plain)

    def read_local(
        self, avail: list[str], loc: Local, plain_only: bool, must: list[str] | None
    ) -> Node | None:
        """`u0[j, i + 1, 2]`: a read of an earlier result (plain, shifted or constant)."""
        draw = self.draw
        atoms: list[tuple[str, Callable[[Env], np.ndarray]]] = []
        in_read: list[str] = []
        plain: set[str] = set()
        free: set[str] = set()
        pending = list(must or [])
        for u in loc.vars:
            size = self.sizes[u]
            fits = [
                v
                for v in avail
                if v not in in_read and (v == u if self.generic else self.sizes[v] == size)
            ]
            forced = pending.pop(0) if pending and pending[0] in fits else None
            kind = (
                "var"
                if plain_only or forced
                else draw(st.sampled_from(["var", "var", "var", "shift", "const"]))
            )
            if kind == "var" and not fits:
                if plain_only:
                    return None
                kind = "const"
            if kind == "var":
                v = forced or draw(st.sampled_from(sorted(fits)))
                in_read.append(v)
                plain.add(v)
                free.add(v)
                atoms.append((v, lambda env, v=v, s=size: full_iota(v, s)))
            elif kind == "shift":
                v = self.index_var(avail)
                free.add(v)
                c = draw(st.integers(-2, 2))
                text = f"{v} + {c}" if c >= 0 else f"{v} - {-c}"
                atoms.append((text, lambda env, v=v, c=c: full_iota(v, self.sizes[v]) + c))
            else:
                c = draw(st.integers(0, size))
                atoms.append((str(c), lambda env, c=c: np.array(c, dtype=np.int64)))
        if pending or len(atoms) != len(loc.vars):
            return None
        self.reads += 1
        sizes = [self.sizes[u] for u in loc.vars]
        fns = [a[1] for a in atoms]
        t = NP[loc.dtype]

        def fn(env: Env, name=loc.name, sizes=sizes, fns=fns, t=t) -> np.ndarray:
            x = env[name]
            idx = [np.asarray(f(env)) for f in fns]
            shape = np.broadcast_shapes(*(i.shape for i in idx))
            idx = [np.broadcast_to(i, shape) for i in idx]
            ok = np.ones(shape, dtype=bool)
            for i, s in zip(idx, sizes):
                ok &= (i >= 0) & (i < s)
            safe = tuple(np.where(ok, i, 0) for i in idx)
            return as_full(np.where(ok, x[safe], np.zeros((), dtype=t)).astype(t))

        is_plain = all(a[0] in in_read for a in atoms)
        return Node(
            f"{loc.name}[{', '.join(a[0] for a in atoms)}]",
            fn,
            loc.dtype,
            loc.exact,
            frozenset(free),
            frozenset(plain),
            plain_read=is_plain,
        )

    # ------------------------------------------------------------ expressions
    def literal(self) -> Node:
        text = self.draw(st.sampled_from(["0.5", "2.0", "1.0", "0.25", "3", "2", "0"]))
        if "." in text:
            return Node(text, lambda env, v=float(text): v, "float", literal=True)
        return Node(text, lambda env, v=int(text): v, "int", literal=True)

    def var_value(self, avail: list[str]) -> Node:
        v = self.index_var(avail)
        return Node(
            v,
            lambda env, v=v, s=self.sizes[v]: full_iota(v, s).astype(np.int32),
            "i32",
            True,
            frozenset({v}),
        )

    def expr(self, avail: list[str], depth: int) -> Node:
        draw = self.draw
        leaves = ["read", "read", "read", "lit"] + (["var"] if avail else [])
        inner = ["unary", "arith", "arith", "select", "cast", "reduce", "contract", "compare"]
        kind = draw(st.sampled_from(leaves + (inner if depth > 0 and self.reads < 5 else [])))
        if kind == "read":
            return self.read(avail)
        if kind == "lit":
            return self.literal()
        if kind == "var":
            return self.var_value(avail)
        if kind == "unary":
            return self.unary(self.tensor(avail, depth - 1))
        if kind == "arith":
            return self.arith(self.expr(avail, depth - 1), self.expr(avail, depth - 1), avail)
        if kind == "compare":
            return self.as_number(self.compare(avail, depth - 1))
        if kind == "select":
            cond = self.compare(avail, depth - 1)
            if draw(st.booleans()):
                other = self.compare(avail, depth - 1)
                op = draw(st.sampled_from(["&&", "||"]))
                f = np.logical_and if op == "&&" else np.logical_or
                cond = Node(
                    f"({cond.src} {op} {other.src})",
                    lambda env, a=cond.fn, b=other.fn, f=f: as_full(f(a(env), b(env))),
                    "bool",
                    True,
                    cond.free | other.free,
                    cond.plain | other.plain,
                )
            if draw(st.booleans()):
                cond = Node(
                    f"(!{cond.src})",
                    lambda env, a=cond.fn: as_full(~a(env)),
                    "bool",
                    True,
                    cond.free,
                    cond.plain,
                )
            return self.select(
                cond, self.expr(avail, depth - 1), self.expr(avail, depth - 1), avail
            )
        if kind == "cast":
            return self.cast(self.tensor(avail, depth - 1))
        if kind == "reduce":
            return self.reduce(avail, depth - 1)
        return self.contract(avail, depth - 1)

    def tensor(self, avail: list[str], depth: int) -> Node:
        n = self.expr(avail, depth)
        return n if not n.literal else self.read(avail)

    def as_number(self, n: Node) -> Node:
        if n.dtype != "bool":
            return n
        return self.cast(n, self.draw(st.sampled_from(["f32", "i32"])))

    def numeric(self, v: Any, dtype: str) -> np.ndarray:
        return as_full(np.asarray(v).astype(NP[dtype]))

    def unary(self, x: Node) -> Node:
        draw = self.draw
        if x.dtype == "bool":
            return Node(
                f"(!{x.src})",
                lambda env, a=x.fn: as_full(~a(env)),
                "bool",
                x.exact,
                x.free,
                x.plain,
            )
        if not is_float(x.dtype):
            if draw(st.booleans()):
                op = draw(st.sampled_from(["-", "abs"]))
                src = f"(-{x.src})" if op == "-" else f"abs({x.src})"
                f = np.negative if op == "-" else np.abs
                return Node(
                    src, lambda env, a=x.fn, f=f: f(a(env)), x.dtype, x.exact, x.free, x.plain
                )
            x = self.cast(x, "f32")
        t = NP[x.dtype]
        ops: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray], bool]] = {
            "neg": ("(-{})", np.negative, True),
            "abs": ("abs({})", np.abs, True),
            "floor": ("floor({})", np.floor, True),
            "exp": ("exp({})", np.exp, False),
            "tanh": ("tanh({})", np.tanh, False),
            "sin": ("sin({})", np.sin, False),
            "cos": ("cos({})", np.cos, False),
            "sigmoid": ("sigmoid({})", lambda a: 1 / (1 + np.exp(-a)), False),
            "sqrt": ("sqrt(abs({}))", lambda a: np.sqrt(np.abs(a)), False),
            "log": ("log(abs({}) + 1.0)", lambda a: np.log(np.abs(a) + t(1.0)), False),
            "rsqrt": ("rsqrt(abs({}) + 1.0)", lambda a: 1 / np.sqrt(np.abs(a) + t(1.0)), False),
        }
        name = draw(st.sampled_from(sorted(ops)))
        fmt, f, exact = ops[name]
        return Node(
            fmt.format(x.src),
            lambda env, a=x.fn, f=f, t=t: as_full(np.asarray(f(a(env))).astype(t)),
            x.dtype,
            exact and x.exact,
            x.free,
            x.plain,
        )

    def binary_types(self, a: Node, b: Node) -> str:
        """The operation's dtype, as elementwise() picks it (tensors promote, literals weak)."""
        tensors = [n.dtype for n in (a, b) if not n.literal]
        dtype = tensors[0]
        for d in tensors[1:]:
            dtype = promote(dtype, d)
        if any(n.literal and n.dtype == "float" for n in (a, b)) and not is_float(dtype):
            dtype = "f32"
        return dtype

    def arith(self, a: Node, b: Node, avail: list[str]) -> Node:
        draw = self.draw
        if a.literal and b.literal:
            b = self.read(avail)
        if a.dtype == "bool" and (b.dtype == "bool" or b.literal):
            a = self.cast(a, "f32")
        if b.dtype == "bool" and a.literal:
            b = self.cast(b, "f32")
        if a.exact and not a.literal and is_float(a.dtype) and draw(st.integers(0, 3)) == 0:
            a = self.cast(a, draw(st.sampled_from(INTS)))  # integer arithmetic, more often
        dtype = self.binary_types(a, b)
        op = draw(st.sampled_from(["+", "-", "*", "/", "%", "max", "min"]))
        t = NP[dtype]
        if op in ("/", "%"):
            # A safe divisor: a non-zero literal for integers, |b| + 1 for floats.
            if is_float(dtype) and not b.literal and draw(st.booleans()):
                if b.dtype == "bool":
                    b = self.cast(b, "f32")  # `abs` of a bool is E0355: convert first
                b = Node(
                    f"(abs({b.src}) + 1.0)",
                    lambda env, f=b.fn, t=NP[b.dtype]: as_full(np.abs(np.asarray(f(env))) + t(1.0)),
                    b.dtype if b.dtype != "bool" else "f32",
                    False,
                    b.free,
                    b.plain,
                )
                if b.dtype not in FLOATS:
                    b = self.cast(b, "f32")
                dtype = self.binary_types(a, b)
                t = NP[dtype]
            else:
                c = draw(
                    st.sampled_from(
                        [2, 3, -2, -3] if not is_float(dtype) else [2.0, 0.5, -4.0, 0.75]
                    )
                )
                if a.literal:
                    a = self.read(avail)
                    dtype = self.binary_types(
                        a,
                        Node(
                            str(c),
                            lambda env: c,
                            "float" if isinstance(c, float) else "int",
                            literal=True,
                        ),
                    )
                    t = NP[dtype]
                b = Node(
                    f"({c})" if c < 0 else str(c),
                    lambda env, c=c: c,
                    "float" if isinstance(c, float) else "int",
                    literal=True,
                )
                # The literal replaced b: the operation's dtype is a's with it (a bf16 `a`
                # divided by 2.0 stays bf16, whatever b was).
                dtype = self.binary_types(a, b)
                t = NP[dtype]
                if a.dtype == "bool":
                    a = self.cast(a, "f32")
                    dtype = self.binary_types(a, b)
                    t = NP[dtype]
        if dtype == "bool":
            a, b = self.cast(a, "f32"), b
            dtype = self.binary_types(a, b)
            t = NP[dtype]

        def f(env: Env, a=a.fn, b=b.fn, t=t, op=op) -> np.ndarray:
            x, y = np.asarray(a(env)).astype(t), np.asarray(b(env)).astype(t)
            if op == "+":
                r = x + y
            elif op == "-":
                r = x - y
            elif op == "*":
                r = x * y
            elif op == "/":
                r = np.floor_divide(x, y) if np.issubdtype(t, np.integer) else x / y
            elif op == "%":
                r = np.remainder(x, y)
            elif op == "max":
                r = np.maximum(x, y)
            else:
                r = np.minimum(x, y)
            return as_full(np.asarray(r).astype(t))

        exact = a.exact and b.exact and (op not in ("/", "%") or not is_float(dtype))
        src = f"{op}({a.src}, {b.src})" if op in ("max", "min") else f"({a.src} {op} {b.src})"
        return Node(src, f, dtype, exact, a.free | b.free, a.plain | b.plain)

    def compare(self, avail: list[str], depth: int) -> Node:
        draw = self.draw
        a = self.exact_operand(avail, depth)
        b = self.exact_operand(avail, depth)
        if a.literal and b.literal:
            b = self.read(avail)
        if (a.dtype == "bool") != (b.dtype == "bool"):
            if a.dtype == "bool":
                a = self.cast(a, "f32")
            else:
                b = self.cast(b, "f32")
        ops = ["==", "!="] if a.dtype == "bool" else ["<", "<=", ">", ">=", "==", "!="]
        op = draw(st.sampled_from(ops))
        fns = {
            "<": np.less,
            "<=": np.less_equal,
            ">": np.greater,
            ">=": np.greater_equal,
            "==": np.equal,
            "!=": np.not_equal,
        }
        dtype = self.binary_types(a, b) if a.dtype != "bool" else "bool"
        t = NP[dtype]
        return Node(
            f"({a.src} {op} {b.src})",
            lambda env, a=a.fn, b=b.fn, f=fns[op], t=t: as_full(
                f(np.asarray(a(env)).astype(t), np.asarray(b(env)).astype(t))
            ),
            "bool",
            True,
            a.free | b.free,
            a.plain | b.plain,
        )

    def exact_operand(self, avail: list[str], depth: int) -> Node:
        for _ in range(3):
            n = self.expr(avail, depth)
            if n.exact:
                return n
        return self.read(avail)

    def select(self, cond: Node, x: Node, y: Node, avail: list[str]) -> Node:
        if x.literal and y.literal:
            y = self.read(avail)
        if x.dtype == "bool" and (y.dtype == "bool" or y.literal):
            x = self.cast(x, "f32")
        if y.dtype == "bool" and x.literal:
            y = self.cast(y, "f32")
        dtype = self.binary_types(x, y)
        t = NP[dtype]
        return Node(
            f"select({cond.src}, {x.src}, {y.src})",
            lambda env, c=cond.fn, a=x.fn, b=y.fn, t=t: as_full(
                np.where(c(env), np.asarray(a(env)).astype(t), np.asarray(b(env)).astype(t))
            ),
            dtype,
            x.exact and y.exact,
            cond.free | x.free | y.free,
            cond.plain | x.plain | y.plain,
        )

    def cast(self, x: Node, to: str | None = None) -> Node:
        if to is None:
            choices = ["f32", "f64", "bf16", "f16"] + (["i32", "i64", "bool"] if x.exact else [])
            to = self.draw(st.sampled_from(choices))
        t = NP[to]

        def f(env: Env, a=x.fn, t=t, src=x.dtype) -> np.ndarray:
            v = np.asarray(a(env))
            if src == "float":
                v = v.astype(np.float64)
            return as_full(v.astype(t))

        exact = x.exact and not (to == "f16" and x.dtype != "f16")
        if x.literal:  # a cast of a literal folds to a literal of that type
            lit = x.fn({})
            return Node(
                f"({x.src} as {to})",
                lambda env, v=lit, t=t: as_full(np.asarray(v).astype(t)),
                to,
                exact,
                x.free,
                x.plain,
            )
        return Node(f"({x.src} as {to})", f, to, exact, x.free, x.plain)

    def fresh(self, avail: list[str], count: int) -> list[str]:
        pool = [v for v in VARS if v not in avail]
        count = min(count, len(pool))
        if count == 0:
            return []
        return self.draw(
            st.lists(st.sampled_from(pool), min_size=count, max_size=count, unique=True)
        )

    def binders(self, names: list[str], plain: frozenset) -> str:
        parts = []
        for v in names:
            parts.append(
                v if v in plain and self.draw(st.integers(0, 3)) else f"{v}: {self.dim(v)}"
            )
        return ", ".join(parts)

    def reduce(self, avail: list[str], depth: int) -> Node:
        draw = self.draw
        kvars = self.fresh(avail, draw(st.integers(1, 2)))
        if not kvars:
            return self.read(avail)
        body = self.expr(avail + kvars, depth)
        kind = draw(st.sampled_from(["sum", "max", "min", "mean", "prod", "sum"]))
        if body.literal:
            body = self.read(avail + kvars)
        if body.dtype == "bool" and kind in ("max", "min"):
            body = self.cast(body, "f32")
        if kind == "prod" and not (body.plain_read or body.literal):
            kind = "sum"
        acc_override = draw(st.sampled_from([None, None, None, "f64", "f32"]))
        if acc_override and kind in ("max", "min"):
            acc_override = None
        acc = acc_override or accumulator(kind, body.dtype)
        out_dtype = body.dtype if kind in ("max", "min") else acc
        axes = tuple(AXIS[v] for v in kvars)
        sizes = dict(self.sizes)

        def f(
            env: Env,
            b=body.fn,
            kind=kind,
            acc=NP[acc],
            out=NP[out_dtype],
            axes=axes,
            kvars=kvars,
            sizes=sizes,
        ) -> np.ndarray:
            x = as_full(np.asarray(b(env)))
            shape = list(x.shape)
            for v in kvars:
                shape[AXIS[v]] = sizes[v]
            x = np.broadcast_to(x, shape).astype(acc)
            if kind == "sum":
                r = np.sum(x, axis=axes, keepdims=True, dtype=acc)
            elif kind == "prod":
                r = np.prod(x, axis=axes, keepdims=True, dtype=acc)
            elif kind == "mean":
                r = np.sum(x, axis=axes, keepdims=True, dtype=acc) / acc(
                    np.prod([sizes[v] for v in kvars])
                )
            elif kind == "max":
                r = np.max(x, axis=axes, keepdims=True)
            else:
                r = np.min(x, axis=axes, keepdims=True)
            return np.asarray(r).astype(out)

        head = f"{kind}<{acc_override}>" if acc_override else kind
        src = f"({head}[{self.binders(kvars, body.plain)}] {body.src})"
        return Node(
            src, f, out_dtype, body.exact and kind != "mean", body.free - set(kvars), body.plain
        )

    def contract(self, avail: list[str], depth: int) -> Node:
        """`sum[k] a[..k..] * b[..k..]`, optionally cast and times a factor without k."""
        draw = self.draw
        kvars = self.fresh(avail, draw(st.integers(1, 2)))
        if not kvars:
            return self.read(avail)
        a = self.read(avail + kvars, plain_only=True, must=kvars[:1])
        b = self.read(avail + kvars, plain_only=True, must=kvars[-1:])
        if draw(st.booleans()):
            a = self.cast(a, draw(st.sampled_from(["f64", "bf16", "f32", "i32"])))
        factor = None
        if draw(st.booleans()):
            factor = self.literal() if draw(st.booleans()) else self.read(avail)
        acc_override = draw(st.sampled_from([None, None, "f64"]))
        dtype = promote(a.dtype, b.dtype)
        acc = acc_override or accumulator("sum", dtype)
        axes = tuple(AXIS[v] for v in kvars)
        sizes = dict(self.sizes)

        def f(
            env: Env, a=a.fn, b=b.fn, t=NP[dtype], acc=NP[acc], axes=axes, kvars=kvars, sizes=sizes
        ) -> np.ndarray:
            x = np.asarray(a(env)).astype(t).astype(acc)
            y = np.asarray(b(env)).astype(t).astype(acc)
            prod = x * y
            shape = list(prod.shape)
            for v in kvars:
                shape[AXIS[v]] = sizes[v]
            prod = np.broadcast_to(prod, shape)
            return np.sum(prod, axis=axes, keepdims=True, dtype=acc)

        head = f"sum<{acc_override}>" if acc_override else "sum"
        body = f"{a.src} * {b.src}" + (f" * {factor.src}" if factor else "")
        plain = a.plain | b.plain | (factor.plain if factor else frozenset())
        node = Node(
            f"({head}[{self.binders(kvars, a.plain | b.plain)}] {body})",
            f,
            acc,
            a.exact and b.exact,
            (a.free | b.free) - set(kvars),
            plain,
        )
        if factor is None:
            return node
        res = self.arith_fixed(node, factor, "*")
        res.src = node.src  # the factor is already inside the reduction's text
        res.plain = plain
        return res

    def arith_fixed(self, a: Node, b: Node, op: str) -> Node:
        dtype = self.binary_types(a, b)
        t = NP[dtype]
        fns = {"*": np.multiply}
        return Node(
            f"({a.src} {op} {b.src})",
            lambda env, a=a.fn, b=b.fn, t=t, f=fns[op]: as_full(
                np.asarray(f(np.asarray(a(env)).astype(t), np.asarray(b(env)).astype(t))).astype(t)
            ),
            dtype,
            a.exact and b.exact,
            a.free | b.free,
            a.plain | b.plain,
        )


@st.composite
def index_programs(draw: Any) -> Case:
    seed = draw(st.integers(0, 2**32 - 1))
    sizes = {v: draw(st.integers(1, 4)) for v in VARS}
    gen = Gen(draw, np.random.default_rng(seed), sizes, generic=draw(st.booleans()))
    nout = draw(st.integers(1, 3))
    out = draw(st.lists(st.sampled_from(VARS[:5]), min_size=nout, max_size=nout, unique=True))
    # Earlier statements whose results later reads may use: let u0[i, k] = ...
    lines = []
    env: Env = {}
    for li in range(draw(st.integers(0, 2))):
        nvars = draw(st.integers(1, 3))
        lvars = draw(
            st.lists(st.sampled_from(VARS[:6]), min_size=nvars, max_size=nvars, unique=True)
        )
        n = gen.expr(list(lvars), draw(st.integers(0, 2)))
        if n.literal:
            n = gen.cast(n, "f32")
        env.update({i.name: i.data for i in gen.inputs})
        data = expand(n.fn(env), lvars, sizes)
        lines.append(f"let u{li}[{gen.binders(lvars, n.plain)}] = {n.src}")
        gen.locals.append(Local(f"u{li}", list(lvars), n.dtype, data.astype(NP[n.dtype]), n.exact))
        env[f"u{li}"] = gen.locals[-1].data
    depth = draw(st.integers(1, 3))
    node = gen.expr(list(out), depth)
    if node.literal or node.dtype != "f32":
        node = gen.cast(node, "f32")
    # Result binders, optionally merged into composite axes: let y[(i, j), k] = ...
    groups: list[list[str]] = []
    rest = list(out)
    while rest:
        take = 2 if len(rest) >= 2 and draw(st.integers(0, 3)) == 0 else 1
        groups.append(rest[:take])
        rest = rest[take:]
    binder_text = []
    for g in groups:
        parts = gen.binders(g, node.plain)
        binder_text.append(parts if len(g) == 1 else f"({parts})")
    out_dims = []
    out_shape = []
    for g in groups:
        if gen.generic:
            out_dims.append(" * ".join(gen.dim(v) for v in g))
        else:
            out_dims.append(str(int(np.prod([sizes[v] for v in g]))))
        out_shape.append(int(np.prod([sizes[v] for v in g])))
    # Expected value: broadcast to the result's variables, in the binders' order.
    env.update({i.name: i.data for i in gen.inputs})
    expected = expand(node.fn(env), out, sizes).reshape(out_shape).astype(np.float32)

    generics = sorted(gen.used)
    params = ", ".join(f"{i.name}: Tensor[{', '.join(i.dims)}; {i.dtype}]" for i in gen.inputs)
    result = f"Tensor[{', '.join(out_dims)}; f32]"
    body = "\n        ".join([*lines, f"let y[{', '.join(binder_text)}] = {node.src}", "return y"])
    gdecl = f"<{', '.join(f'{g}: Dim' for g in generics)}>" if generics else ""
    if draw(st.booleans()):
        source = (
            f"model M{gdecl} {{\n    entry run({params}) -> {result} {{\n        "
            f"{body}\n    }}\n}}\n"
        )
    else:
        gargs = f"<{', '.join(generics)}>" if generics else ""
        source = (
            f"pub op f{gdecl}({params}) -> {result} {{\n        {body}\n}}\n\n"
            f"model M{gdecl} {{\n    entry run({params}) -> {result} {{\n        "
            f"return f{gargs}({', '.join(i.name for i in gen.inputs)})\n    }}\n}}\n"
        )
    config = {
        g: (sizes[g.lower()] if g.lower() in sizes and len(g) == 1 else gen.extra[g])
        for g in generics
    }
    data = {i.name: i.data for i in gen.inputs}
    return Case(source, {i.name: i.shape for i in gen.inputs}, data, config, expected, node.exact)


def expand(value: Any, names: list[str], sizes: dict[str, int]) -> np.ndarray:
    """A full-rank value as the array over ``names`` (in that order) that it stands for."""
    full = as_full(np.asarray(value))
    shape = [1] * NV
    for v in names:
        shape[AXIS[v]] = sizes[v]
    full = np.broadcast_to(full, shape)
    order = [AXIS[v] for v in names] + [a for a in range(NV) if VARS[a] not in names]
    return np.transpose(full, order).reshape([sizes[v] for v in names])


# ==================================================================== state writes
@dataclass
class StateCase:
    source: str
    inputs: dict[str, list[int]]
    data: dict[str, np.ndarray]
    config: dict[str, int]
    state: np.ndarray  # the state's value before the call
    expected: np.ndarray  # ... and after it (also what the entry returns)


@st.composite
def state_programs(draw: Any) -> StateCase:
    """Entries that write a state once or twice (`self.s[n, (k + 1) % 3, 0] = x[k, n]`) and
    return it, and the state NumPy computes by assigning element by element."""
    import itertools

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    generic = draw(st.booleans())
    sizes = {v: draw(st.integers(1, 3)) for v in VARS[:4]}
    state_vars = draw(st.lists(st.sampled_from(VARS[:4]), min_size=1, max_size=3, unique=True))
    used: dict[str, int] = {}

    def dim(v: str) -> str:
        if not generic:
            return str(sizes[v])
        used[v.upper()] = sizes[v]
        return v.upper()

    def extra(size: int) -> str:
        if not generic:
            return str(size)
        name = f"S{len([u for u in used if u.startswith('S')])}"
        used[name] = size
        return name

    # The state's axes: one per variable (its position a function of that variable), plus
    # constant axes; their order is shuffled.
    axes: list[tuple[str, str]] = [("var", v) for v in state_vars]
    axes += [("const", "")] * draw(st.integers(0, 1))
    if draw(st.booleans()):
        axes.append(("repeat", draw(st.sampled_from(state_vars))))
    axes = draw(st.permutations(axes))
    state_dims: list[str] = []
    state_shape: list[int] = []
    for kind, v in axes:
        if kind == "const":
            size = draw(st.integers(1, 3))
            state_dims.append(extra(size))
        else:
            size = sizes[v]
            state_dims.append(dim(v))
        state_shape.append(size)
    inputs: list[tuple[str, list[str], list[int], str, np.ndarray]] = []
    lines = []
    state = (rng.integers(-8, 9, size=state_shape) / 4).astype(np.float32)
    expected = state.copy()
    for _ in range(draw(st.integers(1, 2))):
        positions: list[tuple[str, Callable[[dict[str, int]], int]]] = []
        plain: set[str] = set()
        for axis, (kind, v) in enumerate(axes):
            size = state_shape[axis]
            if kind == "const":
                c = draw(st.integers(0, size - 1))
                positions.append((str(c), lambda e, c=c: c))
                continue
            form = draw(st.sampled_from(["plain", "plain", "shift", "reverse", "data"]))
            if kind == "repeat" and form == "plain":
                form = "shift"
            if form == "plain":
                plain.add(v)
                positions.append((v, lambda e, v=v: e[v]))
            elif form == "shift":
                c = draw(st.integers(0, 2))
                positions.append(
                    (f"({v} + {c}) % {dim(v)}", lambda e, v=v, c=c: (e[v] + c) % sizes[v])
                )
            elif form == "reverse":
                positions.append((f"{dim(v)} - 1 - {v}", lambda e, v=v: sizes[v] - 1 - e[v]))
            else:
                name = f"p{len(inputs)}"
                perm = rng.permutation(sizes[v]).astype(np.int32)
                inputs.append((name, [dim(v)], [sizes[v]], "i32", perm))
                positions.append((f"{name}[{v}]", lambda e, v=v, p=perm: int(p[e[v]])))
                plain.add(v)  # `p[v]` reads p plainly: v's range comes from it
        # The value reads the variables without a plain position, and maybe others.
        must = [v for v in state_vars if v not in plain]
        more = draw(st.lists(st.sampled_from(state_vars), unique=True, max_size=3))
        value_vars = list(dict.fromkeys(must + more))
        if value_vars or draw(st.booleans()):
            value_vars = draw(st.permutations(value_vars))
            name = f"x{len(inputs)}"
            data = (rng.integers(-8, 9, size=[sizes[v] for v in value_vars]) / 4).astype(np.float32)
            inputs.append(
                (name, [dim(v) for v in value_vars], [sizes[v] for v in value_vars], "f32", data)
            )
            value_src = f"{name}[{', '.join(value_vars)}]" if value_vars else name
            scale = draw(st.sampled_from(["", " * 2.0", " + 1.0"]))
            value_src += scale

            def value(e: dict[str, int], data=data, vv=tuple(value_vars), scale=scale) -> float:
                x = float(data[tuple(e[v] for v in vv)])
                return x * 2.0 if scale == " * 2.0" else (x + 1.0 if scale else x)
        else:
            c = draw(st.sampled_from([2.5, -1.0, 0.0]))
            value_src = str(c)

            def value(e: dict[str, int], c=c) -> float:
                return c

        lines.append(f"self.s[{', '.join(p[0] for p in positions)}] = {value_src}")
        for combo in itertools.product(*(range(sizes[v]) for v in state_vars)):
            e = dict(zip(state_vars, combo))
            expected[tuple(p[1](e) for p in positions)] = value(e)
    names = [f"r{a}" for a in range(len(state_shape))]
    lines.append(f"let y[{', '.join(names)}] = self.s[{', '.join(names)}]")
    lines.append("return y")
    generics = sorted(used)
    gdecl = f"<{', '.join(f'{g}: Dim' for g in generics)}>" if generics else ""
    state_type = f"Tensor[{', '.join(state_dims)}; f32]"
    params = ", ".join(
        f"{n}: Tensor[{', '.join(d)}; {t}]" if d else f"{n}: Tensor[; {t}]"
        for n, d, _, t, _ in inputs
    )
    body = "\n        ".join(lines)
    source = (
        f"model M{gdecl} {{\n    state s: {state_type}\n\n    entry run({params}) -> "
        f"{state_type} {{\n        {body}\n    }}\n}}\n"
    )
    return StateCase(
        source,
        {n: s for n, _, s, _, _ in inputs},
        {n: d for n, _, _, _, d in inputs},
        dict(used),
        state,
        expected,
    )
