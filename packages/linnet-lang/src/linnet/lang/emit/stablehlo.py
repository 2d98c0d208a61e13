"""Graph → StableHLO MLIR text. Writes text only: this module imports no MLIR library
(:func:`verify` and :func:`run` import jax lazily, for tests and the conformance suite).

One module per lowered entry with a public ``@main``: its arguments are the entry's inputs,
then each state (the KV cache), then each parameter, named after them; it returns the entry's
outputs, then each state's value after the call, so a caller carries the cache from one call
to the next. Every std op the entry calls (``std.nn.linear::linear``) is a
``stablehlo.composite`` named ``linnet.std.nn.linear.linear`` whose decomposition is a private
function holding the op's body (nested as the calls nest, one function per callee and body:
the layers share theirs), so a compiler can match the op or inline the body. Operations are
written in MLIR's generic form, each with its source location (``loc("llama.linnet:45")``),
and a comment with the ``.linnet`` line heads each group of steps.

Every primitive has a rule in :data:`RULES` (``tests/test_coverage.py`` checks it). A step
with no rule, or a dtype StableHLO lacks, is error E0940 / E0941 naming the step and its
source line.

``erf`` is CHLO's ``chlo.erf`` (as JAX writes it); a portable text (``portable=``, for
:func:`linnet.lang.emit.stablehlo_portable.serialize`) holds StableHLO operations only.

>>> from linnet.lang.emit.stablehlo import RULES
>>> from linnet.lang.ir.primitives import PRIMITIVES
>>> sorted(set(PRIMITIVES) - set(RULES))  # collectives: an exported graph is one rank's
['all_gather', 'all_reduce']
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from linnet.lang import __version__
from linnet.lang.diagnostics.core import Diagnostic, LinnetError
from linnet.lang.emit import stablehlo_portable
from linnet.lang.emit.stablehlo_rules import EXPECTED_MISSING, RULES, contract, reduce
from linnet.lang.emit.stablehlo_scope import MLIR_DTYPES, Scope, _escape, scalar_literal, where
from linnet.lang.export_checks import mlir_attribute
from linnet.lang.ir.graph import Call, Graph

# The rule table and the writers are the emitter's public names (the coverage test reads
# RULES here).
__all__ = [
    "EXPECTED_MISSING",
    "MLIR_DTYPES",
    "RULES",
    "StablehloEmitter",
    "argument_order",
    "compile_cpu",
    "contract",
    "emit_stablehlo",
    "reduce",
    "scalar_literal",
    "verify",
]

"""``rule(step, scope)``: appends operations and returns the result's SSA name (None for a
state write, which rebinds ``@state`` in the scope itself)."""


# ---------------------------------------------------------------- the emitter
def _std_name(callee: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.]", "_", callee.removeprefix("std.").replace("::", "."))


class StablehloEmitter:
    def __init__(
        self,
        graph: Graph,
        sources: Mapping[str, str] | None,
        portable: tuple[int, int, int] | None = None,
    ) -> None:
        from linnet.lang.emit.onnx import std_op_calls

        self.graph = graph
        # A portable text (a target version): StableHLO operations only, and std ops as
        # func.call below the first version with composites (stablehlo_portable).
        self.portable = portable
        self.composites = portable is None or stablehlo_portable.composites_at(portable)
        self.sources = {k: v.splitlines() for k, v in (sources or graph.sources or {}).items()}
        self.calls = std_op_calls(graph)
        self.users = graph.users()
        self.functions: dict[tuple, str] = {}  # body key -> symbol
        self.symbols: set[str] = {"main"}
        self.texts: list[str] = []

    def comment(self, loc: str) -> str:
        user = loc.split("|", 1)[0]
        file, _, line = user.rpartition(":")
        lines = self.sources.get(file)
        text = ""
        if lines and line.isdigit() and 0 < int(line) <= len(lines):
            text = "  " + lines[int(line) - 1].strip()
        short = file.rsplit("/", 1)[-1]
        out = f"// {short}:{line}{text}"
        return out if len(out) <= 96 else out[:93].rstrip() + "..."

    def span(self, start: int, stop: int) -> tuple[list[str], list[str]]:
        defined: set[str] = set()
        reads: list[str] = []
        writes: list[str] = []
        outs: list[str] = []
        for st in self.graph.steps[start:stop]:
            for o in st.operands:
                if o not in defined and o not in reads:
                    reads.append(o)
            if st.op == "scatter" and st.operands[0] not in writes:
                writes.append(st.operands[0])
                defined.add(st.operands[0])
            defined.update(st.results)
            for r in st.results:
                if r in self.graph.outputs or any(u >= stop for u in self.users.get(r, [])):
                    outs.append(r)
        return reads, outs + writes

    def children(self, start: int, stop: int, owner: Call | None) -> dict[int, Call]:
        def contains(o: Call, c: Call) -> bool:
            return (
                o.start <= c.start
                and c.stop <= o.stop
                and (o.stop - o.start > c.stop - c.start or o.depth < c.depth)
            )

        mine = [
            c
            for c in self.calls
            if c is not owner
            and start <= c.start
            and c.stop <= stop
            and (owner is None or contains(owner, c))
        ]
        return {c.start: c for c in mine if not any(o is not c and contains(o, c) for o in mine)}

    def body(self, scope: Scope, start: int, stop: int, owner: Call | None) -> None:
        inner = self.children(start, stop, owner)
        last = None
        i = start
        while i < stop:
            call = inner.get(i)
            step = self.graph.steps[i]
            loc = call.loc if call is not None and call.loc else step.loc
            if loc and loc != last:
                scope.lines.append(self.comment(loc))
                last = loc
            if call is not None:
                self.call(scope, call)
                i = call.stop
                continue
            scope.step, scope.current, scope.loc = i, step, step.loc
            rule = RULES.get(step.op)
            if rule is None:
                raise LinnetError(
                    Diagnostic(
                        "E0940",
                        f"{where(self.graph, i, step)}: primitive `{step.op}` has no "
                        "StableHLO rule",
                        help="run this model with the PyTorch runtime, or add the primitive to "
                        "linnet.lang.emit.stablehlo_rules.RULES",
                    )
                )
            for r in step.results:  # a dtype StableHLO lacks is E0941, named at this step
                scope.ty(self.graph.values[r].shape, self.graph.values[r].dtype)
            out = rule(step, scope)
            if step.results:
                scope.env[step.results[0]] = out
            scope.current = None
            i += 1

    def call(self, scope: Scope, call: Call) -> None:
        reads, writes = self.span(call.start, call.stop)
        local: dict[str, str] = {r: f"in{k}" for k, r in enumerate(reads)}
        key_steps = []
        for j, st in enumerate(self.graph.steps[call.start : call.stop]):
            ops = tuple(local.get(o, o) for o in st.operands)
            types = tuple(scope.ref_type(o) for o in st.operands)
            for r in st.results:
                local[r] = f"v{j}"
            key_steps.append((st.op, repr(sorted(st.attributes.items())), ops, types))
        key = (call.callee, tuple(key_steps), tuple(local.get(w, w) for w in writes))
        symbol = self.functions.get(key) or self.function(call, reads, writes, key)
        args = [scope.env[r] for r in reads]
        out_types = [scope.ref_type(w) for w in writes]
        scope.step, scope.current, scope.loc = call.start, self.graph.steps[call.start], call.loc
        attrs = (
            f'name = "linnet.std.{_std_name(call.callee)}", composite_attributes = '
            f'{{callee = "{_escape(call.callee)}", path = "{_escape(call.path)}"}}, '
            f"decomposition = @{symbol}, version = 0 : i32"
        )
        op = "stablehlo.composite"
        if not self.composites:  # an older target: a plain call of the decomposition
            scope.lines.append(f"// linnet.std.{_std_name(call.callee)} `{call.path}`")
            op, attrs = "func.call", f"callee = @{symbol}"
        names = [scope.fresh(w.rsplit(".", 1)[-1] if w.startswith("@") else w) for w in writes]
        ins = ", ".join(scope.ty(a) for a in args)
        outs = ", ".join(scope.ty(sh, dt) for sh, dt in out_types)
        if len(names) == 1:
            lhs = names[0]
        else:
            lhs = f"{names[0]}:{len(names)}"
        text = f'{lhs} = "{op}"({", ".join(args)}) {{{attrs}}} : ({ins}) -> ({outs})'
        if call.loc:
            text += f' loc("{_escape(call.loc)}")'
        scope.lines.append(text)
        for j, (w, (sh, dt)) in enumerate(zip(writes, out_types)):
            ssa = names[0] if len(names) == 1 else f"{names[0]}#{j}"
            scope.types[ssa] = (tuple(sh), dt)
            scope.env[w] = ssa
        scope.current = None

    def function(self, call: Call, reads: list[str], writes: list[str], key: tuple) -> str:
        inner = Scope(self.graph, portable=self.portable is not None)
        params = []
        for ref in reads:
            hint = ref.rsplit(".", 1)[-1] if ref.startswith("@") else ref
            ssa = inner.fresh(hint)
            inner.env[ref] = ssa
            inner.types[ssa] = tuple(inner.ref_type(ref))  # type: ignore[assignment]
            params.append(f"{ssa}: {inner.ty(ssa)}")
        self.body(inner, call.start, call.stop, call)
        outs = [inner.env[w] for w in writes]
        base = _std_name(call.callee).replace(".", "_")
        symbol, k = base, 1
        while symbol in self.symbols:
            k += 1
            symbol = f"{base}_{k}"
        self.symbols.add(symbol)
        self.functions[key] = symbol
        self.texts.append(
            self.function_text(
                f"private @{symbol}",
                params,
                outs,
                inner,
                f"{call.callee}: first called for `{call.path}` at {call.loc or '?'}",
            )
        )
        return symbol

    def function_text(
        self, head: str, params: list[str], outs: list[str], scope: Scope, doc: str
    ) -> str:
        results = ", ".join(scope.ty(o) for o in outs)
        lines = [f"  // {doc}", f"  func.func {head}({', '.join(params)}) -> ({results}) {{"]
        lines += ["    " + line.replace("\n", "\n    ") for line in scope.lines]
        lines.append(f'    "func.return"({", ".join(outs)}) : ({results}) -> ()')
        lines.append("  }")
        return "\n".join(lines)

    def module(self, flag: str | None = None, checks: Mapping[str, Any] | None = None) -> str:
        g = self.graph
        scope = Scope(g, portable=self.portable is not None)
        params = []
        for ref in [*g.inputs, *("@" + p for p in g.states), *("@" + p for p in g.parameters)]:
            ssa = scope.fresh(ref)
            scope.env[ref] = ssa
            scope.types[ssa] = tuple(scope.ref_type(ref))  # type: ignore[assignment]
            params.append(f"{ssa}: {scope.ty(ssa)}")
        self.body(scope, 0, len(g.steps), None)
        outs = [scope.env[r] for r in g.outputs] + [scope.env["@" + p] for p in g.states]
        outs += [scope.env[flag]] if flag else []
        main = self.function_text(
            "public @main",
            params,
            outs,
            scope,
            f"entry {g.model}.{g.entry}: arguments are its inputs, then its states, then its "
            "parameters; results its outputs, then its states after the call"
            + (", then linnet.valid" if flag else ""),
        )
        header = [
            f"// StableHLO generated by linnet-lang {__version__} for {g.model}.{g.entry}.",
            "// Arguments of @main, in order: "
            + ", ".join(r.lstrip("%") for r in g.inputs)
            + (", the states " + ", ".join(g.states) if g.states else "")
            + ", then the parameters by path.",
            f"module @{re.sub(r'[^0-9A-Za-z_]', '_', g.model + '_' + g.entry)}"
            + (f" attributes {{{mlir_attribute(checks)}}}" if checks is not None else "")
            + " {",
        ]
        if flag:
            header.insert(
                2,
                "// The last result, linnet.valid, is false where an index left "
                "its axis (docs/export.md).",
            )
        return "\n".join([*header, *self.texts, main, "}"]) + "\n"


def emit_stablehlo(
    graph: Graph,
    sources: Mapping[str, str] | None = None,
    validity: bool = True,
    portable: tuple[int, int, int] | None = None,
) -> str:
    """StableHLO MLIR text for one lowered entry (see the module docstring for its form).
    ``validity``: the last result is ``linnet.valid`` (:mod:`linnet.lang.export_checks`),
    what it checks in the module attribute ``linnet.valid``. ``portable``: a target version
    (``(1, 0, 0)``): the text StableHLO's serializer takes at it (erf from arithmetic, std
    ops as calls below 0.19.0; :mod:`linnet.lang.emit.stablehlo_portable`).

    >>> from linnet.lang import Program, lower
    >>> prog = Program.from_text('''
    ... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x * 2.0 } }''')
    >>> text = emit_stablehlo(lower(prog, "run", {"x": [3]}))
    >>> "func.func public @main(%x: tensor<3xf32>)" in text
    True
    """
    if not validity:
        return StablehloEmitter(graph, sources, portable).module()
    from linnet.lang.export_checks import describe
    from linnet.lang.ir.validity import with_validity

    checked, flag = with_validity(graph)
    return StablehloEmitter(checked, sources, portable).module(flag, describe(graph))


def argument_order(graph: Graph) -> list[str]:
    """The names of ``@main``'s arguments, in order: inputs, states, parameters."""
    return [r.lstrip("%") for r in graph.inputs] + list(graph.states) + list(graph.parameters)


