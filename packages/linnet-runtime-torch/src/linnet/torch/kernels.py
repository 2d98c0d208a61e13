"""Launching one tile kernel on given tensors, outside any model: the seam that kernel
checkers (``linnet kernels``, tests) build on.

:func:`launch` lowers a kernel (or the kernel an op is bound to) for concrete generics,
writes it as generated PyTorch would (a ``@triton.jit`` function and its launcher, from
``linnet.lang.emit.triton``), imports that from a file (Triton reads the source) and
launches it. Set ``TRITON_INTERPRET=1`` before the first launch to run on CPU tensors in
Triton's interpreter; on CUDA tensors it compiles and runs for real.

>>> import os; os.environ["TRITON_INTERPRET"] = "1"                      # doctest: +SKIP
>>> x = torch.randn(4, 8)                                                 # doctest: +SKIP
>>> y, = launch("std.nn.activation::softmax", {"R": 4, "C": 8}, x)      # doctest: +SKIP
>>> torch.allclose(y, torch.softmax(x, -1))                              # doctest: +SKIP
True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.lang import LinnetError, Program
from linnet.lang.diagnostics.core import coded_error

import torch

from .home import import_source


def _program(program: Program | str | Path | None) -> Program:
    if isinstance(program, Program):
        return program
    if program is None:  # the std library: modules are loaded as names need them
        return Program.from_text("", name="linnet_kernels")
    return Program.from_file(program)


def resolve(
    program: Program | str | Path | None, name: str, generics: dict[str, Any]
) -> tuple[str, dict[str, Any], bool]:
    """``(kernel, kernel generics, where-clause holds)`` for ``name``: a kernel's qualified
    name with the kernel's generics, or an op bound to a kernel with the op's generics
    (the binding `kernel row_softmax<R, C, 1024>` gives the kernel's; a chain's first
    kernel, with ``holds`` for both: :func:`stages` gives both)."""
    found, holds = stages(program, name, generics)
    return found[0][0], found[0][1], holds


def stages(
    program: Program | str | Path | None, name: str, generics: dict[str, Any]
) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """The kernels ``name`` launches in turn, ``[(kernel, kernel generics)]`` (several for an op
    bound to a chain, `kernel a<...> then b<...>`), and whether every `where` clause holds.

    >>> stages(None, "std.nn.activation::softmax", {"R": 4, "C": 8})
    ([('std.nn.activation::row_softmax', {'R': 4, 'C': 8, 'B': 1024})], True)
    """
    import linnet.lang.syntax.tree as A
    from linnet.lang.check.evaluate import Evaluator, Fail, Frame
    from linnet.lang.check.tile_lowering import find_kernel
    from linnet.lang.ir.builder import Builder
    from linnet.lang.ir.graph import kernel_stages
    from linnet.lang.tensors.dims import Dim

    prog = _program(program)
    module, _, short = name.rpartition("::")
    _ensure_module(prog, module, short)
    mod = prog.module(module)
    item = mod.find(short) if mod is not None else None
    if isinstance(item, A.FuncDecl) and item.kind == "kernel":
        ev = Evaluator(prog, Builder(None))
        env = {k: Dim.const(v) if isinstance(v, int) else v for k, v in generics.items()}
        frame = Frame(item.module, env, None, item)  # type: ignore[arg-type]
        holds = True
        for clause in item.where:
            try:
                c = ev.value(clause, frame)
            except Fail as f:
                raise LinnetError(f.diag) from None
            holds = holds and bool(getattr(c, "value", False))
        return [(item.qualified_name, dict(generics))], holds
    if isinstance(item, A.FuncDecl) and item.kernel is not None:
        ev = Evaluator(prog, Builder(None))
        env = {k: Dim.const(v) if isinstance(v, int) else v for k, v in generics.items()}
        missing = [g.name for g in item.generics if g.name not in env]
        if missing:
            raise coded_error(
                "E0760",
                f"op `{name}` needs generics {', '.join(missing)} to bind its kernel",
                help="give every generic of the op: "
                + ", ".join(f"{g.name}: {g.kind}" for g in item.generics),
            )
        try:
            attrs = ev.kernel_binding_attrs(item, Frame(item.module, env, None, item))  # type: ignore[arg-type]
        except Fail as f:
            raise LinnetError(f.diag) from None
        return kernel_stages(attrs), attrs["kernel_applies"]
    find_kernel(prog, name)  # E0533: not a kernel
    raise AssertionError("unreachable")


def _op_where_holds(prog: Program, decl: Any, generics: dict[str, Any]) -> bool:
    """Whether op ``decl``'s own `where` clauses hold for ``generics`` (its kernel's are
    :func:`stages`'); ``I % NG == 0`` of a quantised product, say."""
    from linnet.lang.check.evaluate import Evaluator, Fail, Frame
    from linnet.lang.ir.builder import Builder
    from linnet.lang.tensors.dims import Dim

    ev = Evaluator(prog, Builder(None))
    env = {k: Dim.const(v) if isinstance(v, int) else v for k, v in generics.items()}
    frame = Frame(decl.module, env, None, decl)
    try:
        return all(bool(getattr(ev.value(c, frame), "value", False)) for c in decl.where)
    except Fail:
        return False


