"""Kill/resume cycles: SIGINT/SIGTERM stop within 5 s with exit 130/143 and a usable last.pt; SIGKILL loses
at most the time since the last save; resuming continues, cleans leftovers and logs every step once.

Some runs go through a small wrapper that slows one function down (a checkpoint write, reading the
corpus, a translation batch), so that a signal lands exactly there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nmt.fs.folders import TEMP_SUFFIX
from nmt.train.checkpoint import load_checkpoint

from .conftest import make_config, nmt_server

REPO = Path(__file__).resolve().parents[1]
STOP_WITHIN = 5.0
SAVE_DELAY = 3                      # seconds slow_save adds to one write of last.pt



def slow_save(at: int) -> str:
    """A wrapper that makes the `at`-th write of last.pt take SAVE_DELAY s more, announced on stderr."""
    return f"""
import nmt.fs.folders as f
_commit, _count = f.PendingFile.commit, [0]
def commit(self, *args):
    if self.path.name == "last.pt":
        _count[0] += 1
        if _count[0] == {at}:
            print("SAVING", file=sys.stderr, flush=True)
            time.sleep({SAVE_DELAY})
    _commit(self, *args)
f.PendingFile.commit = commit
"""


SIGNAL_HANDLED = """
import signal as _signal
_install = _signal.signal
def _announcing(sig, handler):
    if callable(handler):
        inner = handler
        def handler(signum, frame):
            inner(signum, frame)       # the first signal returns; a second one raises before the print
            print("HANDLED", file=sys.stderr, flush=True)
    return _install(sig, handler)
_signal.signal = _announcing
"""

ANNOUNCE_VALIDATION = """
import nmt.train.trainer as tt
_validate = tt.Trainer.validate
def validate(self):
    print("VALIDATING", file=sys.stderr, flush=True)
    return _validate(self)
tt.Trainer.validate = validate
"""


def signal_in_update(n: int) -> str:
    """A wrapper that sends the process SIGTERM inside its `n`-th training update."""
    return f"""
import os, signal
import nmt.train.trainer as tt
_update, _calls = tt.Trainer._update, [0]
def update(self, *args, **kwargs):
    _calls[0] += 1
    if _calls[0] == {n}:
        os.kill(os.getpid(), signal.SIGTERM)
    return _update(self, *args, **kwargs)
tt.Trainer._update = update
"""


SLOW_READ = """
import nmt.fs.text as t
_iter = t.iter_lines
def iter_lines(stream, name):
    print("READING", file=sys.stderr, flush=True)
    time.sleep(3)
    yield from _iter(stream, name)
t.iter_lines = iter_lines
"""

SLOW_TRANSLATE = """
import nmt.decode.translator as tr
_translate = tr.Translator.translate
def translate(self, lines, *args, **kwargs):
    out = _translate(self, lines, *args, **kwargs)
    print("TRANSLATED", file=sys.stderr, flush=True)
    time.sleep(3)
    return out
tr.Translator.translate = translate
"""


def run_nmt(*args: str) -> subprocess.CompletedProcess:
    """`nmt ARGS` to its end, in its own process forked by the session's CliServer (no signal is sent to it)."""
    return nmt_server().run(*args, text=True)


def start(args: list[str], patch: str = "", stdin=None) -> subprocess.Popen:
    code = f"import sys, time\n{patch}\nfrom nmt.cli.main import main\nsys.argv = ['nmt', *{args!r}]\nmain()\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=stdin, cwd=REPO)


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def read_until(proc: subprocess.Popen, marker: str, timeout: float = 120.0) -> str:
    """Read the child's stderr until a line containing `marker`."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode("utf-8", "replace")
        assert line, "process ended early:\n" + "".join(seen)
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError("timed out:\n" + "".join(seen))


def stop(proc: subprocess.Popen, sig: int) -> tuple[int, float, str]:
    """Send `sig`; returns (exit code, seconds until exit, rest of stderr)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, time.monotonic() - sent, err.decode("utf-8", "replace")


def events(run: Path, kind: str) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e["step"] for e in map(json.loads, lines) if e["event"] == kind]


def train_args(prepared: Path, run: Path, **training) -> list[str]:
    args = ["train", "--config", str(prepared), "--set", f"training.run_dir={run}", "--set", "training.log_every=1",
            "--set", "training.threads=1"]      # threads busy-wait when other processes load the CPU
    for key, value in training.items():
        args += ["--set", f"training.{key}={value}"]
    return args


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def assert_steps_once(run: Path) -> list[int]:
    steps = events(run, "train")
    assert len(steps) == len(set(steps)) and steps == sorted(steps), steps
    validations = events(run, "validation")
    assert len(validations) == len(set(validations)), validations
    return steps


