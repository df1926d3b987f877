"""Validation during training: dev loss and perplexity, greedy decoding, BLEU and chrF.

Early stopping, the plateau schedule and best.pt go by these scores, computed as `nmt evaluate` scores a test
set; greedy decoding (a cheap, monotone proxy for beam search) and the loss run on an inference step built
from the current parameters.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sacrebleu.metrics import CHRF

from nmt.config import Config
from nmt.data.batching import Batch, BucketBatchSampler, ParallelIds
from nmt.data.corpus import DataError
from nmt.data.folder import DataFolder
from nmt.data.tokenizer import Vocab
from nmt.decode.search import Hypothesis, SearchSettings, greedy_search
from nmt.decode.steps import Decoding
from nmt.device import autocast
from nmt.evaluate import bleu_metric
from nmt.fs.text import printable, read_lines
from nmt.model.seq2seq import Seq2Seq
from nmt.train.loss import output_cross_entropy

PROBE_SENTENCES = 32        # what `estimate_dev_seconds` decodes: the longest dev sentences


class ValidationAbandoned(Exception):
    """A stop signal arrived during validation: the loop saves last.pt and exits instead of finishing it."""


@torch.no_grad()
def evaluate_dev(model: Seq2Seq, dev: ParallelIds, data: DataFolder, vocabs: tuple[Vocab, Vocab], config: Config,
                 device: torch.device, amp_dtype: torch.dtype | None,
                 stopping: Callable[[], bool]) -> dict[str, Any]:
    """Loss, perplexity, BLEU and chrF of greedy translations of the dev set, with `training.log_examples`
    (source, hypothesis, reference) examples. Raises `ValidationAbandoned` between batches once `stopping()`."""
    t = config.training
    model.eval()
    decoding = Decoding(model)
    rows, batches = _dev_batches(dev, config)
    loss_sum, tokens = 0.0, 0
    hyps: dict[int, list[int]] = {}
    for batch_rows in batches:
        if stopping():
            raise ValidationAbandoned
        batch = dev.collate(rows[batch_rows]).to(device)
        batch_loss, results = _dev_batch(decoding, batch, config, device, amp_dtype)
        loss_sum += batch_loss
        tokens += batch.n_tgt_tokens
        hyps.update(zip(batch.indices.tolist(), [hyp.tokens for hyp in results], strict=True))
    hypotheses = vocabs[1].decode([hyps[i] for i in rows.tolist()])
    references = read_lines(data.reference_path("dev"))[: len(rows)]   # only "\n" ends a line
    if len(references) != len(hypotheses):          # sacreBLEU would score the common prefix without a word
        raise DataError(f"{data.reference_path('dev')} has {len(references)} lines for {len(hypotheses)} "
                        "dev pairs; preprocess the data folder again")
    metric = bleu_metric(t.bleu_tokenize, t.bleu_lowercase, "training.bleu_tokenize")   # e.g. zh for Chinese
    bleu = metric.corpus_score(hypotheses, [references])
    chrf = CHRF(lowercase=t.bleu_lowercase).corpus_score(hypotheses, [references])
    loss = loss_sum / max(tokens, 1)
    sources = vocabs[0].decode([dev.src[i].tolist() for i in range(min(t.log_examples, len(rows)))])
    examples = list(zip(sources, hypotheses, references, strict=False))
    return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": bleu.score, "chrf": chrf.score,
            "bleu_signature": metric.get_signature().format(), "examples": examples}


def _dev_batches(dev: ParallelIds, config: Config) -> tuple[np.ndarray, list[np.ndarray]]:
    """The dev rows validation reads (the first `training.val_max_sentences`) and its batches."""
    t = config.training
    rows = np.arange(len(dev) if not t.val_max_sentences else min(t.val_max_sentences, len(dev)))
    sampler = BucketBatchSampler(dev.src_lengths[rows], dev.tgt_lengths[rows], t.val_batch_tokens, shuffle=False)
    return rows, sampler.batches(0)


def _dev_batch(decoding: Decoding, batch: Batch, config: Config, device: torch.device,
               amp_dtype: torch.dtype | None) -> tuple[float, list[Hypothesis]]:
    with autocast(device, amp_dtype):
        features = decoding.forced_features(batch.src, batch.src_lengths, batch.tgt_in)
        output = decoding.model.decoder.output          # in 1024-token chunks: no tokens x vocab peak
        loss = float(output_cross_entropy(features, output.weight, output.bias, batch.tgt_out, chunk_rows=1024))
        return loss, greedy_search(decoding, batch.src, batch.src_lengths,
                                   SearchSettings(max_len_ratio=config.decoding.max_len_ratio,
                                                  min_len=config.decoding.min_len))


@torch.no_grad()
def estimate_dev_seconds(model: Seq2Seq, dev: ParallelIds | None, config: Config, device: torch.device,
                         amp_dtype: torch.dtype | None) -> float:
    """Seconds `evaluate_dev` would take now (0 without `dev`): its longest `PROBE_SENTENCES` sentences timed,
    scaled by their share of the dev tokens. It errs high: an early model's outputs run long, a few rows cost
    more each. The training RNG is left as it was."""
    if dev is None:
        return 0.0
    model.eval()
    rows, batches = _dev_batches(dev, config)
    lengths = dev.src_lengths[rows] + dev.tgt_lengths[rows]
    probe = batches[0][:PROBE_SENTENCES]
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        _dev_batch(Decoding(model), dev.collate(rows[probe]).to(device), config, device, amp_dtype)
    return (time.perf_counter() - start) * float(lengths.sum()) / max(float(lengths[probe].sum()), 1.0)


@torch.no_grad()
def first_sentence_attention(model: Seq2Seq, dev: ParallelIds, vocabs: tuple[Vocab, Vocab], device: torch.device,
                             amp_dtype: torch.dtype | None,
                             max_len_ratio: float) -> tuple[list[str], list[str], torch.Tensor]:
    """The first dev sentence's greedy translation: (source pieces, output pieces, attention weights of shape
    (output pieces, source pieces)), </s> included on both sides."""
    model.eval()
    batch = dev.collate(np.arange(1)).to(device)
    with autocast(device, amp_dtype):
        hyp = greedy_search(Decoding(model), batch.src, batch.src_lengths,
                            SearchSettings(max_len_ratio=max_len_ratio, return_attention=True))[0]
    assert hyp.attention is not None                          # asked for: return_attention
    return ([*vocabs[0].to_pieces(dev.src[0].tolist()), "</s>"], [*vocabs[1].to_pieces(hyp.tokens), "</s>"],
            hyp.attention.float())                            # (tgt pieces, src pieces)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux and macOS report it in different units)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def example_lines(src: str, hyp: str, ref: str) -> str:
    """A dev example as the training log shows it, escaped: a control character never reaches the terminal."""
    return f"  src: {printable(src)}\n  hyp: {printable(hyp)}\n  ref: {printable(ref)}"
