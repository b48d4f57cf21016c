"""TF-Hub-style outputs for code written against ``google/elmo``: the ``default`` and ``tokens`` signatures.

``HubElmo(options, weights)(["the cat sat", "hi"], signature="default", as_dict=True)`` and
``HubElmo(...)({"tokens": t, "sequence_len": n}, signature="tokens", as_dict=True)`` are TF-Hub's
call, returning its output dictionary as torch tensors (``as_dict=False``: the ``default`` output
alone, as TF-Hub's ``Module.__call__`` returns the output named "default" for either signature);
inputs may be lists or numpy arrays of str or bytes, as TF users hold them.
``hub_signature(inputs, options, weights, signature=...)`` is the same call without gradients,
keeping the loaded model between calls.

What the public sources say (tfhub.dev ``google/elmo/2`` and ``/3`` model pages, and the issues of
tensorflow/hub), and what was chosen where they are silent:

* ``default`` splits each string on spaces (``tf.string_split``: only the space character
  separates, runs of spaces make no empty tokens, leading and trailing spaces are dropped; tabs
  and newlines stay inside tokens). ``tokens`` takes ``[B, T]`` strings padded with anything
  (``""`` in TF-Hub's example) and ``sequence_len`` ``[B]``; tokens past a sentence's length are
  never read. An empty string inside a sentence's length is a token, as in TF-Hub.
* Outputs are ``[B, T, ...]`` with ``T`` the longest sentence (``default``) or the width of
  ``tokens`` (``tokens``), without the ``<S>``/``</S>`` boundaries. Chosen here, as TF-Hub does
  not document it: every position past a sentence's length is exactly zero in ``word_emb``,
  ``lstm_outputs1/2`` and ``elmo`` (bilm-tf's ``dynamic_rnn`` gives zeros there for the LSTM
  layers; the token layer is masked the same way so padding never leaks into a mean or a sum).
* ``default`` is the mean of ``elmo`` over each sentence's own tokens: the fix of
  ``google/elmo/3`` ("correctly ignoring padding during the mean pooling"). A sentence of zero
  tokens gets zeros, not NaN (TF-Hub's behaviour there is not documented).
* ``elmo`` is ``gamma * sum_k softmax(w)_k * layer_k`` over the token layer and the LSTM
  layers, TF-Hub's "4 trainable scalar weights for layer aggregation": an even mix with
  ``gamma = 1`` to start (``ScalarMix``, allennlp's parameter layout), trainable; TF-Hub ships
  its own trained values of these four scalars, which are not public outside its checkpoint.
* The biLM is stateless: a sentence's vectors never depend on its batch-mates or on earlier
  calls. Whether TF-Hub's module carries LSTM states between calls, as bilm-tf's graph does, is
  not documented (tensorflow/hub#369 reports vectors that change when a sentence is added to the
  batch, without an answer).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..bilm.char_ids import batch_to_ids
from ..bilm.model import ElmoBiLm
from ..bilm.precision import Precision, resolve_precision
from ..bilm.scalar_mix import ScalarMix
from ..devices import resolve_device
from ..errors import ElmoFastError, InputError

SIGNATURES = ("default", "tokens")


def _as_text(item: object, where: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, bytes):  # tf.string tensors hold bytes: accept what TF-Hub callers pass
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{where}: bytes that are not UTF-8 ({e})") from None
    raise InputError(f"{where}: expected a str, got {type(item).__name__} {item!r:.60}")


def split_on_spaces(text: str) -> list[str]:
    """TF-Hub's ``default`` tokenization: split on the space character, no empty tokens."""
    return [t for t in text.split(" ") if t]


