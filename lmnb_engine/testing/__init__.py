"""Helpers that build small Hugging Face checkpoints offline, for tests and benchmarks."""

from lmnb_engine.testing.tiny_checkpoint import ARCHITECTURES, make_tiny_checkpoint, train_tiny_tokenizer

__all__ = ["ARCHITECTURES", "make_tiny_checkpoint", "train_tiny_tokenizer"]
