"""Checkpoints without a framework: safetensors headers and shard indexes (`safetensors`) and
Hugging Face `config.json` through a model's mapping (`checkpoint`)."""