class HubElmo(nn.Module):
    """A biLM with TF-Hub ``google/elmo``'s two signatures and five outputs.

    options_file, weight_file: a bilm-tf model (``google/elmo`` is the ``original`` model,
    ``elmo_fast.pretrained.fetch_model("original")``); neither: the bundled ``default`` model. scalar_mix_parameters: the initial ``w`` of the
    ``elmo`` mix, one per layer (default zeros: an even mix), frozen when given (allennlp's
    meaning), trainable otherwise; ``gamma`` starts at 1. backend, precision (or dtype, its older
    name), token_cache_size: as :class:`ElmoBiLm` (precision: "fp32", "tf32", "bf16", "fp16", each
    with its stated bound against fp32, :mod:`~elmo_fast.bilm.precision`). device: where the model
    and the outputs live.

    ``module(strings)`` (or ``module(strings, signature="default", as_dict=True)``) is the
    ``default`` signature, ``module({"tokens": t, "sequence_len": n}, signature="tokens")`` or
    ``module.tokens(t, n)`` the ``tokens`` one; both return a dict (P: the projection dim, L: the
    LSTM layers)::

        word_emb         [B, T, P]    the context-free token vectors
        lstm_outputs1..L [B, T, 2P]   each biLSTM layer, forward and backward halves
        elmo             [B, T, 2P]   the learned mix of the L + 1 layers
        default          [B, 2P]      mean of elmo over each sentence's tokens
        sequence_len     [B] int64    tokens per sentence
        mask             [B, T] bool  position < sequence_len

    Positions past a sentence's length are zero in every [B, T, ...] output. The biLM's own
    weights are frozen; gradients reach the mix's scalars.
    """

    def __init__(
        self,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        *,
        scalar_mix_parameters: Sequence[float] | None = None,
        backend: str = "auto",
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        token_cache_size: int = 0,
        precision: str | Precision | None = None,
    ) -> None:
        super().__init__()
        self.device = resolve_device(device)
        precision = resolve_precision(precision, dtype)
        precision.check_device(self.device)
        self.elmo_bilm = (
            ElmoBiLm(
                options_file,
                weight_file,
                requires_grad=False,
                stateful=False,
                backend=backend,
                token_cache_size=token_cache_size,
                precision=precision,
            )
            .to(self.device)
            .eval()
        )
        self.num_layers = self.elmo_bilm.num_layers
        self.projection_dim = self.elmo_bilm.options.projection_dim
        self.output_dim = self.elmo_bilm.get_output_dim()
        if scalar_mix_parameters is not None and len(scalar_mix_parameters) != self.num_layers:
            n = self.num_layers
            raise ElmoFastError(
                f"scalar_mix_parameters has {len(scalar_mix_parameters)} values, but this model has "
                f"{n} layers to mix (the token layer and {n - 1} LSTM layers)"
            )
        self.scalar_mix = ScalarMix(
            self.num_layers, initial_scalar_parameters=scalar_mix_parameters, trainable=scalar_mix_parameters is None
        ).to(self.device)

    def forward(
        self,
        inputs: Sequence[str] | np.ndarray | Mapping[str, object],
        *,
        signature: str | None = None,
        as_dict: bool = True,
    ) -> dict[str, Tensor] | Tensor:
        """TF-Hub's ``elmo(inputs, signature=..., as_dict=...)``.

        signature "default" (or None): inputs are B untokenized sentences (a list of str or bytes,
        or a 1-D numpy array of them, dtype ``<U``, ``S`` or object), split on spaces. signature
        "tokens": inputs are ``{"tokens": [B, T] strings padded with "", "sequence_len": [B]}``
        (see :meth:`tokens`). as_dict=True: every output, as a dict; as_dict=False: the output
        named "default" alone, as TF-Hub returns it (for both signatures). Unlike TF-Hub,
        as_dict defaults to True here, as elmo-fast's call always returned the dict.
        """
        signature = "default" if signature is None else signature
        if signature not in SIGNATURES:
            raise ElmoFastError(f"unknown signature {signature!r}; TF-Hub's google/elmo has {' and '.join(SIGNATURES)}")
        if signature == "tokens":
            if not isinstance(inputs, Mapping) or set(inputs) != {"tokens", "sequence_len"}:
                got = sorted(inputs) if isinstance(inputs, Mapping) else type(inputs).__name__
                raise InputError(f'the tokens signature takes {{"tokens": ..., "sequence_len": ...}}, got {got}')
            out = self.tokens(inputs["tokens"], inputs["sequence_len"])
        else:
            out = self._default_signature(inputs)
        return out if as_dict else out["default"]

    def _default_signature(self, strings: Sequence[str] | np.ndarray) -> dict[str, Tensor]:
        """B untokenized sentences, split on spaces."""
        if isinstance(strings, np.ndarray):
            if strings.ndim != 1:
                raise InputError(f"strings must be a 1-D array of sentences [batch], got shape {list(strings.shape)}")
            strings = strings.tolist()  # <U: str, S: bytes, object: as held
        if isinstance(strings, (str, bytes)):
            raise InputError(
                f"strings must be a list of sentences, got a single {type(strings).__name__}; "
                f"wrap it: [{strings!r:.40}]"
            )
        if not isinstance(strings, Sequence):
            hint = (
                '; a dict of tokens and sequence_len is for signature="tokens"' if isinstance(strings, Mapping) else ""
            )
            raise InputError(f"strings must be a list or tuple of str, got {type(strings).__name__}{hint}")
        sentences = [split_on_spaces(_as_text(s, f"strings[{i}]")) for i, s in enumerate(strings)]
        return self._outputs(sentences, max((len(s) for s in sentences), default=0))

    def tokens(
        self, tokens: Sequence[Sequence[str]] | np.ndarray, sequence_len: Sequence[int] | Tensor
    ) -> dict[str, Tensor]:
        """The ``tokens`` signature: tokens [B, T] (a rectangular list of lists, or a 2-D numpy array
        of str or bytes, padded with "" as TF-Hub's example pads), sequence_len [B] ints in [0, T];
        tokens at or past sequence_len[i] are ignored."""
        if isinstance(tokens, np.ndarray):
            if tokens.ndim != 2:
                raise InputError(
                    f"tokens must be [batch, max_length] strings, got an array of shape {list(tokens.shape)}"
                )
            tokens = tokens.tolist()
        if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
            raise InputError(f"tokens must be [batch, max_length] strings, got {type(tokens).__name__}")
        rows = [list(r) if not isinstance(r, (str, bytes)) and hasattr(r, "__len__") else r for r in tokens]
        for i, r in enumerate(rows):
            if not isinstance(r, list):
                raise InputError(f"tokens[{i}] must be a list of token strings, got {type(r).__name__} {r!r:.40}")
        width = len(rows[0]) if rows else 0
        for i, r in enumerate(rows):
            if len(r) != width:
                raise InputError(
                    f'tokens must be rectangular (pad with ""): tokens[0] has {width} tokens, tokens[{i}] has {len(r)}'
                )
        lengths = _check_lengths(sequence_len, len(rows), width)
        sentences = [
            [_as_text(t, f"tokens[{i}][{j}]") for j, t in enumerate(r[:n])]
            for i, (r, n) in enumerate(zip(rows, lengths))
        ]
        return self._outputs(sentences, width)

    def _outputs(self, sentences: list[list[str]], width: int) -> dict[str, Tensor]:
        B, P, D, L = len(sentences), self.projection_dim, self.output_dim, self.num_layers
        device = self.elmo_bilm.device  # follows a later .to(device) of the module
        lengths = torch.tensor([len(s) for s in sentences], dtype=torch.long, device=device)
        mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
        if any(len(s) for s in sentences):
            # ids on the CPU: a biLM on a GPU plans its forward from them there, without a device sync
            layers, _ = self.elmo_bilm.embed(batch_to_ids(sentences))  # [B, L, T', D]
            layers = layers.float()
            if layers.shape[2] < width:  # the tokens signature keeps its input's width
                layers = nn.functional.pad(layers, (0, 0, 0, width - layers.shape[2]))
        else:  # nothing to embed (no sentences, or only empty ones): skip the model
            layers = torch.zeros(B, L, width, D, device=device)
        per_layer = layers.unbind(1)
        elmo = self.scalar_mix(per_layer, mask)
        pooled = elmo.sum(dim=1) / lengths.clamp(min=1).unsqueeze(1).to(elmo.dtype)
        out = {"word_emb": per_layer[0][..., :P]}
        out.update({f"lstm_outputs{k}": per_layer[k] for k in range(1, L)})
        out.update(elmo=elmo, default=pooled, sequence_len=lengths, mask=mask)
        return out


