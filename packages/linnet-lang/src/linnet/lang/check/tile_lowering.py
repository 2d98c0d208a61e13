"""Lowering a kernel's body to a tile program (:class:`~linnet.lang.ir.tiles.TileKernel`)
for concrete generics: the one place that reads a kernel's syntax tree. It runs at lowering
time (:mod:`linnet.lang.check.kernel_instances` records each bound call's instances in the
graph) and in the kernel tools (`linnet kernels`, access checks); ``ir/tiles.py`` holds the
tile program format and the passes over it.

>>> from linnet.lang.syntax.program import Program
>>> prog = Program.from_text('''
... kernel double<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N / B) {
...     let cols = program_id(0) * B + iota<i32>(B)
...     store(y[cols], load(x[cols], cols < N) * 2.0, cols < N)
... }''')
>>> k = lower_kernel(prog, "main::double", {"N": 10, "B": 4})
>>> k.grid, [s.op for s in k.steps]
((2,), ['program_id', 'constant', 'mul', 'iota', 'add', 'constant', 'lt', 'load', 'constant', 'mul', 'store'])
"""

from __future__ import annotations

from typing import Any

import linnet.lang.syntax.tree as A
from linnet.lang.check.evaluate import Evaluator, Fail, Frame
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.ir.tiles import TileKernel
from linnet.lang.syntax.program import Program
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import Const, Tensor


def find_kernel(program: Program, name: str) -> A.FuncDecl:
    """The kernel declaration called ``name`` (``module::kernel``); E0533 if there is none."""
    module, _, short = name.rpartition("::")
    mod = program.module(module)
    item = mod.find(short) if mod is not None else None
    if not isinstance(item, A.FuncDecl) or item.kind != "kernel":
        raise LinnetError(
            Diagnostic(
                "E0533",
                f"no kernel `{name}` in this program",
                help="name a kernel as `module::name`, e.g. `std.nn.activation::row_softmax`",
            )
        )
    return item


def lower_kernel(
    program: Program, name: str, generics: dict[str, Any], scalars: dict[str, Any] | None = None
) -> TileKernel:
    """Lower kernel ``name`` (``module::kernel``) for ``generics`` (every generic of the
    kernel: ints for dims, dtype names for DTypes) to a :class:`TileKernel`. ``scalars``
    gives the values of its scalar parameters (`eps: f32`): like generics, they are
    constants of the compiled kernel (a call passes compile-time scalars).

    The program is assumed checked (``check_program``): a kernel that does not check fails
    here with the checker's diagnostic. A generic missing or of the wrong kind is E0534.
    """
    decl = find_kernel(program, name)
    env: dict[str, Any] = {}
    for g in decl.generics:
        v = generics.get(g.name)
        if g.kind == "Dim" and isinstance(v, int) and not isinstance(v, bool):
            env[g.name] = Dim.const(v)
        elif g.kind == "DType" and isinstance(v, str):
            env[g.name] = v
        else:
            raise LinnetError(
                Diagnostic(
                    "E0534",
                    f"kernel `{name}` needs generic `{g.name}` ({g.kind}), given {v!r}",
                    help="give every generic of the kernel: an int for a Dim, a dtype name "
                    "(`f32`) for a DType",
                )
            )
    graph = Graph(entry=decl.name, model=name)
    ev = Evaluator(program, Builder(graph))
    assert decl.module is not None
    frame = Frame(decl.module, env, None, decl)
    params: list[tuple[str, tuple[int, ...], str]] = []
    results: list[tuple[str, tuple[int, ...], str]] = []
    scalars_out: dict[str, Any] = {}
    try:
        for clause in decl.where:
            c = ev.value(clause, frame)
            if isinstance(c, Const) and c.value is False:
                raise LinnetError(
                    Diagnostic(
                        "E0535",
                        f"kernel `{name}`'s `where {ev.src(clause)}` does not hold for "
                        f"{_generics(generics)}",
                        clause.span,
                        "this clause",
                        help="its op runs the body for these shapes; launch the kernel only "
                        "where the clause holds",
                    )
                )
        for p in decl.params:
            if isinstance(p.type, A.TensorType):
                shape, dtype = ev.tensor_type(p.type, frame)
                concrete = tuple(ev.concrete(d) for d in shape)
                frame.bind(p.name, Tensor(f"@{p.name}", shape, dtype, kind="global"))
                frame.tensor_params.add(p.name)
                params.append((p.name, concrete, dtype))  # type: ignore[arg-type]
                graph.parameters[p.name] = ValueType(concrete, dtype)  # type: ignore[arg-type]
            else:
                v = (scalars or {}).get(p.name)
                shape, dtype = ev.tensor_type(p.type, frame)
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise LinnetError(
                        Diagnostic(
                            "E0536",
                            f"kernel `{name}` needs the value of its scalar parameter "
                            f"`{p.name}`, given {v!r}",
                            p.span,
                            "scalar parameter",
                            help="a kernel's scalar parameters are compile-time constants: "
                            "pass the call's value (`scalars={'" + p.name + "': ...}`)",
                        )
                    )
                c = (
                    Const(Dim.const(int(v)), "int")
                    if dtype in ("i32", "i64", "int")
                    else Const(float(v), dtype)
                )
                frame.bind(p.name, c)
                scalars_out[p.name] = v
        for r in decl.results:
            shape, dtype = ev.tensor_type(r.type, frame)
            concrete = tuple(ev.concrete(d) for d in shape)
            assert r.name is not None
            t = Tensor(f"@{r.name}", shape, dtype, kind="global")
            frame.results[r.name] = t
            frame.bind(r.name, t)
            results.append((r.name, concrete, dtype))  # type: ignore[arg-type]
            graph.parameters[r.name] = ValueType(concrete, dtype)  # type: ignore[arg-type]
        scratch: list[tuple[str, tuple[int, ...], str]] = []
        for p in decl.scratch:
            shape, dtype = ev.tensor_type(p.type, frame)
            concrete = tuple(ev.concrete(d) for d in shape)
            frame.bind(p.name, Tensor(f"@{p.name}", shape, dtype, kind="global"))
            frame.tensor_params.add(p.name)
            frame.scratch.add(p.name)
            scratch.append((p.name, concrete, dtype))  # type: ignore[arg-type]
            graph.parameters[p.name] = ValueType(concrete, dtype)  # type: ignore[arg-type]
            # As a state's: its loads are never shared (a store or a count may come between).
            graph.states[p.name] = ValueType(concrete, dtype)  # type: ignore[arg-type]
        grid = tuple(int(ev.concrete(ev.eval_dim(e, frame))) for e in decl.grid or [])
        ev.run_body(decl.body, frame)
    except Fail as f:
        raise LinnetError(f.diag) from None
    if ev.errors:
        raise LinnetError(ev.errors)
    span = decl.span
    first = span.line
    last = first + span.source.text[span.start : span.stop].count("\n") if span.source else first
    return TileKernel(
        name,
        dict(generics),
        grid,
        params,
        results,
        scalars_out,
        graph.steps,
        graph.values,
        f"{span.source.name}:{first}" if span.source else "",
        (first, last),
        scratch=scratch,
    )


def _generics(generics: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in generics.items())
