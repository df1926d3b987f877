"""CI has no Docker engine, so the Dockerfile is checked by reading it; scripts/docker_check.sh builds and
runs the image where an engine is (docs/benchmarks.md, "Docker")."""

import json
import re

from .conftest import REPO


def instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    rows = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(row.split(None, 1)[0].upper(), row.split(None, 1)[1] if " " in row else "") for row in rows]


def test_base_is_an_argument_defaulting_to_a_pinned_cuda_pytorch_image_of_a_tested_torch():
    ops = instructions()
    assert ops[0][0] == "ARG" and ops[1] == ("FROM", "${BASE}")
    name, _, default = ops[0][1].partition("=")
    image, _, tag = default.partition(":")
    assert name == "BASE" and image == "pytorch/pytorch"
    match = re.fullmatch(r"(\d+\.\d+)\.\d+-cuda\d+\.\d+-cudnn\d+-(runtime|devel)", tag)
    assert match, tag
    lower = re.search(r'"torch>=([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert tuple(map(int, match.group(1).split("."))) >= tuple(map(int, lower.split(".")))


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


def test_dependencies_come_from_the_constraints_file_and_torch_from_the_base():
    runs = " ".join(arg for op, arg in instructions() if op == "RUN")
    assert "pip install --no-deps ." in runs
    requirements = re.findall(r"pip install ([^&]*)", runs)
    assert not any(re.search(r"\btorch\b", r) for r in requirements)
    assert any(r.startswith("-c constraints.txt") for r in requirements)
    pyproject = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"dependencies = \[(.*?)\]", pyproject, re.S).group(1)
    names = {re.match(r'\s*"([a-zA-Z0-9_-]+)', d).group(1) for d in deps.split(",") if d.strip().startswith('"')}
    for name in names - {"torch"} | {"fastapi", "uvicorn", "matplotlib"}:   # the serve and plot extras too
        assert name in runs, name
    pinned = {line.split("==")[0].lower() for line in (REPO / "constraints.txt").read_text().splitlines()
              if "==" in line}
    assert {name.lower() for name in names - {"torch"}} <= pinned


def test_dockerignore_keeps_data_and_environment_out():
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".venv", "data", "runs", ".git"):
        assert entry in ignored


def test_serve_takes_its_address_from_the_environment(monkeypatch):
    import typer.main

    from nmt.cli import app

    command = typer.main.get_command(app).commands["serve"]
    host = next(p for p in command.params if p.name == "host")
    assert host.envvar == "NMT_SERVE_HOST" and host.default == "127.0.0.1"
