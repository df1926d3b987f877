import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from nmt.config import ConfigError, load_config
from nmt.device import autocast_dtype
from nmt.train.checkpoint import CheckpointError, load_checkpoint
from nmt.train.trainer import RunDirError, Trainer

from .conftest import link_marker, nmt_server


def config_for(prepared, run_dir, **training):
    overrides = [f"training.run_dir={run_dir}"] + [f"training.{k}={v}" for k, v in training.items()]
    return load_config(prepared, overrides)


def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True, **kwargs)


def test_max_minutes_bounds_the_whole_command(prepared, tmp_path):
    """`training.max_minutes` bounds `nmt train` from the process's start to its exit: start-up, the last
    validation and the last checkpoint included, not only the updates. (Start-up alone took up to 30 s on a
    busy 2-core machine, hence 45 s.) Validation is not scheduled within the budget: the time kept for the
    last one comes from the estimate before it."""
    budget = 45.0
    start = time.monotonic()
    result = run_cli("train", "--config", str(prepared), "--set", f"training.run_dir={tmp_path / 'run'}",
                     "--set", f"training.max_minutes={budget / 60}", "--set", "training.max_updates=0",
                     "--set", "training.validate_every=100000", "--set", "training.threads=1", timeout=300)
    wall = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert "(max_minutes)" in result.stderr
    assert 0.8 * budget <= wall <= 1.05 * budget, wall
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = events[-1]
    assert last["event"] == "validation" and last["step"] >= 1 and last["wall_time"] <= budget
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == last["step"]


def test_train_events_report_the_padding_of_the_logged_batches(prepared, tmp_path):
    """src_padding and tgt_padding: PAD positions / all positions of the window's padded batch tensors."""
    run = tmp_path / "run"
    trainer = Trainer(config_for(prepared, run, max_updates=6, log_every=3, validate_every=100000,
                                 val_max_sentences=5))
    batches = [trainer.train_ids.collate(rows) for rows in trainer.sampler.batches(0)[:6]]
    trainer.train()
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in train] == [3, 6]
    for event, window in zip(train, (batches[:3], batches[3:]), strict=True):
        src_real = sum(int((b.src != 0).sum()) for b in window)
        tgt_real = sum(int((b.tgt_out != 0).sum()) for b in window)
        src_cells, tgt_cells = sum(b.src.numel() for b in window), sum(b.tgt_out.numel() for b in window)
        assert event["src_padding"] == pytest.approx(1 - src_real / src_cells)
        assert event["tgt_padding"] == pytest.approx(1 - tgt_real / tgt_cells)
        assert 0 < event["src_padding"] < 1 and 0 < event["tgt_padding"] < 1


def test_resume_reaches_the_same_parameters(prepared, tmp_path):
    settings = dict(max_updates=8, validate_every=3, val_max_sentences=10, log_every=2)
    straight = Trainer(config_for(prepared, tmp_path / "a", **settings))
    straight.train()

    half = Trainer(config_for(prepared, tmp_path / "b", **{**settings, "max_updates": 4}))
    half.train()
    del half
    resumed = Trainer(config_for(prepared, tmp_path / "b", **settings), resume=True)
    assert resumed.progress.step == 4
    resumed.train()

    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert load_checkpoint(tmp_path / "b" / "last.pt")["step"] == 8


def deterministic_runs(prepared, folder, *settings: str) -> tuple[dict, dict]:
    """`nmt train` with deterministic kernels for 6 updates straight (run a), and for 3 then resumed to 6
    (run b), each in its own process (tests/cli_server.py): the switch is process-wide. Their last.pt."""
    common = ["-c", str(prepared), "--set", "training.deterministic=true", "--set", "training.validate_every=3",
              "--set", "training.val_max_sentences=10", *[item for s in settings for item in ("--set", s)]]
    for run, updates, extra in (("a", 6, []), ("b", 3, []), ("b", 6, ["--resume"])):
        result = nmt_server().run("train", *common, "--set", f"training.run_dir={folder / run}",
                                  "--set", f"training.max_updates={updates}", *extra, text=True)
        assert result.returncode == 0, result.stderr
    return load_checkpoint(folder / "a" / "last.pt"), load_checkpoint(folder / "b" / "last.pt")


