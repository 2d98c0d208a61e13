"""`load_function`, `load_source`, `load`: running a Linnet model's entries on JAX.

Each entry, lowered for its inputs' shapes, becomes generated JAX source
(:func:`linnet.lang.emit.jax.emit_jax`) imported from a content-hashed file under
$LINNET_HOME/generated; its entry function is pure, ``f(*inputs, params, states) ->
(outputs, new_states)``, and is run under ``jax.jit`` with the states donated, so that the
KV cache is updated in place on the device.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from linnet.lang import Graph, Program
from linnet.lang.compiler import Compiled, compile_entry
from linnet.lang.emit.jax import emit_jax
from linnet.lang.host.inputs import bind_inputs, check_count
from linnet.lang.host.inputs import error as _error
from linnet.lang.host.loading import (
    check_dtype_config,
    check_finite_flag,
    check_weights_type,
    entry_method,
    load_program,
    read_config,
    read_headers,
)
from linnet.lang.host.options import check_seed
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
    FLOATS,
    NUMERICS,  # noqa: F401  (users name linnet.jax.model.NUMERICS)
    CompileOptions,
)
from linnet.lang.text.model import TextModel, given_tokenizer
from linnet.lang.weights.demo import parameter_types
from linnet.lang.weights.generation import StopTokens, checkpoint_stop_tokens
from linnet.lang.weights.gguf import GGUFCheckpoint

from .home import import_source
from .inputs import check_inputs, is_array, type_error
from .lowering import compiler_options, matmul_precision
from .weights import check_finite_weights, load_checkpoint, numpy_dtype


def resolve_device(device: Any) -> Any:
    """``device=`` as a jax device: None (jax's default), a jax device, ``"cpu"``, ``"gpu"``
    (or ``"cuda"``), or ``"gpu:N"`` / ``"cuda:N"``; the PyTorch runtime's codes otherwise
    (E0710 not a device, E0711 none of that kind here, E0712 no such index).

    >>> resolve_device("cpu").platform
    'cpu'
    """
    import jax

    if device is None or isinstance(device, jax.Device):
        return device if device is not None else jax.devices()[0]
    if not isinstance(device, str):
        raise _error(
            "E0710",
            f"`{device!r}` is not a device",
            help="use 'cpu', 'gpu', 'gpu:N' or a jax.Device",
        )
    kind, _, index = device.partition(":")
    platform = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu"}.get(kind)
    if platform is None or (index and not index.isdigit()):
        raise _error(
            "E0710", f"`{device}` is not a device", help="use 'cpu', 'gpu', 'gpu:N' or a jax.Device"
        )
    try:
        found = jax.devices(platform)
    except RuntimeError:
        found = []
    if not found:
        raise _error(
            "E0711",
            f"device `{device}` was asked for, but jax finds no {platform} here",
            help="load with device='cpu', or install jax's CUDA plugin "
            "(`pip install jax[cuda13]`) on a machine with an NVIDIA GPU",
        )
    n = int(index or 0)
    if n >= len(found):
        raise _error(
            "E0712",
            f"device `{device}` does not exist: jax sees {len(found)} {platform} device(s)",
            help="pick another index",
        )
    return found[n]


def _check_weights_type(weights: Any) -> None:
    check_weights_type(weights, is_array, "arrays")


def float_name(dtype: Any) -> str | None:
    """A NumPy or jax float dtype's Linnet name (``jnp.bfloat16``, ``"float32"``), None for
    anything else: what :meth:`CompileOptions.parse` takes to check ``dtype=`` (E0742).

    >>> float_name(np.float32), float_name(np.int32), float_name("float16")
    ('f32', None, 'f16')
    """
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return None
    return {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(name)


def compile_options_of(numerics: Any, device: Any = None, dtype: Any = None) -> CompileOptions:
    """``numerics=``, ``device=`` and ``dtype=`` checked once (E0713, E0710, E0742): a Linnet
    name or a NumPy/jax dtype for ``dtype``; a ``jax.Device`` is :func:`resolve_device`'s.

    >>> compile_options_of("fast", "gpu:0", "bf16")
    CompileOptions(numerics=<Numerics.FAST: 'fast'>, device='gpu:0', dtype='bf16')
    """
    return CompileOptions.parse(
        numerics,
        device if isinstance(device, str) else None,
        dtype,
        dtype_name=float_name,
        dtype_example="jnp.bfloat16",
    )


def resolve_dtype(dtype: Any) -> str | None:
    """``dtype=`` as a Linnet floating-point dtype name: a name (``"bf16"``) or a NumPy/jax
    dtype (``jnp.bfloat16``); E0742 otherwise (:func:`linnet.lang.pipeline.check_dtype`).

    >>> resolve_dtype("bf16"), resolve_dtype(np.float32)
    ('bf16', 'f32')
    """
    return compile_options_of("exact", None, dtype).dtype


def _dtype_name(dtype: Any) -> str:
    name = np.dtype(dtype).name
    table = {
        "float64": "f64",
        "float32": "f32",
        "float16": "f16",
        "bfloat16": "bf16",
        "int64": "i64",
        "int32": "i32",
        "int16": "i16",
        "int8": "i8",
        "uint8": "u8",
        "bool": "bool",
    }
    if name not in table:
        raise _error(
            "E0723",
            f"weights of dtype {name} are not supported",
            help="convert them to one of " + ", ".join(table.values()),
        )
    return table[name]


@dataclass
class Prepared:
    """What every loader shares: the checked program, its config, the weights' shapes and
    (when loaded) the parameters on the device."""

    program: Program
    path: Path
    config: dict[str, Any]
    weight_shapes: dict[str, tuple] | None
    params: dict[str, Any] = field(default_factory=dict)
    device: Any = None
    # The checkpoint's end-of-sequence tokens (linnet.lang.weights.generation).
    stops: StopTokens = field(default_factory=StopTokens)


def prepare(
    path: str | Path | None,
    weights: Any,
    config: Any,
    options: CompileOptions,
    device: Any,
    read: bool = True,
    check_finite: bool = True,
    check_grads: bool = False,
    quantize: Any = None,
    kv_pages: int | None = None,
    kv_page_size: int | None = None,
) -> Prepared:
    """Check the model, read its config and the checkpoint's headers (the weights converted
    to ``options.dtype``); with ``read``, load the parameters onto ``device`` and
    (``check_finite``) check they hold no NaN (E0666); with ``check_grads``, check every
    grad clause first (:mod:`linnet.jax.grad_checks`); ``quantize``, ``kv_pages`` and
    ``kv_page_size`` as for :func:`load`."""
    quant = parse_quantize(quantize)  # E0681 before anything is read
    _check_weights_type(weights)
    check_finite_flag(check_finite)
    if not isinstance(check_grads, bool):
        raise _error(
            "E0541",
            f"check_grads must be True or False, not {check_grads!r}",
            help="load(..., check_grads=True) checks every grad clause against its op's body first",
        )
    convert = options.dtype
    dev = resolve_device(device) if read else None
    program, model_path = load_program(model_for_weights(weights) if path is None else path)
    if check_grads:
        from .grad_checks import assert_grad_clauses

        # The torch runtime's quick look (linnet.torch.model.LOAD_CHECK_*): 2 cases a clause.
        assert_grad_clauses(program, unchecked="warn", count=2, max_size=12)
    cfg = read_config(config, model_path)
    cfg = {**cfg, **paged_config(program, kv_pages, kv_page_size, cfg)}  # E0688, E0689
    check_dtype_config(program, cfg, convert)
    params: dict[str, Any] = {}
    shapes: dict[str, tuple] | None = None
    stops = StopTokens()
    layout: Layout | None = None
    repack: dict[str, tuple[str, ...]] = {}
    if isinstance(weights, dict):
        from linnet.lang.weights.stacked import stack_tensors

        import jax

        # A mixture of experts' per-expert tensors are its stacked parameters.
        weights = stack_tensors(weights, np.stack)
        shapes = {}
        for k, v in weights.items():
            name = _dtype_name(v.dtype)
            if convert is not None and name in FLOATS:
                v, name = v.astype(numpy_dtype(convert)), convert
            shapes[k] = (tuple(v.shape), name)
            if read:
                params[k] = jax.device_put(v, dev)
        cfg = {**stored_quantization(shapes), **cfg}  # a quantised model's params reload
        if isinstance(quant, Quantize):
            layout = quantized_layout(program, cfg, shapes, quant)
    elif weights is not None:
        ckpt, shapes, cfg = read_headers(weights, program, model_path, cfg, convert)
        stops = checkpoint_stop_tokens(ckpt)  # E0798 before any tensor is read
        if isinstance(ckpt, GGUFCheckpoint):
            # Kept by default only on a GPU (as the torch runtime on CUDA).
            import jax

            keep = (dev.platform if dev is not None else jax.default_backend()) == "gpu"
            layout, repack, _ = gguf_layout(program, cfg, shapes, ckpt, quant, keep)
        elif isinstance(quant, Quantize):
            layout = quantized_layout(program, cfg, shapes, quant)
        if read:
            params = load_checkpoint(ckpt, dev, convert, check_finite, repack)
    if isinstance(weights, dict) and read and check_finite:
        check_finite_weights(weights)
    if layout is not None and shapes is not None:
        shapes, cfg, params = _quantized(layout, shapes, cfg, params, repack, dev)
    return Prepared(program, model_path, cfg, shapes, params, dev, stops)


def _quantized(
    layout: Layout,
    shapes: dict[str, Any],
    cfg: dict[str, Any],
    params: dict[str, Any],
    repack: dict[str, tuple[str, ...]],
    dev: Any,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The quantised model's shapes, config and parameters: each float weight ``layout``
    quantises, quantised on the host and put back on ``dev`` (a GGUF file's kept weights
    were repacked as they were read)."""
    import jax

    from .quantize import quantizer

    step = quantizer(layout)
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name in layout.sources and name not in repack:
            for k, v in step(name, np.asarray(value)).items():
                out[k] = jax.device_put(v, dev)
        else:
            out[name] = value
    kept = {k: v for k, v in shapes.items() if k not in layout.sources}
    shapes = {k: kept.get(k, v) for k, v in layout.shapes.items()}
    return shapes, {**cfg, **layout.config}, out


