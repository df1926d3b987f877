import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmt.config import ModelConfig, load_config
from nmt.data.batching import ParallelIds
from nmt.data.folder import DataFolder
from nmt.data.special import PAD
from nmt.decode.search import greedy_search
from nmt.decode.steps import Decoding
from nmt.device import make_optimizer
from nmt.model.output_rows import padded_rows
from nmt.model.seq2seq import Seq2Seq

from .conftest import randomize_feed_weights

VARIANTS = ["bahdanau", "luong_dot", "luong_general", "luong_concat"]


def sequence_loss(logits: torch.Tensor, tgt_out: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Summed cross-entropy from full logits over real target tokens (padding ignored)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt_out.reshape(-1), ignore_index=PAD,
                           label_smoothing=label_smoothing, reduction="sum")


@pytest.fixture(scope="module")
def small_batch(prepared):
    folder = DataFolder.open(load_config(prepared).data.out_dir)
    ids = ParallelIds(folder.ids("train", "src"), folder.ids("train", "tgt"))
    rows = np.flatnonzero(ids.tgt_lengths <= 12)[:32]
    return ids.collate(rows), len(folder.vocab("src")), len(folder.vocab("tgt"))


def tiny(attention="bahdanau", rnn="gru", **kw) -> ModelConfig:
    """A tiny model; PyTorch's default initialisation suits its small sizes better than U(-0.1, 0.1)."""
    kw.setdefault("init", "default")
    return ModelConfig(rnn_type=rnn, attention=attention, embedding_dim=32, encoder_hidden=32, decoder_hidden=64,
                       attention_dim=32, dropout=0.0, **kw)


def test_uniform_init_bounds_every_parameter():
    model = Seq2Seq.from_config(ModelConfig(init="uniform", init_scale=0.05), 50, 40)
    for name, parameter in model.named_parameters():
        assert parameter.abs().max() <= 0.05, name
    default = Seq2Seq.from_config(ModelConfig(init="default"), 50, 40)
    assert default.encoder.embed.weight.abs().max() > 1.0          # N(0, 1) embeddings


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("attention", VARIANTS)
def test_tiny_model_overfits_a_few_dozen_pairs(small_batch, attention, rnn):
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention, rnn), src_vocab, tgt_vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(120):
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        loss = sequence_loss(logits, batch.tgt_out, 0.0) / batch.n_tgt_tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10, (losses[0], losses[-1])


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_teacher_forcing_ratio_zero_and_one(small_batch, attention):
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention), src_vocab, tgt_vocab).eval()
    randomize_feed_weights(model)
    full, _ = model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=1.0)
    free, _ = model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=0.0)
    assert full.shape == free.shape
    assert torch.allclose(full[:, 0], free[:, 0], atol=1e-5)        # step 0 always sees BOS
    assert not torch.allclose(full, free)                           # later steps see the model's own tokens
    loss = sequence_loss(free, batch.tgt_out, 0.0)
    loss.backward()
    assert torch.isfinite(loss) and model.decoder.embed.weight.grad is not None


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("input_feeding", [True, False])
def test_teacher_forced_path_equals_step_by_step(small_batch, attention, input_feeding):
    """Training's teacher forcing, the model's step as the equations read, and decoding's inference step
    (token table, fused and folded weights, padded output rows) give the same logits and weights."""
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention, input_feeding=input_feeding), src_vocab, tgt_vocab).eval()
    randomize_feed_weights(model)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)     # the training path
    decoding = Decoding(model)
    with torch.no_grad():
        for name, (encode, step) in {"model": (model.encode, model.decoder.step),
                                     "inference": (decoding.encode, decoding.step)}.items():
            memory, state = encode(batch.src, batch.src_lengths)
            for i in range(batch.tgt_in.size(1)):
                step_logits, state, step_weights = step(batch.tgt_in[:, i], state, memory)
                assert torch.allclose(step_logits, logits[:, i], atol=1e-5), name
                assert torch.allclose(step_weights, weights[:, i], atol=1e-6), name
        forced = decoding.forced_logits(batch.src, batch.src_lengths, batch.tgt_in)
    torch.testing.assert_close(forced, logits, rtol=1e-5, atol=1e-5)
    assert torch.all(weights.masked_select(~batch.src_mask.unsqueeze(1).expand_as(weights)) == 0.0)


