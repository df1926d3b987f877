import itertools

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.special import BOS, EOS, UNK
from nmt.decode import search as search_module
from nmt.decode.search import (
    Sampler,
    SearchSettings,
    beam_search,
    greedy_search,
    length_penalty,
    max_output_lengths,
    search,
)
from nmt.decode.steps import Decoding
from nmt.model.seq2seq import Seq2Seq

from .conftest import randomize_feed_weights

VARIANTS = ["bahdanau", "luong_dot", "luong_general", "luong_concat"]


def random_model(attention="bahdanau", rnn="gru", tgt_vocab=40, seed=0, sharpen=3.0) -> Seq2Seq:
    torch.manual_seed(seed)
    config = ModelConfig(rnn_type=rnn, attention=attention, embedding_dim=16, encoder_hidden=16, decoder_hidden=32,
                         attention_dim=16, dropout=0.0)
    model = Seq2Seq.from_config(config, 30, tgt_vocab).eval()
    randomize_feed_weights(model)              # Luong's W_f starts at zero; the feed must be exercised
    with torch.no_grad():                      # sharper distributions: fewer near-ties, more varied outputs
        model.decoder.output.weight.mul_(sharpen)
    return model


def source_batch(seed=1):
    torch.manual_seed(seed)
    lengths = torch.tensor([9, 7, 5, 3, 2])
    src = torch.zeros(5, 9, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        src[i, : n - 1] = torch.randint(4, 30, (n - 1,))
        src[i, n - 1] = EOS
    return src, lengths


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_beam_one_equals_greedy(attention, rnn):
    model = random_model(attention, rnn)
    src, lengths = source_batch()
    greedy = greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5))
    beam = beam_search(model, src, lengths, SearchSettings(beam_size=1, alpha=0.0, max_len_ratio=1.5))
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    assert torch.allclose(torch.tensor([h.score for h in greedy]), torch.tensor([b[0].score for b in beam]))


def sequence_logprob(model, src, length, tokens):
    """log p(tokens + EOS | src) by teacher forcing."""
    tgt = torch.tensor([[BOS, *tokens]])
    out = torch.tensor([[*tokens, EOS]])
    logits, _ = model(src.unsqueeze(0), torch.tensor([length]), tgt)
    return logits.log_softmax(-1).gather(2, out.unsqueeze(2)).sum().item()


@pytest.mark.parametrize(("alpha", "eos_penalty"), [(0.0, 0.0), (1.0, 0.0), (1.0, 8.0)])
@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
@pytest.mark.parametrize("min_len", [0, 1])
def test_wide_beam_finds_the_exhaustive_optimum(alpha, eos_penalty, attention, min_len):
    """Outputs of at most 3 symbols + EOS over {UNK, 4, 5}: enumerate all 40 (39 without the
    empty one: min_len 1) and compare.
    A lower EOS bias makes longer outputs win under the length penalty, after shorter ones finished."""
    max_len = 4                                     # tokens including EOS
    symbols = [UNK, 4, 5]
    for seed in range(4):
        model = random_model(attention, tgt_vocab=6, seed=seed, sharpen=4.0)
        with torch.no_grad():
            model.decoder.output.bias[EOS] -= eos_penalty
        src, lengths = source_batch(seed)
        results = beam_search(model, src, lengths,
                              SearchSettings(beam_size=128, alpha=alpha, max_len=max_len, min_len=min_len))
        narrow = beam_search(model, src, lengths,
                             SearchSettings(beam_size=2, alpha=alpha, max_len=max_len, min_len=min_len))
        for i in range(src.size(0)):
            n = int(lengths[i])
            candidates = [list(c) for k in range(min_len, max_len) for c in itertools.product(symbols, repeat=k)]
            scored = [(sequence_logprob(model, src[i, :n], n, c) / length_penalty(len(c) + 1, alpha), c)
                      for c in candidates]
            best_score, best_tokens = max(scored, key=lambda x: x[0])
            assert results[i][0].tokens == best_tokens
            assert results[i][0].score == pytest.approx(best_score, abs=1e-4)
            assert narrow[i][0].score <= best_score + 1e-4


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("early_stop", [False, True])
def test_batched_beam_equals_one_sentence_at_a_time(attention, early_stop):
    model = random_model(attention)
    src, lengths = source_batch()
    batched = beam_search(model, src, lengths,
                          SearchSettings(beam_size=4, alpha=1.0, max_len_ratio=1.5, n_best=2, early_stop=early_stop))
    for i in range(src.size(0)):
        n = int(lengths[i])
        alone = beam_search(model, src[i : i + 1, :n], lengths[i : i + 1],
                            SearchSettings(beam_size=4, alpha=1.0, max_len_ratio=1.5, n_best=2, early_stop=early_stop))
        assert [h.tokens for h in alone[0]] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone[0]] == pytest.approx([h.score for h in batched[i]], abs=1e-4)


