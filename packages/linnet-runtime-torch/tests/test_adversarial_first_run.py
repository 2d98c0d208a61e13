"""A newcomer's first minutes with `linnet run` and `generate` on PyTorch (issue 46, items 9-12
and 15).

* Item 9: a checkpoint's end-of-sequence tokens stop `Model.generate` and `linnet run` where
  transformers' `generate` stops (generation_config.json's eos_token_id, else config.json's;
  a generation_config.json without one stops nothing), against transformers on a random
  `save_pretrained` directory whose eos is hit early; `stop_tokens=[]` / `--stop none`
  turn it off; a damaged eos is E0798 at load.
* Item 10: `linnet run DIR` runs the shipped model DIR's config.json names, and says so.
* Item 11: the shipped models run without weights on their toy configs; `--set` reaches the
  model.
* Item 12: every `linnet run` option is checked before torch is imported.
* Item 15: the CPU thread count is chosen (one for a small model), said, settable with
  `--threads`, and OMP_NUM_THREADS is respected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from linnet.lang import LinnetError  # noqa: E402
from linnet.lang.cli import main  # noqa: E402
from linnet.torch import load, random_weights  # noqa: E402
from support import LLAMA, toy_config  # noqa: E402

PROMPT = [5, 17, 200, 3, 9]
STEPS = 16
SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def hf_generate(path, prompt=PROMPT, steps=STEPS) -> list[int]:
    """transformers' greedy generate on the checkpoint at ``path``, as a user runs it."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A random Qwen2 saved by transformers, its greedy tokens with no end-of-sequence
    token, and copies of it whose eos (a token first generated at step 3 or later) is named
    in generation_config.json (with a second id never generated: a list), in config.json
    only, or in config.json while a generation_config.json names none."""
    torch.manual_seed(0)
    hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL)).eval()
    base = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(base)
    with torch.no_grad():
        full = hf.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
        )[0, len(PROMPT) :].tolist()
    step = next(i for i in range(3, STEPS - 4) if full[i] not in full[:i])
    eos, unused = full[step], next(t for t in range(256) if t not in full)
    dirs = {}
    for name in ("generation", "config", "neither"):
        d = tmp_path_factory.mktemp(name)
        for f in base.iterdir():
            shutil.copy(f, d / f.name)
        cfg = json.loads((d / "config.json").read_text())
        if name == "generation":
            (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, unused]}))
        else:
            cfg["eos_token_id"] = eos
            (d / "config.json").write_text(json.dumps(cfg))
            if name == "config":
                (d / "generation_config.json").unlink()
            else:  # a generation_config.json that names no eos: transformers does not stop
                (d / "generation_config.json").write_text(json.dumps({"do_sample": False}))
        dirs[name] = d
    return full, step, eos, unused, dirs


@pytest.mark.parametrize("kind", ["generation", "config", "neither"])
def test_generate_stops_where_transformers_stops(checkpoints, kind):
    """Before: Linnet ignored generation_config.json and emitted every token."""
    full, step, eos, unused, dirs = checkpoints
    want = hf_generate(dirs[kind])
    cut = full[: step + 1]
    assert want == (full if kind == "neither" else cut)  # the reference itself
    model = load("std.models.qwen2", weights=dirs[kind], config={"S": 64})
    assert model.stop_tokens == {"generation": (eos, unused), "config": (eos,), "neither": ()}[kind]
    assert model.generate([PROMPT], STEPS) == [want]


def test_stop_tokens_given_win(checkpoints):
    full, step, _, _, dirs = checkpoints
    model = load("std.models.qwen2", weights=dirs["generation"], config={"S": 64})
    assert model.generate([PROMPT], STEPS, stop_tokens=[]) == [full]  # off
    other = full[step + 2]
    assert model.generate([PROMPT], STEPS, stop_tokens=[other]) == [full[: full.index(other) + 1]]


def test_a_damaged_eos_is_E0798_at_load(checkpoints, tmp_path):
    *_, dirs = checkpoints
    for f in dirs["generation"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "<|endoftext|>"}')
    with pytest.raises(LinnetError) as info:
        load("std.models.qwen2", weights=tmp_path, config={"S": 64})
    assert info.value.diagnostics[0].code == "E0798"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["run", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.out, out.err


def test_linnet_run_dir_picks_the_model_and_stops_at_eos(checkpoints, capsys):
    """Item 10: before, `linnet run DIR` gave three unrelated errors; item 9: it ran every
    token past the eos."""
    full, step, eos, unused, dirs = checkpoints
    prompt = ",".join(map(str, PROMPT))
    rc, out, err = run(
        capsys, str(dirs["generation"]), "--prompt", prompt, "--tokens", str(STEPS), "--set", "S=64"
    )
    assert rc == 0, err
    assert "linnet: config.json's architecture Qwen2ForCausalLM: running std.models.qwen2" in err
    assert f"stopping at generation_config.json's eos_token_id {[eos, unused]}" in err
    assert f"decoded {step + 1} tokens: {full[: step + 1]}" in out
    assert "loaded std.models.qwen2 on cpu, 1 thread" in out
    rc, out, _ = run(
        capsys,
        "--weights",
        str(dirs["generation"]),
        "--prompt",
        prompt,
        "--tokens",
        str(STEPS),
        "--set",
        "S=64",
        "--stop",
        "none",
    )
    assert rc == 0 and f"decoded {STEPS} tokens: {full}" in out


@pytest.mark.parametrize("name", ["qwen2", "gpt2"])
def test_a_shipped_model_runs_without_weights(capsys, name):
    """Item 11: before, `linnet run std.models.qwen2` ended in E0603."""
    rc, out, err = run(capsys, f"std.models.{name}", "--tokens", "2")
    assert rc == 0, err
    assert f"loaded std.models.{name} on cpu" in out and "decoded 2 tokens" in out
    assert f"generating a deterministic checkpoint for {name}.linnet (toy config" in err


def test_set_reaches_the_model(capsys):
    # A cache of 16 positions cannot take a prompt of 8 and 16 more tokens: --set S was used.
    rc, _, err = run(capsys, "std.models.llama", "--set", "S=16", "--tokens", "16")
    assert rc == 1 and "error[E0788]" in err and "below 16" in err


# ---------------------------------------------------------------- item 15: threads
@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_linnet_run_chooses_says_and_takes_the_thread_count(capsys, threads, monkeypatch):
    """Before: torch's default (every logical CPU): the demo's per-token time swung 100x on
    a shared machine. Now one thread for a small model, said in the output."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    rc, out, err = run(capsys, str(LLAMA), "--tokens", "2")
    assert rc == 0 and "on cpu, 1 thread in" in out and torch.get_num_threads() == 1
    assert "linnet: 1 thread on the CPU (a small model" in err
    if len(os.sched_getaffinity(0)) >= 2:
        rc, out, err = run(capsys, str(LLAMA), "--tokens", "2", "--threads", "2")
        assert rc == 0 and "on cpu, 2 threads in" in out and "(--threads;" in err
    # OMP_NUM_THREADS set by the user is respected: the count is left as torch has it
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    rc, out, err = run(capsys, str(LLAMA), "--tokens", "2")
    assert rc == 0 and "on cpu, 3 threads in" in out and "(OMP_NUM_THREADS;" in err
    assert torch.get_num_threads() == 3


