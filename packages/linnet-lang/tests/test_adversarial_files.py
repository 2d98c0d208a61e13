"""Adversarial suite (issue 11, items 9, 10 and 12): $LINNET_HOME, `-o`, configs and `--input`.

Every case is a fault a user or their machine can produce: a home that is a file, a read-only
directory, a full disk, `-o` onto the model's own source, a config with a BOM, a stray byte or
ten thousand brackets. Each must end in a coded diagnostic (never a traceback) and must leave
the user's files as they were. Tests run as root here, where `chmod 000` does not stop a
write, so permission faults are simulated by making the failing call raise; the other faults
are real (a file where a directory should be, a directory where a file should be, bad bytes).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linnet.lang import LinnetError
from linnet.lang import home as home_mod
from linnet.lang.cli import load_config, main, parse_inputs
from linnet.lang.home import atomic_write, linnet_home

MAIN = """\
use std.nn.linear::{Linear}
use helpers::{double}

pub model Tiny<D: Dim> {
    block proj: Linear<D, D, f32>

    entry forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
        return self.proj(x)
    }
}
"""
HELPERS = """\
pub fn double(x: f32) -> f32 {
    return x * 2.0
}
"""
LOWER = ["--set", "D=4", "--input", "x=2,4"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    path = tmp_path / "home"
    monkeypatch.setenv("LINNET_HOME", str(path))
    monkeypatch.delenv("LINNET_DEBUG", raising=False)
    return path


@pytest.fixture
def model(tmp_path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "helpers.linnet").write_text(HELPERS)
    (d / "main.linnet").write_text(MAIN)
    return d / "main.linnet"


def codes(err: pytest.ExceptionInfo[LinnetError] | LinnetError) -> list[str]:
    error = err if isinstance(err, LinnetError) else err.value
    return [d.code for d in error.diagnostics]


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    return rc, text


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


# ---------------------------------------------------------------- item 9: $LINNET_HOME


def test_home_is_created_private(home):
    assert linnet_home() == home and (home.stat().st_mode & 0o777) == 0o700


def test_home_that_is_a_file(home):
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("my notes")
    with pytest.raises(LinnetError) as err:
        linnet_home()
    assert codes(err) == ["E0660"]
    d = err.value.diagnostics[0]
    assert str(home) in d.message and "LINNET_HOME" in d.help
    assert home.read_text() == "my notes"


def test_home_below_a_file(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("LINNET_HOME", str(tmp_path / "f" / "linnet"))
    with pytest.raises(LinnetError) as err:
        linnet_home()
    assert codes(err) == ["E0660"] and "not a directory" in err.value.diagnostics[0].message


def test_home_that_cannot_be_created(home, monkeypatch):
    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(LinnetError) as err:
        linnet_home()
    assert codes(err) == ["E0660"]
    assert "writable directory" in err.value.diagnostics[0].help


def test_home_on_a_read_only_file_system(home, monkeypatch):
    def erofs(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", erofs)
    with pytest.raises(LinnetError) as err:
        linnet_home()
    assert codes(err) == ["E0660"] and "read-only" in err.value.diagnostics[0].message


def test_home_path_without_creating(home):
    assert linnet_home(create=False) == home and not home.exists()


def test_xdg_default(monkeypatch, tmp_path):
    monkeypatch.delenv("LINNET_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert linnet_home() == tmp_path / "xdg" / "linnet"


def _mkstemp_fails(monkeypatch, err: int) -> None:
    def fail(*a, **k):
        raise OSError(err, os.strerror(err), k.get("dir"))

    monkeypatch.setattr(tempfile, "mkstemp", fail)


def test_write_into_a_read_only_home(home, monkeypatch):
    path = linnet_home() / "generated" / "x.py"
    _mkstemp_fails(monkeypatch, errno.EACCES)
    with pytest.raises(LinnetError) as err:
        atomic_write(path, "x = 1\n")
    assert codes(err) == ["E0661"]
    d = err.value.diagnostics[0]
    assert str(path) in d.message and "LINNET_HOME" in d.help


def test_write_into_a_read_only_file_system(home, monkeypatch):
    _mkstemp_fails(monkeypatch, errno.EROFS)
    with pytest.raises(LinnetError) as err:
        atomic_write(linnet_home() / "x.txt", "hi")
    assert codes(err) == ["E0661"] and "read-only" in err.value.diagnostics[0].message


def test_write_onto_a_directory(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep").write_text("k")
    with pytest.raises(LinnetError) as err:
        atomic_write(target, "text")
    assert codes(err) == ["E0661"] and "is a directory" in err.value.diagnostics[0].message
    assert (target / "keep").read_text() == "k"
    assert [p.name for p in tmp_path.iterdir() if p.name != "home"] == ["out"]


def test_write_below_a_file(tmp_path):
    (tmp_path / "f").write_text("keep")
    with pytest.raises(LinnetError) as err:
        atomic_write(tmp_path / "f" / "x.txt", "text")
    assert codes(err) == ["E0661"]
    assert (tmp_path / "f").read_text() == "keep"


def test_write_into_a_missing_directory_without_parents(tmp_path):
    with pytest.raises(LinnetError) as err:
        atomic_write(tmp_path / "nope" / "x.txt", "text", parents=False)
    assert codes(err) == ["E0661"] and "does not exist" in err.value.diagnostics[0].message
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_full_disk_keeps_the_old_file(tmp_path, monkeypatch, where):
    target = tmp_path / "t.txt"
    target.write_text("old contents")

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "write":
        monkeypatch.setattr(home_mod, "_write_all", enospc)
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", enospc)
    else:
        monkeypatch.setattr(os, "replace", enospc)
    with pytest.raises(LinnetError) as err:
        atomic_write(target, "new contents " * 1000)
    assert codes(err) == ["E0661"]
    assert "free some space" in err.value.diagnostics[0].help
    assert target.read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir() if p.name != "home"] == ["t.txt"]


def test_write_keeps_an_existing_mode_and_gives_new_files_new_mode(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.txt"
    atomic_write(fresh, "x", new_mode=0o644)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    private = tmp_path / "private.txt"
    atomic_write(private, "x")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_write_through_a_symlink_replaces_its_target(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_write_onto_a_read_only_file(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("keep me")
    target.chmod(0o444)
    with pytest.raises(LinnetError) as err:
        atomic_write(target, "new")
    assert codes(err) == ["E0661"] and "read-only" in err.value.diagnostics[0].message
    assert target.read_text() == "keep me"


# ---------------------------------------------------------------- item 10: `-o`


@pytest.mark.parametrize("command", ["torch", "graph"])
@pytest.mark.parametrize("which", ["root", "module", "std", "symlink", "hardlink", "relative"])
def test_output_onto_a_source_file_is_refused(capsys, tmp_path, model, monkeypatch, command, which):
    from linnet.lang.syntax.program import STD_ROOT

    argv = [command, str(model), *LOWER]
    if command == "graph":
        argv += ["--entry", "forward"]
    if which == "root":
        target = model
    elif which == "module":
        target = model.parent / "helpers.linnet"
    elif which == "std":
        target = STD_ROOT / "nn" / "linear.linnet"
    elif which == "symlink":
        target = tmp_path / "alias.linnet"
        target.symlink_to(model)
    elif which == "hardlink":
        target = tmp_path / "hard.linnet"
        os.link(model, target)
    else:
        monkeypatch.chdir(model.parent)
        target = Path("main.linnet")
    before = {
        p: p.read_bytes()
        for p in (model, model.parent / "helpers.linnet", STD_ROOT / "nn" / "linear.linnet")
    }
    rc, text = run_cli(capsys, [*argv, "-o", str(target)])
    assert rc == 1 and "E0662" in text
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("what", ["config", "weights"])
def test_output_onto_the_config_or_weights_is_refused(capsys, tmp_path, model, what):
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"D": 4}')
    argv = ["torch", str(model), "--config", str(cfg), "--input", "x=2,4"]
    target = cfg
    if what == "weights":
        import numpy as np
        from safetensors.numpy import save_file

        target = tmp_path / "w.safetensors"
        save_file(
            {"proj.weight": np.zeros((4, 4), np.float32), "proj.bias": np.zeros(4, np.float32)},
            str(target),
        )
        argv += ["--weights", str(target)]
    before = target.read_bytes()
    rc, text = run_cli(capsys, [*argv, "-o", str(target)])
    assert rc == 1 and "E0662" in text
    assert target.read_bytes() == before


@pytest.mark.parametrize("command", ["torch", "graph"])
def test_output_into_a_missing_directory(capsys, tmp_path, model, command):
    argv = [command, str(model), *LOWER] + (["--entry", "forward"] if command == "graph" else [])
    rc, text = run_cli(capsys, [*argv, "-o", str(tmp_path / "no" / "out.py")])
    assert rc == 1 and "E0661" in text and "does not exist" in text
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("command", ["torch", "graph"])
def test_output_onto_a_directory(capsys, tmp_path, model, command):
    argv = [command, str(model), *LOWER] + (["--entry", "forward"] if command == "graph" else [])
    (tmp_path / "d").mkdir()
    rc, text = run_cli(capsys, [*argv, "-o", str(tmp_path / "d")])
    assert rc == 1 and "E0661" in text and "is a directory" in text
    assert list((tmp_path / "d").iterdir()) == []


def test_output_onto_a_read_only_file(capsys, tmp_path, model):
    target = tmp_path / "out.py"
    target.write_text("# mine\n")
    target.chmod(0o444)
    rc, text = run_cli(capsys, ["torch", str(model), *LOWER, "-o", str(target)])
    assert rc == 1 and "E0661" in text
    assert target.read_text() == "# mine\n"


@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS, errno.ENOSPC, errno.EDQUOT])
def test_output_in_a_directory_that_refuses(capsys, tmp_path, model, monkeypatch, err):
    target = tmp_path / "out.py"
    target.write_text("# old\n")
    _mkstemp_fails(monkeypatch, err)
    rc, text = run_cli(capsys, ["torch", str(model), *LOWER, "-o", str(target)])
    assert rc == 1 and "E0661" in text
    assert target.read_text() == "# old\n"


def test_output_on_a_full_disk_keeps_the_old_file(capsys, tmp_path, model, monkeypatch):
    target = tmp_path / "out.py"
    target.write_text("# old\n")

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(home_mod, "_write_all", enospc)
    rc, text = run_cli(capsys, ["torch", str(model), *LOWER, "-o", str(target)])
    assert rc == 1 and "E0661" in text and "No space left" in text
    assert target.read_text() == "# old\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["model", "out.py"]


def test_output_json_errors_go_to_stdout_as_json(capsys, model):
    rc = main(
        ["graph", str(model), "--entry", "forward", *LOWER, "--format", "json", "-o", str(model)]
    )
    assert rc == 1
    assert [d["code"] for d in json.loads(capsys.readouterr().out)] == ["E0662"]


def test_output_written_atomically_with_the_old_mode(capsys, tmp_path, model):
    target = tmp_path / "out.py"
    target.write_text("# old\n")
    target.chmod(0o604)
    rc, text = run_cli(capsys, ["torch", str(model), *LOWER, "-o", str(target)])
    assert rc == 0 and "wrote" in text
    assert "def forward" in target.read_text() or "forward" in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o604
    fresh = tmp_path / "g.txt"
    rc, _ = run_cli(capsys, ["graph", str(model), "--entry", "forward", *LOWER, "-o", str(fresh)])
    umask = os.umask(0)
    os.umask(umask)
    assert rc == 0 and fresh.read_text().startswith("graph Tiny.forward")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


# ---------------------------------------------------------------- item 12: configs


def write_config(tmp_path: Path, data: bytes) -> str:
    p = tmp_path / "cfg.json"
    p.write_bytes(data)
    return str(p)


def test_config_with_a_bom_is_read(tmp_path):
    path = write_config(tmp_path, b"\xef\xbb\xbf" + b'{"D": 4, "_c": "x"}')
    assert load_config(path, []) == {"D": 4}


@pytest.mark.parametrize(
    "data,offset",
    [(b'{"D": 4, "T": "\xff"}', 15), (b'\xef\xbb\xbf{"D": "\xc3"}', 10), (b"\xfe\xff\x00{", 0)],
)
def test_config_with_a_bad_byte(tmp_path, data, offset):
    with pytest.raises(LinnetError) as err:
        load_config(write_config(tmp_path, data), [])
    assert codes(err) == ["E0645"]
    assert f"byte {offset}" in err.value.diagnostics[0].message


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, '{"D": ' + "[" * 5000 + "]" * 5000 + "}", '{"a":' * 3000 + "1" + "}" * 3000],
)
def test_config_nested_too_deeply(tmp_path, text):
    with pytest.raises(LinnetError) as err:
        load_config(write_config(tmp_path, text.encode()), [])
    assert codes(err) == ["E0646"]


@pytest.mark.parametrize(
    "text",
    [
        "[64, 4]",
        '"D"',
        "4",
        "null",
        "",
        "   ",
        "{",
        '{"D": 4} x',
        '{"D": NaN}',
        '{"D": Infinity}',
        '{"D": -Infinity}',
    ],
)
def test_config_that_is_not_one_json_object(tmp_path, text):
    with pytest.raises(LinnetError) as err:
        load_config(write_config(tmp_path, text.encode()), [])
    assert codes(err) == ["E0641"]


def test_config_with_a_key_twice(tmp_path):
    with pytest.raises(LinnetError) as err:
        load_config(write_config(tmp_path, b'{"D": 64, "H": 4, "D": 32}'), [])
    assert codes(err) == ["E0664"] and "`D`" in err.value.diagnostics[0].message


def test_config_that_is_a_directory(tmp_path):
    (tmp_path / "cfg").mkdir()
    with pytest.raises(LinnetError) as err:
        load_config(str(tmp_path / "cfg"), [])
    assert codes(err) == ["E0647"]


def test_config_that_cannot_be_read(tmp_path, monkeypatch):
    path = write_config(tmp_path, b'{"D": 4}')

    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(LinnetError) as err:
        load_config(path, [])
    assert codes(err) == ["E0647"] and "Permission denied" in err.value.diagnostics[0].message


def test_config_not_found_is_still_E0640(tmp_path):
    with pytest.raises(LinnetError) as err:
        load_config(str(tmp_path / "nope.json"), [])
    assert codes(err) == ["E0640"]


@pytest.mark.parametrize("item", ["=3", " =3", "D"])
def test_set_without_a_name(item):
    with pytest.raises(LinnetError) as err:
        load_config(None, [item])
    assert codes(err) == ["E0642"]


def test_config_errors_through_the_cli(capsys, tmp_path, model):
    path = write_config(tmp_path, b'{"D": "\xff"}')
    rc, text = run_cli(
        capsys, ["graph", str(model), "--entry", "forward", "--config", path, "--input", "x=2,4"]
    )
    assert rc == 1 and "E0645" in text


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.text(alphabet='{}[]":,0123456789aD \\', max_size=40).map(str.encode),
    )
)
def test_any_config_bytes_give_a_dict_or_a_coded_error(tmp_path, data):
    try:
        config = load_config(write_config(tmp_path, data), [])
    except LinnetError as err:
        assert codes(err)[0] in {"E0641", "E0645", "E0646", "E0664"}
    else:
        assert isinstance(config, dict)


# ---------------------------------------------------------------- item 12: `--input`


def test_inputs_parse():
    assert parse_inputs(["tokens=1,16", "x=2x3", "s=", "y= 4 , 5 "]) == {
        "tokens": [1, 16],
        "x": [2, 3],
        "s": [],
        "y": [4, 5],
    }


@pytest.mark.parametrize(
    "item",
    [
        "x=-1",
        "x=2,-3",
        "x=99999999999999999999999",
        "x=" + "9" * 5000,
        "x=4294967296,4294967296",
        "x=9223372036854775808",
    ],
)
def test_input_dims_out_of_range(item):
    with pytest.raises(LinnetError) as err:
        parse_inputs([item])
    assert codes(err) == ["E0648"]


@pytest.mark.parametrize(
    "item", ["x=abc", "x=1.5", "x=1,,2", "x=+1", "x=1_0", "x=\u0663", "x=1e3", "x=0o7", "x=,"]
)
def test_input_dims_that_are_not_integers(item):
    with pytest.raises(LinnetError) as err:
        parse_inputs([item])
    assert codes(err) == ["E0643"]


@pytest.mark.parametrize(
    "items", [["=1,2"], [" =1"], ["1,2"], ["x"], ["x y=1"], ["x=1", "x=2"], ["x=1", " x =2"]]
)
def test_input_names(items):
    with pytest.raises(LinnetError) as err:
        parse_inputs(items)
    assert codes(err) == ["E0649"]


@pytest.mark.parametrize(
    "item,code",
    [
        ("x=-1,4", "E0648"),
        ("x=abc,4", "E0643"),
        ("x=99999999999999999999999,4", "E0648"),
        ("x=1,,4", "E0643"),
        ("=2,4", "E0649"),
        ("x", "E0649"),
    ],
)
def test_input_errors_through_the_cli(capsys, model, item, code):
    rc, text = run_cli(
        capsys, ["graph", str(model), "--entry", "forward", "--set", "D=4", "--input", item]
    )
    assert rc == 1 and f"error[{code}]" in text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="xy=,-0123456789 a_", max_size=12), max_size=3))
def test_any_input_items_give_shapes_or_a_coded_error(items):
    try:
        shapes = parse_inputs(items)
    except LinnetError as err:
        assert codes(err)[0] in {"E0643", "E0648", "E0649"}
    else:
        for name, dims in shapes.items():
            assert name.isidentifier()
            assert all(isinstance(d, int) and 0 <= d < 2**63 for d in dims)


# ---------------------------------------------------------------- the last line of defence


def test_an_os_error_in_a_command_is_a_message(capsys, model, monkeypatch):
    from linnet.lang import cli

    def eio(*a, **k):
        raise OSError(errno.EIO, "Input/output error", str(model))

    monkeypatch.setattr(cli.Program, "from_file", eio)
    rc, text = run_cli(capsys, ["check", str(model)])
    assert rc == 1 and "E0663" in text and "Input/output error" in text


def test_an_os_error_is_a_traceback_under_linnet_debug(model, monkeypatch):
    from linnet.lang import cli

    def eio(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(cli.Program, "from_file", eio)
    monkeypatch.setenv("LINNET_DEBUG", "1")
    with pytest.raises(OSError):
        main(["check", str(model)])


def test_a_bad_home_through_the_cli(capsys, home, model, monkeypatch):
    from linnet.lang import cli

    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("not a dir")

    def uses_home(args):
        linnet_home()
        return 0

    monkeypatch.setattr(cli, "cmd_check", uses_home)
    rc, text = run_cli(capsys, ["check", str(model)])
    assert rc == 1 and "E0660" in text


def test_no_fault_left_a_file_behind(tmp_path, model, capsys):
    before = snapshot(model.parent)
    for argv in (
        ["torch", str(model), *LOWER, "-o", str(model)],
        ["torch", str(model), *LOWER, "-o", str(tmp_path / "x" / "y.py")],
    ):
        run_cli(capsys, argv)
    assert snapshot(model.parent) == before


def test_output_onto_a_device_writes_through_it(capsys, model):
    rc, text = run_cli(capsys, ["torch", str(model), *LOWER, "-o", os.devnull])
    assert rc == 0 and "wrote" in text and stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_output_onto_the_config_by_its_name(capsys, tmp_path, model):
    (model.parent / "configs").mkdir()
    cfg = model.parent / "configs" / "tiny.json"
    cfg.write_text('{"D": 4}')
    rc, text = run_cli(
        capsys, ["torch", str(model), "--config", "tiny", "--input", "x=2,4", "-o", str(cfg)]
    )
    assert rc == 1 and "E0662" in text and cfg.read_text() == '{"D": 4}'


def test_output_onto_a_loop_of_links(capsys, tmp_path, model):
    loop = tmp_path / "loop.py"
    loop.symlink_to(tmp_path / "loop2.py")
    (tmp_path / "loop2.py").symlink_to(loop)
    rc, text = run_cli(capsys, ["torch", str(model), *LOWER, "-o", str(loop)])
    assert rc == 1 and "E0661" in text
    assert loop.is_symlink() and (tmp_path / "loop2.py").is_symlink()


def test_no_home_directory_at_all(monkeypatch):
    def nowhere():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("LINNET_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", nowhere)
    with pytest.raises(LinnetError) as err:
        linnet_home()
    assert codes(err) == ["E0660"] and "LINNET_HOME" in err.value.diagnostics[0].help


# ---------------------------------------------------------------- issue 38 item 1: whose home
def test_a_home_linnet_makes_is_marked_as_linnets(home):
    from linnet.lang.home import MARKER, is_linnet_home

    assert not home.exists()
    linnet_home()
    assert is_linnet_home(home)
    assert (home / MARKER).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def test_an_empty_folder_is_marked_and_a_full_one_is_not(tmp_path, monkeypatch):
    from linnet.lang.home import MARKER, is_linnet_home

    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    for folder in (empty, full):
        monkeypatch.setenv("LINNET_HOME", str(folder))
        linnet_home()
    assert is_linnet_home(empty)
    assert not is_linnet_home(full) and sorted(p.name for p in full.iterdir()) == ["notes.txt"]
    (full / MARKER).write_text("Signature: 8a477f597d28d172789f06886806bc55\n# another tool\n")
    assert not is_linnet_home(full)  # a cache tag, but not Linnet's


def test_generated_source_never_writes_through_a_link(home, tmp_path):
    import hashlib

    from linnet.lang.home import import_source

    text = "v = 5\n"
    name = f"linnet_linked_{hashlib.sha256(text.encode()).hexdigest()[:20]}.py"
    (linnet_home() / "generated").mkdir()
    theirs = tmp_path / "theirs.py"
    theirs.write_text("precious")
    (home / "generated" / name).symlink_to(theirs)
    assert import_source(text, "linnet_linked").v == 5
    assert theirs.read_text() == "precious"
    assert not (home / "generated" / name).is_symlink()


def test_atomic_write_can_replace_a_link_instead_of_its_target(tmp_path):
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_text("keep")
    link.symlink_to(target)
    atomic_write(link, "new", follow_symlinks=False)
    assert target.read_text() == "keep" and link.read_text() == "new" and not link.is_symlink()
    link.unlink()
    link.symlink_to(target)
    atomic_write(link, "through")  # the default: the link is followed, as for `-o`
    assert target.read_text() == "through" and link.is_symlink()
