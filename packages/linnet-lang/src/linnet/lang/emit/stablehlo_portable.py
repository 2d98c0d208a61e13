"""StableHLO portable artifacts: the text in a form StableHLO's serializer takes at a target
version, and the artifact itself (MLIR bytecode in the versioned VHLO dialect).

A portable artifact may hold StableHLO operations only, each one the target version has:

* ``erf`` is no StableHLO operation. The text's ``chlo.erf`` is refused by StableHLO's
  serializer (``stablehlo.serialize_portable_artifact``) at every version, and jax's
  (``jax.extend.mlir.serialize_portable_artifact``) rewrites it as a ``stablehlo.composite``,
  which needs 0.19.0. So a portable text computes erf from StableHLO arithmetic
  (:func:`erf`): the rational approximations XLA itself expands ``chlo.erf`` to (Eigen's for
  f32, f16 and bf16 computed in f32; Cephes' for f64).
* ``stablehlo.composite`` (a std op with its decomposition) exists from VHLO 0.19.0: below it
  each std op is a ``func.call`` of the same private function.
* The oldest target is the oldest version the installed jaxlib's StableHLO writes
  (``get_minimum_version()``: 0.9.0 with jax 0.10.2), the newest its own
  (``get_current_version()``: 1.17.0); one outside them, or no version, is E0946.

>>> parse_version("1.0.0"), parse_version("0.19")
((1, 0, 0), (0, 19, 0))
>>> composites_at((0, 18, 0)), composites_at((0, 19, 0))
(False, True)
"""

from __future__ import annotations

import re
import struct
import sys
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.emit.stablehlo_edges import Scope, compare

