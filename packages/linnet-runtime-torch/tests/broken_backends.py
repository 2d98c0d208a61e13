"""Deliberately broken backends (test fixtures for the adversarial suite, issue 11).

Each misbehaves in one way a plugin could: regions that reorder a KV cache's write and read,
outputs that are not the region's, executables that are not executables, meta that lies,
prepare or execute that raise, estimates that are garbage; and (issue 38) outputs of the
right shape with wrong values, `match` results that are not Regions of the graph, and two
algorithms for one region.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from linnet.backends import CONTRACT, Capabilities, Cost, ExecutableMeta, Region, region_kind
from linnet.torch.interpreter import RULES
from reference_backends import LINEAR, LinearCall, RefLinear, linear_calls

K_CACHE = "model.layers.0.self_attn.k_cache"


# ------------------------------------------------------------ regions across a state write
def across_scatter(graph) -> list[int]:
    """k_rot's add, and layer 0's attention scores that read k_cache with what they read
    from the steps between (the query's reshape): every SSA operand is made in time, but
    the scatter of k_rot into k_cache, which the scores read, is skipped."""
    write = next(
        i for i, s in enumerate(graph.steps) if s.op == "scatter" and s.operands[0] == "@" + K_CACHE
    )
    read = next(
        i for i, s in enumerate(graph.steps) if s.op != "scatter" and "@" + K_CACHE in s.operands
    )
    producers = graph.producers()
    steps, todo = set(), [write - 1, read]
    while todo:
        i = todo.pop()
        if i in steps:
            continue
        steps.add(i)
        todo += [
            producers[o]
            for o in graph.steps[i].operands
            if o in producers and producers[o] >= write - 1
        ]
    return sorted(steps)


class Interpret:
    """Runs its region's steps one by one (the interpreter's rules), reading parameters and
    states from ``context.parameters`` as the contract says: a correct executable, so that
    any wrong result comes from where the plan runs it."""

    def __init__(self, region: Region):
        self.region = region
        self.meta = ExecutableMeta()

    def prepare(self, context):
        pass

    def execute(self, inputs, outputs, context):
        graph = self.region.graph
        env = dict(zip(self.region.inputs, inputs))
        for i in self.region.steps:
            step = graph.steps[i]
            args = [
                context.parameters[o[1:]] if o.startswith("@") else env[o] for o in step.operands
            ]
            out = RULES[step.op](step, args, context.device)
            if step.results:
                env[step.results[0]] = out
        return [env[o] for o in self.region.outputs]


class Base:
    version = "1.0"
    contract = CONTRACT

    def probe(self, target):
        return Capabilities()

    def estimate_cost(self, region, target):
        return None


class AcrossScatter(Base):
    """Claims steps that read k_cache across the scatter that writes it (Region.of_steps)."""

    name = "across-scatter"

    def match(self, graph, target):
        return [Region.of_steps(graph, across_scatter(graph))]

    def compile(self, region, target, options):
        return Interpret(region)


class HandBuilt(Base):
    """The same steps, with the Region built by hand (no Region.of_steps to refuse it)."""

    name = "hand-built"

    def match(self, graph, target):
        steps = across_scatter(graph)
        made = {r for i in steps for r in graph.steps[i].results}
        inputs = tuple(
            dict.fromkeys(
                o
                for i in steps
                for o in graph.steps[i].operands
                if not o.startswith("@") and o not in made
            )
        )
        users = {o for j, s in enumerate(graph.steps) if j not in steps for o in s.operands}
        outputs = tuple(
            r for i in steps for r in graph.steps[i].results if r in users or r in graph.outputs
        )
        states = (K_CACHE,)
        region = Region(graph, tuple(steps), None, inputs, outputs, (), states, "")
        object.__setattr__(region, "kind", region_kind(region))  # all it says is consistent
        return [region]

    def compile(self, region, target, options):
        return Interpret(region)


class CacheWrite(Base):
    """Claims layer 0's k_rot and its write into k_cache; ``wrong`` doubles the cache after
    (k_rot, the region's output, stays right): only the state shows the fault."""

    def __init__(self, wrong: bool = False):
        self.wrong = wrong
        self.name = "wrong-cache-write" if wrong else "cache-write"

    def match(self, graph, target):
        write = next(
            i
            for i, s in enumerate(graph.steps)
            if s.op == "scatter" and s.operands[0] == "@" + K_CACHE
        )
        return [Region.of(graph, write - 1, write + 1)]

    def compile(self, region, target, options):
        return _Doubling(region) if self.wrong else Interpret(region)


class _Doubling(Interpret):
    def execute(self, inputs, outputs, context):
        out = super().execute(inputs, outputs, context)
        context.parameters[K_CACHE].mul_(2)
        return out


class MadeUpKind(RefLinear):
    """Linear regions whose kind is made up (they would share one timing)."""

    name = "made-up-kind"

    def match(self, graph, target):
        out = []
        for region in super().match(graph, target):
            object.__setattr__(region, "kind", "same-for-all")
            out.append(region)
        return out


# ------------------------------------------------------------ outputs that are not the region's
BAD_OUTPUTS = (
    "float",
    "none",
    "garbage",
    "bare-tensor",
    "empty",
    "extra",
    "slice",
    "dtype",
    "device",
    "list-of-none",
)


class BadOutputCall(LinearCall):
    def __init__(self, region, how):
        super().__init__(region)
        self.how = how

    def execute(self, inputs, outputs, context):
        (good,) = super().execute(inputs, outputs, context)
        how = self.how
        if how == "float":
            return [float(good.sum())]
        if how == "none":
            return None
        if how == "garbage":
            return "fast!"
        if how == "bare-tensor":
            return good
        if how == "empty":
            return []
        if how == "extra":
            return [good, good]
        if how == "slice":
            return [good[..., :1]]  # [1, 1] where [1, 64] is declared: it would broadcast
        if how == "dtype":
            return [good.double()]
        if how == "device":
            return [torch.empty(good.shape, dtype=good.dtype, device="meta")]
        if how == "list-of-none":
            return [None]
        if how == "nan":
            return [torch.full_like(good, math.nan)]
        if how == "inf":
            return [torch.full_like(good, math.inf)]
        if how == "zeros":  # of the right shape, dtype and device: only the values are wrong
            return [torch.zeros_like(good)]
        if how == "scaled":
            return [good * 1.5]
        if how == "int":
            return [good.to(torch.int32)]
        raise AssertionError(how)


class BadOutputs(RefLinear):
    """Claims the LM head only (one region) and returns ``how``'s wrong outputs."""

    def __init__(self, how: str, every: bool = False):
        super().__init__()
        self.how, self.every = how, every
        self.name = f"bad-outputs-{how}"

    def match(self, graph, target):
        calls = linear_calls(graph)
        calls = calls if self.every else calls[-1:]
        return [Region.of(graph, c.start, c.stop, c.index) for c in calls]

    def compile(self, region, target, options):
        return BadOutputCall(region, self.how)


# ------------------------------------------------------------ executables that lie or raise
class Meta:
    def __init__(self, holds):
        self.holds = holds


class LyingHolds(RefLinear):
    """A frozen ExecutableMeta does not check its fields: holds="lots" gets through."""

    def __init__(self, holds: Any):
        super().__init__()
        self.bad = holds
        self.name = f"holds-{holds!r}"

    def compile(self, region, target, options):
        call = LinearCall(region)
        call.meta = ExecutableMeta((), (), holds=self.bad)
        return call


class CompileGives(RefLinear):
    """``compile`` returns ``what`` instead of an executable."""

    def __init__(self, what: Any, label: str):
        super().__init__()
        self.what = what
        self.name = f"compile-gives-{label}"

    def compile(self, region, target, options):
        return self.what


class NoMethods:
    meta = ExecutableMeta()


class NotCallable:
    meta = ExecutableMeta()
    prepare = None
    execute = "no"


class CompileRaises(RefLinear):
    name = "compile-raises"

    def compile(self, region, target, options):
        raise RuntimeError("no kernel for this shape")


class RaisingCall(LinearCall):
    def __init__(self, region, where: str, after: int):
        super().__init__(region)
        self.where, self.after, self.calls = where, after, {"prepare": 0, "execute": 0}

    def _maybe(self, method):
        self.calls[method] += 1
        if method == self.where and self.calls[method] > self.after:
            raise RuntimeError(f"{method} blew up (call {self.calls[method]})")

    def prepare(self, context):
        self._maybe("prepare")

    def execute(self, inputs, outputs, context):
        self._maybe("execute")
        return super().execute(inputs, outputs, context)


class Raises(RefLinear):
    """The executables' ``where`` ("prepare" or "execute") raises after ``after`` calls."""

    def __init__(self, where: str, after: int = 0):
        super().__init__()
        self.where, self.after = where, after
        self.name = f"{where}-raises-after-{after}"

    def compile(self, region, target, options):
        return RaisingCall(region, self.where, self.after)


class MatchGives(RefLinear):
    def __init__(self, what: Any, label: str):
        super().__init__()
        self.what = what
        self.name = f"match-gives-{label}"

    def match(self, graph, target):
        return self.what


# ------------------------------------------------------------ estimates
class Estimates(RefLinear):
    """Every linear, with ``estimate_cost`` giving ``what`` (a Cost, garbage, or raising)."""

    def __init__(self, what: Any, label: str, name: str = ""):
        super().__init__()
        self.what = what
        self.name = name or f"estimates-{label}"

    def estimate_cost(self, region, target):
        if isinstance(self.what, BaseException):
            raise self.what
        return self.what


class EstimatedSiblings(Base):
    """q/k/v joined, with an estimate (or none) per region."""

    def __init__(self, seconds: float | None):
        from reference_backends import RefSiblings

        self.inner = RefSiblings()
        self.seconds = seconds
        self.name = "estimated-siblings"

    def match(self, graph, target):
        return self.inner.match(graph, target)

    def compile(self, region, target, options):
        return self.inner.compile(region, target, options)

    def estimate_cost(self, region, target):
        return None if self.seconds is None else Cost(self.seconds)


# ------------------------------------------------------------ issue 38: wrong values, right shape
ATTENTION = "std.nn.attention::decode_attention"


class Zeros(Interpret):
    """The region's outputs as zeros of the declared shape and dtype."""

    def execute(self, inputs, outputs, context):
        return [torch.zeros_like(t) for t in super().execute(inputs, outputs, context)]


class DecodeAttention(Base):
    """Claims each layer's decode attention (it reads the KV cache the step just wrote);
    ``zeros``: returns zeros, which equal the generated source's only on a cache that does
    not hold this step's k and v."""

    def __init__(self, zeros: bool = False):
        self.zeros = zeros
        self.name = "zero-attention" if zeros else "interpreted-attention"

    def match(self, graph, target):
        return [Region.of(graph, c.start, c.stop, c.index) for c in graph.semantic_calls(ATTENTION)]

    def compile(self, region, target, options):
        return Zeros(region) if self.zeros else Interpret(region)


# ------------------------------------------------------------ issue 38: match results
class MatchGivesEach(RefLinear):
    """``match`` gives the LM head's region, then whatever ``extra(graph)`` returns."""

    def __init__(self, extra, label: str):
        super().__init__()
        self.extra = extra
        self.name = f"match-gives-{label}"

    def match(self, graph, target):
        head = linear_calls(graph)[-1]
        return [Region.of(graph, head.start, head.stop, head.index), *self.extra(graph)]


def hand_region(graph, steps, callee: str = LINEAR) -> Region:
    """A Region built by hand (no checks), with a callee so ``explain`` names it."""
    return Region(graph, steps, None, (), (), (), (), "", callee, "lm_head")


# ------------------------------------------------------------ issue 38: two algorithms
class SlowCall(LinearCall):
    """The same product as LinearCall, another class (an algorithm told apart by class)."""


class TwoAlgorithms(RefLinear):
    """The LM head offered twice: a slow executable first, then a fast one. ``how`` tells
    them apart: "named" (ExecutableMeta.algorithm), "class" (two classes, no names) or
    "order" (one class, no names: told apart by order)."""

    def __init__(self, how: str, delay: float = 0.005):
        super().__init__()
        self.how, self.delay = how, delay
        self.name = f"two-algorithms-{how}"
        self.slow: set[int] = set()

    def match(self, graph, target):
        head = linear_calls(graph)[-1]
        slow = Region.of(graph, head.start, head.stop, head.index)
        fast = Region.of(graph, head.start, head.stop, head.index)
        self.slow.add(id(slow))
        return [slow, fast]

    def compile(self, region, target, options):
        slow = id(region) in self.slow
        kind = SlowCall if slow and self.how == "class" else LinearCall
        call = kind(region, delay=self.delay if slow else 0.0)
        if self.how == "named":
            call.meta = ExecutableMeta(algorithm="slow" if slow else "fast")
        return call


class BadAlgorithm(RefLinear):
    """An executable whose meta.algorithm is not a str."""

    name = "bad-algorithm"

    def compile(self, region, target, options):
        call = LinearCall(region)
        call.meta = ExecutableMeta(algorithm=3)  # type: ignore[arg-type]
        return call
