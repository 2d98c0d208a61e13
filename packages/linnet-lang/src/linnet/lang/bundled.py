"""The example models that ship inside linnet-lang's wheel (`linnet/lang/examples/`).

A built wheel carries the repository's `examples/llama` (copied in by hatch_build.py), so that
`linnet run`'s demo and plugins' tests work from an install alone, with no Linnet checkout.
An editable install in a checkout finds the repository's own folder instead.

>>> (example("llama") / "llama.linnet").is_file()
True
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def example(name: str = "llama") -> Path:
    """The folder of the example ``name``: its ``.linnet`` file and its ``configs/``.

    >>> sorted(p.name for p in (example() / "configs").glob("toy.json"))
    ['toy.json']
    """
    shipped = HERE / "examples" / name
    if shipped.is_dir():
        return shipped
    # An editable install: packages/linnet-lang/src/linnet/lang/ inside a checkout.
    checkout = HERE.parents[4] / "examples" / name
    if (checkout.parent.parent / "packages" / "linnet-lang").is_dir() and checkout.is_dir():
        return checkout
    raise LookupError(
        f"no example `{name}` in {HERE / 'examples'}: this linnet-lang was "
        "installed without its examples; reinstall it from a wheel"
    )