def _entry_params(program: Program, entry: str) -> list[str]:
    return [p.name for p in entry_method(program, entry).params]


def _sources(program: Program) -> dict[str, str]:
    return {m.source.name: m.source.text for m in program.modules.values()}


def _shape_of(value: Any) -> list[int]:
    return list(np.shape(value))


def load_source(
    path: str | Path,
    entry: str,
    shapes: dict[str, Sequence[int]],
    weights: Any = None,
    config: Any = None,
    numerics: str = "exact",
    fast: bool = True,
) -> ModuleType:
    """The generated JAX module for ``entry`` with inputs of ``shapes`` (by input name),
    imported from a content-hashed file under $LINNET_HOME/generated (``module.__file__``).

    ``weights`` (read for their shapes only) and ``config`` are as for :func:`load`. The
    module's function named like the entry is pure: ``f(*inputs, params, states) ->
    (outputs, new_states)``; ``module.ENTRIES`` describes its slices.

    >>> m = load_source("examples/llama/llama.linnet", "decode", {"token": [1], "pos": [1]},
    ...                 config="toy")                                   # doctest: +SKIP
    >>> m.decode.__doc__                                                # doctest: +SKIP
    'Entry Llama.decode(token i32[1], pos i32[1]) -> (f32[1, 256]), and the new states.'
    """
    options = compile_options_of(numerics)
    prep = prepare(path, weights, config, options, None, read=False)
    _entry_params(prep.program, entry)
    compiled = _compile(prep, entry, {k: list(v) for k, v in shapes.items()}, options)
    return _module(prep.program, compiled, options, fast)


