"""Hugging Face checkpoints as they are: directories, shards, config.json, rope scaling.

Small random Llamas made with transformers are saved by `save_pretrained` into several
shards and loaded by directory with no config=; they must match transformers (prefill
logits within 1e-4 past the original max position of llama3 scaling, greedy tokens). Broken
checkpoints are coded errors whose rendered text is compared with `golden/NAME.expected`
(`LINNET_UPDATE_GOLDEN=1` rewrites them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from linnet.lang import LinnetError, render_all  # noqa: E402
from linnet.torch import load  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from support import LLAMA, toy_config  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("LINNET_UPDATE_GOLDEN") == "1"
TOLERANCE = 1e-4
PROMPT = 20  # past llama3's original_max_position_embeddings (16)
STEPS = 24
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
ROPES = {
    "llama3": LLAMA3,
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "tied": {"rope_type": "default"},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}


def hf_model(rope: dict, tied: bool = False) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=16 if rope.get("rope_type") == "dynamic" else 128,
        rms_norm_eps=1e-6,
        rope_parameters={**rope, "rope_theta": 10000.0},
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each rope variant saved in several shards, with transformers' logits and tokens."""
    out = {}
    prompt = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    for name, rope in ROPES.items():
        model = hf_model(rope, tied=name == "tied")
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path, max_shard_size="100KB")
        with torch.no_grad():
            logits = model(prompt).logits
            generated = model.generate(
                prompt, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS, pad_token_id=0
            )
        out[name] = (path, logits, generated[0, PROMPT:].tolist())
    return prompt, out


def greedy(model, prompt, steps: int):
    tokens = prompt.to(torch.int32)
    logits = model.prefill(tokens)
    out = [int(logits[0, -1].argmax())]
    pos = tokens.shape[1]
    for _ in range(steps - 1):
        step = model.decode(
            torch.tensor([out[-1]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32)
        )
        out.append(int(step[0].argmax()))
        pos += 1
    return logits, out


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def golden(name: str, err: LinnetError, *roots: Path) -> None:
    text = render_all(err.diagnostics)
    for i, root in enumerate(roots):
        text = text.replace(str(root), "CHECKPOINT" if i == 0 else f"CHECKPOINT{i + 1}")
    text = text.replace(str(LLAMA.parent), "examples/llama") + "\n"
    path = GOLDEN / f"{name}.expected"
    if UPDATE or not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"wrote missing golden {path.name}; review it and rerun")
    assert text == path.read_text(encoding="utf-8")


