"""Lowering an entry for concrete shapes: binding the model's generics from the
inputs, config and weights, then running the entry to a graph (`lower`)."""

from __future__ import annotations

import re
from typing import Any

import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.blocks import instantiate, walk_instance
from linnet.lang.check.checker import check_modules, dedupe, too_deep
from linnet.lang.check.evaluate import NEGATIVE_HELP, Evaluator, Fail, Frame, fail, walk
from linnet.lang.check.weight_checks import check_weights, dense_count, param_spans
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, Span
from linnet.lang.ir.builder import Builder
from linnet.lang.ir.graph import Graph, ValueType
from linnet.lang.pipeline import run_stages
from linnet.lang.syntax.program import Program
from linnet.lang.tensors.dims import Dim, solve_for
from linnet.lang.tensors.values import Const


def find_model(program: Program, model: str | None) -> A.BlockDecl:
    models = [i for i in program.root.items if isinstance(i, A.BlockDecl) and i.kind == "model"]
    if model is not None:
        for m in models:
            if m.name == model:
                return m
        raise LinnetError(
            Diagnostic(
                "E0600",
                f"no model `{model}` in {program.root.source.name}",
                help="models here: " + (", ".join(m.name for m in models) or "none"),
            )
        )
    if len(models) != 1:
        raise LinnetError(
            Diagnostic(
                "E0600",
                f"{program.root.source.name} declares {len(models)} models; name one",
                help=(
                    f"pick one with `--model {models[0].name}` (`model=` in Python); models here: "
                    + ", ".join(m.name for m in models)
                )
                if models
                else "declare one: `model Name<...> { ... entry decode(...) ... }`",
            )
        )
    return models[0]


def probe_inputs(entry: A.FuncDecl, config: dict[str, Any] | None = None) -> dict[str, list[int]]:
    """Input shapes to lower ``entry`` with when only the model's layout matters (which
    parameters, of which shapes): a dim named by an integer of ``config`` (a fixed batch
    ``B``) takes that value, every other dim 1.

    >>> from linnet.lang.syntax.program import model_file
    >>> decl = find_model(Program.from_file(model_file("std.models.llama")), None)
    >>> probe_inputs(next(m for m in decl.methods if m.name == "decode"), {"B": 8})
    {'token': [8], 'pos': [8]}
    """
    values = config or {}

    def size(dim: A.Expr) -> int:
        value = values.get(dim.name) if isinstance(dim, A.Name) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    return {
        p.name: [size(d) for d in p.type.dims]
        for p in entry.params
        if isinstance(p.type, A.TensorType)
    }


def config_key_help(key: str, known: list[str]) -> str:
    """E0602's help for a config key ``key`` that is none of the model's ``known`` names: the
    closest one (a misspelling, or the right name in another case), then all of them.

    >>> config_key_help("rms_eps", ["H", "rms_norm_eps"])
    'did you mean `rms_norm_eps`? (known names: H, rms_norm_eps)'
    >>> config_key_help("h", ["H", "rms_norm_eps"])
    'did you mean `H`? (known names: H, rms_norm_eps)'
    """
    from linnet.lang.check.hints import did_you_mean

    names = ", ".join(known)
    return did_you_mean(key, known, f"known names: {names}").replace(
        "?", f"? (known names: {names})", 1
    )


