"""Adversarial suite (issue 11, item 9): the timing cache under a hostile $LINNET_HOME.

The policy: a plan can always be made, so a cache that cannot be read or written costs only
its timings (a :class:`CacheWarning`, then on). The user's entries are never lost: a file that
could not be read is never overwritten, and a corrupt one is moved aside under a unique name.
Tests run as root, so permission faults are simulated by making the call raise.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.plan import CacheWarning, TimingCache

GOOD = {
    "format": "linnet.benchmarks",
    "version": 1,
    "entries": {"old": {"seconds": 2.5, "measured": 0.0}},
}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    path = tmp_path / "home"
    monkeypatch.setenv("LINNET_HOME", str(path))
    return path


def recorded(fn, *args):
    """Run ``fn``; return its result and the CacheWarnings' texts (any other exception fails)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def put_and_flush(cache: TimingCache) -> list[str]:
    cache.put("new", 1.0)
    _, warned = recorded(cache.flush)
    assert cache.get("new") == 1.0  # still usable in this process
    return warned


def asides(directory: Path) -> list[Path]:
    return sorted(directory.glob("benchmarks.json.corrupt-*"))


def raising(err: int):
    def fail(*a, **k):
        raise OSError(err, os.strerror(err))

    return fail


# ---------------------------------------------------------------- corrupt files


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe{}",
        b'{"format": "linnet.benchmarks", "x": "\xc3"}',
        b"[" * 100_000,
        b'{"a":' * 3000 + b"1" + b"}" * 3000,
        b"{ not json",
        b"",
        b"[]",
        b'"s"',
        b"null",
        b'{"format": "other", "version": 1, "entries": {}}',
        b'{"format": "linnet.benchmarks", "version": 1, "entries": []}',
    ],
)
def test_corrupt_file_is_moved_aside_and_rebuilt(tmp_path, data):
    path = tmp_path / "benchmarks.json"
    path.write_bytes(data)
    cache, warned = recorded(TimingCache, path)
    assert warned and "moved it" in warned[0]
    [aside] = asides(tmp_path)
    assert aside.read_bytes() == data
    assert put_and_flush(cache) == []
    assert json.loads(path.read_text())["entries"]["new"]["seconds"] == 1.0


def test_two_corrupt_files_in_one_second_keep_both(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    path = tmp_path / "benchmarks.json"
    for data in (b"first", b"second", b"third"):
        path.write_bytes(data)
        recorded(TimingCache, path)
    assert sorted(p.read_bytes() for p in asides(tmp_path)) == [b"first", b"second", b"third"]


def test_corrupt_file_that_cannot_be_moved_is_not_overwritten(tmp_path, monkeypatch):
    path = tmp_path / "benchmarks.json"
    path.write_bytes(b"{ precious but broken")
    monkeypatch.setattr(os, "replace", raising(errno.EACCES))
    cache, warned = recorded(TimingCache, path)
    assert warned and "left it" in warned[0]
    warned = put_and_flush(cache)
    assert warned and "not saved" in warned[0]
    assert path.read_bytes() == b"{ precious but broken"
    assert not asides(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == [
        "benchmarks.json",
        "benchmarks.json.lock",
    ]


def test_file_corrupted_after_opening_is_moved_aside_at_flush(tmp_path):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    cache = TimingCache(path)
    path.write_bytes(b"\x00garbage")
    warned = put_and_flush(cache)
    assert warned and "moved it" in warned[0]
    assert [p.read_bytes() for p in asides(tmp_path)] == [b"\x00garbage"]
    assert set(json.loads(path.read_text())["entries"]) == {"new"}


# ---------------------------------------------------------------- bad entries


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0, True, "1.0", None, [1]])
def test_bad_seconds_are_never_used_and_never_dropped(tmp_path, seconds):
    path = tmp_path / "benchmarks.json"
    entries = {"bad": {"seconds": seconds}, "good": {"seconds": 3.0}, "odd": 7}
    path.write_text(json.dumps({"format": "linnet.benchmarks", "version": 1, "entries": entries}))
    cache, warned = recorded(TimingCache, path)
    assert warned == []
    assert cache.get("bad") is None and cache.get("odd") is None and cache.get("good") == 3.0
    assert put_and_flush(cache) == []
    kept = json.loads(path.read_text())["entries"]
    assert set(kept) == {"bad", "good", "odd", "new"}


