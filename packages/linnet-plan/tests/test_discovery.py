"""Discovery through the `linnet.backends` entry-point group, with fake entry points.

Each test installs fake entry points (and the modules they name) and checks what
`available()` and `skipped()` say: every reason a plugin is left out, and the host living on.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import sys
import types
from pathlib import PurePosixPath

import pytest
from linnet.backends import (
    CONTRACT,
    Capabilities,
    SkipRecord,
    Target,
    available,
    discover,
    discovery,
    here,
    runnable,
    skipped,
)
from linnet.backends.cli import register_backends

_unique = itertools.count()


class FakeDistribution:
    def __init__(self, name: str, version: str = "1.0", location: str = "/site") -> None:
        self.name = name
        self.version = version
        self.metadata = {"Name": name}
        self._location = location

    def locate_file(self, path: str) -> PurePosixPath:
        return PurePosixPath(self._location) / path


class FakeEntryPoint:
    group = discovery.GROUP

    def __init__(self, name: str, value: str, dist: FakeDistribution | None) -> None:
        self.name = name
        self.value = value
        self.dist = dist


class Backend:
    """A backend that meets the contract; tests derive broken ones from it."""

    name = "fake"
    version = "0.1"
    contract = CONTRACT

    def probe(self, target):
        return Capabilities()

    def match(self, graph, target):
        return []

    def compile(self, region, target, options):
        raise RuntimeError("discovery tests never plan, so nothing is compiled")

    def estimate_cost(self, region, target):
        return None


def backend_class(name: str, **attributes) -> type:
    return type(f"Backend_{name.replace('-', '_')}", (Backend,), {"name": name, **attributes})


class Plugins:
    """The fake installation: entry points, and the modules they name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
        self.monkeypatch = monkeypatch
        self.tmp_path = tmp_path
        self.entry_points: list[FakeEntryPoint] = []
        monkeypatch.setattr(importlib.metadata, "entry_points", self._entry_points)
        monkeypatch.syspath_prepend(str(tmp_path))

    def _entry_points(self, **selection):
        assert selection == {"group": "linnet.backends"}
        return list(self.entry_points)

    def module(self, **attributes) -> str:
        """A module holding ``attributes``; returns its name."""
        name = f"fake_backend_{next(_unique)}"
        module = types.ModuleType(name)
        vars(module).update(attributes)
        self.monkeypatch.setitem(sys.modules, name, module)
        return name

    def source(self, text: str) -> str:
        """A module file with ``text`` as its source; returns its name."""
        name = f"fake_backend_file_{next(_unique)}"
        (self.tmp_path / f"{name}.py").write_text(text)
        importlib.invalidate_caches()
        return name

    def add(
        self, name: str, value: str, distribution: str | None = "dist-a", version: str = "1.0"
    ) -> None:
        dist = FakeDistribution(distribution, version) if distribution else None
        self.entry_points.append(FakeEntryPoint(name, value, dist))

    def add_backend(self, backend_type, name: str | None = None, **kwargs) -> None:
        name = name or getattr(backend_type, "name", "plugin")
        self.add(name, f"{self.module(Factory=backend_type)}:Factory", **kwargs)


@pytest.fixture
def plugins(monkeypatch, tmp_path) -> Plugins:
    monkeypatch.setattr(discovery, "_cache", None)
    return Plugins(monkeypatch, tmp_path)


def only_skip(name: str) -> SkipRecord:
    records = skipped()
    assert [r.name for r in records] == [name], records
    return records[0]


def test_finds_backends_sorted_by_name_with_their_distributions(plugins):
    plugins.add_backend(backend_class("zeta"), distribution="dist-z", version="2.1")
    plugins.add_backend(backend_class("alpha"), distribution="dist-a", version="0.3")

    def make_middle():  # an entry point may name a function as well as a class
        return backend_class("middle")()

    plugins.add("middle", f"{plugins.module(make=make_middle)}:make", "dist-m")

    assert [b.name for b in available()] == ["alpha", "middle", "zeta"]
    assert skipped() == []
    alpha = discover().found[0]
    assert (alpha.distribution, alpha.version) == ("dist-a", "0.3")
    assert alpha.path.endswith(":Factory (/site)")


