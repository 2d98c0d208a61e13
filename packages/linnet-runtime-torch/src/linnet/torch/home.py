"""Generated source under $LINNET_HOME, imported from files (see linnet.lang.home, where
:func:`import_source` lives: every runtime imports its generated module the same way)."""

from __future__ import annotations

from linnet.lang.home import atomic_write, import_source, linnet_home

__all__ = ["atomic_write", "import_source", "linnet_home"]
