"""Test data for linnet.lang.text: a generated corpus of strings (emoji, CJK, whitespace runs,
combining marks, the templates' special tokens) and conversations, to compare the toy
tokenizers of :mod:`linnet.lang.text.toy` against transformers on.
"""

from __future__ import annotations

import random

from linnet.lang.text.toy import (  # noqa: F401  (re-exported for the tests)
    LLAMA_TEMPLATE,
    SMOL_TEMPLATE,
    WORDS,
    save_llama_style,
    save_smol_style,
)

EMOJI = ["👋", "🙂", "🐦", "👩‍💻", "🇫🇷", "❤️", "🧪", "😀😃", "👍🏽"]
CJK = ["你好", "世界", "日本語", "こんにちは", "한국어", "中文字符", "漢字"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0915\u094d\u0937"]
SPACES = ["  ", "   ", "\t", "\n", "\n\n", " \n ", "\t\t  "]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>"]


def corpus(n: int = 240, seed: int = 0) -> list[str]:
    """``n`` strings mixing words, punctuation, digits, emoji, CJK, combining marks,
    whitespace runs and special tokens (deterministic)."""
    rng = random.Random(seed)
    fixed = [
        "",
        " ",
        "a",
        "Hello, world!",
        "  leading",
        "trailing  ",
        "x\n\ny",
        "🐦",
        "你好，世界",
        "e\u0301\u0301",
        "<|im_start|>user\nHi<|im_end|>",
        "1234567890",
        "don't stop",
        "tab\there",
        "<s> </s>",
        " <|endoftext|> ",
    ]
    out = list(fixed)
    pools = [
        WORDS,
        EMOJI,
        CJK,
        COMBINING,
        SPACES,
        SPECIALS,
        list(",.!?;:'\"()-"),
        [str(rng.randrange(10**6)) for _ in range(10)],
    ]
    weights = [10, 2, 2, 1, 2, 1, 2, 1]
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choices(pools, weights)[0]
            parts.append(rng.choice(pool))
            if rng.random() < 0.6:
                parts.append(" ")
        out.append("".join(parts))
    return out


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a bird."}],
    [
        {"role": "user", "content": "你好 👋"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "  spaces  \n\n tabs\t"},
    ],
    [{"role": "user", "content": "e\u0301 <|im_end|> literal"}],
]
