"""Entry inputs, as every runtime checks them: counts (E0720, E0784), names (E0783),
element types (E0722) and index ranges (E0780), with the same messages in the torch and JAX
runtimes and in exported models' checks (:mod:`linnet.lang.export_checks`). Pure Python: each
runtime computes what it alone can (a dtype's name, an input's smallest and largest value on
its device) and passes it here.

>>> error("E0713", "numerics must be 'exact' or 'fast', not 'quick'").diagnostics[0].code
'E0713'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linnet.lang.diagnostics.core import LinnetError, coded_error
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.bounds import InputRange, dim_names

# The examples' model: `get` reads row `i[k]` of a table of V rows, so `i` is an index input.
GATHER_EXAMPLE = """
model M<V: Dim, N: Dim> {
    param t: Tensor[V; f32]
    entry get(i: Tensor[N; i32]) -> Tensor[N; f32] {
        let out[k] = self.t[i[k]]
        return out
    }
}"""

error = coded_error  # the name the runtimes import


def short(value: Any) -> str:
    """``repr(value)`` cut to 40 characters, for messages that show what was passed.

    >>> short(list(range(30)))
    '[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11...'
    """
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- entry inputs
def check_count(
    entry: str, names: Sequence[str], inputs: Any, noun: str, example: str = ""
) -> None:
    """E0784 where ``inputs`` is no list or tuple, E0720 where it holds another number of
    values than the entry's inputs ``names`` (a leading ``%`` is dropped); ``noun`` is what
    the runtime calls one value ("tensor", "array"), ``example`` the call the help shows
    (default: the input names in brackets).

    >>> check_count("decode", ["%token", "%pos"], [1], "tensor")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0720]: entry `decode` takes 2 inputs...
    """
    shown = ", ".join(n.lstrip("%") for n in names)
    if not isinstance(inputs, list | tuple):
        raise error(
            "E0784",
            f"the inputs of `{entry}` must be a list or tuple of {noun}s, got "
            f"{type(inputs).__name__}",
            help=f"pass one {noun} per input: {example or f'[{shown}]'}",
        )
    if len(inputs) != len(names):
        raise error(
            "E0720", f"entry `{entry}` takes {len(names)} inputs ({shown}), got {len(inputs)}"
        )


def bind_inputs(
    entry: str, names: Sequence[str], given: Sequence[Any], named: dict[str, Any]
) -> list[Any]:
    """Inputs given by position (``given``) and by name (``named``) in the entry's order:
    E0720 for too many or a missing one, E0783 for an unknown name or one given twice.

    >>> bind_inputs("decode", ["token", "pos"], [7], {"pos": 0})
    [7, 0]
    >>> bind_inputs("decode", ["token", "pos"], [7], {"token": 1})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0783]: input `token` of `decode` is given...
    """
    shown = ", ".join(names)
    out: dict[str, Any] = dict(zip(names, given))
    if len(given) > len(names):
        raise error(
            "E0720",
            f"entry `{entry}` takes {len(names)} inputs ({shown}), got {len(given) + len(named)}",
        )
    for key, value in named.items():
        if key not in names:
            raise error(
                "E0783", f"entry `{entry}` has no input `{key}`", help=f"its inputs are: {shown}"
            )
        if key in out:
            raise error(
                "E0783",
                f"input `{key}` of `{entry}` is given twice (by position and by name)",
                help=f"its inputs are, in order: {shown}",
            )
        out[key] = value
    missing = [p for p in names if p not in out]
    if missing:
        raise error(
            "E0720",
            f"entry `{entry}` takes {len(names)} inputs ({shown}); missing: {', '.join(missing)}",
        )
    return [out[p] for p in names]


def dtype_error(
    entry: str, name: str, got: str, declared: str, convert: str, why: bool = True
) -> LinnetError:
    """E0722: input ``name`` of ``entry`` has element type ``got`` (as the array library
    prints it), the entry declares ``declared``; ``convert`` is the call that fixes it.

    >>> print(dtype_error("get", "%i", "float32", "i32", "i.astype(jnp.int32)"))
    error[E0722]: input `i` of `get` is float32, the entry declares i32
      = help: convert it: `i.astype(jnp.int32)` (nothing is converted silently: ...
    """
    return error(
        "E0722",
        f"input `{name.lstrip('%')}` of `{entry}` is {got}, the entry declares {declared}",
        help=f"convert it: `{convert}`"
        + (
            " (nothing is converted silently: a float token id or position is a mistake)"
            if why
            else ""
        ),
    )


def in_range(r: InputRange, lo: int, hi: int) -> bool:
    """Whether an index input whose smallest value is ``lo`` and largest ``hi`` is in its
    range ``r`` (each runtime computes the two on its device, then calls this).

    >>> from linnet.lang import Program, lower
    >>> from linnet.lang.passes.bounds import input_bounds
    >>> g = lower(Program.from_text(GATHER_EXAMPLE), "get", {"i": [1]}, {"V": 4})
    >>> r = input_bounds(g).inputs["%i"]
    >>> in_range(r, 0, 3), in_range(r, 0, 4)
    (True, False)
    """
    return not (r.empty or lo < r.lo or hi >= r.hi)


def range_error(
    graph: Graph, entry: str, r: InputRange, values: Sequence[int], shape: Sequence[int]
) -> LinnetError:
    """E0780 for an index input outside its range ``r``: ``values`` are its elements as
    Python ints in row-major order (a host copy: only made on this error path), ``shape``
    its shape. Names the input, the first bad index and value, how many are bad, the range
    and what the input indexes, and says how to fix it.

    >>> from linnet.lang import Program, lower
    >>> from linnet.lang.passes.bounds import input_bounds
    >>> g = lower(Program.from_text(GATHER_EXAMPLE), "get", {"i": [2]}, {"V": 4})
    >>> range_error(g, "get", input_bounds(g).inputs["%i"], [1, 9], [2]).diagnostics[0].message
    'input `i` of `get` has 9 at index [1]; every value must be in [0, 4): `i` indexes axis 0 ...'
    """
    return range_error_of(entry, range_parts(graph, r), values, shape)


def range_parts(graph: Graph, r: InputRange) -> dict[str, Any]:
    """What E0780 says of range ``r``, as plain data (JSON): an exported model keeps it
    (linnet.lang.export_checks) to raise the runtimes' error without the graph.

    >>> from linnet.lang import Program, lower
    >>> from linnet.lang.passes.bounds import input_bounds
    >>> g = lower(Program.from_text(GATHER_EXAMPLE), "get", {"i": [2]}, {"V": 4})
    >>> parts = range_parts(g, input_bounds(g).inputs["%i"])
    >>> parts["input"], parts["lo"], parts["hi"], parts["text"]
    ('i', 0, 4, 'in [0, 4)')
    """

    def help_for(use: Any) -> str:
        if use.target.startswith("@") and use.target[1:] in graph.states:
            names = dim_names(graph, use.size)
            dim = " or ".join(names) if names else "the size of that axis"
            return (
                f"give values {r.text()}; the state holds {use.size} entries along "
                f"that axis: to go further, load the model with a larger {dim} in the "
                "config"
            )
        return (
            f"give values {r.text()}; the size comes from the weights or the config: is "
            "this input from another vocabulary or model?"
        )

    return {
        "input": r.input.lstrip("%"),
        "lo": r.lo,
        "hi": r.hi,
        "text": r.text(),
        "empty": r.empty,
        "lower": r.lower.describe(graph),
        "upper": r.upper.describe(graph),
        "lower_help": help_for(r.lower),
        "upper_help": help_for(r.upper),
    }


def range_error_of(
    entry: str, parts: dict[str, Any], values: Sequence[int], shape: Sequence[int]
) -> LinnetError:
    """E0780 from :func:`range_parts`' data and the input's values and shape."""
    name, lo, hi, text = parts["input"], parts["lo"], parts["hi"], parts["text"]
    if parts["empty"]:
        return error(
            "E0780",
            f"no value of input `{name}` of `{entry}` is valid: it indexes "
            f"{parts['lower']} and {parts['upper']}",
            help="the model's indices cannot all be in range for these shapes",
        )
    bad = [k for k, v in enumerate(values) if v < lo or v >= hi]
    first = bad[0] if bad else 0
    where: list[int] = []
    rest = first
    for size in reversed(list(shape)):  # row-major, as numpy.unravel_index
        where.insert(0, rest % size if size else 0)
        rest = rest // size if size else 0
    value = int(values[first])
    more = f" ({len(bad)} values are out of range)" if len(bad) > 1 else ""
    low = value < lo
    message = (
        f"input `{name}` of `{entry}` has {value} at index {where}{more}; every value "
        f"must be {text}: `{name}` indexes {parts['lower' if low else 'upper']}"
    )
    if low and value < 0:
        help = f"give values {text}; negative values do not count from the end in Linnet"
    else:
        help = parts["lower_help" if low else "upper_help"]
    return error("E0780", message, help=help)
