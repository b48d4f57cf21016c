"""State dicts saved by other code, loaded into :class:`~elmo_fast.bilm.model.ElmoBiLm`'s stage
modules: allennlp's ``_ElmoBiLm`` (alone, inside ``Elmo``, or inside any model) and elmo-fast 0.1
(flat parameter lists). :func:`rename_legacy_keys` is the model's ``load_state_dict`` pre-hook."""

from __future__ import annotations

import re

_ALLENNLP_KEYS = [  # allennlp's _ElmoBiLm parameter names -> ours (relative to the biLM)
    (re.compile(r"_token_embedder\._char_embedding_weights$"), "token_embedder.char_cnn.char_embedding"),
    (re.compile(r"_token_embedder\.char_conv_(\d+)\.(weight|bias)$"), r"token_embedder.char_cnn.convs.\1.\2"),
    (
        re.compile(r"_token_embedder\._highways\._layers\.(\d+)\.(weight|bias)$"),
        r"token_embedder.highways.layers.\1.\2",
    ),
    (re.compile(r"_token_embedder\._projection\.(weight|bias)$"), r"token_embedder.projection.\1"),
    (re.compile(r"_elmo_lstm\.(forward|backward)_layer_(\d+)\.(\w+\.(?:weight|bias))$"), r"encoder.\1_layers.\2.\3"),
]
# derived from the weights (allennlp's vocab_to_cache tables), not weights of their own
_ALLENNLP_DERIVED = re.compile(r"(_word_embedding\.weight|_bos_embedding|_eos_embedding)$")
_V01_KEYS = [  # elmo-fast 0.1's flat parameter lists -> the stage modules
    (re.compile(r"char_embedding$"), "token_embedder.char_cnn.char_embedding"),
    (re.compile(r"conv_weights\.(\d+)$"), r"token_embedder.char_cnn.convs.\1.weight"),
    (re.compile(r"conv_biases\.(\d+)$"), r"token_embedder.char_cnn.convs.\1.bias"),
    (re.compile(r"highway_weights\.(\d+)$"), r"token_embedder.highways.layers.\1.weight"),
    (re.compile(r"highway_biases\.(\d+)$"), r"token_embedder.highways.layers.\1.bias"),
    (re.compile(r"proj_(weight|bias)$"), r"token_embedder.projection.\1"),
]
_V01_LSTM = ("input_linearity.weight", "state_linearity.weight", "state_linearity.bias", "state_projection.weight")


def rename_legacy_keys(state_dict: dict, prefix: str, *args) -> None:
    """Rename, in place, the keys under ``prefix`` that allennlp or elmo-fast 0.1 saved to the stage
    modules' names (and drop allennlp's vocab_to_cache tables, which are derived, not weights).
    Keys already in the stage modules' names are left as they are."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix) :]
        if _ALLENNLP_DERIVED.fullmatch(rest):
            del state_dict[key]
            continue
        new = None
        for pattern, repl in _ALLENNLP_KEYS + _V01_KEYS:
            if pattern.fullmatch(rest):
                new = pattern.sub(repl, rest)
                break
        m = re.fullmatch(r"lstm_params\.(\d+)", rest)
        if m:
            i = int(m.group(1))
            layer, direction, k = i // 8, i // 4 % 2, i % 4
            new = f"encoder.{('forward', 'backward')[direction]}_layers.{layer}.{_V01_LSTM[k]}"
        if new is not None and new != rest:
            state_dict[prefix + new] = state_dict.pop(key)