def _snapshot(paths) -> dict[str, str]:
    """sha256 of every file under ``paths`` (files or folders)."""
    import hashlib

    out = {}
    for root in paths:
        root = Path(root)
        for f in [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []:
            if f.is_file():
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.fixture(autouse=True)
def loads_change_no_file(monkeypatch):
    """Every `load` in this module, good checkpoint or broken, leaves every byte of the
    checkpoint it read as it was (the issue's "0 checkpoint bytes changed")."""
    real = load

    def checked(path, weights=None, **kw):
        where = (
            [weights]
            if isinstance(weights, str | Path)
            else (
                [w for w in weights if isinstance(w, str | Path)]
                if isinstance(weights, list)
                else []
            )
        )
        where = [Path(w).parent if Path(w).is_file() else Path(w) for w in where]
        before = _snapshot(where)
        try:
            return real(path, weights=weights, **kw)
        finally:
            assert _snapshot(where) == before, "load changed a checkpoint file"

    monkeypatch.setitem(globals(), "load", checked)


# ---------------------------------------------------------------- parity with transformers


@pytest.mark.parametrize(
    "rope,interpret",
    [
        ("llama3", False),
        ("llama3", True),
        ("default", False),
        ("linear", False),
        ("tied", False),
        ("dynamic", False),
        ("dynamic", True),
    ],
)
def test_directory_matches_transformers(checkpoints, rope, interpret):
    prompt, ckpts = checkpoints
    path, hf_logits, hf_tokens = ckpts[rope]
    assert len(list(path.glob("*.safetensors"))) > 2  # really sharded
    # No config=; the dynamic checkpoint's max_position_embeddings (16) is also its default
    # cache length, too short for the test: S is a runtime choice.
    config = {"S": 64} if rope == "dynamic" else None
    model = load(LLAMA, weights=path, interpret=interpret, config=config)
    assert model.config.get("rope_llama3", False) is (rope == "llama3")
    assert ("lm_head.weight" in model.params) is (rope != "tied")
    logits, tokens = greedy(model, prompt, STEPS)
    assert logits.shape == hf_logits.shape
    # Positions 16..19 are past the original max position: the scaled band matters there.
    # (dynamic NTK: past max_position_embeddings, 16, theta grows with every position).
    assert (logits[0, 16:] - hf_logits[0, 16:]).abs().max().item() < TOLERANCE
    assert (logits - hf_logits).abs().max().item() < TOLERANCE
    assert tokens == hf_tokens


def test_llama3_frequencies_equal_transformers():
    from linnet.lang import Program, lower
    from linnet.torch.interpreter import run_graph
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    src = """
use std.nn.rope::{llama3_frequencies}
model M<HD: Dim> {
    entry run(x: Tensor[1; f32]) -> Tensor[HD / 2; f32] {
        return llama3_frequencies<HD>(500000.0, 32.0, 1.0, 4.0, 8192.0)
    }
}
"""
    graph = lower(Program.from_text(src, "m"), "run", {"x": [1]}, {"HD": 128})
    (ours,) = run_graph(graph, [torch.zeros(1)], {}, {}, torch.device("cpu"))
    cfg = transformers.LlamaConfig(
        head_dim=128,
        hidden_size=4096,
        num_attention_heads=32,
        rope_parameters={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0)


def test_index_file_list_of_files_and_no_index(checkpoints, tmp_path):
    prompt, ckpts = checkpoints
    path, hf_logits, _ = ckpts["llama3"]
    files = sorted(path.glob("*.safetensors"))
    no_index = copy(path, tmp_path / "no-index")
    (no_index / "model.safetensors.index.json").unlink()
    for weights in (path / "model.safetensors.index.json", files, no_index):
        model = load(LLAMA, weights=weights)
        logits = model.prefill(prompt.to(torch.int32))
        assert (logits - hf_logits).abs().max().item() < TOLERANCE


def test_user_config_overrides_runtime_choices(checkpoints):
    path = checkpoints[1]["default"][0]
    model = load(LLAMA, weights=path, config={"S": 32, "H": 4})  # H agrees with config.json
    assert model.config["S"] == 32
    ctx = model.new_context("decode", [torch.tensor([1], dtype=torch.int32)] * 2)
    assert ctx.states["model.layers.0.self_attn.k_cache"].shape[1] == 32


def test_dtype_converts_and_sets_t(checkpoints):
    prompt, ckpts = checkpoints
    path, hf_logits, _ = ckpts["default"]
    model = load(LLAMA, weights=path, dtype="bf16")
    assert model.params["lm_head.weight"].dtype == torch.bfloat16
    logits = model.prefill(prompt.to(torch.int32))
    assert logits.dtype == torch.float32
    assert (logits - hf_logits).abs().max().item() < 0.1  # bf16 rounding only


def test_dtype_on_a_file_with_a_config_t(tmp_path):
    from linnet.torch import random_weights

    weights = random_weights(LLAMA, toy_config(), seed=0, dtype=torch.bfloat16)
    file = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in weights.items()}, str(file))
    cfg = {k: v for k, v in toy_config().items() if k != "T"}
    # The help of E0633 says `dtype=`: that conversion works.
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=file, config=toy_config())  # T = f32 in the config
    assert {d.code for d in err.value.diagnostics} == {"E0633"}
    assert "dtype='f32'" in err.value.diagnostics[0].help
    model = load(LLAMA, weights=file, config=toy_config(), dtype="f32", interpret=True)
    assert model.params["lm_head.weight"].dtype == torch.float32
    model.decode(torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32))
    model = load(LLAMA, weights=file, config=cfg, dtype=torch.float16)
    assert model.params["lm_head.weight"].dtype == torch.float16
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=file, config=toy_config(), dtype="bf16")
    assert err.value.diagnostics[0].code == "E0743"


