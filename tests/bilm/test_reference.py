"""The reference biLM: bilm-tf golden outputs, allennlp's semantics, state modes."""

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bilm_cases import _sentences, expected_top_layers
from tolerances import TOL

from elmo_fast import ElmoBiLm, ElmoEmbedder, ElmoFastError, batch_to_ids, load_options, load_weights
from elmo_fast.bilm.reference import (
    add_sentence_boundaries,
    bilm_ref,
    bilstm_ref,
    char_cnn_ref,
    flat_lstm_weights,
    highway_ref,
    layer0_gates_ref,
    lstm_layer_ref,
    remove_sentence_boundaries,
)

FP32 = TOL[torch.float32]["atol"]


@pytest.mark.slow
def test_golden_lm_embeddings_stateful(bilm_tf_tiny, tiny_files, fixture_sentences):
    # bilm-tf ran batch i = [sentences[0][i], sentences[1][i], sentences[2][i]] for i = 0..9 in order,
    # each row carrying its LSTM state into the next batch (see the fixture's NOTICE).
    expected = expected_top_layers(bilm_tf_tiny)
    bilm = ElmoBiLm(*tiny_files, stateful=True, backend="reference")
    worst = 0.0
    for i in range(10):
        batch = [fixture_sentences[k][i].split() for k in range(3)]
        top, mask = bilm.embed(batch_to_ids(batch))
        assert mask.sum(dim=1).tolist() == [len(s) for s in batch]
        for k in range(3):
            got = top[k, 2, : len(batch[k])].numpy()
            assert got.shape == expected[k][i].shape
            worst = max(worst, float(np.abs(got - expected[k][i]).max()))
    assert worst <= FP32, f"max abs error vs bilm-tf {worst:.3g}"


@pytest.mark.slow
def test_golden_lm_embeddings_need_state(bilm_tf_tiny, tiny_files, fixture_sentences):
    """The fixture really exercises the carried state: stateless outputs differ after batch 0."""
    expected = expected_top_layers(bilm_tf_tiny)
    bilm = ElmoBiLm(*tiny_files, stateful=False, backend="reference")
    batch = [fixture_sentences[k][1].split() for k in range(3)]
    top, _ = bilm.embed(batch_to_ids(batch))
    assert np.abs(top[0, 2, : len(batch[0])].numpy() - expected[0][1]).max() > 1e-3


