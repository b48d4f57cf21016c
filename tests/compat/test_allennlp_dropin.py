"""Code written for allennlp's ELMo, run on elmo-fast's names: the module path people use to reset
states, ``Elmo(..., module=...)``, the errors migrated code catches, and the empty sentence's
shape. Each behaviour that still differs is in the table of
docs/elmo-module-and-allennlp.md."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from bilm_cases import _sentences
from peers import allennlp_elmo
from tolerances import TOL, max_abs_error
from torch import nn

from elmo_fast import Elmo, ElmoBiLm, ElmoEmbedder, ElmoFastError, ModelFileError, ScalarMix, batch_to_ids
from elmo_fast.bilm.stages import BiLstmEncoder, CharTokenEmbedder
from elmo_fast.compat import ConfigurationError

FP32 = TOL[torch.float32]["atol"]


def _batches(seed, n=3):
    rng = np.random.default_rng(seed)
    return [batch_to_ids(_sentences(rng, 4, 1, 9)) for _ in range(n)]


# --- the names along the path: elmo._elmo_lstm._elmo_lstm.reset_states() -------------------------------


def test_allennlp_names_along_the_whole_path(random_models):
    elmo = Elmo(*random_models("tiny"), 1)
    assert isinstance(elmo._elmo_lstm, ElmoBiLm)
    assert isinstance(elmo._elmo_lstm._elmo_lstm, BiLstmEncoder)
    assert elmo._elmo_lstm._elmo_lstm is elmo._elmo_lstm.encoder
    assert isinstance(elmo._elmo_lstm._token_embedder, CharTokenEmbedder)
    assert elmo._elmo_lstm._token_embedder.char_cnn is elmo._elmo_lstm.token_embedder.char_cnn
    # aliases, not modules of their own: the state dict and print() are unchanged
    assert not any(k.startswith(("_elmo_lstm._elmo_lstm.", "_elmo_lstm._token_embedder.")) for k in elmo.state_dict())
    assert "(_elmo_lstm): ElmoBiLm(" in str(elmo) and "(_token_embedder)" not in str(elmo)


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.slow
def test_reset_states_through_allennlps_path(random_models, backend):
    """The idiom of public model code: reset ELMo's states between documents. After it, a stateful
    Elmo gives what a fresh one gives."""
    files = random_models("tiny", exercise_clips=True)
    first, second, third = _batches(1)
    elmo = Elmo(*files, 1, dropout=0.0, stateful=True, backend=backend)
    fresh = Elmo(*files, 1, dropout=0.0, stateful=True, backend=backend)
    with torch.no_grad():
        elmo(first), elmo(second)
        assert elmo._elmo_lstm.get_states() is not None
        carried = elmo(third)["elmo_representations"][0]
        want = fresh(third)["elmo_representations"][0]
        assert max_abs_error(carried, want) > 1e-4  # the states really carried something
        elmo._elmo_lstm._elmo_lstm.reset_states()
        assert elmo._elmo_lstm.get_states() is None
        got = elmo(third)["elmo_representations"][0]
    assert max_abs_error(got, want) <= FP32


def test_reset_states_with_allennlps_mask(random_models):
    """allennlp's ``reset_states(mask)``: the rows where mask is True start again from zero."""
    files = random_models("tiny")
    first, second = _batches(2, 2)
    bilm = ElmoBiLm(*files, stateful=True)
    fresh = ElmoBiLm(*files, stateful=True)
    with torch.no_grad():
        bilm(first)
        h, c = (t.clone() for t in bilm.get_states())
        mask = torch.tensor([True, False, True, False])
        bilm._elmo_lstm.reset_states(mask)
        h2, c2 = bilm.get_states()
        assert torch.all(h2[:, mask] == 0) and torch.all(c2[:, mask] == 0)
        assert torch.equal(h2[:, ~mask], h[:, ~mask]) and torch.equal(c2[:, ~mask], c[:, ~mask])
        got = bilm(second)["activations"]
        fresh(first)
        fresh.set_states((h * (~mask).view(1, 4, 1), c * (~mask).view(1, 4, 1)))
        want = fresh(second)["activations"]
    for x, y in zip(got, want):
        assert max_abs_error(x, y) <= FP32
    with pytest.raises(
        ElmoFastError, match=r"reset_states: mask must have one entry per carried row, \[4\], got \[3\]"
    ):
        bilm._elmo_lstm.reset_states(torch.tensor([True, False, True]))


# --- Elmo(None, None, k, module=...) -----------------------------------------------------------------------


def test_module_instead_of_files(random_models):
    files = random_models("tiny", exercise_clips=True)
    bilm = ElmoBiLm(*files)
    elmo = Elmo(None, None, 2, dropout=0.0, module=bilm)
    assert elmo._elmo_lstm is bilm and elmo.get_output_dim() == bilm.get_output_dim()
    want = Elmo(*files, 2, dropout=0.0)
    want.load_state_dict(elmo.state_dict())  # the same (even) mixes
    ids = _batches(3, 1)[0]
    with torch.no_grad():
        for x, y in zip(elmo(ids)["elmo_representations"], want(ids)["elmo_representations"]):
            assert max_abs_error(x, y) <= FP32
    assert sorted(elmo.state_dict()) == sorted(want.state_dict())


