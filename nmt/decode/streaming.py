"""Input stream -> micro-batches -> translations in input order, one result per input line: a file goes through
in large chunks, a slow pipe gets each line's translation soon after the line, memory stays bounded. When most
non-empty lines translate to nothing, one warning says so: a BLEU of 0.00 reads as a broken tool.
"""

from __future__ import annotations

import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from itertools import islice, zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, TextIO

import numpy as np

from nmt.config import MAX_BEAM, ConfigError, DecodingConfig
from nmt.data.rows import flatten, longest_first, padded_ids, padded_prefixes, truncated
from nmt.data.special import EOS
from nmt.data.tokenizer import Vocab
from nmt.decode.outputs import OutputFiles, ResultWriter, Translation, score_line, translations
from nmt.fs.text import TextInputError, as_lines, iter_lines, open_text

if TYPE_CHECKING:
    from nmt.decode.rule import Hypothesis

Line = str | tuple[str, str]          # a source line, or a (source, target prefix) pair


class Translates(ABC):
    """What both translators share around their own `_search`: lines to budgeted batches to Translations,
    streams, output files, the n-best check. Torch-free: the PyTorch translator (nmt.decode.translator) and
    the onnxruntime one (nmt.runtime.translator) both derive from it."""

    decoding: DecodingConfig
    src_vocab: Vocab
    tgt_vocab: Vocab
    samples: ClassVar[bool] = True                  # can sample instead of searching (the PyTorch one)

    @property
    def sampling(self) -> bool:
        """It draws samples: its decoding says so, and it can (the PyTorch translator)."""
        return self.samples and self.decoding.sampling

    def translate(self, lines: list[str], n_best: int = 1, return_attention: bool = False, first_line: int = 1,
                  beam_size: int | None = None, prefixes: list[str] | None = None) -> list[Translation]:
        """One result per line, in order: the n_best hypotheses (or samples); `first_line` numbers warnings;
        `prefixes`: one forced target prefix per line ("" for none)."""
        lines, prefixes = checked_call(lines, prefixes, n_best, beam_size, first_line)
        if self.sampling and beam_size not in (None, self.decoding.beam_size):
            raise ConfigError(f"beam_size {beam_size} does not apply to sampling (`decoding.sampling`): samples "
                              "are drawn, not searched; load a translator without sampling for beam search")
        decoding = self.decoding if beam_size is None else replace(self.decoding, beam_size=beam_size)
        self.check_n_best(n_best, decoding)
        prefix_ids = self.tgt_vocab.encode(prefixes) if prefixes is not None and any(prefixes) else None
        limit = decoding.max_input_len
        encoded, cut = truncated(self.src_vocab.encode(lines), limit, lambda i, n: (
            f"warning: input line {first_line + i} has {n} pieces; truncated to {limit}"))
        results: list[list[Hypothesis]] = [[] for _ in lines]
        offsets, flat = flatten(encoded)                                     # the chunk as one flat id array
        rows_per_line = n_best if self.sampling else decoding.beam_size
        for rows in longest_first(offsets, np.array([bool(line.strip()) for line in lines], dtype=bool),
                                  self.batch_tokens() // max(1, rows_per_line)):
            src = padded_ids(flat, offsets, rows, None, EOS)                 # (rows, src_len)
            prefix = padded_prefixes(prefix_ids, rows) if prefix_ids is not None else None   # (rows, prefix_len)
            found = self._search(src, n_best, return_attention or decoding.replace_unk, decoding, prefix)
            for row, hyps in zip(rows.tolist(), found, strict=True):
                results[row] = hyps
        return translations(lines, results, encoded, cut.tolist(), n_best, (self.src_vocab, self.tgt_vocab),
                            decoding.replace_unk)

    @abstractmethod
    def _search(self, src: np.ndarray, n_best: int, return_attention: bool, d: DecodingConfig,
                prefix: np.ndarray | None) -> list[list[Hypothesis]]:
        """Each row's hypotheses, best first: (rows, src_len) ids with EOS, (rows, prefix_len) forced ids."""

    @abstractmethod
    def batch_tokens(self, scoring: bool = False) -> int: ...

    @abstractmethod
    def score(self, sources: list[str], targets: list[str],
              first_line: int = 1) -> list[tuple[float, float, int]]: ...

    def check_n_best(self, n_best: int, decoding: DecodingConfig | None = None,
                     names: tuple[str, str, str] = ("n_best", "beam_size", "sampling")) -> None:
        """n_best hypotheses need n_best beams (samples do not). `names`: the caller's for the three settings."""
        d = decoding or self.decoding
        if not (self.samples and d.sampling) and n_best > d.beam_size:
            n, beam, sampling = names
            raise ConfigError(f"{n} {n_best} is larger than the beam size {d.beam_size}: beam search finds at most "
                              f"{beam} hypotheses; raise {beam} to at least {n_best}"
                              + (f" or use {sampling}" if self.samples else ""))

    def translate_stream(self, lines: Iterable[Line], chunk_lines: int = 10000, n_best: int = 1,
                         return_attention: bool = False, progress: Any = None, max_wait: float = 0.05
                         ) -> Iterator[Translation]:
        """Results in input order; an item may be a (source, target prefix) pair. `lines` is read ahead (up to
        `chunk_lines` items) on a thread of its own, so that reading overlaps translating: an iterable bound to
        the calling thread (a database cursor) must be read into a list or a queue first."""
        for batch in self.translate_batches(lines, chunk_lines, n_best, return_attention, progress, max_wait):
            yield from batch

    def translate_batches(self, lines: Iterable[Line], chunk_lines: int = 10000, n_best: int = 1,
                          return_attention: bool = False, progress: Any = None, max_wait: float = 0.05
                          ) -> Iterator[list[Translation]]:
        """Each micro-batch's results as soon as it is translated; a reading error after every earlier line's."""
        if isinstance(lines, str):
            raise TypeError("lines must be an iterable of lines (a list, a file), not one string")
        first, inputs, empty = 1, 0, 0              # non-empty input lines, and those translated to nothing
        for chunk in micro_batches(lines, chunk_lines, max_wait):
            sources, prefixes = split_prefixes(chunk)
            results = self.translate(sources, n_best, return_attention, first_line=first, prefixes=prefixes)
            found = [bool(result.text.strip()) for source, result in zip(sources, results, strict=True)
                     if source.strip()]
            inputs, empty = inputs + len(found), empty + found.count(False)
            yield results
            first += len(chunk)
            if progress is not None:
                progress.update(len(chunk))
        if empty > inputs / 2:
            hint = "" if self.decoding.min_len else "; --min-len 1 forbids empty outputs"
            print(f"warning: {empty} of {inputs} non-empty input lines translated to empty lines; the model may "
                  f"be undertrained (train longer){hint}", file=sys.stderr, flush=True)

    def write_translations(self, lines: Iterable[Line], files: OutputFiles, n_best: int = 1,
                           progress: Any = None) -> None:
        """One line per input line into `files`, or `n_best` lines 'i ||| text ||| score' (nmt.decode.outputs)."""
        batches = self.translate_batches(lines, n_best=n_best, return_attention=files.wants_attention,
                                         progress=progress)
        ResultWriter(files, self.src_vocab, self.tgt_vocab, self.decoding.length_penalty).write(batches)


def without_line_ending(line: str) -> str:
    return line[:-2] if line.endswith("\r\n") else line.removesuffix("\n")


def stream_item(item: object, index: int) -> Line:
    """An item of a stream without its line ending: a string, or a (source, prefix) pair of strings."""
    if isinstance(item, str):
        return without_line_ending(item)
    if isinstance(item, tuple) and len(item) == 2 and all(isinstance(part, str) for part in item):
        return without_line_ending(item[0]), without_line_ending(item[1])
    kind = f"a tuple of {len(item)}" if isinstance(item, tuple) else type(item).__name__
    raise TypeError(f"lines[{index}] is {kind}, not a string or a (source, prefix) pair of strings")


def micro_batches(lines: Iterable[Line], max_lines: int, max_wait: float) -> Iterator[list[Line]]:
    """Batches of a stream read on a thread, line endings gone: at `max_lines` lines, at the end, or `max_wait`
    seconds after a batch's first line; an error of `lines` after every earlier line's batch. The reader wakes
    the consumer only for a batch's first line or a full buffer: a fast file costs no hand-off per line."""
    buffer: deque[Line] = deque()
    cond = threading.Condition()
    shared: dict[str, Any] = {"first_at": 0.0, "done": False, "error": None, "stop": False}

    def read() -> None:
        try:
            for index, item in enumerate(lines):
                line = stream_item(item, index)
                with cond:
                    while len(buffer) >= max_lines and not shared["stop"]:
                        cond.wait()
                    if shared["stop"]:
                        return
                    if not buffer:
                        shared["first_at"] = time.monotonic()
                    buffer.append(line)
                    if len(buffer) == 1 or len(buffer) >= max_lines:
                        cond.notify_all()
        except BaseException as exc:   # handed to the consumer, which raises it after the earlier lines
            shared["error"] = exc
        finally:
            with cond:
                shared["done"] = True
                cond.notify_all()

    max_lines = max(1, max_lines)
    reader = threading.Thread(target=read, name="nmt-line-reader", daemon=True)
    reader.start()
    try:
        while True:
            with cond:
                while not buffer and not shared["done"]:
                    cond.wait()
                if not buffer:
                    break
                deadline = shared["first_at"] + max_wait
                while len(buffer) < max_lines and not shared["done"]:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    cond.wait(remaining)
                batch = [buffer.popleft() for _ in range(min(len(buffer), max_lines))]
                shared["first_at"] = time.monotonic()
                cond.notify_all()                       # a reader waiting on a full buffer goes on
            yield batch
        if shared["error"] is not None:
            raise shared["error"]
    finally:
        with cond:
            shared["stop"] = True
            cond.notify_all()


def check_first_line(first_line: object) -> None:
    """`first_line` numbers the warnings of a call (a TypeError here, not in the first warning's f-string)."""
    if not isinstance(first_line, int) or isinstance(first_line, bool):
        raise TypeError(f"first_line must be an int (the number of the call's first line), got {first_line!r}")


def checked_call(lines: object, prefixes: object, n_best: object, beam_size: object,
                 first_line: object = 1) -> tuple[list[str], list[str] | None]:
    """A translate call's lines and prefixes (one per line) as lists of strings, or a TypeError or ValueError."""
    def whole(number: object) -> bool:
        return isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= MAX_BEAM

    check_first_line(first_line)
    lines = as_lines("lines", lines)
    prefixes = as_lines("prefixes", prefixes) if prefixes is not None else None
    if not (whole(n_best) and (beam_size is None or whole(beam_size))):
        raise ValueError(f"beam_size and n_best must be integers from 1 to {MAX_BEAM}, "
                         f"got {beam_size!r} and {n_best!r}")
    if prefixes is not None and len(prefixes) != len(lines):
        raise ValueError(f"{len(prefixes)} prefixes for {len(lines)} lines")
    return lines, prefixes


def split_prefixes(chunk: list[Line]) -> tuple[list[str], list[str] | None]:
    """A chunk of lines and (source, prefix) pairs -> the sources, and the prefixes ("" where none; None if none)."""
    if not any(isinstance(item, tuple) for item in chunk):
        return chunk, None                                             # type: ignore[return-value]
    pairs = [item if isinstance(item, tuple) else (item, "") for item in chunk]
    return [source for source, _ in pairs], [prefix for _, prefix in pairs]


def paired_lines(first: Iterator[str], second: Iterator[str], first_name: str,
                 second_name: str) -> Iterator[tuple[str, str]]:
    """Line i of both streams as a pair; one stream ending before the other is a `TextInputError`."""
    for number, (a, b) in enumerate(zip_longest(first, second), start=1):
        if a is None or b is None:
            short, long = (first_name, second_name) if a is None else (second_name, first_name)
            raise TextInputError(f"{short} has {number - 1} lines but {long} has more; "
                                 "they must align line by line")
        yield a, b


def open_source(stack: ExitStack, path: Path | None, stdin: BinaryIO | None, prefix_file: Path | None = None,
                prefix_column: bool = False) -> Iterator[Line]:
    """The lines of `path`, else `stdin`; (source, prefix) pairs with `prefix_file` or `prefix_column`
    ('source<TAB>prefix'). Opened now (TextInputError names the file), closed with `stack`."""
    if prefix_file is not None and prefix_column:
        raise TextInputError("--prefix-file and --prefix-column exclude each other")
    handles = [stack.enter_context(open_text(p)) if p is not None else None for p in (path, prefix_file)]
    stream = handles[0] if handles[0] is not None else stdin
    if stream is None:
        raise TextInputError("stdin is closed; give the source text on stdin or with --input")
    name = str(path or "stdin")
    source = iter_lines(stream, name)
    if handles[1] is not None:
        return paired_lines(source, iter_lines(handles[1], str(prefix_file)), name, str(prefix_file))
    return map(_split_prefix, source) if prefix_column else source


def _split_prefix(line: str) -> Line:
    """'source<TAB>prefix' -> (source, prefix); a line without a tab has none."""
    source, tab, prefix = line.partition("\t")
    return (source, prefix) if tab else line


def open_pairs(stack: ExitStack, src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """(source, target) pairs of two files read line by line (`paired_lines`), closed with `stack`."""
    handles = [stack.enter_context(open_text(path)) for path in (src, tgt)]
    return paired_lines(iter_lines(handles[0], str(src)), iter_lines(handles[1], str(tgt)), str(src), str(tgt))


def write_scores(translator: Translates, pairs: Iterator[tuple[str, str]], out: TextIO, as_json: bool,
                 chunk_pairs: int = 10000) -> None:
    """`nmt score`: one line per pair (outputs.score_line), `chunk_pairs` at a time: memory stays bounded."""
    number = 0
    while chunk := list(islice(pairs, chunk_pairs)):
        sources, targets = zip(*chunk, strict=True)
        for log_prob, normalised, length in translator.score(list(sources), list(targets), number + 1):
            out.write(score_line(number, log_prob, normalised, length, as_json))
            number += 1
