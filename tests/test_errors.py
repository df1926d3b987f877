"""The error matrix: bad invocations as a user would type them.

Each one must exit 2 with exactly one `error:` line on stderr, no traceback, and leave every
file that existed before (inputs, outputs, run and data folders) byte-identical, with no new
file anywhere in them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from nmt.data.preprocess import FORMAT_VERSION
from nmt.fs.folders import LOCK

from .conftest import make_config, nmt_server, write_slice

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, stdin=stdin, cwd=cwd)


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file and folder under `roots`, with a hash of each file's bytes (lock files hold a PID: skipped)."""
    seen = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.name == LOCK:
                continue
            seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return seen


@pytest.fixture(scope="module")
def world(tmp_path_factory, corpus_dir, prepared, trained_run) -> dict[str, Path]:
    """A user's folder: corpus, configs, a finished run (copy), outputs that must survive, odd files."""
    root = tmp_path_factory.mktemp("world")
    corpus = root / "corpus"
    write_slice(corpus, "train", 30)
    write_slice(corpus, "val", 5)
    conf = root / "conf"
    conf.mkdir()
    config = make_config(conf, corpus, data={"test": None, "out_dir": str(root / "data")},
                         training={"run_dir": str(root / "runs" / "a")})
    run = root / "run_copy"
    shutil.copytree(trained_run, run)
    (root / "runs").mkdir()
    user = root / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("my own notes\n")
    (root / "userrun").mkdir()                    # a user's folder that happens to hold a last.pt
    (root / "userrun" / "last.pt").write_bytes(b"not a checkpoint")
    (root / "userrun" / "config.yaml").write_text("my: notes\n")
    files = {
        "root": root, "corpus": corpus, "config": config, "prepared": prepared, "run": run, "user": user,
        "ckpt": run / "best.pt",
    }
    (root / "out.txt").write_text("previous output\n")
    (root / "scores.json").write_text('{"old": true}\n')
    (root / "good.de").write_text("ein Hund\nzwei Katzen\n")
    (root / "bad.de").write_bytes(b"ein Hund\n" * 3 + b"kaputt \xff\n" + b"ein Hund\n")
    (root / "ref.en").write_text("a dog\ntwo cats\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "latin1.yaml").write_bytes("data:\n  src_lang: d\xe9\n".encode("latin-1"))
    (root / "broken.yaml").write_text("data: [unclosed\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "typo.yaml").write_text("trainig:\n  lr: 0.1\n")
    (root / "garbage.pt").write_bytes(b"PK\x03\x04 definitely not a checkpoint")
    (root / "notgz.de.gz").write_bytes(b"plain text pretending to be gzip\n")
    (root / "adir").mkdir()
    state = torch.load(run / "best.pt", weights_only=True)
    state["config"]["model"]["decoder_hidden"] = 7                    # weights no longer fit the config
    torch.save(state, run / "mismatch.pt")
    shutil.copy(run / "best.pt", root / "model.pt")                      # a model outside any nmt folder
    for name, damage in (("norng", lambda st: st.pop("rng")), ("badrng", lambda st: st["rng"].update(torch="x")),
                         ("badstep", lambda st: st.update(step="x")),
                         ("badwindow", lambda st: st["progress"].update(window_tokens="x")),
                         ("oldprogress", lambda st: st["progress"].pop("validation_due"))):
        shutil.copytree(run, root / name, ignore=shutil.ignore_patterns("mismatch.pt"))
        state = torch.load(root / name / "last.pt", weights_only=False)
        damage(state)
        torch.save(state, root / name / "last.pt")
    bad_corpus = root / "badcorpus"
    write_slice(bad_corpus, "train", 20)
    raw = (bad_corpus / "train.de").read_bytes().split(b"\n")
    raw[4] += b"\xc3\x28"
    (bad_corpus / "train.de").write_bytes(b"\n".join(raw))
    gz_corpus = root / "gzcorpus"
    write_slice(gz_corpus, "train", 20)
    (gz_corpus / "train.de").rename(gz_corpus / "train.de.gz")                  # not gzip inside
    short = root / "short"
    write_slice(short, "train", 20)
    (short / "train.en").write_text("".join((short / "train.en").read_text().splitlines(True)[:-1]))
    with gzip.open(root / "hyp.gz", "wb") as handle:
        handle.write(b"a dog\n\xfe\n")
    (root / "afile").write_text("I am a file\n")
    (root / "emptycorpus").mkdir()
    for lang in ("de", "en"):
        (root / "emptycorpus" / f"train.{lang}").write_bytes(b"")
    (root / "torn").mkdir()
    (root / "torn" / "manifest.json").write_text('{"format": ')          # a manifest cut short
    (root / "hollow").mkdir()
    (root / "hollow" / "manifest.json").write_text(json.dumps({"format": FORMAT_VERSION}))
    shutil.copytree(Path(yaml.safe_load(prepared.read_text())["data"]["out_dir"]), root / "nocorpora",
                    ignore=shutil.ignore_patterns(LOCK))
    manifest = json.loads((root / "nocorpora" / "manifest.json").read_text())
    del manifest["splits"]["train"]["corpora"]
    (root / "nocorpora" / "manifest.json").write_text(json.dumps(manifest))
    files["data_cfg"] = {"data": {"out_dir": str(root / "data")}}
    return files


def case_args(name: str, w: dict) -> tuple[list[str], bytes | None]:
    """The arguments (and stdin) of one bad invocation."""
    r, cfg, prep, run, ckpt = w["root"], str(w["config"]), str(w["prepared"]), w["run"], str(w["ckpt"])
    # as trained_run validated (--resume refuses another way of scoring validations)
    resume = ["train", "-c", prep, "--set", "training.val_max_sentences=20", "--set", f"training.run_dir={run}",
              "--resume"]
    translate = ["translate", "--checkpoint", ckpt, "-q"]
    cases: dict[str, tuple[list[str], bytes | None]] = {
        # configuration files and overrides
        "config missing": (["preprocess", "-c", str(r / "nope.yaml")], None),
        "config is a folder": (["preprocess", "-c", str(r / "adir")], None),
        "config not UTF-8": (["preprocess", "-c", str(r / "latin1.yaml")], None),
        "config not YAML": (["train", "-c", str(r / "broken.yaml")], None),
        "config not a mapping": (["preprocess", "-c", str(r / "list.yaml")], None),
        "config unknown section": (["train", "-c", str(r / "typo.yaml")], None),
        "set without =": (["train", "-c", cfg, "--set", "training.lr"], None),
        "set without section": (["train", "-c", cfg, "--set", "lr=0.1"], None),
        "set wrong type": (["train", "-c", cfg, "--set", "training.lr=fast"], None),
        "set out of range": (["train", "-c", cfg, "--set", "training.max_updates=-5"], None),
        "set one adam beta": (["train", "-c", cfg, "--set", "training.adam_betas=[0.9]"], None),
        "set same languages": (["preprocess", "-c", cfg, "--set", "data.tgt_lang=de"], None),
        "set into a value": (["train", "-c", cfg, "--set", "data.train.x=1"], None),
        "set bad YAML": (["train", "-c", cfg, "--set", "training.lr=[1"], None),
        "set control character": (["train", "-c", cfg, "--set", "training.lr=\x07"], None),
        "set unknown choice": (["train", "-c", cfg, "--set", "training.device=tpu"], None),
        "fp16 training on the CPU": (["train", "-c", prep, "--set", f"training.run_dir={r}/fp16run", "--set",
                                      "training.device=cpu", "--set", "training.precision=fp16"], None),
        "set unknown key": (["preprocess", "-c", cfg, "--set", "data.vocab=100"], None),
        "resume and overwrite": (["train", "-c", cfg, "--resume", "--overwrite"], None),
        "unknown option": (["train", "-c", cfg, "--frobnicate"], None),
        "unknown command": (["frobnicate"], None),
        # preprocess: folders and inputs
        "out_dir is the corpus": (["preprocess", "-c", cfg, "--set", f"data.out_dir={w['corpus']}"], None),
        "out_dir inside the corpus": (["preprocess", "-c", cfg, "--set", f"data.out_dir={w['corpus']}/spm"], None),
        "out_dir contains the corpus": (["preprocess", "-c", cfg, "--set", f"data.out_dir={r}"], None),
        "out_dir is the config folder": (["preprocess", "-c", cfg, "--set", "data.out_dir=."], None),
        "out_dir holds user files": (["preprocess", "-c", cfg, "--set", f"data.out_dir={w['user']}"], None),
        "out_dir is a file": (["preprocess", "-c", cfg, "--set", f"data.out_dir={r / 'afile'}"], None),
        "out_dir is a run folder": (["preprocess", "-c", cfg, "--set", f"data.out_dir={run}"], None),
        "train file missing": (["preprocess", "-c", cfg, "--set", f"data.train={r}/nowhere/train"], None),
        "corpus invalid UTF-8": (["preprocess", "-c", cfg, "--set", f"data.train={r}/badcorpus/train"], None),
        "corpus gzip garbage": (["preprocess", "-c", cfg, "--set", f"data.train={r}/gzcorpus/train"], None),
        "corpus misaligned": (["preprocess", "-c", cfg, "--set", f"data.train={r}/short/train"], None),
        "corpus empty": (["preprocess", "-c", cfg, "--set", f"data.train={r}/emptycorpus/train"], None),
        "dev empty": (["preprocess", "-c", cfg, "--set", f"data.dev={r}/emptycorpus/train"], None),
        "filter drops every pair": (["preprocess", "-c", cfg, "--set", "data.max_len=1"], None),
        "vocab below the characters": (["preprocess", "-c", cfg, "--set", "data.vocab_size=16"], None),
        "coverage below SentencePiece's": (["preprocess", "-c", cfg, "--set", "data.character_coverage=0.5"], None),
        "spm model not SentencePiece": (["preprocess", "-c", cfg, "--set", f"data.src_spm_model={r}/good.de",
                                         "--set", f"data.tgt_spm_model={r}/good.de"], None),
        # train: run folders and resume
        "overwrite a user folder": (["train", "-c", prep, "--set", f"training.run_dir={w['user']}", "--overwrite"],
                                    None),
        "run folder not empty": (["train", "-c", prep, "--set", f"training.run_dir={w['user']}"], None),
        "resume a user folder": (["train", "-c", prep, "--set", f"training.run_dir={r / 'userrun'}", "--resume"], None),
        "model the config cannot build": (["train", "-c", prep, "--set", f"training.run_dir={r / 'runs' / 'tied'}",
                                           "--set", "model.tie_embeddings=true"], None),
        "run_dir is the corpus": (["train", "-c", cfg, "--set", f"training.run_dir={w['corpus']}",
                                   "--set", f"data.out_dir={Path(prep).parent / 'data'}"], None),
        "run_dir is the config folder": (["train", "-c", prep, "--set", "training.run_dir=.", "--overwrite"], None),
        "run_dir is a data folder": (["train", "-c", prep, "--set", f"training.run_dir={Path(prep).parent / 'data'}",
                                      "--overwrite"], None),
        "resume without last.pt": (["train", "-c", prep, "--set", f"training.run_dir={r / 'runs' / 'none'}",
                                    "--resume"], None),
        "resume changes seed": ([*resume, "--set", "training.seed=7"], None),
        "resume changes batch_tokens": ([*resume, "--set", "training.batch_tokens=999"], None),
        "resume changes data": ([*resume, "--set", "data.max_len=20"], None),
        "resume changes model": ([*resume, "--set", "model.decoder_hidden=8"], None),
        "resume without training state": ([*resume[:6], f"training.run_dir={r / 'norng'}", "--resume"], None),
        "resume a damaged training state": ([*resume[:6], f"training.run_dir={r / 'badrng'}", "--resume"], None),
        "resume a step that is no number": ([*resume[:6], f"training.run_dir={r / 'badstep'}", "--resume"], None),
        "resume a progress count that is no number": ([*resume[:6], f"training.run_dir={r / 'badwindow'}", "--resume"],
                                                      None),
        "resume an early version's progress": ([*resume[:6], f"training.run_dir={r / 'oldprogress'}", "--resume"],
                                               None),
        "train on a manifest without corpora": (["train", "-c", cfg, "--set", f"data.out_dir={r / 'nocorpora'}",
                                                 "--set", "data.train=null"], None),     # the folder as it is
        "train without data folder": (["train", "-c", cfg], None),
        "train on other settings' data": (["train", "-c", prep, "--set", f"training.run_dir={r / 'runs' / 'other'}",
                                           "--set", "data.vocab_size=999"], None),
        "train on a torn manifest": (["train", "-c", cfg, "--set", f"data.out_dir={r / 'torn'}"], None),
        "train on a hollow manifest": (["train", "-c", cfg, "--set", f"data.out_dir={r / 'hollow'}"], None),
        "train on a tpu": (["train", "-c", prep, "--set", f"training.run_dir={r / 'runs' / 'tpu'}",
                            "--set", "training.device=tpu"], None),
        # translate
        "checkpoint missing": (["translate", "--checkpoint", str(r / "nope.pt")], b"x\n"),
        "checkpoint garbage": (["translate", "--checkpoint", str(r / "garbage.pt")], b"x\n"),
        "checkpoint is a folder": (["translate", "--checkpoint", str(r / "adir")], b"x\n"),
        "weights do not fit config": (["translate", "--checkpoint", str(run / "mismatch.pt")], b"x\n"),
        "device tpu": ([*translate, "--device", "tpu"], b"x\n"),
        "output into missing folder": ([*translate, "-o", str(r / "nowhere" / "out.txt")], b"ein Hund\n"),
        "output onto the model": (["translate", "-m", str(r / "model.pt"), "-q", "-o", str(r / "model.pt")],
                                  b"ein Hund\n"),
        "scores onto the model": (["translate", "-m", str(r / "model.pt"), "-q", "--scores", str(r / "model.pt")],
                                  b"ein Hund\n"),
        "output onto a run's checkpoint": ([*translate, "-o", str(run / "last.pt")], b"ein Hund\n"),
        "score output onto the model": (["score", "-m", str(r / "model.pt"), "--src", str(r / "good.de"),
                                         "--tgt", str(r / "ref.en"), "-o", str(r / "model.pt")], None),
        "evaluate json onto the model": (["evaluate", "-m", str(r / "model.pt"), "--src", str(r / "good.de"),
                                          "--ref", str(r / "ref.en"), "--json", str(r / "model.pt")], None),
        "output onto a folder": ([*translate, "-o", str(r / "adir")], b"ein Hund\n"),
        "alignments into missing folder": ([*translate, "--alignments", str(r / "no" / "al.txt")], b"ein Hund\n"),
        "attention onto a folder": ([*translate, "--attention-out", str(r / "adir")], b"ein Hund\n"),
        "input missing": ([*translate, "-i", str(r / "nope.de")], None),
        "input is a folder": ([*translate, "-i", str(r / "adir")], None),
        "input gzip garbage": ([*translate, "-i", str(r / "notgz.de.gz"), "-o", str(r / "out.txt")], None),
        "input invalid UTF-8 to file": ([*translate, "-i", str(r / "bad.de"), "-o", str(r / "out.txt")], None),
        "stdin invalid UTF-8 to file": ([*translate, "-o", str(r / "out.txt")], b"gut\n\xff\xfe\n"),
        "input is the output": ([*translate, "-i", str(r / "good.de"), "-o", str(r / "good.de")], None),
        "n-best above beam": ([*translate, "--n-best", "4", "--beam-size", "2"], b"ein Hund\n"),
        "threads negative": ([*translate, "--threads", "-1"], b"x\n"),
        "beam size zero": ([*translate, "--beam-size", "0"], b"x\n"),
        "beam size huge": ([*translate, "--beam-size", "100000000"], b"x\n"),
        "min-len above max-len": ([*translate, "--min-len", "30", "--max-len", "5"], b"x\n"),
        "max-len overflows": ([*translate, "--max-len", str(10**20)], b"x\n"),
        "seed overflows": ([*translate, "--sampling", "--seed", str(10**20)], b"x\n"),
        "temperature without sampling": ([*translate, "--temperature", "0.5"], b"x\n"),
        "n-best huge with sampling": ([*translate, "--sampling", "--n-best", "1001"], b"x\n"),
        "serve max-beam huge": (["serve", "--model", ckpt, "--max-beam", "5000"], None),
        "plot folder is the output": ([*translate, "-o", str(r / "plots"), "--plot-attention", str(r / "plots")],
                                      b"ein Hund\n"),
        "threads huge": ([*translate, "--threads", "100000"], b"x\n"),
        "device without it": ([*translate, "--device", "cuda:99"], b"x\n"),
        "batch tokens not a number": ([*translate, "--batch-tokens", "many"], b"x\n"),
        "precision fp8": ([*translate, "--precision", "fp8"], b"x\n"),
        "translate without checkpoint": (["translate"], b"x\n"),
        # evaluate
        "evaluate empty files": (["evaluate", "--hyp", str(r / "empty.txt"), "--ref", str(r / "empty.txt")], None),
        "evaluate hyp missing": (["evaluate", "--hyp", str(r / "nope.en"), "--ref", str(r / "ref.en")], None),
        "evaluate line counts differ": (["evaluate", "--hyp", str(r / "good.de"), "--ref", str(r / "out.txt")], None),
        "evaluate invalid UTF-8": (["evaluate", "--hyp", str(r / "bad.de"), "--ref", str(r / "bad.de")], None),
        "evaluate gzip hyp invalid": (["evaluate", "--hyp", str(r / "hyp.gz"), "--ref", str(r / "ref.en")], None),
        "evaluate json into missing folder": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "ref.en"),
                                               "--json", str(r / "no" / "s.json")], None),
        "evaluate json onto a folder": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "ref.en"),
                                         "--json", str(r / "adir")], None),
        "evaluate json over the hyp": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "good.de"),
                                        "--json", str(r / "ref.en")], None),
        "evaluate nothing to score": (["evaluate", "--ref", str(r / "ref.en")], None),
        "evaluate checkpoint without src": (["evaluate", "--ref", str(r / "ref.en"), "--checkpoint", ckpt], None),
        "evaluate compare missing": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "ref.en"),
                                      "--compare", str(r / "nope")], None),
        "evaluate device tpu": (["evaluate", "--ref", str(r / "ref.en"), "--checkpoint", ckpt,
                                 "--src", str(r / "good.de"), "--device", "tpu"], None),
        "evaluate beam size for a hyp file": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "ref.en"),
                                               "--beam-size", "7"], None),
        "evaluate src with a hyp file": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "ref.en"),
                                          "--src", str(r / "good.de")], None),
        "evaluate bootstrap without compare": (["evaluate", "--hyp", str(r / "ref.en"), "--ref", str(r / "ref.en"),
                                                "--bootstrap-samples", "50"], None),
        "shortlist-k with no-shortlist": ([*translate, "--shortlist-k", "20", "--no-shortlist"], b"x\n"),
        "early stop with greedy": ([*translate, "--beam-size", "1", "--early-stop"], b"x\n"),
        # average and plot
        "average into missing folder": (["average", ckpt, ckpt, "-o", str(r / "no" / "avg.pt")], None),
        "average onto a folder": (["average", ckpt, "-o", str(r / "adir")], None),
        "average garbage": (["average", str(r / "garbage.pt"), ckpt, "-o", str(r / "avg.pt")], None),
        "average missing checkpoint": (["average", str(r / "nope.pt"), "-o", str(r / "avg.pt")], None),
        "plot curves missing run": (["plot", "curves", str(r / "nope"), "-o", str(r / "c.png")], None),
    }
    return cases[name]


