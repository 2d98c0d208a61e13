"""Reading GGUF files (llama.cpp's format) as checkpoints of the shipped model families.

A GGUF file holds the model's hyperparameters as metadata under llama.cpp's key names, its
tensors under llama.cpp's names (most of them quantised in blocks), and its tokenizer. This
module reads it through the ``gguf`` package (``gguf.GGUFReader``, memory-mapped) and turns it
into what a Hugging Face checkpoint gives: the config.json dict the family's ``.hf.json``
mapping reads (so config checks, ranges and defaults are shared with safetensors
checkpoints) and tensors named by the model's parameter paths (:mod:`.gguf_names`).

Nothing is dequantised when the file is opened: each :class:`GGUFTensor` keeps its quant type,
its shape and a view of its raw blocks in the file, and :meth:`GGUFTensor.dequantized` is the
one step that turns blocks into float32 (``gguf.quants.dequantize``, vectorised NumPy), undoing
what llama.cpp's converter did to the values. A runtime that keeps blocks quantised would take
``GGUFTensor.blocks`` instead.

Needs the ``gguf`` extra (``pip install linnet-lang[gguf]``, which both runtimes install);
linnet-lang imports without it, and a GGUF file is then E0850.

>>> ckpt = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")            # doctest: +SKIP
>>> ckpt.family.model, ckpt.hf_config["num_hidden_layers"]          # doctest: +SKIP
('std.models.llama', 30)
>>> ckpt.tensors["model.layers.0.self_attn.q_proj.weight"].quant    # doctest: +SKIP
'Q4_1'
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError, coded_error
from linnet.lang.weights.generation import StopTokens
from linnet.lang.weights.gguf_names import (
    ARCHITECTURES,
    FAMILIES,
    Family,
    block_kind,
    family_for,
    hf_tensor_name,
)

GGUF_SUFFIX = ".gguf"
#: The quant types Linnet dequantises (gguf's NumPy implementations of llama.cpp's blocks).
SUPPORTED_QUANTS = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)
# `{arch}.` metadata keys that never change a decoder's logits, or are read elsewhere here
# (the head width, the rotary width, rope scaling, the expert counts of a dense model).
_KNOWN_ARCH_KEYS = {
    "vocab_size",
    "rope.dimension_count",
    "attention.key_length",
    "attention.value_length",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "expert_count",
    "expert_used_count",
    "tensor_data_layout",
}
# Tensors whose values change the rotary embedding in ways the models do not read from a GGUF.
_ROPE_TENSORS = {
    "rope_freqs.weight": "Llama 3.1's rope scaling, stored as per-dimension frequency factors",
    "rope_factors_long.weight": "Phi-3's longrope scaling",
    "rope_factors_short.weight": "Phi-3's longrope scaling",
}


def is_gguf(weights: Any) -> bool:
    """Whether ``weights`` names a GGUF file (a path ending in ``.gguf``).

    >>> is_gguf("SmolLM2.Q4_1.gguf"), is_gguf("model.safetensors"), is_gguf({"w": 1})
    (True, False, False)
    """
    return isinstance(weights, str | os.PathLike) and Path(weights).suffix.lower() == GGUF_SUFFIX


def import_gguf() -> Any:
    """The ``gguf`` package; E0850 where linnet-lang was installed without its extra."""
    try:
        import gguf
    except ImportError:
        raise coded_error(
            "E0850",
            "reading a GGUF file needs the `gguf` package, which is not installed",
            help="install linnet-lang with its gguf extra: `pip install 'linnet-lang[gguf]'` "
            "(linnet-runtime-torch and linnet-runtime-jax install it)",
        ) from None
    return gguf


def _corrupt(path: Path, why: str) -> LinnetError:
    return coded_error(
        "E0851",
        f"`{path}` is not a readable GGUF file: {why}",
        help="the file may be truncated or not a GGUF file at all; download it "
        "again (a complete GGUF file starts with the bytes `GGUF`)",
    )


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its parameter path ``name`` and llama.cpp name
    ``gguf_name``, its quant type (``"Q4_1"``), its shape as the model's parameter (row-major,
    after any transposition), and ``blocks``, a view of its raw data in the memory-mapped file.
    ``permute_heads`` (llama.cpp permuted the rows of Llama's q/k for its rotary embedding),
    ``offset`` (added to the values: Gemma's norms) and ``transpose`` say how to undo what
    llama.cpp's converter did.
    """

    name: str
    gguf_name: str
    quant: str
    shape: tuple[int, ...]
    blocks: Any
    qtype: Any
    permute_heads: int | None = None
    offset: float = 0.0
    transpose: bool = False

    def dequantized(self) -> Any:
        """The tensor's values as a float32 NumPy array of :attr:`shape`, in memory of its
        own (not the file's pages: the model outlives the memory map).

        >>> ckpt.tensors["model.norm.weight"].dequantized().dtype      # doctest: +SKIP
        dtype('float32')
        """
        import numpy as np
        from gguf.quants import dequantize

        values = np.asarray(dequantize(self.blocks, self.qtype), dtype=np.float32)
        if self.transpose:
            values = values.T
        if self.permute_heads is not None:
            # llama.cpp's converter interleaved each head's two rotary halves (rows
            # (2, HD/2) -> (HD/2, 2)) for its rotary kernel: undo it.
            heads = self.permute_heads
            rows = values.shape[0]
            values = (
                values.reshape(heads, rows // heads // 2, 2, *values.shape[1:])
                .swapaxes(1, 2)
                .reshape(values.shape)
            )
        if self.offset:
            values = values + np.float32(self.offset)
        out = np.ascontiguousarray(values, dtype=np.float32)
        if np.may_share_memory(out, self.blocks):
            out = out.copy()
        return out.reshape(self.shape)


@dataclass
class GGUFCheckpoint:
    """A GGUF file read as a checkpoint of ``family``: ``hf_config`` is the config.json its
    model's mapping reads, ``tensors`` maps each parameter path to its :class:`GGUFTensor`,
    ``metadata`` holds the file's scalar metadata. ``dtype`` is the Linnet float type the
    tensors are loaded as (set when the model's config is known). ``files`` and
    ``directory`` are as a safetensors :class:`~linnet.lang.weights.safetensors.Checkpoint`'s
    (the runtimes print the one; no config.json or generation_config.json is read from the
    other: the file says everything)."""

    path: Path
    arch: str
    family: Family
    hf_config: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    metadata: dict[str, Any] = field(default_factory=dict)
    reader: Any = None
    dtype: str = "f32"

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.path,)

    @property
    def directory(self) -> None:
        return None

    @property
    def config_name(self) -> str:
        """What messages call the metadata, in place of ``config.json``."""
        return f"{self.path.name}'s metadata"

    def arrays(self) -> Iterator[tuple[str, Any]]:
        """Each parameter path and its float32 values, dequantised one tensor at a time (the
        runtime converts each to :attr:`dtype` on its device before the next is made)."""
        for name, tensor in self.tensors.items():
            yield name, tensor.dequantized()

    def stop_tokens(self) -> StopTokens:
        """The end-of-sequence token the file names (``tokenizer.ggml.eos_token_id``), where
        generation stops by default, as transformers reads a GGUF file's config."""
        eos = self.metadata.get("tokenizer.ggml.eos_token_id")
        if not isinstance(eos, int) or isinstance(eos, bool) or eos < 0:
            return StopTokens()
        return StopTokens((eos,), f"{self.path.name}'s tokenizer.ggml.eos_token_id")


