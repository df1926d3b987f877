import pytest
import torch

from nmt.model.attention import Memory, build_attention, masked_softmax, padding_bias

VARIANTS = ["bahdanau", "luong_dot", "luong_general", "luong_concat"]


def make_memory(attention, batch=3, src_len=7, size=16):
    torch.manual_seed(0)
    values = torch.randn(batch, src_len, size)
    lengths = torch.tensor([7, 4, 1])
    mask = torch.arange(src_len).unsqueeze(0) < lengths.unsqueeze(1)       # (batch, src_len)
    return Memory(values, attention.project_keys(values), mask)


@pytest.mark.parametrize("kind", VARIANTS)
def test_masked_positions_get_exactly_zero_and_rows_sum_to_one(kind):
    attention = build_attention(kind, query_size=16, value_size=16, attention_dim=8)
    memory = make_memory(attention)
    query = torch.randn(3, 16) * 10          # large scores: masking must still be exact
    context, weights = attention(query, memory)
    assert weights.shape == (3, 7) and context.shape == (3, 16)
    assert torch.all(weights[~memory.mask] == 0.0)
    assert torch.allclose(weights.sum(-1), torch.ones(3))
    assert weights[2, 0] == 1.0              # a single real position takes all the weight
    assert torch.allclose(context, torch.einsum("bs,bsd->bd", weights, memory.values), atol=1e-6)


@pytest.mark.parametrize("kind", VARIANTS)
def test_all_steps_at_once_equals_step_by_step(kind):
    attention = build_attention(kind, query_size=16, value_size=16, attention_dim=8)
    memory = make_memory(attention)
    queries = torch.randn(3, 5, 16)
    context, weights = attention(queries, memory)                          # (batch, tgt_len, ...)
    assert weights.shape == (3, 5, 7) and context.shape == (3, 5, 16)
    for i in range(5):
        step_context, step_weights = attention(queries[:, i], memory)
        assert torch.allclose(step_weights, weights[:, i], atol=1e-6)
        assert torch.allclose(step_context, context[:, i], atol=1e-6)
    assert torch.all(weights.masked_select(~memory.mask.unsqueeze(1).expand_as(weights)) == 0.0)


def test_masked_softmax_ignores_masked_scores():
    scores = torch.tensor([[1.0, 2.0, 1e9]])
    mask = torch.tensor([[True, True, False]])
    weights = masked_softmax(scores, padding_bias(mask))
    assert weights[0, 2] == 0.0
    assert torch.allclose(weights[0, :2], torch.softmax(torch.tensor([1.0, 2.0]), -1))


def test_dot_attention_needs_matching_sizes():
    with pytest.raises(ValueError, match="luong_dot needs model.decoder_hidden"):
        build_attention("luong_dot", query_size=16, value_size=32, attention_dim=8)


def test_keys_are_precomputed_projections():
    attention = build_attention("bahdanau", 16, 16, 8)
    values = torch.randn(2, 5, 16)
    assert torch.allclose(attention.project_keys(values), 2 * attention.key_proj(values))


@pytest.mark.parametrize("kind", ["bahdanau", "luong_concat"])
def test_additive_energies_are_the_textbook_ones(kind):
    """The sigmoid evaluation gives e_ij = v_aᵀ tanh(W_a s + U_a h_j) itself, not just the same softmax."""
    attention = build_attention(kind, query_size=16, value_size=16, attention_dim=8)
    memory = make_memory(attention)
    query = torch.randn(3, 4, 16) * 3
    textbook = torch.tanh(attention.query_proj(query).unsqueeze(2)
                          + attention.key_proj(memory.values).unsqueeze(1)) @ attention.v.weight.squeeze(0)
    assert torch.allclose(attention.score(query, memory.keys), textbook, atol=1e-5)


@pytest.mark.parametrize("kind", VARIANTS)
def test_beams_sharing_one_memory_row_equal_a_repeated_memory(kind):
    """Beam search keeps one memory per sentence for its `beam` query rows."""
    attention = build_attention(kind, query_size=16, value_size=16, attention_dim=8)
    memory = make_memory(attention)
    beam = 4
    queries = torch.randn(3 * beam, 16)                                   # rows: sentence-major
    shared_context, shared_weights = attention(queries, memory)
    repeated = memory.index_select(torch.arange(3).repeat_interleave(beam))
    context, weights = attention(queries, repeated)
    assert shared_weights.shape == (3 * beam, 7) and shared_context.shape == (3 * beam, 16)
    assert torch.allclose(shared_weights, weights, atol=1e-6)
    assert torch.allclose(shared_context, context, atol=1e-6)


def test_masked_softmax_refuses_a_mask_for_the_bias():
    """Added to the scores, a bool mask would shift them by 1 and 0 and mask nothing."""
    with pytest.raises(TypeError, match="padding_bias"):
        masked_softmax(torch.zeros(1, 3), torch.tensor([[True, True, False]]))
