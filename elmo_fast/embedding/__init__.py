"""Embedding text with a biLM: ``ElmoEmbedder`` (sentences in, arrays out) and corpus-scale
``embed_file`` (streaming, length bucketing, crash-safe output, resume: :mod:`~elmo_fast.embedding.corpus`)."""
from .embedder import ElmoEmbedder

__all__ = ["ElmoEmbedder"]
