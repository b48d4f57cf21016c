"""What the server's tests share: the tiny random model they serve, and an in-process embedder of it to
compare the answers with."""

from __future__ import annotations

import pytest

from elmo_fast import ElmoEmbedder


@pytest.fixture(scope="module")
def tiny_dir(random_models):
    options, _ = random_models("tiny", seed=7)
    return options.parent


@pytest.fixture(scope="module")
def embedder(tiny_dir):
    return ElmoEmbedder(model_dir=tiny_dir)