@pytest.mark.parametrize("attention,rnn,bridge", [*((a, "gru", "bridge") for a in VARIANTS),
                                                   ("bahdanau", "lstm", "zero")])
def test_teacher_forced_gradients_equal_step_by_step(small_batch, attention, rnn, bridge):
    """Training's teacher-forced path (Bahdanau: gradients of [W_h; W_a] and W_ctx h_j summed once after
    the loop, nmt.model.shared_grads) gives the gradients plain autograd gives over `step`, also when an
    earlier backward pass over the same graph asked for other inputs only."""
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention, rnn, input_feeding=True, bridge=bridge), src_vocab, tgt_vocab).eval()
    randomize_feed_weights(model)

    def loss_of(ratio: float) -> torch.Tensor:
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=ratio)
        return sequence_loss(logits, batch.tgt_out, 0.0)

    model.zero_grad()
    loss_of(0.999999999).backward()   # below 1: the per-step path; it rounds to 1 in float32, so always the reference
    stepped = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    loss = loss_of(1.0)
    torch.autograd.grad(loss, [model.decoder.embed.weight], retain_graph=True)   # runs the steps, not the sums
    loss.backward()
    for name, p in model.named_parameters():
        scale = float(p.grad.abs().max())
        assert scale > 0, name               # the step's cat-and-multiply rounds otherwise than the split products
        torch.testing.assert_close(p.grad, stepped[name], rtol=1e-4, atol=1e-6 * max(1.0, scale), msg=name)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_teacher_forcing_as_cuda_runs_it_gives_the_cpus_gradients(small_batch, monkeypatch, rnn):
    """CUDA's teacher forcing takes every step's gradients in the loop (nmt.model.bahdanau.shares_grads is
    False there): the same loss and gradients as the CPU's sums after the loop, checked here on the CPU."""
    from nmt.model import bahdanau

    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny("bahdanau", rnn), src_vocab, tgt_vocab).eval()

    def loss_and_gradients() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        loss = sequence_loss(logits, batch.tgt_out, 0.0)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    cpu_loss, cpu_grads = loss_and_gradients()
    monkeypatch.setattr(bahdanau, "shares_grads", lambda device: False)
    cuda_loss, cuda_grads = loss_and_gradients()
    torch.testing.assert_close(cuda_loss, cpu_loss)
    for name, grad in cpu_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(cuda_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("attention", VARIANTS)
def test_inference_memory_projects_only_the_real_positions(attention):
    """In inference the per-batch projections (keys; Bahdanau's W_ctx h_j and W_cc h_j) skip padded
    positions: training's full projections at the real positions, zeros at the padded ones."""
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention), 50, 40).eval()
    values = torch.randn(3, 7, model.encoder.output_size)                # (batch, src_len, enc_out)
    mask = torch.arange(7) < torch.tensor([7, 4, 1]).unsqueeze(1)        # (batch, src_len)
    full = model.decoder.memory(values, mask)
    with torch.no_grad():
        real = Decoding(model).steps().memory(values, mask, True)
    if not model.decoder.attention.projects_keys:
        assert real.keys is values
    projected = ["context_terms"] if attention == "bahdanau" else []
    for name in projected + (["keys"] if model.decoder.attention.projects_keys else []):
        whole, skipped = getattr(full, name), getattr(real, name)
        torch.testing.assert_close(skipped[mask], whole[mask].to(skipped.dtype), rtol=1e-5, atol=1e-6)
        assert torch.all(skipped[~mask] == 0), name