@pytest.mark.slow
def test_golden_token_embeddings(bilm_tf_tiny, tiny_files):
    words = (bilm_tf_tiny / "vocab_test.txt").read_text().strip().split("\n")
    with h5py.File(bilm_tf_tiny / "elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][...]
    assert len(words) == expected.shape[0]
    w = load_weights(tiny_files[1], load_options(tiny_files[0]))
    ids = batch_to_ids([words])[0]
    got = highway_ref(
        char_cnn_ref(ids, w.char_embedding, w.conv_weights, w.conv_biases, w.options.activation),
        w.highway_weights,
        w.highway_biases,
        w.proj_weight,
        w.proj_bias,
    )
    assert np.abs(got.numpy() - expected).max() <= FP32
    # the same vectors come out of layer 0 of the embedder, whatever the context
    emb = ElmoEmbedder(*tiny_files, backend="reference")
    layer0 = np.concatenate([emb.embed_sentence(words[i : i + 50])[0] for i in range(0, len(words), 50)])
    assert np.abs(layer0[:, :16] - expected).max() <= FP32
    assert np.abs(layer0[:, 16:] - expected).max() <= FP32


@pytest.mark.slow
def test_golden_through_embedder_stateful(bilm_tf_tiny, tiny_files, fixture_sentences):
    expected = expected_top_layers(bilm_tf_tiny)
    emb = ElmoEmbedder(*tiny_files, batch_size=3, stateful=True, backend="reference")
    order = [fixture_sentences[k][i].split() for i in range(10) for k in range(3)]
    for n, got in enumerate(emb.embed_sentences(order)):
        i, k = divmod(n, 3)
        assert np.abs(got[2] - expected[k][i]).max() <= FP32


# --- allennlp's stateful rules -------------------------------------------------------------------


@pytest.mark.slow
def test_stateful_rules_for_growing_and_shrinking_batches(random_models):
    """Row i starts from row i's last state; new rows from zero; unused rows keep their state."""
    options, weights = random_models("tiny", exercise_clips=True)
    w = load_weights(weights, load_options(options))
    bilm = ElmoBiLm(options, weights, stateful=True, backend="reference")
    rng = np.random.default_rng(0)
    L, P2, C2 = 2, 32, 128
    h = torch.zeros(L, 0, P2)
    c = torch.zeros(L, 0, C2)
    for size in [2, 4, 1, 3, 4, 2]:
        batch = _sentences(rng, size)
        ids = batch_to_ids(batch)
        grow = max(0, size - h.shape[1])
        h = torch.cat([h, torch.zeros(L, grow, P2)], 1)
        c = torch.cat([c, torch.zeros(L, grow, C2)], 1)
        acts, mask, h_new, c_new = bilm_ref(ids, w, h[:, :size], c[:, :size])
        h = torch.cat([h_new, h[:, size:]], 1)
        c = torch.cat([c_new, c[:, size:]], 1)
        out = bilm(ids)
        for a, b in zip(out["activations"], acts):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(bilm.get_states()[0], h, atol=0, rtol=0)
        torch.testing.assert_close(bilm.get_states()[1], c, atol=0, rtol=0)
    bilm.reset_states()
    assert bilm.get_states() is None


def test_states_can_be_saved_and_restored(random_models):
    """get_states/set_states carry a stateful run across models (what a resumed embed_file needs)."""
    files = random_models("tiny", exercise_clips=True)
    rng = np.random.default_rng(3)
    first, second = batch_to_ids(_sentences(rng, 3)), batch_to_ids(_sentences(rng, 2))
    a = ElmoBiLm(*files, stateful=True)
    assert a.get_states() is None
    a(first)
    saved = tuple(t.clone() for t in a.get_states())
    want = a(second)["activations"]
    b = ElmoBiLm(*files, stateful=True)
    b.set_states(saved)
    for x, y in zip(b(second)["activations"], want):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    with pytest.raises(ElmoFastError, match=r"states must be h \[2, rows, 32\]"):
        b.set_states((saved[0][:, :, :5], saved[1]))


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.slow
def test_stateless_vectors_do_not_depend_on_batching(random_models, backend):
    options, weights = random_models("tiny", exercise_clips=True)
    emb = ElmoEmbedder(options, weights, batch_size=4, backend=backend)
    rng = np.random.default_rng(1)
    sentences = _sentences(rng, 11, 1, 30)
    alone = [emb.embed_sentence(s) for s in sentences]
    for batch_size in (1, 3, 11):
        for got, want in zip(emb.embed_sentences(sentences, batch_size), alone):
            np.testing.assert_allclose(got, want, atol=FP32, rtol=0)
    shuffled = list(reversed(sentences))
    for got, want in zip(emb.embed_batch(shuffled), reversed(alone)):
        np.testing.assert_allclose(got, want, atol=FP32, rtol=0)


# --- the pieces against independent formulations ---------------------------------------------------


def test_lstm_layer_matches_torch_lstm_without_clips():
    """Without clips and with full-length rows, the layer is nn.LSTM(proj_size=P)."""
    torch.manual_seed(0)
    B, T, In, C, P = 3, 7, 5, 6, 4
    lstm = torch.nn.LSTM(In, C, proj_size=P, batch_first=True)
    x = torch.randn(B, T, In)
    h0, c0 = torch.randn(B, P), torch.randn(B, C)
    want, (hT, cT) = lstm(x, (h0[None], c0[None]))
    xg = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    got, h, c = lstm_layer_ref(
        xg, torch.full((B,), T), lstm.weight_hh_l0, lstm.weight_hr_l0, h0, c0, None, None, reverse=False
    )
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(h, hT[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(c, cT[0], atol=1e-6, rtol=0)
    # reverse: the same as running nn.LSTM over each row's own reversed tokens
    lengths = torch.tensor([7, 1, 4])
    got, h, c = lstm_layer_ref(xg, lengths, lstm.weight_hh_l0, lstm.weight_hr_l0, h0, c0, None, None, reverse=True)
    for b, n in enumerate(lengths.tolist()):
        want, (hT, cT) = lstm(x[b : b + 1, :n].flip(1), (h0[None, b : b + 1], c0[None, b : b + 1]))
        torch.testing.assert_close(got[b, :n], want[0].flip(0), atol=1e-6, rtol=0)
        assert torch.all(got[b, n:] == 0)
        torch.testing.assert_close(h[b], hT[0, 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(c[b], cT[0, 0], atol=1e-6, rtol=0)


def _allennlp_style_layer(x, lengths, w, cell_clip, proj_clip, go_forward):
    """allennlp's LstmCellWithProjection loop: rows sorted by length, the active prefix sliced each step."""
    B, T, _ = x.shape
    C = w.w_hh.shape[0] // 4
    P = w.w_proj.shape[0]
    out = x.new_zeros(B, T, P)
    h, c = x.new_zeros(B, P), x.new_zeros(B, C)
    cur = B - 1 if go_forward else 0
    for step in range(T):
        index = step if go_forward else T - step - 1
        if go_forward:
            while lengths[cur] <= index:
                cur -= 1
        else:
            while cur < B - 1 and lengths[cur + 1] > index:
                cur += 1
        pi = F.linear(x[: cur + 1, index], w.w_ih)
        ps = F.linear(h[: cur + 1], w.w_hh, w.bias)
        i = torch.sigmoid(pi[:, :C] + ps[:, :C])
        f = torch.sigmoid(pi[:, C : 2 * C] + ps[:, C : 2 * C])
        g = torch.tanh(pi[:, 2 * C : 3 * C] + ps[:, 2 * C : 3 * C])
        o = torch.sigmoid(pi[:, 3 * C :] + ps[:, 3 * C :])
        mem = (i * g + f * c[: cur + 1]).clamp(-cell_clip, cell_clip)
        hh = F.linear(o * torch.tanh(mem), w.w_proj).clamp(-proj_clip, proj_clip)
        c = c.clone()
        h = h.clone()
        c[: cur + 1] = mem
        h[: cur + 1] = hh
        out[: cur + 1, index] = hh
    return out, h, c


@pytest.mark.slow
def test_bilstm_matches_allennlp_loop_with_clips(random_models):
    options, weights = random_models("tiny", exercise_clips=True)
    w = load_weights(weights, load_options(options))
    torch.manual_seed(2)
    lengths = torch.tensor([9, 6, 6, 3, 1])  # sorted, as allennlp requires
    x = torch.randn(5, 9, 16) * 2
    x = x * (torch.arange(9)[None, :, None] < lengths[:, None, None])
    flat = flat_lstm_weights(w.lstm)
    # each position its own "distinct token"
    outputs, h, c = bilstm_ref(
        layer0_gates_ref(x.reshape(45, 16), flat), torch.arange(45).view(5, 9), lengths, flat, 3.0, 3.0
    )
    fwd_in, bwd_in = x, x
    for layer, (wf, wb) in enumerate(w.lstm):
        yf, hf, cf = _allennlp_style_layer(fwd_in, lengths.tolist(), wf, 3.0, 3.0, True)
        yb, hb, cb = _allennlp_style_layer(bwd_in, lengths.tolist(), wb, 3.0, 3.0, False)
        if layer:
            yf, yb = yf + fwd_in, yb + bwd_in
        torch.testing.assert_close(outputs[layer], torch.cat([yf, yb], -1), atol=FP32, rtol=0)
        torch.testing.assert_close(h[layer], torch.cat([hf, hb], -1), atol=FP32, rtol=0)
        torch.testing.assert_close(c[layer], torch.cat([cf, cb], -1), atol=FP32, rtol=0)
        fwd_in, bwd_in = yf, yb
    assert c.abs().max() == 3.0, "the cell clip was not exercised"


def test_char_cnn_ref_by_hand():
    """One filter of width 2 over a 3-character word, computed by hand."""
    emb = torch.zeros(262, 1)
    emb[1:, 0] = torch.arange(1, 262, dtype=torch.float32) / 100  # id k -> k / 100
    w = torch.tensor([[[1.0, -2.0]]])  # [1 filter, 1 dim, width 2]
    b = torch.tensor([0.5])
    ids = batch_to_ids([["ab"]])[0]  # [[259, 98, 99, 260, 261, ...]]
    x = emb[ids[0], 0]
    windows = x[:-1] * 1.0 - 2.0 * x[1:] + 0.5
    got = char_cnn_ref(ids, emb, [w], [b], "relu")
    assert got.shape == (1, 1)
    assert torch.isclose(got[0, 0], torch.relu(windows.max()))
    got_tanh = char_cnn_ref(ids, emb, [w], [b], "tanh")
    assert torch.isclose(got_tanh[0, 0], torch.tanh(windows.max()))


def test_highway_sign_convention(tiny_files):
    """Loaded weights give bilm-tf's highway: carry = sigmoid(x Wc + bc), out = carry*relu(x Wt + bt) + (1-carry)*x."""
    f = h5py.File(tiny_files[1], "r")
    wt, wc = f["CNN_high_0/W_transform"][...], f["CNN_high_0/W_carry"][...]
    bt, bc = f["CNN_high_0/b_transform"][...], f["CNN_high_0/b_carry"][...]
    w = load_weights(tiny_files[1], load_options(tiny_files[0]))
    x = torch.randn(6, 124)
    carry = torch.sigmoid(x @ torch.from_numpy(wc) + torch.from_numpy(bc))
    want = carry * torch.relu(x @ torch.from_numpy(wt) + torch.from_numpy(bt)) + (1 - carry) * x
    eye = torch.eye(124)
    got = highway_ref(x, w.highway_weights[:1], w.highway_biases[:1], eye, torch.zeros(124))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_sentence_boundaries_roundtrip():
    ids = batch_to_ids([["a", "b", "c"], [], ["d"]])
    with_b, mask = add_sentence_boundaries(ids)
    assert mask.sum(1).tolist() == [5, 2, 3]
    assert with_b[1, 1].tolist() == batch_to_ids([["</S>"]])[0, 0].tolist()
    assert with_b[2, 0].tolist() == batch_to_ids([["<S>"]])[0, 0].tolist()
    x = torch.randn(3, 5, 2)
    body, m = remove_sentence_boundaries(x, mask)
    assert m.sum(1).tolist() == [3, 0, 1]
    torch.testing.assert_close(body[0], x[0, 1:4])
    assert torch.all(body[1] == 0) and torch.all(body[2, 1:] == 0)


@pytest.mark.parametrize("exercise_clips", [False, True])
@pytest.mark.slow
def test_random_models_have_realistic_scales(random_models, exercise_clips):
    options, weights = random_models("small", exercise_clips=exercise_clips)
    emb = ElmoEmbedder(options, weights, backend="reference")
    rng = np.random.default_rng(3)
    out = np.concatenate([emb.embed_sentence(s) for s in _sentences(rng, 4, 8, 20)], axis=1)
    top_std = out[2].std()
    assert 0.3 <= top_std <= 1.5, top_std
    layer1_max = np.abs(out[1]).max()
    if exercise_clips:
        assert layer1_max == 3.0  # the projection clip is hit (layer 1 has no skip connection)
    else:
        assert layer1_max < 3.0
