"""Bounds on numbers and sizes read from the user: options, config keys, --set, stored configs, the server,
input lines, scores. Each value past a bound is one `error:` line naming it and exit 2, before any work."""

from __future__ import annotations

import errno
import io
import re
from pathlib import Path

import numpy as np
import pytest

from nmt import evaluate as ev
from nmt.config import ConfigError, load_config
from nmt.data.corpus import DataError, IdWriter, write_error
from nmt.fs.text import TextInputError, iter_lines
from nmt.serve.server import ServeSettings
from tests.conftest import nmt_server


def run(*args: str, stdin: str | bytes | None = None, timeout: float = 120):
    return nmt_server().run(*args, stdin=stdin, text=True, timeout=timeout)


def one_error(result, *messages: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "internal error" not in lines[0]
    for message in messages:
        assert message in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("options", "named"), [
    (["--length-penalty", "9e18"], "`--length-penalty` must be <= 10.0"),
    (["--max-len-ratio", "1e18"], "`--max-len-ratio` must be <= 10.0"),
    (["--sampling", "--temperature", "1e-320"], "`--temperature` must be >= 0.01"),
    (["--sampling", "--temperature", "1e308"], "`--temperature` must be <= 100.0"),
    (["--sampling", "--top-p", "1e-320"], "`--top-p` must be >= 1e-06"),
    (["--coverage-penalty", "1e30"], "`--coverage-penalty` must be <= 10.0"),
    (["--max-input-len", "1000000000"], "`--max-input-len` must be <= 10000"),
    (["--batch-tokens", "2000000000"], "`--batch-tokens` must be <= 1000000"),
])
def test_translate_options_past_their_bound(model_file, options, named):
    result = run("translate", "-m", str(model_file), "-q", *options, stdin="Ein Hund.\n", timeout=60)
    one_error(result, named)
    assert result.stdout == ""


def test_bootstrap_samples_are_bounded_before_any_work(tmp_path):
    for name in ("hyp", "ref", "other"):
        (tmp_path / name).write_text("a cat sat\n")
    result = run("evaluate", "--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref"),
                 "--compare", str(tmp_path / "other"), "--bootstrap-samples", str(10**9), timeout=30)
    one_error(result, "--bootstrap-samples")
    with pytest.raises(ev.EvaluationError, match="--bootstrap-samples must be in 1..100000"):
        ev.compare(["a"], ["a"], ["a"], samples=10**9)


def test_a_bootstrap_draw_larger_than_memory_is_refused(monkeypatch):
    monkeypatch.setattr(ev, "memory_bytes", lambda: 8 * 1000 * 3)       # a machine of 24 kB
    with pytest.raises(ev.EvaluationError, match="needs .* GiB for its draws"):
        ev.compare(["a"] * 3, ["a"] * 3, ["a"] * 3, samples=1000)


def test_every_score_refuses_hypothesis_and_reference_counts_that_differ():
    with pytest.raises(ev.EvaluationError, match="has 2 lines but the references has 3"):
        ev.score(["a", "b"], ["a", "b", "c"])
    with pytest.raises(ev.EvaluationError, match="has 3 lines but the references has 2"):
        ev.bleu(["a", "b", "c"], ["a", "b"])                       # what scripts/ score with
    assert ev.bleu(["a cat sat on the mat"], ["a cat sat on the mat"]) == pytest.approx(100.0)
    with pytest.raises(ev.EvaluationError, match="the other system has 1 lines"):
        ev.compare(["a", "b"], ["a"], ["a", "b"], samples=10)
    with pytest.raises(ev.EvaluationError, match="the baseline has 3 lines"):
        ev.compare(["a", "b", "c"], ["a", "b"], ["a", "b"], samples=10)


@pytest.mark.parametrize(("command", "override", "named"), [
    ("train", "training.accumulate=1000000000", "`training.accumulate` must be <= 1000"),
    ("preprocess", "data.vocab_size=2147483647", "`data.vocab_size` must be <= 1000000"),
    ("train", "model.decoder_layers=1000000", "`model.decoder_layers` must be <= 64"),
    ("train", "decoding.length_penalty=9e18", "`decoding.length_penalty` must be <= 10.0"),
    ("train", "training.bucket_pool=1000000000", "`training.bucket_pool` must be <= 10000"),
])
def test_set_and_config_file_values_past_their_bound(prepared, tmp_path, command, override, named):
    one_error(run(command, "--config", str(prepared), "--set", override, timeout=60), named)
    key, value = override.split("=")
    section, name = key.split(".")
    config = tmp_path / "config.yaml"
    config.write_text(f"{section}:\n  {name}: {value}\n")
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(config)


