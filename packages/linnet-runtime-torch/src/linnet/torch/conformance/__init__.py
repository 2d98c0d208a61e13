"""The conformance suite: one model definition, the same function on every runtime.

For each :data:`CASES` entry (every std op, the Llama example's prefill and a greedy decode
loop, its variants) and the same random inputs and weights, every runtime of
:data:`RUNTIMES` runs the entry and is compared with the PyTorch interpreter, the reference.
A decode case prefills a prompt, then runs greedy decode steps, each runtime carrying the
states (the KV cache) it returned into its next call; it passes when every runtime picks the
interpreter's tokens and its logits are within tolerance. The tolerance is the output dtype's
(:data:`TOLERANCES`), relative to the reference's largest magnitude (at least 1).

``linnet conform-all`` prints the table; ``--write docs/conformance.md`` writes the page the
docs site shows, and integration-tests/test_conformance.py fails when the committed page no
longer matches what the suite computes (a new case or runtime, a changed verdict, a difference
off by more than 10x).

A runtime is one :class:`Runtime` row of :data:`RUNTIMES`: adding one (the generated JAX of
``linnet.jax``) is one entry.

>>> from linnet.torch.conformance import run_suite, table              # doctest: +SKIP
>>> print(table(run_suite()))                                          # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from linnet.lang.check.kernel_cases import integer_range

from .cases import (  # noqa: F401  (the suite's cases, re-exported)
    EDGES,
    MODELS_COVERED,
    SHIPPED_MODELS,
    STD_OPS,
    Case,
    _tinylm,
    cases,
    edge_cases,
)

TOLERANCES: dict[str, float] = {"f64": 1e-9, "f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}
"""Largest difference an output may have from the reference, by its dtype, relative to the
reference's largest magnitude (at least 1): ``|got - want| <= tol * max(1, max |want|)``.
Integer and bool outputs, and the tokens a decode loop picks, must be equal."""


Arrays = dict[str, np.ndarray]
StepFn = Callable[[Arrays, Arrays], tuple[list[np.ndarray], Arrays]]
"""``step(inputs by name, states by path) -> (outputs, states after the call)``."""


def make_inputs(case: Case, seed: int = 0) -> Arrays:
    rng = np.random.default_rng(seed + zlib.crc32(case.name.encode()))
    out: Arrays = {}
    for name, (shape, fill) in case.inputs.items():
        if fill == "normal":
            out[name] = rng.standard_normal(shape).astype(np.float32)
        elif isinstance(fill, tuple):
            ints = all(isinstance(v, int) for v in fill)
            out[name] = np.array(fill, np.int32 if ints else np.float32).reshape(shape)
        else:
            out[name] = rng.integers(0, int(fill), shape).astype(np.int32)
    return out


def make_weights(graphs: list[Any], seed: int = 0) -> dict[str, Any]:
    """Random weights (torch tensors) for every parameter the graphs read: normal(0, 0.2), norm
    gains near one, 8-bit integers (quantised weights) uniform over their whole range; each from its own seed (the path's), so a case sees the same weights
    whatever else is lowered."""
    import torch

    from ..interpreter import DTYPES

    out: dict[str, Any] = {}
    for g in graphs:
        for path, vt in g.parameters.items():
            if path in out:
                continue
            rng = np.random.default_rng(seed + zlib.crc32(path.encode()))
            if vt.dtype in ("i8", "u8"):  # quantised levels and packed nibbles: every value
                low, high = integer_range(vt.dtype)
                ints = rng.integers(low, high, vt.shape)
                out[path] = torch.from_numpy(ints.astype(np.int64)).to(DTYPES[vt.dtype])
                continue
            if path.endswith("norm.weight") or path == "gain":
                arr = 1.0 + 0.1 * rng.standard_normal(vt.shape)
            else:
                arr = 0.2 * rng.standard_normal(vt.shape)
            out[path] = torch.from_numpy(arr.astype(np.float32)).to(DTYPES[vt.dtype])
    return out


# ---------------------------------------------------------------- runtimes
@dataclass
class Setup:
    """What every runtime of one case shares: the model file, config, weights and graphs."""

    case: Case
    weights: dict[str, Any]
    graphs: dict[str, Any]  # entry -> Graph (lowered by the interpreter's model)
    models: dict[str, Any] = field(default_factory=dict)  # kind -> linnet.torch Model

    def torch_model(self, kind: str) -> Any:
        from ..loading import load

        if kind not in self.models:
            self.models[kind] = load(
                self.case.model,
                weights=self.weights,
                config=self.case.config,
                interpret=kind == "interpret",
                compile=kind == "compile",
            )
        return self.models[kind]

    def numpy_weights(self, graph: Any) -> Arrays:
        """The graph's weights as NumPy arrays of their own dtypes (an int8 weight stays
        int8, an f16 scale f16: the exports declare them so); bf16, which NumPy lacks, as
        f32."""
        import torch

        return {
            p: (w.float() if w.dtype == torch.bfloat16 else w).numpy()
            for p in graph.parameters
            for w in (self.weights[p],)
        }


def _torch_step(kind: str) -> Callable[[Setup, Any], StepFn]:
    def make(setup: Setup, graph: Any) -> StepFn:
        import torch

        from ..context import Context

        model = setup.torch_model(kind)

        def step(inputs: Arrays, states: Arrays) -> tuple[list[np.ndarray], Arrays]:
            ctx = Context(
                model.params,
                {k: torch.from_numpy(v.copy()) for k, v in states.items()},
                model.device,
            )
            args = [torch.from_numpy(inputs[r.lstrip("%")]) for r in graph.inputs]
            out = model.run(graph.entry, args, context=ctx)
            outs = list(out) if isinstance(out, tuple) else [out]
            return (
                [o.float().numpy() if o.is_floating_point() else o.numpy() for o in outs],
                {k: v.float().numpy() for k, v in ctx.states.items()},
            )

        return step

    return make


def _onnx_step(evaluator: str) -> Callable[[Setup, Any], StepFn]:
    def make(setup: Setup, graph: Any) -> StepFn:
        from linnet.lang.emit import onnx as emit

        model = emit.emit_onnx(graph, setup.numpy_weights(graph))
        emit.check(model)
        proto = emit.to_proto(model)
        if evaluator == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            sess = ort.InferenceSession(
                proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            run = sess.run
        else:
            from onnx.reference import ReferenceEvaluator

            run = ReferenceEvaluator(proto).run
        n = len(graph.outputs)

        def step(inputs: Arrays, states: Arrays) -> tuple[list[np.ndarray], Arrays]:
            outs = run(None, {**inputs, **states})
            return list(outs[:n]), dict(zip(graph.states, outs[n:]))

        return step

    return make


def _stablehlo_step(setup: Setup, graph: Any) -> StepFn:
    from linnet.lang.emit import stablehlo as emit

    text = emit.emit_stablehlo(graph)
    emit.verify(text)
    run = emit.compile_cpu(text)
    weights = setup.numpy_weights(graph)
    n = len(graph.outputs)

    def step(inputs: Arrays, states: Arrays) -> tuple[list[np.ndarray], Arrays]:
        named = {**inputs, **states, **weights}
        outs = run(*(named[a] for a in emit.argument_order(graph)))
        return outs[:n], dict(zip(graph.states, outs[n:]))

    return step


def _jax_step(setup: Setup, graph: Any) -> StepFn:
    """Generated JAX (linnet-runtime-jax): the entry as ``linnet.jax``'s pure function
    ``fn(params, states, inputs) -> (outputs, new_states)`` of a model loaded with the same
    weights (NumPy arrays of their dtypes) and config; each call is given the states the
    previous one returned."""
    import jax.numpy as jnp
    from linnet.jax import load  # type: ignore[import-not-found]
    from linnet.jax.weights import numpy_dtype  # type: ignore[import-not-found]

    model = setup.models.get("jax")
    if model is None:
        weights = {
            k: v.float().numpy().astype(numpy_dtype(_linnet_dtype(v)))
            for k, v in setup.weights.items()
        }
        model = setup.models["jax"] = load(
            setup.case.model, weights=weights, config=setup.case.config
        )
    fn = model.function(graph.entry)

    def step(inputs: Arrays, states: Arrays) -> tuple[list[np.ndarray], Arrays]:
        args = [inputs[r.lstrip("%")] for r in graph.inputs]
        # Fresh arrays of the states' dtypes: fn donates its states argument.
        mine = {p: jnp.asarray(states[p], numpy_dtype(vt.dtype)) for p, vt in graph.states.items()}
        outs, new = fn(model.params, mine, args)
        return (
            [np.asarray(o, np.float32 if o.dtype.name == "bfloat16" else None) for o in outs],
            {k: np.asarray(v, np.float32) for k, v in new.items()},
        )

    return step


def _linnet_dtype(tensor: Any) -> str:
    """A torch tensor's dtype as a Linnet name (``torch.bfloat16`` -> ``bf16``)."""
    from ..interpreter import DTYPES

    return next(name for name, dt in DTYPES.items() if dt == tensor.dtype)


