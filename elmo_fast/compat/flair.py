"""What flair's ``ELMoEmbeddings`` needs besides allennlp, on elmo-fast's allennlp import path.

flair (0.12 and later, 0.15.1 included) saves a model's embeddings as parameters (``to_params``) and
rebuilds them on load (``from_params``, through the registry of embedding classes); its legacy
``ELMoEmbeddings`` has neither, so a tagger holding one cannot be saved, with allennlp 0.9 or without.
When :mod:`elmo_fast.as_allennlp` is active and ``flair.embeddings.legacy`` is imported,
:func:`make_elmo_embeddings_saveable` gives the class the two and registers it, so that flair's own
``save`` and ``load`` work. The parameters are its constructor's arguments (``model``,
``options_file``, ``weight_file``, ``embedding_mode``: the model files are named, not copied, as flair
does for other file-backed embeddings) and the embedder's LSTM states at the time of ``save``
(``lstm_states``: ``h`` [layers, rows, 2P] and ``c`` [layers, rows, 2C], CPU tensors, rows one per
batch row seen, as allennlp 0.9 keeps them). allennlp 0.9's ``ElmoEmbedder`` is stateful: each call
starts from the states the previous one left, so a rebuilt embedder that started afresh would give
other vectors for the same sentence (up to 0.19 apart on a tiny model). ``from_params`` builds the
embedder (its constructor embeds flair's dummy sentence) and then puts the saved states back, so the
loaded model continues where the saved one was, as flair's pickles before 0.12 did. Parameters saved
without states (by an earlier elmo-fast) load as before: the states are a fresh embedder's.
A flair that has ``to_params`` of its own is left alone.
"""

from __future__ import annotations

import types

from ..errors import ElmoFastError

#: ELMoEmbeddings' constructor arguments, which rebuild it
_PARAMS = ("model", "options_file", "weight_file", "embedding_mode")
#: the parameter holding the embedder's LSTM states ({"h": Tensor, "c": Tensor})
STATES = "lstm_states"


def _to_params(self) -> dict:
    given = getattr(self, "instance_parameters", None) or {}
    params = {name: given[name] for name in _PARAMS if name in given}
    if "embedding_mode" not in params and isinstance(getattr(self, "name", None), str):
        params["embedding_mode"] = self.name.rsplit("-", 1)[-1]  # flair names it elmo-{model}-{mode}
    states = self.ee.elmo_bilm.get_states()
    if states is not None:  # (plain CPU tensors: torch.save and flair's load keep them as they are)
        params[STATES] = {"h": states[0].detach().cpu().clone(), "c": states[1].detach().cpu().clone()}
    return params


def _from_params(cls, params: dict):
    embeddings = cls(**{name: params[name] for name in _PARAMS if name in params})
    saved = params.get(STATES)
    if saved is not None:
        bilm = embeddings.ee.elmo_bilm
        now = bilm.get_states()  # (the dummy sentence's: their dtype is the model's)
        dtype = now[0].dtype if now is not None else saved["h"].dtype
        try:
            bilm.set_states((saved["h"].to(dtype), saved["c"].to(dtype)))
        except ElmoFastError as e:
            raise ElmoFastError(
                f"the saved ELMoEmbeddings' LSTM states do not fit the model it names "
                f"({params.get('options_file') or params.get('model')}): were its files replaced since the "
                f"save? ({e})"
            ) from None
    return embeddings


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