def _ensure_module(prog: Program, module: str, item: str) -> None:
    """Load ``module`` (a std module, say) into ``prog`` if it is not there yet."""
    if prog.module(module) is not None or not module:
        return
    extra = Program.from_text(f"use {module}::{{{item}}}\n", name="linnet_kernels")
    prog.modules.update({k: v for k, v in extra.modules.items() if k != "linnet_kernels"})


def kernel_module(
    program: Program | str | Path | None,
    kernel: str,
    generics: dict[str, Any],
    scalars: dict[str, Any] | None = None,
    precision: str = "ieee",
) -> Any:
    """The imported module holding kernel ``kernel`` for ``generics`` and its launcher
    (``module.LAUNCH``), imported from a file under $LINNET_HOME."""
    from linnet.lang.check.tile_lowering import lower_kernel
    from linnet.lang.emit.triton import HEADER, READY, kernel_text, runs_table

    prog = _program(program)
    module, _, short = kernel.rpartition("::")
    _ensure_module(prog, module, short)
    k = lower_kernel(prog, kernel, generics, scalars)
    sources = {m.source.name: m.source.text.splitlines() for m in prog.modules.values()}
    text = kernel_text(k, sources, precision, set())
    import os

    from linnet.lang.emit.python import wrap

    # The interpreter is chosen when the module is imported: a module written under one
    # setting is not the one imported under the other (import_source keys files by text).
    mode = "TRITON_INTERPRET=1" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"
    body = "\n".join(
        [
            f'"""Kernel {kernel} for {generics}, written by linnet.torch.kernels."""',
            "",
            f"# for: {mode}",
            "import torch",
            "",
            HEADER,
            runs_table([text.key]),
            "",
            "",
            READY,
            "",
            "",
            text.source,
            "",
            f"LAUNCH = {text.launcher}",
            "",
        ]
    )
    body = "\n".join(w for line in body.split("\n") for w in wrap(line))
    return import_source(body, "linnet_kernel_" + k.short_name)


# Triton's signature spelling of a pointer to each Linnet element type (as its JIT names a
# tensor argument).
_POINTERS = {
    "f64": "*fp64",
    "f32": "*fp32",
    "f16": "*fp16",
    "bf16": "*bf16",
    "i64": "*i64",
    "i32": "*i32",
    "i16": "*i16",
    "i8": "*i8",
    "u8": "*u8",
    "bool": "*i1",
}


