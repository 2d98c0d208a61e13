"""Entry inputs checked before anything runs: count, type, dtype and index ranges.

The same checks, with the same codes and messages, as linnet-runtime-torch's
``linnet.torch.inputs`` (E0720 count, E0721 not an array, E0722 dtype, E0780 a value outside
the range its input may take, E0782 shapes that index past an axis whatever the values): a
model rejects the same bad input the same way whichever runtime runs it. Ranges come from
:func:`linnet.lang.ir.bounds.input_bounds`. Inputs are jax arrays or NumPy arrays (nothing
else is converted: a Python int or list is E0721). Arrays being traced (an outer ``jax.jit``)
have no values to check: only their dtypes are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from linnet.lang import LinnetError
from linnet.lang.diagnostics.core import Diagnostic
from linnet.lang.ir.bounds import InputRange, bounds_for, dim_names
from linnet.lang.ir.graph import Graph

from .weights import numpy_dtype


def _error(code: str, message: str, help: str = "") -> LinnetError:
    return LinnetError(Diagnostic(code, message, help=help))


def is_array(value: Any) -> bool:
    """A jax array (concrete or traced) or a NumPy array."""
    if isinstance(value, np.ndarray):
        return True
    import jax

    return isinstance(value, jax.Array)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def type_error(entry: str, name: str, value: Any, graph: Graph | None) -> LinnetError:
    """E0721: ``value`` for input ``name`` is not an array."""
    want = "jnp.asarray(...)"
    if graph is not None and name in graph.values:
        vt = graph.values[name]
        want = f"jnp.asarray(..., dtype=jnp.{numpy_dtype(vt.dtype).name}) of shape {list(vt.shape)}"
    return _error("E0721", f"input `{name.lstrip('%')}` of `{entry}` must be a jax or NumPy "
                  f"array, got {type(value).__name__} {_short(value)}",
                  help=f"wrap it: {want} (Python ints and lists are not converted: their "
                       "dtype would be a guess)")


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
    if not isinstance(inputs, list | tuple):
        raise _error("E0784", f"the inputs of `{entry}` must be a list or tuple of arrays, got "
                     f"{type(inputs).__name__}", help="pass one array per input: ["
                     + ", ".join(n.lstrip('%') for n in graph.inputs) + "]")
    if len(inputs) != len(graph.inputs):
        raise _error("E0720", f"entry `{entry}` takes {len(graph.inputs)} inputs "
                     f"({', '.join(n.lstrip('%') for n in graph.inputs)}), got {len(inputs)}")
    for name, t in zip(graph.inputs, inputs):
        if not is_array(t):
            raise type_error(entry, name, t, graph)
        vt = graph.values[name]
        want = numpy_dtype(vt.dtype)
        if np.dtype(t.dtype) != want:
            raise _error("E0722", f"input `{name[1:]}` of `{entry}` is {np.dtype(t.dtype).name}, "
                         f"the entry declares {vt.dtype}",
                         help=f"convert it: `{name[1:]}.astype(jnp.{want.name})` (nothing is "
                              "converted silently: a float token id or position is a mistake)")
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
        if r.empty or int(host.min()) < r.lo or int(host.max()) >= r.hi:
            raise _range_error(graph, entry, host, r)


def _range_error(graph: Graph, entry: str, t: np.ndarray, r: InputRange) -> LinnetError:
    name = r.input.lstrip("%")
    flat = t.reshape(-1).astype(np.int64)
    bad = np.nonzero((flat < r.lo) | (flat >= r.hi))[0]
    first = int(bad[0]) if len(bad) else 0
    where = [int(i) for i in np.unravel_index(first, t.shape)] if t.ndim else []
    value = int(flat[first])
    count = len(bad)
    more = f" ({count} values are out of range)" if count > 1 else ""
    if r.empty:
        return _error("E0780", f"no value of input `{name}` of `{entry}` is valid: it indexes "
                      f"{r.lower.describe(graph)} and {r.upper.describe(graph)}",
                      help="the model's indices cannot all be in range for these shapes")
    low = value < r.lo
    use = r.lower if low else r.upper
    message = (f"input `{name}` of `{entry}` has {value} at index {where}{more}; every value "
               f"must be {r.text()}: `{name}` indexes {use.describe(graph)}")
    if low and value < 0:
        help = (f"give values {r.text()}; negative values do not count from the end "
                "in Linnet")
    elif use.target.startswith("@") and use.target[1:] in graph.states:
        names = dim_names(graph, use.size)
        dim = " or ".join(names) if names else "the size of that axis"
        help = (f"give values {r.text()}; the state holds {use.size} entries along "
                f"that axis: to go further, load the model with a larger {dim} in the config")
    else:
        help = (f"give values {r.text()}; the size comes from the weights or the "
                "config: is this input from another vocabulary or model?")
    return _error("E0780", message, help=help)
