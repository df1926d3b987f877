import json
import re
import subprocess
import unicodedata

import numpy as np
import pytest

from nmt.config import load_config
from nmt.data import preprocess as preprocess_module
from nmt.data.corpus import DataError, read_lines
from nmt.data.folder import DataFolder
from nmt.data.preprocess import preprocess
from nmt.data.special import BOS, EOS, PAD, UNK

from .conftest import link_marker, make_config, nmt_server, write_slice


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, text=True)


def test_preprocess_real_slice_end_to_end(tmp_path, corpus_dir):
    config = load_config(make_config(tmp_path, corpus_dir))
    out = preprocess(config)
    folder = DataFolder.open(out)
    manifest = folder.manifest
    train = manifest["splits"]["train"]
    assert train["input_pairs"] == 2000
    assert train["pairs"] + sum(train["dropped"].values()) == 2000
    assert manifest["splits"]["dev"]["pairs"] == 100 and manifest["splits"]["test"]["pairs"] == 100
    assert manifest["special_ids"] == {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS}
    assert set(manifest["inputs"]) == {f"{s}.{side}" for s in ("train", "dev", "test") for side in ("src", "tgt")}
    assert (out / "config.yaml").is_file()
    # Ids decode back to the original text (SentencePiece round trip, no unknowns on training data).
    src_vocab, tgt_vocab = folder.vocab("src"), folder.vocab("tgt")
    assert len(tgt_vocab) <= len(src_vocab) == manifest["vocab"]["src"]["size"]
    dev_tgt = folder.ids("dev", "tgt")
    refs = folder.reference_path("dev").read_text(encoding="utf-8").splitlines()
    assert len(refs) == len(dev_tgt) == 100
    raw_train_en = read_lines(corpus_dir / "train.en.gz")
    raw_train_de = read_lines(corpus_dir / "train.de.gz")
    train_tgt = folder.ids("train", "tgt")
    assert tgt_vocab.decode([train_tgt[0]])[0] == raw_train_en[0]
    assert src_vocab.decode([folder.ids("train", "src")[0]])[0] == raw_train_de[0]
    raw_dev_de = read_lines(corpus_dir / "val.de")
    normalised = [" ".join(unicodedata.normalize("NFKC", line).split()) for line in raw_dev_de]  # SentencePiece's NFKC
    assert src_vocab.decode([folder.ids("dev", "src")[i] for i in range(100)]) == normalised
    assert train["tgt_unk"] == 0
    assert train["tgt_tokens"] == int(train_tgt.lengths.sum())


