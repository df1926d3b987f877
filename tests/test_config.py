from pathlib import Path

import pytest
import yaml

from nmt.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    load_config,
    parse_override,
    stored_config,
)

from .conftest import REPO


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_defaults_and_sections(tmp_path):
    config = load_config(write(tmp_path, {"model": {"attention": "luong_dot"}}))
    assert config.model.attention == "luong_dot"
    assert config.decoding.beam_size == 5
    assert config.training.batch_tokens == 2000


def test_a_config_saved_by_an_earlier_nmt_loads_despite_newer_rules():
    raw = Config().to_dict()
    raw["data"]["src_lang"] = "de.tok"                           # accepted before these rules existed
    with pytest.raises(ConfigError, match="language code"):       # a user's config is held to them
        config_from_dict(raw)
    raw["decoding"]["seed"] = -3
    with pytest.raises(ConfigError, match=r"`decoding.seed` must be >= 0"):
        config_from_dict(raw)
    saved = stored_config(raw)                                    # a checkpoint's or model file's is not
    assert saved.data.src_lang == "de.tok" and saved.decoding.seed == -3
    raw["decoding"]["beam_size"] = 0                              # the older rules still hold
    with pytest.raises(ConfigError, match="beam_size"):
        stored_config(raw)


def test_unknown_key_names_key_and_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key `training.bach_tokens`; did you mean `training.batch_tokens`"):
        load_config(write(tmp_path, {"training": {"bach_tokens": 100}}))


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key `decodin`; did you mean `decoding`"):
        load_config(write(tmp_path, {"decodin": {}}))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"training": {"lr": "fast"}}, r"`training.lr` must be float, got 'fast'"),
        ({"model": {"bidirectional": 1}}, r"`model.bidirectional` must be bool"),
        ({"training": {"batch_tokens": 2.5}}, r"`training.batch_tokens` must be int"),
        ({"model": {"attention": "luong_dott"}}, r"`model.attention` must be one of .*did you mean `luong_dot`"),
        ({"model": {"dropout": 1.5}}, r"`model.dropout` must be <= 1.0, got 1.5"),
        ({"decoding": {"beam_size": 0}}, r"`decoding.beam_size` must be >= 1, got 0"),
        ({"model": "big"}, r"`model` must be a mapping"),
        ({"data": {"src_lang": "en", "tgt_lang": "en"}}, r"`data.tgt_lang` must differ from `data.src_lang`"),
        ({"data": {"tgt_lang": "../en"}}, r"`data.tgt_lang` must be a language code .* got '../en'"),
        ({"data": {"src_lang": ""}}, r"`data.src_lang` must be a language code"),
        ({"training": {"adam_betas": [0.9]}}, r"`training.adam_betas` must be two numbers in \[0, 1\), got \[0.9\]"),
        ({"training": {"adam_betas": [2.0, 0.5]}}, r"`training.adam_betas` must be two numbers in \[0, 1\)"),
        ({"training": {"seed": -1}}, r"`training.seed` must be >= 0, got -1"),
        ({"data": {"spm_sample_seed": -1}}, r"`data.spm_sample_seed` must be >= 0"),
        ({"decoding": {"seed": -3}}, r"`decoding.seed` must be >= 0"),
        ({"training": {"seed": 2**64}}, r"`training.seed` must be at most 2147483647, got 18446744073709551616"),
        ({"data": {"shortlist_k": 10**20}}, r"`data.shortlist_k` must be <= 1000000, got 10+"),
        ({"training": {"threads": 100000}}, r"`training.threads` must be <= 1024, got 100000"),
        ({"training": {"batch_tokens": 0}}, r"`training.batch_size` must be >= 1 when `training.batch_tokens` is 0"),
        ({"data": {"character_coverage": 0.5}}, r"`data.character_coverage` must be >= 0.98, got 0.5"),
        ({"model": {"input_feeding": False}}, r"`model.input_feeding: false` does not apply to `model.attention: bahd"),
    ],
)
def test_wrong_types_and_ranges(tmp_path, raw, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, raw))


def test_input_feeding_is_a_luong_key(tmp_path):
    luong = {"model": {"attention": "luong_dot", "input_feeding": False}}
    assert not load_config(write(tmp_path, luong)).model.input_feeding
    assert load_config(write(tmp_path, {"model": {"attention": "bahdanau", "input_feeding": True}})).model.input_feeding


def test_int_accepted_for_float(tmp_path):
    assert load_config(write(tmp_path, {"training": {"lr": 1}})).training.lr == 1.0


def test_parse_override_values():
    assert parse_override("training.lr=0.5") == (["training", "lr"], 0.5)
    assert parse_override("model.attention=luong_dot") == (["model", "attention"], "luong_dot")
    assert parse_override("model.bidirectional=false") == (["model", "bidirectional"], False)
    assert parse_override("training.adam_betas=[0.9, 0.98]") == (["training", "adam_betas"], [0.9, 0.98])
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("training.lr")
    with pytest.raises(ConfigError, match="must name a section and a key"):
        parse_override("lr=3")


def test_overrides_are_validated(tmp_path):
    config = load_config(write(tmp_path, {}), ["training.lr=3e-4", "model.attention=luong_dot"])
    assert config.training.lr == 3e-4 and config.model.attention == "luong_dot"
    with pytest.raises(ConfigError, match="unknown key `training.lrr`"):
        load_config(write(tmp_path, {}), ["training.lrr=1"])
    with pytest.raises(ConfigError, match="`training` is not a section|must be a mapping"):
        config_from_dict(apply_overrides({"training": 3}, []))


