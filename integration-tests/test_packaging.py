"""Each distribution installs alone: linnet-lang in a fresh venv works without torch or jax."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_linnet_lang_installs_alone(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    subprocess.run(
        [uv, "build", "--package", "linnet-lang", "--wheel", "--out-dir", str(tmp_path / "dist")],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("linnet_lang-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--no-index", str(wheel)], check=True
    )
    out = subprocess.run(
        [str(venv / "bin" / "linnet"), "check", str(ROOT / "examples/llama/llama.linnet")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    probe = subprocess.run(
        [
            str(py),
            "-c",
            "import sys, linnet.lang, linnet.lang.emit.torch; "
            "print('torch' in sys.modules, 'jax' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == ["False", "False"]
    listed = subprocess.run([str(py), "-m", "pip", "list"], capture_output=True, text=True)
    assert "torch" not in listed.stdout.lower()


RUNTIMES = {"linnet-runtime-torch": "linnet.torch"}
"""Each runtime distribution and its package: each must run `linnet run` from its wheel alone."""


@pytest.mark.slow
def test_each_wheel_installs_and_imports_alone(fresh_venv, built_wheels):
    """One fresh venv, filled one distribution at a time in dependency order: each imports
    with only what it declares installed, and `linnet check` never needs more."""
    venv = fresh_venv()
    model = None
    steps = [
        ("linnet-lang", ["linnet.lang", "linnet.lang.cli"]),
        ("linnet-plan", ["linnet.backends", "linnet.plan", "linnet.backends.cli"]),
        # linnet.torch imports torch lazily; the plugins below import it for real.
        ("linnet-runtime-torch", ["linnet.torch", "linnet.torch.cli"]),
        ("linnet-flashinfer", ["linnet.torch.flashinfer"]),
        ("linnet-cublaslt", ["linnet.torch.cublaslt"]),
        ("linnet-serve", ["linnet.serve", "linnet.serve.cli"]),
    ]
    for name, modules in steps:
        venv.install_locked("--package", name)
        venv.install(built_wheels[name])
        probe = venv.run(
            "python",
            "-c",
            "import importlib, importlib.metadata as m; "
            + "; ".join(f"importlib.import_module({mod!r})" for mod in modules)
            + f"; print(m.version({name!r}))",
        )
        assert probe.returncode == 0, (name, probe.stderr)
        assert probe.stdout.strip() == "0.1.0"
        if model is None:
            model = venv.run(
                "python",
                "-c",
                "from linnet.lang.bundled import example; print(example() / 'llama.linnet')",
            ).stdout.strip()
            assert "site-packages" in model, model  # the wheel's copy, not the checkout's
        done = venv.run("linnet", "check", model)
        assert done.returncode == 0, (name, done.stdout, done.stderr)
    check = subprocess.run(
        [venv.uv, "pip", "check", "--python", str(venv.bin / "python")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.slow
@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_runtime_wheel_runs_the_demo_alone(fresh_venv, built_wheels, runtime, tmp_path):
    """`pip install linnet-runtime-torch` in a fresh venv, then `linnet run` outside the
    repository: the embedded demo (the Llama example from linnet-lang's wheel, a checkpoint
    written with safetensors, which needs numpy) runs."""
    venv = fresh_venv()
    venv.install_locked("--package", runtime)
    venv.install(built_wheels[runtime])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = venv.run("linnet", "run", "--tokens", "3", cwd=outside)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert list((venv.root / "home" / "demo").glob("llama-*.safetensors")), "no demo checkpoint"
    # A shipped model runs on its toy config, which the wheel carries beside it (issue 46).
    done = venv.run("linnet", "run", "std.models.gpt2", "--tokens", "2", cwd=outside)
    assert done.returncode == 0 and "decoded 2 tokens" in done.stdout, done.stderr
    listed = venv.run(
        "python",
        "-c",
        "import importlib.metadata as m; "
        "print(sorted(d.metadata['Name'] for d in m.distributions()))",
    )
    names = set(eval(listed.stdout))  # a list literal printed by the venv's own python
    assert {"linnet-lang", "linnet-plan", runtime, "numpy", "safetensors"} <= names
    assert not {
        n
        for n in names
        if n.startswith("linnet-") and n not in ("linnet-lang", "linnet-plan", runtime)
    }


def test_check_imports_no_runtime():
    """`linnet check` with every package installed imports neither torch nor any extension's
    module: the CLI loads only the extension named like the command run."""
    example = ROOT / "examples" / "llama" / "llama.linnet"
    code = (
        "import sys; from linnet.lang.cli import main; rc = main(['check', sys.argv[1]]); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
        "or m.startswith(('linnet.torch', 'linnet.backends', 'linnet.plan'))); "
        "print(rc, heavy)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(example)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout


def test_help_lists_extensions_without_torch():
    """`linnet --help` loads every extension's registration, and none of them imports torch."""
    code = (
        "import sys, contextlib, io\nfrom linnet.lang.cli import main\nout = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\nprint(repr(out.getvalue()), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    text, torch_imported = done.stdout.rsplit(" ", 1)
    for command in ("check", "backends", "run", "plan"):
        assert f"    {command} " in eval(text), text
    assert torch_imported.strip() == "False"


def test_linnet_torch_imports_lazily():
    """`import linnet.torch` imports no torch until a name is used (the runtime's own tests
    use every name); each public name is listed by dir()."""
    code = (
        "import sys, linnet.torch as lt; "
        "print('torch' in sys.modules, sorted(set(lt.__all__) - set(dir(lt))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "[]"]


class FakeEntryPoint:
    """A `linnet.commands` entry point whose loading is recorded."""

    def __init__(self, name: str, loaded: list[str], broken: bool = False) -> None:
        self.name = name
        self.loaded = loaded
        self.broken = broken

    def load(self):
        self.loaded.append(self.name)
        if self.broken:
            raise ImportError("no module named heavy_runtime")

        def register(subparsers):
            p = subparsers.add_parser(self.name, help=f"the {self.name} command")
            p.set_defaults(run=lambda args: 7)

        return register


@pytest.mark.parametrize(
    "argv, loads",
    [
        (["check", "x.linnet"], []),
        (["explain", "E0301"], []),
        (["graph", "--help"], []),
        (["run"], ["run"]),
        (["run", "--tokens", "2"], ["run"]),
        (["plan", "--help"], ["plan"]),
        (["--help"], ["run", "plan", "broken"]),
        ([], ["run", "plan", "broken"]),
        (["rnu"], ["run", "plan", "broken"]),  # a typo: load all, so argparse lists them
        (["--", "run"], ["run", "plan", "broken"]),
    ],
)
def test_cli_loads_only_the_extension_it_runs(monkeypatch, argv, loads):
    from linnet.lang import cli

    loaded: list[str] = []
    eps = [
        FakeEntryPoint("run", loaded),
        FakeEntryPoint("plan", loaded),
        FakeEntryPoint("broken", loaded, broken=True),
    ]
    monkeypatch.setattr(cli, "entry_points", lambda group: eps)
    cli.build_parser(argv)
    assert loaded == loads
    if argv == ["run"]:
        loaded.clear()
        assert cli.main(argv) == 7  # the extension's command runs
        assert loaded == ["run"]


def test_cli_a_broken_extension_never_stops_other_commands(monkeypatch, capsys):
    from linnet.lang import cli

    loaded: list[str] = []
    monkeypatch.setattr(
        cli, "entry_points", lambda group: [FakeEntryPoint("broken", loaded, broken=True)]
    )
    monkeypatch.setenv("LINNET_DEBUG", "1")
    with pytest.raises(SystemExit):
        cli.main(["broken"])  # it failed to register: argparse says the command is unknown
    err = capsys.readouterr().err
    assert "skipped command plugin broken: no module named heavy_runtime" in err
    assert "Traceback" not in err