@pytest.mark.parametrize("drop_fraction", [0.0, 0.25, 1.0])
def test_batched_greedy_equals_one_sentence_at_a_time(drop_fraction, monkeypatch):
    """Rows that ended are decoded on until they are `DROP_ENDED_FRACTION` of the batch (0: dropped at
    once; 1: kept to the end); what they compute meanwhile must not reach any output."""
    monkeypatch.setattr(search_module, "DROP_ENDED_FRACTION", drop_fraction)
    model = random_model("bahdanau")
    src = torch.cat([source_batch(seed)[0] for seed in (1, 2, 3)])       # 15 sentences, 2 to 9 pieces
    lengths = src.ne(0).sum(1)
    batched = greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5, return_attention=True))
    assert len({len(h.tokens) for h in batched}) > 2                      # rows end at different steps
    for i in range(src.size(0)):
        n = int(lengths[i])
        alone = greedy_search(model, src[i : i + 1, :n], lengths[i : i + 1],
                              SearchSettings(max_len_ratio=1.5, return_attention=True))[0]
        assert alone.tokens == batched[i].tokens
        assert alone.score == pytest.approx(batched[i].score, abs=1e-5)
        torch.testing.assert_close(alone.attention, batched[i].attention, atol=1e-5, rtol=0)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_sampling_draws_for_live_rows_only(monkeypatch):
    """Ended rows kept in the batch draw nothing: the same seed gives the same samples whenever they are
    dropped, and a row past its own length limit (only EOS allowed, and EOS blocked by no_repeat_ngram 1)
    cannot make the sampler see an all -inf row."""
    model = random_model("bahdanau")
    lengths = torch.tensor([9, 9, 9, 9, 2])                              # one short sentence: a short limit
    src = torch.zeros(5, 9, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        src[i, : n - 1] = torch.randint(4, 30, (n - 1,))
        src[i, n - 1] = EOS
    drawn = {}
    for fraction in (0.0, 0.25, 1.0):
        monkeypatch.setattr(search_module, "DROP_ENDED_FRACTION", fraction)
        drawn[fraction] = [[h.tokens for hyps in search(model, src, lengths,
                                                        SearchSettings(sampler=Sampler(generator=generator(seed)),
                                                                       no_repeat_ngram=1, n_best=2)) for h in hyps]
                           for seed in range(20)]
    assert drawn[0.25] == drawn[0.0] and drawn[1.0] == drawn[0.0]


def test_n_best_sorted_and_distinct():
    model = random_model()
    src, lengths = source_batch()
    results = beam_search(model, src, lengths, SearchSettings(beam_size=5, n_best=5, max_len_ratio=1.0))
    for hyps in results:
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5


@pytest.mark.parametrize("alpha", [0.0, 2.0])
def test_stopping_at_n_best_keeps_the_same_best_hypotheses(alpha):
    """A sentence stops once its n-best list is final, not when all `beam` hypotheses have finished.
    (With this model and alpha 2, stopping as soon as one hypothesis finishes gives other outputs.)"""
    model = random_model(seed=1)
    src, lengths = source_batch(seed=2)
    full = beam_search(model, src, lengths, SearchSettings(beam_size=5, alpha=alpha, n_best=5, max_len_ratio=2.0))
    for n_best in (1, 2):
        short = beam_search(model, src, lengths,
                            SearchSettings(beam_size=5, alpha=alpha, n_best=n_best, max_len_ratio=2.0))
        for hyps, reference in zip(short, full, strict=True):
            assert [h.tokens for h in hyps] == [h.tokens for h in reference[:n_best]]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in reference[:n_best]])


