"""A newcomer's first minutes with `linnet run` (issue 46, items 9-12), the pure-Python part:
what runs, with which config and weights, decided and checked before any array library.

* Item 9: a checkpoint's end-of-sequence tokens read as transformers reads them
  (generation_config.json's eos_token_id, else config.json's), anything that is no token ids
  E0798.
* Item 10: a Hugging Face checkpoint directory runs the shipped model its config.json names
  (said on stderr); an architecture none runs is E0796 listing those that do; a directory
  that is no checkpoint E0795; a hub id (`org/name`) E0797: Linnet does not download.
* Item 11: every shipped model has a toy config beside it that lowers; `--set KEY=VALUE` is
  typed, and a key the model lacks is E0602 with a did-you-mean.
* Item 12: the default model is found from any working directory (was E0740 outside the
  checkout's root); `linnet kernels`' progress counts the cases the checks run.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path

import pytest
from linnet.lang import LinnetError, Program, lower
from linnet.lang.host.run import (
    check_threads,
    default_model,
    model_for_checkpoint,
    run_setup,
    shipped_models,
)
from linnet.lang.syntax.program import model_file
from linnet.lang.weights.generation import read_stop_tokens

MODELS = ["llama", "qwen2", "mistral", "gemma", "phi3", "gpt2"]


def setup(file=None, weights=None, config=None, sets=()):
    return run_setup(argparse.Namespace(file=file, weights=weights, config=config, set=list(sets)))


def code_of(info) -> str:
    return info.value.diagnostics[0].code


def checkpoint_dir(path: Path, config: dict | None, weights: bool = True) -> Path:
    """A directory with a config.json (None: none) and a one-tensor safetensors file."""
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if weights:
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
        header += " " * (-len(header) % 8)
        (path / "model.safetensors").write_bytes(
            len(header).to_bytes(8, "little") + header.encode() + b"\0\0\0\0"
        )
    return path


# ---------------------------------------------------------------- item 12: the default model
def test_the_default_model_is_found_from_any_directory(tmp_path, monkeypatch):
    """Before: E0740 outside the checkout's root (a path relative to the working
    directory); the checkout's example, or the wheel's, from anywhere."""
    monkeypatch.chdir(tmp_path)
    s = setup()
    assert s.model == default_model() and s.model.is_file()
    assert s.config_name == "toy" and s.config["V"] == 256 and s.weights is None


def test_an_install_without_the_example_is_E0740_naming_a_shipped_model(monkeypatch):
    import linnet.lang.bundled as bundled

    def missing(name="llama"):
        raise LookupError(name)

    monkeypatch.setattr(bundled, "example", missing)
    with pytest.raises(LinnetError) as info:
        setup()
    assert (
        code_of(info) == "E0740" and "linnet run std.models.llama" in info.value.diagnostics[0].help
    )


def test_a_model_file_that_is_not_there_is_refused_before_anything(tmp_path):
    with pytest.raises(LinnetError) as info:
        setup(str(tmp_path / "nope.linnet"))
    assert code_of(info) == "E0001"


# ---------------------------------------------------------------- item 11: toy configs, --set
@pytest.mark.parametrize("name", MODELS)
def test_every_shipped_model_runs_on_its_toy_config(name):
    """Before: `linnet run std.models.X` ended in E0603 (no config), `--config toy` in E0640.
    The toy config is the default without weights, and both entries lower with it."""
    s = setup(f"std.models.{name}")
    assert s.config_name == "toy" and s.weights is None, s
    program = Program.from_file(s.model)
    prefill = lower(program, "prefill", {"tokens": [1, 4]}, s.config)
    decode = lower(program, "decode", {"token": [1], "pos": [1]}, s.config)
    assert prefill.values[prefill.outputs[0]].shape[-1] == s.config["V"] == 256
    assert (
        decode.parameters and sum(math.prod(v.shape) for v in decode.parameters.values()) < 1 << 20
    )  # small: a demo


def test_set_overrides_the_config_typed():
    s = setup(
        "std.models.mistral",
        sets=[
            "S=64",
            "rms_norm_eps=1e-5",
            "T=bf16",
            "tie_word_embeddings=true",
            "sliding_window=8",
        ],
    )
    cfg = s.config
    assert (
        cfg["S"],
        cfg["rms_norm_eps"],
        cfg["T"],
        cfg["tie_word_embeddings"],
        cfg["sliding_window"],
    ) == (64, 1e-5, "bf16", True, 8)
    assert type(cfg["S"]) is int and type(cfg["rms_norm_eps"]) is float
    assert cfg["V"] == 256  # the rest of the toy config stays


@pytest.mark.parametrize(
    ("model", "key", "hint"),
    [
        ("std.models.qwen2", "rms_eps", "did you mean `rms_norm_eps`?"),
        ("std.models.qwen2", "h", "did you mean `H`?"),
        ("std.models.mistral", "sliding_windw", "did you mean `sliding_window`?"),
        ("std.models.gpt2", "zzz", "known names: V, P"),
    ],
)
def test_a_set_key_the_model_lacks_is_E0602_with_a_did_you_mean(model, key, hint):
    with pytest.raises(LinnetError) as info:
        setup(model, sets=[f"{key}=1"])
    d = info.value.diagnostics[0]
    assert d.code == "E0602" and f"`--set {key}=...`" in d.message and hint in d.help, d


def test_lowering_names_the_closest_config_key():
    """The lowering's own E0602 (a config file's key) names the closest key too."""
    program = Program.from_file(model_file("std.models.qwen2"))
    cfg = setup("std.models.qwen2").config | {"rope_thetta": 1.0}
    with pytest.raises(LinnetError) as info:
        lower(program, "decode", {"token": [1], "pos": [1]}, cfg)
    assert (
        code_of(info) == "E0602" and "did you mean `rope_theta`?" in info.value.diagnostics[0].help
    )


def test_a_set_that_is_no_key_value_is_E0642():
    with pytest.raises(LinnetError) as info:
        setup("std.models.qwen2", sets=["S"])
    assert code_of(info) == "E0642"


def test_an_unknown_config_name_lists_the_models_names():
    with pytest.raises(LinnetError) as info:
        setup("std.models.phi3", config="tiny")
    d = info.value.diagnostics[0]
    assert d.code == "E0640" and "this model's named configs: toy" in d.help


# ---------------------------------------------------------------- item 10: checkpoint dirs
@pytest.mark.parametrize("name", MODELS)
def test_a_checkpoint_directory_runs_the_model_its_architecture_names(tmp_path, name):
    """Before: three unrelated errors (the default Llama example against a Qwen2
    checkpoint), none naming std.models.qwen2."""
    arch = shipped_models()[f"std.models.{name}"]["architectures"][0]
    d = checkpoint_dir(tmp_path / "ckpt", {"architectures": [arch], "model_type": "x"})
    s = setup(str(d))
    assert s.model == model_file(f"std.models.{name}") and s.weights == str(d)
    assert s.config_name is None  # the checkpoint's config.json gives the config
    assert s.notes == [f"linnet: config.json's architecture {arch}: running std.models.{name}"]
    # --weights DIR with no model picks the same
    s = setup(weights=str(d))
    assert s.model == model_file(f"std.models.{name}") and s.notes


def test_a_model_type_alone_picks_the_model(tmp_path):
    d = checkpoint_dir(tmp_path / "ckpt", {"model_type": "gemma"})
    assert model_for_checkpoint(d / "config.json") == ("std.models.gemma", "model_type gemma")
    assert setup(str(d)).model == model_file("std.models.gemma")


def test_an_architecture_no_shipped_model_runs_is_E0796(tmp_path):
    d = checkpoint_dir(tmp_path / "falcon", {"architectures": ["FalconForCausalLM"]})
    for kw in ({"file": str(d)}, {"weights": str(d)}):
        with pytest.raises(LinnetError) as info:
            setup(**kw)
        diag = info.value.diagnostics[0]
        assert diag.code == "E0796" and "FalconForCausalLM" in diag.message
        assert "Qwen2ForCausalLM (std.models.qwen2)" in diag.help


def test_a_directory_that_is_no_checkpoint_is_E0795(tmp_path):
    with pytest.raises(LinnetError) as info:
        setup(str(checkpoint_dir(tmp_path / "bare", None)))
    assert code_of(info) == "E0795" and "no config.json" in info.value.diagnostics[0].message
    # a folder of models: the help names the file to run
    models = tmp_path / "models"
    models.mkdir()
    (models / "mine.linnet").write_text("// a model\n")
    with pytest.raises(LinnetError) as info:
        setup(str(models))
    assert code_of(info) == "E0795" and "mine.linnet" in info.value.diagnostics[0].help
    # a Linnet config named config.json names no architecture
    linnet_cfg = checkpoint_dir(tmp_path / "lc", {"V": 256})
    with pytest.raises(LinnetError) as info:
        setup(str(linnet_cfg))
    assert code_of(info) == "E0795"


def test_a_checkpoint_given_twice_is_E0795(tmp_path):
    a = checkpoint_dir(tmp_path / "a", {"architectures": ["Qwen2ForCausalLM"]})
    b = checkpoint_dir(tmp_path / "b", {"architectures": ["Qwen2ForCausalLM"]})
    with pytest.raises(LinnetError) as info:
        setup(str(a), weights=str(b))
    assert code_of(info) == "E0795"
    assert setup(str(a), weights=str(a)).weights == str(a)  # the same one twice is fine


@pytest.mark.parametrize(
    "kw",
    [
        {"file": "Qwen/Qwen2.5-0.5B"},
        {"file": "std.models.qwen2", "weights": "Qwen/Qwen2.5-0.5B"},
        {"weights": "meta-llama/Llama-3.2-1B"},
    ],
)
def test_a_hub_id_is_E0797_saying_linnet_does_not_download(tmp_path, monkeypatch, kw):
    """Before: "not found" with no hint."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LinnetError) as info:
        setup(**kw)
    d = info.value.diagnostics[0]
    given = kw.get("weights", kw.get("file"))
    assert d.code == "E0797" and "does not download" in d.message
    assert f"huggingface-cli download {given} --local-dir {given.split('/')[1]}" in d.help


