"""ElmoEmbedder and embed_file on a GPU against the CPU: plans made on the host, the same outputs, a
batch that runs out of GPU memory split until it fits.

On a GPU only ("cuda" target, tests/support/cuda_targets.py: skips, saying why, without one); TF32 off."""

import random

import numpy as np
import pytest
import torch
from bilm_cases import sentences
from cuda_targets import exact_fp32  # noqa: F401  (autouse: TF32 off)
from tolerances import assert_close

from elmo_fast import ElmoEmbedder
from elmo_fast.errors import InputError


def test_embedder_on_cuda_plans_on_the_host(cuda_target, random_models):
    """ElmoEmbedder hands the biLM its ids on the CPU: batch_to_embeddings never waits for the GPU."""
    embedder = ElmoEmbedder(*random_models("small"), device="cuda")
    batch = sentences(np.random.default_rng(11), 5)
    embedder.batch_to_embeddings(batch)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got, mask = embedder.batch_to_embeddings(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want, want_mask = ElmoEmbedder(*random_models("small")).batch_to_embeddings(batch)
    assert torch.equal(mask.cpu(), want_mask)
    assert_close(got, want, dtype=torch.float32, what="ElmoEmbedder on CUDA, host-planned")


def test_embed_file_on_cuda_matches_cpu(cuda_target, random_models, tmp_path):
    from embed_runs import assert_same_output, random_sentences, write_lines

    files = random_models("small")
    inp = write_lines(tmp_path / "in.txt", random_sentences(random.Random(6), 150))
    ElmoEmbedder(*files, device="cuda").embed_file(inp, tmp_path / "gpu.h5", "all", progress=False)
    ElmoEmbedder(*files).embed_file(inp, tmp_path / "cpu.h5", "all", progress=False)
    assert_same_output(tmp_path / "gpu.h5", tmp_path / "cpu.h5", "embed_file on CUDA vs CPU")


def test_embed_file_on_cuda_splits_batches_that_run_out_of_memory(cuda_target, random_models, tmp_path):
    """A real CUDA out-of-memory: the caching allocator capped ~120 MB above the model, so a batch of
    32 sentences of 300 tokens (its layer >= 1 input gates alone take 2 x 32 x 302 x 4096 x 4 bytes
    = 317 MB on `small`) must be halved until it fits, and a 10k-token sentence (328 MB alone)
    is refused naming its line."""
    from embed_runs import assert_same_output, write_lines

    files = random_models("small")
    rng = random.Random(5)
    words = ["the", "cat", "sat", "on", "a", "mat", ".", "über"]
    inp = write_lines(tmp_path / "in.txt", [" ".join(rng.choice(words) for _ in range(300)) for _ in range(32)])
    too_long = write_lines(tmp_path / "long.txt", ["a short one", " ".join(rng.choice(words) for _ in range(10_000))])
    embedder = ElmoEmbedder(*files, device="cuda", batch_size=32, token_cache_mb=0)
    embedder.embed_file(inp, tmp_path / "free.h5", "top", progress=False, bucketing=False)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 120 * 2**20) / total)
    try:
        stats = embedder.embed_file(inp, tmp_path / "tight.h5", "top", progress=False, bucketing=False)
        with pytest.raises(InputError, match=r"line 2: its sentence of 10000 tokens does not fit in memory"):
            embedder.embed_file(too_long, tmp_path / "never.h5", "top", progress=False, bucketing=False)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert stats["oom_splits"] > 0
    assert_same_output(tmp_path / "tight.h5", tmp_path / "free.h5", "embed_file split after CUDA OOM")
    assert not (tmp_path / "never.h5").exists()
