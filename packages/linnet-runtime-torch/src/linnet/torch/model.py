"""`load`, models, contexts: running a Linnet model's entries on PyTorch."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from linnet.lang import Graph, Program
from linnet.lang.compiler import compile_entry
from linnet.lang.emit.torch import emit_torch
from linnet.lang.host.generate import COARSE, FINE, Ladder
from linnet.lang.host.inputs import bind_inputs, check_count, dtype_error, short
from linnet.lang.host.inputs import error as _error
from linnet.lang.host.loading import (
    entry_method,
)
from linnet.lang.host.options import check_seed
from linnet.lang.pipeline import (
    NUMERICS,  # noqa: F401  (users name linnet.torch.model.NUMERICS)
    SHARD,
    CompileOptions,
    Stage,
)
from linnet.lang.text.model import TextModel
from linnet.lang.weights.demo import parameter_types
from linnet.lang.weights.generation import StopTokens

import torch
from torch._subclasses.fake_tensor import is_fake

from .context import Context
from .home import import_source
from .inputs import check_inputs
from .interpreter import DTYPES, index_error, run_graph

# Re-exported: `linnet.torch.model.compile_options` is how tests and users name them.
from .options import (  # noqa: F401
    COMPILE_MODES,
    announce_compile,
    compile_label,
    compile_options,
    numerics_mode,
)
from .parallel import rank_errors


def resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise _error(
            "E0710", f"`{device}` is not a device: {exc}", help="use 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise _error(
            "E0711",
            f"device `{device}` was asked for, but CUDA is not available here",
            help="load with device='cpu', or run on a machine with an NVIDIA GPU and a "
            "CUDA build of torch",
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise _error(
            "E0712",
            f"device `{device}` does not exist: this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)",
            help="pick another index",
        )
    if dev.type not in ("cpu", "cuda", "meta"):
        # A name torch parses but cannot use here (`xla` without torch_xla, `mps` off a Mac):
        # found now, not as a misleading error from the first tensor made there.
        try:
            torch.empty(0, device=dev)
        except (RuntimeError, AssertionError) as exc:
            text = str(exc).strip() or type(exc).__name__
            first = text.splitlines()[0].split(". ")[0]  # torch's first sentence, not its list
            raise _error(
                "E0711",
                f"device `{device}` was asked for, but this torch cannot use it here: {first}",
                help="use 'cpu', or 'cuda' on a machine with an NVIDIA GPU",
            ) from None
    return dev


@dataclass
class Lowered:
    graph: Graph
    module: ModuleType | None = None
    path: str = ""
    # The entry's function where the model runs its own (compiled slices); else the module's.
    function: Callable | None = None


class Model(TextModel):
    """A loaded Linnet model: its parameters on a device and its entries as methods.

    Entries are called with tensors, by position or by the entry's parameter names:
    ``model.decode(token, pos)`` or ``model.decode(token=token, pos=pos)``. Nothing is
    converted: a Python int, a list or a NumPy array is error E0721, a wrong dtype E0722.
    Inputs used as indices are range-checked before anything runs (a token id outside the
    vocabulary, a position outside the KV cache: E0780; a prompt longer than the cache:
    E0782; see docs/torch.md, "Inputs"). Each distinct input shape is lowered once; its
    generated source is imported from a file under $LINNET_HOME/generated.

    Entries run under ``torch.inference_mode()`` unless the model was loaded with
    ``grad=True`` (or :meth:`requires_grad_` turned gradients on): then floating-point
    parameters require grad, entries run in the caller's grad mode, and
    ``loss.backward()`` fills ``model.params[...].grad`` (docs/torch.md, "Gradients").

    >>> model = load("examples/llama/llama.linnet", config="toy")          # doctest: +SKIP
    >>> token, pos = torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    >>> model.decode(token=token, pos=pos).shape                            # doctest: +SKIP
    torch.Size([1, 256])
    """

    def __init__(
        self,
        program: Program,
        params: dict[str, torch.Tensor],
        config: dict[str, Any],
        device: torch.device,
        compile: bool | str | dict,
        options: CompileOptions,
        interpret: bool,
        weight_shapes: dict[str, tuple] | None,
        progress: Callable[[str], None] | None = None,
        grad: bool = False,
        world: int = 1,
        rank: int = 0,
        split: dict[str, int] | None = None,
        stops: StopTokens | None = None,
    ):
        self.program = program
        # The checkpoint's end-of-sequence tokens (generation_config.json's, else
        # config.json's eos_token_id): where generate stops unless given stop_tokens.
        stops = stops or StopTokens()
        self.stop_tokens: tuple[int, ...] = stops.tokens
        self.stop_tokens_source = stops.source
        # Tensor parallelism (linnet.torch.parallel): this process is rank `rank` of `world`;
        # `split` is each split parameter's axis (the params here are this rank's blocks).
        self.world, self.rank, self.split = world, rank, dict(split or {})
        self.params = params
        # Whether entries run with autograd (load(grad=True), requires_grad_): not `grad`,
        # which is the method computing gradients through the reverse pass (issue 18).
        self.autograd = False
        self.config = dict(config)
        self.device = device
        self.compile = compile
        # The compile options load checked once (numerics, this device's name, dtype);
        # `numerics` is theirs, named as before (plans and grad read model.numerics).
        self.options = options.on(str(device))
        self.numerics = self.options.numerics
        self.interpret = interpret
        self.weight_shapes = weight_shapes
        self.progress = progress or (lambda msg: None)
        self._lowered: dict[tuple, Lowered] = {}
        self._contexts: dict[tuple, Context] = {}
        # This model's compiled slice functions: (module name, function name) -> wrapper.
        self._compiled: dict[tuple[str, str], Callable] = {}
        self.entries = [m.name for m in self._model_decl().methods if m.kind == "entry"]
        if grad:
            self.requires_grad_(True)

    def requires_grad_(self, requires_grad: bool = True) -> Model:
        """Turn gradients on (or off) for this model, as ``nn.Module.requires_grad_`` does:
        floating-point parameters become leaves that require grad, and entries run in the
        caller's grad mode instead of ``torch.inference_mode()`` (so ``torch.no_grad()``
        around a call still turns them off). Off, entries run under inference mode again.
        Plans and ``Captured`` always run in inference mode. Returns the model.

        >>> model = load("examples/llama/llama.linnet", weights=w, config="toy")  # doctest: +SKIP
        >>> model.requires_grad_()                                                # doctest: +SKIP
        >>> model.prefill(tokens).logsumexp(-1).mean().backward()                 # doctest: +SKIP
        >>> model.params["lm_head.weight"].grad.shape                             # doctest: +SKIP
        torch.Size([256, 64])
        """
        if not isinstance(requires_grad, bool):
            raise _error(
                "E0769",
                f"grad must be True or False, not {requires_grad!r}",
                help="load(..., grad=True) or model.requires_grad_(True)",
            )
        for name, p in list(self.params.items()):
            if p.is_floating_point() and p.requires_grad != requires_grad:
                # A new leaf over the same memory: the caller's own tensors (weights given
                # as a dict) keep their flags.
                self.params[name] = p.detach().requires_grad_(requires_grad)
        self.autograd = requires_grad
        return self

    def _model_decl(self):
        from linnet.lang.check.driver import find_model

        return find_model(self.program, None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.__dict__.get("entries", []):
            raise AttributeError(name)

        def entry(*inputs: Any, context: Context | None = None, **named: Any) -> Any:
            return self.run(name, self._inputs(name, list(inputs), named), context=context)

        entry.__name__ = entry.__qualname__ = name
        return entry

    def _inputs(self, entry: str, given: list[Any], named: dict[str, Any]) -> list[Any]:
        """Positional inputs, then inputs by the entry's parameter names, in its order."""
        if not named:
            return given
        return bind_inputs(entry, [p.name for p in self._entry_method(entry).params], given, named)

    def _entry_method(self, entry: str) -> Any:
        cache = self.__dict__.setdefault("_methods", {})
        if entry in cache:
            return cache[entry]
        method = cache[entry] = entry_method(self.program, entry)
        return method

    def __dir__(self) -> list[str]:
        return list(super().__dir__()) + list(self.entries)

    # ------------------------------------------------------------ lowering
    def graph(self, entry: str, inputs: list[torch.Tensor]) -> Graph:
        """The graph of ``entry`` for inputs shaped like ``inputs``."""
        return self._lower(entry, inputs).graph

    def _lower(self, entry: str, inputs: Sequence[torch.Tensor]) -> Lowered:
        method = self._entry_method(entry)
        names = [p.name for p in method.params]
        check_count(
            entry, names, inputs, "tensor", example=f"model.run({entry!r}, [{', '.join(names)}])"
        )
        for p, t in zip(method.params, inputs):
            if not isinstance(t, torch.Tensor):
                raise _error(
                    "E0721",
                    f"input `{p.name}` of `{entry}` must be a torch.Tensor, "
                    f"got {type(t).__name__} {short(t)}",
                    help="wrap it: torch.tensor(..., dtype=torch.int32) for token ids "
                    "and positions (Python ints and lists are not converted: "
                    "their dtype and device would be guesses)",
                )
        key = (entry, tuple((tuple(t.shape), t.dtype) for t in inputs))
        if key in self._lowered:
            return self._lowered[key]
        shapes = {p.name: list(t.shape) for p, t in zip(method.params, inputs)}
        compiled = compile_entry(
            self.program,
            entry,
            shapes,
            self.config,
            self.weight_shapes,
            self.options,
            check=False,
            check_bounds=True,
            # This rank's graph of a tensor-parallel model (the pipeline's stage SHARD).
            stages=(Stage(SHARD, lambda g: self._shard(g, entry)),) if self.world > 1 else (),
            kernels=not self.interpret,
        )
        graph = compiled.graph
        for p, t, name in zip(method.params, inputs, graph.inputs):
            want = DTYPES[graph.values[name].dtype]
            if t.dtype != want:
                raise dtype_error(
                    entry,
                    p.name,
                    str(t.dtype),
                    graph.values[name].dtype,
                    f"{p.name}.to({want})",
                    why=False,
                )
        lowered = Lowered(graph)
        if not self.interpret:
            sources = {m.source.name: m.source.text for m in self.program.modules.values()}
            text = emit_torch(
                compiled.emitted,
                sources,
                numerics=self.numerics,
                origin=self.program.root.source.name,
                device=str(self.options.device),
            )
            module = import_source(text, f"linnet_{graph.model.lower()}_{entry}")
            lowered.module = module
            lowered.path = module.__file__ or ""
            if self.compile:
                lowered.function = self._compiled_entry(module, entry)
        self._lowered[key] = lowered
        return lowered

    def _shard(self, graph: Graph, entry: str) -> Graph:
        """This rank's graph of ``graph`` (linnet.lang.passes.shard); its inputs are checked as
        the whole graph's are (the same inputs reach every rank)."""
        from linnet.lang.passes.bounds import share_bounds
        from linnet.lang.passes.shard import shard

        from .parallel import check_layout

        sharded = shard(graph, self.world, self.rank)
        check_layout(sharded.parameters, self.split, entry)
        share_bounds(sharded.graph, graph)
        return sharded.graph

    def _single(self, what: str) -> None:
        if self.world > 1:
            raise _error(
                "E0823",
                f"{what} is not supported on a tensor-parallel model (world={self.world})",
                help="load the model without world= (one process) for this",
            )

    def _compiled_entry(self, module: ModuleType, entry: str) -> Callable:
        """The entry's function calling this model's torch.compile'd slices (each function
        compiled once). The module is shared by every model whose generated text is the same
        (one source, device and numerics: import_source imports by content), so it is never
        patched: the function is the module's entry code over its own globals, the module's
        names with the slices replaced. Another model of the source never runs this one's
        compiled slices, its compile options or its progress callback (issue 39 item 5)."""
        options = compile_options(self.compile) or {}
        names = dict(vars(module))
        for sl in module.ENTRIES[entry]["slices"]:
            name = sl["function"]
            key = (module.__name__, name)
            if key not in self._compiled:
                compiled = torch.compile(getattr(module, name), dynamic=False, **options)
                self._compiled[key] = self._announce(compiled, name, sl["kind"])
            names[name] = self._compiled[key]
        fn = getattr(module, module.ENTRIES[entry].get("function", entry))
        return types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__)

    def _announce(self, compiled: Callable, name: str, kind: str) -> Callable:
        return announce_compile(compiled, name, kind, self.progress)

    # ------------------------------------------------------------ running
    def new_context(
        self, entry: str | None = None, inputs: list[torch.Tensor] | None = None
    ) -> Context:
        """Fresh, zeroed states; shapes come from a lowered entry (the first one run if none)."""
        if entry is not None and inputs is not None:
            graph = self._lower(entry, inputs).graph
        elif self._lowered:
            graph = next(iter(self._lowered.values())).graph
        else:
            raise _error(
                "E0730",
                "a new context needs an entry and inputs to size its states",
                help="model.new_context('decode', [token, pos])",
            )
        return self.context_for_graph(graph)

    def context_for_graph(self, graph: Graph) -> Context:
        """A fresh context with zeroed states sized for ``graph``."""
        states = {
            path: torch.zeros(vt.shape, dtype=DTYPES[vt.dtype], device=self.device)
            for path, vt in graph.states.items()
        }
        return Context(self.params, states, self.device)

    def _context_for_graph(self, graph: Graph) -> Context:
        key = tuple(sorted((p, v.shape, v.dtype) for p, v in graph.states.items()))
        if key not in self._contexts:
            ctx = self.context_for_graph(graph)
            if graph.states and (
                torch.compiler.is_exporting() or any(is_fake(s) for s in ctx.states.values())
            ):
                # Made now, the states would be the tracer's fake tensors, kept by the model
                # for every later call (which would then return fake tensors).
                raise _error(
                    "E0732",
                    f"`{graph.entry}` keeps states (KV caches) that the model "
                    "has not made yet, and torch.export (or a FakeTensorMode) is "
                    "tracing it: they would be made of fake tensors",
                    help=f"export model.as_module({graph.entry!r}, inputs) (its states "
                    "are buffers of the module), or run the entry once before "
                    "tracing it",
                )
            self._contexts[key] = ctx
        return self._contexts[key]

    # ------------------------------------------------------------ plans
    def plan_for(
        self,
        entry: str,
        inputs: list[torch.Tensor],
        backends: Any = None,
        compile: Any = None,
        memory: int | None = None,
        measure: bool = True,
        margin: float = 0.02,
        progress: Any = True,
        cache: Any = None,
        kernels: bool = True,
        captured: bool = True,
    ) -> Any:
        """Plan ``entry`` for inputs like ``inputs`` over ``backends`` (default: every backend
        ``linnet.backends.available()`` lists). Each region kind is timed once on its backend
        and on the generated source; a backend takes a region only if it saves ``margin``
        (2%) of the time. ``compile`` is the torch.compile mode, backend or inductor options
        (as in :func:`load`) of the generated slices; compiled, each kind of region taken is
        also timed against the compiled slices around it, and dropped ("slower in context")
        where cutting them costs more than it saves (``linnet.plan.context``); ``memory`` caps the bytes executables
        hold; ``measure=False`` skips timing; ``progress`` (True: stderr; or a callable
        taking a line) shows a bar while regions are timed and a line when each slice
        compiles; ``cache`` is the ``linnet.plan.TimingCache`` to read and write (default:
        the one under $LINNET_HOME). ``kernels`` (under numerics "fast"): Linnet's own
        kernels, bound ops' and span ops' (std's fused decode kernels), are candidates too,
        as the backend ``linnet-kernels``, each timed against the op bodies' generated code;
        False leaves them out (the plan's generated source never launches a kernel).
        ``captured`` says how the plan will run on CUDA, which decides how it is timed: True
        (the default), as one CUDA graph (:class:`~linnet.torch.plans.Captured`, a decode
        step), where the host's launch costs are not paid; False, by ``plan.run`` (a prefill
        of one prompt), item by item from the host, where each region and each cut between
        compiled slices costs its Python and launches too: each is charged its host time
        beside its device time, so a region that saves less device time than it costs the
        host is not taken. Every executable runs once where the plan is made, measured or
        not, and is checked against the generated source as :meth:`conform` checks it: one
        that raises or gives other outputs (NaN, zeros, a wrong scale, a wrong state write)
        is not taken ("failed" in ``plan.explain()``, with a
        :class:`~linnet.plan.BackendWarning`). ``margin`` is a fraction in [0, 1),
        ``memory`` None or bytes, ``backends`` a list of backend objects; a value of the
        wrong kind is a coded error (E0765, E0771-E0776, E0714) before anything is lowered.

        >>> plan = model.plan_for("decode", [token, pos], backends=[MyLinear()])  # doctest: +SKIP
        >>> print(plan.explain())                                                # doctest: +SKIP
        >>> prefill = model.plan_for("prefill", [prompt], captured=False)        # doctest: +SKIP
        """
        from .planned import plan_arguments, plan_for

        # Each argument checked before anything is lowered (a coded error naming it); the
        # backends as a list (a generator given is read once, here).
        backends = plan_arguments(
            backends, compile, memory, measure, margin, progress, cache, kernels, captured
        )[1]
        self._checked(entry, inputs)  # the plan runs them to record and time regions
        return plan_for(
            self,
            entry,
            inputs,
            backends,
            compile,
            memory,
            measure,
            margin,
            progress,
            cache,
            kernels,
            captured,
        )

    def _checked(self, entry: str, inputs: Sequence[torch.Tensor]) -> Graph:
        """The graph for ``inputs``, after checking them (see :meth:`run`)."""
        graph = self._lower(entry, inputs).graph
        check_inputs(graph, list(inputs), entry)
        return graph

    def context_for(self, plan: Any, shared: bool = False) -> Context:
        """A context for ``plan``: zeroed states, and each executable prepared once (where a
        backend lays out joined weights with ``context.join``). An executable whose prepare
        raises is error E0756, naming its backend: plan again without it. ``shared=True``
        gives instead the context the model's own entry calls use for states of these
        shapes (prepared for ``plan`` too): plans of several batch sizes over a paged KV
        cache, whose states do not depend on the batch, then share one page pool with each
        other and with ``model.prefill_paged(...)``.

        >>> ctx = model.context_for(plan)                        # doctest: +SKIP
        >>> pool = model.context_for(decode_plan, shared=True)   # doctest: +SKIP
        """
        from .plans import prepare_all

        ctx = self._context_for_graph(plan.graph) if shared else self.context_for_graph(plan.graph)
        # A shared context may hold the last step's inputs of another plan (another batch
        # size): they are not this plan's, and its executables prepare before its first step.
        ctx.inputs, ctx.host_inputs = {}, {}
        with torch.inference_mode():
            prepare_all(plan, ctx, "E0756")
        return ctx

    def conform(
        self,
        entry: str,
        inputs: list[torch.Tensor],
        backend: Any,
        tolerance: float = 0.01,
        context: Context | None = None,
    ) -> list[Any]:
        """Run each region ``backend`` takes both ways on the same inputs; see the spec.

        >>> for f in model.conform("decode", [token, pos], MyLinear()):  # doctest: +SKIP
        ...     print(f.region.start, f.difference, f.passed)
        """
        from .planned import conform

        self._checked(entry, inputs)
        return conform(self, entry, inputs, backend, tolerance, context)

    def run(
        self,
        entry: str,
        inputs: Sequence[torch.Tensor] | dict[str, torch.Tensor],
        context: Context | None = None,
    ) -> Any:
        """Run ``entry``; returns its result (a tensor, or a tuple for several).

        ``inputs`` is a list (or tuple) of tensors in the entry's order, or a dict by the
        entry's parameter names; ``model.decode(token, pos)`` and
        ``model.decode(token=token, pos=pos)`` are the same call. Inputs must be tensors of
        the declared dtype (nothing is converted); token ids and positions must be in range
        (checked before anything runs: error E0780; see docs/torch.md, "Bad inputs").

        >>> model.run("decode", {"token": token, "pos": pos})        # doctest: +SKIP
        """
        if isinstance(inputs, dict):
            inputs = self._inputs(entry, [], dict(inputs))
        if context is not None and not isinstance(context, Context):
            raise _error(
                "E0785",
                f"context must be a linnet.torch.Context, got {type(context).__name__}",
                help=f"make one: model.new_context({entry!r}, inputs)",
            )
        given = inputs
        lowered = self._lower(entry, given)
        graph = lowered.graph
        # Checked where the caller's tensors are: host tensors cost nothing to check.
        check_inputs(graph, list(given), entry)
        inputs = [t.to(self.device) for t in given]
        ctx = context if context is not None else self._context_for_graph(graph)
        self._check_context(graph, ctx, entry)
        return self._execute(lowered, entry, inputs, self.params, ctx.states)

    @staticmethod
    def _check_context(graph: Graph, ctx: Context, entry: str) -> None:
        """E0731 where ``ctx`` lacks a state ``graph`` writes, or holds one of another shape."""
        for path, vt in graph.states.items():
            have = ctx.states.get(path)
            if have is None or tuple(have.shape) != vt.shape:
                raise _error(
                    "E0731",
                    f"the context's state `{path}` is "
                    f"{None if have is None else list(have.shape)}, this call needs "
                    f"{list(vt.shape)}",
                    help=f"make a context for these inputs: model.new_context({entry!r}, inputs)",
                )

    def _execute(
        self,
        lowered: Lowered,
        entry: str,
        inputs: list[torch.Tensor],
        params: dict[str, torch.Tensor],
        states: dict[str, torch.Tensor],
    ) -> Any:
        """Run a lowered entry on checked inputs against ``params`` and ``states`` (the
        model's and a context's, or an :meth:`as_module` module's own)."""
        # With gradients on, the caller's grad mode applies (torch.no_grad() still works).
        grad_mode = contextlib.nullcontext() if self.autograd else torch.inference_mode()
        # A rank whose collectives lose the other ranks (timeout, a peer gone) says so: E0825.
        with numerics_mode(self.numerics), grad_mode, rank_errors(self.rank, self.world):
            if self.interpret:
                outs = run_graph(lowered.graph, inputs, params, states, self.device)
            else:
                assert lowered.module is not None
                # An entry named like a builtin (`input`) has a function named apart.
                module = lowered.module
                fn = lowered.function or getattr(
                    module, module.ENTRIES[entry].get("function", entry)
                )
                try:
                    outs = fn(*inputs, params, states)
                except IndexError as exc:
                    # An index the bounds analysis could not follow to an input (one
                    # computed from a parameter, say): the same code as the interpreter's.
                    raise index_error(entry, str(exc)) from None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def as_module(
        self, entry: str, inputs: Sequence[torch.Tensor], context: Context | None = None
    ) -> torch.nn.Module:
        """``entry`` as a ``torch.nn.Module`` for ``torch.export`` and AOTInductor: the
        entry's parameters are the module's parameters and its states (the KV caches) its
        buffers, under their paths, sharing memory with the model and ``context`` (by
        default the context :meth:`run` uses). ``forward(*inputs)`` runs the entry; an
        exported program writes the caches as the model does and refuses out-of-range token
        ids and positions (docs/torch.md, "Exporting with torch.export").

        >>> decode = model.as_module("decode", [token, pos])                 # doctest: +SKIP
        >>> program = torch.export.export(decode, (token, pos))              # doctest: +SKIP
        >>> program.module()(token, pos).shape                                # doctest: +SKIP
        torch.Size([1, 256])
        """
        from .entry_module import EntryModule

        self._single("as_module")
        return EntryModule(self, entry, list(inputs), context)

    # ------------------------------------------------------------ gradients
    def value_and_grad(
        self,
        entry: str,
        inputs: Sequence[torch.Tensor] | dict[str, Any],
        wrt: str | Sequence[str] = "params",
        cotangents: Any = None,
        context: Context | None = None,
    ) -> tuple[Any, dict[str, torch.Tensor]]:
        """Run ``entry`` and its gradient: ``(value, grads)``, like ``jax.value_and_grad``.

        ``wrt``: the inputs (by name) and parameters (by path) to differentiate with
        respect to, or ``"params"`` (every floating-point parameter, the default).
        ``grads`` maps each of them (name or path) to its gradient, of its shape and dtype.
        Without ``cotangents`` the entry must return one scalar float (a loss: E0952
        otherwise); with ``cotangents`` (one tensor per float output, shaped like it) the
        gradients are the vector-Jacobian product ``sum(out * cotangent)``'s. The gradient
        is linnet-lang's reverse pass over the entry's graph (`linnet torch --grad`), run as
        generated source; ops with a ``grad`` clause are differentiated by their clause.
        States the entry writes are written, as by :meth:`run`.

        >>> loss, grads = model.value_and_grad("loss", [tokens, targets])   # doctest: +SKIP
        >>> for path, g in grads.items():                                    # doctest: +SKIP
        ...     model.params[path] -= 0.1 * g
        """
        from .grad import value_and_grad

        self._single("value_and_grad")
        return value_and_grad(self, entry, inputs, wrt, cotangents, context)

    def grad(
        self,
        entry: str,
        inputs: Sequence[torch.Tensor] | dict[str, Any],
        wrt: str | Sequence[str] = "params",
        cotangents: Any = None,
        context: Context | None = None,
    ) -> dict[str, torch.Tensor]:
        """The gradients of :meth:`value_and_grad` alone (``jax.grad``).

        >>> grads = model.grad("loss", [tokens, targets], wrt=["model.norm.weight"])  # doctest: +SKIP
        """
        return self.value_and_grad(entry, inputs, wrt, cotangents, context)[1]

    def grad_graph(
        self,
        entry: str,
        inputs: Sequence[torch.Tensor],
        wrt: str | Sequence[str] = "params",
        cotangents: bool = False,
    ) -> Graph:
        """The gradient graph that :meth:`value_and_grad` runs (``linnet graph --grad``)."""
        from .grad import lowered_grad

        self._single("grad_graph")
        return lowered_grad(
            self, entry, inputs, wrt, "cotangents" if cotangents else "scalar"
        ).graph

    def generate(self, prompts: Any, max_new_tokens: int = 16, **options: Any) -> Any:
        """Generate tokens after each prompt on ``prefill`` and ``decode``: greedy by
        default; ``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop_tokens`` and
        ``on_token`` as :func:`linnet.torch.generate.generate` says (docs/torch.md,
        "Generating"). A sequence stops after one of ``model.stop_tokens`` (the checkpoint's
        end-of-sequence tokens) unless ``stop_tokens=`` says otherwise (``[]``: never).
        Token-id prompts give token ids; text prompts (a string, chat messages, or a list
        of either) give text, with ``stop=``, ``callback=`` and ``skip_special_tokens=``
        (:func:`linnet.lang.text.generation.generate_text`; needs ``model.tokenizer``).

        >>> model.generate([[1, 2, 3], [4, 5]], max_new_tokens=8)          # doctest: +SKIP
        [[17, 9, 9, 30, 2, 88, 7, 7], [5, 5, 211, 2, 40, 40, 9, 1]]
        >>> model.generate([{"role": "user", "content": "Hi"}], 32)       # doctest: +SKIP
        'Hello! How can I help you today?'
        """
        from .generate import check_options

        check_options(options)  # E0794, not a TypeError, for an option generate lacks
        return self._generate(prompts, max_new_tokens, options)

    def _token_generate(self) -> Callable[..., list[list[int]]]:
        from .generate import generate

        return generate

    def _int32_zeros(self, n: int) -> Any:
        return torch.zeros(n, dtype=torch.int32)

    @property
    def _warm_up_runs(self) -> int:  # type: ignore[override]
        """Twice on CUDA: generate's fast path captures a length bucket's prefill (and a batch
        bucket's greedy step) at its second call (:mod:`linnet.torch.fast_generate`)."""
        return 2 if self.device.type == "cuda" else 1

    @property
    def prompt_ladder(self) -> Ladder:
        """The prompt lengths ``generate`` runs prefill at: :data:`~linnet.lang.host.generate.FINE`
        on the CPU without ``compile=`` (prefill's time grows with the padded length, and a
        new length only lowers and imports source), else
        :data:`~linnet.lang.host.generate.COARSE` (CUDA: short prompts cost the weights'
        read whatever their length; torch.compile compiles each shape).

        >>> load("std.models.llama").prompt_ladder.per_octave                  # doctest: +SKIP
        4
        """
        return FINE if self.device.type == "cpu" and not self.compile else COARSE

    def source(self, entry: str, inputs: list[torch.Tensor]) -> str:
        """The path of the generated source file for ``entry`` with these inputs."""
        return self._lower(entry, inputs).path

    def module(self, entry: str, inputs: list[torch.Tensor]) -> ModuleType | None:
        """The imported generated module for ``entry`` with these inputs (None with
        ``interpret=True``). Its ``RUNS`` counts, per kernel instance, the calls that
        launched the kernel and those that ran the op's body (docs/torch.md, "Kernels").

        >>> model.module("run", [x]).RUNS                          # doctest: +SKIP
        {'row_softmax_4_8_1024': [1, 0]}
        """
        return self._lower(entry, inputs).module

    # ------------------------------------------------------------ export
    def export_onnx(
        self,
        entry: str,
        inputs: Sequence[torch.Tensor],
        path: str | Path,
        check: bool = True,
        external_threshold: int | None = None,
        dynamic: str | list[str] | None = None,
    ) -> list[Path]:
        """Write ``entry``, lowered for inputs shaped like ``inputs``, as an ONNX model at
        ``path``: the entry's inputs then its states (the KV cache) as graph inputs, its
        outputs then each state after the call (``<path>.next``) as outputs, this model's
        weights as initializers (in ``path.data`` above ``external_threshold`` bytes, 1 GiB),
        std ops as local functions of the ``linnet.std`` domain. Checked with
        ``onnx.checker`` (full check) unless ``check=False``. Needs ``linnet-lang[onnx]``.
        Returns the files written; see docs/export.md.

        ``dynamic``: the dims to make symbolic (``["B", "L"]`` or ``"B,L"``; their inputs,
        states and outputs get ONNX ``dim_param`` names and the model runs at any size of
        them); left out, B and L where the graph allows; ``"none"``: every dim concrete.
        A named dim that cannot be symbolic is E0935-E0938.

        >>> model.export_onnx("decode", [token, pos], "decode.onnx")      # doctest: +SKIP
        [PosixPath('decode.onnx')]
        """
        from .export import export_onnx

        self._single("export_onnx")
        return export_onnx(self, entry, inputs, path, check, external_threshold, dynamic)

    def export_stablehlo(
        self, entry: str, inputs: Sequence[torch.Tensor], path: str | Path, verify: bool = False
    ) -> list[str]:
        """Write ``entry``, lowered for inputs shaped like ``inputs``, as StableHLO MLIR text
        at ``path`` (std ops as ``stablehlo.composite``s); ``verify=True`` parses and verifies
        it with jaxlib first. Returns the names of ``@main``'s arguments in order: the inputs,
        the states, then the parameters (pass ``model.params[name]`` for those).

        >>> order = model.export_stablehlo("prefill", [tokens], "prefill.mlir")  # doctest: +SKIP
        """
        from .export import export_stablehlo

        self._single("export_stablehlo")
        return export_stablehlo(self, entry, inputs, path, verify)