def _compile(
    prep: Prepared, entry: str, shapes: dict[str, list[int]], options: CompileOptions
) -> Compiled:
    """``entry`` compiled for these shapes as the JAX runtime runs it: each call's grad
    clause recorded where the program has one (a Pallas kernel's backward under jax.grad),
    the inputs' static bounds checked (E0782), kernel instances recorded under "fast"."""
    return compile_entry(
        prep.program,
        entry,
        shapes,
        prep.config,
        prep.weight_shapes,
        options,
        check=False,
        clauses=True,
        check_bounds=True,
    )


def _module(
    program: Program, compiled: Compiled, options: CompileOptions, fast: bool
) -> ModuleType:
    graph = compiled.graph
    text = emit_jax(
        compiled.emitted,
        _sources(program),
        numerics=options.numerics,
        fast=fast,
        origin=program.root.source.name,
        clauses=compiled.clauses,
    )
    return import_source(text, f"linnet_jax_{graph.model.lower()}_{graph.entry}")


def check_x64(graph: Graph) -> None:
    """E0791 where the graph has 64-bit values and jax runs in 32 bits (its default): jax
    would silently compute them in i32/f32."""
    import jax

    wide = sorted(
        {
            vt.dtype
            for vt in [*graph.values.values(), *graph.parameters.values(), *graph.states.values()]
            if vt.dtype in ("i64", "f64")
        }
    )
    if wide and not jax.config.read("jax_enable_x64"):
        raise _error(
            "E0791",
            f"`{graph.entry}` computes in {' and '.join(wide)}, but jax runs "
            "in 32 bits here: it would silently compute those values in i32/f32",
            help="enable 64-bit jax before loading: "
            "jax.config.update('jax_enable_x64', True) (or JAX_ENABLE_X64=1)",
        )


