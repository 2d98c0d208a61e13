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