def test_filters_long_and_unbalanced_pairs(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    src = ["ein kurzer Satz", "x " * 80, "ein Hund", "eins zwei drei vier fünf sechs", ""]
    tgt = ["a short sentence", "y " * 80, "a dog", "one", ""]
    (folder / "train.de").write_text("\n".join(src) + "\n")
    (folder / "train.en").write_text("\n".join(tgt) + "\n")
    config = load_config(make_config(tmp_path, folder, data={"dev": None, "test": None, "vocab_size": 40,
                                                             "max_len": 60, "max_len_ratio": 3.0}))
    manifest = DataFolder.open(preprocess(config)).manifest
    dropped = manifest["splits"]["train"]["dropped"]
    assert dropped == {"too_short": 1, "too_long": 1, "ratio": 1}
    assert manifest["splits"]["train"]["pairs"] == 2
    assert manifest["splits"]["train"]["empty_lines"] == 1


def test_misaligned_files_rejected_by_cli(tmp_path, corpus_dir):
    folder = tmp_path / "bad"
    write_slice(folder, "train", 50)
    lines = (folder / "train.en").read_text().splitlines(keepends=True)
    (folder / "train.en").write_text("".join(lines[:-1]))
    config = make_config(tmp_path, folder, data={"dev": None, "test": None})
    result = run_cli("preprocess", "--config", str(config))
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message == (f"error: {folder}/train.de has 50 lines but {folder}/train.en has 49; "
                       "parallel files must align line by line")
    assert not (tmp_path / "data").exists()


def test_invalid_utf8_rejected_with_line(tmp_path):
    folder = tmp_path / "bad"
    write_slice(folder, "train", 20)
    raw = (folder / "train.de").read_bytes().split(b"\n")
    raw[6] = raw[6] + b" \xff\xfe kaputt"
    (folder / "train.de").write_bytes(b"\n".join(raw))
    config = load_config(make_config(tmp_path, folder, data={"dev": None, "test": None}))
    with pytest.raises(DataError, match=rf"{folder}/train.de line 7: invalid UTF-8"):
        preprocess(config)


def test_missing_file_names_it(tmp_path, corpus_dir):
    config = make_config(tmp_path, corpus_dir, data={"dev": str(tmp_path / "nowhere" / "val")})
    result = run_cli("preprocess", "--config", str(config))
    assert result.returncode == 2
    assert f"`data.dev`: neither {tmp_path}/nowhere/val.de nor {tmp_path}/nowhere/val.de.gz exists" in result.stderr


def test_a_fifo_or_folder_where_an_input_file_belongs_is_named_for_what_it_is(tmp_path, corpus_dir):
    """Not reported missing: preprocessing reads its inputs twice and hashes them, so only a file will do."""
    import os

    odd = tmp_path / "odd"
    odd.mkdir()
    for lang in ("de", "en"):
        os.mkfifo(odd / f"pipe.{lang}")
        (odd / f"folder.{lang}.gz").mkdir()
    os.mkfifo(odd / "spm.model")
    cases = [({"train": str(odd / "pipe")}, f"`data.train`: {odd}/pipe.de is a FIFO (named pipe), not a file"),
             ({"dev": str(odd / "folder")}, f"`data.dev`: {odd}/folder.de.gz is a folder, not a file"),
             ({"src_spm_model": str(odd / "spm.model")}, f"`data.src_spm_model`: {odd}/spm.model is a FIFO (named "
                                                         "pipe), not a file")]
    for data, message in cases:
        config = make_config(tmp_path, corpus_dir, data=data)
        result = run_cli("preprocess", "--config", str(config))
        assert result.returncode == 2 and result.stderr == f"error: {message}\n"
        assert not (tmp_path / "data").exists()


def test_a_side_present_both_plain_and_gzipped_is_an_error_naming_both(tmp_path):
    prefix = write_slice(tmp_path / "corpus", "train", 20)
    write_slice(tmp_path / "corpus", "train", 30, gz=True)                  # another version beside it
    config = make_config(tmp_path, prefix.parent, data={"dev": None, "test": None})
    result = run_cli("preprocess", "--config", str(config))
    assert result.returncode == 2 and result.stderr == (f"error: `data.train`: both {prefix}.de and {prefix}.de.gz "
                                                        "exist, and they may differ; remove one\n")
    assert not (tmp_path / "data").exists()


def test_rerun_is_noop_and_changed_input_rebuilds(tmp_path, capsys):
    folder = tmp_path / "corpus"
    write_slice(folder, "train", 300)
    config = load_config(make_config(tmp_path, folder, data={"dev": None, "test": None, "vocab_size": 200}))
    out = preprocess(config)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    capsys.readouterr()
    preprocess(config)
    assert "up to date" in capsys.readouterr().err
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    # Change an input: the folder is rebuilt and reflects the new data.
    lines = (folder / "train.en").read_text().splitlines()
    lines[0] = "A completely different first sentence ."
    (folder / "train.en").write_text("\n".join(lines) + "\n")
    preprocess(config)
    assert "up to date" not in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["train.tgt"]["sha256"] != ""
    folder_data = DataFolder.open(out)
    assert folder_data.vocab("tgt").decode([folder_data.ids("train", "tgt")[0]])[0] == lines[0]


def test_interrupted_run_leaves_no_partial_output(tmp_path, monkeypatch):
    folder = tmp_path / "corpus"
    write_slice(folder, "train", 200)
    write_slice(folder, "val", 20)
    config = load_config(make_config(tmp_path, folder, data={"test": None, "vocab_size": 200}))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    # First build: interrupted while writing id files -> no data folder, no temporary left behind.
    original = preprocess_module.IdWriter
    monkeypatch.setattr(preprocess_module, "IdWriter", crash)
    with pytest.raises(KeyboardInterrupt):
        preprocess(config)
    assert list(tmp_path.glob("*data*")) == []
    # A complete build, then an interrupted rebuild: the complete folder survives untouched.
    monkeypatch.setattr(preprocess_module, "IdWriter", original)
    out = preprocess(config)
    before = (out / "manifest.json").read_bytes()
    monkeypatch.setattr(preprocess_module, "IdWriter", crash)
    with pytest.raises(KeyboardInterrupt):
        preprocess(config, force=True)
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.glob("*data*")) == ["data"]