def _entry_function(module: ModuleType, entry: str) -> Callable:
    return getattr(module, module.ENTRIES[entry].get("function", entry))


@dataclass
class Lowered:
    """One entry lowered for one set of input shapes: its graph, module and jitted function."""

    graph: Graph
    module: ModuleType
    jitted: Callable
    # The same without compiler options, for a call traced by an outer transformation (a
    # caller's jax.jit, grad, scan), where jax takes options only from the outermost jit.
    nested: Callable | None = None

    @property
    def path(self) -> str:
        return self.module.__file__ or ""

    @property
    def function(self) -> Callable:
        """The generated entry function, not jitted: ``f(*inputs, params, states) ->
        (outputs, new_states)`` (for a caller's own ``jax.jit``, as generate's step; pass it
        ``compiler_options=linnet.jax.lowering.compiler_options(numerics)`` to keep every
        16-bit rounding, as the Function's own jit does)."""
        return _entry_function(self.module, self.graph.entry)


class Function:
    """An entry of a model as a pure function ``f(params, states, inputs) -> (outputs,
    new_states)``, jitted with ``states`` donated (see :func:`load_function`).

    ``inputs`` is a list (or tuple) of arrays in the entry's order, or a dict by the entry's
    parameter names. Each distinct input shape is lowered, generated and jitted once.
    ``params`` holds the loaded weights; :meth:`new_states` makes zeroed states.
    """

    def __init__(
        self, prep: Prepared, entry: str, options: CompileOptions, fast: bool, check: bool
    ):
        self.entry = entry
        self.params = prep.params
        self.device = prep.device
        self.options = options
        self.numerics = options.numerics
        # The checkpoint's end-of-sequence tokens (generation_config.json's, else
        # config.json's eos_token_id, as transformers reads them): where generation stops
        # by default, as linnet.torch's Model.generate does.
        self.stop_tokens: tuple[int, ...] = prep.stops.tokens
        self.stop_tokens_source = prep.stops.source
        self._prep = prep
        self._fast = fast
        self._check = check
        self._names = _entry_params(prep.program, entry)
        self._lowered: dict[tuple, Lowered] = {}

    def _ordered(self, inputs: Any) -> list[Any]:
        if isinstance(inputs, dict):
            return bind_inputs(self.entry, self._names, [], inputs)
        check_count(self.entry, self._names, inputs, "array")
        return list(inputs)

    def lowered(self, inputs: Any) -> Lowered:
        """The graph, generated module and jitted function for inputs shaped like these."""
        given = self._ordered(inputs)
        for name, t in zip(self._names, given):
            if not is_array(t):
                raise type_error(self.entry, "%" + name, t, None)
        key = tuple((tuple(np.shape(t)), np.dtype(t.dtype).name) for t in given)
        found = self._lowered.get(key)
        if found is not None:
            return found
        import jax

        shapes = {p: _shape_of(t) for p, t in zip(self._names, given)}
        compiled = _compile(self._prep, self.entry, shapes, self.options)
        graph = compiled.graph
        check_x64(graph)
        module = _module(self._prep.program, compiled, self.options, self._fast)
        fn = _entry_function(module, self.entry)

        def pure(params: dict, states: dict, inputs: tuple) -> tuple:
            outs, new = fn(*inputs, params, states)
            return outs, new

        pure.__name__ = pure.__qualname__ = fn.__name__
        options = compiler_options(self.numerics)  # exact: every bf16 rounding kept
        found = Lowered(
            graph,
            module,
            jax.jit(pure, donate_argnums=(1,), compiler_options=options),
            jax.jit(pure, donate_argnums=(1,)),
        )
        self._lowered[key] = found
        return found

    def new_states(self, inputs: Any) -> dict[str, Any]:
        """Zeroed states for inputs shaped like ``inputs``, on the model's device."""
        import jax
        import jax.numpy as jnp

        graph = self.lowered(inputs).graph
        return {
            path: jax.device_put(jnp.zeros(vt.shape, numpy_dtype(vt.dtype)), self.device)
            for path, vt in graph.states.items()
        }

    def source(self, inputs: Any) -> str:
        """The path of the generated source file for inputs shaped like ``inputs``."""
        return self.lowered(inputs).path

    def __call__(self, params: dict[str, Any], states: dict[str, Any], inputs: Any) -> tuple:
        """``(outputs, new_states)``: a tuple of the entry's outputs and the states after
        the call. ``states`` is donated: its arrays are invalid afterwards (use the new
        ones)."""
        given = self._ordered(inputs)
        low = self.lowered(given)
        if self._check:
            check_inputs(low.graph, given, self.entry)
        for path, vt in low.graph.states.items():
            have = states.get(path) if isinstance(states, dict) else None
            if have is None or tuple(np.shape(have)) != vt.shape:
                raise _error(
                    "E0731",
                    f"the state `{path}` is "
                    f"{None if have is None else list(np.shape(have))}, this call "
                    f"needs {list(vt.shape)}",
                    help="make states for these inputs: fn.new_states(inputs)",
                )
        with matmul_precision(self.numerics), warnings.catch_warnings():
            # jax's CPU backend cannot reuse donated buffers and says so once per compile.
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            jitted = low.nested if _traced(params, states, given) else low.jitted
            assert jitted is not None
            return jitted(params, states, tuple(given))


