"""Real plugin distributions, built and installed: discovery keeps the good one and skips the
others with the right reasons, and the host lives on.

The plugins are in integration-tests/plugins/: `good` (a working backend), `cuda-only` (runs
on CUDA devices of compute capability 8.0+ only, and says why it declines the others),
`old-contract` (written for contract 0) and `broken` (its module raises ImportError).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from linnet.backends import CONTRACT

PLUGINS = Path(__file__).resolve().parent / "plugins"
OURS = {
    "linnet-backend-good",
    "linnet-backend-cuda-only",
    "linnet-backend-old-contract",
    "linnet-backend-broken",
}

DISCOVER = """
import json
from linnet.backends import available, discover, skipped

names = [b.name for b in available()]
records = [(r.name, r.distribution, r.reason) for r in skipped()]
distributions = {f.name: f.distribution for f in discover().found}
# Still here after loading every plugin: the host did not crash.
print(json.dumps({"available": names, "skipped": records, "distributions": distributions,
                  "alive": True}))
"""


@pytest.fixture(scope="module")
def installed(plugin_site):
    names = ("good", "cuda-only", "old-contract", "broken")
    plugin_site.install(*(plugin_site.build(PLUGINS / name) for name in names))
    return plugin_site


@pytest.mark.slow
def test_good_is_found_and_the_others_are_skipped(installed):
    done = installed.python("-c", DISCOVER)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])

    assert found["alive"]
    assert "good" in found["available"]
    assert "cuda-only" in found["available"]  # loaded: whether it runs here is `runnable()`'s
    assert found["distributions"]["good"] == "linnet-backend-good"
    assert {n for n, d in found["distributions"].items() if d in OURS} == {"good", "cuda-only"}
    ours = sorted(tuple(r) for r in found["skipped"] if r[1] in OURS)
    assert ours == [
        (
            "broken",
            "linnet-backend-broken",
            "its module linnet_backend_broken failed to import (ImportError)",
        ),
        (
            "old-contract",
            "linnet-backend-old-contract",
            f"written for backend contract 0, but this host implements contract {CONTRACT}: "
            "upgrade the plugin",
        ),
    ]


@pytest.mark.slow
def test_linnet_backends_command(installed):
    done = installed.python("-m", "linnet.lang.cli", "backends", "--format", "json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed["contract"] == CONTRACT
    good = next(b for b in listed["available"] if b["name"] == "good")
    assert good["distribution"] == "linnet-backend-good"
    assert good["distribution_version"] == "0.2.0"
    broken = next(r for r in listed["skipped"] if r["name"] == "broken")
    assert broken["version"] == "0.1.0"
    assert broken["path"].startswith(f"linnet_backend_broken:Broken ({installed.path}")
    assert "libmissing.so" in broken["detail"]

    # "available" means it can run here: `cuda-only` runs on none of a CPU machine's targets.
    cuda = [
        t for t in listed["machine"]["targets"] if t["kind"] == "cuda" and t["capability"] >= [8, 0]
    ]
    if not cuda:
        assert "cuda-only" not in [b["name"] for b in listed["available"]]
        entry = next(b for b in listed["unavailable"] if b["name"] == "cuda-only")
        assert entry["distribution"] == "linnet-backend-cuda-only"
        cpu = entry["targets"][0]
        assert (cpu["target"]["kind"], cpu["state"]) == ("cpu", "declines")
        assert cpu["reason"] == "cuda-only runs on CUDA devices only; this target is cpu"
        if not listed["machine"]["targets"][1:]:
            assert listed["machine"]["notes"][0].startswith("no CUDA device")
            # Linnet's own GPU plugins (workspace members, so installed here) likewise, each
            # saying its library is missing too where it is.
            for name, module, library in (
                ("cublaslt", "nvmath", "nvmath-python"),
                ("flashinfer", "flashinfer", "flashinfer-python"),
            ):
                entry = next(b for b in listed["unavailable"] if b["name"] == name)
                reason = entry["targets"][0]["reason"]
                assert "CUDA" in reason and "this target is cpu" in reason, reason
                if importlib.util.find_spec(module) is None:
                    assert f"{library} is not installed" in reason, reason
    else:
        assert "cuda-only" in [b["name"] for b in listed["available"]]
    assert good["runnable"] is True and good["targets"][0]["state"] == "runs"

    # The text form, without the `linnet` CLI (whose other commands import torch: slow).
    text = installed.python(
        "-c", "from linnet.backends import cli, discover; print(cli.to_text(discover()))"
    )
    assert text.returncode == 0, text.stderr
    assert (
        "old-contract (linnet-backend-old-contract 0.1.0): written for backend contract 0"
        in text.stdout
    )
    if not cuda:
        assert (
            "  cuda-only 0.1.0 (linnet-backend-cuda-only 0.1.0)\n      cpu: declines: "
            "cuda-only runs on CUDA devices only; this target is cpu"
        ) in text.stdout