def _needs(*modules: str) -> Callable[[], str]:
    def missing() -> str:
        absent = [m for m in modules if importlib.util.find_spec(m) is None]
        return f"{', '.join(absent)} not installed" if absent else ""

    return missing


@dataclass(frozen=True)
class Runtime:
    """One column of the table: ``missing()`` says why it cannot run here ("" if it can);
    ``make(setup, graph)`` returns its step function for one lowered entry."""

    name: str
    description: str
    missing: Callable[[], str]
    make: Callable[[Setup, Any], StepFn]


RUNTIMES: list[Runtime] = [
    Runtime(
        "interpreter", "the PyTorch interpreter (the reference)", _needs(), _torch_step("interpret")
    ),
    Runtime("generated", "generated PyTorch (linnet torch)", _needs(), _torch_step("generated")),
    Runtime(
        "compile",
        "generated PyTorch under torch.compile (load(compile=True))",
        _needs(),
        _torch_step("compile"),
    ),
    Runtime(
        "onnxruntime",
        "ONNX (linnet onnx) under onnxruntime, CPU",
        _needs("onnx", "onnx_ir", "onnxruntime"),
        _onnx_step("onnxruntime"),
    ),
    Runtime(
        "onnx-reference",
        "ONNX under onnx.reference.ReferenceEvaluator",
        _needs("onnx", "onnx_ir"),
        _onnx_step("reference"),
    ),
    Runtime(
        "stablehlo",
        "StableHLO (linnet stablehlo) on JAX's CPU backend",
        _needs("jax"),
        _stablehlo_step,
    ),
    Runtime("jax", "generated JAX (linnet-runtime-jax)", _needs("linnet.jax"), _jax_step),
]
"""The runtimes, in the table's order; the first is the reference."""