def test_deterministic_kernels_train_and_resume_exactly(prepared, tmp_path):
    """Every op a run uses must have a deterministic kernel, and resuming repeats the straight run."""
    a, b = deterministic_runs(prepared, tmp_path, "training.threads=1")
    assert a["step"] == b["step"] == 6
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_auto_precision_is_float32_on_cuda_without_graphs_and_explicit_ones_are_kept():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")       # no GPU needed: only the choice is checked
    assert autocast_dtype("auto", cuda) is None                 # eager: measured faster than bf16 autocast
    assert autocast_dtype("fp32", cuda, graphed=True) is None
    assert autocast_dtype("fp16", cuda) == torch.float16
    assert autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("bf16", cpu) == torch.bfloat16


def test_run_writes_checkpoints_and_metrics(prepared, tmp_path):
    trainer = Trainer(config_for(prepared, tmp_path / "run", max_updates=6, validate_every=3, val_max_sentences=10,
                                 log_every=2, keep_best=1))
    trainer.train()
    run = tmp_path / "run"
    for name in ("last.pt", "best.pt", "config.yaml", "metrics.jsonl", "spm.model", "tgt.pieces"):
        assert (run / name).is_file(), name
    assert len(list(run.glob("best-step*.pt"))) == 1      # keep_best: 1
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validations = [e for e in events if e["event"] == "validation"]
    assert [v["step"] for v in validations] == [3, 6]
    assert all({"loss", "ppl", "bleu"} <= v.keys() for v in validations)
    assert [e["step"] for e in events if e["event"] == "train"] == [2, 4, 6]
    state = load_checkpoint(run / "last.pt")
    assert state["cursor"]["batch"] == 6 and state["step"] == 6
    assert yaml.safe_load((run / "config.yaml").read_text())["training"]["max_updates"] == 6


def test_non_empty_run_folder_is_refused(prepared, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=f"run folder {run} is not empty; pass --resume"):
        Trainer(config_for(prepared, run))
    result = run_cli("train", "--config", str(prepared), "--set", f"training.run_dir={run}")
    assert result.returncode == 2 and "is not empty" in result.stderr
    assert (run / "notes.txt").read_text() == "mine" and sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_a_run_that_stopped_before_its_first_checkpoint_says_to_start_over(prepared, tmp_path):
    run = tmp_path / "run"
    Trainer(config_for(prepared, run, max_updates=1, validate_every=100)).close()   # the folder, no update
    assert (run / "config.yaml").is_file() and not (run / "last.pt").exists()
    with pytest.raises(RunDirError, match="holds no last.pt to resume .* pass --overwrite to start over"):
        Trainer(config_for(prepared, run))
    Trainer(config_for(prepared, run, max_updates=1, validate_every=100), overwrite=True).train()
    assert (run / "last.pt").is_file()


def test_resume_without_checkpoint_is_refused(prepared, tmp_path):
    with pytest.raises(RunDirError, match="cannot resume"):
        Trainer(config_for(prepared, tmp_path / "empty"), resume=True)


def test_corrupt_and_incompatible_checkpoints_are_refused(prepared, tmp_path):
    Trainer(config_for(prepared, tmp_path / "run", max_updates=2, validate_every=2, val_max_sentences=5)).train()
    last = tmp_path / "run" / "last.pt"
    good = last.read_bytes()

    last.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        load_checkpoint(last)
    result = run_cli("train", "--config", str(prepared), "--set", f"training.run_dir={tmp_path / 'run'}", "--resume")
    assert result.returncode == 2 and "truncated or corrupt" in result.stderr.strip().splitlines()[-1]

    last.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        load_checkpoint(last)

    state = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    state["format"] = 999
    torch.save(state, last)
    with pytest.raises(CheckpointError, match="has format 999"):
        load_checkpoint(last)

    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_sigterm_saves_last_checkpoint_and_exits_143(prepared, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "train", "--config", str(prepared), "--set", f"training.run_dir={run}",
         "--set", "training.max_updates=100000", "--set", "training.log_every=1",
         "--set", "training.validate_every=100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "metrics.jsonl").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "training did not start"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "SIGTERM" in err
    state = load_checkpoint(run / "last.pt")
    assert 0 < state["step"] < 100000


def saves_that(monkeypatch, on_save) -> None:
    """Call `on_save(number)` before each write of last.pt, counted from 1."""
    from nmt.train import trainer

    original, count = trainer.save_checkpoint, [0]

    def save(path, state, *args, **kwargs):
        if path.name == "last.pt":
            count[0] += 1
            on_save(count[0])
        original(path, state, *args, **kwargs)
    monkeypatch.setattr(trainer, "save_checkpoint", save)


def stop_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("training stopped at update")]


