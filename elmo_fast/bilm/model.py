"""``ElmoBiLm``: the biLM as a tree of stage modules (:mod:`elmo_fast.bilm.stages`), with the
state modes, the choice of backend, and the caches that let the fast path do less work."""
from __future__ import annotations

import os
import re
import time
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import ElmoFastError
from ..formats.bilm_tf import ElmoOptions, ElmoWeights, LstmWeights, load_model_files
from ..formats.manylangs_dir import ManyLangsConfig, ManyLangsWeights
from ..formats.model_dir import load_model_dir
from . import ops, reference
from .char_ids import AllenNlpCharIds
from .word_char_ids import ManyLangsIds
from .stages import (BiLstmEncoder, CharCNN, CharTokenEmbedder, Highway, LstmLayer, Stage, WordCharTokenEmbedder,
                     _linear)

BACKENDS = ("auto", "fast", "reference")
_warned_fallback = False


def resolve_backend(backend: str) -> str:
    """"auto" is "fast" when the extension is built, else "reference" (with a warning, once)."""
    global _warned_fallback
    if backend not in BACKENDS:
        raise ElmoFastError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    has_fast = ops.HAS_EXTENSION and all(hasattr(ops, name) for name in ("char_cnn", "highway", "bilstm"))
    if backend == "fast":
        ops.require_extension()
        if not has_fast:
            raise ElmoFastError("this build of elmo_fast._C lacks the fast-path ops; rebuild it with "
                                "`pip install --no-build-isolation -e .`")
    if backend == "auto":
        if has_fast:
            return "fast"
        if not _warned_fallback:
            if ops.EXTENSION_LOAD_FAILED:
                why = f"elmo_fast._C does not load ({ops.EXTENSION_IMPORT_ERROR})"
            else:
                why = ("elmo_fast._C is not built. Build the fast path from the source tree with "
                       "`pip install --no-build-isolation -e .`")
            warnings.warn(f"elmo-fast runs its plain-PyTorch reference path (slow): {why}.", RuntimeWarning,
                          stacklevel=3)
            _warned_fallback = True
        return "reference"
    return backend


def _lstm_tensors(w: LstmWeights) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return w.w_ih, w.w_hh, w.bias, w.w_proj


def resolve_model(options_file, weight_file, model_dir) -> ElmoWeights | ManyLangsWeights:
    """The weights the constructors of ElmoBiLm, Elmo and ElmoEmbedder are given, in any of their forms:
    options + weights files, loaded weights, or a model directory (``model_dir=``, or the first
    argument alone) of either kind."""
    if isinstance(weight_file, (ElmoWeights, ManyLangsWeights)):
        return weight_file
    if model_dir is not None:
        if options_file is not None or weight_file is not None:
            raise ElmoFastError("give either model_dir or options_file and weight_file, not both")
        return load_model_dir(model_dir)
    if options_file is not None and weight_file is None and os.path.isdir(options_file):
        return load_model_dir(options_file)
    if options_file is None and weight_file is None:  # no model named: the one bundled in the package
        from ..pretrained.bundled import default_model_dir

        return load_model_dir(default_model_dir())
    if options_file is None or weight_file is None:
        raise ElmoFastError("give options_file and weight_file (bilm-tf), or a model directory (model_dir=, "
                            "bilm-tf or ELMoForManyLangs)")
    return load_model_files(options_file, weight_file)


