"""Shared fixtures: slices of the real Multi30k corpus and small configs pointing at them.

The corpus is tests/data/multi30k (the first lines of each split, shipped with the repository), or the folder
NMT_MULTI30K names: every test reads a prefix the sample holds, so both give the same results."""

from __future__ import annotations

import gzip
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "tests" / "data" / "multi30k"
MULTI30K = Path(os.environ.get("NMT_MULTI30K") or SAMPLE)
SMOKE_CONFIG = REPO / "configs" / "smoke.yaml"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One test process per core (`pytest -n auto`, as .ci/run runs): each, and the nmt commands it starts, on
    # one thread, before anything imports torch. Two processes of two spinning OpenMP threads each on two cores
    # took 28 minutes where one process took 21 and two of one thread 12.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for torchrun's rendezvous), below the kernel's
    ephemeral range: a client that dials a port of that range before its server listens can be given
    that very port as its own and connect to itself (TCP simultaneous open), and then waits forever."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768                                                        # Linux's default
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port below the ephemeral range")


def randomize_feed_weights(model, scale: float = 0.1) -> None:
    """Luong models start input feeding's weights W_f at zero (LuongDecoder.zero_feed_weights); a test
    of a numeric path needs them non-zero, or the feed of h̃_{i-1} would not be exercised."""
    import torch

    if getattr(model.decoder, "input_feeding", False):
        with torch.no_grad():
            model.decoder.feed_weight().uniform_(-scale, scale)


def pytest_configure(config: pytest.Config) -> None:
    """A corpus folder that is missing would skip most of the suite: stop before running anything."""
    if not (MULTI30K / "train.de.gz").is_file():
        raise pytest.UsageError(f"NMT_MULTI30K={MULTI30K} has no train.de.gz; unset it to use the sample in {SAMPLE}")


def read_gz(name: str, n: int) -> list[str]:
    """The first n lines of {MULTI30K}/{name}.gz (all of them must be there: a short read is an error)."""
    with gzip.open(MULTI30K / f"{name}.gz", "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for _, line in zip(range(n), handle, strict=False)]
    if len(lines) < n:
        raise ValueError(f"{MULTI30K}/{name}.gz has {len(lines)} lines; the test needs {n}")
    return lines


def write_slice(folder: Path, split: str, n: int, gz: bool = False) -> Path:
    """Write the first n pairs of a Multi30k split as {folder}/{split}.de/.en; returns the prefix."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        text = "".join(f"{line}\n" for line in read_gz(f"{split}.{lang}", n))
        if gz:
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write(text)
        else:
            (folder / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return folder / split


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2000 training pairs (gzipped, like the real files), 100 dev, 100 test."""
    folder = tmp_path_factory.mktemp("m30k")
    write_slice(folder, "train", 2000, gz=True)
    write_slice(folder, "val", 100)
    write_slice(folder, "test_2016_flickr", 100)
    return folder


def make_config(tmp_path: Path, corpus: Path, **sections: dict) -> Path:
    """A copy of configs/smoke.yaml with paths into tmp_path and `sections` merged in."""
    raw = yaml.safe_load(SMOKE_CONFIG.read_text())
    raw["data"].update(train=str(corpus / "train"), dev=str(corpus / "val"),
                       test=str(corpus / "test_2016_flickr"), out_dir=str(tmp_path / "data"))
    raw["training"]["run_dir"] = str(tmp_path / "run")
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """A config whose data folder has been preprocessed once (shared by model/train tests)."""
    from nmt.config import load_config
    from nmt.data.preprocess import preprocess

    tmp = tmp_path_factory.mktemp("prepared")
    config = make_config(tmp, corpus_dir)
    preprocess(load_config(config))
    return config


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory, prepared: Path) -> Path:
    """A run folder with a checkpoint of the smoke model after a few dozen updates."""
    from nmt.config import load_config
    from nmt.train.trainer import Trainer

    run = tmp_path_factory.mktemp("trained") / "run"
    config = load_config(prepared, [f"training.run_dir={run}", "training.max_updates=40",
                                    "training.validate_every=20", "training.val_max_sentences=20"])
    Trainer(config).train()
    return run


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory, trained_run: Path) -> Path:
    """`trained_run`'s best.pt exported as a model file (`nmt export`)."""
    from nmt.modelfile.file import export_model

    out = tmp_path_factory.mktemp("exported") / "model.nmt"
    export_model(trained_run / "best.pt", out)
    return out


class CliServer:
    """`nmt ARGS` for tests that run many commands: tests/cli_server.py forks each one as its own process
    from an interpreter that has imported nmt and torch once, instead of starting Python for each."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cli_server.py"))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, *args: str, stdin: bytes | str | None = None, cwd: Path | None = None, text: bool = False,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """Like subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=text)."""
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            if stdin is not None:
                (folder / "stdin").write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
            request = {"args": list(args), "cwd": str(cwd or Path.cwd()), "env": dict(os.environ),
                       "timeout": timeout, "stdin": str(folder / "stdin") if stdin is not None else None,
                       "stdout": str(folder / "stdout"), "stderr": str(folder / "stderr")}
            if self.process.poll() is not None:
                raise RuntimeError("tests/cli_server.py ended")
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            reply = self.process.stdout.readline()
            if not reply:
                raise RuntimeError("tests/cli_server.py ended")
            result = json.loads(reply)
            out, err = (folder / "stdout").read_bytes(), (folder / "stderr").read_bytes()
            if text:
                out, err = out.decode(), err.decode()
            if result["timed_out"]:
                raise subprocess.TimeoutExpired(["nmt", *args], timeout, out, err)
            return subprocess.CompletedProcess(["nmt", *args], result["returncode"], out, err)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


_server: CliServer | None = None


def nmt_server() -> CliServer:
    """The session's CliServer, started on first use (and again if it died)."""
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = CliServer()
    return _server


@pytest.fixture(scope="session", autouse=True)
def _stop_nmt_server() -> Iterator[None]:
    yield
    if _server is not None:
        _server.close()


def link_marker(folder: Path) -> Path:
    """Make `folder` with its marker a symbolic link to a user's file beside it (returned, holding "mine\n")."""
    folder.mkdir()
    victim = folder.parent / "victim.txt"
    victim.write_text("mine\n")
    (folder / ".nmt-folder.json").symlink_to(victim)
    return victim
