"""Vocabulary shortlist: gathering in preprocess, carrying into checkpoints and model files, decoding."""

import json
import threading
from collections import Counter
from itertools import product

import numpy as np
import pytest
import torch

import nmt.data.shortlist as gathering
from nmt.config import ConfigError, load_config
from nmt.data.folder import DataFolder
from nmt.data.shortlist import CooccurrenceCounts, load_shortlist, vocab_fingerprint
from nmt.decode.shortlist import SPECIALS, Shortlist
from nmt.decode.translator import Translator
from nmt.modelfile.file import export_model
from tests.test_errors import assert_one_error, run_cli


def random_corpus(n: int, src_size: int, tgt_size: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, src_size, rng.integers(0, 9)), rng.integers(0, tgt_size, rng.integers(0, 9)))
            for _ in range(n)]


def count_in_chunks(corpus, src_size: int, tgt_size: int, max_pairs: int, chunk: int) -> CooccurrenceCounts:
    counts = CooccurrenceCounts(src_size, tgt_size, max_pairs)
    for i in range(0, len(corpus), chunk):
        part = corpus[i : i + chunk]
        counts.add(np.concatenate([s for s, _ in part]).astype(np.int32), np.array([len(s) for s, _ in part]),
                   np.concatenate([t for _, t in part]).astype(np.int32), np.array([len(t) for _, t in part]))
    return counts


def test_counts_equal_a_brute_force_count(monkeypatch):
    monkeypatch.setattr(gathering, "PAIRS_PER_BLOCK", 50)       # many blocks per chunk
    corpus = random_corpus(300, 13, 11)
    counts = count_in_chunks(corpus, 13, 11, max_pairs=250, chunk=37)
    joint, src, tgt = Counter(), Counter(), Counter()
    for s, t in corpus[:250]:
        src.update(set(s.tolist()))
        tgt.update(set(t.tolist()))
        joint.update(product(set(s.tolist()), set(t.tolist())))
    assert counts.pairs == 250
    assert {divmod(int(k), 11): int(c) for k, c in zip(counts.keys, counts.joint, strict=True)} == dict(joint)
    assert counts.src.tolist() == [src[i] for i in range(13)]
    assert counts.tgt.tolist() == [tgt[i] for i in range(11)]


@pytest.mark.parametrize("score", ["dice", "prob"])
def test_table_keeps_the_k_best_by_score_and_the_frequent_apart(score):
    corpus = random_corpus(200, 9, 14, seed=3)
    counts = count_in_chunks(corpus, 9, 14, max_pairs=10**6, chunk=64)
    targets, frequent = counts.table(np.arange(14), np.arange(9), 9, k=4, n_frequent=3, score=score)
    c_t = counts.tgt.copy()
    c_t[:4] = 0
    assert frequent.tolist() == sorted(range(14), key=lambda t: (-c_t[t], t))[:3]
    joint = {divmod(int(k), 14): int(c) for k, c in zip(counts.keys, counts.joint, strict=True)}
    for s in range(9):
        def value(t, s=s):
            c = joint.get((s, t), 0)
            return 2 * c / (counts.src[s] + counts.tgt[t]) if score == "dice" else c / counts.src[s]
        candidates = [t for t in range(4, 14) if joint.get((s, t)) and t not in frequent]
        best = sorted(candidates, key=lambda t: (-value(t), t))[:4]
        assert targets[s].tolist() == best + [-1] * (4 - len(best))


def test_preprocess_writes_a_shortlist_in_the_target_id_space(prepared):
    data = DataFolder.open(load_config(prepared).data.out_dir)
    entry = data.manifest["shortlist"]
    arrays = load_shortlist(data.root / entry["file"])
    src, tgt = data.vocab("src"), data.vocab("tgt")
    assert arrays["targets"].shape == (len(src), entry["k"])
    assert arrays["targets"].max() < len(tgt) and 0 < len(arrays["frequent"]) <= entry["frequent"]
    assert arrays["vocab_sha256"] == vocab_fingerprint(src.sp.serialized_model_proto(),
                                                       tgt.sp.serialized_model_proto(), tgt.pieces)
    # the best target piece of a frequent source word is a target piece of its translations
    word = src.encode(["Hund"])[0]
    listed = set(arrays["targets"][word].ravel().tolist()) | set(arrays["frequent"].tolist())
    assert set(tgt.encode(["dog"])[0].tolist()) <= listed