def test_sigint_in_a_training_step_then_resume(prepared, tmp_path):
    run = tmp_path / "run"
    proc = start(train_args(prepared, run, max_updates=100000, validate_every=100000))
    wait_for(lambda: (run / "metrics.jsonl").is_file() and len(events(run, "train")) >= 2)
    code, seconds, err = stop(proc, signal.SIGINT)
    assert code == 130 and seconds < STOP_WITHIN, (code, seconds, err)
    assert "Traceback" not in err
    step = load_checkpoint(run / "last.pt")["step"]
    assert step == max(events(run, "train")) and step >= 2          # saved at the update it stopped at
    assert temporaries(run) == []
    done = run_nmt(*train_args(prepared, run, max_updates=step + 2, validate_every=100000), "--resume")
    assert done.returncode == 0, done.stderr
    assert assert_steps_once(run) == list(range(1, step + 3))


def test_sigterm_during_validation_abandons_it(prepared, tmp_path):
    run = tmp_path / "run"
    # One sentence per validation batch and long greedy outputs: validation takes many seconds.
    proc = start([*train_args(prepared, run, max_updates=100000, validate_every=3, val_max_sentences=100,
                              val_batch_tokens=1),
                  "--set", "decoding.max_len_ratio=6"], ANNOUNCE_VALIDATION)
    read_until(proc, "VALIDATING")                          # inside validation at update 3
    code, seconds, err = stop(proc, signal.SIGTERM)
    assert code == 143 and seconds < STOP_WITHIN, (code, seconds, err)
    assert events(run, "validation") == []                   # abandoned, not finished
    state = load_checkpoint(run / "last.pt")
    assert state["step"] == 3 and state["progress"]["validation_due"]
    assert not (run / "best.pt").exists() and temporaries(run) == []
    # --resume owes the run that validation: it comes first, then training goes on
    done = run_nmt(*train_args(prepared, run, max_updates=4, validate_every=3, val_max_sentences=100),
                   "--set", "decoding.max_len_ratio=6", "--resume")       # as scored before; larger batches
    assert done.returncode == 0, done.stderr
    assert events(run, "validation") == [3, 4] and (run / "best.pt").exists()
    assert not load_checkpoint(run / "last.pt")["progress"]["validation_due"]


def resume_owed_validation(prepared: Path, run: Path, *extra: str, **training) -> None:
    """--resume runs the validation the stopped run owes, once; a second --resume has nothing left to do."""
    step = load_checkpoint(run / "last.pt")["step"]
    args = [*train_args(prepared, run, **training), *extra, "--resume"]
    done = run_nmt(*args)
    assert done.returncode == 0, done.stderr
    assert events(run, "validation") == [step] and (run / "best.pt").exists()
    assert not load_checkpoint(run / "last.pt")["progress"]["validation_due"]
    again = run_nmt(*args)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr
    assert events(run, "validation") == [step]


@pytest.mark.parametrize("budget", [{"max_updates": 3}, {"max_updates": 100000, "max_epochs": 1}])
def test_sigterm_during_the_budget_end_validation_leaves_it_owed(prepared, tmp_path, budget):
    run = tmp_path / "run"
    proc = start([*train_args(prepared, run, validate_every=100000, val_max_sentences=100, val_batch_tokens=1,
                              **budget), "--set", "decoding.max_len_ratio=6"], ANNOUNCE_VALIDATION)
    read_until(proc, "VALIDATING")                          # the validation that ends the budget
    code, seconds, err = stop(proc, signal.SIGTERM)
    assert code == 143 and seconds < STOP_WITHIN, (code, seconds, err)
    state = load_checkpoint(run / "last.pt")
    assert state["progress"]["validation_due"] and events(run, "validation") == []
    resume_owed_validation(prepared, run, "--set", "decoding.max_len_ratio=6", validate_every=100000,
                           val_max_sentences=100, **budget)


def test_sigterm_in_the_last_update_leaves_the_final_validation_owed(prepared, tmp_path):
    run = tmp_path / "run"
    proc = start(train_args(prepared, run, max_updates=3, validate_every=100000), signal_in_update(3))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err.decode()
    state = load_checkpoint(run / "last.pt")
    assert state["step"] == 3 and state["progress"]["validation_due"] and events(run, "validation") == []
    # A run that owes a validation reads the dev set: a changed data folder is refused, as for training on.
    manifest = run / "data_manifest.json"
    recorded = manifest.read_text()
    manifest.write_text(json.dumps({**json.loads(recorded), "fingerprint": "other"}))
    refused = run_nmt(*train_args(prepared, run, max_updates=3, validate_every=100000), "--resume")
    assert refused.returncode == 2 and "holds other data" in refused.stderr, refused.stderr
    manifest.write_text(recorded)
    resume_owed_validation(prepared, run, max_updates=3, validate_every=100000)


