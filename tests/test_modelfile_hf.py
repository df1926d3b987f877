"""Models in the field's layout: `nmt export --format hf`, loading the folder, hf:// from a Hub cache
laid out here (offline, no network), the model card's metadata, and the folder rules."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nmt.decode.translator import Translator
from tests.test_translate import run_cli

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "", "Eine Frau liest ein Buch."]
TESTSET = "multi30k_test_2016_flickr"
FILES = ["README.md", "config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json"]


def one_error(result: subprocess.CompletedProcess, message: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def scores_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `nmt evaluate --json` result."""
    folder = tmp_path_factory.mktemp("scores")
    (folder / "hyp.en").write_text("A dog runs over the meadow.\nTwo men play football.\n")
    (folder / "ref.en").write_text("A dog runs across the meadow.\nTwo men are playing soccer.\n")
    out = folder / "test.json"
    result = run_cli("evaluate", "--hyp", str(folder / "hyp.en"), "--ref", str(folder / "ref.en"), "--json", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def hf_folder(trained_run: Path, scores_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "nmt-de-en-smoke"
    result = run_cli("export", str(trained_run / "best.pt"), "--format", "hf", "-o", str(out),
                     "--score", f"{TESTSET}={scores_json}", "--license", "cc-by-4.0")
    assert result.returncode == 0, result.stderr
    return out


def texts(translator: Translator, lines: list[str]) -> list[str]:
    return [t.text for t in translator.translate(lines)]


def test_the_folder_translates_like_the_model_file(hf_folder, model_file):
    assert sorted(p.name for p in hf_folder.iterdir()) == FILES                  # and no temporary left beside it
    assert [p.name for p in hf_folder.parent.iterdir()] == [hf_folder.name]
    for beam in (1, 5):
        from_file = Translator.load(model_file, device="cpu", precision="fp32", beam_size=beam)
        from_folder = Translator.load(hf_folder, device="cpu", precision="fp32", beam_size=beam)
        assert texts(from_folder, SOURCES) == texts(from_file, SOURCES)


def test_the_weights_open_with_plain_safetensors(hf_folder, model_file):
    """No nmt and no unpickling needed to read the weights; the metadata is text."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from nmt.modelfile.file import load_model

    tensors = load_file(hf_folder / "model.safetensors")
    weights = load_model(model_file).weights
    assert all(name in tensors and tensors[name].equal(t) for name, t in weights.items())
    with safe_open(str(hf_folder / "model.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "pt" and metadata["nmt.kind"] == "nmt-model" and metadata["nmt.format"] == "2"
    assert json.loads(metadata["nmt.config"])["data"]["src_lang"] == "de"


def test_config_and_tokenizer_files(hf_folder, model_file):
    import sentencepiece as spm

    from nmt.modelfile.file import load_model

    loaded = load_model(model_file)
    config = json.loads((hf_folder / "config.json").read_text())
    assert config["library_name"] == "nmt" and config["source_language"] == "de" and config["target_language"] == "en"
    assert config["model"] == loaded.config.to_dict()["model"]
    assert config["tokenizer"]["target_vocab_size"] == len(loaded.tgt_vocab)
    assert config["nmt_version"] == __import__("nmt").__version__
    source = spm.SentencePieceProcessor(model_file=str(hf_folder / "source.spm"))
    assert source.encode("Ein Hund.", out_type=str) == loaded.src_vocab.sp.encode("Ein Hund.", out_type=str)
    vocab = json.loads((hf_folder / "vocab.json").read_text())
    assert len(vocab["target"]) == len(loaded.tgt_vocab) and vocab["target"][3] == loaded.tgt_vocab.sp.id_to_piece(3)


def test_the_model_card_front_matter(hf_folder, scores_json):
    text = (hf_folder / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["language"] == ["de", "en"] and front["license"] == "cc-by-4.0"
    assert front["library_name"] == "nmt" and front["tags"] == ["translation", "nmt", "rnn"]
    result = front["model-index"][0]["results"][0]
    assert front["model-index"][0]["name"] == hf_folder.name
    assert result["task"]["type"] == "translation" and result["dataset"]["name"] == TESTSET
    assert result["dataset"]["args"] == "de-en"
    evaluated = json.loads(scores_json.read_text())
    bleu = next(m for m in result["metrics"] if m["type"] == "bleu")
    assert bleu["value"] == evaluated["bleu"]["score"] and bleu["config"] == evaluated["bleu"]["signature"]
    assert bleu["config"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    escaped = evaluated["bleu"]["signature"].replace("|", "\\|")           # a table cell in Markdown
    assert f"| {TESTSET} | 2 | {evaluated['bleu']['score']:.2f} | {evaluated['chrf']['score']:.2f} | `{escaped}` |" \
        in text
    assert "dev BLEU:" in text and "hf://OWNER/nmt-de-en-smoke" in text


def test_huggingface_hub_reads_the_card(hf_folder):
    """The card follows the Hub's metadata spec, as huggingface_hub's own parser reads it."""
    hub = pytest.importorskip("huggingface_hub")
    card = hub.ModelCard.load(hf_folder / "README.md")
    assert card.data.library_name == "nmt" and card.data.license == "cc-by-4.0"
    results = card.data.eval_results
    assert [(r.dataset_name, r.metric_type) for r in results] == [(TESTSET, "bleu"), (TESTSET, "chrf")]
    assert results[0].task_type == "translation" and results[0].metric_config.startswith("nrefs:1|")


# ---------------------------------------------------------------------------------------------
# hf:// through huggingface_hub's cache, offline


def lay_out_cache(cache: Path, repo: str, folder: Path) -> str:
    """The Hub cache layout snapshot_download keeps: blobs by hash, a snapshot of links, refs/main."""
    commit = hashlib.sha1(repo.encode()).hexdigest()
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir()
    for file in folder.iterdir():
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return commit


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, hf_folder) -> str:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return lay_out_cache(tmp_path / "hub", "someone/nmt-de-en", hf_folder)


def test_translate_from_the_hub_cache_offline(offline_hub, model_file, hf_folder):
    stdin = "".join(f"{s}\n" for s in SOURCES)
    expected = run_cli("translate", "-m", str(model_file), "--device", "cpu", "-q", stdin=stdin)
    assert expected.returncode == 0, expected.stderr
    for name in ("hf://someone/nmt-de-en", f"hf://someone/nmt-de-en@{offline_hub}", str(hf_folder)):
        result = run_cli("translate", "-m", name, "--device", "cpu", "-q", stdin=stdin)
        assert result.returncode == 0, result.stderr
        assert result.stdout == expected.stdout
    code = ("from nmt import Translator; t = Translator.load('hf://someone/nmt-de-en', device='cpu'); "
            "print(t.translate(['Ein Hund.'])[0].text)")
    api = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert api.returncode == 0, api.stderr
    reference = run_cli("translate", "-m", str(model_file), "--device", "cpu", "-q", stdin="Ein Hund.\n").stdout
    assert api.stdout == reference


def test_a_model_missing_from_the_offline_cache_is_one_error(offline_hub):
    line = one_error(run_cli("translate", "-m", "hf://someone/other", "-q", stdin="Ein Hund.\n"), "hf://someone/other")
    assert "HF_HUB_OFFLINE" in line or "cached" in line
    one_error(run_cli("info", "hf://someone/nmt-de-en@no-such-tag"), "hf://someone/nmt-de-en@no-such-tag")
    one_error(run_cli("info", "hf://../etc"), "is not a Hub model name")


def test_hf_models_without_the_hub_extra(model_file):
    code = ("import sys; sys.modules['huggingface_hub'] = None; sys.argv = ['nmt', 'info', 'hf://someone/x']; "
            "from nmt.cli.main import main; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: hf:// models need the hub extra: pip install 'nmt[hub]'"


# ---------------------------------------------------------------------------------------------
# Where the folder may go


def test_export_hf_never_writes_into_a_folder_that_holds_files(trained_run, tmp_path, scores_json):
    best = str(trained_run / "best.pt")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine\n")
    one_error(run_cli("export", best, "--format", "hf", "-o", str(full)), "holds files")
    assert [p.name for p in full.iterdir()] == ["notes.txt"] and (full / "notes.txt").read_text() == "mine\n"
    a_file = tmp_path / "model.nmt"
    a_file.write_text("x")
    one_error(run_cli("export", best, "--format", "hf", "-o", str(a_file)), "is a file")
    one_error(run_cli("export", best, "--format", "hf", "-o", str(tmp_path / "new"), "--force"), "--force")
    one_error(run_cli("export", best, "-o", str(tmp_path / "m.nmt"), "--score", f"x={scores_json}"),
              "--score applies only to --format hf")
    one_error(run_cli("export", best, "--format", "hf", "-o", str(tmp_path / "new"), "--score", "noequals"),
              "--score noequals")
    one_error(run_cli("export", best, "--format", "hf", "-o", str(tmp_path / "new"), "--score", f"t={best}"),
              "is not JSON")
    one_error(run_cli("export", best, "--format", "hf", "-o", str(tmp_path / "new"), "--license", "My License"),
              "--license")
    one_error(run_cli("export", best, "--format", "zip", "-o", str(tmp_path / "new")), "--format")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "model.nmt"]       # nothing left behind
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("export", best, "--format", "hf", "-o", str(empty))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in empty.iterdir()) == FILES
    card = (empty / "README.md").read_text()
    assert "model-index" not in card and "license: unknown" in card
