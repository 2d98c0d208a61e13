"""Dimensions: integer polynomials over generic names.

The checker works on generic code, where a dim is `H * HD` or `D / 2`; lowering works on
concrete shapes, where every dim is a constant. Both use :class:`Dim`, so the same rules run in
both. Two dims are equal when their normal forms are equal; distinct generics are distinct,
as in Rust's generics (a `where D == H * HD` clause makes them equal).

>>> D, H = Dim.symbol("D"), Dim.symbol("H")
>>> str(D * 2 + H - D)
'D + H'
>>> (D / 2).substitute({"D": Dim.const(8)}).value
4
"""

from __future__ import annotations

from fractions import Fraction

Monomial = tuple[str, ...]  # sorted symbol names, with repeats for powers


class Dim:
    __slots__ = ("_hash", "_value", "terms")

    def __init__(self, terms: dict[Monomial, Fraction]):
        self.terms = {m: c for m, c in terms.items() if c != 0}
        self._hash: int | None = None
        self._value: tuple[int | None] | None = None  # cached `value`

    @staticmethod
    def const(value: int | Fraction) -> Dim:
        return Dim({(): Fraction(value)})

    @staticmethod
    def symbol(name: str) -> Dim:
        return Dim({(name,): Fraction(1)})

    @property
    def is_const(self) -> bool:
        return all(m == () for m in self.terms)

    @property
    def value(self) -> int | None:
        """The integer value of a constant dim (None if symbolic or fractional)."""
        if self._value is None:
            if not self.is_const:
                self._value = (None,)
            else:
                c = self.terms.get((), Fraction(0))
                self._value = (int(c) if c.denominator == 1 else None,)
        return self._value[0]

    @property
    def exact(self) -> Fraction | None:
        return self.terms.get((), Fraction(0)) if self.is_const else None

    def symbols(self) -> set[str]:
        return {s for m in self.terms for s in m}

    def __add__(self, other: Dim | int) -> Dim:
        other = _as_dim(other)
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, Fraction(0)) + c
        return Dim(terms)

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return Dim({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Dim | int) -> Dim:
        return self + (-_as_dim(other))

    def __rsub__(self, other: Dim | int) -> Dim:
        return _as_dim(other) - self

    def __mul__(self, other: Dim | int) -> Dim:
        other = _as_dim(other)
        terms: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, Fraction(0)) + c1 * c2
        return Dim(terms)

    __rmul__ = __mul__

    def __truediv__(self, other: Dim | int) -> Dim:
        """Exact division; `floordiv` is the runtime integer division."""
        other = _as_dim(other)
        if other.is_const:
            c = other.exact
            if c is None or c == 0:
                raise ZeroDivisionError("division of a dimension by zero")
            return Dim({m: v / c for m, v in self.terms.items()})
        if len(other.terms) == 1:
            ((mono, coef),) = other.terms.items()
            out: dict[Monomial, Fraction] = {}
            for m, v in self.terms.items():
                rest = list(m)
                for s in mono:
                    if s in rest:
                        rest.remove(s)
                    else:
                        return _opaque(self, "/", other)
                out[tuple(rest)] = v / coef
            return Dim(out)
        return _opaque(self, "/", other)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            other = Dim.const(other)
        return isinstance(other, Dim) and self.terms == other.terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self.terms.items()))
        return self._hash

    def substitute(self, env: dict[str, Dim]) -> Dim:
        result = Dim.const(0)
        for m, c in self.terms.items():
            term = Dim.const(c)
            for s in m:
                term = term * (env[s] if s in env else Dim.symbol(s))
            result = result + term
        return result

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m in sorted(self.terms, key=lambda m: (len(m) == 0, m)):
            c = self.terms[m]
            names = " * ".join(_fmt_symbol(s) for s in m)
            if not m:
                text = (
                    str(c.numerator) if c.denominator == 1 else f"{c.numerator} / {c.denominator}"
                )
            elif c == 1:
                text = names
            elif c.denominator == 1:
                text = f"{c.numerator} * {names}"
            else:
                num = f"{c.numerator} * {names}" if c.numerator != 1 else names
                text = f"{num} / {c.denominator}"
            parts.append(text)
        out = parts[0]
        for p in parts[1:]:
            out += f" - {p[1:]}" if p.startswith("-") else f" + {p}"
        return out

    def __repr__(self) -> str:
        return f"Dim({self})"


def _fmt_symbol(name: str) -> str:
    return f"({name})" if " " in name else name


def _opaque(a: Dim, op: str, b: Dim) -> Dim:
    return Dim.symbol(f"{a} {op} {b}")


def _as_dim(x: Dim | int | Fraction) -> Dim:
    return x if isinstance(x, Dim) else Dim.const(x)


def solve_for(expr: Dim, target: Dim, unknowns: set[str]) -> tuple[str, Dim] | None:
    """Solve `expr == target` for the single unknown that appears linearly in `expr`.

    >>> solve_for(Dim.symbol("H") * 64, Dim.const(2048), {"H"})
    ('H', Dim(32))
    """
    present = expr.symbols() & unknowns
    if len(present) != 1:
        return None
    (name,) = present
    coef = Dim.const(0)
    rest = Dim.const(0)
    for m, c in expr.terms.items():
        count = m.count(name)
        if count > 1:
            return None
        if count == 1:
            others = list(m)
            others.remove(name)
            coef = coef + Dim({tuple(others): c})
        else:
            rest = rest + Dim({m: c})
    if coef == Dim.const(0):
        return None
    value = (target - rest) / coef
    return name, value