def test_loads_once_until_refreshed(plugins):
    calls = []

    def factory():
        calls.append(1)
        return backend_class("counted")()

    plugins.add("counted", f"{plugins.module(make=factory)}:make")
    first = available()
    assert available()[0] is first[0]
    assert discover() is discover()
    assert len(calls) == 1
    assert available(refresh=True)[0] is not first[0]
    assert len(calls) == 2


def test_dotted_attribute(plugins):
    holder = types.SimpleNamespace(Backend=backend_class("nested"))
    plugins.add("nested", f"{plugins.module(holder=holder)}:holder.Backend")
    assert [b.name for b in available()] == ["nested"]


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        ("raise ImportError('needs libfoo.so')\n", "ImportError", "needs libfoo.so"),
        (
            "import linnet_package_that_is_not_installed\n",
            "ModuleNotFoundError",
            "linnet_package_that_is_not_installed",
        ),
        ("def broken(:\n", "SyntaxError", "invalid syntax"),
        ("raise SystemExit(3)\n", "SystemExit", "3"),
        ("raise RuntimeError('boom')\n", "RuntimeError", "boom"),
    ],
)
def test_module_that_fails_to_import_is_skipped(plugins, source, error, message):
    module = plugins.source(source)
    plugins.add("bad", f"{module}:Backend", "dist-bad", "0.9")
    plugins.add_backend(backend_class("fine"))

    assert [b.name for b in available()] == ["fine"]
    record = only_skip("bad")
    assert record.reason == f"its module {module} failed to import ({error})"
    assert (record.distribution, record.version) == ("dist-bad", "0.9")
    assert record.path == f"{module}:Backend (/site)"
    assert error in record.detail and message in record.detail


def test_keyboard_interrupt_is_not_swallowed(plugins):
    plugins.add("interrupting", f"{plugins.source('raise KeyboardInterrupt')}:Backend")
    with pytest.raises(KeyboardInterrupt):
        available()


def test_missing_attribute_is_skipped(plugins):
    module = plugins.module()
    plugins.add("missing", f"{module}:Nowhere")
    record = only_skip("missing")
    assert record.reason == f"its module {module} has no Nowhere"
    assert "Nowhere" in record.detail


def test_entry_point_without_attribute_is_skipped(plugins):
    plugins.add("module-only", plugins.module())
    assert "does not name an object as 'module:attr'" in only_skip("module-only").reason


def test_object_that_is_not_callable_is_skipped(plugins):
    plugins.add("instance", f"{plugins.module(BACKEND=42)}:BACKEND")
    record = only_skip("instance")
    assert record.reason.endswith("is a int, not a function or class that returns a backend")


@pytest.mark.parametrize("error", [ValueError("no GPU library"), SystemExit(1)])
def test_factory_that_raises_is_skipped(plugins, error):
    def factory():
        raise error

    module = plugins.module(make=factory)
    plugins.add("raising", f"{module}:make")
    record = only_skip("raising")
    assert record.reason == f"{module}:make() raised {type(error).__name__}"
    assert record.detail.startswith(type(error).__name__)
    assert available() == []


def test_object_without_the_contract_is_skipped(plugins):
    class Half:
        name = "half"
        version = "1"
        contract = CONTRACT

        def probe(self, target):
            return Capabilities()

        match = None  # present but not callable

    plugins.add_backend(Half)
    record = only_skip("half")
    assert record.reason == "Half is not a backend: it lacks match, compile, estimate_cost"
    assert "probe, match, compile, estimate_cost" in record.detail


