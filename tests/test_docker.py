"""CI has no Docker engine, so the Dockerfile is checked by reading it."""

import json
import re

from .conftest import REPO


def instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    rows = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(row.split(None, 1)[0].upper(), row.split(None, 1)[1] if " " in row else "") for row in rows]


def test_base_image_is_a_pinned_cuda_pytorch_image():
    (base,) = [arg for op, arg in instructions() if op == "FROM"]
    image, _, tag = base.partition(":")
    assert image == "pytorch/pytorch"
    assert re.fullmatch(r"\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-(runtime|devel)", tag), tag


def test_entrypoint_is_the_nmt_cli_as_a_non_root_user():
    ops = instructions()
    assert [json.loads(arg) for op, arg in ops if op == "ENTRYPOINT"] == [["nmt"]]
    users = [arg for op, arg in ops if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    volumes = [json.loads(arg) for op, arg in ops if op == "VOLUME"]
    assert volumes == [["/data", "/runs"]]


def test_install_step_does_not_download_torch_again():
    runs = " ".join(arg for op, arg in instructions() if op == "RUN")
    assert "pip install --no-deps ." in runs
    requirements = re.findall(r'pip install ([^&]*)', runs)
    assert not any(re.search(r"\btorch\b", r) for r in requirements)
    # every runtime dependency other than torch is installed explicitly
    pyproject = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"dependencies = \[(.*?)\]", pyproject, re.S).group(1)
    names = {re.match(r'\s*"([a-zA-Z0-9_-]+)', d).group(1) for d in deps.split(",") if d.strip().startswith('"')}
    for name in names - {"torch"}:
        assert name in runs, name


def test_dockerignore_keeps_data_and_environment_out():
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".venv", "data", "runs", ".git"):
        assert entry in ignored
