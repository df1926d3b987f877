import json
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from nmt.config import load_config
from nmt.data import preprocess as preprocess_module
from nmt.data.corpus import DataError, read_lines
from nmt.data.preprocess import DataFolder, preprocess
from nmt.data.tokenizer import BOS, EOS, PAD, UNK

from .conftest import make_config, write_slice


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True)


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
