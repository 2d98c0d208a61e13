"""Toy tokenizers for tests and examples, trained here with the `tokenizers` library (nothing
is downloaded) and saved as transformers checkpoint directories: a Llama-style BPE with byte
fallback (``<0xNN>`` tokens: emoji and most CJK fall back to bytes) and a BOS in its
post-processor, and a GPT-2-style byte-level BPE with SmolLM2's special tokens and chat
template. Their vocabularies are small (a few hundred tokens), for toy models.

>>> import tempfile; from pathlib import Path
>>> from linnet.lang.text.tokenizer import Tokenizer
>>> tok = Tokenizer.from_directory(save_smol_style(Path(tempfile.mkdtemp())))
>>> tok.decode(tok.encode("hello 👋"))
'hello 👋'
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

# SmolLM2-Instruct's template, as its tokenizer_config.json has it.
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A Llama-2-style template: a BOS per turn, alternating roles enforced with raise_exception.
LLAMA_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system != false %}"
    "{% set content = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "hello",
    "world",
    "linnet",
    "model",
    "token",
    "text",
    "stream",
    "decode",
    "encode",
    "prompt",
    "answer",
    "question",
    "tensor",
    "shape",
    "value",
    "running",
    "generated",
    "ça",
    "déjà",
    "naïve",
    "résumé",
    "Ünïcödé",
    "straße",
]


def _training_text() -> list[str]:
    rng = random.Random(1)
    lines = []
    for _ in range(400):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))))
    lines += ["你好 世界 中文", "hello, world! 12345", "don't won't it's"]
    return lines


def byte_fallback_tokenizer() -> Any:
    """A Llama-style BPE: Metaspace-like normaliser, ``<0xNN>`` byte-fallback tokens, and a
    decoder that turns them back into UTF-8 (emoji and most CJK fall back to bytes)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    trainer = BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        limit_alphabet=60,
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    data["decoder"] = json.loads(
        decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        ).__getstate__()
    )
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    # BOS in tokenizer.json's own post-processor, as Llama checkpoints write it.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def byte_level_tokenizer() -> Any:
    """A GPT-2-style byte-level BPE with SmolLM2's special tokens at ids 0-2."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer)
    return tok


def save_llama_style(folder: Path) -> Path:
    """The byte-fallback tokenizer as a checkpoint directory: BOS added on encode, a
    Llama-2 template, EOS ``</s>`` (and generation_config's eos ids)."""
    folder.mkdir(parents=True, exist_ok=True)
    byte_fallback_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
                "chat_template": LLAMA_TEMPLATE,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    # The legacy file, read where the config has no added_tokens_decoder (its objects too).
    (folder / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "eos_token": {
                    "content": "</s>",
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                }
            }
        )
    )
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4]}))
    return folder


def save_smol_style(folder: Path) -> Path:
    """The byte-level tokenizer as a checkpoint directory with SmolLM2's chat template
    (in chat_template.jinja, as transformers now saves it) and EOS ``<|im_end|>``."""
    folder.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|im_end|>",
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    (folder / "chat_template.jinja").write_text(SMOL_TEMPLATE)
    return folder


def toy_text_checkpoint(
    folder: Path, style: str = "smol", seed: int = 0
) -> tuple[Path, dict[str, Any]]:
    """A checkpoint directory for text tests: a toy tokenizer (``"smol"``: byte-level with
    SmolLM2's chat template; ``"llama"``: byte fallback with a BOS) beside random
    ``std.models.llama`` weights whose vocabulary is the tokenizer's rounded up to 64 (a
    padded vocabulary, as real models have); returns the folder and the model's config.

    >>> folder, config = toy_text_checkpoint(Path(tempfile.mkdtemp()))   # doctest: +SKIP
    """
    from linnet.lang.weights.demo import write_demo

    save = {"smol": save_smol_style, "llama": save_llama_style}[style]
    save(folder)
    tokens = json.loads((folder / "tokenizer.json").read_text())
    size = (
        max(
            [*tokens["model"]["vocab"].values(), *(t["id"] for t in tokens.get("added_tokens", []))]
        )
        + 1
    )
    config: dict[str, Any] = {
        "V": -(-size // 64) * 64,
        "D": 32,
        "F": 64,
        "NL": 1,
        "H": 2,
        "KV": 1,
        "HD": 16,
        "S": 192,
        "T": "f32",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    write_demo(folder / "model.safetensors", "std.models.llama", config, seed)
    return folder, config