def test_target_vocab_holds_only_target_pieces(prepared):
    folder = DataFolder.open(load_config(prepared).data.out_dir)
    tgt, src = folder.vocab("tgt"), folder.vocab("src")
    assert len(tgt) < len(src)
    seen = np.unique(folder.ids("train", "tgt").ids)
    assert set(range(4, len(tgt))) <= set(seen.tolist())   # every non-special target piece was seen


# ---------------------------------------------------------------------------------------------
# Streaming: line reading, chunks, the SentencePiece sample, several corpora


def test_iter_lines_splits_only_at_newline_across_blocks():
    import io

    from nmt.fs.text import iter_lines

    raw = "eins\r\nzwei\rdrei\nvier\u2028fünf\n\n\u00e4\u00f6\u00fc sechs\r".encode()
    expected = ["eins", "zwei\rdrei", "vier\u2028fünf", "", "\u00e4\u00f6\u00fc sechs\r"]  # no "\n": "\r" is content
    for block in (1, 2, 3, 5, 64):
        assert list(iter_lines(io.BytesIO(raw), "x", block_size=block)) == expected
    assert list(iter_lines(io.BytesIO(b""), "x")) == []
    assert list(iter_lines(io.BytesIO(b"a\n"), "x")) == ["a"]


def test_iter_lines_names_the_line_of_invalid_utf8_in_a_later_block():
    import io

    from nmt.fs.text import TextInputError, iter_lines

    raw = b"".join(f"line {i}\n".encode() for i in range(1, 40)) + b"bad \xc3\x28 here\nok\n"
    read = []
    with pytest.raises(TextInputError, match=r"^f\.txt line 40: invalid UTF-8 \(byte 0xc3 at column 5\)$"):
        for line in iter_lines(io.BytesIO(raw), "f.txt", block_size=16):
            read.append(line)
    assert read == [f"line {i}" for i in range(1, 40)]      # every line before the bad one


def test_reservoir_sample_is_seeded_bounded_and_uniform():
    from nmt.data.corpus import ReservoirSample

    def draw(seed: int) -> list[str]:
        sample = ReservoirSample(10, seed)
        for start in range(0, 100, 7):                       # chunks of 7 items
            sample.add([str(i) for i in range(start, min(start + 7, 100))])
        return sample.sample()

    assert draw(1) == draw(1) and draw(1) != draw(2)
    counts = np.zeros(100)
    for seed in range(300):
        picked = draw(seed)
        assert len(picked) == len(set(picked)) == 10
        counts[[int(x) for x in picked]] += 1
    assert counts.min() > 10 and counts.max() < 55             # each item expected 30 times


def test_chunked_output_equals_one_chunk(tmp_path, corpus_dir, monkeypatch):
    """Chunk boundaries change nothing: ids, offsets, counts and references are the same."""
    built = {}
    for chunk in (7, 100_000):
        monkeypatch.setattr(preprocess_module, "CHUNK_PAIRS", chunk)
        work = tmp_path / str(chunk)
        work.mkdir()
        out = preprocess(load_config(make_config(work, corpus_dir, data={"vocab_size": 300})))
        built[chunk] = out
    small, large = built.values()
    for name in sorted(p.name for p in large.iterdir() if p.name not in ("manifest.json", "config.yaml")):
        assert (small / name).read_bytes() == (large / name).read_bytes(), name
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (small, large)]
    assert manifests[0]["splits"] == manifests[1]["splits"]


