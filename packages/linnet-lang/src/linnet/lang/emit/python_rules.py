"""What the emitters that write Python (emit/torch.py, emit/jax.py) share below the emitter
class (emit/python_emitter.py): the :class:`Scope` that names values inside one generated
function, the signatures of a primitive rule (:data:`Rule`) and of a fused call
(:data:`FastRule`), the rules that are the same text in both (a constant becomes a literal),
the integer range analysis that leaves out guards that cannot fire, the clamping of a gather's
or scatter-add's indices, and the parsing of each generated statement (E0910).

The examples below share one lowered entry, ``y[i] = x[(i + 1) % N]`` at N = 4 (``%t.2`` is
``i + 1``, ``%t.4`` is ``(i + 1) % 4``):

>>> from linnet.lang import Program, lower
>>> from linnet.lang.emit.torch import TorchScope
>>> graph = lower(Program.from_text('''
... model M<N: Dim> { entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
...     let y[i: N] = x[(i + 1) % N]; return y } }'''), "run", {"x": [4]})
>>> scope = TorchScope(graph)
>>> [constant_rule(s, scope, "exact") for s in graph.steps if s.op == "constant"], scope.literals
([[], []], {'%t.1': '1', '%t.3': '4'})
>>> shifted_by(scope, "%t.2", 4), in_range(scope, "%t.4", 4), in_range(scope, "%t.2", 4)
(1, True, False)
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from linnet.lang.emit.python import Statement
from linnet.lang.emit.tiles import literal
from linnet.lang.ir.graph import Call, Graph, Step
from linnet.lang.passes.bounds import value_ranges
from linnet.lang.passes.slices import Slice
from linnet.lang.pipeline import Numerics


def identifier(text: str) -> str:
    """A Python name for an SSA value or a parameter path (`%q.1` → `q_1`). Keywords,
    builtins (`float`, `len`, `id`) and the module's own names (`torch`, `F`) get a `v_`
    prefix: generated code calls ``float('-inf')`` and must not find a tensor there.

    >>> identifier("%q.1"), identifier("%float"), identifier("%len"), identifier("@class")
    ('q_1', 'v_float', 'v_len', 'v_class')
    """
    name = re.sub(r"[^0-9A-Za-z_]", "_", text.lstrip("%@"))
    if (
        not name
        or name[0].isdigit()
        or keyword.iskeyword(name)
        or keyword.issoftkeyword(name)
        or name in RESERVED
        or name.startswith("__")
    ):
        name = "v_" + name
    return name


# Names the generated module itself uses, and every builtin (a value named `float` would
# shadow the `float('-inf')` of a masked softmax, `len` or `type` any later call of them).
RESERVED = {"torch", "F", "DEVICE", "params", "states", "math", "ENTRIES"} | set(dir(builtins))
# ... and what a module that launches kernels defines (emit/triton.py's HEADER and READY).
RESERVED |= {
    "os",
    "types",
    "triton",
    "tl",
    "TRITON",
    "INTERPRET",
    "wrap_triton",
    "LIBRARY",
    "RUNS",
    "kernels_ready",
    "kernel_op",
    "POISON",
    "new_result",
    "PDL",
    "PDL_LAUNCH",
    "pdl_launch",
    "_PDL_DEVICES",
    "_PDL_MODE",
    "contextlib",
    "set_wrap_triton_enabled",
    "direct",
    "_LIBRARY",
    "_SCRATCH",
    "check_inplace",
    "rows_in_place",
    "strides_as",
    "dot16",
    "prefetch_l2",
    "prefetching",
    "scratch",
    "warnings",
    "max_nan",
    "min_nan",
    "_tree_reduce",
    "_interpreter_fast_paths",
}
# ... and emit/kernel_grad.py's helpers for launches under autograd.
RESERVED |= {"cache_reach"}  # the torch emitter's CPU decode helper
RESERVED |= {"kernel_grad_op", "launch_with_grad", "body_backward", "no_backward"}


_ANONYMOUS = re.compile(r"^%t(\.\d+)?$")


@dataclass
class Scope:
    """Names inside one generated function: SSA values, parameters and constants."""

    graph: Graph
    slice: Slice | None = None
    names: dict[str, str] = field(default_factory=dict)
    literals: dict[str, str] = field(default_factory=dict)  # constant steps inlined as literals
    # The values of `names`, kept beside it: rebuilding the set for every new name made
    # emission quadratic in the length of an entry.
    used: set[str] = field(default_factory=set)
    # Where the search for a free `base_N` stopped last time (every earlier N is taken).
    next_suffix: dict[str, int] = field(default_factory=dict)
    # The emitter's options (its target device, say), for rules whose text depends on them.
    options: Options | None = None

    def __call__(self, ref: str) -> str:
        if ref in self.literals:
            return self.literals[ref]
        if ref not in self.names:
            anonymous = _ANONYMOUS.match(ref)
            step = self.producers().get(ref) if anonymous else None
            if step is not None:
                # A value the source never named (`%t.37`): named after its op and numbered
                # in this function (`pad_1`, `neg_1`), not after its place in the whole graph.
                base, n = re.sub(r"[^0-9A-Za-z_]", "_", step.op), 1
                first = f"{base}_1"
            else:
                base = identifier(
                    self.slice.relative(ref[1:]) if ref.startswith("@") and self.slice else ref
                )
                n = 1
                first = base
            n = self.next_suffix.get(base, n)
            name = first if n == 1 else f"{base}_{n}"
            while name in self.used:
                n += 1
                name = f"{base}_{n}"
            self.next_suffix[base] = n
            self.names[ref] = name
            self.used.add(name)
        return self.names[ref]

    def reserve(self, name: str) -> None:
        """Keep ``name`` (a function the entry calls) from being given to a value."""
        self.used.add(name)

    def tensor(self, ref: str) -> str:
        """``ref`` as a tensor expression where a rule needs one (a constant inlined as a
        literal becomes the framework's scalar tensor): each emitter's scope spells it
        (emit/torch.py's :class:`~linnet.lang.emit.torch.TorchScope`, emit/jax.py's
        ``JaxScope``)."""
        raise NotImplementedError(f"{type(self).__name__} writes no tensors")

    def producers(self) -> dict[str, Step]:
        if not hasattr(self, "_producers"):
            self._producers = {r: st for st in self.graph.steps for r in st.results}
        return self._producers

    def shape(self, ref: str) -> tuple[int, ...]:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].shape
        return self.graph.values[ref].shape

    def dtype(self, ref: str) -> str:
        if ref.startswith("@"):
            path = ref[1:]
            table = self.graph.states if path in self.graph.states else self.graph.parameters
            return table[path].dtype
        return self.graph.values[ref].dtype


# ---------------------------------------------------------------- primitive rules
Rule = Callable[[Step, Scope, str], list[str]]

TORCH_INT = {"i8", "i16", "i32", "i64", "u8"}


def constant_rule(s: Step, n: Scope, numerics: str) -> list[str]:
    """The rule of ``constant`` in every Python emitter: no statement, the value becomes a
    literal of the scope (``1``, ``float('-inf')``) that later rules write in place of a name
    (the module docstring shows it)."""
    n.literals[s.results[0]] = literal(s.attributes["value"])
    return []


def shifted_by(n: Scope, idx: str, size: int) -> int | None:
    """If ``idx`` is `iota(size) + c` (or `- c`), the shift c; else None: a read of
    ``x[i + c]`` under bounds zero is then a slice and a pad, not a gather (the module
    docstring shows it)."""
    producers = n.producers()
    step = producers.get(idx)
    if step is None or step.op not in ("add", "sub"):
        return None
    a, b = (producers.get(o) for o in step.operands)
    if a is None or b is None:
        return None
    if a.op == "iota" and b.op == "constant":
        iota, const, sign = a, b, (1 if step.op == "add" else -1)
    elif b.op == "iota" and a.op == "constant" and step.op == "add":
        iota, const, sign = b, a, 1
    else:
        return None
    if iota.attributes["shape"] != [size] or not isinstance(const.attributes["value"], int):
        return None
    return sign * const.attributes["value"]


def in_range(n: Scope, ref: str, size: int) -> bool:
    """Whether every element of integer value ``ref`` lies in ``0..size-1``, as the graph's
    one range analysis (:func:`linnet.lang.passes.bounds.value_ranges`) finds: an index that is
    needs no guard (the module docstring shows it)."""
    r = value_ranges(n.graph).get(ref)
    return r is not None and r[0] >= 0 and r[1] < size


def inside_mask(n: Scope, indices: list[str], shape: tuple[int, ...], guarded: list[bool]) -> str:
    """The mask of the positions where each ``guarded`` index is within its axis, broadcast
    over the axes after the indexed ones: ``((i >= 0) & (i < 8))[..., None]`` (a gather or
    a scatter-add under bounds zero; the JAX emitter's too).

    >>> from linnet.lang.emit.torch import TorchScope
    >>> from linnet.lang.ir.graph import Graph
    >>> inside_mask(TorchScope(Graph("run", "M")), ["%i"], (4, 8), [True])
    '((i >= 0) & (i < 4))[..., None]'
    """
    valid = " & ".join(
        f"({n.tensor(r)} >= 0) & ({n.tensor(r)} < {shape[a]})"
        for a, r in enumerate(indices)
        if guarded[a]
    )
    trailing = len(shape) - len(indices)
    return f"({valid})" + ("[..., " + ", ".join(["None"] * trailing) + "]" if trailing else "")


def clamped(
    s: Step,
    n: Scope,
    out: str,
    indices: list[str],
    shape: tuple[int, ...],
    clamp: str = "{}.long().clamp(0, {})",
    plain: str = "{}.long()",
) -> tuple[list[str], list[str], list[bool]]:
    """The indices of a gather or a scatter-add (``x[i, j]``): under bounds zero, one that
    may fall outside its axis is clamped into it first (``out_i0 = ...``; :func:`inside_mask`
    masks its positions after); the others are used as they are. Returns the clamping lines,
    the index expressions and which indices are guarded; ``clamp`` and ``plain`` spell them
    (the JAX emitter's: ``jnp.clip({}, 0, {})`` and ``{}``).

    >>> from linnet.lang.emit.torch import TorchScope
    >>> from linnet.lang.ir.graph import Graph, Step
    >>> gather = Step("gather", ["%x", "%i"], ["%y"], {"bounds": "zero"})
    >>> clamped(gather, TorchScope(Graph("run", "M")), "y", ["%i"], (4,))
    (['y_i0 = i.long().clamp(0, 3)'], ['y_i0'], [True])
    """
    lines, names = [], []
    guarded = [
        s.attributes["bounds"] == "zero" and not in_range(n, r, shape[a])
        for a, r in enumerate(indices)
    ]
    for axis, ref in enumerate(indices):
        i = n.tensor(ref)
        if guarded[axis]:
            lines.append(f"{out}_i{axis} = {clamp.format(i, shape[axis] - 1)}")
            names.append(f"{out}_i{axis}")
        else:
            names.append(plain.format(i))
    return lines, names, guarded


# ---------------------------------------------------------------- fast calls
FastRule = Callable[[Call, Scope, list[str], list[str]], list[str]]


# ---------------------------------------------------------------- functions
def launch_args(call: Call) -> list[str]:
    """The tensors a bound call's launch passes: its tensor arguments, then, for each state
    it writes (``writes``: passes/spans.py's ``state_writes``), the state and its positions
    (and, for a paged cache, the pages written).

    >>> from linnet.lang.ir.graph import Call
    >>> call = Call("std.nn.norm::rms_norm", "op", 0, 2, 0, attributes={"args": ["%x", "@w", 1e-5]})
    >>> launch_args(call)
    ['%x', '@w']
    """
    out = [a for a in call.attributes.get("args", []) if isinstance(a, str)]
    for w in call.attributes.get("writes") or []:
        out += [w["state"], w["at"]] + ([w["page"]] if w.get("page") else [])
    return out


def is_std(loc: str) -> bool:
    """Whether a step's location is in the standard library (not the user's model).

    >>> is_std("std/nn/norm.linnet:3"), is_std("llama.linnet:3")
    (True, False)
    """
    return loc.startswith("std/")


@dataclass
class Options:
    """What an emitter is asked for: the numerics, whether fused calls are used, and the
    model's device (written into a PyTorch module as ``DEVICE``)."""

    numerics: Numerics = Numerics.EXACT
    fast: bool = True  # use FAST_CALLS where they apply
    device: str = "cpu"  # the model's torch device, written into the module (DEVICE)


def internal_error(code: str, message: str, help: str = "") -> Exception:
    """An emitter's internal error (a bug in it, not in the model) as a coded
    :class:`~linnet.lang.LinnetError`; ``help`` defaults to the PyTorch emitter's.

    >>> internal_error("E0910", "a rule wrote invalid Python").diagnostics[0].code
    'E0910'
    """
    from linnet.lang.diagnostics import Diagnostic, LinnetError

    return LinnetError(
        Diagnostic(
            code,
            message,
            help=help
            or (
                "this is a bug in linnet-lang's PyTorch emitter, not in your model: please report it "
                "with the model and the command; `linnet run` (the interpreter) runs the model "
                "meanwhile"
            ),
        )
    )


def parse_statement(
    text: str,
    step: int,
    op: str,
    loc: str,
    framework: str = "PyTorch",
    internal: Callable[[str, str], Exception] = internal_error,
) -> Statement:
    """Parse one generated statement; a rule that wrote something that is not one valid
    Python statement is an internal error (E0910) naming the step and its source line, made
    by ``internal`` (the emitter's, whose help says what runs the model meanwhile) and
    naming the ``framework``'s emitter.

    >>> parse_statement("y = x + 1", 0, "add", "").targets
    frozenset({'y'})
    """
    if text.startswith("#"):
        return Statement(text, comment=True)
    where = f"step {step} (`{op}`" + (f", from {loc.replace('|', ' via ')}" if loc else "") + ")"
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise internal(
            "E0910",
            f"the {framework} emitter wrote invalid Python for {where}: {exc.msg}: `{text}`",
        ) from None
    if len(tree.body) != 1:
        raise internal(
            "E0910",
            f"the {framework} emitter wrote {len(tree.body)} statements "
            f"on one line for {where}: `{text}`",
        )
    node = tree.body[0]
    for sub in ast.walk(node):
        # `0.clamp(0, 1)` parses as `(0.).clamp` on some inputs and fails at run time on all
        # of them: a method called on a literal is never what a rule means.
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Constant)
            and not isinstance(sub.value.value, str)
        ):
            raise internal(
                "E0910",
                f"the {framework} emitter called `.{sub.attr}` on the "
                f"literal {sub.value.value!r} for {where}: `{text}`",
            )
    reads = frozenset(
        s.id for s in ast.walk(node) if isinstance(s, ast.Name) and isinstance(s.ctx, ast.Load)
    )
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        return Statement(
            text, frozenset(t.id for t in node.targets if isinstance(t, ast.Name)), reads
        )
    return Statement(text, reads=reads, effect=True)
