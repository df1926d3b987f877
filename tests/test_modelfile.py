"""Model files: export, load anywhere, the card, old checkpoints, errors, and who imports what."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.decode.translator import Translator
from nmt.modelfile.file import (
    LEGACY_MODEL_FORMAT,
    MODEL_FORMAT,
    ModelFileError,
    export_model,
    load_model,
    read_state,
)
from nmt.modelfile.tensors import write_model_file
from tests.test_translate import run_cli

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "", "Eine Frau liest ein Buch."]


@pytest.fixture(scope="module")
def model_file(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke model exported and moved alone into an empty folder elsewhere."""
    out = tmp_path_factory.mktemp("export") / "model.nmt"
    result = run_cli("export", str(trained_run / "best.pt"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    alone = tmp_path_factory.mktemp("elsewhere") / "model.nmt"
    shutil.move(out, alone)
    return alone


@pytest.fixture(scope="module")
def legacy_file(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model as nmt wrote model files before safetensors (format 1): the same dictionary, `torch.save`d."""
    state, _ = read_state(model_file)
    path = tmp_path_factory.mktemp("legacy") / "old.nmt"
    torch.save({**state, "format": LEGACY_MODEL_FORMAT}, path)
    return path


def texts(translator: Translator, lines: list[str]) -> list[str]:
    return [t.text for t in translator.translate(lines)]


def test_model_file_alone_translates_like_the_checkpoint(trained_run, model_file):
    assert [p.name for p in model_file.parent.iterdir()] == ["model.nmt"]
    from_checkpoint = Translator.load(trained_run / "best.pt", device="cpu", precision="fp32")
    from_file = Translator.load(model_file, device="cpu", precision="fp32")
    assert texts(from_file, SOURCES) == texts(from_checkpoint, SOURCES)


def test_model_file_contents(trained_run, model_file):
    state, pickled = read_state(model_file)
    assert not pickled and model_file.read_bytes()[:4] != b"PK\x03\x04"    # safetensors: nothing to unpickle
    assert state["kind"] == "nmt-model" and state["format"] == MODEL_FORMAT and state["dtype"] == "fp32"
    assert "optimizer" not in state and "rng" not in state
    assert isinstance(state["tokenizer"]["src"]["spm"], bytes)
    assert state["tokenizer"]["tgt"]["pieces"][:4] == [0, 1, 2, 3]
    card = state["card"]
    assert card["languages"] == {"src": "de", "tgt": "en"}
    assert card["dev"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    checkpoint = torch.load(trained_run / "best.pt", weights_only=True)
    assert card["dev"]["step"] == checkpoint["step"]
    shortlist = sum(t.numel() * t.element_size() for t in state["shortlist"].values() if torch.is_tensor(t))
    sizes = [path.stat().st_size - shortlist for path in (model_file, trained_run / "best.pt")]  # both embed it
    assert sizes[0] < 0.5 * sizes[1]                                                  # weights only


def test_half_precision_exports(trained_run, tmp_path):
    sizes = {}
    for dtype, torch_dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        out = tmp_path / f"{dtype}.nmt"
        export_model(trained_run / "best.pt", out, dtype)
        loaded = load_model(out)
        assert {t.dtype for t in loaded.weights.values() if t.is_floating_point()} == {torch_dtype}
        sizes[dtype] = out.stat().st_size
        translator = Translator.load(out, device="cpu", precision="fp32")
        assert next(translator.model.parameters()).dtype == torch.float32     # computed in fp32 as usual
        assert len(translator.translate(SOURCES)) == len(SOURCES)
    weight_bytes = sum(t.numel() * 4 for t in load_model(tmp_path / "fp32.nmt").weights.values())
    for half in ("fp16", "bf16"):                                # half the weights' bytes saved
        assert abs((sizes["fp32"] - sizes[half]) - weight_bytes / 2) < 0.05 * weight_bytes


def test_info_shows_the_card(model_file):
    result = run_cli("info", str(model_file))
    assert result.returncode == 0, result.stderr
    card = result.stdout
    for expected in ("de -> en", "SentencePiece", "parameters:", "dev BLEU:", "nrefs:1|case:mixed", "train",
                     "sentence pairs"):
        assert expected in card, (expected, card)
    as_json = run_cli("info", "--json", str(model_file))
    import json

    info = json.loads(as_json.stdout)
    assert info["parameters"] == sum(t.numel() for t in load_model(model_file).weights.values())
    assert info["data"]["train"]["pairs"] > 0


def test_cli_translates_with_a_model_file_and_a_moved_checkpoint(trained_run, model_file, tmp_path):
    moved = tmp_path / "moved.pt"
    shutil.copyfile(trained_run / "best.pt", moved)            # new checkpoints embed their tokenizer
    outputs = []
    for option, path in (("--model", model_file), ("--checkpoint", moved), ("--checkpoint", trained_run / "best.pt")):
        result = run_cli("translate", option, str(path), "--device", "cpu", "--precision", "fp32", "-q",
                         stdin="".join(f"{s}\n" for s in SOURCES))
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0].split("\n")) == len(SOURCES) + 1


def test_a_checkpoint_without_its_tokenizer_is_refused_even_in_its_run_folder(trained_run):
    state = torch.load(trained_run / "best.pt", weights_only=True)
    del state["tokenizer"], state["card"]                      # as checkpoints were before model files
    inside = trained_run / "old-style.pt"
    torch.save(state, inside)
    try:
        with pytest.raises(ModelFileError, match="embeds no tokenizer"):
            load_model(inside)
        result = run_cli("translate", "--checkpoint", str(inside), stdin="Ein Hund.\n")
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and "embeds no tokenizer" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        inside.unlink(missing_ok=True)


def test_checkpoint_of_an_earlier_release_with_a_retired_key_loads(trained_run, tmp_path):
    state = torch.load(trained_run / "best.pt", weights_only=True)
    state["config"]["data"]["spm_train_sentences"] = 0          # written by nmt before streaming preprocessing
    old = tmp_path / "old.pt"
    torch.save(state, old)
    assert texts(Translator.load(old, device="cpu"), SOURCES) == texts(Translator.load(trained_run / "best.pt",
                                                                                       device="cpu"), SOURCES)


def test_a_model_file_of_the_earlier_format_still_loads(model_file, legacy_file, tmp_path):
    """Format 1 (a torch.save dictionary, as nmt wrote before safetensors) loads, translates the same,
    and exports to format 2 with the same weights."""
    assert legacy_file.read_bytes()[:4] == b"PK\x03\x04" and read_state(legacy_file)[1]
    assert load_model(legacy_file).kind == "model"
    assert texts(Translator.load(legacy_file, device="cpu"), SOURCES) == texts(Translator.load(model_file,
                                                                                              device="cpu"), SOURCES)
    result = run_cli("info", str(legacy_file))
    assert result.returncode == 0 and "dev BLEU:" in result.stdout, result.stderr
    again = tmp_path / "again.nmt"
    export_model(legacy_file, again)
    new, old = load_model(again).weights, load_model(model_file).weights
    assert new.keys() == old.keys() and all(new[name].equal(old[name]) for name in old)


def test_bad_model_files_are_one_line_errors(model_file, tmp_path):
    from safetensors.torch import save_file

    truncated = tmp_path / "truncated.nmt"
    truncated.write_bytes(model_file.read_bytes()[:5000])
    other_format = tmp_path / "future.nmt"
    state, _ = read_state(model_file)
    write_model_file({**state, "format": 99}, other_format)
    old_other_format = tmp_path / "future-pickled.nmt"
    torch.save({**state, "format": 99}, old_other_format)
    not_nmt = tmp_path / "weights.nmt"
    save_file({"weight": torch.zeros(2)}, not_nmt)
    not_nmt_pickled = tmp_path / "weights-pickled.nmt"
    torch.save({"weight": torch.zeros(2)}, not_nmt_pickled)
    text = tmp_path / "notes.nmt"
    text.write_text("not a model\n")
    fifo = tmp_path / "fifo.nmt"
    os.mkfifo(fifo)
    (tmp_path / "empty.nmt").write_bytes(b"")
    for path, message in ((truncated, "is truncated or corrupt"), (other_format, "has format 99"),
                          (old_other_format, "has format 99"), (text, f"{text} is not an nmt model file (neither"),
                          (not_nmt, "is not an nmt model file"), (not_nmt_pickled, "is not an nmt model file"),
                          (tmp_path / "missing.nmt", "does not exist"),
                          (fifo, f"model file {fifo} is a FIFO (named pipe), not a file"),
                          (Path("/dev/zero"), "model file /dev/zero is a character device, not a file"),
                          (tmp_path / "empty.nmt", "is truncated or corrupt (only 0 bytes)")):
        with pytest.raises(ModelFileError, match=re.escape(message)):
            load_model(path)
        result = run_cli("info", str(path))
        assert result.returncode == 2 and result.stderr.startswith("error: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_model_file_with_damaged_bytes_is_refused(model_file, tmp_path):
    """One byte changed inside the largest tensor, or in the metadata: safetensors reads both without complaint
    (it keeps no checksum), so nmt's CRC-32s must catch them (before, translations came out empty)."""
    import json

    from safetensors.torch import load_file

    data = bytearray(model_file.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    name, entry = max(((k, v) for k, v in header.items() if k != "__metadata__"),
                      key=lambda item: item[1]["data_offsets"][1] - item[1]["data_offsets"][0])
    start, end = entry["data_offsets"]
    weights = bytearray(data)
    weights[8 + size + (start + end) // 2] ^= 0x40
    metadata = bytearray(data)
    at = metadata.index(b"beam_size")
    metadata[at:at + 9] = b"beam_sizf"
    for damaged, message in ((weights, f"its tensor {name} fails its checksum"),
                             (metadata, "its metadata fails its checksum")):
        path = tmp_path / "damaged.nmt"
        path.write_bytes(bytes(damaged))
        load_file(path)                                  # safetensors itself does not notice
        with pytest.raises(ModelFileError, match=f"model file {path} is damaged: {message}"):
            load_model(path)
        result = run_cli("translate", "-m", str(path), "-q", stdin="Ein Hund.\n")
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == f"error: model file {path} is damaged: {message}; copy or export it again"


def test_a_format_1_model_file_with_damaged_weight_bytes_is_refused(legacy_file, tmp_path):
    """One byte changed inside the largest weight record: torch.load reads it without complaint,
    so the records' CRC-32 must catch it."""
    import zipfile

    data = bytearray(legacy_file.read_bytes())
    with zipfile.ZipFile(legacy_file) as archive:
        record = max((info for info in archive.infolist() if "/data/" in info.filename),   # not data.pkl
                     key=lambda info: info.file_size)
    header = record.header_offset
    name_len, extra_len = int.from_bytes(data[header + 26:header + 28], "little"), \
        int.from_bytes(data[header + 28:header + 30], "little")
    data[header + 30 + name_len + extra_len + record.file_size // 2] ^= 0x40
    damaged = tmp_path / "damaged.nmt"
    damaged.write_bytes(bytes(data))
    torch.load(damaged, weights_only=True)               # torch itself does not notice
    with pytest.raises(ModelFileError, match=f"model file {damaged} is damaged: its record .* fails its checksum"):
        load_model(damaged)
    result = run_cli("translate", "-m", str(damaged), "-q", stdin="Ein Hund.\n")
    assert result.returncode == 2 and "is damaged" in result.stderr and result.stdout == ""


@pytest.mark.parametrize("where", ["local name", "central version"])
def test_a_format_1_model_file_with_damaged_zip_headers_is_refused(legacy_file, tmp_path, where):
    """Flipped bytes in the zip structure that torch.load may not notice either: one clean error."""
    import zipfile

    data = bytearray(legacy_file.read_bytes())
    with zipfile.ZipFile(legacy_file) as archive:
        central = archive.start_dir
    data[30 if where == "local name" else central + 6] ^= 0xFF
    damaged = tmp_path / "damaged.nmt"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=f"model file {damaged} is (truncated or corrupt|damaged)"):
        load_model(damaged)


def test_export_never_replaces_what_nmt_did_not_write(trained_run, model_file, tmp_path):
    notes = tmp_path / "notes.nmt"
    notes.write_text("my notes\n")
    result = run_cli("export", str(trained_run / "best.pt"), "-o", str(notes))
    assert result.returncode == 2 and "exists" in result.stderr
    result = run_cli("export", str(trained_run / "best.pt"), "-o", str(notes), "--force")
    assert result.returncode == 2 and "not an nmt model file" in result.stderr
    assert notes.read_text() == "my notes\n"
    copy = tmp_path / "copy.nmt"
    shutil.copyfile(model_file, copy)
    result = run_cli("export", str(trained_run / "best.pt"), "-o", str(copy), "--force", "--dtype", "fp16")
    assert result.returncode == 0, result.stderr
    assert load_model(copy).dtype == "fp16"
    result = run_cli("export", str(trained_run / "best.pt"), "-o", str(tmp_path / "x.nmt"), "--dtype", "int8")
    assert result.returncode == 2 and "--dtype" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.nmt", "notes.nmt"]     # no temporary files left


def test_averaged_checkpoint_keeps_tokenizer_but_not_dev_scores(trained_run, tmp_path):
    best = sorted(trained_run.glob("best-step*.pt"))
    out = tmp_path / "avg.pt"
    result = run_cli("average", *map(str, best), "-o", str(out))
    assert result.returncode == 0, result.stderr
    loaded = load_model(out)
    assert "dev" not in loaded.card and loaded.card["averaged_from"] == [p.name for p in best]
    assert texts(Translator.load(out, device="cpu"), SOURCES[:1])


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_nothing_outside_train_and_the_cli_imports_train():
    offenders = {}
    for path in (REPO / "nmt").rglob("*.py"):
        parts = path.relative_to(REPO / "nmt").parts
        if parts[0] in ("train", "cli"):     # the command line runs training
            continue
        bad = sorted(n for n in _imports(path) if n == "nmt.train" or n.startswith("nmt.train."))
        if bad:
            offenders[str(path.relative_to(REPO))] = bad
    assert offenders == {}


def test_importing_nmt_is_cheap_and_changes_nothing():
    code = ("import os, sys; before = dict(os.environ); import nmt; "
            "assert dict(os.environ) == before, 'environment changed'; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from nmt import Translator; assert Translator.__name__ == 'Translator'; print('ok')")
    env = {k: v for k, v in __import__("os").environ.items() if k != "LRU_CACHE_CAPACITY"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
