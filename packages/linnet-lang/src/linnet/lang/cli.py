"""The `linnet` command line. Other distributions add subcommands through the
`linnet.commands` entry-point group (a function that takes an argparse subparsers object).

    linnet check FILE [--format json]
    linnet graph FILE --entry decode [--config toy.json] [--set B=1] [--input token=1]
    linnet explain E0301
    linnet onnx FILE --entry decode ... -o decode.onnx
    linnet stablehlo FILE --entry decode ... -o decode.mlir
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from linnet.lang.check.driver import check_program, lower
from linnet.lang.compiler import Compiled, Grad, compile_entry
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, render_all, to_json

# load_config lives with the host (linnet run and the runtimes' load read configs too);
# `from linnet.lang.cli import load_config` is how docs/jax.md and docs/grad.md name it.
from linnet.lang.host.config import config_path, load_config
from linnet.lang.ir.graph import Graph
from linnet.lang.pipeline import NUMERICS, CompileOptions, Numerics, stage_text, watch
from linnet.lang.syntax.program import Program

INT64_MAX = 2**63 - 1
_DIM = re.compile(r"[0-9]+", re.ASCII)


def parse_inputs(items: list[str]) -> dict[str, list[int]]:
    """`--input tokens=1,16` → {'tokens': [1, 16]}; `--input x=` is a scalar.

    Names are identifiers, each given once; sizes are decimal integers from 0 to 2**63 - 1,
    whose product fits too (E0643, E0648, E0649 otherwise).

    >>> parse_inputs(["tokens=1,16", "x=2x3", "s="])
    {'tokens': [1, 16], 'x': [2, 3], 's': []}
    """
    out: dict[str, list[int]] = {}
    for item in items:
        name, eq, dims = item.partition("=")
        name = name.strip()
        if not eq:
            raise LinnetError(
                Diagnostic(
                    "E0649",
                    f"`--input {item}` needs NAME=D0,D1",
                    help=f"write `--input {name or 'x'}=1,16`, or "
                    f"`--input {name or 'x'}=` for a scalar",
                )
            )
        if not name.isidentifier():
            what = "has no name" if not name else f"`{name}` is not an input name"
            raise LinnetError(
                Diagnostic(
                    "E0649",
                    f"`--input {item}` {what}",
                    help="name one of the entry's inputs: `--input tokens=1,16`",
                )
            )
        if name in out:
            raise LinnetError(
                Diagnostic(
                    "E0649",
                    f"`--input {name}=...` is given twice",
                    help="give each input's shape once",
                )
            )
        shape: list[int] = []
        if dims.strip():
            for piece in dims.replace("x", ",").split(","):
                d = piece.strip()
                if d.startswith("-") and _DIM.fullmatch(d[1:]):
                    raise LinnetError(
                        Diagnostic(
                            "E0648",
                            f"`--input {item}`: size {d} is negative",
                            help="sizes are 0 or more: `--input tokens=1,16`",
                        )
                    )
                if not _DIM.fullmatch(d):
                    raise LinnetError(
                        Diagnostic(
                            "E0643",
                            f"`--input {item}`: shapes are integers, not `{d}`",
                            help="write `--input tokens=1,16`",
                        )
                    )
                if len(d) > 19 or int(d) > INT64_MAX:
                    shown = d if len(d) <= 24 else f"{d[:10]}...({len(d)} digits)"
                    raise LinnetError(
                        Diagnostic(
                            "E0648",
                            f"`--input {name}=...`: size {shown} is too large",
                            help="a size is at most 2**63 - 1",
                        )
                    )
                shape.append(int(d))
        numel = 1
        for size in shape:
            numel *= size
        if numel > INT64_MAX:
            raise LinnetError(
                Diagnostic(
                    "E0648",
                    f"`--input {item}` has more elements than any tensor can hold",
                    help="the sizes' product is at most 2**63 - 1",
                )
            )
        out[name] = shape
    return out


def inputs_of(args: argparse.Namespace, program: Program) -> list[Path]:
    """The files a lowering command reads: its model, every module that model loaded (the
    standard library's included), its config and its weights. `-o` must not name one."""
    paths = [Path(args.file)]
    for dotted in program.modules:
        if dotted != program.root.name:
            found = program._locate(dotted.split("."))
            if found is not None:
                paths.append(found)
    if getattr(args, "config", None):
        paths.append(config_path(args.config, args.file))
    if getattr(args, "weights", None):
        paths.append(Path(args.weights))
    return paths


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # symbolic and hard links too
    except OSError:  # one of them does not exist (yet)
        pass
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # a loop of symbolic links: it names no file of ours
        return False


def check_output(output: str | None, inputs: list[Path]) -> None:
    """E0662 when `-o OUTPUT` is one of the command's own inputs (it would be overwritten)."""
    if not output:
        return
    for source in inputs:
        if _same_file(Path(output), source):
            raise LinnetError(
                Diagnostic(
                    "E0662",
                    f"`-o {output}` would overwrite `{source}`, which this command reads",
                    help="write the output to another file, such as `-o out.py`",
                )
            )


def write_output(output: str, text: str | bytes) -> None:
    """Write `-o OUTPUT` atomically: on any failure (E0661) the old file stays as it was.
    A new file gets the usual permissions (0666 less the umask), an old one keeps its own."""
    from linnet.lang.home import atomic_write

    mask = os.umask(0o022)
    os.umask(mask)
    atomic_write(Path(output), text, parents=False, new_mode=0o666 & ~mask)


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
        check_output(args.output, inputs_of(args, program))
        weights = None
        if args.weights:
            weights = read_safetensors_header(args.weights)
        with watch() as seen:
            graph = lower_for_command(
                args, program, args.entry, parse_inputs(args.input), config, weights
            )
        text = graph.dumps() if args.format == "json" else graph.summary()
        if args.stages:  # every stage's graph, in order (linnet.lang.pipeline)
            text = (
                json.dumps(
                    [{"stage": name, "graph": json.loads(g.dumps())} for name, g in seen], indent=1
                )
                if args.format == "json"
                else "\n\n".join(stage_text(name, g) for name, g in seen)
            )
        if args.output:
            write_output(args.output, text + "\n")
    except LinnetError as err:
        return report(err, args.format if args.format == "json" else "text")
    if not args.output:
        print(text)
    return 0


def lower_for_command(
    args: argparse.Namespace,
    program: Program,
    entry: str,
    inputs: dict,
    config: dict,
    weights: dict | None,
    check: bool = True,
) -> Graph:
    """Lower ``entry`` as a command's flags say: with ``--grad`` (``--wrt``, ``--grad-seed``:
    :func:`add_lowering_arguments` adds them), its gradient graph (:mod:`linnet.lang.grad`),
    with no kernel instance recorded (:func:`compile_for_command`, which every emitting
    command calls, so each gets ``--grad`` with no code of its own).

    >>> args = build_parser().parse_args(["graph", "m.linnet", "--entry", "e", "--grad"])
    >>> (args.grad, args.wrt, args.grad_seed)
    (True, [], 'scalar')
    """
    return compile_for_command(args, program, entry, inputs, config, weights, check, False).graph


def compile_for_command(
    args: argparse.Namespace,
    program: Program,
    entry: str,
    inputs: dict,
    config: dict,
    weights: dict | None,
    check: bool = True,
    kernels: bool = True,
    check_bounds: bool = False,
) -> Compiled:
    """:func:`linnet.lang.compiler.compile_entry` as a command's flags say: ``--grad``
    (``--wrt``, ``--grad-seed``) and ``--numerics`` where the command has them;
    ``check_bounds``: E0782 where an input cannot fit the states, as the runtimes check.

    >>> args = build_parser().parse_args(["torch", "m.linnet", "--numerics", "fast"])
    >>> options_of(args).numerics
    <Numerics.FAST: 'fast'>
    """
    grad = Grad(args.wrt or "params", args.grad_seed) if getattr(args, "grad", False) else None
    return compile_entry(
        program,
        entry,
        inputs,
        config,
        weights,
        options_of(args),
        model=args.model,
        check=check,
        grad=grad,
        check_bounds=check_bounds,
        kernels=kernels,
    )


def options_of(args: argparse.Namespace) -> CompileOptions:
    """The command's :class:`~linnet.lang.pipeline.CompileOptions` (``--numerics``, checked
    by :func:`main` already).

    >>> options_of(build_parser().parse_args(["graph", "m.linnet", "--entry", "e"])).numerics
    <Numerics.EXACT: 'exact'>
    """
    return CompileOptions.parse(getattr(args, "numerics", None) or Numerics.EXACT)


def read_safetensors_header(path: str) -> dict[str, tuple]:
    """Shapes and dtypes of a safetensors file, read from its header (no tensor data); a
    mixture of experts' per-expert tensors as the stacked parameters they load as."""
    from linnet.lang.weights.safetensors import safetensors_shapes
    from linnet.lang.weights.stacked import stack_shapes

    return stack_shapes(safetensors_shapes(path))


def cmd_torch(args: argparse.Namespace, emit: Callable | None = None) -> int:
    """Write generated PyTorch (or, with ``emit``, another emitter's Python) for every entry
    whose inputs were given."""
    from linnet.lang.check.driver import find_model
    from linnet.lang.emit.torch import emit_torch

    emit_torch = emit or emit_torch

    try:
        config = load_config(args.config, args.set, args.file)
        program = Program.from_file(args.file)
        check_output(args.output, inputs_of(args, program))
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
                graphs.append(
                    compile_for_command(args, program, m.name, mine, config, weights, False)
                )
            else:
                missing = [p.name for p in m.params if p.name not in inputs]
                print(
                    f"linnet: skipping entry `{m.name}`: no shape for "
                    + ", ".join(f"`--input {n}=...`" for n in missing),
                    file=sys.stderr,
                )
        if not graphs:
            raise LinnetError(
                Diagnostic(
                    "E0644",
                    "no entry had all its input shapes",
                    help="give them with --input NAME=D0,D1",
                )
            )
        sources = {m.source.name: m.source.text for m in program.modules.values()}
        text = emit_torch(
            [c.emitted for c in graphs],
            sources,
            numerics=args.numerics,
            fast=not args.no_fast,
            origin=args.file,
        )
        if args.output:
            write_output(args.output, text)
    except LinnetError as err:
        return report(err, "text")
    if args.output:
        print(
            f"wrote {args.output} ({len(text.splitlines())} lines, entries: "
            + ", ".join(c.graph.entry for c in graphs)
            + ")",
            file=sys.stderr,
        )
    else:
        print(text)
    return 0


def cmd_jax(args: argparse.Namespace) -> int:
    """Write generated JAX for every entry whose inputs were given (`linnet jax`)."""
    from linnet.lang.emit.jax import emit_jax

    return cmd_torch(args, emit_jax)


def cmd_explain(args: argparse.Namespace) -> int:
    from linnet.lang.diagnostics.codes import EXPLANATIONS

    code = args.code.upper()
    if not code.startswith("E"):
        code = "E" + code.zfill(4)
    text = EXPLANATIONS.get(code)
    if text is None:
        print(f"no explanation for `{args.code}`; codes look like E0301", file=sys.stderr)
        return 1
    print(f"{code}: {text.strip()}")
    return 0


# ---------------------------------------------------------------- export (issue 17)
def _export_graph(args: argparse.Namespace, dynamic: bool = False) -> tuple[Any, dict[str, str]]:
    """The graph an export command writes; ``dynamic``: with the dims `--dynamic` names
    symbolic (`linnet onnx`; :func:`linnet.lang.export.symbolic_dims`)."""
    config = load_config(args.config, args.set, args.file)
    program = Program.from_file(args.file)
    check_output(args.output, inputs_of(args, program))
    errors = check_program(program)
    if errors:
        raise LinnetError(errors)
    weights = read_safetensors_header(args.weights) if args.weights else None
    # `--grad` exports the gradient graph (it was parsed, so never ignored); check_bounds:
    # E0782 (a prompt past the cache), as the runtimes say.
    inputs = parse_inputs(args.input)
    graph = compile_for_command(
        args, program, args.entry, inputs, config, weights, False, False, check_bounds=True
    ).graph
    if dynamic:
        from linnet.lang.export import relowering, symbolic_dims

        relower = relowering(
            program,
            args.entry,
            inputs,
            config,
            lambda i, c: lower_for_command(args, program, args.entry, i, c, weights, check=False),
            args.model,
        )
        graph = symbolic_dims(graph, relower, args.dynamic)
    sources = {m.source.name: m.source.text for m in program.modules.values()}
    return graph, sources


def cmd_onnx(args: argparse.Namespace) -> int:
    """`linnet onnx FILE --entry E ... -o model.onnx`."""
    from linnet.lang.export import export_onnx, read_safetensors

    try:
        graph, sources = _export_graph(args, dynamic=True)
        params = read_safetensors(args.weights) if args.weights else None
        written = export_onnx(
            graph,
            params,
            args.output,
            sources,
            check=not args.no_check,
            external_threshold=args.external_threshold,
        )
    except LinnetError as err:
        return report(err, "text")
    how = "initializers" if args.weights else "graph inputs (no --weights)"
    symbolic = ", ".join(getattr(graph, "symbolic", {})) or "none"
    print(
        f"wrote {', '.join(str(p) for p in written)} ({graph.model}.{graph.entry}: "
        f"{len(graph.inputs)} inputs, {len(graph.states)} states, {len(graph.parameters)} "
        f"parameters as {how}; symbolic dims: {symbolic})",
        file=sys.stderr,
    )
    return 0


def cmd_stablehlo(args: argparse.Namespace) -> int:
    """`linnet stablehlo FILE --entry E ... [-o model.mlir]`."""
    from linnet.lang.export import export_stablehlo

    portable = args.portable
    try:
        if portable is not None and not args.output:
            raise LinnetError(
                Diagnostic(
                    "E0947",
                    "a portable StableHLO artifact is binary (MLIR bytecode): it is "
                    "written to a file, never to the terminal",
                    help="name the file with `-o model.mlirbc`, or leave out --portable for the "
                    "text",
                )
            )
        graph, sources = _export_graph(args)
        if portable is not None:
            from linnet.lang.emit.stablehlo_portable import target, version_text
            from linnet.lang.export import portable_stablehlo

            version = version_text(target(portable or None))
            _, artifact = portable_stablehlo(graph, version, sources, verify=args.verify)
            write_output(args.output, artifact)
            print(
                f"wrote {args.output} (portable StableHLO artifact, version {version}, "
                f"{len(artifact)} bytes, {graph.model}.{graph.entry})",
                file=sys.stderr,
            )
            return 0
        text = export_stablehlo(graph, None, sources, verify=args.verify)
        if args.output:
            write_output(args.output, text)
    except LinnetError as err:
        return report(err, "text")
    if args.output:
        print(
            f"wrote {args.output} ({len(text.splitlines())} lines, {graph.model}.{graph.entry})",
            file=sys.stderr,
        )
    else:
        print(text, end="")
    return 0


def register_export(sub: Any) -> None:
    """Add `onnx` and `stablehlo` (docs/export.md) to the `linnet` command's subparsers."""
    p = sub.add_parser("onnx", help="export an entry as an ONNX model")
    add_lowering_arguments(p)
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument("--no-check", action="store_true", help="skip onnx.checker's full check")
    p.add_argument(
        "--external-threshold",
        type=int,
        default=None,
        metavar="BYTES",
        help="weights over this many bytes in all go to OUTPUT.data (default 1 GiB)",
    )
    p.add_argument(
        "--dynamic",
        default=None,
        metavar="DIM[,DIM]",
        help="dims to make symbolic in the model (e.g. B,L; `none` for all "
        "concrete); default: B and L, each where the graph allows",
    )
    p.set_defaults(run=cmd_onnx)

    p = sub.add_parser("stablehlo", help="export an entry as StableHLO MLIR text")
    add_lowering_arguments(p)
    p.add_argument("-o", "--output", help="the .mlir file to write (default: stdout)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="parse and verify the text with jaxlib's MLIR bindings (needs jax)",
    )
    p.add_argument(
        "--portable",
        nargs="?",
        const="",
        default=None,
        metavar="VERSION",
        help="write a portable artifact (MLIR bytecode, needs jax and -o) for "
        "StableHLO VERSION (default: the oldest jaxlib writes)",
    )
    p.set_defaults(run=cmd_stablehlo)


BUILTIN = ("check", "graph", "torch", "explain", "jax", "onnx", "stablehlo", "chat")
"""The subcommands linnet-lang defines itself; the rest come from `linnet.commands`."""


def _command_of(argv: list[str] | None) -> str | None:
    """The subcommand named on the command line, or None (no command, `--help`)."""
    args = sys.argv[1:] if argv is None else argv
    for arg in args:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `linnet` argument parser, with the `linnet.commands` subcommands ``argv`` needs.

    Loading an extension's registration function imports its module (linnet-runtime-torch's
    imports torch's whole package tree on some installs), so only the extension named like the
    command being run is loaded: `linnet check` loads none, `linnet run` loads `run`, and a
    command line naming no known command (`linnet --help`, a typo) loads them all, to list
    them. The entry point's name is the subcommand's name.

    >>> parser = build_parser(["check", "model.linnet"])
    >>> parser.parse_args(["check", "model.linnet"]).file
    'model.linnet'
    """
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
    p.add_argument(
        "--stages",
        action="store_true",
        help="print the graph after every stage of lowering, in order",
    )
    p.set_defaults(run=cmd_graph)

    p = sub.add_parser("torch", help="write generated PyTorch source for a model's entries")
    add_lowering_arguments(p, entry_required=False)
    p.add_argument("-o", "--output", help="the .py file to write (default: stdout)")
    add_numerics_argument(p)
    p.add_argument(
        "--no-fast",
        action="store_true",
        help="lower std ops from their bodies instead of fused torch calls",
    )
    p.set_defaults(run=cmd_torch)

    p = sub.add_parser("jax", help="write generated JAX source for a model's entries")
    add_lowering_arguments(p, entry_required=False)
    p.add_argument("-o", "--output", help="the .py file to write (default: stdout)")
    add_numerics_argument(p)
    p.add_argument(
        "--no-fast",
        action="store_true",
        help="lower std ops from their bodies instead of fused jax calls",
    )
    p.set_defaults(run=cmd_jax)

    p = sub.add_parser("explain", help="explain an error code")
    p.add_argument("code")
    p.set_defaults(run=cmd_explain)

    register_export(sub)
    from linnet.lang.text.cli import register_chat

    register_chat(sub, add_run_arguments)

    command = _command_of(argv)
    if command in BUILTIN:
        return parser
    extensions = list(entry_points(group="linnet.commands"))
    if any(ep.name == command for ep in extensions):
        extensions = [ep for ep in extensions if ep.name == command]
    for ep in extensions:
        try:
            register: Callable = ep.load()
            register(sub)
        except Exception as exc:  # a broken extension never takes the CLI down
            if os.environ.get("LINNET_DEBUG"):
                print(f"linnet: skipped command plugin {ep.name}: {exc}", file=sys.stderr)
    return parser


def quantize_argument(value: str | None) -> str | bool | None:
    """``load``'s ``quantize=`` from `linnet run --quantize`: ``none`` is False.

    >>> quantize_argument("none"), quantize_argument("int4"), quantize_argument(None)
    (False, 'int4', None)
    """
    return False if value == "none" else value


def add_run_arguments(p: argparse.ArgumentParser, torch: bool = True) -> None:
    """The options of `linnet run`, whichever runtime registers the command first (each
    runtime's `linnet.commands` entry point calls this, so the two never drift apart).
    ``torch=False`` (linnet-runtime-jax where linnet-runtime-torch is not installed) leaves
    out the options only the torch runtime takes (``--compile``, ``--interpret``,
    ``--nproc``, ``--rank-timeout``): `--help` lists what the installed runtimes take.

    >>> p = argparse.ArgumentParser(); add_run_arguments(p)
    >>> p.parse_args(["--tokens", "4"]).tokens
    4
    >>> p = argparse.ArgumentParser(); add_run_arguments(p, torch=False)
    >>> "--compile" in p.format_help(), "--temperature" in p.format_help()
    (False, True)
    """
    p.add_argument(
        "file",
        nargs="?",
        help="a .linnet model, a shipped one by name "
        "(std.models.llama, std.models.qwen2, ...: each "
        "runs on random weights of its toy config), or a "
        "Hugging Face checkpoint directory (the model is "
        "picked from its config.json; default: the Llama "
        "example)",
    )
    p.add_argument(
        "--weights",
        help="a safetensors file, a checkpoint directory (a Hugging Face "
        "download: its config.json is read too), an index JSON "
        "(default: a generated toy checkpoint)",
    )
    p.add_argument(
        "--config",
        help="JSON config or a name in the model's configs/ (default: toy "
        "without --weights; with them, the checkpoint's config.json)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config value or model generic, typed as written (int, float, "
        "true/false, else a string; repeatable): --set S=256 --set T=bf16",
    )
    p.add_argument(
        "--prompt",
        default=None,
        help="comma-separated token ids, or text (through the tokenizer beside the "
        "weights, and its chat template: linnet.lang.text.cli); default: the "
        "demo's question where no model is given, else 1,2,3,4,5,6,7,8",
    )
    p.add_argument(
        "--tokens",
        "--max-new-tokens",
        dest="tokens",
        type=int,
        default=None,
        help="tokens to generate (default: 16 for token ids, 256 for text)",
    )
    p.add_argument("--device", default="cpu")
    if torch:
        p.add_argument(
            "--compile",
            action="store_true",
            help="torch.compile each slice kind once (torch runtime)",
        )
        p.add_argument(
            "--interpret", action="store_true", help="use the PyTorch interpreter (torch runtime)"
        )
    add_numerics_argument(p)
    p.add_argument(
        "--quantize",
        choices=("int8", "int4", "none"),
        default=None,
        help="quantise the linear weights as they load (f16 scales per group; "
        "docs/quantization.md); `none` loads a GGUF file's Q8_0/Q4_0/Q4_1 weights in float "
        "(default: as stored, a GGUF file's kept quantised)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated checkpoint")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature (default 0: greedy)",
    )
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="sample among the most likely tokens reaching p")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        metavar="P",
        help="penalise tokens already in the sequence (prompt and answer) by P, as "
        "transformers' repetition_penalty (1.2, say; default: none)",
    )
    p.add_argument(
        "--sampling-seed", type=int, help="seed of the sampling (same seed, same tokens)"
    )
    p.add_argument(
        "--stop",
        default=None,
        help="comma-separated token ids that end generation "
        "(default: the checkpoint's end-of-sequence "
        "tokens; `none`: decode every --tokens)",
    )
    from linnet.lang.text.cli import add_text_arguments

    add_text_arguments(p)
    if not torch:
        return
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads torch runs on (default: OMP_NUM_THREADS if set, else 1 "
        "for a small model, up to 4 physical cores for a large one; torch "
        "runtime)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="tensor parallelism: split the model over N ranks, started here (gloo "
        "on the CPU, NCCL on CUDA; torch runtime); rank 0 prints",
    )
    p.add_argument(
        "--rank-timeout",
        type=float,
        metavar="SECONDS",
        help="with --nproc: how long a rank waits for the others, to join and in "
        "each collective, before it stops with E0825 (default 300; also "
        "$LINNET_RANK_TIMEOUT)",
    )


def add_numerics_argument(p: argparse.ArgumentParser) -> None:
    """``--numerics`` (:class:`~linnet.lang.pipeline.Numerics`), checked by :func:`main` with
    the E0713 every entry point raises (argparse's ``choices`` would exit with its own usage
    error instead).

    >>> p = argparse.ArgumentParser(); add_numerics_argument(p)
    >>> p.parse_args([]).numerics
    'exact'
    """
    p.add_argument(
        "--numerics",
        default=Numerics.EXACT.value,
        metavar="{" + ",".join(NUMERICS) + "}",
        help="exact: every op as its body says; fast: fused calls, kernels, TF32 "
        "matmuls (default: exact)",
    )


def add_lowering_arguments(p: argparse.ArgumentParser, entry_required: bool = True) -> None:
    """The arguments every command that lowers an entry shares."""
    p.add_argument("file")
    p.add_argument("--entry", required=entry_required, help="entry to lower (e.g. decode)")
    p.add_argument("--model", help="model name, when the file declares several")
    p.add_argument("--config", help="JSON config, or the name of one in the model's configs/")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a config value or model generic (repeatable)",
    )
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=D0,D1",
        help="an entry input's shape (repeatable)",
    )
    p.add_argument("--weights", help="a safetensors file: bind dims from its shapes and check it")
    p.add_argument(
        "--grad",
        action="store_true",
        help="the entry's gradient graph: its outputs, then the gradients",
    )
    p.add_argument(
        "--wrt",
        action="append",
        default=[],
        metavar="NAME",
        help="with --grad: an input or parameter path to differentiate with "
        "respect to (repeatable; default: every float parameter)",
    )
    p.add_argument(
        "--grad-seed",
        choices=["scalar", "cotangents"],
        default="scalar",
        help="with --grad: the entry returns a loss (scalar), or the graph takes a "
        "cotangent input per float output (cotangents)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "numerics", None) is not None:
            Numerics.parse(args.numerics)  # E0713 before any work, as load() raises it
        return int(args.run(args) or 0)
    except LinnetError as err:
        return report(err, getattr(args, "format", "text"))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `linnet graph ... | head`
        sys.stderr.close()
        return 0
    except OSError as exc:
        # The last line of defence: a file or device fault no command turned into its own
        # diagnostic. LINNET_DEBUG=1 keeps the traceback, to find where it came from.
        if os.environ.get("LINNET_DEBUG"):
            raise
        where = f" (`{exc.filename}`)" if exc.filename else ""
        return report(
            LinnetError(
                Diagnostic(
                    "E0663",
                    f"`linnet {args.command}` stopped: {exc.strerror or exc}{where}",
                    help="check the files and the disk this command uses; set LINNET_DEBUG=1 for "
                    "a traceback",
                )
            ),
            getattr(args, "format", "text"),
        )


if __name__ == "__main__":
    sys.exit(main())