@pytest.fixture(scope="module")
def translator(trained_run):
    return Translator.load(trained_run / "best.pt", "cpu", batch_tokens=300)


@pytest.fixture(scope="module")
def sources(corpus_dir):
    return (corpus_dir / "val.de").read_text(encoding="utf-8").splitlines()[:40]


def full_shortlist(translator: Translator) -> Shortlist:
    size = len(translator.tgt_vocab)
    empty = torch.full((len(translator.src_vocab), 1), -1, dtype=torch.long)
    return Shortlist(empty, torch.arange(size), size)


@pytest.mark.parametrize("options", [
    {"beam_size": 1}, {"beam_size": 4}, {"beam_size": 4, "n_best": 3}, {"beam_size": 1, "no_repeat_ngram": 2},
    {"beam_size": 3, "prefix": True}, {"beam_size": 1, "prefix": True},
    {"beam_size": 3, "replace_unk": True, "min_len": 4, "coverage_penalty": 0.2}])
def test_a_shortlist_of_every_piece_gives_the_full_vocabulary_outputs(translator, sources, options):
    options = dict(options)
    prefixes = ["A" if i % 2 else "" for i in range(len(sources))] if options.pop("prefix", False) else None
    decoding = {k: options.pop(k) for k in ("no_repeat_ngram", "replace_unk", "min_len", "coverage_penalty")
                if k in options}
    plain = Translator(translator.model, translator.src_vocab, translator.tgt_vocab,
                       _decoding(translator, **decoding), translator.device)
    listed = Translator(translator.model, translator.src_vocab, translator.tgt_vocab,
                        _decoding(translator, shortlist=True, **decoding), translator.device,
                        full_shortlist(translator))
    a = plain.translate(sources, prefixes=prefixes, return_attention=True, **options)
    b = listed.translate(sources, prefixes=prefixes, return_attention=True, **options)
    for x, y in zip(a, b, strict=True):
        assert x.text == y.text
        assert [h.tokens for h in x.hypotheses] == [h.tokens for h in y.hypotheses]
        assert [h.score for h in x.hypotheses] == pytest.approx([h.score for h in y.hypotheses], abs=1e-5)
        assert torch.equal(x.attention, y.attention)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_int8_with_a_shortlist_of_every_piece_gives_the_int8_full_vocabulary_outputs(trained_run, sources, beam_size):
    """The shortlist cuts the int8 output product (not a float32 copy of its rows): the same scores."""
    plain = Translator.load(trained_run / "best.pt", "cpu", batch_tokens=300, beam_size=beam_size, quantize="int8")
    listed = Translator(plain.model, plain.src_vocab, plain.tgt_vocab, _decoding(plain, shortlist=True),
                        plain.device, full_shortlist(plain))
    for x, y in zip(plain.translate(sources), listed.translate(sources), strict=True):
        assert [h.tokens for h in x.hypotheses] == [h.tokens for h in y.hypotheses]
        assert [h.score for h in x.hypotheses] == pytest.approx([h.score for h in y.hypotheses], abs=1e-5)


def _decoding(translator: Translator, **changes):
    from dataclasses import replace

    return replace(translator.decoding, **changes)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_trained_models_shortlist_outputs_match_the_full_vocabulary(trained_run, sources, beam_size):
    full = Translator.load(trained_run / "best.pt", "cpu", beam_size=beam_size, shortlist=False)
    listed = Translator.load(trained_run / "best.pt", "cpu", beam_size=beam_size, shortlist=True)
    assert full.shortlist is None
    assert listed.shortlist is not None
    same = [a.text == b.text for a, b in zip(full.translate(sources), listed.translate(sources), strict=True)]
    assert sum(same) >= 0.9 * len(same)