def test_an_error_during_a_save_prints_no_stop_reason(prepared, tmp_path, monkeypatch, capsys):
    """Before, the loop's default "(max_epochs)" was printed above the error that really ended the run."""
    def full(number):
        if number == 2:
            raise CheckpointError("cannot write checkpoint last.pt (No space left on device)")
    saves_that(monkeypatch, full)
    with pytest.raises(CheckpointError, match="No space left"):
        Trainer(config_for(prepared, tmp_path / "run", max_updates=5, validate_every=100, save_every=1)).train()
    assert stop_lines(capsys.readouterr().err) == []


def test_a_signal_during_the_final_validation_is_the_stop_reason(prepared, tmp_path, monkeypatch, capsys):
    """max_updates was reached, but the signal abandoned the validation that ends it: that one is owed."""
    from nmt.train import validation

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)          # the Trainer's handler abandons the validation at once
        raise AssertionError("the validation went on after the signal")
    monkeypatch.setattr(validation, "evaluate_dev", interrupted)
    trainer = Trainer(config_for(prepared, tmp_path / "run", max_updates=2, validate_every=100))
    trainer.train()
    assert trainer.stop_signal == signal.SIGINT
    assert load_checkpoint(tmp_path / "run" / "last.pt")["progress"]["validation_due"]
    assert stop_lines(capsys.readouterr().err) == [
        f"training stopped at update 2 (interrupted: SIGINT; the last validation is owed, --resume runs it); "
        f"checkpoints in {tmp_path / 'run'}"]


def test_a_second_signal_during_a_save_is_the_stop_reason(prepared, tmp_path, monkeypatch, capsys):
    def twice(number):
        if number == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)     # gives up at once: KeyboardInterrupt
    saves_that(monkeypatch, twice)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config_for(prepared, tmp_path / "run", max_updates=5, validate_every=100, save_every=1)).train()
    lines = stop_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "(interrupted: SIGTERM, then a second signal: gave up at once;" in lines[0], lines
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 1      # the second save never began


def test_a_failed_checkpoint_write_says_a_previous_one_is_unchanged_only_where_there_was_one(
        prepared, tmp_path, monkeypatch):
    import errno

    from nmt.train.checkpoint import save_checkpoint

    run = tmp_path / "run"
    Trainer(config_for(prepared, run, max_updates=1, validate_every=100)).train()
    state, before = load_checkpoint(run / "last.pt"), (run / "last.pt").read_bytes()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(CheckpointError, match=r"\(No space left\); the previous one is unchanged$"):
        save_checkpoint(run / "last.pt", state)
    assert (run / "last.pt").read_bytes() == before
    with pytest.raises(CheckpointError) as refused:
        save_checkpoint(run / "best-step9.pt", state)
    assert str(refused.value).endswith("(No space left); nothing was written"), refused.value
    assert not (run / "best-step9.pt").exists()


def test_cli_smoke_train(prepared, tmp_path):
    run = tmp_path / "cli_run"
    result = run_cli("train", "--config", str(prepared), "--set", f"training.run_dir={run}",
                     "--set", "training.max_updates=4", "--set", "training.validate_every=2")
    assert result.returncode == 0, result.stderr
    assert (run / "best.pt").is_file() and (run / "metrics.jsonl").is_file()
    assert "validation @ 2" in result.stderr and "BLEU" in result.stderr


