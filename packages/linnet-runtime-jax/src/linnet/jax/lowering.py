"""Lowering an entry for the JAX runtime, and the precision its products run at: the pieces
that :mod:`linnet.jax.model`, :mod:`linnet.jax.export` and :mod:`linnet.jax.generate` share.

They live below those three so that none imports another to reach them (export and generate
are called by ``Model``; they used to import ``model`` back from inside their functions).

>>> from linnet.jax.lowering import matmul_precision
>>> matmul_precision("fast")                                          # doctest: +ELLIPSIS
<contextlib.nullcontext object at ...>
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from linnet.lang.check.driver import lower
from linnet.lang.grad import has_grad_clauses
from linnet.lang.ir.graph import Graph
from linnet.lang.syntax.program import Program


def lower_entry(
    program: Program, entry: str, shapes: dict, config: dict | None, weights: dict | None
) -> tuple[Graph, dict[int, Any] | None]:
    """The entry's graph and, where the program has grad clauses, each call's clause: a
    Pallas kernel's backward under jax.grad (emit/jax.py). Recording clauses lowers every
    layer on its own, so a program without one is lowered as before.

    >>> graph, clauses = lower_entry(program, "decode", {"token": [1], "pos": [1]},
    ...                              config, None)                   # doctest: +SKIP
    """
    clauses: dict[int, Any] | None = {} if has_grad_clauses(program) else None
    graph = lower(program, entry, shapes, config, weights, check=False, grad_clauses=clauses)
    return graph, clauses


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