def _check_lengths(sequence_len: Sequence[int] | Tensor, batch: int, width: int) -> list[int]:
    if isinstance(sequence_len, Tensor):
        if sequence_len.dim() != 1 or sequence_len.dtype.is_floating_point or sequence_len.dtype == torch.bool:
            raise InputError(
                f"sequence_len must be a 1-D integer tensor, got {sequence_len.dtype} "
                f"of shape {list(sequence_len.shape)}"
            )
        values = sequence_len.tolist()
    else:
        if isinstance(sequence_len, (str, bytes)) or not hasattr(sequence_len, "__len__"):
            raise InputError(
                f"sequence_len must be a list of ints, one per sentence, got {type(sequence_len).__name__}"
            )
        values = list(sequence_len)
    if len(values) != batch:
        raise InputError(f"sequence_len has {len(values)} values for {batch} sentences")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise InputError(f"sequence_len[{i}] must be an int, got {type(v).__name__} {v!r}")
        v = int(v.__index__())
        if not 0 <= v <= width:
            raise InputError(f"sequence_len[{i}] = {v} is outside [0, {width}] (tokens has {width} columns)")
        out.append(v)
    return out


_MODULES: OrderedDict[tuple, HubElmo] = OrderedDict()
_MAX_CACHED = 2


