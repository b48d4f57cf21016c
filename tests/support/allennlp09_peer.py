"""Run allennlp 0.9.0 itself (the release flair, seqvec and bio_embeddings were written for) on torch 2.x,
in a process of its own, and record what it gives: the peer of elmo-fast's allennlp 0.9 import path.

    python tests/support/allennlp09_peer.py JOB.json OUT.npz

allennlp 0.9 is installed outside the venv (``.peers/allennlp-0.9``, tests/install_peers.sh); this
script puts it first on sys.path. It imports many libraries its ELMo code never runs (spaCy, NLTK,
pytorch-pretrained-bert, ...): each that is not installed gets an empty stand-in, and so do the
subpackages of allennlp off ELMo's path whose imports break on today's libraries (semparse,
service, predictors; the ``allennlp.commands`` package's ``__init__``, which imports every command).
Nothing of ELMo's path is stubbed: ``allennlp.commands.elmo``, ``allennlp.modules.elmo`` and what
they import run as released.

JOB (JSON): {"options": path, "weights": path, "steps": [[op, args...], ...], "pickle_after": k?,
"pickle_to": path?, "flair_legacy": {...}?}. Ops, on one stateful ``ElmoEmbedder`` (its states flow
through the whole sequence): ``["embed_sentence", tokens]``, ``["embed_batch", batch]``,
``["embed_sentences", sentences, batch_size]``, ``["embed_file", path, output_format, batch_size]``
(the HDF5 written to path + ".h5"), ``["elmo", batch, num_output_representations,
scalar_mix_parameters]`` (a stateful ``Elmo`` of its own, dropout 0, its outputs recorded),
``["flair", embedding_mode, sentences]`` (flair's ``ELMoEmbeddings`` on allennlp 0.9, built then
embedding the sentences as one call: each sentence's token vectors recorded),
``["flair_legacy", path, sentences, tag_type]`` (a flair ``SequenceTagger`` over ``ELMoEmbeddings``,
saved to path as flair saved models before 0.12, its embeddings pickled whole; then its predictions
for the sentences recorded: ``s{step}_tags`` and ``s{step}_scores``), ``["seqvec", argv]`` (seqvec's
command line on allennlp 0.9; its own ElmoEmbedder). Each step's arrays are recorded
as ``s{step}_{k}``. With ``pickle_after`` the embedder is pickled to ``pickle_to`` after that step,
and the sequence goes on.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pickle
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("ELMO_FAST_PEERS") or HERE.parents[1] / ".peers")
SITE = PEERS / "allennlp-0.9"

# allennlp subpackages off ELMo's path whose imports fail on today's libraries: empty stand-ins
_OFF_PATH = ("allennlp.semparse", "allennlp.service", "allennlp.predictors")


class _Anything:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


def _imported_from_allennlp() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if str(SITE) in name:
            return True
        if "importlib" not in name and not name.startswith("<frozen"):
            return False
        frame = frame.f_back
    return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, front: bool) -> None:
        self.front = front

    def find_spec(self, fullname, path, target=None):
        if self.front:
            if fullname == "allennlp.commands" or fullname.startswith(_OFF_PATH):
                return importlib.util.spec_from_loader(fullname, self, is_package=True)
            return None
        top = fullname.split(".")[0]
        if top == "allennlp" or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        if importlib.machinery.PathFinder.find_spec(top) is not None and "." not in fullname:
            return None
        if not _imported_from_allennlp():
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        if spec.name == "overrides":  # a decorator that checks a method overrides one: here, the method itself
            module = types.ModuleType("overrides")
            module.overrides = lambda method: method
            return module
        module = _Stub(spec.name)
        # allennlp.commands: the real folder, without its __init__ (which imports every command)
        module.__path__ = [str(SITE / "allennlp" / "commands")] if spec.name == "allennlp.commands" else []
        return module

    def exec_module(self, module):
        pass


class _Overrides(_Finder):
    def __init__(self) -> None:
        super().__init__(front=False)

    def find_spec(self, fullname, path, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname == "overrides" else None


def import_allennlp09():
    if not (SITE / "allennlp" / "commands" / "elmo.py").is_file():
        raise SystemExit(f"allennlp 0.9 is not installed in {SITE}: bash tests/install_peers.sh")
    sys.path.insert(0, str(SITE))
    import h5py  # noqa: F401  (real, before the stand-ins)
    import numpy  # noqa: F401
    import torch  # noqa: F401

    sys.meta_path.insert(0, _Finder(front=True))
    sys.meta_path.append(_Finder(front=False))
    if importlib.util.find_spec("overrides") is None:
        sys.meta_path.insert(1, _Overrides())
    import allennlp.commands.elmo as elmo_command
    import allennlp.modules.elmo as elmo_module

    return elmo_command, elmo_module


def main(job_path: str, out_path: str) -> None:
    import numpy as np
    import torch

    job = json.loads(Path(job_path).read_text())
    commands, modules = import_allennlp09()
    torch.manual_seed(0)
    embedder = commands.ElmoEmbedder(job["options"], job["weights"], cuda_device=-1)
    out: dict[str, np.ndarray] = {}
    for i, (op, *args) in enumerate(job["steps"]):
        with torch.no_grad():
            if op == "embed_sentence":
                arrays = [embedder.embed_sentence(args[0])]
            elif op == "embed_batch":
                arrays = embedder.embed_batch(args[0])
            elif op == "embed_sentences":
                arrays = list(embedder.embed_sentences(args[0], args[1]))
            elif op == "embed_file":
                with open(args[0], encoding="utf-8") as f:
                    embedder.embed_file(f, args[0] + ".h5", args[1], args[2])
                arrays = []
            elif op == "elmo":
                elmo = modules.Elmo(job["options"], job["weights"], args[1], dropout=0.0, scalar_mix_parameters=args[2])
                result = elmo(modules.batch_to_ids(args[0]))
                arrays = [r.numpy() for r in result["elmo_representations"]] + [result["mask"].numpy()]
            elif op == "flair":
                from flair.data import Sentence
                from flair.embeddings import ELMoEmbeddings

                embeddings = ELMoEmbeddings(
                    options_file=job["options"], weight_file=job["weights"], embedding_mode=args[0]
                )
                sentences = [Sentence(tokens) for tokens in args[1]]
                embeddings.embed(sentences)
                arrays = [torch.stack([t.get_embedding() for t in s]).numpy() for s in sentences]
            elif op == "seqvec":  # seqvec's command line, argv as given, on allennlp 0.9
                import seqvec.seqvec

                sys.argv = ["seqvec", *args[0]]
                seqvec.seqvec.main()
                arrays = []
            elif op == "flair_legacy":
                arrays = []
                out.update(_flair_legacy(job, i, *args))
            else:
                raise SystemExit(f"unknown op {op!r}")
        for k, a in enumerate(arrays):
            out[f"s{i}_{k}"] = np.asarray(a)
        if job.get("pickle_after") == i:
            with open(job["pickle_to"], "wb") as f:
                pickle.dump(embedder, f)
    np.savez(out_path, **out)


def _flair_legacy(job: dict, step: int, path: str, sentences: list, tag_type: str) -> dict:
    import flair
    import numpy as np
    import torch
    from flair.data import Dictionary, Sentence
    from flair.embeddings import ELMoEmbeddings
    from flair.models import SequenceTagger

    flair.set_seed(1)
    tags = Dictionary(add_unk=False)
    for tag in ("N", "V", "D"):
        tags.add_item(tag)
    embeddings = ELMoEmbeddings(options_file=job["options"], weight_file=job["weights"], embedding_mode="all")
    tagger = SequenceTagger(
        hidden_size=16, embeddings=embeddings, tag_dictionary=tags, tag_type=tag_type, use_crf=False, use_rnn=True
    )
    tagger.eval()
    # what flair up to 0.11 saved: the model's settings, its state dict, and its embeddings pickled whole
    state = {
        "__cls__": "SequenceTagger",
        "state_dict": tagger.state_dict(),
        "embeddings": tagger.embeddings,
        "hidden_size": 16,
        "tag_dictionary": tags,
        "tag_format": "BIOES",
        "tag_type": tag_type,
        "use_crf": False,
        "use_rnn": True,
        "rnn_layers": 1,
        "use_dropout": 0.0,
        "use_word_dropout": 0.05,
        "use_locked_dropout": 0.5,
        "rnn_type": "LSTM",
        "reproject_embeddings": True,
        "weight_dict": None,
        "train_initial_hidden_state": False,
    }
    torch.save(state, path, pickle_protocol=4)
    batch = [Sentence(tokens) for tokens in sentences]
    tagger.predict(batch, mini_batch_size=len(batch))
    labels = [t.get_label(tag_type) for s in batch for t in s]
    return {
        f"s{step}_tags": np.array([label.value for label in labels]),
        f"s{step}_scores": np.array([label.score for label in labels], dtype=np.float64),
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
