"""elmo-fast: ELMo (Peters et al., 2018) inference on modern PyTorch, from bilm-tf model files."""
from .char_ids import batch_to_ids
from .elmo import Elmo
from .embedder import ElmoEmbedder
from .errors import DownloadError, ElmoFastError, ExtensionNotBuiltError, InputError, ModelFileError
from .model import ElmoBiLm
from .scalar_mix import ScalarMix
from .tf_hub import HubElmo, hub_module, hub_signature
from .weights import ElmoOptions, ElmoWeights, load_options, load_weights

__version__ = "0.1.0"

__all__ = [
    "batch_to_ids", "Elmo", "ElmoEmbedder", "ElmoBiLm", "ScalarMix", "ElmoOptions", "ElmoWeights", "load_options",
    "load_weights", "HubElmo", "hub_signature", "hub_module",
    "ElmoFastError", "ModelFileError", "InputError", "DownloadError", "ExtensionNotBuiltError", "__version__",
]
