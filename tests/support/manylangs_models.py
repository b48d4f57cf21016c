"""Random-weight ELMoForManyLangs model directories of every variant the tests cover, written in its
exact layout, and the sentences they are run on."""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from elmo_fast.formats.manylangs_dir import CHAR_DIC, CONFIG_FILE, WORD_DIC, save_manylangs
from elmo_fast.formats.random_models import MANYLANGS_CHARS, MANYLANGS_PRESETS, random_manylangs_weights, random_words

TINY = MANYLANGS_PRESETS["tiny"]
#: a vocabulary word of 48 characters: a 50-character token cut to 48 finds it
LONG_WORD = "hosszú" * 8
NBSP = "\xa0"
IDEOGRAPHIC_SPACE = "\u3000"

VARIANTS = {
    # words and characters, clips that bite, and dictionaries with every quirk of the format
    "words+chars": dict(config=TINY, quirks=True),
    # zip pickles (torch >= 1.6) saved from a GPU: storages tagged cuda:0
    "chars only, cuda-tagged": dict(config=replace(TINY, word_dim=0), cuda_tagged=True),
    "words only": dict(config=replace(TINY, char_dim=0, filters=(), n_highway=0)),
    # torch's pre-1.6 pickle format (the released models'), storages tagged cuda:0 (saved from a GPU)
    "legacy pickles, cuda-tagged": dict(config=TINY, legacy=True, cuda_tagged=True),
    # another max_characters_per_token, tanh, one highway, three layers, clips of 0 (none)
    "20 chars, tanh, 3 layers": dict(
        config=replace(
            TINY,
            max_characters_per_token=20,
            activation="tanh",
            n_highway=1,
            n_layers=3,
            cell_clip=None,
            proj_clip=None,
            filters=((1, 4), (3, 8), (5, 16)),
        ),
        clips=False,
    ),
}


@contextmanager
def cuda_tagged_storages():
    """torch.save records every CPU storage as saved from cuda:0, as the released models' files are."""
    registry = torch.serialization._package_registry
    entry = (-1000, lambda storage: "cuda:0" if storage.device.type == "cpu" else None, lambda storage, loc: None)
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)


def write_variant(name: str, directory: Path, seed: int = 0) -> Path:
    spec = VARIANTS[name]
    config = spec["config"]
    rng = random.Random(seed)
    words = random_words(300, MANYLANGS_CHARS, seed) + [LONG_WORD] if config.word_dim else []
    weights = random_manylangs_weights(
        config, list(MANYLANGS_CHARS) + [IDEOGRAPHIC_SPACE], words, seed=seed, exercise_clips=spec.get("clips", True)
    )
    if spec.get("quirks"):
        # explicit ids in no particular order (the tables' rows follow the ids, whatever the line order)
        for vocab in (weights.char_vocab, weights.word_vocab):
            ids = list(vocab.values())
            rng.shuffle(ids)
            vocab.update(zip(list(vocab), ids))
    context = cuda_tagged_storages() if spec.get("cuda_tagged") else _nothing()
    with context:
        save_manylangs(directory, weights, legacy_format=spec.get("legacy", False), config_name="cnn_tiny_sample.json")
    if spec.get("quirks"):
        # config_path: an absolute path of another machine, found by its base name
        (directory / CONFIG_FILE).write_text(
            '{"config_path": "/home/hitscir/elmo/configs/cnn_tiny_sample.json", '
            '"model": "/home/hitscir/elmo/zhs.model", "batch_size": 32}',
            encoding="utf-8",
        )
        _write_quirky_dictionary(directory / CHAR_DIC, weights.char_vocab, "a", rng)
        _write_quirky_dictionary(directory / WORD_DIC, weights.word_vocab, words[0], rng)
    return directory


@contextmanager
def _nothing():
    yield


def _write_quirky_dictionary(path: Path, vocab: dict[str, int], duplicated: str, rng: random.Random) -> None:
    """Lines that read back (as ELMoForManyLangs reads them) to exactly ``vocab``: a token given a wrong id
    first and its own later (a later line wins), U+3000 written as itself (a line that strips to one
    field) and then again as a no-break space (which strips the same way: that later id wins), CRLF
    line ends."""
    lines = []
    wrong = next(i for t, i in vocab.items() if t != duplicated)
    lines.append(f"{duplicated}\t{wrong}")
    space_id = vocab.pop(IDEOGRAPHIC_SPACE, None)
    for token, index in vocab.items():
        lines.append(f"{token}\t{index}")
    if space_id is not None:
        lines.insert(len(lines) // 2, f"{IDEOGRAPHIC_SPACE}\t{wrong}")
        lines.append(f"{NBSP}\t{space_id}")
        vocab[IDEOGRAPHIC_SPACE] = space_id
    lines.append(f"{duplicated}\t{vocab[duplicated]}")
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))


def sentences(words: list[str], seed: int = 0) -> list[list[str]]:
    """Sentences that exercise the front end: vocabulary words and unknown ones, held-out characters,
    literal marks, tokens of 48, 49, 50 and more characters (code points, not bytes), empty
    sentences and an empty token."""
    rng = random.Random(seed)
    w = words or ["szó", "kutya", "ház", "的一", "один"]
    out = [
        [w[0], w[1], "abc", "Hello", "!"],
        [],
        ["<bos>", w[2], "<eos>", "<pad>", "<oov>", "<bow>", "<eow>"],
        ["x" * 48, "y" * 49, "z" * 60, LONG_WORD + "ab", "ő" * 55, LONG_WORD],
        ["😀", "αβγ", "日本", "a" + IDEOGRAPHIC_SPACE + "b", IDEOGRAPHIC_SPACE, NBSP + "x", "ß"],
        [w[3]],
        ["", w[4]],
        [
            rng.choice(w)
            if rng.random() < 0.7
            else "".join(rng.choice("qwertyuiopéű") for _ in range(rng.randint(1, 12)))
            for _ in range(37)
        ],
        [],
        list("abcdefg"),
    ]
    return out
