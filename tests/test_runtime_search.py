"""nmt.runtime's numpy searches against nmt.decode.search on one fake step: the same outputs, scores and
attention, setting for setting (greedy, beam, n-best, penalties, limits, prefixes, n-gram blocking)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from nmt.decode import search as torch_search
from nmt.decode.search import SearchSettings
from nmt.runtime import search as np_search

V, H, S = 29, 8, 17                        # target vocabulary, hidden size, source vocabulary


class Rows:
    """Named per-row arrays; `take` for the numpy searches, `index_select` for the torch ones."""

    def __init__(self, **arrays: np.ndarray) -> None:
        self.arrays = arrays

    def take(self, index: np.ndarray) -> Rows:
        return Rows(**{k: a[index] for k, a in self.arrays.items()})

    def index_select(self, index: torch.Tensor) -> Rows:
        return self.take(index.numpy())


class FakeStep:
    """A tiny attention decoder in numpy float32: h' = tanh(h A + E[y]), α = softmax(K h'), logits = (h' + α K) W + b.
    Its logits go through torch's log_softmax on both sides, so both searches see the same numbers."""

    def __init__(self, seed: int, sharpness: float = 3.0) -> None:
        rng = np.random.default_rng(seed)
        self.src_emb = rng.normal(size=(S, H)).astype(np.float32)
        self.tgt_emb = rng.normal(size=(V, H)).astype(np.float32)
        self.a = (rng.normal(size=(H, H)) / np.sqrt(H)).astype(np.float32)
        self.w = (sharpness * rng.normal(size=(H, V)) / np.sqrt(H)).astype(np.float32)
        self.b = rng.normal(size=V).astype(np.float32)

    def _encode(self, src: np.ndarray) -> tuple[Rows, Rows]:
        keys = self.src_emb[src]                                             # (batch, src_len, H)
        mask = src != 0
        h0 = np.tanh((keys * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)).astype(np.float32)
        return Rows(keys=keys, mask=mask), Rows(h=h0)

    def _step(self, prev: np.ndarray, state: Rows, memory: Rows) -> tuple[np.ndarray, Rows, np.ndarray]:
        per = len(prev) // len(memory.arrays["keys"])                        # rows per sentence
        keys = np.repeat(memory.arrays["keys"], per, 0)                      # (rows, src_len, H)
        mask = np.repeat(memory.arrays["mask"], per, 0)
        h = np.tanh(state.arrays["h"] @ self.a + self.tgt_emb[prev]).astype(np.float32)   # (rows, H)
        energy = np.where(mask, (keys @ h[:, :, None])[:, :, 0], -np.inf)
        alpha = np.exp(energy - energy.max(1, keepdims=True))
        alpha = (alpha / alpha.sum(1, keepdims=True)).astype(np.float32)
        logits = ((h + (alpha[:, :, None] * keys).sum(1)) @ self.w + self.b).astype(np.float32)
        return logits, Rows(h=h), alpha


class TorchFake(FakeStep):
    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor, fold_context: bool = True) -> tuple[Rows, Rows]:
        return self._encode(src.numpy())

    def step(self, prev: torch.Tensor, state: Rows, memory: Rows) -> tuple[torch.Tensor, Rows, torch.Tensor]:
        logits, state, alpha = self._step(prev.numpy(), state, memory)
        return torch.from_numpy(logits), state, torch.from_numpy(alpha)

    def vocab_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens


class NumpyFake(FakeStep):
    def encode(self, src: np.ndarray, src_lengths: np.ndarray, greedy: bool) -> tuple[Rows, Rows]:
        return self._encode(src)

    def step(self, prev: np.ndarray, state: Rows, memory: Rows) -> tuple[np.ndarray, Rows, np.ndarray]:
        logits, state, alpha = self._step(prev, state, memory)
        return torch.from_numpy(logits).log_softmax(-1).numpy(), state, alpha

    def vocab_ids(self, tokens: np.ndarray) -> np.ndarray:
        return tokens


