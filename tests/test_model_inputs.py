"""No output replaces a file a command reads (nmt/fs/outputs.py, nmt/modelfile/hub.py model_files): the
files of a model folder, the blobs of a Hub cache, the second model of an ensemble, every input option,
compared by where links lead and by inode. And /dev/null is an output."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_modelfile_hf import lay_out_cache

from .conftest import nmt_server


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, stdin=stdin, text=True)


def one_error(result: subprocess.CompletedProcess, *parts: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (links followed) by its relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hf_model(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf_model") / "hf"
    result = run_cli("export", str(trained_run / "best.pt"), "--format", "hf", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def work(tmp_path: Path, hf_model: Path) -> Path:
    """A copy of the Hugging Face folder (`hf`), a link to it (`link`) and a source file (`in.de`)."""
    shutil.copytree(hf_model, tmp_path / "hf")
    (tmp_path / "link").symlink_to("hf")
    (tmp_path / "in.de").write_text("Ein Hund läuft.\n")
    return tmp_path


def test_no_output_replaces_a_file_of_a_model_folder(work):
    hf, link, source = work / "hf", work / "link", str(work / "in.de")
    before = contents(hf)
    cases = [
        (["translate", "-m", str(hf), "-i", source, "-o", str(hf / "model.safetensors")], "--output"),
        (["translate", "-m", f"{hf}/", "-i", source, "--scores", str(hf / "config.json")], "--scores"),
        (["translate", "-m", str(link), "-i", source, "--alignments", str(hf / "source.spm")], "--alignments"),
        (["translate", "-m", str(hf), "-i", source, "--attention-out", str(link / "target.spm")], "--attention-out"),
        (["score", "-m", str(hf), "--src", source, "--tgt", source, "-o", str(link / "vocab.json")], "--output"),
        (["evaluate", "--hyp", source, "--ref", source, "-m", str(link), "--src", source,
          "--json", str(hf / "README.md")], "--json"),
        (["export", str(hf), "-o", str(hf / "model.safetensors"), "--force"], "--output"),
        (["export", f"{link}/", "-o", str(hf / "model.safetensors"), "--force"], "--output"),
    ]
    for args, option in cases:
        one_error(run_cli(*args), option, "is also a file of --model")
    assert contents(hf) == before
    assert run_cli("info", str(hf)).returncode == 0


def test_a_hard_link_or_a_link_to_the_model_is_the_model(model_file, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n")
    model = tmp_path / "model.nmt"
    shutil.copyfile(model_file, model)
    os.link(model, tmp_path / "hard.nmt")
    (tmp_path / "soft.nmt").symlink_to(model)
    for alias in ("hard.nmt", "soft.nmt"):
        one_error(run_cli("translate", "-m", str(model), "-i", str(source), "-o", str(tmp_path / alias)),
                  "is also --model")
    assert model.read_bytes() == model_file.read_bytes()


def test_the_hub_cache_of_an_hf_model_is_never_written(work, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = work / "hub"
    monkeypatch.setenv("HF_HOME", str(work / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = lay_out_cache(cache, "someone/nmt-de-en", work / "hf")
    repo = cache / "models--someone--nmt-de-en"
    before = {p.name: p.read_bytes() for p in (repo / "blobs").iterdir()}
    snapshot = repo / "snapshots" / commit
    blob = (snapshot / "model.safetensors").resolve()
    source = str(work / "in.de")
    for name in ("hf://someone/nmt-de-en", f"hf://someone/nmt-de-en@{commit}"):
        for out in (snapshot / "model.safetensors", blob, snapshot / "config.json"):
            one_error(run_cli("translate", "-m", name, "-i", source, "-o", str(out)),
                      f"is also a file of --model {name}")
    one_error(run_cli("score", "-m", "hf://someone/nmt-de-en", "--src", source, "--tgt", source,
                      "-o", str(snapshot / "model.safetensors")), "is also a file of --model hf://someone/nmt-de-en")
    assert {p.name: p.read_bytes() for p in (repo / "blobs").iterdir()} == before
    assert all(p.is_symlink() for p in snapshot.iterdir())
    result = run_cli("translate", "-m", "hf://someone/nmt-de-en", "-i", source, "-o", str(work / "out.en"), "-q")
    assert result.returncode == 0, result.stderr                    # the cache still loads; other outputs go
    assert (work / "out.en").read_text().count("\n") == 1


def test_every_input_option_and_every_model_of_an_ensemble(trained_run, model_file, work):
    pytest.importorskip("matplotlib")
    hf, source = work / "hf", work / "in.de"
    prefix = work / "prefix.en"
    prefix.write_text("A\n")
    shortlist = work / "shortlist.npz"
    shutil.copyfile(trained_run / "shortlist.npz", shortlist)
    before = contents(work)
    one_error(run_cli("translate", "-m", str(model_file), "-m", str(hf), "-i", str(source),
                      "-o", str(hf / "target.spm")), "is also a file of --model")
    one_error(run_cli("translate", "-m", str(model_file), "-i", str(source), "--prefix-file", str(prefix),
                      "--scores", str(prefix)), "is also --prefix-file")
    one_error(run_cli("translate", "-m", str(model_file), "-i", str(source), "--shortlist-file", str(shortlist),
                      "-o", str(shortlist)), "is also --shortlist-file")
    one_error(run_cli("evaluate", "--hyp", str(source), "--ref", str(prefix), "--ref", str(source),
                      "--json", str(work / "link" / ".." / "prefix.en")), "is also --ref")
    one_error(run_cli("plot", "attention", "-m", str(hf), "--src", "Ein Hund.", "-o", str(hf / "README.md")),
              "is also a file of --model")
    one_error(run_cli("translate", "-m", str(hf), "-i", str(source), "--plot-attention", str(hf)), str(hf))
    assert contents(work) == before


def test_dev_null_is_an_output(model_file, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\nZwei Männer.\n")
    result = run_cli("translate", "-m", str(model_file), "-i", str(source), "-o", os.devnull,
                     "--scores", os.devnull, "-q")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert Path(os.devnull).is_char_device() and os.listdir(tmp_path) == ["in.de"]
    result = run_cli("evaluate", "--hyp", str(source), "--ref", str(source), "--json", os.devnull)
    assert result.returncode == 0, result.stderr
    assert Path(os.devnull).is_char_device()
    one_error(run_cli("translate", "-m", str(model_file), "-i", os.devnull, "-o", os.devnull), "is also --input")


def test_a_pipe_is_an_output_written_as_a_stream(model_file, tmp_path):
    """`-o FIFO` and `--scores >(cmd)` are streams, as stdout is: the reader gets every line, nothing is renamed
    over the pipe; one pipe may not take two outputs."""
    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\nZwei Männer.\n")
    expected = run_cli("translate", "-m", str(model_file), "-i", str(source), "-q").stdout
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    result = run_cli("translate", "-m", str(model_file), "-i", str(source), "-o", str(fifo), "-q")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert reader.communicate(timeout=60)[0] == expected and expected.count("\n") == 2
    assert fifo.is_fifo() and sorted(os.listdir(tmp_path)) == ["in.de", "out.fifo"]
    one_error(run_cli("translate", "-m", str(model_file), "-i", str(source), "-o", str(fifo), "--scores", str(fifo)),
              "is also --output")


def test_dev_stdout_is_written_through_the_open_descriptor(model_file, tmp_path):
    """`-o /dev/stdout` into a file the shell appends to: the lines land after what is there, nothing is
    truncated or renamed over it; into a pipe they stream. A second output on the same descriptor is refused."""
    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\nZwei Männer.\n")
    expected = run_cli("translate", "-m", str(model_file), "-i", str(source), "-q").stdout
    log = tmp_path / "log.txt"
    log.write_text("day 1\n")
    nmt = f"{shlex.quote(sys.executable)} -m nmt translate -m {shlex.quote(str(model_file))} -i {source} -q"
    script = f"(echo day 2; {nmt} -o /dev/stdout; echo end) >> {log}; {nmt} --scores /dev/stderr 2>> {log} >/dev/null"
    subprocess.run(["bash", "-c", script], check=True, timeout=300)
    text = log.read_text()
    assert text.startswith(f"day 1\nday 2\n{expected}end\n") and text.count("\n") == 7, text
    piped = subprocess.run(["bash", "-c", f"{nmt} -o /dev/fd/1 | cat"], capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0 and piped.stdout == expected, piped.stderr
    twice = subprocess.run(["bash", "-c", f"{nmt} -o /dev/stdout --scores /dev/fd/1 >> {log}"], capture_output=True,
                           text=True, timeout=300)
    assert twice.returncode == 2 and "--scores /dev/fd/1 is also --output" in twice.stderr
    for shell, message in ((f"{nmt} --alignments /dev/stdout | cat", "--alignments /dev/stdout is also stdout"),
                           (f"{nmt} --scores {log} >> {log}", f"--scores {log} is also stdout"),   # would unlink it
                           (f"{nmt} -o /dev/fd/3 3< {log}", "descriptor 3 is not open for writing"),
                           (f"{nmt} -o /dev/stdout >&-", "descriptor 1 is not open for writing (closed")):
        refused = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300)
        assert refused.stdout == "" and message in refused.stderr and refused.stderr.count("\n") == 1, shell
    assert log.read_text() == text and sorted(os.listdir(tmp_path)) == ["in.de", "log.txt"]