def compiled(
    name: str,
    generics: dict[str, Any],
    program: Program | str | Path | None = None,
    scalars: dict[str, Any] | None = None,
    arch: int = 90,
    flags: dict[str, int] | None = None,
    aligned: bool = True,
) -> Any:
    """Kernel ``name`` compiled by Triton for NVIDIA compute capability ``arch`` without a
    GPU: the ``CompiledKernel``, whose ``asm`` holds ``"ttgir"``, ``"ptx"`` and ``"cubin"``.

    It is compiled as its launcher launches it: contiguous tensors (strides known), every
    tensor's address a multiple of 16 bytes where ``aligned`` (as Triton specialises a
    launch on PyTorch's allocations; without it no load is vectorised), ``USE_PDL`` 0 and
    ``PREFETCH`` 0 unless ``flags`` says otherwise. ``name``, ``generics``, ``program`` and
    ``scalars`` as :func:`launch`. Needs Triton with its NVIDIA backend and no
    ``TRITON_INTERPRET=1`` in this process (the interpreter cannot compile).

    >>> k = compiled("std.nn.decode::gemv_rows", {"N": 1, "I": 4096, "O": 4096, "T": "bf16",
    ...              "BR": 16, "BO": 8, "BK": 512})                          # doctest: +SKIP
    >>> "ld.global.v4" in k.asm["ptx"]                                       # doctest: +SKIP
    True
    """
    import triton
    from linnet.lang.check.tile_lowering import lower_kernel
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, kernel_generics, _ = resolve(program, name, generics)
    module = kernel_module(program, kernel, kernel_generics, scalars)
    prog = _program(program)
    mod_name, _, short = kernel.rpartition("::")
    _ensure_module(prog, mod_name, short)
    k = lower_kernel(prog, kernel, kernel_generics, scalars)
    fn = next(
        v
        for n, v in vars(module).items()
        if isinstance(v, triton.runtime.JITFunction) and n.startswith(k.short_name)
    )
    tensors = k.params + k.results + k.scratch
    signature = {p: _POINTERS[dtype] for p, _, dtype in tensors}
    constants: dict[str, Any] = {"USE_PDL": 0, "PREFETCH": 0} | (flags or {})
    for p, shape, _ in tensors:
        stride = 1
        for axis in reversed(range(len(shape))):
            constants[f"{p.upper()}_STRIDE_{axis}"] = stride
            stride *= shape[axis]
    constants = {a: constants[a] for a in fn.arg_names if a not in signature}
    signature |= dict.fromkeys(constants, "constexpr")
    pointers = [i for i, a in enumerate(fn.arg_names) if signature.get(a, "").startswith("*")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointers} if aligned else {}
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32))


