"""linnet.lang.text against transformers: the toy tokenizers of linnet.lang.text.toy (a
byte-fallback BPE and a byte-level BPE) saved as checkpoint directories give the ids and the
text transformers' AutoTokenizer gives on a corpus of 240 strings, and chat prompts as its
apply_chat_template renders and tokenises them; TextStream's pieces never split a character
and concatenate to decode's text; StopStrings cuts across pieces and holds back no more than
a stop string's beginning.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from linnet.lang.text.stream import REPLACEMENT, StopStrings, TextStream
from linnet.lang.text.tokenizer import Tokenizer
from text_cases import CONVERSATIONS, corpus, save_llama_style, save_smol_style

STYLES = {"llama": save_llama_style, "smol": save_smol_style}


@pytest.fixture(scope="module", params=sorted(STYLES))
def pair(request, tmp_path_factory):
    """(ours, transformers') for each toy checkpoint directory."""
    transformers = pytest.importorskip("transformers")
    folder = STYLES[request.param](tmp_path_factory.mktemp(request.param))
    return Tokenizer.from_directory(folder), transformers.AutoTokenizer.from_pretrained(str(folder))


def test_corpus_is_wide():
    texts = corpus()
    assert len(texts) >= 200
    joined = "".join(texts)
    for needle in ("👋", "你好", "\u0301", "   ", "\t", "<|im_start|>", "<|im_end|>"):
        assert needle in joined


def test_encode_decode_match_transformers(pair):
    mine, ref = pair
    for text in corpus():
        ids = mine.encode(text)
        assert ids == ref.encode(text), text
        assert mine.encode(text, add_special_tokens=False) == ref.encode(
            text, add_special_tokens=False
        ), text
        for skip in (False, True):
            assert mine.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            ), text


def test_round_trip(pair):
    mine, _ = pair
    specials = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>")
    texts = [t for t in corpus() if not any(s in t for s in specials)]
    assert len(texts) >= 150
    for text in texts:
        # Around special tokens a SentencePiece-style tokenizer adds a space, as Llama's
        # does (and transformers: the test above); plain text comes back as it was.
        assert mine.decode(mine.encode(text), skip_special_tokens=True) == text, text


def test_chat_template_matches_transformers(pair):
    mine, ref = pair
    for conversation in CONVERSATIONS:
        for prompt in (True, False):
            text = ref.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=prompt
            )
            assert mine.apply_chat_template(conversation, add_generation_prompt=prompt) == text
            ids = ref.apply_chat_template(conversation, tokenize=True, add_generation_prompt=prompt)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            # Not a second BOS: the template writes its own (transformers does the same).
            assert mine.encode_chat(conversation, add_generation_prompt=prompt) == list(ids)


def test_eos_ids_and_special_tokens(tmp_path):
    llama = Tokenizer.from_directory(save_llama_style(tmp_path / "l"))
    # generation_config.json's ids first, then the EOS token's (already there).
    assert llama.eos_token_ids == (2, 4)
    assert llama.bos_token_id == 1
    assert llama.special["eos_token"] == "</s>"  # from special_tokens_map.json's object
    smol = Tokenizer.from_directory(save_smol_style(tmp_path / "s"))
    assert smol.eos_token_ids == (smol.token_id("<|im_end|>"),)
    assert "SmolLM" in smol.chat_template


def test_stream_matches_decode_and_never_splits(pair):
    mine, _ = pair
    for text in corpus():
        ids = mine.encode(text)
        for skip in (False, True):
            stream = TextStream(mine, skip_special_tokens=skip)
            pieces = [stream.add(t) for t in ids]
            end = stream.finish()
            assert "".join(pieces) + end == mine.decode(ids, skip_special_tokens=skip), text
            # A character that later tokens complete is never given half-done.
            assert not any(REPLACEMENT in p for p in pieces), (text, pieces)


def test_stream_emoji_over_byte_tokens(tmp_path):
    tok = Tokenizer.from_directory(save_llama_style(tmp_path))
    ids = tok.encode("a 👋 b 日本語", add_special_tokens=False)
    names = [tok.backend.id_to_token(t) for t in ids]
    assert sum(n.startswith("<0x") for n in names) >= 4  # the emoji is 4 byte tokens
    stream = TextStream(tok)
    pieces = [stream.add(t) for t in ids]
    # The emoji's bytes give nothing: the character comes with the token that ends the run
    # of byte tokens (a further byte could still make the run invalid).
    first = names.index("<0xF0>")
    assert pieces[first : first + 4] == ["", "", "", ""]
    assert pieces[first + 4].startswith("👋")
    assert "".join(pieces) + stream.finish() == "a 👋 b 日本語"


def test_stream_stray_byte_rewrites_the_run(tmp_path):
    # A valid byte, then a stray continuation byte: the decoder replaces both (the run is
    # one invalid sequence), so the first must not be given before the run ends.
    tok = Tokenizer.from_directory(save_llama_style(tmp_path))
    ids = [
        *tok.encode("x", add_special_tokens=False),
        tok.token_id("<0x03>"),
        tok.vocab_size + 3,
        tok.token_id("<0x87>"),
        *tok.encode("34", add_special_tokens=False),
    ]
    stream = TextStream(tok)
    pieces = [stream.add(t) for t in ids] + [stream.finish()]
    assert "".join(pieces) == tok.decode(ids)
    assert tok.decode(ids).startswith("x" + REPLACEMENT * 2)


def test_stream_unfinished_character_at_the_end(tmp_path):
    tok = Tokenizer.from_directory(save_llama_style(tmp_path))
    ids = tok.encode("x👋", add_special_tokens=False)[:-1]  # the emoji's last byte missing
    stream = TextStream(tok)
    assert REPLACEMENT not in "".join(stream.add(t) for t in ids)
    assert stream.finish().endswith(REPLACEMENT)  # finish gives what decode gives


def test_stop_strings_across_pieces():
    cut = StopStrings(["<|im_end|>", "User:"])
    shown = []
    for piece in ["Hel", "lo <", "|im", "_e", "nd|> more"]:
        text, stopped = cut.feed(piece)
        shown.append(text)
    assert "".join(shown) == "Hello " and stopped
    # Held back only while the end could begin a stop string.
    cut = StopStrings(["###"])
    assert cut.feed("a#") == ("a", False)
    assert cut.feed("b") == ("#b", False)
    assert cut.feed("##") == ("", False)
    assert cut.finish() == "##"


def test_stop_string_earliest_wins_and_nothing_after():
    cut = StopStrings(["bc", "ab"])
    assert cut.feed("xabc") == ("x", True)
    assert cut.feed("more") == ("", True)


def test_stop_strings_none_hold_nothing():
    cut = StopStrings([])
    assert cut.feed("abc") == ("abc", False)
    assert cut.finish() == ""
