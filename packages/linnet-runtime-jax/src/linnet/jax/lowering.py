"""The precision the JAX runtime's products run at: what :mod:`linnet.jax.model` and
:mod:`linnet.jax.generate` share. (Lowering an entry is
:func:`linnet.lang.compiler.compile_entry`, which the model and :mod:`linnet.jax.export` call.)

It lives below those so that neither imports the other to reach it (generate is called by
``Model``; it used to import ``model`` back from inside its functions).

>>> from linnet.jax.lowering import matmul_precision
>>> matmul_precision("fast")                                          # doctest: +ELLIPSIS
<contextlib.nullcontext object at ...>
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any


def compiler_options(numerics: str) -> dict[str, Any]:
    """XLA's options for jitting an entry. Exact: ``xla_allow_excess_precision`` off, so that
    every rounding the graph makes happens: with it on (XLA's default), a bf16 value that is
    converted to f32 next (``(a + b) as f32``, the logits' ``as f32``, a residual that a norm
    reads) was kept in f32, and 45% of such values were not bf16 values. Fast: XLA's default.
    A caller jitting :attr:`linnet.jax.model.Lowered.function` itself passes these
    too.

    >>> compiler_options("exact"), compiler_options("fast")
    ({'xla_allow_excess_precision': False}, {})
    """
    return {"xla_allow_excess_precision": False} if numerics == "exact" else {}


def matmul_precision(numerics: str) -> AbstractContextManager:
    """Exact: every product at full precision, also those inside library calls (the fused
    attention) that take no ``precision=``; fast: the backend's default.

    >>> with matmul_precision("exact"):                               # doctest: +SKIP
    ...     outputs = jitted(params, states, inputs)
    """
    if numerics != "exact":
        return nullcontext()
    import jax  # jax is imported on first use, not with the package (see linnet.jax)

    return jax.default_matmul_precision("highest")
