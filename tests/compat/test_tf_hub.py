"""TF-Hub google/elmo's signatures (HubElmo, hub_signature): outputs against the reference biLM and
bilm-tf's own outputs, padding conventions, tokenization, statelessness, input errors."""

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bilm_cases import _sentences, expected_top_layers
from tolerances import TOL, assert_close

from elmo_fast import (
    ElmoFastError,
    HubElmo,
    InputError,
    batch_to_ids,
    hub_module,
    hub_signature,
    load_options,
    load_weights,
)
from elmo_fast.bilm import ops
from elmo_fast.bilm.reference import bilm_ref, remove_sentence_boundaries, scalar_mix_ref
from elmo_fast.compat.tf_hub import split_on_spaces

FP32 = TOL[torch.float32]["atol"]
HAS_FAST = ops.HAS_EXTENSION and all(hasattr(ops, n) for n in ("char_cnn", "highway", "bilstm"))
BACKENDS = ["reference", pytest.param("fast", marks=pytest.mark.skipif(not HAS_FAST, reason="elmo_fast._C not built"))]
LAYERED = ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo")


def _randomize_mix(module: HubElmo, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Give the elmo mix uneven weights and gamma != 1, so that a wrong mix cannot pass."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(module.num_layers, generator=g)
    gamma = 0.5 + torch.rand(1, generator=g)
    with torch.no_grad():
        for p, v in zip(module.scalar_mix.scalar_parameters, w):
            p.fill_(float(v))
        module.scalar_mix.gamma.copy_(gamma)
    return w, gamma


def _oracle(files, sentences, width, w, gamma):
    """The five outputs by hand: bilm_ref on the same batch, boundaries removed, padded to width."""
    weights = load_weights(files[1], load_options(files[0]))
    P = weights.options.projection_dim
    acts, mask, _, _ = bilm_ref(batch_to_ids(sentences), weights)
    layers = [remove_sentence_boundaries(a, mask)[0] for a in acts]
    layers = [F.pad(x, (0, 0, 0, width - x.shape[1])) for x in layers]
    elmo = scalar_mix_ref(layers, w, gamma)
    default = torch.stack(
        [elmo[i, : len(s)].mean(dim=0) if s else torch.zeros(elmo.shape[-1]) for i, s in enumerate(sentences)]
    )
    return {
        "word_emb": layers[0][..., :P],
        "lstm_outputs1": layers[1],
        "lstm_outputs2": layers[2],
        "elmo": elmo,
        "default": default,
    }


def _check_padding(out, lengths):
    mask = torch.arange(out["elmo"].shape[1]).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    assert torch.equal(out["mask"].cpu(), mask)
    assert out["sequence_len"].tolist() == lengths
    for name in LAYERED:
        assert bool((out[name][~out["mask"]] == 0).all()), f"{name}: padding positions are not zero"


@pytest.mark.parametrize("backend", BACKENDS)
def test_tokens_signature_equals_the_reference(random_models, backend):
    files = random_models("tiny", exercise_clips=True, seed=3)
    rng = np.random.default_rng(11)
    sentences = _sentences(rng, 6, 1, 12)
    sentences[0] = ["x" * 60, "ü" * 30] + sentences[0]  # a cut token and a cut multibyte token
    sentences[1] = ["one"]
    sentences[2] = []
    width = max(len(s) for s in sentences) + 3  # wider than any sentence, as a fixed-size input would be
    junk = ["<S>", "</S>", "junk", "zzz"]
    tokens = [s + [junk[j % 4] for j in range(width - len(s))] for s in sentences]  # never to be read
    module = HubElmo(*files, backend=backend)
    w, gamma = _randomize_mix(module, seed=5)
    out = module.tokens(tokens, [len(s) for s in sentences])
    B, P = len(sentences), module.projection_dim
    shapes = {
        "word_emb": (B, width, P),
        "lstm_outputs1": (B, width, 2 * P),
        "lstm_outputs2": (B, width, 2 * P),
        "elmo": (B, width, 2 * P),
        "default": (B, 2 * P),
        "sequence_len": (B,),
        "mask": (B, width),
    }
    assert {k: tuple(v.shape) for k, v in out.items()} == shapes
    assert out["sequence_len"].dtype == torch.int64 and out["mask"].dtype == torch.bool
    assert all(out[k].dtype == torch.float32 for k in (*LAYERED, "default"))
    expected = _oracle(files, sentences, width, w, gamma)
    for name, value in expected.items():
        assert_close(out[name], value, dtype=torch.float32, what=f"{backend} {name}")
    _check_padding(out, [len(s) for s in sentences])
    assert bool((out["default"][2] == 0).all())  # the empty sentence: zeros, not NaN


def test_default_signature_splits_on_spaces_like_tf_hub():
    assert split_on_spaces("  the  cat sat ") == ["the", "cat", "sat"]
    assert split_on_spaces("") == [] and split_on_spaces("   ") == []
    assert split_on_spaces("tab\tinside new\nline") == ["tab\tinside", "new\nline"]  # only " " separates


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_default_signature_equals_tokens_signature(random_models, backend):
    files = random_models("tiny", seed=4)
    strings = ["  the cat  sat on the mat ", "", "one", "   ", "dogs are\tin the fog", "über 東京 , ."]
    module = HubElmo(*files, backend=backend)
    _randomize_mix(module, seed=6)
    by_string = module(strings)
    split = [split_on_spaces(s) for s in strings]
    width = max(map(len, split))
    assert by_string["elmo"].shape[1] == width
    padded = [s + [""] * (width - len(s)) for s in split]
    by_tokens = module.tokens(padded, [len(s) for s in split])
    as_numpy = module.tokens(np.array(padded, dtype=object), np.array([len(s) for s in split], dtype=np.int32))
    as_tensor = module.tokens(padded, torch.tensor([len(s) for s in split], dtype=torch.int32))
    for other in (by_tokens, as_numpy, as_tensor):
        assert other.keys() == by_string.keys()
        for name in by_string:
            assert torch.equal(other[name], by_string[name]), name
    _check_padding(by_string, [len(s) for s in split])
    assert torch.isfinite(by_string["default"]).all() and bool((by_string["default"][[1, 3]] == 0).all())
    # bytes, as tf.string tensors hold them, are read as UTF-8
    assert torch.equal(module([s.encode() for s in strings])["elmo"], by_string["elmo"])


def test_stateless_a_sentence_ignores_its_batch_mates(random_models):
    files = random_models("tiny", exercise_clips=True, seed=5)
    rng = np.random.default_rng(12)
    strings = [" ".join(s) for s in _sentences(rng, 7, 1, 15)]
    module = HubElmo(*files)
    _randomize_mix(module, seed=7)
    batch = module(strings)
    again = module(strings[::-1])  # another call, other rows: nothing carried over
    for i, s in enumerate(strings):
        alone = module([s])
        n = len(s.split())
        for name in LAYERED:
            assert_close(batch[name][i, :n], alone[name][0], what=f"sentence {i} {name} in a batch vs alone")
            assert_close(again[name][len(strings) - 1 - i, :n], alone[name][0], what=f"sentence {i} {name}, reversed")
        assert_close(batch["default"][i], alone["default"][0], what=f"sentence {i} default")


def test_empty_batches_and_empty_sentences(random_models):
    module = HubElmo(*random_models("tiny", seed=6))
    P = module.projection_dim
    for out, B, T in (
        (module([]), 0, 0),
        (module([""]), 1, 0),
        (module.tokens([["", "x", "y"]] * 2, [0, 0]), 2, 3),
        (module.tokens([], []), 0, 0),
    ):
        assert tuple(out["word_emb"].shape) == (B, T, P) and tuple(out["elmo"].shape) == (B, T, 2 * P)
        assert tuple(out["default"].shape) == (B, 2 * P) and out["sequence_len"].tolist() == [0] * B
        assert bool((out["default"] == 0).all()) and bool((out["elmo"] == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_golden_against_bilm_tf(bilm_tf_tiny, tiny_files, fixture_sentences, backend):
    # Only bilm-tf's first batch is comparable: it ran batch i = [sentences[0][i], sentences[1][i],
    # sentences[2][i]] in order with a stateful LSTM, so batch 0 alone started from zero states, as
    # every batch does here. The fixture has the top layer (lstm_outputs2) and the token layer.
    expected = expected_top_layers(bilm_tf_tiny)
    module = HubElmo(*tiny_files, backend=backend)
    out = module([fixture_sentences[k][0] for k in range(3)])
    for k in range(3):
        n = len(fixture_sentences[k][0].split())
        assert out["sequence_len"][k] == n
        got = out["lstm_outputs2"][k, :n].numpy()
        assert got.shape == expected[k][0].shape
        assert np.abs(got - expected[k][0]).max() <= FP32, f"sentence {k}: lstm_outputs2 vs bilm-tf"
    words = (bilm_tf_tiny / "vocab_test.txt").read_text().strip().split("\n")
    with h5py.File(bilm_tf_tiny / "elmo_token_embeddings.hdf5", "r") as f:
        token_embeddings = f["embedding"][...]
    out = module.tokens([[w] for w in words], [1] * len(words))  # each word alone: word_emb is context-free
    assert np.abs(out["word_emb"][:, 0].numpy() - token_embeddings).max() <= FP32


def test_elmo_mix_trainable_or_fixed(random_models):
    files = random_models("tiny", seed=7)
    module = HubElmo(*files)
    strings = ["the cat sat", "a dog"]
    out = module(strings)
    # the even mix with gamma 1 by default: the mean of the layers
    layers = [torch.cat([out["word_emb"]] * 2, dim=-1), out["lstm_outputs1"], out["lstm_outputs2"]]
    assert_close(out["elmo"], sum(layers) / 3, what="default mix")
    out["default"].sum().backward()
    mix = module.scalar_mix
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in [*mix.scalar_parameters, mix.gamma])
    assert all(p.grad is None and not p.requires_grad for p in module.elmo_bilm.parameters())

    fixed = HubElmo(*files, scalar_mix_parameters=[1.0, -0.5, 2.0])
    assert not any(p.requires_grad for p in fixed.parameters())
    got = fixed(strings)
    assert_close(got["elmo"], scalar_mix_ref(layers, torch.tensor([1.0, -0.5, 2.0]), torch.ones(1)), what="fixed mix")
    with pytest.raises(ElmoFastError, match="2 values, but this model has 3 layers"):
        HubElmo(*files, scalar_mix_parameters=[0.0, 1.0])


def test_hub_signature_mirrors_the_module_and_keeps_it(random_models):
    files = random_models("tiny", seed=8)
    strings = ["the cat sat on the mat", "dogs are in the fog"]
    first = hub_module(*files)
    assert hub_module(*files) is first  # loaded once
    assert hub_module(*files, backend="reference") is not first
    out = hub_signature(strings, *files)
    assert hub_module(*files) is first
    assert not out["elmo"].requires_grad  # a functional call, like TF-Hub's
    fresh = HubElmo(*files)(strings)
    for name in fresh:
        assert_close(out[name].float(), fresh[name].float(), what=name)
    tokens = [s.split() + [""] * (6 - len(s.split())) for s in strings]
    by_tokens = hub_signature({"tokens": tokens, "sequence_len": [6, 5]}, signature="tokens", module=first)
    assert torch.equal(by_tokens["elmo"], out["elmo"])
    with pytest.raises(ElmoFastError, match="unknown signature 'word_emb'"):
        hub_signature(strings, *files, signature="word_emb")
    with pytest.raises(ElmoFastError, match="needs options_file and weight_file"):
        hub_signature(strings)
    with pytest.raises(InputError, match="sequence_len"):
        hub_signature({"tokens": tokens}, signature="tokens", module=first)
    with pytest.raises(ElmoFastError, match="cannot read model file"):
        hub_module(files[0], str(files[1]) + ".missing")


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m: m("the cat sat"), r"single str; wrap it: \['the cat sat'\]"),
        (lambda m: m(["fine", 3]), r"strings\[1\]: expected a str, got int"),
        (lambda m: m([b"\xff"]), r"strings\[0\]: bytes that are not UTF-8"),
        (lambda m: m({"tokens": [["a"]], "sequence_len": [1]}), "list or tuple of str"),
        (lambda m: m.tokens([["a", "b"], ["c"]], [1, 1]), r"rectangular .*tokens\[1\] has 1"),
        (lambda m: m.tokens(["ab", "cd"], [1, 1]), r"tokens\[0\] must be a list of token strings"),
        (lambda m: m.tokens([["a"]], [2]), r"sequence_len\[0\] = 2 is outside \[0, 1\]"),
        (lambda m: m.tokens([["a"]], [-1]), r"sequence_len\[0\] = -1 is outside"),
        (lambda m: m.tokens([["a"]], [1, 1]), "2 values for 1 sentences"),
        (lambda m: m.tokens([["a"]], [1.0]), r"sequence_len\[0\] must be an int"),
        (lambda m: m.tokens([["a"]], torch.tensor([1.0])), "1-D integer tensor"),
        (lambda m: m.tokens([["a", None]], [2]), r"tokens\[0\]\[1\]: expected a str, got NoneType"),
    ],
)
def test_input_errors_name_the_problem(random_models, call, match):
    module = hub_module(*random_models("tiny", seed=9))
    with pytest.raises(InputError, match=match) as info:
        call(module)
    assert isinstance(info.value, ValueError)


