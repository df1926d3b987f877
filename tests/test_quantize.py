"""int8 decoding (--quantize int8): torch.ao dynamic int8 products close to float32, on Bahdanau and Luong."""

import pytest
import torch
import torch.nn.functional as F

from nmt.config import ModelConfig
from nmt.decode.quantize import Int8Products, _int8_linear, quantize_int8
from nmt.decode.steps import Decoding
from nmt.decode.translator import Translator
from nmt.evaluate import bleu
from nmt.model.seq2seq import Seq2Seq

from .conftest import randomize_feed_weights, read_gz
from .test_translate import run_cli


def test_int8_linear_is_close_to_float32():
    torch.manual_seed(0)
    weight, bias, inputs = torch.randn(300, 64) * 0.1, torch.randn(300), torch.randn(50, 64)
    exact = F.linear(inputs, weight, bias)
    approx = _int8_linear(weight, bias)(inputs)
    assert approx.dtype == torch.float32 and approx.shape == exact.shape
    error = (approx - exact).abs().max() / exact.abs().max()
    assert 0 < error < 0.02                              # quantized (not the float path), and close


def test_int8_rows_are_the_full_products_rows():
    """A shortlist's cut of the int8 output product: the same int8 values and scales, so the same numbers."""
    torch.manual_seed(0)
    weight, bias, inputs = torch.randn(300, 64) * 0.1, torch.randn(300), torch.randn(50, 64)
    full = _int8_linear(weight, bias)
    rows = torch.tensor([0, 1, 2, 3, 17, 120, 299])
    assert torch.equal(full.rows(rows)(inputs), full(inputs)[:, rows])
    assert not torch.equal(full.rows(rows)(inputs), F.linear(inputs, weight[rows], bias[rows]))   # int8, not float


def _step_log_probs(model: Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, steps: int,
                    fold_context: bool = True, int8: Int8Products | None = None) -> torch.Tensor:
    """Log-probabilities of `steps` teacher-free steps fed with token 2 (BOS) then the argmax, with `int8`."""
    out = []
    decoding = Decoding(model, int8)
    with torch.no_grad():
        memory, state = decoding.encode(src, lengths, fold_context)
        tokens = torch.full((src.size(0),), 2)
        for _ in range(steps):
            logits, state, _ = decoding.step(tokens, state, memory)
            out.append(logits.log_softmax(-1))
            tokens = logits.argmax(-1)
    return torch.stack(out, 1)                            # (batch, steps, vocab)


@pytest.mark.parametrize("model_options", [
    dict(attention="bahdanau", rnn_type="gru"),
    dict(attention="luong_general", rnn_type="lstm", input_feeding=True),
    dict(attention="luong_dot", rnn_type="gru", input_feeding=False, decoder_hidden=64),
])
def test_quantized_model_steps_close_to_float32(model_options):
    """Every product that quantize_int8 replaces is used, and the step outputs stay close."""
    torch.manual_seed(0)
    config = ModelConfig(embedding_dim=32, encoder_hidden=32, decoder_hidden=model_options.pop("decoder_hidden", 48),
                         attention_dim=40, dropout=0.0, **model_options)
    model = Seq2Seq.from_config(config, src_vocab=120, tgt_vocab=90).eval()
    randomize_feed_weights(model)
    src = torch.randint(4, 120, (6, 9))
    src[3, 5:] = 0
    lengths = (src != 0).sum(1)
    exact = _step_log_probs(model, src, lengths, steps=5)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    int8 = quantize_int8(model)
    approx = _step_log_probs(model, src, lengths, steps=1, int8=int8)
    assert not torch.equal(approx, exact[:, :1])                    # the int8 products ran
    assert (approx - exact[:, :1]).abs().max() < 0.05
    assert torch.equal(_step_log_probs(model, src, lengths, steps=5), exact)   # the model itself stays float32
    if model_options["attention"] == "bahdanau":                     # greedy's unfolded memory: int8 [W_ctx; W_cc] c_i
        context, calls = int8.context, []
        add = context.add                                            # the step's c_i product, with its token terms
        context.add = lambda terms, x: calls.append(x.shape) or add(terms, x)
        unfolded = _step_log_probs(model, src, lengths, steps=3, fold_context=False, int8=int8)
        del context.add
        assert calls == [(6, 64)] * 3                                 # once per step, on c_i (rows, enc_out)
        assert (unfolded - exact[:, :3]).abs().max() < 0.05
    for name, value in model.state_dict().items():                  # float parameters untouched, none added
        assert torch.equal(value, before[name]), name
    assert model.state_dict().keys() == before.keys()
    tgt_in = torch.randint(4, 90, (6, 4))
    float_model = Seq2Seq.from_config(config, src_vocab=120, tgt_vocab=90).eval()
    float_model.load_state_dict(before)
    assert torch.equal(model(src, lengths, tgt_in)[0], float_model(src, lengths, tgt_in)[0])   # training: float32


