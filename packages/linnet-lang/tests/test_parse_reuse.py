"""Parsing done once (CI time): a model appended to a module parses only the model
(`parse_appended`, what `linnet kernels` and span claims do for every case), and a module a
program `use`s is parsed once a process for each text. Both give the trees a parse of the
whole text gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import linnet.lang.syntax.tree as A
import pytest
from linnet.lang import LinnetError, Program
from linnet.lang.check.kernel_cases import bound_ops, sample_cases, wrapper_program
from linnet.lang.diagnostics.core import SourceFile, Span
from linnet.lang.syntax.parser import parse, parse_appended
from linnet.lang.syntax.program import STD_ROOT, std_modules

MODEL = """
// a model calling the module's items
pub model Added<N: Dim> {
    entry run(x: Tensor[N; f32]) -> Tensor[N; f32] { return x }
}
"""


def shape(node: object) -> object:
    """A syntax tree as plain data: spans as (file, start, stop), back-pointers as the name
    they point at (not followed: they make the tree cyclic)."""
    if isinstance(node, Span):
        return (node.source.name, node.start, node.stop)
    if isinstance(node, list | tuple):
        return [shape(x) for x in node]
    if isinstance(node, A.Module):
        return ("module", node.name)
    if dataclasses.is_dataclass(node):
        return (
            type(node).__name__,
            {
                f.name: (
                    getattr(getattr(node, f.name), "name", None)
                    if f.name in ("module", "owner")
                    else shape(getattr(node, f.name))
                )
                for f in dataclasses.fields(node)
                if not f.name.startswith("_")
            },
        )
    return node


def std_module(dotted: str) -> A.Module:
    path = STD_ROOT.joinpath(*dotted.split(".")[1:]).with_suffix(".linnet")
    return parse(SourceFile(f"std/{path.name}", path.read_text()), dotted)


@pytest.mark.parametrize("dotted", sorted(std_modules()))
def test_an_appended_model_parses_as_the_whole_text(dotted):
    module = std_module(dotted)
    before = shape(module)
    got = parse_appended(module, MODEL)
    whole = parse(SourceFile(module.source.name, module.source.text + "\n" + MODEL), dotted)
    assert shape(got) == shape(whole)
    assert got.source.text == whole.source.text and got.name == dotted
    # Every function and method is bound to the new module, as a parse binds them.
    for item in got.items:
        if isinstance(item, A.FuncDecl | A.BlockDecl):
            assert item.module is got
        if isinstance(item, A.BlockDecl):
            assert all(m.module is got and m.owner is item for m in item.methods)
    assert got.find("Added") is got.items[-1] and got.items[-1].span.source is got.source
    # The module it was given is as it was: its items still its own.
    assert shape(module) == before
    assert all(i.module is module for i in module.items if isinstance(i, A.FuncDecl))


def test_an_appended_text_after_a_trailing_comment_starts_its_own_line():
    module = parse(SourceFile("m.linnet", "pub fn f(x: f32) -> f32 { return x } // no newline"))
    got = parse_appended(module, "pub fn g(x: f32) -> f32 { return f(x) }")
    assert [i.name for i in got.items] == ["f", "g"] and got.items[1].span.line == 2


def test_a_syntax_error_in_the_appended_text_is_reported_there():
    module = parse(SourceFile("m.linnet", "pub fn f(x: f32) -> f32 { return x }\n"))
    with pytest.raises(LinnetError) as info:
        parse_appended(module, "pub fn g(x: f32) -> f32 { return $ }")
    [d] = [d for d in info.value.diagnostics if d.code == "E0002"]
    assert d.span.location() == "m.linnet:3:34"


def test_a_wrapper_program_reuses_the_ops_module():
    """`linnet kernels` appends a model calling the op to the op's module: the module's own
    functions are reused (their bodies the same objects), not parsed again."""
    program = Program.from_text("use std.nn.decode::{linear_gemv}")
    op = next(o for o in bound_ops(program) if o.name == "linear_gemv")
    [case] = sample_cases(program, op, 1, seed=0)
    wrapper = wrapper_program(program, op, case)
    root = wrapper.root
    assert root.name == "std.nn.decode" and root is not op.module
    copy = root.find("linear_gemv")
    assert copy is not op and copy.body is op.body and copy.module is root
    assert shape(root) == shape(parse(root.source, "std.nn.decode"))


def test_a_used_module_is_parsed_once_for_each_text(tmp_path):
    a = Program.from_text("use std.nn.norm::{rms_norm}")
    b = Program.from_text("use std.nn.norm::{rms_norm}")
    assert a.module("std.nn.norm") is b.module("std.nn.norm")
    # A file whose text changed is parsed again.
    (tmp_path / "helpers.linnet").write_text("pub fn one() -> f32 { return 1.0 }\n")
    main = tmp_path / "main.linnet"
    main.write_text("use helpers::{one}\n")
    first = Program.from_file(main).module("helpers")
    assert Program.from_file(main).module("helpers") is first
    (tmp_path / "helpers.linnet").write_text("pub fn one() -> f32 { return 2.0 }\n")
    again = Program.from_file(main).module("helpers")
    assert again is not first and "2.0" in again.source.text
    assert Path(again.source.name).name == "helpers.linnet"
