"""`linnet run`'s setup, shared by every runtime and done before an array library is imported:
which model runs, with which config and which weights.

* A model file, or a model the wheel ships by name (``std.models.qwen2``).
* A Hugging Face checkpoint directory (``linnet run Qwen2.5-0.5B/``, or ``--weights`` alone):
  the shipped model is picked from its ``config.json``'s ``architectures`` (or
  ``model_type``) through the mappings ``std/models/*.hf.json`` list, and said
  (:func:`model_for_checkpoint`); an architecture none runs is E0796.
* A Hugging Face id (``Qwen/Qwen2.5-0.5B``) that is no path here is E0797: Linnet does not
  download, and the help says how to get the files.
* Without weights, the model's ``toy`` config (``configs/<model>/toy.json`` beside a shipped
  model) and the demo's random checkpoint; ``--set KEY=VALUE`` overrides config values, a key
  the model does not have being E0602 with a did-you-mean.

Nothing here imports torch, jax or NumPy.

>>> default_model().name
'llama.linnet'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linnet.lang import bundled
from linnet.lang.check.lowering import config_key_help, find_model
from linnet.lang.diagnostics.core import SourceFile
from linnet.lang.home import linnet_home
from linnet.lang.home_files import record
from linnet.lang.host.config import load_config, named_config_paths
from linnet.lang.host.inputs import error
from linnet.lang.syntax.program import STD_ROOT, Program, model_file
from linnet.lang.weights.checkpoint import read_json_object
from linnet.lang.weights.demo import GENERATOR, write_demo
from linnet.lang.weights.gguf import is_gguf
from linnet.lang.weights.safetensors import resolve_checkpoint

if TYPE_CHECKING:
    import argparse

#: The config `linnet run` takes for a model run without weights, where the model has one.
DEMO_CONFIG = "toy"

# `org/name` as the Hugging Face hub spells a repository: one slash, no path-like ends.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_FILE_SUFFIXES = (".linnet", ".safetensors", ".json", ".gguf")


@dataclass
class RunSetup:
    """What `linnet run` runs: the model file, its config (and the config's name, for the
    demo's message), the weights (None: the demo checkpoint) and the lines to say on stderr
    about choices made for the user (the model picked from a checkpoint's architecture)."""

    model: Path
    config_name: str | None
    config: dict[str, Any]
    weights: str | None
    notes: list[str] = field(default_factory=list)


def default_model() -> Path:
    """The model `linnet run` runs when none is given: the Llama example, as the wheel ships
    it (or, in an editable install, from the checkout: whatever the working directory);
    E0740 when this install has neither.

    >>> default_model().parent.name
    'llama'
    """
    try:
        return bundled.example("llama") / "llama.linnet"
    except LookupError:
        raise error(
            "E0740",
            "no model given, and this linnet-lang was installed without the Llama example",
            help="pass a model: `linnet run std.models.llama` (its toy "
            "config), or reinstall linnet-lang from its wheel",
        ) from None


def shipped_models() -> dict[str, dict[str, Any]]:
    """Each model the wheel ships (``std.models.qwen2``) and its checkpoint mapping.

    >>> shipped_models()["std.models.qwen2"]["architectures"]
    ['Qwen2ForCausalLM']
    """
    out = {}
    for path in sorted((STD_ROOT / "models").glob("*.hf.json")):
        out[f"std.models.{path.name.removesuffix('.hf.json')}"] = json.loads(
            path.read_text(encoding="utf-8")
        )
    return out


def model_for_checkpoint(config_json: Path) -> tuple[str, str] | None:
    """The shipped model that runs the Hugging Face checkpoint whose ``config.json`` is
    ``config_json``, and why (``"architecture Qwen2ForCausalLM"``): the first of its
    ``architectures`` a model's mapping lists, else its ``model_type``. None for a
    config.json that is no Hugging Face config (neither key); E0796 when no shipped model
    runs it, listing those that do.

    >>> model_for_checkpoint(Path("Qwen2.5-0.5B/config.json"))   # doctest: +SKIP
    ('std.models.qwen2', 'architecture Qwen2ForCausalLM')
    """
    data, _ = read_json_object(config_json, "E0652", "checkpoint config")
    archs = data.get("architectures")
    kind = data.get("model_type")
    if archs is None and kind is None:
        return None
    listed = [a for a in (archs if isinstance(archs, list) else [archs]) if a is not None]
    models = shipped_models()
    for arch in listed:
        for name, mapping in models.items():
            if arch in mapping.get("architectures", []):
                return name, f"architecture {arch}"
    if not listed:
        for name, mapping in models.items():
            if kind in mapping.get("model_types", []):
                return name, f"model_type {kind}"
    what = (
        f"architecture {', '.join(map(str, listed))}"
        if listed
        else f"model_type {json.dumps(kind)}"
    )
    runs = "; ".join(
        f"{', '.join(m.get('architectures', []))} ({name})" for name, m in models.items()
    )
    raise error(
        "E0796",
        f"`{config_json}` names {what}, which no model Linnet ships runs",
        help=f"the shipped models run: {runs}. For another architecture, write its "
        "model in Linnet with a `.hf.json` mapping beside it (docs/models.md) and "
        "run `linnet run model.linnet --weights DIR`",
    )


def gguf_model(path: str | Path) -> tuple[str, str]:
    """The shipped model that runs the GGUF file at ``path`` and why
    (:func:`linnet.lang.weights.gguf_load.gguf_model`)."""
    from linnet.lang.weights.gguf_load import gguf_model as pick

    return pick(path)


def model_for_weights(weights: Any) -> str:
    """The shipped model ``load(weights=...)`` runs when given no model: the one a GGUF
    file's architecture names, or a Hugging Face checkpoint's config.json; E0857 for weights
    that name none (a bare safetensors file, a dict of tensors).

    >>> model_for_weights("SmolLM2-135M-Instruct.Q4_1.gguf")   # doctest: +SKIP
    'std.models.llama'
    >>> model_for_weights(None)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0857]: load() was given no model, and ...
    """
    from linnet.lang.weights.gguf import is_gguf

    if is_gguf(weights):
        return gguf_model(weights)[0]
    picked = None
    if isinstance(weights, str | os.PathLike):
        config_json = checkpoint_config_json(str(weights))
        picked = model_for_checkpoint(config_json) if config_json is not None else None
    if picked is None:
        raise error(
            "E0857",
            "load() was given no model, and its weights do not name their "
            "architecture (a GGUF file or a Hugging Face checkpoint with a "
            "config.json does)",
            help="name the model: load('std.models.llama', weights=...), or a .linnet file",
        )
    return picked[0]


def check_not_hub_id(text: str, flag: str = "") -> None:
    """E0797 for a Hugging Face hub id (``org/name``) given where a path is wanted and that
    is no path here: Linnet reads local files only, and the help says how to get them.

    >>> check_not_hub_id("examples/llama/llama.linnet")
    >>> check_not_hub_id("Qwen/Qwen2.5-0.5B")
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0797]: `Qwen/Qwen2.5-0.5B` is not a file or ...
    """
    if Path(text).exists() or not _HUB_ID.fullmatch(text) or text.endswith(_FILE_SUFFIXES):
        return
    local = text.split("/")[1]
    given = f"{flag} {text}" if flag else text
    raise error(
        "E0797",
        f"`{text}` is not a file or directory here; it looks like a Hugging "
        f"Face id, and Linnet does not download (it reads local files only)",
        help=f"download it first: `huggingface-cli download {text} --local-dir "
        f"{local}`, then `linnet run {local}` (the model is picked from its "
        f"config.json; you gave `{given}`)",
    )


def checkpoint_config_json(weights: str | None) -> Path | None:
    """The Hugging Face ``config.json`` beside ``weights`` (a directory, a file in one, an
    index), if there is one that names a model (``model_type`` or ``architectures``)."""
    if weights is None:
        return None
    path = resolve_checkpoint(weights).config_path
    if path is None:
        return None
    data, _ = read_json_object(path, "E0652", "checkpoint config")
    return path if "model_type" in data or "architectures" in data else None


def _checkpoint_directory(directory: Path, weights: str | None) -> tuple[str, Path]:
    """`linnet run DIR`: the shipped model of DIR's config.json and its file (E0795 where DIR
    is no Hugging Face checkpoint, or --weights names another)."""
    if weights is not None and Path(weights).resolve() != directory.resolve():
        raise error(
            "E0795",
            f"`linnet run {directory}` runs the checkpoint in that directory, "
            f"and --weights names another ({weights})",
            help=f"give the checkpoint once: `linnet run {directory}`, or a model and "
            f"its weights: `linnet run model.linnet --weights {weights}`",
        )
    config_json = directory / "config.json"
    picked = model_for_checkpoint(config_json) if config_json.is_file() else None
    if picked is None:
        models = sorted(p.name for p in directory.glob("*.linnet"))
        hint = (
            f"to run a model of that folder, name its file: `linnet run {directory / models[0]}`"
            if models
            else "pass the directory a Hugging Face checkpoint was downloaded or saved to "
            "(`save_pretrained` writes config.json beside the safetensors files), or a "
            "model and its weights: `linnet run std.models.llama --weights DIR`"
        )
        what = (
            "no config.json"
            if not config_json.is_file()
            else "a config.json that names no architecture (no `architectures`, no `model_type`)"
        )
        raise error(
            "E0795",
            f"`{directory}` is a directory with {what}: not a Hugging Face "
            "checkpoint Linnet can pick a model for",
            help=hint,
        )
    name, why = picked
    return f"linnet: {config_json.name}'s {why}: running {name}", model_file(name)


def has_config(model: Path, name: str) -> bool:
    """Whether the model in ``model`` has a named config ``name`` (``configs/`` beside it).

    >>> from linnet.lang.syntax.program import model_file
    >>> has_config(model_file("std.models.phi3"), "toy")
    True
    """
    return any(p.is_file() for p in named_config_paths(model, name))


def run_setup(args: argparse.Namespace) -> RunSetup:
    """`linnet run`'s model, config and weights from its arguments (``file``, ``weights``,
    ``config``, ``set``), every path and name checked (E0211, E0640, E0651, E0795-E0797,
    E0602 for a ``--set`` key the model lacks) before anything is loaded or imported.

    >>> import argparse
    >>> s = run_setup(argparse.Namespace(file="std.models.qwen2", weights=None, config=None,
    ...                                  set=["S=64"]))
    >>> s.model.name, s.config_name, s.config["S"], s.weights
    ('qwen2.linnet', 'toy', 64, None)
    """
    file, weights = args.file, args.weights
    sets = list(getattr(args, "set", None) or [])
    notes: list[str] = []
    if weights is not None:
        check_not_hub_id(weights, "--weights")
    if is_gguf(file) or (file is None and is_gguf(weights)):
        # `linnet run x.gguf`: the file names its architecture, and so the model.
        if (
            file is not None
            and weights is not None
            and Path(weights).resolve() != Path(file).resolve()
        ):
            raise error(
                "E0795",
                f"`linnet run {file}` runs that GGUF file, and --weights names another ({weights})",
                help=f"give the file once: `linnet run {file}`, or a model and its "
                f"weights: `linnet run std.models.llama --weights {weights}`",
            )
        weights = file or weights
        name, why = gguf_model(weights)
        notes.append(f"linnet: {Path(weights).name}'s {why}: running {name}")
        model = model_file(name)
        file = str(model)
    elif file is not None and Path(file).is_dir():
        note, model = _checkpoint_directory(Path(file), weights)
        notes.append(note)
        weights = file
    elif file is not None:
        check_not_hub_id(file)
        model = model_file(file)  # E0211 for a std name that is none
        SourceFile.read(model)  # E0001 for a file that is not there, before any import
    else:
        config_json = checkpoint_config_json(weights)
        picked = model_for_checkpoint(config_json) if config_json is not None else None
        if picked is not None:
            assert config_json is not None
            notes.append(f"linnet: {config_json.name}'s {picked[1]}: running {picked[0]}")
            model = model_file(picked[0])
        else:
            model = default_model()
    # Without weights, the demo runs on the model's toy config; with weights that bring no
    # config of their own (a bare safetensors file), the toy config of the default model.
    own_config = is_gguf(weights) or checkpoint_config_json(weights) is not None
    config_name = args.config
    if (
        config_name is None
        and (weights is None or (file is None and not own_config))
        and has_config(model, DEMO_CONFIG)
    ):
        config_name = DEMO_CONFIG
    config = load_config(config_name, [], str(model)) if config_name else {}
    if sets:
        overrides = load_config(None, sets)  # E0642 for a --set that is no NAME=VALUE
        check_config_keys(model, list(overrides))
        config.update(overrides)
    return RunSetup(model, config_name, config, weights, notes)


def check_config_keys(model: Path, keys: list[str], program: Program | None = None) -> None:
    """E0602 for each ``--set`` key that is neither a generic nor a config of the model in
    ``model`` (the lowering's own message, naming the closest key), before anything runs.

    >>> from linnet.lang.syntax.program import model_file
    >>> check_config_keys(model_file("std.models.qwen2"), ["rms_norm_eps", "S"])
    >>> check_config_keys(model_file("std.models.qwen2"), ["rms_eps"])
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0602]: `--set rms_eps=...`: `rms_eps` is ...
    """
    decl = find_model(program or Program.from_file(model), None)
    known = [g.name for g in decl.generics] + sorted(
        m.name for m in decl.members if m.kind == "config"
    )
    for key in keys:
        if key not in known:
            raise error(
                "E0602",
                f"`--set {key}=...`: `{key}` is not a generic or config of model `{decl.name}`",
                help=config_key_help(key, known),
            )


def check_threads(threads: Any, cores: int) -> None:
    """E0799 unless ``--threads`` is None (choose) or an int from 1 to ``cores`` (the CPUs
    this process may run on: more threads than those only wait for each other).

    >>> check_threads(2, 4)
    >>> check_threads(0, 4)
    Traceback (most recent call last):
    ...
    linnet.lang.diagnostics.core.LinnetError: error[E0799]: --threads 0: run on at least one ...
    """
    if threads is None:
        return
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise error(
            "E0799",
            f"--threads {threads}: run on at least one CPU thread",
            help="e.g. --threads 1 (steady on a shared machine), or leave it out to "
            "let linnet run choose",
        )
    if threads > cores:
        raise error(
            "E0799",
            f"--threads {threads}: this process may run on {cores} CPU(s); "
            "more threads than CPUs only wait for each other",
            help=f"give at most --threads {cores}, or leave it out to let linnet run choose",
        )


def threads_from_environment(environ: Any = None) -> str | None:
    """The variable that sets the CPU thread count already (``OMP_NUM_THREADS``,
    ``MKL_NUM_THREADS``), which `linnet run` then respects; None where neither is set.

    >>> threads_from_environment({"OMP_NUM_THREADS": "3"})
    'OMP_NUM_THREADS'
    """
    env = os.environ if environ is None else environ
    return next((k for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if env.get(k, "").strip()), None)


def demo_checkpoint(
    model: Path, config: dict[str, Any], seed: int, write: Callable[[Path], None] | None = None
) -> Path:
    """The demo's deterministic random checkpoint for ``model``, ``config`` and ``seed``
    under $LINNET_HOME/demo, made once (to a temporary name, renamed into place) by the one
    generator every runtime shares (:mod:`linnet.lang.weights.demo`): `linnet run` and
    `linnet run --runtime jax` load the same file and decode the same tokens. ``write``
    (a function of the path) writes it instead (tests).

    >>> demo_checkpoint(Path("llama.linnet"), cfg, 0)   # doctest: +SKIP
    PosixPath('/home/me/.cache/linnet/demo/llama-3f2a....safetensors')
    """
    key = hashlib.sha256(f"{GENERATOR}{model.read_text()}{sorted(config.items())}{seed}".encode())
    name = f"{model.stem}-{key.hexdigest()[:12]}.safetensors"
    path = linnet_home() / "demo" / name
    if not path.is_file() or path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A name of its own (two processes making it at once), renamed onto the place: a
        # link there is replaced, never written through.
        fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            if write is None:
                write_demo(Path(tmp), model, config, seed)
            else:
                write(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        record(path)  # so that `linnet cache clear` knows the file as Linnet's
    return path