def test_relative_paths_resolve_against_config_folder(tmp_path):
    sub = tmp_path / "configs"
    sub.mkdir()
    path = sub / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"train": "../data/train", "out_dir": "/abs/out"}}))
    config = load_config(path)
    assert config.data.train == str((tmp_path / "data" / "train").resolve())
    assert config.data.out_dir == "/abs/out"


@pytest.mark.parametrize("name", ["multi30k_de_en_bahdanau.yaml", "multi30k_de_en_luong.yaml", "smoke.yaml"])
def test_shipped_configs_load(name):
    config = load_config(REPO / "configs" / name)
    assert config.data.train and config.training.run_dir


def test_reference_configs_match_design():
    config = load_config(REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    m, t = config.model, config.training
    assert (m.rnn_type, m.embedding_dim, m.encoder_hidden, m.bidirectional) == ("gru", 256, 256, True)
    assert (m.decoder_hidden, m.attention, m.dropout) == (512, "bahdanau", 0.3)
    assert (t.lr, t.clip_grad_norm, t.batch_tokens, t.seed) == (1e-3, 1.0, 2000, 42)
    assert config.data.vocab_size == 8000 and config.data.joint_vocab and config.data.max_len == 50
    assert load_config(REPO / "configs" / "multi30k_de_en_luong.yaml").model.attention == "luong_general"


def test_a_key_given_twice_is_an_error_with_its_line(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("training:\n  lr: 0.003\nmodel:\n  dropout: 0.1\ntraining:\n  lr: 9.0\n")
    with pytest.raises(ConfigError, match=r"twice.yaml line 5: .*duplicate key 'training' \(first on line 1\)"):
        load_config(twice)
    (tmp_path / "key.yaml").write_text("training:\n  lr: 0.003\n  lr: 5.0\n")
    with pytest.raises(ConfigError, match=r"line 3: .*duplicate key 'lr'"):
        load_config(tmp_path / "key.yaml")
    (tmp_path / "flow.yaml").write_text("training: {lr: 0.003, lr: 5.0}\n")       # both on one line
    with pytest.raises(ConfigError, match=r"line 1: .*duplicate key 'lr' \(first on line 1\)"):
        load_config(tmp_path / "flow.yaml")
    (tmp_path / "merge.yaml").write_text("training: &t\n  lr: 0.003\ndecoding:\n  beam_size: 3\n")
    assert load_config(tmp_path / "merge.yaml").training.lr == 0.003     # anchors still load


# (key, a value away from its default, a setting that makes nmt ignore it, one that makes it apply)
IGNORED_KEYS = [
    ("training.batch_size", 32, {}, {"training.batch_tokens": 0}),
    ("training.plateau_factor", 0.3, {}, {"training.lr_schedule": "plateau"}),
    ("training.plateau_patience", 5, {"training.lr_schedule": "budget"}, {"training.lr_schedule": "plateau"}),
    ("training.min_lr", 1e-4, {"training.lr_schedule": "inverse_sqrt"}, {"training.lr_schedule": "budget"}),
    ("training.teacher_forcing_min", 0.2, {}, {"training.teacher_forcing_schedule": "exponential"}),
    ("training.teacher_forcing_decay_updates", 50, {"training.teacher_forcing_schedule": "exponential"},
     {"training.teacher_forcing_schedule": "linear"}),
    ("training.teacher_forcing_decay_rate", 0.99, {"training.teacher_forcing_schedule": "linear"},
     {"training.teacher_forcing_schedule": "exponential"}),
    ("model.attention_dim", 64, {"model.attention": "luong_dot"}, {"model.attention": "luong_concat"}),
    ("model.attention_dim", 64, {"model.attention": "luong_general"}, {}),
    ("model.init_scale", 0.05, {"model.init": "default"}, {}),
    ("training.init_optimizer", True, {}, {"training.init_from": "parent.pt"}),
]


def _nested(flat: dict) -> dict:
    raw: dict = {}
    for dotted, value in flat.items():
        section, key = dotted.split(".")
        raw.setdefault(section, {})[key] = value
    return raw


@pytest.mark.parametrize(("key", "value", "ignoring", "applying"), IGNORED_KEYS)
def test_a_key_the_other_settings_make_nmt_ignore_is_an_error_naming_it(tmp_path, key, value, ignoring, applying):
    with pytest.raises(ConfigError, match=rf"^`{key}` does not apply with `[a-z_.]+` [^:]+: .*; remove it \(or give "
                                          rf"it its default, [^)]+\) or change `"):
        load_config(write(tmp_path, _nested({**ignoring, key: value})))
    with pytest.raises(ConfigError, match=rf"^`{key}` does not apply"):           # --set gives it too
        load_config(write(tmp_path, _nested(ignoring)), [f"{key}={value}"])
    section, name = key.split(".")
    assert getattr(getattr(load_config(write(tmp_path, _nested({**applying, key: value}))), section), name) == value
    # Only a key given away from its default: unset, at its default (as the config.yaml nmt writes lists every
    # key) or in a checkpoint's stored config, it loads.
    load_config(write(tmp_path, _nested(ignoring)))
    default = getattr(getattr(Config(), section), name)
    load_config(write(tmp_path, _nested({**ignoring, key: default})))
    assert getattr(getattr(stored_config(_nested({**ignoring, key: value})), section), name) == value


def test_the_config_nmt_writes_loads_again(tmp_path):
    from nmt.config import dump_config

    for name in sorted(p.name for p in (REPO / "configs").glob("*.yaml")):
        written = tmp_path / name
        written.write_text(dump_config(load_config(REPO / "configs" / name)))
        load_config(written)
