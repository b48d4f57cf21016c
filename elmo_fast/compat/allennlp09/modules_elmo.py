"""``allennlp.modules.elmo``: allennlp 0.9's ``Elmo``, ``_ElmoBiLm``, ``_ElmoCharacterEncoder`` and
``batch_to_ids``, on the elmo-fast core.

As in 0.9, the biLMs are stateful (each batch row starts from the states its row ended the previous
batch with: ``stateful=True`` of :class:`~elmo_fast.ElmoBiLm`), masks are long tensors, and model
files may be the official models' URLs (:mod:`.file_utils`). ``ELMO_FAST_PRECISION`` /
``ELMO_FAST_BACKEND`` set the fast path's precision and backend (:mod:`.settings`).

``_ElmoBiLm`` also loads what allennlp 0.9 pickled: an object holding one (a flair model saved before
flair 0.12 holds an allennlp ``ElmoEmbedder``) unpickles into elmo-fast's biLM, its weights and its
carried LSTM states included (:mod:`.pickled` names allennlp's other classes for that).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ...bilm.backends import resolve_backend
from ...bilm.char_ids import batch_to_ids
from ...bilm.model import ElmoBiLm, build_stages
from ...bilm.reference import add_sentence_boundaries
from ...compat.allennlp import Elmo as _CoreElmo
from ...formats.bilm_tf import ElmoOptions, zero_weights
from ...model_source import resolve_model
from .file_utils import cached_path
from .settings import model_settings

__all__ = ["Elmo", "_ElmoBiLm", "_ElmoCharacterEncoder", "batch_to_ids"]


def _local(path):
    return cached_path(path) if isinstance(path, (str, os.PathLike)) else path


def _is_allennlp09_state(state: dict) -> bool:
    from .pickled import ElmoLstm

    modules = state.get("_modules") or {}
    return isinstance(modules.get("_elmo_lstm"), ElmoLstm) and "_options" in vars(
        modules.get("_token_embedder", object)
    )


class _ElmoBiLm(ElmoBiLm):
    """allennlp 0.9's ``_ElmoBiLm(options_file, weight_file, requires_grad=False, vocab_to_cache=None)``:
    the biLM, stateful, its masks long. Keyword arguments of :class:`~elmo_fast.ElmoBiLm` are
    accepted too (``stateful=False``, ``precision="bf16"``, ...)."""

    def __init__(
        self,
        options_file,
        weight_file,
        requires_grad: bool = False,
        vocab_to_cache: Sequence[str] | None = None,
        **core,
    ) -> None:
        settings = {"stateful": True, **model_settings(), **core}
        super().__init__(
            _local(options_file),
            _local(weight_file),
            requires_grad=requires_grad,
            vocab_to_cache=vocab_to_cache,
            **settings,
        )

    def forward(self, inputs: Tensor | None = None, word_inputs: Tensor | None = None) -> dict:
        out = super().forward(inputs, word_inputs)
        return {"activations": out["activations"], "mask": out["mask"].long()}

    def __setstate__(self, state: dict) -> None:
        if not _is_allennlp09_state(state):
            super().__setstate__(state)  # elmo-fast's own pickle
            return
        # allennlp 0.9's: its modules were unpickled into holders (.pickled); rebuild the biLM from their
        # options and tensors, then carry on from the states it had
        char_encoder, lstm = state["_modules"]["_token_embedder"], state["_modules"]["_elmo_lstm"]
        options = ElmoOptions.from_dict(vars(char_encoder)["_options"], source="an allennlp 0.9 pickle")
        holder = nn.Module()
        holder.add_module("_token_embedder", char_encoder)
        holder.add_module("_elmo_lstm", lstm)
        weights = holder.state_dict()
        requires_grad = bool(state.get("_requires_grad", False))
        self.__init__(None, zero_weights(options), requires_grad=requires_grad)
        self.load_state_dict(weights)
        device = next(iter(weights.values())).device
        self.to(device)
        carried = vars(lstm).get("_states")
        if carried is not None:
            self.encoder.set_states(tuple(s.detach() for s in carried))


class Elmo(_CoreElmo):
    """allennlp 0.9's ``Elmo(options_file, weight_file, num_output_representations, requires_grad=False,
    do_layer_norm=False, dropout=0.5, vocab_to_cache=None, keep_sentence_boundaries=False,
    scalar_mix_parameters=None, module=None)``: stateful and with long masks, as 0.9's. Keyword
    arguments of :class:`elmo_fast.compat.allennlp.Elmo` are accepted too."""

    def __init__(
        self,
        options_file=None,
        weight_file=None,
        num_output_representations: int | None = None,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: Sequence[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        module: nn.Module | None = None,
        **core,
    ) -> None:
        if module is None:
            core = {"stateful": True, **model_settings(), **core}
            options_file, weight_file = _local(options_file), _local(weight_file)
        super().__init__(
            options_file,
            weight_file,
            num_output_representations,
            requires_grad,
            do_layer_norm,
            dropout,
            vocab_to_cache,
            keep_sentence_boundaries,
            scalar_mix_parameters,
            module,
            **core,
        )

    def forward(self, inputs: Tensor | None = None, word_inputs: Tensor | None = None) -> dict:
        out = super().forward(inputs, word_inputs)
        out["mask"] = out["mask"].long()
        return out


class _ElmoCharacterEncoder(nn.Module):
    """allennlp 0.9's ``_ElmoCharacterEncoder(options_file, weight_file, requires_grad=False)``: the
    context-free half of the biLM. ``forward(inputs [B, T, 50])`` -> ``{"mask": [B, T + 2] long,
    "token_embedding": [B, T + 2, P]}``, sentence boundaries added (padding slots unmasked, as allennlp's).
    Its parameters are elmo-fast's
    token embedder's (their names differ from allennlp's)."""

    def __init__(self, options_file, weight_file, requires_grad: bool = False) -> None:
        super().__init__()
        weights = resolve_model(_local(options_file), _local(weight_file)).weights
        _, self.token_embedder, _ = build_stages(weights, requires_grad)
        self.token_embedder.backend = resolve_backend(model_settings().get("backend", "auto"))
        self.output_dim = weights.options.projection_dim
        self.requires_grad = requires_grad

    def get_output_dim(self) -> int:
        return self.output_dim

    def forward(self, inputs: Tensor) -> dict[str, Tensor]:
        ids, mask = add_sentence_boundaries(inputs)
        B, T2, W = ids.shape
        flat = ids.reshape(B * T2, W)
        grad = self.training and torch.is_grad_enabled() and self.requires_grad
        if grad or self.token_embedder.backend == "reference":
            vectors = self.token_embedder.forward_reference(flat)
        else:
            with torch.no_grad():
                vectors = self.token_embedder.forward_fast(flat)
        # padding slots hold what the all-zero row gives, as allennlp's do (it masks nothing here)
        return {"mask": mask.long(), "token_embedding": vectors.view(B, T2, -1)}