def hub_module(
    options_file: str | os.PathLike,
    weight_file: str | os.PathLike,
    *,
    backend: str = "auto",
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    precision: str | Precision | None = None,
) -> HubElmo:
    """A :class:`HubElmo` for these files and settings, loaded once and kept (the last two used).

    A file rewritten since it was loaded (new size or mtime) is loaded again.
    """
    paths = [Path(options_file).expanduser().resolve(), Path(weight_file).expanduser().resolve()]
    stamps = []
    for p in paths:
        try:
            st = p.stat()
        except OSError as e:
            raise ElmoFastError(f"cannot read model file {p}: {e.strerror}") from None
        stamps.append((str(p), st.st_size, st.st_mtime_ns))
    precision = resolve_precision(precision, dtype)
    key = (*stamps, backend, str(resolve_device(device)), precision.name)
    module = _MODULES.get(key)
    if module is None:
        module = HubElmo(paths[0], paths[1], backend=backend, device=device, precision=precision)
        _MODULES[key] = module
        while len(_MODULES) > _MAX_CACHED:
            _MODULES.popitem(last=False)
    _MODULES.move_to_end(key)
    return module


def hub_signature(
    inputs: Sequence[str] | np.ndarray | Mapping[str, object],
    options_file: str | os.PathLike | None = None,
    weight_file: str | os.PathLike | None = None,
    *,
    signature: str | None = "default",
    as_dict: bool = True,
    module: HubElmo | None = None,
    backend: str = "auto",
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    precision: str | Precision | None = None,
) -> dict[str, Tensor] | Tensor:
    """TF-Hub's ``elmo(inputs, signature=signature, as_dict=as_dict)``, without gradients.

    signature="default": inputs is B strings (a list, or a 1-D numpy array of str or bytes).
    signature="tokens": inputs is ``{"tokens": [B, T] strings, "sequence_len": [B] ints}``. The
    model is ``module`` when given, else the one :func:`hub_module` keeps for
    ``options_file``/``weight_file``. Returns the outputs of :class:`HubElmo`, or with
    as_dict=False the ``default`` output alone.
    """
    if signature is not None and signature not in SIGNATURES:
        raise ElmoFastError(f"unknown signature {signature!r}; TF-Hub's google/elmo has {' and '.join(SIGNATURES)}")
    if module is None:
        if options_file is None or weight_file is None:
            raise ElmoFastError("hub_signature needs options_file and weight_file, or module=HubElmo(...)")
        module = hub_module(options_file, weight_file, backend=backend, device=device, dtype=dtype, precision=precision)
    with torch.no_grad():
        return module(inputs, signature=signature, as_dict=as_dict)