# ---------------------------------------------------------------- unreadable files


def test_unreadable_file_is_never_overwritten(tmp_path, monkeypatch):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    real = Path.read_bytes

    def refuse(self):
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    cache, warned = recorded(TimingCache, path)
    assert warned and "cannot read" in warned[0]
    warned = put_and_flush(cache)
    assert warned and "not saved" in warned[0]
    monkeypatch.undo()
    assert json.loads(path.read_text()) == GOOD
    assert not asides(tmp_path)


def test_directory_where_the_file_should_be(tmp_path):
    path = tmp_path / "benchmarks.json"
    path.mkdir()
    (path / "inside").write_text("mine")
    cache, warned = recorded(TimingCache, path)
    assert warned and "is a directory" in warned[0]
    assert put_and_flush(cache)
    assert (path / "inside").read_text() == "mine"


def test_directory_where_the_lock_should_be(tmp_path):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    (tmp_path / "benchmarks.json.lock").mkdir()
    cache, warned = recorded(TimingCache, path)
    assert warned == [] and cache.get("old") == 2.5
    warned = put_and_flush(cache)
    assert warned and "lock" in warned[0]
    assert json.loads(path.read_text()) == GOOD


def test_corrupt_file_and_no_lock_is_left_in_place(tmp_path):
    path = tmp_path / "benchmarks.json"
    path.write_bytes(b"{ broken")
    (tmp_path / "benchmarks.json.lock").mkdir()
    cache, warned = recorded(TimingCache, path)
    assert warned and "left it" in warned[0]
    assert put_and_flush(cache)
    assert path.read_bytes() == b"{ broken" and not asides(tmp_path)


# ---------------------------------------------------------------- homes that refuse writes


def test_home_that_is_a_file(home):
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("my notes")
    cache, warned = recorded(TimingCache)
    assert warned and "LINNET_HOME" in warned[0]
    assert cache.path == home / "benchmarks.json"
    assert put_and_flush(cache)
    assert home.read_text() == "my notes"


@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS])
def test_read_only_home(tmp_path, monkeypatch, err):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    (tmp_path / "benchmarks.json.lock").touch()
    monkeypatch.setattr(tempfile, "mkstemp", raising(err))
    cache, warned = recorded(TimingCache, path)
    assert warned == [] and cache.get("old") == 2.5
    warned = put_and_flush(cache)
    assert warned and "not saved" in warned[0]
    assert json.loads(path.read_text()) == GOOD


def test_read_only_home_without_a_lock_file(tmp_path, monkeypatch):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    real = os.open

    def refuse(name, flags, *a, **k):
        if str(name).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", name)
        return real(name, flags, *a, **k)

    monkeypatch.setattr(os, "open", refuse)
    cache = TimingCache(path)
    warned = put_and_flush(cache)
    assert warned and "lock" in warned[0]
    assert json.loads(path.read_text()) == GOOD


def test_missing_cache_directory_that_cannot_be_created(tmp_path):
    (tmp_path / "f").write_text("x")
    cache, warned = recorded(TimingCache, tmp_path / "f" / "benchmarks.json")
    assert warned == []
    assert put_and_flush(cache)
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_full_disk_keeps_the_old_file(tmp_path, monkeypatch, where):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    cache = TimingCache(path)
    monkeypatch.setattr(os, where, raising(errno.ENOSPC))
    warned = put_and_flush(cache)
    assert warned and "No space left" in warned[0]
    monkeypatch.undo()
    assert json.loads(path.read_text()) == GOOD
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == [
        "benchmarks.json",
        "benchmarks.json.lock",
    ]
    # The timings stay pending: a later flush, with space again, saves them.
    recorded(cache.flush)
    assert set(json.loads(path.read_text())["entries"]) == {"old", "new"}


