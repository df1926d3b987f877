"""Ensembles of trained checkpoints through the Python API and the command line."""

from pathlib import Path

import pytest
import sacrebleu
import torch

from nmt.decode.translator import Translator

from .conftest import read_gz
from .test_translate import run_cli


@pytest.fixture(scope="session")
def second_run(tmp_path_factory: pytest.TempPathFactory, prepared: Path) -> Path:
    """The smoke model of `trained_run` trained again with another seed (different parameters)."""
    from nmt.config import load_config
    from nmt.train.trainer import Trainer

    run = tmp_path_factory.mktemp("trained_seed2") / "run"
    config = load_config(prepared, [f"training.run_dir={run}", "training.max_updates=40", "training.seed=7",
                                    "training.validate_every=20", "training.val_max_sentences=20"])
    Trainer(config).train()
    return run


@pytest.fixture(scope="module")
def test_set() -> tuple[list[str], list[str]]:
    return read_gz("test_2016_flickr.de", 60), read_gz("test_2016_flickr.en", 60)


def translate(checkpoints: list[Path], lines: list[str], **options) -> list[str]:
    translator = Translator.from_checkpoints(checkpoints, device="cpu", precision="fp32", **options)
    return [t.text for t in translator.translate(lines)]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_ensemble_of_a_checkpoint_with_itself_equals_the_checkpoint(trained_run, test_set, beam_size):
    sources, _ = test_set
    alone = translate([trained_run / "best.pt"], sources, beam_size=beam_size)
    assert translate([trained_run / "best.pt"] * 2, sources, beam_size=beam_size) == alone


def test_ensemble_of_two_runs_differs_from_both_and_is_no_worse_than_the_weaker(trained_run, second_run, test_set):
    sources, references = test_set
    first, second = trained_run / "best.pt", second_run / "best.pt"
    outputs = {name: translate(paths, sources, beam_size=3)
               for name, paths in (("first", [first]), ("second", [second]), ("ensemble", [first, second]))}
    assert outputs["ensemble"] != outputs["first"] and outputs["ensemble"] != outputs["second"]
    # the model's own measure of quality: mean log-probability of the references
    scores = {name: Translator.from_checkpoints(paths, device="cpu", precision="fp32").score(sources, references)
              for name, paths in (("first", [first]), ("second", [second]), ("ensemble", [first, second]))}
    mean = {name: sum(s[0] for s in rows) / len(rows) for name, rows in scores.items()}
    assert mean["ensemble"] >= min(mean["first"], mean["second"])
    bleu = {name: sacrebleu.corpus_bleu(hyps, [references]).score for name, hyps in outputs.items()}
    assert bleu["ensemble"] >= min(bleu["first"], bleu["second"]) - 0.5, bleu


def test_cli_ensemble_and_its_vocabulary_check(trained_run, second_run, tmp_path):
    first, second = str(trained_run / "best.pt"), str(second_run / "best.pt")
    text = "ein Hund läuft\nzwei Frauen sitzen auf einer Bank\n"
    result = run_cli("translate", "--checkpoint", first, "--checkpoint", second, "-q", "--precision", "fp32",
                     stdin=text)                    # as `translate` below: bf16 CPUs would round near-ties apart
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n".join(translate([Path(first), Path(second)], text.splitlines())) + "\n"

    other = tmp_path / "other.pt"                   # the same model with a different (embedded) target vocabulary
    state = torch.load(second_run / "best.pt", weights_only=True)
    pieces = state["tokenizer"]["tgt"]["pieces"]
    pieces[10], pieces[11] = pieces[11], pieces[10]
    torch.save(state, other)
    result = run_cli("translate", "--checkpoint", first, "--checkpoint", str(other), "-q", stdin=text)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "different target vocabulary" in result.stderr