def launch(
    name: str,
    generics: dict[str, Any],
    *tensors: torch.Tensor,
    program: Program | str | Path | None = None,
    scalars: dict[str, Any] | None = None,
    precision: str = "ieee",
) -> tuple[torch.Tensor, ...]:
    """Launch one kernel on ``tensors`` and return its results (a tuple).

    ``name`` is a kernel (``std.nn.activation::row_softmax``, with the kernel's generics)
    or an op bound to one (``std.nn.activation::softmax``, with the op's generics; an op
    bound to a chain launches each kernel in turn and returns the last one's results);
    ``program`` is the ``Program`` or ``.linnet`` file it lives in (default: the std
    library). ``scalars`` gives the kernel's scalar parameters (``{"eps": 1e-5}``);
    ``precision`` is ``tl.dot``'s for f32 tiles (``"ieee"``, or ``"tf32"`` as numerics fast
    launches them). The kernel runs even where its ``where`` clause does not hold for these
    generics only if it lowers; a clause that is false is error E0535. One that accesses out
    of bounds or races whatever the data, for these generics, is E0548 or E0549. Tensors must match the
    kernel's parameter shapes and dtypes (E0761), and be on CUDA, or on the CPU with
    ``TRITON_INTERPRET=1`` set before the first launch (E0762). Without Triton: E0763.

    >>> y, = launch("std.nn.activation::softmax", {"R": 4, "C": 8}, torch.randn(4, 8))  # doctest: +SKIP
    """
    import os

    try:
        import triton  # noqa: F401
    except ImportError:
        raise coded_error(
            "E0763",
            "Triton is not importable, so no kernel can be launched",
            help="install triton (it comes with torch on Linux), or run the op's body",
        ) from None
    prog = _program(program)
    found, holds = stages(prog, name, generics)
    (kernel, kgen) = found[0]
    if not holds:
        raise coded_error(
            "E0764",
            f"`{kernel}`'s where clause does not hold for {kgen}"
            if len(found) == 1
            else f"a where clause of `{kernel}` or `{found[1][0]}` does not hold for {generics}",
            help="choose generics that satisfy the kernel's `where` clause",
        )
    module = kernel_module(prog, kernel, kgen, scalars, precision)
    from linnet.lang.check.kernel_access import raise_access_faults
    from linnet.lang.check.tile_lowering import lower_kernel

    # A chain's op tensors: the last kernel's parameters less the results of the kernel
    # before it (each next kernel takes the op's tensors, then the previous one's results);
    # the first kernel takes the leading ones it declares.
    lowered = [
        lower_kernel(prog, kernel_name, kernel_generics, scalars)
        for kernel_name, kernel_generics in found
    ]
    k = lowered[0]
    params = k.params
    if len(found) > 1:
        params = lowered[-1].params[: len(lowered[-1].params) - len(lowered[-2].results)]
    # E0548, E0549: a kernel that would access out of bounds or race for these generics is
    # not launched (a wild store kills the process).
    raise_access_faults(prog, lowered, f"launch of `{name}`")
    if len(tensors) != len(params):
        raise coded_error(
            "E0761",
            f"{'op' if len(found) > 1 else 'kernel'} `"
            f"{name if len(found) > 1 else kernel}` takes {len(params)} tensors, got "
            f"{len(tensors)}",
            help="pass one tensor per tensor parameter: " + ", ".join(p for p, _, _ in params),
        )
    from linnet.lang.emit.torch import TORCH_DTYPES

    for (p, shape, dtype), t in zip(params, tensors):
        if tuple(t.shape) != shape or str(t.dtype) != TORCH_DTYPES[dtype]:
            raise coded_error(
                "E0761",
                f"kernel `{kernel}` takes `{p}` as {dtype}{list(shape)}, got "
                f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}",
                help="pass tensors of the shapes its generics give",
            )
    on_cuda = all(t.is_cuda for t in tensors)
    if not on_cuda and not (module.INTERPRET and not any(t.is_cuda for t in tensors)):
        raise coded_error(
            "E0762",
            "the tensors are not all on CUDA and TRITON_INTERPRET=1 was not "
            "set before the kernel was first written"
            if not on_cuda
            else "",
            help="move them to CUDA, or set TRITON_INTERPRET=1 in the environment "
            f"before importing Triton (now: {os.environ.get('TRITON_INTERPRET')!r})",
        )
    out = module.LAUNCH(*tensors[: len(k.params)])
    out = out if isinstance(out, tuple) else (out,)
    for stage, stage_generics in found[1:]:  # a chain: each next kernel reads the op's
        nxt = kernel_module(prog, stage, stage_generics, scalars, precision)  # tensors and
        out = nxt.LAUNCH(*tensors, *out)  # the results of the one before it
        out = out if isinstance(out, tuple) else (out,)
    return out


# ---------------------------------------------------------------- ops bound to kernels


