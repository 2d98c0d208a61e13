"""Text in, text out on the torch runtime (issue 40, item 1): the toy Llama with random
weights beside a toy tokenizer (linnet.lang.text.toy) generates text that is the tokenizer's
decode of the ids the id path generates, streams pieces that concatenate to it, cuts at stop
strings, and `linnet run --prompt TEXT` / `linnet chat` stream it.

Case classes: silent wrong results (text against ids), hangs (a stream left early),
tracebacks (coded errors).
"""

from __future__ import annotations

import io
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
from linnet.lang import LinnetError  # noqa: E402
from linnet.lang.cli import main  # noqa: E402
from linnet.lang.text.toy import toy_text_checkpoint  # noqa: E402
from linnet.torch import load  # noqa: E402

CHAT = [{"role": "user", "content": "Hi 👋 你好"}]
STEPS = 24


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_text_checkpoint(tmp_path_factory.mktemp("smol") / "ckpt", seed=3)


@pytest.fixture(scope="module")
def model(ckpt):
    folder, config = ckpt
    return load("std.models.llama", weights=str(folder), config=config)


def reference(model, prompt, steps=STEPS, **options):
    """The id path's tokens and their text."""
    tok = model.tokenizer
    ids = tok.encode(prompt) if isinstance(prompt, str) else tok.encode_chat(prompt)
    out = model.generate([ids], steps, stop_tokens=[], **options)[0]
    return out, tok.decode(out, skip_special_tokens=True)


def test_text_is_the_decode_of_the_id_path(model):
    assert model.tokenizer is not None  # found beside the weights
    for prompt in ("The quick brown fox", CHAT):
        _, text = reference(model, prompt)
        assert model.generate(prompt, STEPS, stop_tokens=[]) == text


def test_batch_of_text_and_chat(model):
    got = model.generate(["hello world", CHAT], STEPS, stop_tokens=[])
    assert got == [reference(model, "hello world")[1], reference(model, CHAT)[1]]


def test_stream_and_callback_concatenate_to_the_text(model):
    _, text = reference(model, CHAT)
    pieces = list(model.stream(CHAT, STEPS, stop_tokens=[]))
    assert "".join(pieces) == text and len(pieces) > 1
    seen = []
    assert model.generate(CHAT, STEPS, stop_tokens=[], callback=seen.append) == text
    assert "".join(seen) == text
    indexed = []
    model.generate(["a", "b"], 4, stop_tokens=[], callback=lambda i, p: indexed.append(i))
    assert set(indexed) <= {0, 1}


def test_stop_strings_cut_the_text_and_the_generation(model):
    ids, text = reference(model, CHAT)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    steps = []
    cut = model.generate(
        CHAT, STEPS, stop_tokens=[], stop=[stop], on_token=lambda s, t: steps.append(s)
    )
    assert cut == text[: text.find(stop)]
    assert len(steps) < len(ids)  # generation ended there, not at max_new_tokens
    assert "".join(model.stream(CHAT, STEPS, stop_tokens=[], stop=stop)) == cut


def test_default_stop_is_the_tokenizers_eos(model):
    ids, _ = reference(model, CHAT)
    eos = ids[3]  # make a token the model emits early the EOS
    model.tokenizer.eos_token_ids = (eos,)
    try:
        seen = []
        model.generate(CHAT, STEPS, on_token=lambda s, t: seen.append(t[0]))
        assert seen[-1] == eos and len(seen) == ids.index(eos) + 1
    finally:
        model.tokenizer.eos_token_ids = (model.tokenizer.token_id("<|im_end|>"),)


def test_token_prompts_keep_returning_ids(model):
    out = model.generate([[1, 2, 3]], 4, stop_tokens=[])
    assert isinstance(out, list) and all(isinstance(t, int) for t in out[0])
    with pytest.raises(LinnetError) as e:
        model.generate([[1, 2, 3]], 4, stop=["x"])
    assert e.value.diagnostics[0].code == "E0847"


def test_leaving_a_stream_early_ends_its_generation(model):
    before = threading.active_count()
    stream = model.stream(CHAT, 64, stop_tokens=[])
    next(stream)
    stream.close()  # the worker stops at its next token and is joined
    assert threading.active_count() == before


def test_stream_raises_the_generations_error(model):
    stream = model.stream(CHAT, 10**4, stop_tokens=[])
    with pytest.raises(LinnetError) as e:
        next(stream)
    assert e.value.diagnostics[0].code == "E0817"  # past the cache


def test_text_without_a_tokenizer(ckpt):
    folder, config = ckpt
    model = load("std.models.llama", weights=str(folder), config=config, tokenizer=False)
    with pytest.raises(LinnetError) as e:
        model.generate("Hi", 4)
    assert e.value.diagnostics[0].code == "E0846" and "tokenizer=" in e.value.diagnostics[0].help
    model.tokenizer = str(folder)  # given afterwards
    assert isinstance(model.generate("Hi", 2, stop_tokens=[]), str)


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda m: m.stream(["a", "b"], 4), "E0847"),
        (lambda m: m.stream("a", 4, callback=print), "E0847"),
        (lambda m: m.generate("a", 4, callback=3), "E0847"),
        (lambda m: m.generate("a", 4, stop=[""]), "E0847"),
        (lambda m: m.generate("a", 4, skip_special_tokens="no"), "E0847"),
        (lambda m: m.generate([{"role": "user"}], 4), "E0844"),
        (lambda m: m.generate(["a", [{"role": "user", "content": 1}]], 4), "E0844"),
        (lambda m: m.generate("a", 4, stop_strings=["x"]), "E0794"),
    ],
)
def test_text_mistakes_are_coded(model, call, code):
    with pytest.raises(LinnetError) as e:
        call(model)
    assert e.value.diagnostics[0].code == code


