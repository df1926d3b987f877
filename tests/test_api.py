"""The Python API: `from nmt import Translator`, n-best with scores, attention, and the README example."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from nmt import Translator

from .conftest import read_gz

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def translator(model_file: Path) -> Translator:
    return Translator.load(model_file, device="cpu", precision="fp32")


def test_translate_returns_one_translation_per_line(translator):
    lines = ["Ein Hund läuft.", "", "Zwei Männer spielen Fußball im Park."]
    results = translator.translate(lines, beam_size=5)
    assert len(results) == 3 and results[1].text == "" and results[1].score is None
    assert all(r.text and str(r) == r.text for r in (results[0], results[2]))
    assert isinstance(results[0].score, float)


def count_table_builds(monkeypatch, decoder_type: type) -> list:
    """A list that grows by one whenever a decoder of `decoder_type` builds its token table's weights."""
    builds = []
    real = decoder_type.token_projection
    monkeypatch.setattr(decoder_type, "token_projection", lambda self: builds.append(1) or real(self))
    return builds


def test_any_iterable_of_lines_translates_like_a_list(translator):
    lines = ["Ein Hund läuft.", "Zwei Katzen schlafen."]
    expected = [t.text for t in translator.translate(lines, beam_size=2)]
    assert [t.text for t in translator.translate((line for line in lines), beam_size=2)] == expected
    assert [t.text for t in translator.translate(tuple(lines), beam_size=2)] == expected


def test_derived_weights_are_built_once_per_translator_not_per_call(model_file, monkeypatch):
    """A one-line call used to spend about half its time rebuilding the decoder's token table."""
    own = Translator.load(model_file, device="cpu", precision="fp32", beam_size=1)
    builds = count_table_builds(monkeypatch, type(own.model.decoder))
    first = own.translate(["Ein Hund läuft."])[0].text
    assert len(builds) == 1                                           # built at the first call ...
    assert own.translate(["Ein Hund läuft."])[0].text == first
    own.translate(["Zwei Männer spielen Fußball im Park.", "Eine Frau liest."])
    assert len(builds) == 1                                           # ... and reused by every later one


def test_an_ensembles_members_keep_their_derived_weights(model_file, monkeypatch):
    """load_ensemble discards the member Translators it built; their members' weights must stay held."""
    pair = Translator.load([model_file, model_file], device="cpu", precision="fp32", beam_size=1)
    gc.collect()
    builds = count_table_builds(monkeypatch, type(pair.model.members[0].decoder))
    pair.translate(["Ein Hund läuft."])
    assert len(builds) == 2                                           # one table per member ...
    pair.translate(["Zwei Männer spielen Fußball im Park."])
    assert len(builds) == 2                                           # ... kept for the next call


def test_beam_size_per_call_matches_a_translator_built_with_it(translator, model_file):
    lines = ["Ein Hund läuft über die Wiese.", "Eine Frau liest ein Buch."]
    greedy = Translator.load(model_file, device="cpu", precision="fp32", beam_size=1)
    assert [t.text for t in translator.translate(lines, beam_size=1)] == [t.text for t in greedy.translate(lines)]
    assert translator.decoding.beam_size == 3                     # the call did not change the default


def test_n_best_lists_with_scores(translator):
    results = translator.translate(["Ein Hund läuft.", "Zwei Katzen schlafen."], beam_size=4, n_best=3)
    for result in results:
        assert len(result.nbest) == 3
        scores = [score for _, score in result.nbest]
        assert scores == sorted(scores, reverse=True) and scores[0] == result.score
        assert result.nbest[0][0] == result.text
        assert len({text for text, _ in result.nbest}) >= 2


def test_attention_one_argument_away(translator):
    result = translator.translate(["Ein Hund läuft."], return_attention=True)[0]
    hyp = result.hypotheses[0]
    weights = result.attention
    assert weights.shape == (len(hyp.tokens) + 1, len(result.src_ids) + 1)
    assert torch.allclose(weights.sum(-1), torch.ones(weights.size(0)), atol=1e-4)
    assert translator.translate(["Ein Hund läuft."])[0].attention is None


def readme_example() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no python block under '## Python API'"
    return match.group(1)


def test_readme_example_runs(model_file, tmp_path):
    (tmp_path / "model.nmt").symlink_to(model_file)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", readme_example()], capture_output=True, text=True, cwd=tmp_path,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and lines[0].strip(), result.stdout


def test_threads_share_a_translator_and_its_model_without_a_lock(model_file):
    """A shortlist's output rows live in each call's own inference context, not on the model: searches of
    one model from several threads at once give what they give one after another."""
    translator = Translator.load(model_file, device="cpu", precision="fp32", beam_size=2, shortlist=True)
    lines = read_gz("test_2016_flickr.de", 40)
    chunks = [lines[i::4] for i in range(4)]
    expected = [[t.text for t in translator.translate(chunk)] for chunk in chunks]
    found: dict[int, list[list[str]]] = {i: [] for i in range(4)}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                       # switch threads as often as possible

    def run(i: int) -> None:
        for _ in range(3):
            found[i].append([t.text for t in translator.translate(chunks[i])])

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert all(found[i] == [expected[i]] * 3 for i in range(4))