def test_a_path_shaped_like_a_hub_id_that_exists_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint_dir(tmp_path / "org" / "name", {"architectures": ["LlamaForCausalLM"]})
    assert setup("org/name").model == model_file("std.models.llama")


# ---------------------------------------------------------------- item 9: stop tokens
def write(path: Path, name: str, data) -> None:
    (path / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_stop_tokens_are_read_as_transformers_reads_them(tmp_path):
    hf = {"model_type": "qwen2", "vocab_size": 256, "eos_token_id": 7}
    checkpoint_dir(tmp_path, hf)
    assert read_stop_tokens(tmp_path).tokens == (7,)  # no generation_config.json: config.json
    write(tmp_path, "generation_config.json", {"eos_token_id": [5, 9, 5]})
    stops = read_stop_tokens(tmp_path)
    assert stops.tokens == (5, 9) and stops.source == "generation_config.json's eos_token_id"
    # transformers: a generation_config.json without eos stops nothing early, whatever
    # config.json says
    write(tmp_path, "generation_config.json", {"do_sample": False})
    assert read_stop_tokens(tmp_path).tokens == ()
    write(tmp_path, "generation_config.json", {"eos_token_id": None})
    assert read_stop_tokens(tmp_path).tokens == ()


def test_a_linnet_config_named_config_json_has_no_stop_tokens(tmp_path):
    checkpoint_dir(tmp_path, {"V": 256, "eos_token_id": 3})
    assert read_stop_tokens(tmp_path).tokens == ()


@pytest.mark.parametrize(
    "value", ['"</s>"', "-1", "2.0", "true", "[2, [3]]", "256", '{"id": 2}', "[2, 300]"]
)
def test_an_eos_that_is_no_token_ids_is_E0798(tmp_path, value):
    """A stop token the model can never emit would silently never stop generation."""
    checkpoint_dir(tmp_path, {"model_type": "qwen2", "vocab_size": 256})
    write(tmp_path, "generation_config.json", '{"eos_token_id": ' + value + "}")
    with pytest.raises(LinnetError) as info:
        read_stop_tokens(tmp_path)
    d = info.value.diagnostics[0]
    assert d.code == "E0798" and "generation_config.json's `eos_token_id`" in d.message


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_a_generation_config_that_is_no_json_object_is_E0798(tmp_path, text):
    checkpoint_dir(tmp_path, {"model_type": "qwen2"})
    (tmp_path / "generation_config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(LinnetError) as info:
        read_stop_tokens(tmp_path)
    assert code_of(info) == "E0798"


def test_config_json_eos_past_the_vocabulary_is_E0798(tmp_path):
    checkpoint_dir(tmp_path, {"model_type": "qwen2", "vocab_size": 256, "eos_token_id": [2, 256]})
    with pytest.raises(LinnetError) as info:
        read_stop_tokens(tmp_path)
    assert code_of(info) == "E0798" and "[0, 256)" in info.value.diagnostics[0].message


# ---------------------------------------------------------------- item 15: --threads
@pytest.mark.parametrize("threads", [0, -1, 3, True, 10**20])
def test_threads_out_of_range_are_E0799(threads):
    with pytest.raises(LinnetError) as info:
        check_threads(threads, 2)
    assert code_of(info) == "E0799"


# ---------------------------------------------------------------- item 12: kernels' progress
def test_kernel_progress_counts_the_cases_the_checks_run():
    """The total printed first is the number of cases run_checks then runs; a line per
    case as it finishes; the summary last."""
    from linnet.lang.check.kernel_cases import KernelCheck, std_program
    from linnet.lang.check.kernel_progress import Progress, planned_cases
    from linnet.lang.check.kernel_runs import run_checks

    program = std_program()
    ops = ["rms_norm", "std.nn.activation::silu_mul", "linear_gemv"]
    plan = planned_cases([program], ops, count=2, seed=3, max_size=24, dtypes=("f32",))
    out = io.StringIO()
    progress = Progress(plan, out)
    progress.begin()
    findings = run_checks(
        program,
        lambda op, case, s: KernelCheck(case, 0.0),
        count=2,
        seed=3,
        max_size=24,
        dtypes=("f32",),
        ops=ops,
        on_check=progress.check,
        skip=None,
    )
    progress.end(len(findings))
    lines = out.getvalue().splitlines()
    total = sum(plan.values())
    assert total == progress.done >= 4 and len(plan) >= 2
    assert lines[0] == (
        f"linnet kernels: {total} case(s) of {len(plan)} op(s) bound to a kernel to check"
    )
    assert [line.split("]")[0] for line in lines[1:-1]] == [
        f"[{i}/{total}" for i in range(1, total + 1)
    ]
    assert all(" ... ok " in line and line.endswith(" s") for line in lines[1:-1])
    assert lines[-1].startswith(f"linnet kernels: {total} case(s) checked in ")
    assert lines[-1].endswith("every kernel agrees with its op")
