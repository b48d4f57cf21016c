"""The APIs of the tools ELMo users come from, on the elmo-fast core.

* :mod:`~elmo_fast.compat.allennlp`          allennlp's ``Elmo`` module (scalar mixes over the biLM) and ``ConfigurationError``
* :mod:`~elmo_fast.compat.tf_hub`            TF-Hub ``google/elmo``'s signatures and outputs (``HubElmo``, ``hub_signature``)
* :mod:`~elmo_fast.compat.elmoformanylangs` ELMoForManyLangs' ``Embedder`` (``sents2elmo``), also as :mod:`elmo_fast.manylangs`
* :mod:`~elmo_fast.compat.simple_elmo`      simple_elmo's ``ElmoModel`` (its vocabulary and batcher in
  ``simple_elmo_vocab``, its language-model substitutes in ``simple_elmo_lm``), also as :mod:`elmo_fast.simple_elmo`
* :mod:`~elmo_fast.compat.allennlp09`       allennlp 0.9's ELMo import path (``allennlp.commands.elmo``, ...), put
  under the name ``allennlp`` only when asked (:mod:`elmo_fast.as_allennlp`), for flair, seqvec and bio_embeddings
* :mod:`~elmo_fast.compat.flair`            what flair's ``ELMoEmbeddings`` needs besides allennlp (saving and loading)
* :mod:`~elmo_fast.compat.seqvec`           bio_embeddings' ``SeqVecEmbedder`` (protein sequences), without bio_embeddings

Names are loaded on first use, so that the import path's finder (light) does not import the model.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ConfigurationError": "elmo_fast.compat.allennlp",
    "Elmo": "elmo_fast.compat.allennlp",
    "HubElmo": "elmo_fast.compat.tf_hub",
    "hub_module": "elmo_fast.compat.tf_hub",
    "hub_signature": "elmo_fast.compat.tf_hub",
}

__all__ = ["ConfigurationError", "Elmo", "HubElmo", "hub_module", "hub_signature"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elmo_fast.compat' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
