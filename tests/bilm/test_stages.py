"""ElmoBiLm as a tree of stage modules: what it prints, how its stages pick a forward, and the state
dicts it loads (its own, elmo-fast 0.1's flat lists, allennlp's module names)."""

from __future__ import annotations

import pytest
import torch
from peers import allennlp_elmo
from tolerances import TOL, assert_close, max_abs_error

from elmo_fast import Elmo, ElmoBiLm, batch_to_ids
from elmo_fast.bilm import ops
from elmo_fast.bilm.stages import BiLstmEncoder, CharCNN, CharTokenEmbedder, Highway, Stage

needs_ext = pytest.mark.skipif(not ops.HAS_EXTENSION, reason="elmo_fast._C is not built")
SENTENCES = [["The", "bank", "is", "closed", "."], ["Swans", "swim"], ["a"]]


def test_print_names_every_stage(random_models):
    bilm = ElmoBiLm(*random_models("small"), backend="reference")
    text = str(bilm)
    for name in (
        "token_embedder",
        "CharTokenEmbedder",
        "char_cnn",
        "CharCNN",
        "highways",
        "Highway",
        "projection",
        "encoder",
        "BiLstmEncoder",
        "forward_layers",
        "backward_layers",
        "LstmLayer",
        "input_linearity",
        "state_linearity",
        "state_projection",
        "forward in time",
        "backward in time",
        "backend=reference",
    ):
        assert name in text, f"{name!r} missing from print(ElmoBiLm):\n{text}"
    # one Conv1d per filter width, the architecture's numbers spelled out
    o = bilm.options
    assert text.count("Conv1d(") == len(o.filters)
    assert f"Linear(in_features={o.n_filters}, out_features={2 * o.n_filters}, bias=True)" in text
    assert f"Linear(in_features={o.cell_dim}, out_features={o.projection_dim}, bias=False)" in text
    assert "ParameterList" not in text


def test_parameters_live_in_the_stages(random_models):
    bilm = ElmoBiLm(*random_models("tiny"))
    o = bilm.options
    names = dict(bilm.named_parameters())
    assert len(names) == 1 + 2 * len(o.filters) + 2 * o.n_highway + 2 + 2 * o.n_layers * 4
    assert all(n.startswith(("token_embedder.", "encoder.")) for n in names)
    # weights() views the same tensors, in the layouts the reference functions take
    w = bilm.weights()
    assert w.char_embedding is bilm.token_embedder.char_cnn.char_embedding
    assert w.lstm[1][1].w_proj is bilm.encoder.backward_layers[1].state_projection.weight


@needs_ext
def test_backend_reaches_every_stage(random_models):
    bilm = ElmoBiLm(*random_models("tiny"), backend="reference")
    stages = [m for m in bilm.modules() if isinstance(m, Stage)]
    assert {type(m) for m in stages} == {CharCNN, Highway, CharTokenEmbedder, BiLstmEncoder}
    assert all(m.backend == "reference" for m in stages)
    bilm.backend = "fast"
    assert all(m.backend == "fast" for m in stages)
    with pytest.raises(ValueError, match="unknown backend"):
        bilm.backend = "turbo"


@needs_ext
@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.slow
def test_each_stage_fast_equals_reference(random_models, preset):
    """Each stage's forward, under either backend, on fresh random inputs (awkward sizes)."""
    bilm = ElmoBiLm(*random_models(preset, exercise_clips=True), backend="fast")
    emb, enc = bilm.token_embedder, bilm.encoder
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 262, (13, 50), generator=g)
    ids[:, 9:] = 0  # short tokens: padding windows
    x = torch.randn(13, emb.char_cnn.output_dim, generator=g)
    with torch.no_grad():
        for stage, args in ((emb.char_cnn, (ids,)), (emb.highways, (x,)), (emb, (ids,))):
            assert_close(
                stage.forward_fast(*args), stage.forward_reference(*args), torch.float32, what=type(stage).__name__
            )
        B, T = 3, 7
        lengths = torch.tensor([7, 1, 4])
        vectors = torch.randn(11, bilm.options.projection_dim, generator=g)
        index = torch.randint(0, 11, (B, T), generator=g)
        xg0 = enc.layer0_gates(vectors)
        for got, want in zip(enc.forward_fast(xg0, index, lengths), enc.forward_reference(xg0, index, lengths)):
            assert_close(got, want, torch.float32, what="BiLstmEncoder")
        # one LstmLayer alone is lstm_layer_ref over its own input projection
        layer = enc.backward_layers[0]
        P, C = bilm.options.projection_dim, bilm.options.cell_dim
        y, h, c = layer(vectors[index], lengths, torch.zeros(B, P), torch.zeros(B, C), enc.cell_clip, enc.proj_clip)
        outputs, _, _ = enc.forward_reference(xg0, index, lengths)
        assert_close(y, outputs[0, :, :, P:], torch.float32, what="LstmLayer (backward, layer 0)")


