"""Loading modules: a user's file, the modules it `use`s, and the std library in the wheel."""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

import linnet.lang.syntax.tree as A
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, SourceFile
from linnet.lang.syntax.parser import parse

STD_ROOT = Path(__file__).parent.parent / "std"


class Program:
    """Every module reachable from the root file, parsed once each.

    >>> prog = Program.from_text("pub fn two() -> f32 { return 2.0 }")
    >>> prog.root.name
    'main'
    """

    def __init__(self, root: A.Module, search: list[Path]):
        self.modules: dict[str, A.Module] = {root.name: root}
        self.root = root
        self.search = search
        self.errors: list[Diagnostic] = []
        self._load_uses(root)

    @classmethod
    def from_file(cls, path: str | Path) -> Program:
        source = SourceFile.read(path)
        name = Path(path).stem
        return cls(parse(source, name), [Path(path).resolve().parent])

    @classmethod
    def from_text(cls, text: str, name: str = "main", filename: str | None = None) -> Program:
        source = SourceFile(filename or f"{name}.linnet", text)
        return cls(parse(source, name), [Path.cwd()])

    def _locate(self, dotted: list[str]) -> Path | None:
        rel = Path(*dotted).with_suffix(".linnet")
        if dotted[0] == "std":
            if len(dotted) == 1:  # `use std`: the library, no module (Path() has no name)
                return None
            candidate = STD_ROOT / Path(*dotted[1:]).with_suffix(".linnet")
            try:
                return candidate if candidate.is_file() else None
            except OSError:  # a name too long for the file system: no such module
                return None
        for root in self.search:
            try:
                if (root / rel).is_file():
                    return root / rel
            except OSError:  # a name too long for the file system: no such module
                continue
        return None

    def _load_uses(self, module: A.Module) -> None:
        for item in module.items:
            if not isinstance(item, A.Use):
                continue
            dotted = ".".join(item.module)
            if dotted in self.modules:
                continue
            path = self._locate(item.module)
            if path is None:
                hint = (
                    "the std library has " + ", ".join(sorted(std_modules()))
                    if item.module[0] == "std"
                    else f"put `{Path(*item.module)}.linnet` beside the file that uses it"
                )
                close = difflib.get_close_matches(dotted, std_modules(), n=1, cutoff=0.8)
                if close:
                    hint = f"did you mean `{close[0]}`?"
                if item.module == ["std"]:
                    hint = (
                        "`std` is the library, not a module: name one of its modules, "
                        "e.g. `use std.nn.linear::{linear}`; " + hint
                    )
                self.errors.append(
                    Diagnostic(
                        "E0200",
                        f"module `{dotted}` not found",
                        item.span,
                        "no such module",
                        help=hint,
                    )
                )
                continue
            try:
                source = SourceFile.read(path)
                name = source.name
                if item.module[0] == "std":
                    # Std locations read `std/nn/linear.linnet:9` on every machine.
                    name = "std/" + "/".join(item.module[1:]) + ".linnet"
                sub = parse_once(name, source.text, dotted)
            except LinnetError as err:
                self.errors.extend(err.diagnostics)
                continue
            self.modules[dotted] = sub
            self._load_uses(sub)

    def module(self, dotted: str) -> A.Module | None:
        return self.modules.get(dotted)


@functools.lru_cache(maxsize=64)
def parse_once(name: str, text: str, dotted: str) -> A.Module:
    """Module ``dotted`` of file ``name`` holding ``text``, parsed once a process for each
    text: what a program `use`s. Every program of a std model, and each case `linnet
    kernels` and span claims lower, use the same std modules (a quarter of a second to parse
    std.nn.decode). A parsed tree is never changed after parsing, so programs share it; a
    file whose text changed is parsed again.

    >>> a = parse_once("m.linnet", "pub fn f() -> f32 { return 1.0 }", "m")
    >>> a is parse_once("m.linnet", "pub fn f() -> f32 { return 1.0 }", "m"), a.items[0].name
    (True, 'f')
    """
    return parse(SourceFile(name, text), dotted)


def model_file(model: str | Path) -> Path:
    """The file of a model given by path, or by std module name for the models the wheel
    ships (``std.models.llama`` is ``linnet/lang/std/models/llama.linnet``; its checkpoint
    mapping ``llama.hf.json`` lies beside it).

    >>> model_file("std.models.llama").name
    'llama.linnet'
    >>> model_file("examples/llama/llama.linnet").name
    'llama.linnet'
    """
    text = str(model)
    if text.startswith("std.") and not text.endswith(".linnet") and not Path(text).exists():
        parts = text.split(".")[1:]
        # `std.` names no module: Path("") has no name to give a suffix to.
        if (
            all(p.isidentifier() for p in parts)
            and (candidate := STD_ROOT / Path(*parts).with_suffix(".linnet")).is_file()
        ):
            return candidate
        models = sorted(m for m in std_modules() if m.startswith("std.models."))
        raise LinnetError(
            Diagnostic(
                "E0211",
                f"`{text}` is no model of the std library",
                help="the std library's models: "
                + ", ".join(models)
                + (
                    "; " + "did you mean `" + close[0] + "`?"
                    if (close := difflib.get_close_matches(text, models, n=1, cutoff=0.6))
                    else ""
                ),
            )
        )
    return Path(model)


def std_modules() -> list[str]:
    return [
        "std." + ".".join(p.relative_to(STD_ROOT).with_suffix("").parts)
        for p in STD_ROOT.rglob("*.linnet")
    ]