CASES = [
    "config missing", "config is a folder", "config not UTF-8", "config not YAML", "config not a mapping",
    "config unknown section", "set without =", "set without section", "set wrong type", "set out of range",
    "set one adam beta", "set same languages",
    "set into a value", "set bad YAML", "set control character", "set unknown choice", "set unknown key",
    "resume and overwrite", "unknown option", "unknown command",
    "out_dir is the corpus", "out_dir inside the corpus", "out_dir contains the corpus",
    "out_dir is the config folder", "out_dir holds user files", "out_dir is a file", "out_dir is a run folder",
    "train file missing", "corpus invalid UTF-8", "corpus gzip garbage", "corpus misaligned",
    "corpus empty", "dev empty", "filter drops every pair", "vocab below the characters",
    "coverage below SentencePiece's", "spm model not SentencePiece",
    "overwrite a user folder", "run folder not empty", "resume a user folder", "model the config cannot build",
    "run_dir is the corpus", "run_dir is the config folder",
    "run_dir is a data folder", "resume without last.pt", "resume changes seed", "resume changes batch_tokens",
    "resume changes data", "resume changes model", "resume without training state", "resume a damaged training state",
    "resume a step that is no number", "resume a progress count that is no number",
    "resume an early version's progress", "train on a manifest without corpora",
    "train without data folder", "train on a tpu",
    "train on other settings' data", "train on a torn manifest", "train on a hollow manifest",
    "checkpoint missing", "checkpoint garbage", "checkpoint is a folder", "weights do not fit config", "device tpu",
    "output into missing folder", "output onto the model", "scores onto the model", "output onto a run's checkpoint",
    "score output onto the model", "evaluate json onto the model", "output onto a folder",
    "alignments into missing folder",
    "attention onto a folder", "input missing", "input is a folder", "input gzip garbage",
    "input invalid UTF-8 to file", "stdin invalid UTF-8 to file", "input is the output", "n-best above beam",
    "threads negative", "beam size zero", "beam size huge", "min-len above max-len", "max-len overflows",
    "seed overflows", "temperature without sampling", "plot folder is the output",
    "n-best huge with sampling", "serve max-beam huge", "threads huge", "device without it",
    "batch tokens not a number", "precision fp8", "translate without checkpoint",
    "evaluate empty files", "evaluate hyp missing", "evaluate line counts differ", "evaluate invalid UTF-8",
    "evaluate gzip hyp invalid", "evaluate json into missing folder", "evaluate json onto a folder",
    "evaluate json over the hyp", "evaluate nothing to score", "evaluate checkpoint without src",
    "evaluate compare missing", "evaluate device tpu", "evaluate beam size for a hyp file",
    "evaluate src with a hyp file", "evaluate bootstrap without compare", "shortlist-k with no-shortlist",
    "early stop with greedy",
    "average into missing folder", "average onto a folder", "average garbage", "average missing checkpoint",
    "plot curves missing run",
]


