import json
import random
import select
import subprocess
import sys
import threading

import pytest
import sacrebleu

from nmt.decode.outputs import word_alignments
from nmt.decode.translator import Translator

from .conftest import nmt_server, read_gz


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, stdin=stdin, text=True)


@pytest.fixture(scope="module")
def translator(trained_run) -> Translator:
    return Translator.from_checkpoint(trained_run / "best.pt", device="cpu", beam_size=3, precision="fp32")


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return read_gz("test_2016_flickr.de", 40)


def test_output_order_equals_input_order(translator, sources):
    shuffled = sources[:]
    random.Random(0).shuffle(shuffled)
    lines = shuffled[:20] + [""] + shuffled[20:] + ["", "   "]
    together = translator.translate(lines)
    assert len(together) == len(lines)
    alone = {line: translator.translate([line])[0].text for line in set(lines)}
    assert [t.text for t in together] == [alone[line] for line in lines]
    assert together[20].text == "" and together[-1].text == "" and together[-2].text == ""


def test_stream_in_small_chunks_equals_one_call(translator, sources):
    whole = [t.text for t in translator.translate(sources)]
    streamed = [t.text for t in translator.translate_stream(iter(s + "\n" for s in sources), chunk_lines=7)]
    assert streamed == whole


def test_batch_tokens_are_the_devices_unless_given(trained_run, translator, sources):
    """decoding.batch_tokens 0 (the default a model is saved with) takes the device's figure for searches
    (scoring keeps the CPU's); a value given is kept, and translations do not depend on it."""
    import torch

    from nmt.config import DECODING_BATCH_TOKENS
    from nmt.modelfile.file import load_model

    assert load_model(trained_run / "best.pt", {}).config.decoding.batch_tokens == 0
    assert translator.batch_tokens() == translator.batch_tokens(scoring=True) == DECODING_BATCH_TOKENS["cpu"] == 8000
    on_gpu = Translator(translator.model, translator.src_vocab, translator.tgt_vocab, translator.decoding,
                        translator.device)
    on_gpu.device = torch.device("cuda")                     # what a GPU's Translator reads (no GPU needed)
    assert on_gpu.batch_tokens() == DECODING_BATCH_TOKENS["cuda"] == 32000
    assert on_gpu.batch_tokens(scoring=True) == 8000
    pair = Translator.load([trained_run / "best.pt"] * 2, "cpu", beam_size=3)   # members load on the CPU first
    pair.device = torch.device("cuda")
    assert pair.batch_tokens() == 32000
    small = Translator.load(trained_run / "best.pt", "cpu", beam_size=3, precision="fp32", batch_tokens=90)
    small.device = torch.device("cuda")
    assert small.batch_tokens() == small.batch_tokens(scoring=True) == 90
    small.device = translator.device
    assert [t.text for t in small.translate(sources)] == [t.text for t in translator.translate(sources)]


def test_overlong_line_is_truncated_with_warning(translator, capsys):
    long_line = " ".join(["Hund"] * 400)
    result = translator.translate(["ein Hund", long_line], first_line=5)
    assert len(result) == 2 and result[1].truncated and not result[0].truncated
    assert len(result[1].src_ids) == translator.decoding.max_input_len
    assert "input line 6" in capsys.readouterr().err


def test_word_alignments_map_pieces_to_words():
    import torch

    src = ["▁Ein", "▁Hund", "e", "▁läuft"]
    tgt = ["▁A", "▁dog", "▁run", "s"]
    attention = torch.tensor([[1.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0], [0, 0, 0, 1.0, 0], [0, 0, 0, 0.9, 0.1]])
    assert word_alignments(src, tgt, attention) == "0-0 1-1 2-2"


def test_cli_translate_stdin_to_stdout(trained_run, sources, tmp_path):
    text = "\n".join(sources[:10] + [""] + sources[10:15]) + "\n"
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "--beam-size", "2", "-q",
                     "--alignments", str(tmp_path / "al.txt"), stdin=text)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 16 and lines[10] == ""
    alignments = (tmp_path / "al.txt").read_text().split("\n")[:-1]
    assert len(alignments) == 16
    src_words = [len(s.split()) for s in sources[:10] + [""] + sources[10:15]]
    out_words = [len(t.split()) for t in lines[:-1]]
    for line, n_src, n_out in zip(alignments, src_words, out_words, strict=True):
        for pair in line.split():
            i, j = map(int, pair.split("-"))
            assert 0 <= i < n_src and 0 <= j < n_out