def test_sentencepiece_trains_on_a_seeded_sample(tmp_path, corpus_dir, capsys):
    models = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        work = tmp_path / name
        work.mkdir()
        config = load_config(make_config(work, corpus_dir, data={"vocab_size": 300, "spm_sample_sentences": 500,
                                                                 "spm_sample_seed": seed}))
        models.append((preprocess(config) / "spm.model").read_bytes())
        assert "on 500 sampled sentences" in capsys.readouterr().err
    assert models[0] == models[1] and models[0] != models[2]


def test_several_training_corpora_with_weights(tmp_path):
    corpus = tmp_path / "corpus"
    write_slice(corpus / "a", "train", 300)
    write_slice(corpus / "b", "train", 200, gz=True)
    (tmp_path / "cfg").mkdir()
    config_path = make_config(tmp_path / "cfg", corpus, data={
        "train": ["../corpus/a/train", {"prefix": str(corpus / "b" / "train"), "weight": 0.5}],
        "dev": None, "test": None, "vocab_size": 300})
    config = load_config(config_path)
    assert config.data.train[0] == str(corpus / "a" / "train")      # relative to the config file
    folder = DataFolder.open(preprocess(config))
    train = folder.manifest["splits"]["train"]
    first, second = train["corpora"]
    assert (first["name"], first["weight"], first["input_pairs"], first["start"]) == ("train[0]", 1.0, 300, 0)
    assert (second["name"], second["weight"], second["input_pairs"]) == ("train[1]", 0.5, 200)
    assert first["end"] == second["start"] == first["pairs"] and second["end"] == train["pairs"]
    assert first["pairs"] + second["pairs"] == train["pairs"] == len(folder.ids("train", "src"))
    assert set(folder.manifest["inputs"]) == {"train[0].src", "train[0].tgt", "train[1].src", "train[1].tgt"}
    # The second corpus's first pair is the row right after the first corpus.
    raw_b = read_lines(corpus / "b" / "train.en.gz")
    assert folder.vocab("tgt").decode([folder.ids("train", "tgt")[second["start"]]])[0] == raw_b[0]


def test_corpus_entry_errors_name_the_key(tmp_path, corpus_dir):
    from nmt.config import ConfigError

    for entry, message in (({"prefix": "x", "wieght": 2}, r"unknown key `data.train\[1\].wieght`; did you mean "
                                                          r"`data.train\[1\].weight`\?"),
                           ({"prefix": "x", "weight": 0}, r"`data.train\[1\].weight` must be > 0.0, got 0")):
        path = make_config(tmp_path, corpus_dir, data={"train": ["a", entry]})
        with pytest.raises(ConfigError, match=message):
            load_config(path)


