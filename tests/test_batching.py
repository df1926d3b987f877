from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.config import load_config
from nmt.data.batching import BucketBatchSampler, ParallelIds, pad_rows
from nmt.data.folder import DataFolder
from nmt.data.rows import cut_by_budget
from nmt.data.special import BOS, EOS, PAD


@pytest.fixture(scope="module")
def train_ids(prepared) -> ParallelIds:
    folder = DataFolder.open(load_config(prepared).data.out_dir)
    return ParallelIds(folder.ids("train", "src"), folder.ids("train", "tgt"))


def test_every_sentence_exactly_once_per_epoch(train_ids):
    sampler = BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, batch_tokens=500, seed=3)
    for epoch in range(3):
        rows = np.concatenate(sampler.batches(epoch))
        assert sorted(rows.tolist()) == list(range(len(train_ids)))


def test_token_budget_counts_padding(train_ids):
    sampler = BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, batch_tokens=400, seed=0)
    for rows in sampler.batches(0):
        batch = train_ids.collate(rows)
        assert batch.src.numel() <= 400 or len(rows) == 1
        assert batch.tgt_in.numel() <= 400 or len(rows) == 1


def test_sentence_count_batches(train_ids):
    sampler = BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, batch_tokens=0, batch_size=16)
    batches = sampler.batches(0)
    assert max(len(b) for b in batches) == 16
    assert sum(len(b) for b in batches) == len(train_ids)