def test_a_run_validated_at_the_end_of_its_last_epoch_is_not_validated_again_on_resume(prepared, tmp_path):
    from nmt.config import load_config
    from nmt.train.trainer import Trainer

    probe = Trainer(load_config(prepared, [f"training.run_dir={tmp_path / 'probe'}"]))
    updates = len(probe.sampler.batches(0))                  # max_updates runs out with the first epoch's batches
    probe.close()
    run = tmp_path / "run"
    args = train_args(prepared, run, max_epochs=1, validate_every=100000, val_max_sentences=5)
    first = run_nmt(*args, "--set", f"training.max_updates={updates}")
    assert first.returncode == 0, first.stderr
    assert events(run, "validation") == [updates]
    more = run_nmt(*args, "--set", f"training.max_updates={updates + 5}", "--resume")
    assert more.returncode == 0, more.stderr
    assert events(run, "validation") == [updates] and load_checkpoint(run / "last.pt")["step"] == updates


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_a_checkpoint_write_lets_it_finish(prepared, tmp_path, sig):
    run = tmp_path / "run"
    proc = start(train_args(prepared, run, max_updates=100000, validate_every=100000, save_every=2), slow_save(1))
    read_until(proc, "SAVING")
    code, seconds, err = stop(proc, sig)
    assert code == 128 + sig and seconds < SAVE_DELAY + STOP_WITHIN, (code, seconds, err)   # the write goes on
    state = load_checkpoint(run / "last.pt")                  # complete, and at the update it stopped at
    assert state["step"] == max(events(run, "train"))
    assert temporaries(run) == []


def test_second_signal_during_a_write_gives_up_at_once(prepared, tmp_path):
    run = tmp_path / "run"
    proc = start(train_args(prepared, run, max_updates=100000, validate_every=100000, save_every=2),
                 slow_save(1) + SIGNAL_HANDLED)
    read_until(proc, "SAVING")
    proc.send_signal(signal.SIGTERM)
    read_until(proc, "HANDLED")                             # two signals at once would arrive as one
    code, seconds, err = stop(proc, signal.SIGTERM)
    assert code == 143 and seconds < STOP_WITHIN, (code, seconds, err)
    assert "Traceback" not in err
    assert temporaries(run) == [] and not (run / "last.pt").exists()     # the first save was abandoned


def test_sigkill_during_a_save_then_resume_cleans_up(prepared, tmp_path):
    run = tmp_path / "run"
    proc = start(train_args(prepared, run, max_updates=100000, validate_every=100000, save_every=2), slow_save(2))
    read_until(proc, "SAVING")                               # the second save: a first last.pt exists
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert len(temporaries(run)) == 1                        # the write the kill cut short
    saved = load_checkpoint(run / "last.pt")["step"]
    assert saved == 2
    done = run_nmt(*train_args(prepared, run, max_updates=saved + 3, validate_every=100000), "--resume")
    assert done.returncode == 0, done.stderr
    assert temporaries(run) == []
    assert load_checkpoint(run / "last.pt")["step"] == saved + 3
    assert assert_steps_once(run) == list(range(1, saved + 4))


def test_sigkill_loses_at_most_save_every_minutes(prepared, tmp_path):
    run = tmp_path / "run"
    proc = start(train_args(prepared, run, max_updates=100000, validate_every=100000, save_every_minutes=0.005))
    wait_for(lambda: (run / "last.pt").is_file() and len(events(run, "train")) >= 4)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    saved = load_checkpoint(run / "last.pt")["step"]
    assert saved >= 1                         # written by the clock alone: no validation, no save_every
    assert max(events(run, "train")) >= saved
    done = run_nmt(*train_args(prepared, run, max_updates=saved + 2, validate_every=100000), "--resume")
    assert done.returncode == 0, done.stderr
    assert assert_steps_once(run) == list(range(1, saved + 3))


