"""Scores with sacreBLEU: BLEU, chrF (and TER), their signatures, and paired bootstrap tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import PairedTest

from nmt.config import memory_bytes
from nmt.textio import TextInputError, read_lines

MAX_BOOTSTRAP = 100_000     # bootstrap samples: each is a Python-level BLEU computation (~0.1 ms)


class EvaluationError(ValueError):
    """Inputs that cannot be scored together (e.g. different line counts)."""


def read_text(path: str | Path) -> list[str]:
    """The lines of a text file: only "\\n" ends a line (see nmt.textio)."""
    try:
        return read_lines(path)
    except TextInputError as exc:
        raise EvaluationError(str(exc)) from None


def check_lengths(hyps: list[str], refs: list[str], hyp_name: str = "the hypotheses",
                  ref_name: str = "the references") -> None:
    """sacreBLEU pairs hypotheses with references by position and silently drops what one list has more of:
    every score nmt computes is refused unless the counts agree."""
    if not refs:
        raise EvaluationError(f"{ref_name} is empty; there is nothing to score")
    if len(hyps) != len(refs):
        raise EvaluationError(
            f"{hyp_name} has {len(hyps)} lines but {ref_name} has {len(refs)}; hypotheses and references must align"
        )


def bleu(hyps: list[str], refs: list[str]) -> float:
    """Corpus BLEU with sacreBLEU's defaults (unrounded), for scripts; refuses counts that differ."""
    check_lengths(hyps, refs)
    return BLEU().corpus_score(hyps, [refs]).score


def make_metrics(ter: bool = False) -> dict[str, Any]:
    metrics: dict[str, Any] = {"bleu": BLEU(), "chrf": CHRF()}
    if ter:
        metrics["ter"] = TER()
    return metrics


def score(hyps: list[str], refs: list[str], ter: bool = False) -> dict[str, Any]:
    """Corpus scores with sacreBLEU's default settings; each with its signature."""
    check_lengths(hyps, refs)
    results: dict[str, Any] = {"sentences": len(hyps)}
    for name, metric in make_metrics(ter).items():
        result = metric.corpus_score(hyps, [refs])
        entry = {"score": round(result.score, 2), "signature": str(metric.get_signature()), "text": str(result)}
        if name == "bleu":
            entry.update(precisions=[round(p, 2) for p in result.precisions], bp=round(result.bp, 4),
                         sys_len=result.sys_len, ref_len=result.ref_len)
        results[name] = entry
    return results


def compare(hyps: list[str], other: list[str], refs: list[str], ter: bool = False,
            samples: int = 1000) -> dict[str, Any]:
    """Paired bootstrap resampling (Koehn 2004) of `other` against the baseline `hyps`.

    sacreBLEU draws all `samples` x sentences indices at once (8 bytes each): a count whose draw would
    not fit in a quarter of this machine's memory is refused before it starts."""
    check_lengths(hyps, refs, "the baseline")
    check_lengths(other, refs, "the other system")
    if not 1 <= samples <= MAX_BOOTSTRAP:
        raise EvaluationError(f"--bootstrap-samples must be in 1..{MAX_BOOTSTRAP}, got {samples}")
    need = samples * len(hyps) * 8
    if need > memory_bytes() // 4:
        raise EvaluationError(f"--bootstrap-samples {samples} over {len(hyps)} sentences needs "
                              f"{need / 2**30:.1f} GiB for its draws; use fewer samples (1000 is the usual)")
    metrics = {m.__class__.__name__: m for m in make_metrics(ter).values()}
    test = PairedTest([("baseline", hyps), ("other", other)], metrics, [refs], test_type="bs", n_samples=samples)
    signatures, scores = test()
    out = {}
    for metric_name, (baseline, system) in ((k, v) for k, v in scores.items() if k != "System"):
        out[metric_name] = {
            "baseline": round(float(baseline.score), 2), "other": round(float(system.score), 2),
            "other_mean": round(float(system.mean), 2), "other_ci95": round(float(system.ci), 2),
            "p_value": float(system.p_value), "signature": str(signatures[metric_name]),
        }
    return out


def format_report(results: dict[str, Any], hyp_name: str, ref_name: str) -> str:
    lines = [f"hypotheses: {hyp_name}", f"references: {ref_name}", f"sentences:  {results['sentences']}"]
    for name in ("bleu", "chrf", "ter"):
        if name in results:
            lines.append(f"{results[name]['text']}")
            lines.append(f"  signature: {results[name]['signature']}")
    for metric, entry in results.get("comparison", {}).items():
        verdict = "significant" if entry["p_value"] is not None and entry["p_value"] < 0.05 else "not significant"
        lines.append(f"paired bootstrap {metric}: baseline {entry['baseline']} vs other {entry['other']} "
                     f"(mean {entry['other_mean']} ± {entry['other_ci95']}), p = {entry['p_value']:.4f} "
                     f"({verdict} at 0.05)")
    return "\n".join(lines)
