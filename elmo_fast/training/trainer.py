"""Training and fine-tuning a biLM, bilm-tf's recipe, with runs that survive being killed.

The output directory holds the model in the layout every ELMo tool reads (``options.json`` +
``weights.hdf5``, bilm-tf's), the softmax (``softmax.hdf5``), the vocabulary (``vocab.txt``), a
metrics log (``metrics.jsonl``: one JSON object per line, training and held-out;
:mod:`~elmo_fast.training.metrics_log`), ``checkpoints/`` (model, softmax, optimizer, data position,
and what the run was computed from; the last two kept; :mod:`~elmo_fast.training.checkpoints`), and
while a run runs ``.elmo-fast.lock``. Every file is written through :mod:`elmo_fast.durable` (a temporary name,
fsync, rename): whole under its final name whatever moment a run is killed at, and a failed write is
one :class:`~elmo_fast.durable.WriteError` naming the file, the previous checkpoint intact.

One run per output directory: a run holds :class:`~elmo_fast.run_lock.RunLock` on ``.elmo-fast.lock``
from start to end, removed at the end (a second run on the directory fails at once naming the holder's
PID; a killed run's lock never blocks), and sweeps the temporary files that killed runs left there.

``--resume`` continues the run only if it is the same run: the vocabulary, the corpus files and the
settings are compared with what the checkpoint recorded (:mod:`~elmo_fast.training.run_fingerprint`)
and any difference is refused, named, unless ``allow_changed=True`` (``--resume-anyway``).

Determinism, which is what makes ``--resume`` exact: batches are a function of the seed and the
epoch (:mod:`elmo_fast.training.data`); every random draw of step ``s`` (dropout masks, sampled
negatives) comes from generators seeded by (seed, s), not from a state carried across steps. A
resumed run therefore needs only the step, the data position and the tensors of a checkpoint, and
ends with the weights of an uninterrupted run (same machine, same threads).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..bilm.backends import training_backend
from ..bilm.model import ElmoBiLm
from ..bilm.precision import PRECISIONS
from ..errors import InputError, Param
from ..formats.bilm_tf import ElmoOptions, load_model_files, load_softmax, save_model_files, write_softmax
from ..formats.model_dir import model_dir_files
from ..formats.vocab import Vocabulary
from ..textio import DEFAULT_MAX_LINE_LENGTH, check_max_line_length, iter_text_lines
from . import run_fingerprint
from .checkpoints import checkpoint_to_resume, save_checkpoint
from .data import SentenceBatches, UnrolledWindows, expand_corpus, sentence_batch
from .evaluate import evaluate
from .metrics_log import METRICS, MetricsLog
from .model import Batch, BidirectionalLM, initial_weights, unwrap
from .out_dir import lock_out_dir, prepare_out_dir
from .softmax import SoftmaxHead
from .stop_signals import Interrupted, Stop, StopSignals

__all__ = ["TrainConfig", "Trainer", "Interrupted", "evaluate", "model_dir_files", "training_backend"]

#: bilm-tf scales the mean loss by its unroll steps before differentiating (20 by default); the
#: sentence scheme keeps that scale per token, so Adagrad's accumulator and the clip see the same
#: magnitudes as in bilm-tf
BILM_TF_UNROLL_STEPS = 20


@dataclass
class TrainConfig:
    """Everything that decides what a run computes (compared on --resume), and how it runs."""

    train: list[str]
    vocab: str
    out: str
    options: dict  # ElmoOptions.to_dict()
    heldout: list[str] = field(default_factory=list)
    epochs: int = 10
    max_steps: int | None = None
    batch_size: int = 128
    max_tokens_per_batch: int | None = None
    unroll_steps: int | None = None
    seed: int = 0
    learning_rate: float = 0.2
    initial_accumulator: float = 1.0
    clip_norm: float = 10.0
    dropout: float = 0.1
    negative_samples: int = 8192
    tokenize: bool = False
    init_model_dir: str | None = None  # fine-tuning: start from this model
    softmax_warmup_steps: int = 0  # steps training only a new softmax (fine-tuning without one)
    keep_best: bool = False  # export the model with the best held-out perplexity
    # how the run runs (not compared on resume)
    eval_every: int = 1000
    eval_max_sentences: int | None = None
    checkpoint_every: int = 500
    log_every: int = 50
    device: str = "cpu"
    backend: str = "auto"
    precision: str = "fp32"  # elmo_fast.bilm.precision: fp32, tf32 or bf16 (autocast)
    progress: bool = True
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH  # characters a corpus line may hold (None: no bound)

    RESULT_KEYS = (
        "train",
        "vocab",
        "options",
        "heldout",
        "epochs",
        "batch_size",
        "max_tokens_per_batch",
        "unroll_steps",
        "seed",
        "learning_rate",
        "initial_accumulator",
        "clip_norm",
        "dropout",
        "negative_samples",
        "tokenize",
        "init_model_dir",
        "softmax_warmup_steps",
        "precision",
    )

    def identity(self, world_size: int) -> dict:
        d = {k: getattr(self, k) for k in self.RESULT_KEYS}
        d["world_size"] = world_size
        return json.loads(json.dumps(d))


def _seed_of(*key: int) -> int:
    return hash(tuple(key)) & 0x7FFFFFFFFFFFFFFF


class Trainer:
    def __init__(self, config: TrainConfig, log: Callable[[str], None] | None = None) -> None:
        self.cfg = config
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.out = Path(config.out)
        self.metrics = MetricsLog(self.out / METRICS)
        self.fingerprint: dict | None = None
        self._saved: dict | None = None  # the state last checkpointed (and exported) by this process
        self.device = torch.device(config.device)
        self.vocab = Vocabulary.load(config.vocab)
        self.options = ElmoOptions.from_dict(config.options, source="options")
        self.tokenize = None
        if config.tokenize:
            from ..tokenizer import tokenize_line

            self.tokenize = tokenize_line
        self._check_config()

    # ---- setup -----------------------------------------------------------------------------------

    def _check_config(self) -> None:
        c = self.cfg
        for name in (
            "batch_size",
            "epochs",
            "negative_samples",
            "checkpoint_every",
            "eval_every",
            "log_every",
            "max_steps",
            "unroll_steps",
        ):
            value = getattr(c, name)
            if value is not None and value < 1:
                raise InputError(Param(name), f" must be >= 1, got {value}")
        check_max_line_length(c.max_line_length)
        if not 0.0 <= c.dropout < 1.0:
            raise InputError(Param("dropout"), f" must be in [0, 1), got {c.dropout}")
        if c.precision not in PRECISIONS:
            raise InputError(Param("precision"), f" must be one of {', '.join(PRECISIONS)}, got {c.precision!r}")
        self.precision = PRECISIONS[c.precision]
        self.precision.check_training()
        if c.max_tokens_per_batch is not None and c.unroll_steps is not None:
            raise InputError(
                Param("max_tokens_per_batch"),
                " applies to the sentence scheme, not to ",
                Param("unroll_steps"),
                " (whose batches are ",
                Param("batch_size"),
                " rows of ",
                Param("unroll_steps"),
                " tokens)",
            )

    def _build(self) -> BidirectionalLM:
        c = self.cfg
        g = torch.Generator().manual_seed(_seed_of(c.seed, -1))
        softmax = None
        if c.init_model_dir:
            options_file, weights_file = model_dir_files(c.init_model_dir, "init_model_dir")
            weights = load_model_files(options_file, weights_file)
            if weights.options.to_dict() != self.options.to_dict():
                raise InputError(f"{options_file}: the model's options differ from the run's options")
            softmax_file = Path(c.init_model_dir) / "softmax.hdf5"
            if softmax_file.exists():
                w, b = load_softmax(softmax_file, len(self.vocab), self.options.projection_dim)
                softmax = SoftmaxHead(w, b)
        else:
            weights = initial_weights(self.options, g)
        if softmax is None:
            softmax = SoftmaxHead.initial(len(self.vocab), self.options.projection_dim, g)
        bilm = ElmoBiLm.from_weights(weights, requires_grad=True, backend=training_backend(c.backend, self.device))
        lm = BidirectionalLM(bilm, softmax, dropout=c.dropout, negative_samples=c.negative_samples)
        return lm.to(self.device)

    def _data(self, files: list[str], shuffle: bool = True, eval_mode: bool = False):
        c = self.cfg
        if c.unroll_steps is not None and not eval_mode:
            return UnrolledWindows(
                files,
                self.vocab,
                c.batch_size,
                c.unroll_steps,
                c.seed,
                self.world_size,
                self.rank,
                self.tokenize,
                c.max_line_length,
            )
        return SentenceBatches(
            files,
            c.batch_size,
            c.max_tokens_per_batch,
            c.seed,
            self.world_size if not eval_mode else 1,
            self.rank if not eval_mode else 0,
            shuffle=shuffle,
            tokenize=self.tokenize,
            max_line_length=c.max_line_length,
        )

    # ---- checkpoints -------------------------------------------------------------------------------

    def _save_checkpoint(self, lm: BidirectionalLM, optimizer, state: dict) -> None:
        if self.rank == 0:
            save_checkpoint(
                self.out,
                {
                    "model": unwrap(lm).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "state": state,
                    "identity": self.cfg.identity(self.world_size),
                    "fingerprint": self.fingerprint,
                },
            )
        self._barrier()

    def _load_checkpoint(self, lm: BidirectionalLM, optimizer, allow_changed: bool) -> dict | None:
        found = checkpoint_to_resume(
            self.out, self.fingerprint, self.cfg.identity(self.world_size), allow_changed, self.device, self.log
        )
        if found is None:
            return None
        path, payload = found
        try:
            unwrap(lm).load_state_dict(payload["model"])
            optimizer.load_state_dict(payload["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            first = " ".join(str(e).split())[:200]
            raise InputError(
                f"{path}: its tensors do not fit this run's model ({first}): the architecture or the "
                "vocabulary's size changed; use another ",
                Param("out"),
            ) from None
        return payload["state"]

    def _export(self, lm: BidirectionalLM) -> None:
        """The model files in the output directory (each replaced durably)."""
        if self.rank != 0:
            return
        inner = unwrap(lm)
        extra = {
            "bidirectional": True,
            "dropout": self.cfg.dropout,
            "n_tokens_vocab": len(self.vocab),
            "n_negative_samples_batch": self.cfg.negative_samples,
            "all_clip_norm_val": self.cfg.clip_norm,
            "batch_size": self.cfg.batch_size,
            "unroll_steps": self.cfg.unroll_steps or BILM_TF_UNROLL_STEPS,
            "n_epochs": self.cfg.epochs,
        }
        save_model_files(self.out / "options.json", self.out / "weights.hdf5", inner.bilm.weights(), extra)
        write_softmax(self.out / "softmax.hdf5", inner.softmax.weight, inner.softmax.bias)
        if not (self.out / "vocab.txt").exists():
            self.vocab.save(self.out / "vocab.txt")

    # ---- the loop ----------------------------------------------------------------------------------

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def _log_metrics(self, record: dict) -> None:
        if self.rank == 0:
            self.metrics.append(record)

    def run(self, resume: bool = False, overwrite: bool = False, allow_changed: bool = False) -> dict:
        """Train (or continue, ``resume``) the run in ``cfg.out``; returns step, tokens, seconds and
        the best held-out perplexity. ``overwrite``: start over in a directory that holds a run.
        ``allow_changed`` (implies ``resume``): continue although the vocabulary, the corpus or the
        settings differ from the checkpoint's."""
        c = self.cfg
        resume = resume or allow_changed
        train_files = expand_corpus(c.train, "train")
        heldout_files = expand_corpus(c.heldout, "heldout") if c.heldout else []
        for param, files in (("train", train_files), ("heldout", heldout_files)):
            if files and not _has_a_sentence(files, c.max_line_length):
                raise InputError(Param(param), f" {' '.join(files)}: no sentences (every line is empty)")
        self.fingerprint = run_fingerprint.fingerprint(c.vocab, train_files, heldout_files, c.identity(self.world_size))
        lock = None
        if self.rank == 0:
            lock = lock_out_dir(self.out)
        try:
            if self.rank == 0:
                prepare_out_dir(self.out, resume, overwrite, self.log)
            self._barrier()
            return self._run(resume, allow_changed, train_files, heldout_files)
        finally:
            if lock is not None:
                lock.release()

    def _run(self, resume: bool, allow_changed: bool, train_files: list[str], heldout_files: list[str]) -> dict:
        lm, model, optimizer = self._model_and_optimizer()
        state = self._start_or_resume(lm, optimizer, resume, allow_changed)
        carried = state.pop("states", None)
        run = _Progress(
            state,
            started=time.perf_counter() - state["seconds"],
            h0c0=None if carried is None else tuple(t.to(self.device) for t in carried),
            bar=self._progress(state),
        )
        with StopSignals() as stop:
            try:
                self._loop(model, lm, optimizer, run, self._data(train_files), heldout_files, stop)
            except Stop as s:
                self._checkpoint(lm, optimizer, state, run.h0c0, run.started)
                raise Interrupted.at_step(s.signum, state["step"]) from None
            finally:
                if run.bar is not None:
                    run.bar.close()
        return {
            "step": state["step"],
            "tokens": state["tokens"],
            "seconds": time.perf_counter() - run.started,
            "best": state["best"],
        }

    def _model_and_optimizer(self):
        """The model (``lm``), what trains it (``model``: lm, or its DDP wrapper) and the optimizer."""
        c = self.cfg
        lm = self._build()
        model = lm
        if self.distributed:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(lm, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        # the fused kernel (CPU only in torch) updates in one pass: 4x faster than the per-tensor loop
        optimizer = torch.optim.Adagrad(
            lm.parameters(),
            lr=c.learning_rate,
            initial_accumulator_value=c.initial_accumulator,
            eps=0.0,
            fused=True if self.device.type == "cpu" else None,
        )
        return lm, model, optimizer

    def _start_or_resume(self, lm: BidirectionalLM, optimizer, resume: bool, allow_changed: bool) -> dict:
        """The run's position: a checkpoint's (``resume``, when there is one), else step 0 with the
        metrics log emptied and the vocabulary saved."""
        state = self._load_checkpoint(lm, optimizer, allow_changed) if resume else None
        if state is None:
            state = {"step": 0, "epoch": 0, "batch": 0, "tokens": 0, "best": None, "seconds": 0.0, "states": None}
            if self.rank == 0:
                self.metrics.remove()
                self.vocab.save(self.out / "vocab.txt")
        else:
            if self.rank == 0:  # lines logged after the checkpoint are logged again by this run
                self.metrics.trim(state["step"])
            self.log(
                f"elmo-fast: resuming at step {state['step']} (epoch {state['epoch'] + 1}, batch {state['batch']})"
            )
        return state

    def _loop(
        self, model, lm: BidirectionalLM, optimizer, run: _Progress, data, heldout_files: list[str], stop: StopSignals
    ) -> None:
        """Epochs of steps from ``run.state``'s position, logging, evaluating and checkpointing on
        their schedules; a stop signal ends it after the step it arrived in (:class:`Stop`)."""
        c, state, interval = self.cfg, run.state, run.interval
        bilm_params = list(lm.bilm.parameters())
        # a run killed after its last checkpoint (while exporting) resumes with nothing left to train
        finished = c.max_steps is not None and state["step"] >= c.max_steps
        while state["epoch"] < c.epochs and not finished:
            for index, rows in data.epoch(state["epoch"], state["batch"]):
                batch = rows if isinstance(rows, Batch) else sentence_batch(rows, self.vocab)
                frozen = bilm_params if state["step"] < c.softmax_warmup_steps else []
                loss_value, targets, run.h0c0 = self._step(model, lm, optimizer, batch, state["step"], run.h0c0, frozen)
                state["step"] += 1
                state["batch"] = index + 1
                real_tokens = int((batch.fwd_targets >= 0).sum())
                state["tokens"] += real_tokens * self.world_size
                interval["loss"] += loss_value * targets
                interval["targets"] += targets
                interval["tokens"] += real_tokens * self.world_size
                interval["steps"] += 1
                if run.bar is not None:
                    run.bar.update(1)
                step = state["step"]
                if step % c.log_every == 0:
                    self._log_interval(state, interval, run.bar, run.started)
                if heldout_files and step % c.eval_every == 0:
                    self._evaluate_and_log(lm, heldout_files, state)
                if step % c.checkpoint_every == 0:
                    self._checkpoint(lm, optimizer, state, run.h0c0, run.started)
                if c.max_steps is not None and step >= c.max_steps:
                    finished = True
                    break
                stop.check()
            else:
                state["epoch"] += 1
                state["batch"] = 0
                run.h0c0 = None  # every epoch's streams start afresh
                if heldout_files and state["step"] % c.eval_every != 0:
                    self._evaluate_and_log(lm, heldout_files, state)
        if interval["steps"]:
            self._log_interval(state, interval, run.bar, run.started)
        if heldout_files and not self.metrics.has_eval(state["step"]):
            self._evaluate_and_log(lm, heldout_files, state)
        self._checkpoint(lm, optimizer, state, run.h0c0, run.started)

    def _progress(self, state: dict):
        if not self.cfg.progress or self.rank != 0:
            return None
        from tqdm import tqdm

        total = self.cfg.max_steps
        return tqdm(
            total=total, initial=state["step"], unit="step", dynamic_ncols=True, file=sys.stderr, desc="training"
        )

    def _step(self, model, lm: BidirectionalLM, optimizer, batch: Batch, step: int, h0c0, frozen=()):
        c = self.cfg
        lm.train()
        torch.manual_seed(_seed_of(c.seed, step, self.rank))  # this step's dropout masks
        sampler = torch.Generator().manual_seed(_seed_of(c.seed, step, 7))  # negatives: one draw for all ranks
        batch = batch.to(self.device)
        h0, c0 = (None, None) if h0c0 is None else h0c0
        with self.precision.gemm_mode(self.device), self.precision.autocast(self.device.type):
            fwd_sum, bwd_sum, n_fwd, n_bwd, h, cs = model(batch, h0, c0, sampler, False)
        counts = torch.tensor([float(n_fwd), float(n_bwd)])
        if self.distributed:
            dist.all_reduce(counts)
        n_fwd_all, n_bwd_all = max(counts[0].item(), 1.0), max(counts[1].item(), 1.0)
        # bilm-tf: 0.5 * (mean_fwd + mean_bwd), times its unroll steps; DDP averages over ranks, hence
        # the world size (each rank holds its share of the global sums)
        loss = 0.5 * (fwd_sum / n_fwd_all + bwd_sum / n_bwd_all)
        with self.precision.gemm_mode(self.device):
            (loss * BILM_TF_UNROLL_STEPS * self.world_size).backward()
        for p in frozen:  # a new softmax's warm-up: the biLM keeps its weights (and Adagrad state)
            p.grad = None
        params = [p for p in lm.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, c.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if self.distributed:
            dist.all_reduce(value)
        carried = None if c.unroll_steps is None else (h.detach(), cs.detach())
        return float(value), int(n_fwd_all + n_bwd_all) // 2, carried

    def _log_interval(self, state: dict, interval: dict, bar, started: float) -> None:
        if not interval["targets"]:
            return
        seconds = time.perf_counter() - interval["start"]
        loss = interval["loss"] / interval["targets"]
        rate = interval["tokens"] / max(seconds, 1e-9)
        record = {
            "step": state["step"],
            "epoch": state["epoch"] + 1,
            "tokens": state["tokens"],
            "loss": round(loss, 5),
            "train_perplexity": round(math.exp(min(loss, 50.0)), 3),
            "tokens_per_s": round(rate, 1),
            "elapsed_s": round(time.perf_counter() - started, 1),
        }
        self._log_metrics(record)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.3f}", ppl=f"{record['train_perplexity']:.1f}", tok_s=f"{rate:,.0f}")
        interval.update(loss=0.0, targets=0, tokens=0, start=time.perf_counter(), steps=0)

    def _evaluate_and_log(self, lm: BidirectionalLM, files: list[str], state: dict) -> None:
        if self.rank == 0:
            result = evaluate(
                lm,
                files,
                self.vocab,
                batch_size=self.cfg.batch_size,
                device=self.device,
                tokenize=self.tokenize,
                max_sentences=self.cfg.eval_max_sentences,
                max_line_length=self.cfg.max_line_length,
            )
            improved = state["best"] is None or result["mean"] < state["best"]
            if improved:
                state["best"] = result["mean"]
            self._log_metrics(
                {"step": state["step"], "epoch": state["epoch"] + 1, "tokens": state["tokens"], "heldout": result}
            )
            if self.cfg.keep_best and improved:
                self._export(lm)
        self._barrier()

    def _checkpoint(self, lm, optimizer, state: dict, h0c0, started: float) -> None:
        position = {k: v for k, v in state.items() if k != "seconds"}
        if position == self._saved:  # (a run that ends or stops on a checkpoint's step: written already)
            return
        self._saved = position
        state["seconds"] = time.perf_counter() - started
        snapshot = dict(state)
        snapshot["states"] = None if h0c0 is None else tuple(t.cpu() for t in h0c0)
        self._save_checkpoint(lm, optimizer, snapshot)
        if not self.cfg.keep_best or not self.cfg.heldout:
            self._export(lm)


@dataclass
class _Progress:
    """Where a run stands while it trains: its state (checkpointed), when it started (less the
    seconds of the runs it resumes), the carried LSTM states, the progress bar, and the log interval."""

    state: dict
    started: float
    h0c0: tuple | None
    bar: Any
    interval: dict = field(
        default_factory=lambda: {"loss": 0.0, "targets": 0, "tokens": 0, "start": time.perf_counter(), "steps": 0}
    )


def _has_a_sentence(files: list[str], max_line_length: int | None) -> bool:
    return any(line.strip() for path in files for line in iter_text_lines(path, max_line_length=max_line_length))