def test_early_stop_decodes_fewer_rows_and_never_beats_the_exact_search(monkeypatch):
    """OpenNMT-py's rule stops a sentence when its best candidate ends. Its best hypothesis is one the
    exact search also finished, so it never scores higher (with alpha 2 and this model, 3 of 15 differ);
    with alpha 0 the exact search stops at the same step (scores only fall): the same outputs."""
    model = random_model(seed=1)                                          # one whose outputs end early
    src = torch.cat([source_batch(seed)[0] for seed in (1, 2, 3)])       # 15 sentences
    lengths = src.ne(0).sum(1)
    rows: list[int] = []
    step = Decoding.step

    def counted_step(self, prev, *args):
        rows.append(prev.numel())
        return step(self, prev, *args)

    def search(alpha: float, early_stop: bool) -> tuple[list[list], int]:
        rows.clear()
        found = beam_search(model, src, lengths,
                            SearchSettings(beam_size=5, alpha=alpha, max_len_ratio=2.0, early_stop=early_stop))
        return found, sum(rows)

    monkeypatch.setattr(Decoding, "step", counted_step)
    (exact, exact_rows), (early, early_rows) = search(2.0, False), search(2.0, True)
    assert early_rows < exact_rows
    for fast, full in zip(early, exact, strict=True):
        assert fast[0].score <= full[0].score + 1e-6
    assert any(fast[0].tokens != full[0].tokens for fast, full in zip(early, exact, strict=True))
    (exact, _), (early, _) = search(0.0, False), search(0.0, True)
    assert [h[0].tokens for h in early] == [h[0].tokens for h in exact]


def test_min_length_and_max_length():
    model = random_model()
    src, lengths = source_batch()
    for hyps in beam_search(model, src, lengths, SearchSettings(beam_size=3, min_len=4, max_len=6)):
        assert 4 <= len(hyps[0].tokens) <= 5       # EOS not allowed before 4 tokens; at most 6 with EOS
    for hyp in greedy_search(model, src, lengths, SearchSettings(min_len=2, max_len=3)):
        assert 2 <= len(hyp.tokens) <= 2


def eos_first_model(seed=0):
    """An undertrained model's habit, exaggerated: EOS is by far the most probable first token."""
    model = random_model(seed=seed)
    with torch.no_grad():
        model.decoder.output.bias[EOS] += 30.0
    return model


def test_by_default_no_search_gives_an_empty_output():
    """EOS is not allowed at the first position unless min_len 0 asks for it (Joey NMT, fairseq): greedy,
    beam and sampling, eager and static-shape (nmt.decode.graphs, the CUDA-graph search run eagerly)."""
    from nmt.decode.graphs import SearchGraphs

    model = eos_first_model()
    src, lengths = source_batch()
    sampler = Sampler(generator=generator(0))
    empty = [greedy_search(model, src, lengths, SearchSettings(min_len=0)),
             [h[0] for h in beam_search(model, src, lengths, SearchSettings(beam_size=4, min_len=0))],
             [h[0] for h in search(model, src, lengths, SearchSettings(sampler=sampler, min_len=0))]]
    assert all(h.tokens == [] for hyps in empty for h in hyps)          # the setup: EOS wins position 0
    greedy = greedy_search(model, src, lengths)
    beams = beam_search(model, src, lengths, SearchSettings(beam_size=4, n_best=3))
    samples = search(model, src, lengths, SearchSettings(sampler=sampler, n_best=2))
    assert all(len(h.tokens) >= 1 for h in greedy)
    assert all(len(hyps) == 3 and all(len(h.tokens) >= 1 for h in hyps) for hyps in beams)
    assert all(len(h.tokens) >= 1 for hyps in samples for h in hyps)
    graphs = SearchGraphs(Decoding(model), capture=False)
    assert [h.tokens for h in graphs.greedy(src, lengths)] == [h.tokens for h in greedy]
    assert ([[h.tokens for h in hyps] for hyps in graphs.beam(src, lengths, SearchSettings(beam_size=4, n_best=3))]
            == [[h.tokens for h in hyps] for hyps in beams])


def test_the_length_cap_wins_over_the_minimum_length():
    lengths = torch.tensor([1, 5, 40])                 # source lengths, EOS included
    assert max_output_lengths(lengths, 2.0).tolist() == [10, 18, 88]
    assert max_output_lengths(lengths, 2.0, min_len=20).tolist() == [21, 21, 88]
    assert max_output_lengths(lengths, 2.0, min_len=20, cap=15).tolist() == [15, 15, 15]


