"""nmt.decode.outputs: one n-best rule and one format for the command line, the Python API and the server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from nmt.cli.main import app
from nmt.decode.outputs import Translation, nbest_json, nbest_lines, score_lines
from nmt.decode.search import Hypothesis
from nmt.decode.translator import Translator


def test_an_n_best_list_has_exactly_k_entries_padded_by_one_rule():
    found = Translation("a b", [Hypothesis([5, 6], -1.5, None, -2.0)], np.array([7]), n_best=3)
    empty = Translation("", [], np.array([], dtype=np.int64), n_best=3)
    assert found.nbest == [("a b", -1.5), ("", float("-inf")), ("", float("-inf"))]
    assert empty.nbest == [("", 0.0)] * 3
    assert nbest_lines(found, 4) == "4 ||| a b ||| -1.5000\n4 |||  ||| -inf\n4 |||  ||| -inf\n"
    assert nbest_json(found) == [{"text": "a b", "score": -1.5}, {"text": "", "score": None},
                                 {"text": "", "score": None}]
    assert nbest_json(empty) == [{"text": "", "score": 0.0}] * 3
    scores = [json.loads(line) for line in score_lines(found, 4, alpha=0.0, as_json=True).splitlines()]
    assert [s["rank"] for s in scores] == [0, 1, 2] and scores[0]["log_prob"] == -2.0 and scores[0]["length"] == 3
    assert scores[1]["log_prob"] == float("-inf") and scores[1]["length"] == 0


def test_cli_and_http_give_the_same_n_best_lists(model_file):
    """--max-len 1 (with --min-len 0) leaves EOS as the only output, so a line has one hypothesis and K - 1
    padding entries; an empty line has K entries of score 0. The command line and the server say the same."""
    pytest.importorskip("fastapi")
    from nmt.serve.server import format_response

    lines = ["Ein Hund läuft.", "", "Zwei Katzen schlafen."]
    translator = Translator.load(model_file, device="cpu", precision="fp32", beam_size=3, max_len=1, min_len=0)
    http = format_response(translator.translate(lines, n_best=3), 3)["n_best"]
    result = CliRunner().invoke(app, ["translate", "-m", str(model_file), "--device", "cpu", "--precision", "fp32",
                                      "--beam-size", "3", "--max-len", "1", "--min-len", "0", "--n-best", "3",
                                      "-q"],
                                input="".join(f"{line}\n" for line in lines))
    assert result.exit_code == 0, result.output
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert len(rows) == 9 and [len(entries) for entries in http] == [3, 3, 3]
    for i, entries in enumerate(http):
        for r, entry in enumerate(entries):
            number, text, score = rows[3 * i + r]
            assert int(number) == i and text == entry["text"]
            assert score == "-inf" if entry["score"] is None else float(score) == pytest.approx(entry["score"])
    assert http[0][1:] == [{"text": "", "score": None}] * 2
    assert http[1] == [{"text": "", "score": 0.0}] * 3
