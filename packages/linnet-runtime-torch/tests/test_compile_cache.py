"""Start-up cost (issue 15, part 3): a second process planning the same model reuses what the
first compiled, tuned and timed, from $LINNET_HOME; unreadable cache files never stop a plan
and are never lost; `linnet cache` shows and clears the caches."""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
from linnet.lang import LinnetError
from linnet.lang.cli import main
from linnet.plan import CacheWarning
from linnet.torch import home
from linnet.torch.options import compile_options, reuse_line
from support import run_guarded

HERE = Path(__file__).resolve().parent
VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")

# One fresh process: the toy Llama planned with compile=True (CPU inductor) over RefLinear
# (so that region kinds are timed and cached), one planned decode step; what it said, its
# logits and torch's cache counters as JSON on the last line of stdout.
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from linnet.torch import load, random_weights
from reference_backends import RefLinear
from support import LLAMA, toy_config
from torch._dynamo.utils import counters

said = []
model = load(LLAMA, weights=random_weights(LLAMA, toy_config(), seed=4), config=toy_config())
token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
plan = model.plan_for("decode", [token, pos], backends=[RefLinear()], compile=True,
                      progress=said.append)
logits, = plan.run([token, pos], model.context_for(plan))
print(json.dumps({"said": said, "logits": logits.flatten().tolist(),
                  "counters": {k: dict(v) for k, v in counters.items()}}))
"""


def run_child(linnet_home: Path, script: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env["LINNET_HOME"] = str(linnet_home)
    # Bytecode of torch's own modules in a folder of this test (none written into the
    # environment): the later children start seconds faster where bytecode is not kept.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(script.parent / "pycache")
    env["PYTHONWARNINGS"] = "always::UserWarning"
    done = run_guarded([sys.executable, str(script), str(HERE)], env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def files(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The same plan made twice, each in a fresh process, on one $LINNET_HOME."""
    root = tmp_path_factory.mktemp("start")
    script = root / "child.py"
    script.write_text(CHILD)
    linnet_home = root / "linnet-home"
    first, _ = run_child(linnet_home, script)
    generated = files(linnet_home / "generated")
    second, _ = run_child(linnet_home, script)
    return linnet_home, script, first, second, generated


def slice_lines(said: list[str]) -> tuple[list[str], list[str]]:
    return (
        [m for m in said if m.startswith("compiled ")],
        [m for m in said if m.startswith("reused ") and " region kinds " not in m],
    )