def assert_one_error(result: subprocess.CompletedProcess) -> str:
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0]


def test_the_matrix_is_large():
    assert len(CASES) == len(set(CASES)) >= 40


@pytest.mark.parametrize("name", CASES)
def test_bad_invocation(world, name):
    args, stdin = case_args(name, world)
    watched = (world["root"], world["prepared"].parent)
    before = snapshot(*watched)
    result = run_cli(*args, stdin=stdin, cwd=world["config"].parent)
    assert_one_error(result)
    assert snapshot(*watched) == before
    if name == "stdin invalid UTF-8 to file":
        assert result.stdout == b""


def test_messages_name_the_thing_to_fix(world):
    r, run = world["root"], world["run"]
    checks = {
        "config not UTF-8": "latin1.yaml line 2: not UTF-8",
        "out_dir holds user files": "holds files nmt did not write (notes.txt)",
        "overwrite a user folder": "holds files nmt did not write (notes.txt)",
        "out_dir is the corpus": f"overlaps {world['corpus']}",
        "corpus invalid UTF-8": f"{r}/badcorpus/train.de line 5: invalid UTF-8",
        "input invalid UTF-8 to file": f"{r}/bad.de line 4: invalid UTF-8 (byte 0xff at column 8)",
        "stdin invalid UTF-8 to file": "stdin line 2: invalid UTF-8",
        "resume changes seed": "--resume cannot change `training.seed` (1 -> 7)",
        "device tpu": "unknown device 'tpu'",
        "weights do not fit config": f"{run}/mismatch.pt: weight bridge.hidden.weight has shape (64, 64), "
                                     "but its config describes (7, 64)",
        "n-best above beam": "--n-best 4 is larger than the beam size 2",
        "threads negative": "--threads",
        "beam size huge": "`--beam-size` must be <= 1000, got 100000000",
        "min-len above max-len": "`--min-len` 30 leaves no room under `--max-len` 5",
        "seed overflows": "`--seed` must be at most 2147483647",
        "temperature without sampling": "`--temperature` applies only to sampling; add `--sampling`",
        "evaluate beam size for a hyp file": "--beam-size applies only with --checkpoint",
        "evaluate src with a hyp file": "--src applies only with --checkpoint",
        "evaluate bootstrap without compare": "--bootstrap-samples applies only with --compare",
        "shortlist-k with no-shortlist": "`--shortlist-k` applies only with the shortlist on",
        "early stop with greedy": "--early-stop applies only to beam search, and the beam size is 1 (greedy)",
        "plot folder is the output": f"--plot-attention {r}/plots is also --output",
        "device without it": "device cuda:99 was asked for",
        "train on other settings' data": "was preprocessed with `data.vocab_size`",
        "resume without training state": f"{r}/norng/last.pt lacks the training state `rng`",
        "resume a user folder": f"cannot resume: {r}/userrun is not an nmt run folder",
        "resume a step that is no number": f"{r}/badstep/last.pt: its training state cannot be restored",
        "resume a progress count that is no number": f"{r}/badwindow/last.pt: its training state cannot be restored",
        "resume an early version's progress": f"{r}/oldprogress/last.pt lacks the progress field `validation_due`",
        "train on a manifest without corpora": f"{r}/nocorpora/manifest.json is not a complete nmt manifest",
        "serve max-beam huge": "--max-beam",
        "resume a damaged training state": f"{r}/badrng/last.pt: its training state cannot be restored",
        "corpus empty": "`data.train`: the training corpora hold no non-blank sentences",
        "dev empty": f"`data.dev`: {r}/emptycorpus/train.de and {r}/emptycorpus/train.en are empty",
        "filter drops every pair": "the length filter drops all 30 training pairs (too short 0, too long 30",
        "vocab below the characters": "`data.vocab_size` 16 is too small",
        "spm model not SentencePiece": f"`data.src_spm_model`: {r}/good.de is not a SentencePiece model",
        "train on a torn manifest": f"{r}/torn/manifest.json cannot be read as a manifest",
        "train on a hollow manifest": f"{r}/hollow/manifest.json lacks `langs`",
        "evaluate empty files": "is empty",
        "output into missing folder": f"--output: folder {r}/nowhere does not exist",
        "output onto the model": f"--output {r}/model.pt is also --model",
        "evaluate json onto the model": f"--json {r}/model.pt is also --model",
        "output onto a run's checkpoint": f"--output {run}/last.pt is a file of the nmt run folder {run}",
    }
    for name, expected in checks.items():
        args, stdin = case_args(name, world)
        line = assert_one_error(run_cli(*args, stdin=stdin, cwd=world["config"].parent))
        assert expected in line, (name, line)


