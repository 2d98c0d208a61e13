"""The emitter class that the emitters writing Python share (emit/torch.py's TorchEmitter,
emit/jax.py's JaxEmitter): slicing, naming, liveness, source-line comments, kernel launches and
fused calls at their spans, entry functions, ``ENTRIES`` and the module's layout. What differs
between frameworks is a subclass's: its rule tables, its scope, and the hooks below marked
abstract (the kernel text a launch runs, the launch statement, the module's header).

>>> from linnet.lang.emit.python_emitter import PythonEmitter
>>> from linnet.lang.emit.torch import TorchEmitter
>>> issubclass(TorchEmitter, PythonEmitter) and PythonEmitter.returns_states
False
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from linnet.lang import __version__
from linnet.lang.emit.kernel_grad import Backwards, math_under_autograd
from linnet.lang.emit.python import (
    WIDTH,
    Draft,
    Statement,
    docstring,
    fresh,
    kept_outputs,
    wrap,
)
from linnet.lang.emit.python_rules import (
    FastRule,
    Options,
    Rule,
    Scope,
    identifier,
    is_std,
    launch_args,
    parse_statement,
)
from linnet.lang.emit.tiles import literal
from linnet.lang.emit.triton import KernelText
from linnet.lang.ir.graph import Call, Graph
from linnet.lang.ir.kernels import KernelInstance, instance_key, redirections
from linnet.lang.passes.slices import Slice
from linnet.lang.pipeline import Numerics


class PythonEmitter(ABC):
    """Writes a module of generated Python: one function per slice kind, one per entry
    calling them in turn, and ``ENTRIES``. A subclass (emit/torch.py's, emit/jax.py's) sets
    the attributes below and writes the hooks where its text differs
    (:meth:`returned_states`, :meth:`kernel_text`, :meth:`launch_statement`,
    :meth:`kernel_parts`, :meth:`finish_header`, :meth:`internal`, and :meth:`module` for
    the header)."""

    # What a subclass writing a framework's Python sets: the rules, the
    # fused calls and the scope that names values and writes constants as tensors.
    rules: dict[str, Rule]
    fast_calls: dict[str, FastRule]
    scope_class: type[Scope]
    # ... how the entry treats the states its slices write: False (PyTorch), a slice writes
    # them in place; True (JAX's immutable arrays), a slice returns each state it writes
    # (:meth:`returned_states`), the entry stores it in its copy of `states` and returns the
    # new states after its outputs (`ENTRIES` rows then say which slice `writes` which);
    returns_states = False
    # ... whether a kernel may store results into states (a call's `writes`: the KV-cache
    # writes of a decode step in the kernel that makes k and v): PyTorch's launches write
    # the state in place; JAX's immutable arrays would need Pallas's aliasing;
    kernels_write_states = True
    kernels_scratch = True  # kernels with scratch buffers launch (emit/triton.py's `scratch`)
    # ... the fused calls whose torch function's CPU backward cannot be differentiated again
    # (SDPA's CPU flash kernel: issue 46 item 5): where autograd records the call, a CPU
    # module runs them under SDPA's math backend (emit/kernel_grad.py's math_under_autograd);
    cpu_autograd_math: frozenset[str] = frozenset()  # PyTorch's: emit/torch.py
    # ... the names the generated module defines, which no entry function may take;
    module_names: set[str]
    # ... and the words the module's docstring and errors name it by.
    framework: str
    command: str

    def __init__(self, sources: dict[str, str] | None = None, options: Options | None = None):
        self.sources = {name: text.splitlines() for name, text in (sources or {}).items()}
        self.options = options or Options()
        self.functions: list[str] = []
        self.kinds: dict[str, str] = {}  # slice kind -> function name
        self.used_names: set[str] = set()
        self.entries: list[str] = []
        self.metadata: list[str] = []
        self._repeated_user: dict[int, list[int | None]] = {}
        # The kernel instances of the calls this module launches (the graphs' own,
        # ir/kernels.py), by instance_key.
        self.kernels: dict[str, KernelInstance] = {}
        self.kernel_texts: dict[tuple, KernelText] = {}
        self.backwards: Backwards | None = None  # launches under autograd (emit/kernel_grad)

    def comment(self, loc: str, width: int = WIDTH - 4) -> str:
        if "|" in loc:
            user, std = loc.split("|", 1)
            where = "  [" + self.comment(std)[2:].split("  ")[0] + "]"
            head = self.comment(user, width - len(where))
            return head + where
        file, _, line = loc.rpartition(":")
        text = ""
        lines = self.sources.get(file)
        if lines and line.isdigit() and 0 < int(line) <= len(lines):
            text = "  " + lines[int(line) - 1].strip()
        short = file if is_std(file) else file.rsplit("/", 1)[-1]
        out = f"# {short}:{line}{text}"
        if len(out) > width:  # a long source line: its start, so the comment fits the width
            out = out[: max(width - 3, len(f"# {short}:{line}"))].rstrip() + "..."
        return out

    def _best_call(self, graph: Graph, index: int) -> Call | None:
        best = None
        for call in graph.calls:
            if (
                call.start <= index < call.stop
                and call.loc
                and not is_std(call.loc)
                and call.kind != "entry"
                and (best is None or call.depth > best.depth)
            ):
                best = call
        return best

    def _first_repeated_user(self, graph: Graph) -> list[int | None]:
        """For each step, the first step inside a repeated block (a layer) that reads what
        it makes, directly or through other steps; its own index when it is inside one."""
        key = id(graph)
        if key not in self._repeated_user:
            inside = [False] * len(graph.steps)
            for c in graph.calls:
                if c.iteration is not None:  # a layer's call: its span holds every nested one
                    for i in range(c.start, c.stop):
                        inside[i] = True
            users = graph.users()
            found: list[int | None] = [None] * len(graph.steps)
            for i in range(len(graph.steps) - 1, -1, -1):
                if inside[i]:
                    found[i] = i
                    continue
                best = None
                for r in graph.steps[i].results:
                    for u in users.get(r, []):
                        f = found[u] if u > i else None
                        if f is not None and (best is None or f < best):
                            best = f
                found[i] = best
            self._repeated_user[key] = found
        return self._repeated_user[key]

    def user_loc(self, graph: Graph, index: int, own: str) -> str:
        """The line of the user's model behind a step; std library lines are added after it.
        A step hoisted out of a layer (rope's tables) points at the line in the layer that
        reads it, not at the entry's call of the whole model."""
        if not is_std(own):
            return own
        best = self._best_call(graph, index)
        user = self._first_repeated_user(graph)[index]
        # Hoisted: the step sits in a call (the whole model's) around the layer that reads
        # it, outside that layer. A step of its own call (the embedding) keeps its line.
        if user is not None and user != index and (best is None or best.start <= user < best.stop):
            deeper = self._best_call(graph, user)
            if deeper is not None and (best is None or deeper.depth > best.depth):
                best = deeper
        return f"{best.loc}|{own}" if best else own

    def kernel_launch(
        self,
        graph: Graph,
        index: int,
        stop: int,
        starts: dict[int, list[Call]],
        users_outside: Callable[[int, int], set[str]],
        members: set[int],
        scope: Scope,
    ) -> tuple[Call, KernelText] | None:
        """A call of a bound op starting at step ``index`` whose kernel this module
        launches (numerics fast, its instance recorded in the graph, the `where` clause
        true), with its kernel's text; None otherwise. See emit/triton.py."""
        if self.options.numerics != Numerics.FAST or not graph.kernels:
            return None
        # The longest first: a span op's call (check/spans.py) over an op call it contains.
        for call in sorted(starts.get(index, []), key=lambda c: c.start - c.stop):
            if (
                not call.attributes.get("kernel")
                or not call.attributes.get("kernel_applies")
                or call.stop > stop
                or call.stop <= call.start
            ):
                continue
            results = call.attributes.get("results") or []
            if any(not isinstance(r, str) for r in results) or not all(
                j in members for j in range(call.start, call.stop)
            ):
                continue
            if call.attributes.get("writes") and (
                not self.kernels_write_states or self.backwards is not None
            ):
                continue  # its kernel stores into states: the call without the writes
            found = graph.kernels.get(instance_key(call.attributes))
            if found is None:
                continue  # not recorded (check/kernel_instances.py): the op's body runs
            self.kernels[found.key] = found
            if not self.kernels_scratch and self.uses_scratch(call):
                continue  # its kernel keeps scratch buffers, which this target cannot
            if users_outside(call.start, call.stop) - set(results):
                continue
            if not all(
                a in scope.names or a in scope.literals
                for a in launch_args(call)
                if a.startswith("%")
            ):
                continue
            return call, self.kernel_text(call)
        return None

    def uses_scratch(self, call: Call) -> bool:
        """Whether a kernel the call launches declares `scratch(...)` buffers."""
        return self.kernels[instance_key(call.attributes)].scratch

    @abstractmethod
    def kernel_text(self, call: Call) -> Any:
        """The kernel instance a bound call launches, written once per module (emit/triton.py's
        for PyTorch, emit/pallas.py's for JAX)."""

    def stage_texts(
        self, call: Call, precision: str, text_of: Callable[..., Any], chain_of: Callable[..., Any]
    ) -> Any:
        """The text of the kernel a call binds, or of its chain's kernels and the launcher
        that runs them in turn, written once per module (``text_of`` and ``chain_of``:
        emit/triton.py's or emit/pallas.py's)."""
        # Lowered once at lowering time (check/kernel_instances.py), the state writes
        # redirected; a kernel that does not lower or accesses out of bounds for these
        # shapes raises its coded error here, where its launch would be written.
        kernels = self.kernels[instance_key(call.attributes)].launched()
        writes = redirections(call.attributes)
        key = (
            *(
                (k.name, repr(sorted(k.generics.items())), repr(sorted(k.scalars.items())))
                for k in kernels
            ),
            repr(writes),
        )
        if key not in self.kernel_texts:
            texts = [text_of(k, self.sources, precision, self.used_names) for k in kernels]
            self.kernel_texts[key] = (
                texts[0] if len(texts) == 1 else chain_of(texts, self.used_names)
            )
        return self.kernel_texts[key]

    @abstractmethod
    def launch_statement(
        self,
        text: Any,
        args: list[str],
        outs: list[str],
        body: list[str],
        call: Call,
        scope: Scope,
        backward: Any = None,
    ) -> tuple[str, frozenset[str], frozenset[str]]:
        """The statement at a bound op's call: its kernel's launch, or ``body`` (the op's
        steps) where the kernel cannot run; returns the text, its targets and what it reads."""

    def fast_call(
        self,
        graph: Graph,
        index: int,
        stop: int,
        starts: dict[int, list[Call]],
        users_outside: Callable[[int, int], set[str]],
    ) -> Call | None:
        if not self.options.fast:
            return None
        for call in sorted(starts.get(index, []), key=lambda c: c.start - c.stop):
            if call.callee not in self.fast_calls or call.stop > stop or call.stop <= call.start:
                continue
            results = call.attributes.get("results") or []
            if any(not isinstance(r, str) for r in results):
                continue
            escaping = users_outside(call.start, call.stop)
            if escaping - set(results):
                continue  # a value of the span is shared with later steps (CSE): keep steps
            if any(
                isinstance(a, str)
                and a.startswith("%")
                and graph.producers().get(a, -1) >= call.start
                for a in call.attributes.get("args", [])
            ):
                continue
            return call
        return None

    def draft(self, graph: Graph, sl: Slice, constants: dict[int, str] | None = None) -> Draft:
        """The body of ``sl``'s function; ``constants`` (input position -> literal) are
        inputs known when lowering, written as literals instead of passed in."""
        scope = self.scope_class(graph, sl, options=self.options)
        for j, lit in (constants or {}).items():
            scope.literals[sl.inputs[j]] = lit
        params = [scope("@" + p) for p in sl.parameters + sl.states]
        inputs = [scope(v) for v in sl.inputs]
        body: list[Statement] = []
        starts: dict[int, list[Call]] = {}
        for c in graph.calls:
            starts.setdefault(c.start, []).append(c)
        users = graph.users()

        def users_outside(a: int, b: int) -> set[str]:
            out = set()
            for step in graph.steps[a:b]:
                for r in step.results:
                    if (
                        r in graph.outputs
                        or r in sl.outputs
                        or any(u < a or u >= b for u in users.get(r, []))
                    ):
                        out.add(r)
            return out

        order = sl.steps or list(range(sl.start, sl.stop))
        members = set(order)
        last_loc: list[str | None] = [None]

        def run(k: int, end: int, out: list[Statement], launching: bool = True) -> None:
            while k < end:
                i = order[k]
                step = graph.steps[i]
                launch = (
                    self.kernel_launch(graph, i, sl.stop, starts, users_outside, members, scope)
                    if launching
                    else None
                )
                if launch is not None:
                    # A bound op: its kernel where kernels_ready, else its body (emit/triton).
                    kcall, text = launch
                    stop_k = k + kcall.stop - kcall.start
                    loc = self.user_loc(graph, kcall.start, kcall.loc)
                    if loc and loc != last_loc[0]:
                        out.append(Statement(self.comment(loc), comment=True))
                    last_loc[0] = loc
                    inner: list[Statement] = []
                    run(k, stop_k, inner, launching=False)
                    # The tensors only: scalar arguments are constants of the kernel.
                    args = [scope(a) for a in launch_args(kcall)]
                    outs = [scope(r) for r in kcall.attributes["results"]]
                    backward = (
                        self.backwards.backward(graph, kcall, text.key)
                        if self.backwards is not None
                        else None
                    )
                    line, targets, reads = self.launch_statement(
                        text, args, outs, [st.text for st in inner], kcall, scope, backward
                    )
                    out.append(Statement(line, targets, reads))
                    last_loc[0] = None
                    k = stop_k
                    continue
                call = self.fast_call(graph, i, sl.stop, starts, users_outside)
                if call is not None and not all(j in members for j in range(call.start, call.stop)):
                    call = None
                if call is not None and not all(
                    a in scope.names or a in scope.literals
                    for a in call.attributes["args"]
                    if isinstance(a, str) and a.startswith("%")
                ):
                    call = None  # the fused call reads a value this slice does not have
                if call is not None:
                    args = [
                        scope(a) if isinstance(a, str) else literal(a)
                        for a in call.attributes["args"]
                    ]
                    outs = [scope(r) for r in call.attributes["results"]]
                    lines = self.fast_calls[call.callee](call, scope, args, outs)
                    loc = self.user_loc(graph, call.start, call.loc)
                    op = call.callee
                    if (
                        call.callee in self.cpu_autograd_math
                        and self.options.device.split(":")[0] == "cpu"
                    ):
                        if loc and loc != last_loc[0]:
                            out.append(Statement(self.comment(loc), comment=True))
                        tensors = [
                            a
                            for a, v in zip(args, call.attributes["args"])
                            if isinstance(v, str) and a.isidentifier()
                        ]
                        out.append(Statement(*math_under_autograd(tensors, lines)))
                        last_loc[0] = loc
                        k += call.stop - call.start
                        continue
                    k += call.stop - call.start
                else:
                    lines = self.rules[step.op](step, scope, self.options.numerics)
                    loc = self.user_loc(graph, i, step.loc)
                    op = step.op
                    k += 1
                if lines and loc and loc != last_loc[0]:
                    out.append(Statement(self.comment(loc), comment=True))
                    last_loc[0] = loc
                out.extend(
                    parse_statement(line, i, op, loc, self.framework, self.internal)
                    for line in lines
                )

        run(0, len(order), body)
        outputs = [scope(v) for v in sl.outputs]
        where = (
            f"Steps {sl.start}..{sl.stop}"
            if len(order) == sl.stop - sl.start
            else f"{len(order)} of steps {sl.start}..{sl.stop}"
        )
        doc = (
            f"{where} of {graph.model}.{graph.entry}"
            + (
                f" (and every slice of this kind, e.g. `{sl.prefix.rstrip('.')}`)"
                if sl.prefix
                else ""
            )
            + "."
        )
        return Draft(sl.name, inputs, params, outputs, body, doc)

    def function_name(self, sl: Slice) -> str:
        if sl.kind in self.kinds:
            return self.kinds[sl.kind]
        name = fresh(identifier(sl.name), self.used_names)
        self.used_names.add(name)
        self.kinds[sl.kind] = name
        return name

    def write_function(
        self, name: str, draft: Draft, keep: set[int] | None, narrow: bool
    ) -> tuple[list[int], list[int]]:
        """Write the function; returns the positions of the inputs and of the parameters
        and states it takes. ``narrow``: leave out the ones its body does not read (the
        entry function calls it); otherwise keep them, named `_x` (a plan calls it with
        every input of its slice)."""
        body, live = draft.finish(keep)
        taken_in = [j for j, v in enumerate(draft.inputs) if v in live]
        taken_p = [j for j, v in enumerate(draft.params) if v in live]
        if narrow:
            signature = [draft.inputs[j] for j in taken_in] + [draft.params[j] for j in taken_p]
        else:
            taken_in, taken_p = list(range(len(draft.inputs))), list(range(len(draft.params)))
            signature = [v if v in live else "_" + v for v in draft.inputs + draft.params]
        outs = [
            draft.outputs[j] for j in (range(len(draft.outputs)) if keep is None else sorted(keep))
        ]
        doc = docstring(draft.doc)
        lines = [f"def {name}({', '.join(signature)}):", doc]
        lines += ["    " + st.text for st in body]
        ret = ", ".join(outs)
        lines.append(
            f"    return {ret}" + ("," if len(outs) == 1 else "") if outs else "    return ()"
        )
        self.functions.append("\n".join(lines))
        return taken_in, taken_p

    def slice_function(self, graph: Graph, sl: Slice) -> str:
        """The function for ``sl``'s kind (emitted once per kind, taking every input of the
        slice, as a plan calls it); returns its name."""
        if sl.kind in self.kinds:
            return self.kinds[sl.kind]
        name = self.function_name(sl)
        self.write_function(name, self.draft(graph, sl), None, narrow=False)
        return name

    def constants(self, graph: Graph, slices: list[Slice]) -> dict[str, dict[int, str]]:
        """Per kind, the inputs that are constants known when lowering (the same one in
        every slice of the kind): written as literals, not passed between slices."""
        producers = {r: st for st in graph.steps for r in st.results}
        found: dict[str, dict[int, str]] = {}
        for sl in slices:
            mine = {}
            for j, v in enumerate(sl.inputs):
                st = producers.get(v)
                if st is not None and st.op == "constant":
                    mine[j] = literal(st.attributes["value"])
            found[sl.kind] = (
                mine
                if sl.kind not in found
                else {j: lit for j, lit in found[sl.kind].items() if mine.get(j) == lit}
            )
        return found

    def returned_states(self, graph: Graph, sl: Slice) -> list[str]:
        """The states ``sl``'s function returns as extra results, where
        :attr:`returns_states`; none here: PyTorch writes a state in place (``index_put_``)."""
        return []

    def entry_function(self, graph: Graph, slices: list[Slice]) -> str:
        """The entry's function: each slice's function called in turn (written here, once
        per kind, returning only what a later slice or the entry reads), its outputs
        returned. Its row of ``ENTRIES`` is added to :attr:`metadata`."""
        # Where states are returned, each slice's written states become outputs of it
        # ("@path"), so that liveness keeps the writes and the entry stores the new values.
        writes = {id(sl): self.returned_states(graph, sl) for sl in slices}
        slices = [
            replace(sl, outputs=sl.outputs + ["@" + p for p in writes[id(sl)]])
            if writes[id(sl)]
            else sl
            for sl in slices
        ]
        written = {"@" + p for ps in writes.values() for p in ps}
        constants = self.constants(graph, slices)
        drafts: dict[str, Draft] = {}
        for sl in slices:
            if sl.kind not in drafts:
                self.function_name(sl)
                drafts[sl.kind] = self.draft(graph, sl, constants[sl.kind])
        keep = kept_outputs(slices, drafts, set(graph.outputs) | written)
        taken: dict[str, tuple[list[int], list[int]]] = {}
        for sl in slices:
            if sl.kind not in taken:
                taken[sl.kind] = self.write_function(
                    self.kinds[sl.kind], drafts[sl.kind], keep[sl.kind], narrow=True
                )
        scope = self.scope_class(graph, options=self.options)
        for fn in self.kinds.values():
            scope.reserve(fn)
        if self.returns_states:
            scope.reserve("states")
        for sl in slices:  # the local names of the new states (`self_attn_k_cache`)
            for o in sl.outputs:
                if o.startswith("@"):
                    scope.reserve(identifier(sl.relative(o[1:])))
        inputs = [scope(v) for v in graph.inputs]
        read = {v for sl in slices for j in taken[sl.kind][0] for v in [sl.inputs[j]]}
        read |= set(graph.outputs)
        # The entry's own inputs are its declared signature (the runtime passes all of them):
        # one the model never reads is named `_x`, Python's mark of an unused argument.
        signature = [n if v in read else "_" + n for v, n in zip(graph.inputs, inputs)]
        name = identifier(graph.entry)
        while name in self.used_names or name in self.module_names:
            name = "entry_" + name
        self.used_names.add(name)
        lines = [f"def {name}({', '.join([*signature, 'params', 'states'])}):"]
        shapes = ", ".join(
            f"{v[1:]} {graph.values[v].dtype}{list(graph.values[v].shape)}" for v in graph.inputs
        )
        outs = ", ".join(f"{scope.dtype(v)}{list(scope.shape(v))}" for v in graph.outputs)
        arrow = f"({outs}), and the new states" if self.returns_states else outs
        lines.append(docstring(f"Entry {graph.model}.{graph.entry}({shapes}) -> {arrow}."))
        if self.returns_states:
            lines.append("    states = dict(states)  # the caller's dict is not changed")
        rows = []
        for sl in slices:
            fn = self.kinds[sl.kind]
            tin, tp = taken[sl.kind]
            paths = sl.parameters + sl.states
            args = [scope(sl.inputs[j]) for j in tin]
            args += [
                f"{'states' if paths[j] in graph.states else 'params'}[{paths[j]!r}]" for j in tp
            ]
            kept = [sl.outputs[j] for j in sorted(keep[sl.kind])]
            outputs = [
                identifier(sl.relative(o[1:])) if o.startswith("@") else scope(o) for o in kept
            ]
            target = ", ".join(outputs) + ("," if len(outputs) == 1 else "")
            call = f"{fn}({', '.join(args)})"
            lines.append(f"    {target} = {call}" if outputs else f"    {call}")
            lines += [
                f"    states[{o[1:]!r}] = {local}"
                for o, local in zip(kept, outputs)
                if o.startswith("@")
            ]
            row = dict(
                function=fn,
                kind=sl.kind,
                start=sl.start,
                stop=sl.stop,
                inputs=[sl.inputs[j] for j in tin],
                outputs=[o for o in kept if not o.startswith("@")],
                parameters=[paths[j] for j in tp if paths[j] not in graph.states],
                states=[paths[j] for j in tp if paths[j] in graph.states],
            )
            if self.returns_states:
                row["writes"] = [o[1:] for o in kept if o.startswith("@")]
            rows.append(row)
        results = ", ".join(self.entry_output(graph, scope, v) for v in graph.outputs)
        lines.append(f"    return ({results},)" + (", states" if self.returns_states else ""))
        self.metadata.append(self.entry_metadata(graph, rows, name))
        return "\n".join(lines)

    def entry_output(self, graph: Graph, scope: Scope, ref: str) -> str:
        """An entry's output: a value, or a whole state or parameter (``return self.cache``),
        returned as a copy (as the interpreter does): the next call writes the state in
        place, and a result the caller holds must not change under them. Where states are
        returned (JAX's immutable arrays), no copy is needed."""
        if ref.startswith("@"):
            path = ref[1:]
            table = "states" if path in graph.states else "params"
            return f"{table}[{path!r}]" + ("" if self.returns_states else ".clone()")
        return scope(ref)

    def entry_metadata(self, graph: Graph, rows: list[dict], function: str = "") -> str:
        out = [f"    {graph.entry!r}: dict("]
        if function:  # the entry's function: `v_input` for an entry named `input`
            out.append(f"        function={function!r},")
        out += [
            f"        inputs={graph.inputs!r},",
            f"        outputs={graph.outputs!r},",
            "        slices=[",
        ]
        for row in rows:
            out.append("            dict(")
            out += [f"                {k}={v!r}," for k, v in row.items()]
            out.append("            ),")
        out += ["        ],", "    ),"]
        return "\n".join(out)

    @abstractmethod
    def module(
        self, graphs: list[Graph], origin: str, slices: list[list[Slice]] | None = None
    ) -> str:
        """The module's text: its header (docstring, imports, constants), then
        :meth:`module_text`."""

    def doc_head(self, origin: str) -> list[str]:
        """The first lines of the generated module's docstring."""
        return [
            f'"""{self.framework} source generated by linnet-lang {__version__} from {origin}.',
            "",
            f"Do not edit: regenerate with `{self.command}`. Each function below is one slice of an",
            "entry; slices of one kind (every layer) share a function. Comments give the .linnet",
        ]

    @abstractmethod
    def kernel_parts(self, texts: list[Any]) -> tuple[str, str, list[str]]:
        """What a module that launches the kernels ``texts`` adds: lines after its imports,
        its table of runs, and the functions before the slices'."""

    @abstractmethod
    def finish_header(self, header: list[str], body: str) -> None:
        """Imports that only some modules need, added to ``header`` once ``body`` is known."""

    def module_text(self, header: list[str], entries: list[str], origin: str) -> str:
        """The module: ``header`` (its docstring, imports and constants), the kernels its
        functions launch, the slices' functions, ``entries`` and ``ENTRIES``, with lines
        wrapped at :data:`WIDTH`; compiled first (E0911 where it does not)."""
        written = "\n".join(self.functions + entries)
        # The kernels this module launches, first; one whose every call turned out dead is
        # not written.
        texts = [
            t
            for t in self.kernel_texts.values()
            if re.search(rf"[ (]{re.escape(t.launcher)}[(,]", written)
        ]
        if texts:
            lines, runs, functions = self.kernel_parts(texts)
            at = max(i for i, h in enumerate(header) if h.startswith(("import ", "from "))) + 1
            header[at:at] = lines.rstrip("\n").split("\n")
            header += [runs, "", ""]
            self.functions[:0] = functions
        body = "\n\n\n".join(self.functions + entries)
        self.finish_header(header, body)
        meta = "ENTRIES = {\n" + "\n".join(self.metadata) + "\n}\n"
        text = "\n".join(header) + "\n" + body + "\n\n\n" + meta
        text = "\n".join(w for line in text.split("\n") for w in wrap(line))
        try:
            compile(text, origin or "<linnet>", "exec")
        except SyntaxError as exc:
            shown = (exc.text or "").strip()
            raise self.internal(
                "E0911",
                f"the generated {self.framework} module does not "
                f"compile: {exc.msg} at line {exc.lineno}: `{shown}`",
            ) from None
        return text

    @staticmethod
    @abstractmethod
    def internal(code: str, message: str) -> Exception:
        """An internal error of this emitter (a bug in it, not in the model)."""
