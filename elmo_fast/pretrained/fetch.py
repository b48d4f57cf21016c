"""A model named as ``--model`` names it (:mod:`.spec`), made local: the bundled files, an official
model's, a Hub repository's or a URL's, fetched into the cache once and checked on every load."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ElmoFastError
from ..formats.model_dir import BILM_TF, MANYLANGS
from .bundled import bundled_model
from .spec import BundledSpec, HubSpec, ModelSpec, OfficialSpec, UrlSpec, parse_model_spec


@dataclass(frozen=True)
class LocalModel:
    """A model's files on this machine: ``spec`` (its name, as ``--model`` takes it), ``layout``
    (bilm-tf's or ELMoForManyLangs'), ``files`` by role (options, weights, and softmax, vocab where the
    model has them; an ELMoForManyLangs model's files by name), ``directory``: the folder holding them."""

    spec: str
    layout: str
    files: dict[str, Path]
    directory: Path

    def constructor_args(self) -> dict:
        """The arguments that name this model to ``ElmoEmbedder``, ``ElmoBiLm``, ``Elmo``..."""
        if self.layout == MANYLANGS:
            return {"model_dir": self.directory, "model_format": "elmoformanylangs"}
        return {"options_file": self.files["options"], "weight_file": self.files["weights"]}

    def bilm_tf_files(self) -> tuple[Path, Path]:
        """(options, weights); a one-line error for an ELMoForManyLangs model."""
        if self.layout != BILM_TF:
            raise ElmoFastError(
                f"model {self.spec}: an ELMoForManyLangs model (no options.json + weights.hdf5); give it as "
                f"--model {self.spec} or ElmoEmbedder(model={self.spec!r})"
            )
        return self.files["options"], self.files["weights"]

    def model_dir(self) -> Path:
        """The folder as a bilm-tf model directory (options.json + weights), as training takes it."""
        options, weights = self.bilm_tf_files()
        if options.name != "options.json" or weights.parent != options.parent:
            raise ElmoFastError(
                f"model {self.spec}: its files ({options.name}, {weights.name}) are not a model directory "
                "(options.json + weights.hdf5 in one folder); copy them into one as options.json and weights.hdf5 "
                "and give it as --model-dir"
            )
        return options.parent


def _from_record(record) -> LocalModel:
    files = record.paths()
    directory = files["options"].parent if "options" in files else next(iter(files.values())).parent
    return LocalModel(record.spec, record.layout, files, directory)


def fetch(
    model: str | ModelSpec,
    *,
    progress: bool = True,
    timeout: float = 30,
    force: bool = False,
    cache: str | os.PathLike | None = None,
) -> LocalModel:
    """The model ``model`` names, local (fetched once into the cache; sizes checked on every load, digests
    on the first after a download). ``force`` fetches it again. ``cache`` overrides the cache folder."""
    spec = parse_model_spec(model) if isinstance(model, str) else model
    root = Path(cache).expanduser() if cache is not None else None
    if isinstance(spec, BundledSpec):
        files = bundled_model(spec.name)
        roles = {"options": files.options, "weights": files.weights, "softmax": files.softmax, "vocab": files.vocab}
        return LocalModel(spec.text, BILM_TF, roles, files.directory)
    if isinstance(spec, OfficialSpec):
        from . import official

        options, weights = official.fetch_model(spec.name, cache=root, progress=progress, timeout=timeout, force=force)
        return LocalModel(spec.text, BILM_TF, {"options": options, "weights": weights}, options.parent)
    if isinstance(spec, UrlSpec):
        from .url_model import fetch_url_model

        return _from_record(fetch_url_model(spec, progress=progress, timeout=timeout, force=force, cache=root))
    if isinstance(spec, HubSpec):
        from .hf_hub import fetch_hub_model

        return _from_record(fetch_hub_model(spec, progress=progress, force=force, cache=root))
    raise TypeError(f"not a model spec: {spec!r}")
