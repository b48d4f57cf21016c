"""Which files of a repository make an ELMo model, from the list of its paths (a Hub repository's
listing, or the files of a folder already downloaded): no network, no optional package.

In the folder asked for (the repository's root, or a subfolder):

* bilm-tf's: ``options.json`` and a weights file (``weights.hdf5``, else the one ``*.hdf5`` besides
  ``softmax.hdf5``), as the known mirrors hold them (``lysandre/elmo-2x4096_512_2048cnn_2xhighway``:
  options.json + weights.hdf5); with ``softmax.hdf5`` and ``vocab.txt`` when they are there (a model
  elmo-fast trained, which ``finetune`` and ``perplexity`` use);
* allennlp's long names: ``STEM_options.json`` and ``STEM_weights*.hdf5``
  (``elmo_2x4096_512_2048cnn_2xhighway_options.json`` + ``..._weights.hdf5``);
* ELMoForManyLangs' model directory: ``config.json``, ``encoder.pkl``, ``token_embedder.pkl``,
  ``char.dic`` / ``word.dic`` and the architecture's ``*.json``;
* none there, but one folder below holds one of these (SeqVec's ``uniref50_v2/options.json`` +
  ``weights.hdf5``): that one.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ElmoFastError
from ..formats.manylangs_dir import CHAR_DIC, CONFIG_FILE, ENCODER_PKL, TOKEN_EMBEDDER_PKL, WORD_DIC
from ..formats.model_dir import BILM_TF, MANYLANGS

OPTIONS = "options.json"
WEIGHTS = "weights.hdf5"
SOFTMAX = "softmax.hdf5"
VOCAB = "vocab.txt"

_LONG_OPTIONS = re.compile(r"(?P<stem>.+)_options\.json")


@dataclass(frozen=True)
class RepoModel:
    """A model found in a repository: its kind (bilm-tf's or ELMoForManyLangs'), the folder holding it
    ("" the root) and its files by role (bilm-tf: options, weights, and softmax, vocab when there;
    ELMoForManyLangs: each file's name), as paths in the repository."""

    layout: str
    folder: str
    files: dict[str, str]


#: the files that make the usual layouts, for messages
BILM_TF_FILES = (OPTIONS, WEIGHTS)
MANYLANGS_FILES = (CONFIG_FILE, CHAR_DIC, WORD_DIC, TOKEN_EMBEDDER_PKL, ENCODER_PKL)


def _in_folder(paths: Iterable[str], folder: str) -> tuple[set[str], set[str]]:
    """(file names directly in ``folder``, names of its subfolders)."""
    prefix = f"{folder}/" if folder else ""
    names, subfolders = set(), set()
    for p in paths:
        if not p.startswith(prefix):
            continue
        rest = p[len(prefix) :]
        if "/" in rest:
            subfolders.add(rest.split("/", 1)[0])
        elif rest:
            names.add(rest)
    return names, subfolders


def _bilm_tf(names: set[str], folder: str, where: str) -> dict[str, str] | None:
    join = (lambda n: posixpath.join(folder, n)) if folder else (lambda n: n)
    if OPTIONS in names:
        if WEIGHTS in names:
            weights = WEIGHTS
        else:
            candidates = sorted(n for n in names if n.endswith(".hdf5") and n != SOFTMAX)
            if not candidates:
                return None
            if len(candidates) > 1:
                raise ElmoFastError(
                    f"{where} holds options.json and several weights files ({', '.join(candidates)}): "
                    "elmo-fast takes one model per folder"
                )
            weights = candidates[0]
        files = {"options": join(OPTIONS), "weights": join(weights)}
        for role, name in (("softmax", SOFTMAX), ("vocab", VOCAB)):
            if name in names:
                files[role] = join(name)
        return files
    stems = {}
    for n in sorted(names):
        m = _LONG_OPTIONS.fullmatch(n)
        if m:
            weights = sorted(w for w in names if w.startswith(m["stem"] + "_weights") and w.endswith(".hdf5"))
            if len(weights) == 1:
                stems[m["stem"]] = (n, weights[0])
    if len(stems) > 1:
        raise ElmoFastError(
            f"{where} holds several models ({', '.join(sorted(stems))}): elmo-fast takes one model per folder"
        )
    if stems:
        options, weights = next(iter(stems.values()))
        return {"options": join(options), "weights": join(weights)}
    return None


def _manylangs(names: set[str], folder: str) -> dict[str, str] | None:
    if not {CONFIG_FILE, ENCODER_PKL, TOKEN_EMBEDDER_PKL} <= names:
        return None
    wanted = sorted(
        n for n in names if n.endswith(".json") or n in (CHAR_DIC, WORD_DIC, ENCODER_PKL, TOKEN_EMBEDDER_PKL)
    )
    return {n: posixpath.join(folder, n) if folder else n for n in wanted}


def _model_in(paths: list[str], folder: str, where: str) -> RepoModel | None:
    names, _ = _in_folder(paths, folder)
    bilm = _bilm_tf(names, folder, where)
    many = _manylangs(names, folder)
    if bilm and many:
        raise ElmoFastError(
            f"{where} holds both a bilm-tf model (options.json) and an ELMoForManyLangs model (config.json, "
            "encoder.pkl): elmo-fast takes one model per folder"
        )
    if bilm:
        return RepoModel(BILM_TF, folder, bilm)
    if many:
        return RepoModel(MANYLANGS, folder, many)
    return None


def find_model(paths: Iterable[str], folder: str | None, where: str) -> RepoModel:
    """The model in ``folder`` of a repository holding ``paths`` (see the module's docstring); ``where``
    names the folder in errors. A one-line error when there is none, or several one level down."""
    paths = [p.strip("/") for p in paths]
    folder = (folder or "").strip("/")
    found = _model_in(paths, folder, where)
    if found is not None:
        return found
    _, subfolders = _in_folder(paths, folder)
    below = [
        m for s in sorted(subfolders) if (m := _model_in(paths, posixpath.join(folder, s) if folder else s, where))
    ]
    if len(below) == 1:
        return below[0]
    if below:
        raise ElmoFastError(
            f"{where} holds models in several folders ({', '.join(m.folder for m in below)}): name one as the "
            "subfolder, hf:OWNER/REPO[@REVISION]/FOLDER"
        )
    raise ElmoFastError(
        f"{where} holds no ELMo model: expected {' + '.join(BILM_TF_FILES)} (bilm-tf's, or allennlp's "
        f"NAME_options.json + NAME_weights.hdf5) or {', '.join(MANYLANGS_FILES)} (ELMoForManyLangs'), "
        "there or one folder below"
    )