COMPOSITE_SINCE = (0, 19, 0)
"""The first VHLO version with ``stablehlo.composite`` (``vhlo.composite_v1``)."""

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    """``"1.0.0"`` (or ``"1.0"``) as a tuple; E0946 for anything else."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.(\d+))?\s*", text)
    if m is None:
        raise LinnetError(
            Diagnostic(
                "E0946",
                f"`{text}` is no StableHLO version",
                help="give a version such as 1.0.0, or `--portable` alone for the oldest one "
                "jaxlib writes",
            )
        )
    return int(m[1]), int(m[2]), int(m[3] or 0)


def version_text(v: Version) -> str:
    return ".".join(str(p) for p in v)


def composites_at(version: Version) -> bool:
    """Whether a portable artifact at ``version`` keeps the std ops as composites."""
    return version >= COMPOSITE_SINCE


def _stablehlo() -> Any:
    try:
        from jax._src.interpreters import mlir as _jmlir  # noqa: F401  (registers dialects)
        from jaxlib.mlir.dialects import stablehlo
    except ImportError:
        raise LinnetError(
            Diagnostic(
                "E0942",
                "writing a portable StableHLO artifact needs jax, which is not installed",
                help="install it with `pip install 'linnet-lang[stablehlo]'`, or write the text "
                "(leave out --portable)",
            )
        ) from None
    return stablehlo


def supported() -> tuple[Version, Version]:
    """The oldest and the newest target version the installed jaxlib writes."""
    s = _stablehlo()
    return parse_version(s.get_minimum_version()), parse_version(s.get_current_version())


def target(version: str | None) -> Version:
    """The target version asked for (None: the oldest jaxlib writes), checked against what
    jaxlib writes: E0946 outside it."""
    oldest, newest = supported()
    if version is None:
        return oldest
    v = parse_version(version)
    if not oldest <= v <= newest:
        jax = getattr(sys.modules.get("jax"), "__version__", "?")
        raise LinnetError(
            Diagnostic(
                "E0946",
                f"cannot write a portable StableHLO artifact for version "
                f"{version_text(v)}: the installed jaxlib (jax {jax}) writes versions "
                f"{version_text(oldest)} to {version_text(newest)}",
                help=f"target a version from {version_text(oldest)} to {version_text(newest)} "
                f"(std ops stay composites from {version_text(COMPOSITE_SINCE)}), or "
                "install a jax whose StableHLO writes the one you need",
            )
        )
    return v


def serialize(text: str, version: Version) -> bytes:
    """The portable artifact (VHLO bytecode) of portable ``text`` at ``version``, written by
    StableHLO's own serializer (``stablehlo.serialize_portable_artifact_str``, the strict
    one: CHLO and operations newer than the target are refused). A refusal is a bug in the
    emitter (E0943)."""
    s = _stablehlo()
    from jax._src.interpreters import mlir as jmlir

    with jmlir.make_ir_context():
        try:
            return bytes(s.serialize_portable_artifact_str(text, version_text(version)))
        except Exception as exc:  # MLIRError / ValueError: "failed to serialize module"
            raise LinnetError(
                Diagnostic(
                    "E0943",
                    f"StableHLO's serializer refuses the portable text at "
                    f"{version_text(version)}: {str(exc).strip().splitlines()[0]}",
                    help="this is a bug in linnet-lang's StableHLO emitter: please report it",
                )
            ) from None


def deserialize(artifact: bytes) -> str:
    """The StableHLO text of a portable artifact (for tests and for reading one back)."""
    s = _stablehlo()
    from jax._src.interpreters import mlir as jmlir

    with jmlir.make_ir_context() as context:
        return str(s.deserialize_portable_artifact(context, artifact))


# ---------------------------------------------------------------- erf in StableHLO arithmetic
def _f32(v: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", v))[0])


# Eigen's generic_fast_erf_float, as XLA expands chlo.erf for f32 (x clamped to [-4, 4]):
# erf(x) = x * alpha(x^2) / beta(x^2), clamped to [-1, 1]. Highest degree first.
_ALPHA = [
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
]
_BETA = [
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
]
# Cephes' ndtr.c, as XLA expands chlo.erf for f64: |x| < 1: x * T(x^2) / U(x^2); else
# 1 - erfc(x), erfc(|x|) = exp(-x^2) * P(|x|) / Q(|x|) below 8, R / S above.
_T = [
    9.60497373987051638749e0,
    9.00260197203842689217e1,
    2.23200534594684319226e3,
    7.00332514112805075473e3,
    5.55923013010394962768e4,
]
_U = [
    1.0,
    3.35617141647503099647e1,
    5.21357949780152679795e2,
    4.59432382970980127987e3,
    2.26290000613890934246e4,
    4.92673942608635921086e4,
]
_P = [
    2.46196981473530512524e-10,
    5.64189564831068821977e-1,
    7.46321056442269912687e0,
    4.86371970985681366614e1,
    1.96520832956077098242e2,
    5.26445194995477358631e2,
    9.34528527171957607540e2,
    1.02755188689515710272e3,
    5.57535335369399327526e2,
]
_Q = [
    1.0,
    1.32281951154744992508e1,
    8.67072140885989742329e1,
    3.54937778887819891062e2,
    9.75708501743205489753e2,
    1.82390916687909736289e3,
    2.24633760818710981792e3,
    1.65666309194161350182e3,
    5.57535340817727675546e2,
]
_R = [
    5.64189583547755073984e-1,
    1.27536670759978104416e0,
    5.01905042251180477414e0,
    6.16021097993053585195e0,
    7.40974269950448939160e0,
    2.97886665372100240670e0,
]
_S = [
    1.0,
    2.26052863220117276590e0,
    9.39603524938001434673e0,
    1.20489539808096656605e1,
    1.70814450747565897222e1,
    9.60896809063285878198e0,
    3.36907645100081516050e0,
]
_MAXLOG = 7.09782712893383996843e2  # exp(-x^2) is 0 in f64 below -MAXLOG


def _full(n: Scope, value: float, like: str) -> str:
    shape, dt = n.types[like]
    return n.coerce(n.const(value, dt), None, shape)


def _bin(n: Scope, op: str, a: str, b: str) -> str:
    shape, dt = n.types[a]
    return n.op(f"stablehlo.{op}", [a, b], shape, dt)


def _horner(n: Scope, coefs: list[float], x: str) -> str:
    p = _full(n, coefs[0], x)
    for c in coefs[1:]:
        p = _bin(n, "add", _bin(n, "multiply", p, x), _full(n, c, x))
    return p


def _lt(n: Scope, a: str, b: str) -> str:
    return compare(n, a, b, "LT")


def _select(n: Scope, c: str, a: str, b: str) -> str:
    shape, dt = n.types[a]
    return n.op("stablehlo.select", [c, a, b], shape, dt)


def _erf_f32(n: Scope, x: str) -> str:
    shape, _ = n.types[x]
    x = n.op("stablehlo.clamp", [_full(n, -4.0, x), x, _full(n, 4.0, x)], shape, "f32")
    x2 = _bin(n, "multiply", x, x)
    p = _bin(n, "multiply", x, _horner(n, [_f32(c) for c in _ALPHA], x2))
    y = _bin(n, "divide", p, _horner(n, [_f32(c) for c in _BETA], x2))
    return n.op("stablehlo.clamp", [_full(n, -1.0, y), y, _full(n, 1.0, y)], shape, "f32")


def _erf_f64(n: Scope, x: str) -> str:
    shape, _ = n.types[x]
    x2 = _bin(n, "multiply", x, x)
    small = _bin(n, "divide", _bin(n, "multiply", x, _horner(n, _T, x2)), _horner(n, _U, x2))
    z = n.op("stablehlo.negate", [x2], shape, "f64")
    e = n.op("stablehlo.exponential", [z], shape, "f64")
    a = n.op("stablehlo.abs", [x], shape, "f64")
    near = _bin(n, "divide", _bin(n, "multiply", e, _horner(n, _P, a)), _horner(n, _Q, a))
    far = _bin(n, "divide", _bin(n, "multiply", e, _horner(n, _R, a)), _horner(n, _S, a))
    erfc = _select(n, _lt(n, a, _full(n, 8.0, a)), near, far)
    erfc = _select(n, _lt(n, z, _full(n, -_MAXLOG, z)), _full(n, 0.0, z), erfc)
    erfc = _select(
        n, _lt(n, x, _full(n, 0.0, x)), _bin(n, "subtract", _full(n, 2.0, x), erfc), erfc
    )
    large = _bin(n, "subtract", _full(n, 1.0, x), erfc)
    return _select(n, _lt(n, a, _full(n, 1.0, a)), small, large)


def erf(n: Scope, x: str) -> str:
    """erf of ``x`` from StableHLO arithmetic only, as XLA expands ``chlo.erf`` (NaN gives
    NaN, +-inf gives +-1); f16 and bf16 are computed in f32.

    >>> erf(scope, "%x")                                                # doctest: +SKIP
    """
    dt = n.types[x][1]
    if dt == "f64":
        return _erf_f64(n, x)
    return n.coerce(_erf_f32(n, n.coerce(x, "f32")), dt)