def test_teacher_forced_gradients_under_bf16_autocast_match_step_by_step(small_batch):
    """The shared-gradient sums (nmt.model.shared_grads) also serve bf16 autocast training on the CPU: the
    inputs and gradients they record are bf16, their sums are cast back to the weights' float32."""
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny("bahdanau"), src_vocab, tgt_vocab)

    def gradients(ratio: float) -> dict[str, torch.Tensor]:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=ratio)
        sequence_loss(logits, batch.tgt_out, 0.0).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    stepped, shared = gradients(0.999999999), gradients(1.0)    # below 1: the per-step path, every step forced
    floor = 1e-4 * torch.cat([g.flatten() for g in stepped.values()]).norm()   # near-zero gradients (biases)
    for name, reference in stepped.items():
        assert shared[name].dtype == torch.float32 and torch.isfinite(shared[name]).all(), name
        assert (shared[name] - reference).norm() <= 2e-2 * reference.norm() + floor, name


@pytest.mark.parametrize("init", ["uniform", "default"])
def test_luong_input_feeding_weights_start_at_zero_and_learn(small_batch, init):
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny("luong_general", init=init, input_feeding=True), src_vocab, tgt_vocab)
    emb, hidden = model.decoder.embedding_dim, model.decoder.hidden_size
    feed = model.decoder.rnn.input_weight(emb, emb + hidden)            # W_f: multiplies h̃_{i-1}
    assert torch.count_nonzero(feed) == 0
    assert torch.count_nonzero(model.decoder.rnn.input_weight(0, emb)) == feed.size(0) * emb   # W_e untouched
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
    sequence_loss(logits, batch.tgt_out, 0.0).backward()
    grad = model.decoder.rnn.rnn.weight_ih_l0.grad[:, emb:emb + hidden]
    assert grad.abs().max() > 0                                          # the feed learns from the first update
    plain = Seq2Seq.from_config(tiny("luong_general", init=init, input_feeding=False), src_vocab, tgt_vocab)
    assert plain.decoder.rnn.rnn.weight_ih_l0.shape[1] == emb and torch.count_nonzero(
        plain.decoder.rnn.rnn.weight_ih_l0) == plain.decoder.rnn.rnn.weight_ih_l0.numel()


def test_tied_embeddings_share_the_output_matrix():
    model = Seq2Seq.from_config(ModelConfig(embedding_dim=64, decoder_hidden=64, tie_embeddings=True), 50, 40)
    assert model.decoder.output.weight is model.decoder.embed.weight


def test_multilayer_lstm_bridge_shapes():
    config = ModelConfig(rnn_type="lstm", encoder_layers=2, decoder_layers=3, embedding_dim=8, encoder_hidden=8,
                         decoder_hidden=12, attention_dim=8)
    model = Seq2Seq.from_config(config, 30, 20)
    src = torch.tensor([[5, 6, 7, 3], [8, 3, 0, 0]])
    memory, state = model.encode(src, torch.tensor([4, 2]))
    assert memory.values.shape == (2, 4, 16)
    assert state.hidden.shape == (3, 2, 12) and state.cell.shape == (3, 2, 12)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 3])
