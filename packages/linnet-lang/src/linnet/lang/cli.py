"""The `linnet` command line. Other distributions add subcommands through the
`linnet.commands` entry-point group (a function that takes an argparse subparsers object).

    linnet check FILE [--format json]
    linnet graph FILE --entry decode [--config toy.json] [--set B=1] [--input token=1]
    linnet explain E0301
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .compiler import check_program, lower
from .diagnostics import Diagnostic, LinnetError, render_all, to_json
from .program import Program


def parse_value(text: str) -> Any:
    """`4` → 4, `1e-5` → 1e-05, `true` → True, `bf16` → 'bf16'."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def load_config(path: str | None, sets: list[str], model_file: str | None = None) -> dict:
    """Read a JSON config (a path, or a name under the model's `configs/` folder) plus
    `--set NAME=VALUE` overrides. Keys starting with `_` are comments."""
    config: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file() and model_file is not None:
            candidate = Path(model_file).parent / "configs" / f"{path}.json"
            if candidate.is_file():
                p = candidate
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LinnetError(Diagnostic("E0640", f"config `{path}` not found",
                                         help="pass a JSON file, or the name of one in the "
                                              "model's configs/ folder")) from None
        except (OSError, json.JSONDecodeError) as exc:
            raise LinnetError(Diagnostic("E0641", f"config `{path}` is not valid JSON: {exc}",
                                         help="a config is one JSON object of names to values"))\
                from None
        if not isinstance(data, dict):
            raise LinnetError(Diagnostic("E0641", f"config `{path}` is not a JSON object",
                                         help='write `{"D": 64, "T": "f32"}`'))
        config.update({k: v for k, v in data.items() if not k.startswith("_")})
    for item in sets:
        if "=" not in item:
            raise LinnetError(Diagnostic("E0642", f"`--set {item}` needs NAME=VALUE",
                                         help="e.g. `--set B=1`"))
        k, v = item.split("=", 1)
        config[k.strip()] = parse_value(v.strip())
    return config


def parse_inputs(items: list[str]) -> dict[str, list[int]]:
    """`--input tokens=1,16` → {'tokens': [1, 16]}; `--input x=` is a scalar."""
    out: dict[str, list[int]] = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            out[name.strip()] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise LinnetError(Diagnostic("E0643", f"`--input {item}`: shapes are integers",
                                         help="write `--input tokens=1,16`")) from None
    return out


def report(err: LinnetError, fmt: str) -> int:
    if fmt == "json":
        print(to_json(err.diagnostics))
    else:
        print(render_all(err.diagnostics), file=sys.stderr)
    return 1


def cmd_check(args: argparse.Namespace) -> int:
    try:
        program = Program.from_file(args.file)
        errors = check_program(program)
        if errors:
            raise LinnetError(errors)
    except LinnetError as err:
        return report(err, args.format)
    if args.format == "json":
        print("[]")
    else:
        n = len(program.modules)
        print(f"{args.file}: ok ({n} module{'s' if n != 1 else ''} checked)")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, args.set, args.file)
        program = Program.from_file(args.file)
        weights = None
        if args.weights:
            weights = read_safetensors_header(args.weights)
        graph = lower(program, args.entry, parse_inputs(args.input), config, weights,
                      model=args.model)
    except LinnetError as err:
        return report(err, args.format if args.format == "json" else "text")
    text = graph.dumps() if args.format == "json" else graph.summary()
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


def read_safetensors_header(path: str) -> dict[str, tuple]:
    """Shapes and dtypes of a safetensors file, read from its header (no tensor data)."""
    from .weights import safetensors_shapes

    return safetensors_shapes(path)


def cmd_torch(args: argparse.Namespace) -> int:
    """Write generated PyTorch for every entry whose inputs were given."""
    from .compiler import find_model
    from .emit_torch import emit_torch

    try:
        config = load_config(args.config, args.set, args.file)
        program = Program.from_file(args.file)
        errors = check_program(program)
        if errors:
            raise LinnetError(errors)
        weights = read_safetensors_header(args.weights) if args.weights else None
        inputs = parse_inputs(args.input)
        decl = find_model(program, args.model)
        entries = [m for m in decl.methods if m.kind == "entry"]
        if args.entry:
            entries = [m for m in entries if m.name == args.entry] or entries[:0]
            if not entries:
                lower(program, args.entry, inputs, config, weights, args.model, check=False)
        graphs = []
        for m in entries:
            if all(p.name in inputs for p in m.params):
                mine = {p.name: inputs[p.name] for p in m.params}
                graphs.append(lower(program, m.name, mine, config, weights, args.model,
                                    check=False))
            else:
                missing = [p.name for p in m.params if p.name not in inputs]
                print(f"linnet: skipping entry `{m.name}`: no shape for "
                      + ", ".join(f"`--input {n}=...`" for n in missing), file=sys.stderr)
        if not graphs:
            raise LinnetError(Diagnostic("E0644", "no entry had all its input shapes",
                                         help="give them with --input NAME=D0,D1"))
    except LinnetError as err:
        return report(err, "text")
    sources = {m.source.name: m.source.text for m in program.modules.values()}
    text = emit_torch(graphs, sources, numerics=args.numerics, fast=not args.no_fast,
                      origin=args.file)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({len(text.splitlines())} lines, entries: "
              + ", ".join(g.entry for g in graphs) + ")", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .codes import EXPLANATIONS

    code = args.code.upper()
    if not code.startswith("E"):
        code = "E" + code.zfill(4)
    text = EXPLANATIONS.get(code)
    if text is None:
        print(f"no explanation for `{args.code}`; codes look like E0301", file=sys.stderr)
        return 1
    print(f"{code}: {text.strip()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="linnet", description="The Linnet toolchain.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check", help="parse and check a .linnet file")
    p.add_argument("file")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=cmd_check)

    p = sub.add_parser("graph", help="lower an entry and print its graph")
    add_lowering_arguments(p)
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("-o", "--output", help="write to a file instead of stdout")
    p.set_defaults(run=cmd_graph)

    p = sub.add_parser("torch", help="write generated PyTorch source for a model's entries")
    add_lowering_arguments(p, entry_required=False)
    p.add_argument("-o", "--output", help="the .py file to write (default: stdout)")
    p.add_argument("--numerics", choices=["exact", "fast"], default="exact")
    p.add_argument("--no-fast", action="store_true",
                   help="lower std ops from their bodies instead of fused torch calls")
    p.set_defaults(run=cmd_torch)

    p = sub.add_parser("explain", help="explain an error code")
    p.add_argument("code")
    p.set_defaults(run=cmd_explain)

    for ep in entry_points(group="linnet.commands"):
        try:
            register: Callable = ep.load()
            register(sub)
        except Exception as exc:  # a broken extension never takes the CLI down
            if os.environ.get("LINNET_DEBUG"):
                print(f"linnet: skipped command plugin {ep.name}: {exc}", file=sys.stderr)
    return parser


def add_lowering_arguments(p: argparse.ArgumentParser, entry_required: bool = True) -> None:
    """The arguments every command that lowers an entry shares."""
    p.add_argument("file")
    p.add_argument("--entry", required=entry_required, help="entry to lower (e.g. decode)")
    p.add_argument("--model", help="model name, when the file declares several")
    p.add_argument("--config", help="JSON config, or the name of one in the model's configs/")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a config value or model generic (repeatable)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=D0,D1",
                   help="an entry input's shape (repeatable)")
    p.add_argument("--weights", help="a safetensors file: bind dims from its shapes and check it")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except LinnetError as err:
        return report(err, getattr(args, "format", "text"))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `linnet graph ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
