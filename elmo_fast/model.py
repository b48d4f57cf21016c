"""The biLM as a ``torch.nn.Module``: weights, state handling, and the choice of backend."""
from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from . import reference
from .errors import ElmoFastError
from .weights import ElmoOptions, ElmoWeights, LstmWeights, load_model_files

BACKENDS = ("reference",)


class ElmoBiLm(nn.Module):
    """allennlp's ``_ElmoBiLm``: char CNN, highway, projection and the biLSTM.

    ``forward(char_ids [B, T, 50])`` returns ``{"activations": [L + 1 tensors [B, T + 2, 2P]],
    "mask": [B, T + 2]}``, sentence boundaries included, as allennlp does.

    stateful=False (the default): every batch starts from zero LSTM states, so a sentence's
    vectors never depend on its batch-mates or on earlier batches. stateful=True reproduces
    allennlp and bilm-tf: batch row i starts from the final states row i had in the previous
    batch; a larger batch adds zero states for the new rows, a smaller one leaves the states of
    the rows it does not use untouched.
    """

    def __init__(self, options_file: str | os.PathLike, weight_file: str | os.PathLike,
                 requires_grad: bool = False, stateful: bool = False, backend: str = "reference") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ElmoFastError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.stateful = stateful
        w = load_model_files(options_file, weight_file)
        self.options: ElmoOptions = w.options

        def p(t: Tensor) -> nn.Parameter:
            return nn.Parameter(t, requires_grad=requires_grad)

        self.char_embedding = p(w.char_embedding)
        self.conv_weights = nn.ParameterList([p(t) for t in w.conv_weights])
        self.conv_biases = nn.ParameterList([p(t) for t in w.conv_biases])
        self.highway_weights = nn.ParameterList([p(t) for t in w.highway_weights])
        self.highway_biases = nn.ParameterList([p(t) for t in w.highway_biases])
        self.proj_weight = p(w.proj_weight)
        self.proj_bias = p(w.proj_bias)
        # per layer, per direction (forward, backward): w_ih, w_hh, bias, w_proj
        self.lstm_params = nn.ParameterList(
            [p(getattr(d, name)) for pair in w.lstm for d in pair for name in ("w_ih", "w_hh", "bias", "w_proj")])
        self._states: tuple[Tensor, Tensor] | None = None

    @property
    def num_layers(self) -> int:
        """Output layers, the context-free one included (allennlp's ``num_layers``)."""
        return self.options.n_layers + 1

    def get_output_dim(self) -> int:
        return self.options.output_dim

    def weights(self) -> ElmoWeights:
        """The module's current parameters as an :class:`ElmoWeights` (no copies)."""
        it = iter(self.lstm_params)
        lstm = [tuple(LstmWeights(*(next(it) for _ in range(4))) for _ in range(2))
                for _ in range(self.options.n_layers)]
        return ElmoWeights(
            options=self.options, char_embedding=self.char_embedding, conv_weights=list(self.conv_weights),
            conv_biases=list(self.conv_biases), highway_weights=list(self.highway_weights),
            highway_biases=list(self.highway_biases), proj_weight=self.proj_weight, proj_bias=self.proj_bias,
            lstm=lstm)

    def reset_states(self) -> None:
        """Forget the carried LSTM states (stateful mode)."""
        self._states = None

    def _initial_states(self, batch_size: int) -> tuple[Tensor | None, Tensor | None]:
        if not self.stateful or self._states is None:
            return None, None
        h, c = self._states
        if batch_size > h.shape[1]:  # new rows start from zero, and keep their slot from now on
            grow = batch_size - h.shape[1]
            h = torch.cat([h, h.new_zeros(h.shape[0], grow, h.shape[2])], dim=1)
            c = torch.cat([c, c.new_zeros(c.shape[0], grow, c.shape[2])], dim=1)
            self._states = (h, c)
        return h[:, :batch_size], c[:, :batch_size]

    def _update_states(self, h: Tensor, c: Tensor) -> None:
        B = h.shape[1]
        if self._states is None or self._states[0].shape[1] == B:
            self._states = (h.detach(), c.detach())
        else:  # a smaller batch: rows past it keep their states
            old_h, old_c = self._states
            self._states = (torch.cat([h.detach(), old_h[:, B:]], dim=1), torch.cat([c.detach(), old_c[:, B:]], dim=1))

    def forward(self, char_ids: Tensor) -> dict[str, Tensor | list[Tensor]]:
        if char_ids.dim() != 3 or char_ids.shape[-1] != 50:
            raise ElmoFastError(f"char_ids must have shape [batch, tokens, 50], got {list(char_ids.shape)}")
        char_ids = char_ids.to(self.char_embedding.device)
        h0, c0 = self._initial_states(char_ids.shape[0])
        activations, mask, h, c = reference.bilm_ref(char_ids, self.weights(), h0, c0)
        if self.stateful:
            self._update_states(h, c)
        return {"activations": activations, "mask": mask}

    def embed(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Outputs without the sentence boundaries: [B, L + 1, T, 2P] and mask [B, T]."""
        out = self(char_ids)
        layers = [reference.remove_sentence_boundaries(a, out["mask"]) for a in out["activations"]]
        return torch.stack([x for x, _ in layers], dim=1), layers[0][1]
