"""The APIs of the tools ELMo users come from, on the elmo-fast core.

* :mod:`~elmo_fast.compat.allennlp`          allennlp's ``Elmo`` module (scalar mixes over the biLM) and ``ConfigurationError``
* :mod:`~elmo_fast.compat.tf_hub`            TF-Hub ``google/elmo``'s signatures and outputs (``HubElmo``, ``hub_signature``)
* :mod:`~elmo_fast.compat.elmoformanylangs` ELMoForManyLangs' ``Embedder`` (``sents2elmo``), also as :mod:`elmo_fast.manylangs`
* :mod:`~elmo_fast.compat.simple_elmo`      simple_elmo's ``ElmoModel`` (its vocabulary and batcher in
  ``simple_elmo_vocab``, its language-model substitutes in ``simple_elmo_lm``), also as :mod:`elmo_fast.simple_elmo`
"""
from .allennlp import ConfigurationError, Elmo
from .tf_hub import HubElmo, hub_module, hub_signature

__all__ = ["ConfigurationError", "Elmo", "HubElmo", "hub_module", "hub_signature"]
