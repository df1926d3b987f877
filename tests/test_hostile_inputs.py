"""Hostile structure in what nmt reads (nmt.fs.bounded): deep JSON, YAML aliases that expand to billions of
nodes, huge configs, pipes and devices given as files. Each is refused with one `error:` line and exit 2
within seconds (the timeouts make a hang fail the test), never an internal error or minutes of work."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from nmt.fs.bounded import MAX_DEPTH, BoundError, check_yaml, load_yaml, loads_json, read_json
from nmt.fs.folders import MARKER, write_marker
from tests.conftest import nmt_server

DEEP = "[" * 100_000 + "]" * 100_000
QUICK = 20          # seconds: far above what a refusal takes, far below what the unbounded parse took


def run(*args: str, timeout: float = QUICK):
    return nmt_server().run(*args, text=True, timeout=timeout)


def one_error(result, *messages: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr
    for message in messages:
        assert message in lines[0], lines[0]
    return lines[0]


def laughs(levels: int = 9, flow: bool = False) -> str:
    """A YAML mapping whose last anchor expands to 9**levels scalars (a "billion laughs"): indented block
    lines, or with `flow` one line (for --set)."""
    items = [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]" for i in range(levels)]
    return "{" + ", ".join(items) + "}" if flow else "".join(f"  {item}\n" for item in items)


# ---------------------------------------------------------------------------------------------- the reader


def test_json_deeper_than_the_bound_is_refused_and_the_bound_itself_read():
    at_bound = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads_json(at_bound) == json.loads(at_bound)
    for text in ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), DEEP, '{"a":' * 5000 + "1" + "}" * 5000):
        with pytest.raises(BoundError, match=f"nested deeper than {MAX_DEPTH}"):
            loads_json(text)
    with pytest.raises(BoundError, match="larger than 1 KB"):
        loads_json("[" + "1," * 1000 + "1]", max_bytes=1024)


def test_a_json_key_given_twice_is_refused_at_any_depth():
    assert loads_json('{"a": {"b": 1, "c": 2}, "d": [{"b": 3}, {"b": 4}]}') == {"a": {"b": 1, "c": 2},
                                                                              "d": [{"b": 3}, {"b": 4}]}
    for text in ('{"q": "x", "source": "de", "q": "y"}', '[{"a": {"b": 1, "b": 1}}]'):
        with pytest.raises(ValueError, match="the key '[qb]' is given twice in one object"):
            loads_json(text)


def test_yaml_aliases_are_counted_expanded_and_ordinary_anchors_still_load():
    with pytest.raises(BoundError, match="more than 100,000 values once its aliases"):
        check_yaml("data:\n" + laughs())
    assert load_yaml("base: &b {lr: 0.1}\ntraining:\n  <<: *b\n  lr: 0.2\n")["training"] == {"lr": 0.2}
    with pytest.raises(BoundError, match="nested deeper than"):
        check_yaml("- " * 1000 + "x\n")
    with pytest.raises(BoundError, match="refers to no finished anchor"):
        check_yaml("a: &a [1, *a]\n")
    with pytest.raises(BoundError, match="larger than 1 MB"):
        check_yaml("a: [" + "1, " * 400_000 + "1]\n")


def test_a_pipe_or_device_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "scores.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), (Path("/dev/zero"), "character device")):
        with pytest.raises(OSError, match=f"not a regular file \\(a {kind}"):
            read_json(path)


# ---------------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize(("name", "text", "named"), [
    ("laughs in an unknown key", "data:\n" + laughs(), "config.yaml line 7: refused: more than 100,000 values"),
    ("laughs in a known key", "data:\n  train: " + laughs(flow=True) + "\n", "line 2: refused: more than 100,000"),
    ("deep", "data: " + DEEP + "\n", "line 1: refused: nested deeper than 32 levels"),
    ("4 MB list", "data:\n  train: [" + "x, " * 1_400_000 + "x]\n", "refused: larger than 1 MB"),
])
def test_hostile_config_files_are_refused_quickly(tmp_path, name, text, named):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    for command in ("preprocess", "train"):
        one_error(run(command, "--config", str(config)), f"{config}", named)


def test_hostile_set_values_are_refused_quickly(prepared, tmp_path):
    for value, named in ((laughs(flow=True), "the value is more than 100,000 values"), ("[" * 5000 + "]" * 5000,
                                                                          "the value is nested deeper than 32")):
        result = run("train", "--config", str(prepared), "--set", f"training.lr={value}",
                     "--set", f"training.run_dir={tmp_path / 'run'}")
        one_error(result, "override `training.lr=...`", named)
    assert not (tmp_path / "run").exists()


def test_a_config_that_is_a_pipe_is_named_for_what_it_is(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    one_error(run("preprocess", "--config", str(fifo)), f"config file {fifo} is a FIFO (named pipe), not a YAML file")


# ---------------------------------------------------------------------------------------------- model files


def _with_metadata(source: Path, target: Path, key: str, value: str) -> Path:
    """`source` with one metadata entry replaced, its checksums made to match (a crafted file, not a damaged one)."""
    from safetensors import safe_open
    from safetensors.torch import save

    from nmt.modelfile import tensors as model_tensors

    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    metadata[key] = value
    metadata["nmt.checksums"] = json.dumps({"metadata": model_tensors._metadata_crc(metadata),
                                            "tensors": {n: model_tensors._crc(t) for n, t in sorted(tensors.items())}})
    target.write_bytes(save(tensors, metadata))
    return target


@pytest.mark.parametrize("key", ["nmt.config", "nmt.card", "nmt.shortlist"])
def test_deep_json_in_model_metadata_is_refused(model_file, tmp_path, key):
    crafted = _with_metadata(model_file, tmp_path / "deep.nmt", key, DEEP)
    one_error(run("info", str(crafted)), f"{crafted}: its metadata is unusable (JSON nested deeper than 32 levels)")
    one_error(run("translate", "-m", str(crafted)), f"{crafted}: its metadata is unusable")


def test_pipes_devices_and_text_given_as_models_are_named_for_what_they_are(prepared, tmp_path):
    fifo = tmp_path / "model.nmt"
    os.mkfifo(fifo)
    text = tmp_path / "notes.nmt"
    text.write_text("these are my notes, not a model\n")
    for path, named in ((fifo, f"model file {fifo} is a FIFO (named pipe), not a file"),
                        (Path("/dev/zero"), "model file /dev/zero is a character device, not a file"),
                        (text, f"{text} is not an nmt model file (neither safetensors nor a torch checkpoint")):
        one_error(run("info", str(path)), named)
        one_error(run("translate", "-m", str(path)), named)
        result = run("train", "--config", str(prepared), "--init-from", str(path),
                     "--set", f"training.run_dir={tmp_path / 'run'}")
        one_error(result, "`training.init_from`: ", named)
    assert not (tmp_path / "run").exists()


def test_a_deep_score_file_is_refused_by_export(model_file, tmp_path):
    scores = tmp_path / "test.json"
    scores.write_text(DEEP)
    result = run("export", str(model_file), "--format", "hf", "-o", str(tmp_path / "hf"),
                 "--score", f"multi30k_test_2016_flickr={scores}")
    one_error(result, f"{scores} is not JSON (JSON nested deeper than 32 levels)")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    result = run("export", str(model_file), "--format", "hf", "-o", str(tmp_path / "hf"),
                 "--score", f"multi30k_test_2016_flickr={fifo}")
    one_error(result, f"cannot read {fifo}: not a regular file (a FIFO (named pipe))")
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------- folders


def test_a_deep_data_manifest_is_refused(prepared, tmp_path):
    config = yaml.safe_load(prepared.read_text())
    data = tmp_path / "data"
    shutil.copytree(config["data"]["out_dir"], data, ignore=shutil.ignore_patterns(".nmt.lock"))
    (data / "manifest.json").write_text(DEEP)
    result = run("train", "--config", str(prepared), "--set", f"data.out_dir={data}",
                 "--set", f"training.run_dir={tmp_path / 'run'}")
    one_error(result, f"{data / 'manifest.json'} cannot be read as a manifest (JSON nested deeper than 32 levels)")
    assert not (tmp_path / "run").exists()


def test_a_deep_marker_makes_its_folder_foreign(prepared, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_marker(run_dir, "run")
    (run_dir / "last.pt").write_text("x")
    (run_dir / MARKER).write_text('{"kind": "run", "files": ' + DEEP + "}")
    result = run("train", "--config", str(prepared), "--set", f"training.run_dir={run_dir}", "--overwrite")
    one_error(result, f"{run_dir} holds files nmt did not write (last.pt)")
    assert (run_dir / "last.pt").read_text() == "x"