# ---------------------------------------------------------------- running
@dataclass
class Cell:
    runtime: str
    difference: float | None  # None: the runtime did not run (``note`` says why)
    passed: bool
    note: str = ""


@dataclass
class Row:
    case: Case
    cells: list[Cell]


def _difference(got: np.ndarray, want: np.ndarray) -> tuple[float, bool]:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return math.inf, False
    if want.dtype.kind in "biu":
        diff = float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
        return diff, diff == 0
    g, w = got.astype(np.float64), want.astype(np.float64)
    # NaN and infinities must be where the reference has them (the edge-value cases); the
    # difference is taken over the finite rest.
    same = (np.isnan(g) & np.isnan(w)) | (np.isinf(w) & (g == w))
    if np.any(~same & ~np.isfinite(g)) or np.any(~same & ~np.isfinite(w)):
        return math.inf, False
    with np.errstate(invalid="ignore"):  # inf - inf where `same` already holds
        diff = float(np.max(np.abs(np.where(same, 0.0, g - w)), initial=0))
    finite = np.where(np.isfinite(w), np.abs(w), 0.0)
    return diff, diff <= _tolerance(want) * max(1.0, float(np.max(finite, initial=0)))


def _tolerance(want: np.ndarray) -> float:
    name = {np.dtype(np.float64): "f64", np.dtype(np.float16): "f16"}.get(want.dtype, "f32")
    return TOLERANCES[name]


def _trace(
    case: Case, setup: Setup, make: Callable[[Setup, Any], StepFn]
) -> tuple[list[list[np.ndarray]], list[int]]:
    """Every call's outputs (and states after it), and the tokens a decode loop picked."""
    inputs = make_inputs(case)
    first = setup.graphs[case.entry]
    states = {p: np.zeros(v.shape, np.float32) for p, v in first.states.items()}
    outs, states = make(setup, first)(inputs, states)
    seen = [outs + [states[p] for p in sorted(states)]]
    tokens: list[int] = []
    if case.decode:
        step = make(setup, setup.graphs["decode"])
        token = int(np.argmax(outs[0][0, -1]))
        length = next(iter(inputs.values())).shape[1]
        for i in range(case.decode):
            tokens.append(token)
            outs, states = step(
                {"token": np.array([token], np.int32), "pos": np.array([length + i], np.int32)},
                states,
            )
            seen.append(outs + [states[p] for p in sorted(states)])
            token = int(np.argmax(outs[0][0]))
        tokens.append(token)
    return seen, tokens


def lower_case(case: Case) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case's graphs (its entry, and decode for a loop) and the weights for them."""
    from linnet.lang import lower
    from linnet.lang.host.loading import load_program

    program, _ = load_program(case.model)  # parsed and checked (once a suite: run_suite)
    graphs = {}
    for entry in [case.entry] + (["decode"] if case.decode else []):
        shapes = (
            {k: list(v[0]) for k, v in case.inputs.items()}
            if entry == case.entry
            else {"token": [1], "pos": [1]}
        )
        graphs[entry] = lower(program, entry, shapes, case.config, check=False)
    return graphs, make_weights(list(graphs.values()))


