"""linnet.backends: the backend contract and plugin discovery.

>>> from linnet.backends import CONTRACT, Region, available, skipped
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
    Options,
    Region,
    RegionError,
    Target,
    region_kind,
)
from .discovery import SkipRecord, available, discover, skipped

__all__ = [
    "CONTRACT",
    "Backend",
    "Capabilities",
    "Cost",
    "Executable",
    "ExecutableMeta",
    "Options",
    "Region",
    "RegionError",
    "SkipRecord",
    "Target",
    "available",
    "discover",
    "region_kind",
    "skipped",
]
