"""Text in, text out on the JAX runtime (issue 40, item 1): the same text as the id path
decoded, the same text as the torch runtime where it is installed, stream pieces that
concatenate to it, stop strings, and `linnet run --runtime jax --prompt TEXT`.

Case classes: silent wrong results (text against ids and against torch), tracebacks.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jax")
pytest.importorskip("tokenizers")
from linnet.jax import load
from linnet.lang import LinnetError
from linnet.lang.cli import main
from linnet.lang.text.toy import toy_text_checkpoint

CHAT = [{"role": "user", "content": "Hi 👋 你好"}]
STEPS = 16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_text_checkpoint(tmp_path_factory.mktemp("text") / "ckpt", style="llama", seed=5)


@pytest.fixture(scope="module")
def model(ckpt):
    folder, config = ckpt
    return load("std.models.llama", weights=str(folder), config=config)


def test_text_stream_and_stop_strings(model):
    tok = model.tokenizer
    ids = model.generate([tok.encode_chat(CHAT)], STEPS, stop_tokens=[])[0]
    text = tok.decode(ids, skip_special_tokens=True)
    assert model.generate(CHAT, STEPS, stop_tokens=[]) == text
    assert "".join(model.stream(CHAT, STEPS, stop_tokens=[])) == text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert model.generate(CHAT, STEPS, stop_tokens=[], stop=stop) == text[: text.find(stop)]
    raw = model.generate([tok.encode("fox")], STEPS, stop_tokens=[])[0]
    assert model.generate(["fox"], STEPS, stop_tokens=[]) == [
        tok.decode(raw, skip_special_tokens=True)
    ]


def test_same_text_as_torch(ckpt, model):
    lt = pytest.importorskip("linnet.torch")
    folder, config = ckpt
    other = lt.load("std.models.llama", weights=str(folder), config=config)
    assert model.generate(CHAT, STEPS, stop_tokens=[]) == other.generate(
        CHAT, STEPS, stop_tokens=[]
    )


def test_a_repetition_penalty_on_text_is_the_id_paths_and_torchs(ckpt, model):
    """Issue 41: text prompts pass repetition_penalty through (before: E0794)."""
    tok = model.tokenizer
    ids = model.generate([tok.encode_chat(CHAT)], STEPS, stop_tokens=[], repetition_penalty=1.5)
    text = model.generate(CHAT, STEPS, stop_tokens=[], repetition_penalty=1.5)
    assert text == tok.decode(ids[0], skip_special_tokens=True)
    lt = pytest.importorskip("linnet.torch")
    folder, config = ckpt
    other = lt.load("std.models.llama", weights=str(folder), config=config)
    assert text == other.generate(CHAT, STEPS, stop_tokens=[], repetition_penalty=1.5)


def test_text_without_a_tokenizer(ckpt):
    folder, config = ckpt
    bare = load("std.models.llama", weights=str(folder), config=config, tokenizer=False)
    with pytest.raises(LinnetError) as e:
        bare.generate(CHAT, 4)
    assert e.value.diagnostics[0].code == "E0846"


def test_linnet_run_jax_streams_text(ckpt, model, capsys, tmp_path):
    folder, config = ckpt
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    text = model.generate([{"role": "user", "content": "Name a bird."}], 8, stop_tokens=[])
    assert (
        main(
            [
                "run",
                "--runtime",
                "jax",
                "std.models.llama",
                "--weights",
                str(folder),
                "--config",
                str(tmp_path / "cfg.json"),
                "--prompt",
                "Name a bird.",
                "--tokens",
                "8",
                "--stop",
                "none",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out == text + "\n" and "(jax)" in err and "tokens/s" in err


def test_linnet_run_jax_text_refuses_torch_options(ckpt, capsys, tmp_path):
    folder, config = ckpt
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    assert (
        main(
            [
                "run",
                "--runtime",
                "jax",
                "std.models.llama",
                "--weights",
                str(folder),
                "--config",
                str(tmp_path / "cfg.json"),
                "--prompt",
                "Hi",
                "--compile",
            ]
        )
        == 1
    )
    assert "E0790" in capsys.readouterr().err
