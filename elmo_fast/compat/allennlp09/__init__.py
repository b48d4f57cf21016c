"""allennlp 0.9's ELMo import path, on the elmo-fast core: what flair's ``ELMoEmbeddings``, seqvec,
bio_embeddings' ``SeqVecEmbedder`` and allennlp-0.9-era code import, under the name ``allennlp``,
**only when asked** (:mod:`elmo_fast.as_allennlp`, or ``ELMO_FAST_AS_ALLENNLP=1``) and never over a
real allennlp.

:data:`PROVIDED` is the whole of it: each ``allennlp`` module of ELMo's path, and the elmo-fast
names it holds (``"module:attribute"``). Every other ``allennlp.*`` module is not there (its
``find_spec`` answers None), and a name a provided module lacks is an AttributeError saying what is. The modules beside this one translate allennlp 0.9's signatures and
behaviour (stateful biLMs, URLs of the official models) onto the core; they hold no model code.

This file and :mod:`.finder` import nothing heavy: the finder can be set up at interpreter start
(the ``.pth`` hook) for the cost of a dictionary; torch and the model load when an ``allennlp``
module is first imported.
"""

from __future__ import annotations

_HERE = "elmo_fast.compat.allennlp09"

#: allennlp module -> {name: "elmo_fast module:attribute"}; packages have an empty map or their re-exports
PROVIDED: dict[str, dict[str, str]] = {
    "allennlp": {"__version__": f"{_HERE}.version:VERSION"},
    "allennlp.version": {"VERSION": f"{_HERE}.version:VERSION"},
    "allennlp.commands": {},
    "allennlp.commands.elmo": {
        name: f"{_HERE}.commands_elmo:{name}"
        for name in (
            "ElmoEmbedder",
            "DEFAULT_OPTIONS_FILE",
            "DEFAULT_WEIGHT_FILE",
            "DEFAULT_BATCH_SIZE",
            "empty_embedding",
            "elmo_command",
        )
    },
    "allennlp.common": {},
    "allennlp.common.checks": {"ConfigurationError": "elmo_fast.errors:ConfigurationError"},
    "allennlp.common.file_utils": {
        "cached_path": f"{_HERE}.file_utils:cached_path",
        "CACHE_ROOT": f"{_HERE}.file_utils:CACHE_ROOT",
        "CACHE_DIRECTORY": f"{_HERE}.file_utils:CACHE_DIRECTORY",
        "url_to_filename": f"{_HERE}.file_utils:url_to_filename",
    },
    "allennlp.common.util": {"lazy_groups_of": f"{_HERE}.util:lazy_groups_of"},
    "allennlp.data": {},
    "allennlp.data.token_indexers": {"ELMoTokenCharactersIndexer": f"{_HERE}.elmo_indexer:ELMoTokenCharactersIndexer"},
    "allennlp.data.token_indexers.elmo_indexer": {
        name: f"{_HERE}.elmo_indexer:{name}" for name in ("ELMoCharacterMapper", "ELMoTokenCharactersIndexer")
    },
    "allennlp.modules": {"Elmo": f"{_HERE}.modules_elmo:Elmo", "ScalarMix": "elmo_fast.bilm.scalar_mix:ScalarMix"},
    "allennlp.modules.elmo": {
        name: f"{_HERE}.modules_elmo:{name}" for name in ("Elmo", "_ElmoBiLm", "_ElmoCharacterEncoder", "batch_to_ids")
    },
    "allennlp.modules.scalar_mix": {"ScalarMix": "elmo_fast.bilm.scalar_mix:ScalarMix"},
    # the classes of allennlp 0.9's biLM, for unpickling objects pickled with it (flair models saved
    # before flair 0.12 hold an allennlp ElmoEmbedder): each becomes elmo-fast's on load
    "allennlp.modules.elmo_lstm": {"ElmoLstm": f"{_HERE}.pickled:ElmoLstm"},
    "allennlp.modules.encoder_base": {"_EncoderBase": f"{_HERE}.pickled:_EncoderBase"},
    "allennlp.modules.highway": {"Highway": f"{_HERE}.pickled:Highway"},
    "allennlp.modules.lstm_cell_with_projection": {"LstmCellWithProjection": f"{_HERE}.pickled:LstmCellWithProjection"},
    "allennlp.nn": {},
    "allennlp.nn.util": {
        name: f"{_HERE}.nn_util:{name}"
        for name in ("remove_sentence_boundaries", "add_sentence_boundary_token_ids", "get_device_of")
    },
}

#: the modules that are packages (they have submodules here)
PACKAGES = frozenset(name.rsplit(".", 1)[0] for name in PROVIDED if "." in name)
