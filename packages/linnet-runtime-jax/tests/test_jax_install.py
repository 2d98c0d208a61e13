"""Install alone (issue 16, item 4): in a fresh venv holding only linnet-lang's and
linnet-runtime-jax's wheels and what they declare (jax, safetensors, numpy, at uv.lock's
pins, from uv's cache), torch is absent, and the Llama example runs through
`linnet run --runtime jax` and the Python API."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run(
    command: list, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{done.stdout}\n{done.stderr}"
    return done


API = """
import numpy as np
from linnet.jax import load, load_function, random_weights, save_safetensors
from linnet.lang.bundled import example
from linnet.lang.cli import load_config
model = example() / "llama.linnet"
save_safetensors(random_weights(model, load_config("toy", [], str(model))), "toy.safetensors")
decode = load_function(model, "decode", weights="toy.safetensors", config="toy")
ins = [np.array([1], np.int32), np.array([0], np.int32)]
(logits,), states = decode(decode.params, decode.new_states(ins), ins)
m = load(model, weights="toy.safetensors", config="toy")
print(logits.shape, m.prefill(np.array([[1, 2, 3]], np.int32)).shape)
"""


def test_runtime_jax_installs_and_runs_without_torch(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    dist = tmp_path / "dist"
    for name in ("linnet-lang", "linnet-runtime-jax"):
        run(
            [
                uv,
                "build",
                "--quiet",
                "--package",
                name,
                "--wheel",
                "--no-sources",
                "--offline",
                "--out-dir",
                dist,
            ],
            cwd=ROOT,
        )
    venv = tmp_path / "venv"
    run([uv, "venv", "--quiet", "--python", sys.executable, venv])
    py = venv / "bin" / "python"
    lock = tmp_path / "pylock.toml"
    run(
        [
            uv,
            "export",
            "--quiet",
            "--frozen",
            "--format",
            "pylock.toml",
            "--no-default-groups",
            "--no-emit-workspace",
            "--package",
            "linnet-runtime-jax",
            "-o",
            lock,
        ],
        cwd=ROOT,
    )
    run([uv, "pip", "install", "--quiet", "--python", py, "--offline", "-r", lock])
    run(
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            py,
            "--no-index",
            f"--find-links={dist}",
            *dist.glob("linnet_runtime_jax-*.whl"),
        ]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["LINNET_HOME"] = str(tmp_path / "home")
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    probe = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr
    names = run(
        [
            py,
            "-c",
            "import importlib.metadata as m; "
            "print(sorted(d.metadata['Name'].lower() for d in m.distributions()))",
        ],
        env=env,
    ).stdout
    assert "'torch'" not in names and "'jax'" in names and "linnet-runtime-torch" not in names

    # The CLI: the demo (the example from linnet-lang's wheel, a generated checkpoint); jax
    # is the default runtime where torch is not installed. It samples (issue 46 item 14),
    # and its --help lists only the options JAX takes.
    done = run(
        [
            venv / "bin" / "linnet",
            "run",
            "--runtime",
            "jax",
            "--tokens",
            "3",
            "--temperature",
            "0.8",
            "--top-k",
            "50",
            "--sampling-seed",
            "1",
        ],
        cwd=outside,
        env=env,
    )
    assert "(jax)" in done.stdout and "decoded 3 tokens" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr
    usage = run([venv / "bin" / "linnet", "run", "--help"], cwd=outside, env=env).stdout
    assert "--temperature" in usage and "--stop" in usage, usage
    assert not any(o in usage for o in ("--compile", "--interpret", "--nproc", "--rank-timeout"))
    default = run([venv / "bin" / "linnet", "run", "--tokens", "2"], cwd=outside, env=env)
    assert "(jax)" in default.stdout
    torch_asked = subprocess.run(
        [venv / "bin" / "linnet", "run", "--runtime", "torch"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
    )
    assert torch_asked.returncode != 0 and "E0790" in torch_asked.stderr
    assert "Traceback" not in torch_asked.stderr

    # The Python API: load_function and load.
    api = run([py, "-c", API], cwd=outside, env=env)
    assert api.stdout.split("\n")[-2] == "(1, 256) (1, 3, 256)", api.stdout + api.stderr