def _traced(*trees: Any) -> bool:
    """Whether any array in ``trees`` is being traced (by a caller's jit, grad, vmap or scan):
    then jax refuses a jit with compiler options inside, and the caller's jit decides them."""
    import jax

    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(trees))


def load_function(
    path: str | Path,
    entry: str,
    weights: Any = None,
    config: Any = None,
    device: Any = None,
    dtype: Any = None,
    numerics: str = "exact",
    fast: bool = True,
    check: bool = True,
    check_finite: bool = True,
    check_grads: bool = False,
) -> Function:
    """Load ``entry`` of a `.linnet` model as a jitted pure function of ``(params, states,
    inputs)`` returning ``(outputs, new_states)``, states donated (updated in place on the
    device). Its ``params`` attribute holds the loaded weights and ``new_states(inputs)``
    makes zeroed states.

    ``path``, ``weights``, ``config``, ``device``, ``dtype`` and ``numerics`` are as for
    :func:`load` (``path`` may name a shipped model: ``std.models.gemma``);
    ``fast=False`` runs std ops' bodies instead of fused JAX calls; ``check=False`` skips
    the input range checks (one small host copy per index input and call);
    ``check_finite=False`` skips the load-time NaN check of the weights (E0666);
    ``check_grads=True`` checks every grad clause first, as :func:`load` does.

    >>> prefill = load_function("examples/llama/llama.linnet", "prefill",
    ...                         weights="model.safetensors", config="toy")   # doctest: +SKIP
    >>> tokens = jnp.asarray([[1, 2, 3]], dtype=jnp.int32)                   # doctest: +SKIP
    >>> (logits,), states = prefill(prefill.params, prefill.new_states([tokens]), [tokens])
    ...                                                                       # doctest: +SKIP
    """
    options = compile_options_of(numerics, device, dtype)  # E0713, E0710, E0742, once
    prep = prepare(
        path, weights, config, options, device, check_finite=check_finite, check_grads=check_grads
    )
    return Function(prep, entry, options, fast, check)