def open_reader(path: str | Path) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped, read-only); E0651 for a missing file,
    E0851 for one that is not GGUF or is truncated."""
    gguf = import_gguf()
    p = Path(path)
    if not p.is_file():
        raise coded_error("E0651", f"weights file `{p}` not found", help="check the path")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise coded_error("E0651", f"cannot read `{p}`: {exc}") from None
    if magic != b"GGUF":
        raise _corrupt(p, f"it starts with {magic!r}, not the GGUF magic b'GGUF'")
    try:
        return gguf.GGUFReader(str(p), "r")
    except (
        ValueError,
        KeyError,
        IndexError,
        OverflowError,
        UnicodeDecodeError,
        OSError,
        TypeError,
    ) as exc:
        raise _corrupt(p, str(exc) or type(exc).__name__) from None


def read_metadata(reader: Any) -> dict[str, Any]:
    """The file's metadata as Python values: scalars and strings as they are, arrays as
    lists (the token list and merges included)."""
    out = {}
    for key, fld in reader.fields.items():
        try:
            out[key] = fld.contents()
        except (ValueError, UnicodeDecodeError, IndexError) as exc:
            raise _corrupt(
                Path(str(getattr(reader.data, "filename", "the file"))),
                f"metadata key `{key}` cannot be read ({exc})",
            ) from None
    return out


def _scalar_metadata(reader: Any) -> dict[str, Any]:
    out = {}
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and len(fld.data) > 1:
            continue  # the vocabulary and merges: read by the tokenizer only
        try:
            out[key] = fld.contents()
        except (ValueError, UnicodeDecodeError, IndexError):
            out[key] = None
    return out


def read_gguf(
    path: str | Path, architectures: list[str] | None = None, model: str | None = None
) -> GGUFCheckpoint:
    """Read the GGUF file at ``path`` as a checkpoint of the family whose Hugging Face
    architecture is among ``architectures`` (the loading model's ``.hf.json`` lists them;
    None: the first family of the file's architecture). Only headers are read: no tensor is
    dequantised. ``model`` names the loading model in messages.

    Every problem is a coded error naming the file: E0851 (not GGUF, truncated), E0852 (an
    architecture no shipped model runs, or that ``model`` does not run), E0853 (a quant type
    Linnet does not dequantise), E0854 (a tensor missing, or one the model does not have),
    E0855 (a metadata key missing, of the wrong kind, or one the model does not model),
    E0856 (rope scaling stored as tensors, which the models do not read from GGUF).

    >>> read_gguf("model.gguf").family.model   # doctest: +SKIP
    'std.models.llama'
    """
    p = Path(path)
    reader = open_reader(p)
    meta = _scalar_metadata(reader)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise coded_error(
            "E0855",
            f"`{p}` has no `general.architecture` metadata string",
            help="every GGUF model file names its architecture; the file was "
            "not written by llama.cpp's converter, or is damaged",
        )
    count = meta.get(f"{arch}.expert_count")
    moe = isinstance(count, int) and not isinstance(count, bool) and count > 0
    # A mixture of experts' family where the file is one (Mixtral is a `llama` file with
    # experts); else the first that runs the architecture, which refuses what it lacks.
    fam = family_for(arch, architectures, moe) or family_for(arch, architectures)
    if fam is None:
        raise _unknown_architecture(p, arch, architectures, model)
    if moe and not fam.experts:
        # Before its tensors are read: `ffn_gate_exps` would be reported as unknown (E0854).
        others = [f.model for f in FAMILIES if f.arch == arch and f.experts]
        raise coded_error(
            "E0852",
            f"`{p}` is a mixture of {count} experts (`{arch}.expert_count`), which model "
            f"{fam.model} does not run",
            help="load it with a model written for that mixture of experts"
            + (f" ({', '.join(others)})" if others else ""),
        )
    if fam.experts and not moe:
        raise coded_error(
            "E0852",
            f"`{p}` is a GGUF file of architecture {arch!r} without experts "
            f"(no `{arch}.expert_count`), but model {fam.model} is a mixture of experts",
            help=f"load it with {' or '.join(m for m in ARCHITECTURES[arch] if m != fam.model)}"
            f", or without a model (`linnet run {p.name}` picks it from the file)"
            if len(ARCHITECTURES[arch]) > 1
            else "load the file of the mixture of experts",
        )
    tensors = _tensors(p, reader, fam)
    hf = hf_config(p, meta, fam, tensors)
    _permute_and_check(p, fam, hf, tensors)
    return GGUFCheckpoint(p, arch, fam, hf, tensors, meta, reader)


def _unknown_architecture(
    p: Path, arch: str, architectures: list[str] | None, model: str | None
) -> LinnetError:
    known = "; ".join(f"{a} ({', '.join(m)})" for a, m in ARCHITECTURES.items())
    if architectures is None or arch not in ARCHITECTURES:
        return coded_error(
            "E0852",
            f"`{p}` is a GGUF file of architecture {arch!r}, which no model Linnet ships runs",
            help=f"the GGUF architectures Linnet loads: {known}. For "
            "another, load the model's Hugging Face (safetensors) checkpoint with a model "
            "written for it",
        )
    runs = ", ".join(architectures) or "no Hugging Face architecture"
    return coded_error(
        "E0852",
        f"`{p}` is a GGUF file of architecture {arch!r}, but model "
        f"`{model or 'the model'}` runs {runs}",
        help=f"load it with {' or '.join(ARCHITECTURES[arch])}, or without a model "
        f"(`linnet run {p.name}` picks it from the file)",
    )


def _tensors(p: Path, reader: Any, fam: Family) -> dict[str, GGUFTensor]:
    gguf = import_gguf()
    quants = gguf.GGMLQuantizationType
    out: dict[str, GGUFTensor] = {}
    unknown: list[str] = []
    unsupported: dict[str, list[str]] = {}
    rope: list[str] = []
    for t in reader.tensors:
        if t.name in _ROPE_TENSORS:
            rope.append(t.name)
            continue
        name = hf_tensor_name(fam, t.name)
        if name is None:
            unknown.append(t.name)
            continue
        qname = quants(t.tensor_type).name
        if qname not in SUPPORTED_QUANTS:
            unsupported.setdefault(qname, []).append(t.name)
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        kind = block_kind(t.name)
        transpose = kind in fam.transposed and t.name.endswith(".weight") and len(shape) == 2
        if transpose:
            shape = shape[::-1]
        if kind in fam.rows and len(shape) == 1:
            shape = (1, shape[0])  # a vector in the file, one row of the model's [1, n]
        offset = fam.norm_offset if t.name.endswith("norm.weight") else 0.0
        out[name] = GGUFTensor(
            name, t.name, qname, shape, t.data, t.tensor_type, offset=offset, transpose=transpose
        )
    if rope:
        raise coded_error(
            "E0856",
            f"`{p}` holds {', '.join(f'`{r}`' for r in rope)} "
            f"({_ROPE_TENSORS[rope[0]]}), which model {fam.model} does not read from a "
            "GGUF file",
            help="load the model's Hugging Face checkpoint (its config.json "
            "states the rope scaling the model implements)",
        )
    diags = [
        Diagnostic(
            "E0853",
            f"`{p}` holds {len(names)} tensor"
            f"{'s' if len(names) != 1 else ''} of quant type {q}, which Linnet "
            f"does not dequantise: {_names(names)}",
            help="quant types Linnet loads: "
            + ", ".join(SUPPORTED_QUANTS)
            + "; convert the file to one of them with llama.cpp's "
            "`llama-quantize`, or load an unquantised checkpoint",
        )
        for q, names in unsupported.items()
    ]
    if unknown:
        diags.append(
            Diagnostic(
                "E0854",
                f"`{p}` holds tensor{'s' if len(unknown) != 1 else ''} "
                f"{_names(unknown)}, which model {fam.model} does not have",
                help="the file is of another variant of the architecture (a mixture of experts, "
                "extra projections...) than the shipped model runs; load it with a model "
                "written for that variant",
            )
        )
    if diags:
        raise LinnetError(diags)
    return out


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _number(p: Path, key: str, value: Any, kind: type) -> Any:
    ok = (
        isinstance(value, kind) and not isinstance(value, bool)
        if kind is int
        else isinstance(value, int | float) and not isinstance(value, bool)
    )
    if not ok:
        raise coded_error(
            "E0855",
            f"`{p}`'s metadata `{key}` is {value!r:.40}, not "
            f"{'an integer' if kind is int else 'a number'}",
            help="the file is damaged or was not written by llama.cpp's "
            "converter; download it again",
        )
    return int(value) if kind is int else float(value)


def hf_config(
    p: Path, meta: dict[str, Any], fam: Family, tensors: dict[str, GGUFTensor]
) -> dict[str, Any]:
    """The config.json a Hugging Face checkpoint of ``fam`` would have, from the file's
    metadata ``meta`` and its tensors: every size and constant llama.cpp wrote, the
    vocabulary size (the embedding's rows), whether the output projection is the embedding
    (no ``output.weight``), rope scaling. E0855 for a required key missing, a value of the
    wrong kind, or an ``{arch}.`` key that changes the math and is not modelled."""
    arch = fam.arch
    hf: dict[str, Any] = {"architectures": [fam.architecture], "model_type": fam.model_type}
    for key, hf_key in fam.config.items():
        full = f"{arch}.{key}"
        if full not in meta:
            continue
        value = meta[full]
        if isinstance(value, list):
            # Some files write a per-layer list (`head_count_kv`); the models have one value.
            if not value or any(v != value[0] for v in value):
                raise coded_error(
                    "E0855",
                    f"`{p}`'s metadata `{full}` differs between layers "
                    f"({str(value)[:40]}), which model {fam.model} does not model",
                    help="load it with a model written for that variant",
                )
            value = value[0]
        real = any(w in key for w in ("epsilon", "freq", "softcapping"))
        hf[hf_key] = _number(p, full, value, float if real else int)
    for key in ("block_count", "embedding_length", "attention.head_count"):
        if f"{arch}.{key}" not in meta:
            raise coded_error(
                "E0855",
                f"`{p}` has no `{arch}.{key}` metadata",
                help="llama.cpp's converter writes it for every model; the file "
                "is damaged or was written by another tool",
            )
    unknown = [
        k
        for k in meta
        if k.startswith(f"{arch}.")
        and k[len(arch) + 1 :] not in fam.config
        and k[len(arch) + 1 :] not in _KNOWN_ARCH_KEYS
    ]
    experts = meta.get(f"{arch}.expert_count")
    if isinstance(experts, int) and experts > 0 and not fam.experts:
        raise coded_error(
            "E0852",
            f"`{p}` is a mixture of {experts} experts "
            f"(`{arch}.expert_count`), which model {fam.model} does not run",
            help="load it with a model written for that mixture of experts",
        )
    if unknown:
        raise coded_error(
            "E0855",
            f"`{p}`'s metadata sets {_names(unknown)}, which model {fam.model} does not model",
            help="the file is of a variant of the architecture whose math "
            "the shipped model does not implement; load its Hugging "
            "Face checkpoint with a model written for it",
        )
    embed = tensors.get(f"{fam.top['token_embd']}.weight")
    if embed is not None:
        hf[fam.vocab_key] = embed.shape[0]
    elif isinstance(meta.get(f"{arch}.vocab_size"), int):
        hf[fam.vocab_key] = meta[f"{arch}.vocab_size"]
    _head_dim(p, meta, fam, hf)
    if fam.query_scale_layers is not None:
        # Not in the file: what llama.cpp computes (see Family.query_scale_layers).
        heads, width = hf.get(fam.heads_key), hf.get("hidden_size")
        if isinstance(heads, int) and isinstance(width, int) and heads > 0:
            big = hf.get(fam.layers_key) == fam.query_scale_layers
            head = hf.get("head_dim") or width // heads
            hf["query_pre_attn_scalar"] = width // heads if big else head
    output = tensors.get(f"{fam.top['output']}.weight")
    if (
        output is not None
        and embed is not None
        and fam.arch == "gpt2"
        and output.quant == embed.quant
        and output.shape == embed.shape
        and bytes(output.blocks.data) == bytes(embed.blocks.data)
    ):
        # llama.cpp writes GPT-2's tied embedding twice: one matrix, tied.
        del tensors[output.name]
        output = None
    hf["tie_word_embeddings"] = output is None
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if not fam.rope_scaling:
            hf["rope_scaling"] = {"rope_type": str(scaling)}
        else:
            params: dict[str, Any] = {"rope_type": str(scaling)}
            factor = meta.get(f"{arch}.rope.scaling.factor")
            if factor is not None:
                params["factor"] = _number(p, f"{arch}.rope.scaling.factor", factor, float)
            original = meta.get(f"{arch}.rope.scaling.original_context_length")
            if original is not None and scaling != "linear":
                params["original_max_position_embeddings"] = _number(
                    p, f"{arch}.rope.scaling.original_context_length", original, int
                )
            hf["rope_scaling"] = params
    hf.update(fam.extra)
    return hf


def _head_dim(p: Path, meta: dict[str, Any], fam: Family, hf: dict[str, Any]) -> None:
    arch = fam.arch
    heads = hf.get(fam.heads_key)
    width = hf.get("hidden_size", hf.get("n_embd"))
    key_length = meta.get(f"{arch}.attention.key_length")
    head = (
        _number(p, f"{arch}.attention.key_length", key_length, int)
        if key_length is not None
        else (width // heads if width and heads else None)
    )
    if key_length is not None and fam.head_dim is not None:
        hf[fam.head_dim] = head
    value_length = meta.get(f"{arch}.attention.value_length")
    if (
        value_length is not None
        and head is not None
        and _number(p, f"{arch}.attention.value_length", value_length, int) != head
    ):
        raise coded_error(
            "E0855",
            f"`{p}`'s metadata gives keys and values different widths "
            f"(`{arch}.attention.key_length` {head}, `value_length` "
            f"{value_length}), which model {fam.model} does not model",
            help="load it with a model written for that variant",
        )
    rope = meta.get(f"{arch}.rope.dimension_count")
    if rope is not None and head and fam.arch != "gpt2":
        rope = _number(p, f"{arch}.rope.dimension_count", rope, int)
        if rope != head:
            hf["partial_rotary_factor"] = rope / head


def _permute_and_check(
    p: Path, fam: Family, hf: dict[str, Any], tensors: dict[str, GGUFTensor]
) -> None:
    """Record llama.cpp's q/k row permutation on those tensors (it needs the head counts),
    and E0854 for each tensor the model needs that the file lacks."""
    layers = hf.get(fam.layers_key)
    heads = hf.get(fam.heads_key)
    kv_heads = hf.get(fam.kv_heads_key, heads) if fam.kv_heads_key else heads
    if fam.permute_qk and isinstance(heads, int) and isinstance(kv_heads, int):
        for name, t in list(tensors.items()):
            kind = block_kind(t.gguf_name)
            count = heads if kind == "attn_q" else kv_heads if kind == "attn_k" else None
            if count is None:
                continue
            if count <= 0 or t.shape[0] % (2 * count):
                raise coded_error(
                    "E0855",
                    f"`{p}`'s `{t.gguf_name}` has {t.shape[0]} rows, which "
                    f"{count} heads of pairs of rotary dimensions cannot divide",
                    help="the head counts in the metadata do not match the tensors; "
                    "download the file again",
                )
            tensors[name] = GGUFTensor(
                t.name,
                t.gguf_name,
                t.quant,
                t.shape,
                t.blocks,
                t.qtype,
                count,
                t.offset,
                t.transpose,
            )
    gguf_names = {t.gguf_name for t in tensors.values()}
    missing = [f"{k}.weight" for k in fam.top if k != "output" and f"{k}.weight" not in gguf_names]
    stray = []
    if isinstance(layers, int):
        for i in range(layers):
            missing += [
                f"blk.{i}.{k}.weight" for k in fam.block if f"blk.{i}.{k}.weight" not in gguf_names
            ]
        stray = sorted(
            (n for n in gguf_names if n.startswith("blk.") and int(n.split(".")[1]) >= layers),
            key=len,
        )
    if missing:
        raise coded_error(
            "E0854",
            f"`{p}` lacks tensor{'s' if len(missing) != 1 else ''} "
            f"{_names(missing)}, which model {fam.model} needs",
            help="the file is incomplete or of another variant of the architecture; "
            "download it again",
        )
    if stray:
        raise coded_error(
            "E0854",
            f"`{p}` holds {_names(stray)}, past the {layers} layers its "
            f"`{fam.arch}.block_count` says",
            help="the metadata and the tensors disagree: the file is damaged; download it again",
        )
