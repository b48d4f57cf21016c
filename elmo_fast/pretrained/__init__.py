"""Models by name: the official allennlp/bilm-tf ELMo models, fetched once into a local cache
(:mod:`elmo_fast.pretrained.official`)."""
from .official import (DEFAULT_BASE_URL, MODEL_DESCRIPTIONS, MODELS, cache_dir, fetch_model, model_names,
                       model_urls)

__all__ = ["DEFAULT_BASE_URL", "MODELS", "MODEL_DESCRIPTIONS", "cache_dir", "fetch_model", "model_names", "model_urls"]
