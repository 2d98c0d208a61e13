"""Compiling an entry, written down once: the typed compile options and the stages of
lowering, in order.

**Options.** :class:`Numerics` is the one definition of the ``numerics`` option ("exact":
every op as its body says, f32 matmuls in full f32; "fast": std ops' fused calls, kernels
launched, TF32 matmuls). :meth:`Numerics.parse` validates a user's value once, with E0713,
for every entry point: ``load`` in both runtimes, ``emit_torch``, ``emit_jax`` and the
CLI's ``--numerics``. It is a ``str`` enum, so ``Numerics.FAST == "fast"`` and the
emitters' string comparisons keep working. :class:`CompileOptions` holds every option a
runtime compiles with (numerics, the target device's name and the weights' dtype),
checked once when it is made: ``load`` in both runtimes builds one
(:meth:`CompileOptions.parse`) and passes it down.

**Stages.** Lowering an entry is the stage ``lower`` (a program and input shapes to a graph,
:func:`linnet.lang.check.lowering.lower`), then :data:`STAGES`, each a :class:`Stage` (a
name and a function Graph -> Graph) run by :func:`run_stages`. :data:`ORDER` lists every
stage an entry can go through, in order: ``lower_grad`` adds the stage :data:`GRAD`, the
torch runtime's tensor parallelism :data:`SHARD` (a rank's graph), a plan :data:`SPANS`
on the graph it plans (:func:`linnet.lang.compiler.claim`), and
:func:`linnet.lang.compiler.compile_entry` (what the runtimes and the CLI call) ends with
:data:`KERNELS` under numerics "fast". After every stage the graph is verified
(:func:`linnet.lang.ir.verify.verify`, under ``LINNET_DEBUG`` and in the test suites, as
before), and under ``LINNET_DEBUG=stages`` each stage's graph is printed to stderr in the
text format ``linnet graph`` prints; ``linnet graph --stages`` prints them too
(:func:`watch`). This module imports no ``check/``: lowering runs :data:`STAGES`, so
:func:`~linnet.lang.compiler.compile_entry`, which runs lowering, lives in
:mod:`linnet.lang.compiler`.

>>> Numerics.parse("fast") is Numerics.FAST, Numerics.FAST == "fast"
(True, True)
>>> [s.name for s in STAGES]
['hoist']
>>> ORDER
('lower', 'hoist', 'grad', 'shard', 'spans', 'kernels')
"""

from __future__ import annotations

import copy
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from linnet.lang.diagnostics.core import coded_error
from linnet.lang.ir import verify as _verify
from linnet.lang.ir.graph import Graph
from linnet.lang.passes.hoist import hoist_invariants


class Numerics(StrEnum):
    """The ``numerics`` compile option. ``str(Numerics.FAST)`` is ``"fast"``.

    >>> Numerics.EXACT == "exact", [n.value for n in Numerics]
    (True, ['exact', 'fast'])
    """

    EXACT = "exact"
    FAST = "fast"

    @classmethod
    def parse(cls, value: Any) -> Numerics:
        """``value`` as a :class:`Numerics`, or E0713 (the one check of a user's value).

        >>> Numerics.parse("exact")
        <Numerics.EXACT: 'exact'>
        >>> Numerics.parse("fastest")
        Traceback (most recent call last):
        ...
        linnet.lang.diagnostics.core.LinnetError: error[E0713]: numerics must be 'exact' or 'fast', not 'fastest'...
        """
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        raise coded_error(
            "E0713",
            f"numerics must be 'exact' or 'fast', not {value!r}",
            help="numerics='exact' runs every op as its body says (f32 matmuls "
            "in full f32); numerics='fast' uses fused calls, kernels and "
            "TF32 matmuls",
        )


NUMERICS: tuple[str, ...] = tuple(n.value for n in Numerics)
"""The values of :class:`Numerics`, as strings (``("exact", "fast")``)."""

FLOATS: tuple[str, ...] = ("f64", "f32", "f16", "bf16")
"""Linnet's floating-point element types: the ones ``load(..., dtype=)`` converts weights to."""

# A device's name: a kind and an optional index ("cpu", "cuda:1", "meta", JAX's "gpu:0").
# Whether this machine has one is the runtime's question (E0711, E0712); this is the name's.
_DEVICE = re.compile(r"[a-z][a-z0-9_]*(:[0-9]+)?")


