"""``Elmo``: ELMo inside a PyTorch model, with learned layer mixes (allennlp's ``Elmo``), and the
``ConfigurationError`` that code migrated from allennlp catches."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..bilm.char_ids import batch_to_ids
from ..bilm.model import ElmoBiLm
from ..bilm.precision import Precision
from ..bilm.reference import remove_sentence_boundaries
from ..bilm.scalar_mix import ScalarMix
from ..devices import resolve_device
from ..errors import ConfigurationError, ElmoFastError

__all__ = ["ConfigurationError", "Elmo"]


class Elmo(nn.Module):
    """allennlp's ``Elmo``: the biLM run once, then ``num_output_representations`` scalar mixes.

    ``forward(char_ids [..., T, 50], word_inputs [..., T] = None)`` returns
    ``{"elmo_representations": K tensors [..., T, 2P], "mask": [..., T] (bool)}``, where
    representation k is ``dropout(gamma_k * sum_j softmax(w_k)_j * h_j)`` over the biLM's layers h_j
    (the context-free layer and every LSTM layer), each h_j first normalised over all unmasked
    elements of the batch, boundaries included, when ``do_layer_norm`` (allennlp's ``ScalarMix``).

    Options, with allennlp's meaning and defaults:

    * ``requires_grad``: fine-tune the biLM too. In train mode (with grad on) its weights then
      train through the reference stages' exact autograd; in eval() the fast path runs and gives
      them no gradient. The scalar mixes always train, on the fast path when the biLM is frozen.
    * ``scalar_mix_parameters``: fixed (pre-softmax) mixing weights for every representation,
      e.g. ``[-9e10, 1, -9e10]`` for layer 1 alone; gamma is then fixed at 1 too.
    * ``keep_sentence_boundaries``: keep ``<S>``/``</S>``: representations [..., T + 2, 2P].
    * ``vocab_to_cache``: words whose context-free vectors are precomputed; ``word_inputs`` are
      ids into that list (0 = padding) and ``char_ids`` may be None (see :class:`ElmoBiLm`).
    * ``module``: a biLM module to use instead of loading one (an :class:`ElmoBiLm`, or any module
      with allennlp's ``_ElmoBiLm`` interface: a ``num_layers`` attribute, ``get_output_dim()``, and a
      forward returning ``{"activations", "mask"}``); ``options_file`` and ``weight_file`` must then be
      None (:class:`~elmo_fast.errors.ConfigurationError` otherwise, as allennlp), and
      ``requires_grad`` and ``vocab_to_cache`` are the module's own, ignored here as in allennlp.
    * ``stateful``: allennlp carries the LSTM states from batch to batch; elmo-fast does not by
      default (every batch starts from zeros), ``stateful=True`` restores allennlp's behaviour.

    elmo-fast's own: ``backend`` ("auto", "fast", "reference"), ``device``, and ``precision``
    (``dtype``, its older name, is an alias): "fp32" (default; max abs error <= 1e-5 against the
    reference), "tf32" (TF32 GEMMs on CUDA: max error <= 1% of a layer's max |value|, RMS <= 0.25%;
    exactly fp32 on a CPU), "bf16" (bf16 GEMMs: <= 5%, RMS <= 1%), "fp16" (CUDA only: <= 1%, RMS <=
    0.25%), for the fast path (:mod:`~elmo_fast.bilm.precision`); parameters and outputs stay fp32.
    With ``module=``, these and ``stateful`` are the module's own settings.

    The biLM may also be a model directory, ``model_dir=`` or the first argument alone, of
    bilm-tf or ELMoForManyLangs (e.g. ``Elmo("./hun", num_output_representations=1)``): an
    ELMoForManyLangs model takes its own ids, from :meth:`batch_to_ids`, [..., T, token_width]. A
    directory holding both kinds needs ``model_format`` ("bilm-tf" or "elmoformanylangs").

    An empty batch (no sentences) gives empty outputs; allennlp raises on it.
    Submodules carry allennlp's names along the whole path (``_elmo_lstm``, the biLM, whose
    ``_elmo_lstm`` is the biLSTM with ``reset_states()`` and ``_token_embedder`` the char CNN's
    stage; ``scalar_mix_{k}``), so ``elmo._elmo_lstm._elmo_lstm.reset_states()`` works and the
    scalar mixes of a state dict saved from an allennlp model load as they are.
    """

    def __init__(
        self,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        num_output_representations: int | None = None,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: Sequence[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        module: nn.Module | None = None,
        stateful: bool = False,
        backend: str = "auto",
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        *,
        model_dir: str | os.PathLike | None = None,
        precision: str | Precision | None = None,
        model_format: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(weight_file, int) and not isinstance(weight_file, bool):
            raise ElmoFastError(
                "with a model directory, pass num_output_representations by keyword: "
                "Elmo(model_dir, num_output_representations=2)"
            )
        if (
            isinstance(num_output_representations, bool)
            or not isinstance(num_output_representations, int)
            or num_output_representations < 1
        ):
            raise ElmoFastError(
                f"num_output_representations must be an integer >= 1, got {num_output_representations!r}"
            )
        if not 0.0 <= dropout <= 1.0:
            raise ElmoFastError(f"dropout must be in [0, 1], got {dropout!r}")
        if module is not None:
            if options_file is not None or weight_file is not None or model_dir is not None or model_format:
                raise ConfigurationError(
                    "give options_file and weight_file (or model_dir), or module, not both "
                    '(allennlp: "Don\'t provide options_file or weight_file with module")'
                )
            _check_bilm_module(module)
            own = [
                name
                for name, given in (
                    ("stateful", stateful),
                    ("backend", backend != "auto"),
                    ("precision", precision is not None),
                    ("dtype", dtype is not None),
                )
                if given
            ]
            if own:
                raise ConfigurationError(
                    f"{', '.join(own)}: settings of the biLM itself; with module=, set them on "
                    f"the module you pass (e.g. ElmoBiLm(..., stateful=True))"
                )
            self._elmo_lstm = module
        else:
            self._elmo_lstm = ElmoBiLm(
                options_file,
                weight_file,
                requires_grad=requires_grad,
                stateful=stateful,
                backend=backend,
                dtype=dtype,
                precision=precision,
                vocab_to_cache=vocab_to_cache,
                model_dir=model_dir,
                model_format=model_format,
            )
        self._keep_sentence_boundaries = keep_sentence_boundaries
        self._dropout = nn.Dropout(p=dropout)
        num_layers = self._elmo_lstm.num_layers
        if scalar_mix_parameters is not None and len(scalar_mix_parameters) != num_layers:
            raise ConfigurationError(
                f"scalar_mix_parameters has {len(scalar_mix_parameters)} weights, but this biLM "
                f"has {num_layers} layers to mix"
            )
        self._scalar_mixes: list[ScalarMix] = []
        for k in range(num_output_representations):
            mix = ScalarMix(
                num_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=scalar_mix_parameters is None,
            )
            self.add_module(f"scalar_mix_{k}", mix)
            self._scalar_mixes.append(mix)
        if device is not None:
            self.to(resolve_device(device))

    def get_output_dim(self) -> int:
        return self._elmo_lstm.get_output_dim()

    def batch_to_ids(self, sentences: Sequence[Sequence[str]]) -> Tensor:
        """The ids :meth:`forward` takes for tokenized sentences: [B, T, token_width] (allennlp's
        ``batch_to_ids`` for bilm-tf models, the model's own for ELMoForManyLangs ones)."""
        own = getattr(self._elmo_lstm, "batch_to_ids", None)
        return batch_to_ids(sentences) if own is None else own(sentences)

    def save_bilm(self, directory: str | os.PathLike) -> tuple[str, str]:
        """Write the biLM's current weights (after fine-tuning with ``requires_grad=True``) as
        ``options.json`` + ``weights.hdf5`` in the bilm-tf layout, an ELMoForManyLangs model in its own
        (see :meth:`ElmoBiLm.save`)."""
        if not isinstance(self._elmo_lstm, ElmoBiLm):
            raise ElmoFastError(
                f"save_bilm writes an ElmoBiLm; this Elmo holds a {type(self._elmo_lstm).__name__} (module=)"
            )
        return self._elmo_lstm.save(directory)

    def reset_states(self) -> None:
        """Forget the LSTM states carried across batches (``stateful=True``)."""
        reset = getattr(self._elmo_lstm, "reset_states", None)
        if reset is not None:
            reset()

    def forward(
        self, char_ids: Tensor | None = None, word_inputs: Tensor | None = None
    ) -> dict[str, Tensor | list[Tensor]]:
        """char_ids [..., T, 50] (``batch_to_ids``; [..., T, token_width] of :meth:`batch_to_ids` for an
        ELMoForManyLangs model), word_inputs [..., T] (with ``vocab_to_cache``).

        Leading dimensions past the batch (e.g. [B, N, T, 50] for N sentences per instance) are
        flattened for the biLM and restored on every output, as allennlp does.
        """
        if char_ids is None and word_inputs is None:
            raise ElmoFastError("Elmo needs char_ids (from batch_to_ids), or word_inputs with vocab_to_cache")
        W = getattr(self._elmo_lstm, "token_width", 50)
        if char_ids is not None and (char_ids.dim() < 3 or char_ids.shape[-1] != W):
            how = "" if W == 50 else " (this model's own ids: elmo.batch_to_ids(sentences))"
            raise ElmoFastError(f"char_ids must have shape [batch, ..., tokens, {W}]{how}, got {list(char_ids.shape)}")
        if word_inputs is not None and word_inputs.dim() < 2:
            raise ElmoFastError(f"word_inputs must have shape [batch, ..., tokens], got {list(word_inputs.shape)}")
        if char_ids is not None and word_inputs is not None and word_inputs.shape != char_ids.shape[:-1]:
            raise ElmoFastError(
                f"char_ids {list(char_ids.shape)} and word_inputs {list(word_inputs.shape)} must "
                f"describe the same tokens: [..., tokens, {W}] and [..., tokens]"
            )
        lead = char_ids.shape[:-2] if char_ids is not None else word_inputs.shape[:-1]
        T = char_ids.shape[-2] if char_ids is not None else word_inputs.shape[-1]
        rows = math.prod(lead)  # explicit: view(-1, ...) cannot infer it when there are no elements
        bilm = self._elmo_lstm(
            None if char_ids is None else char_ids.reshape(rows, T, W),
            None if word_inputs is None else word_inputs.reshape(rows, T),
        )
        layers, mask = bilm["activations"], bilm["mask"]
        representations = []
        for mix in self._scalar_mixes:
            mixed = mix(layers, mask)
            if not self._keep_sentence_boundaries:
                mixed, out_mask = remove_sentence_boundaries(mixed, mask)
            else:
                out_mask = mask
            representations.append(self._dropout(mixed).view(*lead, mixed.shape[1], mixed.shape[2]))
        return {"elmo_representations": representations, "mask": out_mask.view(*lead, out_mask.shape[1])}


def _check_bilm_module(module: object) -> None:
    """What allennlp's ``Elmo`` asks of a ``module=``: a torch module with ``num_layers`` (the layers
    it outputs, the context-free one included), ``get_output_dim()`` and a forward returning
    ``{"activations", "mask"}``."""
    if not isinstance(module, nn.Module):
        raise ConfigurationError(
            f"module must be a torch.nn.Module with allennlp's _ElmoBiLm interface (an ElmoBiLm, "
            f"say), got {type(module).__name__}"
        )
    layers = getattr(module, "num_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ConfigurationError(
            f"module ({type(module).__name__}) must have num_layers, the number of layers it "
            f"outputs (an int >= 1), as allennlp's Elmo requires; got {layers!r}"
        )
    if not callable(getattr(module, "get_output_dim", None)):
        raise ConfigurationError(
            f"module ({type(module).__name__}) must have get_output_dim(), as allennlp's _ElmoBiLm has"
        )
