"""ELMoForManyLangs' models and API: ``from elmo_fast.manylangs import Embedder`` in place of
``from elmoformanylangs import Embedder`` (see :mod:`elmo_fast.compat.elmoformanylangs`).

The model directories themselves are read by :mod:`elmo_fast.formats.manylangs_dir`, and every other
entry point takes them too: ``ElmoEmbedder(model_dir)``, ``ElmoBiLm(model_dir)``,
``Elmo(model_dir, num_output_representations=k)`` and ``elmo-fast embed --model-dir DIR``.
"""

from .compat.elmoformanylangs import Embedder
from .formats.manylangs_dir import ManyLangsConfig, ManyLangsWeights, load_manylangs

__all__ = ["Embedder", "ManyLangsConfig", "ManyLangsWeights", "load_manylangs"]
