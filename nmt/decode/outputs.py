"""What a translation gives back, in one format for the command line, the Python API and the server.

The n-best rule everywhere: exactly K entries, the hypotheses found, best first, then empty texts scored 0 for an
empty input line (its empty output is exact), -inf (JSON: null) when the search found fewer: line i*K + r of
`--n-best` is input line i's. `--scores` and `nmt score` write log p and log p / lp(|y|), |y| counting EOS.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

import numpy as np

from nmt.config import ConfigError
from nmt.data.special import UNK
from nmt.data.tokenizer import Vocab
from nmt.fs.folders import FolderError, PendingFile
from nmt.fs.outputs import DeviceFile, check_outputs, open_output, output_target

if TYPE_CHECKING:                      # no torch at run time: the ONNX runtime (nmt.runtime) writes through here too
    from torch import Tensor

    from nmt.decode.rule import Hypothesis


@dataclass
class Translation:
    """The result for one input line; hypotheses carry attention (target pieces + EOS, source pieces + EOS)
    when asked for."""

    text: str                              # the best hypothesis, detokenised ("" for an empty line)
    hypotheses: list[Hypothesis]           # n-best, best first; empty for an empty line
    src_ids: np.ndarray                    # source side ids as encoded (after truncation), EOS excluded
    truncated: bool = False
    nbest_texts: list[str] = field(default_factory=list)   # detokenised hypotheses when n_best > 1
    n_best: int = 1                        # the length of `nbest`: what the call asked for

    def __str__(self) -> str:
        return self.text

    @property
    def score(self) -> float | None:
        """The best hypothesis's score (what the search ranked it by); None for an empty line."""
        return self.hypotheses[0].score if self.hypotheses else None

    @property
    def padding_score(self) -> float:
        return 0.0 if not self.hypotheses else float("-inf")

    @property
    def nbest(self) -> list[tuple[str, float]]:
        """Exactly `n_best` (text, score) pairs by the module's rule."""
        texts = self.nbest_texts or [self.text]
        found = [(text, hyp.score) for text, hyp in zip(texts, self.hypotheses[: self.n_best], strict=False)]
        return found + [("", self.padding_score)] * (self.n_best - len(found))

    @property
    def attention(self) -> Tensor | None:
        return self.hypotheses[0].attention if self.hypotheses else None


def translations(lines: list[str], results: list[list[Hypothesis]], encoded: list[np.ndarray], truncated: list[bool],
                 n_best: int, vocabs: tuple[Vocab, Vocab], replace_unk: bool) -> list[Translation]:
    """One Translation per line from its hypotheses (none for an empty line), the texts decoded in one call for
    the best and one for the n-best; with `replace_unk`, each <unk> of a best text is replaced (`unk_replaced`)."""
    src_vocab, tgt_vocab = vocabs
    texts = tgt_vocab.decode([h[0].tokens if h else [] for h in results])
    if replace_unk:
        texts = [unk_replaced(src_vocab, tgt_vocab, line, h[0]) if h and UNK in h[0].tokens else text
                 for line, text, h in zip(lines, texts, results, strict=True)]
    done = [Translation(text if line.strip() else "", hyps, ids, bool(cut), n_best=n_best)
            for line, text, hyps, ids, cut in zip(lines, texts, results, encoded, truncated, strict=True)]
    if n_best > 1:
        flat_texts = iter(tgt_vocab.decode([h.tokens for hyps in results for h in hyps]))
        for translation in done:
            translation.nbest_texts = [next(flat_texts) for _ in translation.hypotheses]
    return done


def unk_replaced(src_vocab: Vocab, tgt_vocab: Vocab, line: str, hyp: Hypothesis) -> str:
    """The hypothesis' text with each <unk> replaced by the source text of its most attended source piece."""
    offsets = src_vocab.sp.EncodeAsOffsetMapping(line)["offsets"]        # (start, end) in `line` per piece
    surfaces = [line[start:end].strip() for start, end in offsets]
    assert hyp.attention is not None                                     # asked for with replace_unk
    attention = hyp.attention[: len(hyp.tokens), : max(1, len(surfaces))]   # (tokens, src pieces), EOS column off
    best = attention.argmax(-1).tolist()
    pieces = [surfaces[best[t]] if token == UNK and surfaces else piece
              for t, (token, piece) in enumerate(zip(hyp.tokens, tgt_vocab.to_pieces(hyp.tokens), strict=True))]
    return tgt_vocab.sp.decode_pieces(pieces)


