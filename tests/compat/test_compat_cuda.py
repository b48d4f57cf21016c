"""The fronts on a GPU against the CPU reference: Elmo (outputs, and gradients frozen and fine-tuned),
HubElmo, an ELMoForManyLangs model.

On a GPU only ("cuda" target, tests/support/cuda_targets.py: skips, saying why, without one); TF32 off."""

import numpy as np
import pytest
import torch
from bilm_cases import sentences
from cuda_targets import (
    exact_fp32,  # noqa: F401  (autouse: TF32 off)
    poison,
)
from tolerances import assert_close

from elmo_fast import batch_to_ids


def test_elmo_on_cuda_matches_cpu_reference(cuda_target, random_models):
    from elmo_fast import Elmo

    files = random_models("small", exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(4), 7) + [["one"]])
    for layer_norm in (False, True):
        kwargs = dict(num_output_representations=2, do_layer_norm=layer_norm, dropout=0.0)
        gpu = Elmo(*files, backend="fast", device="cuda", **kwargs).eval()
        cpu = Elmo(*files, backend="reference", **kwargs).eval()
        with torch.no_grad():
            for mix in (gpu, cpu):
                mix.scalar_mix_1.load_state_dict(
                    {
                        "scalar_parameters.0": torch.tensor([0.3]),
                        "gamma": torch.tensor([1.7]),
                        "scalar_parameters.1": torch.tensor([-0.2]),
                        "scalar_parameters.2": torch.tensor([0.5]),
                    }
                )
            poison(cuda_target)
            got, want = gpu(ids.cuda()), cpu(ids)
        assert torch.equal(got["mask"].cpu(), want["mask"])
        for k, (g, w) in enumerate(zip(got["elmo_representations"], want["elmo_representations"])):
            assert_close(g, w, dtype=torch.float32, what=f"Elmo on CUDA, layer norm {layer_norm}, representation {k}")


@pytest.mark.parametrize("requires_grad", [False, True], ids=["frozen", "fine-tuned"])
def test_elmo_gradients_on_cuda_match_cpu(cuda_target, random_models, requires_grad):
    """A training step on the GPU (fast path under a frozen biLM, the reference's autograd when the
    biLM trains) gives the CPU reference's gradients within 1e-4 relative."""
    from elmo_fast import Elmo

    files = random_models("tiny", exercise_clips=True)
    ids = batch_to_ids(sentences(np.random.default_rng(5), 5))
    grads = {}
    for where, kwargs in (("cuda", dict(backend="fast", device="cuda")), ("cpu", dict(backend="reference"))):
        model = Elmo(*files, 2, do_layer_norm=True, dropout=0.0, requires_grad=requires_grad, **kwargs).train()
        reps = model(ids.to(next(model.parameters()).device))["elmo_representations"]
        (reps[0].square().mean() + reps[1].mean()).backward()
        grads[where] = {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["cuda"].keys() == grads["cpu"].keys()
    assert any("_elmo_lstm" in n for n in grads["cpu"]) == requires_grad
    for name, want in grads["cpu"].items():
        err = (grads["cuda"][name] - want).abs().max() / want.abs().max().clamp_min(1e-12)
        assert err <= 1e-4, f"{name}: relative gradient error {err:.3g}"


def test_hub_elmo_on_cuda_matches_cpu(cuda_target, random_models):
    from elmo_fast import HubElmo

    files = random_models("small", exercise_clips=True)
    strings = ["the cat sat on the mat", "one", "über 東京 antidisestablishmentarianism , ."]
    got = HubElmo(*files, backend="fast", device="cuda")(strings)
    want = HubElmo(*files, backend="reference")(strings)
    for name, w in want.items():
        g = got[name]
        assert g.device.type == "cuda", name
        if w.dtype.is_floating_point:
            assert_close(g, w, dtype=torch.float32, what=f"HubElmo on CUDA: {name}")
        else:
            assert torch.equal(g.cpu(), w), name


@pytest.mark.parametrize("variant", ["words+chars", "20 chars, tanh, 3 layers"])
def test_manylangs_model_on_cuda_matches_reference(cuda_target, tmp_path, variant):
    """An ELMoForManyLangs model on the GPU (word embedding, char CNN over its own table and token
    length, highway_gate, bilstm) against the reference on the CPU."""
    from manylangs_models import sentences, write_variant

    from elmo_fast.manylangs import Embedder

    d = write_variant(variant, tmp_path / "model")
    sents = sentences(["szó", "kutya", "ház", "的一", "один"])
    want = Embedder(d, backend="reference").sents2elmo(sents, output_layer=-2)
    poison(cuda_target)
    got = Embedder(d, device="cuda", backend="fast").sents2elmo(sents, output_layer=-2)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        assert_close(torch.from_numpy(g), torch.from_numpy(w), torch.float32, what=f"{variant} sentence {i}")
