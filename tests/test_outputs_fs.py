"""Where a user-named output lands (nmt/fs/outputs.py): links under the kernel's rule for sticky
world-writable folders, never through a link in an nmt folder, never onto an input (stdin too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.fs.folders import FolderError, write_marker
from nmt.fs.outputs import check_outputs, output_target

from .conftest import nmt_server

OTHER_UID = 4242          # a user that is neither the caller (root) nor the sticky folder's owner
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a link owned by another uid needs root to make")


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, stdin=stdin, text=True)


def sticky(tmp_path: Path, owner: int | None = None) -> Path:
    """A folder like /tmp: world-writable with the sticky bit."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    if owner is not None:
        os.chown(folder, owner, owner)
    return folder


def plant(link: Path, target: Path, uid: int = OTHER_UID) -> Path:
    """`link` -> `target`, owned by `uid` (another user planting it)."""
    link.symlink_to(target)
    os.lchown(link, uid, uid)
    return link


def one_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """The caller's file that a planted link points to (like ~/.profile)."""
    home = tmp_path / "home"
    home.mkdir()
    path = home / ".profile"
    path.write_text("export PATH\n")
    return path


# ---------------------------------------------------------------------------------------------- the rule


@needs_root
def test_a_link_another_user_planted_in_a_sticky_folder_is_refused(tmp_path, victim):
    link = plant(sticky(tmp_path) / "out.txt", victim)
    with pytest.raises(FolderError, match=rf"--output {link} is a symbolic link owned by uid {OTHER_UID}"):
        output_target(link, "--output")
    with pytest.raises(FolderError, match="symbolic link owned by"):        # a link in the folders of the path too
        output_target(plant(link.parent / "dir", victim.parent) / "x.txt", "--output")


@needs_root
def test_links_the_kernel_would_follow_are_followed(tmp_path, victim):
    shared = sticky(tmp_path)
    mine = shared / "mine.txt"
    mine.symlink_to(victim)                                   # the caller's own link
    assert output_target(mine, "--output") == victim
    plain = tmp_path / "plain"
    plain.mkdir()                                             # not sticky: any owner's link is followed
    assert output_target(plant(plain / "out.txt", victim), "--output") == victim
    (tmp_path / "owned").mkdir()
    owned = sticky(tmp_path / "owned", owner=OTHER_UID)       # the folder's owner made it
    assert output_target(plant(owned / "out.txt", victim), "--output") == victim
    relative = tmp_path / "rel.txt"
    relative.symlink_to(Path("home") / ".." / "home" / ".profile")
    assert output_target(relative).resolve() == victim
    assert output_target(tmp_path / "new.txt") == tmp_path / "new.txt"       # no link: as given


def test_a_link_inside_an_nmt_folder_is_never_followed(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "run")
    (run / "notes.txt").symlink_to(victim)
    with pytest.raises(FolderError, match="inside the nmt folder"):
        output_target(run / "notes.txt", "--output")


def test_an_input_is_never_an_output(tmp_path, monkeypatch):
    source = tmp_path / "same.de"
    source.write_text("Hallo\n")
    (tmp_path / "alias.de").symlink_to(source)
    with pytest.raises(FolderError, match="--output .* is also --input"):
        check_outputs({"--output": tmp_path / "alias.de"}, [("--input", source)])
    (tmp_path / "b").mkdir()
    with pytest.raises(FolderError, match="--scores .* is also --output"):
        check_outputs({"--output": tmp_path / "a", "--scores": tmp_path / "b" / ".." / "a"}, [])
    with source.open() as handle:                                   # `< same.de`
        monkeypatch.setattr("sys.stdin", handle)
        with pytest.raises(FolderError, match="is also stdin"):
            check_outputs({"--output": source}, [], stdin=True)
        assert check_outputs({"--output": tmp_path / "other"}, [], stdin=True) == {"--output": tmp_path / "other"}
    assert source.read_text() == "Hallo\n"


# ---------------------------------------------------------------------------------------------- commands


