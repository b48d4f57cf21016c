"""The biLM core: one room per stage, the fast and the reference forward side by side.

* :mod:`~elmo_fast.bilm.char_ids`         allennlp's character ids (``batch_to_ids``)
* :mod:`~elmo_fast.bilm.word_char_ids`    ELMoForManyLangs' rows of word and character ids (its own dictionaries)
* :mod:`~elmo_fast.bilm.reference`        the reference twin of every stage, plain PyTorch: the oracle
* :mod:`~elmo_fast.bilm.ops`              typed wrappers of the compiled ops (``torch.ops.elmo_fast.*``)
* :mod:`~elmo_fast.bilm.stages`           the stages as modules: CharCNN, Highway, CharTokenEmbedder, LstmLayer,
                                          BiLstmEncoder (which also carries a stateful biLM's states)
* :mod:`~elmo_fast.bilm.model`            ``ElmoBiLm``: the stages composed with the parts below
* :mod:`~elmo_fast.bilm.backends`         fast or reference ("auto": fast when the extension is built)
* :mod:`~elmo_fast.bilm.precision`        fp32 / tf32 / bf16 / fp16, each with its stated error bound
* :mod:`~elmo_fast.bilm.distinct_rows`    each distinct token of a batch once
* :mod:`~elmo_fast.bilm.token_cache`      distinct tokens' context-free results, kept across batches
* :mod:`~elmo_fast.bilm.derived_weights`  low-precision, packed and stacked copies of the weights, remade when they change
* :mod:`~elmo_fast.bilm.cpu_choices`      the CPU kernels' choices as the ops take them; the model asks for its own
                                          there, and :mod:`elmo_fast.tuning` (installed here) answers
* :mod:`~elmo_fast.bilm.cuda_graphs`      captured forwards per bucket (``cuda_graphs=N``)
* :mod:`~elmo_fast.bilm.vocab_cache`      allennlp's ``vocab_to_cache``: word ids read against cached vectors
* :mod:`~elmo_fast.bilm.legacy_keys`      state dicts saved by allennlp and elmo-fast 0.1, loaded
* :mod:`~elmo_fast.bilm.scalar_mix`       ``ScalarMix``: learned mixes of the layers

Each op checked against its twin, and what was built: :mod:`elmo_fast.verification` (``elmo-fast doctor``,
the first-use self-check ``ELMO_FAST_SELFCHECK``, installed on the ops when this package is imported).
"""

from ..tuning import cpu_tuning as _tuning
from ..verification import first_use
from . import cpu_choices
from .char_ids import batch_to_ids
from .model import ElmoBiLm
from .scalar_mix import ScalarMix

first_use.enable_from_environment()  # ELMO_FAST_SELFCHECK (default: CUDA ops): check each op on its first use
cpu_choices.install(_tuning.cpu_tuning)  # the CPU kernels' choices, measured on this machine (elmo_fast.tuning)

__all__ = ["batch_to_ids", "ElmoBiLm", "ScalarMix"]
