"""Block instances: a block's members by path (parameters, states, sub-blocks and
repeated block arrays) under an environment of generics and config values."""

from __future__ import annotations

from typing import Any

import linnet.lang.check.config_lists as config_lists
import linnet.lang.check.instantiate as instantiation
import linnet.lang.syntax.tree as A
import linnet.lang.tensors.dtypes as DT
from linnet.lang.check.config_checks import check_passed_kind, no_value, plain
from linnet.lang.check.const_tensors import tensor_config_value
from linnet.lang.check.evaluate import MAX_DEPTH, Evaluator, Frame, fail
from linnet.lang.check.instantiate import clone_element
from linnet.lang.tensors.dims import Dim
from linnet.lang.tensors.values import BlockArray, BlockInst, Const, ConstList, Tensor


def instantiate(
    ev: Evaluator,
    decl: A.BlockDecl,
    env: dict[str, Any],
    path: str,
    config: dict[str, Any] | None = None,
    given: dict[str, Const] | None = None,
) -> BlockInst:
    """Build a block's members (parameters and states by path, sub-blocks) under ``env``.

    ``config`` holds the user's raw values (a model's config); ``given`` the values a block
    member passes (`Attention<...>(window = 8)`) over the configs the enclosing blocks see
    (a model's `config rms_norm_eps` reaches every block that declares `rms_norm_eps`)."""
    ev.block_stack.append(decl)
    try:
        return _instantiate(ev, decl, env, path, config, given or {})
    finally:
        ev.block_stack.pop()


def _instantiate(
    ev: Evaluator,
    decl: A.BlockDecl,
    env: dict[str, Any],
    path: str,
    config: dict[str, Any] | None,
    given: dict[str, Const],
) -> BlockInst:
    inst = BlockInst(decl, path, env)
    assert decl.module is not None
    frame = Frame(decl.module, env, inst)
    # What this block's sub-blocks see: the configs from above, with this block's own.
    visible = dict(given)
    for m in decl.members:
        if m.kind == "config":
            env[m.name] = config_value(ev, m, frame, config or {}, given)
            inst.members[m.name] = (
                env[m.name] if not isinstance(env[m.name], Dim) else Const(env[m.name], "int")
            )
            visible[m.name] = inst.members[m.name]
            continue
        if m.condition is not None:
            c = ev.value(m.condition, frame)
            if not (isinstance(c, Const) and c.dtype == "bool"):
                raise fail(
                    "E0610",
                    "a member's condition must be a compile-time bool",
                    m.condition.span,
                    "not a bool",
                )
            if ev.lowering and c.value is False:
                continue
        child_path = f"{path}.{m.name}" if path else m.name
        if m.kind in ("param", "state"):
            if not isinstance(m.type, A.TensorType | A.ScalarType):
                raise fail(
                    "E0611",
                    f"a {m.kind} must be a tensor",
                    m.type.span,
                    "not a tensor",
                    help=f"write `{m.kind} {m.name}: Tensor[...; f32]`; sub-blocks are "
                    "declared with `block`",
                )
            shape, dtype = ev.tensor_type(m.type, frame)
            inst.members[m.name] = Tensor("@" + child_path, shape, dtype, kind=m.kind)
        elif m.kind == "block":
            inst.members[m.name] = instantiate_member_block(ev, m, frame, child_path, visible)
    return inst


def config_value(
    ev: Evaluator,
    m: A.Member,
    frame: Frame,
    config: dict[str, Any],
    given: dict[str, Any] | None = None,
) -> Any:
    if given and m.name in given and m.name not in config:
        check_passed_kind(m, given[m.name])
    if isinstance(m.type, A.TensorType):
        return tensor_config_value(ev, m, frame, config, given)
    if isinstance(m.type, A.ListType):
        if m.name in config:
            raw, has = config[m.name], True
        elif given and m.name in given:
            raw, has = given[m.name], True
        else:
            raw, has = None, False
        return config_lists.list_config_value(ev, m, frame, raw, has, convert_config)
    if given and isinstance(given.get(m.name), ConstList) and m.name not in config:
        raise config_lists.list_used_as_value(m.name, m.span)
    if m.name in config:
        raw = config[m.name]
    elif given and m.name in given and isinstance(given[m.name], Const):
        c = given[m.name]
        t = type_name(m.type)
        if c.value is None or (isinstance(c.value, Dim) and c.value.value is None):
            # Checking before lowering: the value is not known yet, only its kind.
            if (t == "bool") != (c.dtype == "bool"):
                raw = c.value  # reported as a mismatch below
            else:
                return c if isinstance(c.value, Dim) else Const(None, t)
        else:
            raw = plain(c.value)
    elif m.default is not None:
        return ev.value(m.default, frame)
    else:
        return no_value(
            ev,
            m,
            Const(None, type_name(m.type)),
            f"pass it: `--set {m.name}=...`, or give a default: `config {m.name}: ... = ...`",
        )
    return convert_config(m, type_name(m.type), raw)


