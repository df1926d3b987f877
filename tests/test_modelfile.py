"""Model files: export, load anywhere, the card, old checkpoints, errors, and who imports what."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.decode.translator import Translator
from nmt.model.modelfile import MODEL_FORMAT, ModelFileError, export_model, load_model
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


def texts(translator: Translator, lines: list[str]) -> list[str]:
    return [t.text for t in translator.translate(lines)]


def test_model_file_alone_translates_like_the_checkpoint(trained_run, model_file):
    assert [p.name for p in model_file.parent.iterdir()] == ["model.nmt"]
    from_checkpoint = Translator.load(trained_run / "best.pt", device="cpu", precision="fp32")
    from_file = Translator.load(model_file, device="cpu", precision="fp32")
    assert texts(from_file, SOURCES) == texts(from_checkpoint, SOURCES)


def test_model_file_contents(trained_run, model_file):
    state = torch.load(model_file, weights_only=True)          # no pickled code in the file
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


def test_old_checkpoint_needs_its_run_folder(trained_run, tmp_path):
    state = torch.load(trained_run / "best.pt", weights_only=True)
    del state["tokenizer"], state["card"]                      # as checkpoints were before model files
    inside = trained_run / "old-style.pt"
    torch.save(state, inside)
    try:
        assert texts(Translator.load(inside, device="cpu"), SOURCES[:1])
        outside = tmp_path / "old-style.pt"
        shutil.move(inside, outside)
        result = run_cli("translate", "--checkpoint", str(outside), stdin="Ein Hund.\n")
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and "without an embedded tokenizer" in result.stderr
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


def test_bad_model_files_are_one_line_errors(model_file, tmp_path):
    truncated = tmp_path / "truncated.nmt"
    truncated.write_bytes(model_file.read_bytes()[:5000])
    other_format = tmp_path / "future.nmt"
    state = torch.load(model_file, weights_only=True)
    torch.save({**state, "format": 99}, other_format)
    not_nmt = tmp_path / "weights.nmt"
    torch.save({"weight": torch.zeros(2)}, not_nmt)
    for path, message in ((truncated, "is truncated or corrupt"), (other_format, "has format 99"),
                          (not_nmt, "is not an nmt model file"), (tmp_path / "missing.nmt", "does not exist")):
        with pytest.raises(ModelFileError, match=message):
            load_model(path)
        result = run_cli("info", str(path))
        assert result.returncode == 2 and result.stderr.startswith("error: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_model_file_with_damaged_weight_bytes_is_refused(model_file, tmp_path):
    """One byte changed inside the largest weight record: torch.load reads it without complaint,
    so the records' CRC-32 must catch it (before, translations came out empty)."""
    import zipfile

    data = bytearray(model_file.read_bytes())
    with zipfile.ZipFile(model_file) as archive:
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
def test_a_model_file_with_damaged_zip_headers_is_refused(model_file, tmp_path, where):
    """Flipped bytes in the zip structure that torch.load may not notice either: one clean error."""
    import zipfile

    data = bytearray(model_file.read_bytes())
    with zipfile.ZipFile(model_file) as archive:
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
        if "train" in path.relative_to(REPO / "nmt").parts or path.name == "cli.py":
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