def test_object_without_name_is_recorded_under_its_entry_point(plugins):
    plugins.add_backend(type("Nameless", (), {}), name="entry-name")
    record = only_skip("entry-name")
    assert record.reason.startswith("Nameless is not a backend: it lacks name, version, contract")


def test_empty_name_is_skipped(plugins):
    plugins.add_backend(backend_class(""), name="blank")
    assert only_skip("blank").reason == "its name '' is not a non-empty string"


def test_older_contract_is_skipped_with_upgrade_advice(plugins):
    plugins.add_backend(
        backend_class("old", contract=CONTRACT - 1), distribution="dist-old", version="0.1"
    )
    record = only_skip("old")
    assert record.reason == (
        f"written for backend contract {CONTRACT - 1}, but this host "
        f"implements contract {CONTRACT}: upgrade the plugin"
    )
    assert (record.distribution, record.version) == ("dist-old", "0.1")
    assert available() == []


def test_newer_contract_asks_to_upgrade_the_host(plugins):
    plugins.add_backend(backend_class("new", contract=CONTRACT + 1))
    assert only_skip("new").reason == (
        f"written for backend contract {CONTRACT + 1}, but this "
        f"host implements contract {CONTRACT}: upgrade the host "
        "(linnet-plan)"
    )


@pytest.mark.parametrize("declared", [str(CONTRACT), float(CONTRACT), True])
def test_contract_that_is_not_an_int_is_skipped(plugins, declared):
    plugins.add_backend(backend_class("odd", contract=declared))
    assert only_skip("odd").reason.startswith(f"declares contract {declared!r}, which is not")


def test_old_contract_is_reported_even_when_methods_changed(plugins):
    # A contract-0 plugin may lack methods contract 1 added: the version is the news.
    old = type("Old", (), {"name": "old", "version": "1", "contract": 0})
    plugins.add_backend(old)
    assert only_skip("old").reason.startswith("written for backend contract 0")


@pytest.mark.parametrize("order", [["dist-b", "dist-a"], ["dist-a", "dist-b"]])
def test_duplicate_name_keeps_the_first_distribution(plugins, order):
    kinds = {dist: backend_class("dup") for dist in order}
    for dist in order:
        plugins.add_backend(kinds[dist], distribution=dist)

    (winner,) = available()
    assert winner.name == "dup" and isinstance(winner, kinds["dist-a"])
    record = only_skip("dup")
    assert record.distribution == "dist-b"
    assert "dist-a" in record.reason and "(name, distribution) order" in record.reason
    assert "dist-a" not in record.path


def test_duplicate_names_from_differently_named_entry_points(plugins):
    plugins.add_backend(backend_class("same"), name="first-entry", distribution="dist-b")
    plugins.add_backend(backend_class("same"), name="second-entry", distribution="dist-a")
    assert [f.distribution for f in discover().found] == ["dist-a"]
    assert only_skip("same").distribution == "dist-b"


def test_entry_point_without_distribution(plugins):
    plugins.add_backend(backend_class("loose", contract=0), distribution=None)
    record = only_skip("loose")
    assert (record.distribution, record.version) == ("", "")
    assert record.path.endswith(":Factory")
    assert str(record).startswith("loose (unknown distribution): written for")


def test_one_bad_plugin_of_each_kind_and_the_good_ones_survive(plugins):
    plugins.add("import", f"{plugins.source('raise ImportError')}:B", "d1")
    plugins.add_backend(backend_class("old", contract=0), distribution="d2")
    plugins.add_backend(backend_class("dup"), distribution="d3")
    plugins.add_backend(backend_class("dup"), distribution="d4")
    plugins.add_backend(backend_class("good"), distribution="d5")
    assert [b.name for b in available()] == ["dup", "good"]
    assert sorted((r.name, r.distribution) for r in skipped()) == [
        ("dup", "d4"),
        ("import", "d1"),
        ("old", "d2"),
    ]


