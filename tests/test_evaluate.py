"""`nmt evaluate` and nmt.evaluate: tokenizers for every script, case, several references, signatures."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from importlib.util import find_spec
from pathlib import Path

import pytest

from nmt import evaluate as ev
from nmt.config import ConfigError, load_config

from .conftest import SMOKE_CONFIG, nmt_server

# Two Chinese sentences and their references: 13a sees each sentence as one "word" (no spaces), zh splits
# every Han character, so only zh gives BLEU a chance to count matching n-grams.
ZH_HYP = ["我喜欢猫。", "今天天气很好。"]
ZH_REF = ["我很喜欢猫。", "今天天气好。"]
ZH_REF2 = ["我喜欢猫。", "今天的天气很好。"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, text=True)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def one_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_chinese_is_scored_with_the_zh_tokenizer_and_the_signature_says_so(tmp_path):
    hyp, ref = write(tmp_path / "hyp.zh", ZH_HYP), write(tmp_path / "ref.zh", ZH_REF)
    default = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", "-")
    zh = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tokenize", "zh", "--json", "-")
    assert default.returncode == 0 and zh.returncode == 0, default.stderr + zh.stderr
    default_bleu, zh_bleu = json.loads(default.stdout)["bleu"], json.loads(zh.stdout)["bleu"]
    assert default_bleu["score"] == 0.0 and default_bleu["sys_len"] == 2      # 13a: one token per sentence
    assert zh_bleu["sys_len"] == 12 and zh_bleu["score"] == pytest.approx(57.19, abs=0.01)
    assert "|tok:zh|" in zh_bleu["signature"] and "nrefs:1|case:mixed" in zh_bleu["signature"]
    assert zh_bleu["score"] == pytest.approx(ev.bleu(ZH_HYP, ZH_REF, tokenize="zh"), abs=0.005)


def test_a_second_reference_raises_bleu_and_counts_in_the_signature(tmp_path):
    hyp, ref = write(tmp_path / "hyp.zh", ZH_HYP), write(tmp_path / "ref.zh", ZH_REF)
    ref2 = write(tmp_path / "ref2.zh", ZH_REF2)
    one = json.loads(run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tokenize", "zh",
                             "--json", "-").stdout)
    result = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--ref", str(ref2), "--tokenize", "zh",
                     "--json", "-")
    assert result.returncode == 0, result.stderr
    two = json.loads(result.stdout)
    assert two["bleu"]["score"] > one["bleu"]["score"] + 30                   # 57.19 -> 95.54
    assert two["chrf"]["score"] > one["chrf"]["score"]
    assert two["bleu"]["signature"].startswith("nrefs:2|") and two["chrf"]["signature"].startswith("nrefs:2|")
    assert two["references"] == [str(ref), str(ref2)] and one["references"] == str(ref)
    text = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--ref", str(ref2), "--tokenize", "zh")
    assert f"references: {ref}, {ref2}" in text.stdout and "nrefs:2|case:mixed|eff:no|tok:zh" in text.stdout
    assert ev.bleu(ZH_HYP, [ZH_REF, ZH_REF2], tokenize="zh") == pytest.approx(two["bleu"]["score"], abs=0.005)


def test_lowercase_scores_case_insensitively_with_a_case_lc_signature(tmp_path):
    hyp = write(tmp_path / "hyp.en", ["A DOG RUNS ON THE GRASS .", "two men play football ."])
    ref = write(tmp_path / "ref.en", ["A dog runs on the grass .", "Two men play football ."])
    mixed = json.loads(run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", "-").stdout)
    result = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lowercase", "--json", "-")
    assert result.returncode == 0, result.stderr
    lower = json.loads(result.stdout)
    assert lower["bleu"]["score"] == pytest.approx(100.0) and mixed["bleu"]["score"] < 50
    assert "|case:lc|" in lower["bleu"]["signature"] and "|case:lc|" in lower["chrf"]["signature"]
    assert "|case:mixed|" in mixed["bleu"]["signature"]


def test_a_reference_of_another_length_names_the_file_and_counts(tmp_path):
    hyp, ref = write(tmp_path / "hyp.zh", ZH_HYP), write(tmp_path / "ref.zh", ZH_REF)
    short = write(tmp_path / "short.zh", ZH_REF2[:1])
    line = one_error(run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--ref", str(short)))
    assert f"{hyp} has 2 lines but {short} has 1" in line
    other = write(tmp_path / "other.zh", ZH_HYP)
    line = one_error(run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--ref", str(short),
                             "--compare", str(other)))
    assert "has 1" in line and str(short) in line


def test_compare_runs_the_bootstrap_against_several_references(tmp_path):
    hyp, ref = write(tmp_path / "hyp.zh", ZH_HYP * 5), write(tmp_path / "ref.zh", ZH_REF * 5)
    ref2, other = write(tmp_path / "ref2.zh", ZH_REF2 * 5), write(tmp_path / "other.zh", ZH_REF2 * 5)
    result = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--ref", str(ref2), "--compare", str(other),
                     "--tokenize", "zh", "--bootstrap-samples", "50", "--json", "-")
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)["comparison"]["BLEU"]
    assert comparison["other"] == pytest.approx(100.0) and "nrefs:2" in comparison["signature"]
    assert "tok:zh" in comparison["signature"]


def test_an_unknown_tokenizer_is_one_error_with_a_hint(tmp_path):
    hyp = write(tmp_path / "hyp.en", ["a"])
    line = one_error(run_cli("evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--tokenize", "13b"))
    assert "--tokenize must be one of 13a, intl, zh, ja-mecab, ko-mecab, char, flores200, none" in line
    assert "did you mean 13a?" in line


@pytest.mark.parametrize(("tokenize", "module", "extra"), [("ja-mecab", "MeCab", "nmt[ja]"),
                                                          ("ko-mecab", "mecab_ko", "nmt[ko]")])
def test_mecab_tokenizers_without_their_packages_say_what_to_install(tmp_path, monkeypatch, tokenize, module,
                                                                     extra):
    real = find_spec

    def without(name: str, *args):
        return None if name == module else real(name, *args)

    monkeypatch.setattr(ev, "find_spec", without)
    with pytest.raises(ev.EvaluationError, match=rf"--tokenize {tokenize} needs .*{module}.* not installed.*"
                                                 + re.escape(f"pip install '{extra}'")):
        ev.bleu_metric(tokenize)
    if find_spec(module) is None:               # the same through the command, where it is not installed
        hyp = write(tmp_path / "hyp", ["a"])
        line = one_error(run_cli("evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--tokenize", tokenize))
        assert f"pip install '{extra}'" in line


def test_japanese_with_mecab_when_installed(tmp_path):
    pytest.importorskip("MeCab")
    pytest.importorskip("ipadic")
    hyp = write(tmp_path / "hyp.ja", ["猫が好きです。"])
    ref = write(tmp_path / "ref.ja", ["猫が大好きです。"])
    result = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tokenize", "ja-mecab", "--json", "-")
    assert result.returncode == 0, result.stderr
    bleu = json.loads(result.stdout)["bleu"]
    assert bleu["sys_len"] == 5 and "|tok:ja-mecab-" in bleu["signature"]


def test_flores200_without_its_model_offline_is_one_error(tmp_path, monkeypatch):
    from sacrebleu.tokenizers import tokenizer_spm

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network here")

    monkeypatch.setattr(tokenizer_spm, "SACREBLEU_DIR", str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(ev.EvaluationError) as caught:
        ev.bleu_metric("flores200")
    message = str(caught.value)
    assert "--tokenize flores200 needs sacreBLEU's SentencePiece model" in message
    assert str(tmp_path / "models" / "flores200sacrebleuspm") in message and "no network here" in message
    assert "\n" not in message and not (tmp_path / "models" / "flores200sacrebleuspm").exists()


def test_flores200_with_its_model_in_place_scores_offline(tmp_path, monkeypatch):
    import sentencepiece as spm
    from sacrebleu.tokenizers import tokenizer_spm

    text = tmp_path / "text"
    write(text, ["a dog runs on the grass", "two men play football in the park", "a cat sleeps"] * 20)
    (tmp_path / "models").mkdir()
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "spm"), vocab_size=28,
                                   minloglevel=2)
    (tmp_path / "spm.model").rename(tmp_path / "models" / "flores200sacrebleuspm")
    monkeypatch.setattr(tokenizer_spm, "SACREBLEU_DIR", str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("no download when the model is there"))
    results = ev.score(["a dog runs on the grass"], ["a dog runs on the grass"], tokenize="flores200")
    assert results["bleu"]["score"] == pytest.approx(100.0) and "|tok:flores200|" in results["bleu"]["signature"]


def test_validation_bleu_settings_are_config_keys(tmp_path):
    base = SMOKE_CONFIG.read_text(encoding="utf-8")
    path = tmp_path / "c.yaml"
    path.write_text(base.replace("  keep_best: 2", "  keep_best: 2\n  bleu_tokenize: zh\n  bleu_lowercase: true"))
    training = load_config(path).training
    assert (training.bleu_tokenize, training.bleu_lowercase) == ("zh", True)
    with pytest.raises(ConfigError, match=r"`training.bleu_tokenize` must be one of .*did you mean `ja-mecab`"):
        load_config(path, ["training.bleu_tokenize=ja-mecub"])
    with pytest.raises(ConfigError, match=r"did you mean `training.bleu_tokenize`"):
        load_config(path, ["training.bleu_tokenizer=zh"])
    signature = ev.bleu_signature(training.bleu_tokenize, training.bleu_lowercase)
    assert signature.startswith("nrefs:1|case:lc|eff:no|tok:zh|")
    with pytest.raises(ev.EvaluationError, match="^training.bleu_tokenize must be one of"):
        ev.bleu_metric("13b", option="training.bleu_tokenize")
