"""Generated source under $LINNET_HOME, imported from content-hashed files (the same loader
as linnet.torch's: see :func:`linnet.lang.home.import_source`)."""

from __future__ import annotations

from linnet.lang.home import atomic_write, import_source, linnet_home

__all__ = ["atomic_write", "import_source", "linnet_home"]