@needs_root
def test_translate_and_evaluate_refuse_a_planted_link_and_write_nothing(trained_run, tmp_path, victim):
    shared = sticky(tmp_path)
    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\n")
    before = victim.read_bytes()
    for option in ("-o", "--alignments", "--attention-out", "--scores"):
        link = plant(shared / f"out{option}", victim)
        line = one_error(run_cli("translate", "-m", str(trained_run / "best.pt"), "-i", str(source), option, str(link),
                                 *(["--scores-json"] if option == "--scores" else [])))
        assert str(link) in line and f"owned by uid {OTHER_UID}" in line
    link = plant(shared / "scores.json", victim)
    line = one_error(run_cli("evaluate", "--hyp", str(source), "--ref", str(source), "--json", str(link)))
    assert "--json" in line and str(link) in line
    link = plant(shared / "model.nmt", victim)
    line = one_error(run_cli("export", str(trained_run / "best.pt"), "-o", str(link), "--force"))
    assert str(link) in line
    dangling = plant(shared / "avg.pt", victim.parent / "avg.pt")
    line = one_error(run_cli("average", str(trained_run / "best.pt"), "-o", str(dangling)))
    assert str(dangling) in line and not (victim.parent / "avg.pt").exists()
    assert victim.read_bytes() == before and sorted(p.name for p in victim.parent.iterdir()) == [".profile"]
    mine = shared / "mine.txt"                                 # the caller's own link: written through
    mine.symlink_to(tmp_path / "real.txt")
    result = run_cli("translate", "-m", str(trained_run / "best.pt"), "-i", str(source), "-o", str(mine))
    assert result.returncode == 0, result.stderr
    assert mine.is_symlink() and (tmp_path / "real.txt").read_text().count("\n") == 1


@needs_root
def test_plot_outputs_refuse_a_planted_link_through_the_cli_and_the_api(trained_run, tmp_path, victim):
    pytest.importorskip("matplotlib")
    from nmt.plot import AttentionPlotter, plot_curves

    shared = sticky(tmp_path)
    link = plant(shared / "curves.png", victim)
    line = one_error(run_cli("plot", "curves", str(trained_run), "--out", str(link)))
    assert str(link) in line and "owned by" in line
    with pytest.raises(FolderError, match="owned by"):
        plot_curves([trained_run], link)
    folder = plant(shared / "attention", victim.parent)         # a heatmap folder someone else points home
    line = one_error(run_cli("plot", "attention", "-m", str(trained_run / "best.pt"), "--src", "Ein Hund.",
                             "-o", str(folder)))
    assert str(folder) in line and "owned by" in line
    with pytest.raises(FolderError, match="owned by"):
        AttentionPlotter(folder)
    assert victim.read_text() == "export PATH\n" and sorted(p.name for p in victim.parent.iterdir()) == [".profile"]


def test_translate_refuses_to_replace_its_input(trained_run, tmp_path):
    source = tmp_path / "same.de"
    source.write_text("Ein Hund läuft.\n")
    model = str(trained_run / "best.pt")
    with source.open("rb") as same:        # `nmt translate -o same.de < same.de`: stdin is that very file
        result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", model, "-o", str(source)],
                                stdin=same, capture_output=True, text=True)
    assert one_error(result) == f"error: --output {source} is also stdin; write the output to another file"
    alias = tmp_path / "alias.de"
    alias.symlink_to(source)
    line = one_error(run_cli("translate", "-m", model, "-i", str(alias), "-o", str(source)))
    assert "is also --input" in line
    assert source.read_text() == "Ein Hund läuft.\n"


def test_export_refuses_to_replace_its_input(model_file, tmp_path):
    copy = tmp_path / "model.nmt"
    copy.write_bytes(model_file.read_bytes())
    line = one_error(run_cli("export", str(copy), "-o", str(copy), "--force"))
    assert "is also --model" in line
    assert copy.read_bytes() == model_file.read_bytes()


def test_the_api_never_writes_through_a_link_it_was_not_told_to_follow(model_file, tmp_path, victim):
    from nmt.modelfile.file import export_model

    link = tmp_path / "model.nmt"
    link.symlink_to(victim)
    with pytest.raises(FolderError, match="is a symbolic link"):
        export_model(model_file, link)
    assert victim.read_text() == "export PATH\n"


def test_a_marker_planted_in_a_shared_folder_does_not_block_outputs_there(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".nmt-folder.json").symlink_to(tmp_path / "elsewhere.json")
    assert check_outputs({"--output": shared / "out.txt"}, []) == {"--output": shared / "out.txt"}
    (shared / ".nmt-folder.json").unlink()
    (shared / ".nmt-folder.json").write_text('{"kind": "run", "files": ["../x"]}')
    assert check_outputs({"--output": shared / "out.txt"}, []) == {"--output": shared / "out.txt"}
