"""linnet.plan: which backend runs which region, decided by measurement (framework-neutral).

The framework side (``linnet.torch.planned``) matches, compiles and times; this package decides
(:mod:`linnet.plan.decide`, re-exported here): a backend takes a region only when it saves at
least ``Options.margin`` of the generated source's time for the same steps; the regions that save the most go first; overlapping
regions never both run; ``memory=`` caps the bytes executables hold. With ``measure=False``
nothing is timed: the candidates whose backend gave an estimate (``estimate_cost`` returned a
:class:`~linnet.backends.Cost`) go first, fastest per step of the graph they cover first (the
most estimated time saved for the steps claimed), then the others, the largest regions first.
``plan.explain()`` shows each estimate beside the measured times. A backend's several
executables for the same steps (two algorithms) are told apart by :func:`label_algorithms`
and timed and decided each on its own. Where the generated source
is compiled, :func:`choose_in_context` (:mod:`linnet.plan.context`) then checks each kind of
taken region against the compiled steps around it.

>>> from linnet.plan import Candidate, choose
"""

from __future__ import annotations

from .cache import CacheWarning, TimingCache, cache_key
from .context import SliceTimer, choose_in_context, layout, rotation, window
from .decide import (
    BackendWarning,
    Candidate,
    Decision,
    choose,
    explain_table,
    label_algorithms,
    warn_failed,
)

__all__ = [
    "BackendWarning",
    "CacheWarning",
    "Candidate",
    "Decision",
    "SliceTimer",
    "TimingCache",
    "cache_key",
    "choose",
    "choose_in_context",
    "explain_table",
    "label_algorithms",
    "layout",
    "rotation",
    "warn_failed",
    "window",
]
