"""Copies the fast path derives from a biLM's weights, made once and remade whenever the weights
change: low-precision copies of the GEMM weights (``precision="bf16"`` / ``"fp16"``), the bilstm
op's weight list (stacked per layer on CUDA), and the vocabulary cache's token vectors.

Fine-tuning, ``load_state_dict``, in-place edits and moves all change the weights under a cached
copy; :func:`weights_key` changes with every one of them, and each copy is checked against it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

#: Device types whose bilstm op runs both directions' GEMMs at once and so takes each layer's
#: forward and backward w_hh (and w_proj) as one [2, ...] tensor: given two separate tensors it
#: stacks them, a copy of every recurrent weight on every call (168 MB on `original` in fp32).
#: There the model passes views of stacked copies it keeps (the CPU op reads each direction alone).
STACKED_LSTM_DEVICES = ("cuda",)


def weights_key(module: nn.Module, *extra: object) -> tuple:
    """Changes whenever a parameter of ``module`` does (an optimizer step, load_state_dict,
    .to(device)): in-place updates bump a tensor's version counter; moves change its storage.
    (Parameters made under inference_mode have no version counter; they cannot train either.)
    ``extra``: what else the derived values depend on (the precision)."""
    return (*extra, *((p.data_ptr(), -1 if p.is_inference() else p._version) for p in module.parameters()))


class DerivedWeights:
    """The derived copies of one biLM, each kept with the :func:`weights_key` it was made from.
    ``len()`` counts the copies held."""

    def __init__(self) -> None:
        self._token_embedder: tuple[tuple, dict] | None = None
        self._lstm: dict[tuple, tuple[tuple, list[Tensor]]] = {}
        self._vocab: tuple[tuple, Tensor] | None = None

    def __len__(self) -> int:
        return (self._token_embedder is not None) + len(self._lstm) + (self._vocab is not None)

    def holds(self, what: str) -> bool:
        """Whether a copy of ``what`` ("token_embedder", "lstm", "vocab") is held."""
        return bool({"token_embedder": self._token_embedder, "lstm": self._lstm, "vocab": self._vocab}[what])

    def clear(self) -> None:
        self._token_embedder = None
        self._lstm = {}
        self._vocab = None

    def token_embedder_weights(self, token_embedder: nn.Module, dtype: torch.dtype, key: tuple) -> dict:
        """``dtype`` copies of the highway and projection weights (the token embedder's
        ``lowp_weights``), which its ``project_fast`` reads; the LSTM's are :meth:`lstm_op_weights`."""
        if self._token_embedder is None or self._token_embedder[0] != key:
            self._token_embedder = None  # free the stale copies before making the new ones
            self._token_embedder = (key, token_embedder.lowp_weights(dtype))
        return self._token_embedder[1]

    def lstm_op_weights(
        self,
        flat: list[Tensor],
        device: torch.device,
        dtype: torch.dtype,
        key: Callable[[], tuple],
        pack: Callable[[Tensor], Tensor] | None = None,
    ) -> list[Tensor]:
        """The bilstm op's flat weight list (``flat``, the encoder's parameters) in ``dtype``,
        detached: the parameters themselves (fp32 on a CPU), or copies made once per (device,
        dtype): low-precision copies of the GEMM weights (biases stay fp32 on a CPU; on CUDA, whose
        op takes one dtype, they are cast too), and on :data:`STACKED_LSTM_DEVICES` each layer's
        w_hh and w_proj stacked, both directions, the list holding views of the two halves (which
        the op uses in place). ``key()`` gives the weights' key, asked for only when a copy is
        involved (the plain fp32 list needs none, and so stays traceable by torch.compile). ``pack``
        (the CPU, when the calibration chose it): applied to every GEMM weight, w_ih, w_hh and w_proj,
        in ``dtype`` (ops.pack_weight), the copies then held being the packed ones (in fp32 a copy
        the size of the LSTM's weights)."""
        lowp = dtype != torch.float32
        stacked = device.type in STACKED_LSTM_DEVICES
        if not (lowp or stacked or pack is not None):
            self._lstm = {}
            return [w.detach() for w in flat]
        slot = (device.type, device.index, dtype, pack is not None)
        key = key()
        entry = self._lstm.get(slot)
        if entry is not None and entry[0] == key:
            return entry[1]
        # Copies derived from older weights are dropped before the new ones are made.
        self._lstm = {s: e for s, e in self._lstm.items() if e[0] == key}

        def cast(w: Tensor, k: int) -> Tensor:
            keep_fp32 = k == 2 and not stacked  # a bias, on the CPU
            w = w.detach().to(dtype) if lowp and not keep_fp32 else w.detach()
            return pack(w) if pack is not None and k != 2 else w

        out = [cast(w, i % 4) for i, w in enumerate(flat)]
        if stacked:
            for layer in range(len(flat) // 8):
                for k in (1, 3):  # w_hh, w_proj
                    f, b = 8 * layer + k, 8 * layer + 4 + k
                    both = torch.stack([out[f], out[b]])
                    out[f], out[b] = both[0], both[1]
        self._lstm[slot] = (key, out)
        return out

    def vocab_vectors(self, key: tuple, make: Callable[[], Tensor]) -> Tensor:
        """The vocabulary cache's token vectors [V + 2, P], made by ``make()`` for these weights."""
        if self._vocab is None or self._vocab[0] != key:
            self._vocab = None  # free the stale table before building the new one
            self._vocab = (key, make())
        return self._vocab[1]
