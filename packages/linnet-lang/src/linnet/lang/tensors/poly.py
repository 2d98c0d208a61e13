"""Polynomials in symbolic dims (``B * L``, ``L - 1``): the sizes of a graph exported with
symbolic batch and sequence dims (:mod:`linnet.lang.export`, the ONNX emitter's
``SymInt``), and their text as ONNX names a dim (``dim_param``).

>>> poly_text(poly_mul(((("B",), 1),), ((("L",), 1), ((), -1))))
'B*L-B'
"""

from __future__ import annotations

from typing import Any

Poly = tuple[tuple[tuple[str, ...], int], ...]
"""Sum of ``coefficient * product(dims)`` terms, sorted: ``((("B", "L"), 1),)`` is B * L."""


def poly_add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    out: dict[tuple[str, ...], int] = dict(a)
    for mono, c in b:
        out[mono] = out.get(mono, 0) + sign * c
    return tuple(sorted((m, c) for m, c in out.items() if c))


def poly_mul(a: Poly, b: Poly) -> Poly:
    out: Poly = ()
    for ma, ca in a:
        for mb, cb in b:
            out = poly_add(out, ((tuple(sorted(ma + mb)), ca * cb),))
    return out


def poly_text(poly: Poly) -> str:
    """``B*L``, ``L-1``, ``2*B+3``: how ONNX names a symbolic dim (``dim_param``).

    >>> poly_text(((("B", "L"), 1),)), poly_text((((), -1), (("L",), 1)))
    ('B*L', 'L-1')
    """
    parts = []
    for mono, c in sorted(poly, key=lambda t: (-len(t[0]), t[0])):
        body = "*".join(mono)
        term = (body if abs(c) == 1 else f"{abs(c)}*{body}") if body else str(abs(c))
        parts.append(("-" if c < 0 else "+") + term)
    text = "".join(parts) or "0"
    return text[1:] if text.startswith("+") else text


# A size that depends on a symbolic dim (linnet.lang.export.symbolic_dims fits them from
# lowerings at other sizes): a reshape to [B * L, D], an iota of length L, a slice to L - 1.
class SymInt(int):
    """A size or bound that is a polynomial in symbolic dims, with its value at the sizes
    the graph was lowered for: arithmetic keeps the polynomial, so a rule that computes
    ``size - 1`` gets ``L-1``.

    >>> n = SymInt(6, ((("L",), 1),))
    >>> n - 1, int(n * 2)
    (<L-1=5>, 12)
    """

    poly: Poly

    def __new__(cls, value: int, poly: Poly) -> Any:
        if all(not mono for mono, _ in poly):  # no dim left: a plain int
            return int(value)
        out = super().__new__(cls, value)
        out.poly = poly
        return out

    def __repr__(self) -> str:
        return f"<{poly_text(self.poly)}={int(self)}>"

    __str__ = int.__repr__

    def __reduce__(self) -> Any:  # copy, deepcopy and pickle keep the polynomial
        return (SymInt, (int(self), self.poly))

    @staticmethod
    def poly_of(x: int) -> Poly:
        return x.poly if isinstance(x, SymInt) else (((), int(x)),) if x else ()

    def _op(self, other: Any, fn: Any, poly: Any) -> Any:
        if not isinstance(other, int) or isinstance(other, bool):
            return fn(int(self), other)
        return SymInt(fn(int(self), int(other)), poly(SymInt.poly_of(self), SymInt.poly_of(other)))

    def __add__(self, o: Any) -> Any:
        return self._op(o, int.__add__, poly_add)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Any:
        return self._op(o, int.__sub__, lambda a, b: poly_add(a, b, -1))

    def __rsub__(self, o: Any) -> Any:
        return self._op(o, lambda a, b: b - a, lambda a, b: poly_add(b, a, -1))

    def __mul__(self, o: Any) -> Any:
        return self._op(o, int.__mul__, poly_mul)

    __rmul__ = __mul__

    def __neg__(self) -> Any:
        return SymInt(-int(self), poly_add((), self.poly, -1))
