"""CI has no Docker engine, so the Dockerfile is checked by reading it (pyproject.toml read as TOML), and
scripts/docker_check.sh by what it does before it builds, with a fake `docker` on PATH; the script builds and
runs the image where an engine is (README.md, "Docker")."""

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import REPO

PROMISED_EXTRAS = {"serve", "plot"}        # what the README's Docker section says the image includes


def instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    rows = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(row.split(None, 1)[0].upper(), row.split(None, 1)[1] if " " in row else "") for row in rows]


def shell_commands() -> list[list[str]]:
    """Every simple command of the RUN lines, as the shell splits it (`&&`, `||`, `;` between them)."""
    commands: list[list[str]] = [[]]
    for op, arg in instructions():
        if op != "RUN":
            continue
        lexer = shlex.shlex(arg, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        for token in lexer:
            if token in ("&&", "||", ";"):
                commands.append([])
            else:
                commands[-1].append(token)
        commands.append([])
    return [command for command in commands if command]


def pip_installs() -> list[list[str]]:
    return [command[2:] for command in shell_commands() if command[:2] == ["pip", "install"]]


def constraint_files(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg in ("-c", "--constraint")]


def targets(args: list[str]) -> list[str]:
    """What a `pip install` installs: its arguments that are neither options nor their values."""
    valued = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url"}
    return [arg for i, arg in enumerate(args) if not arg.startswith("-") and (i == 0 or args[i - 1] not in valued)]


def pyproject() -> dict:
    with (REPO / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)["project"]


def test_base_is_an_argument_defaulting_to_a_pinned_cuda_pytorch_image_of_a_tested_torch():
    ops = instructions()
    assert ops[0][0] == "ARG" and ops[1] == ("FROM", "${BASE}")
    name, _, default = ops[0][1].partition("=")
    image, _, tag = default.partition(":")
    assert name == "BASE" and image == "pytorch/pytorch"
    match = re.fullmatch(r"(\d+\.\d+\.\d+)-cuda\d+\.\d+-cudnn\d+-(runtime|devel)", tag)
    assert match, tag
    torch = next(Requirement(d) for d in pyproject()["dependencies"] if Requirement(d).name == "torch")
    assert torch.specifier.contains(match.group(1)), (torch, tag)


def test_entrypoint_is_the_nmt_cli_as_a_non_root_user_with_volumes_and_the_server_port():
    ops = instructions()
    assert [json.loads(arg) for op, arg in ops if op == "ENTRYPOINT"] == [["nmt"]]
    users = [arg for op, arg in ops if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert [json.loads(arg) for op, arg in ops if op == "VOLUME"] == [["/data", "/runs"]]
    assert [arg for op, arg in ops if op == "EXPOSE"] == ["8000"]
    env = " ".join(arg for op, arg in ops if op == "ENV")
    assert "NMT_SERVE_HOST=0.0.0.0" in env                     # reachable through -p, inside the container only
    assert "HOME=/tmp" in env                                  # any --user, also with --read-only --tmpfs /tmp


def test_nmt_goes_in_with_every_dependency_of_its_metadata_and_the_promised_extras():
    # The image used to install a hand-written list and nmt with --no-deps: safetensors was missing, and
    # `nmt export` failed in the container with ModuleNotFoundError.
    installs = pip_installs()
    of_nmt = [args for args in installs if any(re.fullmatch(r"\.(\[[\w,-]+\])?", t) for t in targets(args))]
    assert len(of_nmt) == 1, installs
    args = of_nmt[0]
    assert "--no-deps" not in args                             # pip reads pyproject's dependencies itself
    (target,) = [t for t in targets(args) if t.startswith(".")]
    extras = set(filter(None, target.strip(".[]").split(",")))
    assert extras >= PROMISED_EXTRAS and extras <= set(pyproject()["optional-dependencies"]), extras
    assert "constraints.txt" in constraint_files(args)
    assert not [t for args in installs for t in targets(args) if t != target]   # nothing installed beside it


def test_every_dependency_and_promised_extra_is_pinned_by_the_constraints_file():
    project = pyproject()
    wanted = project["dependencies"] + [d for extra in PROMISED_EXTRAS for d in project["optional-dependencies"][extra]]
    names = {canonicalize_name(Requirement(d).name) for d in wanted} - {"torch"}
    assert {"safetensors", "sentencepiece", "fastapi", "matplotlib"} <= names    # TOML, not split on commas
    pinned = {canonicalize_name(line.split("==")[0]) for line in (REPO / "constraints.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    assert names <= pinned, names - pinned


def test_torch_is_constrained_to_the_version_the_base_has():
    # The constraint file comes from a command run in the image: here, the same command names this venv's torch.
    (args,) = [args for args in pip_installs() if "constraints.txt" in constraint_files(args)]
    written = {}
    for command in shell_commands():
        if ">" in command:
            written[command[command.index(">") + 1]] = command[:command.index(">")]
    (torch_file,) = [f for f in constraint_files(args) if f != "constraints.txt"]
    program = written[torch_file]
    assert program[:2] == ["python", "-c"]
    line = subprocess.run([sys.executable, "-c", program[2]], capture_output=True, text=True, check=True).stdout
    requirement = Requirement(line.strip())
    assert requirement.name == "torch" and requirement.specifier.contains(version("torch"))
    assert len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "=="


def test_dockerignore_keeps_data_and_environment_out():
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".venv", "data", "runs", ".git"):
        assert entry in ignored


def test_serve_takes_its_address_from_the_environment(monkeypatch):
    import typer.main

    from nmt.cli.main import app

    command = typer.main.get_command(app).commands["serve"]
    host = next(p for p in command.params if p.name == "host")
    assert host.envvar == "NMT_SERVE_HOST" and host.default == "127.0.0.1"


def _fake_docker(folder: Path, script: str) -> Path:
    """A `docker` that logs its arguments to calls.log beside it, then runs `script` (a case on "$1")."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "docker"
    path.write_text(f'#!/bin/sh\necho "$*" >> "{folder}/calls.log"\n{script}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def _calls(folder: Path) -> list[str]:
    log = folder / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _check(root: Path, path: str, tmp: Path) -> tuple[subprocess.CompletedProcess, float]:
    tmp.mkdir(exist_ok=True)
    start = time.monotonic()
    script = root / "scripts" / "docker_check.sh"
    result = subprocess.run([shutil.which("bash"), str(script), "nmt-base:local"], cwd=root, capture_output=True,
                            env={**os.environ, "PATH": path, "TMPDIR": str(tmp)}, text=True, timeout=120)
    return result, time.monotonic() - start


NOT_RUNNING = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def test_the_check_refuses_to_start_without_an_engine(tmp_path):
    # It used to run every step (each failing) for three minutes.
    fake = _fake_docker(tmp_path / "bin", f'echo "{NOT_RUNNING}" >&2; exit 1')
    result, seconds = _check(REPO, f"{fake}:{os.environ['PATH']}", tmp_path / "tmp")
    assert result.returncode == 2 and result.stdout == "" and seconds < 10
    assert result.stderr.splitlines() == [
        f"error: docker_check.sh needs a running Docker engine (docker info: {NOT_RUNNING}); see --help"]
    assert _calls(fake) == ["info --format {{.ServerVersion}}"] and list((tmp_path / "tmp").iterdir()) == []


def test_the_check_refuses_to_start_without_the_docker_command(tmp_path):
    tools = tmp_path / "tools"                  # what the script needs before its first docker command; no docker
    tools.mkdir()
    for tool in ("dirname", "readlink", "basename"):
        (tools / tool).symlink_to(shutil.which(tool))
    result, seconds = _check(REPO, str(tools), tmp_path / "tmp")
    assert result.returncode == 2 and result.stdout == "" and seconds < 10
    assert result.stderr.splitlines() == [
        "error: docker_check.sh needs docker (the Docker CLI), which is not on PATH; see --help"]


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A repository root with the check, its helper, the smoke config and the shipped Multi30k sample."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for script in ("docker_check.sh", "script_usage.sh"):
        shutil.copy(REPO / "scripts" / script, root / "scripts")
    (root / "configs").mkdir()
    shutil.copy(REPO / "configs" / "smoke.yaml", root / "configs")
    (root / "tests" / "data").mkdir(parents=True)
    (root / "tests" / "data" / "multi30k").symlink_to(REPO / "tests" / "data" / "multi30k")
    return root


def test_a_failed_build_stops_the_check_with_one_line_and_each_run_has_its_own_tag(checkout, tmp_path):
    # A failed build used to go on with the older image of the fixed tag nmt-check:latest and report "ok".
    fake = _fake_docker(tmp_path / "bin", 'case "$1" in\n  build) echo "ERROR: failed to solve" >&2; exit 1;;\n'
                                          '  info) echo 28.2.2;;\nesac\nexit 0')
    tags = []
    for run in range(2):
        result, _ = _check(checkout, f"{fake}:{os.environ['PATH']}", tmp_path / f"tmp{run}")
        assert result.returncode == 1, result.stderr
        (line,) = result.stdout.splitlines()
        assert line.startswith("FAILED  build (exit 1, ") and line.endswith("build.log)")
        calls = _calls(fake)
        assert not [call for call in calls if call.split()[0] in ("run", "image")], calls  # nothing ran after it
        (build,) = [call.split() for call in calls if call.startswith("build ")]
        tags.append(build[build.index("-t") + 1])
        assert f"rmi --no-prune {tags[-1]}" in calls            # its tag is removed at the end
        (fake / "calls.log").unlink()
    assert tags[0] != tags[1] and "nmt-check:latest" not in tags