def random_weights(
    model_path: str | Path,
    config: dict[str, Any],
    seed: int = 0,
    dtype: torch.dtype | None = None,
    scale: float = 0.02,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Deterministic random parameters for a model and config (norm weights are ones),
    made directly on ``device`` (an 8B-shaped model never passes through host memory).

    >>> w = random_weights("examples/llama/llama.linnet", toy_config)   # doctest: +SKIP
    """
    check_seed(seed, optional=False)  # E0815, not an OverflowError from manual_seed
    dev = resolve_device(device)
    gen = torch.Generator(dev).manual_seed(seed)
    out = {}
    for path, vt, ones in parameter_types(model_path, config):
        if vt.dtype in ("i8", "u8"):  # quantised levels (weight_bits 8 or 4): any byte
            low, high = (-127, 128) if vt.dtype == "i8" else (0, 256)
            out[path] = torch.randint(
                low, high, vt.shape, generator=gen, device=dev, dtype=DTYPES[vt.dtype]
            )
            continue
        # A quantised weight's f16 scales stay f16 whatever dtype= asks of the rest.
        dt = (
            DTYPES[vt.dtype]
            if vt.dtype == "f16" and dtype is not None
            else dtype or DTYPES[vt.dtype]
        )
        if ones:
            out[path] = torch.ones(vt.shape, dtype=dt, device=dev)
        else:
            t = torch.empty(vt.shape, dtype=dt, device=dev)
            out[path] = t.normal_(0.0, scale, generator=gen)
    return out