def test_plugin_output_at_import_does_not_reach_stdout(plugins, capsys):
    module = plugins.source(
        "print('hello from a plugin')\n"
        "from linnet.backends import CONTRACT, Capabilities\n"
        "class Chatty:\n"
        "    name, version, contract = 'chatty', '1', CONTRACT\n"
        "    def probe(self, target): return Capabilities()\n"
        "    def match(self, graph, target): return []\n"
        "    def compile(self, region, target, options): return None\n"
        "    def estimate_cost(self, region, target): return None\n"
    )
    plugins.add("chatty", f"{module}:Chatty")
    assert [b.name for b in available()] == ["chatty"]
    out = capsys.readouterr()
    assert out.out == ""
    assert "hello from a plugin" in out.err


def test_skip_record_is_frozen():
    record = SkipRecord("n", "d", "1", "m:a", "reason")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.reason = "other"  # type: ignore[misc]
    assert record.detail == ""


class TestProbeAll:
    def test_sorts_backends_into_capable_and_records(self, plugins):
        class Declines(Backend):
            name = "declines"

            def probe(self, target):
                return None

        class Raises(Backend):
            name = "raises"

            def probe(self, target):
                raise OSError("driver not loaded")

        class Sloppy(Backend):
            name = "sloppy"

            def probe(self, target):
                return True

        cuda_only = backend_class(
            "cuda-only", probe=lambda self, t: Capabilities() if t.kind == "cuda" else None
        )
        for kind in (Declines, Raises, Sloppy, cuda_only):
            plugins.add_backend(kind, distribution=f"dist-{kind.name}")
        plugins.add_backend(backend_class("any"), distribution="dist-any")

        capable, records = discovery.probe_all(Target("cpu"))
        assert [b.name for b in capable] == ["any"]
        by_name = {r.name: r for r in records}
        assert by_name["declines"].reason == "declined cpu"
        assert by_name["declines"].distribution == "dist-declines"
        assert by_name["cuda-only"].reason == "declined cpu"
        assert by_name["raises"].reason == "probe for cpu raised OSError"
        assert by_name["raises"].detail == "OSError: driver not loaded"
        assert by_name["sloppy"].reason == (
            "probe for cpu returned a bool, not Capabilities or None"
        )

        capable, records = discovery.probe_all(Target("cuda", capability=(9, 0)))
        assert [b.name for b in capable] == ["any", "cuda-only"]

    def test_backends_passed_by_hand_keep_their_order_and_are_checked(self, plugins):
        first, second = backend_class("b")(), backend_class("a")()
        old = backend_class("old", contract=0)()
        capable, records = discovery.probe_all(Target("cpu"), [first, old, second])
        assert capable == [first, second]
        (record,) = records
        assert record.name == "old" and record.reason.startswith("written for backend contract 0")
        assert record.path == f"{__name__}:{type(old).__qualname__}"

    def test_keyboard_interrupt_in_probe_propagates(self, plugins):
        def probe(self, target):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            discovery.probe_all(Target("cpu"), [backend_class("x", probe=probe)()])