def test_a_corpus_weight_must_give_an_epoch_rows_it_can_hold(tmp_path):
    """A weight is bounded by the rows an epoch may hold (at loading and, with the pairs known, at preprocess), and
    one that rounds a corpus to 0 rows per epoch is refused: it would train nothing (one corpus: an untrained run)."""
    from nmt.config import MAX_EPOCH_ROWS, ConfigError

    corpus = write_slice(tmp_path / "corpus", "train", 100)
    cases = [(1e300, ConfigError, rf"`data.train\[0\].weight` must be <= {MAX_EPOCH_ROWS}, got 1e\+300"),
             (1e9, DataError, rf"`data.train\[0\].weight` 1e\+09 makes an epoch of more than {MAX_EPOCH_ROWS} rows"),
             (0.0001, DataError, r"`data.train\[0\].weight` 0.0001 takes 0 of its \d+ pairs per epoch .*raise it "
                                 r"above 0.00\d+")]
    for weight, error, message in cases:
        path = make_config(tmp_path, corpus.parent, data={"train": [{"prefix": str(corpus), "weight": weight}],
                                                          "dev": None, "test": None, "vocab_size": 200})
        with pytest.raises(error, match=message):
            preprocess(load_config(path))
        assert not (tmp_path / "data").exists()                      # nothing half-written
    result = run_cli("preprocess", "--config", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stderr.count("error:") == 1
    assert result.stderr.splitlines()[-1].startswith("error: `data.train[0].weight` 0.0001 takes 0 of its")


def test_a_data_folder_recording_a_weight_training_cannot_take_is_refused(prepared):
    """A manifest written by an nmt that let such a weight through: training names the key, not an OverflowError."""
    folder = DataFolder.open(load_config(prepared).data.out_dir)
    for weight, message in ((1e300, r"must be > 0 and <= \d+, the rows an epoch"), (1e-9, "takes 0 of its")):
        train = folder.manifest["splits"]["train"]
        corpora = [dict(train["corpora"][0], weight=weight)]
        manifest = dict(folder.manifest, splits=dict(folder.manifest["splits"], train=dict(train, corpora=corpora)))
        damaged = folder.root.parent / "weighted"
        damaged.mkdir(exist_ok=True)
        (damaged / "manifest.json").write_text(json.dumps(manifest))
        shown = re.escape(f"{weight:g}")
        with pytest.raises(DataError, match=rf"`data.train.weight` {shown} \(.*manifest.json records it\) {message}"):
            DataFolder.open(damaged)


def test_vocabulary_settings_are_refused_where_no_sentencepiece_model_is_trained(prepared, trained_run, tmp_path):
    """With the parent's models (`training.init_from`) or given ones for every side, `data.vocab_size` must be
    theirs (the config that made them still works) and `data.spm_model_type` is refused; only keys set, not
    defaults."""
    from nmt.config import ConfigError

    spm_model = DataFolder.open(load_config(prepared).data.out_dir).root / "spm.model"      # smoke's: 500 pieces
    corpus = write_slice(tmp_path / "corpus", "train", 60)
    parent = [f"training.init_from={trained_run / 'best.pt'}"]
    given = [f"data.src_spm_model={spm_model}"]
    for name, sets, source in (("parent", parent, r"the SentencePiece models of `training.init_from`"),
                               ("given", given, r"the given SentencePiece models \(`data.src_spm_model`\)")):
        (tmp_path / name).mkdir()
        path = make_config(tmp_path / name, corpus.parent, data={"dev": None, "test": None})
        for setting, message in (("data.vocab_size=300", rf"`data.vocab_size` 300 does not apply: {source} are "
                                                         r"used, of 500 pieces, and none is trained; remove it"),
                                 ("data.spm_model_type=bpe", rf"`data.spm_model_type` bpe does not apply: {source}")):
            with pytest.raises(ConfigError, match=message):
                preprocess(load_config(path, [*sets, setting]))
            assert not (tmp_path / name / "data").exists()
        preprocess(load_config(path, [*sets, "data.vocab_size=500"]), force=True)      # the models' own size
        preprocess(load_config(path, [*sets, "data.vocab_size=8000", "data.spm_model_type=unigram"]), force=True)
    # Separate vocabularies with only the source model given: the target one is trained to vocab_size.
    path = make_config(tmp_path, corpus.parent, data={"dev": None, "test": None, "joint_vocab": False,
                                                      "vocab_size": 150, "spm_model_type": "bpe"})
    folder = DataFolder.open(preprocess(load_config(path, given), force=True))
    assert folder.vocab("src").sp.get_piece_size() == 500 and folder.vocab("tgt").sp.get_piece_size() == 150
    result = run_cli("preprocess", "--config", str(path), "--set", "data.joint_vocab=true", "--set",
                     f"data.src_spm_model={spm_model}")
    assert result.returncode == 2 and result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: `data.vocab_size` 150 does not apply")


def test_old_data_format_is_refused(prepared):
    folder = DataFolder.open(load_config(prepared).data.out_dir)
    manifest = dict(folder.manifest, format=1)
    old = folder.root.parent / "old_format"
    old.mkdir(exist_ok=True)
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"data format 1 is not 2; rerun `nmt preprocess`"):
        DataFolder.open(old)


