"""Search options on small random models: prefixes, sampling, scores, coverage, ensembles."""

import pytest
import torch

from nmt.data.special import BOS, PAD
from nmt.decode.ensemble import Ensemble
from nmt.decode.search import (
    Sampler,
    SearchSettings,
    beam_search,
    coverage_penalty,
    force_decode,
    greedy_search,
    length_penalty,
    search,
)
from tests.test_search import random_model, source_batch


def as_targets(hyps) -> torch.Tensor:
    """Hypotheses -> (n, longest) PAD-padded output ids without EOS, for force_decode."""
    longest = max(1, max(len(h.tokens) for h in hyps))
    out = torch.full((len(hyps), longest), PAD, dtype=torch.long)
    for i, h in enumerate(hyps):
        out[i, : len(h.tokens)] = torch.tensor(h.tokens, dtype=torch.long)
    return out


def prefixes(rows: list[list[int]]) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (longest - len(r)) for r in rows], dtype=torch.long)


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_reported_log_prob_equals_teacher_forced_score(attention):
    model = random_model(attention)
    src, lengths = source_batch()
    greedy = greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5))
    log_probs, _ = force_decode(model, src, lengths, as_targets(greedy))
    assert torch.allclose(log_probs, torch.tensor([h.log_prob for h in greedy]), atol=1e-4)
    beams = beam_search(model, src, lengths, SearchSettings(beam_size=4, alpha=1.0, max_len_ratio=1.5, n_best=3))
    for i, hyps in enumerate(beams):
        scored, out_lengths = force_decode(model, src[i : i + 1].expand(len(hyps), -1),
                                           lengths[i : i + 1].expand(len(hyps)), as_targets(hyps))
        assert torch.allclose(scored, torch.tensor([h.log_prob for h in hyps]), atol=1e-4)
        normalised = scored / length_penalty(out_lengths.float(), 1.0)
        assert torch.allclose(normalised, torch.tensor([h.score for h in hyps]), atol=1e-4)


@pytest.mark.parametrize("ensembled", [False, True])
def test_scores_do_not_depend_on_how_many_rows_are_normalised_at_once(ensembled, monkeypatch):
    """Scoring makes its float32 log-probabilities a few rows at a time (memory bounded by
    FORCED_CHUNK_ELEMENTS, not by the batch): one row at a time gives the same scores."""
    import nmt.decode.steps as inference

    model = Ensemble([random_model("bahdanau"), random_model("luong_dot", seed=3)]) if ensembled \
        else random_model("bahdanau")
    src, lengths = source_batch()
    targets = as_targets(greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5)))
    at_once, _ = force_decode(model, src, lengths, targets)
    monkeypatch.setattr(inference, "FORCED_CHUNK_ELEMENTS", 1)
    one_by_one, out_lengths = force_decode(model, src, lengths, targets)
    assert targets.size(0) > 1 and torch.equal(one_by_one, at_once)
    assert out_lengths.tolist() == ((targets != PAD).sum(1) + 1).tolist()


@pytest.mark.parametrize("attention", ["bahdanau", "luong_dot"])
def test_prefix_is_forced_and_the_rest_is_the_teacher_forced_argmax(attention):
    model = random_model(attention)
    src, lengths = source_batch()
    forced = [[7, 8, 9], [5], [], [11, 12], [6, 6, 6, 6]]
    hyps = greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5), prefix=prefixes(forced))
    for i, (hyp, start) in enumerate(zip(hyps, forced, strict=True)):
        assert hyp.tokens[: len(start)] == start
        tgt_in = torch.tensor([[BOS, *hyp.tokens]])
        logits, _ = model(src[i : i + 1], lengths[i : i + 1], tgt_in)
        logp = logits.log_softmax(-1)[0]                                  # (len+1, vocab)
        logp[:, [PAD, BOS]] = float("-inf")
        predicted = logp.argmax(-1).tolist()
        assert predicted[len(start) : len(hyp.tokens)] == hyp.tokens[len(start) :]   # EOS may be forced by the limit
        assert hyp.log_prob == pytest.approx(force_decode(model, src[i : i + 1], lengths[i : i + 1],
                                                          as_targets([hyp]))[0].item(), abs=1e-4)
    beams = beam_search(model, src, lengths,
                        SearchSettings(beam_size=3, max_len_ratio=1.5, n_best=2), prefix=prefixes(forced))
    for hyps_i, start in zip(beams, forced, strict=True):
        assert hyps_i and all(h.tokens[: len(start)] == start for h in hyps_i)


def test_prefix_longer_than_the_length_limit_still_finishes():
    model = random_model()
    src, lengths = source_batch()
    long = [list(range(4, 24))] * 5                                         # 20 tokens, limit is ~1.5*len+10
    hyps = greedy_search(model, src, lengths, SearchSettings(max_len_ratio=0.1, max_len=5), prefix=prefixes(long))
    assert all(h.tokens[:20] == long[0] for h in hyps)


def test_no_repeat_ngram_in_greedy_search():
    model = random_model(sharpen=0.2)
    src, lengths = source_batch()
    for n in (1, 2, 3):
        for hyp in greedy_search(model, src, lengths, SearchSettings(max_len_ratio=3.0, no_repeat_ngram=n)):
            grams = [tuple(hyp.tokens[i : i + n]) for i in range(len(hyp.tokens) - n + 1)]
            assert len(grams) == len(set(grams))


