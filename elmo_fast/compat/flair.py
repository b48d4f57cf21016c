"""What flair's ``ELMoEmbeddings`` needs besides allennlp, on elmo-fast's allennlp import path.

flair (0.12 and later, 0.15.1 included) saves a model's embeddings as parameters (``to_params``) and
rebuilds them on load (``from_params``, through the registry of embedding classes); its legacy
``ELMoEmbeddings`` has neither, so a tagger holding one cannot be saved, with allennlp 0.9 or without.
When :mod:`elmo_fast.as_allennlp` is active and ``flair.embeddings.legacy`` is imported,
:func:`make_elmo_embeddings_saveable` gives the class the two (its constructor's arguments: ``model``,
``options_file``, ``weight_file``, ``embedding_mode``) and registers it, so that flair's own ``save``
and ``load`` work; the model files are named, not copied, as flair does for other file-backed
embeddings. A flair that has them already is left alone.
"""

from __future__ import annotations

import types

#: ELMoEmbeddings' constructor arguments, which rebuild it
_PARAMS = ("model", "options_file", "weight_file", "embedding_mode")


def _to_params(self) -> dict:
    given = getattr(self, "instance_parameters", None) or {}
    params = {name: given[name] for name in _PARAMS if name in given}
    if "embedding_mode" not in params and isinstance(getattr(self, "name", None), str):
        params["embedding_mode"] = self.name.rsplit("-", 1)[-1]  # flair names it elmo-{model}-{mode}
    return params


def _from_params(cls, params: dict):
    return cls(**{name: params[name] for name in _PARAMS if name in params})


def make_elmo_embeddings_saveable(legacy: types.ModuleType) -> None:
    """Give ``legacy.ELMoEmbeddings`` flair's ``to_params`` / ``from_params`` and register it (see the
    module docstring); a post-import hook of :mod:`elmo_fast.compat.allennlp09.finder`."""
    cls = getattr(legacy, "ELMoEmbeddings", None)
    if cls is None:
        return
    from flair.embeddings.base import EMBEDDING_CLASSES, Embeddings, register_embeddings

    if cls.to_params is not Embeddings.to_params or "ELMoEmbeddings" in EMBEDDING_CLASSES:
        return  # flair has its own (or this ran already)
    cls.to_params = _to_params
    cls.from_params = classmethod(_from_params)
    register_embeddings(cls)
