"""The biLM core: one room per stage, the fast and the reference forward side by side.

* :mod:`~elmo_fast.bilm.char_ids`   allennlp's character ids (``batch_to_ids``)
* :mod:`~elmo_fast.bilm.reference`  the reference twin of every stage, plain PyTorch: the oracle
* :mod:`~elmo_fast.bilm.ops`        typed wrappers of the compiled ops (``torch.ops.elmo_fast.*``)
* :mod:`~elmo_fast.bilm.stages`     the stages as modules: CharCNN, Highway, CharTokenEmbedder, LstmLayer, BiLstmEncoder
* :mod:`~elmo_fast.bilm.model`      ``ElmoBiLm``: the stages composed, state modes, backends, caches
* :mod:`~elmo_fast.bilm.scalar_mix` ``ScalarMix``: learned mixes of the layers
* :mod:`~elmo_fast.bilm.tolerances` the one table of bounds, fast vs reference (tests, doctor, self-check)
* :mod:`~elmo_fast.bilm.selfcheck`  each op against its twin on this machine (``elmo-fast doctor``,
                                    ``ELMO_FAST_SELFCHECK``); inputs in ``selfcheck_cases``
* :mod:`~elmo_fast.bilm.build_report` what was built: version, torch, backends, CUDA archs (``--version``)
"""
from . import selfcheck
from .char_ids import batch_to_ids
from .model import ElmoBiLm
from .scalar_mix import ScalarMix

selfcheck.enable_from_environment()  # ELMO_FAST_SELFCHECK: check each op on its first use

__all__ = ["batch_to_ids", "ElmoBiLm", "ScalarMix"]
