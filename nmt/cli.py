"""The `nmt` command line: thin wrappers that parse options, load the config and call a stage."""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from itertools import islice, zip_longest
from pathlib import Path

import typer

from nmt import __version__
from nmt.config import MAX_BEAM, ConfigError, load_config
from nmt.data.corpus import DataError
from nmt.folders import FolderError, PendingFile, register_file, remove_leftovers
from nmt.output_files import check_outputs, output_target
from nmt.process import configure_process
from nmt.textio import TextInputError, iter_lines, open_text

app = typer.Typer(
    help="RNN-attention neural machine translation: preprocess, train, translate, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,           # plain help: rich tables cut option names at 80 columns
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "--config", "-c", help="YAML config file.", exists=False)
MODEL_HELP = "A model file (nmt export) or a training checkpoint, e.g. model.nmt or RUN/best.pt."
SetOption = typer.Option(None, "--set", help="Override a config key: --set training.lr=3e-4 (repeatable).")


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind (temporary files are removed on the way) and exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _interrupt(signum: int, _frame: object) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):     # a second signal must not interrupt the cleanup
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


class ClosedStdout(io.TextIOBase):
    """Stands in for a stdout the shell closed (`nmt translate >&-`): writing to it is an error, as in a shell."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed (>&-); leave it open, or write to a file where the "
                                   "command has an option for one")


def _occupy_closed_descriptors() -> None:
    """Open /dev/null on a closed stdin, stdout or stderr (`>&-`), so that no file nmt opens later gets
    descriptor 0, 1 or 2 and receives what a library prints; writing to the closed stdout stays an error."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:                  # Python's stand-in for a descriptor 1 closed at start
        sys.stdout = ClosedStdout()
    if sys.stderr is None:                  # messages and progress bars go where the user sent them: nowhere
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def fail(message: str) -> None:
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code=2)


def as_options(message: str) -> str:
    """A decoding key in a message as the option that sets it: `decoding.beam_size` -> `--beam-size`."""
    return re.sub(r"`decoding\.(\w+)`", lambda m: f"`--{m.group(1).replace('_', '-')}`", message)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """RNN-attention NMT toolkit."""


@app.command()
def preprocess(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the output is up to date."),
) -> None:
    """Train SentencePiece and encode train/dev/test into id files with a manifest."""
    from nmt.data.preprocess import preprocess as run_preprocess

    try:
        run_preprocess(load_config(config, overrides or []), force=force, config_path=config)
    except (ConfigError, DataError, FolderError) as exc:
        fail(str(exc))


@app.command()
def train(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in training.run_dir from last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Delete what nmt wrote in the run folder and start over (never other files)."),
) -> None:
    """Train a seq2seq model; checkpoints and metrics go to training.run_dir.

    SIGINT/SIGTERM save last.pt at the current update and exit 130/143; --resume continues.
    """
    configure_process(training=True)             # before torch's first oneDNN call
    from nmt.train.checkpoint import CheckpointError
    from nmt.train.trainer import RunDirError
    from nmt.train.trainer import train as run_training

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    try:
        trainer = run_training(load_config(config, overrides or []), resume=resume, overwrite=overwrite,
                               config_path=config)
    except (ConfigError, DataError, CheckpointError, RunDirError, FolderError) as exc:
        fail(str(exc))
    except FloatingPointError as exc:
        fail(f"{exc}; lower training.lr or raise training.clip_grad_norm, then --resume from last.pt")
    if trainer.stop_signal is not None:
        raise typer.Exit(code=128 + trainer.stop_signal)


def _check_outputs(inputs: dict[str, Path | None], outputs: dict[str, Path | None],
                   models: Sequence[Path] = (), stdin: bool = False) -> dict[str, Path]:
    """`check_outputs` (nmt.output_files) with the models as inputs; a problem is one `error:` line."""
    try:
        return check_outputs(outputs, [*inputs.items(), *(("--model", model) for model in models)], stdin=stdin)
    except FolderError as exc:
        fail(str(exc))
        return {}


