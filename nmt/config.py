"""Typed configuration: one YAML file with sections data, model, training, decoding; every key a dataclass field
with a default, checked on loading (nmt.config_check). Relative paths resolve against the file's folder."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.config_check import ConfigError, build
from nmt.fs.bounded import MAX_YAML_BYTES, YAML_LOADER, BoundError, file_kind, load_yaml, read_bytes


def _bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
             since_saved: bool = False, help: str | None = None) -> Any:
    """A field with a range check; `since_saved`: not applied to a config read back from a file an earlier nmt
    saved (`stored_config`); `help`: the key's command-line help (nmt.cli.options)."""
    return field(default=default, metadata={"ge": ge, "gt": gt, "le": le, "since_saved": since_saved, "help": help})


def _described(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


def _path(default: str | None = None) -> Any:
    return field(default=default, metadata={"path": True})


MAX_BEAM = 1000      # beam sizes and n-best lists beyond this are typos (and would exhaust memory)
EXTRA_OUTPUT_PIECES = 10   # an output may have max_len_ratio * source pieces + this many, EOS included
# Bounds far beyond any real use: a value over one is a typo or a damaged file (stored configs too).
MAX_VOCAB = 1_000_000   # SentencePiece pieces, shortlist sizes, top-k
MAX_DIM = 16_384        # embedding, hidden and attention sizes
MAX_LAYERS = 64         # RNN layers per side
MAX_LEN = 10_000        # pieces in one sentence (training filter, decoding input and output)
MAX_TOKENS = 1_000_000  # tokens or sentences in one batch
MAX_EPOCH_ROWS = 2**31 - 1  # rows of one training epoch: its row numbers and sort keys (~16 bytes each) are in memory
# decoding.batch_tokens 0: on a CPU 4000 was 5% slower and more gained nothing; a GPU step costs about the same
# whatever its rows (docs/benchmarks.md)
DECODING_BATCH_TOKENS = {"cpu": 8000, "cuda": 32000}
MAX_PENALTY = 10.0      # GNMT alpha and beta: ((5 + len) / 6) ** alpha stays finite in fp32
# sacreBLEU's BLEU tokenizers nmt offers (nmt.evaluate): ja-mecab and ko-mecab need nmt[ja] / nmt[ko]
BleuTokenize = Literal["13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "flores200", "none"]


def memory_bytes() -> int:
    """This machine's physical memory, for bounds that depend on it."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):     # not POSIX: assume a large machine
        return 1 << 40


@dataclass
class CorpusConfig:
    """One training corpus of several: a file prefix and how much of it an epoch takes."""

    prefix: str = _path()               # reads {prefix}.{src_lang}[.gz] and {prefix}.{tgt_lang}[.gz]
    # rows per epoch = round(weight x pairs) (2 = twice, 0.5 = a random half): at least 1, at most MAX_EPOCH_ROWS
    weight: float = _bounded(1.0, gt=0.0, le=MAX_EPOCH_ROWS)


@dataclass
class DataConfig:
    src_lang: str = "de"
    tgt_lang: str = "en"
    # a file prefix ({train}.{src_lang}[.gz], {train}.{tgt_lang}[.gz]), or a list of prefixes / {prefix, weight}
    train: str | list[str | CorpusConfig] | None = _path()  # noqa: RUF009 (a list is never mutated)
    dev: str | None = _path()
    test: str | None = _path()
    out_dir: str | None = _path()       # where `nmt preprocess` writes ids, SentencePiece models, manifest
    joint_vocab: bool = True            # one SentencePiece model for both sides
    vocab_size: int = _bounded(8000, ge=16, le=MAX_VOCAB)
    spm_model_type: Literal["unigram", "bpe"] = "unigram"
    character_coverage: float = _bounded(1.0, ge=0.98, le=1.0, since_saved=True)  # SentencePiece's own range
    spm_sample_sentences: int = _bounded(500_000, ge=1, le=50_000_000)   # SentencePiece's seeded uniform sample
    spm_sample_seed: int = _bounded(42, ge=0, since_saved=True)
    src_spm_model: str | None = _path()  # reuse existing SentencePiece models instead of training
    tgt_spm_model: str | None = _path()
    target_vocab_from_train: bool = True  # target vocabulary = pieces seen on the target side
    min_len: int = _bounded(1, ge=0, le=MAX_LEN)     # in subword pieces, applied to training pairs only
    max_len: int = _bounded(50, ge=1, le=MAX_LEN)
    max_len_ratio: float = _bounded(3.0, gt=0.0, le=1e6)  # drop pairs whose length ratio exceeds this
    shortlist_k: int = _bounded(100, ge=0, le=MAX_VOCAB)  # decoding shortlist: target pieces per source piece, 0 = none
    shortlist_frequent: int = _bounded(300, ge=0, le=MAX_VOCAB)  # the most frequent target pieces, always kept
    shortlist_score: Literal["dice", "prob"] = "prob"  # p(t|s) = c(s,t)/c(s), or dice 2c(s,t)/(c(s)+c(t))
    shortlist_pairs: int = _bounded(1_000_000, ge=1)   # co-occurrences are counted on the first N training pairs


@dataclass
class ModelConfig:
    rnn_type: Literal["gru", "lstm"] = "gru"
    embedding_dim: int = _bounded(256, ge=1, le=MAX_DIM)
    encoder_hidden: int = _bounded(256, ge=1, le=MAX_DIM)   # per direction
    encoder_layers: int = _bounded(1, ge=1, le=MAX_LAYERS)
    bidirectional: bool = True
    decoder_hidden: int = _bounded(512, ge=1, le=MAX_DIM)
    decoder_layers: int = _bounded(1, ge=1, le=MAX_LAYERS)
    attention: Literal["bahdanau", "luong_dot", "luong_general", "luong_concat"] = "bahdanau"
    attention_dim: int = _bounded(512, ge=1, le=MAX_DIM)    # additive attention's hidden size (bahdanau, luong_concat)
    input_feeding: bool = True                  # Luong: feed h~_{i-1} into the decoder RNN
    bridge: Literal["bridge", "zero"] = "bridge"
    dropout: float = _bounded(0.3, ge=0.0, le=1.0)
    tie_embeddings: bool = False
    init: Literal["default", "uniform"] = "uniform"   # uniform: every parameter from U(-init_scale, init_scale)
    init_scale: float = _bounded(0.1, gt=0.0, le=10.0)


@dataclass
class TrainingConfig:
    run_dir: str | None = _path()
    seed: int = _bounded(42, ge=0, since_saved=True)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # autocast; auto: bf16 on bf16 CPUs and graphed CUDA
    threads: int = _bounded(0, ge=0, le=1024)            # torch CPU threads; 0 = torch's default
    deterministic: bool = False                          # deterministic kernels (process-wide): exact CUDA resume
    cuda_graphs: bool = True                             # CUDA: each update replayed as a captured graph
    batch_tokens: int = _bounded(2000, ge=0, le=MAX_TOKENS)             # padded tokens per batch; 0 = use batch_size
    batch_size: int = _bounded(0, ge=0, le=MAX_TOKENS)                  # sentences per batch when batch_tokens is 0
    bucket_pool: int = _bounded(100, ge=1, le=10_000)               # batches' worth of sentences sorted together
    optimizer: Literal["adam", "adamw"] = "adam"
    lr: float = _bounded(1e-3, gt=0.0)
    weight_decay: float = _bounded(0.0, ge=0.0)
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    clip_grad_norm: float = _bounded(1.0, ge=0.0)       # 0 disables
    accumulate: int = _bounded(1, ge=1, le=1000)
    label_smoothing: float = _bounded(0.0, ge=0.0, le=1.0)
    lr_schedule: Literal["constant", "plateau", "inverse_sqrt", "budget"] = "constant"
    warmup_updates: int = _bounded(0, ge=0)
    plateau_factor: float = _bounded(0.5, gt=0.0, le=1.0)
    plateau_patience: int = _bounded(2, ge=0)
    min_lr: float = _bounded(1e-6, ge=0.0)             # plateau: training ends once the lr decays below it
    teacher_forcing: float = _bounded(1.0, ge=0.0, le=1.0)
    teacher_forcing_schedule: Literal["constant", "linear", "exponential"] = "constant"
    teacher_forcing_min: float = _bounded(0.5, ge=0.0, le=1.0)
    teacher_forcing_decay_updates: int = _bounded(10000, ge=1)  # linear: updates to reach the minimum
    teacher_forcing_decay_rate: float = _bounded(0.9999, gt=0.0, le=1.0)  # exponential: factor per update
    max_updates: int = _bounded(0, ge=0)                 # 0 = no limit
    max_epochs: int = _bounded(100, ge=1)
    max_minutes: float = _bounded(0.0, ge=0.0)           # wall-clock budget; 0 = no limit
    log_every: int = _bounded(100, ge=1)
    validate_every: int = _bounded(1000, ge=1)
    save_every: int = _bounded(0, ge=0)                  # extra last.pt saves between validations; 0 = none
    save_every_minutes: float = _bounded(10.0, ge=0.0)   # also save last.pt after this much training; 0 = never
    early_stopping_metric: Literal["bleu", "loss", "ppl"] = "bleu"
    bleu_tokenize: BleuTokenize = "13a"                  # dev BLEU's sacreBLEU tokenizer (zh, ja-mecab, ...)
    bleu_lowercase: bool = False                         # dev BLEU case-insensitive (signature case:lc)
    patience: int = _bounded(0, ge=0)                    # validations without improvement; 0 = never stop
    keep_best: int = _bounded(3, ge=0, le=1000)
    val_batch_tokens: int = _bounded(4000, ge=1, le=MAX_TOKENS)
    val_max_sentences: int = _bounded(0, ge=0)           # 0 = whole dev set
    log_examples: int = _bounded(3, ge=0, le=1000)
    tensorboard: bool = False                            # event files in run_dir/tensorboard (nmt[tensorboard])
    init_from: str | None = _path()                      # fine-tune: start from this model file or checkpoint
    init_optimizer: bool = False                         # fine-tune: also its optimiser state (a checkpoint's)


@dataclass
class DecodingConfig:
    """How to decode; every key is also an option of `nmt translate` (its help is the key's `help`)."""

    beam_size: int = _bounded(5, ge=1, le=MAX_BEAM, help="Beam size; 1 = greedy.")
    length_penalty: float = _bounded(1.0, ge=0.0, le=MAX_PENALTY, help="GNMT alpha (beam); 0 disables.")
    max_len_ratio: float = _bounded(2.0, gt=0.0, le=10.0,
                                    help=f"At most ratio * source pieces + {EXTRA_OUTPUT_PIECES} pieces.")
    min_len: int = _bounded(1, ge=0, le=1000, help="No EOS before this many pieces: 1 (the default) never "
                                                   "gives an empty output for a non-empty input; 0 allows it.")
    no_repeat_ngram: int = _bounded(0, ge=0, le=100, help="Block repeated n-grams of this size; 0 = off.")
    batch_tokens: int = _bounded(0, ge=0, le=MAX_TOKENS,
                                 help="Tokens per batch: source x beam (translate), source + target (score); "
                                      "0 = by device: 8000 on a CPU, 32000 on a GPU (scoring: 8000).")
    max_input_len: int = _bounded(250, ge=1, le=MAX_LEN, help="Truncate longer inputs (pieces), with a warning.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _described("auto", "auto, fp32, bf16 or fp16.")
    max_len: int = _bounded(0, ge=0, le=MAX_LEN,
                            help="At most this many pieces (EOS included); 0 = only --max-len-ratio.")
    coverage_penalty: float = _bounded(0.0, ge=0.0, le=MAX_PENALTY, help="GNMT beta (beam); 0 disables.")
    early_stop: bool = _described(False, "Beam: a sentence ends when its best candidate ends (OpenNMT-py's "
                                         "rule): fewer steps, may miss a longer best hypothesis.")
    replace_unk: bool = _described(False, "Copy the most attended source piece for each <unk>.")
    sampling: bool = _described(False, "Sample instead of searching (back-translation).")
    temperature: float = _bounded(1.0, ge=0.01, le=100.0, help="Sampling temperature.")
    top_k: int = _bounded(0, ge=0, le=MAX_VOCAB, help="Sample from the k most probable pieces; 0 = all.")
    top_p: float = _bounded(1.0, ge=1e-6, le=1.0, help="Sample from the top-p probability mass.")
    seed: int = _bounded(0, ge=0, since_saved=True, help="Sampling seed (same seed and batches, same samples).")
    quantize: Literal["none", "int8"] = _described("none", "int8: int8 weights for the decoder's step products "
                                                           "and the encoder RNN (CPU; BLEU within 0.3); none.")
    shortlist: bool = _described(False, "Score only the target pieces likely for each batch's source pieces "
                                         "(the vocabulary shortlist the model embeds; greedy and beam). On by "
                                         "default on the CPU for a model that embeds one.")
    shortlist_k: int = _bounded(0, ge=0, le=MAX_VOCAB, help="Shortlist: target pieces per source piece; 0 = all "
                                "stored (implies --shortlist).")
    cuda_graphs: bool = _described(True, "On a GPU, replay greedy and beam steps as captured CUDA graphs.")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)

    def __post_init__(self) -> None:
        self.given: frozenset[str] = frozenset()     # dotted keys the config file and --set gave (not a field)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def set_away_from_default(self, dotted: str) -> bool:
        """Whether the user gave `section.key` a value other than its default: only such a key is refused where it
        does not apply (a default, as the config.yaml nmt writes lists every key, is never)."""
        section, key = dotted.split(".")
        return dotted in self.given and getattr(getattr(self, section), key) != _default(dotted)


def _default(dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(Config(), section), key)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`training.lr=3e-4` -> (["training", "lr"], 0.0003); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override `{text}` must look like section.key=value")
    dotted, _, raw_value = text.partition("=")
    parts = dotted.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override `{text}` must name a section and a key, e.g. training.lr=3e-4")
    try:
        value = load_yaml(raw_value) if raw_value.strip() else ""
    except BoundError as exc:
        raise ConfigError(f"override `{dotted.strip()}=...`: the value is {exc.problem}") from None
    except yaml.YAMLError as exc:
        reason = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"override `{text}`: value is not valid YAML ({reason})") from None
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in the raw mapping (checked afterwards, by `build`)."""
    for text in overrides:
        parts, value = parse_override(text)
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override `{text}`: `{part}` is not a section")
            node = child
        node[parts[-1]] = value
    return raw


def config_from_dict(raw: Any, base_dir: Path | None = None, stored: bool = False) -> Config:
    config = build(Config, raw, "", base_dir, stored)
    if not stored:
        config.given = frozenset(f"{section}.{key}" for section, values in (raw or {}).items()
                                 if isinstance(values, dict) for key in values)
        _check_together(config)
        _check_applicable(config)
    return config


# Keys that another key's value makes ignored: (key, deciding key, whether it applies at that value, why).
NOT_APPLICABLE: tuple[tuple[str, str, Callable[[Any], bool], str], ...] = (
    ("training.batch_size", "training.batch_tokens", lambda v: v == 0,
     "batches count sentences only when `training.batch_tokens` is 0"),
    ("training.plateau_factor", "training.lr_schedule", lambda v: v == "plateau",
     "only the plateau schedule lowers the rate by it"),
    ("training.plateau_patience", "training.lr_schedule", lambda v: v == "plateau",
     "only the plateau schedule counts validations without improvement"),
    ("training.min_lr", "training.lr_schedule", lambda v: v in ("plateau", "budget"),
     "only the plateau and budget schedules have a floor"),
    ("training.teacher_forcing_min", "training.teacher_forcing_schedule", lambda v: v != "constant",
     "a constant teacher-forcing ratio never decays to a minimum"),
    ("training.teacher_forcing_decay_updates", "training.teacher_forcing_schedule", lambda v: v == "linear",
     "only the linear schedule decays over a number of updates"),
    ("training.teacher_forcing_decay_rate", "training.teacher_forcing_schedule", lambda v: v == "exponential",
     "only the exponential schedule decays by a rate"),
    ("model.attention_dim", "model.attention", lambda v: v in ("bahdanau", "luong_concat"),
     "the dot and general scores have no additive layer for it to size"),
    ("model.init_scale", "model.init", lambda v: v == "uniform",
     "only `model.init: uniform` draws from U(-init_scale, init_scale); default keeps torch's initialisation"),
    ("training.init_optimizer", "training.init_from", lambda v: v is not None,
     "it applies only with `training.init_from`, the parent whose optimiser state it carries over"),
)


def _check_applicable(config: Config) -> None:
    """A key the user set (away from its default) where another key's value makes nmt ignore it is an error."""
    for key, deciding, applies, why in NOT_APPLICABLE:
        section, name = deciding.split(".")
        value = getattr(getattr(config, section), name)
        if config.set_away_from_default(key) and not applies(value):
            shown = "unset" if value is None else f"{value}"
            raise ConfigError(f"`{key}` does not apply with `{deciding}` {shown}: {why}; remove it (or give it "
                              f"its default, {json.dumps(_default(key))}) or change `{deciding}`")


LANGUAGE_CODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")     # a file suffix: no "/", "." or spaces


def _check_together(config: Config) -> None:
    data, training = config.data, config.training
    for key in ("src_lang", "tgt_lang"):
        if not LANGUAGE_CODE.fullmatch(getattr(data, key)):
            raise ConfigError(f"`data.{key}` must be a language code of letters, digits, '-' or '_' "
                              f"(it names files), got {getattr(data, key)!r}")
    if data.src_lang == data.tgt_lang:
        raise ConfigError(f"`data.tgt_lang` must differ from `data.src_lang` (both {data.src_lang!r}): "
                          "the two sides of a corpus are files named by them")
    if training.batch_tokens == 0 and training.batch_size == 0:
        raise ConfigError("`training.batch_size` must be >= 1 when `training.batch_tokens` is 0 "
                          "(set one of them: tokens or sentences per batch)")
    if config.model.attention == "bahdanau" and not config.model.input_feeding:
        raise ConfigError("`model.input_feeding: false` does not apply to `model.attention: bahdanau`, whose decoder "
                          "reads the context c_i in its RNN input by design; remove the key or choose a luong_* "
                          "attention")
    betas = training.adam_betas
    if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise ConfigError(f"`training.adam_betas` must be two numbers in [0, 1), got {betas!r}")
    check_decoding(config.decoding)


def check_decoding(decoding: DecodingConfig) -> None:
    """Rules between decoding keys, for the YAML file and for one decoding run's settings."""
    if decoding.max_len and decoding.min_len >= decoding.max_len:
        raise ConfigError(f"`decoding.min_len` {decoding.min_len} leaves no room under `decoding.max_len` "
                          f"{decoding.max_len} (which counts EOS); lower the first or raise the second")


def with_implied_shortlist(given: dict[str, Any], shortlist_file: str | Path | None = None) -> dict[str, Any]:
    """One run's decoding settings with what they imply: a shortlist file, or `shortlist_k` without `shortlist`,
    turns the shortlist on; either with the shortlist turned off is a ConfigError (it would be ignored)."""
    wanting = ("--shortlist-file" if shortlist_file is not None else
               "`decoding.shortlist_k`" if given.get("shortlist_k") is not None else None)
    if wanting and given.get("shortlist") is False:
        raise ConfigError(f"{wanting} applies only with the shortlist on, and it is turned off (--no-shortlist, "
                          "`decoding.shortlist: false`); drop one of them")
    return {**given, "shortlist": True} if wanting and given.get("shortlist") is None else dict(given)


def check_decoding_overrides(overrides: dict[str, Any]) -> None:
    """Decoding settings given for one run meet the YAML file's rules, though the stored config's are lenient."""
    build(DecodingConfig, {k: v for k, v in overrides.items() if v is not None}, "decoding.", None)


# Keys that earlier nmt versions wrote into checkpoints and model files and this one no longer has.
RETIRED_KEYS = {"data": ("spm_train_sentences",)}   # replaced by data.spm_sample_sentences (streaming sample)


def stored_config(raw: Any) -> Config:
    """The config saved in a checkpoint or model file, perhaps by an earlier nmt: retired keys dropped and newer
    rules (`since_saved`, `_check_together`) not applied, so that what it trained loads."""
    if isinstance(raw, dict):
        raw = {section: ({k: v for k, v in values.items() if k not in RETIRED_KEYS.get(section, ())}
                         if isinstance(values, dict) else values) for section, values in raw.items()}
    return config_from_dict(raw, stored=True)


class _UniqueKeyLoader(YAML_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader, but a key given twice in one mapping is an error (YAML would silently keep the last)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *base`: its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:                 # an unhashable key: construct_mapping says so
            break
        if first is not key_node:         # another node with an equal key (on the same line too: `{a: 1, a: 2}`)
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {first.start_mark.line + 1})", key_node.start_mark)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ConfigError(f"config file {path} does not exist") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"config file {path} is {file_kind(mode)}, not a YAML file")
    try:
        data = read_bytes(path, MAX_YAML_BYTES)
        raw = load_yaml(data.decode("utf-8"), _UniqueKeyLoader) or {}
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from None
    except BoundError as exc:
        where = f" line {exc.line}" if exc.line is not None else ""
        raise ConfigError(f"{path}{where}: refused: {exc.problem} (a config file is small and plain)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with sections data, model, training, decoding")
    raw = apply_overrides(raw, overrides or [])
    return config_from_dict(raw, base_dir=path.resolve().parent)


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