def test_an_ensemble_decodes_with_the_first_models_shortlist(trained_run, sources):
    single = Translator.load(trained_run / "best.pt", "cpu", beam_size=3, shortlist=True)
    pair = Translator.load([trained_run / "best.pt", trained_run / "best.pt"], "cpu", beam_size=3, shortlist=True)
    assert pair.shortlist is not None
    assert [t.text for t in pair.translate(sources)] == [t.text for t in single.translate(sources)]


def test_threads_sharing_a_translator_get_their_own_shortlists(trained_run, sources):
    """A shortlist is set on the shared model for one search: concurrent calls must not see another's."""
    plain = Translator.load(trained_run / "best.pt", "cpu", beam_size=3, batch_tokens=60)
    generator = torch.Generator().manual_seed(0)           # a few targets per source piece: small, varied subsets
    targets = torch.randint(SPECIALS, len(plain.tgt_vocab), (len(plain.src_vocab), 3), generator=generator)
    listed = Translator(plain.model, plain.src_vocab, plain.tgt_vocab, _decoding(plain, shortlist=True),
                        plain.device, Shortlist(targets, torch.arange(SPECIALS), len(plain.tgt_vocab)))
    parts = [sources[i::4] for i in range(4)]
    expected = [[t.text for t in listed.translate(part)] for part in parts]
    results: list[list[list[str]]] = [[] for _ in parts]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                results[i].append([t.text for t in listed.translate(parts[i])])
        except BaseException as exc:      # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(parts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results == [[texts] * 3 for texts in expected]


def test_select_keeps_specials_frequent_rows_and_prefix(translator):
    targets = torch.tensor([[-1, -1], [-1, -1], [-1, -1], [-1, -1], [9, 7], [12, -1]])
    shortlist = Shortlist(targets, torch.tensor([0, 1, 2, 3, 5]), 20)
    keep = shortlist.select(torch.tensor([[4, 3], [5, 0]]), extra=torch.tensor([[15, 0]]))
    assert keep.tolist() == [0, 1, 2, 3, 5, 7, 9, 12, 15]


def test_model_files_and_checkpoints_carry_the_shortlist(trained_run, tmp_path, sources):
    model = tmp_path / "model.nmt"
    export_model(trained_run / "best.pt", model)
    from_file = Translator.load(model, "cpu", shortlist=True)
    from_checkpoint = Translator.load(trained_run / "best.pt", "cpu", shortlist=True)
    # asking for k pieces per source piece turns the shortlist on; with shortlist=False it would be ignored
    assert Translator.load(model, "cpu", shortlist_k=20).decoding.shortlist is True
    with pytest.raises(ConfigError, match="`decoding.shortlist_k` applies only with the shortlist on"):
        Translator.load(model, "cpu", shortlist_k=20, shortlist=False)
    assert torch.equal(from_file.shortlist.targets, from_checkpoint.shortlist.targets)
    texts = [t.text for t in from_file.translate(sources[:10])]
    assert texts == [t.text for t in from_checkpoint.translate(sources[:10])]
    result = run_cli("translate", "--model", str(model), "--shortlist", "--beam-size", "2", "-q",
                     stdin="\n".join(sources[:5]).encode() + b"\n")
    assert result.returncode == 0, result.stderr.decode()
    assert len(result.stdout.decode().splitlines()) == 5


def test_a_model_without_a_shortlist_gives_one_clean_error(trained_run, tmp_path, prepared):
    state = torch.load(trained_run / "best.pt", weights_only=True)
    del state["shortlist"]
    old = tmp_path / "old.pt"
    torch.save(state, old)
    result = run_cli("translate", "--checkpoint", str(old), "--shortlist", stdin=b"Ein Hund.\n")
    assert "no vocabulary shortlist" in assert_one_error(result)
    # --shortlist-k asks for the shortlist too; with --no-shortlist it would be ignored
    result = run_cli("translate", "--checkpoint", str(old), "--shortlist-k", "5", stdin=b"Ein Hund.\n")
    assert "no vocabulary shortlist" in assert_one_error(result)
    result = run_cli("translate", "--checkpoint", str(old), "--shortlist-k", "5", "--no-shortlist", "-q",
                     stdin=b"Ein Hund.\n")
    assert "`--shortlist-k` applies only with the shortlist on" in assert_one_error(result)
    result = run_cli("translate", "--checkpoint", str(old), "--no-shortlist", "-q", stdin=b"Ein Hund.\n")
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1, result.stderr.decode()
    # the data folder's shortlist.npz serves such a model
    npz = tmp_path / "shortlist.npz"
    npz.write_bytes((DataFolder.open(load_config(prepared).data.out_dir).root / "shortlist.npz").read_bytes())
    result = run_cli("translate", "--checkpoint", str(old), "--shortlist-file", str(npz), "-q", stdin=b"Ein Hund.\n")
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1, result.stderr.decode()


