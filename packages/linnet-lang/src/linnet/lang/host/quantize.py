"""Quantised weights on load, shared by the runtimes (pure Python: names, shapes, formats).

A model whose `Linear` / `Proj` blocks read the configs ``weight_bits`` and ``weight_group``
(every std decoder model) runs with 8- or 4-bit weights: ``load(..., quantize="int8")``
lowers the model once with its float checkpoint and once quantised, and the difference is
the layout: each float ``X.weight`` that the quantised model no longer has becomes
``X.weight_q8`` and ``X.weight_scale`` (int8), or ``X.weight_q4``, ``X.weight_scale`` and
``X.weight_min`` (int4, two levels a byte). The program decides which weights those are,
not a name pattern: the embedding table, norms and a tied LM head stay in float.
The runtimes compute the quantised tensors (``linnet.torch.quantize``); the formats are
what ``std.nn.linear::linear_q8`` and ``linear_q4`` define (docs/quantization.md).

>>> parse_quantize("int4")
Quantize(format='int4', group=None)
>>> parse_quantize({"format": "int8", "group": 64})
Quantize(format='int8', group=64)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linnet.lang.diagnostics.core import Diagnostic, LinnetError

#: format -> (weight_bits, the parameters that replace ``weight``, in order).
FORMATS: dict[str, tuple[int, tuple[str, ...]]] = {
    "int8": (8, ("weight_q8", "weight_scale")),
    "int4": (4, ("weight_q4", "weight_scale", "weight_min")),
}

#: The group sizes tried, largest first, when none is given: the largest that divides the
#: inputs of every quantised weight (128 for Llama 3 8B, 64 for SmolLM2's 576).
GROUPS = (128, 64, 32)


@dataclass(frozen=True)
class Quantize:
    """A quantisation asked for: ``format`` ``"int8"`` or ``"int4"``; ``group``, inputs
    that share one f16 scale (None: the largest of :data:`GROUPS` that divides them all).

    >>> Quantize("int8", 128).bits
    8
    """

    format: str
    group: int | None = None

    @property
    def bits(self) -> int:
        return FORMATS[self.format][0]


def scale_overflow(name: str) -> LinnetError:
    """E0684: weight ``name`` has a group whose scale (or offset) overflows f16; both
    runtimes' quantisers raise it.

    >>> scale_overflow("lm_head.weight").diagnostics[0].code
    'E0684'
    """
    return LinnetError(
        Diagnostic(
            "E0684",
            f"weight `{name}` cannot be quantised: a group's scale overflows f16 "
            "(weights larger than about 8e6 in magnitude)",
            help="load it without quantize=; a trained checkpoint's weights are far "
            "smaller, so check that the file is the one you meant",
        )
    )


def _bad(value: Any, why: str) -> LinnetError:
    return LinnetError(
        Diagnostic(
            "E0681",
            f"quantize={value!r} is not a quantisation: {why}",
            help='pass quantize="int8" or "int4", or {"format": "int4", "group": 128} '
            "(group: inputs sharing one scale, a positive multiple of 2); None loads the "
            "weights as stored, False every weight in float (a GGUF file dequantised)",
        )
    )


def parse_quantize(value: Any) -> Quantize | bool | None:
    """``load``'s ``quantize=`` checked: None (as stored; a GGUF file's Q8_0/Q4_0/Q4_1
    blocks kept), False (everything in float), ``"int8"``, ``"int4"``, a :class:`Quantize`
    or a dict ``{"format": ..., "group": ...}``; anything else is E0681.

    >>> parse_quantize(None) is None, parse_quantize(False)
    (True, False)
    """
    if value is False:
        return False
    if value is None or isinstance(value, Quantize):
        if isinstance(value, Quantize):
            parse_quantize({"format": value.format, "group": value.group})
        return value
    if isinstance(value, str):
        if value not in FORMATS:
            raise _bad(value, f"the formats are {', '.join(FORMATS)}")
        return Quantize(value)
    if isinstance(value, dict):
        extra = sorted(set(value) - {"format", "group"})
        if extra:
            raise _bad(value, f"unknown key {extra[0]!r}")
        fmt = value.get("format")
        if fmt not in FORMATS:
            raise _bad(value, f"format must be one of {', '.join(FORMATS)}")
        group = value.get("group")
        if group is not None and (
            isinstance(group, bool) or not isinstance(group, int) or group < 2 or group % 2
        ):
            raise _bad(value, "group must be a positive even integer")
        return Quantize(fmt, group)
    raise _bad(value, "expected a string or a dict")


@dataclass(frozen=True)
class Layout:
    """What quantising a checkpoint does: ``config``, the configs to lower with
    (``weight_bits``, ``weight_group``); ``sources``, each float weight quantised and the
    names that replace it; ``shapes``, the model's weights as the quantised model declares
    them (``(shape, dtype)`` by name).

    >>> Layout({}, {}, {}).quantized
    0
    """

    config: dict[str, Any]
    sources: dict[str, tuple[str, ...]]
    shapes: dict[str, tuple[tuple[int, ...], str]]

    @property
    def quantized(self) -> int:
        return len(self.sources)

    @property
    def group(self) -> int:
        return int(self.config.get("weight_group", 0))


def _declares(program: Any, name: str) -> bool:
    from linnet.lang.check.driver import find_model

    decl = find_model(program, None)
    return any(m.kind == "config" and m.name == name for m in decl.members)


def quantized_layout(
    program: Any,
    config: dict[str, Any],
    shapes: dict[str, Any],
    quantize: Quantize,
) -> Layout:
    """The :class:`Layout` of ``program``'s float weights ``shapes`` quantised as
    ``quantize`` asks, from two lowerings of the model's first entry (float, then
    quantised). E0682: the model has no ``weight_bits`` config, or no weight it would
    quantise; E0683: no group size divides every quantised weight's inputs. Weights saved
    quantised in that format are kept as they are (a layout with no sources); in another,
    E0687.

    >>> layout = quantized_layout(program, cfg, shapes, Quantize("int4"))  # doctest: +SKIP
    >>> layout.sources["lm_head.weight"]                                  # doctest: +SKIP
    ('lm_head.weight_q4', 'lm_head.weight_scale', 'lm_head.weight_min')
    """
    from linnet.lang.check.driver import find_model
    from linnet.lang.check.lowering import lower, probe_inputs

    stored = stored_quantization(shapes)
    if stored:  # saved quantised weights: kept as they are, or E0687
        fmt = "int8" if stored["weight_bits"] == 8 else "int4"
        if fmt == quantize.format and quantize.group in (None, stored.get("weight_group")):
            return Layout(dict(stored), {}, {k: (tuple(v[0]), v[1]) for k, v in shapes.items()})
        raise LinnetError(
            Diagnostic(
                "E0687",
                f"the weights are already quantised ({fmt}, group "
                f"{stored.get('weight_group')}): quantize={quantize.format!r}"
                + (f" with group {quantize.group}" if quantize.group else "")
                + " would quantise quantised weights",
                help="load them without quantize= (they reload as saved), or quantise the "
                "float checkpoint they came from",
            )
        )
    decl = find_model(program, None)
    if not _declares(program, "weight_bits") or not _declares(program, "weight_group"):
        raise LinnetError(
            Diagnostic(
                "E0682",
                f"model `{decl.name}` cannot be quantised: it declares no `weight_bits` and "
                "`weight_group` configs",
                help="declare `config weight_bits: i32 = 16` and `config weight_group: Dim = "
                "32` in the model and build its layers from std.nn.linear::Linear (as every "
                "std model does), or load without quantize=",
            )
        )
    entry = next(m for m in decl.methods if m.kind == "entry")
    inputs = probe_inputs(entry, config)
    plain = {k: v for k, v in config.items() if k not in ("weight_bits", "weight_group")}
    floats = lower(program, entry.name, inputs, plain, shapes, check=False)
    dims = {
        k: v
        for k, v in {**floats.dims, **floats.dtypes}.items()
        if k not in ("weight_bits", "weight_group")
    }
    bits, names = FORMATS[quantize.format]
    # Which weights: lowered quantised at a group every size divides (2), then sized.
    probe = lower(
        program,
        entry.name,
        inputs,
        {**plain, **dims, "weight_bits": bits, "weight_group": 2},
        None,
        check=False,
    )
    sources: dict[str, tuple[str, ...]] = {}
    for path in floats.parameters:
        if path in probe.parameters or not path.endswith(".weight"):
            continue
        stem = path[: -len("weight")]
        targets = tuple(stem + n for n in names)
        if all(t in probe.parameters for t in targets):
            sources[path] = targets
    if not sources:
        raise LinnetError(
            Diagnostic(
                "E0682",
                f"model `{decl.name}` has no weight that weight_bits = {bits} quantises",
                help="its layers must be std.nn.linear::Linear or std.nn.decoder::Proj blocks; "
                "load without quantize=",
            )
        )
    inner = {p: int(floats.parameters[p].shape[-1]) for p in sources}
    group = quantize.group or next(
        (g for g in GROUPS if all(i % g == 0 for i in inner.values())), None
    )
    bad = sorted(p for p, i in inner.items() if group is None or i % group)
    if group is None or bad:
        sizes = sorted(set(inner.values()))
        raise LinnetError(
            Diagnostic(
                "E0683",
                (
                    f"group size {group} does not divide the {inner[bad[0]]} inputs of `{bad[0]}`"
                    if group is not None
                    else "none of the group sizes " + ", ".join(map(str, GROUPS)) + " divides "
                    "the inputs of every quantised weight"
                )
                + f" (input sizes: {', '.join(map(str, sizes))})",
                help='pass a group that divides them all: quantize={"format": '
                f'"{quantize.format}", "group": G}}',
            )
        )
    qconfig = {"weight_bits": bits, "weight_group": group}
    full = lower(program, entry.name, inputs, {**plain, **dims, **qconfig}, None, check=False)
    out = {p: (tuple(int(d) for d in v.shape), str(v.dtype)) for p, v in full.parameters.items()}
    return Layout(qconfig, sources, out)


def stored_quantization(shapes: dict[str, Any]) -> dict[str, int]:
    """The configs a checkpoint of quantised weights was saved with (a quantised model's
    ``params`` written to safetensors): ``weight_bits`` from its ``*.weight_q8`` or
    ``*.weight_q4`` tensors, ``weight_group`` from a weight's inputs over its scales' count;
    ``{}`` for a float checkpoint. The user's config, merged over it, still decides.

    >>> stored_quantization({"p.weight_q4": ((8, 32), "u8"), "p.weight_scale": ((8, 2), "f16")})
    {'weight_bits': 4, 'weight_group': 32}
    """
    for name, info in shapes.items():
        for suffix, bits, per_byte in ((".weight_q8", 8, 1), (".weight_q4", 4, 2)):
            if not name.endswith(suffix):
                continue
            scale = shapes.get(name[: -len(suffix)] + ".weight_scale")
            shape, scale_shape = tuple(info[0]), tuple(scale[0]) if scale else ()
            if len(shape) != 2 or len(scale_shape) != 2 or not scale_shape[1]:
                return {"weight_bits": bits}  # lowering names what is mis-shaped
            inputs = shape[1] * per_byte
            return {"weight_bits": bits, "weight_group": max(1, inputs // scale_shape[1])}
    return {}


def gguf_layout(
    program: Any,
    config: dict[str, Any],
    shapes: dict[str, Any],
    ckpt: Any,
    quantize: Quantize | bool | None,
    keep: bool = True,
) -> tuple[Layout | None, dict[str, tuple[str, ...]], str]:
    """How a GGUF file loads: the :class:`Layout` (None: every weight in float), the weights
    repacked from the file's blocks rather than dequantised (name -> the names replacing
    it), and a line for the progress report.

    ``quantize`` None keeps the file's Q8_0, Q4_0 or Q4_1 linear weights as they are when
    ``keep`` (the runtimes pass it on a GPU, where Linnet's kernels read quantised weights;
    on a CPU the op bodies would dequantise every weight at every step, slower than float),
    they are all of one kept format (:data:`linnet.lang.weights.gguf_quant.KEPT`) and the
    model can hold them; else the file is dequantised, as ``False`` asks. A format asked
    for repacks the weights already in it at group 32 (the group unless one is given) and
    quantises the rest from their dequantised values.

    >>> layout, repack, note = gguf_layout(program, cfg, shapes, ckpt, None)  # doctest: +SKIP
    """
    from linnet.lang.weights.gguf_quant import GROUP, KEPT, keepable

    if quantize is False:
        return None, {}, ""
    if isinstance(quantize, Quantize):
        fmt = quantize.format
        if quantize.group is None and any(
            keepable(t) and KEPT[t.quant] == fmt for t in ckpt.tensors.values()
        ):
            quantize = Quantize(fmt, GROUP)  # the file's blocks, kept as they are
        layout = quantized_layout(program, config, shapes, quantize)
    elif not keep:
        return None, {}, ""
    else:
        if not (_declares(program, "weight_bits") and _declares(program, "weight_group")):
            return None, {}, "dequantising the file's weights: the model cannot hold them quantised"
        probe = quantized_layout(program, config, shapes, Quantize("int8", GROUP))
        tensors = [ckpt.tensors.get(p) for p in probe.sources]  # the same for either format
        formats = {KEPT.get(t.quant) if t is not None and keepable(t) else None for t in tensors}
        if len(formats) != 1 or None in formats:
            kinds = sorted({t.quant for t in tensors if t is not None})
            return (
                None,
                {},
                f"dequantising the file's weights ({', '.join(kinds)}): only Q8_0, Q4_0 and "
                "Q4_1 linear weights of one kind are kept quantised",
            )
        fmt = formats.pop() or ""
        # The probe is the int8 layout already: lower again only for int4.
        layout = (
            probe
            if fmt == "int8"
            else quantized_layout(program, config, shapes, Quantize(fmt, GROUP))
        )
    repack = {}
    if layout.group == GROUP:
        for path, targets in layout.sources.items():
            t = ckpt.tensors.get(path)
            if t is not None and keepable(t) and KEPT[t.quant] == fmt:
                repack[path] = targets
    note = f"keeping {len(repack)} of the file's weights quantised ({fmt}, group {GROUP})" + (
        f", quantising {layout.quantized - len(repack)} more"
        if layout.quantized > len(repack)
        else ""
    )
    return layout, repack, note


__all__ = [
    "FORMATS",
    "GROUPS",
    "Layout",
    "Quantize",
    "gguf_layout",
    "parse_quantize",
    "quantized_layout",
    "scale_overflow",
    "stored_quantization",
]