def nbest_lines(result: Translation, number: int) -> str:
    """`--n-best` output: one line 'N ||| text ||| score' per entry (N the 0-based input line)."""
    return "".join(f"{number} ||| {text} ||| {score:.4f}\n" for text, score in result.nbest)


def nbest_json(result: Translation) -> list[dict[str, Any]]:
    """The server's n-best list: {"text", "score"} per entry, score rounded to 4 places, null if not finite."""
    return [{"text": text, "score": round(score, 4) if math.isfinite(score) else None}
            for text, score in result.nbest]


def normalised_score(log_prob: float, length: int, alpha: float) -> float:
    """log p / lp(|y|), the GNMT length normalisation; `length` counts EOS."""
    return log_prob / ((5.0 + length) / 6.0) ** alpha        # lp(|y|) of nmt.decode.search


def score_line(number: int, log_prob: float, normalised: float, length: int, as_json: bool,
               rank: int | None = None) -> str:
    """One line of `--scores` or `nmt score`: 'log-prob<TAB>normalised', or JSON with the line
    (0-based), the rank in the n-best list (translate only), log_prob, score and length (EOS counted)."""
    if not as_json:
        return f"{log_prob:.6f}\t{normalised:.6f}\n"
    ranked = {"rank": rank} if rank is not None else {}
    return json.dumps({"line": number, **ranked, "log_prob": round(log_prob, 6), "score": round(normalised, 6),
                       "length": length}) + "\n"


def score_lines(result: Translation, number: int, alpha: float, as_json: bool) -> str:
    """`--scores` for one input line: one line per n-best entry; padding entries get its padding score."""
    lines = [score_line(number, hyp.log_prob, normalised_score(hyp.log_prob, len(hyp.tokens) + 1, alpha),
                        len(hyp.tokens) + 1, as_json, rank)
             for rank, hyp in enumerate(result.hypotheses[: result.n_best])]
    missing = result.padding_score
    lines += [score_line(number, missing, missing, 0, as_json, rank) for rank in range(len(lines), result.n_best)]
    return "".join(lines)


def word_alignments(src_pieces: list[str], tgt_pieces: list[str], attention: Tensor) -> str:
    """Pharaoh alignments "i-j" (source word i, target word j, 0-based): each target piece to its most attended
    source piece, pieces to words by their "▁" starts. attention: (tgt_pieces [+ EOS], src_pieces [+ EOS])."""
    def word_index(pieces: list[str]) -> list[int]:                # the word of each piece
        return list(accumulate((int(i == 0 or p.startswith("▁")) for i, p in enumerate(pieces)), initial=-1))[1:]

    if not tgt_pieces or not src_pieces:
        return ""
    src_word, tgt_word = word_index(src_pieces), word_index(tgt_pieces)
    best = attention[: len(tgt_pieces), : len(src_pieces)].argmax(-1).tolist()
    pairs = sorted({(src_word[s], tgt_word[t]) for t, s in enumerate(best)})
    return " ".join(f"{s}-{t}" for s, t in pairs)


def attention_record(number: int, src_pieces: list[str], tgt_pieces: list[str], hyp: Hypothesis | None) -> str:
    """One line of `--attention-out`: the pieces of both sides (with </s>) and the weights, 4 places."""
    attention = hyp.attention.tolist() if hyp is not None and hyp.attention is not None else []
    weights = [[round(w, 4) for w in row] for row in attention]
    record = {"line": number, "src": [*src_pieces, "</s>"], "tgt": [*tgt_pieces, "</s>"], "attention": weights}
    return json.dumps(record, ensure_ascii=False) + "\n"


@dataclass
class OutputFiles:
    """Where `write_results` puts things; only `text` is required."""

    text: TextIO
    alignments: TextIO | None = None    # Pharaoh "i-j" word alignments, one line per input line
    attention: TextIO | None = None     # JSON lines: source/target pieces and the weight matrix
    plotter: Any = None                 # nmt.plot.AttentionPlotter, writes one heatmap per sentence
    scores: TextIO | None = None        # per output line: log p and length-normalised score
    scores_json: bool = False           # scores as JSON lines instead of tab-separated

    def __post_init__(self) -> None:
        if self.scores_json and self.scores is None:
            raise ValueError("scores_json needs a scores file (--scores-json needs --scores)")

    @property
    def wants_attention(self) -> bool:
        return self.alignments is not None or self.attention is not None or self.plotter is not None

    def flush(self) -> None:
        for handle in (self.text, self.alignments, self.attention, self.scores):
            if handle is not None:
                handle.flush()