def test_module_beside_model_files_is_allennlps_error(random_models):
    files = random_models("tiny")
    bilm = ElmoBiLm(*files)
    for args, kwargs in (((*files, 2), {}), ((files[0], None, 2), {}), ((None, None, 2), {"model_dir": "x"})):
        with pytest.raises(
            ConfigurationError,
            match=r"give options_file and weight_file \(or model_dir\), or "
            r"module, not both",
        ):
            Elmo(*args, module=bilm, **kwargs)
    with pytest.raises(
        ConfigurationError, match="module must be a torch.nn.Module with allennlp's _ElmoBiLm interface.*got str"
    ):
        Elmo(None, None, 1, module="elmo")
    with pytest.raises(ConfigurationError, match=r"must have num_layers.*got None"):
        Elmo(None, None, 1, module=nn.Linear(2, 2))
    with pytest.raises(
        ConfigurationError,
        match="stateful, precision: settings of the biLM itself; with module=, set them on the module",
    ):
        Elmo(None, None, 1, module=bilm, stateful=True, precision="bf16")


class _ForeignBiLm(nn.Module):
    """A biLM with allennlp's ``_ElmoBiLm`` interface that is not an ElmoBiLm (what allennlp's
    ``module=`` is for): ``num_layers``, ``get_output_dim()``, a forward giving activations and mask."""

    def __init__(self, inner: ElmoBiLm) -> None:
        super().__init__()
        self.inner = inner
        self.num_layers = inner.num_layers
        self.calls = 0

    def get_output_dim(self) -> int:
        return self.inner.get_output_dim()

    def forward(self, inputs, word_inputs=None):
        self.calls += 1
        out = self.inner(inputs)
        return {"activations": [2 * a for a in out["activations"]], "mask": out["mask"]}


def test_a_compatible_module_that_is_not_an_elmobilm(random_models):
    files = random_models("tiny")
    foreign = _ForeignBiLm(ElmoBiLm(*files))
    elmo = Elmo(None, None, 1, dropout=0.0, module=foreign)
    ids = _batches(4, 1)[0]
    with torch.no_grad():
        got = elmo(ids)["elmo_representations"][0]
        want = Elmo(*files, 1, dropout=0.0)(ids)["elmo_representations"][0]
    assert foreign.calls == 1 and max_abs_error(got, 2 * want) <= 2 * FP32
    assert torch.equal(elmo.batch_to_ids([["a", "b"]]), batch_to_ids([["a", "b"]]))
    elmo.reset_states()  # the module has none: nothing to do
    with pytest.raises(ElmoFastError, match="save_bilm writes an ElmoBiLm; this Elmo holds a _ForeignBiLm"):
        elmo.save_bilm("unused")


@pytest.mark.peers
def test_allennlps_own_bilm_as_the_module(random_models):
    """allennlp's ``_ElmoBiLm`` itself passed as ``module=``: elmo-fast's mixes over its activations."""
    elmo_module = allennlp_elmo()
    files = [str(f) for f in random_models("tiny")]
    theirs = elmo_module._ElmoBiLm(*files)
    ids = _batches(5, 1)[0]
    with torch.no_grad():
        got = Elmo(None, None, 1, dropout=0.0, module=theirs)(ids)["elmo_representations"][0]
        want = Elmo(*files, 1, dropout=0.0)(ids)["elmo_representations"][0]
    assert max_abs_error(got, want) <= FP32


# --- ConfigurationError where allennlp raises it -------------------------------------------------------


def test_configuration_errors_are_catchable_as_migrated_code_expects(random_models, tmp_path):
    """``except ConfigurationError`` (imported from elmo_fast.compat in place of allennlp.common.checks)
    catches what allennlp raised as one; each is still an ElmoFastError, a ValueError."""
    assert issubclass(ConfigurationError, ElmoFastError) and issubclass(ConfigurationError, ValueError)
    cases = [
        lambda: ScalarMix(3, initial_scalar_parameters=[0.0, 1.0]),
        lambda: ScalarMix(2)([torch.zeros(1, 2, 3)] * 3),
        lambda: Elmo(*random_models("tiny"), 1, scalar_mix_parameters=[1.0, 2.0]),
        lambda: Elmo(*random_models("tiny"), 1, module=ElmoBiLm(*random_models("tiny"))),
    ]
    options, weights = random_models("tiny")
    for key, value in (("char_cnn", {"activation": "sigmoid"}), ("lstm", {"use_skip_connections": False})):
        raw = json.loads(open(options).read())
        raw[key].update(value)
        edited = tmp_path / f"{key}.json"
        edited.write_text(json.dumps(raw))
        cases.append(lambda edited=edited: Elmo(edited, weights, 1))
    for case in cases:
        try:
            case()
        except ConfigurationError as e:
            assert isinstance(e, ElmoFastError)
        else:
            pytest.fail("no ConfigurationError")
    # the two model-options cases are errors of the model file too, as before
    with pytest.raises(ModelFileError, match="only biLMs with 'lstm.use_skip_connections': true"):
        cases[-1]()


# --- the empty sentence: (L + 1, 0, D), D the model's own width ------------------------------------------


@pytest.mark.parametrize("preset,width", [("tiny", 32), ("small", 256)])
def test_an_empty_sentence_keeps_the_models_width(random_models, preset, width):
    """allennlp 0.9 gave (3, 0, 1024) for every model; elmo-fast gives the model's own D."""
    emb = ElmoEmbedder(*random_models(preset))
    assert emb.embed_sentence([]).shape == (3, 0, width)
    out = emb.embed_batch([[], ["a", "b"], []])
    assert [a.shape for a in out] == [(3, 0, width), (3, 2, width), (3, 0, width)]
    assert all(a.dtype == np.float32 for a in out)