def check_device(device: Any) -> str | None:
    """``device`` if it is a device's name (a kind and an optional index: ``"cpu"``,
    ``"cuda"``, ``"cuda:1"``, ``"meta"``) or None (the runtime's default); E0710 otherwise.

    >>> check_device("cuda:1")
    'cuda:1'
    >>> check_device("cuda:x")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0710]: 'cuda:x' is not a device...
    """
    if device is None or (isinstance(device, str) and _DEVICE.fullmatch(device)):
        return device
    raise coded_error(
        "E0710",
        f"{device!r} is not a device: a device is named by a kind and an optional index",
        help="e.g. 'cpu', 'cuda', 'cuda:1', 'meta' (JAX: 'gpu', 'gpu:N')",
    )


def check_dtype(
    dtype: Any,
    name_of: Callable[[Any], str | None] | None = None,
    example: str = "'f32'",
) -> str | None:
    """``dtype=`` (what ``load`` converts floating-point weights to) as a Linnet float name
    (one of :data:`FLOATS`), or None for no conversion; E0742 otherwise. ``name_of`` names
    a runtime's own dtype objects (``torch.bfloat16``, ``jnp.bfloat16``: ``"bf16"``; None
    for what it does not know); ``example`` is the runtime's spelling, for the help.

    >>> check_dtype("bf16"), check_dtype(None)
    ('bf16', None)
    >>> check_dtype("i32")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0742]: dtype must be a floating-point type to convert the weights to, not 'i32'...
    """
    if dtype is None:
        return None
    name = dtype if isinstance(dtype, str) and dtype in FLOATS else None
    if name is None and name_of is not None:
        name = name_of(dtype)
    if name not in FLOATS:
        raise coded_error(
            "E0742",
            f"dtype must be a floating-point type to convert the weights to, not {dtype!r}",
            help=f"e.g. dtype={example} or dtype='bf16' (one of " + ", ".join(FLOATS) + ")",
        )
    return name


@dataclass(frozen=True)
class CompileOptions:
    """The options an entry is compiled with, each checked once, when the options are made:
    ``numerics`` (:class:`Numerics`, E0713), ``device`` (the target device's name, as
    :func:`check_device` takes it, E0710; None: the runtime's default) and ``dtype`` (the
    float type the weights are converted to, one of :data:`FLOATS`, E0742; None: as the
    checkpoint holds them). ``load`` in both runtimes builds one with :meth:`parse` and
    passes it down; :func:`linnet.lang.compiler.compile_entry` takes it.

    >>> CompileOptions()
    CompileOptions(numerics=<Numerics.EXACT: 'exact'>, device=None, dtype=None)
    >>> CompileOptions("fast", "cuda:1", "bf16").numerics is Numerics.FAST
    True
    """

    numerics: Numerics = Numerics.EXACT
    device: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        # Every way of making options checks them (the constructor, parse, dataclasses.replace).
        object.__setattr__(self, "numerics", Numerics.parse(self.numerics))
        check_device(self.device)
        check_dtype(self.dtype)

    @classmethod
    def parse(
        cls,
        numerics: Any = "exact",
        device: Any = None,
        dtype: Any = None,
        *,
        dtype_name: Callable[[Any], str | None] | None = None,
        dtype_example: str = "'f32'",
    ) -> CompileOptions:
        """Options from a user's values, checked in this order: ``numerics`` (E0713),
        ``device`` (E0710), ``dtype`` (E0742; a runtime's dtype objects through
        ``dtype_name``, see :func:`check_dtype`).

        >>> CompileOptions.parse("fast", "cpu", "bf16")
        CompileOptions(numerics=<Numerics.FAST: 'fast'>, device='cpu', dtype='bf16')
        """
        return cls(
            Numerics.parse(numerics),
            check_device(device),
            check_dtype(dtype, dtype_name, dtype_example),
        )

    def on(self, device: str) -> CompileOptions:
        """These options for ``device`` (a runtime's resolved device, ``str(torch.device)``).

        >>> CompileOptions().on("cuda:0").device
        'cuda:0'
        """
        return CompileOptions(self.numerics, device, self.dtype)


class Stage(NamedTuple):
    """One stage of lowering: its name (what ``--stages`` prints and an E092x verifier
    error names) and its function, Graph -> Graph (it may change the graph in place).

    >>> Stage("hoist", hoist_invariants).name
    'hoist'
    """

    name: str
    run: Callable[[Graph], Graph]


