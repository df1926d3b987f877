"""Fine-tuning (`training.init_from`, `nmt train --init-from`): a new run that starts from a trained model.

The shifted domain of these tests is Multi30k in another register: the English side lowercased and without
its final full stop, as transcripts and search queries are written. A model trained on the ordinary text
scores low there; fine-tuning on a little of the shifted text must raise its BLEU there, more than the same
updates on more ordinary text do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError, load_config
from nmt.data.folder import DataFolder
from nmt.data.preprocess import preprocess
from nmt.decode.translator import Translator
from nmt.evaluate import bleu
from nmt.modelfile.file import export_model, load_model
from nmt.train.checkpoint import load_checkpoint
from nmt.train.parts import build_parts
from nmt.train.trainer import Trainer
from tests.conftest import make_config, nmt_server, read_gz


def shifted(line: str) -> str:
    """The shifted domain's English: lowercase, no final full stop."""
    return line.lower().rstrip().removesuffix(".").rstrip()


def write_corpus(folder: Path, name: str, start: int, n: int, split: str = "train", shift: bool = False) -> Path:
    """Pairs start..start+n of a Multi30k split as folder/name.de|.en (the English shifted if asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    de = read_gz(f"{split}.de", start + n)[start:]
    en = read_gz(f"{split}.en", start + n)[start:]
    (folder / f"{name}.de").write_text("".join(f"{line}\n" for line in de), encoding="utf-8")
    (folder / f"{name}.en").write_text("".join(f"{shifted(line) if shift else line}\n" for line in en),
                                       encoding="utf-8")
    return folder / name


MODEL = {"embedding_dim": 64, "encoder_hidden": 64, "decoder_hidden": 128, "attention_dim": 64, "dropout": 0.1}


def domain_config(tmp: Path, name: str, train: Path, dev: Path, **training: object) -> Path:
    """A smoke-size config training on `train` (validating on `dev`) into tmp/name."""
    folder = tmp / name
    folder.mkdir()
    return make_config(folder, train.parent, model=MODEL, data={"train": str(train), "dev": str(dev), "test": str(dev)},
                       training={"lr": 0.003, "batch_tokens": 1500, "validate_every": 1000, "precision": "fp32",
                                 "val_max_sentences": 50, "log_examples": 0, **training})


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A model trained on 2000 ordinary pairs (its run's best.pt), and the folder of the shared corpora."""
    tmp = tmp_path_factory.mktemp("finetune")
    corpora = tmp / "corpora"
    general = write_corpus(corpora, "general", 0, 2000)
    dev = write_corpus(corpora, "dev", 0, 100, split="val")
    config = domain_config(tmp, "parent", general, dev, max_updates=400)
    preprocess(load_config(config))
    Trainer(load_config(config)).train()
    return tmp / "parent" / "run" / "best.pt", corpora


def fine_tune(parent_path: Path, name: str, train: Path, dev: Path, tmp: Path, *overrides: str) -> Path:
    """Preprocess `train` with the parent's vocabularies and fine-tune on it; returns the run's best.pt."""
    config = domain_config(tmp, name, train, dev, max_updates=150, lr=0.001)
    sets = [f"training.init_from={parent_path}", *overrides]
    preprocess(load_config(config, sets))
    Trainer(load_config(config, sets)).train()
    return tmp / name / "run" / "best.pt"


@pytest.mark.slow
def test_fine_tuning_on_a_shifted_domain_raises_bleu_there(parent, tmp_path):
    parent_path, corpora = parent
    domain = write_corpus(corpora / "domain", "train", 2000, 500, shift=True)
    domain_dev = write_corpus(corpora / "domain", "dev", 100, 100, split="val", shift=True)
    more_general = write_corpus(corpora / "more", "train", 2000, 500)
    tuned = fine_tune(parent_path, "tuned", domain, domain_dev, tmp_path)
    control = fine_tune(parent_path, "control", more_general, domain_dev, tmp_path)

    source = read_gz("test_2016_flickr.de", 300)
    domain_refs = [shifted(line) for line in read_gz("test_2016_flickr.en", 300)]
    scores = {}
    for name, path in (("parent", parent_path), ("tuned", tuned), ("control", control)):
        hyps = [t.text for t in Translator.load(path, "cpu", beam_size=1).translate(source)]
        scores[name] = bleu(hyps, domain_refs)
    assert scores["tuned"] > scores["parent"] + 2.5, scores
    assert scores["tuned"] > scores["control"] + 2.5, scores       # the domain, not the extra updates


