"""Diagnostics: spans, rendering and JSON (`core`, re-exported here) and the explanation of
every code (`codes`).

>>> from linnet.lang.diagnostics import Diagnostic, render
>>> print(render(Diagnostic("E0601", "model `Llama` has no entry `decod`")))
error[E0601]: model `Llama` has no entry `decod`
"""

from linnet.lang.diagnostics.core import (
    Diagnostic,
    Label,
    LinnetError,
    SourceFile,
    Span,
    render,
    render_all,
    to_json,
)

__all__ = [
    "Diagnostic",
    "Label",
    "LinnetError",
    "SourceFile",
    "Span",
    "render",
    "render_all",
    "to_json",
]