def test_recurrent_stack_steps_equal_the_fused_sequence_call(rnn, layers):
    import torch.nn.functional as F

    from nmt.model.recurrent import RecurrentStack

    torch.manual_seed(0)
    stack = RecurrentStack(rnn, input_size=6, hidden=8, layers=layers, dropout=0.2).eval()
    inputs = torch.randn(4, 5, 6)
    hidden = torch.randn(layers, 4, 8)
    cell = torch.randn(layers, 4, 8) if rnn == "lstm" else None
    outputs, final_hidden, final_cell = stack(inputs, hidden, cell)
    for t in range(5):
        gi0 = F.linear(inputs[:, t], stack.input_weight(0, 6), stack.input_bias())
        top, hidden, cell = stack.step(gi0, hidden, cell)
        assert torch.allclose(top, outputs[:, t], atol=1e-6)
    assert torch.allclose(hidden, final_hidden, atol=1e-6)
    if rnn == "lstm":
        assert torch.allclose(cell, final_cell, atol=1e-6)


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_multilayer_lstm_teacher_forced_equals_steps(small_batch, attention):
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    config = tiny(attention, "lstm", decoder_layers=2, encoder_layers=2)
    model = Seq2Seq.from_config(config, src_vocab, tgt_vocab).eval()
    randomize_feed_weights(model)
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
    memory, state = model.encode(batch.src, batch.src_lengths)
    for i in range(batch.tgt_in.size(1)):
        step_logits, state, _ = model.decoder.step(batch.tgt_in[:, i], state, memory)
        assert torch.allclose(step_logits, logits[:, i], atol=1e-5)


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_derived_weights_follow_a_fused_optimizer_step(small_batch, attention):
    """Validation between training updates must see the updated parameters: fused Adam changes
    them in place without bumping their versions, so nothing may be cached across searches."""
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention), src_vocab, tgt_vocab)
    optimizer = make_optimizer(torch.optim.Adam, model.parameters(), lr=0.05)
    model.eval()
    with torch.no_grad():
        before = greedy_search(model, batch.src, batch.src_lengths)
    model.train()
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
    sequence_loss(logits, batch.tgt_out, 0.0).backward()
    optimizer.step()
    model.eval()
    fresh = Seq2Seq.from_config(tiny(attention), src_vocab, tgt_vocab).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        after = greedy_search(model, batch.src, batch.src_lengths)
        expected = greedy_search(fresh, batch.src, batch.src_lengths)
        decoding = Decoding(model)                           # built after the update: its weights
        memory, state = decoding.encode(batch.src, batch.src_lengths)
        first, state, _ = decoding.step(batch.tgt_in[:, 0], state, memory)
        assert decoding.built                                # built once, kept for the next steps
        memory, state = fresh.encode(batch.src, batch.src_lengths)
        reference, _, _ = fresh.decoder.step(batch.tgt_in[:, 0], state, memory)
    assert [h.tokens for h in after] == [h.tokens for h in expected]
    assert [h.tokens for h in after] != [h.tokens for h in before]
    assert torch.allclose(first, reference, atol=1e-5)


