"""`load`: a model from its `.linnet` source (or a std name, or none where the weights name
their architecture), its weights (a safetensors file, a checkpoint directory, an index, a GGUF
file, a dict of tensors) and its config, checked and placed on a device. The loaded
:class:`~linnet.torch.model.Model` runs its entries.

>>> model = load("examples/llama/llama.linnet", weights="model.safetensors",
...              config="examples/llama/configs/toy.json")             # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from linnet.lang.host.inputs import error as _error
from linnet.lang.host.loading import (
    check_dtype_config,
    check_finite_flag,
    check_weights_type,
    load_program,
    read_config,
    read_headers,
)
from linnet.lang.host.paged import paged_config
from linnet.lang.host.quantize import (
    Layout,
    Quantize,
    gguf_layout,
    parse_quantize,
    quantized_layout,
    stored_quantization,
)
from linnet.lang.host.run import model_for_weights
from linnet.lang.pipeline import (
    NUMERICS,  # noqa: F401  (users name linnet.torch.model.NUMERICS)
    CompileOptions,
)
from linnet.lang.text.model import given_tokenizer
from linnet.lang.weights.generation import StopTokens, checkpoint_stop_tokens
from linnet.lang.weights.gguf import GGUFCheckpoint

import torch

from .interpreter import DTYPES
from .model import Model, resolve_device

# Re-exported: `linnet.torch.model.compile_options` is how tests and users name them.
from .options import (  # noqa: F401
    COMPILE_MODES,
    announce_compile,
    compile_label,
    compile_options,
    numerics_mode,
)


def dtype_name(dtype: Any) -> str | None:
    """A torch dtype's Linnet name (``torch.bfloat16``: ``"bf16"``), None for anything else:
    what :meth:`CompileOptions.parse` takes to check ``load(..., dtype=)`` (E0742).

    >>> dtype_name(torch.bfloat16), dtype_name("bfloat16")
    ('bf16', None)
    """
    if not isinstance(dtype, torch.dtype):
        return None
    return next((name for name, dt in DTYPES.items() if dt == dtype), None)


def compile_options_of(numerics: Any, device: Any, dtype: Any) -> CompileOptions:
    """``load``'s ``numerics=``, ``device=`` and ``dtype=`` checked once (E0713, E0710,
    E0742): a torch dtype or a Linnet name for ``dtype``; a ``torch.device`` is resolved
    later (:func:`~linnet.torch.model.resolve_device`) and named then.

    >>> compile_options_of("fast", "cuda:1", torch.bfloat16)
    CompileOptions(numerics=<Numerics.FAST: 'fast'>, device='cuda:1', dtype='bf16')
    """
    return CompileOptions.parse(
        numerics,
        device if isinstance(device, str) else None,
        dtype,
        dtype_name=dtype_name,
        dtype_example="torch.bfloat16",
    )


def _check_weights_type(weights: Any) -> None:
    check_weights_type(
        weights,
        lambda v: isinstance(v, torch.Tensor),
        "tensors",
        note="a path is never read as a file descriptor",
    )


# load(..., check_grads=True): cases per grad clause, and the largest dim they take (a
# quick look at every clause; `linnet grads` checks more).
LOAD_CHECK_CASES = 2
LOAD_CHECK_MAX_SIZE = 12


def load(
    path: str | Path | None = None,
    weights: Any = None,
    device: str | torch.device = "cpu",
    compile: bool | str | dict = False,
    numerics: str = "exact",
    config: dict[str, Any] | str | Path | None = None,
    interpret: bool = False,
    dtype: torch.dtype | str | None = None,
    progress: Callable[[str], None] | bool = False,
    grad: bool = False,
    world: int | None = None,
    check_finite: bool = True,
    check_grads: bool = False,
    tokenizer: Any = None,
    quantize: str | dict[str, Any] | bool | None = None,
    kv_pages: int | None = None,
    kv_page_size: int | None = None,
) -> Model:
    """Load a `.linnet` model with safetensors weights onto ``device``.

    ``path`` is a model file, or a model the linnet-lang wheel ships by its module name:
    ``std.models.llama``, ``std.models.qwen2``, ``std.models.mistral``, ``std.models.gemma``,
    ``std.models.gpt2``, ``std.models.phi3`` (docs/models.md).

    ``weights`` is a safetensors file, a checkpoint directory (its
    ``model.safetensors.index.json``, else every ``*.safetensors`` in it), an index file,
    a list of files, a dict of tensors, or a GGUF file (llama.cpp's format: its metadata
    gives the config, its tensors are dequantised to the model's float type on load;
    docs/models.md). Without ``path``, the shipped model is picked from the weights: a GGUF
    file's architecture or a checkpoint's config.json (``load(weights="x.gguf")``). Files are never unpickled: their headers are
    validated first (every problem of every shard in one error, naming the shard), the
    model is checked against them, then each shard is read tensor by tensor straight to
    the device (on the CPU into memory of the model's own, not the file's pages).

    A ``config.json`` beside the safetensors files (a Hugging Face checkpoint) gives the
    model's config through the mapping beside the model (``llama.hf.json``); then nothing
    else is needed. ``config`` (a dict, a JSON file, or a name in the model's configs/
    folder) gives the rest, or overrides runtime choices such as the cache length ``S``;
    it may not contradict config.json. Dims that the weights determine are read from them.
    The checkpoint's end-of-sequence tokens (``generation_config.json``'s ``eos_token_id``,
    else ``config.json``'s, as transformers reads them) become ``model.stop_tokens``, where
    :meth:`Model.generate` stops by default.

    ``dtype`` (``torch.bfloat16`` or ``"bf16"``) converts floating-point weights on load;
    the model's element type ``T`` then follows it (a config ``T`` must agree).
    ``compile=True`` compiles each slice kind once with inductor; a string is a
    torch.compile mode (``"max-autotune-no-cudagraphs"``...) or backend (``"aot_eager"``), a
    dict inductor's options (see :func:`compile_options`);
    ``interpret=True`` runs the PyTorch interpreter instead of generated source.
    ``grad=True`` runs entries with autograd (see :meth:`Model.requires_grad_`): parameters
    require grad and ``backward()`` through an entry's result reaches them; a kernel an op
    launches then differentiates through the op's `grad` clause, or its body run again.

    Every floating-point weight is checked for NaN and infinite values once, on the device
    (one sum per tensor: a few percent of the time reading it takes); one is E0666, naming
    the tensor and where its first bad value is. ``check_finite=False`` skips the check (to
    load a damaged checkpoint and inspect it).

    ``check_grads=True`` first checks every `grad` clause of the model's ops (its own
    and the std ops it uses) against the reverse pass of the op's body on a few random
    cases (as `linnet grads` does, docs/grad.md): a clause that differs is a coded error
    (E0537, E0538) before anything is loaded, and one the check cannot see into (a
    straight-through estimator) a warning that says so (E0539). Off by default: each clause
    costs a fraction of a second to check.

    ``tokenizer`` (a checkpoint directory, a ``.gguf`` file or a
    :class:`linnet.lang.text.Tokenizer`) becomes ``model.tokenizer``, for text prompts;
    left out, the one beside the weights (their directory's tokenizer.json, or the GGUF
    file's), read when first used; ``False``: none.

    ``quantize="int8"`` or ``"int4"`` quantises the model's linear weights as they are read
    (round to nearest, an f16 scale per group of inputs; ``{"format": "int4", "group": 64}``
    picks the group, default the largest of 128, 64, 32 that divides every layer's inputs):
    decode then streams 1/2 or 1/4 of the bf16 bytes. The model must read the configs
    ``weight_bits``/``weight_group`` (every std model does); embeddings, norms and a tied
    LM head stay in float. On CUDA a GGUF file's Q8_0, Q4_0 and Q4_1 linear weights are
    kept as they are (repacked once, never dequantised) unless ``quantize=False``, which
    loads every weight in float; on the CPU, where no kernel reads quantised weights and
    the op bodies would dequantise every weight at every step, they are dequantised unless
    a format is asked for (``quantize="int4"`` keeps a Q4_0/Q4_1 file's blocks). Error and measured accuracy: docs/quantization.md.

    >>> model = load(weights="Llama-3.2-1B/", dtype="bf16", device="cuda",
    ...              quantize="int4")                              # doctest: +SKIP

    ``kv_pages=NP`` (and ``kv_page_size=PS``, default 16) makes the model's KV cache a pool
    of NP pages of PS positions shared by the sequences, read and written through a page
    table by the entries ``decode_paged`` and ``prefill_paged`` (every std model has them;
    page 0 is the sink page no sequence owns): a serving engine's cache
    (docs/models.md, "Serving: a paged KV cache"). The dense entries then have no cache.

    >>> model = load(weights="SmolLM2-135M/", kv_pages=256, kv_page_size=16)  # doctest: +SKIP

    ``world=N`` (N > 1) loads this process's rank of the model split over N ranks of
    torch.distributed's default process group (tensor parallelism, docs/parallel.md): the
    group already initialised, or started here from torchrun's environment (NCCL on CUDA,
    gloo on the CPU); ``device="cuda"`` is the rank's own GPU (``LOCAL_RANK``). Each rank
    reads only its block of each split tensor; entries return the whole result on every
    rank. ``linnet run --nproc N`` starts the ranks itself.

    >>> model = load("examples/llama/llama.linnet", weights="toy.safetensors",
    ...              config="toy", world=2)                      # doctest: +SKIP

    >>> model = load("examples/llama/llama.linnet", weights="Llama-3.2-1B/",
    ...              dtype="bf16", device="cuda")                    # doctest: +SKIP
    >>> logits = model.decode(torch.tensor([1]), torch.tensor([0]))  # doctest: +SKIP
    """
    # numerics, the device's name and dtype, checked once (E0713, E0710, E0742).
    options = compile_options_of(numerics, device, dtype)
    if not isinstance(grad, bool):
        raise _error(
            "E0769",
            f"grad must be True or False, not {grad!r}",
            help="load(..., grad=True) runs entries with autograd",
        )
    check_finite_flag(check_finite)
    if not isinstance(check_grads, bool):
        raise _error(
            "E0541",
            f"check_grads must be True or False, not {check_grads!r}",
            help="load(..., check_grads=True) checks every grad clause against its op's body first",
        )
    quant = parse_quantize(quantize)  # E0681 before anything is read
    if isinstance(quant, Quantize) and (grad or (world or 1) > 1):
        raise _error(
            "E0686",
            "quantize= is not supported "
            + ("with grad=True" if grad else "on a tensor-parallel model (world > 1)"),
            help="quantised weights are for inference on one device: load without "
            + ("grad=True" if grad else "world="),
        )
    stops = StopTokens()
    compile_options(compile)  # a bad value fails here, before anything is loaded
    tokenizer = given_tokenizer(tokenizer)  # E0842/E0849 before the weights are read
    _check_weights_type(weights)
    convert = None if options.dtype is None else DTYPES[options.dtype]
    from .parallel import check_world

    world = check_world(world)
    rank = 0
    if world > 1:
        if grad:
            raise _error(
                "E0823",
                "grad=True is not supported on a tensor-parallel model",
                help="load without world= to train or differentiate",
            )
        from .parallel import init

        rank, device = init(world, device)
    dev = resolve_device(device)
    program, model_path = load_program(model_for_weights(weights) if path is None else path)
    if check_grads:
        from .grad_checks import assert_grad_clauses

        assert_grad_clauses(
            program, unchecked="warn", count=LOAD_CHECK_CASES, max_size=LOAD_CHECK_MAX_SIZE
        )
    cfg = read_config(config, model_path)
    cfg = {**cfg, **paged_config(program, kv_pages, kv_page_size, cfg)}  # E0688, E0689
    check_dtype_config(program, cfg, options.dtype)
    report = _progress(progress)
    params: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple] | None = None
    split: dict[str, int] = {}
    if isinstance(weights, dict):
        from linnet.lang.weights.stacked import stack_tensors

        # A mixture of experts' per-expert tensors are its stacked parameters.
        weights = stack_tensors(weights, torch.stack)
        shapes = {
            k: (
                tuple(v.shape),
                _dtype_name(convert if convert is not None and v.is_floating_point() else v.dtype),
            )
            for k, v in weights.items()
        }
        cfg = {**stored_quantization(shapes), **cfg}  # a quantised model's params reload
        blocks = {}
        if world > 1:
            from .parallel import layout_of, parameter_axes

            split = parameter_axes(program, cfg, shapes, world, rank)
            blocks = layout_of(split, world, rank, shapes)
        from .parallel import block

        params = {
            k: (v.to(dev, convert) if convert is not None and v.is_floating_point() else v.to(dev))
            for k, v in ((k, block(v, blocks.get(k))) for k, v in weights.items())
        }
        if isinstance(quant, Quantize):
            layout = quantized_layout(program, cfg, shapes, quant)
            shapes, cfg, step = _quantizing(layout, cfg, shapes, check_finite, report)
            params = {k: t for name, v in params.items() for k, t in step(name, v).items()}
    elif weights is not None:
        from .weights import load_checkpoint

        ckpt, shapes, cfg = read_headers(weights, program, model_path, cfg, options.dtype)
        stops = checkpoint_stop_tokens(ckpt)  # E0798 before any tensor is read
        report(
            f"loading weights from {weights}"
            + (f" ({len(ckpt.files)} shards)" if len(ckpt.files) > 1 else "")
        )
        blocks = {}
        if world > 1:
            from .parallel import layout_of, parameter_axes

            split = parameter_axes(program, cfg, shapes, world, rank)
            blocks = layout_of(split, world, rank, shapes)
        step, layout, note = None, None, None
        repack: dict[str, tuple[str, ...]] = {}
        if isinstance(ckpt, GGUFCheckpoint) and not grad and world == 1:
            keep = dev.type == "cuda"  # Linnet's kernels read quantised weights there
            layout, repack, note = gguf_layout(program, cfg, shapes, ckpt, quant, keep)
            if layout is None and note:
                report(note)
        elif isinstance(quant, Quantize):
            layout = quantized_layout(program, cfg, shapes, quant)
        if layout is not None:
            shapes, cfg, step = _quantizing(layout, cfg, shapes, check_finite, report, note)
        params = load_checkpoint(ckpt, dev, convert, blocks, step, repack)
    elif world > 1:
        raise _error(
            "E0821",
            "world > 1 needs weights: each rank holds its block of them",
            help="pass weights= (a safetensors checkpoint or a dict of tensors)",
        )
    if check_finite:
        from .weights import check_finite_weights

        check_finite_weights(params, shapes)
    model = Model(
        program,
        params,
        cfg,
        dev,
        compile,
        options,
        interpret,
        shapes,
        report,
        grad,
        world,
        rank,
        split,
        stops,
    )
    model.attach_tokenizer(tokenizer, weights)
    return model


def _quantizing(
    layout: Layout,
    cfg: dict[str, Any],
    shapes: dict[str, Any],
    check_finite: bool,
    report: Callable[[str], None],
    note: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Callable[[str, torch.Tensor], dict]]:
    """The quantised model's weight shapes and config, and the per-tensor step that
    quantises the float weights as they are read (the finite check first, if on);
    ``note`` replaces the progress line (a GGUF file's)."""
    from .quantize import quantizer
    from .weights import check_finite_weights

    if note is None:
        fmt = "int8" if layout.config["weight_bits"] == 8 else "int4"
        report(
            f"quantising {layout.quantized} weights to {fmt} (group {layout.group}) as read"
            if layout.quantized
            else f"the weights are quantised already ({fmt}, group {layout.group})"
        )
    elif note:
        report(note)
    kept = {k: v for k, v in shapes.items() if k not in layout.sources}
    shapes = {k: kept.get(k, v) for k, v in layout.shapes.items()}

    def check(name: str, t: torch.Tensor) -> None:
        if check_finite:
            check_finite_weights({name: t})

    return shapes, {**cfg, **layout.config}, quantizer(layout, check)


def _dtype_name(dtype: torch.dtype) -> str:
    for name, dt in DTYPES.items():
        if dt == dtype:
            return name
    raise _error(
        "E0723",
        f"weights of dtype {dtype} are not supported",
        help="convert them to one of " + ", ".join(DTYPES),
    )


def _progress(progress: Callable[[str], None] | bool) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda msg: print(f"linnet: {msg}", file=sys.stderr, flush=True)
    return lambda msg: None
