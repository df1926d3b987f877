"""`nmt translate` decoding options and `nmt score`, end to end on the trained smoke model."""

import json

import pytest

from nmt.decode.outputs import unk_replaced
from nmt.decode.search import Hypothesis
from nmt.decode.translator import Translator

from .conftest import read_gz
from .test_translate import run_cli


@pytest.fixture(scope="module")
def source_text(tmp_path_factory) -> str:
    return "".join(f"{line}\n" for line in read_gz("test_2016_flickr.de", 12))


def translate(trained_run, *options: str, stdin: str | None = None):
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "-q", *options, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[:-1]


def test_sampling_with_a_seed_is_reproducible(trained_run, source_text, tmp_path):
    options = ("--sampling", "--num-samples", "5", "--seed", "11", "--top-k", "20", "--temperature", "0.9")
    first = translate(trained_run, *options, stdin=source_text)
    assert translate(trained_run, *options, stdin=source_text) == first
    assert len(first) == 5 * 12 and [r.split(" ||| ")[0] for r in first[:6]] == ["0"] * 5 + ["1"]
    assert len({r.split(" ||| ")[1] for r in first}) > 12                # samples of one sentence differ
    assert translate(trained_run, *options[:-4], "--seed", "12", stdin=source_text) != first


def test_prefixes_from_a_file_and_from_a_column(trained_run, source_text, tmp_path):
    sources = source_text.splitlines()
    starts = ["A man", "Two", "", "The dog is", "A"] + ["People"] * 7
    prefix_file = tmp_path / "prefixes.en"
    prefix_file.write_text("".join(f"{p}\n" for p in starts))
    for options in (("--beam-size", "1"), ("--beam-size", "3")):
        outputs = translate(trained_run, *options, "--prefix-file", str(prefix_file), stdin=source_text)
        assert len(outputs) == 12 and all(out.startswith(p) for out, p in zip(outputs, starts, strict=True))
        column = "".join(f"{s}\t{p}\n" for s, p in zip(sources, starts, strict=True))
        assert translate(trained_run, *options, "--prefix-column", stdin=column) == outputs
    short = tmp_path / "short.en"
    short.write_text("A man\n")
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "-q", "--prefix-file", str(short),
                     stdin=source_text)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "short.en has 1 lines but stdin has more" in result.stderr


def test_scores_equal_forced_decoding_of_the_output(trained_run, source_text, tmp_path):
    src = tmp_path / "src.de"
    src.write_text(source_text)
    for beam in ("1", "4"):
        scores = tmp_path / f"scores{beam}.tsv"
        # fp32 both ways: under bf16 autocast (auto on bf16 CPUs) a search and teacher forcing round apart
        outputs = translate(trained_run, "--beam-size", beam, "--scores", str(scores), "-i", str(src),
                            "--precision", "fp32")
        (tmp_path / "hyp.en").write_text("".join(f"{o}\n" for o in outputs))
        reported = [tuple(map(float, line.split("\t"))) for line in scores.read_text().splitlines()]
        result = run_cli("score", "--checkpoint", str(trained_run / "best.pt"), "--src", str(src),
                         "--tgt", str(tmp_path / "hyp.en"), "--json", "--precision", "fp32")
        assert result.returncode == 0, result.stderr
        forced = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(reported) == len(forced) == 12
        for (log_prob, normalised), record in zip(reported, forced, strict=True):
            assert log_prob == pytest.approx(record["log_prob"], abs=2e-3)
            assert normalised == pytest.approx(record["score"], abs=2e-3)
            assert normalised >= log_prob                           # lp > 1 for any output with EOS