def lower(
    program: Program,
    entry: str,
    inputs: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    weights: dict[str, tuple] | None = None,
    model: str | None = None,
    check: bool = True,
    grad_clauses: dict[int, Any] | None = None,
) -> Graph:
    """Lower a model's entry for concrete shapes into a :class:`Graph`.

    ``inputs`` maps each entry parameter to a shape (list of ints) or to ``(shape, dtype)``.
    ``config`` maps config members and model generics to values. ``weights`` maps parameter
    paths to ``(shape, dtype)``; dims that weights determine are bound from them, and a
    missing, unexpected or mis-shaped weight is an error. ``grad_clauses``: a dict that
    lowering fills with each call's ``grad`` clause, lowered, by call index
    (:func:`linnet.lang.grad.lower_grad` passes one).

    >>> prog = Program.from_file("examples/llama/llama.linnet")          # doctest: +SKIP
    >>> g = lower(prog, "decode", {"token": [1], "pos": [1]}, config)     # doctest: +SKIP
    """
    if check:
        errors = check_modules(program)
        if errors:
            raise LinnetError(errors)
    decl = find_model(program, model)
    method = decl.method(entry)
    if method is None or method.kind != "entry":
        entries = [m.name for m in decl.methods if m.kind == "entry"]
        close = [e for e in entries if e.startswith(entry[:2])]
        raise LinnetError(
            Diagnostic(
                "E0601",
                f"model `{decl.name}` has no entry `{entry}`",
                decl.name_span,
                "model declared here",
                help=("entries: " + ", ".join(entries))
                + (f"; did you mean `{close[0]}`?" if close else ""),
            )
        )
    graph = Graph(entry=entry, model=decl.name)
    ev = Evaluator(program, Builder(graph), config)
    ev.grad_templates = grad_clauses
    try:
        env = bind_model_generics(ev, decl, method, inputs or {}, config or {}, weights)
        inst = instantiate(ev, decl, dict(env), "", config)
        ev.check_where(
            decl,
            Frame(decl.module, inst.env, inst),  # type: ignore[arg-type]
            decl.name_span,  # type: ignore[arg-type]
            label="model declared here",
            help="choose config values that satisfy the clause",
        )
        if weights is not None:
            check_weights(decl, inst, weights)
        graph.dims = {
            k: int(v.value) for k, v in env.items() if isinstance(v, Dim) and v.value is not None
        }
        graph.dtypes = {k: v for k, v in env.items() if isinstance(v, str)}
        graph.config = {
            k: (v.value.value if isinstance(v.value, Dim) else v.value)
            for k, v in inst.env.items()
            if isinstance(v, Const)
        }
        for t in walk_instance(inst):
            vt = ValueType(tuple(d.value for d in t.shape), t.dtype)  # type: ignore[misc]
            (graph.states if t.kind == "state" else graph.parameters)[t.ref[1:]] = vt
        frame = Frame(decl.module, inst.env, inst, method)  # type: ignore[arg-type]
        for p in method.params:
            shape, dtype = ev.tensor_type(p.type, frame)
            check_input_shape(ev, p, shape, (inputs or {}).get(p.name))
            t = ev.builder.emit("input", [], shape, dtype, {"name": p.name}, hint=p.name)
            graph.steps.pop()  # inputs are not steps; they are listed in graph.inputs
            graph.inputs.append(t.ref)
            frame.bind(p.name, t)
        call = ev.builder.open_call(method.qualified_name, "entry", "", method.span)
        ev.run_body(method.body, frame)
        ev.builder.close_call(call)
        returned = frame.returned or []
        results = [ev.tensor_type(r.type, frame) for r in method.results]
        if len(returned) != len(results):
            raise fail(
                "E0441",
                f"entry `{entry}` returns {len(returned)} values but declares {len(results)}",
                method.name_span,
            )
        for value, (shape, dtype), res in zip(returned, results, method.results):
            value = ev.check_return(value, shape, dtype, res, method)
            graph.outputs.append(value.ref)
    except Fail as f:
        raise LinnetError(dedupe([*ev.errors, f.diag])) from None
    except RecursionError:
        # The depth limits (E0118, E0119, E0209) keep lowering shallow; this is the last line.
        raise LinnetError(dedupe([*ev.errors, too_deep(method)])) from None
    if ev.errors:
        raise LinnetError(dedupe(ev.errors))
    graph.sources = {m.source.name: m.name for m in program.modules.values()}
    check_numel(graph, {f"%{p.name}": p.span for p in method.params} | param_spans(inst))
    # The stages after lowering, verified after each (linnet.lang.pipeline).
    return run_stages(graph)