def test_first_flush_creates_the_directory(tmp_path):
    cache = TimingCache(tmp_path / "a" / "b" / "benchmarks.json")
    assert put_and_flush(cache) == []
    assert json.loads((tmp_path / "a" / "b" / "benchmarks.json").read_text())["entries"]["new"]


# ---------------------------------------------------------------- any bytes at all

ENTRY = st.one_of(
    st.none(),
    st.floats(),
    st.integers(),
    st.dictionaries(st.just("seconds"), st.one_of(st.floats(), st.text())),
)
OURS = st.builds(
    lambda e: json.dumps({"format": "linnet.benchmarks", "version": 1, "entries": e}).encode(),
    st.dictionaries(st.text(max_size=4), ENTRY, max_size=4),
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.one_of(st.binary(max_size=80), OURS))
def test_any_file_gives_a_cache_and_loses_nothing(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("c")
    path = d / "benchmarks.json"
    path.write_bytes(data)
    cache, _ = recorded(TimingCache, path)
    for key in cache.entries:
        value = cache.get(key)
        assert value is None or (value >= 0 and value != float("inf"))
    put_and_flush(cache)
    kept = [p.read_bytes() for p in asides(d)]
    if kept:
        assert kept == [data]
    else:  # it was ours: every entry it had is still there, and the new one
        old = json.loads(data)["entries"]
        assert set(json.loads(path.read_text())["entries"]) == set(old) | {"new"}


def test_read_only_file_is_not_replaced(tmp_path):
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(GOOD))
    path.chmod(0o444)
    warned = put_and_flush(TimingCache(path))
    assert warned and "read-only" in warned[0]
    assert json.loads(path.read_text()) == GOOD


@pytest.mark.parametrize(
    "text",
    [
        '{"seconds": 1e999}',
        '{"seconds": ' + "9" * 400 + "}",
        '{"seconds": NaN}',
        '{"seconds": -Infinity}',
    ],
)
def test_extreme_seconds_are_not_used(tmp_path, text):
    path = tmp_path / "benchmarks.json"
    path.write_text('{"format": "linnet.benchmarks", "version": 1, "entries": {"k": ' + text + "}}")
    cache, warned = recorded(TimingCache, path)
    assert warned == [] and cache.get("k") is None


def test_no_home_directory_at_all(monkeypatch):
    def nowhere():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("LINNET_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", nowhere)
    cache, warned = recorded(TimingCache)
    assert warned and "LINNET_HOME" in warned[0]
    assert put_and_flush(cache)


# ---------------------------------------------------------------- whose home (issue 38, item 1)
@pytest.mark.parametrize("data", [b"my own benchmark results", b'{"format": "other"}', b"[]"])
def test_a_users_benchmarks_json_in_a_home_linnet_did_not_make_is_left_alone(home, data):
    home.mkdir()
    (home / "benchmarks.json").write_bytes(data)
    (home / "thesis.tex").write_bytes(b"\\begin")  # LINNET_HOME=$HOME, say
    cache, warned = recorded(TimingCache)
    assert warned and "left it as it is" in warned[0] and "may be yours" in warned[0]
    warned = put_and_flush(cache)
    assert warned and "not saved" in warned[0]
    assert (home / "benchmarks.json").read_bytes() == data
    assert not asides(home)


def test_a_corrupt_timing_cache_in_linnets_home_is_moved_aside_and_recorded(home):
    from linnet.lang.home import linnet_home

    linnet_home()  # Linnet makes the home (and marks it)
    (home / "benchmarks.json").write_bytes(b"{ truncated")
    cache, warned = recorded(TimingCache)
    assert warned and "moved it" in warned[0]
    [aside] = asides(home)
    assert aside.read_bytes() == b"{ truncated"
    lines = [json.loads(x) for x in (home / "linnet-files.jsonl").read_text().splitlines()]
    assert [x["path"] for x in lines] == [aside.name]  # so that a clear may remove it
    assert put_and_flush(cache) == []
