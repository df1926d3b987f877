"""Every path of the model and the searches against the plain equations of tests/reference_decoder.py.

The model's training forward pass (with and without gradients), greedy and beam search as the CPU runs
them, the static-shape searches of the CUDA-graph path run eagerly (capture=False), a vocabulary
shortlist and int8 products: each is checked against what the equations give for the same parameters,
one sentence at a time without padding. Tolerances: float32 rounding (1e-4 on log-probabilities) for
every exact path; int8 is an approximation, held to 0.05 per output position in log p.
"""

from __future__ import annotations

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.special import BOS, EOS, PAD
from nmt.decode.graphs import SearchGraphs
from nmt.decode.quantize import quantize_int8
from nmt.decode.search import SearchSettings, beam_search, greedy_search, length_penalty, max_output_lengths
from nmt.decode.steps import Decoding
from nmt.model.seq2seq import Seq2Seq

from .conftest import randomize_feed_weights
from .reference_decoder import Reference

ATTENTIONS = ["bahdanau", "luong_dot", "luong_general", "luong_concat"]
# (attention, rnn, input feeding, decoder layers, bridge): every attention with GRU and LSTM, Luong with and
# without input feeding, two decoder and encoder layers, the zero bridge
MODELS = [(a, r, True, 1, "bridge") for a in ATTENTIONS for r in ("gru", "lstm")] + [
    ("luong_general", "gru", False, 1, "bridge"), ("luong_concat", "lstm", False, 1, "bridge"),
    ("bahdanau", "gru", True, 2, "bridge"), ("luong_general", "lstm", True, 2, "bridge"),
    ("bahdanau", "lstm", True, 1, "zero"), ("luong_dot", "gru", True, 1, "zero"),
]
IDS = [f"{a}-{r}-{'feed' if f else 'nofeed'}-{n}layer-{b}" for a, r, f, n, b in MODELS]
VOCAB = 40
EXACT = 1e-4


def make_model(attention: str, rnn: str, feeding: bool, layers: int, bridge: str) -> Seq2Seq:
    torch.manual_seed(7)
    config = ModelConfig(rnn_type=rnn, attention=attention, embedding_dim=12, encoder_hidden=16, decoder_hidden=32,
                         attention_dim=16, dropout=0.0, input_feeding=feeding, decoder_layers=layers,
                         encoder_layers=layers, bridge=bridge)
    model = Seq2Seq.from_config(config, 30, VOCAB).eval()
    randomize_feed_weights(model)
    with torch.no_grad():   # U(-0.4, 0.4): attention far from uniform (a wrong energy shows), few near-ties
        for parameter in model.parameters():
            parameter.mul_(4.0)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Five sources of lengths 9..2 (EOS included), PAD-padded, and each as a list without padding."""
    torch.manual_seed(3)
    sentences = [[*torch.randint(4, 30, (n - 1,)).tolist(), EOS] for n in (9, 6, 7, 3, 2)]
    src = torch.full((len(sentences), 9), PAD)
    for i, sentence in enumerate(sentences):
        src[i, : len(sentence)] = torch.tensor(sentence)
    return src, torch.tensor([len(s) for s in sentences]), sentences


@pytest.fixture(params=MODELS, ids=IDS)
def model(request) -> Seq2Seq:
    return make_model(*request.param)


@pytest.mark.parametrize("grad", [True, False], ids=["training", "no_grad"])
def test_teacher_forcing_is_the_equations(model, grad):
    """Seq2Seq.forward (folded context, shared gradients, one-call Luong recurrence…) gives the equations'
    logits and attention at every real position, and exactly zero attention on the padding."""
    src, lengths, sentences = batch()
    torch.manual_seed(5)
    tgt_in = torch.cat([torch.full((5, 1), BOS), torch.randint(4, VOCAB, (5, 6))], dim=1)   # (batch, 7)
    with torch.set_grad_enabled(grad):
        logits, alphas = model(src, lengths, tgt_in)
    for i, sentence in enumerate(sentences):
        steps = Reference(model, sentence).run(tgt_in[i].tolist())
        n = len(sentence)
        torch.testing.assert_close(logits[i].detach(), torch.stack([s.logits for s in steps]).detach(),
                                   atol=EXACT, rtol=EXACT)
        torch.testing.assert_close(alphas[i, :, :n].detach(), torch.stack([s.alpha for s in steps]).detach(),
                                   atol=EXACT, rtol=EXACT)
        assert bool((alphas[i, :, n:] == 0).all()), "padded source positions must get exactly zero attention"


def _greedy_paths(model: Seq2Seq):
    """name -> greedy search(src, lengths, max_len_ratio, min_len) over each path."""
    graphs = SearchGraphs(Decoding(model), capture=False)
    return {
        "eager": lambda s, n, ratio, m: greedy_search(model, s, n, SearchSettings(max_len_ratio=ratio, min_len=m)),
        "graphed": lambda s, n, ratio, m: graphs.greedy(s, n, SearchSettings(max_len_ratio=ratio, min_len=m)),
    }


@pytest.mark.parametrize("min_len", [0, 3])
def test_greedy_search_is_the_equations(model, min_len):
    src, lengths, sentences = batch()
    limits = max_output_lengths(lengths, 1.5, min_len).tolist()
    expected = [Reference(model, s).greedy(limit, min_len) for s, limit in zip(sentences, limits, strict=True)]
    for name, search in _greedy_paths(model).items():
        with torch.no_grad():
            found = search(src, lengths, 1.5, min_len)
        assert [h.tokens for h in found] == [tokens for tokens, _ in expected], name
        for hyp, (_, log_p) in zip(found, expected, strict=True):
            assert hyp.score == pytest.approx(log_p, abs=EXACT), name


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_hypotheses_are_scored_as_the_equations_score_them(model, alpha):
    """Every n-best hypothesis of the eager and the graphed beam search carries log p(y) as the equations
    compute it for its tokens, and score = log p / lp(|y| + 1), best first; beam 1 without a length
    penalty is the equations' greedy output."""
    src, lengths, sentences = batch()
    refs = [Reference(model, s) for s in sentences]
    graphs = SearchGraphs(Decoding(model), capture=False)
    with torch.no_grad():
        paths = {"eager": beam_search(model, src, lengths,
                                      SearchSettings(beam_size=4, alpha=alpha, max_len_ratio=1.5, n_best=3)),
                 "graphed": graphs.beam(src, lengths,
                                        SearchSettings(beam_size=4, alpha=alpha, max_len_ratio=1.5, n_best=3))}
    for name, found in paths.items():
        for ref, hyps in zip(refs, found, strict=True):
            assert len(hyps) == 3, name
            for hyp in hyps:
                assert hyp.log_prob == pytest.approx(ref.log_prob(hyp.tokens), abs=EXACT), name
                assert hyp.score == pytest.approx(hyp.log_prob / length_penalty(len(hyp.tokens) + 1, alpha),
                                                  abs=EXACT), name
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True), name
    limits = max_output_lengths(lengths, 1.5, 1).tolist()
    with torch.no_grad():
        beam_one = beam_search(model, src, lengths,
                               SearchSettings(beam_size=1, alpha=0.0, max_len_ratio=1.5, min_len=1))
    assert [hyps[0].tokens for hyps in beam_one] == [r.greedy(n, 1)[0] for r, n in zip(refs, limits, strict=True)]