def test_refusals_are_one_line(trained_run, tmp_path):
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "--shortlist", "--sampling",
                     stdin=b"Ein Hund.\n")
    assert "--sampling" in assert_one_error(result)
    other = tmp_path / "other.npz"
    np.savez(other, targets=np.zeros((3, 2), np.int16), frequent=np.zeros(1, np.int16), vocab_sha256=np.array("x"))
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "--shortlist-file", str(other),
                     stdin=b"Ein Hund.\n")
    assert "other vocabularies" in assert_one_error(result)
    (tmp_path / "junk.npz").write_bytes(b"junk")
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "--shortlist-file",
                     str(tmp_path / "junk.npz"), stdin=b"Ein Hund.\n")
    assert "not a readable shortlist" in assert_one_error(result)


def test_manifest_records_the_shortlist_settings(prepared):
    manifest = json.loads((DataFolder.open(load_config(prepared).data.out_dir).root / "manifest.json").read_text())
    assert manifest["shortlist"]["score"] in ("dice", "prob") and manifest["shortlist"]["pairs"] > 0


def test_the_cpu_decodes_with_the_embedded_shortlist_by_default(trained_run, sources, tmp_path):
    """The fast path needs no flag: a model that embeds a shortlist uses it on the CPU; --no-shortlist, a model
    without one, sampling and a GPU keep the full vocabulary."""
    from nmt.decode.translator import shortlist_by_default
    from nmt.modelfile.file import load_model

    default = Translator.load(trained_run / "best.pt", "cpu", beam_size=3)
    listed = Translator.load(trained_run / "best.pt", "cpu", beam_size=3, shortlist=True)
    assert default.decoding.shortlist and default.shortlist is not None
    assert [t.text for t in default.translate(sources)] == [t.text for t in listed.translate(sources)]
    assert Translator.load(trained_run / "best.pt", "cpu", shortlist=False).shortlist is None
    assert Translator.load(trained_run / "best.pt", "cpu", sampling=True).shortlist is None
    loaded = load_model(trained_run / "best.pt")
    assert not shortlist_by_default(loaded, torch.device("cuda"), {})
    state = torch.load(trained_run / "best.pt", weights_only=True)
    del state["shortlist"]
    torch.save(state, tmp_path / "old.pt")
    assert Translator.load(tmp_path / "old.pt", "cpu").shortlist is None             # nothing to use, no error
    result = run_cli("info", str(trained_run / "best.pt"))
    assert "used by default when decoding on the CPU" in result.stdout.decode()


def test_info_says_a_sampling_model_keeps_the_full_vocabulary(trained_run, tmp_path):
    """`nmt info` reports the CPU default the translator applies: on for a model that searches, off for one
    whose stored decoding samples."""
    searching = json.loads(run_cli("info", str(trained_run / "best.pt"), "--json").stdout)
    assert searching["shortlist"]["default_on_cpu"] is True
    state = torch.load(trained_run / "best.pt", weights_only=True)
    state["config"]["decoding"]["sampling"] = True
    torch.save(state, tmp_path / "sampler.pt")
    assert Translator.load(tmp_path / "sampler.pt", "cpu").shortlist is None
    sampling = run_cli("info", str(tmp_path / "sampler.pt"), "--json")
    assert sampling.returncode == 0 and json.loads(sampling.stdout)["shortlist"]["default_on_cpu"] is False
    card = run_cli("info", str(tmp_path / "sampler.pt")).stdout.decode()
    assert "off by default: this model samples" in card and "used by default" not in card