class Model(TextModel):
    """A loaded Linnet model on JAX: its parameters on a device, its states, and its entries
    as methods, mirroring ``linnet.torch.load``'s model.

    ``model.decode(token, pos)`` or ``model.decode(token=token, pos=pos)`` runs the entry
    with the model's own states (the KV cache), replaced by the new ones after each call,
    and returns its result (an array, or a tuple for several). Inputs are jax or NumPy
    arrays of the declared dtype; index inputs are range-checked (E0780).

    >>> model = load("examples/llama/llama.linnet", config="toy",
    ...              weights="toy.safetensors")                          # doctest: +SKIP
    >>> model.decode(jnp.asarray([1], jnp.int32), jnp.asarray([0], jnp.int32)).shape
    ...                                                                   # doctest: +SKIP
    (1, 256)
    """

    def __init__(self, prep: Prepared, options: CompileOptions, fast: bool):
        from linnet.lang.check.driver import find_model

        self.program = prep.program
        self.params = prep.params
        self.config = dict(prep.config)
        self.device = prep.device
        self.options = options
        self.numerics = options.numerics
        # The checkpoint's end-of-sequence tokens (generation_config.json's, else
        # config.json's eos_token_id, as transformers reads them): where generation stops
        # by default, as linnet.torch's Model.generate does.
        self.stop_tokens: tuple[int, ...] = prep.stops.tokens
        self.stop_tokens_source = prep.stops.source
        self._prep = prep
        self._fast = fast
        self._functions: dict[str, Function] = {}
        # generate's jitted steps, made once per batch shape and way of picking
        # (linnet.jax.generate): later calls reuse them, never tracing again.
        self._generation: dict[tuple, Callable] = {}
        self.states: dict[str, Any] = {}
        self.entries = [m.name for m in find_model(self.program, None).methods if m.kind == "entry"]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.__dict__.get("entries", []):
            raise AttributeError(name)

        def entry(*inputs: Any, **named: Any) -> Any:
            if named:
                return self.run(
                    name, bind_inputs(name, _entry_params(self.program, name), inputs, named)
                )
            return self.run(name, list(inputs))

        entry.__name__ = entry.__qualname__ = name
        return entry

    def __dir__(self) -> list[str]:
        return list(super().__dir__()) + list(self.entries)

    def function(self, entry: str) -> Function:
        """``entry`` as a :class:`Function` sharing this model's parameters."""
        if entry not in self._functions:
            self._functions[entry] = Function(self._prep, entry, self.options, self._fast, True)
        return self._functions[entry]

    def reset(self) -> None:
        """Forget the states (the next call starts from zeroed ones)."""
        self.states = {}

    def run(self, entry: str, inputs: Sequence[Any] | dict[str, Any]) -> Any:
        """Run ``entry`` on ``inputs`` (a list in the entry's order, or a dict by name) with
        the model's states; returns its result.

        >>> model.run("decode", {"token": token, "pos": pos})     # doctest: +SKIP
        """
        fn = self.function(entry)
        low = fn.lowered(inputs)
        need = low.graph.states
        if any(
            p not in self.states or tuple(self.states[p].shape) != vt.shape
            for p, vt in need.items()
        ):
            fresh = fn.new_states(inputs)
            self.states = {
                **self.states,
                **{
                    p: fresh[p]
                    for p in need
                    if p not in self.states or self.states[p].shape != fresh[p].shape
                },
            }
        mine = {p: self.states[p] for p in need}
        outs, new = fn(self.params, mine, inputs)
        self.states = {**self.states, **new}
        return outs[0] if len(outs) == 1 else tuple(outs)

    def generate(self, prompts: Any, max_new_tokens: int = 16, **options: Any) -> Any:
        """Generate tokens after each prompt on ``prefill`` and ``decode``: greedy by
        default; ``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop_tokens`` and
        ``on_token`` as :func:`linnet.jax.generate.generate` says (docs/jax.md,
        "Generating"): the torch runtime's ``generate``, sampling with ``jax.random`` on the
        device. Text prompts (a string, chat messages, or a list of either) give text, as
        in the torch runtime (:func:`linnet.lang.text.generation.generate_text`).

        >>> model.generate([[1, 2, 3], [4, 5]], max_new_tokens=8)          # doctest: +SKIP
        [[17, 9, 9, 30, 2, 88, 7, 7], [5, 5, 211, 2, 40, 40, 9, 1]]
        """
        from .generate import check_options

        check_options(options)  # E0794, not a TypeError, for an option generate lacks
        return self._generate(prompts, max_new_tokens, options)

    def _token_generate(self) -> Callable[..., list[list[int]]]:
        from .generate import generate

        return generate

    def _int32_zeros(self, n: int) -> Any:
        return np.zeros(n, np.int32)

    def source(self, entry: str, inputs: Any) -> str:
        """The path of the generated source file for ``entry`` with these inputs."""
        return self.function(entry).source(inputs)

    def graph(self, entry: str, inputs: Any) -> Graph:
        """The graph of ``entry`` for inputs shaped like ``inputs``."""
        return self.function(entry).lowered(inputs).graph

    # ------------------------------------------------------------ export
    def export_onnx(
        self,
        entry: str,
        inputs: Any,
        path: str | Path,
        check: bool = True,
        external_threshold: int | None = None,
        dynamic: str | list[str] | None = None,
    ) -> list[Path]:
        """Write ``entry``, lowered for inputs shaped like ``inputs``, as an ONNX model at
        ``path``, as ``linnet.torch``'s ``model.export_onnx`` does: the entry's inputs then
        its states as graph inputs, its outputs then each state after the call
        (``<path>.next``) as outputs, this model's weights as initializers (in
        ``path.data`` above ``external_threshold`` bytes, 1 GiB). Checked with
        ``onnx.checker`` unless ``check=False``. Needs ``linnet-lang[onnx]``. Returns the
        files written; see docs/export.md.

        ``dynamic``: the dims to make symbolic (``["B", "L"]`` or ``"B,L"``; their inputs,
        states and outputs get ONNX ``dim_param`` names and the model runs at any size of
        them); left out, B and L where the graph allows; ``"none"``: every dim concrete.
        A named dim that cannot be symbolic is E0935-E0938.

        >>> model.export_onnx("decode", [token, pos], "decode.onnx")      # doctest: +SKIP
        [PosixPath('decode.onnx')]
        """
        from .export import export_onnx

        return export_onnx(self, entry, inputs, path, check, external_threshold, dynamic)

    def export_stablehlo(
        self, entry: str, inputs: Any, path: str | Path, verify: bool = False
    ) -> list[str]:
        """Write ``entry``, lowered for inputs shaped like ``inputs``, as StableHLO MLIR text
        at ``path``; ``verify=True`` parses and verifies it with jaxlib first. Returns the
        names of ``@main``'s arguments in order: the inputs, the states, then the parameters
        (pass ``model.params[name]`` for those).

        >>> order = model.export_stablehlo("prefill", [tokens], "prefill.mlir")  # doctest: +SKIP
        """
        from .export import export_stablehlo

        return export_stablehlo(self, entry, inputs, path, verify)