def bind_model_generics(
    ev: Evaluator,
    decl: A.BlockDecl,
    entry: A.FuncDecl,
    inputs: dict[str, Any],
    config: dict[str, Any],
    weights: dict[str, tuple] | None,
) -> dict[str, Any]:
    assert decl.module is not None
    generics = {g.name: g for g in decl.generics + entry.generics}
    config_names = {m.name for m in decl.members if m.kind == "config"}
    for key in config:
        if key not in generics and key not in config_names:
            raise fail(
                "E0602",
                f"`{key}` is not a generic or config of model `{decl.name}`",
                decl.name_span,
                "model declared here",
                help=config_key_help(key, list(generics) + sorted(config_names)),
            )
    env: dict[str, Any] = {}
    for name, value in config.items():
        if name in generics:
            g = generics[name]
            if g.kind == "DType":
                if value not in DT.DTYPES:
                    raise fail(
                        "E0613",
                        f"`{name}` must be an element type, got {value!r}",
                        g.span,
                        "declared here",
                        help="one of " + ", ".join(DT.DTYPES),
                    )
                env[name] = value
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise fail(
                        "E0613",
                        f"`{name}` must be a positive integer, got {value!r}",
                        g.span,
                        "declared here",
                    )
                if value > MAX_SIZE:
                    raise fail(
                        "E0609",
                        f"`{name}` = {value} is larger than a tensor dimension "
                        f"can be (at most {MAX_SIZE})",
                        g.span,
                        "declared here",
                        help=f"check the config's `{name}`",
                    )
                env[name] = Dim.const(value)
    # Entry inputs.
    params = {p.name: p for p in entry.params}
    for name in inputs:
        if name not in params:
            raise fail(
                "E0604",
                f"entry `{entry.name}` has no input `{name}`",
                entry.name_span,
                "entry declared here",
                help="inputs: " + ", ".join(p.name for p in entry.params),
            )
    for p in entry.params:
        if p.name not in inputs:
            raise fail(
                "E0605",
                f"input `{p.name}` of entry `{entry.name}` was not given",
                p.span,
                "needs a shape",
                help=f"give its shape, e.g. `--input {p.name}="
                + ",".join(ev.src(d) for d in p.type.dims)
                + "` with numbers"
                if isinstance(p.type, A.TensorType)
                else f"give it, e.g. `--input {p.name}=`",
            )
        if not isinstance(p.type, A.TensorType):
            continue
        given = inputs[p.name]
        shape = given[0] if isinstance(given, tuple) else given
        check_sizes(shape, f"input `{p.name}`", p.span, p.name)
        if len(shape) != len(p.type.dims):
            raise fail(
                "E0606",
                f"input `{p.name}` has {len(shape)} "
                f"dimension{'s' if len(shape) != 1 else ''}, entry `{entry.name}` expects "
                f"{len(p.type.dims)}",
                p.span,
                f"declared {len(p.type.dims)}-dimensional",
                help="give one size per dimension: `--input "
                + p.name
                + "="
                + ",".join(ev.src(d) for d in p.type.dims)
                + "` with numbers",
            )
        pending = list(zip(p.type.dims, shape))
        unify_dims(ev, pending, env, generics, decl, f"input `{p.name}`", p.span)
    # Weights.
    if weights is not None:
        for _ in range(4):
            progress = False
            sym_env = {
                n: env.get(n, Dim.symbol(n) if g.kind == "Dim" else n) for n, g in generics.items()
            }
            count_arrays(decl, sym_env, env, generics, weights)
            saved = ev.lowering
            ev.lowering = False
            try:
                inst = instantiate(ev, decl, dict(sym_env), "", config)
            finally:
                ev.lowering = saved
            for t in walk_instance(inst):
                if t.kind != "param" or t.ref[1:] not in weights:
                    continue
                wshape, wdtype = weights[t.ref[1:]]
                check_sizes(wshape, f"weight `{t.ref[1:]}`", None, "")
                if isinstance(t.dtype, str) and t.dtype in generics and t.dtype not in env:
                    env[t.dtype] = wdtype
                    progress = True
                if len(wshape) != len(t.shape):
                    continue
                for d, n in zip(t.shape, wshape):
                    unknown = {s for s in d.symbols() if s in generics and s not in env}
                    if not unknown:
                        continue
                    solved = solve_for(d, Dim.const(n), unknown)
                    if solved and solved[1].value is not None:
                        env[solved[0]] = solved[1]
                        progress = True
            if not progress:
                break
    solve_where(ev, decl, env, generics)
    missing = [g for g in decl.generics + entry.generics if g.name not in env and g.default is None]
    if missing:
        names = ", ".join(f"`{g.name}`" for g in missing)
        # A `where` clause that should have bound it, with every other name known, has no
        # whole-number solution (`where H == KV * G` with H = 3, KV = 2): show it.
        unsolvable = []
        for clause in decl.where:
            used = {n.name for n in walk(clause) if isinstance(n, A.Name) and n.name in generics}
            unknown = used - set(env)
            if len(unknown) == 1 and unknown <= {g.name for g in missing}:
                known = ", ".join(f"{n} = {env[n]}" for n in sorted(used - unknown))
                unsolvable.append(
                    (clause.span, f"no whole `{next(iter(unknown))}` satisfies this with {known}")
                )
        raise fail(
            "E0603",
            f"model `{decl.name}`: cannot determine {names}",
            decl.name_span,
            "model declared here",
            help="give " + ("them" if len(missing) > 1 else "it") + " in the config (`--set "
            f"{missing[0].name}=...`)"
            + ("" if weights is not None else " or pass weights")
            + (", or change the sizes in the `where` clause" if unsolvable else ""),
            secondary=[(g.span, "unbound") for g in missing[:3]] + list(unsolvable),
        )
    for g in decl.generics + entry.generics:
        if g.name not in env and g.default is not None:
            env[g.name] = ev.generic_value(g, g.default, Frame(decl.module, env))
    return env


