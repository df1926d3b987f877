"""The pieces of a training run, built from its config in an order that fails early and leaves nothing behind:
the data folder (shared lock: `nmt preprocess` cannot rewrite it meanwhile) and a model this machine can hold
first, the run folder once they have loaded, then a resumed run's checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.config import Config, ConfigError, stored_config
from nmt.data.batching import BucketBatchSampler, ParallelIds
from nmt.data.folder import DataFolder
from nmt.data.tokenizer import Vocab
from nmt.device import autocast_dtype, make_optimizer, resolve_device, use_deterministic_algorithms
from nmt.evaluate import bleu_metric
from nmt.fs.locks import lock_folder, release_folder
from nmt.model.seq2seq import Seq2Seq
from nmt.modelfile.check import expected_weights
from nmt.modelfile.parent import Parent, check_data_vocabularies, load_parent
from nmt.train import checkpoint
from nmt.train.distributed import Ranks
from nmt.train.graphed import GraphedUpdates, capturable_optimizer
from nmt.train.graphed import applies as graphs_apply
from nmt.train.run_folder import RunDirError, RunFolder, resume_changes
from nmt.train.schedules import LrSchedule
from nmt.train.stopping import finished_reason
from nmt.train.tensorboard import TensorBoardLog
from nmt.train.tensorboard import check_available as check_tensorboard


@dataclass
class TrainingParts:
    """Everything one training process works with; `train_model` is `model` or its DDP wrapper."""

    config: Config
    ranks: Ranks
    run: RunFolder
    data: DataFolder
    data_locked: bool                    # this process holds a shared lock on the data folder
    vocabs: tuple[Vocab, Vocab]          # (source, target)
    device: torch.device
    amp_dtype: torch.dtype | None
    model: Seq2Seq
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LrSchedule
    scaler: torch.amp.GradScaler
    graphed: GraphedUpdates | None
    train_ids: ParallelIds
    sampler: BucketBatchSampler
    dev_ids: ParallelIds | None
    progress: checkpoint.Progress                   # fresh, or as the resumed checkpoint left it
    parent: Parent | None = None         # the model a new fine-tuning run started from (`training.init_from`)
    tensorboard: TensorBoardLog | None = None   # on rank 0

    def close(self) -> None:
        """Let go of the folders' locks and the process group (idempotent)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        self.run.release()
        if self.data_locked:
            release_folder(self.data.root)
            self.data_locked = False
        self.ranks.close()


def build_parts(config: Config, resume: bool = False, overwrite: bool = False,
                config_path: str | Path | None = None) -> TrainingParts:
    """Build (and for `resume`, restore) a run from its config; its folders stay locked until `close()`."""
    t = config.training
    if t.run_dir is None:
        raise ConfigError("`training.run_dir` is required: the folder for checkpoints and logs")
    if config.data.out_dir is None:
        raise ConfigError("`data.out_dir` is required: the preprocessed data folder (run `nmt preprocess`)")
    data_dir = Path(config.data.out_dir)
    data_locked = (data_dir / "manifest.json").is_file() and lock_folder(data_dir, "train", shared=True)
    ranks = Ranks()
    try:
        parts = _build(config, ranks, bool(data_locked), resume, data_dir, Path(t.run_dir))
    except BaseException:
        if data_locked:
            release_folder(data_dir)
        ranks.close()
        raise
    try:
        if t.tensorboard:
            check_tensorboard()                         # the package is there, before the run folder is touched
        bleu_metric(t.bleu_tokenize, t.bleu_lowercase, "training.bleu_tokenize")   # e.g. MeCab there, before update 1
        parts.run.prepare(config, parts.data, resume, overwrite, config_path)
        if t.deterministic:                             # process-wide, so only once the run is certain
            use_deterministic_algorithms()
        if resume:
            _resume(parts)
        elif parts.parent is not None:
            loaded = parts.parent.loaded
            parts.run.log({"event": "init_from", "path": str(loaded.path), "kind": loaded.kind,
                           "parent_step": (loaded.card.get("training") or {}).get("step"),
                           "optimizer": parts.parent.optimizer is not None})
        if t.tensorboard and ranks.is_main:
            parts.tensorboard = TensorBoardLog(parts.run.path, parts.progress.step)
    except BaseException:
        parts.close()
        raise
    return parts