class TestCommand:
    def run(self, *argv: str) -> None:
        parser = argparse.ArgumentParser(prog="linnet")
        register_backends(parser.add_subparsers())
        args = parser.parse_args(["backends", *argv])
        assert args.run(args) == 0

    def install(self, plugins) -> None:
        plugins.add_backend(
            backend_class("fast-linear", version="0.4"), distribution="linnet-fast", version="0.4.1"
        )
        plugins.add("broken", f"{plugins.source('raise ImportError(1)')}:B", "linnet-broken")

    def test_text(self, plugins, capsys):
        self.install(plugins)
        self.run()
        out = capsys.readouterr().out
        assert f"backend contract {CONTRACT}" in out
        assert "NAME         VERSION  CONTRACT  DISTRIBUTION" in out
        assert f"fast-linear  0.4      {CONTRACT}         linnet-fast 0.4.1" in out
        assert "broken (linnet-broken 1.0): its module" in out
        assert "ImportError: 1" in out

    def test_json(self, plugins, capsys):
        self.install(plugins)
        self.run("--format", "json")
        data = json.loads(capsys.readouterr().out)
        assert data["contract"] == CONTRACT
        # Each available backend also says, target by target, what its probe answered here.
        targets = data["available"][0]["targets"]
        assert targets and all(t["state"] == "runs" for t in targets)
        assert data["available"] == [
            {
                "name": "fast-linear",
                "version": "0.4",
                "contract": CONTRACT,
                "distribution": "linnet-fast",
                "distribution_version": "0.4.1",
                "path": data["available"][0]["path"],
                "runnable": True,
                "targets": targets,
            }
        ]
        assert data["unavailable"] == []
        (record,) = data["skipped"]
        assert (record["name"], record["distribution"]) == ("broken", "linnet-broken")
        assert set(record) == {
            "name",
            "distribution",
            "version",
            "path",
            "reason",
            "detail",
            "code",
        }
        assert record["code"] == ""

    def test_nothing_installed(self, plugins, capsys):
        self.run()
        assert "available: none" in capsys.readouterr().out


# ------------------------------------------------------------------ runnable here
CPU = discovery.HOST
H100 = Target(
    "cuda", "cuda:0", "NVIDIA H100 80GB HBM3", (9, 0), "torch", (("torch", "2.9"), ("cuda", "12.8"))
)
CPU_ONLY = here.Machine((CPU,), ("no CUDA device: torch 2.9 (CUDA 12.8) sees none",))
WITH_GPU = here.Machine((CPU, H100))


class CudaOnly(Backend):
    """A GPU backend as the plugins write one: declines the CPU, and says why."""

    name = "cuda-only"

    def probe(self, target):
        return Capabilities() if self.decline_reason(target) is None else None

    def decline_reason(self, target):
        if target.kind != "cuda":
            return f"runs on CUDA devices only; this target is {target.kind}"
        return None


class Silent(Backend):
    """A contract-1 backend written before `decline_reason`: it declines without a reason."""

    name = "silent"

    def probe(self, target):
        return None


class FaultsOnCuda(Backend):
    """Its probe runs on the CPU and raises on a GPU (a driver call that fails)."""

    name = "faults-on-cuda"

    def probe(self, target):
        if target.kind == "cuda":
            raise OSError("CUDA driver version is insufficient")
        return Capabilities()