def test_plateau_schedule_and_teacher_forcing_decay():
    from nmt.config import TrainingConfig
    from nmt.train.schedules import LrSchedule, teacher_forcing_ratio

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    config = TrainingConfig(lr=1.0, lr_schedule="plateau", plateau_patience=1, plateau_factor=0.5)
    schedule = LrSchedule(optimizer, config)
    for score in (10.0, 9.0, 8.0):          # one improvement, then two bad validations > patience 1
        schedule.on_validation(score, higher_is_better=True)
    assert schedule.step(5) == 0.5 and optimizer.param_groups[0]["lr"] == 0.5
    warm = LrSchedule(optimizer, TrainingConfig(lr=1.0, lr_schedule="inverse_sqrt", warmup_updates=100))
    assert warm.lr_at(50) == 0.5 and warm.lr_at(100) == 1.0 and warm.lr_at(400) == 0.5
    linear = TrainingConfig(teacher_forcing=1.0, teacher_forcing_schedule="linear", teacher_forcing_min=0.5,
                            teacher_forcing_decay_updates=100)
    assert teacher_forcing_ratio(linear, 0) == 1.0 and teacher_forcing_ratio(linear, 50) == 0.75
    assert teacher_forcing_ratio(linear, 1000) == 0.5


def test_budget_schedule_decays_over_whichever_budget_is_further_spent():
    from nmt.config import ConfigError, TrainingConfig
    from nmt.train.schedules import LrSchedule

    optimizer = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    by_updates = LrSchedule(optimizer, TrainingConfig(lr=1.0, lr_schedule="budget", max_updates=100, min_lr=0.0))
    assert by_updates.lr_at(1) == pytest.approx(1.0, abs=1e-3)
    assert by_updates.lr_at(50) == pytest.approx(0.5) and by_updates.lr_at(100) == pytest.approx(0.0)
    both = LrSchedule(optimizer, TrainingConfig(lr=1.0, lr_schedule="budget", max_updates=100, max_minutes=30,
                                                min_lr=0.1, warmup_updates=10))
    assert both.lr_at(5, minutes=0.1) == pytest.approx(0.5, abs=0.01)          # the warm-up ramp first
    assert both.lr_at(20, minutes=15) == pytest.approx(0.55)                  # half the time: halfway to min_lr
    assert both.lr_at(20, minutes=45) == pytest.approx(0.1)                   # past the budget: min_lr
    assert both.step(20, minutes=15) == optimizer.param_groups[0]["lr"] == pytest.approx(0.55)
    with pytest.raises(ConfigError, match="training.max_minutes or training.max_updates"):
        LrSchedule(optimizer, TrainingConfig(lr=1.0, lr_schedule="budget"))


def test_a_budgeted_run_ends_at_min_lr(prepared, tmp_path):
    trainer = Trainer(config_for(prepared, tmp_path / "run", lr_schedule="budget", lr=0.003, min_lr=0.0001,
                                 max_updates=8, log_every=2, validate_every=100))
    trainer.train()
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [e["lr"] for e in events if e["event"] == "train"]
    assert len(lrs) == 4 and lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(0.0001)


def test_early_stopping_after_patience(prepared, tmp_path):
    # With a vanishing learning rate the dev BLEU cannot improve, so patience 1 stops at the 2nd validation.
    trainer = Trainer(config_for(prepared, tmp_path / "run", lr=1e-12, max_updates=50, validate_every=2,
                                 val_max_sentences=10, patience=1, early_stopping_metric="bleu"))
    trainer.train()
    assert trainer.progress.step == 4
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["best"] for e in events if e["event"] == "validation"] == [True, False]


def test_plateau_schedule_ends_training_below_min_lr(prepared, tmp_path):
    # Dev BLEU cannot improve at a vanishing lr, so every validation after the first decays it (patience 0);
    # 1e-12 -> 5e-13 -> 2.5e-13 < min_lr 3e-13 ends the run at the 3rd validation, long before max_updates.
    settings = dict(lr=1e-12, lr_schedule="plateau", plateau_patience=0, plateau_factor=0.5, min_lr=3e-13,
                    max_updates=50, validate_every=2, val_max_sentences=10)
    trainer = Trainer(config_for(prepared, tmp_path / "run", **settings))
    trainer.train()
    assert trainer.progress.step == 6
    again = Trainer(config_for(prepared, tmp_path / "run", **settings), resume=True)
    assert "below min_lr" in (again.finished_reason() or "")
    again.close()