def _build(config: Config, ranks: Ranks, data_locked: bool, resume: bool, data_dir: Path,
           run_dir: Path) -> TrainingParts:
    t = config.training
    device = resolve_device(t.device)
    if t.precision == "fp16" and device.type != "cuda":       # autocast would quietly run bf16 instead
        raise ConfigError("`training.precision` fp16 runs on CUDA only; on the CPU use bf16 or fp32")
    if t.threads:
        torch.set_num_threads(t.threads)
    data = DataFolder.open(data_dir)
    if not resume:                                  # a resumed run checks its own data (RunFolder.data_mismatch)
        data.check_settings(config.data)
    src_vocab, tgt_vocab = data.vocab("src"), data.vocab("tgt")
    parent = None                                   # a resumed run has its weights in last.pt
    if (t.init_from or t.init_optimizer) and not resume:
        parent = load_parent(config)
        check_data_vocabularies(parent, src_vocab, tgt_vocab, data.root)
    expected_weights(config.model, len(src_vocab), len(tgt_vocab), "the config", copies=4,
                     error=ConfigError)             # a model this machine cannot train: before allocating
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    model = Seq2Seq.from_config(config.model, len(src_vocab), len(tgt_vocab)).to(device)
    if parent is not None:
        model.load_state_dict(parent.loaded.weights)     # copied into float32 parameters
    train_model: torch.nn.Module = model
    if ranks.world_size > 1:
        train_model, device = ranks.wrap(model, device)
        torch.manual_seed(t.seed + ranks.rank)      # same initial parameters, different dropout per rank
    optim_class = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    graphed = t.cuda_graphs and graphs_apply(model, device, ranks.world_size,
                                             autocast_dtype(t.precision, device, graphed=True),
                                             config.model.rnn_type, t.accumulate)
    amp_dtype = autocast_dtype(t.precision, device, graphed)
    settings = {"betas": tuple(t.adam_betas), "weight_decay": t.weight_decay}
    optimizer = (capturable_optimizer(optim_class, model.parameters(), t.lr, device, **settings) if graphed
                 else make_optimizer(optim_class, model.parameters(), lr=t.lr, **settings))
    if parent is not None and parent.optimizer is not None:
        try:
            checkpoint.load_optimizer_state(optimizer, parent.optimizer, config)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"`training.init_optimizer`: the optimiser state of {parent.loaded.path} does not "
                              f"fit this run's optimiser ({str(exc)[:200]})") from None
    train_ids = ParallelIds(data.ids("train", "src"), data.ids("train", "tgt"))
    corpora = [(c["start"], c["end"], c["weight"]) for c in data.manifest["splits"]["train"]["corpora"]]
    sampler = BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, t.batch_tokens, t.batch_size,
                                 t.bucket_pool, seed=t.seed, rank=ranks.rank, world_size=ranks.world_size,
                                 corpora=corpora)
    dev_ids = (ParallelIds(data.ids("dev", "src"), data.ids("dev", "tgt")) if data.has_split("dev") else None)
    return TrainingParts(
        config=config, ranks=ranks, run=RunFolder(run_dir, ranks.is_main), data=data,
        data_locked=data_locked, vocabs=(src_vocab, tgt_vocab), device=device, amp_dtype=amp_dtype,
        model=model, train_model=train_model, optimizer=optimizer, schedule=LrSchedule(optimizer, t),
        scaler=torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16), train_ids=train_ids,
        graphed=GraphedUpdates(model, optimizer, amp_dtype, t.clip_grad_norm, t.label_smoothing) if graphed else None,
        sampler=sampler, dev_ids=dev_ids, progress=checkpoint.Progress(cursor=checkpoint.Cursor(seed=t.seed)),
        parent=parent)


def _resume(parts: TrainingParts) -> None:
    """Restore last.pt into the pieces: model, optimiser, schedule, scaler, RNGs, progress."""
    config, run, t = parts.config, parts.run, parts.config.training
    path = run.path / "last.pt"
    state = checkpoint.load_checkpoint(path)
    saved = stored_config(state["config"])
    if saved.model != config.model:
        raise checkpoint.CheckpointError(f"{path} was trained with a different `model` section")
    for key in ("init_from", "init_optimizer"):     # unset (`--init-from` starts new runs only): the run's own
        if not getattr(t, key):
            setattr(t, key, getattr(saved.training, key))
    changed = resume_changes(saved, config)
    try:
        parts.model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise checkpoint.CheckpointError(f"{path} does not fit the model: {str(exc)[:200]}") from None
    ranks = parts.ranks
    parts.progress = checkpoint.restore_training_state(path, state, config, parts.optimizer, parts.schedule,
                                                       parts.scaler, ranks.rank, ranks.world_size)
    mismatch = run.data_mismatch(parts.data)
    # a finished run reads no data (let it say it is done), unless it owes a validation
    if mismatch and (parts.progress.validation_due or not finished_reason(t, parts.progress, parts.schedule)):
        raise RunDirError(mismatch)
    run.record_resume_changes(changed, config)
    run.trim_metrics(parts.progress.step)
