"""What the shell scripts do before their real work: the virtual environment that quickstart.sh and
best_recipe.sh set up on a fresh machine (setup_venv.sh), and every script's answer to arguments
(script_usage.sh).

The scripts run in a fake virtual environment whose `python` and `pip` only record their calls, so
the tests check what gets installed without installing anything.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _fake_checkout(root: Path) -> Path:
    """A repository root with the script, an importable `nmt/` package and a .venv whose tools log calls."""
    (root / "scripts").mkdir(parents=True)
    for script in ("setup_venv.sh", "script_usage.sh", "quickstart.sh", "best_recipe.sh"):
        shutil.copy(REPO / "scripts" / script, root / "scripts")
    (root / "nmt").mkdir()
    (root / "nmt" / "__init__.py").write_text("")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    _executable(bin_dir / "python", f'#!/bin/sh\necho "python $*" >> "{root}/calls.log"\nexit 0\n')
    _executable(bin_dir / "pip", f'#!/bin/sh\necho "pip $*" >> "{root}/calls.log"\nexit 0\n')
    return root


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("NMT_SKIP_VENV", "MULTI30K_MIRROR", "VIRTUAL_ENV")}


def _calls(root: Path) -> list[str]:
    log = root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _source(root: Path) -> list[str]:
    subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/setup_venv.sh"], cwd=root, env=_clean_env(),
                   check=True)
    return _calls(root)


def test_installs_nmt_when_its_command_is_missing_even_though_the_package_imports_from_the_root(tmp_path):
    # From the repository root `import nmt` works without an install; quickstart.sh then found no `nmt` command.
    calls = _source(_fake_checkout(tmp_path))
    assert "pip install -q -c constraints.txt -e ." in calls


def test_leaves_an_installed_nmt_alone(tmp_path):
    root = _fake_checkout(tmp_path)
    _executable(root / ".venv" / "bin" / "nmt", "#!/bin/sh\nexit 0\n")
    calls = _source(root)
    assert not [call for call in calls if call.startswith("pip install") and "-e ." in call]
    assert any(call.startswith("python -c") for call in calls)      # it still checked for torch


@pytest.mark.parametrize(("script", "documented"), [("quickstart.sh", ["MINUTES=", "THREADS=", "RUN="]),
                                                    ("best_recipe.sh", ["THREADS=", "BEAMS", "PENALTIES"])])
def test_help_prints_the_header_and_does_nothing_else(tmp_path, script, documented):
    root = _fake_checkout(tmp_path)
    before = sorted(path.relative_to(root) for path in root.rglob("*"))
    result = subprocess.run(["bash", f"scripts/{script}", "--help"], cwd=root, env=_clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert all(name in result.stdout for name in documented) and not result.stdout.startswith("#")
    assert "set -euo" not in result.stdout                                   # the header only, not the code
    assert _calls(root) == [] and sorted(path.relative_to(root) for path in root.rglob("*")) == before


@pytest.mark.parametrize("script", ["quickstart.sh", "best_recipe.sh"])
def test_an_argument_is_an_error_before_anything_runs(tmp_path, script):
    # Both take environment variables only; `best_recipe.sh --beams 5` used to start hours of training.
    root = _fake_checkout(tmp_path)
    result = subprocess.run(["bash", f"scripts/{script}", "--beams", "5"], cwd=root, env=_clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: {script} takes no arguments (got '--beams'); its settings are "
                                          "environment variables; see --help"]
    assert _calls(root) == [] and not (root / "data").exists()


@pytest.mark.parametrize(("answer", "model", "lr"), [
    ("de en bahdanau cpu-fp32", ["model.dropout=0.2"], "0.003"), ("de en bahdanau cpu-bf16", [], "0.002"),
    ("en de bahdanau cuda", [], "0.002"),
    ("de en luong_general cpu-bf16", ["model.input_feeding=false"], "0.002"),
    ("de en luong_dot cuda", ["model.input_feeding=false"], "0.002"),
    ("de en luong_general cpu-fp32", ["model.input_feeding=false"], "0.003"),
    ("en de bahdanau cpu-fp32", ["model.dropout=0.2"], "0.003")])
def test_the_quickstart_recipe_follows_the_attention_and_the_compute(tmp_path, answer, model, lr):
    """Every model trains on 1,000-token batches; Luong models without input feeding, which lets the budget
    hold more updates; on a float32 CPU, whose budget holds about four epochs, every model peaks at lr 3e-3
    and Bahdanau models train with dropout 0.2 (docs/benchmarks.md, "Quality per minute")."""
    root = _fake_checkout(tmp_path)
    bin_dir = root / ".venv" / "bin"
    # the config question gets `answer` (source, target, attention, compute); every command logs its call
    _executable(bin_dir / "python", f'#!/bin/sh\necho "python $*" >> "{root}/calls.log"\n'
                                    f'case "$*" in *load_config*) echo "{answer}";; esac\n')
    _executable(bin_dir / "nmt", f'#!/bin/sh\necho "nmt $*" >> "{root}/calls.log"\n')
    _executable(root / "scripts" / "get_multi30k.sh",
                'mkdir -p "$1" && for f in de en; do echo x | gzip > "$1/test_2016_flickr.$f.gz"; done\n')
    result = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=root, env={**_clean_env(), "MINUTES": "3"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    train = [call for call in _calls(root) if call.startswith("nmt train")]
    assert len(train) == 1 and "training.max_minutes=3" in train[0]
    assert [arg for arg in train[0].split() if arg.startswith("training.batch_tokens=")] == [
        "training.batch_tokens=1000"]
    assert [arg for arg in train[0].split() if arg.startswith("model.")] == model
    assert [arg for arg in train[0].split() if arg.startswith("training.lr=")] == [f"training.lr={lr}"]


def _path(script: str) -> Path:
    """Every script a user runs is in scripts/ (gpu_benchmarks.sh runs bench/gpu_benchmarks.sh)."""
    return REPO / "scripts" / script


@pytest.mark.parametrize(("script", "args", "expected"), [
    ("get_multi30k.sh", ["--help"], "MULTI30K_MIRROR=/path"),
    ("get_iwslt14.sh", ["-h"], "IWSLT14_MIRROR=/path"),
    ("gpu_benchmarks.sh", ["--help"], "bash scripts/gpu_benchmarks.sh OUT [MODEL]"),
    ("gpu_kit.sh", ["--help"], "bash scripts/gpu_kit.sh fetch KIT"),
    ("docker_base.sh", ["--help"], "bash scripts/docker_base.sh [TAG]"),
    ("docker_check.sh", ["-h"], "bash scripts/docker_check.sh BASE"),
])
def test_the_download_and_gpu_scripts_answer_help_with_their_header(tmp_path, script, args, expected):
    result = subprocess.run(["bash", str(_path(script)), *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and expected in result.stdout and result.stderr == ""
    assert list(tmp_path.iterdir()) == []                 # no folder named --help (they used to mkdir it)


@pytest.mark.parametrize(("script", "args", "message"), [
    ("get_multi30k.sh", ["--mirrror", "x"], "takes [--mirror FOLDER] [DEST], got '--mirrror x'"),
    ("get_multi30k.sh", ["a", "b"], "takes [--mirror FOLDER] [DEST], got 'a b'"),
    ("get_multi30k.sh", ["--mirror"], "--mirror needs a folder"),
    ("get_iwslt14.sh", ["--force"], "takes [--mirror FOLDER] [DEST], got '--force'"),
    ("gpu_benchmarks.sh", [], "takes OUT [MODEL], got ''"),
    ("gpu_benchmarks.sh", ["--stages", "train"], "takes OUT [MODEL], got '--stages train'"),
    ("gpu_kit.sh", ["fetch"], "takes fetch KIT or install KIT, got 'fetch'"),
    ("gpu_kit.sh", ["get", "kit"], "takes fetch KIT or install KIT, got 'get kit'"),
    ("docker_base.sh", ["a", "b"], "takes [TAG], got 'a b'"),
    ("docker_check.sh", [], "takes BASE, got ''"),
    ("docker_check.sh", ["--no-cache"], "takes BASE, got '--no-cache'"),
])
def test_the_download_and_gpu_scripts_refuse_what_they_do_not_take(tmp_path, script, args, message):
    result = subprocess.run(["bash", str(_path(script)), *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: {script} {message}; see --help"]
    assert list(tmp_path.iterdir()) == []


def test_a_script_run_through_a_link_finds_its_helper(tmp_path):
    link = tmp_path / "bin" / "get_multi30k"
    link.parent.mkdir()
    link.symlink_to(REPO / "scripts" / "get_multi30k.sh")
    result = subprocess.run(["bash", str(link), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "MULTI30K_MIRROR=/path" in result.stdout, result.stderr


def test_the_gpu_kit_refuses_to_install_without_wheels(tmp_path):
    result = subprocess.run(["bash", str(_path("gpu_kit.sh")), "install", str(tmp_path / "kit")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: gpu_kit.sh install: {tmp_path / 'kit'}/wheels holds no wheels "
        f"(bash scripts/gpu_kit.sh fetch {tmp_path / 'kit'})"]