def test_finished_run_says_so_and_resume_applies_safe_changes(prepared, tmp_path):
    run = tmp_path / "run"
    args = train_args(prepared, run, max_updates=3, validate_every=3, val_max_sentences=5)
    first = run_nmt(*args)
    assert first.returncode == 0, first.stderr
    before = (run / "last.pt").read_bytes(), (run / "metrics.jsonl").read_bytes()
    again = run_nmt(*args, "--resume")
    assert again.returncode == 0, again.stderr
    assert "already finished at update 3" in again.stderr
    assert ((run / "last.pt").read_bytes(), (run / "metrics.jsonl").read_bytes()) == before
    more = run_nmt(*args, "--resume", "--set", "training.max_updates=5", "--set", "training.lr=0.0005")
    assert more.returncode == 0, more.stderr
    assert "training.lr 0.003 -> 0.0005" in more.stderr and "training.max_updates 3 -> 5" in more.stderr
    saved = yaml.safe_load((run / "config.yaml").read_text())["training"]
    assert saved["lr"] == 0.0005 and saved["max_updates"] == 5
    assert load_checkpoint(run / "last.pt")["step"] == 5
    assert assert_steps_once(run) == [1, 2, 3, 4, 5]

    # The data folder changed since (e.g. rebuilt by a newer nmt): a finished run still says it is done,
    # one that would train on refuses with one line.
    recorded = json.loads((run / "data_manifest.json").read_text())
    (run / "data_manifest.json").write_text(json.dumps({**recorded, "fingerprint": "other"}))
    resume = [*args, "--resume", "--set", "training.lr=0.0005"]
    done = run_nmt(*resume, "--set", "training.max_updates=5")
    assert done.returncode == 0 and "already finished at update 5" in done.stderr, done.stderr
    refused = run_nmt(*resume, "--set", "training.max_updates=6")
    assert refused.returncode == 2 and "holds other data" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and load_checkpoint(run / "last.pt")["step"] == 5
    assert yaml.safe_load((run / "config.yaml").read_text())["training"]["max_updates"] == 5   # not recorded


def test_sigterm_in_preprocess_leaves_nothing(tmp_path, corpus_dir):
    config = make_config(tmp_path, corpus_dir)
    out = tmp_path / "data"
    proc = start(["preprocess", "--config", str(config)], SLOW_READ)
    read_until(proc, "READING")
    code, seconds, err = stop(proc, signal.SIGTERM)
    assert code == 143 and seconds < STOP_WITHIN, (code, seconds, err)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_sigint_in_translate_writes_no_output(trained_run, tmp_path):
    out = tmp_path / "out.en"
    out.write_text("previous\n")
    source = tmp_path / "in.de"
    source.write_text("ein Hund\n" * 50)
    proc = start(["translate", "--checkpoint", str(trained_run / "best.pt"), "-i", str(source), "-o", str(out),
                  "-q", "--beam-size", "1", "--threads", "1"], SLOW_TRANSLATE)
    read_until(proc, "TRANSLATED")
    code, seconds, err = stop(proc, signal.SIGINT)
    assert code == 130 and seconds < STOP_WITHIN, (code, seconds, err)
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "out.en"]


SLOW_TYPER_IMPORT = """
import importlib.abc, sys, time
class SlowTyper(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "typer":
            print("IMPORTING", file=sys.stderr, flush=True)
            time.sleep(30)
        return None
sys.meta_path.insert(0, SlowTyper())
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_console_script_imports_exits_quietly(sig):
    """The installed `nmt` script's target, slowed down while it imports the command line: no traceback."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "nmt"]
    module, _, function = script.value.partition(":")
    code = f"{SLOW_TYPER_IMPORT}\nimport {module}\nsys.argv = ['nmt', '--version']\n{module}.{function}()\n"
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, cwd=REPO)
    assert process.stderr.readline() == b"IMPORTING\n"
    start = time.monotonic()
    process.send_signal(sig)
    _, err = process.communicate(timeout=STOP_WITHIN)
    assert time.monotonic() - start < STOP_WITHIN
    assert process.returncode == 128 + sig, err
    assert b"Traceback" not in err
    assert err.decode().splitlines() == [f"interrupted ({signal.Signals(sig).name})"]


@pytest.mark.parametrize("options", [["--beam-size", "3"], ["--sampling"]])
def test_a_reader_that_stops_early_ends_translate_as_it_ends_yes(trained_run, tmp_path, options):
    """`nmt translate | head -1`: the writes after head has gone fail (3-best lists of 2,000 lines are more
    than a pipe holds), and translate ends silently with the status `yes | head -1` gives `yes` (killed by
    SIGPIPE: 141), not 1."""
    err = tmp_path / "stderr"
    script = f"""
yes | head -1 > /dev/null; expected=${{PIPESTATUS[0]}}
for i in $(seq 2000); do echo "Zwei Männer spielen Fußball."; done \\
  | "{sys.executable}" -m nmt translate -m "{trained_run / 'best.pt'}" --device cpu --threads 1 -q \\
    --n-best 3 --max-len 3 {' '.join(options)} 2> "{err}" | head -1
echo "$expected ${{PIPESTATUS[1]}}"
"""
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    first, statuses = result.stdout.splitlines()
    assert first.strip()                                          # head got its line
    expected, status = statuses.split()
    assert expected == "141" and status == expected, (statuses, err.read_text())
    assert err.read_text() == ""
