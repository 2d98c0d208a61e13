"""linnet.lang: the Linnet compiler (parse → check → lower → emit).

>>> from linnet.lang import check_text
>>> prog = check_text('''
... pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
...     let y[n] = 2.0 * x[n]
...     return y
... }''')
"""

from linnet.lang.check.driver import check_file, check_program, check_text, lower
from linnet.lang.diagnostics.core import (
    Diagnostic,
    LinnetError,
    SourceFile,
    Span,
    render,
    render_all,
)
from linnet.lang.ir.graph import FORMAT_VERSION, Call, Graph, Step, ValueType
from linnet.lang.ir.primitives import PRIMITIVES
from linnet.lang.syntax.parser import parse
from linnet.lang.syntax.program import Program

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "PRIMITIVES",
    "Call",
    "Diagnostic",
    "Graph",
    "LinnetError",
    "Program",
    "SourceFile",
    "Span",
    "Step",
    "ValueType",
    "__version__",
    "check_file",
    "check_program",
    "check_text",
    "lower",
    "parse",
    "render",
    "render_all",
]