def test_sigkill_then_resume_continues_from_last_checkpoint(prepared, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--config", str(prepared), "--set", f"training.run_dir={run}", "--set", "training.save_every=2",
            "--set", "training.validate_every=100000", "--set", "training.log_every=1"]
    proc = subprocess.Popen([sys.executable, "-m", "nmt", *args, "--set", "training.max_updates=100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (run / "last.pt").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint was saved"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = load_checkpoint(run / "last.pt")["step"]
    assert saved >= 2 and saved % 2 == 0
    result = run_cli(*args, "--set", f"training.max_updates={saved + 3}", "--resume")
    assert result.returncode == 0, result.stderr
    assert load_checkpoint(run / "last.pt")["step"] == saved + 3


def test_resume_applies_the_optimizer_settings_and_refuses_a_new_optimizer(prepared, tmp_path):
    run = tmp_path / "run"
    Trainer(config_for(prepared, run, max_updates=2, validate_every=100)).train()
    again = Trainer(config_for(prepared, run, max_updates=3, validate_every=100, weight_decay=0.1,
                               adam_betas="[0.5, 0.9]"), resume=True)
    assert all(g["weight_decay"] == 0.1 and tuple(g["betas"]) == (0.5, 0.9) for g in again.optimizer.param_groups)
    again.close()
    for key, value in (("optimizer", "adamw"), ("early_stopping_metric", "loss")):
        with pytest.raises(RunDirError, match=f"--resume cannot change `training.{key}`"):
            Trainer(config_for(prepared, run, max_updates=3, validate_every=100, **{key: value}), resume=True)


def test_resume_refuses_a_new_parent_and_keeps_its_own(prepared, tmp_path):
    """The weights came from the first parent: another one (or one for a run that had none) is refused and
    recorded nowhere; leaving the keys unset, as `--resume` without `--init-from` does, keeps the run's own."""
    settings = dict(max_updates=1, validate_every=100)
    parent, run, child = tmp_path / "parent", tmp_path / "run", tmp_path / "child"
    for folder in (parent, run):
        Trainer(config_for(prepared, folder, **settings)).train()
    Trainer(config_for(prepared, child, **settings, init_from=parent / "last.pt", init_optimizer="true")).train()
    recorded = {folder: [(folder / n).read_bytes() for n in ("config.yaml", "last.pt")] for folder in (run, child)}
    with pytest.raises(ConfigError, match="`training.init_optimizer` does not apply with `training.init_from` unset"):
        config_for(prepared, run, max_updates=2, init_optimizer="true")      # refused before any folder is read
    for folder, key, value in ((run, "init_from", parent / "last.pt"), (child, "init_from", run / "last.pt")):
        with pytest.raises(RunDirError, match=f"--resume cannot change `training.{key}`.*first parent"):
            Trainer(config_for(prepared, folder, max_updates=2, **{key: value}), resume=True)
        assert [(folder / n).read_bytes() for n in ("config.yaml", "last.pt")] == recorded[folder]
    Trainer(config_for(prepared, child, max_updates=2), resume=True).train()
    kept = load_config(child / "config.yaml").training
    assert (kept.init_from, kept.init_optimizer) == (str(parent / "last.pt"), True)
    assert load_checkpoint(child / "last.pt")["step"] == 2


def test_resume_refuses_another_way_of_scoring_validations(prepared, tmp_path):
    """best.pt, the kept best checkpoints, patience and the plateau schedule compare dev scores: all of them
    must come from the same greedy outputs of the same dev sentences, scored alike."""
    run = tmp_path / "run"
    Trainer(config_for(prepared, run, max_updates=1, validate_every=100)).train()
    recorded = [(run / name).read_bytes() for name in ("config.yaml", "last.pt")]
    changes = {"training.bleu_tokenize": "char", "training.bleu_lowercase": "true",
               "training.val_max_sentences": 7, "decoding.max_len_ratio": 1.2, "decoding.min_len": 0}
    for key, value in changes.items():
        config = load_config(prepared, [f"training.run_dir={run}", "training.max_updates=2", f"{key}={value}"])
        with pytest.raises(RunDirError, match=f"--resume cannot change `{key}`.*on one scale"):
            Trainer(config, resume=True)
    assert [(run / name).read_bytes() for name in ("config.yaml", "last.pt")] == recorded


def test_the_logged_loss_window_survives_a_resume(prepared, tmp_path):
    settings = dict(validate_every=100, log_every=3, save_every=1)
    Trainer(config_for(prepared, tmp_path / "straight", max_updates=6, **settings)).train()
    Trainer(config_for(prepared, tmp_path / "split", max_updates=4, **settings)).train()
    Trainer(config_for(prepared, tmp_path / "split", max_updates=6, **settings), resume=True).train()

    def losses(run):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return {e["step"]: e["loss"] for e in map(json.loads, lines) if e["event"] == "train"}
    straight, split = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert list(split) == [3, 6] and split == pytest.approx(straight, rel=1e-6)


def test_validation_bleu_reads_references_as_nmt_evaluate_does(prepared, tmp_path, monkeypatch):
    trainer = Trainer(config_for(prepared, tmp_path / "run", val_max_sentences=6, max_updates=1))
    refs = [f"sentence {i} of the references ends here" for i in range(6)]
    refs[0] = "the first one has a lone\r inside it"                       # not a line break for nmt
    ref_file = tmp_path / "dev.ref"
    ref_file.write_bytes("\n".join(refs).encode() + b"\n")
    monkeypatch.setattr(trainer.data, "reference_path", lambda split: ref_file)
    monkeypatch.setattr(trainer.tgt_vocab, "decode", lambda ids: refs[: len(ids)])   # perfect translations
    assert trainer.validate()["bleu"] == pytest.approx(100.0)
    trainer.close()


def test_validation_refuses_a_reference_file_shorter_than_the_dev_set(prepared, tmp_path, monkeypatch):
    """sacreBLEU would score the common prefix; a damaged data folder is an error naming the file."""
    from nmt.data.corpus import DataError

    trainer = Trainer(config_for(prepared, tmp_path / "run", val_max_sentences=6, max_updates=1))
    ref_file = tmp_path / "dev.ref"
    ref_file.write_text("only\nfour\nlines\nhere\n")
    monkeypatch.setattr(trainer.data, "reference_path", lambda split: ref_file)
    with pytest.raises(DataError, match=f"{ref_file} has 4 lines for 6 dev pairs"):
        trainer.validate()
    trainer.close()


def test_the_end_of_the_last_epoch_is_validated_like_any_budget_end(prepared, tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(config_for(prepared, run, max_epochs=1, validate_every=100000, val_max_sentences=5))
    trainer.train()
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last_step = trainer.progress.step
    assert [e["step"] for e in events if e["event"] == "validation"] == [last_step] and (run / "best.pt").exists()


def test_resume_never_rewrites_a_linked_metrics_file(prepared, tmp_path):
    run = tmp_path / "run"
    Trainer(config_for(prepared, run, max_updates=2, validate_every=2, val_max_sentences=5)).train()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(victim)
    result = nmt_server().run("train", "--config", str(prepared), "--set", f"training.run_dir={run}",
                              "--set", "training.max_updates=4", "--resume", text=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1].startswith("error: ") and "symbolic links (metrics.jsonl)" in lines[-1]
    assert victim.read_text() == "mine\n" and (run / "metrics.jsonl").is_symlink()


def test_a_run_folder_whose_marker_is_a_link_is_refused(prepared, tmp_path):
    run = tmp_path / "run"
    victim = link_marker(run)
    result = nmt_server().run("train", "--config", str(prepared), "--set", f"training.run_dir={run}",
                              "--set", "training.max_updates=2", "--overwrite", text=True)
    assert result.returncode == 2 and "is a symbolic link" in result.stderr.strip().splitlines()[-1]
    assert victim.read_text() == "mine\n" and [p.name for p in run.iterdir()] == [".nmt-folder.json"]


def test_resume_deletes_no_file_a_checkpoint_names_outside_its_run_folder(prepared, tmp_path):
    run = tmp_path / "run"
    Trainer(config_for(prepared, run, max_updates=2, validate_every=2, val_max_sentences=5)).train()
    victims = [tmp_path / "victim.txt", tmp_path / "absolute.txt"]
    for victim in victims:
        victim.write_text("mine\n")
    state = torch.load(run / "last.pt", weights_only=True)
    for name in ("../victim.txt", str(victims[1]), "config.yaml"):
        state["progress"]["best_k"] = [[9.0, name]] * 3         # each would drop out at the next validation
        torch.save(state, run / "last.pt")
        with pytest.raises(CheckpointError, match="progress.best_k names"):
            Trainer(config_for(prepared, run, max_updates=4, validate_every=1, val_max_sentences=5,
                               keep_best=1), resume=True).train()
    assert all(victim.read_text() == "mine\n" for victim in victims) and (run / "config.yaml").is_file()