# ---------------------------------------------------------------- jax: verify and run
def _jax() -> Any:
    try:
        import jax  # noqa: F401
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib.mlir import ir
    except ImportError:
        raise LinnetError(
            Diagnostic(
                "E0942",
                "checking or running StableHLO needs jax, which is not installed",
                help="install it with `pip install 'linnet-lang[stablehlo]'`",
            )
        ) from None
    return jmlir, ir


def verify(text: str) -> None:
    """Parse and verify ``text`` with jaxlib's MLIR bindings (the StableHLO and CHLO dialects
    registered); a failure is an internal error (E0943).

    >>> verify(emit_stablehlo(graph))                                # doctest: +SKIP
    """
    jmlir, ir = _jax()
    with jmlir.make_ir_context():
        try:
            module = ir.Module.parse(text)
            ok = module.operation.verify()
        except Exception as exc:  # MLIRError: a diagnostic with the offending line
            raise LinnetError(
                Diagnostic(
                    "E0943",
                    f"the StableHLO text does not parse or verify: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}",
                    help="this is a bug in linnet-lang's StableHLO emitter: please report it",
                )
            ) from None
        if not ok:
            raise LinnetError(
                Diagnostic(
                    "E0943",
                    "the StableHLO module does not verify",
                    help="this is a bug in linnet-lang's StableHLO emitter: please report it",
                )
            )