def check_input_shape(ev: Evaluator, p: A.Param, shape: Any, given: Any) -> None:
    """E0607 where an input's size contradicts its declared type evaluated with every
    generic and config known: binding from the inputs skips a size it cannot evaluate then
    (one that reads a config, `Tensor[B, (S + kv_page_size - 1) / kv_page_size; i32]`)."""
    if given is None or not isinstance(p.type, A.TensorType):
        return
    sizes = given[0] if isinstance(given, tuple) else given
    for axis, (dexpr, dim, n) in enumerate(zip(p.type.dims, shape, sizes)):
        want = getattr(dim, "value", dim)
        if isinstance(want, int) and want != n:
            raise fail(
                "E0607",
                f"input `{p.name}` has size {n} along axis {axis}, where its declared type "
                f"gives {want}",
                dexpr.span,
                f"expects {want}",
                help="pass an input of the declared shape",
            )


# Sizes and element counts are int64 in every runtime (torch, safetensors).
MAX_SIZE = 2**63 - 1


def check_sizes(shape: Any, what: str, span: Span | None, name: str) -> None:
    """A shape is a list of positive sizes that fit in int64 (E0608, E0609).

    ``name`` is the input's name, or "" for a weight.

    >>> check_sizes([2, 3], "input `x`", None, "x")
    """
    example = f"`--input {name}=1,8`" if name else "`[2048, 64]`"
    if not isinstance(shape, list | tuple):
        raise fail(
            "E0608",
            f"{what}: a shape is a list of sizes, got {shape!r}",
            span,
            "declared here",
            help=f"give one positive size per dimension, e.g. {example}",
        )
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, int):
            raise fail(
                "E0608",
                f"{what} has size {n!r}; sizes are whole numbers",
                span,
                "declared here",
                help=f"give one positive size per dimension, e.g. {example}",
            )
        if n <= 0:
            raise fail(
                "E0608",
                f"{what} has size {n}; sizes are at least 1",
                span,
                "declared here",
                help=f"give one positive size per dimension, e.g. {example}",
            )
        if n > MAX_SIZE:
            raise fail(
                "E0609",
                f"{what} has size {n}, larger than a tensor dimension can be (at most {MAX_SIZE})",
                span,
                "declared here",
                help="give a smaller size",
            )


def check_numel(graph: Graph, spans: dict[str, Span]) -> None:
    """Every value of a lowered graph has fewer than 2^63 elements (E0618).

    Sizes that fit one by one can still multiply past int64 (`[2^32, 2^32]`), which no
    runtime can allocate or even index.
    """
    inputs = {name: graph.values[name] for name in graph.inputs if name in graph.values}
    groups: list[tuple[str, dict[str, ValueType]]] = [
        ("input", inputs),
        ("parameter", graph.parameters),
        ("state", graph.states),
        ("value", graph.values),
    ]
    for kind, table in groups:
        for name, vt in table.items():
            numel = 1
            for d in vt.shape:
                numel *= d if isinstance(d, int) else 1
                if isinstance(d, int) and d < 0:
                    raise LinnetError(
                        Diagnostic(
                            "E0619",
                            f"{kind} `{name.lstrip('%@')}` has shape {list(vt.shape)}, "
                            "with a negative size",
                            spans.get(name),
                            "",
                            help=NEGATIVE_HELP,
                        )
                    )
            if numel > MAX_SIZE:
                raise LinnetError(
                    Diagnostic(
                        "E0618",
                        f"{kind} `{name.lstrip('%@')}` of shape {list(vt.shape)} has {numel} elements, "
                        f"more than a tensor can hold (at most {MAX_SIZE})",
                        spans.get(name),
                        f"{list(vt.shape)}" if spans.get(name) else "",
                        help="choose smaller sizes in the config or the inputs",
                    )
                )