def test_sampling_is_reproducible_and_follows_its_settings():
    model = random_model(sharpen=0.5)
    src, lengths = source_batch()

    def draw(seed, **settings):
        generator = torch.Generator().manual_seed(seed)
        return [[h.tokens for h in hyps] for hyps in
                search(model, src, lengths,
                       SearchSettings(sampler=Sampler(generator=generator, **settings), max_len_ratio=1.5, n_best=4))]

    first, again, other = draw(3), draw(3), draw(4)
    assert first == again and first != other
    assert all(len(samples) == 4 for samples in first)
    assert len({tuple(s) for samples in first for s in samples}) > 5    # samples of a sentence differ
    greedy = [h.tokens for h in greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5))]
    for settings in ({"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-4}):
        assert all(samples == [g] * 4 for samples, g in zip(draw(5, **settings), greedy, strict=True))


def test_sampled_scores_are_model_log_probs():
    model = random_model(sharpen=0.5)
    src, lengths = source_batch()
    sampler = Sampler(temperature=1.5, top_k=10, generator=torch.Generator().manual_seed(0))
    hyps = [h for sampled in search(model, src, lengths,
                                    SearchSettings(sampler=sampler, max_len_ratio=1.5, n_best=2)) for h in sampled]
    rows = torch.arange(5).repeat_interleave(2)
    scored, _ = force_decode(model, src[rows], lengths[rows], as_targets(hyps))
    assert torch.allclose(scored, torch.tensor([h.log_prob for h in hyps]), atol=1e-4)


def test_top_k_and_top_p_keep_only_their_candidates():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(2000, -1).contiguous()
    top_k = Sampler(top_k=2, generator=torch.Generator().manual_seed(0))(logp)
    assert set(top_k.tolist()) == {0, 1}
    top_p = Sampler(top_p=0.85, generator=torch.Generator().manual_seed(0))(logp)   # 0.5 + 0.3 < 0.85
    assert set(top_p.tolist()) == {0, 1, 2}


def test_coverage_penalty_is_added_to_the_normalised_score():
    model = random_model("luong_general")
    src, lengths = source_batch()
    plain = beam_search(model, src, lengths, SearchSettings(beam_size=3, max_len_ratio=1.5, return_attention=True))
    zero = beam_search(model, src, lengths, SearchSettings(beam_size=3, max_len_ratio=1.5, coverage=0.0))
    assert [h[0].tokens for h in plain] == [h[0].tokens for h in zero]
    covered = beam_search(model, src, lengths,
                          SearchSettings(beam_size=3, max_len=3, coverage=0.4, return_attention=True))
    penalties = []
    for hyps in covered:
        hyp = hyps[0]
        mask = torch.ones(1, hyp.attention.size(1), dtype=torch.bool)
        cp = coverage_penalty(hyp.attention.sum(0, keepdim=True), mask, 0.4).item()
        expected = hyp.log_prob / length_penalty(float(len(hyp.tokens) + 1), 1.0) + cp
        assert hyp.score == pytest.approx(expected, abs=1e-4)
        penalties.append(cp)
    assert max(penalties) <= 0 and min(penalties) < 0


def test_ensemble_of_a_model_with_itself_equals_the_model():
    model = random_model("bahdanau")
    src, lengths = source_batch()
    twice = Ensemble([model, model]).eval()
    assert ([h.tokens for h in greedy_search(twice, src, lengths, SearchSettings(max_len_ratio=1.5))]
            == [h.tokens for h in greedy_search(model, src, lengths, SearchSettings(max_len_ratio=1.5))])
    alone = beam_search(model, src, lengths, SearchSettings(beam_size=3, max_len_ratio=1.5, n_best=2))
    ensembled = beam_search(twice, src, lengths, SearchSettings(beam_size=3, max_len_ratio=1.5, n_best=2))
    for a, b in zip(alone, ensembled, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_ensemble_of_different_architectures_averages_log_probs():
    first, second = random_model("bahdanau", seed=0), random_model("luong_general", rnn="lstm", seed=5)
    ensemble = Ensemble([first, second]).eval()
    src, lengths = source_batch()
    hyps = beam_search(ensemble, src, lengths, SearchSettings(beam_size=3, max_len_ratio=1.5))
    targets = as_targets([h[0] for h in hyps])
    scored, _ = force_decode(ensemble, src, lengths, targets)
    assert torch.allclose(scored, torch.tensor([h[0].log_prob for h in hyps]), atol=1e-4)
    # the ensemble's step distribution is the renormalised mean of the members' log-probabilities
    tgt_in = torch.cat([torch.full((5, 1), BOS), targets], 1)
    tgt_out = torch.cat([targets, torch.full((5, 1), PAD)], 1)           # any next tokens: all are scored
    members = [m(src, lengths, tgt_in)[0].log_softmax(-1) for m in (first, second)]
    expected = ((members[0] + members[1]) / 2).log_softmax(-1).gather(2, tgt_out.unsqueeze(2)).squeeze(2)
    assert torch.allclose(ensemble.decoding().forced(src, lengths, tgt_in, tgt_out), expected, atol=1e-5)
    outputs = {tuple(tuple(h[0].tokens) for h in beam_search(m, src, lengths,
                                                             SearchSettings(beam_size=3, max_len_ratio=1.5)))
               for m in (first, second, ensemble)}
    assert len(outputs) == 3                                             # differs from both members


def test_ensemble_refuses_different_target_vocabularies():
    with pytest.raises(ValueError, match="target vocabulary"):
        Ensemble([random_model(tgt_vocab=40), random_model(tgt_vocab=41)])