def test_tokens_past_sequence_len_are_never_read(random_models):
    module = hub_module(*random_models("tiny", seed=9))
    clean = module.tokens([["a", "b", ""], ["c", "", ""]], [2, 1])
    dirty = module.tokens([["a", "b", None], ["c", 7, object()]], [2, 1])
    for name in clean:
        assert torch.equal(clean[name], dirty[name]), name


@pytest.mark.slow
def test_tf_hub_call_style_and_numpy_inputs(random_models):
    """`elmo(inputs, signature=..., as_dict=...)` as TF-Hub users write it, with numpy string arrays as
    they hold them (<U, S and object dtypes; tokens padded with ""); as_dict=False gives the output
    named "default", for either signature, as hub.Module.__call__ does."""
    files = random_models("tiny", seed=10)
    module = HubElmo(*files)
    _randomize_mix(module, seed=11)
    strings = ["the cat sat on the mat", "dogs", "über 東京 , ."]
    want = module(strings)
    split = [s.split() for s in strings]
    width = max(map(len, split))
    padded = [s + [""] * (width - len(s)) for s in split]
    lengths = np.array([len(s) for s in split], dtype=np.int32)
    calls = {
        "default, as_dict": lambda x: module(x, signature="default", as_dict=True),
        "no signature": lambda x: module(x, signature=None, as_dict=True),
        "hub_signature": lambda x: hub_signature(x, module=module, signature="default", as_dict=True),
    }
    inputs = {
        "list": strings,
        "<U": np.array(strings),
        "object": np.array(strings, dtype=object),
        "S": np.array([s.encode() for s in strings]),
    }
    for call_name, call in calls.items():
        for input_name, x in inputs.items():
            got = call(x)
            assert got.keys() == want.keys()
            for name in want:
                assert torch.equal(got[name], want[name]), f"{call_name}, {input_name}: {name}"
    tokens = {"list": padded, "<U": np.array(padded), "S": np.array([[t.encode() for t in r] for r in padded])}
    for input_name, t in tokens.items():
        for call in (
            lambda d: module(d, signature="tokens", as_dict=True),
            lambda d: hub_signature(d, module=module, signature="tokens"),
        ):
            got = call({"tokens": t, "sequence_len": lengths})
            for name in want:
                assert torch.equal(got[name], want[name]), f"tokens {input_name}: {name}"
        default = module({"tokens": t, "sequence_len": lengths}, signature="tokens", as_dict=False)
        assert torch.equal(default, want["default"])
    for default in (
        module(np.array(strings), signature="default", as_dict=False),
        hub_signature(strings, module=module, as_dict=False),
    ):
        assert isinstance(default, torch.Tensor) and torch.equal(default, want["default"])
    with pytest.raises(InputError, match=r"1-D array of sentences \[batch\], got shape \[3, 1\]"):
        module(np.array(strings)[:, None])
    with pytest.raises(InputError, match=r"\[batch, max_length\] strings, got an array of shape \[3\]"):
        module({"tokens": np.array(strings), "sequence_len": lengths}, signature="tokens")
    with pytest.raises(InputError, match='a dict of tokens and sequence_len is for signature="tokens"'):
        module({"tokens": padded, "sequence_len": lengths})
    with pytest.raises(InputError, match=r'the tokens signature takes \{"tokens": ..., "sequence_len": ...\}'):
        module(strings, signature="tokens")
    with pytest.raises(ElmoFastError, match="unknown signature 'elmo'"):
        module(strings, signature="elmo")