def test_stdin_lines_before_a_bad_byte_stay_and_nothing_after(world):
    result = run_cli("translate", "--checkpoint", str(world["ckpt"]), "-q", "--beam-size", "1",
                     stdin=b"ein Hund\nzwei Katzen\n\xff\nein Hund\n")
    assert_one_error(result)
    out = result.stdout.decode().split("\n")
    assert len(out) <= 3 and out[-1] == ""         # at most the two good lines, each complete


def test_a_locked_run_folder_names_the_holder(world, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(world["run"], run, ignore=shutil.ignore_patterns("mismatch.pt"))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from nmt.fs.locks import lock_folder
        lock_folder({str(run)!r}, "train")
        print("locked", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(run)
        for extra in (["--resume", "--set", "training.max_updates=1000"], ["--overwrite"]):
            result = run_cli("train", "-c", str(world["prepared"]), "--set", f"training.run_dir={run}", *extra)
            line = assert_one_error(result)
            assert f"is in use by process {holder.pid} (nmt train)" in line
        assert snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()


def test_config_yaml_still_parses(world):
    assert yaml.safe_load(world["config"].read_text())["data"]["out_dir"].endswith("data")


def test_disk_full_while_saving_a_checkpoint(prepared, tmp_path):
    """fsync reports ENOSPC on the second write of last.pt: one error line, the first last.pt intact."""
    run = tmp_path / "run"
    patch = textwrap.dedent("""
        import errno, os, sys
        import nmt.fs.folders as f
        _commit, _count = f.PendingFile.commit, [0]
        def commit(self, *args):
            if self.path.name == "last.pt":
                _count[0] += 1
                if _count[0] == 2:
                    os.fsync = lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
            _commit(self, *args)
        f.PendingFile.commit = commit
    """)
    args = ["train", "-c", str(prepared), "--set", f"training.run_dir={run}", "--set", "training.save_every=1",
            "--set", "training.validate_every=1000", "--set", "training.max_updates=5", "--set", "training.threads=1"]
    code = f"{patch}\nfrom nmt.cli.main import main\nsys.argv = ['nmt', *{args!r}]\nmain()\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=REPO, timeout=300)
    line = assert_one_error(result)
    assert f"cannot write checkpoint {run}/last.pt (No space left on device)" in line
    from nmt.train.checkpoint import load_checkpoint

    assert load_checkpoint(run / "last.pt")["step"] == 1
    assert [p.name for p in run.iterdir() if p.name.endswith(".nmt-tmp")] == []


def test_training_refuses_inputs_changed_since_preprocessing(prepared, corpus_dir, tmp_path):
    """A moved project trains (paths are not compared); an input file edited since `nmt preprocess` does not."""
    raw = yaml.safe_load(prepared.read_text())
    corpus = shutil.copytree(corpus_dir, tmp_path / "corpus")
    shutil.copytree(Path(raw["data"]["out_dir"]), tmp_path / "data")
    raw["data"].update(train=str(corpus / "train"), dev=str(corpus / "val"), test=str(corpus / "test_2016_flickr"),
                       out_dir=str(tmp_path / "data"))
    raw["training"].update(run_dir=str(tmp_path / "run"), max_updates=1, validate_every=1000)
    config = tmp_path / "moved.yaml"
    config.write_text(yaml.safe_dump(raw))
    moved = run_cli("train", "-c", str(config))
    assert moved.returncode == 0, moved.stderr.decode()

    with gzip.open(corpus / "train.de.gz", "ab") as handle:    # one more line, and so another size
        handle.write(b"ein neuer Satz\n")
    before = snapshot(tmp_path)
    line = assert_one_error(run_cli("train", "-c", str(config), "--set", f"training.run_dir={tmp_path / 'run2'}"))
    assert f"{corpus}/train.de.gz has changed since" in line
    assert snapshot(tmp_path) == before


def test_a_closed_stdout_is_an_error_and_output_files_still_work(world, tmp_path):
    """`nmt translate >&-`: one error line, exit 2; with --output the file gets the translation, and
    nothing a library prints to descriptor 1 can land in it."""
    args = [sys.executable, "-m", "nmt", "translate", "-m", str(world["ckpt"]), "-q", "--beam-size", "1"]

    def close_stdout() -> None:
        os.close(1)

    to_stdout = subprocess.run(args, input=b"ein Hund\n", stderr=subprocess.PIPE, preexec_fn=close_stdout,
                               cwd=REPO, timeout=300)
    assert "stdout is closed" in assert_one_error(to_stdout)
    out = tmp_path / "out.txt"
    to_file = subprocess.run([*args, "-o", str(out)], input=b"ein Hund\n", stderr=subprocess.PIPE,
                             preexec_fn=close_stdout, cwd=REPO, timeout=300)
    assert to_file.returncode == 0, to_file.stderr
    expected = run_cli("translate", "-m", str(world["ckpt"]), "-q", "--beam-size", "1", stdin=b"ein Hund\n").stdout
    assert out.read_bytes() == expected and expected.count(b"\n") == 1


def test_evaluate_with_a_closed_stdout_writes_no_json_file(tmp_path):
    """`nmt evaluate --json F >&-`: the report cannot be printed, so the command fails before F exists."""
    (tmp_path / "hyp.txt").write_text("ein Hund\n")
    (tmp_path / "ref.txt").write_text("ein Hund\n")
    target = tmp_path / "scores.json"
    result = subprocess.run([sys.executable, "-m", "nmt", "evaluate", "--hyp", str(tmp_path / "hyp.txt"),
                             "--ref", str(tmp_path / "ref.txt"), "--json", str(target)],
                            stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), cwd=REPO, timeout=300)
    assert "stdout is closed" in assert_one_error(result)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hyp.txt", "ref.txt"]


@pytest.mark.parametrize("option", ["--output", "--scores"])
def test_a_write_error_names_the_file_and_leaves_nothing(world, tmp_path, option):
    """Files may grow to 100 bytes only (RLIMIT_FSIZE, as a full disk would stop them): the error names
    the output being written, and neither it nor a temporary file is left."""
    import resource

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)         # EFBIG from write() instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    target = tmp_path / "out.txt"
    lines = b"ein Hund spielt im Park mit einem Ball\n" * 200
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(world["ckpt"]), "-q",
                             "--beam-size", "1", option, str(target)], input=lines, capture_output=True,
                            preexec_fn=small_files, cwd=REPO, timeout=300)
    line = assert_one_error(result)
    assert f"error: {target}: File too large" in line
    assert list(tmp_path.iterdir()) == []