def test_a_cap_below_the_minimum_length_still_ends_every_hypothesis():
    """min_len 6 under max_len 4 (a stored config older nmt accepted): the cap wins, nothing comes back empty."""
    model = random_model()
    src, lengths = source_batch()
    for hyps in beam_search(model, src, lengths, SearchSettings(beam_size=3, min_len=6, max_len=4)):
        assert hyps and len(hyps[0].tokens) == 3
    assert all(len(hyp.tokens) == 3 for hyp in greedy_search(model, src, lengths, SearchSettings(min_len=6, max_len=4)))


def test_no_repeat_ngram_blocks_repeats():
    model = random_model(tgt_vocab=8, sharpen=8.0)
    src, lengths = source_batch()
    for n in (1, 2):
        for hyps in beam_search(model, src, lengths, SearchSettings(beam_size=3, no_repeat_ngram=n, max_len_ratio=2.0)):
            tokens = hyps[0].tokens
            grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
            assert len(grams) == len(set(grams))


def test_attention_is_returned_per_hypothesis():
    model = random_model("luong_dot")
    src, lengths = source_batch()
    for hyps, n in zip(beam_search(model, src, lengths,
                                   SearchSettings(beam_size=3, return_attention=True, max_len_ratio=1.0)),
                       lengths.tolist(), strict=True):
        weights = hyps[0].attention
        assert weights.shape == (len(hyps[0].tokens) + 1, n)
        assert torch.allclose(weights.sum(-1), torch.ones(weights.size(0)), atol=1e-5)
    greedy = greedy_search(model, src, lengths, SearchSettings(return_attention=True))
    assert greedy[0].attention.shape == (len(greedy[0].tokens) + 1, 9)


def test_the_settings_are_the_decoding_configs_and_pick_the_search():
    """One object carries a DecodingConfig's search settings (and the call's n_best and attention) to
    whichever search runs; `greedy` says which: sampling, or one beam, one hypothesis and no coverage."""
    from nmt.config import DecodingConfig

    d = DecodingConfig(beam_size=4, length_penalty=0.6, max_len_ratio=1.5, min_len=2, max_len=30, no_repeat_ngram=3,
                       coverage_penalty=0.2, early_stop=True)
    s = SearchSettings.of(d, n_best=2, return_attention=True)
    assert (s.beam_size, s.alpha, s.max_len_ratio, s.min_len, s.max_len, s.n_best, s.no_repeat_ngram, s.coverage,
            s.early_stop, s.return_attention, s.sampler) == (4, 0.6, 1.5, 2, 30, 2, 3, 0.2, True, True, None)
    assert SearchSettings.of(DecodingConfig(max_len=0)).max_len is None                 # 0: only the ratio
    assert SearchSettings().min_len == DecodingConfig().min_len == 1
    assert SearchSettings(beam_size=1).greedy and SearchSettings(beam_size=5, sampler=Sampler()).greedy
    assert not any(SearchSettings(beam_size=1, **option).greedy for option in ({"n_best": 2}, {"coverage": 0.1}))
    model = random_model()
    src, lengths = source_batch()
    settings = SearchSettings(beam_size=3, n_best=2, max_len_ratio=1.5)
    assert search(model, src, lengths, settings) == beam_search(model, src, lengths, settings)
    greedy = SearchSettings(beam_size=1, max_len_ratio=1.5)
    assert search(model, src, lengths, greedy) == [[h] for h in greedy_search(model, src, lengths, greedy)]


def test_no_import_cycle_between_the_decode_modules():
    """translator imports streaming and the searches, the eager search the rule, the graphs both: none of them
    imports back, not even for type annotations."""
    import grimp

    graph = grimp.build_graph("nmt")
    for importer, imported in (("translator", "streaming"), ("search", "rule"), ("graphs", "search"),
                               ("graphs", "rule"), ("translator", "graphs")):
        importer, imported = f"nmt.decode.{importer}", f"nmt.decode.{imported}"
        assert graph.direct_import_exists(importer=importer, imported=imported)
        assert not graph.direct_import_exists(importer=imported, imported=importer), (imported, importer)
