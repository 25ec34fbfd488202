"""Hugging Face model directories: safetensors checkpoints, tokenizers, configs."""
