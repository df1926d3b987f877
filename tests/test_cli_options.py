"""nmt.cli.options: decoding options made from DecodingConfig, and options that do not apply are errors."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main
from typer.testing import CliRunner

from nmt.cli.main import app
from nmt.cli.options import option_name
from nmt.config import DecodingConfig


def command(name: str):
    return typer.main.get_command(app).commands[name]


def test_every_decoding_key_is_a_translate_option_with_its_help():
    params = {param.name: param for param in command("translate").params}
    for field in dataclasses.fields(DecodingConfig):
        param = params[field.name]
        assert option_name(field.name) in param.opts and param.help == field.metadata["help"]
        assert param.default is None                   # not given: the model's own setting
    assert {p.name for p in command("score").params} >= {"length_penalty", "batch_tokens", "precision"}
    assert {p.name for p in command("serve").params} >= {"precision", "quantize"}


@pytest.mark.parametrize("options", [["--beam-size", "3"], ["--length-penalty", "0.5"],
                                     ["--coverage-penalty", "0.2"], ["--early-stop"], ["--no-early-stop"]])
def test_search_options_with_sampling_are_errors(model_file, options):
    result = CliRunner().invoke(app, ["translate", "-m", str(model_file), "--device", "cpu", "--sampling",
                                      *options], input="Ein Hund.\n")
    assert result.exit_code == 2 and result.stdout == ""
    named = options[0].replace("--no-", "--")                # the key's option, whichever way it was given
    assert result.stderr.startswith(f"error: `{named}` does not apply to sampling"), result.stderr


def test_sampling_options_without_sampling_are_errors(model_file):
    result = CliRunner().invoke(app, ["translate", "-m", str(model_file), "--device", "cpu", "--top-k", "5"],
                                input="Ein Hund.\n")
    assert result.exit_code == 2 and result.stderr.startswith("error: `--top-k` applies only to sampling")


def test_scores_json_without_scores_is_an_error(model_file, tmp_path):
    out = tmp_path / "out.txt"
    result = CliRunner().invoke(app, ["translate", "-m", str(model_file), "--device", "cpu", "--scores-json",
                                      "-o", str(out)], input="Ein Hund.\n")
    assert result.exit_code == 2 and result.stderr == "error: --scores-json needs --scores FILE, the file the " \
                                                      "scores go to\n"
    assert not out.exists()


def test_a_range_error_names_the_option(model_file):
    result = CliRunner().invoke(app, ["translate", "-m", str(model_file), "--device", "cpu", "--top-p", "2"],
                                input="Ein Hund.\n")
    assert result.exit_code == 2 and "`--top-p` must be <= 1.0, got 2.0" in result.stderr


def test_fp16_on_the_cpu_is_an_error_not_bf16(model_file):
    result = CliRunner().invoke(app, ["translate", "-m", str(model_file), "--device", "cpu", "--precision", "fp16"],
                                input="Ein Hund.\n")
    assert result.exit_code == 2 and result.stderr.startswith("error: `--precision` fp16 runs on CUDA only")
