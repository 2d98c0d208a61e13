"""A paged KV cache, as every runtime loads and checks it (docs/models.md, "Serving").

``load(..., kv_pages=NP, kv_page_size=PS)`` sets a model's configs ``kv_pages`` and
``kv_page_size``: its attention caches become pools of NP pages of PS positions (std.nn.paged)
that its entries ``decode_paged`` and ``prefill_paged`` read and write through a page table.
:func:`paged_config` checks the two values and that the model declares them (E0688, E0689);
:func:`check_paged_inputs` checks what the index-range analysis cannot (E0690): a prefill
chunk's last real position ``start + n - 1`` and a decode position below the cache's ``S``.
Table entries (``[0, NP)``), ``n`` (``[1, L]``) and ``start >= 0`` are E0780, derived from
the graph as every index input's range is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.ir.graph import Graph

#: The entries of a paged model (the contract the serving engine codes against).
DECODE_PAGED = "decode_paged"
PREFILL_PAGED = "prefill_paged"
PAGED_ENTRIES = (DECODE_PAGED, PREFILL_PAGED)
#: The model configs load(kv_pages=, kv_page_size=) sets.
PAGE_CONFIGS = ("kv_pages", "kv_page_size")


def _declares(program: Any, name: str) -> bool:
    from linnet.lang.check.driver import find_model

    decl = find_model(program, None)
    return any(m.kind == "config" and m.name == name for m in decl.members)


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise coded_error(
            "E0688",
            f"{name} must be an integer of at least {least}, not {value!r}",
            help="load(..., kv_pages=NP, kv_page_size=PS): NP pages of PS positions "
            "(page 0 is the sink page no sequence owns, so NP >= 2), e.g. kv_pages=1024, "
            "kv_page_size=16",
        )
    return value


def paged_config(
    program: Any, kv_pages: Any, kv_page_size: Any, config: Mapping[str, Any]
) -> dict[str, int]:
    """The configs ``kv_pages`` and ``kv_page_size`` that load's arguments give (``{}``
    when both are None: the dense cache). E0688 for a value that is no integer, fewer than
    2 pages (page 0 is the sink page), a page size below 1, a page size without pages, or
    a value that contradicts ``config``; E0689 where the model declares no such configs.

    >>> from linnet.lang.syntax.program import Program, model_file
    >>> llama = Program.from_file(model_file("std.models.llama"))
    >>> paged_config(llama, 64, 16, {})
    {'kv_pages': 64, 'kv_page_size': 16}
    >>> paged_config(llama, None, None, {})
    {}
    """
    if kv_pages is None and kv_page_size is None:
        return {}
    if kv_pages is None:
        raise coded_error(
            "E0688",
            f"kv_page_size={kv_page_size!r} is given without kv_pages",
            help="give the pool's size too: load(..., kv_pages=NP, kv_page_size=PS)",
        )
    out = {"kv_pages": _count("kv_pages", kv_pages, 2)}
    if kv_page_size is not None:
        out["kv_page_size"] = _count("kv_page_size", kv_page_size, 1)
    for name, value in out.items():
        if name in config and config[name] != value:
            raise coded_error(
                "E0688",
                f"{name}={value} contradicts the config's {name} = {config[name]!r}",
                help=f"give {name} once: as load's argument or in the config",
            )
    from linnet.lang.check.driver import find_model

    missing = [n for n in PAGE_CONFIGS if not _declares(program, n)]
    if missing:
        name = find_model(program, None).name
        raise coded_error(
            "E0689",
            f"model `{name}` has no paged KV cache: it declares no "
            + " and ".join(f"`{n}`" for n in missing)
            + " config",
            help="every std model (std.models.*) has one; a model of your own builds its "
            "layers from std.nn.decoder's blocks, declares `config kv_pages: Dim = 0` and "
            "`config kv_page_size: Dim = 16` and the entries decode_paged and prefill_paged "
            "as std.models.llama does (docs/models.md); or load without kv_pages=",
        )
    return out


def check_paged_inputs(graph: Graph, entry: str, values: Mapping[str, Sequence[int]]) -> None:
    """E0690 where a paged entry's positions pass the cache: ``decode_paged``'s ``pos``
    >= S, or ``prefill_paged``'s chunk ending past S (``start + n > S``). ``values`` maps
    input names (``pos``, ``start``, ``n``) to their elements as Python ints (a host copy of
    B values). Other entries, and graphs without a dim ``S``, are not checked.

    >>> from linnet.lang.ir.graph import Graph
    >>> g = Graph("prefill_paged", "m", dims={"S": 8})
    >>> check_paged_inputs(g, "prefill_paged", {"start": [0, 4], "n": [3, 4]})
    >>> check_paged_inputs(g, "prefill_paged", {"start": [0, 6], "n": [3, 4]})
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0690]: row 1 of `prefill_paged`'s chunk...
    """
    if entry not in PAGED_ENTRIES:
        return
    s = graph.dims.get("S")
    if not isinstance(s, int):
        return
    help = (
        f"the model's cache holds S = {s} positions a sequence: end the sequence (or "
        "preempt it) before position S, or load the model with a larger S in the config"
    )
    if entry == DECODE_PAGED and "pos" in values:
        for b, p in enumerate(values["pos"]):
            if p >= s:
                raise coded_error(
                    "E0690",
                    f"row {b} of `{entry}` is at position {p}, past the cache's last "
                    f"position {s - 1}",
                    help=help,
                )
    if entry == PREFILL_PAGED and "start" in values and "n" in values:
        for b, (st, n) in enumerate(zip(values["start"], values["n"])):
            if st + n > s:
                raise coded_error(
                    "E0690",
                    f"row {b} of `{entry}`'s chunk (start {st}, n {n}) ends at position "
                    f"{st + n - 1}, past the cache's last position {s - 1}",
                    help=help,
                )
