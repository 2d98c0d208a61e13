"""Adversarial cases for linnet.lang.text (issue 40, item 1): every user mistake with a
tokenizer, a chat template or a text option is a coded error (E0840-E0849) that says where
and how to fix, never a tokenizers/Jinja traceback; a checkpoint's template stays in its
sandbox; what transformers would render or add, Linnet renders or adds.

Case classes: tracebacks (coded errors instead), silent wrong results.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from linnet.lang import LinnetError
from linnet.lang.text.chat import render
from linnet.lang.text.stream import check_stop
from linnet.lang.text.tokenizer import Tokenizer, load_tokenizer
from text_cases import LLAMA_TEMPLATE, save_llama_style, save_smol_style

HI = [{"role": "user", "content": "Hi"}]


def code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.diagnostics[0].code


def message(exc: pytest.ExceptionInfo) -> str:
    return exc.value.diagnostics[0].message


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    return Tokenizer.from_directory(save_smol_style(tmp_path_factory.mktemp("smol")))


# ---------------------------------------------------------------- tracebacks -> codes
def test_without_the_text_extra_linnet_lang_imports_and_says_what_to_install(tmp_path):
    save_smol_style(tmp_path)
    script = (
        "import sys; sys.modules['tokenizers'] = None; sys.modules['jinja2'] = None\n"
        "import linnet.lang, linnet.lang.cli, linnet.lang.text\n"
        "from linnet.lang.text.tokenizer import Tokenizer\n"
        "from linnet.lang import LinnetError\n"
        "try:\n"
        f"    Tokenizer.from_directory({str(tmp_path)!r})\n"
        "except LinnetError as e:\n"
        "    print(e.diagnostics[0].code, e.diagnostics[0].help)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("E0840") and "linnet-lang[text]" in out.stdout


def test_gguf_without_gguf_support(tmp_path, monkeypatch):
    # A GGUF file's tokenizer where the `gguf` package is not installed: E0850, as for its
    # weights (linnet-lang's gguf extra).
    monkeypatch.setitem(sys.modules, "gguf", None)
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(LinnetError) as e:
        Tokenizer.from_file(path)
    assert code(e) == "E0850" and "gguf" in message(e)


def test_gguf_dispatches_to_tokenizer_parts(tmp_path, monkeypatch, smol):
    from linnet.lang.text import tokenizer as tokenizer_module

    seen = []

    def tokenizer_parts(path):
        seen.append(path)
        return {
            "backend": smol.backend.to_str(),
            "bos_token_id": 1,
            "eos_token_ids": [2],
            "chat_template": smol.chat_template,
            "add_bos_token": True,
            "add_eos_token": False,
            "name": path.name,
        }

    monkeypatch.setattr(tokenizer_module, "tokenizer_parts", tokenizer_parts)
    tok = Tokenizer.from_file(tmp_path / "m.gguf")
    assert seen and tok.name == "m.gguf" and tok.eos_token_ids == (2,)
    # add_bos_token from the GGUF metadata: the BOS (here <|im_start|>, id 1) is added.
    assert tok.encode("hi")[0] == 1 and tok.encode("hi", add_special_tokens=False)[0] != 1
    assert tok.apply_chat_template(HI) == smol.apply_chat_template(HI)


@pytest.mark.parametrize("damage", ["missing", "truncated", "config", "template", "dir"])
def test_damaged_tokenizer_files(tmp_path, damage):
    folder = save_smol_style(tmp_path / "ckpt")
    if damage == "missing":
        (folder / "tokenizer.json").unlink()
    elif damage == "truncated":
        text = (folder / "tokenizer.json").read_text()
        (folder / "tokenizer.json").write_text(text[: len(text) // 2])
    elif damage == "config":
        (folder / "tokenizer_config.json").write_text("{not json")
    elif damage == "template":
        (folder / "chat_template.jinja").unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": 42}))
    else:
        folder = tmp_path / "nothing-here"
    with pytest.raises(LinnetError) as e:
        Tokenizer.from_directory(folder)
    assert code(e) == "E0842", message(e)
    assert e.value.diagnostics[0].help


def test_backend_of_the_wrong_type():
    with pytest.raises(LinnetError) as e:
        Tokenizer.from_parts({"vocab": {}}, eos_token_ids=[0])
    assert code(e) == "E0842"
    with pytest.raises(LinnetError) as e:
        Tokenizer.from_parts("{not a tokenizer", eos_token_ids=[0])
    assert code(e) == "E0842"


@pytest.mark.parametrize(
    "parts", [{"eos_token_ids": [10**6]}, {"bos_token_id": -1}, {"eos_token_ids": ["</s>"]}]
)
def test_parts_with_ids_the_tokenizer_lacks(smol, parts):
    with pytest.raises(LinnetError) as e:
        Tokenizer.from_parts(smol.backend, **parts)
    assert code(e) == "E0842"


def test_no_chat_template(tmp_path):
    folder = save_smol_style(tmp_path)
    (folder / "chat_template.jinja").unlink()
    tok = Tokenizer.from_directory(folder)
    with pytest.raises(LinnetError) as e:
        tok.apply_chat_template(HI)
    assert code(e) == "E0843" and "raw" in e.value.diagnostics[0].help


def test_named_templates_without_a_default(tmp_path):
    folder = save_smol_style(tmp_path)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "rag", "template": "R{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_directory(folder)
    with pytest.raises(LinnetError) as e:
        tok.apply_chat_template(HI)
    assert code(e) == "E0843" and "rag" in message(e)
    assert tok.apply_chat_template(HI, chat_template="rag") == "RHi"
    # Tools pick the tool_use template, as transformers does.
    assert tok.apply_chat_template(HI, tools=[{"type": "function"}]) == "T1"


@pytest.mark.parametrize(
    "messages, where",
    [
        ("Hi", "not str"),
        ([], "empty"),
        ([HI[0], "Hi"], "message 1"),
        ([{"role": "user", "text": "Hi"}], "message 0 has no `content`"),
        ([{"content": "Hi"}], "message 0 has no `role`"),
        ([{"role": 1, "content": "Hi"}], "message 0's `role`"),
        ([HI[0], {"role": "assistant", "content": 42}], "message 1's `content`"),
    ],
)
def test_messages_of_the_wrong_shape(smol, messages, where):
    with pytest.raises(LinnetError) as e:
        smol.apply_chat_template(messages)
    assert code(e) == "E0844"
    assert where.split()[0] in message(e) or where == "not str"


def test_tools_of_the_wrong_shape(smol):
    with pytest.raises(LinnetError) as e:
        smol.apply_chat_template(HI, tools="search")
    assert code(e) == "E0844"


def test_template_raise_names_the_message():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    with pytest.raises(LinnetError) as e:
        render(LLAMA_TEMPLATE, messages, variables={"bos_token": "<s>", "eos_token": "</s>"})
    assert code(e) == "E0845"
    assert "message 3" in message(e) and "alternate" in message(e)


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{{ m.content }",  # does not parse
        "{{ messages[0].content.__class__.__mro__[1].__subclasses__() }}",  # leaves the sandbox
        "{% set ns = namespace(_x=1) %}{{ ns._x }}",  # underscore names on a namespace
        "{{ messages.append(1) }}",  # changes the caller's data
        "{{ messages[0].content / 0 }}",  # fails on a value
    ],
)
def test_templates_that_fail_are_coded(template):
    with pytest.raises(LinnetError) as e:
        render(template, [dict(HI[0])])
    assert code(e) == "E0845", message(e)


@pytest.mark.parametrize("ids", [[1, -1], "abc", [1.5], [True], [2**40], None])
def test_decode_refuses_what_is_no_ids(smol, ids):
    with pytest.raises(LinnetError) as e:
        smol.decode(ids)
    assert code(e) == "E0848"


@pytest.mark.parametrize("text", [123, b"bytes", ["Hi"], None])
def test_encode_refuses_what_is_no_text(smol, text):
    with pytest.raises(LinnetError) as e:
        smol.encode(text)
    assert code(e) == "E0848"


@pytest.mark.parametrize("value", [42, "/no/such/tokenizer/dir", ["a"]])
def test_load_tokenizer_argument(value):
    with pytest.raises(LinnetError) as e:
        load_tokenizer(value)
    assert code(e) == "E0849"


@pytest.mark.parametrize("stop", ["", [""], [1], {"a": 1}, ["a", None]])
def test_stop_strings_of_the_wrong_shape(stop):
    with pytest.raises(LinnetError) as e:
        check_stop(stop)
    assert code(e) == "E0847"


# ---------------------------------------------------------------- silent wrong results
def test_ids_past_the_tokenizers_vocabulary_have_no_text(smol):
    # A model's padded vocabulary may emit them: no text, as transformers decodes them.
    assert smol.decode([smol.encode("hi")[0], smol.vocab_size + 5]) == smol.decode(
        smol.encode("hi")[:1]
    )


def test_add_bos_token_where_tokenizer_json_has_no_post_processor(tmp_path):
    folder = save_llama_style(tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(data))
    tok = Tokenizer.from_directory(folder)
    assert tok.encode("hello")[0] == 1  # the config's add_bos_token: true
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**config, "add_bos_token": False, "add_eos_token": True})
    )
    tok = Tokenizer.from_directory(folder)
    ids = tok.encode("hello")
    assert ids[0] != 1 and ids[-1] == 2


def test_template_files_take_precedence(tmp_path):
    folder = save_smol_style(tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "CONFIG"}))
    assert "SmolLM" in Tokenizer.from_directory(folder).apply_chat_template(HI)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "JSON"}))
    assert Tokenizer.from_directory(folder).apply_chat_template(HI) == "JSON"
    (folder / "chat_template.json").unlink()
    assert Tokenizer.from_directory(folder).apply_chat_template(HI) == "CONFIG"


def test_template_sees_special_tokens_tojson_and_strftime(smol):
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ messages | tojson }}|"
        "{{ strftime_now('%Y') | length }}|{{ extra }}"
    )
    out = smol.apply_chat_template(
        [{"role": "user", "content": "é <b>"}], chat_template=template, extra="X"
    )
    # tojson keeps non-ASCII text and HTML characters, as transformers' filter does.
    assert out == ('<|im_start|>|<|im_end|>|[{"role": "user", "content": "é <b>"}]|4|X')


def test_none_values_are_dropped_and_messages_untouched(smol):
    messages = [{"role": "user", "content": "Hi", "name": None}]
    template = "{% for m in messages %}{{ m.name is defined }}{% endfor %}"
    assert smol.apply_chat_template(messages, chat_template=template) == "False"
    assert messages == [{"role": "user", "content": "Hi", "name": None}]