def run_case(case: Case, runtimes: list[Runtime] | None = None) -> Row:
    """Run ``case`` on every runtime; the first runtime's results are the reference."""
    runtimes = RUNTIMES if runtimes is None else runtimes
    graphs, weights = lower_case(case)
    setup = Setup(case, weights, {})
    # Lowered as the torch runtime lowers them (with the weights' shapes): every runtime
    # exports or runs these very graphs.
    ref_model = setup.torch_model("interpret")
    for entry, g in graphs.items():
        import torch

        args = [
            torch.zeros(g.values[r].shape, dtype=_torch_dtype(g.values[r].dtype)) for r in g.inputs
        ]
        setup.graphs[entry] = ref_model.graph(entry, args)
    want, want_tokens = _trace(case, setup, runtimes[0].make)
    cells = [Cell(runtimes[0].name, 0.0, True, "reference")]
    for rt in runtimes[1:]:
        why = rt.missing()
        if why:
            cells.append(Cell(rt.name, None, True, why))
            continue
        got, tokens = _trace(case, setup, rt.make)
        worst, ok = 0.0, True
        for call_got, call_want in zip(got, want):
            for g_, w_ in zip(call_got, call_want):
                d, p = _difference(g_, w_)
                worst, ok = max(worst, d), ok and p
        ok = ok and len(got) == len(want) and tokens == want_tokens
        note = "" if tokens == want_tokens else "different tokens"
        cells.append(Cell(rt.name, worst, ok, note))
    return Row(case, cells)


def _torch_dtype(name: str) -> Any:
    from ..interpreter import DTYPES

    return DTYPES[name]


def run_suite(
    select: Callable[[Case], bool] | None = None, runtimes: list[Runtime] | None = None
) -> list[Row]:
    """Every case (those ``select`` keeps) on every runtime; each model file is parsed and
    checked once for them all (:func:`~linnet.lang.host.loading.programs_kept`)."""
    from linnet.lang.host.loading import programs_kept

    with programs_kept():
        return [run_case(c, runtimes) for c in cases() if select is None or select(c)]


# ---------------------------------------------------------------- the table
def cell_text(cell: Cell) -> str:
    if cell.difference is None:
        return "n/a"
    if cell.note == "reference":
        return "reference"
    mark = "pass" if cell.passed else "FAIL"
    extra = f" ({cell.note})" if cell.note else ""
    return f"{cell.difference:.1e} {mark}{extra}"


def table(rows: list[Row], runtimes: list[Runtime] | None = None) -> str:
    """The Markdown table: one row per case, one column per runtime (largest difference from
    the interpreter over every output, state and call, and whether it passes; "not run" where
    a row was run on fewer runtimes)."""
    runtimes = RUNTIMES if runtimes is None else runtimes
    head = "| case | " + " | ".join(rt.name for rt in runtimes) + " |"
    lines = [head, "|" + "---|" * (len(runtimes) + 1)]
    for row in rows:
        cells = {c.runtime: c for c in row.cells}
        texts = [cell_text(cells[rt.name]) if rt.name in cells else "not run" for rt in runtimes]
        lines.append(f"| {row.case.name} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def page(rows: list[Row]) -> str:
    """docs/conformance.md: the table, the runtimes, the tolerances and what n/a means."""
    missing = {rt.name: rt.missing() for rt in RUNTIMES if rt.missing()}
    lines = [
        "# Conformance",
        "",
        "One model definition, the same function on every runtime: each case below runs on",
        "the same random inputs and weights on every runtime, compared with the PyTorch",
        "interpreter. A cell is the largest difference from the interpreter over every",
        "output, every state after each call and every call of a decode loop (whose tokens",
        "must be the interpreter's). Generated by `linnet conform-all --write",
        "docs/conformance.md`; `integration-tests/test_conformance.py` fails when this page",
        "no longer matches what the suite computes.",
        "",
        table(rows),
        "",
        "Runtimes:",
        "",
    ]
    lines += [
        f"- `{rt.name}`: {rt.description}"
        + (f" (n/a here: {missing[rt.name]})" if rt.name in missing else "")
        for rt in RUNTIMES
    ]
    lines += [
        "",
        "Tolerances (by output dtype, relative to the reference's largest magnitude, "
        "at least 1; integers, bools and tokens must be equal):",
        "",
    ]
    lines += [f"- {k}: {v:g}" for k, v in TOLERANCES.items()]
    return "\n".join(lines) + "\n"
