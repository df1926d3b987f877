"""Model files and checkpoints that torch.load reads without complaint but nmt must refuse (nmt.modelfile.check):
wrong weights, views larger than their bytes, NaN, oversized configs, sections of the wrong type, damaged
checkpoints, vocabulary entries naming files elsewhere. Each is one `error:` line and exit 2, never garbage."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from nmt.modelfile.file import LEGACY_MODEL_FORMAT, ModelFileError, load_model, read_state
from nmt.modelfile.tensors import write_model_file
from nmt.train.checkpoint import CheckpointError, average_checkpoints, load_checkpoint
from tests.conftest import nmt_server


def run(*args: str, stdin: str | None = None):
    return nmt_server().run(*args, stdin=stdin, text=True, timeout=120)


def one_error(result, message: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


def rewrite(model_file: Path, folder: Path, change, layout: str = "pickled") -> Path:
    """A copy of the model file whose dictionary `change` edited, with valid checksums: in format 1
    (`torch.save`, which can hold any tensor view) or format 2 (safetensors)."""
    state, _ = read_state(model_file)
    change(state)
    out = folder / "changed.nmt"
    if layout == "pickled":
        torch.save({**state, "format": LEGACY_MODEL_FORMAT}, out)
    else:
        write_model_file(state, out)
    return out


def _set(section: str, value):
    def change(state):
        state[section] = value
    return change


def _weights(edit):
    def change(state):
        edit(state["model"])
    return change


def _config(section: str, key: str, value):
    def change(state):
        state["config"][section][key] = value
    return change


CASES = {
    "all weights NaN": (_weights(lambda w: [t.fill_(float("nan")) for t in w.values()]), "non-finite values"),
    "one weight inf": (_weights(lambda w: w["decoder.output.weight"].view(-1).__setitem__(0, float("inf"))),
                       "weight decoder.output.weight holds 1 non-finite values"),
    "int64 weights": (_weights(lambda w: w.update({k: t.long() for k, t in w.items()})), "is torch.int64"),
    "missing weight": (_weights(lambda w: w.pop("decoder.output.bias")), "lacks weight decoder.output.bias"),
    "extra weight": (_weights(lambda w: w.update({"decoder.extra": torch.zeros(3)})),
                     "has unknown weight decoder.extra"),
    "wrong shape": (_weights(lambda w: w.update({"decoder.output.bias": torch.zeros(7)})),
                    "weight decoder.output.bias has shape (7,)"),
    "a view of 10^12 elements": (_weights(lambda w: w.update({"decoder.output.bias": torch.zeros(1).expand(10**12)})),
                                 "weight decoder.output.bias has shape (1000000000000,)"),
    "a view larger than its bytes": (_weights(lambda w: w.update(
        {"decoder.output.weight": torch.zeros(1).expand(w["decoder.output.weight"].shape)})),
        "weight decoder.output.weight declares"),
    "10^6 decoder layers": (_config("model", "decoder_layers", 10**6),
                            "its config is unusable: `model.decoder_layers` must be <= 64"),
    "a model larger than memory": (lambda s: s["config"]["model"].update(
        encoder_hidden=16384, decoder_hidden=16384, encoder_layers=64, decoder_layers=64),
        "more than this machine's"),
    "a stored length penalty of 9e18": (_config("decoding", "length_penalty", 9e18),
                                        "`decoding.length_penalty` must be <= 10.0, got 9e+18"),
    "config of the wrong type": (_set("config", "big"), "its config is str, not a mapping"),
    "a config section of the wrong type": (_set("config", {"model": [1, 2]}),
                                           "its config is unusable: `model` must be a mapping"),
    "card of the wrong type": (_set("card", [1, 2]), "card is list, not a mapping"),
    "card with a text BLEU": (_set("card", {"dev": {"bleu": "high", "signature": "x", "step": 1}}),
                              "card.dev.bleu is str"),
    "card languages without src": (_set("card", {"languages": {"tgt": "en"}}), "card.languages lacks src"),
    "shortlist of the wrong type": (_set("shortlist", "yes"), "shortlist is str, not a mapping"),
    "shortlist of floats": (_set("shortlist", {"targets": torch.zeros(3, 2), "vocab_sha256": "x",
                                              "frequent": torch.zeros(2, dtype=torch.long)}),
                            "shortlist.targets is a 2-D torch.float32"),
    "dtype of the wrong kind": (_set("dtype", "fp64"), "dtype 'fp64' is not one of"),
    "tokenizer pieces out of range": (lambda s: s["tokenizer"]["src"].update(pieces=[0, 1, 2, 3, 10**9]),
                                      "the embedded src tokenizer is unusable"),
    "tokenizer of the wrong type": (_set("tokenizer", {"src": "x", "tgt": None}), "tokenizer.src is str"),
}


# Sections safetensors cannot hold as they are (views, tensors as text): format 1 only.
PICKLED_ONLY = {"a view of 10^12 elements", "a view larger than its bytes", "shortlist of the wrong type",
                "tokenizer of the wrong type"}


@pytest.mark.parametrize("case", [case for case in CASES if case not in PICKLED_ONLY])
def test_a_safetensors_model_file_that_does_not_fit_is_refused(model_file, tmp_path, case):
    change, message = CASES[case]
    path = rewrite(model_file, tmp_path, change, "safetensors")
    with pytest.raises(ModelFileError, match=None) as caught:
        load_model(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
    one_error(run("info", str(path)), message)


@pytest.mark.parametrize("case", list(CASES))
def test_a_model_file_that_does_not_fit_is_refused_by_load_info_and_translate(model_file, tmp_path, case):
    change, message = CASES[case]
    path = rewrite(model_file, tmp_path, change)
    with pytest.raises(ModelFileError, match=None) as caught:
        load_model(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
    one_error(run("info", str(path)), message)
    result = run("translate", "-m", str(path), "-q", stdin="Ein Hund.\n")
    one_error(result, message)
    assert result.stdout == ""


def test_info_can_show_a_model_with_nonfinite_weights(model_file, tmp_path):
    path = rewrite(model_file, tmp_path, CASES["all weights NaN"][0])
    result = run("info", str(path), "--allow-nonfinite")
    assert result.returncode == 0 and "# nmt model" in result.stdout, result.stderr
    assert "- BROKEN: non-finite values (NaN or inf) in encoder.embed.weight, " in result.stdout
    assert "BROKEN" not in run("info", str(model_file)).stdout


def test_an_intact_model_file_passes_every_check(model_file):
    assert load_model(model_file).build() is not None
    assert run("info", str(model_file)).returncode == 0


# ---------------------------------------------------------------------------------------------
# Checkpoints: the model file's integrity check


def flip_record(path: Path, tensor: torch.Tensor, out: Path, count: int = 64, value: int = 0x7E) -> None:
    """A copy of `path` with `count` bytes in the middle of `tensor`'s record set to `value`
    (0x7e7e7e7e as float32 is 8.4e37): the zip stays readable, only its CRC-32 tells."""
    raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        record = next(info for info in archive.infolist() if "/data/" in info.filename and archive.read(info) == raw)
    header = record.header_offset
    name_len = int.from_bytes(data[header + 26:header + 28], "little")
    extra_len = int.from_bytes(data[header + 28:header + 30], "little")
    start = header + 30 + name_len + extra_len + record.file_size // 2
    data[start:start + count] = bytes([value]) * count
    out.write_bytes(bytes(data))


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    """A copy of the trained run folder (its checkpoints can be damaged and averaged there)."""
    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder, ignore=shutil.ignore_patterns("*.lock", "lock"))
    return folder


def test_a_checkpoint_with_flipped_weight_bytes_is_refused_everywhere(run_copy, tmp_path):
    best = run_copy / "best.pt"
    weight = torch.load(best, weights_only=True)["model"]["decoder.output.weight"]
    damaged = run_copy / "damaged.pt"
    flip_record(best, weight, damaged)
    torch.load(damaged, weights_only=True)                 # torch itself does not notice
    message = f"checkpoint {damaged} is damaged: its record"
    with pytest.raises(ModelFileError, match=message):
        load_model(damaged)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(damaged)
    result = run("translate", "-m", str(damaged), "-q", stdin="Ein Hund.\n")
    one_error(result, message)
    assert result.stdout == ""
    exported = tmp_path / "model.nmt"
    one_error(run("export", str(damaged), "-o", str(exported)), message)
    assert not exported.exists() and not list(tmp_path.glob("*.nmt*"))
    averaged = run_copy / "averaged.pt"
    one_error(run("average", str(best), str(damaged), "-o", str(averaged)), message)
    assert not averaged.exists()


def test_average_reads_each_checkpoint_once_and_checks_it(run_copy, monkeypatch):
    """Each checkpoint is read once (its optimiser state left unread), and that one read is checked as a model."""
    best, last = run_copy / "best.pt", run_copy / "last.pt"
    load, reads = torch.load, []

    def counting(path, *args, **kwargs):
        reads.append(Path(path).name)
        return load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    averaged = average_checkpoints([best, last])
    assert sorted(reads) == ["best.pt", "last.pt"] and "optimizer" not in averaged


def test_average_refuses_a_checkpoint_with_nonfinite_weights(run_copy):
    best = run_copy / "best.pt"
    state = torch.load(best, weights_only=True)
    state["model"]["decoder.output.weight"].view(-1)[:64] = float("nan")
    broken = run_copy / "broken.pt"
    torch.save(state, broken)
    with pytest.raises(CheckpointError, match="non-finite"):
        average_checkpoints([best, broken])
    one_error(run("export", str(broken), "-o", str(run_copy / "x.nmt")), "non-finite")