@pytest.mark.parametrize("bad", ["int8", "float", torch.int32, 3])
def test_bad_dtype(bad):
    with pytest.raises(LinnetError) as err:
        load(LLAMA, config=toy_config(), dtype=bad)
    assert err.value.diagnostics[0].code == "E0742"


def test_cli_runs_a_directory(checkpoints, capsys):
    from linnet.lang.cli import main

    path, _, _ = checkpoints[1]["llama3"]
    prompt = ",".join(str(t) for t in checkpoints[0][0].tolist())
    rc = main(["run", str(LLAMA), "--weights", str(path), "--prompt", prompt, "--tokens", "4"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"decoded 4 tokens: {checkpoints[1]['llama3'][2][:4]}" in out.out


# ---------------------------------------------------------------- broken checkpoints (goldens)


def test_missing_shard(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    (path / "model-00002-of-00005.safetensors").unlink()
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    golden("missing_shard", err.value, path)


def test_shard_with_a_tensor_the_index_does_not_list(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    shard = path / "model-00003-of-00005.safetensors"
    tensors = load_file(str(shard))
    tensors["model.layers.0.extra.weight"] = torch.zeros(4)
    save_file(tensors, str(shard))
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    golden("shard_tensor_not_in_index", err.value, path)


def test_index_lists_a_tensor_its_shard_lacks_and_a_bad_shard(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    shard = path / "model-00003-of-00005.safetensors"
    tensors = load_file(str(shard))
    del tensors["model.layers.0.input_layernorm.weight"]
    save_file(tensors, str(shard))
    (path / "model-00004-of-00005.safetensors").write_bytes(b"\x10\x00\x00\x00")
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    # Both problems, in two shards, in one report.
    golden("index_tensor_absent_and_bad_shard", err.value, path)


def test_config_contradicting_the_weights(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    edit_config(path, intermediate_size=256)
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    golden("config_contradicts_weights", err.value, path)


def test_heads_contradicting_the_weights(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    edit_config(path, num_key_value_heads=4)
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    codes = [d.code for d in err.value.diagnostics]
    assert {"E0460", "E0632"} & set(codes) and codes[-1] == "E0658"
    assert "num_key_value_heads = 4 (KV)" in err.value.diagnostics[-1].message


def test_a_stray_layer_name_is_an_unexpected_weight_not_a_huge_model(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    shard = path / "model-00003-of-00005.safetensors"
    tensors = load_file(str(shard))
    tensors["model.layers.99999999.input_layernorm.weight"] = torch.ones(64)
    save_file(tensors, str(shard))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.99999999.input_layernorm.weight"] = shard.name
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)  # num_hidden_layers = 2 in config.json bounds the layers
    assert [d.code for d in err.value.diagnostics] == ["E0631"]
    assert shard.name in err.value.diagnostics[0].message


def test_unknown_rope_type(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    edit_config(path, rope_parameters={"rope_type": "su", "factor": 4.0, "rope_theta": 10000.0})
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    golden("unknown_rope_type", err.value, path)


def test_old_style_rope_scaling(checkpoints, tmp_path):
    # transformers 4.x and real Llama 3.1 downloads: `rope_theta` and `rope_scaling` apart.
    prompt, ckpts = checkpoints
    path = copy(ckpts["llama3"][0], tmp_path / "ckpt")
    edit_config(
        path,
        rope_parameters=None,
        rope_theta=10000.0,
        rope_scaling={**LLAMA3, "rope_type": "llama3"},
    )
    logits = load(LLAMA, weights=path).prefill(prompt.to(torch.int32))
    assert (logits - ckpts["llama3"][1]).abs().max().item() < TOLERANCE
    edit_config(path, rope_scaling={"type": "su", "factor": 2.0})  # Phi-3's, not Llama's
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    assert [d.code for d in err.value.diagnostics] == ["E0657"]


def test_other_architecture(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    edit_config(path, architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    golden("other_architecture", err.value, path)


def test_unmodelled_keys(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    edit_config(
        path,
        attention_bias=True,
        sliding_window=64,
        logit_softcap=30.0,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    )
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    golden("unmodelled_keys", err.value, path)


def test_user_config_contradicting_config_json(checkpoints, tmp_path):
    path = checkpoints[1]["default"][0]
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path, config={"H": 8, "rms_norm_eps": 1e-5})
    golden("user_config_contradicts", err.value, path)


def test_model_without_a_mapping(checkpoints, tmp_path):
    model = tmp_path / "mine.linnet"
    shutil.copy(LLAMA, model)
    with pytest.raises(LinnetError) as err:
        load(model, weights=checkpoints[1]["default"][0])
    golden("no_mapping", err.value, checkpoints[1]["default"][0], tmp_path)


@pytest.mark.parametrize("value", ['"four"', "-4", "4.5", "true", "[4]", "1e400"])
def test_bad_values_in_config_json(checkpoints, tmp_path, value):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    text = (
        (path / "config.json")
        .read_text()
        .replace('"num_attention_heads": 4', f'"num_attention_heads": {value}')
    )
    (path / "config.json").write_text(text)
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    # -4 is out of num_attention_heads's range ([1, 4096], E0665), caught before lowering.
    assert {d.code for d in err.value.diagnostics} <= {"E0671", "E0665", "E0613", "E0603", "E0658"}


def test_a_config_json_that_is_not_a_hugging_face_one_is_not_read(tmp_path):
    from linnet.torch import random_weights

    save_file(random_weights(LLAMA, toy_config(), seed=0), str(tmp_path / "w.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(toy_config()))  # a Linnet config
    model = load(LLAMA, weights=tmp_path, config=toy_config(), interpret=True)
    assert model.config["H"] == 4


def test_same_tensor_in_two_files_and_empty_directory(checkpoints, tmp_path):
    path = checkpoints[1]["default"][0]
    files = sorted(path.glob("*.safetensors"))
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=[*files, files[0]])
    assert {d.code for d in err.value.diagnostics} == {"E0638"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=tmp_path / "empty")
    assert err.value.diagnostics[0].code == "E0639"


def test_shard_names_escaping_the_directory(checkpoints, tmp_path):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../../etc/passwd"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    assert err.value.diagnostics[0].code == "E0634"


@pytest.mark.parametrize("where", ["header", "index", "config"])
def test_deeply_nested_json(checkpoints, tmp_path, where):
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    deep = b"[" * 100_000 + b"]" * 100_000
    if where == "header":
        (path / "model-00001-of-00005.safetensors").write_bytes(
            len(deep).to_bytes(8, "little") + deep
        )
    elif where == "index":
        (path / "model.safetensors.index.json").write_bytes(deep)
    else:
        (path / "config.json").write_bytes(b'{"a": ' + deep + b"}")
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    code = {"header": "E0650", "index": "E0634", "config": "E0652"}[where]
    assert code in [d.code for d in err.value.diagnostics]


@pytest.mark.parametrize(
    "bad", [3, 3.5, b"model.safetensors", [], [3], {"w": [1.0]}, {1: torch.zeros(1)}, object()]
)
def test_weights_of_the_wrong_type(bad):
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(LinnetError) as err:
            load(LLAMA, weights=bad if bad != 3 else fd, config=toy_config())
        assert err.value.diagnostics[0].code == "E0741"
        os.fstat(fd)  # never read as a file descriptor, nor closed under the caller
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the model owns its memory


def test_overwriting_the_file_after_load_changes_nothing(tmp_path):
    from linnet.torch import random_weights

    file = tmp_path / "w.safetensors"
    save_file(random_weights(LLAMA, toy_config(), seed=0), str(file))
    # The interpreter: the toy model's generated module is test_generated's to import first.
    model = load(LLAMA, weights=file, config=toy_config(), interpret=True)
    token, pos = torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    before = model.decode(token, pos).clone()
    # Overwrite in place (same inode, as `cp` onto it does), with other weights.
    other = tmp_path / "other.safetensors"
    save_file(random_weights(LLAMA, toy_config(), seed=1), str(other))
    with open(file, "r+b") as f:
        f.write(other.read_bytes())
    model.new_context("decode", [token, pos])
    after = load(LLAMA, weights=file, config=toy_config(), interpret=True).decode(token, pos)
    assert not torch.equal(before, after)  # the file really changed
    again = model.decode(token, pos, context=model.new_context("decode", [token, pos]))
    assert torch.equal(before, again)


def test_truncating_the_file_after_load_does_not_kill_the_process(tmp_path):
    script = f"""
import os, sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from support import LLAMA, toy_config
from safetensors.torch import save_file
from linnet.torch import load, random_weights
file = {str(tmp_path / "w.safetensors")!r}
save_file(random_weights(LLAMA, toy_config(), seed=0), file)
model = load(LLAMA, weights=file, config=toy_config())
os.truncate(file, 0)
out = model.decode(torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32))
print("ok", tuple(out.shape))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ok (1, 256)" in proc.stdout


def test_random_weights_take_a_config_that_sets_the_batch():
    """The weights do not depend on the batch: a config with B = 8 (a benchmark's) gives the
    same tensors as B = 1 instead of failing to lower the entry at batch 1 (E0607)."""
    from linnet.torch import random_weights
    from support import LLAMA, toy_config

    eight = random_weights(LLAMA, toy_config(B=8), seed=1)
    one = random_weights(LLAMA, toy_config(B=1), seed=1)
    assert eight.keys() == one.keys()
    assert all(torch.equal(eight[k], one[k]) for k in eight)


# ---------------------------------------------------------------- issue 38: items 7, 8, 16, 18


def test_an_out_of_range_value_in_config_json_is_E0665_not_nan_logits(checkpoints, tmp_path):
    """Item 7: `rms_norm_eps: -1` gave NaN logits and a zero rope theta other logits."""
    path = copy(checkpoints[1]["default"][0], tmp_path / "ckpt")
    edit_config(path, rms_norm_eps=-1, rope_parameters={"rope_type": "default", "rope_theta": 0.0})
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path)
    messages = sorted((d.code, d.message) for d in err.value.diagnostics)
    assert messages == [
        ("E0665", "config.json's `rms_norm_eps` is -1, outside its valid range (0, 1]"),
        (
            "E0665",
            "config.json's `rope_parameters.rope_theta` is 0.0, outside its valid range (0, 1e12]",
        ),
    ]


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    from linnet.torch import random_weights

    weights = random_weights(LLAMA, toy_config(), seed=0)
    weights["model.layers.1.mlp.down_proj.weight"][3, 7] = float("nan")
    weights["lm_head.weight"][0, 5] = float("-inf")
    path = tmp_path_factory.mktemp("nan") / "model.safetensors"
    save_file(weights, str(path))
    return path, weights


def test_a_nan_weight_is_E0666_at_load(nan_checkpoint):
    """Item 8: a NaN weight made greedy generate repeat one token forever."""
    path, weights = nan_checkpoint
    for given in (path, weights):
        with pytest.raises(LinnetError) as err:
            load(LLAMA, weights=given, config=toy_config())
        assert [(d.code, d.message) for d in err.value.diagnostics] == [
            ("E0666", "weight `lm_head.weight` holds 1 infinite value (the first at [0, 5])"),
            (
                "E0666",
                "weight `model.layers.1.mlp.down_proj.weight` holds 1 NaN value (the "
                "first at [3, 7])",
            ),
        ]
        assert "check_finite=False" in err.value.diagnostics[0].help
    with pytest.raises(LinnetError) as err:
        load(
            LLAMA,
            weights=path,
            config={k: v for k, v in toy_config().items() if k != "T"},
            dtype="bf16",
        )
    assert {d.code for d in err.value.diagnostics} == {"E0666"}


def test_check_finite_false_loads_a_damaged_checkpoint(nan_checkpoint):
    path, _ = nan_checkpoint
    model = load(LLAMA, weights=path, config=toy_config(), check_finite=False)
    assert torch.isnan(model.params["model.layers.1.mlp.down_proj.weight"]).sum() == 1
    for bad in ("no", 0, None):
        with pytest.raises(LinnetError) as err:
            load(LLAMA, weights=path, config=toy_config(), check_finite=bad)
        assert err.value.diagnostics[0].code == "E0667"


def test_finite_weights_whose_sum_overflows_are_not_flagged():
    """The check sums each tensor: a sum past f32's range is not a NaN (f64 decides)."""
    from linnet.torch import random_weights
    from linnet.torch.weights import check_finite_weights

    weights = random_weights(LLAMA, toy_config(), seed=0)
    weights["model.norm.weight"].fill_(3e38)
    check_finite_weights(weights)
    load(LLAMA, weights=weights, config=toy_config())
    half = {"w": torch.full((100_000,), 60000.0, dtype=torch.float16)}  # sums to inf in f16
    check_finite_weights(half)
    half["w"][-1] = float("nan")
    with pytest.raises(LinnetError):
        check_finite_weights(half)


def test_a_float8_checkpoint_is_unsupported_not_corrupt(tmp_path):
    """Item 16: a valid fp8 safetensors file was reported as corrupt (E0650)."""
    from linnet.torch import random_weights

    weights = random_weights(LLAMA, toy_config(), seed=0)
    weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"].to(
        torch.float8_e4m3fn
    )
    weights["model.layers.1.mlp.up_proj.weight"] = weights["model.layers.1.mlp.up_proj.weight"].to(
        torch.float8_e5m2
    )
    path = tmp_path / "fp8.safetensors"
    save_file(weights, str(path))
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=path, config=toy_config())
    got = sorted((d.code, d.message.split(" (")[0]) for d in err.value.diagnostics)
    assert got == [
        ("E0723", f"`{path}` holds 1 tensor of dtype F8_E4M3"),
        ("E0723", f"`{path}` holds 1 tensor of dtype F8_E5M2"),
    ]
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights={k: v for k, v in weights.items()}, config=toy_config())
    assert err.value.diagnostics[0].code == "E0723"


TINY = """\
use std.nn.linear::{Linear}

pub model Tiny<vocab_size: Dim, hidden_size: Dim, B: Dim, T: DType> {
    config scale: f32 = 1.0
    param embed: Tensor[vocab_size, hidden_size; T]
    block head: Linear<hidden_size, vocab_size, T>

    entry forward(tokens: Tensor[B; i32]) -> Tensor[B, vocab_size; f32] {
        let h[b, d] = self.embed[tokens[b], d] * scale
        return self.head(h) as f32
    }
}
"""


def test_a_users_model_named_as_its_checkpoint_needs_no_mapping_file(tmp_path):
    """Item 18: the mapping is inferred where every config.json key names a config of the
    model and every parameter path a tensor of its shape; E0670 says what did not match."""
    model_file = tmp_path / "tiny.linnet"
    model_file.write_text(TINY)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.manual_seed(0)
    embed, head = torch.randn(16, 8), torch.randn(16, 8)
    save_file({"embed": embed, "head.weight": head}, str(ckpt / "model.safetensors"))
    config = {
        "architectures": ["TinyForCausalLM"],
        "model_type": "tiny",
        "vocab_size": 16,
        "hidden_size": 8,
        "scale": 0.5,
        "torch_dtype": "float32",
        "_name_or_path": "me/tiny",
        "transformers_version": "4.46.0",
    }
    (ckpt / "config.json").write_text(json.dumps(config))
    model = load(model_file, weights=ckpt, config={"T": "f32"})
    tokens = torch.tensor([1, 2], dtype=torch.int32)
    assert torch.allclose(model.forward(tokens), (embed[[1, 2]] * 0.5) @ head.T)
    (ckpt / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4}))
    with pytest.raises(LinnetError) as err:
        load(model_file, weights=ckpt, config={"T": "f32"})
    d = err.value.diagnostics[0]
    assert d.code == "E0670" and "`num_attention_heads` names no config" in d.message
    (ckpt / "config.json").write_text(json.dumps(config))
    save_file({"embed": embed, "lm_head.weight": head}, str(ckpt / "model.safetensors"))
    with pytest.raises(LinnetError) as err:
        load(model_file, weights=ckpt, config={"T": "f32"})
    assert [d.code for d in err.value.diagnostics] == ["E0670", "E0630", "E0631"]
    assert "weight `head.weight` is missing" in err.value.diagnostics[0].message