class TestRunnableHere:
    def install(self, plugins, machine, monkeypatch) -> None:
        monkeypatch.setattr(here, "this_machine", lambda: machine)
        plugins.add_backend(backend_class("anywhere"), distribution="dist-any")
        plugins.add_backend(CudaOnly, distribution="dist-cuda", version="0.3")
        plugins.add_backend(Silent, distribution="dist-silent")

    def command(self, *argv: str) -> None:
        TestCommand().run(*argv)

    def test_cpu_machine_lists_a_gpu_backend_as_unavailable_with_why(
        self, plugins, monkeypatch, capsys
    ):
        self.install(plugins, CPU_ONLY, monkeypatch)
        self.command()
        out = capsys.readouterr().out
        assert "this machine: cpu; no CUDA device: torch 2.9 (CUDA 12.8) sees none" in out
        available_part, rest = out.split("unavailable (loaded, but cannot run here):")
        assert "available (can run here):" in available_part
        assert "anywhere" in available_part and "cuda-only" not in available_part
        assert (
            "  cuda-only 0.1 (dist-cuda 0.3)\n      cpu: declines: runs on CUDA devices "
            "only; this target is cpu"
        ) in rest
        assert (
            "  silent 0.1 (dist-silent 1.0)\n      cpu: declines: (the backend gives no "
            "reason)" in rest
        )

    def test_json_available_means_runnable_here(self, plugins, monkeypatch, capsys):
        self.install(plugins, CPU_ONLY, monkeypatch)
        self.command("--format", "json")
        data = json.loads(capsys.readouterr().out)
        assert [a["name"] for a in data["available"]] == ["anywhere"]
        assert [a["name"] for a in data["unavailable"]] == ["cuda-only", "silent"]
        assert data["machine"]["notes"] == list(CPU_ONLY.notes)
        assert [t["kind"] for t in data["machine"]["targets"]] == ["cpu"]
        cuda_only = data["unavailable"][0]
        assert cuda_only["runnable"] is False and cuda_only["distribution"] == "dist-cuda"
        (result,) = cuda_only["targets"]
        assert result["target"]["device"] == "cpu"
        assert (result["state"], result["code"]) == ("declines", "")
        assert result["reason"] == "runs on CUDA devices only; this target is cpu"
        (anywhere,) = data["available"]
        assert anywhere["runnable"] is True and anywhere["targets"][0]["state"] == "runs"
        assert anywhere["targets"][0]["dtypes"] == []

    def test_a_gpu_machine_probes_each_device(self, plugins, monkeypatch, capsys):
        self.install(plugins, WITH_GPU, monkeypatch)
        self.command("--format", "json")
        data = json.loads(capsys.readouterr().out)
        assert [a["name"] for a in data["available"]] == ["anywhere", "cuda-only"]
        states = [(t["target"]["device"], t["state"]) for t in data["available"][1]["targets"]]
        assert states == [("cpu", "declines"), ("cuda:0", "runs")]
        assert data["machine"]["targets"][1]["capability"] == [9, 0]
        self.command()
        out = capsys.readouterr().out
        assert "this machine: cpu, cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)" in out
        assert "RUNS ON" in out and "cuda:0" in out

    def test_a_probe_that_raises_on_one_target_is_a_coded_finding(
        self, plugins, monkeypatch, capsys
    ):
        monkeypatch.setattr(here, "this_machine", lambda: WITH_GPU)
        plugins.add_backend(FaultsOnCuda, distribution="dist-faulty")
        self.command()
        out = capsys.readouterr().out
        assert "Traceback" not in out
        assert (
            "faults-on-cuda on cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0): "
            "error[E0777]: probe for cuda raised OSError"
        ) in out
        assert "OSError: CUDA driver version is insufficient" in out
        assert "linnet explain E0777" in out
        self.command("--format", "json")
        (entry,) = json.loads(capsys.readouterr().out)["available"]  # it runs on the CPU
        fault = entry["targets"][1]
        assert (fault["state"], fault["code"]) == ("fault", "E0777")
        assert fault["detail"] == "OSError: CUDA driver version is insufficient"

    def test_runnable_keeps_only_what_runs_here(self, plugins, monkeypatch):
        self.install(plugins, CPU_ONLY, monkeypatch)
        assert [b.name for b in available()] == ["anywhere", "cuda-only", "silent"]
        assert [b.name for b in runnable()] == ["anywhere"]
        monkeypatch.setattr(here, "this_machine", lambda: WITH_GPU)
        assert [b.name for b in runnable()] == ["anywhere", "cuda-only"]

    def test_planning_still_sees_every_loaded_backend(self, plugins, monkeypatch):
        # A plan asks each backend about its own target: available() stays "loaded".
        self.install(plugins, CPU_ONLY, monkeypatch)
        capable, records = discovery.probe_all(H100)
        assert [b.name for b in capable] == ["anywhere", "cuda-only"]
        assert [(r.name, r.reason) for r in records] == [("silent", "declined cuda")]
        capable, records = discovery.probe_all(CPU)
        assert [(r.name, r.reason) for r in records] == [
            ("cuda-only", "declined cpu: runs on CUDA devices only; this target is cpu"),
            ("silent", "declined cpu"),
        ]

    def test_nothing_installed_never_imports_torch(self, plugins, monkeypatch, capsys):
        def looked():
            raise AssertionError("no backend to ask: the machine is not looked at")

        monkeypatch.setattr(here, "this_machine", looked)
        self.command()
        out = capsys.readouterr().out
        assert "available: none (no installed package" in out and "this machine" not in out