@dataclass
class ResultWriter:
    """Writes translations into `files`; `alpha` (decoding.length_penalty) normalises `--scores`."""

    files: OutputFiles
    src_vocab: Vocab
    tgt_vocab: Vocab
    alpha: float

    def write(self, batches: Iterable[list[Translation]]) -> None:
        """One line per input line, or n_best lines; every batch flushed at once, so a slow pipe sees it."""
        number = 0
        for batch in batches:
            for result in batch:
                self.write_one(result, number)
                number += 1
            self.files.flush()

    def write_one(self, result: Translation, number: int) -> None:
        files = self.files
        files.text.write(nbest_lines(result, number) if result.n_best > 1 else result.text + "\n")
        if files.scores is not None:
            files.scores.write(score_lines(result, number, self.alpha, files.scores_json))
        if not files.wants_attention:
            return
        hyp = result.hypotheses[0] if result.hypotheses else None
        src_pieces = self.src_vocab.to_pieces(result.src_ids)  # type: ignore[arg-type]  # any int array
        tgt_pieces = self.tgt_vocab.to_pieces(hyp.tokens) if hyp else []
        if files.alignments is not None:
            weights = hyp.attention if hyp is not None else None
            files.alignments.write((word_alignments(src_pieces, tgt_pieces, weights) if weights is not None else "")
                                   + "\n")
        if files.attention is not None:
            files.attention.write(attention_record(number, src_pieces, tgt_pieces, hyp))
        if files.plotter is not None and hyp:
            files.plotter.plot(number, [*src_pieces, "</s>"], [*tgt_pieces, "</s>"], hyp.attention)


@dataclass
class OutputPaths:
    """The files `nmt translate` writes, checked before the model loads; each a temporary file beside its target
    (a device such as /dev/null: written directly), renamed over it by `commit`, deleted on any failure."""

    text: Path | None = None            # --output; None: stdout
    alignments: Path | None = None      # --alignments
    attention: Path | None = None       # --attention-out
    scores: Path | None = None          # --scores
    scores_json: bool = False           # --scores-json
    plot_folder: Path | None = None     # --plot-attention
    _pending: list[PendingFile | DeviceFile] = field(default_factory=list, repr=False)

    OPTIONS: ClassVar[dict[str, str]] = {"text": "--output", "alignments": "--alignments",
                                         "attention": "--attention-out", "scores": "--scores"}

    def check(self, inputs: Iterable[tuple[str, Path | None]], stdin: bool) -> None:
        """ConfigError or FolderError, naming the option, for outputs that cannot be written or would overwrite
        an input, another output or a file of an nmt folder."""
        if self.scores_json and self.scores is None:
            raise ConfigError("--scores-json needs --scores FILE, the file the scores go to")
        paths = {option: getattr(self, name) for name, option in self.OPTIONS.items()}
        check_outputs(paths, inputs, stdin=stdin, stdout=None if self.text else "stdout (the command's output)")
        folder = self.plot_folder
        if folder is not None:
            if folder.exists() and not folder.is_dir():
                raise FolderError(f"--plot-attention: {folder} is a file, not a folder")
            for option, path in paths.items():
                if path is not None and path.resolve() == folder.resolve():
                    raise FolderError(f"--plot-attention {folder} is also {option}; the heatmaps need a folder "
                                      "of their own")

    def open(self, stack: ExitStack, stdout: TextIO) -> OutputFiles:
        """The open files (stdout for no --output); leftovers of killed runs beside each target removed first."""
        plotter = None
        if self.plot_folder is not None:
            from nmt.plot import AttentionPlotter

            plotter = AttentionPlotter(self.plot_folder)
        handles: dict[str, Any] = dict.fromkeys(self.OPTIONS)
        for name in self.OPTIONS:
            if (path := getattr(self, name)) is not None:
                pending = open_output(output_target(path))   # checked by `check`; a link changed since is refused
                stack.callback(pending.discard)
                self._pending.append(pending)
                handles[name] = pending.handle
        return OutputFiles(handles["text"] or stdout, handles["alignments"], handles["attention"], plotter,
                           handles["scores"], self.scores_json)

    def commit(self) -> None:
        for pending in self._pending:
            pending.commit()