_ALLENNLP_KEYS = [  # allennlp's _ElmoBiLm parameter names -> ours (relative to the biLM)
    (re.compile(r"_token_embedder\._char_embedding_weights$"), "token_embedder.char_cnn.char_embedding"),
    (re.compile(r"_token_embedder\.char_conv_(\d+)\.(weight|bias)$"), r"token_embedder.char_cnn.convs.\1.\2"),
    (re.compile(r"_token_embedder\._highways\._layers\.(\d+)\.(weight|bias)$"), r"token_embedder.highways.layers.\1.\2"),
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


def _rename_legacy_keys(state_dict: dict, prefix: str, *args) -> None:
    """Load state dicts saved by allennlp (``_ElmoBiLm``, inside ``Elmo`` or any model) and by
    elmo-fast 0.1 (flat parameter lists) into the stage modules, renaming their keys in place."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
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


def distinct_rows(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct rows of ``ids`` [B, T, W] among the positions ``mask`` [B, T] holds, on the CPU.

    Returns distinct [U, W] (U >= 1; in no particular order) and index [B, T], the row of each
    position (0 outside the mask, a row the caller multiplies by 0 or never reads). What
    ``torch.unique(dim=0)`` gives, without its lexicographic sort of whole rows (tens of ms for a
    large batch on the CPU): rows are hashed to 64 bits, the hashes made unique, and the result
    checked against the rows themselves (a collision, which this check would catch, falls back to
    ``torch.unique(dim=0)``: the result is exact either way).
    """
    B, T, W = ids.shape
    rows = ids[mask].numpy()
    index = torch.zeros(B, T, dtype=torch.long)
    if rows.shape[0] == 0:
        return ids.new_zeros(1, W), index
    hashes = (rows.astype(np.uint64) * _row_hash_multipliers(W)).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    distinct = rows[first]
    if np.array_equal(distinct[inverse.reshape(-1)], rows):
        index[mask] = torch.from_numpy(inverse.reshape(-1).astype(np.int64))
        return torch.from_numpy(distinct), index
    distinct_t, inverse_t = torch.unique(ids[mask], dim=0, return_inverse=True)  # a hash collision
    index[mask] = inverse_t
    return distinct_t, index


_HASH_MULTIPLIERS: dict[int, np.ndarray] = {}


def _row_hash_multipliers(width: int) -> np.ndarray:
    """Fixed random odd 64-bit multipliers, one per column: a row's hash is sum_j ids[j] * m_j mod 2^64."""
    m = _HASH_MULTIPLIERS.get(width)
    if m is None:
        m = np.random.default_rng(20180215).integers(0, 2**64 - 1, size=width, dtype=np.uint64, endpoint=True) | 1
        _HASH_MULTIPLIERS[width] = m
    return m


class TokenCache:
    """Context-free results of distinct tokens, kept across batches: LRU, bounded in entries.

    Keyed by a token's row of ids (its 50 character ids for bilm-tf models); holds its vector [P] and
    its layer-0 input gates [2, 4C], the two results the fast path would otherwise recompute for
    every batch it appears in.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[Tensor, Tensor]] = OrderedDict()
        #: the ElmoBiLm weights' key (ElmoBiLm._weights_key) the entries were computed with
        self.weights_key: tuple | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> tuple[Tensor, Tensor] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, value: tuple[Tensor, Tensor]) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


class CudaGraphRunner:
    """One forward captured as a CUDA graph: ``capture(body)`` runs ``body`` once eagerly on a side
    stream (a warm-up, as torch recommends: cuBLAS workspaces, lazily made copies), then once under
    capture, and keeps its outputs (static tensors, in the graph's own memory pool); ``replay()``
    reruns the captured kernels, which rewrite those outputs from the static inputs ``body`` reads."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.graph = torch.cuda.CUDAGraph()
        self.outputs: list[Tensor] = []

    def capture(self, body) -> None:
        with torch.cuda.device(self.device):  # the model's GPU, whichever is current
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                body()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(self.graph):
                self.outputs = body()

    def replay(self) -> list[Tensor]:
        with torch.cuda.device(self.device):
            self.graph.replay()
        return self.outputs


class _CapturedBucket:
    """A captured forward and the static inputs it reads: the distinct tokens (padded with "no token"
    rows to a power of two), token_index and mask of one bucket's shapes and lengths."""

    def __init__(self, runner, distinct: Tensor, token_index: Tensor, mask: Tensor, lengths: Tensor) -> None:
        self.runner = runner
        self.distinct = distinct
        self.token_index = token_index
        self.mask = mask
        self.lengths = lengths  # on the CPU: the bilstm op's schedule, fixed in the graph


class ElmoBiLm(nn.Module):
    """allennlp's ``_ElmoBiLm``: char CNN, highway, projection and the biLSTM.

    ``forward(char_ids [B, T, 50], word_inputs [B, T] = None)`` returns ``{"activations": [L + 1
    tensors [B, T + 2, 2P]], "mask": [B, T + 2]}``, sentence boundaries included, as allennlp does.

    The model: ``options_file`` and ``weight_file`` (bilm-tf's files), or a model directory, as
    ``model_dir=`` or the first argument alone: bilm-tf's (options.json + weights.hdf5) or an
    ELMoForManyLangs one (:mod:`~elmo_fast.formats.manylangs_dir`). An ELMoForManyLangs model has its
    own front end (:attr:`front_end`, :class:`~elmo_fast.bilm.word_char_ids.ManyLangsIds`): its
    token rows are ``[word id] + [char ids]`` of its own dictionaries, made by
    :meth:`batch_to_ids`, its sentence boundaries ``<bos>`` / ``<eos>``, and its token embedder a
    :class:`~elmo_fast.bilm.stages.WordCharTokenEmbedder`; everything else is the same.
    :meth:`batch_to_ids` gives allennlp's ids for a bilm-tf model.

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
    the rows it does not use untouched.

    cuda_graphs=N (off by default): on a GPU, the fast forward of char ids given on the CPU is
    captured as a CUDA graph per bucket, the batch's shape and exact lengths (a bucket's second
    batch is captured, later ones replay it: one launch instead of thousands, for small batches
    whose time goes to launches), keeping the N most recent. Only where nothing varies but the
    data: stateless, no token cache, no profile; other calls run as without. Graphs are dropped
    when the weights change, and each holds its own memory.
    """

    #: the class that captures and replays a forward (tests substitute a CPU stand-in)
    _graph_runner = CudaGraphRunner

    def __init__(self, options_file: str | os.PathLike | None = None,
                 weight_file: str | os.PathLike | ElmoWeights | ManyLangsWeights | None = None,
                 requires_grad: bool = False, stateful: bool = False, backend: str = "auto",
                 token_cache_size: int = 0, dtype: torch.dtype = torch.float32,
                 vocab_to_cache: Sequence[str] | None = None, *, model_dir: str | os.PathLike | None = None,
                 cuda_graphs: int = 0) -> None:
        super().__init__()
        self.backend = resolve_backend(backend)
        if dtype not in (torch.float32, torch.bfloat16):
            raise ElmoFastError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        if dtype == torch.bfloat16 and self.backend != "fast":
            raise ElmoFastError("dtype=torch.bfloat16 needs the fast backend (the reference path is fp32)")
        #: the GEMMs' dtype on the fast path: bfloat16 runs them in bf16 with fp32 accumulation, while
        #: the char CNN, cell states and everything elementwise stay fp32 (parameters stay fp32 too)
        self.compute_dtype = dtype
        self._lowp: tuple[torch.device, dict] | None = None
        # the bilstm op's weight lists, per (device type, device index, dtype): see _flat_lstm
        self._lstm_op_weights: dict[tuple, tuple[tuple, list[Tensor]]] = {}
        if cuda_graphs < 0:
            raise ElmoFastError(f"cuda_graphs must be >= 0 (the captured buckets to keep; 0: none), got {cuda_graphs}")
        #: CUDA graphs of the fast forward kept, per bucket (0: none; see the class docstring)
        self.cuda_graphs = cuda_graphs
        self._graphs: OrderedDict[tuple, _CapturedBucket] = OrderedDict()
        self._graphs_seen: OrderedDict[tuple, None] = OrderedDict()
        self._graphs_weights_key: tuple | None = None
        self.stateful = stateful
        #: distinct tokens whose context-free results are kept across batches (fast path; 0: none)
        self.token_cache = TokenCache(token_cache_size) if token_cache_size > 0 else None
        #: when True, forward() adds the seconds spent per stage to stage_times
        self.profile = False
        self.stage_times: dict[str, float] = {}
        w = resolve_model(options_file, weight_file, model_dir)
        self.options: ElmoOptions | ManyLangsConfig = w.options
        o = w.options
        g = requires_grad
        # front_end: tokens -> rows of ids, allennlp's character ids or the model's own (ELMoForManyLangs);
        # token_embedder (stage 1): rows of ids -> context-free token vectors [P]
        self.front_end: AllenNlpCharIds | ManyLangsIds
        self.token_embedder: CharTokenEmbedder | WordCharTokenEmbedder
        if isinstance(w, ManyLangsWeights):
            self.front_end = ManyLangsIds(
                w.char_vocab if w.char_embedding is not None else None,
                w.word_vocab if w.word_embedding is not None else None, o.max_characters_per_token)
            has_chars = w.char_embedding is not None
            self.token_embedder = WordCharTokenEmbedder(
                w.word_embedding,
                CharCNN(w.char_embedding, w.conv_weights, w.conv_biases, o.activation, requires_grad=g)
                if has_chars else None,
                Highway(w.highway_weights, w.highway_biases, requires_grad=g) if has_chars else None,
                _linear(w.proj_weight, w.proj_bias, g), requires_grad=g)
        else:
            self.front_end = AllenNlpCharIds()
            self.token_embedder = CharTokenEmbedder(
                CharCNN(w.char_embedding, w.conv_weights, w.conv_biases, o.activation, requires_grad=g),
                Highway(w.highway_weights, w.highway_biases, requires_grad=g),
                _linear(w.proj_weight, w.proj_bias, g))
        # the token cache's keys: int16 holds every id of allennlp's rows (100-byte keys)
        self._key_dtype = torch.int16 if self.front_end.max_id < 2**15 else torch.int32
        #: stage 2: the biLSTM over the token vectors
        self.encoder = BiLstmEncoder(
            [LstmLayer(*_lstm_tensors(f), reverse=False, requires_grad=g) for f, _ in w.lstm],
            [LstmLayer(*_lstm_tensors(b), reverse=True, requires_grad=g) for _, b in w.lstm],
            o.cell_clip, o.proj_clip)
        self._set_stage_backends()
        self._register_load_state_dict_pre_hook(_rename_legacy_keys)
        self._states: tuple[Tensor, Tensor] | None = None
        # vocab_to_cache: the words' char ids, row 0 zeros (padding); an empty list means no cache,
        # as in allennlp. Not in the state dict: it is part of the configuration, not of the weights.
        self._vocab_table: tuple[tuple, Tensor] | None = None
        vocab_ids = None
        if vocab_to_cache is not None:
            if isinstance(vocab_to_cache, str) or not all(isinstance(w, str) for w in vocab_to_cache):
                raise ElmoFastError("vocab_to_cache must be a list of words (str), e.g. "
                                    "vocab.get_index_to_token_vocabulary().values()")
            if len(vocab_to_cache):
                vocab_ids = torch.tensor([self.front_end.token_ids(w) for w in vocab_to_cache], dtype=torch.long)
                vocab_ids[0] = 0
        self.register_buffer("_vocab_char_ids", vocab_ids, persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .cpu(), .float(), ...: copies derived from the weights go at once (they would
        # be remade anyway, the weights' storage having changed), not at the next forward.
        self._lowp = None
        self._lstm_op_weights = {}
        self.clear_cuda_graphs()
        return super()._apply(fn, *args, **kwargs)

    def clear_cuda_graphs(self) -> None:
        """Drop the captured forwards (cuda_graphs) and their memory."""
        if "_graphs" in self.__dict__:
            self._graphs.clear()
            self._graphs_seen.clear()

    @classmethod
    def from_weights(cls, weights: ElmoWeights | ManyLangsWeights, **kwargs) -> "ElmoBiLm":
        """A biLM holding these tensors (as :func:`~elmo_fast.formats.bilm_tf.load_model_files` or
        :func:`~elmo_fast.formats.manylangs_dir.load_manylangs` return them) as its parameters; keyword
        arguments as the constructor's."""
        return cls(None, weights, **kwargs)

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
    def backend(self) -> str:
        """"fast" or "reference": the forward every stage runs (see the class docstring for gradients)."""
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

    def extra_repr(self) -> str:
        dtype = str(self.compute_dtype).replace("torch.", "")
        return f"backend={self.backend}, stateful={self.stateful}, dtype={dtype}"

    @property
    def device(self) -> torch.device:
        return self.token_embedder.projection.weight.device

    def weights(self) -> ElmoWeights | ManyLangsWeights:
        """The module's current parameters as an :class:`ElmoWeights` (or :class:`ManyLangsWeights`),
        no copies."""
        emb, enc = self.token_embedder, self.encoder
        lstm = [tuple(LstmWeights(*layer.flat()) for layer in pair)
                for pair in zip(enc.forward_layers, enc.backward_layers)]
        if isinstance(emb, WordCharTokenEmbedder):
            cnn, fe = emb.char_cnn, self.front_end
            return ManyLangsWeights(
                options=self.options, char_vocab=fe.char_vocab or {}, word_vocab=fe.word_vocab or {},
                word_embedding=emb.word_embedding, char_embedding=None if cnn is None else cnn.char_embedding,
                conv_weights=[] if cnn is None else cnn.conv_weights(),
                conv_biases=[] if cnn is None else cnn.conv_biases(),
                highway_weights=[] if cnn is None else emb.highways.weights(),
                highway_biases=[] if cnn is None else emb.highways.biases(),
                proj_weight=emb.projection.weight, proj_bias=emb.projection.bias, lstm=lstm)
        return ElmoWeights(
            options=self.options, char_embedding=emb.char_cnn.char_embedding,
            conv_weights=emb.char_cnn.conv_weights(), conv_biases=emb.char_cnn.conv_biases(),
            highway_weights=emb.highways.weights(), highway_biases=emb.highways.biases(),
            proj_weight=emb.projection.weight, proj_bias=emb.projection.bias, lstm=lstm)

    def save(self, directory: str | os.PathLike) -> tuple[str, str]:
        """Write the current weights (fine-tuned, say) as ``options.json`` + ``weights.hdf5`` in the
        bilm-tf layout into ``directory``, the files allennlp, bilm-tf and ``elmo-fast embed`` load;
        each file replaced atomically. Returns their paths.

        An ELMoForManyLangs model is written in its own layout instead (config.json, its config, the
        dictionaries, token_embedder.pkl and encoder.pkl; zip pickles), which ELMoForManyLangs and
        every elmo-fast entry point load as a model directory; returns the paths of config.json and
        encoder.pkl."""
        from ..formats.bilm_tf import save_model_files

        os.makedirs(directory, exist_ok=True)
        weights = self.weights()
        if isinstance(weights, ManyLangsWeights):
            from ..formats.manylangs_dir import CONFIG_FILE, ENCODER_PKL, save_manylangs

            saved = save_manylangs(directory, weights)
            return os.path.join(saved, CONFIG_FILE), os.path.join(saved, ENCODER_PKL)
        options, weights_path = os.path.join(directory, "options.json"), os.path.join(directory, "weights.hdf5")
        save_model_files(options, weights_path, weights)
        return options, weights_path

    def reset_states(self) -> None:
        """Forget the carried LSTM states (stateful mode)."""
        self._states = None

    def get_states(self) -> tuple[Tensor, Tensor] | None:
        """The LSTM states carried to the next batch (stateful mode): h [L, rows, 2P] and c
        [L, rows, 2C], rows being the largest batch seen; None before the first batch."""
        return self._states

    def set_states(self, states: tuple[Tensor, Tensor] | None) -> None:
        """Carry these states (as :meth:`get_states` returned them) into the next batch."""
        if states is None:
            self._states = None
            return
        h, c = states
        L, P2, C2 = self.options.n_layers, 2 * self.options.projection_dim, 2 * self.options.cell_dim
        if h.dim() != 3 or c.dim() != 3 or (h.shape[0], h.shape[2]) != (L, P2) or (c.shape[0], c.shape[2]) != (L, C2) \
                or h.shape[1] != c.shape[1]:
            raise ElmoFastError(f"states must be h [{L}, rows, {P2}] and c [{L}, rows, {C2}], got h {list(h.shape)} "
                                f"and c {list(c.shape)}")
        self._states = (h.detach().to(self.device), c.detach().to(self.device))

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

    def forward(self, char_ids: Tensor | None = None,
                word_inputs: Tensor | None = None) -> dict[str, Tensor | list[Tensor]]:
        word_inputs = self._cached_word_inputs(char_ids, word_inputs)
        W = self.token_width
        if word_inputs is None and (char_ids is None or char_ids.dim() != 3 or char_ids.shape[-1] != W):
            got = None if char_ids is None else list(char_ids.shape)
            how = "" if W == 50 else " (this model's own ids: model.batch_to_ids(sentences))"
            raise ElmoFastError(f"char_ids must have shape [batch, tokens, {W}]{how}, got {got}")
        device = self.device
        fast_inference = not (self.backend == "reference" or self._fine_tuning())
        if fast_inference and self._plans_on_host(char_ids if word_inputs is None else word_inputs):
            # Inputs on the host, model on a GPU: the schedule, the distinct tokens and the lengths are
            # worked out here before anything moves, so that the forward never waits for the GPU.
            batch_size = (char_ids if word_inputs is None else word_inputs).shape[0]
            h0, c0 = self._initial_states(batch_size)
            with torch.no_grad():
                activations, mask, h, c = self._forward_planned_on_host(char_ids, word_inputs, h0, c0)
            if self.stateful:
                self._update_states(h, c)
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
                    activations, mask, h, c = reference.bilm_ref(char_ids, self.weights(), h0, c0,
                                                                 self.front_end.bos, self.front_end.eos)
            else:
                with self._stage("autograd"):
                    activations, mask, h, c = self._forward_autograd(char_ids, h0, c0)
        else:
            # the fast ops have no backward: their outputs are constants to autograd (this matters in
            # eval() with weights that require grad, where grad mode may still be on)
            with torch.no_grad():
                if word_inputs is not None:
                    vectors, gates, token_index, mask = self._cached_tokens(word_inputs)
                else:
                    ids, mask = self._add_sentence_boundaries(char_ids)
                    vectors, gates, token_index = self._distinct_tokens(ids)
                activations, h, c = self._contextualize(vectors, gates, token_index, mask, h0, c0)
        if self.stateful:
            self._update_states(h, c)
        return {"activations": activations, "mask": mask}

    def _plans_on_host(self, inputs: Tensor) -> bool:
        """Whether a fast inference call plans on the host: the model on a GPU, its inputs on the CPU."""
        return self.device.type == "cuda" and inputs.device.type == "cpu"

    def _forward_planned_on_host(self, char_ids: Tensor | None, word_inputs: Tensor | None, h0: Tensor | None,
                                 c0: Tensor | None) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
        """The fast forward from inputs on the CPU, without a device sync: the sentence boundaries,
        the distinct tokens (:func:`distinct_rows`), the token cache's keys and the lengths are worked
        out on the CPU; the distinct tokens, token_index and mask go to the device through pinned
        memory; the bilstm op takes its lengths on the CPU (its schedule is made from them). Only
        kernels are then queued: nothing waits for the GPU, and a CUDA graph can capture it all."""
        device = self.device
        if word_inputs is not None:
            index_h, mask_h = self._vocab_index(word_inputs.long())
            distinct_h, inverse = torch.unique(index_h, return_inverse=True)  # 1-d: a cheap sort
            vectors = self._vocab_vectors()[ops.to_device_async(distinct_h, device)]
            gates = self._layer0_gates(vectors)
            index_h = inverse.view(index_h.shape)
        else:
            ids_h, mask_h = self._add_sentence_boundaries(char_ids)
            distinct_h, index_h = distinct_rows(ids_h, mask_h)
            if self._graphs_apply(h0):
                activations = self._graphed_forward(distinct_h, index_h, mask_h)
                if activations is not None:
                    return activations, ops.to_device_async(mask_h, device), None, None
            vectors, gates = self._token_results(distinct_h)
        token_index, mask = ops.to_device_async(index_h, device), ops.to_device_async(mask_h, device)
        activations, h, c = self._contextualize(vectors, gates, token_index, mask, h0, c0, lengths=mask_h.sum(dim=1))
        return activations, mask, h, c

    def _graphs_apply(self, h0: Tensor | None) -> bool:
        """Whether this call may replay (or capture) a CUDA graph: only the data varies in it."""
        return (self.cuda_graphs > 0 and h0 is None and not self.stateful and self.token_cache is None
                and not self.profile)

    def _graphed_forward(self, distinct_h: Tensor, index_h: Tensor, mask_h: Tensor) -> list[Tensor] | None:
        """The activations from this bucket's captured forward (captured now if its bucket was seen
        before), or None: the caller runs the forward itself (a bucket seen for the first time)."""
        key = self._weights_key()
        if self._graphs_weights_key != key:  # graphs read the weights (and copies made of them) in place
            self.clear_cuda_graphs()
            self._graphs_weights_key = key
        lengths = mask_h.sum(dim=1)
        B, T = index_h.shape
        U, W = distinct_h.shape
        rows = max(8, 1 << (U - 1).bit_length())  # rows of the static distinct tokens: a power of two
        bucket = (B, T, W, rows, tuple(lengths.tolist()))
        entry = self._graphs.get(bucket)
        if entry is None:
            if bucket not in self._graphs_seen:  # a bucket is captured the second time it is seen
                self._graphs_seen[bucket] = None
                while len(self._graphs_seen) > 64 * self.cuda_graphs:
                    self._graphs_seen.popitem(last=False)
                return None
            entry = self._capture_bucket(distinct_h, index_h, mask_h, lengths, rows)
            self._graphs[bucket] = entry
            while len(self._graphs) > self.cuda_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(bucket)
            self._fill_bucket(entry, distinct_h, index_h, mask_h)
        return [t.clone() for t in entry.runner.replay()]

    def _fill_bucket(self, entry: _CapturedBucket, distinct_h: Tensor, index_h: Tensor, mask_h: Tensor) -> None:
        """This batch's data into a bucket's static inputs (asynchronously, from pinned memory)."""
        padded = distinct_h.new_zeros(entry.distinct.shape)  # "no token" rows past U: never indexed
        padded[: distinct_h.shape[0]] = distinct_h
        for static, host in ((entry.distinct, padded), (entry.token_index, index_h), (entry.mask, mask_h)):
            static.copy_(host.pin_memory() if static.is_cuda else host, non_blocking=static.is_cuda)

    def _capture_bucket(self, distinct_h: Tensor, index_h: Tensor, mask_h: Tensor, lengths: Tensor,
                        rows: int) -> _CapturedBucket:
        device = self.device
        entry = _CapturedBucket(None, torch.empty(rows, distinct_h.shape[1], dtype=torch.long, device=device),
                                torch.empty(index_h.shape, dtype=torch.long, device=device),
                                torch.empty(mask_h.shape, dtype=torch.bool, device=device), lengths.clone())
        self._fill_bucket(entry, distinct_h, index_h, mask_h)

        def body() -> list[Tensor]:  # reads the static inputs only
            vectors = self._token_vectors(entry.distinct)
            gates = self._layer0_gates(vectors)
            activations, _, _ = self._contextualize(vectors, gates, entry.token_index, entry.mask, None, None,
                                                    lengths=entry.lengths)
            return activations

        entry.runner = self._graph_runner(device)
        entry.runner.capture(body)
        return entry

    def _fine_tuning(self) -> bool:
        """Whether this call must give the biLM's weights gradients: train mode, grad mode on, and a
        weight that requires grad. Everything else (eval(), no_grad, inference_mode, a frozen biLM)
        runs the fast ops, whose outputs carry no gradient to the biLM."""
        return self.training and torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())

    def _forward_autograd(self, char_ids: Tensor, h0: Tensor | None, c0: Tensor | None):
        """What fine-tuning runs: each distinct token of the batch (padding included, as one more)
        through the token embedder once, then the biLSTM, under autograd. On the fast backend (where
        the ops have backward passes) that is the fused char CNN and highway ops and
        :func:`~elmo_fast.bilm.ops.bilstm_train` (backpropagation through time in C++); otherwise the
        reference stages. Equal to ``bilm_ref`` up to fp32 summation order."""
        ids, mask = self._add_sentence_boundaries(char_ids)
        B, T2, W = ids.shape
        distinct, inverse = torch.unique(ids.reshape(B * T2, W), dim=0, return_inverse=True)
        token_index = inverse.view(B, T2)
        lengths = mask.sum(dim=1)
        enc = self.encoder
        if self._fast_gradients():
            vectors = self.token_embedder.forward_fast(distinct)
            outputs, h, c = ops.bilstm_train(vectors[token_index], lengths, enc.flat_weights(), enc.cell_clip,
                                             enc.proj_clip, h0, c0, training=False)
        else:
            vectors = self.token_embedder.forward_reference(distinct)
            outputs, h, c = enc.forward_reference(enc.layer0_gates(vectors), token_index, lengths, h0, c0)
        tokens = vectors[token_index] * mask.unsqueeze(-1).to(vectors.dtype)
        return [torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], mask, h, c

    def _add_sentence_boundaries(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        return reference.add_sentence_boundaries(char_ids, self.front_end.bos, self.front_end.eos)

    def _fast_gradients(self) -> bool:
        """Whether the fast ops can give this model's gradients (backward passes on its device)."""
        if self.backend != "fast":
            return False
        return ops.HAS_CUDA_BACKWARD if self.device.type == "cuda" else ops.HAS_BACKWARD

    def _cached_word_inputs(self, char_ids: Tensor | None, word_inputs: Tensor | None) -> Tensor | None:
        """word_inputs when this batch can use the vocabulary cache, else None (the char path)."""
        if word_inputs is None:
            return None
        if self._vocab_char_ids is None:
            if char_ids is None:
                raise ElmoFastError("word_inputs given without char_ids, but the model has no vocab_to_cache")
            warnings.warn("word_inputs given to a model without vocab_to_cache: they are ignored and the "
                          "char ids used (as allennlp does)", RuntimeWarning, stacklevel=3)
            return None
        if word_inputs.dim() != 2 or word_inputs.dtype.is_floating_point or word_inputs.dtype == torch.bool:
            raise ElmoFastError(f"word_inputs must be integer ids of shape [batch, tokens], got "
                                f"{word_inputs.dtype} {list(word_inputs.shape)}")
        W = self.token_width
        if char_ids is not None and tuple(char_ids.shape) != (*word_inputs.shape, W):
            raise ElmoFastError(f"char_ids {list(char_ids.shape)} and word_inputs {list(word_inputs.shape)} "
                                f"must describe the same tokens: [batch, tokens, {W}] and [batch, tokens]")
        if word_inputs.numel() and bool(((word_inputs < 0) | (word_inputs >= self.vocab_size)).any()):
            if char_ids is None:
                bad = word_inputs[(word_inputs < 0) | (word_inputs >= self.vocab_size)][0].item()
                raise ElmoFastError(f"word_inputs holds id {bad}, outside the cached vocabulary of "
                                    f"{self.vocab_size} words; pass char_ids too, so that such batches can "
                                    "back off to the char CNN")
            return None  # back off to the char ids for the whole batch, as allennlp does
        return word_inputs.long()

    def _distinct_tokens(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each distinct token once: char CNN, highway, projection and layer-0 input gates.

        ids [B, T, W] -> token vectors [U, P], layer-0 gates [U, 2, 4C], and token_index [B, T]
        (the row of each position). Padding slots are one more "token" (all-zero ids): one row.
        """
        B, T, W = ids.shape
        distinct, inverse = torch.unique(ids.reshape(B * T, W), dim=0, return_inverse=True)
        return *self._token_results(distinct), inverse.view(B, T)

    def _token_results(self, distinct: Tensor) -> tuple[Tensor, Tensor]:
        """Token vectors [U, P] and layer-0 gates [U, 2, 4C] on the model's device of the distinct
        token rows ``distinct`` [U, W] (on the CPU or the model's device), through the token cache."""
        device = self.device
        cache = self.token_cache
        if cache is None:
            vectors = self._token_vectors(ops.to_device_async(distinct, device))
            return vectors, self._layer0_gates(vectors)
        key = self._weights_key()
        if cache.weights_key != key:
            cache.clear()
            cache.weights_key = key
        # one host copy for the batch's distinct tokens (none when they are on the host already)
        keys = [k.tobytes() for k in distinct.to(device="cpu", dtype=self._key_dtype).numpy()]
        entries = [cache.get(k) for k in keys]
        missing = [i for i, e in enumerate(entries) if e is None]
        cache.hits += len(keys) - len(missing)
        cache.misses += len(missing)
        if missing:
            rows = distinct[ops.to_device_async(torch.tensor(missing), distinct.device)]
            vectors = self._token_vectors(ops.to_device_async(rows, device))
            gates = self._layer0_gates(vectors)
            for j, i in enumerate(missing):
                entries[i] = (vectors[j].clone(), gates[j].clone())
                cache.put(keys[i], entries[i])
        return torch.stack([e[0] for e in entries]), torch.stack([e[1] for e in entries])

    def _weights_key(self) -> tuple:
        """Changes whenever a parameter does (an optimizer step, load_state_dict, .to(device)): what
        the caches derived from the weights are checked against, so that fine-tuning never leaves a
        stale copy behind. In-place updates bump a tensor's version counter; moves change its storage.
        (Parameters made under inference_mode have no version counter; they cannot train either.)"""
        return (self.compute_dtype,
                *((p.data_ptr(), -1 if p.is_inference() else p._version) for p in self.parameters()))

    def _bf16_weights(self) -> dict:
        """bf16 copies of the highway and projection weights (remade when the weights change); the
        LSTM's are :meth:`_flat_lstm`'s."""
        key = self._weights_key()
        if self._lowp is None or self._lowp[0] != key:
            self._lowp = (key, self.token_embedder.bf16_weights())
        return self._lowp[1]

    def _token_vectors(self, distinct_ids: Tensor) -> Tensor:
        emb = self.token_embedder
        with self._stage("char_cnn"):
            cnn = emb.char_features_fast(distinct_ids)
        with self._stage("highway"):
            return emb.project_fast(cnn, self._bf16_weights() if self.compute_dtype == torch.bfloat16 else None,
                                    distinct_ids)

    def _layer0_gates(self, vectors: Tensor) -> Tensor:
        # fp32 in both modes: once per distinct token (and cached), a small share of the work
        with self._stage("lstm"):
            return self.encoder.layer0_gates_fast(vectors)

    #: Device types whose bilstm op runs both directions' GEMMs at once and so takes each layer's
    #: forward and backward w_hh (and w_proj) as one [2, ...] tensor: given two separate tensors it
    #: stacks them, a copy of every recurrent weight on every call (168 MB on `original` in fp32).
    #: There the model passes views of stacked copies it keeps (the CPU op reads each direction alone).
    _STACKED_LSTM_DEVICES = ("cuda",)

    def _flat_lstm(self) -> list[Tensor]:
        """The bilstm op's flat weight list in the compute dtype, detached: the parameters themselves
        (fp32 on a CPU), or copies made once per (device, dtype) and remade whenever the weights
        change (:meth:`_weights_key`: load_state_dict, in-place edits, optimizer steps, moves):
        bf16 copies of the GEMM weights (biases stay fp32 on a CPU; on CUDA, whose op takes one dtype,
        they are bf16 too), and on CUDA each layer's w_hh and w_proj stacked, both directions, the list
        holding views of the two halves (which the op uses in place)."""
        device = self.device
        bf16 = self.compute_dtype == torch.bfloat16
        stacked = device.type in self._STACKED_LSTM_DEVICES
        flat = self.encoder.flat_weights()
        if not (bf16 or stacked):
            self._lstm_op_weights = {}
            return [w.detach() for w in flat]
        slot = (device.type, device.index, self.compute_dtype)
        key = self._weights_key()
        entry = self._lstm_op_weights.get(slot)
        if entry is not None and entry[0] == key:
            return entry[1]
        # Copies derived from older weights are dropped before the new ones are made.
        self._lstm_op_weights = {s: e for s, e in self._lstm_op_weights.items() if e[0] == key}

        def cast(w: Tensor, k: int) -> Tensor:
            keep_fp32 = k == 2 and not stacked  # a bias, on the CPU
            return w.detach().to(torch.bfloat16) if bf16 and not keep_fp32 else w.detach()

        out = [cast(w, i % 4) for i, w in enumerate(flat)]
        if stacked:
            for layer in range(len(flat) // 8):
                for k in (1, 3):  # w_hh, w_proj
                    f, b = 8 * layer + k, 8 * layer + 4 + k
                    both = torch.stack([out[f], out[b]])
                    out[f], out[b] = both[0], both[1]
        self._lstm_op_weights[slot] = (key, out)
        return out

    def _cached_tokens(self, word_inputs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The vocabulary cache's counterpart of add_sentence_boundaries + _distinct_tokens.

        word_inputs [B, T], ids in [0, V) -> token vectors [U, P], layer-0 gates [U, 2, 4C], token_index
        [B, T + 2] and mask [B, T + 2]. Only the vectors are kept for the whole vocabulary: its gates
        would take 32 C bytes a word (128 KiB for the original model), so they are computed here for
        the batch's distinct words only, as the char path does.
        """
        index, mask = self._vocab_index(word_inputs)
        distinct, inverse = torch.unique(index, return_inverse=True)
        vectors = self._vocab_vectors()[distinct]
        return vectors, self._layer0_gates(vectors), inverse.view(index.shape), mask

    def _vocab_index(self, word_inputs: Tensor) -> tuple[Tensor, Tensor]:
        """word_inputs [B, T] -> rows of the vocabulary table [B, T + 2] (0 at padding) and the mask."""
        V = self.vocab_size
        B, T = word_inputs.shape
        lengths = (word_inputs > 0).sum(dim=1)
        # rows V and V + 1 of the table are <S> and </S>; placed as add_sentence_boundaries places them
        index = word_inputs.new_zeros(B, T + 2)
        index[:, 1:-1] = word_inputs
        index[:, 0] = V
        index[torch.arange(B, device=index.device), lengths + 1] = V + 1
        return index, index > 0

    def _vocab_vectors(self) -> Tensor:
        """[V + 2, P]: the context-free vectors of vocab_to_cache, then of <S> and </S>."""
        key = self._weights_key()
        if self._vocab_table is None or self._vocab_table[0] != key:
            self._vocab_table = None  # free the stale table before building the new one
            ids = torch.cat([self._vocab_char_ids,
                             self._vocab_char_ids.new_tensor([self.front_end.bos, self.front_end.eos])])
            with torch.no_grad():  # chunks bound the char CNN's memory for large vocabularies
                vectors = torch.cat([self._token_vectors(chunk) for chunk in ids.split(4096)])
            self._vocab_table = (key, vectors)
        return self._vocab_table[1]

    def _contextualize(self, vectors: Tensor, gates: Tensor, token_index: Tensor, mask: Tensor,
                       h0: Tensor | None, c0: Tensor | None,
                       lengths: Tensor | None = None) -> tuple[list[Tensor], Tensor, Tensor]:
        """The biLSTM over the distinct tokens' results; the fast path's activations and final states.
        lengths: [B] (on the CPU when the caller has them there: the op plans from them without a
        device sync), else mask.sum(dim=1)."""
        weights = self._flat_lstm()
        if self.compute_dtype == torch.bfloat16 and gates.is_cuda:
            # The CUDA bilstm takes one floating dtype for all its inputs (the CPU one takes fp32 input
            # gates and biases beside bf16 weights): round the layer-0 gates to bf16 (the biases are,
            # in _flat_lstm), as the gates of layers >= 1 are inside the op. States carried across
            # batches stay bf16.
            gates = gates.to(torch.bfloat16)
        with self._stage("lstm"):
            lengths = mask.sum(dim=1) if lengths is None else lengths
            outputs, h, c = self.encoder.forward_fast(gates, token_index, lengths, h0, c0, weights)
            outputs = outputs.float()
        tokens = vectors[token_index] * mask.unsqueeze(-1).to(vectors.dtype)
        return [torch.cat([tokens, tokens], dim=-1), *outputs.unbind(0)], h, c

    def embed(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Outputs without the sentence boundaries: [B, L + 1, T, 2P] and mask [B, T]."""
        out = self(char_ids)
        layers = [reference.remove_sentence_boundaries(a, out["mask"]) for a in out["activations"]]
        return torch.stack([x for x, _ in layers], dim=1), layers[0][1]
