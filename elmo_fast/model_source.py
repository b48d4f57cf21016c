"""Which model a constructor was given, in any of the forms the API takes, resolved once for every
entry point (``ElmoBiLm``, ``ElmoEmbedder``, ``Elmo``, ``HubElmo``, ELMoForManyLangs' ``Embedder``):

* ``options_file`` + ``weight_file``: bilm-tf's files;
* a model directory, as ``model_dir=`` or the first argument alone: bilm-tf's (options.json +
  weights.hdf5) or ELMoForManyLangs' (:mod:`~elmo_fast.formats.model_dir` tells which; a directory
  holding both needs ``model_format``, "bilm-tf" or "elmoformanylangs");
* weights already loaded (``weight_file`` an :class:`~elmo_fast.formats.bilm_tf.ElmoWeights` or
  :class:`~elmo_fast.formats.manylangs_dir.ManyLangsWeights`);
* a model by name, as ``model=`` (what ``--model`` takes: ``default``, an official name,
  ``hf:OWNER/REPO[@REVISION][/SUBFOLDER]``, ``URL#sha256=HEX``), fetched once into the cache
  (:mod:`elmo_fast.pretrained`);
* nothing: the English model bundled in the package (one line on the ``elmo_fast`` logger says so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import ElmoFastError, Param
from .formats.bilm_tf import ElmoWeights, load_model_files
from .formats.manylangs_dir import ManyLangsWeights
from .formats.model_dir import BILM_TF, check_model_format, inspect_model_dir, load_model


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: its weights, and the files that define it by role (``"options"``,
    ``"weights"``, or an ELMoForManyLangs directory's files; empty for weights given in memory),
    which a resumed ``embed_file`` checks have not changed."""

    weights: ElmoWeights | ManyLangsWeights
    files: dict[str, str | os.PathLike] = field(default_factory=dict)


def resolve_model(
    options_file: str | os.PathLike | None = None,
    weight_file: str | os.PathLike | ElmoWeights | ManyLangsWeights | None = None,
    model_dir: str | os.PathLike | None = None,
    model_format: str | None = None,
    model: str | None = None,
) -> ModelSource:
    """The model named by a constructor's ``options_file``, ``weight_file``, ``model_dir`` and ``model``,
    loaded and checked (see the module docstring for the forms); a one-line error for any other mix.
    model_format: which model of a directory to load ("bilm-tf" or "elmoformanylangs"; files given
    one by one are bilm-tf's)."""
    if model is not None:
        if options_file is not None or weight_file is not None or model_dir is not None or model_format is not None:
            raise ElmoFastError(
                "give ",
                Param("model"),
                " (a name) or the model's files (",
                Param("options_file"),
                " + ",
                Param("weight_file"),
                ", or ",
                Param("model_dir"),
                "), not both",
            )
        from .pretrained.fetch import fetch

        return resolve_model(**fetch(model).constructor_args())
    kind = check_model_format(model_format)
    if isinstance(weight_file, (ElmoWeights, ManyLangsWeights)):
        return ModelSource(weight_file)
    if model_dir is None and weight_file is None and options_file is not None and os.path.isdir(options_file):
        model_dir, options_file = options_file, None
    if model_dir is None and options_file is None and weight_file is None:  # no model named: the bundled one
        from .pretrained.bundled import default_model_dir

        model_dir = default_model_dir()
    if model_dir is not None:
        if options_file is not None or weight_file is not None:
            raise ElmoFastError(
                "give either ",
                Param("model_dir"),
                " or ",
                Param("options_file"),
                " and ",
                Param("weight_file"),
                ", not both",
            )
        model = inspect_model_dir(model_dir, model_format)
        return ModelSource(load_model(model), dict(model.files))
    if kind not in (None, BILM_TF):
        raise ElmoFastError(
            Param("options_file"),
            " and ",
            Param("weight_file"),
            " are a bilm-tf model, but ",
            Param("model_format"),
            f" is {model_format!r}: give the ELMoForManyLangs model's directory as ",
            Param("model_dir"),
        )
    if options_file is None or weight_file is None:
        raise ElmoFastError(
            "give ",
            Param("options_file"),
            " and ",
            Param("weight_file"),
            " (bilm-tf), or a model directory (",
            Param("model_dir"),
            ", bilm-tf or ELMoForManyLangs)",
        )
    return ModelSource(load_model_files(options_file, weight_file), {"options": options_file, "weights": weight_file})
