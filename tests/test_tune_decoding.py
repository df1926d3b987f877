"""scripts/tune_decoding.py: the dev-set grid over checkpoints, beam sizes and length penalties."""

from __future__ import annotations

import json
import subprocess
import sys

from nmt.decode.translator import Translator
from nmt.evaluate import score
from tests.conftest import REPO

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
    translator = Translator.load(model_file, beam_size=3, length_penalty=0.6)
    expected = score([str(t) for t in translator.translate(sources)], refs)["bleu"]["score"]
    row = next(r for r in rows if r["model"] == str(model_file) and r["beam_size"] == 3 and r["length_penalty"] == 0.6)
    assert row["bleu"] == expected


def test_misaligned_dev_files_are_one_error_line(model_file, corpus_dir, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("ein Hund .\n", encoding="utf-8")
    result = subprocess.run([sys.executable, str(SCRIPT), "--models", str(model_file), "--src", str(short),
                             "--ref", str(corpus_dir / "val.en")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
