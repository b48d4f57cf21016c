"""Which TensorFlow checkpoint a source folder holds: a bilm-tf training folder or a TF-Hub module.

* bilm-tf training folder (``bin/train_elmo.py --save_dir``): ``checkpoint`` (TensorFlow's list of
  the run's checkpoints, naming them by their paths on the training machine: only the base names
  are used, looked up next to the file), ``model.ckpt-N.index`` + ``model.ckpt-N.data-*`` (the
  last two saves), ``options.json`` (the training options); ``step`` picks another N.
* TF-Hub module folder: ``saved_model.pb`` or ``tfhub_module.pb``, and ``variables/variables.index``
  + ``variables/variables.data-*``.
* a checkpoint prefix itself (``dir/model.ckpt-N``, or its ``.index`` file).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFileError
from ..formats.tf_checkpoint import read_checkpoint_state

BILM_TF, TF_HUB, PREFIX = "bilm-tf training folder", "TF-Hub module", "checkpoint"
HUB_GRAPHS = ("saved_model.pb", "tfhub_module.pb")
_STEP = re.compile(r"^(?P<stem>.+)-(?P<step>[0-9]+)\.index$")


@dataclass
class Source:
    """A checkpoint found in SRC, and what lies beside it."""

    kind: str
    prefix: str  # the checkpoint, without .index / .data-*
    step: int | None = None
    steps: list[int] = field(default_factory=list)  # every step found beside it (bilm-tf)
    latest: bool = True  # the one the ``checkpoint`` file names
    options: dict[str, Any] | None = None  # the training options.json, when there is one
    options_path: str | None = None
    vocab_path: str | None = None  # a vocab.txt beside it


def _base_name(path: str) -> str:
    """The last component of a path written on another machine (POSIX or Windows)."""
    return re.split(r"[\\/]", path.rstrip("\\/"))[-1]


def _checkpoints(directory: Path) -> dict[int, list[str]]:
    """step -> checkpoint prefixes (base names) of the ``*-N.index`` files in ``directory``."""
    found: dict[int, list[str]] = {}
    for p in sorted(directory.glob("*.index")):
        m = _STEP.match(p.name)
        if m:
            found.setdefault(int(m.group("step")), []).append(p.name[: -len(".index")])
    return found


def _read_options(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            options = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise ModelFileError(f"{path}: cannot read the training options as JSON: {' '.join(str(e).split())}") from None
    if not isinstance(options, dict):
        raise ModelFileError(f"{path}: expected a JSON object (bilm-tf's training options)")
    return options


def find_source(src: str | os.PathLike, step: int | None = None) -> Source:
    """The checkpoint to convert in ``src`` (see the module's docstring); ``step`` picks one of a
    bilm-tf run's checkpoints other than the latest."""
    path = Path(src)
    if not path.is_dir():
        prefix = str(path)[: -len(".index")] if path.name.endswith(".index") else str(path)
        if not os.path.isfile(prefix + ".index"):
            what = "not found" if not path.exists() else "not a folder or a checkpoint's .index file"
            raise ModelFileError(
                f"{path}: {what}; expected a bilm-tf training folder (checkpoint, model.ckpt-N.index "
                f"and .data-*, options.json), a TF-Hub module folder (saved_model.pb or "
                f"tfhub_module.pb, variables/) or a checkpoint prefix"
            )
        if step is not None:
            raise ModelFileError(f"--step {step}: SRC is one checkpoint ({prefix}); give the folder to pick a step")
        options = Path(prefix).parent / "options.json"
        return Source(
            PREFIX,
            prefix,
            options=_read_options(options) if options.is_file() else None,
            options_path=str(options) if options.is_file() else None,
            vocab_path=_vocab_beside(Path(prefix).parent),
        )
    hub_graph = next((path / g for g in HUB_GRAPHS if (path / g).is_file()), None)
    if hub_graph is not None or (path / "variables").is_dir():
        index = path / "variables" / "variables.index"
        if not index.is_file():
            has = hub_graph.name if hub_graph else "variables/"
            raise ModelFileError(
                f"{index}: missing; {path} holds {has} like a TF-Hub module, which keeps its weights "
                f"in variables/variables.index and variables/variables.data-*"
            )
        if step is not None:
            raise ModelFileError(f"--step {step}: {path} is a TF-Hub module, which holds one checkpoint")
        return Source(TF_HUB, str(path / "variables" / "variables"))
    found = _checkpoints(path)
    steps = sorted(found)
    state_file = path / "checkpoint"
    latest_name = None
    if state_file.is_file():
        latest_path, _ = read_checkpoint_state(state_file)
        if latest_path:
            latest_name = _base_name(latest_path)
            if step is None and not (path / (latest_name + ".index")).is_file():
                have = (
                    f"steps {', '.join(map(str, steps))} are here (--step N picks one)"
                    if steps
                    else "no checkpoint index is here"
                )
                raise ModelFileError(
                    f"{path / (latest_name + '.index')}: missing; {state_file} names {latest_name} "
                    f"(as {latest_path}) as the latest checkpoint, and {have}"
                )
    elif not steps:
        raise ModelFileError(
            f"{path}: holds no TensorFlow checkpoint; expected a bilm-tf training folder (checkpoint, "
            f"model.ckpt-N.index and .data-*, options.json) or a TF-Hub module folder (saved_model.pb "
            f"or tfhub_module.pb, variables/)"
        )
    if step is not None:
        names = found.get(step, [])
        stem = (
            _STEP.match(latest_name + ".index").group("stem")
            if latest_name and _STEP.match(latest_name + ".index")
            else None
        )
        preferred = [n for n in names if stem and n.startswith(stem + "-")] or names
        if not preferred:
            raise ModelFileError(
                f"--step {step}: {path} holds no checkpoint of step {step} (no *-{step}.index); "
                f"steps here: {', '.join(map(str, steps)) or 'none'}"
            )
        if len(preferred) > 1:
            raise ModelFileError(
                f"--step {step}: {path} holds {len(preferred)} checkpoints of step {step} "
                f"({', '.join(preferred)}); give SRC as one of their prefixes"
            )
        name = preferred[0]
    elif latest_name is not None:
        name = latest_name
    else:  # no `checkpoint` file: the highest step
        if len(found[steps[-1]]) > 1:
            raise ModelFileError(
                f"{path}: no checkpoint file, and {len(found[steps[-1]])} checkpoints of step "
                f"{steps[-1]} ({', '.join(found[steps[-1]])}); give SRC as one of their prefixes"
            )
        name = found[steps[-1]][0]
    m = _STEP.match(name + ".index")
    options = path / "options.json"
    return Source(
        BILM_TF,
        str(path / name),
        step=int(m.group("step")) if m else None,
        steps=steps,
        latest=name == latest_name or (latest_name is None and step is None),
        options=_read_options(options) if options.is_file() else None,
        options_path=str(options) if options.is_file() else None,
        vocab_path=_vocab_beside(path),
    )


def _vocab_beside(directory: Path) -> str | None:
    vocab = directory / "vocab.txt"
    return str(vocab) if vocab.is_file() else None