def load(
    path: str | Path | None = None,
    weights: Any = None,
    device: Any = None,
    numerics: str = "exact",
    config: Any = None,
    dtype: Any = None,
    fast: bool = True,
    check_finite: bool = True,
    check_grads: bool = False,
    tokenizer: Any = None,
    quantize: Any = None,
    kv_pages: int | None = None,
    kv_page_size: int | None = None,
) -> Model:
    """Load a `.linnet` model with safetensors weights onto a jax device.

    ``path`` is a model file, or a model the linnet-lang wheel ships by its module name
    (``std.models.llama``, ``std.models.qwen2``, ``std.models.mistral``, ``std.models.gemma``,
    ``std.models.phi3``, ``std.models.gpt2``: docs/models.md); an unknown one is E0211.

    ``weights`` is a safetensors file, a checkpoint directory (its
    ``model.safetensors.index.json``, else every ``*.safetensors`` in it; a Hugging Face
    ``config.json`` beside them gives the config), an index file, a list of files, or a
    dict of arrays, or a GGUF file (its metadata gives the config, its tensors are
    dequantised to the model's float type; without ``path`` the shipped model is picked from
    its architecture, ``load(weights="x.gguf")``, as from a checkpoint's config.json); the
    checkpoint's end-of-sequence tokens (``generation_config.json``'s
    ``eos_token_id``, else ``config.json``'s) become ``model.stop_tokens``, as in
    ``linnet.torch.load``. Headers are validated first (the PyTorch runtime's codes), then each
    shard is memory-mapped and read tensor by tensor to the device. ``config`` (a dict, a
    JSON file, or a name in the model's configs/ folder) gives the rest; ``dtype``
    (``"bf16"``) converts floating-point weights. ``device``: None (jax's default), ``"cpu"``,
    ``"gpu"``, ``"gpu:N"`` or a jax device. ``numerics``: ``"exact"`` (every product at
    ``Precision.HIGHEST``) or ``"fast"`` (the backend's default precision; accumulation
    dtypes stay the model's). Every floating-point weight is checked for NaN and infinite
    values once, on the host as it is read (one sum, or for 16-bit floats one test of the
    exponent bits, per tensor: no compilation); one is E0666, naming the tensor and its
    first bad value; ``check_finite=False`` skips the check. ``check_grads=True`` first checks every `grad` clause of the
    model's ops against ``jax.vjp`` of the op's body (as `linnet grads --runtime jax`, in f64
    with x64 enabled, else f32): a Pallas kernel's backward under ``jax.grad`` is its op's
    clause, so a wrong one is a coded error (E0537-E0539) here, not a wrong gradient later.
    ``tokenizer``: ``model.tokenizer``, for text prompts, as in ``linnet.torch.load``
    (left out: the one beside the weights; ``False``: none). ``quantize``: ``"int8"``,
    ``"int4"`` or ``{"format": ..., "group": ...}`` quantises the linear weights as they
    load, as in ``linnet.torch.load`` (on the host, in NumPy); on a GPU a GGUF file's Q8_0,
    Q4_0 and Q4_1 linear weights are kept as they are unless ``quantize=False``, on the
    CPU only when a format is asked for (``quantize="int4"`` keeps Q4_0/Q4_1 blocks).
    ``kv_pages=NP`` (``kv_page_size=PS``, default 16): a paged KV cache read and written by
    the entries ``decode_paged`` and ``prefill_paged``, as in ``linnet.torch.load``
    (docs/models.md, "Serving: a paged KV cache").

    >>> model = load("examples/llama/llama.linnet", weights="Llama-3.2-1B/", dtype="bf16",
    ...              device="gpu")                                       # doctest: +SKIP
    >>> qwen = load("std.models.qwen2", weights="Qwen2.5-0.5B/")         # doctest: +SKIP
    >>> logits = model.prefill(jnp.asarray([[1, 2, 3]], jnp.int32))       # doctest: +SKIP
    """
    options = compile_options_of(numerics, device, dtype)  # E0713, E0710, E0742, once
    tokenizer = given_tokenizer(tokenizer)  # E0842/E0849 before the weights are read
    model = Model(
        prepare(
            path,
            weights,
            config,
            options,
            device,
            check_finite=check_finite,
            check_grads=check_grads,
            quantize=quantize,
            kv_pages=kv_pages,
            kv_page_size=kv_page_size,
        ),
        options,
        fast,
    )
    model.attach_tokenizer(tokenizer, weights)
    return model


