"""The smallest training run that does everything a run does (the tests of faults, kills and locks):
a biLM far smaller than the ``tiny`` preset (a few thousand parameters), a corpus of 40 short
sentences, and the ``elmo-fast train`` flags for a run of a few steps with a checkpoint and an export.
One run takes a few tens of milliseconds once torch is loaded, so a test can afford hundreds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

#: 1 highway layer, 2 filters, a 1-layer biLSTM of 16 cells projected to 8
MINI_OPTIONS = {
    "lstm": {
        "use_skip_connections": True,
        "projection_dim": 8,
        "cell_clip": 3.0,
        "proj_clip": 3.0,
        "dim": 16,
        "n_layers": 1,
    },
    "char_cnn": {
        "activation": "relu",
        "filters": [[1, 4], [2, 4]],
        "n_highway": 1,
        "embedding": {"dim": 4},
        "n_characters": 262,
        "max_characters_per_token": 50,
    },
}
WORDS = "the cat dog sees a big small bird likes".split()


def mini_inputs(root: Path) -> dict[str, str]:
    """Corpus, vocabulary and options files of the mini run, written under ``root``."""
    from elmo_fast.training.vocab import build_vocabulary

    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(40)]
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    vocab, _ = build_vocabulary([str(root / "train.txt")])
    vocab.save(root / "vocab.txt")
    (root / "options.json").write_text(json.dumps(MINI_OPTIONS))
    return {"train": str(root / "train.txt"), "vocab": str(root / "vocab.txt"), "options": str(root / "options.json")}


def train_args(
    inputs: dict[str, str], out: str | Path, max_steps: int = 3, checkpoint_every: int = 2, *extra: str
) -> list[str]:
    """``elmo-fast train`` arguments (without the program name) of the mini run into ``out``."""
    return [
        "train",
        "--train",
        inputs["train"],
        "--vocab",
        inputs["vocab"],
        "--options",
        inputs["options"],
        "--out",
        str(out),
        "--max-steps",
        str(max_steps),
        "--batch-size",
        "4",
        "--negative-samples",
        "4",
        "--checkpoint-every",
        str(checkpoint_every),
        "--log-every",
        "1",
        "--quiet",
        "--seed",
        "1",
        *extra,
    ]


def final_tensors(out: str | Path) -> list[torch.Tensor]:
    """The exported biLM's tensors and the softmax of a run's output directory."""
    import h5py

    from elmo_fast.formats.bilm_tf import load_model_files

    out = Path(out)
    tensors = list(load_model_files(out / "options.json", out / "weights.hdf5").tensors())
    with h5py.File(out / "softmax.hdf5", "r") as f:
        tensors += [torch.from_numpy(f["softmax/W"][...]), torch.from_numpy(f["softmax/b"][...])]
    return tensors


def same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def mini_config(inputs: dict[str, str], out: str | Path, **changes):
    """The mini run as a :class:`TrainConfig` (the Python API): 2 steps, a checkpoint after each."""
    from elmo_fast.training.trainer import TrainConfig

    settings = dict(
        train=[inputs["train"]],
        vocab=inputs["vocab"],
        out=str(out),
        options=MINI_OPTIONS,
        epochs=1,
        max_steps=2,
        batch_size=4,
        negative_samples=4,
        checkpoint_every=1,
        log_every=1,
        progress=False,
        seed=1,
    )
    settings.update(changes)
    return TrainConfig(**settings)