def test_cli_output_file_is_written_atomically(trained_run, tmp_path):
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"ein Hund\n" * 5 + b"\xff\xfe\n")
    out = tmp_path / "out.en"
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "-i", str(bad), "-o", str(out), "-q")
    assert result.returncode == 2 and "invalid UTF-8" in result.stderr
    assert not out.exists() and list(tmp_path.glob(".out.en*")) == []
    good = tmp_path / "good.de"
    good.write_text("ein Hund\nzwei Katzen\n")
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "-i", str(good), "-o", str(out), "-q")
    assert result.returncode == 0 and len(out.read_text().splitlines()) == 2


def test_cli_translate_n_best(trained_run):
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "--n-best", "3", "--beam-size", "3",
                     "-q", stdin="ein Hund\nzwei Katzen\n")
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "1", "1"]
    scores = [float(r[2]) for r in rows[:3]]
    assert scores == sorted(scores, reverse=True)


def test_cli_missing_checkpoint(tmp_path):
    result = run_cli("translate", "--checkpoint", str(tmp_path / "nope.pt"), stdin="x\n")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: checkpoint {tmp_path / 'nope.pt'} does not exist"


def test_evaluate_reproduces_sacrebleu(tmp_path):
    refs = read_gz("test_2016_flickr.en", 200)
    hyps = [" ".join(r.split()[:-1]) if i % 3 else r for i, r in enumerate(refs)]   # perturbed references
    (tmp_path / "hyp.en").write_text("\n".join(hyps) + "\n")
    (tmp_path / "ref.en").write_text("\n".join(refs) + "\n")
    result = run_cli("evaluate", "--hyp", str(tmp_path / "hyp.en"), "--ref", str(tmp_path / "ref.en"),
                     "--json", str(tmp_path / "scores.json"))
    assert result.returncode == 0, result.stderr
    scores = json.loads((tmp_path / "scores.json").read_text())
    metric = sacrebleu.BLEU()
    bleu = metric.corpus_score(hyps, [refs])
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    assert scores["bleu"]["score"] == round(bleu.score, 2)
    assert scores["chrf"]["score"] == round(chrf.score, 2)
    assert scores["bleu"]["signature"] == str(metric.get_signature())
    assert scores["bleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert f"BLEU = {bleu.score:.2f}" in result.stdout and scores["bleu"]["signature"] in result.stdout


def test_evaluate_json_to_stdout_and_compare(tmp_path):
    refs = read_gz("test_2016_flickr.en", 100)
    (tmp_path / "ref.en").write_text("\n".join(refs) + "\n")
    (tmp_path / "a.en").write_text("\n".join(" ".join(r.split()[:-2]) for r in refs) + "\n")
    (tmp_path / "b.en").write_text("\n".join(refs) + "\n")
    result = run_cli("evaluate", "--hyp", str(tmp_path / "a.en"), "--ref", str(tmp_path / "ref.en"),
                     "--compare", str(tmp_path / "b.en"), "--bootstrap-samples", "100", "--json", "-")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert scores["comparison"]["BLEU"]["other"] == 100.0
    assert scores["comparison"]["BLEU"]["p_value"] < 0.05


def test_evaluate_mismatched_lines(tmp_path):
    (tmp_path / "hyp.en").write_text("a\nb\n")
    (tmp_path / "ref.en").write_text("a\nb\nc\n")
    result = run_cli("evaluate", "--hyp", str(tmp_path / "hyp.en"), "--ref", str(tmp_path / "ref.en"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {tmp_path}/hyp.en has 2 lines but {tmp_path}/ref.en has 3; "
                                     "hypotheses and references must align")


def test_evaluate_from_checkpoint(trained_run, tmp_path):
    src = tmp_path / "src.de"
    src.write_text("\n".join(read_gz("test_2016_flickr.de", 10)) + "\n")
    ref = tmp_path / "ref.en"
    ref.write_text("\n".join(read_gz("test_2016_flickr.en", 10)) + "\n")
    result = run_cli("evaluate", "--checkpoint", str(trained_run / "best.pt"), "--src", str(src), "--ref", str(ref),
                     "--json", "-", "--beam-size", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sentences"] == 10


def test_average_checkpoints(trained_run, tmp_path):
    import torch

    from nmt.train.checkpoint import load_checkpoint

    ckpts = sorted(trained_run.glob("best-step*.pt"))
    assert len(ckpts) == 2
    out = trained_run / "averaged.pt"
    result = run_cli("average", *map(str, ckpts), "-o", str(out))
    assert result.returncode == 0, result.stderr
    states = [load_checkpoint(p)["model"] for p in ckpts]
    averaged = load_checkpoint(out)["model"]
    key = "decoder.output.weight"
    assert torch.allclose(averaged[key], (states[0][key] + states[1][key]) / 2)
    again = run_cli("average", *map(str, ckpts), "-o", str(out))
    assert again.returncode == 2 and "exists" in again.stderr
    assert Translator.from_checkpoint(out, device="cpu").translate(["ein Hund"])[0].text is not None
    out.unlink()


def test_average_refuses_checkpoints_of_another_vocabulary(trained_run, tmp_path):
    """Same shapes, other target pieces (as a run on another data folder of the same size would have)."""
    import torch

    ckpt = sorted(trained_run.glob("best-step*.pt"))[0]
    state = torch.load(ckpt, weights_only=False)
    pieces = state["tokenizer"]["tgt"]["pieces"]
    pieces[4], pieces[5] = pieces[5], pieces[4]
    other = tmp_path / "other.pt"
    torch.save(state, other)
    result = run_cli("average", str(ckpt), str(other), "-o", str(tmp_path / "avg.pt"))
    assert result.returncode == 2, result.stderr
    assert f"checkpoint {other} has another vocabulary than {ckpt}" in result.stderr
    assert not (tmp_path / "avg.pt").exists()


def test_average_accepts_a_checkpoint_written_before_newer_model_keys(trained_run, tmp_path):
    """A run's checkpoints across an nmt upgrade: model keys the older nmt did not write take their defaults."""
    import torch

    first, second = sorted(trained_run.glob("best-step*.pt"))
    state = torch.load(first, weights_only=False)
    for key in ("init", "init_scale"):
        assert state["config"]["model"].pop(key) == {"init": "uniform", "init_scale": 0.1}[key]
    older = tmp_path / "older.pt"
    torch.save(state, older)
    result = run_cli("average", str(older), str(second), "-o", str(tmp_path / "avg.pt"))
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------- streaming


def test_micro_batches_keep_order_and_close_at_the_size_limit():
    from nmt.decode.streaming import micro_batches

    lines = [f"line {i}\n" for i in range(25)] + ["last, no line ending"]
    batches = list(micro_batches(iter(lines), 10, 5.0))
    assert [len(b) for b in batches] == [10, 10, 6]
    assert [line for batch in batches for line in batch] == [f"line {i}" for i in range(25)] + ["last, no line ending"]


def test_micro_batches_close_when_the_input_pauses():
    from nmt.decode.streaming import micro_batches

    first_batch_taken = threading.Event()

    def slow():
        yield "a\n"
        yield "b\r\n"
        assert first_batch_taken.wait(60)           # "c" comes only after the pause closed a batch
        yield "c\n"

    batches = micro_batches(slow(), 100, 0.3)
    assert next(batches) == ["a", "b"]
    first_batch_taken.set()
    assert list(batches) == [["c"]]


def test_stream_error_comes_after_every_earlier_translation(translator, sources):
    def failing():
        yield from (f"{s}\n" for s in sources[:3])
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    got = []
    with pytest.raises(UnicodeDecodeError):
        for result in translator.translate_stream(failing()):
            got.append(result.text)
    assert got == [t.text for t in translator.translate(sources[:3])]


def test_cli_streams_each_translation_while_the_writer_is_slow(trained_run, sources):
    # The writer sends the next line only after reading the previous translation: a translator
    # that waited for more input (or for the end) would never answer, and the select times out.
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "translate", "--checkpoint", str(trained_run / "best.pt"),
                             "--beam-size", "2", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    expected = [t.text for t in Translator.load(trained_run / "best.pt", device="cpu", beam_size=2)
                .translate(sources[:4])]
    try:
        for line, translation in zip(sources[:4], expected, strict=True):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, f"no translation of {line!r} while the input stayed open"
            assert proc.stdout.readline() == translation + "\n"
        proc.stdin.close()
        assert proc.stdout.read() == "" and proc.wait(timeout=60) == 0
    finally:
        proc.kill()