@pytest.mark.slow
def test_second_process_reuses_compiled_slices_timings_and_source(two_processes):
    linnet_home, _, first, second, generated = two_processes
    compiled, reused = slice_lines(first["said"])
    assert compiled and not reused
    assert not any("region kinds" in m for m in first["said"])
    # Linnet placed inductor's cache under $LINNET_HOME: its FX graphs are there.
    assert any((linnet_home / "cache" / "inductor" / "fxgraph").rglob("*"))
    assert (linnet_home / "cache" / "triton").is_dir()

    compiled, reused = slice_lines(second["said"])
    # every slice of the plan came from the first process's cache, none was compiled
    assert reused and not compiled, second["said"]
    assert all(" from $LINNET_HOME/cache/inductor in " in m for m in reused)
    assert second["counters"]["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["counters"]["inductor"]["fxgraph_cache_hit"] >= len(reused)
    # every region kind's timings came from the timing cache: none was compiled to be timed
    kinds = [m for m in second["said"] if " region kinds " in m]
    assert len(kinds) == 1 and kinds[0].startswith("reused the timings of ")
    n, of = kinds[0].split("reused the timings of ")[1].split(" region kinds")[0].split(" of ")
    assert n == of and int(n) > 0
    assert kinds[0].endswith("from $LINNET_HOME/benchmarks.json")
    assert not any(m.startswith("compiling Region(") for m in second["said"])
    # the generated modules were found by their content: none written again, none added
    assert files(linnet_home / "generated") == generated
    torch.testing.assert_close(
        torch.tensor(second["logits"]), torch.tensor(first["logits"]), rtol=0, atol=0
    )


@pytest.mark.slow
def test_unreadable_cache_files_are_set_aside_and_recomputed(two_processes):
    """Every cache file made unreadable: the third process still plans and runs (no
    traceback), says what it could not read, and loses none of the files."""
    linnet_home, script, first, _, _ = two_processes
    timings = linnet_home / "benchmarks.json"
    timings.write_text("{ not json")
    broken = [
        p
        for sub in ("fxgraph", "aotautograd")
        for p in (linnet_home / "cache" / "inductor" / sub).rglob("*")
        if p.is_file()
    ]
    assert broken
    for p in broken:
        p.write_bytes(b"\x80garbage")
    # the module that records region inputs: the same text in every process of this plan
    module = next((linnet_home / "generated").glob("linnet_plan_record_*.py"))
    module.write_text("raise SystemExit('a stale file ran')\n")

    third, stderr = run_child(linnet_home, script)
    torch.testing.assert_close(
        torch.tensor(third["logits"]), torch.tensor(first["logits"]), rtol=1e-6, atol=1e-6
    )
    compiled, reused = slice_lines(third["said"])
    assert compiled and not reused
    # the timing cache was moved aside, under a name of its own, with what it held
    aside = list(linnet_home.glob("benchmarks.json.corrupt-*"))
    assert [p.read_text() for p in aside] == ["{ not json"]
    assert "timing cache" in stderr and "moved it to" in stderr
    # the unreadable compiled artefacts that torch tried were set aside, and said so
    unreadable = list((linnet_home / "cache" / "unreadable").iterdir())
    assert unreadable and all(p.read_bytes() == b"\x80garbage" for p in unreadable)
    assert stderr.count("could not be read") == len(unreadable)
    assert "moved it to $LINNET_HOME/cache/unreadable/" in stderr
    # the generated module was rewritten from the text that was checked
    assert "a stale file ran" not in module.read_text()


# ---------------------------------------------------------------- in this process
@pytest.fixture
def clean(monkeypatch, linnet_home):
    """No compile cache variable set; Linnet's memory of what it set, empty."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(home, "_SET", {})
    monkeypatch.setattr(home, "_MADE", set())
    return linnet_home


def test_caches_go_under_linnet_home_unless_the_user_set_them(clean, tmp_path, monkeypatch):
    compile_options(True)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(clean / "cache" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(clean / "cache" / "triton")
    # a new $LINNET_HOME moves the caches Linnet placed along with it
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "other"))
    compile_options("max-autotune-no-cudagraphs")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "other" / "cache" / "inductor")
    # the user's own directory is never replaced
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    used = home.use_compile_caches()
    assert used["inductor"] == tmp_path / "mine"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()  # created, as torch.compile would


def test_a_value_torch_set_for_itself_is_not_the_users(clean, monkeypatch):
    """Importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR to inductor's default: that
    value, absent from the process's initial environment, is replaced."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", home._inductor_default())
    monkeypatch.setattr(home, "_initial_environment", lambda: {})
    assert home.use_compile_caches()["inductor"] == clean / "cache" / "inductor"
    # ...but started with it, the process keeps it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", home._inductor_default())
    monkeypatch.setattr(
        home, "_initial_environment", lambda: {"TORCHINDUCTOR_CACHE_DIR": home._inductor_default()}
    )
    assert str(home.use_compile_caches()["inductor"]) == home._inductor_default()


def test_a_cache_variable_naming_a_file_is_E0830(clean, tmp_path, monkeypatch):
    file = tmp_path / "a-file"
    file.write_text("mine")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(file))
    with pytest.raises(LinnetError) as err:
        compile_options(True)
    d = err.value.diagnostics[0]
    assert d.code == "E0830" and "TRITON_CACHE_DIR" in d.message and "unset" in d.help
    assert file.read_text() == "mine"


def test_an_unusable_cache_folder_warns_and_torch_keeps_its_default(clean):
    clean.mkdir(parents=True, exist_ok=True)
    (clean / "cache").write_text("in the way")
    with pytest.warns(CacheWarning, match="cache in its default place|caches in its default"):
        used = home.use_compile_caches()
    assert used == {} and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    assert (clean / "cache").read_text() == "in the way"


def test_first_call_lines():
    assert reuse_line("slice_0", 0.25, 3, 0).startswith("reused slice_0 from ")
    assert reuse_line("slice_0", 9.0, 0, 2) == "compiled slice_0 in 9.0 s"
    # a slice the plan's timing in context compiled earlier in this process
    assert reuse_line("slice_0", 0.5, 3, 0, here=True).startswith(
        "compiled slice_0 in 0.5 s (as earlier in this process, from "
    )
    assert reuse_line("slice_0", 4.0, 1, 1).startswith(
        "compiled slice_0 in 4.0 s (1 graph(s) reused from "
    )


