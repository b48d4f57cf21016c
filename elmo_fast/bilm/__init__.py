"""The biLM core: one room per stage, the fast and the reference forward side by side.

* :mod:`~elmo_fast.bilm.char_ids`   allennlp's character ids (``batch_to_ids``)
* :mod:`~elmo_fast.bilm.reference`  the reference twin of every stage, plain PyTorch: the oracle
* :mod:`~elmo_fast.bilm.ops`        typed wrappers of the compiled ops (``torch.ops.elmo_fast.*``)
* :mod:`~elmo_fast.bilm.stages`     the stages as modules: CharCNN, Highway, CharTokenEmbedder, LstmLayer, BiLstmEncoder
* :mod:`~elmo_fast.bilm.model`      ``ElmoBiLm``: the stages composed, state modes, backends, caches
* :mod:`~elmo_fast.bilm.scalar_mix` ``ScalarMix``: learned mixes of the layers
"""
from .char_ids import batch_to_ids
from .model import ElmoBiLm
from .scalar_mix import ScalarMix

__all__ = ["batch_to_ids", "ElmoBiLm", "ScalarMix"]
