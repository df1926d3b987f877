"""`nmt export --format onnx`: the graphs against the PyTorch inference step (every attention, GRU/LSTM, two
layers, input feeding on and off, both bridges; beam and greedy memories), chained on onnxruntime alone over
several steps at batch sizes, source lengths and rows per sentence other than the traced ones; the folder
a trained model exports (its JSON, files, marker, int8 graphs, the shortlist's output rows) translating as
PyTorch does; and the folder rules and option errors of the command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnx", reason="the onnx extra (pip install 'nmt[onnx]') is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra (pip install 'nmt[onnx]') is not installed")

from nmt.config import ModelConfig  # noqa: E402
from nmt.data.special import BOS, EOS, PAD  # noqa: E402
from nmt.decode.onnx_graphs import Layout, OnnxExportError, example_batch, export_pair  # noqa: E402
from nmt.decode.search import max_output_lengths  # noqa: E402
from nmt.decode.steps import Decoding  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.fs.folders import MARKER, read_marker  # noqa: E402
from nmt.model.seq2seq import Seq2Seq  # noqa: E402

from .conftest import randomize_feed_weights  # noqa: E402
from .test_modelfile_hf import one_error  # noqa: E402
from .test_reference_oracle import IDS, MODELS  # noqa: E402
from .test_translate import run_cli  # noqa: E402

SRC_VOCAB, TGT_VOCAB = 30, 40
EXACT = 1e-4                    # float32: log p of a graph against the model's
FILES = {"encoder": "encoder.onnx", "step": "step.onnx", "step_features": "step_features.onnx"}
SOURCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
           "Ein kleines Mädchen in einem rosa Kleid klettert eine Treppe hinauf.", "Leute."]


def make_decoding(attention: str, rnn: str, feeding: bool, layers: int, bridge: str) -> Decoding:
    """A model of the variant with weights far from uniform (as the oracle's) and dropout on in its config:
    a graph traced in training mode would drop activations."""
    torch.manual_seed(11)
    config = ModelConfig(rnn_type=rnn, attention=attention, embedding_dim=12, encoder_hidden=16, decoder_hidden=32,
                         attention_dim=16, dropout=0.3, input_feeding=feeding, decoder_layers=layers,
                         encoder_layers=layers, bridge=bridge)
    model = Seq2Seq.from_config(config, SRC_VOCAB, TGT_VOCAB).eval()
    randomize_feed_weights(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)
    return Decoding(model.requires_grad_(False))


def session(path: Path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def largest_difference(expected: torch.Tensor, got: np.ndarray, real: torch.Tensor | None = None) -> float:
    """Where both are finite (and, for a memory tensor, at the real source positions `real`, where attention
    looks: eager decoding leaves zeros at the padding where a trace may project the zero annotations)."""
    want = expected.float().numpy()
    assert want.shape == got.shape
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got))                # -inf exactly at the padding
    if real is not None:
        finite &= real.numpy().reshape(*real.shape, *[1] * (want.ndim - 2))
    return float(np.abs(want[finite] - got[finite]).max())


def run_both(decoding: Decoding, folder: Path, fold_context: bool, lengths: list[int], k: int, steps: int = 4) -> None:
    """Encode and step `steps` times on the model and on the graphs, each side feeding back its own state and
    memory; the model's best tokens drive both. Asserts log p, attention, h̃ and the states agree."""
    encoder, step, features = (session(folder / FILES[name]) for name in ("encoder", "step", "step_features"))
    src, src_lengths = example_batch(SRC_VOCAB, lengths, seed=sum(lengths) + k)
    memory, state = decoding.encode(src, src_lengths, fold_context)
    layout = Layout.of(memory, state)
    outputs = encoder.run(None, {"src": src.numpy(), "src_lengths": src_lengths.numpy()})
    for want, got in zip(layout.flatten(memory, None), outputs, strict=False):
        assert largest_difference(want, got, src != PAD) < EXACT
    for want, got in zip(layout.flatten(None, state), outputs[len(layout.memory):], strict=True):
        assert largest_difference(want, got) < EXACT
    graph_memory = dict(zip(layout.memory, outputs, strict=False))
    rows = torch.arange(len(lengths)).repeat_interleave(k)              # k consecutive rows per sentence
    state = state.index_select(rows)
    graph_state = {name: np.take(value, rows.numpy(), axis=axis)
                   for (name, axis), value in zip(layout.state, outputs[len(layout.memory):], strict=True)}
    prev = torch.randint(EOS + 1, TGT_VOCAB, rows.shape, generator=torch.Generator().manual_seed(k))
    prev[::k] = BOS
    output = decoding.model.decoder.output
    for _ in range(steps):
        feed = {"prev_tokens": prev.numpy(), **graph_state, **graph_memory}
        got = step.run(None, feed)
        h = features.run(None, feed)[0]
        logits, state, weights = decoding.step(prev, state, memory)
        log_probs = logits.log_softmax(-1, dtype=torch.float32)
        assert largest_difference(log_probs, got[0]) < EXACT
        assert largest_difference(weights, got[-1]) < EXACT
        rescored = torch.from_numpy(h) @ output.weight.T + output.bias  # what the runtime does with output.npz
        assert largest_difference(log_probs, rescored.log_softmax(-1).numpy()) < EXACT
        for want, have in zip(layout.flatten(None, state), got[1:-1], strict=True):
            assert largest_difference(want, have) < EXACT
        graph_state = dict(zip(layout.state_names, got[1:-1], strict=True))
        prev = log_probs.argmax(-1)


@pytest.mark.parametrize("fold_context", [True, False], ids=["beam_memory", "greedy_memory"])
@pytest.mark.parametrize("variant", MODELS, ids=IDS)
def test_the_graphs_compute_what_the_inference_step_computes(variant, fold_context, tmp_path):
    decoding = make_decoding(*variant)
    with torch.no_grad():
        export_pair(decoding, tmp_path, fold_context, FILES, SRC_VOCAB)     # traced on batch 3, 2 rows each
        for lengths, k in (([5], 1), ([9, 2, 6, 1], 4), ([3, 7], 3), ([4, 4], 1)):
            run_both(decoding, tmp_path, fold_context, lengths, k)


# ------------------------------------------------------------------------------------- a trained model's folder


@pytest.fixture(scope="module")
def onnx_folder(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "smoke-onnx"
    result = run_cli("export", str(trained_run / "best.pt"), "--format", "onnx", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"wrote {out}/") and len(result.stderr.splitlines()) == 1   # no exporter noise
    return out


@pytest.fixture(scope="module")
def int8_folder(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx8") / "smoke-int8"
    result = run_cli("export", str(trained_run / "best.pt"), "--format", "onnx", "-o", str(out), "--quantize", "int8")
    assert result.returncode == 0, result.stderr
    return out


def read_info(folder: Path) -> dict:
    return json.loads((folder / "nmt-onnx.json").read_text(encoding="utf-8"))


def test_the_folder_and_what_its_json_says(onnx_folder, trained_run):
    info = read_info(onnx_folder)
    translator = Translator.load(trained_run / "best.pt", device="cpu")
    assert info["format"] == "nmt-onnx" and info["version"] == 2 and info["precision"] == "float32"
    assert info["special"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert info["vocab_size"] == len(translator.tgt_vocab)
    assert info["vocabulary"]["tgt"] == translator.tgt_vocab.pieces.tolist()
    assert info["src_spm"] == info["tgt_spm"] == "sentencepiece.model"                 # the smoke model is joint
    assert (onnx_folder / "sentencepiece.model").read_bytes() == translator.src_vocab.sp.serialized_model_proto()
    assert info["decoding"]["beam_size"] == 3 and info["decoding"]["max_len_ratio"] == 1.5
    assert info["languages"] == {"src": "de", "tgt": "en"}
    assert info["card"]["architecture"]["attention"] == "bahdanau" and info["card"]["file"] == "best.pt"
    assert info["state"] == [{"name": "hidden", "batch_axis": 1}]
    # Bahdanau's beam folds the context into its memory, its greedy search does not: two pairs of graphs
    assert info["memory"] == info["graphs"]["beam"]["memory"] == ["values", "keys", "context_terms", "pad_bias"]
    assert info["graphs"]["greedy"] == {"encoder": "encoder_greedy.onnx", "step": "step_greedy.onnx",
                                        "step_features": "step_features_greedy.onnx",
                                        "memory": ["values", "keys", "pad_bias"]}
    assert info["shortlist"]["file"] == "shortlist.npz" and info["shortlist"]["output"] == "output.npz"
    named = {info["src_spm"], "nmt-onnx.json", "shortlist.npz", "output.npz", "weights.bin",
             *(graphs[g] for graphs in info["graphs"].values() for g in ("encoder", "step", "step_features"))}
    assert sorted(p.name for p in onnx_folder.iterdir()) == sorted([*named, MARKER])
    assert sorted(read_marker(onnx_folder)["files"]) == sorted(named)
    assert [p.name for p in onnx_folder.parent.iterdir()] == [onnx_folder.name]       # no temporary left
    with np.load(onnx_folder / "output.npz") as output:
        decoder = translator.model.decoder
        assert np.array_equal(output["W_s"], decoder.output.weight.detach().numpy())
        assert np.array_equal(output["b_s"], decoder.output.bias.detach().numpy())


def test_each_weight_is_stored_once_for_all_graphs(onnx_folder, trained_run):
    """The graphs keep their weights in weights.bin, each distinct tensor there once: six graphs that each
    embedded their weights made the folder about 5x the model's parameters."""
    import onnx

    from nmt.modelfile.file import load_model

    model = load_model(trained_run / "best.pt").build()
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    weights = (onnx_folder / "weights.bin").read_bytes()
    stored: dict[tuple[int, int], bytes] = {}
    for graph in sorted(onnx_folder.glob("*.onnx")):
        for tensor in onnx.load(str(graph), load_external_data=False).graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                assert len(tensor.raw_data) < 1024, (graph.name, tensor.name)      # only small ones stay inline
                continue
            info = {entry.key: entry.value for entry in tensor.external_data}
            assert info["location"] == "weights.bin"
            offset, length = int(info["offset"]), int(info["length"])
            assert offset + length <= len(weights) and (length < 1 << 20 or offset % (1 << 16) == 0)
            stored[offset, length] = weights[offset: offset + length]
    assert len(stored) > 4 and len(set(stored.values())) == len(stored)      # no bytes stored twice
    graphs = sum(p.stat().st_size for p in onnx_folder.glob("*.onnx"))
    assert graphs + len(weights) < 2 * parameter_bytes, (graphs, len(weights), parameter_bytes)


def greedy_on_onnxruntime(folder: Path, src: torch.Tensor, ratio: float, min_len: int) -> list[list[int]]:
    """nmt's greedy search (no EOS before min_len, PAD and BOS never, EOS at the length limit) on the folder's
    greedy graphs, one sentence at a time."""
    info = read_info(folder)
    graphs = info["graphs"]["greedy"]
    encoder, step = session(folder / graphs["encoder"]), session(folder / graphs["step"])
    state_names = [entry["name"] for entry in info["state"]]
    found = []
    for row in src:
        ids = row[row != PAD].numpy()[None]
        outputs = encoder.run(None, {"src": ids, "src_lengths": np.array([ids.shape[1]])})
        memory = dict(zip(graphs["memory"], outputs, strict=False))
        state = dict(zip(state_names, outputs[len(memory):], strict=True))
        limit = int(max_output_lengths(torch.tensor([ids.shape[1]]), ratio, min_len)[0])
        tokens, prev = [], BOS
        for t in range(limit):
            log_probs, *next_state, _ = step.run(None, {"prev_tokens": np.array([prev]), **state, **memory})
            log_probs[0, [PAD, BOS] + ([EOS] if t < min_len else [])] = -np.inf
            prev = EOS if t == limit - 1 else int(log_probs[0].argmax())
            if prev == EOS:
                break
            tokens.append(prev)
            state = dict(zip(state_names, next_state, strict=True))
        found.append(tokens)
    return found


def test_the_folder_translates_as_pytorch_does(onnx_folder, trained_run):
    translator = Translator.load(trained_run / "best.pt", device="cpu", beam_size=1, shortlist=False,
                                 precision="fp32")
    hypotheses = [t.hypotheses[0].tokens for t in translator.translate(SOURCES)]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor([*ids.tolist(), EOS]) for ids in
                                           translator.src_vocab.encode(SOURCES)], batch_first=True)
    d = translator.decoding
    assert greedy_on_onnxruntime(onnx_folder, src, d.max_len_ratio, d.min_len) == hypotheses


def test_int8_graphs_are_smaller_and_close(onnx_folder, int8_folder):
    info, info8 = read_info(onnx_folder), read_info(int8_folder)
    assert info8["precision"] == "int8" and info8["graphs"] == info["graphs"]
    assert (int8_folder / "weights.bin").stat().st_size < 0.5 * (onnx_folder / "weights.bin").stat().st_size
    ops = {node.op_type for node in __import__("onnx").load(str(int8_folder / "step.onnx")).graph.node}
    assert "MatMulInteger" in ops
    src = np.array([[7, 9, 11, 14, EOS], [5, 6, EOS, PAD, PAD]])
    feeds, log_probs = [], []
    for folder in (onnx_folder, int8_folder):
        outputs = session(folder / "encoder.onnx").run(None, {"src": src, "src_lengths": np.array([5, 3])})
        memory = dict(zip(info["memory"], outputs, strict=False))
        feeds.append({"prev_tokens": np.array([BOS, BOS]), "hidden": outputs[-1], **memory})
        log_probs.append(session(folder / "step.onnx").run(None, feeds[-1])[0])
    assert not np.array_equal(log_probs[0], log_probs[1])                     # int8 products, not float ones
    assert np.abs(np.exp(log_probs[0]) - np.exp(log_probs[1])).max() < 0.02  # about the same distribution


# ------------------------------------------------------------------------------------- folder rules and options


def test_an_existing_folder_is_replaced_only_when_nmt_wrote_it_and_with_force(trained_run, tmp_path):
    best = str(trained_run / "best.pt")
    out = tmp_path / "out"
    assert run_cli("export", best, "--format", "onnx", "-o", str(out)).returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    one_error(run_cli("export", best, "--format", "onnx", "-o", str(out)), "pass --force")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    result = run_cli("export", best, "--format", "onnx", "-o", str(out), "--force", "--quantize", "int8")
    assert result.returncode == 0, result.stderr
    assert read_info(out)["precision"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]                # the old folder is gone too
    (out / "notes.txt").write_text("mine\n")
    one_error(run_cli("export", best, "--format", "onnx", "-o", str(out), "--force"), "notes.txt")
    assert (out / "notes.txt").read_text() == "mine\n" and read_info(out)["precision"] == "int8"


def test_bad_options_and_targets_are_one_error_and_write_nothing(trained_run, tmp_path):
    best = str(trained_run / "best.pt")
    new = str(tmp_path / "new")
    one_error(run_cli("export", best, "--format", "onnx", "-o", new, "--dtype", "fp16"), "--dtype fp16")
    one_error(run_cli("export", best, "--format", "onnx", "-o", new, "--quantize", "int4"), "--quantize")
    one_error(run_cli("export", best, "--format", "onnx", "-o", new, "--license", "mit"), "--license applies only")
    one_error(run_cli("export", best, "--format", "onnx", "-o", new, "--score", "t=x.json"), "--score applies only")
    one_error(run_cli("export", str(tmp_path / "missing.pt"), "--format", "onnx", "-o", new), "missing.pt")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    one_error(run_cli("export", best, "--format", "onnx", "-o", str(mine), "--force"), "did not write")
    a_file = tmp_path / "model.nmt"
    a_file.write_text("x")
    one_error(run_cli("export", best, "--format", "onnx", "-o", str(a_file)), "is a file")
    one_error(run_cli("export", best, "--format", "onnx", "-o", str(tmp_path / "no" / "dir")), "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "model.nmt"]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OnnxExportError("graphs differ")], ids=["interrupt", "check"])
def test_an_export_that_stops_leaves_the_folder_as_it_was(trained_run, tmp_path, monkeypatch, failure):
    """Interrupted (Ctrl-C, SIGTERM) or refused by its check after the graphs are written: the user's empty
    folder stays, empty, and no temporary folder is left beside it."""
    import nmt.decode.onnx_export as onnx_export

    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(onnx_export, "check_graphs", fail)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(type(failure)):
        onnx_export.export_onnx(trained_run / "best.pt", empty)
    assert [p.name for p in tmp_path.iterdir()] == ["empty"] and not any(empty.iterdir())


def test_int8_graphs_that_do_not_run_fail_the_export(trained_run, tmp_path, monkeypatch):
    """The int8 graphs are run too (any values, the model's shapes): a quantization onnxruntime cannot load
    is an export error, and nothing is written."""
    import nmt.decode.onnx_export as onnx_export

    monkeypatch.setattr(onnx_export, "quantize_int8", lambda path: path.write_bytes(b"not a graph"))
    with pytest.raises(OnnxExportError, match="the exported encoder.onnx is not an ONNX graph"):
        onnx_export.export_onnx(trained_run / "best.pt", tmp_path / "out", quantize="int8")
    assert list(tmp_path.iterdir()) == []


def test_a_luong_model_serves_greedy_search_with_its_beam_graphs(trained_run, tmp_path):
    """Luong's memory is the same for both searches: one pair of graphs, named for both, with the LSTM's
    cell and input feeding's h̃ in the state."""
    import dataclasses

    from nmt.decode.onnx_export import write_folder
    from nmt.modelfile.file import load_model

    loaded = load_model(trained_run / "best.pt")
    config = dataclasses.replace(loaded.config, model=dataclasses.replace(
        loaded.config.model, attention="luong_general", rnn_type="lstm", input_feeding=True))
    model = Seq2Seq.from_config(config.model, len(loaded.src_vocab), len(loaded.tgt_vocab))
    luong = dataclasses.replace(loaded, config=config, weights=model.state_dict(), shortlist=None)
    info = write_folder(luong, tmp_path, "none", "luong.pt")
    assert info["graphs"]["greedy"] == info["graphs"]["beam"] == {"encoder": "encoder.onnx", "step": "step.onnx",
                                                                  "memory": ["values", "keys", "pad_bias"]}
    assert [entry["name"] for entry in info["state"]] == ["hidden", "cell", "feed"] and info["shortlist"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder.onnx", "nmt-onnx.json", "sentencepiece.model",
                                                         "step.onnx", "weights.bin"]