def std_bindings() -> list[tuple[str, str]]:
    """Every op of the std library bound to a kernel, as ``(op, kernel)`` qualified names,
    sorted: what benchmarks and kernel checks discover instead of a hard-coded list.

    >>> ("std.nn.activation::softmax", "std.nn.activation::row_softmax") in std_bindings()
    True
    """
    import linnet.lang.syntax.tree as A
    from linnet.lang.syntax.program import std_modules

    out = []
    for module in sorted(std_modules()):
        prog = Program.from_text("", name="linnet_kernels")
        _ensure_module(prog, module, _any_item(module))
        m = prog.module(module)
        if m is None:
            continue
        for item in m.items:
            if isinstance(item, A.FuncDecl) and item.kind == "op" and item.kernel is not None:
                kdecl = m.find(item.kernel.name)
                kname = (
                    kdecl.qualified_name
                    if isinstance(kdecl, A.FuncDecl)
                    else f"{module}::{item.kernel.name}"
                )
                out.append((item.qualified_name, kname))
    return sorted(out)


@dataclass
class OpCase:
    """One call of an op bound to a kernel, for concrete generics: a one-entry model that
    calls it (``text``), its inputs, and the kernel it binds. Built by :func:`op_case`."""

    op: str
    generics: dict[str, Any]
    kernel: str
    kernel_generics: dict[str, Any]
    applies: bool  # the kernel's where clause holds
    scalars: dict[str, Any]  # the op's (and kernel's) scalar arguments
    inputs: list[tuple[str, tuple[int, ...], str]]  # tensor parameters: name, shape, dtype
    results: list[tuple[str, tuple[int, ...], str]]
    text: str

    def random_inputs(
        self, device: str | torch.device = "cpu", seed: int = 0
    ) -> list[torch.Tensor]:
        """Normal random floats (integers in 0..7; 8-bit ones, quantised weights, over their
        whole range) of the inputs' shapes and dtypes."""
        from linnet.lang.check.kernel_cases import integer_range
        from linnet.lang.emit.torch import TORCH_DTYPES

        g = torch.Generator().manual_seed(seed)
        out = []
        for _, shape, dtype in self.inputs:
            dt = eval(TORCH_DTYPES[dtype], {"torch": torch})
            low, high = integer_range(dtype) if dtype in ("i8", "u8") else (0, 8)
            t = (
                torch.randn(shape, generator=g)
                if dt.is_floating_point
                else torch.randint(low, high, shape, generator=g)
            )
            out.append(t.to(dtype=dt, device=device))
        return out


def op_case(
    name: str,
    generics: dict[str, Any],
    scalars: dict[str, Any] | None = None,
    program: Program | str | Path | None = None,
) -> OpCase:
    """The :class:`OpCase` of op ``name`` for the op's ``generics``; ``scalars`` gives its
    scalar parameters (default 1e-5 for floats, 1 for ints).

    >>> case = op_case("std.nn.activation::softmax", {"R": 2, "C": 8})
    >>> case.kernel_generics, case.inputs
    ({'R': 2, 'C': 8, 'B': 1024}, [('x', (2, 8), 'f32')])
    """
    import linnet.lang.syntax.tree as A
    from linnet.lang.check.evaluate import Evaluator, Fail, Frame
    from linnet.lang.ir.builder import Builder
    from linnet.lang.tensors.dims import Dim

    prog = _program(program)
    kernel, kgen, holds = resolve(prog, name, generics)
    module, _, short = name.rpartition("::")
    decl = prog.module(module).find(short)  # type: ignore[union-attr]
    assert isinstance(decl, A.FuncDecl)
    ev = Evaluator(prog, Builder(None))
    env = {k: Dim.const(v) if isinstance(v, int) else v for k, v in generics.items()}
    frame = Frame(decl.module, env, None, decl)  # type: ignore[arg-type]
    inputs, args, given = [], [], dict(scalars or {})
    try:
        for p in decl.params:
            shape, dtype = ev.tensor_type(p.type, frame)  # type: ignore[arg-type]
            if isinstance(p.type, A.TensorType):
                inputs.append((p.name, tuple(int(d.value) for d in shape), dtype))  # type: ignore[arg-type]
                args.append(p.name)
            else:
                v = given.setdefault(p.name, 1e-5 if dtype.startswith(("f", "bf")) else 1)
                args.append(repr(v))
        results = []
        for i, r in enumerate(decl.results):
            shape, dtype = ev.tensor_type(r.type, frame)
            results.append((r.name or f"out{i}", tuple(int(d.value) for d in shape), dtype))  # type: ignore[arg-type]
    except Fail as f:
        raise LinnetError(f.diag) from None

    def ty(shape: tuple[int, ...], dtype: str) -> str:
        return f"Tensor[{', '.join(map(str, shape))}; {dtype}]"

    params = ", ".join(f"{n}: {ty(s, d)}" for n, s, d in inputs)
    rets = ", ".join(ty(s, d) for _, s, d in results)
    call = f"{short}({', '.join(args)})"
    # An entry returns each result: `return op(...)` of a several-result op is one value.
    names = ", ".join(f"r{i}" for i in range(len(results)))
    body = (
        f"        return {call}\n"
        if len(results) == 1
        else f"        let ({names}) = {call}\n        return {names}\n"
    )
    text = (
        f"use {module}::{{{short}}}\n\nmodel Case {{\n    entry run({params}) -> "
        f"{rets if len(results) == 1 else '(' + rets + ')'} {{\n"
        f"{body}    }}\n}}\n"
    )
    return OpCase(
        name,
        dict(generics),
        kernel,
        kgen,
        holds,
        {k: v for k, v in given.items()},
        inputs,
        results,
        text,
    )


