"""scripts/tune_decoding.py: the dev-set grid over checkpoints, beam sizes and length penalties."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from nmt.decode.translator import Translator
from nmt.evaluate import score

from .conftest import REPO

SCRIPT = REPO / "scripts" / "tune_decoding.py"


def test_grid_is_scored_and_ranked_on_dev(model_file, trained_run, corpus_dir, tmp_path):
    src, ref = corpus_dir / "val.de", corpus_dir / "val.en"
    sources = src.read_text(encoding="utf-8").splitlines()[:15]
    refs = ref.read_text(encoding="utf-8").splitlines()[:15]
    (tmp_path / "dev.de").write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    (tmp_path / "dev.en").write_text("".join(f"{r}\n" for r in refs), encoding="utf-8")
    out = tmp_path / "tune.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--models", str(model_file), str(trained_run / "last.pt"),
                             "--src", str(tmp_path / "dev.de"), "--ref", str(tmp_path / "dev.en"),
                             "--beam-sizes", "1,3", "--length-penalties", "0.6,1.2", "--threads", "1",
                             "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    # greedy once per model (its penalty does not matter), then every beam x penalty pair
    assert sorted((r["model"], r["beam_size"], r["length_penalty"]) for r in rows) == sorted(
        (str(m), b, a) for m in (model_file, trained_run / "last.pt")
        for b, a in ((1, 1.0), (3, 0.6), (3, 1.2)))
    assert [r["bleu"] for r in rows] == sorted((r["bleu"] for r in rows), reverse=True)
    assert f"best on {tmp_path / 'dev.de'}: {rows[0]['model']} beam {rows[0]['beam_size']}" in result.stdout
    # each row's score is that setting's translations scored by sacreBLEU
    translator = Translator.load(model_file, device="cpu", beam_size=3, length_penalty=0.6)
    expected = score([str(t) for t in translator.translate(sources)], refs)["bleu"]["score"]
    row = next(r for r in rows if r["model"] == str(model_file) and r["beam_size"] == 3 and r["length_penalty"] == 0.6)
    assert row["bleu"] == expected


def load_script():
    spec = importlib.util.spec_from_file_location("tune_decoding", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_reaches_the_decoder_and_ties_go_to_the_smaller_beam(model_file, monkeypatch):
    tune_decoding = load_script()
    used = []
    translate = Translator.translate

    def recording(self, lines, *args, **kwargs):
        used.append((self.decoding.beam_size, self.decoding.length_penalty))
        return translate(self, lines, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate", recording)
    monkeypatch.setattr(tune_decoding, "score", lambda hyps, refs: {        # every setting scores the same
        "bleu": {"score": 10.0, "signature": "sig"}, "chrf": {"score": 20.0}})
    rows = tune_decoding.tune([model_file], ["ein Hund läuft .", "zwei Männer ."], ["a", "b"], [4, 1, 2],
                              [1.3, 0.8])
    assert used == [(1, 1.0), (4, 1.3), (4, 0.8), (2, 1.3), (2, 0.8)]
    assert [(r["beam_size"], r["length_penalty"]) for r in rows] == [(1, 1.0), (2, 0.8), (2, 1.3),
                                                                     (4, 0.8), (4, 1.3)]


@pytest.mark.parametrize("case", ["misaligned", "beam_zero", "json_folder_missing", "json_is_the_ref"])
def test_bad_input_is_one_error_line(model_file, corpus_dir, tmp_path, case):
    src = tmp_path / "dev.de"
    src.write_text("".join(f"{line}\n" for line in (corpus_dir / "val.de").read_text().splitlines()[:3]))
    ref = tmp_path / "dev.en"
    ref.write_text("".join(f"{line}\n" for line in (corpus_dir / "val.en").read_text().splitlines()[:3]))
    args = {"misaligned": ["--ref", str(corpus_dir / "val.en")],
            "beam_zero": ["--ref", str(ref), "--beam-sizes", "0,5"],
            "json_folder_missing": ["--ref", str(ref), "--json", str(tmp_path / "no" / "t.json")],
            "json_is_the_ref": ["--ref", str(ref), "--json", str(ref)]}[case]
    result = subprocess.run([sys.executable, str(SCRIPT), "--models", str(model_file), "--src", str(src), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert {"misaligned": "has 3 lines but", "beam_zero": "--beam-sizes", "json_folder_missing": "--json",
            "json_is_the_ref": "is also --ref"}[case] in result.stderr
    assert ref.read_text().count("\n") == 3