class TestThisMachine:
    """this_machine() with stand-ins for torch: never an exception, always a reason."""

    def fake_torch(
        self, monkeypatch, *, available=True, count=1, cuda="12.8", props=None, warn=None
    ):
        def is_available():
            if warn:
                import warnings

                warnings.warn(warn, UserWarning, stacklevel=1)
            return available

        def device_count():
            if isinstance(count, BaseException):
                raise count
            return count

        def get_device_properties(index):
            value = (props or {}).get(
                index, types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)
            )
            if isinstance(value, BaseException):
                raise value
            return value

        fake = types.SimpleNamespace(
            __version__="2.9",
            version=types.SimpleNamespace(cuda=cuda),
            cuda=types.SimpleNamespace(
                is_available=is_available,
                device_count=device_count,
                get_device_properties=get_device_properties,
            ),
        )
        monkeypatch.setitem(sys.modules, "torch", fake)

    def test_each_cuda_device_is_a_target(self, monkeypatch):
        self.fake_torch(
            monkeypatch,
            count=2,
            props={1: types.SimpleNamespace(name="NVIDIA A100", major=8, minor=0)},
        )
        machine = here.this_machine()
        assert machine.targets == (
            CPU,
            H100,
            Target("cuda", "cuda:1", "NVIDIA A100", (8, 0), "torch", H100.versions),
        )
        assert machine.notes == ()

    def test_torch_without_cuda_says_so(self, monkeypatch):
        self.fake_torch(monkeypatch, available=False, cuda=None)
        assert here.this_machine().notes == ("no CUDA device: torch 2.9 is built without CUDA",)

    def test_an_old_driver_warning_is_the_reason(self, monkeypatch):
        self.fake_torch(
            monkeypatch,
            available=False,
            warn="CUDA initialization: The NVIDIA driver on your system is too old",
        )
        (note,) = here.this_machine().notes
        assert note == (
            "no CUDA device: torch 2.9 (CUDA 12.8) sees none (CUDA initialization: "
            "The NVIDIA driver on your system is too old)"
        )

    @pytest.mark.parametrize("error", [RuntimeError("CUDA error: unknown error"), SystemExit(2)])
    def test_a_cuda_query_that_raises_is_a_note(self, monkeypatch, error):
        self.fake_torch(monkeypatch, count=error)
        machine = here.this_machine()
        assert machine.targets == (CPU,)
        assert machine.notes[0].startswith("no CUDA device: torch 2.9 could not query CUDA (")

    def test_a_device_whose_properties_fail_is_left_out_with_why(self, monkeypatch):
        self.fake_torch(monkeypatch, count=2, props={0: RuntimeError("device busy")})
        machine = here.this_machine()
        assert [t.device for t in machine.targets] == ["cpu", "cuda:1"]
        assert machine.notes == (
            "cuda:0 left out: torch could not read its properties (RuntimeError: device busy)",
        )

    def test_torch_not_installed_is_never_imported(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "torch", None)  # what a missing module looks like
        real = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: None if name == "torch" else real(name, *a),
        )
        machine = here.this_machine()
        assert machine.targets == (CPU,)
        assert machine.notes == ("no CUDA device looked for: torch is not installed",)
        assert sys.modules["torch"] is None

    def test_torch_that_fails_to_import_is_a_note(self, monkeypatch, tmp_path):
        (tmp_path / "torch.py").write_text("raise OSError('libcudart.so.12: cannot open')\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "torch", raising=False)
        importlib.invalidate_caches()
        machine = here.this_machine()
        assert machine.targets == (CPU,)
        assert machine.notes == (
            "no CUDA device looked for: torch failed to import (OSError: "
            "libcudart.so.12: cannot open)",
        )
