"""Entry inputs checked before anything runs: count, type, dtype and index ranges.

The same checks, with the same codes and messages, as linnet-runtime-torch's
``linnet.torch.inputs`` (E0720 count, E0721 not an array, E0722 dtype, E0780 a value outside
the range its input may take, E0782 shapes that index past an axis whatever the values): a
model rejects the same bad input the same way whichever runtime runs it. Ranges come from
:func:`linnet.lang.passes.bounds.input_bounds`. Inputs are jax arrays or NumPy arrays (nothing
else is converted: a Python int or list is E0721). Arrays being traced (an outer ``jax.jit``)
have no values to check: only their dtypes are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from linnet.lang import LinnetError
from linnet.lang.host.inputs import check_count, dtype_error, error, in_range, range_error, short
from linnet.lang.host.paged import PAGED_ENTRIES, check_paged_inputs
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.bounds import bounds_for

from .weights import numpy_dtype


def is_array(value: Any) -> bool:
    """A jax array (concrete or traced) or a NumPy array."""
    if isinstance(value, np.ndarray):
        return True
    import jax

    return isinstance(value, jax.Array)


def type_error(entry: str, name: str, value: Any, graph: Graph | None) -> LinnetError:
    """E0721: ``value`` for input ``name`` is not an array."""
    want = "jnp.asarray(...)"
    if graph is not None and name in graph.values:
        vt = graph.values[name]
        want = f"jnp.asarray(..., dtype=jnp.{numpy_dtype(vt.dtype).name}) of shape {list(vt.shape)}"
    return error(
        "E0721",
        f"input `{name.lstrip('%')}` of `{entry}` must be a jax or NumPy "
        f"array, got {type(value).__name__} {short(value)}",
        help=f"wrap it: {want} (Python ints and lists are not converted: their "
        "dtype would be a guess)",
    )


def check_inputs(graph: Graph, inputs: Sequence[Any], entry: str) -> None:
    """Check ``inputs`` of ``graph`` (an entry lowered for their shapes) before it runs.

    Raises the PyTorch runtime's codes: E0784 (not a list), E0720 (count), E0721 (not an
    array), E0722 (dtype), E0780 (a value outside its range, naming the input, the first
    bad index and value, the range and what the input indexes).

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<V: Dim> {
    ...     param t: Tensor[V; f32]
    ...     entry get(i: Tensor[1; i32]) -> Tensor[1; f32] {
    ...         let out[k] = self.t[i[k]]
    ...         return out
    ...     }
    ... }''')
    >>> g = lower(prog, "get", {"i": [1]}, {"V": 4})
    >>> check_inputs(g, [np.array([3], np.int32)], "get")
    >>> check_inputs(g, [np.array([4], np.int32)], "get")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0780]: input `i` of `get` has 4 at index [0]...
    """
    check_count(entry, graph.inputs, inputs, "array")
    for name, t in zip(graph.inputs, inputs):
        if not is_array(t):
            raise type_error(entry, name, t, graph)
        vt = graph.values[name]
        want = numpy_dtype(vt.dtype)
        if np.dtype(t.dtype) != want:
            raise dtype_error(
                entry, name, np.dtype(t.dtype).name, vt.dtype, f"{name[1:]}.astype(jnp.{want.name})"
            )
    bounds = bounds_for(graph)
    if not bounds.inputs:
        return
    import jax

    for name, t in zip(graph.inputs, inputs):
        r = bounds.inputs.get(name)
        if r is None or t.size == 0:
            continue
        try:
            # One copy to the host per input used as an index (token ids, positions).
            host = np.asarray(t)
        except jax.errors.TracerArrayConversionError:
            continue  # traced under an outer jit: no values to check yet
        if not in_range(r, int(host.min()), int(host.max())):
            # The message's first bad index and value, read from a flat copy as ints.
            raise range_error(
                graph, entry, r, host.reshape(-1).astype(np.int64).tolist(), host.shape
            )
    if entry in PAGED_ENTRIES:
        _check_paged(graph, entry, inputs)


def _check_paged(graph: Graph, entry: str, inputs: Sequence[Any]) -> None:
    """A paged entry's positions against the cache's S (E0690), where they have values."""
    import jax

    values = {}
    for name, t in zip(graph.inputs, inputs):
        if name[1:] in ("pos", "start", "n"):
            try:
                values[name[1:]] = np.asarray(t).reshape(-1).astype(np.int64).tolist()
            except jax.errors.TracerArrayConversionError:
                return  # traced under an outer jit: no values to check yet
    check_paged_inputs(graph, entry, values)