def test_a_model_this_machine_cannot_train_is_refused_before_anything_is_allocated(prepared, tmp_path):
    run_dir = tmp_path / "run"
    result = run("train", "--config", str(prepared), "--set", f"training.run_dir={run_dir}",
                 "--set", "model.encoder_hidden=16384", "--set", "model.decoder_hidden=16384",
                 "--set", "model.encoder_layers=64", "--set", "model.decoder_layers=64", timeout=120)
    one_error(result, "more than this machine's", "GiB of memory")
    assert not run_dir.exists()


@pytest.mark.parametrize(("settings", "named"), [
    ({"max_queue": 10**9}, "--max-queue must be in 1..100000"),
    ({"max_sentences": 10**7}, "--max-sentences must be in 1..10000"),
    ({"max_batch_sentences": 10**6}, "--max-batch-sentences must be in 1..10000"),
    ({"max_body_bytes": 2**40}, "--max-body-kb must be in 1..65536"),
])
def test_server_limits_are_bounded(settings, named):
    with pytest.raises(ConfigError, match=named):
        ServeSettings(**settings).check()


def test_serve_refuses_an_unbounded_limit_before_loading_the_model(model_file):
    one_error(run("serve", "-m", str(model_file), "--max-queue", str(10**9), timeout=30), "--max-queue")


# ---------------------------------------------------------------------------------------------
# Lines


class EndlessLine(io.RawIOBase):
    """A stream of 'x' without a newline, 64 MiB of it (endless for a reader with a bound; a reader without
    one would hold it all); counts what was read."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        if self.read_bytes >= 64 << 20:
            return b""
        self.read_bytes += 65536
        return b"x" * 65536


def test_a_reader_stops_a_line_without_newline_at_the_bound():
    stream = EndlessLine()
    with pytest.raises(TextInputError, match="endless line 1: longer than 1048576 bytes"):
        list(iter_lines(stream, "endless", block_size=65536))
    assert stream.read_bytes <= (1 << 20) + 65536


@pytest.mark.parametrize("block_size", [64, 1 << 20])
@pytest.mark.parametrize("text", [b"x" * 5000, "\u00e9".encode() * 2600, b"\xff" + b"x" * 5000])
def test_a_long_line_between_others_is_named_after_the_lines_before_it(block_size, text):
    stream = io.BytesIO(b"one\ntwo\n" + text + b"\nfour\n")
    seen = []
    with pytest.raises(TextInputError, match="file line 3: longer than 4096 bytes"):
        seen.extend(iter_lines(stream, "file", block_size=block_size, max_line_bytes=4096))
    assert seen == ["one", "two"]


def test_lines_at_the_bound_are_read():
    text = b"\xc3\xa9" * 2048 + b"\n" + b"y" * 4096
    assert list(iter_lines(io.BytesIO(text), "file", block_size=1000, max_line_bytes=4096)) == ["\u00e9" * 2048,
                                                                                                  "y" * 4096]


def test_translate_refuses_a_50_megabyte_line(model_file):
    result = run("translate", "-m", str(model_file), "-q", stdin=b"Ein Hund.\n" + b"x" * (50 << 20), timeout=120)
    one_error(result, "stdin line 2: longer than 1048576 bytes")


# ---------------------------------------------------------------------------------------------
# Full disks


def test_a_full_disk_names_the_file_and_says_it_is_full(tmp_path):
    stem = tmp_path / "train.de"
    Path(f"{stem}.ids").symlink_to("/dev/full")            # every write: ENOSPC, as on a full disk
    with pytest.raises(DataError, match=rf"cannot write {stem}.ids: the disk is full"), \
            IdWriter(stem, np.dtype(np.uint16)) as writer:
        writer.append(np.arange(100_000) % 500, np.array([100_000]))
    message = str(write_error("out/train.ref.en", OSError(errno.ENOSPC, "No space left on device")))
    assert message == ("cannot write out/train.ref.en: the disk is full (No space left on device); "
                       "free some space and run it again")
