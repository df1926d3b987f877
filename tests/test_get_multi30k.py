"""scripts/get_multi30k.sh from a local mirror: the three standard splits are required, the held-out
test sets are copied when the mirror has them."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "get_multi30k.sh"
REQUIRED = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en", "fr")]


def run(mirror, dest):
    return subprocess.run(["bash", str(SCRIPT), "--mirror", str(mirror), str(dest)], capture_output=True, text=True)


def test_mirror_copies_standard_splits_and_the_held_out_sets_it_has(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    present = REQUIRED + ["test_2017_mscoco.de.gz", "test_2017_mscoco.en.gz"]
    for name in present:
        (mirror / name).write_bytes(name.encode())
    result = run(mirror, tmp_path / "dest")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == sorted(present)
    assert all((tmp_path / "dest" / name).read_bytes() == name.encode() for name in present)
    note = next(line for line in result.stderr.splitlines() if line.startswith("note:"))
    assert "test_2017_flickr.de.gz" in note and "test_2018_flickr.en.gz" in note
    assert "test_2017_mscoco.en.gz" not in note


def test_mirror_without_a_standard_split_is_an_error_naming_it(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in REQUIRED[:-1]:
        (mirror / name).write_bytes(b"x")
    result = run(mirror, tmp_path / "dest")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {mirror}/{REQUIRED[-1]} does not exist")


def offline(tmp_path):
    """A PATH whose curl fails as it does without a network, and counts its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    curl = bin_dir / "curl"
    curl.write_text(f'#!/bin/sh\necho x >> "{tmp_path}/curl_calls"\n'
                    'echo "curl: (6) Could not resolve host: github.com" >&2\nexit 6\n')
    curl.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MULTI30K_MIRROR": ""}


def test_offline_the_held_out_sets_are_skipped_in_one_line_after_one_try(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    for name in REQUIRED:                                   # the standard splits are there already
        (dest / name).write_bytes(b"x")
    result = subprocess.run(["bash", str(SCRIPT), str(dest)], capture_output=True, text=True, env=offline(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "curl_calls").read_text().count("x") == 1
    note, done = result.stderr.splitlines()
    assert note.startswith("note: held-out test files not downloaded (curl: (6) Could not resolve host: github.com)")
    assert "test_2017_flickr.de.gz" in note and "test_2018_flickr.fr.gz" in note
    assert done == f"Multi30k raw files in {dest}"


def test_offline_a_standard_split_is_one_error_line_with_curls_reason(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "dest")], capture_output=True, text=True,
                            env=offline(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: could not download https://github.com/multi30k/dataset/raw/master/data/task1/raw/train.de.gz "
        "(curl: (6) Could not resolve host: github.com)"]