def test_trainer_takes_corpus_weights_from_the_manifest(tmp_path):
    from nmt.train.trainer import Trainer

    corpus = tmp_path / "corpus"
    write_slice(corpus / "a", "train", 120)
    write_slice(corpus / "b", "train", 80)
    config = load_config(make_config(tmp_path, corpus, data={
        "train": [{"prefix": str(corpus / "a" / "train"), "weight": 2},
                  {"prefix": str(corpus / "b" / "train"), "weight": 0.25}], "dev": None, "test": None,
        "vocab_size": 200}))
    preprocess(config)
    first, second = DataFolder.open(config.data.out_dir).manifest["splits"]["train"]["corpora"]
    rows = np.concatenate(Trainer(config).sampler.batches(0))
    assert len(rows) == 2 * first["pairs"] + round(0.25 * second["pairs"])
    assert np.bincount(rows, minlength=second["end"])[: first["end"]].tolist() == [2] * first["pairs"]


def test_a_data_folder_matches_the_settings_it_was_built_with(prepared):
    """Paths may move and one prefix equals a one-item list; another setting or a missing split is named."""
    import dataclasses

    config = load_config(prepared)
    folder = DataFolder.open(config.data.out_dir)
    folder.check_settings(config.data)
    folder.check_settings(dataclasses.replace(config.data, train=[config.data.train]))
    with pytest.raises(DataError, match="preprocessed with a `data.test`, this config has no `data.test`"):
        folder.check_settings(dataclasses.replace(config.data, test=None))
    with pytest.raises(DataError, match="preprocessed with 1 training corpus of weight 1.0, this config has "
                                        r"2 training corpora of weights \[1.0, 2.0\]"):
        folder.check_settings(dataclasses.replace(config.data, train=[config.data.train, {"prefix": "x",
                                                                                          "weight": 2.0}]))
    with pytest.raises(DataError, match="preprocessed with `data.max_len` 50, this config has `data.max_len` 20"):
        folder.check_settings(dataclasses.replace(config.data, max_len=20))


@pytest.mark.parametrize("name", ["../victim.txt", "ABSOLUTE"])
def test_a_marker_naming_files_outside_the_data_folder_deletes_nothing(tmp_path, corpus_dir, name):
    from nmt.fs.folders import MARKER

    config = make_config(tmp_path, corpus_dir)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    data = tmp_path / "data"
    data.mkdir()
    listed = str(victim) if name == "ABSOLUTE" else name
    (data / MARKER).write_text(json.dumps({"kind": "data", "files": [listed]}))
    result = run_cli("preprocess", "--config", str(config))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert repr(listed) in lines[0] and "not a plain file name" in lines[0]
    assert victim.read_text() == "mine" and sorted(p.name for p in data.iterdir()) == [MARKER]


def test_a_marker_that_is_a_link_is_never_written_through(tmp_path, corpus_dir):
    from nmt.fs.folders import MARKER

    config = make_config(tmp_path, corpus_dir)
    data = tmp_path / "data"
    victim = link_marker(data)
    result = run_cli("preprocess", "--config", str(config))
    assert result.returncode == 2 and "is a symbolic link" in result.stderr.strip().splitlines()[-1]
    assert victim.read_text() == "mine\n" and [p.name for p in data.iterdir()] == [MARKER]


def test_a_vocabulary_named_outside_the_data_folder_is_refused(tmp_path):
    from nmt.data.tokenizer import Vocab

    for entry in ({"model": "../spm.model"}, {"model": "/etc/passwd"}, {"model": "spm.model", "pieces": "../p"}):
        with pytest.raises(ValueError, match="not a plain file name inside"):
            Vocab.from_entry(tmp_path, entry)