def batch(seed: int, n: int = 7) -> np.ndarray:
    """n sources of 1 to 9 pieces (ids 4..S-1) + EOS, PAD-padded."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 10, size=n)
    src = np.zeros((n, lengths.max() + 1), np.int64)
    for i, length in enumerate(lengths):
        src[i, :length] = rng.integers(4, S, size=length)
        src[i, length] = 3
    return src


def same(torch_hyps: list, numpy_hyps: list) -> None:
    assert len(torch_hyps) == len(numpy_hyps)
    for t, n in zip(torch_hyps, numpy_hyps, strict=True):
        assert t.tokens == n.tokens
        assert t.score == pytest.approx(n.score, rel=1e-6, abs=1e-6)
        assert t.log_prob == pytest.approx(n.log_prob, rel=1e-6, abs=1e-6)
        assert (t.attention is None) == (n.attention is None)
        if t.attention is not None:
            np.testing.assert_allclose(t.attention.numpy(), n.attention, rtol=1e-6)


GREEDY = [dict(), dict(min_len=3), dict(max_len=4), dict(no_repeat_ngram=2), dict(no_repeat_ngram=1),
          dict(max_len_ratio=0.5), dict(return_attention=True), dict(min_len=0)]


@pytest.mark.parametrize(("seed", "options"), list(itertools.product([0, 1], GREEDY)))
def test_greedy_equals_torch(seed: int, options: dict) -> None:
    src = batch(seed)
    lengths = (src != 0).sum(1)
    want = torch_search.greedy_search(TorchFake(seed), torch.from_numpy(src), torch.from_numpy(lengths),
                                      SearchSettings(**options))
    got = np_search.greedy_search(NumpyFake(seed), src, lengths, SearchSettings(**options))
    same(want, got)
    assert any(h.tokens for h in got)


BEAM = [dict(beam_size=5), dict(beam_size=1, alpha=0.0), dict(beam_size=3, n_best=3), dict(beam_size=5, alpha=0.0),
        dict(beam_size=4, alpha=0.6), dict(beam_size=5, coverage=0.4), dict(beam_size=5, early_stop=True),
        dict(beam_size=5, min_len=4, max_len=7), dict(beam_size=3, no_repeat_ngram=2),
        dict(beam_size=5, n_best=5, return_attention=True), dict(beam_size=2, max_len_ratio=0.3, min_len=0),
        dict(beam_size=6, n_best=2, coverage=0.2, alpha=0.0)]


@pytest.mark.parametrize(("seed", "options"), list(itertools.product([0, 1, 2], BEAM)))
def test_beam_equals_torch(seed: int, options: dict) -> None:
    src = batch(seed)
    lengths = (src != 0).sum(1)
    fake = dict(sharpness=1.0) if seed == 2 else {}        # flat distributions: long searches, many ties in rank
    want = torch_search.beam_search(TorchFake(seed, **fake), torch.from_numpy(src), torch.from_numpy(lengths),
                                    SearchSettings(**options))
    got = np_search.beam_search(NumpyFake(seed, **fake), src, lengths, SearchSettings(**options))
    assert len(want) == len(got)
    for t, n in zip(want, got, strict=True):
        same(t, n)
    assert all(got)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_prefixes_are_forced_as_in_torch(beam_size: int) -> None:
    src = batch(5, n=4)
    lengths = (src != 0).sum(1)
    prefix = np.array([[7, 8, 9], [0, 0, 0], [5, 0, 0], [11, 11, 0]], np.int64)
    if beam_size == 1:
        want = [[h] for h in torch_search.greedy_search(TorchFake(5), torch.from_numpy(src), torch.from_numpy(lengths),
                                                        SearchSettings(), prefix=torch.from_numpy(prefix))]
        got = [[h] for h in np_search.greedy_search(NumpyFake(5), src, lengths, prefix=prefix)]
    else:
        want = torch_search.beam_search(TorchFake(5), torch.from_numpy(src), torch.from_numpy(lengths),
                                        SearchSettings(beam_size=beam_size, n_best=2), prefix=torch.from_numpy(prefix))
        got = np_search.beam_search(NumpyFake(5), src, lengths, SearchSettings(beam_size=beam_size, n_best=2), prefix)
    for t, n in zip(want, got, strict=True):
        same(t, n)
    assert got[0][0].tokens[:3] == [7, 8, 9] and got[2][0].tokens[:1] == [5] and got[3][0].tokens[:2] == [11, 11]


def test_top_candidates_break_ties_to_the_lower_index() -> None:
    x = np.array([[1, 5, 5, 2, 5, -np.inf], [0, 0, 0, 0, 0, 0]], np.float32)
    scores, ids = np_search.top_candidates(x, 2)
    assert ids.tolist() == [[1, 2], [0, 1]] and scores.tolist() == [[5, 5], [0, 0]]
    scores, ids = np_search.top_candidates(x[:, :2], 3)                 # fewer entries than asked: -inf padding
    assert ids.tolist() == [[1, 0, 0], [0, 1, 0]] and scores[:, 2].tolist() == [-np.inf, -np.inf]


def test_output_limits_equal_torch() -> None:
    lengths = np.array([1, 2, 7, 30, 251])
    for ratio, min_len, cap in [(2.0, 1, None), (1.3, 5, None), (0.7, 0, 12), (1.1, 20, 8)]:
        want = torch_search.max_output_lengths(torch.from_numpy(lengths), ratio, min_len, cap).numpy()
        assert np_search.max_output_lengths(lengths, ratio, min_len, cap).tolist() == want.tolist()


def test_top_candidates_equal_a_stable_sort_on_many_ties() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 3, size=(50, 40)).astype(np.float32)                # few values: ties everywhere
    x[rng.random(x.shape) < 0.3] = -np.inf
    for n in (1, 4, 10, 40):
        order = np.argsort(-x, axis=1, kind="stable")[:, :n]
        scores, ids = np_search.top_candidates(x, n)
        assert ids.tolist() == order.tolist()
        assert scores.tolist() == np.take_along_axis(x, order, 1).tolist()