def test_reproducible_from_seed_and_reshuffled_per_epoch(train_ids):
    make = lambda seed: BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, 500, seed=seed)  # noqa: E731
    a, b, c = make(7).batches(0), make(7).batches(0), make(8).batches(0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(a) != len(c) or not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    epoch1 = make(7).batches(1)
    assert len(a) != len(epoch1) or not all(np.array_equal(x, y) for x, y in zip(a, epoch1, strict=True))


def test_ranks_split_batches_without_overlap(train_ids):
    full = BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, 500, seed=1).batches(0)
    shares = [BucketBatchSampler(train_ids.src_lengths, train_ids.tgt_lengths, 500, seed=1, rank=r,
                                 world_size=2).batches(0) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == len(full) // 2
    assert all(np.array_equal(x, y) for x, y in zip(shares[0], full[0::2], strict=False))
    assert all(np.array_equal(x, y) for x, y in zip(shares[1], full[1::2], strict=False))


def test_padded_tensors_and_masks(train_ids):
    rows = np.array([5, 0, 17, 3])
    batch = train_ids.collate(rows)
    assert batch.src_lengths.tolist() == sorted(batch.src_lengths.tolist(), reverse=True)
    for i, row in enumerate(batch.indices.tolist()):
        src, tgt = train_ids.src[row], train_ids.tgt[row]
        n = len(src)
        assert batch.src[i, :n].tolist() == src.tolist() and batch.src[i, n] == EOS
        assert (batch.src[i, n + 1 :] == PAD).all() and batch.src_mask[i].sum() == n + 1
        m = len(tgt)
        assert batch.tgt_in[i, 0] == BOS and batch.tgt_in[i, 1 : m + 1].tolist() == tgt.tolist()
        assert batch.tgt_out[i, :m].tolist() == tgt.tolist() and batch.tgt_out[i, m] == EOS
        assert (batch.tgt_out[i, m + 1 :] == PAD).all()
    assert batch.n_tgt_tokens == int((train_ids.tgt_lengths[rows]).sum())


def test_pad_rows_handles_empty_sentences():
    ids = np.array([7, 8, 9], dtype=np.uint16)
    offsets = np.array([0, 0, 3, 3])
    out = pad_rows(ids, offsets, np.array([0, 1, 2]), None, EOS)
    assert out.tolist() == [[EOS, PAD, PAD, PAD], [7, 8, 9, EOS], [EOS, PAD, PAD, PAD]]
    assert out.dtype == torch.int64


def test_cut_by_budget_keeps_overlong_sentence_alone():
    lengths = np.array([3, 3, 50, 3])
    batches = cut_by_budget(np.arange(4), lengths, batch_tokens=10, batch_size=0)
    assert [b.tolist() for b in batches] == [[0, 1], [2], [3]]


def test_padding_under_ten_percent_on_multi30k(tmp_path):
    """The issue's bar: < 10% pad tokens per epoch with batch_tokens 2000 (the full Multi30k: 5%; the
    3,000 pairs of tests/data/multi30k: 8%, since a smaller corpus has fewer sentences of each length)."""
    from nmt.data.preprocess import preprocess

    from .conftest import MULTI30K, make_config

    config = load_config(make_config(tmp_path, MULTI30K, data={"vocab_size": 8000, "test": None}))
    folder = DataFolder.open(preprocess(config))
    ids = ParallelIds(folder.ids("train", "src"), folder.ids("train", "tgt"))
    sampler = BucketBatchSampler(ids.src_lengths, ids.tgt_lengths, batch_tokens=2000, seed=42)
    for epoch in range(2):
        assert padding_fraction(sampler, sampler.batches(epoch)) < 0.10


def padding_fraction(sampler, batches) -> float:
    """Fraction of pad tokens over both sides of the padded batches."""
    real = padded = 0
    for rows in batches:
        src, tgt = sampler.src_lengths[rows].astype(np.int64), sampler.tgt_lengths[rows].astype(np.int64)
        real += int(src.sum() + tgt.sum())
        padded += len(rows) * int(src.max() + tgt.max())
    return 1.0 - real / padded


def test_batch_bounds_match_the_greedy_cut_on_sorted_pools():
    from nmt.data.batching import batch_bounds

    rng = np.random.default_rng(0)
    for _trial in range(20):
        lengths = rng.integers(1, 60, size=int(rng.integers(1, 400)))
        pool_size = int(rng.integers(1, 120))
        starts_p = np.arange(0, len(lengths), pool_size)
        ends_p = np.minimum(starts_p + pool_size, len(lengths))
        for s, e in zip(starts_p, ends_p, strict=True):
            lengths[s:e] = np.sort(lengths[s:e])
        for budget, size in ((int(rng.integers(1, 500)), 0), (0, int(rng.integers(1, 30)))):
            expected = [b for s, e in zip(starts_p, ends_p, strict=True)
                        for b in cut_by_budget(np.arange(s, e), lengths, budget, size)]
            starts, ends = batch_bounds(lengths, starts_p, ends_p, budget, size)
            assert [list(range(s, e)) for s, e in zip(starts, ends, strict=True)] == [b.tolist() for b in expected]


def test_corpus_weights_repeat_and_subsample_per_epoch():
    lengths = np.full(100, 5)
    corpora = [(0, 60, 2.0), (60, 100, 0.5)]
    sampler = BucketBatchSampler(lengths, lengths, batch_tokens=60, seed=4, corpora=corpora)
    seen = []
    for epoch in range(2):
        rows = np.concatenate(sampler.batches(epoch))
        counts = np.bincount(rows, minlength=100)
        assert (counts[:60] == 2).all()                              # weight 2: every pair twice
        assert sorted(set(counts[60:].tolist())) == [0, 1] and counts[60:].sum() == 20   # 0.5: a random half
        seen.append(frozenset(np.flatnonzero(counts[60:])))
    assert seen[0] != seen[1]                                        # a different half each epoch
    again = BucketBatchSampler(lengths, lengths, batch_tokens=60, seed=4, corpora=corpora).batches(1)
    assert all(np.array_equal(a, b) for a, b in zip(again, sampler.batches(1), strict=True))


def _resident_mb() -> float:
    """This process's file-backed resident memory (memory-mapped pages), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no RssFile in /proc/self/status")


def test_collated_pages_are_released_from_memory(tmp_path):
    """Random reads map the id files into the process; every RELEASE_EVERY batches they are unmapped
    again, so the batches stay the same and the resident memory does not grow with the corpus."""
    from nmt.data.corpus import IdFile, IdWriter

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=400_000)
    flat = rng.integers(4, 8000, size=int(lengths.sum())).astype(np.uint16)     # ~40 MB of ids per side
    for side in ("src", "tgt"):
        writer = IdWriter(tmp_path / side, np.uint16)
        writer.append(flat, lengths)
        writer.close()
    ids = ParallelIds(IdFile(tmp_path / "src", np.dtype(np.uint16)), IdFile(tmp_path / "tgt", np.dtype(np.uint16)))
    ids.RELEASE_EVERY = 10**9                                                    # never: the files pile up
    ids_batches = 600
    batches = [rng.integers(0, len(lengths), size=64) for _ in range(ids_batches)]
    before = _resident_mb()
    kept = [ids.collate(rows) for rows in batches]
    grown = _resident_mb() - before
    assert grown > 20, grown                                       # the test can see the pages pile up
    ids.src.release()
    ids.tgt.release()
    assert _resident_mb() - before < grown / 4                     # and release unmaps them
    ids.RELEASE_EVERY = 16
    before = _resident_mb()
    again = [ids.collate(rows) for rows in batches]
    assert _resident_mb() - before < grown / 4
    assert len(again) == ids_batches
    for a, b in zip(kept, again, strict=True):
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