STAGES: tuple[Stage, ...] = (
    # Loop-invariant steps (rope's tables) out of the layers, so every layer's slice is alike.
    Stage("hoist", hoist_invariants),
)
"""The stages every lowered entry goes through after ``lower``, in order."""

LOWER = "lower"
"""The first stage: :func:`linnet.lang.check.lowering.lower`, a program to a graph."""
GRAD = "grad"
"""The reverse pass (:func:`linnet.lang.grad.lower_grad`, after :data:`STAGES`): the graph
of the entry's outputs and its gradients. Made per call (it takes ``wrt`` and the seed)."""
SHARD = "shard"
"""A rank's graph of a tensor-parallel model (:func:`linnet.lang.passes.shard.shard`; the
torch runtime's ``load(world=N)``)."""
KERNELS = "kernels"
"""The kernel instances a graph launches, recorded where numerics is "fast"
(:func:`linnet.lang.check.kernel_instances.with_kernels`): what the emitters take."""
SPANS = "spans"
"""Span ops' claims (:func:`linnet.lang.check.spans.claim_spans`): a plan's own stage, run
on the graph a runtime caches (:func:`linnet.lang.compiler.claim`), never on what the
emitters take; a plan's regions then record their kernels (:data:`KERNELS`)."""

ORDER: tuple[str, ...] = (LOWER, *(s.name for s in STAGES), GRAD, SHARD, SPANS, KERNELS)
"""Every stage an entry's graph can go through, in the order they run; each entry skips
those it does not need (``linnet graph --stages --grad`` shows lower, hoist, grad)."""

# The graphs `watch` collects: (stage name, a copy of the graph after it), innermost last.
_WATCHERS: ContextVar[tuple[list[tuple[str, Graph]], ...]] = ContextVar("_WATCHERS", default=())


def debug_stages() -> bool:
    """Whether ``LINNET_DEBUG`` asks for the stages' graphs (``stages``, alone or in a
    comma-separated list).

    >>> isinstance(debug_stages(), bool)
    True
    """
    return "stages" in os.environ.get("LINNET_DEBUG", "").replace(" ", "").split(",")


@contextmanager
def watch() -> Iterator[list[tuple[str, Graph]]]:
    """Collect every stage's graph lowered inside the block, as (stage name, graph) in
    order (what ``linnet graph --stages`` prints).

    >>> with watch() as seen:
    ...     _ = run_stages(Graph("e", "m"))
    >>> [name for name, _ in seen]
    ['lower', 'hoist']
    """
    seen: list[tuple[str, Graph]] = []
    token = _WATCHERS.set((*_WATCHERS.get(), seen))
    try:
        yield seen
    finally:
        _WATCHERS.reset(token)


def stage_text(name: str, graph: Graph) -> str:
    """A stage's graph as ``LINNET_DEBUG=stages`` and ``linnet graph --stages`` print it:
    a header line, then the graph's text format (:meth:`Graph.summary`).

    >>> stage_text("hoist", Graph("e", "m")).splitlines()[0]
    '# stage hoist: m.e'
    """
    return f"# stage {name}: {graph.model}.{graph.entry}\n{graph.summary()}"


def _after(name: str, graph: Graph, label: str) -> None:
    """What follows every stage: verify, then show the graph to whoever asked."""
    if _verify.checked():
        _verify.verify(graph, label)
    watchers = _WATCHERS.get()
    if watchers:
        kept = copy.deepcopy(graph)  # later stages change the graph in place
        for seen in watchers:
            seen.append((name, kept))
    if debug_stages():
        print(stage_text(name, graph), file=sys.stderr)


def run_stage(stage: Stage, graph: Graph) -> Graph:
    """Run one stage on ``graph``, then verify and show its result (see the module).

    >>> run_stage(Stage("nothing", lambda g: g), Graph("e", "m")).entry
    'e'
    """
    graph = stage.run(graph)
    _after(stage.name, graph, f"stage {stage.name}")
    return graph


def run_stages(graph: Graph, stages: tuple[Stage, ...] | None = None) -> Graph:
    """Run ``stages`` (default :data:`STAGES`) in order on a graph ``lower`` just made; the
    graph is verified and shown as lowering made it (stage ``lower``) and after each.

    >>> run_stages(Graph("e", "m")).model
    'm'
    """
    _after(LOWER, graph, "lowering")
    for stage in STAGES if stages is None else stages:
        graph = run_stage(stage, graph)
    return graph