def test_padded_rows_rounds_up_to_16_with_the_fill():
    weight, bias = torch.randn(37, 5), torch.randn(37)
    padded = padded_rows(weight)
    assert padded.shape == (48, 5) and torch.equal(padded[:37], weight) and torch.all(padded[37:] == 0)
    assert torch.all(padded_rows(bias, float("-inf"))[37:] == float("-inf"))
    assert padded_rows(torch.randn(32, 5)).shape == (32, 5)


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_inference_logits_through_padded_rows_equal_the_output_layer(attention):
    """A decoding step multiplies by W_s padded to 16s rows (37 -> 48) and cuts the logits
    back; with a shortlist, W_s[keep] padded likewise (9 -> 16): the plain layer's logits either way."""
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(attention), 50, 37).eval()
    src, lengths = torch.randint(4, 50, (3, 6)), torch.tensor([6, 4, 2])
    keep = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34])
    positions = torch.tensor([4, 5, 8])                                 # tokens 5, 8, 34 as shortlist positions
    with torch.no_grad():
        memory, state = model.encode(src, lengths)
        plain, _, _ = model.decoder.step(keep[positions], state, memory)        # the model: nn.Linear
        decoding = Decoding(model)
        padded, _, _ = decoding.step(keep[positions], state, memory)
        subset, _, _ = decoding.with_output_subset(keep).step(positions, state, memory)
        assert decoding.subset is None                                          # the subset is the view's only
    assert padded.shape == (3, 37) and subset.shape == (3, 9)
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(subset, plain[:, keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"rnn": "lstm", "decoder_layers": 2}])
def test_bahdanau_steps_over_an_unfolded_memory_equal_the_folded_ones(small_batch, options):
    """Greedy search's memory leaves W_ctx and W_cc out (a step multiplies c_i by them instead): the same
    logits, states and weights as steps over the folded memory that beam search and training use."""
    batch, src_vocab, tgt_vocab = small_batch
    torch.manual_seed(0)
    model = Seq2Seq.from_config(tiny(**options), src_vocab, tgt_vocab).eval()
    decoding = Decoding(model)
    with torch.no_grad():
        folded, state = decoding.encode(batch.src, batch.src_lengths)
        unfolded, _ = decoding.encode(batch.src, batch.src_lengths, fold_context=False)
        assert folded.context_terms is not None and unfolded.context_terms is None
        state_f = state_u = state
        for i in range(batch.tgt_in.size(1)):
            logits_f, state_f, weights_f = decoding.step(batch.tgt_in[:, i], state_f, folded)
            logits_u, state_u, weights_u = decoding.step(batch.tgt_in[:, i], state_u, unfolded)
            torch.testing.assert_close(logits_u, logits_f, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(state_u.hidden, state_f.hidden, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(weights_u, weights_f, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layers,bidirectional", [(1, True), (1, False), (2, True), (2, False)])
def test_training_gru_encoder_equals_the_packed_call(layers, bidirectional, monkeypatch):
    """With gradients on the CPU a GRU encoder runs unpacked, one call per layer and direction (its backward
    direction over each sentence reversed within its length): same outputs, final states and gradients as
    the packed call it replaces, including for the sentences shorter than the batch."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from nmt.model.encoder import Encoder

    torch.manual_seed(0)
    encoder = Encoder(40, 6, 5, layers, bidirectional, "gru", dropout=0.0).double().train()
    unpacked_calls = []
    run_unpacked = encoder._gru_unpacked
    monkeypatch.setattr(encoder, "_gru_unpacked", lambda *a: unpacked_calls.append(1) or run_unpacked(*a))
    lengths = torch.tensor([7, 1, 7, 7, 6, 7, 7, 7, 7, 7])                # 10% padding: unpacked
    src = torch.randint(4, 40, (10, 7))
    src[torch.arange(7) >= lengths.unsqueeze(1)] = PAD
    out_grad = torch.randn(10, 7, encoder.output_size, dtype=torch.float64)
    final_grad = torch.randn(10, encoder.output_size, dtype=torch.float64)

    def gradients(outputs: torch.Tensor, final: torch.Tensor) -> list[torch.Tensor]:
        encoder.zero_grad()
        ((outputs * out_grad).sum() + (final * final_grad).sum()).backward()
        return [p.grad.clone() for p in encoder.parameters()]

    unpacked = encoder(src, lengths)
    assert unpacked_calls == [1]
    unpacked_grads = gradients(unpacked.outputs, unpacked.final)
    packed_out, packed_final = encoder.rnn(pack_padded_sequence(encoder.embed(src), lengths, batch_first=True,
                                                                enforce_sorted=False))
    packed = encoder._output(pad_packed_sequence(packed_out, batch_first=True, total_length=7)[0], packed_final)
    packed_grads = gradients(packed.outputs, packed.final)

    assert torch.allclose(unpacked.outputs, packed.outputs, atol=1e-12)
    assert (unpacked.outputs[src == PAD] == 0).all()
    assert torch.allclose(unpacked.final, packed.final, atol=1e-12)
    for unpacked_grad, packed_grad in zip(unpacked_grads, packed_grads, strict=True):
        assert torch.allclose(unpacked_grad, packed_grad, atol=1e-12)
    with torch.no_grad():                                             # inference keeps the packed call
        assert torch.allclose(encoder(src, lengths).outputs, packed.outputs, atol=1e-12)
    short = lengths.clamp(max=2)                                      # mostly padding: the packed call
    src[torch.arange(7) >= short.unsqueeze(1)] = PAD
    encoder(src, short)
    assert unpacked_calls == [1]
