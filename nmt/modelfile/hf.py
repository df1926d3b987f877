"""A Hugging Face model folder (`nmt export --format hf DIR`): model.safetensors (the nmt model file, all nmt
reads), and for the Hub and people config.json, source.spm, target.spm, vocab.json and README.md (a PyYAML front
matter with a `model-index` of `--score` results, then the card). Built under a temporary name and renamed into
place: DIR is absent, empty or complete.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import yaml

from nmt import __version__
from nmt.fs.bounded import read_json
from nmt.fs.folders import atomic_write, build_folder
from nmt.modelfile.card import describe, format_card, parameter_count
from nmt.modelfile.file import LoadedModel, export_model, load_model
from nmt.modelfile.hub import MODEL_FILE

TAGS = ["translation", "nmt", "rnn"]
_LICENSE = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
_TESTSET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
METRIC_NAMES = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER"}


class ExportError(ValueError):
    """An export that cannot be done as asked (bad --score, --license, folder)."""


@dataclass
class TestScore:
    testset: str
    sentences: int | None
    metrics: dict[str, tuple[float, str]]    # "bleu"|"chrf"|"ter" -> (score, sacreBLEU signature)


def read_score(option: str) -> TestScore:
    testset, sep, file = option.partition("=")
    where = f"--score {option}"
    if not sep or not _TESTSET.match(testset) or not file:
        raise ExportError(f"{where}: write TESTSET=RESULT.json, e.g. multi30k_test_2016_flickr=test.json "
                          "(a test set name of letters, digits, '.', '_', '-')")
    try:
        result = read_json(file)
    except FileNotFoundError:
        raise ExportError(f"{where}: {file} does not exist") from None
    except OSError as exc:
        raise ExportError(f"{where}: cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ExportError(f"{where}: {file} is not JSON (not UTF-8 text)") from None
    except ValueError as exc:
        raise ExportError(f"{where}: {file} is not JSON ({exc})") from None
    metrics = {}
    for name in METRIC_NAMES:
        entry = result.get(name) if isinstance(result, dict) else None
        if entry is None and name != "bleu":
            continue
        score, signature = (entry.get("score"), entry.get("signature")) if isinstance(entry, dict) else (None, None)
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) \
                or not isinstance(signature, str):
            raise ExportError(f"{where}: {file} is not an `nmt evaluate --json` result ({name}.score and "
                              f"{name}.signature missing or of the wrong type)")
        metrics[name] = (float(score), signature)
    sentences = result.get("sentences")
    return TestScore(testset, sentences if isinstance(sentences, int) and not isinstance(sentences, bool) else None,
                     metrics)


def check_target(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"--output {folder} is a file; --format hf writes a folder: give a new folder name")
    if folder.is_dir() and any(folder.iterdir()):
        raise ExportError(f"--output {folder} is a folder that holds files; --format hf writes only a new or empty "
                          "folder: choose another name, or empty it yourself")
    if not folder.parent.is_dir():
        raise ExportError(f"--output {folder}: folder {folder.parent} does not exist")


def export_hf(source: str | Path, folder: str | Path, dtype: str = "fp32", quantize: str | None = None,
              scores: list[TestScore] | None = None, license: str = "unknown") -> LoadedModel:
    """Write a checkpoint's or model file's model as a Hugging Face model folder; returns it as loaded back."""
    folder = Path(folder)
    if not _LICENSE.match(license):
        raise ExportError(f"--license {license!r} is not a license id such as cc-by-4.0, apache-2.0, other or unknown")
    names = [score.testset for score in scores or []]
    if len(set(names)) != len(names):
        raise ExportError(f"--score names the test set {next(n for n in names if names.count(n) > 1)} twice")
    check_target(folder)

    def build(tmp: Path) -> LoadedModel:
        export_model(source, tmp / MODEL_FILE, dtype, quantize)
        loaded = load_model(tmp / MODEL_FILE)
        _write_files(tmp, loaded, folder.name, scores or [], license)
        return loaded

    loaded = build_folder(folder, build, lambda: check_target(folder))
    loaded.path = folder / MODEL_FILE
    return loaded


def _write_files(folder: Path, loaded: LoadedModel, name: str, scores: list[TestScore], license: str) -> None:
    vocab = {side: vocab.to_pieces(range(len(vocab)))
             for side, vocab in (("source", loaded.src_vocab), ("target", loaded.tgt_vocab))}
    files = {"source.spm": loaded.src_vocab.sp.serialized_model_proto(),
             "target.spm": loaded.tgt_vocab.sp.serialized_model_proto(),
             "vocab.json": (json.dumps(vocab, ensure_ascii=False, indent=0) + "\n").encode(),
             "config.json": (json.dumps(hf_config(loaded), indent=2, ensure_ascii=False) + "\n").encode(),
             "README.md": model_card(loaded, name, scores, license).encode()}
    for file, content in files.items():
        atomic_write(folder / file, methodcaller("write", content))


def hf_config(loaded: LoadedModel) -> dict[str, Any]:
    """config.json: the model for a reader without nmt."""
    config, languages = loaded.config.to_dict(), loaded.languages
    return {
        "library_name": "nmt", "nmt_version": __version__, "model_type": "rnn-attention-seq2seq",
        "model_file": MODEL_FILE, "model_format": 2, "dtype": loaded.dtype,
        "source_language": languages["src"], "target_language": languages["tgt"],
        "parameters": parameter_count(loaded), "model": config["model"],
        "tokenizer": {"type": "sentencepiece", "joint": loaded.config.data.joint_vocab, "source": "source.spm",
                      "target": "target.spm", "vocab": "vocab.json", "source_vocab_size": len(loaded.src_vocab),
                      "target_vocab_size": len(loaded.tgt_vocab)},
        "decoding": config["decoding"]}


def model_card(loaded: LoadedModel, name: str, scores: list[TestScore], license: str) -> str:
    """README.md: YAML front matter the Hub indexes, then the card in Markdown."""
    info = describe(loaded)
    src, tgt = info["languages"]["src"], info["languages"]["tgt"]
    pair = f"{src}-{tgt}"
    results = [{"task": {"type": "translation", "name": f"Translation {pair}"},
                "dataset": {"name": score.testset, "type": score.testset, "args": pair},
                "metrics": [{"type": metric, "value": value, "name": METRIC_NAMES[metric], "config": signature}
                            for metric, (value, signature) in score.metrics.items()]}
               for score in scores]
    front: dict[str, Any] = {"language": list(dict.fromkeys([src, tgt])), "license": license, "library_name": "nmt",
                             "tags": TAGS, "pipeline_tag": "translation"}
    if results:
        front["model-index"] = [{"name": name, "results": results}]
    header = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000)
    lines = [f"---\n{header}---", "", f"# {name}", "",
             f"A {src} → {tgt} translation model: an RNN encoder-decoder with attention, trained and exported "
             f"with nmt {__version__}.", "", "## Use", "", "```bash", "pip install 'nmt[hub]'",
             f"nmt translate -m hf://OWNER/{name} < input.{src} > output.{tgt}", "```", "",
             "`-m` also takes a local copy of this folder. `model.safetensors` is the complete nmt model file "
             "(weights, config, SentencePiece models, this card's facts); config.json, source.spm, target.spm and "
             "vocab.json show the same for other tools, and nmt does not read them.", "", "## Test scores", ""]
    if scores:
        lines += ["| test set | sentences | BLEU | chrF | sacreBLEU signature (BLEU) |", "|---|---|---|---|---|"]
        for score in scores:
            chrf = score.metrics.get("chrf")
            bleu, signature = score.metrics["bleu"]
            signature = signature.replace("|", "\\|")          # a pipe inside a table cell, even in `code`
            lines.append(f"| {score.testset} | {score.sentences if score.sentences is not None else '?'} | "
                         f"{bleu:.2f} | {f'{chrf[0]:.2f}' if chrf else '-'} | `{signature}` |")
        lines += ["", "Detokenised output scored against the raw references with sacreBLEU (`nmt evaluate`)."]
    else:
        lines.append("None given at export (`nmt export --format hf --score TESTSET=RESULT.json`).")
    card = [line for line in format_card(info).splitlines()[1:] if line and not line.startswith("- file:")]
    lines += ["", "## Model", "", *card, ""]
    return "\n".join(lines)