def test_a_fine_tuning_run_starts_from_the_parent_with_a_fresh_schedule(parent, tmp_path):
    parent_path, corpora = parent
    train = write_corpus(corpora / "start", "train", 2000, 200, shift=True)
    config = domain_config(tmp_path, "start", train, corpora / "dev", max_updates=10)
    sets = [f"training.init_from={parent_path}"]
    preprocess(load_config(config, sets))
    parts = build_parts(load_config(config, sets))
    try:
        weights = load_model(parent_path).weights
        assert all(torch.equal(value, weights[name]) for name, value in parts.model.state_dict().items())
        assert parts.progress.step == 0 and not parts.optimizer.state          # update 0, Adam fresh
        data = DataFolder.open(tmp_path / "start" / "data")
        assert [data.vocab(side).digest() for side in ("src", "tgt")] == \
            [parts.parent.loaded.src_vocab.digest(), parts.parent.loaded.tgt_vocab.digest()]
        events = [json.loads(line) for line in (tmp_path / "start" / "run" / "metrics.jsonl").read_text().splitlines()]
        assert events[0]["event"] == "init_from" and events[0]["path"] == str(parent_path)
        assert events[0]["optimizer"] is False and events[0]["parent_step"] == load_checkpoint(parent_path)["step"]
    finally:
        parts.close()

    parts = build_parts(load_config(config, [*sets, "training.init_optimizer=true"]), overwrite=True)
    try:
        saved = load_checkpoint(parent_path)["optimizer"]["state"]
        carried = parts.optimizer.state_dict()["state"]
        assert carried.keys() == saved.keys() and all(
            torch.equal(carried[i]["exp_avg"], saved[i]["exp_avg"]) for i in saved)
    finally:
        parts.close()


def test_the_parent_vocabulary_encodes_new_data_even_where_it_lacks_pieces(parent, tmp_path):
    """The parent's target pieces are kept as they are (not re-gathered from the new data), so its output
    layer fits; the data folder is rebuilt when the parent changes."""
    parent_path, corpora = parent
    train = write_corpus(corpora / "tiny", "train", 2500, 30)              # far fewer pieces than the parent saw
    config = domain_config(tmp_path, "tiny", train, corpora / "dev")
    data = preprocess(load_config(config, [f"training.init_from={parent_path}"]))
    folder = DataFolder.open(data)
    assert len(folder.vocab("tgt")) == len(load_model(parent_path).tgt_vocab)
    fingerprint = folder.manifest["fingerprint"]
    preprocess(load_config(config, [f"training.init_from={parent_path}"]))
    assert DataFolder.open(data).manifest["fingerprint"] == fingerprint
    preprocess(load_config(config))                                       # its own vocabulary now
    assert DataFolder.open(data).manifest["fingerprint"] != fingerprint
    with pytest.raises(ConfigError, match="was not encoded with the vocabularies of `training.init_from`"):
        build_parts(load_config(config, [f"training.init_from={parent_path}"]))


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.decoder_hidden=96"], r"`model.decoder_hidden` is 96 but `training.init_from` .* has 128"),
    (["training.init_optimizer=true"], "applies only with `training.init_from`"),
])
def test_a_run_the_parent_does_not_fit_is_refused(parent, tmp_path, overrides, message):
    parent_path, corpora = parent
    config = domain_config(tmp_path, "misfit", corpora / "general", corpora / "dev")
    init = [] if "init_optimizer" in overrides[0] else [f"training.init_from={parent_path}"]
    preprocess(load_config(config, [f"training.init_from={parent_path}"]))
    with pytest.raises(ConfigError, match=message):
        build_parts(load_config(config, [*init, *overrides]))
    assert not (tmp_path / "misfit" / "run").exists()                   # refused before the run folder


