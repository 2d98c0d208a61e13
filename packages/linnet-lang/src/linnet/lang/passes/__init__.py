"""Graph-to-graph passes (issue 39): each reads and writes the graph alone (this package
imports ``ir/``, ``tensors/`` and ``diagnostics/``; never ``syntax/``, ``check/`` or
``emit/``, which the import-graph test enforces). :data:`linnet.lang.pipeline.STAGES` lists
those that run on every lowered entry, in order.

* :mod:`~linnet.lang.passes.hoist`: the stage ``hoist`` (rope's tables out of the layers);
* :mod:`~linnet.lang.passes.spans`: the graph side of span ops (matching a span op's body,
  the state writes a claimed kernel can do); the claims themselves are recorded by the
  lowering-time pass :mod:`linnet.lang.check.spans`, which lowers span ops' bodies;
* :mod:`~linnet.lang.passes.shard`: tensor parallelism, a rank's graph of ``world``
  (``SHARD_RULES``);
* :mod:`~linnet.lang.passes.bounds`: the one integer range analysis (``BOUNDS_RULES``) and
  the valid range of every entry input used as an index;
* :mod:`~linnet.lang.passes.slices`: cutting a graph into the slices generated source
  calls (one function per layer kind).

Passes that must read the program run at lowering time in ``check/`` and record what later
stages need in the graph: :mod:`linnet.lang.check.kernel_instances` (``graph.kernels``,
``graph.backwards``) and :mod:`linnet.lang.check.spans`.
"""
