"""allennlp's ``vocab_to_cache``: the context-free vectors of a list of words, computed once, and
``word_inputs`` (ids into that list) read against them. What a batch of word ids means here: the
checks that decide whether it can use the cache (or backs off to the char ids, as allennlp does),
and its rows of the vocabulary table with the sentence boundaries placed."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..errors import ElmoFastError


def usable_word_inputs(
    char_ids: Tensor | None, word_inputs: Tensor | None, vocab_size: int | None, token_width: int
) -> Tensor | None:
    """``word_inputs`` [B, T] (as int64) when this batch can use the vocabulary cache of
    ``vocab_size`` words (None: the model has none), else None: the batch takes the char path.
    A one-line error where neither can run it."""
    if word_inputs is None:
        return None
    if vocab_size is None:
        if char_ids is None:
            raise ElmoFastError("word_inputs given without char_ids, but the model has no vocab_to_cache")
        warnings.warn(
            "word_inputs given to a model without vocab_to_cache: they are ignored and the "
            "char ids used (as allennlp does)",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    if word_inputs.dim() != 2 or word_inputs.dtype.is_floating_point or word_inputs.dtype == torch.bool:
        raise ElmoFastError(
            f"word_inputs must be integer ids of shape [batch, tokens], got "
            f"{word_inputs.dtype} {list(word_inputs.shape)}"
        )
    W = token_width
    if char_ids is not None and tuple(char_ids.shape) != (*word_inputs.shape, W):
        raise ElmoFastError(
            f"char_ids {list(char_ids.shape)} and word_inputs {list(word_inputs.shape)} "
            f"must describe the same tokens: [batch, tokens, {W}] and [batch, tokens]"
        )
    outside = (word_inputs < 0) | (word_inputs >= vocab_size)
    if word_inputs.numel() and bool(outside.any()):
        if char_ids is None:
            bad = word_inputs[outside][0].item()
            raise ElmoFastError(
                f"word_inputs holds id {bad}, outside the cached vocabulary of {vocab_size} words; "
                "pass char_ids too, so that such batches can back off to the char CNN"
            )
        return None  # back off to the char ids for the whole batch, as allennlp does
    return word_inputs.long()


def vocab_index(word_inputs: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """word_inputs [B, T] -> rows of the vocabulary table [B, T + 2] (0 at padding) and the mask
    [B, T + 2]; rows V and V + 1 of the table are <S> and </S>, placed as the char path's
    ``add_sentence_boundaries`` places them."""
    V = vocab_size
    B, T = word_inputs.shape
    lengths = (word_inputs > 0).sum(dim=1)
    index = word_inputs.new_zeros(B, T + 2)
    index[:, 1:-1] = word_inputs
    index[:, 0] = V
    index[torch.arange(B, device=index.device), lengths + 1] = V + 1
    return index, index > 0
