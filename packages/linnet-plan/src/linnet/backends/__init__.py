"""linnet.backends: the backend contract and plugin discovery.

``available()`` lists the backends that loaded and meet the contract; ``runnable()`` those of
them that can run on this machine (a probe accepts one of its targets); ``skipped()`` the
plugins left out, with why. ``linnet backends`` prints all three.

>>> from linnet.backends import CONTRACT, Region, available, runnable, skipped
>>> CONTRACT
1
"""

from .contract import (
    CONTRACT,
    Backend,
    Capabilities,
    Cost,
    Executable,
    ExecutableMeta,
    ExplainsDeclines,
    Options,
    Region,
    RegionError,
    Target,
    region_kind,
)
from .discovery import SkipRecord, available, discover, skipped
from .here import runnable, survey

__version__ = "0.1.0"
"""linnet-plan's version (`linnet.plan` shares it): the one place it is written."""

__all__ = [
    "CONTRACT",
    "Backend",
    "Capabilities",
    "Cost",
    "Executable",
    "ExecutableMeta",
    "ExplainsDeclines",
    "Options",
    "Region",
    "RegionError",
    "SkipRecord",
    "Target",
    "__version__",
    "available",
    "discover",
    "region_kind",
    "runnable",
    "skipped",
    "survey",
]
