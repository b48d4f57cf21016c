"""The biLM's stages as modules: each holds its weights and has two forwards, the fused ops
(``forward_fast``, :mod:`elmo_fast.bilm.ops`) and the plain-PyTorch twin (``forward_reference``,
:mod:`elmo_fast.bilm.reference`), chosen the same way in every stage by its ``backend``.

    CharTokenEmbedder                      token -> context-free vector [P] (bilm-tf, allennlp)
        CharCNN      char ids [N, 50] -> [N, F]     char embedding + convolutions, max over windows
        Highway      [N, F] -> [N, F]               n_highway gated layers
        projection   [N, F] -> [N, P]               nn.Linear
    WordCharTokenEmbedder                  token -> context-free vector [P] (ELMoForManyLangs)
        word_embedding, CharCNN, Highway, projection over [word embedding ; highway output]
    BiLstmEncoder                          vectors in context: forward and backward stacks
        forward_layers[l], backward_layers[l]: LstmLayer (input, recurrent and projection weights)

Weights keep the layouts :class:`~elmo_fast.formats.bilm_tf.ElmoWeights` describes (allennlp's),
and the parameter names follow allennlp's where it has modules for them (``input_linearity``,
``state_linearity``, ``state_projection``). Modules are built on the meta device and the loaded
tensors assigned, so building never spends time on a random initialisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ElmoFastError
from . import ops, reference

BACKENDS = ("fast", "reference")


class Stage(nn.Module):
    """A module with a fused and a reference forward; ``backend`` picks one for ``forward``.

    :class:`~elmo_fast.bilm.model.ElmoBiLm` sets the backend of all its stages at once."""

    backend: str = "reference"

    def forward(self, *args, **kwargs):
        if self.backend == "fast":
            return self.forward_fast(*args, **kwargs)
        return self.forward_reference(*args, **kwargs)

    def forward_fast(self, *args, **kwargs):
        raise NotImplementedError

    def forward_reference(self, *args, **kwargs):
        raise NotImplementedError


def _param(t: Tensor, requires_grad: bool) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=requires_grad)


def _linear(weight: Tensor, bias: Tensor | None, requires_grad: bool) -> nn.Linear:
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    layer.weight = _param(weight, requires_grad)
    if bias is not None:
        layer.bias = _param(bias, requires_grad)
    return layer


class CharCNN(Stage):
    """Character embedding, one convolution per filter width, max over windows, activation.

    forward(char_ids [N, 50] long) -> [N, sum n_k]; see :func:`~elmo_fast.bilm.reference.char_cnn_ref`.
    """

    def __init__(
        self,
        char_embedding: Tensor,
        conv_weights: Sequence[Tensor],
        conv_biases: Sequence[Tensor],
        activation: str = "relu",
        requires_grad: bool = False,
    ) -> None:
        super().__init__()
        self.activation = activation
        #: [V, D], row 0 zero (the id of "no character")
        self.char_embedding = _param(char_embedding, requires_grad)
        self.convs = nn.ModuleList()
        for w, b in zip(conv_weights, conv_biases):
            conv = nn.Conv1d(w.shape[1], w.shape[0], w.shape[2], device="meta")
            conv.weight, conv.bias = _param(w, requires_grad), _param(b, requires_grad)
            self.convs.append(conv)

    @property
    def output_dim(self) -> int:
        return sum(conv.out_channels for conv in self.convs)

    def conv_weights(self) -> list[Tensor]:
        return [conv.weight for conv in self.convs]

    def conv_biases(self) -> list[Tensor]:
        return [conv.bias for conv in self.convs]

    def extra_repr(self) -> str:
        V, D = self.char_embedding.shape
        return f"characters={V}, char_dim={D}, filters={self.output_dim}, max over windows, {self.activation}"

    def forward_fast(self, char_ids: Tensor) -> Tensor:
        return ops.char_cnn(char_ids, self.char_embedding, self.conv_weights(), self.conv_biases(), self.activation)

    def forward_reference(self, char_ids: Tensor) -> Tensor:
        return reference.char_cnn_ref(
            char_ids, self.char_embedding, self.conv_weights(), self.conv_biases(), self.activation
        )


class Highway(Stage):
    """``n_highway`` layers ``g * x + (1 - g) * relu(transform)``, each one ``nn.Linear(F, 2F)``
    giving ``[transform | gate]`` (the gate half already negated, allennlp's sign convention).

    forward(x [N, F]) -> [N, F]."""

    def __init__(self, weights: Sequence[Tensor], biases: Sequence[Tensor], requires_grad: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_linear(w, b, requires_grad) for w, b in zip(weights, biases))

    def weights(self) -> list[Tensor]:
        return [layer.weight for layer in self.layers]

    def biases(self) -> list[Tensor]:
        return [layer.bias for layer in self.layers]

    def forward_fast(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = ops.highway_gate(F.linear(x, layer.weight, layer.bias), x)
        return x

    def forward_reference(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = reference.highway_gate_ref(F.linear(x, layer.weight, layer.bias), x)
        return x


class CharTokenEmbedder(Stage):
    """A token's context-free vector from its characters: char CNN, highways, projection.

    forward(char_ids [N, 50]) -> [N, P]. The fast forward runs the highways and the projection as
    one op (:func:`~elmo_fast.bilm.ops.highway`); ``lowp`` (low-precision copies of the highway and
    projection weights, :meth:`lowp_weights`, kept by :mod:`~elmo_fast.bilm.derived_weights`) runs
    their GEMMs in that dtype.
    """

    def __init__(self, char_cnn: CharCNN, highways: Highway, projection: nn.Linear) -> None:
        super().__init__()
        self.char_cnn = char_cnn
        self.highways = highways
        self.projection = projection

    @property
    def output_dim(self) -> int:
        return self.projection.out_features

    def forward_fast(self, char_ids: Tensor, lowp: dict | None = None) -> Tensor:
        return self.project_fast(self.char_cnn.forward_fast(char_ids), lowp)

    def char_features_fast(self, char_ids: Tensor) -> Tensor:
        """The char CNN's output [N, F]."""
        return self.char_cnn.forward_fast(char_ids)

    def lowp_weights(self, dtype: torch.dtype) -> dict:
        """``dtype`` (bf16, fp16) copies of the GEMM weights :meth:`project_fast` reads with ``lowp``."""
        return {
            "highway_weights": [p.detach().to(dtype) for p in self.highways.weights()],
            "highway_biases": [p.detach().to(dtype) for p in self.highways.biases()],
            "proj_weight": self.projection.weight.detach().to(dtype),
            "proj_bias": self.projection.bias.detach().to(dtype),
        }

    def project_fast(
        self, cnn: Tensor, lowp: dict | None = None, ids: Tensor | None = None, gemv_max_rows: int | None = None
    ) -> Tensor:
        """The highways and the projection of char CNN outputs [N, F] -> [N, P], as one op
        (``ids`` unused: the signature of every token embedder's second half; ``gemv_max_rows``: the
        op's, measured by :mod:`~elmo_fast.tuning.calibration`)."""
        if lowp is not None:
            return ops.highway(
                cnn.to(lowp["proj_weight"].dtype),
                lowp["highway_weights"],
                lowp["highway_biases"],
                lowp["proj_weight"],
                lowp["proj_bias"],
            ).float()
        return ops.highway(
            cnn,
            self.highways.weights(),
            self.highways.biases(),
            self.projection.weight,
            self.projection.bias,
            gemv_max_rows,
        )

    def forward_reference(self, char_ids: Tensor) -> Tensor:
        return reference.highway_ref(
            self.char_cnn.forward_reference(char_ids),
            self.highways.weights(),
            self.highways.biases(),
            self.projection.weight,
            self.projection.bias,
        )


class WordCharTokenEmbedder(Stage):
    """ELMoForManyLangs' token embedder (its ``ConvTokenEmbedder``): a token's word embedding and
    its char CNN + highway vector, concatenated, then projected.

    forward(ids [N, W]) -> [N, P], a row being ``[word id] + [char ids]``
    (:class:`~elmo_fast.bilm.word_char_ids.ManyLangsIds`; each part present when the model has
    it). ``word_embedding`` [Vw, Dw] or None; ``char_cnn`` and ``highways`` None for a model
    without characters. The highways follow allennlp's convention as they are stored (no sign to
    flip); the projection reads ``[word embedding ; highway output]``.
    """

    def __init__(
        self,
        word_embedding: Tensor | None,
        char_cnn: CharCNN | None,
        highways: Highway | None,
        projection: nn.Linear,
        requires_grad: bool = False,
    ) -> None:
        super().__init__()
        #: [Vw, Dw], row 0 zero (no token); None without word embeddings
        self.word_embedding = None if word_embedding is None else _param(word_embedding, requires_grad)
        self.char_cnn = char_cnn
        self.highways = highways
        self.projection = projection

    @property
    def output_dim(self) -> int:
        return self.projection.out_features

    def extra_repr(self) -> str:
        if self.word_embedding is None:
            return "words=None"
        V, D = self.word_embedding.shape
        return f"words={V}, word_dim={D}, projection over [word embedding ; highway output]"

    def char_features_fast(self, ids: Tensor) -> Tensor | None:
        """The char CNN's output [N, F] (None without characters)."""
        if self.char_cnn is None:
            return None
        return self.char_cnn.forward_fast(ids[:, 0 if self.word_embedding is None else 1 :])

    def project_fast(
        self, cnn: Tensor | None, lowp: dict | None = None, ids: Tensor | None = None, gemv_max_rows: int | None = None
    ) -> Tensor:
        """Highways over the char CNN output, the word embedding of ``ids``, the projection: [N, P].
        ``lowp`` (low-precision copies from :meth:`lowp_weights`) runs the GEMMs in their dtype
        (``gemv_max_rows`` unused: its GEMMs are ATen's)."""
        parts = []
        if self.word_embedding is not None:
            parts.append(self.word_embedding[ids[:, 0]])
        low = None if lowp is None else lowp["proj_weight"].dtype
        if cnn is not None:
            weights = self.highways.weights() if lowp is None else lowp["highway_weights"]
            biases = self.highways.biases() if lowp is None else lowp["highway_biases"]
            x = cnn if lowp is None else cnn.to(low)
            for w, b in zip(weights, biases):
                x = ops.highway_gate(F.linear(x, w, b), x)
            parts.append(x)
        if lowp is None:
            return F.linear(torch.cat(parts, dim=-1), self.projection.weight, self.projection.bias)
        x = torch.cat([p.to(low) for p in parts], dim=-1)
        return F.linear(x, lowp["proj_weight"], lowp["proj_bias"]).float()

    def lowp_weights(self, dtype: torch.dtype) -> dict:
        """``dtype`` (bf16, fp16) copies of the GEMM weights :meth:`project_fast` reads with ``lowp``."""
        hw = self.highways
        return {
            "highway_weights": [] if hw is None else [p.detach().to(dtype) for p in hw.weights()],
            "highway_biases": [] if hw is None else [p.detach().to(dtype) for p in hw.biases()],
            "proj_weight": self.projection.weight.detach().to(dtype),
            "proj_bias": self.projection.bias.detach().to(dtype),
        }

    def forward_fast(self, ids: Tensor, lowp: dict | None = None) -> Tensor:
        return self.project_fast(self.char_features_fast(ids), lowp, ids)

    def forward_reference(self, ids: Tensor) -> Tensor:
        cnn = self.char_cnn
        return reference.word_char_tokens_ref(
            ids,
            self.word_embedding,
            None if cnn is None else cnn.char_embedding,
            [] if cnn is None else cnn.conv_weights(),
            [] if cnn is None else cnn.conv_biases(),
            "relu" if cnn is None else cnn.activation,
            [] if cnn is None else self.highways.weights(),
            [] if cnn is None else self.highways.biases(),
            self.projection.weight,
            self.projection.bias,
        )


class LstmLayer(nn.Module):
    """One direction of one projected LSTM layer (allennlp's ``LstmCellWithProjection``), gates
    i, f, g, o: ``input_linearity`` [4C, In] (no bias), ``state_linearity`` [4C, P] with the bias
    (forget gate +1 folded in), ``state_projection`` [P, C]."""

    def __init__(
        self, w_ih: Tensor, w_hh: Tensor, bias: Tensor, w_proj: Tensor, reverse: bool, requires_grad: bool = False
    ) -> None:
        super().__init__()
        self.reverse = reverse
        self.input_linearity = _linear(w_ih, None, requires_grad)
        self.state_linearity = _linear(w_hh, bias, requires_grad)
        self.state_projection = _linear(w_proj, None, requires_grad)

    @property
    def cell_dim(self) -> int:
        return self.state_projection.in_features

    def flat(self) -> list[Tensor]:
        """w_ih, w_hh, bias, w_proj: this layer's share of the flat list the bilstm op takes."""
        return [
            self.input_linearity.weight,
            self.state_linearity.weight,
            self.state_linearity.bias,
            self.state_projection.weight,
        ]

    def extra_repr(self) -> str:
        return "backward in time" if self.reverse else "forward in time"

    def forward(
        self, x: Tensor, lengths: Tensor, h0: Tensor, c0: Tensor, cell_clip: float | None, proj_clip: float | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, In] -> y [B, T, P], h [B, P], c [B, C] (reference only: the fast op runs the
        whole stack, :class:`BiLstmEncoder`)."""
        xg = F.linear(x, self.input_linearity.weight, self.state_linearity.bias)
        return reference.lstm_layer_ref(
            xg,
            lengths,
            self.state_linearity.weight,
            self.state_projection.weight,
            h0,
            c0,
            cell_clip,
            proj_clip,
            self.reverse,
        )


class BiLstmEncoder(Stage):
    """ELMo's stacked biLSTM: a forward and a backward stack that never read each other, skip
    connections from layer 1, cell and projection clips.

    forward(xg0 [U, 2, 4C], token_index [B, T], lengths [B], h0, c0) -> outputs [L, B, T, 2P],
    h [L, B, 2P], c [L, B, 2C]; ``xg0`` holds layer 0's input gates of distinct tokens
    (:meth:`layer0_gates`). See :func:`~elmo_fast.bilm.reference.bilstm_ref`.

    It also holds the states a stateful biLM carries from batch to batch, as allennlp's
    ``ElmoLstm`` does (``reset_states``, with allennlp's optional mask); ``ElmoBiLm(stateful=True)``
    reads and updates them.
    """

    def __init__(
        self,
        forward_layers: Sequence[LstmLayer],
        backward_layers: Sequence[LstmLayer],
        cell_clip: float | None,
        proj_clip: float | None,
    ) -> None:
        super().__init__()
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.forward_layers = nn.ModuleList(forward_layers)
        self.backward_layers = nn.ModuleList(backward_layers)
        self._states: tuple[Tensor, Tensor] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.forward_layers)

    # ---- the states carried across batches (stateful mode) ------------------------------------------

    def reset_states(self, mask: Tensor | None = None) -> None:
        """Forget the carried states: all of them, or (allennlp's ``reset_states(mask)``) those of
        the rows where ``mask`` [rows] (bool, one entry per carried row) is True."""
        if mask is None or self._states is None:
            self._states = None
            return
        rows = self._states[0].shape[1]
        if mask.dim() != 1 or mask.shape[0] != rows:
            raise ElmoFastError(
                f"reset_states: mask must have one entry per carried row, [{rows}], got {list(mask.shape)}"
            )
        keep = (~mask.to(device=self._states[0].device, dtype=torch.bool)).view(1, rows, 1)
        self._states = tuple(s * keep.to(s.dtype) for s in self._states)  # type: ignore[assignment]

    def get_states(self) -> tuple[Tensor, Tensor] | None:
        """h [L, rows, 2P] and c [L, rows, 2C], rows being the largest batch seen; None before the first."""
        return self._states

    def set_states(self, states: tuple[Tensor, Tensor] | None) -> None:
        """Carry these states (as :meth:`get_states` returned them) into the next batch."""
        if states is None:
            self._states = None
            return
        h, c = states
        first = self.forward_layers[0].state_projection
        L, P2, C2 = self.num_layers, 2 * first.out_features, 2 * first.in_features
        if (
            h.dim() != 3
            or c.dim() != 3
            or (h.shape[0], h.shape[2]) != (L, P2)
            or (c.shape[0], c.shape[2]) != (L, C2)
            or h.shape[1] != c.shape[1]
        ):
            raise ElmoFastError(
                f"states must be h [{L}, rows, {P2}] and c [{L}, rows, {C2}], got h {list(h.shape)} "
                f"and c {list(c.shape)}"
            )
        device = first.weight.device
        self._states = (h.detach().to(device), c.detach().to(device))

    def initial_states(self, batch_size: int) -> tuple[Tensor | None, Tensor | None]:
        """The carried states of the first ``batch_size`` rows (None, None before the first batch);
        rows past the ones carried start from zero, and keep their slot from now on."""
        if self._states is None:
            return None, None
        h, c = self._states
        if batch_size > h.shape[1]:
            grow = batch_size - h.shape[1]
            h = torch.cat([h, h.new_zeros(h.shape[0], grow, h.shape[2])], dim=1)
            c = torch.cat([c, c.new_zeros(c.shape[0], grow, c.shape[2])], dim=1)
            self._states = (h, c)
        return h[:, :batch_size], c[:, :batch_size]

    def update_states(self, h: Tensor, c: Tensor) -> None:
        """Carry a batch's final states [L, B, ...]; rows past B (a smaller batch) keep theirs."""
        B = h.shape[1]
        if self._states is None or self._states[0].shape[1] == B:
            self._states = (h.detach(), c.detach())
        else:
            old_h, old_c = self._states
            self._states = (torch.cat([h.detach(), old_h[:, B:]], dim=1), torch.cat([c.detach(), old_c[:, B:]], dim=1))

    def extra_repr(self) -> str:
        return f"cell_clip={self.cell_clip}, proj_clip={self.proj_clip}, skip connections from layer 1"

    def flat_weights(self) -> list[Tensor]:
        """The flat weight list of :func:`~elmo_fast.bilm.reference.bilstm_ref` (layer-major, forward first)."""
        return [t for f, b in zip(self.forward_layers, self.backward_layers) for layer in (f, b) for t in layer.flat()]

    def layer0_gates(self, vectors: Tensor) -> Tensor:
        """[U, P] token vectors -> [U, 2, 4C] layer 0's input gates, both directions (context-free,
        so computed once per distinct token; fp32 in every mode)."""
        return reference.layer0_gates_ref(vectors, self.flat_weights())

    def layer0_gates_fast(self, vectors: Tensor, gemv_max_rows: int | None = None) -> Tensor:
        """:meth:`layer0_gates` through :func:`~elmo_fast.bilm.ops.layer0_gates` (the same values to
        float32 rounding; up to ``gemv_max_rows`` rows read the weights once on the CPU)."""
        return ops.layer0_gates(vectors, self.flat_weights(), gemv_max_rows)

    def input_masks(self, x: Tensor, dropout: float) -> list[Tensor] | None:
        """Fresh dropout masks for every layer's input: L tensors [2, B, T, P], one per direction,
        elements 0 or 1 / keep_prob (bilm-tf's placement: see
        :func:`~elmo_fast.bilm.reference.bilstm_train_ref`); None when ``dropout`` is 0."""
        if dropout <= 0.0:
            return None
        keep = 1.0 - dropout
        B, T, P = x.shape[-3:]
        return [
            torch.empty(2, B, T, P, dtype=x.dtype, device=x.device).bernoulli_(keep).div_(keep)
            for _ in range(self.num_layers)
        ]

    def forward_sequence(
        self,
        x: Tensor,
        lengths: Tensor,
        h0: Tensor | None = None,
        c0: Tensor | None = None,
        masks: list[Tensor] | None = None,
        tuning: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The stack over per-position inputs, for training: x [B, T, P] read by both directions, or
        [2, B, T, P] one per direction (bilm-tf's unrolled scheme reads two streams); ``masks`` from
        :meth:`input_masks`. Layer 0's input gates are computed per position, gradients reach every
        weight (fast: :func:`~elmo_fast.bilm.ops.bilstm_train`, whose recurrence backpropagates in
        C++; ``tuning``: its, see :func:`~elmo_fast.bilm.ops.bilstm`). Returns outputs [L, B, T, 2P],
        h [L, B, 2P], c [L, B, 2C]."""
        if self.backend == "fast":
            return ops.bilstm_train(
                x,
                lengths,
                self.flat_weights(),
                self.cell_clip,
                self.proj_clip,
                h0,
                c0,
                training=masks is not None,
                masks=masks,
                tuning=tuning,
            )
        return reference.bilstm_train_ref(
            x,
            lengths,
            self.flat_weights(),
            self.cell_clip,
            self.proj_clip,
            h0,
            c0,
            training=masks is not None,
            masks=masks,
        )

    def forward_fast(
        self,
        xg0: Tensor,
        token_index: Tensor,
        lengths: Tensor,
        h0: Tensor | None = None,
        c0: Tensor | None = None,
        weights: list[Tensor] | None = None,
        tuning: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        weights = self.flat_weights() if weights is None else weights
        return ops.bilstm(xg0, token_index, lengths, weights, self.cell_clip, self.proj_clip, h0, c0, tuning)

    def forward_reference(
        self, xg0: Tensor, token_index: Tensor, lengths: Tensor, h0: Tensor | None = None, c0: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        return reference.bilstm_ref(
            xg0, token_index, lengths, self.flat_weights(), self.cell_clip, self.proj_clip, h0, c0
        )
