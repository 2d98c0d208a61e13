"""Emitters: one module per target, each a table keyed by primitive (`torch`), over what every
Python-writing target shares (`python`: statements, liveness of drafts, line wrapping). None
imports its framework: they write text."""
