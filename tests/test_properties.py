"""Property-based checks (hypothesis) of the rule for bad input: exit 2 with one `error:` line naming the
problem; never exit 1 ("internal error"), never a traceback, never a hang.

The generated inputs are model-file metadata (stored config values past their bounds or of the wrong
type, cards, shortlists, dtypes) and the numeric decoding options of `nmt translate`, past the bounds
that nmt.config declares for them: the strategies read the bounds from the dataclasses, so a new key
with a bound is covered without a change here.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nmt.config import DecodingConfig, ModelConfig, TrainingConfig
from nmt.modelfile.file import LEGACY_MODEL_FORMAT, read_state
from nmt.modelfile.tensors import write_model_file
from tests.conftest import nmt_server

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
TRANSLATE_OPTIONS = ("beam_size", "length_penalty", "batch_tokens", "no_repeat_ngram", "min_len", "max_len",
                     "max_len_ratio", "max_input_len", "coverage_penalty", "temperature", "top_k", "top_p", "seed",
                     "shortlist_k")


def outside(field: dataclasses.Field, stored: bool = False) -> st.SearchStrategy:
    """Values of the field's type outside its declared range (its bounds from `_bounded`)."""
    meta, integer = field.metadata, field.type == "int"
    low = meta["ge"] if meta["ge"] is not None else meta["gt"]
    strategies = []
    if meta["le"] is not None:
        strategies.append(st.integers(min_value=int(meta["le"]) + 1, max_value=10**30) if integer else
                          st.floats(min_value=meta["le"], exclude_min=True, allow_nan=False, allow_infinity=False))
    if low is not None:
        below = (st.integers(min_value=-10**30, max_value=int(low)) if integer else
                 st.floats(max_value=low, allow_nan=False, allow_infinity=False))
        strategies.append(below.filter(lambda v: v < low if meta["ge"] is not None else v <= low))
    return st.one_of(strategies)


def bounded_fields(cls: type, stored: bool = False) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "ge" in f.metadata and not (stored and f.metadata["since_saved"])]


def one_error_line(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-1000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-1000:]
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr
    return lines[0]


def run(*args: str, stdin: str | None = None):
    return nmt_server().run(*args, stdin=stdin, text=True, timeout=60)      # a hang fails the test


@st.composite
def translate_option(draw) -> tuple[str, str]:
    fields = {f.name: f for f in bounded_fields(DecodingConfig)}
    name = draw(st.sampled_from(TRANSLATE_OPTIONS))
    value = draw(outside(fields[name]))
    return f"--{name.replace('_', '-')}", repr(value)


@SETTINGS
@given(option=translate_option(), sampling=st.booleans())
@example(option=("--length-penalty", "9e18"), sampling=False)       # the values of the issue: exit 1 before
@example(option=("--max-len-ratio", "1e18"), sampling=False)
@example(option=("--temperature", "1e-320"), sampling=True)
@example(option=("--temperature", "1e308"), sampling=True)
@example(option=("--top-p", "1e-320"), sampling=True)
def test_a_decoding_option_past_its_bound_is_one_error_naming_it(model_file, option, sampling):
    name, value = option
    result = run("translate", "-m", str(model_file), "-q", *(["--sampling"] if sampling else []), name, value,
                 stdin="Ein Hund.\n")
    assert name in one_error_line(result)
    assert result.stdout == ""


SECTIONS = {"model": ModelConfig, "decoding": DecodingConfig, "training": TrainingConfig}
WRONG_TYPES = st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                        st.integers(), max_size=2))


@st.composite
def stored_value(draw) -> tuple[str, str, Any]:
    section = draw(st.sampled_from(sorted(SECTIONS)))
    field = draw(st.sampled_from(bounded_fields(SECTIONS[section], stored=True)))
    return section, field.name, draw(st.one_of(outside(field, stored=True), WRONG_TYPES))


def write_changed(model_file: Path, folder: str, change) -> Path:
    """The model file with its dictionary changed: format 2 (safetensors) where it can hold the change,
    else format 1 (`torch.save`, which holds any shape of section)."""
    state, _ = read_state(model_file)
    change(state)
    path = Path(folder) / "shared.nmt"
    try:
        write_model_file(state, path)
    except (TypeError, KeyError, ValueError, AttributeError):
        torch.save({**state, "format": LEGACY_MODEL_FORMAT}, path)
    return path


@SETTINGS
@given(entry=stored_value())
def test_a_stored_config_value_past_its_bound_or_of_another_type_is_refused(model_file, entry):
    section, key, value = entry
    with tempfile.TemporaryDirectory() as folder:
        path = write_changed(model_file, folder, lambda state: state["config"][section].__setitem__(key, value))
        line = one_error_line(run("info", str(path)))
    assert str(path) in line and f"{section}.{key}" in line


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=8)
CARD_KEYS = ("languages", "data", "data_files", "dev", "training", "averaged_from", "exported_from")


@st.composite
def metadata_change(draw) -> tuple[str, Any]:
    what = draw(st.sampled_from(["card", "card entry", "shortlist", "dtype", "config", "tokenizer side"]))
    if what == "card entry":
        key = draw(st.sampled_from(CARD_KEYS))
        return what, (key, draw(st.one_of(JSON, st.fixed_dictionaries({}, optional={
            "src": JSON, "tgt": JSON, "bleu": JSON, "step": JSON, "signature": JSON, "seconds": JSON}))))
    return what, draw(JSON)


def apply(state: dict, what: str, value: Any) -> None:
    if what == "card entry":
        state["card"][value[0]] = value[1]
    elif what == "tokenizer side":
        state["tokenizer"]["tgt"] = value
    else:
        state[what] = value


@SETTINGS
@given(change=metadata_change())
def test_model_file_metadata_of_any_shape_loads_or_is_one_error(model_file, change):
    with tempfile.TemporaryDirectory() as folder:
        path = write_changed(model_file, folder, lambda state: apply(state, *change))
        result = run("info", str(path))
    if result.returncode != 0:
        assert str(path) in one_error_line(result)