def convert_config(m: A.Member, t: str, raw: Any) -> Const:
    """``raw`` (a user's or a block's value) as config ``m`` of type ``t``; E0613 if it is
    not one."""
    try:
        if t == "bool":
            if not isinstance(raw, bool):
                raise ValueError
            return Const(raw, "bool")
        if t in DT.FLOATS:
            if isinstance(raw, bool):  # float(True) is 1.0: never what a config means
                raise ValueError
            return Const(float(raw), t)
        if t in DT.INTS or t == "Dim":
            if isinstance(raw, bool) or float(raw) != int(raw):
                raise ValueError
            return Const(Dim.const(int(raw)), "int")
    except (TypeError, ValueError, OverflowError):
        pass
    raise fail(
        "E0613",
        f"config `{m.name}` is {t}, but the value given is {raw!r}",
        m.span,
        "declared here",
        help="give `true` or `false`" if t == "bool" else f"give a {t} value",
    )


def type_name(t: A.TypeExpr) -> str:
    return t.name if isinstance(t, A.ScalarType) else "tensor"


def instantiate_member_block(
    ev: Evaluator, m: A.Member, frame: Frame, path: str, visible: dict[str, Const] | None = None
) -> Any:
    typ = m.type
    visible = visible or {}
    if isinstance(typ, A.ScalarType):
        typ = A.BlockType(typ.name, [], typ.span)
    if isinstance(typ, A.ArrayType):
        count = ev.eval_dim(typ.count, frame)
        if count.value is not None and count.value > MAX_REPEAT:
            raise fail(
                "E0625",
                f"`{m.name}` repeats its block {count.value} times, more than {MAX_REPEAT}",
                typ.count.span,
                f"= {count.value}",
                help=f"every block is lowered one by one; choose a count of at most "
                f"{MAX_REPEAT} in the config",
            )
        child, env = block_env(ev, typ.element, frame)
        given = config_args(ev, child, typ.element, frame, visible)
        n = 1 if count.value is None else count.value
        lists = config_lists.split_lists(child, typ.element, given, count, typ)
        if lists:
            # Per-element configs (a config list's items): elements with the same items are
            # copies of the first such element, as below; the others are built anew.
            first_of: dict[str, BlockInst] = {}
            items = []
            for i, own in enumerate(config_lists.element_configs(lists, n)):
                key = repr(sorted((k, repr(v)) for k, v in own.items()))
                p = f"{path}.{i}"
                if key in first_of and instantiation.ENABLED:
                    items.append(clone_element(first_of[key], first_of[key].path, p))
                else:
                    first_of[key] = instantiate(ev, child, dict(env), p, given={**given, **own})
                    items.append(first_of[key])
        elif instantiation.ENABLED:
            # The elements differ only in their paths: copy the first (check/instantiate.py).
            first = instantiate(ev, child, dict(env), f"{path}.0", given=given)
            items = [first] + [
                clone_element(first, f"{path}.0", f"{path}.{i}") for i in range(1, n)
            ]
        else:
            items = [
                instantiate(ev, child, dict(env), f"{path}.{i}", given=given) for i in range(n)
            ]
        for i, item in enumerate(items):
            item.iteration, item.repeated = i, path
        return BlockArray(typ.element, path, count, items)
    if isinstance(typ, A.BlockType):
        child, env = block_env(ev, typ, frame)
        given = config_args(ev, child, typ, frame, visible)
        config_lists.not_repeated(child, typ, given)
        return instantiate(ev, child, env, path, given=given)
    raise fail(
        "E0614",
        "a `block` member needs a block type",
        m.type.span,
        "not a block type",
        help="write `block attn: Attention<...>`, or `param` for tensors",
    )