@pytest.mark.parametrize("attention,products,options", [
    ("bahdanau", ["keys", "context"], {}), ("bahdanau", ["keys", "context"], {"rnn_type": "lstm", "decoder_layers": 2}),
    ("luong_general", ["keys"], {}), ("luong_concat", ["keys"], {})])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("fold_context", [True, False])
def test_int8_memory_is_close_to_float32(attention, products, options, padded, fold_context):
    """The once-per-batch products (keys; Bahdanau's projected annotations when folded) run in int8."""
    torch.manual_seed(0)
    config = ModelConfig(embedding_dim=32, encoder_hidden=32, decoder_hidden=48, attention_dim=40, dropout=0.0,
                         attention=attention, **options)
    model = Seq2Seq.from_config(config, src_vocab=120, tgt_vocab=90).eval()
    values, mask = torch.randn(5, 7, 64), torch.ones(5, 7, dtype=torch.bool)
    if padded:
        mask[2, 4:] = False
    with torch.no_grad():
        exact = Decoding(model).steps().memory(values, mask, fold_context)
        int8 = quantize_int8(model)
        assert all(getattr(int8, product) is not None for product in products)
        approx = Decoding(model, int8).steps().memory(values, mask, fold_context)
    if attention == "bahdanau":
        assert (approx.context_terms is None) == (not fold_context)
    for name in ("keys", "context_terms"):
        a, b = getattr(approx, name), getattr(exact, name)
        if b is None:
            assert a is None
            continue
        assert a.shape == b.shape and not torch.equal(a, b), name                 # int8 ran
        assert (a - b).abs().max() < 0.03 * b.abs().max(), name
        assert not padded or not a[2, 4:].any(), name                             # padded positions stay zero


def test_int8_translations_match_float32(trained_run):
    sources = read_gz("test_2016_flickr.de", 60)
    fp32 = Translator.load(trained_run / "best.pt", device="cpu", precision="fp32", beam_size=3, shortlist=False)
    int8 = Translator.load(trained_run / "best.pt", device="cpu", quantize="int8", beam_size=3, shortlist=False)
    assert int8.amp_dtype is None
    full, quantized = [t.text for t in fp32.translate(sources)], [t.text for t in int8.translate(sources)]
    # BLEU against the float32 outputs, not exact matches: this 40-update model repeats pieces ("a a a ..."),
    # and a repetition one longer or shorter fails a whole line (35 to 50 of 60 equal, by thread count)
    agreement = bleu(quantized, full)
    assert agreement >= 95.0, agreement


def test_cli_quantize_option(trained_run, tmp_path):
    checkpoint = str(trained_run / "best.pt")
    done = run_cli("translate", "--checkpoint", checkpoint, "--quantize", "int8", "-q", stdin="ein Hund .\n\nzwei\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split("\n")) == 4                         # one line out per line in
    for bad, words in ((["--quantize", "int4"], "int4"), (["--quantize", "int8", "--precision", "bf16"], "bf16")):
        result = run_cli("translate", "--checkpoint", checkpoint, *bad, stdin="ein Hund .\n")
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith("error:") and words in result.stderr and "Traceback" not in result.stderr


def test_export_quantize_int8_makes_int8_the_model_files_default(trained_run, tmp_path):
    model_file = tmp_path / "model.nmt"
    done = run_cli("export", str(trained_run / "best.pt"), "-o", str(model_file), "--quantize", "int8")
    assert done.returncode == 0, done.stderr
    translator = Translator.load(model_file, device="cpu")
    assert translator.decoding.quantize == "int8" and translator.search_model.int8 is not None
    assert Translator.load(model_file, device="cpu", quantize="none").search_model.int8 is None
    info = run_cli("info", str(model_file))
    assert info.returncode == 0 and "int8" in info.stdout, info.stdout
