"""Embedding text with a biLM: ``ElmoEmbedder`` (sentences in, arrays out) and corpus-scale
``embed_file`` (streaming, length bucketing, crash-safe output, resume), a pipeline of one module per
stage: :mod:`~elmo_fast.embedding.pipeline` joins them."""

from .embedder import ElmoEmbedder

__all__ = ["ElmoEmbedder"]