def compile_cpu(text: str) -> Callable[..., list[Any]]:
    """Compile ``text`` for JAX's CPU backend; returns ``run(*arrays) -> [numpy arrays]``.

    Uses jaxlib's compiler entry points (``jax._src.compiler.backend_compile_and_load``,
    private API, checked with the jax of uv.lock, 0.10.2); a jax without them is E0942.
    ``run``'s arguments follow :func:`argument_order`.
    """
    import numpy as np

    jmlir, ir = _jax()
    try:
        import jax
        import jax.extend.backend as jeb
        from jax._src import compiler
        from jax._src.lib import xla_client as xc

        backend = jeb.get_backend("cpu")
        device = backend.devices()[0]
        options = compiler.get_compile_options(1, 1, backend=backend)
        compile_and_load = compiler.backend_compile_and_load
    except (ImportError, AttributeError) as exc:
        raise LinnetError(
            Diagnostic(
                "E0942",
                f"this jax ({getattr(sys.modules.get('jax'), '__version__', '?')}) lacks "
                f"the compiler entry points linnet-lang runs StableHLO with: {exc}",
                help="install the jax version linnet-lang is tested with (0.10.2), or run the "
                "text with another StableHLO consumer (IREE)",
            )
        ) from None
    with jmlir.make_ir_context():
        module = ir.Module.parse(text)
        exe = compile_and_load(backend, module, xc.DeviceList((device,)), options, [])

    def run(*arrays: Any) -> list[Any]:
        bufs = [jax.device_put(np.asarray(a), device) for a in arrays]
        return [np.asarray(o) for o in exe.execute(bufs)]

    return run