def test_score_refuses_files_of_different_lengths(trained_run, tmp_path):
    (tmp_path / "a").write_text("eins\nzwei\n")
    (tmp_path / "b").write_text("one\n")
    result = run_cli("score", "--checkpoint", str(trained_run / "best.pt"), "--src", str(tmp_path / "a"),
                     "--tgt", str(tmp_path / "b"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "must align line by line" in result.stderr
    assert not (tmp_path / "out").exists()


def test_score_truncates_overlong_lines_with_a_warning(trained_run, tmp_path):
    """A 40000-piece pair is scored as translation would see it (source cut to max_input_len, the target
    to the longest output allowed), so memory stays bounded; the warning names the line."""
    (tmp_path / "a").write_text("ein Hund\n" + "ein Hund " * 20000 + "\n")
    (tmp_path / "b").write_text("a dog\n" + "a dog " * 20000 + "\n")
    result = run_cli("score", "--checkpoint", str(trained_run / "best.pt"), "--src", str(tmp_path / "a"),
                     "--tgt", str(tmp_path / "b"), "--json")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    decoding = Translator.from_checkpoint(trained_run / "best.pt", device="cpu").decoding
    target_limit = int(decoding.max_len_ratio * decoding.max_input_len) + 10
    assert [r["length"] for r in records] == [records[0]["length"], target_limit + 1]     # EOS counted
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all(w.startswith("warning: line 2: the ") for w in warnings)
    assert f"scored truncated to {decoding.max_input_len}" in warnings[0]


def test_n_best_above_beam_size_is_an_error(trained_run):
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "--n-best", "4", "--beam-size", "2",
                     stdin="ein Hund\n")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == ("error: --n-best 4 is larger than the beam size 2: beam search finds at most "
                                     "--beam-size hypotheses; raise --beam-size to at least 4 or use --sampling")


def test_length_options_are_applied(trained_run, source_text):
    translator = Translator.from_checkpoint(trained_run / "best.pt", device="cpu", beam_size=1)
    for options in (("--beam-size", "1"), ("--beam-size", "3")):
        capped = translate(trained_run, *options, "--max-len", "3", stdin=source_text)
        assert all(len(translator.tgt_vocab.sp.encode(line)) <= 2 for line in capped)
        longer = translate(trained_run, *options, "--min-len", "12", "--max-len-ratio", "5", stdin=source_text)
        assert all(len(translator.tgt_vocab.sp.encode(line)) >= 12 for line in longer)


def test_replace_unk_copies_the_attended_source_text(trained_run):
    translator = Translator.from_checkpoint(trained_run / "best.pt", device="cpu", beam_size=1)
    line = "ein Hund mit Ω und 北京"
    src_pieces = translator.src_vocab.sp.encode(line, out_type=str)
    target = [translator.tgt_vocab.sp.piece_to_id("▁a"), 1, 1]           # a <unk> <unk>
    attention = torch_eye_rows(len(target) + 1, len(src_pieces) + 1,
                               [0, src_pieces.index("Ω"), src_pieces.index("北京"), len(src_pieces)])
    text = unk_replaced(translator.src_vocab, translator.tgt_vocab, line, Hypothesis(target, 0.0, attention))
    assert "Ω" in text and "北京" in text and "⁇" not in text


def test_cli_replace_unk_on_unseen_characters(trained_run):
    text = "ein Mann mit Ω\nzwei 北京 Hunde\n"
    prefixes = "A Ω\nTwo 北京\n"                                          # unseen target characters force <unk>s
    column = "".join(f"{s}\t{p}\n" for s, p in zip(text.splitlines(), prefixes.splitlines(), strict=True))
    plain = translate(trained_run, "--prefix-column", stdin=column)
    assert all("⁇" in line for line in plain)
    replaced = translate(trained_run, "--prefix-column", "--replace-unk", stdin=column)
    assert all("⁇" not in line for line in replaced)
    assert [line.replace(" ⁇", "") for line in plain] != replaced        # the <unk>s became source text


def torch_eye_rows(rows: int, cols: int, picks: list[int]):
    import torch

    weights = torch.zeros(rows, cols)
    weights[torch.arange(rows), torch.tensor(picks)] = 1.0
    return weights