def test_linnet_run_streams_text(ckpt, capsys, tmp_path):
    import json

    folder, config = ckpt
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    model = load("std.models.llama", weights=str(folder), config=config)
    _, text = reference(model, [{"role": "user", "content": "Name a bird."}], 12)
    argv = [
        "run",
        "std.models.llama",
        "--weights",
        str(folder),
        "--config",
        str(tmp_path / "cfg.json"),
        "--prompt",
        "Name a bird.",
        "--max-new-tokens",
        "12",
        "--stop",
        "none",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == text + "\n" and "tokens/s" in err
    raw = reference(model, "Name a bird.", 12)[1]
    assert main([*argv, "--raw"]) == 0
    assert capsys.readouterr().out == raw + "\n"
    assert main(["run", "--prompt", "Hello", "--tokens", "2"]) == 1  # the demo has none
    assert "E0846" in capsys.readouterr().err
    assert main(["run", "--prompt", "1,2,3", "--system", "x"]) == 1
    assert "E0847" in capsys.readouterr().err


def test_linnet_chat_keeps_the_conversation(ckpt, capsys, tmp_path, monkeypatch):
    import json

    folder, config = ckpt
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    model = load("std.models.llama", weights=str(folder), config=config)
    first = [{"role": "user", "content": "Hello"}]
    answer = reference(model, first, 6)[1]
    second = [
        *first,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Again"},
    ]
    again = reference(model, second, 6)[1]
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n\nAgain\n/exit\nnever read\n"))
    assert (
        main(
            [
                "chat",
                "std.models.llama",
                "--weights",
                str(folder),
                "--config",
                str(tmp_path / "cfg.json"),
                "--tokens",
                "6",
                "--stop",
                "none",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out == f">>> {answer}\n>>> >>> {again}\n>>> "


def test_a_base_model_without_a_chat_template(ckpt, capsys, tmp_path, monkeypatch):
    import json
    import shutil

    folder, config = ckpt
    base = tmp_path / "base"
    shutil.copytree(folder, base)
    (base / "chat_template.jinja").unlink()
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    model = load("std.models.llama", weights=str(base), config=config)
    raw = model.generate("Once", 6, stop_tokens=[])
    argv = [
        "run",
        "std.models.llama",
        "--weights",
        str(base),
        "--config",
        str(tmp_path / "cfg.json"),
        "--tokens",
        "6",
        "--stop",
        "none",
    ]
    # The prompt goes in as raw text: there is no template to put it through.
    assert main([*argv, "--prompt", "Once"]) == 0
    assert capsys.readouterr().out == raw + "\n"
    assert main([*argv, "--prompt", "Once", "--system", "Be brief."]) == 1
    assert "E0847" in capsys.readouterr().err
    with pytest.raises(LinnetError) as e:
        model.generate([{"role": "user", "content": "Hi"}], 4)
    assert e.value.diagnostics[0].code == "E0843"
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert main(["chat", *argv[1:]]) == 1
    assert "E0843" in capsys.readouterr().err


def test_a_bad_tokenizer_argument_fails_before_the_weights_are_read(ckpt, monkeypatch):
    import linnet.torch.weights as weights

    folder, config = ckpt
    monkeypatch.setattr(
        weights, "load_checkpoint", lambda *a, **k: pytest.fail("the weights were read")
    )
    for value, code in (("/no/such/dir", "E0849"), (3, "E0849"), (str(folder.parent), "E0842")):
        with pytest.raises(LinnetError) as e:
            load("std.models.llama", weights=str(folder), config=config, tokenizer=value)
        assert e.value.diagnostics[0].code == code


def test_text_prompts_and_the_cli_take_a_repetition_penalty(
    ckpt, model, capsys, tmp_path, monkeypatch
):
    """Issue 41: the text path, `linnet run --prompt TEXT` and `linnet chat` pass
    repetition_penalty through (before: E0794 from generate, no such CLI option)."""
    import json

    folder, config = ckpt
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    ids, text = reference(model, CHAT, 12, repetition_penalty=1.5)
    assert ids != reference(model, CHAT, 12)[0]  # the penalty changes tokens here
    assert model.generate(CHAT, 12, stop_tokens=[], repetition_penalty=1.5) == text
    argv = ["std.models.llama", "--weights", str(folder), "--config", str(tmp_path / "cfg.json")]
    argv += ["--tokens", "12", "--stop", "none", "--repetition-penalty", "1.5"]
    assert main(["run", *argv, "--prompt", CHAT[0]["content"]]) == 0
    assert capsys.readouterr().out == text + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(CHAT[0]["content"] + "\n/exit\n"))
    assert main(["chat", *argv]) == 0
    assert capsys.readouterr().out == f">>> {text}\n>>> "
    assert main(["chat", *argv[:-1], "0"]) == 1
    assert "error[E0867]: --repetition-penalty must be a finite number > 0, not 0.0" in (
        capsys.readouterr().err
    )