def config_args(
    ev: Evaluator, decl: A.BlockDecl, typ: A.BlockType, frame: Frame, visible: dict[str, Any]
) -> dict[str, Any]:
    """The config values a block member passes its block: those the enclosing blocks see,
    then the member's own `(name = value)`, each evaluated where the member is declared."""
    names = [m.name for m in decl.members if m.kind == "config"]
    out = dict(visible)  # passed on through blocks that do not declare them
    for arg in getattr(typ, "config", []):
        if arg.name not in names:
            listed = ", ".join(f"`{n}`" for n in names) or "none"
            raise fail(
                "E0210",
                f"block `{decl.name}` has no config `{arg.name}`",
                arg.span,
                "not a config of the block",
                help=f"its configs: {listed}"
                + (
                    ""
                    if names
                    else f"; declare one in `{decl.name}`: `config {arg.name}: bool = false`"
                ),
                secondary=[(decl.name_span, f"`{decl.name}` declared here")],
            )
        v = config_lists.named_list(arg.value, frame) or ev.value(arg.value, frame)
        if not isinstance(v, Const | ConstList):
            raise fail(
                "E0349",
                f"config `{arg.name}` of `{decl.name}` must be known when lowering",
                arg.value.span,
                f"{ev.describe(v)}",
                help="pass a literal, a dim or a config of the enclosing block: "
                f"`{arg.name} = attention_bias`",
            )
        out[arg.name] = v
    return out


def block_env(ev: Evaluator, typ: A.BlockType, frame: Frame) -> tuple[A.BlockDecl, dict]:
    decl = ev.resolve_global(frame.module, typ.name, typ.span)
    if not isinstance(decl, A.BlockDecl) or decl.kind != "block":
        raise fail(
            "E0615",
            f"`{typ.name}` is not a block",
            typ.span,
            "expected a block type",
            help="declare it with `block " + typ.name + "<...> { ... }`",
        )
    if len(ev.block_stack) > MAX_DEPTH:
        ev.reported_blocks.update(id(b) for b in ev.block_stack)
        outer = ev.block_stack[0]
        raise fail(
            "E0209",
            f"blocks nest more than {MAX_DEPTH} deep, from `{outer.name}` to `{decl.name}`",
            typ.span,
            "the limit is reached here",
            help="nest fewer blocks inside one another",
            secondary=[(outer.name_span, f"`{outer.name}` declared here")],
        )
    for k, outer in enumerate(ev.block_stack):
        if outer is decl:
            # A block that contains itself would have infinitely many members.
            ev.reported_blocks.update(id(b) for b in ev.block_stack[k:])
            cycle = [b.name for b in ev.block_stack[k:]] + [decl.name]
            raise fail(
                "E0207",
                f"block `{decl.name}` contains itself: " + " -> ".join(f"`{n}`" for n in cycle),
                typ.span,
                "a member of its own type",
                help="a block cannot contain itself; "
                "repeat layers with an array member instead: `block layers: "
                "[Layer<...>; N]`",
                secondary=[(b.name_span, f"`{b.name}` declared here") for b in ev.block_stack[k:]][
                    :4
                ],
            )
    if len(typ.args) > len(decl.generics):
        raise fail(
            "E0616",
            f"block `{decl.name}` takes {len(decl.generics)} generic arguments, "
            f"got {len(typ.args)}",
            typ.span,
            "too many arguments",
            secondary=[(decl.name_span, "declared here")],
        )
    env: dict[str, Any] = {}
    for g, a in zip(decl.generics, typ.args):
        env[g.name] = ev.generic_value(g, a, frame)
    for g in decl.generics[len(typ.args) :]:
        if g.default is None:
            raise fail(
                "E0617",
                f"block `{decl.name}` needs generic `{g.name}`",
                typ.span,
                "missing generic argument",
                secondary=[(g.span, "declared here")],
            )
        assert decl.module is not None
        env[g.name] = ev.generic_value(g, g.default, Frame(decl.module, env))
    return decl, env


def walk_instance(inst: BlockInst) -> list[Tensor]:
    out: list[Tensor] = []
    for v in inst.members.values():
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, BlockInst):
            out.extend(walk_instance(v))
        elif isinstance(v, BlockArray):
            for item in v.items:
                out.extend(walk_instance(item))
    return out


# At most this many repeated blocks: each is lowered (unrolled) one by one, so a count of
# millions would run for hours. The largest published transformers have a few hundred layers.
MAX_REPEAT = 4096