def test_a_shortlist_scores_its_subset_as_the_equations_do(model):
    """Greedy search over a vocabulary subset that holds the full search's choices: the same tokens, each
    step normalised over the subset (log_softmax of the equations' logits at the kept ids)."""
    src, lengths, sentences = batch()
    limits = max_output_lengths(lengths, 1.5, 1).tolist()
    refs = [Reference(model, s) for s in sentences]
    chosen = {t for r, n in zip(refs, limits, strict=True) for t in r.greedy(n, 1)[0]}
    keep = torch.tensor(sorted({PAD, 1, BOS, EOS} | chosen | set(range(4, VOCAB, 3))))
    with torch.no_grad():
        found = greedy_search(Decoding(model).with_output_subset(keep), src, lengths,
                              SearchSettings(max_len_ratio=1.5, min_len=1))
    for ref, limit, hyp in zip(refs, limits, found, strict=True):
        tokens, _ = ref.greedy(limit, 1)
        assert hyp.tokens == tokens
        steps = ref.run([BOS, *tokens])
        subset_logp = sum(float(torch.log_softmax(s.logits[keep], 0)[(keep == y).nonzero().item()])
                          for s, y in zip(steps, [*tokens, EOS], strict=True))
        assert hyp.score == pytest.approx(subset_logp, abs=EXACT)


def test_int8_products_stay_within_their_tolerance_of_the_equations(model):
    """int8 greedy search: log p of its own outputs, step by step, within 0.05 per position of what the
    equations give for the same tokens (the products are approximate; the bound is the stated tolerance)."""
    src, lengths, sentences = batch()
    with torch.no_grad():
        found = greedy_search(Decoding(model, quantize_int8(model)), src, lengths, SearchSettings(max_len_ratio=1.5))
    for sentence, hyp in zip(sentences, found, strict=True):
        exact = Reference(model, sentence).log_prob(hyp.tokens)
        assert abs(hyp.score - exact) <= 0.05 * (len(hyp.tokens) + 1), (hyp.score, exact)