def test_export_onto_a_full_disk_names_the_file(world, tmp_path):
    """torch.save turns a failed write into an opaque RuntimeError; the error still names the model file."""
    import resource

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    target = tmp_path / "model.nmt"
    result = subprocess.run([sys.executable, "-m", "nmt", "export", str(world["ckpt"]), "-o", str(target)],
                            capture_output=True, preexec_fn=small_files, cwd=REPO, timeout=300)
    assert f"cannot write {target}: File too large" in assert_one_error(result)
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stderr_loses_only_the_messages(world, tmp_path):
    """`nmt translate 2>&-`: progress and messages go nowhere, the translation is written as usual."""
    out = tmp_path / "out.txt"
    args = [sys.executable, "-m", "nmt", "translate", "-m", str(world["ckpt"]), "--beam-size", "1", "-o", str(out)]
    result = subprocess.run(args, input=b"ein Hund\n", preexec_fn=lambda: os.close(2), cwd=REPO, timeout=300)
    assert result.returncode == 0
    expected = run_cli("translate", "-m", str(world["ckpt"]), "-q", "--beam-size", "1", stdin=b"ein Hund\n").stdout
    assert out.read_bytes() == expected


def test_help_at_80_columns_names_every_option_in_full():
    """Every option of every command appears whole in its --help on an 80-column terminal."""
    import typer.main

    from nmt.cli.main import app

    group = typer.main.get_command(app)
    commands = [(name, cmd) for name, cmd in group.commands.items() if not hasattr(cmd, "commands")]
    commands += [(f"plot {name}", cmd) for name, cmd in group.commands["plot"].commands.items()]
    for name, command in commands:
        result = subprocess.run([sys.executable, "-m", "nmt", *name.split(), "--help"], capture_output=True,
                                text=True, env={**os.environ, "COLUMNS": "80"}, timeout=120)
        assert result.returncode == 0, result.stderr
        assert max(map(len, result.stdout.splitlines())) <= 80, name
        for option in (o for param in command.params for o in param.opts + param.secondary_opts):
            if option.startswith("-"):
                assert option in result.stdout, f"nmt {name} --help lacks {option}"


@pytest.mark.parametrize("target", ["nmt.cli.entry", "nmt.entry"])
def test_both_console_script_targets_give_one_error_line(target, tmp_path):
    """`nmt.entry:main` was the console script's target before the cli package: an install made then and not
    redone after an update still runs it, and a missing file is one `error:` line, exit 2, no traceback."""
    missing = tmp_path / "missing.yaml"
    code = f"import sys; sys.argv = ['nmt', 'train', '-c', {str(missing)!r}]; from {target} import main; main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: config file {missing} does not exist"]