def _pending(path: Path | None, stack: ExitStack) -> PendingFile | None:
    """A temporary file beside `path` (leftovers of killed runs removed first), discarded unless committed."""
    if path is None:
        return None
    path = output_target(path)               # checked by _check_outputs; a link changed since is refused
    remove_leftovers(path.parent, path.name)
    pending = PendingFile(path, "w")
    stack.callback(pending.discard)
    return pending


@app.command()
def translate(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", "--model", "-m",
                                          help=MODEL_HELP + " Repeat it to decode with an ensemble."),
    input: Path | None = typer.Option(None, "--input", "-i", help="Source text; default stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Translations; default stdout."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1, help="1 = greedy; default from config."),
    length_penalty: float | None = typer.Option(None, "--length-penalty", min=0.0, help="GNMT alpha."),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", min=1, help="Source tokens x beam per batch."),
    n_best: int = typer.Option(1, "--n-best", min=1, max=MAX_BEAM,
                               help="Write the K best of each input line (K <= beam size) as K lines "
                                    "'N ||| text ||| score' (N = 0-based input line, score = length-normalised "
                                    "log-probability); an empty input line gives K lines with empty text."),
    no_repeat_ngram: int | None = typer.Option(None, "--no-repeat-ngram", min=0, help="Block repeated n-grams."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda (cuda:N)."),
    precision: str | None = typer.Option(None, "--precision", help="auto, fp32, bf16 or fp16; default from config."),
    quantize: str | None = typer.Option(None, "--quantize",
                                        help="int8: int8 weights for the decoder's step products and the encoder "
                                             "RNN (CPU; BLEU within 0.3); none; default from config."),
    threads: int = typer.Option(0, "--threads", min=0, max=1024, help="CPU threads; 0 = torch's default."),
    alignments: Path | None = typer.Option(None, "--alignments", help="Write Pharaoh word alignments (i-j)."),
    attention_out: Path | None = typer.Option(None, "--attention-out", help="Write attention as JSON lines."),
    plot_attention: Path | None = typer.Option(None, "--plot-attention", help="Write heatmap PNGs into this folder."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    min_len: int | None = typer.Option(None, "--min-len", min=0, help="No EOS before this many pieces."),
    max_len: int | None = typer.Option(None, "--max-len", min=0, help="At most this many pieces (EOS included)."),
    max_len_ratio: float | None = typer.Option(None, "--max-len-ratio", min=0.0, help="At most ratio*source+10."),
    max_input_len: int | None = typer.Option(None, "--max-input-len", min=1, help="Truncate longer inputs."),
    coverage_penalty: float | None = typer.Option(None, "--coverage-penalty", min=0.0, help="GNMT beta (beam)."),
    early_stop: bool | None = typer.Option(None, "--early-stop/--no-early-stop",
                                           help="Beam: a sentence ends when its best candidate ends (OpenNMT-py's "
                                                "rule): fewer steps, may miss a longer best hypothesis."),
    replace_unk: bool | None = typer.Option(None, "--replace-unk/--no-replace-unk",
                                            help="Copy the most attended source piece for each <unk>."),
    sampling: bool | None = typer.Option(None, "--sampling/--no-sampling", help="Sample instead of searching."),
    temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature."),
    top_k: int | None = typer.Option(None, "--top-k", min=0, help="Sample from the k most probable; 0 = all."),
    top_p: float | None = typer.Option(None, "--top-p", help="Sample from the top-p probability mass."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed (same seed and batches, same samples)."),
    num_samples: int | None = typer.Option(None, "--num-samples", min=1, max=MAX_BEAM,
                                           help="Samples per line (= --n-best)."),
    prefix_file: Path | None = typer.Option(None, "--prefix-file", help="Target prefixes, one line per input line."),
    prefix_column: bool = typer.Option(False, "--prefix-column", help="Input lines are 'source<TAB>prefix'."),
    scores: Path | None = typer.Option(None, "--scores", help="Write 'log-prob<TAB>normalised score' per output line."),
    scores_json: bool = typer.Option(False, "--scores-json", help="Write --scores as JSON lines."),
    shortlist: bool | None = typer.Option(None, "--shortlist/--no-shortlist",
                                          help="Score only the target pieces likely for each batch's source "
                                               "pieces (the vocabulary shortlist the model embeds)."),
    shortlist_k: int | None = typer.Option(None, "--shortlist-k", min=0,
                                           help="Shortlist: target pieces per source piece; 0 = all stored "
                                                "(implies --shortlist unless --no-shortlist)."),
    shortlist_file: Path | None = typer.Option(None, "--shortlist-file",
                                               help="A data folder's shortlist.npz, for a model without one "
                                                    "(implies --shortlist)."),
    cuda_graphs: bool | None = typer.Option(None, "--cuda-graphs/--no-cuda-graphs",
                                            help="On a GPU, replay greedy and beam steps as captured CUDA graphs "
                                                 "(default on)."),
) -> None:
    """Translate text, one line out per line in, in input order.

    Only "\\n" ends an input line (a "\\r" before it belongs to a CRLF ending); invalid UTF-8 stops
    with an error naming the line: with --output nothing is written, on stdout nothing after it.
    """
    from tqdm import tqdm

    from nmt.decode.translator import OutputFiles, Translator
    from nmt.device import reuse_freed_memory
    from nmt.model.modelfile import ModelFileError

    try:
        source_file = open_text(input) if input is not None else None
        prefix_handle = open_text(prefix_file) if prefix_file is not None else None
    except TextInputError as exc:
        fail(str(exc))
    if source_file is None and sys.stdin is None:
        fail("stdin is closed; give the source text on stdin or with --input")
    if prefix_file is not None and prefix_column:
        fail("--prefix-file and --prefix-column exclude each other")
    if num_samples is not None:
        if not sampling:
            fail("--num-samples needs --sampling (for beam search use --n-best)")
        if n_best != 1 and n_best != num_samples:
            fail(f"--num-samples {num_samples} and --n-best {n_best} disagree; give one of them")
        n_best = num_samples
    outputs = {"--output": output, "--alignments": alignments, "--attention-out": attention_out, "--scores": scores}
    _check_outputs({"--input": input, "--prefix-file": prefix_file, "--shortlist-file": shortlist_file},
                   outputs, checkpoint, stdin=input is None)
    if plot_attention is not None:
        if plot_attention.exists() and not plot_attention.is_dir():
            fail(f"--plot-attention: {plot_attention} is a file, not a folder")
        for option, path in outputs.items():
            if path is not None and path.resolve() == plot_attention.resolve():
                fail(f"--plot-attention {plot_attention} is also {option}; the heatmaps need a folder of their own")
    if threads:
        import torch

        torch.set_num_threads(threads)
    reuse_freed_memory()
    try:
        translator = Translator.load(
            checkpoint, device, beam_size=beam_size, length_penalty=length_penalty, batch_tokens=batch_tokens,
            no_repeat_ngram=no_repeat_ngram, precision=precision, min_len=min_len, max_len=max_len,
            max_len_ratio=max_len_ratio, max_input_len=max_input_len, coverage_penalty=coverage_penalty,
            early_stop=early_stop, replace_unk=replace_unk, sampling=sampling, temperature=temperature, top_k=top_k,
            top_p=top_p, seed=seed, quantize=quantize, shortlist=shortlist, shortlist_k=shortlist_k,
            shortlist_file=shortlist_file, cuda_graphs=cuda_graphs)
        translator.check_n_best(n_best, names=("--n-best", "--beam-size", "--sampling"))
    except (ConfigError, ModelFileError) as exc:
        fail(as_options(str(exc)))
    if not translator.decoding.sampling:
        given = [name for name, value in (("--temperature", temperature), ("--top-k", top_k), ("--top-p", top_p),
                                          ("--seed", seed)) if value is not None]
        if given:
            fail(f"{given[0]} applies only to sampling; add --sampling (this model does not sample by default)")
    plotter = None
    if plot_attention is not None:
        from nmt.plot import AttentionPlotter, PlotUnavailable

        try:
            plotter = AttentionPlotter(plot_attention)
        except (PlotUnavailable, FolderError) as exc:
            fail(str(exc))
    with ExitStack() as stack:
        for handle in (source_file, prefix_handle):
            if handle is not None:
                stack.enter_context(handle)
        source = iter_lines(source_file if source_file is not None else sys.stdin.buffer, str(input or "stdin"))
        if prefix_handle is not None:
            source = _paired_lines(source, iter_lines(prefix_handle, str(prefix_file)), str(input or "stdin"),
                                   str(prefix_file))
        elif prefix_column:                             # 'source<TAB>prefix'; a line without a tab has none
            source = (tuple(line.split("\t", 1)) if "\t" in line else line for line in source)
        pending = {name: _pending(path, stack) for name, path in
                   (("text", output), ("alignments", alignments), ("attention", attention_out), ("scores", scores))}
        files = OutputFiles(
            pending["text"].handle if pending["text"] else sys.stdout,
            pending["alignments"].handle if pending["alignments"] else None,
            pending["attention"].handle if pending["attention"] else None,
            plotter,
            pending["scores"].handle if pending["scores"] else None,
            scores_json,
        )
        try:
            with tqdm(desc="translate", unit="sent", file=sys.stderr, disable=quiet) as bar:
                translator.write_translations(source, files, n_best=n_best, progress=bar)
        except TextInputError as exc:
            sys.stdout.flush()
            fail(str(exc))
        sys.stdout.flush()
        for item in pending.values():
            if item is not None:
                item.commit()


_MISSING = object()


def _paired_lines(first: Iterator[str], second: Iterator[str], first_name: str,
                  second_name: str) -> Iterator[tuple[str, str]]:
    """Line i of both streams as a pair; one stream ending before the other is a `TextInputError`."""
    for number, (a, b) in enumerate(zip_longest(first, second, fillvalue=_MISSING), start=1):
        if a is _MISSING or b is _MISSING:
            short, long = (first_name, second_name) if a is _MISSING else (second_name, first_name)
            raise TextInputError(f"{short} has {number - 1} lines but {long} has more; "
                                 "they must align line by line")
        yield a, b


@app.command()
def score(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", "--model", "-m",
                                          help=MODEL_HELP + " Repeat it to score with an ensemble."),
    src: Path = typer.Option(..., "--src", help="Source text, one sentence per line."),
    tgt: Path = typer.Option(..., "--tgt", help="Target text to score, line by line with --src."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Scores; default stdout."),
    json_lines: bool = typer.Option(False, "--json", help="JSON lines instead of 'log-prob<TAB>normalised': "
                                    "line (0-based, as translate --n-best), log_prob, score, length."),
    length_penalty: float | None = typer.Option(None, "--length-penalty", min=0.0, help="GNMT alpha."),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", min=1, help="Source+target tokens per batch."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    precision: str | None = typer.Option(None, "--precision", help="auto, fp32, bf16 or fp16; default from config."),
    threads: int = typer.Option(0, "--threads", min=0, max=1024, help="CPU threads; 0 = torch's default."),
) -> None:
    """The model's log-probability of given translations (forced decoding), for filtering and reranking.

    One line per pair: 'log-prob<TAB>length-normalised score' (or JSON with --json).
    """
    import json

    from nmt.decode.translator import Translator
    from nmt.model.modelfile import ModelFileError

    try:
        handles = open_text(src), open_text(tgt)
    except TextInputError as exc:
        fail(str(exc))
    _check_outputs({"--src": src, "--tgt": tgt}, {"--output": output}, checkpoint)
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        scorer = Translator.load(checkpoint, device, length_penalty=length_penalty, batch_tokens=batch_tokens,
                                 precision=precision)
    except (ConfigError, ModelFileError) as exc:
        fail(as_options(str(exc)))
    with ExitStack() as stack:
        for handle in handles:
            stack.enter_context(handle)
        pending = _pending(output, stack)
        out = pending.handle if pending else sys.stdout
        pairs = _paired_lines(iter_lines(handles[0], str(src)), iter_lines(handles[1], str(tgt)), str(src), str(tgt))
        number = 0
        try:
            while chunk := list(islice(pairs, 10000)):
                sources, targets = zip(*chunk, strict=True)
                for log_prob, normalised, length in scorer.score(list(sources), list(targets), number + 1):
                    if json_lines:
                        out.write(json.dumps({"line": number, "log_prob": round(log_prob, 6),
                                              "score": round(normalised, 6), "length": length}) + "\n")
                    else:
                        out.write(f"{log_prob:.6f}\t{normalised:.6f}\n")
                    number += 1
        except TextInputError as exc:
            sys.stdout.flush()
            fail(str(exc))
        sys.stdout.flush()
        if pending is not None:
            pending.commit()


@app.command()
def evaluate(
    ref: Path = typer.Option(..., "--ref", "-r", help="Reference translations, raw text."),
    hyp: Path | None = typer.Option(None, "--hyp", help="Hypotheses to score."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", "--model", "-m",
                                           help="Translate --src with this model file or checkpoint first."),
    src: Path | None = typer.Option(None, "--src", help="Source text (with --checkpoint)."),
    compare: Path | None = typer.Option(None, "--compare", help="Second system: paired bootstrap test."),
    ter: bool = typer.Option(False, "--ter", help="Also compute TER."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the scores as JSON here ('-' = stdout)."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1),
    device: str = typer.Option("auto", "--device"),
    bootstrap_samples: int = typer.Option(1000, "--bootstrap-samples", min=10, max=100_000),
) -> None:
    """Score hypotheses (or a checkpoint's translations) with sacreBLEU BLEU and chrF.

    Only "\\n" ends a line (a "\\r" before it belongs to a CRLF ending).
    """
    import json

    from nmt import evaluate as ev

    if json_out is not None and str(json_out) != "-":
        _check_outputs({"--ref": ref, "--hyp": hyp, "--src": src, "--compare": compare}, {"--json": json_out},
                       [checkpoint] if checkpoint is not None else [])
    try:
        refs = ev.read_text(ref)
        if checkpoint is not None:
            if src is None or hyp is not None:
                fail("--checkpoint needs --src (and no --hyp)")
            from nmt.decode.translator import Translator
            from nmt.model.modelfile import ModelFileError

            try:
                translator = Translator.load(checkpoint, device, beam_size=beam_size)
            except (ModelFileError, ConfigError) as exc:
                fail(as_options(str(exc)))
            hyps = [t.text for t in translator.translate_stream(ev.read_text(src))]
            hyp_name = f"{checkpoint} on {src}"
        elif hyp is not None:
            hyps, hyp_name = ev.read_text(hyp), str(hyp)
        else:
            fail("give --hyp FILE, or --checkpoint C --src FILE")
        ev.check_lengths(hyps, refs, hyp_name, str(ref))
        results = ev.score(hyps, refs, ter=ter)
        if compare is not None:
            other = ev.read_text(compare)
            ev.check_lengths(other, refs, str(compare), str(ref))
            results["comparison"] = ev.compare(hyps, other, refs, ter=ter, samples=bootstrap_samples)
    except ev.EvaluationError as exc:
        fail(str(exc))
    payload = json.dumps({"hypotheses": hyp_name, "references": str(ref), **results}, indent=2)
    if json_out is not None and str(json_out) == "-":
        typer.echo(payload)
        return
    typer.echo(ev.format_report(results, hyp_name, str(ref)))     # first: a closed stdout fails before the file
    if json_out is not None:
        from nmt.folders import atomic_write

        target = output_target(json_out, "--json")     # checked above; a link changed since is refused
        remove_leftovers(target.parent, target.name)
        atomic_write(target, lambda handle: handle.write(payload + "\n"), mode="w")


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(..., help="Checkpoints of one run to average."),
    output: Path = typer.Option(..., "--output", "-o", help="The averaged checkpoint (in the same run folder)."),
) -> None:
    """Average the parameters of several checkpoints into a new one."""
    from nmt.train.checkpoint import CheckpointError, average_checkpoints, save_checkpoint

    if output.exists():
        fail(f"{output} exists; choose a new name (checkpoints are never overwritten in place)")
    target = _check_outputs({}, {"--output": output}, checkpoints)["--output"]
    try:
        state = average_checkpoints(checkpoints)
    except CheckpointError as exc:
        fail(str(exc))
    save_checkpoint(target, {k: v for k, v in state.items() if k not in ("format", "nmt_version")})
    register_file(target)                   # `train --overwrite` may delete it with the rest of the run
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {output}", err=True)


@app.command()
def export(
    checkpoint: Path = typer.Argument(..., help="A training checkpoint (e.g. RUN/best.pt) or a model file."),
    output: Path = typer.Option(..., "--output", "-o", help="The model file to write, e.g. model.nmt."),
    dtype: str = typer.Option("fp32", "--dtype", help="Weights stored as fp32, fp16 or bf16 (half the size)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing nmt model file at --output."),
    quantize: str | None = typer.Option(None, "--quantize",
                                        help="int8: the file decodes with int8 products by default (CPU); none."),
) -> None:
    """Write one self-contained model file: weights (no optimiser state), config, tokenizer, card."""
    from nmt.model.modelfile import DTYPES, ModelFileError, describe, export_model, format_card, load_model

    if dtype not in DTYPES:
        fail(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if output.is_dir():
        fail(f"--output {output} is a folder; give a file name such as {output / 'model.nmt'}")
    if not output.parent.is_dir():
        fail(f"--output {output}: folder {output.parent} does not exist")
    target = _check_outputs({}, {"--output": output}, [checkpoint])["--output"]
    if target.exists():
        if not force:
            fail(f"{output} exists; choose a new name, or pass --force to replace an nmt model file")
        try:
            if load_model(target).kind != "model":
                raise ModelFileError("a checkpoint")
        except (ModelFileError, ConfigError):
            fail(f"{output} exists and is not an nmt model file; nmt replaces only its own model files")
    try:
        export_model(checkpoint, target, dtype, quantize)
        info = describe(load_model(target))
    except (ModelFileError, ConfigError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    size = target.stat().st_size / 2**20
    typer.echo(f"wrote {output} ({size:.1f} MB)\n\n{format_card(info)}", err=True)


@app.command()
def info(
    model: Path = typer.Argument(..., help=MODEL_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the card as JSON instead of Markdown."),
    allow_nonfinite: bool = typer.Option(False, "--allow-nonfinite", help="Show a model with NaN/inf weights."),
) -> None:
    """Show the model card: languages, vocabulary, parameters, data, scores (after checking the file)."""
    import json

    from nmt.model.modelfile import ModelFileError, describe, format_card, load_model

    try:
        card = describe(load_model(model, allow_nonfinite=allow_nonfinite))
    except (ModelFileError, ConfigError) as exc:
        fail(str(exc))
    typer.echo(json.dumps(card, indent=2, ensure_ascii=False) if json_out else format_card(card))


@app.command()
def serve(
    model: Path = typer.Option(..., "--model", "--checkpoint", "-m", help=MODEL_HELP),
    host: str = typer.Option("127.0.0.1", "--host", envvar="NMT_SERVE_HOST",
                             help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port; 0 = any free port (logged)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    precision: str | None = typer.Option(None, "--precision", help="auto, fp32, bf16 or fp16; default from config."),
    quantize: str | None = typer.Option(None, "--quantize", help="int8 or none (CPU); default from the model."),
    threads: int = typer.Option(0, "--threads", min=0, max=1024, help="CPU threads; 0 = torch's default."),
    max_batch_sentences: int = typer.Option(128, "--max-batch-sentences", min=1,
                                            help="Sentences of concurrent requests translated together."),
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", min=0.0, max=60_000.0,
                                      help="How long a batch waits for more requests once the model is free."),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="Requests waiting; more get 503 + Retry-After."),
    max_sentences: int = typer.Option(100, "--max-sentences", min=1, help="Sentences per request (else 413)."),
    max_body_kb: int = typer.Option(256, "--max-body-kb", min=1, help="Request body size in KiB (else 413)."),
    max_beam: int = typer.Option(16, "--max-beam", min=1, max=MAX_BEAM,
                                 help="Largest beam_size a request may ask for."),
    body_timeout: float = typer.Option(30.0, "--body-timeout", min=0.1, max=3600.0,
                                       help="Seconds for a request body to arrive (else 408)."),
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health (needs the serve extra)."""
    from nmt.model.modelfile import ModelFileError

    try:
        from nmt.serve import ServeSettings, run_server
    except ImportError as exc:
        fail(f"nmt serve needs the serve extra: pip install 'nmt[serve]' ({exc})")
    settings = ServeSettings(host=host, port=port, max_batch_sentences=max_batch_sentences,
                             max_wait=max_wait_ms / 1000, max_queue=max_queue, max_sentences=max_sentences,
                             max_body_bytes=max_body_kb * 1024, max_beam=max_beam, body_timeout=body_timeout)
    try:
        code = run_server(model, settings, device=device, precision=precision, threads=threads, quantize=quantize)
    except (ModelFileError, ConfigError, OSError) as exc:
        fail(str(exc))
    raise typer.Exit(code)


plot_app = typer.Typer(help="Pictures: attention heatmaps and training curves (needs the plot extra: matplotlib).",
                       rich_markup_mode=None,
                       no_args_is_help=True)
app.add_typer(plot_app, name="plot")


@plot_app.command("attention")
def plot_attention_command(
    checkpoint: Path = typer.Option(..., "--checkpoint", "--model", "-m", help=MODEL_HELP),
    src: list[str] = typer.Option(..., "--src", help="A source sentence (repeatable)."),
    out: Path = typer.Option(Path("attention"), "--out", "-o", help="Folder for the PNG files."),
    beam_size: int | None = typer.Option(None, "--beam-size", min=1),
    device: str = typer.Option("auto", "--device"),
) -> None:
    """Translate sentences and draw each one's attention as a heatmap PNG."""
    from nmt.decode.translator import OutputFiles, Translator
    from nmt.model.modelfile import ModelFileError
    from nmt.plot import AttentionPlotter, PlotUnavailable

    try:
        plotter = AttentionPlotter(out, "--out")
        translator = Translator.load(checkpoint, device, beam_size=beam_size)
    except (PlotUnavailable, ModelFileError, ConfigError, FolderError) as exc:
        fail(str(exc))
    translator.write_translations(src, OutputFiles(sys.stdout, plotter=plotter))
    skipped = len(src) - len(plotter.written)          # an empty sentence has no attention to draw
    typer.echo(f"wrote {len(plotter.written)} heatmap(s) to {out}"
               + (f"; {skipped} empty sentence(s) have none" if skipped else ""), err=True)


@plot_app.command("curves")
def plot_curves_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (each with metrics.jsonl)."),
    out: Path = typer.Option(Path("curves.png"), "--out", "-o", help="The PNG to write."),
) -> None:
    """Draw train loss, dev perplexity and dev BLEU of one or more runs."""
    from nmt.plot import PlotError, PlotUnavailable, plot_curves

    inputs = [(str(run / name), run / name) for run in run_dirs for name in ("metrics.jsonl", "config.yaml")]
    try:
        check_outputs({"--out": out}, inputs)
        plot_curves(run_dirs, out)
    except (PlotUnavailable, PlotError, FileNotFoundError, FolderError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror}")
    typer.echo(f"wrote {out}", err=True)


def _is_user_error(exc: BaseException) -> bool:
    """nmt's own exception classes (ConfigError, DataError, CheckpointError, ...) describe user errors."""
    return isinstance(exc, ValueError) and type(exc).__module__.startswith("nmt.")


def main() -> None:
    """Run a command; every failure is one `error:` line (exit 2), a signal exits 128 + its number."""
    try:                                 # typer >= 0.20 carries its own copy of click
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:
        from click.exceptions import ClickException, NoArgsIsHelpError

    configure_process()              # before torch's first oneDNN call; imports no torch
    _occupy_closed_descriptors()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    code = 0
    try:
        code = app(standalone_mode=False) or 0
    except NoArgsIsHelpError as exc:
        exc.show()
        code = 2
    except ClickException as exc:
        typer.echo(f"error: {one_line(exc.format_message())} (see --help)", err=True)
        code = 2
    except Interrupted as exc:
        print(f"interrupted ({exc})", file=sys.stderr)
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(exc.exit_code)      # cleanup is done; do not wait for a worker thread still in C++
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:                      # the reader went away (`nmt translate | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"error: {where}{exc.strerror or one_line(str(exc))}", err=True)
        code = 2
    except typer.Abort:
        code = 1
    except Exception as exc:
        if _is_user_error(exc):
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            code = 2
        else:
            typer.echo(f"error: internal error ({type(exc).__name__}: {one_line(str(exc))[:300]}); "
                       "please report it", err=True)
            code = 1
    finally:
        gc.freeze()   # exit without a last garbage-collector walk over torch's objects: 0.3 s of every command
    sys.exit(code)
