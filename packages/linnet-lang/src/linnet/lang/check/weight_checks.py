"""Checking a checkpoint's tensors against the model's parameters: names, shapes,
repeated-block counts."""

from __future__ import annotations

import re

import linnet.lang.syntax.tree as A
from linnet.lang.check.blocks import MAX_REPEAT, walk_instance
from linnet.lang.check.checker import fmt_type
from linnet.lang.check.evaluate import fail
from linnet.lang.check.hints import did_you_mean
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, Span
from linnet.lang.tensors.values import BlockArray, BlockInst, Tensor
from linnet.lang.weights.safetensors import shard_of


def dense_count(
    found: set[int],
    path: str,
    pattern: re.Pattern,
    weights: dict[str, tuple],
    span: Span,
    prefix: str = "",
) -> int:
    r"""How many blocks of the array ``path`` the weights hold: indices 0..N-1, all present.

    A stray tensor (`model.layers.99999999.x` beside layers 0 and 1) must not make lowering
    unroll a hundred million layers, so a gap in the indices is an error (E0624) naming the
    tensor past it, and so is a count over MAX_REPEAT (E0625).

    >>> dense_count({0, 1, 2}, "layers", re.compile(r"^layers\.(\d+)\."), {}, None)
    3
    """
    count = max(found) + 1
    if len(found) != count:
        # The first gap is at most len(found): never build range(count), which may be huge.
        missing = next(i for i in range(len(found) + 1) if i not in found)
        stray = sorted(
            (int(mt.group(1)), k)
            for k in weights
            if (mt := pattern.match(k)) and int(mt.group(1)) > missing
        )[0][1]
        raise fail(
            "E0624",
            f"the weights hold `{prefix}{stray}` but no `{path}.{missing}`: "
            f"the layers of `{path}` must be numbered 0, 1, 2, ... without gaps",
            span,
            "its count is read from the weights' names",
            help=f"remove the stray tensor `{prefix}{stray}`, or give the count in the config",
        )
    if count > MAX_REPEAT:
        raise fail(
            "E0625",
            f"the weights hold {count} blocks of `{path}`, more than {MAX_REPEAT}",
            span,
            "its count is read from the weights' names",
            help="check the checkpoint: no model has that many layers",
        )
    return count


def param_spans(inst: BlockInst) -> dict[str, Span]:
    """Where each parameter of an instance is declared, by path."""
    out: dict[str, Span] = {}
    for m in inst.decl.members:
        v = inst.members.get(m.name)
        if isinstance(v, Tensor):
            out[v.ref[1:]] = m.span
        elif isinstance(v, BlockInst):
            out.update(param_spans(v))
        elif isinstance(v, BlockArray):
            for item in v.items:
                out.update(param_spans(item))
    return out


def check_weights(decl: A.BlockDecl, inst: BlockInst, weights: dict[str, tuple]) -> None:
    """Every parameter has a weight of its shape and dtype, and every weight is a parameter."""
    params = {t.ref[1:]: t for t in walk_instance(inst) if t.kind == "param"}
    spans = param_spans(inst)
    members = {m.name: m.span for m in decl.members}
    diags: list[Diagnostic] = []

    def at_param(d: Diagnostic, path: str) -> Diagnostic:
        # A parameter declared in a sub-block: show the model's member it comes through too.
        top = path.split(".")[0]
        if "." in path and top in members:
            d.with_secondary(members[top], f"`{path}` comes from `{top}`")
        return d

    missing = [p for p in params if p not in weights]
    for p in missing[:20]:
        t = params[p]
        diags.append(
            at_param(
                Diagnostic(
                    "E0630",
                    f"weight `{p}` is missing",
                    spans.get(p),
                    f"`{p}` is declared here",
                    help=f"the model expects {fmt_type((t.shape, t.dtype))}; check that the weights "
                    "belong to this model and config",
                ),
                p,
            )
        )
    if len(missing) > 20:
        diags.append(Diagnostic("E0630", f"... and {len(missing) - 20} more missing weights"))
    unexpected = [w for w in weights if w not in params]
    for w in unexpected[:20]:
        hint = did_you_mean(w, params, "", cutoff=0.8)
        diags.append(
            Diagnostic(
                "E0631",
                f"weight `{w}`{shard_of(weights[w])} is not a parameter of `{decl.name}`",
                None,
                help=(hint + " " if hint else "")
                + "remove it, or declare it as a `param` in the model",
            )
        )
    for p, t in params.items():
        if p in weights:
            shape, dtype = weights[p]
            want = tuple(d.value for d in t.shape)
            if tuple(shape) != want:
                diags.append(
                    at_param(
                        Diagnostic(
                            "E0632",
                            f"weight `{p}`{shard_of(weights[p])} has shape {list(shape)}, "
                            f"the model expects "
                            f"{list(want)}",
                            spans.get(p),
                            f"{list(want)} with this config",
                            help="the weights were made for another config",
                        ),
                        p,
                    )
                )
            elif dtype != t.dtype:
                diags.append(
                    at_param(
                        Diagnostic(
                            "E0633",
                            f"weight `{p}`{shard_of(weights[p])} is {dtype}, the model "
                            f"expects {t.dtype}",
                            spans.get(p),
                            f"{t.dtype} with this config",
                            help=f"convert it on load (`load(..., dtype={t.dtype!r})`), or make the model's "
                            f"element type {dtype} (its config's `T`, say)",
                        ),
                        p,
                    )
                )
    if diags:
        raise LinnetError(diags)
