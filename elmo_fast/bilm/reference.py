"""Reference biLM in plain PyTorch: the oracle every fast kernel is tested against.

One function per stage, fp32 inside, written to be obviously right rather than fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def highway_gate_ref(projected: Tensor, x: Tensor) -> Tensor:
    """One highway layer's gating, given its affine output.

    projected: [N, 2H], the layer's affine map of ``x``: ``[transform | gate]`` (the gate half is
               already ``-(x W_carry + b_carry)`` in allennlp's sign convention).
    x:         [N, H], the layer's input.
    returns    [N, H] = g * x + (1 - g) * relu(transform), with g = sigmoid(gate).
    """
    transform, gate = projected.chunk(2, dim=-1)
    g = torch.sigmoid(gate)
    return g * x + (1 - g) * F.relu(transform)


def char_cnn_ref(
    char_ids: Tensor,
    char_embedding: Tensor,
    conv_weights: list[Tensor],
    conv_biases: list[Tensor],
    activation: str = "relu",
) -> Tensor:
    """Character CNN: one token vector per row of character ids.

    char_ids:       [N, L] long, +1 shifted ids (0 = no character / no token); allennlp's L is 50.
    char_embedding: [V, D], row 0 zero (V = 262 for allennlp's ids).
    conv_weights:   K tensors [n_k, D, w_k]; conv_biases: K tensors [n_k].
    activation:     "relu" or "tanh", applied after the max over positions.
    returns         [N, sum n_k].
    """
    x = F.embedding(char_ids, char_embedding).transpose(1, 2)  # [N, D, L]
    act = torch.relu if activation == "relu" else torch.tanh
    # Each width slides over all L positions (no padding): L - w + 1 windows, max over them.
    return torch.cat([act(F.conv1d(x, w, b).amax(dim=-1)) for w, b in zip(conv_weights, conv_biases)], dim=-1)


def highway_ref(
    x: Tensor, highway_weights: list[Tensor], highway_biases: list[Tensor], proj_weight: Tensor, proj_bias: Tensor
) -> Tensor:
    """Highway stack, then the projection to the LSTM's input width.

    x:               [N, F] char CNN output.
    highway_weights: L tensors [2F, F] ([W_transform; -W_carry]); highway_biases: L tensors [2F].
    proj_weight:     [P, F]; proj_bias: [P].
    returns          [N, P].
    """
    for w, b in zip(highway_weights, highway_biases):
        x = highway_gate_ref(F.linear(x, w, b), x)
    return F.linear(x, proj_weight, proj_bias)


def word_char_tokens_ref(
    ids: Tensor,
    word_embedding: Tensor | None,
    char_embedding: Tensor | None,
    conv_weights: list[Tensor],
    conv_biases: list[Tensor],
    activation: str,
    highway_weights: list[Tensor],
    highway_biases: list[Tensor],
    proj_weight: Tensor,
    proj_bias: Tensor,
) -> Tensor:
    """ELMoForManyLangs' token embedder: [word embedding ; highways(char CNN)], projected.

    ids:             [N, W] long rows ``[word id] + [char ids]`` (+1 shifted, 0 = no token); the word
                     id is there when ``word_embedding`` is given, the char ids when ``char_embedding`` is.
    word_embedding:  [Vw, Dw] or None; char_embedding: [Vc, D] or None (then no convolutions or highways).
    conv_*, activation, highway_*: as :func:`char_cnn_ref` and :func:`highway_ref`.
    proj_weight:     [P, Dw + F]; proj_bias: [P].
    returns          [N, P].
    """
    parts = []
    if word_embedding is not None:
        parts.append(F.embedding(ids[:, 0], word_embedding))
        ids = ids[:, 1:]
    if char_embedding is not None:
        x = char_cnn_ref(ids, char_embedding, conv_weights, conv_biases, activation)
        for w, b in zip(highway_weights, highway_biases):
            x = highway_gate_ref(F.linear(x, w, b), x)
        parts.append(x)
    return F.linear(torch.cat(parts, dim=-1), proj_weight, proj_bias)


def token_vectors_ref(ids: Tensor, weights) -> Tensor:
    """Context-free token vectors [N, P] of rows of ids [N, W], for either kind of weights:
    :class:`~elmo_fast.formats.bilm_tf.ElmoWeights` (char CNN, highways, projection) or
    :class:`~elmo_fast.formats.manylangs_dir.ManyLangsWeights` (with word embeddings)."""
    if hasattr(weights, "word_embedding"):
        return word_char_tokens_ref(
            ids,
            weights.word_embedding,
            weights.char_embedding,
            weights.conv_weights,
            weights.conv_biases,
            weights.options.activation,
            weights.highway_weights,
            weights.highway_biases,
            weights.proj_weight,
            weights.proj_bias,
        )
    tokens = char_cnn_ref(
        ids, weights.char_embedding, weights.conv_weights, weights.conv_biases, weights.options.activation
    )
    return highway_ref(tokens, weights.highway_weights, weights.highway_biases, weights.proj_weight, weights.proj_bias)


def lstm_layer_ref(
    xg: Tensor,
    lengths: Tensor,
    w_hh: Tensor,
    w_proj: Tensor,
    h0: Tensor,
    c0: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    reverse: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """One direction of one projected LSTM layer (allennlp's ``LstmCellWithProjection``).

    xg:      [B, T, 4C] the input's share of the gates, x W_ih^T + bias, gates in order i, f, g, o;
             positions t >= lengths[b] are padding and never read.
    lengths: [B] long, each row's own length; a row's state stops changing after it.
    w_hh:    [4C, P]; w_proj: [P, C].
    h0, c0:  [B, P], [B, C] initial states.
    reverse: run from each row's own last token back to its first.
    returns  y [B, T, P] (zero at padding), h [B, P], c [B, C] (each row's state after its last step).
    """
    B, T, _ = xg.shape
    h, c = h0, c0
    # unbind once and stack at the end rather than index xg[:, t] and write y[:, t]: the same values,
    # but autograd then moves each step's gradient once instead of a whole [B, T, .] tensor per step
    xg_steps = xg.unbind(1)
    y: list[Tensor] = [xg.new_zeros(0)] * T
    for t in range(T - 1, -1, -1) if reverse else range(T):
        h, c, y[t] = lstm_step_ref(xg_steps[t], (t < lengths).unsqueeze(1), h, c, w_hh, w_proj, cell_clip, proj_clip)
    return (torch.stack(y, dim=1) if T else xg.new_zeros(B, 0, w_proj.shape[0])), h, c


def lstm_step_ref(
    xg_t: Tensor,
    active: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    w_proj: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One time step of :func:`lstm_layer_ref` (also the body of the ONNX graph's loop over time).

    xg_t:   [B, 4C] the input's share of the gates at this step, gates i, f, g, o.
    active: [B, 1] bool, whether the step is inside each row (padding leaves the state as it was).
    h, c:   [B, P], [B, C] the states before the step; w_hh [4C, P]; w_proj [P, C].
    returns h [B, P], c [B, C] after the step, and its output y [B, P] (zero where not active).
    """
    i, f, g, o = (xg_t + F.linear(h, w_hh)).chunk(4, dim=1)
    c_new = torch.sigmoid(i) * torch.tanh(g) + torch.sigmoid(f) * c
    if cell_clip:
        c_new = c_new.clamp(-cell_clip, cell_clip)
    h_new = F.linear(torch.sigmoid(o) * torch.tanh(c_new), w_proj)
    if proj_clip:
        h_new = h_new.clamp(-proj_clip, proj_clip)
    return (
        torch.where(active, h_new, h),
        torch.where(active, c_new, c),
        torch.where(active, h_new, torch.zeros_like(h_new)),
    )


def lstm_layer_pair_ref(
    xg: Tensor,
    lengths: Tensor,
    w_hh: Tensor,
    w_proj: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Both directions of one projected LSTM layer: :func:`lstm_layer_ref` per direction (twin of the
    ``lstm_layer`` op).

    xg:      [2, B, T, 4C] input gates x W_ih^T + bias, gates i, f, g, o; direction 0 runs forward in
             time, 1 from each row's own last token back to its first; t >= lengths[b] never read.
    lengths: [B] long in [0, T], any order.
    w_hh:    [2, 4C, P]; w_proj: [2, P, C].
    h0, c0:  [2, B, P], [2, B, C] initial states, or None for zeros.
    returns  y [2, B, T, P] (zero at padding), h [2, B, P], c [2, B, C] (each row's state after its
             last step; a row of length 0 keeps its initial state).
    """
    _, B, T, _ = xg.shape
    P, C = w_proj.shape[1:]
    if h0 is None:
        h0 = xg.new_zeros(2, B, P)
    if c0 is None:
        c0 = xg.new_zeros(2, B, C)
    ys, hs, cs = zip(
        *[
            lstm_layer_ref(xg[d], lengths, w_hh[d], w_proj[d], h0[d], c0[d], cell_clip, proj_clip, reverse=(d == 1))
            for d in range(2)
        ]
    )
    return torch.stack(ys), torch.stack(hs), torch.stack(cs)


def linear_ref(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [n, K] @ weight[N, K]^T + bias [N] -> [n, N]: ``F.linear`` (twin of ``ops.linear``)."""
    return F.linear(x, weight, bias)


def layer0_gates_ref(tokens: Tensor, weights: list[Tensor]) -> Tensor:
    """Layer 0's input projections of distinct tokens, both directions: context-free, so the fast
    path computes (and caches) them once per distinct token.

    tokens:  [U, P] token vectors (the highway + projection output).
    weights: the flat LSTM weight list of :func:`bilstm_ref`.
    returns  [U, 2, 4C]: tokens W_ih^T + bias for the forward (0) and backward (1) layer 0.
    """
    return torch.stack([F.linear(tokens, weights[4 * d], weights[4 * d + 2]) for d in range(2)], dim=1)


def bilstm_ref(
    xg0: Tensor,
    token_index: Tensor,
    lengths: Tensor,
    weights: list[Tensor],
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """ELMo's stacked biLSTM: forward and backward stacks kept apart, skip connections from layer 1.

    xg0:         [U, 2, 4C] layer 0's input projections of the distinct tokens
                 (:func:`layer0_gates_ref`).
    token_index: [B, T] long, the row of ``xg0`` at each position (ignored past a row's length).
    lengths:     [B] long, 0 <= lengths <= T.
    weights:     4 tensors per (layer, direction), layer-major, forward first:
                 weights[4 * (2 * l + d) + k], k = 0: w_ih [4C, P], 1: w_hh [4C, P], 2: bias [4C]
                 (forget-gate bias already +1), 3: w_proj [P, C]. Layer 0's w_ih and bias are
                 already folded into ``xg0``.
    h0, c0:      [L, B, 2P], [L, B, 2C] initial states ([forward | backward] on the last axis), or
                 None for zeros.
    returns      outputs [L, B, T, 2P] (zero at padding), final h [L, B, 2P], final c [L, B, 2C].
    """
    B = token_index.shape[0]
    P, C = weights[3].shape
    L = len(weights) // 8
    if h0 is None:
        h0 = xg0.new_zeros(L, B, 2 * P)
    if c0 is None:
        c0 = xg0.new_zeros(L, B, 2 * C)
    index = token_index.clamp(0, max(xg0.shape[0] - 1, 0)) if xg0.shape[0] else token_index

    def gates(layer: int, d: int, x: Tensor | None, w_ih: Tensor, bias: Tensor) -> tuple[Tensor, Tensor | None]:
        return (xg0[index, d] if layer == 0 else F.linear(x, w_ih, bias)), x

    return stacked_bilstm_ref([None, None], gates, lengths, weights, cell_clip, proj_clip, h0, c0)


def stacked_bilstm_ref(
    first_inputs: list,
    gates,
    lengths: Tensor,
    weights: list[Tensor],
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor,
    c0: Tensor,
    layer=None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The stack of :func:`bilstm_ref` and :func:`bilstm_train_ref`: the forward and backward stacks kept
    apart (each layer reads only its own direction's outputs), skip connections from layer 1.

    first_inputs: [forward, backward] layer 0's inputs, as ``gates`` takes them.
    gates:   ``gates(layer, d, x, w_ih, bias) -> (xg [B, T, 4C], x_skip)``: the input gates of the
             layer's input ``x`` (layer 0: ``first_inputs[d]``, later the previous layer's output in
             direction d) and what the skip connection adds (layers >= 1).
    h0, c0:  [L, B, 2P], [L, B, 2C].
    layer:   what runs one direction of one layer, :func:`lstm_layer_ref` (None) or a function of its
             signature (the ONNX export's loop over time, :mod:`elmo_fast.export.stateless_bilm`).
    returns  outputs [L, B, T, 2P] (zero at padding), h [L, B, 2P], c [L, B, 2C].
    """
    P, C = weights[3].shape
    run_layer = lstm_layer_ref if layer is None else layer
    inputs = list(first_inputs)
    outputs, hs, cs = [], [], []
    for index in range(len(weights) // 8):
        ys, h_layer, c_layer = [], [], []
        for d in range(2):
            w_ih, w_hh, bias, w_proj = weights[4 * (2 * index + d) : 4 * (2 * index + d) + 4]
            xg, x_skip = gates(index, d, inputs[d], w_ih, bias)
            y, h, c = run_layer(
                xg,
                lengths,
                w_hh,
                w_proj,
                h0[index, :, d * P : (d + 1) * P],
                c0[index, :, d * C : (d + 1) * C],
                cell_clip,
                proj_clip,
                reverse=(d == 1),
            )
            ys.append(y + x_skip if index > 0 else y)
            h_layer.append(h)
            c_layer.append(c)
        inputs = ys
        outputs.append(torch.cat(ys, dim=-1))
        hs.append(torch.cat(h_layer, dim=-1))
        cs.append(torch.cat(c_layer, dim=-1))
    return torch.stack(outputs), torch.stack(hs), torch.stack(cs)


def bilstm_train_ref(
    x: Tensor,
    lengths: Tensor,
    weights: list[Tensor],
    cell_clip: float | None,
    proj_clip: float | None,
    h0: Tensor | None = None,
    c0: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = True,
    masks: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """ELMo's stacked biLSTM as bilm-tf trains it: dropout on each layer's input (each direction its
    own mask), the skip connection of layers >= 1 adding the dropped input (bilm-tf wraps every cell in
    ``DropoutWrapper(ResidualWrapper(cell))``, so the residual sees the dropped input).

    x:       [B, T, P] layer 0's input at every position, or [2, B, T, P] one per direction.
    lengths: [B] long in [0, T].
    weights: 8L tensors as :func:`bilstm_ref` (layer 0's w_ih and bias used too).
    h0, c0:  [L, B, 2P], [L, B, 2C] or None (zeros).
    dropout, training: dropout probability, applied when training (fresh masks unless ``masks``).
    masks:   L tensors [2, B, T, P] multiplying each layer's input, used when training.
    returns  outputs [L, B, T, 2P] (zero at padding), h [L, B, 2P], c [L, B, 2C].
    """
    B = x.shape[-3]
    P, C = weights[3].shape
    L = len(weights) // 8
    if h0 is None:
        h0 = x.new_zeros(L, B, 2 * P)
    if c0 is None:
        c0 = x.new_zeros(L, B, 2 * C)
    inputs = [x, x] if x.dim() == 3 else list(x.unbind(0))

    def gates(layer: int, d: int, x: Tensor, w_ih: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        if training and masks is not None:
            x = x * masks[layer][d]
        elif training and dropout > 0:
            x = F.dropout(x, dropout)
        return F.linear(x, w_ih, bias), x  # the skip connection adds the dropped input, as bilm-tf

    return stacked_bilstm_ref(inputs, gates, lengths, weights, cell_clip, proj_clip, h0, c0)


def flat_lstm_weights(lstm: list) -> list[Tensor]:
    """Per-layer (forward, backward) :class:`~elmo_fast.formats.bilm_tf.LstmWeights` -> the flat list."""
    return [t for pair in lstm for w in pair for t in (w.w_ih, w.w_hh, w.bias, w.w_proj)]


def add_sentence_boundaries(char_ids: Tensor, bos=None, eos=None) -> tuple[Tensor, Tensor]:
    """Wrap every sentence in ``<S>`` ... ``</S>`` (as allennlp does, also for empty sentences).

    char_ids: [B, T, W]; a token slot is present when any of its ids is non-zero.
    bos, eos: the W ids of the boundary tokens; default allennlp's (W = 50).
    returns   ids [B, T + 2, W] and mask [B, T + 2] (bool).
    """
    from .char_ids import BOS_CHAR_IDS, EOS_CHAR_IDS

    B, T, W = char_ids.shape
    lengths = (char_ids > 0).any(dim=-1).sum(dim=1)
    out = char_ids.new_zeros(B, T + 2, W)
    out[:, 1:-1] = char_ids
    out[:, 0] = char_ids.new_tensor(BOS_CHAR_IDS if bos is None else bos)
    out[torch.arange(B), lengths + 1] = char_ids.new_tensor(EOS_CHAR_IDS if eos is None else eos)
    return out, (out > 0).any(dim=-1)


def remove_sentence_boundaries(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Drop ``<S>``/``</S>``: x [B, T + 2, ...], mask [B, T + 2] -> x [B, T, ...], mask [B, T]."""
    lengths = mask.sum(dim=1) - 2
    T = x.shape[1] - 2
    new_mask = torch.arange(T, device=mask.device).unsqueeze(0) < lengths.unsqueeze(1)
    body = x[:, 1:-1]
    return body * new_mask.view(*new_mask.shape, *([1] * (x.dim() - 2))).to(x.dtype), new_mask


def bilm_ref(
    char_ids: Tensor, weights, h0: Tensor | None = None, c0: Tensor | None = None, bos=None, eos=None
) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
    """The whole biLM (allennlp's ``_ElmoBiLm``), boundaries included in what it returns.

    char_ids: [B, T, 50] from :func:`~elmo_fast.batch_to_ids` (or [B, T, W] rows of another front
              end, with its boundary rows ``bos`` and ``eos``).
    weights:  :class:`~elmo_fast.formats.bilm_tf.ElmoWeights` (or
              :class:`~elmo_fast.formats.manylangs_dir.ManyLangsWeights`: see :func:`token_vectors_ref`).
    h0, c0:   [L, B, 2P], [L, B, 2C] initial LSTM states, or None for zeros.
    returns   activations: L + 1 tensors [B, T + 2, 2P] (layer 0 is the token vector twice),
              mask [B, T + 2], final h [L, B, 2P], final c [L, B, 2C].
    """
    o = weights.options
    ids, mask = add_sentence_boundaries(char_ids, bos, eos)
    B, T2, W = ids.shape
    tokens = token_vectors_ref(ids.reshape(B * T2, W), weights).view(B, T2, weights.proj_weight.shape[0])
    tokens = tokens * mask.unsqueeze(-1).to(tokens.dtype)
    lstm = flat_lstm_weights(weights.lstm)
    token_index = torch.arange(B * T2, device=ids.device).view(B, T2)
    outputs, h, c = bilstm_ref(
        layer0_gates_ref(tokens.view(B * T2, tokens.shape[-1]), lstm),
        token_index,
        mask.sum(dim=1),
        lstm,
        o.cell_clip,
        o.proj_clip,
        h0,
        c0,
    )
    return [torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], mask, h, c


#: allennlp's ``util.tiny_value_of_dtype(torch.float)``: the variance epsilon of the scalar mix's layer norm
LAYER_NORM_EPS = 1e-13


def scalar_mix_ref(
    layers: list[Tensor], weights: Tensor, gamma: Tensor, mask: Tensor | None = None, do_layer_norm: bool = False
) -> Tensor:
    """allennlp's ``ScalarMix``: ``gamma * sum_k softmax(weights)_k * norm(layers[k])``.

    layers:  K tensors [..., D] of one shape (e.g. [B, T, D]).
    weights: [K] unnormalised scalar weights; gamma: [1] (or a scalar).
    mask:    [...] (e.g. [B, T]), required with do_layer_norm: each layer is normalised with one mean
             and one variance over all its unmasked elements (all positions and features of the
             batch together, not per token), eps 1e-13 as allennlp.
    returns  [..., D].
    """
    if len(layers) != weights.numel():
        raise ValueError(f"scalar mix: {len(layers)} layers given, but {weights.numel()} scalar weights")
    s = torch.softmax(weights.reshape(-1), dim=0)
    if do_layer_norm:
        if mask is None:
            raise ValueError("scalar mix: do_layer_norm needs the mask")
        m = mask.to(layers[0].dtype).unsqueeze(-1)
        n = m.sum() * layers[0].shape[-1]

        def norm(x: Tensor) -> Tensor:
            mean = (x * m).sum() / n
            variance = (((x * m - mean) * m) ** 2).sum() / n
            return (x - mean) / torch.sqrt(variance + LAYER_NORM_EPS)

        layers = [norm(x) for x in layers]
    return gamma.reshape(()) * sum(s[k] * x for k, x in enumerate(layers))
