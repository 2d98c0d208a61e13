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
    subprocess.run([uv, "build", "--package", "linnet-lang", "--wheel", "--out-dir",
                    str(tmp_path / "dist")], cwd=ROOT, check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("linnet_lang-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-index", str(wheel)],
                   check=True)
    out = subprocess.run([str(venv / "bin" / "linnet"), "check",
                          str(ROOT / "examples/llama/llama.linnet")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    probe = subprocess.run(
        [str(py), "-c", "import sys, linnet.lang, linnet.lang.emit_torch; "
         "print('torch' in sys.modules, 'jax' in sys.modules)"],
        capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["False", "False"]
    listed = subprocess.run([str(py), "-m", "pip", "list"], capture_output=True, text=True)
    assert "torch" not in listed.stdout.lower()