def _load(subdir: str, path: str) -> None:
    """Stands for torch's cache lookup: its frame holds `subdir` and `path`."""
    with open(os.path.join(subdir, path), "rb") as f:
        pickle.loads(f.read())


def test_an_unreadable_artefact_record_becomes_one_warning(clean, caplog):
    home.use_compile_caches()
    key = clean / "cache" / "inductor" / "fxgraph" / "ab" / "key"
    key.mkdir(parents=True)
    (key / "entry").write_bytes(b"no pickle")
    logger = logging.getLogger("torch._inductor.codecache")
    with pytest.warns(
        CacheWarning,
        match=r"could not be read \(UnpicklingError.*moved it to "
        r"\$LINNET_HOME/cache/unreadable/",
    ):
        try:
            _load(str(key), "entry")
        except Exception:
            logger.warning("FxGraphCache unable to load compiled graph", exc_info=True)
    # torch's record, with its traceback, was turned into the warning
    assert not [r for r in caplog.records if "unable to load" in r.getMessage()]
    assert not (key / "entry").exists()
    (moved,) = (clean / "cache" / "unreadable").iterdir()
    assert moved.read_bytes() == b"no pickle"
    # other records of that logger pass
    with caplog.at_level(logging.WARNING, logger="torch._inductor.codecache"):
        logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


# ---------------------------------------------------------------- linnet cache
def test_linnet_cache_info_and_clear(clean, tmp_path, monkeypatch, capsys):
    # Linnet's own files, written by Linnet (a clear removes only those: issue 38, item 1).
    from linnet.lang.home import import_source
    from linnet.plan import TimingCache

    import_source("x = 1\n", "linnet_t")
    (clean / "benchmarks.json").write_text("{}")  # not a timing cache: moved aside, recorded
    with pytest.warns(CacheWarning, match="moved it"):
        cache = TimingCache()
    cache.put("k", 1.0)
    cache.flush()
    (clean / "generated" / "m.py").write_text("x = 1\n")  # the user's: kept
    mine = tmp_path / "mine"
    (mine / "fxgraph").mkdir(parents=True)
    (mine / "fxgraph" / "g").write_bytes(b"12345")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))

    assert main(["cache", "--format", "json"]) == 0
    info = {c["name"]: c for c in json.loads(capsys.readouterr().out)["caches"]}
    assert info["generated"]["files"] == 1 and info["generated"]["bytes"] == 6
    assert info["generated"]["kept"] == 1 and "generated/m.py" in info["generated"]["note"]
    assert info["timings"]["files"] == 2 and "set aside" in info["timings"]["note"]
    assert info["inductor"]["path"] == str(mine) and not info["inductor"]["under_home"]
    assert main(["cache"]) == 0
    text = capsys.readouterr().out
    assert "$LINNET_HOME/generated" in text and "TORCHINDUCTOR_CACHE_DIR is set" in text

    assert main(["cache", "clear", "--only", "generated"]) == 0
    out = capsys.readouterr().out
    assert "cleared generated" in out and "kept in generated" in out
    assert [p.name for p in (clean / "generated").iterdir()] == ["m.py"]
    assert (clean / "benchmarks.json").exists()
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "kept inductor at" in out
    assert not (clean / "benchmarks.json").exists()
    assert not list(clean.glob("benchmarks.json.corrupt-*"))
    assert (mine / "fxgraph" / "g").read_bytes() == b"12345"  # the user's: never removed
    assert (clean / "generated" / "m.py").read_text() == "x = 1\n"


def test_linnet_cache_clear_that_cannot_remove_is_E0831(clean, monkeypatch, capsys):
    from linnet.lang.host.run import demo_checkpoint

    model = clean.parent / "m.linnet"  # what the demo checkpoint is keyed by
    model.write_text("model")
    made = demo_checkpoint(model, {}, 0, lambda p: p.write_bytes(b"w"))

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "unlink", refuse)
    assert main(["cache", "clear", "--only", "demo"]) != 0
    err = capsys.readouterr().err
    assert "E0831" in err and "demo" in err
    assert made.read_bytes() == b"w"