def random_weights(
    model_path: str | Path,
    config: dict[str, Any],
    seed: int = 0,
    dtype: str | None = None,
    scale: float = 0.02,
) -> dict[str, np.ndarray]:
    """Deterministic random parameters (NumPy) for a model and config; norm weights are ones.

    >>> w = random_weights("examples/llama/llama.linnet", {"V": 16, "D": 8, "F": 16,
    ...     "NL": 1, "H": 2, "KV": 1, "HD": 4, "S": 8, "T": "f32"})
    >>> w["model.norm.weight"].tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    check_seed(seed, optional=False)  # E0815, not NumPy's ValueError for -1
    rng = np.random.default_rng(seed)
    out = {}
    for path, vt, ones in parameter_types(model_path, config):
        if vt.dtype in ("i8", "u8"):  # quantised levels (weight_bits 8 or 4): any byte
            low, high = (-127, 128) if vt.dtype == "i8" else (0, 256)
            out[path] = rng.integers(low, high, vt.shape).astype(numpy_dtype(vt.dtype))
            continue
        # A quantised weight's f16 scales stay f16 whatever dtype= asks of the rest.
        dt = numpy_dtype(vt.dtype if vt.dtype == "f16" and dtype else dtype or vt.dtype)
        if ones:
            out[path] = np.ones(vt.shape, dtype=dt)
        else:
            out[path] = (rng.standard_normal(vt.shape, dtype=np.float32) * scale).astype(dt)
    return out
