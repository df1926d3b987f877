"""scripts/best_recipe.sh end to end on a tiny model: train until the plateau schedule ends the run,
average the best checkpoints, choose on dev, score the choice on test_2016 and a held-out test set."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import REPO, make_config, read_gz, write_slice


def test_best_recipe_trains_to_the_end_averages_tunes_on_dev_and_scores_tests(tmp_path):
    mirror = tmp_path / "mirror"
    write_slice(mirror, "train", 2000, gz=True)
    write_slice(mirror, "val", 60, gz=True)
    write_slice(mirror, "test_2016_flickr", 40, gz=True)
    for lang in ("de", "en"):                 # a held-out test set: the recipe scores it when present
        with gzip.open(mirror / f"test_2017_mscoco.{lang}.gz", "wt", encoding="utf-8") as handle:
            handle.write("".join(f"{line}\n" for line in read_gz(f"val.{lang}", 200)[-25:]))
    for split in ("train", "val", "test_2016_flickr"):
        with gzip.open(mirror / f"{split}.fr.gz", "wt") as handle:
            handle.write("x\n")
    data = tmp_path / "raw"
    # lr 0.003 halves after 2 validations without a better dev BLEU and training ends below 0.001
    config = make_config(tmp_path, data, training={"max_updates": 200, "lr_schedule": "plateau", "plateau_patience": 1,
                                   "plateau_factor": 0.5, "min_lr": 0.001, "validate_every": 5,
                                   "keep_best": 3, "early_stopping_metric": "bleu"})
    env = {**os.environ, "CONFIG": str(config), "DATA": str(data), "MULTI30K_MIRROR": str(mirror),
           "THREADS": "1", "DEVICE": "cpu", "BEAMS": "1,2", "PENALTIES": "1.0", "NMT_SKIP_VENV": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}   # this python and its nmt
    recipe = ["bash", str(REPO / "scripts" / "best_recipe.sh")]
    result = subprocess.run(recipe, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    run = tmp_path / "run"
    assert "(lr_below_min_lr); checkpoints in" in result.stderr                   # it ended by itself
    assert (run / "averaged-best3.pt").is_file()
    tuned = json.loads((run / "eval" / "tune.json").read_text())
    assert tuned["src"] == str(data / "val.de.gz") and tuned["ref"] == str(data / "val.en.gz")   # dev alone
    rows = tuned["rows"]
    assert {r["model"] for r in rows} == {str(run / "best.pt"), str(run / "averaged-best3.pt")}
    assert {(r["beam_size"], r["length_penalty"]) for r in rows} == {(1, 1.0), (2, 1.0)}
    for testset, lines in (("test_2016_flickr", 40), ("test_2017_mscoco", 25)):
        scores = json.loads((run / "eval" / f"{testset}.json").read_text())
        assert scores["sentences"] == lines and "nrefs:1|case:mixed" in scores["bleu"]["signature"]
        assert len((run / "eval" / f"{testset}.hyp").read_text().split("\n")) == lines + 1
    chosen = rows[0]
    assert (f"== test_2017_mscoco ({chosen['model']}, beam {chosen['beam_size']}, "
            f"length penalty {chosen['length_penalty']})") in result.stdout

    averaged_at = (run / "averaged-best3.pt").stat().st_mtime_ns
    again = subprocess.run(recipe, env=env, capture_output=True, text=True, timeout=900)   # a finished run
    assert again.returncode == 0, again.stderr[-4000:]
    assert "finished" in again.stderr and (run / "averaged-best3.pt").stat().st_mtime_ns == averaged_at
    assert json.loads((run / "eval" / "tune.json").read_text())["rows"] == rows
