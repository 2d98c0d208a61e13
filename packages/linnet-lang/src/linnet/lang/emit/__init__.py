"""Emitters: one module per target, each a table keyed by primitive (`torch`). None imports
its framework: they write text."""