def test_optimizer_state_needs_a_training_checkpoint(parent, tmp_path):
    parent_path, corpora = parent
    exported = tmp_path / "parent.nmt"
    export_model(parent_path, exported)
    config = domain_config(tmp_path, "frommodel", corpora / "general", corpora / "dev")
    sets = [f"training.init_from={exported}"]
    preprocess(load_config(config, sets))
    with pytest.raises(ConfigError, match="has none \\(a model file or an averaged checkpoint\\)"):
        build_parts(load_config(config, [*sets, "training.init_optimizer=true"]))
    build_parts(load_config(config, sets)).close()                     # a model file is a parent, fresh Adam


def test_command_line_init_from(parent, tmp_path):
    parent_path, corpora = parent
    config = domain_config(tmp_path, "cli", corpora / "general", corpora / "dev", max_updates=2)
    result = nmt_server().run("preprocess", "--config", str(config), "--init-from", str(parent_path),
                            "--set", f"data.src_spm_model={tmp_path}/x.model", text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "conflict with `training.init_from`" in \
        result.stderr
    result = nmt_server().run("preprocess", "--config", str(config), "--init-from", str(parent_path), text=True)
    assert result.returncode == 0, result.stderr
    result = nmt_server().run("train", "--config", str(config), "--init-from", str(parent_path), "--resume", text=True)
    assert result.returncode == 2 and "--init-from starts a new run" in result.stderr
    result = nmt_server().run("train", "--config", str(config), "--init-from", str(parent_path), "--init-optimizer",
                            text=True)
    assert result.returncode == 0, result.stderr
    saved = load_config(tmp_path / "cli" / "run" / "config.yaml")
    assert saved.training.init_from == str(parent_path) and saved.training.init_optimizer


@pytest.mark.parametrize(("damage", "message"), [
    ("shape", "exp_avg of parameter 0 has shape (3, 7), but the parameter has"),
    ("dtype", "exp_avg_sq of parameter 0 is torch.int64, not a floating-point tensor"),
    ("nan", "exp_avg_sq of parameter 0 holds non-finite values (NaN or inf)"),
    ("count", "it holds 1 parameters, the model"),
])
def test_an_optimizer_state_that_does_not_fit_the_model_is_refused_before_training(
        trained_run, prepared, tmp_path, damage, message):
    """Before, moments of other shapes or NaN were loaded and the run died later with "loss became nan; lower
    training.lr", which blames the wrong thing."""
    state = torch.load(trained_run / "last.pt", weights_only=True)
    optimizer = state["optimizer"]
    first = optimizer["state"][optimizer["param_groups"][0]["params"][0]]
    if damage == "shape":
        first["exp_avg"] = torch.zeros(3, 7)
    elif damage == "dtype":
        first["exp_avg_sq"] = first["exp_avg_sq"].long()
    elif damage == "nan":
        first["exp_avg_sq"][0] = float("nan")
    else:
        optimizer["param_groups"] = [{**optimizer["param_groups"][0], "params": [0]}]
    damaged = tmp_path / "damaged.pt"
    torch.save(state, damaged)
    result = nmt_server().run("train", "--config", str(prepared), "--init-from", str(damaged), "--init-optimizer",
                              "--set", f"training.run_dir={tmp_path / 'run'}", text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0].startswith(f"error: `training.init_optimizer`: the optimiser state of {damaged} does not fit "
                               "this run's optimiser (") and message in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_check_optimizer_state_accepts_what_adam_saves():
    from nmt.train.checkpoint import check_optimizer_state

    model = torch.nn.Linear(3, 2)
    adam = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    adam.step()
    check_optimizer_state(adam, adam.state_dict())
    check_optimizer_state(torch.optim.Adam(model.parameters()), adam.state_dict())
