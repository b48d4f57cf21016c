"""``ElmoBiLm``: the biLM as a tree of stage modules (:mod:`elmo_fast.bilm.stages`), composed with
the parts that let the fast path do less work, each in its own module:

* :mod:`~elmo_fast.model_source`           which model the constructor was given (files, a directory, weights)
* :mod:`~elmo_fast.bilm.backends`          fast or reference
* :mod:`~elmo_fast.bilm.precision`         fp32 / tf32 / bf16 / fp16, and their bounds
* :mod:`~elmo_fast.bilm.distinct_rows`     each distinct token of a batch once
* :mod:`~elmo_fast.bilm.token_cache`       their context-free results, kept across batches
* :mod:`~elmo_fast.bilm.derived_weights`   low-precision, packed and stacked copies of the weights, remade when they change
* :mod:`~elmo_fast.bilm.cpu_choices`       the CPU kernels' choices, asked for at each use (measured by :mod:`elmo_fast.tuning`)
* :mod:`~elmo_fast.bilm.cuda_graphs`       captured forwards, per bucket
* :mod:`~elmo_fast.bilm.vocab_cache`       allennlp's vocab_to_cache: word ids read against cached vectors
* :mod:`~elmo_fast.bilm.legacy_keys`       state dicts of allennlp and elmo-fast 0.1
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..errors import ElmoFastError, Param
from ..formats.bilm_tf import ElmoOptions, ElmoWeights, LstmWeights
from ..formats.manylangs_dir import ManyLangsConfig, ManyLangsWeights
from ..model_source import resolve_model
from . import ops, reference
from .backends import BACKENDS, fast_gradients, resolve_backend  # noqa: F401  (BACKENDS: public here too)
from .char_ids import AllenNlpCharIds
from .cpu_choices import DEFAULT as DEFAULT_TUNING
from .cpu_choices import CpuTuning, cpu_tuning_for
from .cuda_graphs import CudaGraphCache
from .derived_weights import DerivedWeights, weights_key
from .distinct_rows import distinct_rows
from .legacy_keys import rename_legacy_keys
from .precision import Precision, resolve_precision
from .stages import BiLstmEncoder, CharCNN, CharTokenEmbedder, Highway, LstmLayer, Stage, WordCharTokenEmbedder, _linear
from .token_cache import TokenCache
from .vocab_cache import usable_word_inputs, vocab_index
from .word_char_ids import ManyLangsIds


def build_stages(w: ElmoWeights | ManyLangsWeights, requires_grad: bool = False):
    """The front end (tokens -> rows of ids: allennlp's character ids, or an ELMoForManyLangs model's
    own), the token embedder (rows of ids -> context-free vectors [P]) and the biLSTM encoder that
    hold the tensors of ``w`` as their parameters."""
    o, g = w.options, requires_grad
    if isinstance(w, ManyLangsWeights):
        has_chars = w.char_embedding is not None
        front_end = ManyLangsIds(
            w.char_vocab if has_chars else None,
            w.word_vocab if w.word_embedding is not None else None,
            o.max_characters_per_token,
        )
        token_embedder = WordCharTokenEmbedder(
            w.word_embedding,
            CharCNN(w.char_embedding, w.conv_weights, w.conv_biases, o.activation, requires_grad=g)
            if has_chars
            else None,
            Highway(w.highway_weights, w.highway_biases, requires_grad=g) if has_chars else None,
            _linear(w.proj_weight, w.proj_bias, g),
            requires_grad=g,
        )
    else:
        front_end = AllenNlpCharIds()
        token_embedder = CharTokenEmbedder(
            CharCNN(w.char_embedding, w.conv_weights, w.conv_biases, o.activation, requires_grad=g),
            Highway(w.highway_weights, w.highway_biases, requires_grad=g),
            _linear(w.proj_weight, w.proj_bias, g),
        )
    encoder = BiLstmEncoder(
        [LstmLayer(f.w_ih, f.w_hh, f.bias, f.w_proj, reverse=False, requires_grad=g) for f, _ in w.lstm],
        [LstmLayer(b.w_ih, b.w_hh, b.bias, b.w_proj, reverse=True, requires_grad=g) for _, b in w.lstm],
        o.cell_clip,
        o.proj_clip,
    )
    return front_end, token_embedder, encoder


class ElmoBiLm(nn.Module):
    """allennlp's ``_ElmoBiLm``: char CNN, highway, projection and the biLSTM.

    ``forward(char_ids [B, T, 50], word_inputs [B, T] = None)`` returns ``{"activations": [L + 1
    tensors [B, T + 2, 2P]], "mask": [B, T + 2]}``, sentence boundaries included, as allennlp does.

    The model: ``options_file`` and ``weight_file`` (bilm-tf's files), or a model directory, as
    ``model_dir=`` or the first argument alone: bilm-tf's (options.json + weights.hdf5) or an
    ELMoForManyLangs one (:mod:`~elmo_fast.formats.manylangs_dir`; a directory holding both needs
    ``model_format``, "bilm-tf" or "elmoformanylangs"); nothing: the bundled model
    (:mod:`~elmo_fast.model_source`). An ELMoForManyLangs model has its own front end
    (:attr:`front_end`, :class:`~elmo_fast.bilm.word_char_ids.ManyLangsIds`): its token rows are
    ``[word id] + [char ids]`` of its own dictionaries, made by :meth:`batch_to_ids`, its sentence
    boundaries ``<bos>`` / ``<eos>``, and its token embedder a
    :class:`~elmo_fast.bilm.stages.WordCharTokenEmbedder`; everything else is the same.
    :meth:`batch_to_ids` gives allennlp's ids for a bilm-tf model.

    Submodules: ``token_embedder`` and ``encoder`` (the biLSTM), also under allennlp's names
    ``_token_embedder`` and ``_elmo_lstm`` (``elmo._elmo_lstm._elmo_lstm.reset_states()`` works as in
    allennlp); the parameter names follow allennlp's modules, and allennlp's state dicts load.

    precision (:mod:`~elmo_fast.bilm.precision`; ``dtype``, its older name, is an alias:
    torch.bfloat16 is "bf16"): the fast path's arithmetic, each mode with its bound against the fp32
    reference, per output layer: "fp32" (default; max abs error <= 1e-5), "tf32" (TF32 GEMMs on CUDA,
    max error <= 1% of the layer's max |value| and RMS error <= 0.25% of its RMS; exactly fp32 on a
    CPU), "bf16" (bf16 GEMMs with fp32 accumulation; <= 5% and <= 1%), "fp16" (CUDA only; <= 1% and
    <= 0.25%). Parameters and outputs stay fp32; modes other than fp32 need the fast backend.

    vocab_to_cache (allennlp's option): a list of words whose context-free vectors are computed once
    (lazily, and again whenever the weights change); ``forward`` then takes ``word_inputs``, ids into
    that list, with 0 meaning padding (so ``vocab_to_cache[0]`` is never looked up, as in allennlp,
    where it is the padding token). ``char_ids`` may then be None. A batch holding an id outside the
    list backs off to ``char_ids`` as a whole, as allennlp does. Either way the outputs equal those
    of the char path: the cache only saves work.

    Gradients: in train mode with grad mode on and a parameter that requires grad
    (``requires_grad=True``), the module runs the reference stages under autograd, which gives exact
    gradients (each distinct token once through the char CNN and highway, unless
    backend="reference", which runs ``bilm_ref`` as it is). Otherwise (eval(), no_grad, inference,
    or a frozen biLM under a trained model) it runs the fast path whatever ``backend`` says besides
    "reference"; no gradient then reaches the biLM's weights.

    stateful=False (the default): every batch starts from zero LSTM states, so a sentence's
    vectors never depend on its batch-mates or on earlier batches (beyond fp32 rounding, ~1e-6,
    as a GEMM's rounding varies with its number of rows; the token cache likewise). stateful=True reproduces
    allennlp and bilm-tf: batch row i starts from the final states row i had in the previous
    batch; a larger batch adds zero states for the new rows, a smaller one leaves the states of
    the rows it does not use untouched. The encoder holds those states, as allennlp's ``ElmoLstm``.

    token_cache_size=N: the context-free results of up to N distinct tokens are kept across batches
    (:mod:`~elmo_fast.bilm.token_cache`; fast path; 0: none).

    cuda_graphs=N (off by default): on a GPU, the fast forward of char ids given on the CPU is
    captured as a CUDA graph per bucket, the batch's shape and exact lengths (a bucket's second
    batch is captured, later ones replay it: one launch instead of thousands, for small batches
    whose time goes to launches), keeping the N most recent (:mod:`~elmo_fast.bilm.cuda_graphs`).
    Only where nothing varies but the data: stateless, no token cache, no profile; other calls run
    as without. Graphs are dropped when the weights change, and each holds its own memory.
    """

    def __init__(
        self,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | ElmoWeights | ManyLangsWeights | None = None,
        requires_grad: bool = False,
        stateful: bool = False,
        backend: str = "auto",
        token_cache_size: int = 0,
        dtype: torch.dtype | None = None,
        vocab_to_cache: Sequence[str] | None = None,
        *,
        model_dir: str | os.PathLike | None = None,
        cuda_graphs: int = 0,
        precision: str | Precision | None = None,
        model_format: str | None = None,
    ) -> None:
        super().__init__()
        self.backend = resolve_backend(backend)
        #: the fast path's arithmetic (see the class docstring)
        self.precision = resolve_precision(precision, dtype)
        self.precision.check_backend(self.backend)
        if self.precision.cuda_only and not ops.HAS_CUDA_KERNELS:
            raise ElmoFastError(
                Param("precision", self.precision.name),
                " runs on CUDA only, and this build of elmo_fast._C has no CUDA kernels; use bf16 or fp32 on a CPU",
            )
        if cuda_graphs < 0:
            raise ElmoFastError(f"cuda_graphs must be >= 0 (the captured buckets to keep; 0: none), got {cuda_graphs}")
        #: CUDA graphs of the fast forward kept, per bucket (0: none; see the class docstring)
        self.cuda_graphs = cuda_graphs
        self._graphs = CudaGraphCache(cuda_graphs)
        self._derived = DerivedWeights()
        self.stateful = stateful
        #: distinct tokens whose context-free results are kept across batches (fast path; None: none)
        self.token_cache = TokenCache(token_cache_size) if token_cache_size > 0 else None
        #: when True, forward() adds the seconds spent per stage to stage_times
        self.profile = False
        self.stage_times: dict[str, float] = {}
        w = resolve_model(options_file, weight_file, model_dir, model_format).weights
        self.options: ElmoOptions | ManyLangsConfig = w.options
        self.front_end: AllenNlpCharIds | ManyLangsIds
        self.token_embedder: CharTokenEmbedder | WordCharTokenEmbedder
        #: front_end: tokens -> rows of ids; token_embedder (stage 1): rows -> context-free vectors [P];
        #: encoder (stage 2): the biLSTM over the token vectors
        self.front_end, self.token_embedder, self.encoder = build_stages(w, requires_grad)
        # the token cache's keys: int16 holds every id of allennlp's rows (100-byte keys)
        self._key_dtype = torch.int16 if self.front_end.max_id < 2**15 else torch.int32
        self._set_stage_backends()
        self._register_load_state_dict_pre_hook(rename_legacy_keys)
        # vocab_to_cache: the words' ids, row 0 zeros (padding); an empty list means no cache, as in
        # allennlp. Not in the state dict: it is part of the configuration, not of the weights.
        vocab_ids = None
        if vocab_to_cache is not None:
            if isinstance(vocab_to_cache, str) or not all(isinstance(w, str) for w in vocab_to_cache):
                raise ElmoFastError(
                    "vocab_to_cache must be a list of words (str), e.g. vocab.get_index_to_token_vocabulary().values()"
                )
            if len(vocab_to_cache):
                vocab_ids = torch.tensor([self.front_end.token_ids(w) for w in vocab_to_cache], dtype=torch.long)
                vocab_ids[0] = 0
        self.register_buffer("_vocab_char_ids", vocab_ids, persistent=False)

    def __getstate__(self) -> dict:
        # pickle, torch.save of the module, copy.deepcopy: what this machine derived for its own kernels
        # (low-precision and packed weights, CUDA graphs) stays here; the copy remakes it where it runs, and
        # asks that machine for its kernels' choices (nothing of them is held here).
        state = self.__dict__.copy()
        state["_derived"] = DerivedWeights()
        state["_graphs"] = CudaGraphCache(self.cuda_graphs)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state.pop("_tunings", None)  # the kernels' choices an older version kept in the module: never reused
        super().__setstate__(state)

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .cpu(), .float(), ...: copies derived from the weights go at once (they would
        # be remade anyway, the weights' storage having changed), not at the next forward.
        self._derived.clear()
        self.clear_cuda_graphs()
        return super()._apply(fn, *args, **kwargs)

    def clear_cuda_graphs(self) -> None:
        """Drop the captured forwards (cuda_graphs) and their memory."""
        if "_graphs" in self.__dict__:
            self._graphs.clear()

    @classmethod
    def from_weights(cls, weights: ElmoWeights | ManyLangsWeights, **kwargs) -> ElmoBiLm:
        """A biLM holding these tensors (as :func:`~elmo_fast.formats.bilm_tf.load_model_files` or
        :func:`~elmo_fast.formats.manylangs_dir.load_manylangs` return them) as its parameters; keyword
        arguments as the constructor's."""
        return cls(None, weights, **kwargs)

    # ---- what it is ------------------------------------------------------------------------------------

    @property
    def token_width(self) -> int:
        """Ids per token row: 50 (allennlp's character ids), or the front end's."""
        return self.front_end.width

    def batch_to_ids(self, sentences: Sequence[Sequence[str]]) -> Tensor:
        """LongTensor [B, T, token_width]: the rows of ids :meth:`forward` takes, for tokenized sentences
        (:func:`~elmo_fast.batch_to_ids` for bilm-tf models, the model's own front end otherwise)."""
        return self.front_end.batch_to_ids(sentences)

    @property
    def num_layers(self) -> int:
        """Output layers, the context-free one included (allennlp's ``num_layers``)."""
        return self.options.n_layers + 1

    def get_output_dim(self) -> int:
        return self.options.output_dim

    @property
    def _token_embedder(self) -> CharTokenEmbedder | WordCharTokenEmbedder:
        """allennlp's name for :attr:`token_embedder`."""
        return self.token_embedder

    @property
    def _elmo_lstm(self) -> BiLstmEncoder:
        """allennlp's name for :attr:`encoder` (``elmo._elmo_lstm._elmo_lstm.reset_states()``)."""
        return self.encoder

    @property
    def backend(self) -> str:
        """ "fast" or "reference": the forward every stage runs (see the class docstring for gradients)."""
        return self._backend

    @backend.setter
    def backend(self, backend: str) -> None:
        self._backend = resolve_backend(backend)
        if "encoder" in self._modules:
            self._set_stage_backends()

    def _set_stage_backends(self) -> None:
        for module in self.modules():
            if isinstance(module, Stage):
                module.backend = self._backend

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the fast path's GEMMs (:attr:`precision`'s): float32, bfloat16 or float16."""
        return self.precision.gemm_dtype

    def extra_repr(self) -> str:
        return f"backend={self.backend}, stateful={self.stateful}, precision={self.precision}"

    @property
    def device(self) -> torch.device:
        return self.token_embedder.projection.weight.device

    def weights(self) -> ElmoWeights | ManyLangsWeights:
        """The module's current parameters as an :class:`ElmoWeights` (or :class:`ManyLangsWeights`),
        no copies."""
        emb, enc = self.token_embedder, self.encoder
        lstm = [
            tuple(LstmWeights(*layer.flat()) for layer in pair) for pair in zip(enc.forward_layers, enc.backward_layers)
        ]
        if isinstance(emb, WordCharTokenEmbedder):
            cnn, fe = emb.char_cnn, self.front_end
            return ManyLangsWeights(
                options=self.options,
                char_vocab=fe.char_vocab or {},
                word_vocab=fe.word_vocab or {},
                word_embedding=emb.word_embedding,
                char_embedding=None if cnn is None else cnn.char_embedding,
                conv_weights=[] if cnn is None else cnn.conv_weights(),
                conv_biases=[] if cnn is None else cnn.conv_biases(),
                highway_weights=[] if cnn is None else emb.highways.weights(),
                highway_biases=[] if cnn is None else emb.highways.biases(),
                proj_weight=emb.projection.weight,
                proj_bias=emb.projection.bias,
                lstm=lstm,
            )
        return ElmoWeights(
            options=self.options,
            char_embedding=emb.char_cnn.char_embedding,
            conv_weights=emb.char_cnn.conv_weights(),
            conv_biases=emb.char_cnn.conv_biases(),
            highway_weights=emb.highways.weights(),
            highway_biases=emb.highways.biases(),
            proj_weight=emb.projection.weight,
            proj_bias=emb.projection.bias,
            lstm=lstm,
        )

    def save(self, directory: str | os.PathLike) -> tuple[str, str]:
        """Write the current weights (fine-tuned, say) as ``options.json`` + ``weights.hdf5`` in the
        bilm-tf layout into ``directory``, the files allennlp, bilm-tf and ``elmo-fast embed`` load;
        each file replaced atomically. Returns their paths.

        An ELMoForManyLangs model is written in its own layout instead (config.json, its config, the
        dictionaries, token_embedder.pkl and encoder.pkl; zip pickles), which ELMoForManyLangs and
        every elmo-fast entry point load as a model directory; returns the paths of config.json and
        encoder.pkl."""
        from ..formats.model_dir import save_model_dir

        return save_model_dir(directory, self.weights())

    # ---- states (stateful mode; the encoder holds them) --------------------------------------------------

    def reset_states(self) -> None:
        """Forget the carried LSTM states (stateful mode)."""
        self.encoder.reset_states()

    def get_states(self) -> tuple[Tensor, Tensor] | None:
        """The LSTM states carried to the next batch (stateful mode): h [L, rows, 2P] and c
        [L, rows, 2C], rows being the largest batch seen; None before the first batch."""
        return self.encoder.get_states()

    def set_states(self, states: tuple[Tensor, Tensor] | None) -> None:
        """Carry these states (as :meth:`get_states` returned them) into the next batch."""
        self.encoder.set_states(states)

    def _initial_states(self, batch_size: int) -> tuple[Tensor | None, Tensor | None]:
        return self.encoder.initial_states(batch_size) if self.stateful else (None, None)

    @contextmanager
    def _stage(self, name: str):
        if not self.profile:
            yield
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.stage_times[name] = self.stage_times.get(name, 0.0) + time.perf_counter() - start

    @property
    def vocab_size(self) -> int:
        """Entries of ``vocab_to_cache`` (0 without one)."""
        return 0 if self._vocab_char_ids is None else self._vocab_char_ids.shape[0]

    # ---- forward ---------------------------------------------------------------------------------------

    def forward(
        self, char_ids: Tensor | None = None, word_inputs: Tensor | None = None
    ) -> dict[str, Tensor | list[Tensor]]:
        word_inputs = usable_word_inputs(char_ids, word_inputs, self.vocab_size or None, self.token_width)
        W = self.token_width
        if word_inputs is None and (char_ids is None or char_ids.dim() != 3 or char_ids.shape[-1] != W):
            got = None if char_ids is None else list(char_ids.shape)
            how = "" if W == 50 else " (this model's own ids: model.batch_to_ids(sentences))"
            raise ElmoFastError(f"char_ids must have shape [batch, tokens, {W}]{how}, got {got}")
        device = self.device
        fast_inference = not (self.backend == "reference" or self._fine_tuning())
        if fast_inference:
            self.precision.check_device(device)
        if fast_inference and self._plans_on_host(char_ids if word_inputs is None else word_inputs):
            # Inputs on the host, model on a GPU: the schedule, the distinct tokens and the lengths are
            # worked out here before anything moves, so that the forward never waits for the GPU.
            batch_size = (char_ids if word_inputs is None else word_inputs).shape[0]
            h0, c0 = self._initial_states(batch_size)
            with torch.no_grad(), self.precision.gemm_mode(device):
                activations, mask, h, c = self._forward_planned_on_host(char_ids, word_inputs, h0, c0)
            if self.stateful:
                self.encoder.update_states(h, c)
            return {"activations": activations, "mask": mask}
        if word_inputs is not None:
            word_inputs = word_inputs.to(device)
            batch_size = word_inputs.shape[0]
        else:
            char_ids = char_ids.to(device)
            batch_size = char_ids.shape[0]
        h0, c0 = self._initial_states(batch_size)
        if not fast_inference:
            if word_inputs is not None:  # the words' own char ids: exactly the char path, gradients included
                char_ids = self._vocab_char_ids[word_inputs]
            if self.backend == "reference" or char_ids.shape[0] * char_ids.shape[1] == 0:
                with self._stage("reference"):
                    activations, mask, h, c = reference.bilm_ref(
                        char_ids, self.weights(), h0, c0, self.front_end.bos, self.front_end.eos
                    )
            else:
                with self._stage("autograd"):
                    activations, mask, h, c = self._forward_autograd(char_ids, h0, c0)
        else:
            # the fast ops have no backward: their outputs are constants to autograd (this matters in
            # eval() with weights that require grad, where grad mode may still be on)
            with torch.no_grad(), self.precision.gemm_mode(device):
                if word_inputs is not None:
                    vectors, gates, token_index, mask = self._cached_tokens(word_inputs)
                else:
                    ids, mask = self._add_sentence_boundaries(char_ids)
                    distinct, token_index = distinct_rows(ids)  # padding slots: one more "token" (zero ids)
                    vectors, gates = self._token_results(distinct)
                activations, h, c = self._contextualize(vectors, gates, token_index, mask, h0, c0)
        if self.stateful:
            self.encoder.update_states(h, c)
        return {"activations": activations, "mask": mask}

    def embed(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Outputs without the sentence boundaries: [B, L + 1, T, 2P] and mask [B, T]."""
        out = self(char_ids)
        layers = [reference.remove_sentence_boundaries(a, out["mask"]) for a in out["activations"]]
        return torch.stack([x for x, _ in layers], dim=1), layers[0][1]

    def _fine_tuning(self) -> bool:
        """Whether this call must give the biLM's weights gradients: train mode, grad mode on, and a
        weight that requires grad. Everything else (eval(), no_grad, inference_mode, a frozen biLM)
        runs the fast ops, whose outputs carry no gradient to the biLM."""
        return self.training and torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())

    def _plans_on_host(self, inputs: Tensor) -> bool:
        """Whether a fast inference call plans on the host: the model on a GPU, its inputs on the CPU."""
        return self.device.type == "cuda" and inputs.device.type == "cpu"

    def _add_sentence_boundaries(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        return reference.add_sentence_boundaries(char_ids, self.front_end.bos, self.front_end.eos)

    def _forward_autograd(self, char_ids: Tensor, h0: Tensor | None, c0: Tensor | None):
        """What fine-tuning runs: each distinct token of the batch (padding included, as one more)
        through the token embedder once, then the biLSTM, under autograd. On the fast backend (where
        the ops have backward passes) that is the fused char CNN and highway ops and
        :func:`~elmo_fast.bilm.ops.bilstm_train` (backpropagation through time in C++); otherwise the
        reference stages. Equal to ``bilm_ref`` up to fp32 summation order."""
        ids, mask = self._add_sentence_boundaries(char_ids)
        distinct, token_index = distinct_rows(ids)
        lengths = mask.sum(dim=1)
        enc = self.encoder
        if self._fast_gradients():
            vectors = self.token_embedder.forward_fast(distinct)
            outputs, h, c = ops.bilstm_train(
                vectors[token_index], lengths, enc.flat_weights(), enc.cell_clip, enc.proj_clip, h0, c0, training=False
            )
        else:
            vectors = self.token_embedder.forward_reference(distinct)
            outputs, h, c = enc.forward_reference(enc.layer0_gates(vectors), token_index, lengths, h0, c0)
        tokens = vectors[token_index] * mask.unsqueeze(-1).to(vectors.dtype)
        return [torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], mask, h, c

    def _fast_gradients(self) -> bool:
        """Whether the fast ops can give this model's gradients (backward passes on its device)."""
        return self.backend == "fast" and fast_gradients(self.device)

    def _forward_planned_on_host(
        self, char_ids: Tensor | None, word_inputs: Tensor | None, h0: Tensor | None, c0: Tensor | None
    ) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
        """The fast forward from inputs on the CPU, without a device sync: the sentence boundaries,
        the distinct tokens (:func:`~elmo_fast.bilm.distinct_rows.distinct_rows`), the token cache's
        keys and the lengths are worked out on the CPU; the distinct tokens, token_index and mask go
        to the device through pinned memory; the bilstm op takes its lengths on the CPU (its schedule
        is made from them). Only kernels are then queued: nothing waits for the GPU, and a CUDA graph
        can capture it all."""
        device = self.device
        if word_inputs is not None:
            index_h, mask_h = vocab_index(word_inputs.long(), self.vocab_size)
            distinct_h, index_h = distinct_rows(index_h.unsqueeze(-1))
            vectors = self._vocab_vectors()[ops.to_device_async(distinct_h[:, 0], device)]
            gates = self._layer0_gates(vectors)
        else:
            ids_h, mask_h = self._add_sentence_boundaries(char_ids)
            distinct_h, index_h = distinct_rows(ids_h, mask_h)
            if (
                self.cuda_graphs > 0
                and h0 is None
                and not self.stateful
                and self.token_cache is None
                and not self.profile
            ):  # only the data varies: a captured forward may replay
                activations = self._graphs.forward(
                    distinct_h, index_h, mask_h, self._weights_key(), device, self._captured_forward
                )
                if activations is not None:
                    return activations, ops.to_device_async(mask_h, device), None, None
            vectors, gates = self._token_results(distinct_h)
        token_index, mask = ops.to_device_async(index_h, device), ops.to_device_async(mask_h, device)
        activations, h, c = self._contextualize(vectors, gates, token_index, mask, h0, c0, lengths=mask_h.sum(dim=1))
        return activations, mask, h, c

    def _captured_forward(self, distinct: Tensor, token_index: Tensor, mask: Tensor, lengths: Tensor) -> list[Tensor]:
        """The forward a CUDA graph captures: it reads its static inputs only."""
        vectors = self._token_vectors(distinct)
        gates = self._layer0_gates(vectors)
        activations, _, _ = self._contextualize(vectors, gates, token_index, mask, None, None, lengths=lengths)
        return activations

    # ---- the fast path's pieces ------------------------------------------------------------------------

    def _weights_key(self) -> tuple:
        """What the caches derived from the weights are checked against (:func:`weights_key`, with the
        precision and whether the GEMM weights are packed): fine-tuning never leaves a stale copy behind."""
        return weights_key(self, self.precision.name, self.cpu_tuning().packed)

    def cpu_tuning(self, precision: str | None = None) -> CpuTuning:
        """The CPU kernels' choices for this model in ``precision`` (default: its own) at torch's current
        thread count, as this machine measured them (:mod:`elmo_fast.tuning`: at first use, then read from
        its store; nothing is kept in the model); the kernels' defaults off the CPU or the fast backend,
        and inside torch.compile (which cannot trace a measurement)."""
        if (
            self.device.type != "cpu"
            or self.backend != "fast"
            or not ops.HAS_EXTENSION
            or torch.compiler.is_compiling()
        ):
            return DEFAULT_TUNING
        precision = precision or self.precision.name
        if precision == "tf32":  # a CPU has no TF32: fp32's kernels, hence fp32's choice (bit for bit the same)
            precision = "fp32"
        emb = self.token_embedder
        highway = None
        if isinstance(emb, CharTokenEmbedder):
            highway = (emb.highways.weights(), emb.highways.biases(), emb.projection.weight, emb.projection.bias)
        return cpu_tuning_for(self.encoder.flat_weights(), highway, precision)

    def _token_results(self, distinct: Tensor) -> tuple[Tensor, Tensor]:
        """Token vectors [U, P] and layer-0 gates [U, 2, 4C] on the model's device of the distinct
        token rows ``distinct`` [U, W] (on the CPU or the model's device), through the token cache."""
        if self.token_cache is None:
            vectors = self._token_vectors(ops.to_device_async(distinct, self.device))
            return vectors, self._layer0_gates(vectors)

        def compute(rows: Tensor) -> tuple[Tensor, Tensor]:
            vectors = self._token_vectors(ops.to_device_async(rows, self.device))
            return vectors, self._layer0_gates(vectors)

        return self.token_cache.results(distinct, self._weights_key(), self._key_dtype, compute)

    def _lowp_weights(self) -> dict | None:
        """The token embedder's GEMM weights in the precision's dtype (None in fp32)."""
        if not self.precision.low_precision:
            return None
        return self._derived.token_embedder_weights(self.token_embedder, self.compute_dtype, self._weights_key())

    def _token_vectors(self, distinct_ids: Tensor) -> Tensor:
        emb = self.token_embedder
        with self._stage("char_cnn"):
            cnn = emb.char_features_fast(distinct_ids)
        with self._stage("highway"):
            return emb.project_fast(cnn, self._lowp_weights(), distinct_ids, self.cpu_tuning().highway_gemv_rows)

    def _layer0_gates(self, vectors: Tensor) -> Tensor:
        # fp32 gates in every mode: once per distinct token (and cached). With packed bf16 weights (the
        # CPU's BRGeMM kernel), a bf16 GEMM with an fp32 result; else an fp32 one.
        tuning = self.cpu_tuning()
        with self._stage("lstm"):
            if tuning.packed:
                w = self._flat_lstm()
                return ops.layer0_gates_packed(vectors, [w[0], w[4]], [w[2], w[6]])
            return self.encoder.layer0_gates_fast(vectors, tuning.linear_gemv_rows)

    def _flat_lstm(self) -> list[Tensor]:
        """The bilstm op's flat weight list in the precision's dtype, packed where the calibration chose
        it (see :meth:`~elmo_fast.bilm.derived_weights.DerivedWeights.lstm_op_weights`)."""
        pack = ops.pack_weight if self.cpu_tuning().packed else None
        return self._derived.lstm_op_weights(
            self.encoder.flat_weights(), self.device, self.compute_dtype, self._weights_key, pack
        )

    def _contextualize(
        self,
        vectors: Tensor,
        gates: Tensor,
        token_index: Tensor,
        mask: Tensor,
        h0: Tensor | None,
        c0: Tensor | None,
        lengths: Tensor | None = None,
    ) -> tuple[list[Tensor], Tensor, Tensor]:
        """The biLSTM over the distinct tokens' results; the fast path's activations and final states.
        lengths: [B] (on the CPU when the caller has them there: the op plans from them without a
        device sync), else mask.sum(dim=1)."""
        weights = self._flat_lstm()
        if self.precision.low_precision and gates.is_cuda:
            # The CUDA bilstm takes one floating dtype for all its inputs (the CPU one takes fp32 input
            # gates and biases beside bf16 weights): round the layer-0 gates to it (the biases are, in
            # _flat_lstm), as the gates of layers >= 1 are inside the op. States carried across
            # batches stay in it.
            gates = gates.to(self.compute_dtype)
        with self._stage("lstm"):
            lengths = mask.sum(dim=1) if lengths is None else lengths
            outputs, h, c = self.encoder.forward_fast(
                gates, token_index, lengths, h0, c0, weights, self.cpu_tuning().lstm
            )
            outputs = outputs.float()
        tokens = vectors[token_index] * mask.unsqueeze(-1).to(vectors.dtype)
        return [torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], h, c

    # ---- vocab_to_cache ---------------------------------------------------------------------------------

    def _cached_tokens(self, word_inputs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The vocabulary cache's counterpart of the sentence boundaries + the distinct tokens.

        word_inputs [B, T], ids in [0, V) -> token vectors [U, P], layer-0 gates [U, 2, 4C], token_index
        [B, T + 2] and mask [B, T + 2]. Only the vectors are kept for the whole vocabulary: its gates
        would take 32 C bytes a word (128 KiB for the original model), so they are computed here for
        the batch's distinct words only, as the char path does.
        """
        index, mask = vocab_index(word_inputs, self.vocab_size)
        distinct, token_index = distinct_rows(index.unsqueeze(-1))
        vectors = self._vocab_vectors()[distinct[:, 0]]
        return vectors, self._layer0_gates(vectors), token_index, mask

    def _vocab_vectors(self) -> Tensor:
        """[V + 2, P]: the context-free vectors of vocab_to_cache, then of <S> and </S>."""

        def make() -> Tensor:
            ids = torch.cat(
                [self._vocab_char_ids, self._vocab_char_ids.new_tensor([self.front_end.bos, self.front_end.eos])]
            )
            with torch.no_grad():  # chunks bound the char CNN's memory for large vocabularies
                return torch.cat([self._token_vectors(chunk) for chunk in ids.split(4096)])

        return self._derived.vocab_vectors(self._weights_key(), make)