def test_load_never_changes_the_thread_count_and_a_dict_has_no_stop_tokens(threads):
    torch.set_num_threads(2)
    model = load(LLAMA, weights=random_weights(LLAMA, toy_config()), config=toy_config())
    assert torch.get_num_threads() == 2
    assert model.stop_tokens == () and len(model.generate([[1, 2]], 5)[0]) == 5
    assert torch.get_num_threads() == 2


# ---------------------------------------------------------------- item 12: options first
BAD = [
    (["--tokens", "0"], "E0787"),
    (["--top-p", "2"], "E0814"),
    (["--prompt", ""], "E0786"),
    (["--stop", "-1"], "E0819"),
    (["--threads", "0"], "E0799"),
    (["--threads", str(len(os.sched_getaffinity(0)) + 1)], "E0799"),
    (["no/such/model.linnet"], "E0001"),
    (["--weights", "no-such-dir/"], "E0651"),
    (["std.models.qwen2", "--config", "tiny"], "E0640"),
    (["std.models.qwen2", "--set", "rms_eps=1"], "E0602"),
    (["--set", "S"], "E0642"),
    (["Qwen/Qwen2.5-0.5B"], "E0797"),
    (["std.models.qwen9"], "E0211"),
    (["--nproc", "0"], "E0824"),
    (["--nproc", "2", "--rank-timeout", "-1"], "E0827"),
]


def test_every_option_is_checked_before_torch_is_imported(tmp_path):
    """Before: a missing path, an unknown config or a bad --rank-timeout were reported only
    after importing torch (5-46 s)."""
    code = (
        "import json, sys\nfrom linnet.lang.cli import main\nout = []\n"
        f"for argv, _ in {BAD!r}:\n"
        "    out.append(main(['run', *argv]))\n"
        "print(json.dumps([out, 'torch' in sys.modules]))\n"
    )
    env = os.environ | {"LINNET_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    rcs, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert rcs == [1] * len(BAD) and not imported, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error[")]
    assert [e[6:11] for e in errors] == [c for _, c in BAD], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "demo").exists()
