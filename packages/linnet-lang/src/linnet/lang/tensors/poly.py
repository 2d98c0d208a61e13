"""Polynomials in symbolic dims (``B * L``, ``L - 1``): the sizes of a graph exported with
symbolic batch and sequence dims (:mod:`linnet.lang.export`, the ONNX emitter's
``SymInt``), and their text as ONNX names a dim (``dim_param``).

>>> poly_text(poly_mul(((("B",), 1),), ((("L",), 1), ((), -1))))
'B*L-B'
"""

from __future__ import annotations

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