@pytest.mark.parametrize("call, error, message", [
    (lambda t: t.translate("Ein Hund."), TypeError, "lines must be a list of strings, not one string"),
    (lambda t: t.translate(["Ein Hund."], prefixes="A"), TypeError, "prefixes must be a list"),
    (lambda t: t.score("Ein Hund.", "A dog."), TypeError, "sources must be a list"),
    (lambda t: list(t.translate_stream("Ein Hund.")), TypeError, "not one string"),
    (lambda t: t.translate(["Ein Hund."], beam_size=2.5), ValueError, "integers from 1 to 1000, got 2.5"),
    (lambda t: t.translate(["Ein Hund."], n_best=2.0), ValueError, "integers from 1 to 1000"),
    (lambda t: t.translate(["Ein Hund."], beam_size=0), ValueError, "integers from 1 to 1000"),
    (lambda t: t.translate(["Ein Hund."], beam_size=10**8), ValueError, "integers from 1 to 1000, got 100000000"),
    (lambda t: t.translate(["Ein Hund."], beam_size=2, n_best=4), ValueError,
     "n_best 4 is larger than the beam size 2: beam search finds at most beam_size hypotheses; "
     "raise beam_size to at least 4 or use sampling"),
    (lambda t: Translator.load([]), ValueError, "at least one model path"),
    (lambda t: Translator.load(123), TypeError, "path must be a model file or checkpoint path"),
    (lambda t: t.translate([b"Ein Hund."]), TypeError, "lines[0] is bytes, not a string"),
    (lambda t: t.translate(b"Ein Hund."), TypeError, "not one bytes"),
    (lambda t: t.score(["Ein Hund."], [None]), TypeError, "targets[0] is NoneType, not a string"),
    (lambda t: list(t.translate_stream(["Ein Hund.", b"x"])), TypeError,
     "lines[1] is bytes, not a string or a (source, prefix) pair of strings"),
    (lambda t: list(t.translate_stream([("Ein Hund.", "A", "extra")])), TypeError, "lines[0] is a tuple of 3"),
    (lambda t: t.translate(["Ein Hund.", "Ein \ud800 Hund."]), ValueError,
     "lines[1] is not valid Unicode (a lone surrogate)"),
    (lambda t: Translator.load_ensemble("model.nmt"), TypeError, "a list of model paths, not one path"),
    (lambda t: t.translate(["Ein Hund."], first_line="x"), TypeError,
     "first_line must be an int (the number of the call's first line), got 'x'"),
    (lambda t: t.score(["Ein Hund."], ["A dog."], first_line=None), TypeError, "first_line must be an int"),
    (lambda t: Translator.load("model.nmt", threads=2), TypeError,
     "threads applies to an ONNX folder, whose onnxruntime session has threads of its own"),
])
def test_a_wrong_argument_is_one_clear_error(translator, call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(translator)


@pytest.mark.parametrize("settings, message", [
    ({"seed": -1}, "`decoding.seed` must be >= 0, got -1"),
    ({"beam_size": 10**8}, "`decoding.beam_size` must be <= 1000"),
    ({"min_len": 30, "max_len": 5}, "`decoding.min_len` 30 leaves no room under `decoding.max_len` 5"),
    ({"device": "cuda:99"}, "device cuda:99 was asked for"),
    ({"device": None}, "unknown device None"),
])
def test_load_holds_its_settings_to_the_config_rules(model_file, settings, message):
    """Settings passed to `Translator.load` meet the rules of the YAML file, though the stored config is
    read leniently (it may come from an earlier nmt)."""
    from nmt.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        Translator.load(model_file, **settings)


def test_a_stored_min_len_above_max_len_translates_and_only_length_options_are_checked(model_file, tmp_path):
    """Older nmt stored such configs: unrelated options still load it, and the cap wins over min_len."""
    from nmt.config import ConfigError
    from nmt.modelfile.file import read_state
    from nmt.modelfile.tensors import write_model_file

    state, _ = read_state(model_file)
    state["config"]["decoding"].update(min_len=10, max_len=5)
    path = tmp_path / "minmax.nmt"
    write_model_file(state, path)
    results = Translator.load(path, device="cpu", beam_size=2).translate(["Ein Hund läuft über die Wiese."])
    assert 1 <= len(results[0].hypotheses[0].tokens) <= 4 and results[0].text
    with pytest.raises(ConfigError, match="leaves no room under"):
        Translator.load(path, device="cpu", max_len=6)


def test_a_per_call_beam_size_does_not_apply_to_a_sampling_translator(model_file):
    """It would be ignored (samples are drawn, not searched); the translator's own beam size, which `nmt serve`
    passes with every request, is no request for a beam."""
    from nmt.config import ConfigError

    sampler = Translator.load(model_file, device="cpu", sampling=True, seed=5)
    with pytest.raises(ConfigError, match="beam_size 8 does not apply to sampling"):
        sampler.translate(["Ein Hund."], beam_size=8)
    assert len(sampler.translate(["Ein Hund."], beam_size=sampler.decoding.beam_size)) == 1


def test_a_list_of_one_path_loads_that_model(model_file, translator):
    loaded = Translator.load([model_file], device="cpu", precision="fp32")
    assert isinstance(loaded, Translator) and not isinstance("model.nmt", Translator)
    assert loaded.translate(["Ein Hund läuft."])[0].text == translator.translate(["Ein Hund läuft."])[0].text
