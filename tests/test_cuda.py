"""The CUDA path: training in fp32, bf16 and fp16 (with a gradient scaler), exact resume, and decoding that agrees
with the CPU. Skipped where no CUDA device is present, as on CI; run on a GPU machine with `pytest -m cuda`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nmt.config import load_config
from nmt.decode.steps import Decoding
from nmt.decode.translator import Translator
from nmt.model.attention import Memory, build_attention
from nmt.train.trainer import Trainer

from .test_trainer import deterministic_runs

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
needs_bf16 = pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(),
                                reason="needs a CUDA device with bfloat16")

SOURCES = ["Ein Hund läuft durch das Gras.", "Zwei Männer spielen Fußball.", "Eine Frau", "Kinder",
           "Ein kleines Mädchen in einem rosa Kleid klettert eine Treppe hinauf."]
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def train_losses(run: Path) -> list[float]:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [e["loss"] for e in events if e["event"] == "train"]


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=needs_bf16), "fp16"])
def test_training_loss_falls_in_each_precision(prepared, tmp_path, precision):
    run = tmp_path / "run"
    trainer = Trainer(load_config(prepared, [f"training.run_dir={run}", "training.device=cuda",
                                             f"training.precision={precision}", "training.max_updates=60",
                                             "training.log_every=10", "training.validate_every=60",
                                             "training.val_max_sentences=20"]))
    assert trainer.device.type == "cuda"
    assert trainer.amp_dtype == AUTOCAST[precision]
    assert trainer.scaler.is_enabled() == (precision == "fp16")     # fp16 only: gradients are scaled
    trainer.train()
    losses = train_losses(run)
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.85 * losses[0], losses
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=needs_bf16)])
def test_resume_is_exact_with_deterministic_kernels(prepared, tmp_path, precision):
    a, b = deterministic_runs(prepared, tmp_path, "training.device=cuda", f"training.precision={precision}")
    assert a["step"] == b["step"] == 6
    differ = [key for key, value in a["model"].items() if not torch.equal(value, b["model"][key])]
    assert differ == [], f"parameters that differ after resuming: {differ}"


@pytest.mark.parametrize("kind", ["bahdanau", "luong_general"])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16), torch.float16])
def test_padded_positions_get_zero_attention_under_autocast(kind, dtype):
    torch.manual_seed(0)
    attention = build_attention(kind, query_size=16, value_size=16, attention_dim=8).cuda()
    values = torch.randn(3, 7, 16, device="cuda")                               # (batch, src_len, value)
    mask = torch.arange(7, device="cuda") < torch.tensor([7, 4, 1], device="cuda").unsqueeze(1)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        memory = Memory(values, attention.project_keys(values), mask)
        _, weights = attention(torch.randn(3, 16, device="cuda") * 10, memory)    # (batch, src_len)
    assert torch.all(weights[~mask] == 0)
    assert torch.allclose(weights.float().sum(-1), torch.ones(3, device="cuda"), atol=1e-2)


def test_decoding_on_cuda_agrees_with_the_cpu(trained_run):
    checkpoint = trained_run / "best.pt"
    cpu = Translator.load(checkpoint, device="cpu", precision="fp32", beam_size=3)
    gpu = Translator.load(checkpoint, device="cuda", precision="fp32", beam_size=3)
    assert gpu.device.type == "cuda"
    cpu_texts = [t.text for t in cpu.translate(SOURCES)]
    gpu_texts = [t.text for t in gpu.translate(SOURCES)]
    assert len(gpu_texts) == len(SOURCES)
    # The CPU's hypotheses, scored on the GPU, get the CPU's scores (teacher forcing: no search to diverge).
    for (cpu_lp, _, cpu_len), (gpu_lp, _, gpu_len) in zip(cpu.score(SOURCES, cpu_texts),
                                                         gpu.score(SOURCES, cpu_texts), strict=True):
        assert cpu_len == gpu_len and gpu_lp == pytest.approx(cpu_lp, rel=1e-3, abs=1e-3)
    assert sum(a == b for a, b in zip(cpu_texts, gpu_texts, strict=True)) >= len(SOURCES) - 1


@pytest.mark.parametrize("precision", [pytest.param("bf16", marks=needs_bf16), "fp16"])
def test_mixed_precision_beam_search_keeps_one_line_per_input_in_order(trained_run, precision):
    translator = Translator.load(trained_run / "best.pt", device="cuda", precision=precision, beam_size=4)
    lines = SOURCES * 7                                                         # mixed lengths, sorted and put back
    out = translator.translate(lines, n_best=2, return_attention=True)
    assert len(out) == len(lines) and all(len(t.nbest_texts) == 2 for t in out)
    # in input order, whatever the model says (the smoke model gives one word for every source in bf16): each
    # line's hypotheses attend over its own source's pieces, and the 7 copies of a source translate alike
    for line, result in zip(lines, out, strict=True):
        assert result.src_ids.tolist() == translator.src_vocab.encode([line])[0].tolist()
        for hyp in result.hypotheses:
            assert hyp.attention.shape[1] == len(result.src_ids) + 1            # source pieces and EOS
            torch.testing.assert_close(hyp.attention.float().sum(1), torch.ones(hyp.attention.size(0)),
                                       atol=2e-2, rtol=0)
    texts = [{out[i + len(SOURCES) * k].text for k in range(7)} for i in range(len(SOURCES))]
    assert all(len(copies) == 1 for copies in texts), texts


TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2, "fp16": 2e-2}      # score difference where the texts agree
AGREE = {"fp32": 0.97, "bf16": 0.85, "fp16": 0.9}           # share of identical lines, graphed against eager


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=needs_bf16), "fp16"])
def test_graphed_search_equals_the_eager_search(trained_run, corpus_dir, precision, beam):
    lines = (corpus_dir / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    lines = [*lines[:60], "", *lines[60:], lines[0]]                      # an empty line and a repeat
    graphed = Translator.load(trained_run / "best.pt", device="cuda", precision=precision, beam_size=beam,
                              batch_tokens=600)                           # several batches and shapes
    eager = Translator.load(trained_run / "best.pt", device="cuda", precision=precision, beam_size=beam,
                            batch_tokens=600, cuda_graphs=False)
    found, expected = graphed.translate(lines), eager.translate(lines)
    assert graphed._graphs is not None and len(graphed._graphs.graphs) >= 2
    assert eager._graphs is None
    assert len(found) == len(lines) and found[60].text == ""
    if precision == "fp32":           # in bf16/fp16 another batch shape may flip a near-tie of the repeated line
        assert found[-1].text == found[0].text
    same = [(f, e) for f, e in zip(found, expected, strict=True) if f.text == e.text and f.score is not None]
    assert len(same) >= AGREE[precision] * (len(lines) - 1)
    assert max(abs(f.score - e.score) for f, e in same) <= TOLERANCE[precision]


def test_graphs_are_captured_once_per_shape(trained_run, corpus_dir):
    lines = (corpus_dir / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    translator = Translator.load(trained_run / "best.pt", device="cuda", precision="fp32", beam_size=4)
    first = [t.text for t in translator.translate(lines)]
    captured = len(translator._graphs.graphs)
    assert translator._graphs.captured == captured and translator._graphs.capture_seconds > 0
    assert [t.text for t in translator.translate(lines)] == first       # replayed graphs, same results
    assert len(translator._graphs.graphs) == captured == translator._graphs.captured


@pytest.mark.parametrize("attention", ["bahdanau", "luong_dot", "luong_general", "luong_concat"])
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_captured_steps_equal_eager_steps_on_random_models(attention, rnn):
    from nmt.decode.graphs import SearchGraphs
    from nmt.decode.search import SearchSettings, beam_search, greedy_search

    from .test_search import random_model, source_batch

    model = random_model(attention, rnn).cuda()
    src, lengths = source_batch()
    src = src.cuda()
    graphs = SearchGraphs(Decoding(model))
    for _ in range(2):                                                    # the capture, then a replay
        greedy = graphs.greedy(src, lengths, SearchSettings(max_len_ratio=2.0))
        assert [h.tokens for h in greedy] == [h.tokens for h in greedy_search(model, src, lengths,
                                                                              SearchSettings(max_len_ratio=2.0))]
        beam = graphs.beam(src, lengths, SearchSettings(beam_size=3, alpha=1.0, max_len_ratio=2.0, n_best=2))
        expected = beam_search(model, src, lengths, SearchSettings(beam_size=3, alpha=1.0, max_len_ratio=2.0, n_best=2))
        assert [[h.tokens for h in hyps] for hyps in beam] == [[h.tokens for h in hyps] for hyps in expected]


@pytest.mark.parametrize("attention", ["bahdanau", "luong_general"])
def test_graphed_training_follows_the_eager_loss_curve(prepared, tmp_path, attention):
    """Without dropout the padded, captured updates compute what the eager ones do, up to summation order."""
    losses = {}
    for graphs in (True, False):
        run = tmp_path / f"run-{graphs}"
        trainer = Trainer(load_config(prepared, [f"training.run_dir={run}", "training.device=cuda",
                                                 "training.precision=fp32", f"training.cuda_graphs={graphs}",
                                                 "model.dropout=0", f"model.attention={attention}",
                                                 "training.max_updates=60", "training.log_every=10",
                                                 "training.validate_every=60", "training.val_max_sentences=20",
                                                 # smoke's attention_dim back to its default: general has none
                                                 *([] if attention == "bahdanau" else ["model.attention_dim=512"])]))
        assert (trainer.graphed is not None) == graphs
        trainer.train()
        if graphs:
            assert 1 <= len(trainer.graphed.graphs) < 60                    # shapes captured once, replayed
        losses[graphs] = train_losses(run)
    assert len(losses[True]) == len(losses[False]) == 6
    assert losses[True] == pytest.approx(losses[False], rel=0.02), losses


def test_fp16_and_accumulation_take_the_eager_path(prepared, tmp_path):
    for override in ("training.precision=fp16", "training.accumulate=2"):
        trainer = Trainer(load_config(prepared, [f"training.run_dir={tmp_path / override}", "training.device=cuda",
                                                 override]))
        assert trainer.graphed is None
        trainer.close()


@needs_bf16
def test_auto_precision_is_bf16_where_graphs_run(prepared, tmp_path, trained_run):
    from nmt.device import autocast_dtype

    assert autocast_dtype("auto", torch.device("cuda"), graphed=True) == torch.bfloat16
    graphed = Trainer(load_config(prepared, [f"training.run_dir={tmp_path / 'a'}", "training.device=cuda"]))
    assert graphed.graphed is not None and graphed.amp_dtype == torch.bfloat16
    graphed.close()
    eager = Trainer(load_config(prepared, [f"training.run_dir={tmp_path / 'b'}", "training.device=cuda",
                                           "training.cuda_graphs=false"]))
    assert eager.graphed is None and eager.amp_dtype is None
    eager.close()
    assert Translator.load(trained_run / "best.pt", device="cuda").amp_dtype == torch.bfloat16
    assert Translator.load(trained_run / "best.pt", device="cuda", cuda_graphs=False).amp_dtype is None
