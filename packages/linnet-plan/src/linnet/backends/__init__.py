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

__version__ = "0.1.0"
"""linnet-plan's version (`linnet.plan` shares it): the one place it is written."""

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
    "__version__",
    "available",
    "discover",
    "region_kind",
    "skipped",
]