def solve_where(ev: Evaluator, decl: A.BlockDecl, env: dict, generics: dict) -> None:
    """Use `where A == expr` clauses to bind the one generic they leave unknown."""
    assert decl.module is not None
    for _ in range(len(decl.where)):
        for clause in decl.where:
            if not (isinstance(clause, A.Binary) and clause.op == "=="):
                continue
            sym = {n: env.get(n, Dim.symbol(n)) for n, g in generics.items() if g.kind == "Dim"}
            try:
                left = ev.eval_dim(clause.left, Frame(decl.module, sym))
                right = ev.eval_dim(clause.right, Frame(decl.module, sym))
            except Fail:
                continue
            diff = left - right
            unknown = {s for s in diff.symbols() if s in generics and s not in env}
            if len(unknown) == 1:
                solved = solve_for(diff, Dim.const(0), unknown)
                if solved and solved[1].value is not None and solved[1].value > 0:
                    env[solved[0]] = solved[1]


def unify_dims(
    ev: Evaluator,
    pending: list,
    env: dict,
    generics: dict,
    decl: A.BlockDecl,
    what: str,
    span: Span,
) -> None:
    for _ in range(len(pending) + 1):
        rest = []
        for dexpr, n in pending:
            if isinstance(dexpr, A.Name) and dexpr.name in generics and dexpr.name not in env:
                env[dexpr.name] = Dim.const(n)
                continue
            sym = {nm: env.get(nm, Dim.symbol(nm)) for nm in generics if generics[nm].kind == "Dim"}
            try:
                d = ev.eval_dim(dexpr, Frame(decl.module, sym))  # type: ignore[arg-type]
            except Fail:
                rest.append((dexpr, n))
                continue
            unknown = {s for s in d.symbols() if s in generics and s not in env}
            if unknown:
                solved = solve_for(d, Dim.const(n), unknown)
                if solved and solved[1].value is not None:
                    env[solved[0]] = solved[1]
                else:
                    rest.append((dexpr, n))
                continue
            if d.value != n:
                settable = isinstance(dexpr, A.Name) and dexpr.name in generics
                raise fail(
                    "E0607",
                    f"{what} has size {n} where `{ev.src(dexpr)}` = {d}",
                    dexpr.span,
                    f"expects {d}",
                    help="pass an input of the declared shape"
                    + (f", or set `--set {dexpr.name}={n}`" if settable else ""),
                )
        if len(rest) == len(pending):
            break
        pending = rest


def count_arrays(
    decl: A.BlockDecl, sym_env: dict, env: dict, generics: dict, weights: dict[str, tuple]
) -> None:
    """Bind a repeated block's count (`[Layer<...>; L]`) from the layer indices in weights."""
    for m in decl.members:
        if (
            m.kind == "block"
            and isinstance(m.type, A.ArrayType)
            and isinstance(m.type.count, A.Name)
            and m.type.count.name in generics
            and m.type.count.name not in env
        ):
            pattern = re.compile(rf"^{re.escape(m.name)}\.(\d+)\.")
            found = {int(mt.group(1)) for k in weights if (mt := pattern.match(k))}
            if found:
                env[m.type.count.name] = Dim.const(
                    dense_count(found, m.name, pattern, weights, m.span)
                )
                sym_env[m.type.count.name] = env[m.type.count.name]
        elif m.kind == "block" and isinstance(m.type, A.BlockType):
            child = decl.module.find(m.type.name) if decl.module else None
            if isinstance(child, A.BlockDecl):
                # Nested counts (model.layers) are bound through the child's generic args.
                sub = {
                    k[len(m.name) + 1 :]: v
                    for k, v in weights.items()
                    if k.startswith(m.name + ".")
                }
                for cm in child.members:
                    if cm.kind == "block" and isinstance(cm.type, A.ArrayType):
                        pattern = re.compile(rf"^{re.escape(cm.name)}\.(\d+)\.")
                        found = {int(mt.group(1)) for k in sub if (mt := pattern.match(k))}
                        idx = [g.name for g in child.generics]
                        if (
                            found
                            and isinstance(cm.type.count, A.Name)
                            and cm.type.count.name in idx
                        ):
                            pos = idx.index(cm.type.count.name)
                            if pos < len(m.type.args):
                                arg = m.type.args[pos]
                                if (
                                    isinstance(arg, A.Name)
                                    and arg.name in generics
                                    and arg.name not in env
                                ):
                                    env[arg.name] = Dim.const(
                                        dense_count(
                                            found,
                                            f"{m.name}.{cm.name}",
                                            pattern,
                                            sub,
                                            cm.span,
                                            prefix=m.name + ".",
                                        )
                                    )
                                    sym_env[arg.name] = env[arg.name]