def _v01_state_dict(bilm: ElmoBiLm) -> dict:
    """The state dict elmo-fast 0.1 wrote: flat ParameterLists on the biLM itself."""
    w = bilm.weights()
    sd = {"char_embedding": w.char_embedding, "proj_weight": w.proj_weight, "proj_bias": w.proj_bias}
    for name in ("conv_weights", "conv_biases", "highway_weights", "highway_biases"):
        sd.update({f"{name}.{k}": t for k, t in enumerate(getattr(w, name))})
    flat = [t for pair in w.lstm for d in pair for t in (d.w_ih, d.w_hh, d.bias, d.w_proj)]
    sd.update({f"lstm_params.{i}": t for i, t in enumerate(flat)})
    return {k: v.detach().clone() for k, v in sd.items()}


def _assert_same_weights(a: ElmoBiLm, b: ElmoBiLm) -> None:
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(ta, tb), na


def test_loads_elmo_fast_01_state_dicts(random_models):
    source = ElmoBiLm(*random_models("tiny", seed=1))
    target = ElmoBiLm(*random_models("tiny", seed=0))
    assert max_abs_error(source.weights().proj_weight, target.weights().proj_weight) > 0.01
    target.load_state_dict(_v01_state_dict(source))  # strict: every key placed, none left over
    _assert_same_weights(target, source)
    # inside Elmo, under its _elmo_lstm prefix, next to the scalar mixes
    elmo = Elmo(*random_models("tiny", seed=0), 1)
    sd = {f"_elmo_lstm.{k}": v for k, v in _v01_state_dict(source).items()}
    sd.update({k: v for k, v in elmo.state_dict().items() if k.startswith("scalar_mix")})
    elmo.load_state_dict(sd)
    _assert_same_weights(elmo._elmo_lstm, source)


def test_a_state_dict_round_trips(random_models):
    source = ElmoBiLm(*random_models("tiny", seed=1))
    target = ElmoBiLm(*random_models("tiny", seed=0))
    target.load_state_dict(source.state_dict())
    _assert_same_weights(target, source)


@pytest.mark.peers
@pytest.mark.slow
def test_loads_allennlp_state_dicts_and_gives_allennlp_outputs(random_models):
    """allennlp's own _ElmoBiLm (2.10.1) and Elmo: their state dicts load into ours (module names
    translated), and both compute the same activations."""
    allennlp = allennlp_elmo()
    files = random_models("tiny", exercise_clips=True, seed=1)
    theirs = allennlp._ElmoBiLm(str(files[0]), str(files[1]))
    ours = ElmoBiLm(*random_models("tiny", seed=0), backend="reference")
    ours.load_state_dict(theirs.state_dict())
    _assert_same_weights(ours, ElmoBiLm(*files, backend="reference"))
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        want = theirs(ids)  # its first batch starts from zero states, as ours always do
        for backend in ["reference", "fast"] if ops.HAS_EXTENSION else ["reference"]:
            ours.backend = backend
            got = ours(ids)
            assert torch.equal(got["mask"], want["mask"])
            for k, (a, b) in enumerate(zip(got["activations"], want["activations"])):
                assert_close(a, b, torch.float32, what=f"{backend} layer {k} vs allennlp")
    # a whole allennlp Elmo (biLM + scalar mixes) into ours
    their_elmo = allennlp.Elmo(str(files[0]), str(files[1]), 2, dropout=0.0)
    with torch.no_grad():
        their_elmo.scalar_mix_1.gamma.fill_(0.7)
        their_elmo.scalar_mix_1.scalar_parameters[2].fill_(1.5)
    our_elmo = Elmo(*random_models("tiny", seed=0), 2, dropout=0.0, backend="reference")
    our_elmo.load_state_dict(their_elmo.state_dict())
    with torch.no_grad():
        a = our_elmo(ids)["elmo_representations"][1]
        b = their_elmo(ids)["elmo_representations"][1]
    assert max_abs_error(a, b) <= TOL[torch.float32]["atol"]