def _any_item(module: str) -> str:
    """A public item of std module ``module``, for a `use` that loads it."""
    import linnet.lang.syntax.tree as A
    from linnet.lang.syntax.parser import parse
    from linnet.lang.syntax.program import STD_ROOT

    path = STD_ROOT.joinpath(*module.split(".")[1:]).with_suffix(".linnet")
    from linnet.lang.diagnostics.core import SourceFile

    tree = parse(SourceFile(str(path), path.read_text()), module)
    for item in tree.items:
        if isinstance(item, A.FuncDecl | A.BlockDecl) and item.public:
            return item.name
    return ""


def example_generics(
    name: str,
    rows: int,
    width: int,
    dtype: str = "bf16",
    program: Program | str | Path | None = None,
) -> dict[str, Any] | None:
    """Generics for op ``name`` like a model's: the first dim ``rows`` (1 for decode, a
    prompt's length for prefill), the other dims ``width`` or, where the kernel's where
    clause needs smaller, the largest power of two below it that it takes; where no such
    width does, one dim below the others (a group count: ``linear_q4_gemv``'s kernel needs
    an even group I / NG); DTypes ``dtype``. None if no such choice lets the kernel run.

    >>> example_generics("std.nn.activation::softmax", 1, 4096)
    {'R': 1, 'C': 1024}
    >>> example_generics("std.nn.quant::linear_q4_gemv", 1, 64)
    {'N': 1, 'I': 64, 'O': 64, 'NG': 32, 'T': 'bf16'}
    """
    import linnet.lang.syntax.tree as A

    prog = _program(program)
    module, _, short = name.rpartition("::")
    _ensure_module(prog, module, short)
    decl = prog.module(module).find(short)  # type: ignore[union-attr]
    assert isinstance(decl, A.FuncDecl)
    dims = [g.name for g in decl.generics if g.kind == "Dim"]

    def applies(gen: dict[str, Any]) -> bool:
        try:
            return bool(resolve(prog, name, gen)[2]) and _op_where_holds(prog, decl, gen)
        except LinnetError:
            return False

    def widths() -> Iterator[int]:
        w = width
        while w >= 1:
            yield w
            w //= 2

    def at(w: int) -> dict[str, Any]:
        return {
            g.name: dtype if g.kind == "DType" else (rows if g.name == dims[0] else w)
            for g in decl.generics
        }

    for w in widths():
        if applies(at(w)):
            return at(w)
    for w in widths():  # then one dim narrower than the rest
        for d in dims[1:]:
            v = w // 2
            while v >= 1:
                if applies(gen := at(w) | {d: v}):
                    return gen
                v //= 2
    return None
