"""Small PyTorch backends that exercise the whole contract on the CPU (test helpers)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from linnet.backends import CONTRACT, Capabilities, ExecutableMeta, Region

LINEAR = "std.nn.linear::linear"


def linear_calls(graph):
    return [c for c in graph.semantic_calls(LINEAR) if c.stop > c.start]


class LinearCall:
    def __init__(self, region: Region, delay: float = 0.0, scale: float = 1.0, holds: int = 0):
        self.weight = region.parameters[0]
        self.delay = delay
        self.scale = scale
        self.meta = ExecutableMeta((), (), holds=holds)
        self.prepared = 0

    def prepare(self, context):
        self.prepared += 1

    def execute(self, inputs, outputs, context):
        if self.delay:
            time.sleep(self.delay)
        return [torch.matmul(inputs[0], context.parameters[self.weight].t()) * self.scale]


class RefLinear:
    """Claims every bias-free linear and runs it with a matmul."""

    name = "ref-linear"
    version = "1.0"
    contract = CONTRACT

    def __init__(
        self, delay: float = 0.0, scale: float = 1.0, holds: int = 0, kinds: tuple = ("cpu", "cuda")
    ):
        self.delay, self.scale, self.holds, self.kinds = delay, scale, holds, kinds

    def probe(self, target):
        return Capabilities() if target.kind in self.kinds else None

    def match(self, graph, target):
        return [Region.of(graph, c.start, c.stop, c.index) for c in linear_calls(graph)]

    def compile(self, region, target, options):
        return LinearCall(region, self.delay, self.scale, self.holds)

    def estimate_cost(self, region, target):
        return None


class FusedCall:
    """q, k and v as one product over weights joined by the context."""

    def __init__(self, region: Region, weights: list[str], sizes: list[int]):
        self.weights = weights
        self.sizes = sizes
        self.joined = None
        self.meta = ExecutableMeta()

    def prepare(self, context):
        if self.joined is None:
            self.joined = context.join(self.weights)
            if self.joined is None:
                self.joined = torch.cat([context.parameters[w] for w in self.weights])

    def execute(self, inputs, outputs, context):
        return list(torch.split(F.linear(inputs[0], self.joined), self.sizes, dim=-1))


class RefSiblings:
    """Claims linear calls that read the same input (q, k, v) as one region."""

    name = "ref-siblings"
    version = "1.0"
    contract = CONTRACT

    def probe(self, target):
        return Capabilities()

    def match(self, graph, target):
        groups: dict[str, list] = {}
        for c in linear_calls(graph):
            groups.setdefault(c.attributes["args"][0], []).append(c)
        regions = []
        for calls in groups.values():
            if len(calls) > 1:
                steps = [i for c in calls for i in range(c.start, c.stop)]
                regions.append(Region.of_steps(graph, steps, calls[0].index))
        return regions

    def compile(self, region, target, options):
        graph = region.graph
        sizes = [graph.parameters[p].shape[0] for p in region.parameters]
        return FusedCall(region, list(region.parameters), sizes)

    def estimate_cost(self, region, target):
        return None


class Declines(RefLinear):
    name = "declines"

    def probe(self, target):
        return None


class ProbeRaises(RefLinear):
    name = "probe-raises"

    def probe(self, target):
        raise RuntimeError("no driver")


class OldContract(RefLinear):
    name = "old-contract"
    contract = CONTRACT - 1
