"""The backend contract under attack (issue 11): regions that would reorder state reads and
writes, and plugins whose probe misbehaves in `linnet backends`.

Regions are built on the toy Llama's decode graph, whose layer 0 scatters k_rot into its
k_cache (and v into v_cache) and then reads both caches in the attention product.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import types
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.backends import (
    CONTRACT,
    Capabilities,
    Region,
    RegionError,
    Target,
    discovery,
    here,
    skipped,
)
from linnet.backends.cli import register_backends
from linnet.lang import Graph, check_file, lower

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "examples" / "llama" / "llama.linnet"
K_CACHE = "model.layers.0.self_attn.k_cache"
V_CACHE = "model.layers.0.self_attn.v_cache"


@cache
def decode() -> Graph:
    config = json.loads((LLAMA.parent / "configs" / "toy.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    return lower(check_file(LLAMA), "decode", {"token": [1], "pos": [1]}, config, check=False)


def step_of(graph: Graph, op: str, operand: str) -> int:
    return next(i for i, s in enumerate(graph.steps) if s.op == op and operand in s.operands)


def scatter_of(graph: Graph, state: str) -> int:
    return step_of(graph, "scatter", "@" + state)


def reader_of(graph: Graph, state: str) -> int:
    return next(
        i for i, s in enumerate(graph.steps) if s.op != "scatter" and "@" + state in s.operands
    )


def state_effects(graph: Graph, i: int) -> tuple[set[str], set[str]]:
    """(states read, states written) by step i: a scatter writes its first operand."""
    step = graph.steps[i]
    refs = [o[1:] for o in step.operands if o.startswith("@") and o[1:] in graph.states]
    if step.op == "scatter":
        return set(refs[1:]), set(refs[:1])
    return set(refs), set()


def legal_reorder(graph: Graph, steps: list[int]) -> bool:
    """The oracle: running sorted(steps) at the first keeps every state access in order
    against each skipped step between (checked pairwise, independently of contract.py)."""
    chosen = sorted(set(steps))
    inside = set(chosen)
    for i in chosen:
        for j in range(chosen[0], i):
            if j in inside:
                continue
            ri, wi = state_effects(graph, i)
            rj, wj = state_effects(graph, j)
            if (ri & wj) or (wi & rj) or (wi & wj):
                return False
    return True


# ------------------------------------------------------------------ item 1: state hazards
def test_read_moved_before_the_scatter_that_writes_it_is_refused():
    graph = decode()
    write, read = scatter_of(graph, K_CACHE), reader_of(graph, K_CACHE)
    assert write < read
    # k_rot's add (before the scatter) with the attention read and what it reads from the
    # steps between (the query's reshape): the scatters are skipped.
    steps = closed(graph, [write - 1, read], write - 1)
    assert write not in steps
    with pytest.raises(RegionError) as err:
        Region.of_steps(graph, steps)
    text = str(err.value)
    assert K_CACHE in text and f"step {read}" in text and f"step {write}" in text
    assert "reads state" in text


def test_write_moved_before_a_skipped_read_of_the_same_state():
    """A scatter that runs after a read of its state, moved before that read."""
    graph = decode()
    # Different states do not order each other: the v_cache scatter may run before the
    # k_cache scatter it skips.
    k_write, v_write = scatter_of(graph, K_CACHE), scatter_of(graph, V_CACHE)
    assert Region.of_steps(graph, [k_write - 1, v_write]).steps == (k_write - 1, v_write)
    # Decode scatters before it reads; a graph whose read comes first (layer 0's k scatter
    # moved after the attention read) has the other hazard.
    g = _graph_with_read_before_write()
    read, write = reader_of(g, K_CACHE), scatter_of(g, K_CACHE)
    assert read < write
    steps = closed(g, [read - 1, write], read - 1)
    assert read not in steps
    with pytest.raises(RegionError) as err:
        Region.of_steps(g, steps)
    text = str(err.value)
    assert "writes state" in text and K_CACHE in text
    assert f"step {write}" in text and f"step {read}" in text and "reads it" in text


def _graph_with_read_before_write() -> Graph:
    """decode's graph with layer 0's k scatter moved to just after the attention read (the
    SSA order still holds: the scatter makes no value)."""
    import copy

    g = copy.copy(decode())
    steps = list(g.steps)
    write = scatter_of(g, K_CACHE)
    read = reader_of(g, K_CACHE)
    moved = steps.pop(write)
    steps.insert(read, moved)  # after the read (which shifted down by one)
    g.steps = steps
    return g


def test_two_writes_of_one_state_keep_their_order():
    g = decode()
    import copy

    g = copy.copy(g)
    steps = list(g.steps)
    write = scatter_of(g, K_CACHE)
    steps.insert(write + 1, steps[write])  # a second scatter into k_cache
    g.steps = steps
    with pytest.raises(RegionError, match=r"writes state .*k_cache.* which step"):
        Region.of_steps(g, [write - 1, write + 1])


def test_ranges_never_reorder_so_region_of_spans_across_writes():
    graph = decode()
    write, read = scatter_of(graph, K_CACHE), reader_of(graph, K_CACHE)
    region = Region.of(graph, write - 1, read + 1)
    assert region.steps == tuple(range(write - 1, read + 1))
    assert K_CACHE in region.states
    assert region.writes_state


def closed(graph: Graph, seeds: list[int], lo: int) -> list[int]:
    """``seeds`` and every step at or after ``lo`` that makes a value they read (so that the
    SSA check passes and only states decide)."""
    producers = graph.producers()
    out, todo = set(), list(seeds)
    while todo:
        i = todo.pop()
        if i in out:
            continue
        out.add(i)
        for o in graph.steps[i].operands:
            j = producers.get(o)
            if j is not None and j >= lo:
                todo.append(j)
    return sorted(out)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_of_steps_agrees_with_the_pairwise_oracle(data):
    """Around layer 0's attention (both scatters and both reads): of_steps accepts a set of
    steps closed under its SSA operands exactly when no state access is reordered against
    a step it skips."""
    graph = decode()
    lo, hi = scatter_of(graph, K_CACHE) - 4, reader_of(graph, V_CACHE) + 2
    seeds = data.draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4, unique=True))
    steps = closed(graph, seeds, lo)
    legal = legal_reorder(graph, steps)
    try:
        region = Region.of_steps(graph, steps)
    except RegionError as exc:
        assert not legal, (steps, exc)
        assert "state" in str(exc)
        return
    assert legal, steps
    assert region.steps == tuple(steps)


# ------------------------------------------------------------------ item 11: probe in CLI
class _Good:
    name = "good-one"
    version = "1"
    contract = CONTRACT

    def probe(self, target):
        return Capabilities()

    def match(self, graph, target):
        return []

    def compile(self, region, target, options):
        raise AssertionError("never planned")

    def estimate_cost(self, region, target):
        return None


class _ProbeRaises(_Good):
    name = "probe-raises"

    def probe(self, target):
        raise RuntimeError("no driver here")


class _ProbeGarbage(_Good):
    name = "probe-garbage"

    def probe(self, target):
        return "yes please"


class _ProbeDeclines(_Good):
    name = "probe-declines"

    def probe(self, target):
        return None


class _ProbeExits(_Good):
    name = "probe-exits"

    def probe(self, target):
        raise SystemExit(3)


class _EP:
    group = discovery.GROUP

    def __init__(self, name, value):
        self.name, self.value, self.dist = name, value, None


@pytest.fixture
def installed(monkeypatch):
    module = types.ModuleType("adversarial_probe_plugins")
    classes = [_Good, _ProbeRaises, _ProbeGarbage, _ProbeDeclines, _ProbeExits]
    for cls in classes:
        setattr(module, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    eps = [_EP(c.name, f"{module.__name__}:{c.__name__}") for c in classes]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: list(eps))
    monkeypatch.setattr(discovery, "_cache", None)


def test_a_backend_whose_probe_raises_is_not_available(installed):
    names = [b.name for b in discovery.available()]
    # A probe that declines is available (it may run on another target); one that raises or
    # returns something else is broken and left out.
    assert names == ["good-one", "probe-declines"]
    reasons = {r.name: r for r in skipped()}
    assert set(reasons) == {"probe-raises", "probe-garbage", "probe-exits"}
    assert "probe for cpu raised RuntimeError" in reasons["probe-raises"].reason
    assert "no driver here" in reasons["probe-raises"].detail
    assert "returned a str" in reasons["probe-garbage"].reason
    assert "SystemExit" in reasons["probe-exits"].reason


def test_linnet_backends_lists_probe_failures_as_skipped(installed, capsys):
    parser = argparse.ArgumentParser(prog="linnet")
    register_backends(parser.add_subparsers())
    args = parser.parse_args(["backends", "--format", "json"])
    assert args.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    # "available" means it can run here (issue 46 item 13): a backend whose probe declines
    # every target of this machine loaded, but is listed as unavailable, with its answers.
    assert [a["name"] for a in data["available"]] == ["good-one"]
    assert [a["name"] for a in data["unavailable"]] == ["probe-declines"]
    assert {t["state"] for t in data["unavailable"][0]["targets"]} == {"declines"}
    assert {s["name"] for s in data["skipped"]} == {"probe-raises", "probe-garbage", "probe-exits"}
    # A probe at fault is a coded finding (E0777), never a traceback.
    assert {s["code"] for s in data["skipped"]} == {"E0777"}


# ------------------------------------------------------------------ issue 46 item 13
# `linnet backends` probes every loaded backend on every target of the machine: whatever a
# plugin's probe or decline_reason does there, the command answers (text or parseable JSON),
# never with a traceback, and never calls a backend that declines everything available.
CPU = discovery.HOST
GPU = Target("cuda", "cuda:0", "NVIDIA H100", (9, 0), "torch")


def _backend(name, probe, decline_reason=None):
    attributes = {"name": name, "probe": probe}
    if decline_reason is not None:
        attributes["decline_reason"] = decline_reason
    return type(f"Backend_{name.replace('-', '_')}", (_Good,), attributes)


def _raise(error):
    def method(self, target):
        raise error

    return method


def _declines(self, target):
    return None


def _cpu_or_raise(error):
    """A probe that accepts the CPU and raises ``error`` on any other target."""

    def probe(self, target):
        if target.kind == "cpu":
            return Capabilities()
        raise error

    return probe


def _answer(value):
    return lambda self, target: value


def _prints(self, target):
    print("probing", target.kind, "{not json")
    return Capabilities()


def _garbage_on_gpu(self, target):
    return Capabilities() if target.kind == "cpu" else {"dtypes": ["f16"]}


HERE_CASES = [
    # (backend, state on the CPU, state on the GPU, text expected in the GPU's reason)
    (
        _backend("reason-raises", _declines, _raise(RuntimeError("no nvml"))),
        "declines",
        "declines",
        "(its decline_reason raised RuntimeError: no nvml)",
    ),
    (
        _backend("reason-exits", _declines, _raise(SystemExit(4))),
        "declines",
        "declines",
        "(its decline_reason raised SystemExit: 4)",
    ),
    (
        _backend("reason-list", _declines, _answer(["no", "gpu"])),
        "declines",
        "declines",
        "(its decline_reason returned a list, not a sentence)",
    ),
    (
        _backend("reason-lines", _declines, _answer("needs\n  a GPU\n")),
        "declines",
        "declines",
        "needs a GPU",
    ),
    (_backend("reason-none", _declines, _answer(None)), "declines", "declines", ""),
    (
        _backend("accepts-despite-reason", _answer(Capabilities()), _raise(AssertionError)),
        "runs",
        "runs",
        "",
    ),
    (
        _backend("raises-on-gpu", _cpu_or_raise(RuntimeError("CUDA error: no kernel image"))),
        "runs",
        "fault",
        "probe for cuda raised RuntimeError",
    ),
    (
        _backend("exits-on-gpu", _cpu_or_raise(SystemExit(1))),
        "runs",
        "fault",
        "probe for cuda raised SystemExit",
    ),
    (
        _backend("garbage-on-gpu", _garbage_on_gpu),
        "runs",
        "fault",
        "probe for cuda returned a dict, not Capabilities or None",
    ),
    (_backend("prints", _prints), "runs", "runs", ""),
]


@pytest.mark.parametrize(
    ("backend", "on_cpu", "on_gpu", "reason"), HERE_CASES, ids=[case[0].name for case in HERE_CASES]
)
def test_linnet_backends_survives_any_probe_on_any_target(
    backend, on_cpu, on_gpu, reason, monkeypatch, capsys
):
    module = types.ModuleType("adversarial_here_plugins")
    module.Factory = backend
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [_EP(backend.name, f"{module.__name__}:Factory")],
    )
    monkeypatch.setattr(discovery, "_cache", None)
    monkeypatch.setattr(here, "this_machine", lambda: here.Machine((CPU, GPU)))
    parser = argparse.ArgumentParser(prog="linnet")
    register_backends(parser.add_subparsers())
    for form in ("json", "text"):
        args = parser.parse_args(["backends", "--format", form])
        assert args.run(args) == 0
        out = capsys.readouterr().out
        assert "Traceback" not in out
        if form == "text":
            assert backend.name in out and reason in out
            continue
        data = json.loads(out)  # a probe that prints never corrupts the JSON
        (entry,) = data["available"] + data["unavailable"]
        assert [t["state"] for t in entry["targets"]] == [on_cpu, on_gpu]
        assert entry["runnable"] is (on_cpu == "runs" or on_gpu == "runs")
        gpu = entry["targets"][1]
        assert gpu["reason"] == reason
        assert gpu["code"] == ("E0777" if on_gpu == "fault" else "")


def test_keyboard_interrupt_in_a_probe_of_the_gpu_propagates(monkeypatch):
    backend = _backend("interrupts", _cpu_or_raise(KeyboardInterrupt()))()
    found = discovery.Found(backend, "dist", "1", "m:a")
    with pytest.raises(KeyboardInterrupt):
        here.survey(discovery.Discovery((found,), ()), here.Machine((CPU, GPU)))
